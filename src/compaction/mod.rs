//! Compaction: replace the older part of a conversation with a summary of it. This module is pure
//! (no I/O): it chooses where to cut, renders what the summarizer reads, builds the summary request
//! and the rebuilt conversation, and re-applies stored records byte for byte. The proxy stage that
//! calls the upstream and the store lives in `proxy::recover`.

pub mod agent;
pub mod plan;
pub mod settings;
pub mod summary;

pub use settings::CompactionSettings;
