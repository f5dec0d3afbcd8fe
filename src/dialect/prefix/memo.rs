//! [`Memo`]: what a parse through the cache carries across turns (token counts, truncations,
//! cache marker offsets) and where its own skeleton is kept.

use std::borrow::Cow;
use std::sync::Arc;

use super::key::PrefixKey;
use super::renders::Renders;
use super::skeleton::Skeleton;
pub(super) use super::skeleton::{Counted, Cuts, Reused};
use crate::conversation::Cut;
use crate::tokens::Encoding;

/// What a parse through the cache carries across turns: the token counts, truncations and
/// rendered messages of what it re-made from an earlier turn, and its own skeleton, which keeps
/// this turn's for the next one. Everything taken from an earlier turn is what this turn would
/// work out again from the same bytes with the same decisions. Shown as nothing in `Debug`: a
/// reusing parse and a fresh one are the same parse.
#[derive(Default, Clone)]
pub struct Memo {
    pub(super) earlier: Option<Reused>,
    pub(super) own: Option<Arc<Skeleton>>,
    /// Where the own skeleton is kept, to weigh it again once the rewrite has added to it.
    pub(super) kept: Option<Kept>,
}

/// A cache entry holding a parse's own skeleton.
#[derive(Clone)]
pub(super) struct Kept {
    pub(super) cache: moka::sync::Cache<PrefixKey, Arc<[Arc<Skeleton>]>>,
    pub(super) key: PrefixKey,
    pub(super) candidates: Arc<[Arc<Skeleton>]>,
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

impl Memo {
    /// The leading bytes of the body re-made from an earlier turn's parse (0 for a full parse).
    pub fn reused_bytes(&self) -> usize {
        self.earlier.as_ref().map_or(0, |reused| reused.common)
    }

    /// The counts, slot by slot, of the leading items re-made from an earlier turn counted in
    /// `encoding` (empty when there are none).
    pub fn known(&self, encoding: Encoding) -> &[u32] {
        match &self.earlier {
            Some(Reused { skeleton, items, .. }) => match skeleton.counts.get() {
                Some(counted) if counted.encoding == encoding => counted.slots.get(..items * 2).unwrap_or(&[]),
                _ => &[],
            },
            None => &[],
        }
    }

    /// The cut an earlier turn's truncation made of item `item` (one re-made from it), when it
    /// cut with the same settings: the same text cut the same way.
    pub fn earlier_cut(&self, encoding: Encoding, max_tokens: u32, item: usize) -> Option<&Cut> {
        let earlier = self.earlier.as_ref().filter(|e| item < e.items)?;
        let cuts = earlier.skeleton.cuts.get().filter(|c| c.encoding == encoding && c.max_tokens == max_tokens)?;
        let at = cuts.cuts.binary_search_by_key(&item, |cut| cut.item).ok()?;
        Some(&cuts.cuts[at])
    }

    /// Keeps this parse's truncations (`cuts`, in item order) for the next turn.
    pub fn remember_cuts(&self, encoding: Encoding, max_tokens: u32, cuts: Vec<Cut>) {
        if let Some(own) = &self.own {
            let _ = own.cuts.set(Cuts { encoding, max_tokens, cuts });
        }
    }

    /// The byte offsets in `body` (this parse's) of every cache marker key (`key_len` bytes long,
    /// found by `find` from an offset on), in order: those inside the bytes shared with the
    /// earlier turn are that turn's, only the rest is searched. Kept for the next turn.
    pub(crate) fn markers(
        &self,
        body: &[u8],
        find: impl Fn(&[u8], usize) -> Vec<usize>,
        key_len: usize,
    ) -> Cow<'_, [usize]> {
        if let Some(own) = self.own.as_ref().and_then(|own| own.markers.get()) {
            return Cow::Borrowed(own);
        }
        let earlier = self.earlier.as_ref().and_then(|e| Some((e.skeleton.markers.get()?, e.common)));
        let markers = match earlier {
            Some((earlier, common)) => {
                // A key starting here ends inside the shared bytes.
                let from = (common + 1).saturating_sub(key_len);
                let mut markers: Vec<usize> = earlier.iter().copied().take_while(|&at| at < from).collect();
                markers.extend(find(body, from));
                markers
            }
            None => find(body, 0),
        };
        match &self.own {
            Some(own) => Cow::Borrowed(own.markers.get_or_init(|| markers)),
            None => Cow::Owned(markers),
        }
    }

    /// A book of this turn's rendered messages, taking those an earlier turn rendered the same way.
    pub(crate) fn renders<'r>(&'r self, unapplied: &'r crate::dialect::Unapplied) -> Renders<'r> {
        let earlier = self.earlier.as_ref().and_then(|e| Some((e.skeleton.rendered.get()?.as_slice(), e.messages)));
        Renders { earlier, own: self.own.as_ref(), kept: Vec::new(), unapplied }
    }

    /// Weighs the own skeleton again in the cache, with what the rewrite added to it (kept
    /// truncations, renders and marker offsets), unless a later request has replaced it there
    /// already.
    pub fn settle(&self) {
        let Some(kept) = &self.kept else { return };
        if self
            .own
            .as_ref()
            .is_none_or(|own| own.cuts.get().is_none() && own.rendered.get().is_none() && own.markers.get().is_none())
        {
            return;
        }
        kept.cache.entry(kept.key).and_compute_with(|entry| match entry {
            Some(entry) if Arc::ptr_eq(entry.value(), &kept.candidates) => {
                moka::ops::compute::Op::Put(kept.candidates.clone())
            }
            _ => moka::ops::compute::Op::Nop,
        });
    }

    /// The skeleton of this parse, kept in the cache for the next turn (benchmarks start a warm
    /// turn from it).
    pub fn own(&self) -> Option<&Arc<Skeleton>> {
        self.own.as_ref()
    }

    /// Keeps this parse's item counts (`slots`, two per item, before any policy ran) for the
    /// next turn.
    pub fn remember(&self, encoding: Encoding, slots: &[u32]) {
        if let Some(own) = &self.own
            && slots.len() == own.items.len() * 2
        {
            let _ = own.counts.set(Counted { encoding, slots: slots.to_vec() });
        }
    }
}
