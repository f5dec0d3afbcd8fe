//! The changed messages of a render, kept for the next turn: the same message re-made with the
//! same edits and cache marker takes the earlier turn's text instead of being rendered again.

use std::borrow::Cow;
use std::sync::Arc;

use super::skeleton::Skeleton;
use crate::conversation::{Edit, Item};
use crate::dialect::Unapplied;
use crate::dialect::breakpoints::Marker;

/// A rendered message and its index.
pub(super) type RenderedAt = (usize, Arc<Rendered>);

/// One changed message as rendered, with what decided it: its items' edits and compactor's cache
/// marker on it. The same message of a later turn (the same bytes, re-made) with the same edits
/// and marker renders to the same text.
#[derive(Debug)]
pub(crate) struct Rendered {
    edits: Box<[Edit]>,
    marker: Option<Marker>,
    /// `None`: nothing is left of the message.
    text: Option<Box<str>>,
    /// Whether a replacement in it could not be written (see [`ParsedRequest::unapplied`]).
    unapplied: bool,
}

impl Rendered {
    pub(super) fn size(&self) -> usize {
        let edit = |edit: &Edit| match edit {
            Edit::Replace(text) => text.len(),
            Edit::Keep | Edit::Remove => 0,
        };
        std::mem::size_of::<RenderedAt>()
            + std::mem::size_of::<Self>()
            + self.edits.iter().map(|e| std::mem::size_of::<Edit>() + edit(e)).sum::<usize>()
            + self.marker.as_ref().map_or(0, |m| m.json.len())
            + self.text.as_ref().map_or(0, |t| t.len())
    }

    fn decided_by(&self, items: &[Item], marker: Option<&Marker>) -> bool {
        self.marker.as_ref() == marker && self.edits.iter().eq(items.iter().map(|i| &i.edit))
    }
}

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
