//! A request's session state, [`SessionCtx`]: loaded once when the request arrives, changed in
//! memory while compactor works on it (outputs pruned, usage, breaker, learned window, compaction
//! records, counters), and committed once, by an explicit awaited [`SessionCtx::commit`] from the
//! request's finisher. It is the one owner of the session's store I/O: every failure is logged
//! with the session key (at most one warning per interval) and counted, never dropped.
//!
//! One documented exception to "commit once": the outcome of a compaction is published at once,
//! while the compaction lock is held, because other requests of the session (on any replica) are
//! waiting for the record before they take the lock themselves.

use std::sync::LazyLock;
use std::time::Duration;

use super::error::StoreError;
use super::identify::SessionKey;
use super::state::{CompactionRecord, SessionState, SessionUpdate, Usage};
use super::store::Store;
use crate::error::Chain;
use crate::telemetry::{RateLimited, metric};

/// Store warnings are limited process-wide: a store that is down fails every request alike.
static STORE_WARNINGS: LazyLock<RateLimited> = LazyLock::new(|| RateLimited::new(Duration::from_secs(10)));

/// One request's view of its session.
pub struct SessionCtx {
    key: SessionKey,
    store: Store,
    state: SessionState,
    /// What this request adds, written by [`SessionCtx::commit`].
    pending: SessionUpdate,
    /// Messages of the client's request, stored with the usage for the hybrid estimate.
    message_count: u64,
}

impl SessionCtx {
    /// Loads the session's state; when the store fails, the request goes on with an empty state
    /// (the policies still work, they just start afresh).
    pub async fn load(store: Store, key: SessionKey) -> Self {
        let mut ctx =
            Self { key, store, state: SessionState::default(), pending: SessionUpdate::default(), message_count: 0 };
        match ctx.store.load(ctx.key.as_str()).await {
            Ok(state) => ctx.state = state,
            Err(error) => ctx.report(&error, "load"),
        }
        ctx
    }

    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    /// The session as this request sees it: as loaded, with this request's changes.
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// Counts the request and what it saved, and remembers the outputs it pruned for the first
    /// time (`message_count`: messages as the client sent them).
    pub fn record_request(&mut self, pruned: &[String], tokens_saved: u64, message_count: usize) {
        self.pending.count_request = true;
        self.pending.tokens_saved += tokens_saved;
        self.pending.pruned.extend(pruned.iter().filter(|id| !self.state.pruned.contains(*id)).cloned());
        self.message_count = message_count as u64;
    }

    /// Remembers the real context window an overflow error named, for later estimates.
    pub fn learn_window(&mut self, window: u64) {
        if window > 0 && self.state.counters.learned_window != window {
            self.state.counters.learned_window = window;
            self.pending.learned_window = Some(window);
        }
    }

    /// The usage the upstream reported for this request.
    pub fn set_usage(&mut self, mut usage: Usage) {
        usage.message_count = self.message_count;
        self.pending.usage = Some(usage);
    }

    /// Takes the session's compaction lock for `owner`: `Some(false)` when another owner holds it,
    /// `None` when the store failed (reported).
    pub async fn try_lock(&self, owner: &str, hold: Duration) -> Option<bool> {
        match self.store.try_lock(self.key.as_str(), owner, hold).await {
            Ok(taken) => Some(taken),
            Err(error) => {
                self.report(&error, "lock");
                None
            }
        }
    }

    /// Releases the lock if `owner` still holds it.
    pub async fn unlock(&self, owner: &str) {
        if let Err(error) = self.store.unlock(self.key.as_str(), owner).await {
            self.report(&error, "unlock");
        }
    }

    /// The session as stored now (another request may have changed it); `None` when the store
    /// failed (reported).
    pub async fn fetch(&self) -> Option<SessionState> {
        match self.store.load(self.key.as_str()).await {
            Ok(state) => Some(state),
            Err(error) => {
                self.report(&error, "load");
                None
            }
        }
    }

    /// Takes a fresher stored state in place of the one loaded (after waiting for another
    /// request's compaction); this request's own changes still stand.
    pub fn adopt(&mut self, state: SessionState) {
        self.state = state;
    }

    /// Publishes a new compaction record at once (under the compaction lock): it makes the last
    /// usage stale, closes the breaker and answers an admin request to compact. False when the
    /// write failed (reported).
    pub async fn publish_compaction(&mut self, record: &CompactionRecord) -> bool {
        let update = SessionUpdate {
            compaction: Some(record.clone()),
            clear_usage: true,
            breaker: Some((0, 0)),
            compact_requested: Some(false),
            ..SessionUpdate::default()
        };
        self.publish(update).await
    }

    /// Publishes a failed compaction at once: one more failure in a row on a conversation of
    /// `message_count` messages (a changed conversation starts the count again).
    pub async fn publish_failure(&mut self, message_count: usize) -> bool {
        let counters = &self.state.counters;
        let at = message_count as u64;
        let failures = if counters.failures_at_messages == at { counters.compaction_failures + 1 } else { 1 };
        self.publish(SessionUpdate { breaker: Some((failures, at)), ..SessionUpdate::default() }).await
    }

    async fn publish(&mut self, update: SessionUpdate) -> bool {
        self.state.apply(&update);
        self.write(&update, "publish").await
    }

    /// Writes what this request added, once its response is done. False when the write failed
    /// (reported).
    pub async fn commit(self) -> bool {
        if self.pending == SessionUpdate::default() {
            return true;
        }
        self.write(&self.pending, "commit").await
    }

    async fn write(&self, update: &SessionUpdate, operation: &'static str) -> bool {
        match self.store.update(self.key.as_str(), update).await {
            Ok(()) => true,
            Err(error) => {
                self.report(&error, operation);
                false
            }
        }
    }

    fn report(&self, error: &StoreError, operation: &'static str) {
        metric::store_error(operation);
        if STORE_WARNINGS.ready() {
            tracing::warn!(session = %self.key.as_str(), operation = %operation, error = %Chain(error), "session store failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, StoreKind};
    use crate::session::SessionSource;

    fn key(name: &str) -> SessionKey {
        SessionKey { key: format!("tenant.{name}"), source: SessionSource::Header }
    }

    fn record(generation: u32) -> CompactionRecord {
        CompactionRecord {
            generation,
            summary: "summary".into(),
            covered_messages: 4,
            covered_hash: "h".into(),
            first_kept: 4,
            user_messages: Vec::new(),
            truncate_user_tokens: 0,
            tokens_before: 100,
            tokens_after: 10,
            trigger: "overflow".into(),
            model: "m".into(),
            at_unix_ms: 0,
        }
    }

    #[tokio::test]
    async fn changes_stay_in_memory_until_the_one_commit() {
        let store = Store::from_config(&Config::default().session);
        let mut ctx = SessionCtx::load(store.clone(), key("a")).await;
        ctx.record_request(&["call_1".to_string()], 40, 7);
        ctx.learn_window(4_000);
        ctx.set_usage(Usage { prompt_tokens: 12, ..Usage::default() });
        assert_eq!(ctx.state().counters.learned_window, 4_000, "the request sees its own change");
        assert_eq!(store.load("tenant.a").await.unwrap(), SessionState::default(), "nothing written yet");
        assert!(ctx.commit().await);
        let stored = store.load("tenant.a").await.unwrap();
        assert!(stored.pruned.contains("call_1"));
        assert_eq!((stored.counters.requests, stored.counters.tokens_saved), (1, 40));
        assert_eq!(stored.counters.learned_window, 4_000);
        assert_eq!(stored.usage.map(|u| (u.prompt_tokens, u.message_count)), Some((12, 7)));
    }

    #[tokio::test]
    async fn a_published_compaction_is_visible_at_once_and_a_failure_counts_in_a_row() {
        let store = Store::from_config(&Config::default().session);
        let mut ctx = SessionCtx::load(store.clone(), key("b")).await;
        assert!(ctx.publish_failure(9).await);
        assert!(ctx.publish_failure(9).await);
        assert_eq!(store.load("tenant.b").await.unwrap().counters.compaction_failures, 2);
        assert!(ctx.publish_failure(11).await, "a changed conversation starts the count again");
        assert_eq!(ctx.state().counters.compaction_failures, 1);
        assert!(ctx.publish_compaction(&record(1)).await);
        let stored = store.load("tenant.b").await.unwrap();
        assert_eq!(stored.compactions, vec![record(1)]);
        assert_eq!(stored.counters.compaction_failures, 0);
        assert_eq!(ctx.state().compactions, vec![record(1)]);
    }

    #[tokio::test]
    async fn a_failed_commit_is_reported_not_dropped() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mut config = Config::default().session;
        config.store = StoreKind::Redis;
        config.redis_url = format!("redis://{closed}");
        let mut ctx = SessionCtx::load(Store::from_config(&config), key("c")).await;
        ctx.record_request(&[], 0, 1);
        assert!(!ctx.commit().await);
    }
}
