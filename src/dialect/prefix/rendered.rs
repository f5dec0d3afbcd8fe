//! One changed message as rendered, and what decided it: what a skeleton keeps of a render for
//! the next turn ([`super::renders`] reads it back).

use std::sync::Arc;

use crate::conversation::{Edit, Item};
use crate::dialect::breakpoints::Marker;

/// A rendered message and its index.
pub(super) type RenderedAt = (usize, Arc<Rendered>);

/// One changed message as rendered, with what decided it: its items' edits and compactor's cache
/// marker on it. The same message of a later turn (the same bytes, re-made) with the same edits
/// and marker renders to the same text.
#[derive(Debug)]
pub(crate) struct Rendered {
    pub(super) edits: Box<[Edit]>,
    pub(super) marker: Option<Marker>,
    /// `None`: nothing is left of the message.
    pub(super) text: Option<Box<str>>,
    /// Whether a replacement in it could not be written (see [`ParsedRequest::unapplied`]).
    pub(super) unapplied: bool,
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

    pub(super) fn decided_by(&self, items: &[Item], marker: Option<&Marker>) -> bool {
        self.marker.as_ref() == marker && self.edits.iter().eq(items.iter().map(|i| &i.edit))
    }
}
