//! Sessions: which session and which conversation inside it a request belongs to, and the state
//! compactor keeps for them so the next request of the same conversation gets the same rewrite, on
//! any replica.

pub mod breaker;
pub mod ctx;
pub mod error;
pub mod identify;
pub mod logouts;
pub mod memory;
pub mod redis;
pub mod runs;
pub mod state;
pub mod store;

pub use ctx::{ModelKey, SessionCtx};
pub use error::StoreError;
pub use identify::{ConversationId, Identifier, SessionKey, SessionSource};
pub use state::{
    Breaker, CompactionRecord, ConversationState, ConversationUpdate, ConversationView, Learned, LearnedChange, Marks,
    SessionState, SessionUpdate, SessionView, SummaryCost, Update, Usage,
};
pub use store::Store;

/// Milliseconds since the Unix epoch (0 with a clock set before it).
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
