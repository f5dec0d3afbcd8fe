//! The changed messages of a render, kept for the next turn: the same message re-made with the
//! same edits and cache marker takes the earlier turn's text instead of being rendered again.

use std::borrow::Cow;
use std::sync::Arc;

pub(super) use super::rendered::{Rendered, RenderedAt};
use super::skeleton::Skeleton;
use crate::conversation::Item;
use crate::dialect::Unapplied;
use crate::dialect::breakpoints::Marker;

/// The changed messages of one render, each rendered once: a message re-made from an earlier
/// turn with the same edits and marker takes the earlier turn's text, and the own skeleton keeps
/// this turn's for the next (see [`Memo`]).
pub(crate) struct Renders<'m> {
    pub(super) earlier: Option<(&'m [RenderedAt], usize)>,
    pub(super) own: Option<&'m Arc<Skeleton>>,
    pub(super) kept: Vec<RenderedAt>,
    /// The parse's record of messages whose replacement could not be written.
    pub(super) unapplied: &'m Unapplied,
}

impl<'m> Renders<'m> {
    /// Changed message `index` (its items `items`, compactor's marker on it `marker`) as rendered
    /// by `render` (`None`: nothing is left of it).
    pub(crate) fn message(
        &mut self,
        index: usize,
        items: &[Item],
        marker: Option<&Marker>,
        render: impl FnOnce() -> Option<String>,
    ) -> Option<Cow<'_, str>> {
        if let Some((earlier, messages)) = self.earlier
            && index < messages
            && let Ok(at) = earlier.binary_search_by_key(&index, |(i, _)| *i)
            && earlier[at].1.decided_by(items, marker)
        {
            let rendered: &'m Arc<Rendered> = &earlier[at].1;
            if rendered.unapplied {
                self.unapplied.push(index);
            }
            if self.own.is_some() {
                self.kept.push((index, rendered.clone()));
            }
            return rendered.text.as_deref().map(Cow::Borrowed);
        }
        let recorded = self.unapplied.len();
        let text = render();
        let unapplied = self.unapplied.len() > recorded;
        if self.own.is_none() {
            return text.map(Cow::Owned);
        }
        let rendered = Arc::new(Rendered {
            edits: items.iter().map(|i| i.edit.clone()).collect(),
            marker: marker.cloned(),
            text: text.map(String::into_boxed_str),
            unapplied,
        });
        self.kept.push((index, rendered));
        self.kept.last().and_then(|(_, rendered)| rendered.text.as_deref()).map(Cow::Borrowed)
    }

    /// Keeps this render's messages in the own skeleton for the next turn.
    pub(crate) fn keep(self) {
        if let Some(own) = self.own {
            let _ = own.rendered.set(self.kept);
        }
    }
}
