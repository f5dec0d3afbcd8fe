//! What compactor remembers, in two parts: per session, what is true of the session as a whole
//! (its model's learned window, its counters, the admin API's request to compact), and per
//! conversation inside the session, what was decided for that history (pruned ids, compaction
//! records, the last usage, the compaction breaker). A session holds several conversations: an
//! agent's main loop, its subagents, its side requests.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::runs::RunLengths;

/// The version of the stored schema: a session another version wrote is served without its state
/// and left alone, never misread, deleted or overwritten (docs/sessions-state.md, upgrades).
pub const STATE_VERSION: u32 = 1;

/// Compaction records kept per conversation: the newest are the ones that can still match.
pub const MAX_RECORDS: usize = 20;

pub use crate::usage::Usage;

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
    /// A record prepared in the background (0: made by the request that applied it): the size of
    /// the client's history (compactor's estimate) at which it was foreseen to be needed. It waits
    /// for the first request that needs a compaction, which applies it, as do the ones after.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub due_tokens: u64,
    /// What its summary calls cost (the inspector's figures, the background summaries' metric).
    #[serde(default, skip_serializing_if = "SummaryCost::is_empty")]
    pub cost: SummaryCost,
    /// The request whose compaction made it (for a record prepared in the background: the request
    /// whose growth started it), by its request id; empty in records stored before it was kept.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub started_by: String,
    /// The generation whose summary this one carries on (the record the request applied when it
    /// summarized; 0: none): a record prepared in the background that a request applied and at
    /// once summarized further is named here, though no request carried it.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub built_on: u32,
    /// What its summary calls took per token they generated, in microseconds (0: not measured):
    /// the wall time over the output tokens. A call that read the conversation from a local
    /// server's cache (the summary prepared in the background) measures the server's generation;
    /// one that sent a transcript also paid its prefill, so its figure is an upper bound.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub us_per_token: u64,
}

/// What a compaction's summary calls cost: the provider's usage summed over them, compactor's
/// estimate for an answer that reported none (`estimated`). Tokens in the provider's count;
/// `input` is the whole prompt, the parts read from and written to its cache included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SummaryCost {
    pub calls: u32,
    pub input: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_read: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_write: u64,
    pub output: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

impl SummaryCost {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Adds one answer's usage, or compactor's estimate of it (`input`, `output`) when the
    /// answer reported none.
    pub fn add(&mut self, reported: Option<&Usage>, input: u64, output: u64) {
        self.calls += 1;
        match reported {
            Some(usage) => {
                self.input = self.input.saturating_add(usage.prompt_tokens);
                self.cache_read = self.cache_read.saturating_add(usage.cached_tokens);
                self.cache_write = self.cache_write.saturating_add(usage.cache_write_tokens);
                self.output = self.output.saturating_add(usage.output_tokens);
            }
            None => {
                self.input = self.input.saturating_add(input);
                self.output = self.output.saturating_add(output);
                self.estimated = true;
            }
        }
    }
}

#[cfg(test)]
impl CompactionRecord {
    /// A record of `generation` with nothing in it: tests fill in what they look at.
    pub fn blank(generation: u32) -> Self {
        Self {
            generation,
            summary: String::new(),
            covered_messages: 0,
            covered_hash: String::new(),
            first_kept: 0,
            user_messages: Vec::new(),
            truncate_user_tokens: 0,
            tokens_before: 0,
            tokens_after: 0,
            trigger: String::new(),
            model: String::new(),
            at_unix_ms: 0,
            due_tokens: 0,
            cost: SummaryCost::default(),
            started_by: String::new(),
            built_on: 0,
            us_per_token: 0,
        }
    }
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

/// The session's counters and what is true of its model, shared by its conversations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub requests: u64,
    pub tokens_saved: u64,
    /// Set by the admin API: compact on the next request whose conversation has something to
    /// summarize.
    #[serde(default)]
    pub compact_requested: u64,
    /// What the session learned of its model's window and tokenizer.
    #[serde(flatten)]
    pub learned: Learned,
    /// Prompt tokens the upstream reported for the session's requests, and how many of them it
    /// read from and wrote to its prompt cache (the admin view's hit ratio).
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Requests that pruned something, that ran on a compaction, that recovered from an
    /// overflow: what the inspector's session list filters on.
    #[serde(default)]
    pub pruned_requests: u64,
    #[serde(default)]
    pub compacted_requests: u64,
    #[serde(default)]
    pub overflow_requests: u64,
}

/// What compactor learned of one (upstream, model) from its answers: bounds on the real window
/// and how the provider's tokenizer counts against compactor's estimate. Kept per session and, so
/// a new session starts with it, per (upstream, model). Sizes are in the provider's tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Learned {
    /// Which (upstream, model) these values describe (a hash; 0: none yet).
    #[serde(default)]
    pub model_tag: u64,
    /// The window an overflow error named (0: none).
    #[serde(default, rename = "learned_window")]
    pub window: u64,
    /// The smallest request that overflowed without the error naming the window: the window is
    /// below it (0: none).
    #[serde(default)]
    pub window_below: u64,
    /// The largest prompt plus output the provider answered: the window is at least this.
    #[serde(default)]
    pub window_at_least: u64,
    /// Provider tokens per 1,000 tokens of compactor's estimate, smoothed (0: not measured).
    #[serde(default)]
    pub calibration_milli: u64,
    /// The largest answer (output tokens) the provider generated for the session.
    #[serde(default)]
    pub output_peak: u64,
    /// The window the upstream states it has (a local server's `/props`, `/v1/models`,
    /// `/api/ps`), for this process: it stands for the model table's window; never stored, asked
    /// again by each process.
    #[serde(skip)]
    pub stated: u64,
}

/// Bounds of a calibration ratio (provider tokens per 1,000 of compactor's estimate): outside them
/// a measurement says more about a misread usage report than about a tokenizer.
pub const CALIBRATION_MILLI: (u64, u64) = (500, 3_000);

/// Calibration measurements one request keeps for its commit (the newest): a request measures
/// once per upstream answer, so a handful at most.
pub const MAX_MEASURED: usize = 8;

/// What one request learned of its model, merged field by field into what is stored, so that a
/// parallel request (or another replica) committing what it saw earlier never undoes it: the
/// window bounds only tighten, the largest answers only grow, and each calibration measurement
/// is folded into the stored smoothing rather than a stale smoothed value overwriting a newer one.
/// [`Learned::merge`] is the rule; the Redis store runs the same rule in one script.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LearnedChange {
    /// What the request knows of its model: the model, the bounds it saw or learned. Its
    /// `calibration_milli` is the calibration the request started from (its model's profile for a
    /// new session), used only where nothing is stored yet.
    pub known: Learned,
    /// The request's calibration measurements, oldest first, already bounded to
    /// [`CALIBRATION_MILLI`].
    pub measured: Vec<u64>,
}

impl Learned {
    /// One calibration measurement folded into the smoothed ratio.
    pub fn smooth(old: u64, observed: u64) -> u64 {
        let (low, high) = CALIBRATION_MILLI;
        match old {
            0 => observed,
            old => (old.saturating_mul(6).saturating_add(observed.saturating_mul(4)) / 10).clamp(low, high),
        }
    }

    /// Merges what one request learned into this (the stored value). Another model's values are
    /// replaced (the session talks to another model now); the same model's are joined: the
    /// smallest window an error named, the smallest request that overflowed, the largest answer
    /// and output, the request's measurements folded into the stored calibration. An overflow
    /// bound that an answer contradicts (the provider answered that much) is dropped.
    pub fn merge(&mut self, change: &LearnedChange) {
        let known = &change.known;
        if self.model_tag != known.model_tag {
            *self = *known;
        } else {
            self.window = smallest_set(self.window, known.window);
            self.window_below = smallest_set(self.window_below, known.window_below);
            self.window_at_least = self.window_at_least.max(known.window_at_least);
            self.output_peak = self.output_peak.max(known.output_peak);
            if self.calibration_milli == 0 {
                self.calibration_milli = known.calibration_milli;
            }
        }
        for observed in &change.measured {
            self.calibration_milli = Self::smooth(self.calibration_milli, *observed);
        }
        if self.window_below > 0 && self.window_below <= self.window_at_least {
            self.window_below = 0;
        }
    }
}

/// The smaller of two bounds where 0 means "none".
fn smallest_set(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, other) | (other, 0) => other,
        (a, b) => a.min(b),
    }
}

/// What is kept for a session as a whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    pub version: u32,
    pub counters: Counters,
    /// How long conversations of the model run (kept under the model's key only).
    #[serde(default, skip_serializing_if = "RunLengths::is_empty")]
    pub runs: RunLengths,
}

/// Compactions of one conversation that failed in a row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    pub failures: u64,
    /// How many messages the conversation had at the last failure: a grown conversation starts
    /// the count again.
    pub at_messages: u64,
}

/// What is kept for one conversation of a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConversationState {
    /// Call ids whose outputs are pruned: once pruned, pruned in every later request.
    pub pruned: BTreeSet<String>,
    pub compactions: Vec<CompactionRecord>,
    pub usage: Option<Usage>,
    pub breaker: Breaker,
    /// Requests of this conversation, and the messages the newest of them had.
    pub requests: u64,
    pub messages: u64,
    /// When the newest request of the conversation arrived (Unix ms; 0: never): the provider's
    /// cache has gone cold once it is older than the cache's lifetime.
    #[serde(default)]
    pub last_request_unix_ms: u64,
    /// Requests of the conversation's current run: each within the cache's lifetime of the one
    /// before ([`super::runs`]).
    #[serde(default)]
    pub run: u64,
    /// The generation of a record prepared in the background whose rebuilt prompt compactor sent
    /// ahead to a local server ([`crate::compaction`]'s prefill ahead; 0: none): the server's
    /// cache now holds that prompt, not the conversation as the client last sent it, so the next
    /// request applies the record whether or not it needs the room yet.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub prefilled: u32,
    /// When the newest answered request's answer ended (Unix ms; 0: never).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub answered_unix_ms: u64,
    /// The agent's time between an answer and its next request (its tool and its own thinking),
    /// smoothed towards the shorter gaps ([`ConversationState::smooth_idle`]; 0: not measured):
    /// the time a local server has for a summary prepared in the background.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub idle_ms: u64,
}

impl ConversationState {
    /// One gap between an answer and the next request folded into [`ConversationState::idle_ms`]:
    /// a shorter gap pulls it half way down, a longer one a quarter of the way up. A summary sized
    /// to a gap the agent does not leave lands on its next turn, so the figure leans short.
    pub fn smooth_idle(old: u64, observed: u64) -> u64 {
        match old {
            0 => observed,
            old if observed < old => old.midpoint(observed),
            old => old.saturating_mul(3).saturating_add(observed) / 4,
        }
    }

    /// What the newest summary call of the conversation took per token it generated
    /// ([`CompactionRecord::us_per_token`]; `None`: none measured).
    pub fn summary_pace_us(&self) -> Option<u64> {
        self.compactions.iter().rev().map(|record| record.us_per_token).find(|&pace| pace > 0)
    }

    /// True when nothing was ever recorded for it (an unknown or expired conversation).
    pub fn is_empty(&self) -> bool {
        self.requests == 0 && self.pruned.is_empty() && self.compactions.is_empty() && self.usage.is_none()
    }
}

/// What one request changes of its session as a whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionUpdate {
    /// Count this as a request (the admin API's writes are not).
    pub count_request: bool,
    pub tokens_saved: u64,
    pub compact_requested: Option<bool>,
    /// What the request learned of its model, merged into what the session learned.
    pub learned: Option<LearnedChange>,
    /// The upstream's usage for one request, added to the session's cache counters.
    pub usage: Option<Usage>,
    /// What the request did, for the inspector's filters (counted, never stored per request here).
    pub marks: Marks,
}

/// What one request did that the inspector's session list filters on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    pub pruned: bool,
    pub compacted: bool,
    pub overflow: bool,
}

/// What one request changes of its conversation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConversationUpdate {
    pub pruned: Vec<String>,
    pub usage: Option<Usage>,
    /// Forget the last usage (a compaction made it stale).
    pub clear_usage: bool,
    pub compaction: Option<CompactionRecord>,
    /// The breaker's new value, when it changes.
    pub breaker: Option<Breaker>,
    /// Count this as a request of the conversation, with this many messages.
    pub request_messages: Option<u64>,
    /// When that request arrived (Unix ms).
    pub request_at_unix_ms: Option<u64>,
    /// The request's turn in the conversation's current run.
    pub run: Option<u64>,
    /// The record whose rebuilt prompt was sent ahead ([`ConversationState::prefilled`]).
    pub prefilled: Option<u32>,
    /// When the request's answer ended (Unix ms).
    pub answered_at_unix_ms: Option<u64>,
    /// The conversation's idle time with the gap before this request folded in.
    pub idle_ms: Option<u64>,
    /// The request's summary for the inspector (JSON of [`crate::inspector::RequestRecord`]),
    /// appended to the conversation's bounded request log.
    pub record: Option<String>,
}

/// A run of a conversation reached a bucket of its model's histogram ([`super::runs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRun {
    /// The model's store key.
    pub store_key: String,
    pub bucket: usize,
}

/// Everything one write adds: the session part and the conversation part, stored together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Update {
    pub session: SessionUpdate,
    pub conversation: ConversationUpdate,
    /// Counted in the model's histogram of run lengths, written with the rest.
    pub model_run: Option<ModelRun>,
}

impl Update {
    pub fn is_empty(&self) -> bool {
        *self == Update::default()
    }
}

impl SessionState {
    pub fn apply(&mut self, update: &SessionUpdate) {
        self.version = STATE_VERSION;
        if let Some(requested) = update.compact_requested {
            self.counters.compact_requested = u64::from(requested);
        }
        if let Some(learned) = &update.learned {
            self.counters.learned.merge(learned);
        }
        // Saturating: a counter that wrapped would report a long session as a fresh one.
        let counters = &mut self.counters;
        counters.requests = counters.requests.saturating_add(u64::from(update.count_request));
        counters.tokens_saved = counters.tokens_saved.saturating_add(update.tokens_saved);
        if let Some(usage) = update.usage {
            counters.prompt_tokens = counters.prompt_tokens.saturating_add(usage.prompt_tokens);
            counters.cache_read_tokens = counters.cache_read_tokens.saturating_add(usage.cached_tokens);
            counters.cache_write_tokens = counters.cache_write_tokens.saturating_add(usage.cache_write_tokens);
        }
        let marks = update.marks;
        counters.pruned_requests = counters.pruned_requests.saturating_add(u64::from(marks.pruned));
        counters.compacted_requests = counters.compacted_requests.saturating_add(u64::from(marks.compacted));
        counters.overflow_requests = counters.overflow_requests.saturating_add(u64::from(marks.overflow));
    }
}

impl ConversationState {
    pub fn apply(&mut self, update: &ConversationUpdate) {
        self.pruned.extend(update.pruned.iter().cloned());
        if update.usage.is_some() {
            self.usage = update.usage;
        }
        if update.clear_usage {
            self.usage = None;
        }
        if let Some(breaker) = update.breaker {
            self.breaker = breaker;
        }
        if let Some(messages) = update.request_messages {
            self.requests += 1;
            self.messages = messages;
        }
        if let Some(at) = update.request_at_unix_ms {
            self.last_request_unix_ms = at;
        }
        if let Some(run) = update.run {
            self.run = run;
        }
        if let Some(generation) = update.prefilled {
            self.prefilled = generation;
        }
        if let Some(at) = update.answered_at_unix_ms {
            self.answered_unix_ms = at;
        }
        if let Some(idle) = update.idle_ms {
            self.idle_ms = idle;
        }
        // Fencing: a record of a generation already stored (a holder whose lock lapsed while
        // another took over) is not laid beside the winner's.
        let newest = self.compactions.iter().map(|r| r.generation).max().unwrap_or(0);
        if let Some(record) = update.compaction.as_ref().filter(|record| record.generation > newest) {
            self.compactions.push(record.clone());
            let excess = self.compactions.len().saturating_sub(MAX_RECORDS);
            self.compactions.drain(..excess);
        }
    }
}

/// One conversation as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConversationView {
    pub id: String,
    pub last_used_unix_ms: u64,
    pub pruned_count: usize,
    #[serde(flatten)]
    pub state: ConversationState,
}

/// A session as the admin API shows it: its own state and its conversations, most recently used
/// first.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SessionView {
    #[serde(flatten)]
    pub session: SessionState,
    /// Share of the session's reported prompt tokens the provider read from its cache (null
    /// before any usage was reported).
    pub cache_hit_ratio: Option<f64>,
    pub conversations: Vec<ConversationView>,
}

impl SessionView {
    pub fn new(session: SessionState, conversations: Vec<ConversationView>) -> Self {
        let counters = session.counters;
        let cache_hit_ratio = (counters.prompt_tokens > 0)
            .then(|| (counters.cache_read_tokens as f64 / counters.prompt_tokens as f64 * 1000.0).round() / 1000.0);
        Self { session, cache_hit_ratio, conversations }
    }

    /// True when the store knows nothing of the session.
    pub fn is_empty(&self) -> bool {
        self.session.counters == Counters::default() && self.conversations.iter().all(|c| c.state.is_empty())
    }
}

impl ConversationView {
    pub fn new(id: String, last_used_unix_ms: u64, state: ConversationState) -> Self {
        Self { id, last_used_unix_ms, pruned_count: state.pruned.len(), state }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_time_leans_to_the_shorter_gaps_and_the_pace_is_the_newest_measured() {
        // The first gap is taken as it is; a shorter one pulls half way down, a longer one a
        // quarter of the way up.
        assert_eq!(ConversationState::smooth_idle(0, 8_000), 8_000);
        assert_eq!(ConversationState::smooth_idle(8_000, 2_000), 5_000);
        assert_eq!(ConversationState::smooth_idle(8_000, 12_000), 9_000);
        let record = |generation: u32, us_per_token: u64| CompactionRecord {
            us_per_token,
            ..CompactionRecord::blank(generation)
        };
        let mut conversation = ConversationState::default();
        assert_eq!(conversation.summary_pace_us(), None);
        conversation.compactions = vec![record(1, 90_000), record(2, 34_000), record(3, 0)];
        // A record stored before the pace was kept measured nothing: the one before it counts.
        assert_eq!(conversation.summary_pace_us(), Some(34_000));
    }

    #[test]
    fn counters_near_their_limit_stay_at_it_instead_of_wrapping() {
        let mut session = SessionState::default();
        session.counters.requests = u64::MAX;
        session.counters.tokens_saved = u64::MAX - 1;
        session.counters.prompt_tokens = u64::MAX - 5;
        let usage = Usage { prompt_tokens: 10, cached_tokens: u64::MAX, cache_write_tokens: 3, ..Usage::default() };
        session.apply(&SessionUpdate {
            count_request: true,
            tokens_saved: 7,
            usage: Some(usage),
            ..Default::default()
        });
        session.apply(&SessionUpdate { usage: Some(usage), ..Default::default() });
        let counters = &session.counters;
        assert_eq!((counters.requests, counters.tokens_saved, counters.prompt_tokens), (u64::MAX, u64::MAX, u64::MAX));
        assert_eq!((counters.cache_read_tokens, counters.cache_write_tokens), (u64::MAX, 6));
    }
}
