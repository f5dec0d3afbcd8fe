//! The session store: in memory by default, Redis when configured. An enum of backends, not a
//! trait object: there are exactly these. Around every operation on a shared store sits the
//! circuit breaker ([`super::breaker`]), and around every load the repair of a corrupt or foreign
//! value: whatever the layout of the stored state, the store API is where both live.

use std::sync::Arc;
use std::time::Duration;

use super::breaker::{Admission, Breaker};
use super::error::StoreError;
use super::memory::MemoryStore;
use super::redis::RedisStore;
use super::runs::RunLengths;
use super::state::{ConversationState, SessionState, SessionUpdate, SessionView, Update};
use crate::config::{SessionConfig, StoreKind};
use crate::telemetry::metric;

#[derive(Clone)]
pub struct Store {
    backend: Backend,
    /// The breaker of a shared store (none for the in-process one, which cannot be down).
    breaker: Option<Arc<Breaker>>,
    /// Request summaries kept per conversation for the inspector (0: none).
    request_log: usize,
}

#[derive(Clone)]
enum Backend {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Store {
    /// Builds the configured store; a Redis store connects in the background (needs a runtime).
    pub fn from_config(config: &SessionConfig) -> Self {
        match config.store {
            StoreKind::Memory => Self {
                backend: Backend::Memory(MemoryStore::new(
                    config.max_sessions,
                    config.memory_bytes,
                    config.max_conversations as usize,
                    config.ttl,
                )),
                breaker: None,
                request_log: 0,
            },
            StoreKind::Redis => Self {
                backend: Backend::Redis(RedisStore::new(config)),
                breaker: Some(Arc::new(Breaker::new(config.breaker_failures, config.breaker_backoff))),
                request_log: 0,
            },
        }
    }

    /// Keeps up to `requests` request summaries per conversation for the inspector (0: none),
    /// written with each request's commit.
    pub fn recording(mut self, requests: usize) -> Self {
        self.backend = match self.backend {
            Backend::Memory(store) => Backend::Memory(store.with_request_log(requests)),
            Backend::Redis(store) => Backend::Redis(store.with_request_log(requests)),
        };
        self.request_log = requests;
        self
    }

    /// Whether requests leave a summary for the inspector.
    pub fn records_requests(&self) -> bool {
        self.request_log > 0
    }

    /// The sessions used most recently, newest first, with when (Unix ms): the inspector's list.
    pub async fn recent(&self, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.recent(limit)),
            Backend::Redis(store) => self.guarded(store.recent(limit)).await,
        }
    }

    /// The sessions' own states (counters, what was learned), in one read: the inspector's list.
    pub async fn sessions(&self, keys: &[String]) -> Result<Vec<SessionState>, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(keys.iter().map(|key| store.view(key).session).collect()),
            Backend::Redis(store) => self.guarded(store.sessions(keys)).await,
        }
    }

    /// A conversation's request summaries (JSON), oldest first: the inspector's timeline.
    pub async fn requests(&self, key: &str, conversation: &str) -> Result<Vec<String>, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.requests(key, conversation)),
            Backend::Redis(store) => self.guarded(store.requests(key, conversation)).await,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
        }
    }

    /// The in-process store's estimated size; none for a shared store, which holds nothing here.
    pub fn memory_size(&self) -> Option<crate::tokens::CacheSize> {
        match &self.backend {
            Backend::Memory(store) => Some(store.size()),
            Backend::Redis(_) => None,
        }
    }

    /// Whether the circuit breaker is skipping the store.
    pub fn breaker_open(&self) -> bool {
        self.breaker.as_ref().is_some_and(|breaker| breaker.is_open())
    }

    /// The session's state and its conversation's; empty when new. A stored value compactor
    /// cannot read (a key of the wrong type, unparseable JSON, a counter that is not a number) is
    /// deleted with the whole session, with a warning and a metric, and the session starts
    /// afresh: left alone it would fail every request of the session and have its TTL refreshed
    /// forever. A session another schema version wrote is not corrupt: it is answered with
    /// [`StoreError::OtherVersion`] and left as it is (its own version's replicas still use it).
    pub async fn load(
        &self,
        key: &str,
        conversation: &str,
    ) -> Result<(SessionState, Arc<ConversationState>), StoreError> {
        let loaded = match &self.backend {
            Backend::Memory(store) => Ok(store.load(key, conversation)),
            Backend::Redis(store) => {
                self.guarded(store.load(key, conversation)).await.map(|(session, kept)| (session, Arc::new(kept)))
            }
        };
        match loaded {
            Err(StoreError::Corrupt(reason)) => {
                metric::store_corrupt();
                tracing::warn!(session = %key, %reason, "unreadable session state deleted; the session starts afresh");
                self.forget(key).await?;
                Ok(Default::default())
            }
            other => other,
        }
    }

    /// Whether a conversation's compaction lock is held, and then its state (read in that order:
    /// a holder publishes its record before it releases the lock).
    pub async fn poll(&self, key: &str, conversation: &str) -> Result<(ConversationState, bool), StoreError> {
        match &self.backend {
            Backend::Memory(store) => {
                let locked = store.locked(key, conversation);
                Ok((ConversationState::clone(&store.load(key, conversation).1), locked))
            }
            Backend::Redis(store) => self.guarded(store.poll(key, conversation)).await,
        }
    }

    /// Adds what a request decided to its session and conversation, and marks the conversation as
    /// the session's most recently used (the least recently used beyond the bound is dropped).
    pub async fn update(&self, key: &str, conversation: &str, update: &Update) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory(store) => {
                store.update(key, conversation, update);
                Ok(())
            }
            Backend::Redis(store) => self.guarded(store.update(key, conversation, update)).await,
        }
    }

    /// How long conversations of a model run: the histogram kept under the model's key
    /// ([`super::runs`]); from a shared store, as read at most half a minute ago.
    pub async fn run_lengths(&self, model_key: &str) -> Result<RunLengths, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.run_lengths(model_key)),
            Backend::Redis(store) => self.guarded(store.run_lengths(model_key)).await,
        }
    }

    /// Whether writes go to the in-process store: a map update that neither waits nor fails, so a
    /// request applies its changes in place ([`Store::update_in_place`]) and needs no finisher.
    pub fn is_in_process(&self) -> bool {
        matches!(self.backend, Backend::Memory(_))
    }

    /// [`Store::update`] on the in-process store, at once; false (nothing written) on any other.
    pub fn update_in_place(&self, key: &str, conversation: &str, update: &Update) -> bool {
        match &self.backend {
            Backend::Memory(store) => {
                store.update(key, conversation, update);
                true
            }
            Backend::Redis(_) => false,
        }
    }

    /// [`Store::update_session`] for the in-process store, at once; false for any other store.
    pub fn update_session_in_place(&self, key: &str, update: &SessionUpdate) -> bool {
        match &self.backend {
            Backend::Memory(store) => {
                store.update_session(key, update);
                true
            }
            Backend::Redis(_) => false,
        }
    }

    /// Changes the session's own state only (the admin API).
    pub async fn update_session(&self, key: &str, update: &SessionUpdate) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory(store) => {
                store.update_session(key, update);
                Ok(())
            }
            Backend::Redis(store) => self.guarded(store.update_session(key, update)).await,
        }
    }

    /// Asks for a compaction on the session's next request (the admin API); false, and nothing
    /// created, when the store knows no such session.
    pub async fn request_compaction(&self, key: &str) -> Result<bool, StoreError> {
        let update = SessionUpdate { compact_requested: Some(true), ..Default::default() };
        match &self.backend {
            Backend::Memory(store) => Ok(store.update_existing_session(key, &update)),
            Backend::Redis(store) => self.guarded(store.request_compaction(key)).await,
        }
    }

    /// The session with the conversations it keeps, most recently used first (the admin API).
    pub async fn view(&self, key: &str) -> Result<SessionView, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.view(key)),
            Backend::Redis(store) => self.guarded(store.view(key)).await,
        }
    }

    /// The keys of the sessions, in every tenant, whose session part is `hash` (the admin API's
    /// lookup by agent session id). The index is written with the sessions themselves; a key
    /// whose session has gone since may still be listed.
    pub async fn find(&self, hash: &str) -> Result<Vec<String>, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.find(hash)),
            Backend::Redis(store) => self.guarded(store.find(hash)).await,
        }
    }

    /// Forgets a session and all its conversations; true when it existed.
    pub async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.forget(key)),
            Backend::Redis(store) => self.guarded(store.forget(key)).await,
        }
    }

    /// Ends the inspector login `login` (a keyed hash of its cookie), good until Unix second
    /// `expires`, for every replica of the store: remembered until it would have expired.
    pub async fn end_login(&self, login: &str, expires: u64, now: u64) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory(store) => {
                store.end_login(login, expires, now);
                Ok(())
            }
            Backend::Redis(store) => self.guarded(store.end_login(login, expires.saturating_sub(now))).await,
        }
    }

    /// Whether the inspector login `login` (good until `expires`) was ended; an error when the
    /// store cannot say (the inspector then refuses the login).
    pub async fn login_ended(&self, login: &str, expires: u64, now: u64) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.login_ended(login, expires, now)),
            Backend::Redis(store) => self.guarded(store.login_ended(login)).await,
        }
    }

    /// Maps a stateful Responses chain compactor recovered (`key`: the tenant, `:`, the response
    /// or conversation id the agent names) to `value`, for every replica, for the session TTL.
    pub async fn map_chain(&self, key: &str, value: &str) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory(store) => {
                store.map_chain(key, value);
                Ok(())
            }
            Backend::Redis(store) => self.guarded(store.map_chain(key, value)).await,
        }
    }

    /// What a recovered chain (`key`, as [`Store::map_chain`] names it) maps to.
    pub async fn chain(&self, key: &str) -> Result<Option<String>, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.chain(key)),
            Backend::Redis(store) => self.guarded(store.chain(key)).await,
        }
    }

    /// Takes a conversation's compaction lock for at most `hold`, unless another owner holds it.
    pub async fn try_lock(
        &self,
        key: &str,
        conversation: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.try_lock(key, conversation, owner, hold)),
            Backend::Redis(store) => self.guarded(store.try_lock(key, conversation, owner, hold)).await,
        }
    }

    /// Extends the lease of `owner`'s lock on a conversation; false when it no longer holds it.
    pub async fn renew_lock(
        &self,
        key: &str,
        conversation: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.renew_lock(key, conversation, owner, lease)),
            Backend::Redis(store) => self.guarded(store.renew_lock(key, conversation, owner, lease)).await,
        }
    }

    /// Releases a conversation's lock if `owner` still holds it; true when it did.
    pub async fn unlock(&self, key: &str, conversation: &str, owner: &str) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.unlock(key, conversation, owner)),
            Backend::Redis(store) => self.guarded(store.unlock(key, conversation, owner)).await,
        }
    }

    /// Whether the backend answers, for readiness. While the breaker is open this is the probe
    /// once the backoff is over, so an idle replica recovers too.
    pub async fn health(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(store) => self.guarded(store.ping()).await,
        }
    }

    /// Runs one operation through the breaker: skipped while it is open, counted when it ends.
    async fn guarded<T>(&self, operation: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let Some(breaker) = &self.breaker else { return operation.await };
        let probe = match breaker.admit() {
            Admission::Skip => return Err(StoreError::CircuitOpen),
            Admission::Probe => Some(ProbeGuard(breaker)),
            Admission::Pass => None,
        };
        let result = operation.await;
        match &result {
            Err(error) if error.is_unavailable() => breaker.failure(probe.is_some()),
            // An answer, even one compactor cannot use, says the store is up.
            _ => breaker.success(),
        }
        if let Some(probe) = probe {
            std::mem::forget(probe);
        }
        result
    }
}

/// A probe that was dropped before it ended (its request went away) lets the next one go.
struct ProbeGuard<'b>(&'b Breaker);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.0.abandon_probe();
    }
}
