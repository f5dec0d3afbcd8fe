//! What compactor remembers per session, as versioned JSON.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The version of the stored JSON; a record of another version is ignored, never misread.
pub const STATE_VERSION: u32 = 1;

/// Compaction records kept per session: the newest are the ones that can still match.
pub const MAX_RECORDS: usize = 20;

/// Token usage the upstream reported for the last request of the session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// How many messages (items) that request had, for the hybrid estimate.
    pub message_count: u64,
}

/// One compaction: the covered prefix replaced by a summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionRecord {
    pub generation: u32,
    pub summary: String,
    /// How many messages of the client's history the summary covers.
    pub covered_messages: u64,
    /// Hash of those messages' bytes: a history that no longer starts with them does not match.
    pub covered_hash: String,
    pub first_kept: u64,
    /// Indices of the user's own messages from the covered part, kept verbatim after the summary.
    #[serde(default)]
    pub user_messages: Vec<u32>,
    /// The aggressive rung's cap on user messages (0 = none).
    #[serde(default)]
    pub truncate_user_tokens: u32,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub trigger: String,
    pub model: String,
    pub at_unix_ms: u64,
}

/// Request and savings counters, and the compaction circuit breaker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub requests: u64,
    pub tokens_saved: u64,
    /// Compactions that failed in a row.
    #[serde(default)]
    pub compaction_failures: u64,
    /// How many messages the conversation had at the last failure: a changed conversation resets
    /// the breaker.
    #[serde(default)]
    pub failures_at_messages: u64,
    /// Set by the admin API: compact on the next request.
    #[serde(default)]
    pub compact_requested: u64,
    /// The real context window an overflow error named for this session's model.
    #[serde(default)]
    pub learned_window: u64,
}

/// Everything kept for one session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    pub version: u32,
    /// Call ids whose outputs are pruned: once pruned, pruned in every later request.
    pub pruned: BTreeSet<String>,
    pub compactions: Vec<CompactionRecord>,
    pub usage: Option<Usage>,
    pub counters: Counters,
}

/// What one request adds to its session, written by its [`super::SessionCtx`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionUpdate {
    pub pruned: Vec<String>,
    pub usage: Option<Usage>,
    pub tokens_saved: u64,
    pub compaction: Option<CompactionRecord>,
    /// Forget the last usage (a compaction made it stale).
    pub clear_usage: bool,
    /// New absolute values of the breaker and flags, when they change.
    pub breaker: Option<(u64, u64)>,
    pub compact_requested: Option<bool>,
    pub learned_window: Option<u64>,
    /// Count this as a request (the admin API's writes are not).
    pub count_request: bool,
}

impl SessionState {
    pub fn apply(&mut self, update: &SessionUpdate) {
        self.version = STATE_VERSION;
        self.pruned.extend(update.pruned.iter().cloned());
        if update.usage.is_some() {
            self.usage = update.usage;
        }
        if update.clear_usage {
            self.usage = None;
        }
        if let Some((failures, at)) = update.breaker {
            self.counters.compaction_failures = failures;
            self.counters.failures_at_messages = at;
        }
        if let Some(requested) = update.compact_requested {
            self.counters.compact_requested = u64::from(requested);
        }
        if let Some(window) = update.learned_window {
            self.counters.learned_window = window;
        }
        if update.count_request {
            self.counters.requests += 1;
        }
        self.counters.tokens_saved += update.tokens_saved;
        if let Some(record) = &update.compaction {
            self.compactions.push(record.clone());
            let excess = self.compactions.len().saturating_sub(MAX_RECORDS);
            self.compactions.drain(..excess);
        }
    }
}
