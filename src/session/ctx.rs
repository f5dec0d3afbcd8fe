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

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::error::StoreError;
use super::identify::{ConversationId, SessionKey};
use super::runs::RunLengths;
use super::state::{
    Breaker, CompactionRecord, ConversationState, ConversationUpdate, Learned, LearnedChange, MAX_MEASURED, ModelRun,
    SessionState, SessionUpdate, Update, Usage,
};
use super::store::Store;
use crate::error::Chain;
use crate::telemetry::{RateLimited, metric, trace};
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

    /// Says which (tenant, upstream, model) the request talks to. When the session learned nothing of
    /// that model yet (a new session, or one that switched models), it starts with what earlier
    /// sessions learned of it.
    pub async fn use_model(&mut self, model: ModelKey) {
        if self.session.counters.learned.model_tag != model.tag {
            let mut learned = match self.store.load(&model.store_key, "-").await {
                Ok((profile, _)) if profile.counters.learned.model_tag == model.tag => profile.counters.learned,
                Ok(_) => Learned::default(),
                Err(StoreError::OtherVersion(_)) => {
                    self.foreign_model = true;
                    Learned::default()
                }
                Err(error) => {
                    self.report(&error, "load");
                    Learned::default()
                }
            };
            learned.model_tag = model.tag;
            self.set_learned(learned);
        }
        self.runs = match self.store.run_lengths(&model.store_key).await {
            Ok(runs) => runs,
            Err(error) => {
                self.report(&error, "load");
                RunLengths::default()
            }
        };
        self.model = Some(model);
    }

    /// This request's turn in its conversation's run: 1 after a pause of `lifetime` or more (the
    /// provider's cache has gone cold), the previous request's turn plus one otherwise.
    pub fn run_turn(&self, lifetime: Duration) -> u64 {
        match self.idle() {
            Some(idle) if idle < lifetime => self.conversation.run + 1,
            _ => 1,
        }
    }

    /// Turns the conversation will still run on a warm cache after this request, with
    /// probability `confidence`, by what the deployment measured of its model (and `assumed`
    /// runs, `[prune] assumed_runs`); 0 when nothing is known.
    pub fn later_turns(&self, lifetime: Duration, confidence: f64, assumed: &[u64]) -> u64 {
        let runs = if assumed.is_empty() { self.runs } else { self.runs.with_assumed(assumed) };
        runs.remaining(self.run_turn(lifetime), confidence)
    }

    /// Counts this request in its conversation's run, and the run in the model's histogram when
    /// it starts a bucket (written with the commit).
    pub fn count_turn(&mut self, lifetime: Duration) {
        let turn = self.run_turn(lifetime);
        self.pending.conversation.run = Some(turn);
        if let (Some(bucket), Some(model)) = (RunLengths::boundary(turn), &self.model) {
            self.pending.model_run = Some(ModelRun { store_key: model.store_key.clone(), bucket });
        }
    }

    /// What the session learned of its model's window and tokenizer.
    pub fn learned(&self) -> &Learned {
        &self.session.counters.learned
    }

    /// Takes `learned` as what the session knows of its model now; the commit merges it into
    /// what is stored field by field ([`Learned::merge`]), with the calibration the request
    /// started from, so what a parallel request learned meanwhile stands.
    fn set_learned(&mut self, learned: Learned) {
        if self.session.counters.learned == learned {
            return;
        }
        let started_from = match &self.pending.session.learned {
            Some(change) if change.known.model_tag == learned.model_tag => change.known.calibration_milli,
            _ => learned.calibration_milli,
        };
        let change = self.pending.session.learned.get_or_insert_with(LearnedChange::default);
        if change.known.model_tag != learned.model_tag {
            // Another model: what was measured of the previous one is not this one's.
            change.measured.clear();
        }
        change.known = Learned { calibration_milli: started_from, ..learned };
        self.session.counters.learned = learned;
    }

    /// Changes what the session learned of its model's window (its bounds; the calibration
    /// changes by measurements only, [`SessionCtx::measure`]).
    pub fn learn(&mut self, change: impl FnOnce(&mut Learned)) {
        let mut learned = self.session.counters.learned;
        change(&mut learned);
        learned.calibration_milli = self.session.counters.learned.calibration_milli;
        self.set_learned(learned);
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

    /// Remembers the real context window an overflow error named, for the session's later
    /// estimates (every conversation of the session talks to the same model).
    pub fn learn_window(&mut self, window: u64) {
        if window > 0 {
            self.learn(|learned| learned.window = window);
        }
    }

    /// compactor's estimate of the body it sent (vendor factor applied, not calibrated): the
    /// provider's usage report for it is a measurement of the provider's tokenizer.
    pub fn note_forwarded(&mut self, estimate: u64) {
        self.forwarded_estimate = estimate;
    }

    /// The compaction generation applied to the body sent (0: none): its usage is stored with it.
    pub fn note_generation(&mut self, generation: u32) {
        self.forwarded_generation = generation;
    }

    /// The estimate of the body sent last ([`SessionCtx::note_forwarded`]).
    pub fn forwarded_estimate(&self) -> u64 {
        self.forwarded_estimate
    }

    /// One measurement of the provider's tokenizer: it counted `provider` tokens where compactor
    /// estimated `estimate`. Smoothed, bounded to [`CALIBRATION_MILLI`].
    pub fn measure(&mut self, provider: u64, estimate: u64) {
        if provider == 0 || estimate == 0 {
            return;
        }
        let (low, high) = CALIBRATION_MILLI;
        let observed = (provider.saturating_mul(1_000) / estimate).clamp(low, high);
        let mut learned = self.session.counters.learned;
        learned.calibration_milli = Learned::smooth(learned.calibration_milli, observed);
        let started_from = self.session.counters.learned.calibration_milli;
        let change = self.pending.session.learned.get_or_insert_with(|| LearnedChange {
            known: Learned { calibration_milli: started_from, ..learned },
            measured: Vec::new(),
        });
        if change.measured.len() == MAX_MEASURED {
            change.measured.remove(0);
        }
        change.measured.push(observed);
        self.session.counters.learned = learned;
    }

    /// How long ago the conversation's previous request arrived; `None` for its first.
    pub fn idle(&self) -> Option<Duration> {
        let last = self.conversation.last_request_unix_ms;
        (last > 0).then(|| Duration::from_millis(super::unix_ms().saturating_sub(last)))
    }

    /// The usage the upstream reported for this request (its cache reads and writes also add
    /// to the session's counters): also what it says of the model (the
    /// window holds at least prompt + output, the tokenizer counts prompt where compactor
    /// estimated what it forwarded, answers are about this long).
    pub fn set_usage(&mut self, mut usage: Usage) {
        usage.message_count = self.message_count;
        usage.generation = self.forwarded_generation;
        self.pending.conversation.usage = Some(usage);
        self.pending.session.usage = Some(usage);
        self.measure(usage.prompt_tokens, self.forwarded_estimate);
        let answered = usage.prompt_tokens.saturating_add(usage.output_tokens);
        self.learn(|learned| {
            learned.window_at_least = learned.window_at_least.max(answered);
            learned.output_peak = learned.output_peak.max(usage.output_tokens);
            if learned.window_below > 0 && learned.window_below <= answered {
                // An answer larger than an earlier unnamed overflow: that bound was too tight.
                learned.window_below = 0;
            }
        });
    }

    /// Takes the conversation's compaction lock for `owner`: `Some(false)` when another owner
    /// holds it, `None` when the store failed (reported).
    pub async fn try_lock(&self, owner: &str, hold: Duration) -> Option<bool> {
        match self.store.try_lock(self.key.as_str(), self.conversation_id.as_str(), owner, hold).await {
            Ok(taken) => Some(taken),
            Err(error) => {
                self.report(&error, "lock");
                None
            }
        }
    }

    /// Extends `owner`'s lock by `lease`: `Some(false)` when its lease lapsed, `None` when the
    /// store failed (reported).
    pub async fn renew_lock(&self, owner: &str, lease: Duration) -> Option<bool> {
        match self.store.renew_lock(self.key.as_str(), self.conversation_id.as_str(), owner, lease).await {
            Ok(renewed) => Some(renewed),
            Err(error) => {
                self.report(&error, "lock");
                None
            }
        }
    }

    /// Releases the lock if `owner` still holds it.
    pub async fn unlock(&self, owner: &str) {
        if let Err(error) = self.store.unlock(self.key.as_str(), self.conversation_id.as_str(), owner).await {
            self.report(&error, "unlock");
        }
    }

    /// The conversation as stored now (another request may have changed it) and whether its
    /// compaction lock is held; `None` when the store failed (reported).
    pub async fn poll(&self) -> Option<(ConversationState, bool)> {
        match self.store.poll(self.key.as_str(), self.conversation_id.as_str()).await {
            Ok(polled) => Some(polled),
            Err(error) => {
                self.report(&error, "load");
                None
            }
        }
    }

    /// Takes a fresher stored state of the conversation in place of the one loaded (after
    /// waiting for another request's compaction); this request's own changes still stand.
    pub fn adopt(&mut self, conversation: ConversationState) {
        self.conversation = Arc::new(conversation);
    }

    /// Publishes a new compaction record at once (under the compaction lock): it makes the
    /// conversation's last usage stale, closes its breaker and answers the session's admin
    /// request to compact. False when the write failed (reported).
    pub async fn publish_compaction(&mut self, record: &CompactionRecord) -> bool {
        let update = Update {
            session: SessionUpdate { compact_requested: Some(false), ..SessionUpdate::default() },
            conversation: ConversationUpdate {
                compaction: Some(record.clone()),
                clear_usage: true,
                breaker: Some(Breaker::default()),
                ..ConversationUpdate::default()
            },
            model_run: None,
        };
        self.publish(update).await
    }

    /// Publishes a failed compaction at once: one more failure in a row on a conversation of
    /// `message_count` messages (a grown conversation starts the count again).
    pub async fn publish_failure(&mut self, message_count: usize) -> bool {
        let breaker = self.conversation.breaker;
        let at_messages = message_count as u64;
        let failures = if breaker.at_messages == at_messages { breaker.failures + 1 } else { 1 };
        let conversation =
            ConversationUpdate { breaker: Some(Breaker { failures, at_messages }), ..ConversationUpdate::default() };
        self.publish(Update { conversation, ..Update::default() }).await
    }

    /// Publishes at once that the prompt rebuilt around record `generation` was sent ahead to the
    /// upstream (a local server's cache holds it): the conversation's next request applies it.
    pub async fn publish_prefilled(&mut self, generation: u32) -> bool {
        let conversation = ConversationUpdate { prefilled: Some(generation), ..ConversationUpdate::default() };
        self.publish(Update { conversation, ..Update::default() }).await
    }

    async fn publish(&mut self, update: Update) -> bool {
        self.session.apply(&update.session);
        Arc::make_mut(&mut self.conversation).apply(&update.conversation);
        if self.foreign_session {
            return true;
        }
        self.write(&update, "publish").await
    }

    /// What a commit writes: what the session learned of its model, under the model's key (for
    /// the model's next sessions too), and this request's changes, under the session's; each
    /// `None` when there is nothing to write or another schema version owns the place.
    /// A request the upstream did not answer takes back its turn ([`SessionCtx::note_status`]).
    fn uncount_unanswered(&mut self) {
        if !self.answered {
            self.pending.conversation.run = None;
            self.pending.model_run = None;
        }
    }

    fn commit_writes(&self) -> (Option<(&str, SessionUpdate)>, Option<&Update>) {
        if self.pending.is_empty() {
            return (None, None);
        }
        let learned = match (&self.pending.session.learned, &self.model) {
            (Some(learned), Some(model)) if !self.foreign_model => {
                let update = SessionUpdate { learned: Some(learned.clone()), ..SessionUpdate::default() };
                Some((model.store_key.as_str(), update))
            }
            _ => None,
        };
        (learned, (!self.foreign_session).then_some(&self.pending))
    }

    /// Writes what this request added, once its response is done. False when the write failed
    /// (reported).
    pub async fn commit(mut self) -> bool {
        self.uncount_unanswered();
        let (learned, changes) = self.commit_writes();
        if let Some((model_key, update)) = learned
            && let Err(error) = self.store.update_session(model_key, &update).await
        {
            self.report(&error, "commit");
        }
        match changes {
            Some(update) => self.write(update, "commit").await,
            None => true,
        }
    }

    /// Whether [`SessionCtx::commit_in_place`] will do: the store is the in-process one.
    pub fn commits_in_place(&self) -> bool {
        self.store.is_in_process()
    }

    /// [`SessionCtx::commit`] for the in-process store, done at once on this thread (a map update
    /// that neither waits nor fails, so the request needs no finisher task). False, with nothing
    /// written, for any other store.
    pub fn commit_in_place(mut self) -> bool {
        self.uncount_unanswered();
        let (learned, changes) = self.commit_writes();
        if let Some((model_key, update)) = learned {
            self.store.update_session_in_place(model_key, &update);
        }
        let Some(update) = changes else { return true };
        let span = trace::stage("compactor.store.write", self.key.as_str());
        span.record("compactor.operation", "commit");
        let _entered = span.enter();
        self.store.update_in_place(self.key.as_str(), self.conversation_id.as_str(), update)
    }

    async fn write(&self, update: &Update, operation: &'static str) -> bool {
        let span = trace::stage("compactor.store.write", self.key.as_str());
        span.record("compactor.operation", operation);
        let written =
            self.store.update(self.key.as_str(), self.conversation_id.as_str(), update).instrument(span.clone()).await;
        match written {
            Ok(()) => true,
            Err(error) => {
                span.record("otel.status_code", "ERROR");
                self.report(&error, operation);
                false
            }
        }
    }

    fn report(&self, error: &StoreError, operation: &'static str) {
        if matches!(error, StoreError::CircuitOpen) {
            // The breaker said why when it opened; a skip is counted, not warned about again.
            metric::store_skipped(operation);
            return;
        }
        metric::store_error(operation);
        if STORE_WARNINGS.ready() {
            tracing::warn!(
                session = %self.key.as_str(),
                conversation = %self.conversation_id,
                operation = %operation,
                error = %Chain(error),
                "session store failed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, StoreKind};
    use crate::session::SessionSource;

    #[test]
    fn a_models_key_is_the_hash_of_its_tenant_upstream_and_name() {
        for (upstream, model) in [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-5"), ("openai", "")] {
            let key = ModelKey::new("tenant", upstream, model);
            let tag = xxhash_rust::xxh3::xxh3_64(format!("tenant\0{upstream}\0{model}").as_bytes()).max(1);
            assert_eq!((key.tag, key.store_key.as_str()), (tag, format!("model.{tag:016x}").as_str()));
        }
    }

    fn key(name: &str) -> SessionKey {
        SessionKey { key: format!("tenant.{name}"), source: SessionSource::Header }
    }

    fn conversation(hex: &str) -> ConversationId {
        ConversationId::parse(hex).unwrap()
    }

    const MAIN: &str = "00000000000000aa";
    const SUBAGENT: &str = "00000000000000bb";

    fn record(generation: u32) -> CompactionRecord {
        CompactionRecord {
            summary: "summary".into(),
            covered_messages: 4,
            covered_hash: "h".into(),
            first_kept: 4,
            tokens_before: 100,
            tokens_after: 10,
            trigger: "overflow".into(),
            model: "m".into(),
            ..CompactionRecord::blank(generation)
        }
    }

    #[tokio::test]
    async fn changes_stay_in_memory_until_the_one_commit() {
        let store = Store::from_config(&Config::default().session);
        let mut ctx = SessionCtx::load(store.clone(), key("a"), conversation(MAIN)).await;
        ctx.record_request(&["call_1".to_string()], 40, 7);
        ctx.learn_window(4_000);
        ctx.set_usage(Usage { prompt_tokens: 12, ..Usage::default() });
        assert_eq!(ctx.learned().window, 4_000, "the request sees its own change");
        assert_eq!(store.load("tenant.a", MAIN).await.unwrap(), Default::default(), "nothing written yet");
        assert!(ctx.commit().await);
        let (session, stored) = store.load("tenant.a", MAIN).await.unwrap();
        assert!(stored.pruned.contains("call_1"));
        assert_eq!((session.counters.requests, session.counters.tokens_saved), (1, 40));
        assert_eq!(session.counters.learned.window, 4_000);
        assert_eq!((stored.requests, stored.messages), (1, 7));
        assert_eq!(stored.usage.map(|u| (u.prompt_tokens, u.message_count)), Some((12, 7)));
    }

    #[tokio::test]
    async fn what_a_conversation_decides_stays_with_it_and_what_the_session_learns_is_shared() {
        let store = Store::from_config(&Config::default().session);
        let mut main = SessionCtx::load(store.clone(), key("s"), conversation(MAIN)).await;
        main.record_request(&["call_1".to_string()], 10, 9);
        main.learn_window(8_000);
        assert!(main.publish_compaction(&record(1)).await);
        assert!(main.commit().await);
        let subagent = SessionCtx::load(store.clone(), key("s"), conversation(SUBAGENT)).await;
        assert!(subagent.conversation().is_empty(), "the subagent sees none of the main loop's decisions");
        assert_eq!(subagent.learned().window, 8_000, "but the same model's window");
        assert_eq!(subagent.session().counters.requests, 1);
    }

    #[tokio::test]
    async fn a_published_compaction_is_visible_at_once_and_a_failure_counts_in_a_row() {
        let store = Store::from_config(&Config::default().session);
        let mut ctx = SessionCtx::load(store.clone(), key("b"), conversation(MAIN)).await;
        assert!(ctx.publish_failure(9).await);
        assert!(ctx.publish_failure(9).await);
        assert_eq!(store.load("tenant.b", MAIN).await.unwrap().1.breaker.failures, 2);
        assert!(ctx.publish_failure(11).await, "a grown conversation starts the count again");
        assert_eq!(ctx.conversation().breaker.failures, 1);
        assert!(ctx.publish_compaction(&record(1)).await);
        let (_, stored) = store.load("tenant.b", MAIN).await.unwrap();
        assert_eq!(stored.compactions, vec![record(1)]);
        assert_eq!(stored.breaker, Breaker::default());
        assert_eq!(ctx.conversation().compactions, vec![record(1)]);
    }

    /// A request of conversation `id` of session `name`, to one model.
    async fn turn(store: &Store, name: &str, id: &str) -> Box<SessionCtx> {
        let mut ctx = SessionCtx::load(store.clone(), key(name), conversation(id)).await;
        ctx.use_model(ModelKey::new("tenant", "anthropic", "claude")).await;
        ctx
    }

    #[tokio::test]
    async fn conversations_that_ran_long_make_a_young_one_expect_more_turns_and_a_pause_starts_a_new_run() {
        let store = Store::from_config(&Config::default().session);
        let lifetime = Duration::from_secs(300);
        let young = turn(&store, "new", MAIN).await;
        assert_eq!(young.later_turns(lifetime, 0.9, &[]), 0, "nothing measured: no turn assumed");
        // Ten sessions whose main conversation ran 20 turns on a warm cache.
        for session in 0..10 {
            for _ in 0..20 {
                let mut ctx = turn(&store, &format!("s{session}"), MAIN).await;
                ctx.record_request(&[], 0, 3);
                ctx.count_turn(lifetime);
                ctx.note_status(200);
                assert!(ctx.commit().await);
            }
        }
        let mut ctx = turn(&store, "new", MAIN).await;
        assert_eq!(ctx.run_turn(lifetime), 1);
        assert_eq!(ctx.later_turns(lifetime, 0.9, &[]), 16 - 1, "every run so far reached turn 16");
        ctx.record_request(&[], 0, 3);
        ctx.count_turn(lifetime);
        ctx.note_status(200);
        assert!(ctx.commit().await);
        let ctx = turn(&store, "new", MAIN).await;
        assert_eq!((ctx.run_turn(lifetime), ctx.later_turns(lifetime, 0.9, &[])), (2, 16 - 2));
        // The same conversation after a pause past the cache's lifetime: a new run, at its start.
        assert_eq!(ctx.run_turn(Duration::ZERO), 1);
        // Another model has measured nothing.
        let mut other = SessionCtx::load(store.clone(), key("new"), conversation(SUBAGENT)).await;
        other.use_model(ModelKey::new("tenant", "openai", "gpt")).await;
        assert_eq!(other.later_turns(lifetime, 0.9, &[]), 0);
    }

    #[tokio::test]
    async fn refused_requests_count_toward_no_run_and_one_tenants_runs_are_not_anothers() {
        let store = Store::from_config(&Config::default().session);
        let lifetime = Duration::from_secs(300);
        // Ten sessions whose every request the upstream refused (401): no run, no horizon.
        for session in 0..10 {
            for _ in 0..20 {
                let mut ctx = turn(&store, &format!("refused{session}"), MAIN).await;
                ctx.record_request(&[], 0, 3);
                ctx.count_turn(lifetime);
                ctx.note_status(401);
                assert!(ctx.commit().await);
            }
        }
        let young = turn(&store, "young", MAIN).await;
        assert_eq!(young.later_turns(lifetime, 0.9, &[]), 0, "refused requests measured no run");
        let refused = turn(&store, "refused0", MAIN).await;
        assert_eq!(refused.run_turn(lifetime), 1, "nor a turn of their own conversation");
        // Ten sessions of another tenant that really ran 20 turns: this tenant still knows nothing.
        for session in 0..10 {
            for _ in 0..20 {
                let key = SessionKey { key: format!("other.s{session}"), source: SessionSource::Header };
                let mut ctx = SessionCtx::load(store.clone(), key, conversation(MAIN)).await;
                ctx.use_model(ModelKey::new("other", "anthropic", "claude")).await;
                ctx.record_request(&[], 0, 3);
                ctx.count_turn(lifetime);
                ctx.note_status(200);
                assert!(ctx.commit().await);
            }
        }
        let young = turn(&store, "young", MAIN).await;
        assert_eq!(young.later_turns(lifetime, 0.9, &[]), 0, "another tenant's runs are not this tenant's");
    }

    #[tokio::test]
    async fn parallel_requests_merge_what_they_learned_and_a_stale_commit_erases_no_overflow() {
        let store = Store::from_config(&Config::default().session);
        let model = ModelKey::new("tenant", "openai", "gpt-4o");
        // Both requests load the same session before either commits.
        let mut overflowed = SessionCtx::load(store.clone(), key("p"), conversation(MAIN)).await;
        let mut measured = SessionCtx::load(store.clone(), key("p"), conversation(SUBAGENT)).await;
        overflowed.use_model(model.clone()).await;
        measured.use_model(model.clone()).await;
        overflowed.learn(|learned| learned.window_below = 7_000);
        overflowed.learn_window(6_000);
        measured.note_forwarded(1_000);
        measured.set_usage(Usage { prompt_tokens: 2_000, output_tokens: 300, ..Usage::default() });
        assert!(overflowed.commit().await);
        assert!(measured.commit().await, "commits what it saw before the overflow was learned");
        for stored_key in ["tenant.p", model.store_key.as_str()] {
            let (session, _) = store.load(stored_key, "-").await.unwrap();
            let learned = session.counters.learned;
            assert_eq!((learned.window, learned.window_below), (6_000, 7_000), "{stored_key}: {learned:?}");
            assert_eq!((learned.calibration_milli, learned.window_at_least), (2_000, 2_300), "{stored_key}");
        }
        // A later measurement is folded into the stored calibration, not laid over it.
        let mut later = SessionCtx::load(store.clone(), key("p"), conversation(MAIN)).await;
        let mut stale = SessionCtx::load(store.clone(), key("p"), conversation(SUBAGENT)).await;
        later.use_model(model.clone()).await;
        stale.use_model(model.clone()).await;
        later.measure(1_000, 1_000);
        stale.measure(1_000, 1_000);
        assert!(later.commit().await && stale.commit().await);
        let twice = Learned::smooth(Learned::smooth(2_000, 1_000), 1_000);
        assert_eq!(store.load("tenant.p", "-").await.unwrap().0.counters.learned.calibration_milli, twice);
    }

    #[tokio::test]
    async fn an_answer_larger_than_an_unnamed_overflow_drops_that_bound_in_the_store_too() {
        let store = Store::from_config(&Config::default().session);
        let mut overflowed = SessionCtx::load(store.clone(), key("q"), conversation(MAIN)).await;
        let mut answered = SessionCtx::load(store.clone(), key("q"), conversation(SUBAGENT)).await;
        overflowed.learn(|learned| learned.window_below = 5_000);
        answered.set_usage(Usage { prompt_tokens: 6_000, output_tokens: 10, ..Usage::default() });
        assert!(overflowed.commit().await && answered.commit().await);
        let learned = store.load("tenant.q", "-").await.unwrap().0.counters.learned;
        assert_eq!((learned.window_below, learned.window_at_least), (0, 6_010), "{learned:?}");
    }

    #[tokio::test]
    async fn a_failed_commit_is_reported_not_dropped() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mut config = Config::default().session;
        config.store = StoreKind::Redis;
        config.redis_url = crate::config::RedisUrls::new(format!("redis://{closed}"));
        let mut ctx = SessionCtx::load(Store::from_config(&config), key("c"), conversation(MAIN)).await;
        ctx.record_request(&[], 0, 1);
        assert!(!ctx.commit().await);
    }
}
