//! A request's session state, [`SessionCtx`]: loaded once when the request arrives (the session's
//! own state and its conversation's, in one read), changed in memory while compactor works on it
//! (outputs pruned, usage, breaker, learned window, compaction records, counters), and committed
//! once, by an explicit awaited [`SessionCtx::commit`] from the request's finisher. It is the one
//! owner of the session's store I/O: every failure is logged with the session key (at most one
//! warning per interval) and counted, never dropped.
//!
//! One documented exception to "commit once": the outcome of a compaction is published at once,
//! while the conversation's compaction lock is held, because other requests of the same
//! conversation (on any replica) are waiting for the record before they take the lock themselves.
//!
//! What the request learns of its model and its runs is in `learning`, the compaction lock and
//! what is published at once under it in `compaction`, the commit and the reporting of store
//! failures in `commit`.

mod commit;
mod compaction;
mod learning;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::error::StoreError;
use super::identify::{ConversationId, SessionKey};
use super::runs::RunLengths;
use super::state::{ConversationState, SessionState, Update};
use super::store::Store;
use crate::telemetry::{RateLimited, trace};
use tracing::Instrument;

/// Store warnings are limited process-wide: a store that is down fails every request alike.
static STORE_WARNINGS: LazyLock<RateLimited> = LazyLock::new(|| RateLimited::new(Duration::from_secs(10)));

pub use super::state::CALIBRATION_MILLI;

/// The (tenant, upstream, model) a request talks to: what the session learns of it is also kept
/// under its own store key, so a new session of the same tenant and model starts with it. The
/// tenant is part of the key so that nothing one tenant's requests teach (a window an error
/// named, a tokenizer calibration, how long runs last) changes what compactor decides for another
/// tenant (docs/security.md, "What is learned from whom").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelKey {
    pub tag: u64,
    store_key: String,
    /// The model's name, as the request gave it (the inspector shows it).
    name: String,
}

impl ModelKey {
    pub fn new(tenant: &str, upstream: &str, model: &str) -> Self {
        // The hash of `tenant\0upstream\0model`, streamed: equal to the one-shot hash of the
        // joined text.
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(tenant.as_bytes());
        hasher.update(b"\0");
        hasher.update(upstream.as_bytes());
        hasher.update(b"\0");
        hasher.update(model.as_bytes());
        // Never 0, which means "nothing learned yet".
        let tag = hasher.digest().max(1);
        Self { tag, store_key: "model.".to_owned() + &crate::hex::u64(tag), name: model.to_string() }
    }
}

/// One request's view of its session and of its conversation inside it.
pub struct SessionCtx {
    key: SessionKey,
    conversation_id: ConversationId,
    store: Store,
    /// What is true of the session as a whole (its model, its counters).
    session: SessionState,
    /// What was decided for this conversation (shared with the in-process store until changed).
    conversation: Arc<ConversationState>,
    /// What this request adds, written by [`SessionCtx::commit`].
    pending: Update,
    /// Messages of the client's request, stored with the usage for the hybrid estimate.
    message_count: u64,
    /// The model the request talks to, once known.
    model: Option<ModelKey>,
    /// compactor's estimate (vendor factor applied, not calibrated) of the body that went out
    /// last, set against the usage the provider reports for it.
    forwarded_estimate: u64,
    /// The compaction generation applied to the body sent last, stored with its usage.
    forwarded_generation: u32,
    /// Another schema version wrote the session (or the model's profile): this request works
    /// without its state and writes nothing there, so that version's replicas keep it.
    foreign_session: bool,
    foreign_model: bool,
    /// How long conversations of the model run, as the store last said.
    runs: RunLengths,
    /// Whether the upstream answered the request (a 2xx status): only an answered request
    /// counts toward its conversation's run and the model's run lengths.
    answered: bool,
}

impl SessionCtx {
    /// Loads the session's state and the conversation's; when the store fails, the request goes
    /// on with an empty state (the policies still work, they just start afresh).
    ///
    /// Boxed where it is made, after the store answered: the context is large, and made before
    /// the load it lived in the load's future and was copied whole at each move on its way out.
    pub async fn load(store: Store, key: SessionKey, conversation_id: ConversationId) -> Box<Self> {
        let span = trace::stage("compactor.session.load", key.as_str());
        let loaded = store.load(key.as_str(), conversation_id.as_str()).instrument(span.clone()).await;
        if loaded.is_err() {
            span.record("otel.status_code", "ERROR");
        }
        let mut ctx = Box::new(Self {
            key,
            conversation_id,
            store,
            session: SessionState::default(),
            conversation: Arc::default(),
            pending: Update::default(),
            message_count: 0,
            model: None,
            forwarded_estimate: 0,
            forwarded_generation: 0,
            foreign_session: false,
            foreign_model: false,
            runs: RunLengths::default(),
            answered: false,
        });
        match loaded {
            Ok((session, conversation)) => (ctx.session, ctx.conversation) = (session, conversation),
            Err(StoreError::OtherVersion(version)) => {
                tracing::debug!(session = %ctx.key.as_str(), version, "session of another schema version left alone");
                ctx.foreign_session = true;
            }
            Err(error) => ctx.report(&error, "load"),
        }
        ctx
    }

    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    pub fn conversation_id(&self) -> &ConversationId {
        &self.conversation_id
    }

    /// The session as this request sees it: as loaded, with this request's changes.
    pub fn session(&self) -> &SessionState {
        &self.session
    }

    /// The request's conversation as this request sees it: as loaded (or adopted after waiting
    /// for another request's compaction), with what was published since.
    pub fn conversation(&self) -> &ConversationState {
        &self.conversation
    }

    /// Counts the request and what it saved, and remembers the outputs it pruned for the first
    /// time (`message_count`: messages as the client sent them).
    pub fn record_request(&mut self, pruned: &[String], tokens_saved: u64, message_count: usize) {
        self.pending.session.count_request = true;
        self.pending.session.tokens_saved += tokens_saved;
        let change = &mut self.pending.conversation;
        change.pruned.extend(pruned.iter().filter(|id| !self.conversation.pruned.contains(*id)).cloned());
        change.request_messages = Some(message_count as u64);
        let now = super::unix_ms();
        change.request_at_unix_ms = Some(now);
        // The agent's gap since the previous request's answer, when that answer ended before this
        // request came (a request sent beside another measures nothing).
        let conversation = &self.conversation;
        let answered = conversation.answered_unix_ms;
        if answered > 0 && answered >= conversation.last_request_unix_ms && answered <= now {
            change.idle_ms = Some(ConversationState::smooth_idle(conversation.idle_ms, now - answered));
        }
        self.message_count = message_count as u64;
    }

    /// The request's answer has ended (its last byte sent, or the client gone): the start of the
    /// agent's idle time, measured when its next request comes.
    pub fn note_answered(&mut self) {
        self.pending.conversation.answered_at_unix_ms = Some(super::unix_ms());
    }

    /// The status the client got. A request the upstream refused (401, 429, a 5xx...) is not a
    /// turn of the conversation: it counts toward no run ([`SessionCtx::count_turn`]), so
    /// refused requests cannot lengthen the horizon rewrites are priced over.
    pub fn note_status(&mut self, status: u16) {
        self.answered = (200..300).contains(&status);
    }

    /// The model the request names, once known.
    pub fn model_name(&self) -> &str {
        self.model.as_ref().map_or("", |model| model.name.as_str())
    }

    /// Whether the store keeps the inspector's request summaries.
    pub fn records_requests(&self) -> bool {
        self.store.records_requests()
    }

    /// Adds the request's summary for the inspector (its JSON) to the commit, and what the
    /// session list filters on (`marks`) to the session's counters.
    pub fn inspect(&mut self, record: String, marks: super::Marks) {
        self.pending.conversation.record = Some(record);
        self.pending.session.marks = marks;
    }

    /// Remembers outputs a recovery rung pruned, like any pruned id: the next request of the
    /// conversation sends the same placeholder.
    pub fn remember_pruned(&mut self, pruned: &[String]) {
        let change = &mut self.pending.conversation;
        for id in pruned {
            if !self.conversation.pruned.contains(id) && !change.pruned.contains(id) {
                change.pruned.push(id.clone());
            }
        }
    }

    /// How long ago the conversation's previous request arrived; `None` for its first.
    pub fn idle(&self) -> Option<Duration> {
        let last = self.conversation.last_request_unix_ms;
        (last > 0).then(|| Duration::from_millis(super::unix_ms().saturating_sub(last)))
    }
}

#[cfg(test)]
mod tests;
