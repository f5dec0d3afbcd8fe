//! Prefix reuse across turns: an agent resends its whole conversation every turn, and everything
//! but the last few messages is byte for byte what compactor parsed one turn ago. A [`Skeleton`]
//! remembers where the last parse found each thing (as byte ranges of its body); when the next
//! body starts with the same bytes, the messages inside that common prefix are re-made from the
//! new body by slicing it at the same offsets, and only the rest is read. Nothing of the old body
//! is trusted beyond the bytes compared: the result is the parse of the new body, the same as a
//! fresh one (`tests/library/prefix_reuse.rs` proves it).
//!
//! Skeletons live in process memory only, in a cache bounded in bytes
//! (`limits.prefix_cache_bytes`), under a key of the client's credential and session header: a
//! collision or a stale entry only costs the reuse, never the result.
//!
//! What is kept of a parse (`skeleton`), re-making the next body's head from it (`head`), what a
//! parse carries across turns (`memo`, `renders`), and the cache the skeletons live in, under
//! their keys (`cache`, `key`).

mod cache;
mod head;
mod key;
mod memo;
mod rendered;
mod renders;
mod skeleton;

pub use cache::{Earlier, PrefixCache, Reuse};
pub(crate) use head::Head;
pub use head::{common_prefix, parse_reusing};
pub use key::PrefixKey;
pub use memo::Memo;
pub use skeleton::Skeleton;
