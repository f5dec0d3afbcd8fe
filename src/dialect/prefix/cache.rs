//! [`PrefixCache`]: the last parses' skeletons, bounded in bytes, and a parse through it that
//! re-makes what an earlier turn under the same key already read.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::head::parse_reusing;
use super::key::PrefixKey;
use super::memo::Kept;
use super::skeleton::{ItemSkeleton, MessageSkeleton, Skeleton};
use crate::dialect::{Dialect, ParsedRequest};

/// Earlier bodies kept per key: parallel conversations of one client (subagents) under the same
/// credential each keep theirs.
const CANDIDATES: usize = 4;

/// What a parse through the cache did, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Messages of an earlier turn were re-made.
    Hit,
    /// Nothing earlier matched: a full parse.
    Miss,
    /// The cache is off.
    Off,
}

impl Reuse {
    pub fn label(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Off => "off",
        }
    }
}

/// The earlier turn a parse through the [`PrefixCache`] re-makes its head from, held by the
/// caller for as long as that parse lives.
#[derive(Debug, Default)]
pub struct Earlier(OnceLock<Arc<Skeleton>>);

/// The last parses, bounded in bytes (bodies included); `None` inside when turned off.
#[derive(Clone)]
pub struct PrefixCache {
    cache: Option<moka::sync::Cache<PrefixKey, Arc<[Arc<Skeleton>]>>>,
    /// Smaller bodies are parsed whole and not kept (`limits.prefix_min_bytes`).
    min_bytes: usize,
    /// The heaviest parse kept: half the cache. A heavier one would push every other
    /// conversation out, and moka evicts an entry over its whole bound only at its next
    /// maintenance, so until then the bound did not hold (a 30 MiB body of a million one-letter
    /// messages kept ~430 MiB).
    max_entry: usize,
}

impl PrefixCache {
    /// A cache holding at most `max_bytes`; 0 turns reuse off.
    pub fn new(max_bytes: u64) -> Self {
        let cache = (max_bytes > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, candidates: &Arc<[Arc<Skeleton>]>| {
                    let bytes: usize = candidates.iter().map(|c| c.size()).sum();
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .build()
        });
        Self { cache, min_bytes: 0, max_entry: usize::try_from(max_bytes / 2).unwrap_or(usize::MAX) }
    }

    /// Whether the skeleton of `parsed` (of a body of `body_bytes`) is light enough to keep: its
    /// weight estimated from what it will hold per message and item, before it is built.
    fn keeps(&self, parsed: &ParsedRequest, body_bytes: usize) -> bool {
        let per_item = std::mem::size_of::<ItemSkeleton>() + 2 * std::mem::size_of::<u32>();
        let estimate = body_bytes
            + parsed.messages.len() * std::mem::size_of::<MessageSkeleton>()
            + parsed.conversation.items.len() * per_item;
        estimate <= self.max_entry
    }

    /// The same cache, for bodies of `min_bytes` and more only: a small body parses faster than
    /// the cache's lookup and insert.
    pub fn for_bodies_from(mut self, min_bytes: usize) -> Self {
        self.min_bytes = min_bytes;
        self
    }

    /// The weighted size (bodies and skeletons, what `limits.prefix_cache_bytes` bounds) and the
    /// keys held.
    pub fn size(&self) -> crate::tokens::CacheSize {
        match &self.cache {
            Some(cache) => {
                cache.run_pending_tasks();
                crate::tokens::CacheSize { bytes: cache.weighted_size(), entries: cache.entry_count() }
            }
            None => crate::tokens::CacheSize { bytes: 0, entries: 0 },
        }
    }

    /// Parses `body`, re-making the head it shares with an earlier body under `key` (worked out
    /// only for a body the cache takes), and keeps this parse for the next turn. The earlier
    /// turn is held in `earlier` (a fresh one per parse) for as long as the parse lives: texts
    /// it unescaped are lent from it, not copied.
    pub fn parse<'a>(
        &self,
        key: impl FnOnce() -> PrefixKey,
        dialect: Dialect,
        body: &'a Bytes,
        earlier: &'a Earlier,
    ) -> (Option<ParsedRequest<'a>>, Reuse) {
        let Some(cache) = self.cache.as_ref().filter(|_| body.len() >= self.min_bytes) else {
            return (ParsedRequest::parse(dialect, body), Reuse::Off);
        };
        let key = key();
        let candidates = cache.get(&key);
        let best = candidates
            .iter()
            .flat_map(|c| c.iter())
            .filter(|c| c.dialect == dialect)
            .map(|c| (c.common_prefix(body), c))
            .max_by_key(|(common, _)| *common);
        let earlier = best.and_then(|(_, best)| earlier.0.set(best.clone()).ok().and(earlier.0.get()));
        let (mut parsed, reused) = match earlier {
            Some(earlier) => parse_reusing(dialect, body, earlier),
            None => (ParsedRequest::parse(dialect, body), 0),
        };
        if let Some(parsed) = &mut parsed
            && self.keeps(parsed, body.len())
            && let Some(skeleton) = Skeleton::of(parsed, body.clone())
        {
            let skeleton = Arc::new(skeleton);
            parsed.memo.own = Some(skeleton.clone());
            // This conversation's earlier turn gives way; other conversations under the key stay.
            let kept: Arc<[Arc<Skeleton>]> = std::iter::once(skeleton.clone())
                .chain(candidates.iter().flat_map(|c| c.iter()).filter(|c| !c.same_opening(&skeleton)).cloned())
                .take(CANDIDATES)
                .collect();
            cache.insert(key, kept.clone());
            parsed.memo.kept = Some(Kept { cache: cache.clone(), key, candidates: kept });
        }
        (parsed, if reused > 0 { Reuse::Hit } else { Reuse::Miss })
    }
}
