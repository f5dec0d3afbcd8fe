//! The in-process session store: bounded in bytes (by an estimate of each session's size) and in
//! sessions, and in conversations per session, the least recently used dropped first; with
//! time-to-idle expiry.
//!
//! The compaction locks live in `locks`, the size estimates the bound is kept by in `weight`, the
//! inspector's and the admin API's reads in `views`.

mod locks;
mod views;
mod weight;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::logouts::Logouts;
use super::runs::RunLengths;
use super::state::{ConversationState, ModelRun, SessionState, SessionUpdate, Update};
use crate::tokens::CacheSize;
use weight::{LOG_STEP, conversation_bytes, logged_bytes, pruned_id_bytes};

/// The maps' hasher: seeded per process, and several times cheaper than the standard SipHash on
/// the short hex keys every request looks up (the keys are keyed hashes a client cannot choose).
type Hasher = foldhash::fast::RandomState;

/// Compaction locks by (session, conversation): owner and expiry.
type Locks = HashMap<(String, String), (String, Instant)>;

/// How often an update looks its session up again when it was evicted between the lookup and
/// the lock (or its lock poisoned).
const ATTEMPTS: usize = 4;

/// Session keys by their session part (`<tenant>.<session hash>` by `<session hash>`).
type Index = HashMap<String, std::collections::BTreeSet<String>, Hasher>;

#[derive(Clone)]
pub struct MemoryStore {
    sessions: moka::sync::Cache<String, Arc<Held>, Hasher>,
    /// Keys by session hash, for the admin API's lookup by agent session id; an entry goes when
    /// its session leaves the cache.
    index: Arc<Mutex<Index>>,
    locks: Arc<Mutex<Locks>>,
    max_conversations: usize,
    /// The store's bound in bytes: a session that alone outweighs it is not kept.
    memory_bytes: u64,
    /// What each session is charged at least (`memory_bytes / max_sessions`).
    least_charge: u32,
    /// Orders uses: two uses in the same millisecond still have an order.
    uses: Arc<AtomicU64>,
    /// Request summaries kept per conversation for the inspector (0: none).
    request_log: usize,
    /// The inspector logins ended by "Log out".
    logouts: Arc<Mutex<Logouts>>,
    /// Stateful Responses chains compactor recovered, by tenant and id (`compaction::stateful`).
    chains: moka::sync::Cache<String, Arc<str>, Hasher>,
}

/// The most bytes of recovered chains kept in process (each a rebuilt history, or a few bytes).
const CHAIN_BYTES: u64 = 64 << 20;

/// A session in the cache, and the size it was last weighed at: moka weighs an entry when it is
/// inserted, so a session whose size changed is inserted again.
struct Held {
    session: Mutex<MemorySession>,
    bytes: AtomicU32,
}

impl Held {
    fn new(key: &str) -> Self {
        let bytes = MemorySession::default().estimated_bytes(key);
        Self { session: Mutex::default(), bytes: AtomicU32::new(bytes) }
    }
}

#[derive(Default)]
struct MemorySession {
    state: SessionState,
    conversations: HashMap<String, Kept, Hasher>,
}

/// A conversation and when it was last used.
struct Kept {
    use_order: u64,
    last_used_unix_ms: u64,
    /// Shared with the requests that loaded it (no copy per request); an update copies it only
    /// while one of them still holds it.
    state: Arc<ConversationState>,
    /// The estimated bytes of its id and state ([`conversation_bytes`]), kept up to date by each
    /// update so that weighing a session never walks its pruned ids.
    bytes: usize,
    /// The pruned ids' share of `bytes`, grown by the ids each update adds.
    pruned_bytes: usize,
    /// The inspector's request summaries (JSON), oldest first, at most the store's bound: kept
    /// beside the state, not in it, so a request's load never copies them.
    log: VecDeque<Box<str>>,
    /// The summaries' share of `bytes`.
    log_bytes: usize,
}

impl MemoryStore {
    /// A store of at most `max_sessions` sessions and `memory_bytes` of estimated size, whichever
    /// is reached first: each session is charged at least `memory_bytes / max_sessions`.
    pub fn new(max_sessions: u64, memory_bytes: u64, max_conversations: usize, ttl: Duration) -> Self {
        let index: Arc<Mutex<Index>> = Arc::default();
        let evicted = index.clone();
        let least_charge = u32::try_from(memory_bytes / max_sessions.max(1)).unwrap_or(u32::MAX);
        let sessions = moka::sync::Cache::builder()
            .weigher(move |_: &String, held: &Arc<Held>| held.bytes.load(Ordering::Relaxed).max(least_charge))
            .max_capacity(memory_bytes)
            // Least recently used first: a new session is always admitted, never refused in favour
            // of an old one (moka's default, TinyLFU, may refuse it).
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .time_to_idle(ttl)
            .eviction_listener(move |key: Arc<String>, _, cause| {
                // A session inserted again to be weighed again stays indexed.
                if cause == moka::notification::RemovalCause::Replaced {
                    return;
                }
                if let (Some(hash), Ok(mut index)) = (session_part(&key), evicted.lock())
                    && let Some(keys) = index.get_mut(hash)
                {
                    keys.remove(key.as_str());
                    if keys.is_empty() {
                        index.remove(hash);
                    }
                }
            })
            .build_with_hasher(Hasher::default());
        Self {
            sessions,
            index,
            locks: Arc::default(),
            max_conversations: max_conversations.max(1),
            memory_bytes,
            least_charge,
            uses: Arc::default(),
            request_log: 0,
            logouts: Arc::default(),
            chains: moka::sync::Cache::builder()
                .weigher(|key: &String, value: &Arc<str>| u32::try_from(key.len() + value.len()).unwrap_or(u32::MAX))
                .max_capacity(CHAIN_BYTES)
                .time_to_idle(ttl)
                .build_with_hasher(Hasher::default()),
        }
    }

    /// Keeps up to `requests` request summaries per conversation for the inspector.
    pub fn with_request_log(mut self, requests: usize) -> Self {
        self.request_log = requests;
        self
    }

    /// The session's state and its conversation's; empty when unknown.
    pub fn load(&self, key: &str, conversation: &str) -> (SessionState, Arc<ConversationState>) {
        let Some(entry) = self.sessions.get(key) else { return Default::default() };
        let Ok(session) = entry.session.lock() else {
            self.drop_poisoned(key, &entry);
            return Default::default();
        };
        let kept = session.conversations.get(conversation).map(|kept| kept.state.clone());
        (session.state.clone(), kept.unwrap_or_default())
    }

    /// Applies a request's changes and marks its conversation as the most recently used, dropping
    /// the least recently used one beyond the bound. A session that grew or shrank is weighed
    /// again, and the least recently used sessions leave until the store fits its bound again; one
    /// that alone outweighs the bound leaves instead.
    pub fn update(&self, key: &str, conversation: &str, update: &Update) {
        if let Some(run) = &update.model_run {
            self.count_run(run);
        }
        self.index_key(key);
        self.with_session(key, "update", |entry, session, fresh| {
            self.apply(session, conversation, update);
            let bytes = session.estimated_bytes(key);
            if u64::from(bytes) > self.memory_bytes {
                // Weighed again, it would push every other session out and still not fit.
                self.sessions.invalidate(key);
                return;
            }
            // Weighed while the session is still locked: a concurrent update's weight, taken
            // before this one's change, cannot land after it.
            let before = entry.bytes.swap(bytes, Ordering::Relaxed);
            // Below the count bound's least charge a change weighs nothing.
            let reweigh = before.max(self.least_charge) != bytes.max(self.least_charge);
            if reweigh {
                self.sessions.insert(key.to_string(), entry.clone());
            }
            if reweigh || fresh {
                // Evict now rather than at moka's next housekeeping, so the bounds hold at once.
                self.sessions.run_pending_tasks();
            }
        });
    }

    /// Runs `change` on the session under `key` (created when absent) with its lock held; see
    /// [`Self::under_lock`].
    fn with_session(
        &self,
        key: &str,
        operation: &'static str,
        change: impl FnMut(&Arc<Held>, &mut MemorySession, bool),
    ) {
        let create = || {
            let found = self.sessions.entry_by_ref(key).or_insert_with(|| Arc::new(Held::new(key)));
            let fresh = found.is_fresh();
            Some((found.into_value(), fresh))
        };
        self.under_lock(key, operation, create, change);
    }

    /// Runs `change` with the lock held of the entry the cache holds under `key` at that moment
    /// (`find` looks it up, and says whether it was just created): an entry evicted between the
    /// lookup and the lock is looked up again (a change made to it would be lost with it), and
    /// one whose lock a panic poisoned is dropped (its state may be half changed) and looked up
    /// again. `None` when `find` finds nothing, or when every attempt met an evicted entry.
    fn under_lock<T>(
        &self,
        key: &str,
        operation: &'static str,
        mut find: impl FnMut() -> Option<(Arc<Held>, bool)>,
        mut change: impl FnMut(&Arc<Held>, &mut MemorySession, bool) -> T,
    ) -> Option<T> {
        for _ in 0..ATTEMPTS {
            let (entry, fresh) = find()?;
            let Ok(mut session) = entry.session.lock() else {
                self.drop_poisoned(key, &entry);
                continue;
            };
            if !self.holds(key, &entry) {
                continue;
            }
            return Some(change(&entry, &mut session, fresh));
        }
        // Only a store far too small for one session evicts it on every attempt.
        crate::telemetry::metric::store_error(operation);
        tracing::warn!(session = %key, operation, "in-process session store evicted the session on every attempt; change dropped");
        None
    }

    /// Whether the cache still holds this very entry under `key`.
    fn holds(&self, key: &str, entry: &Arc<Held>) -> bool {
        self.sessions.get(key).is_some_and(|held| Arc::ptr_eq(&held, entry))
    }

    /// A panic while a session was locked left its state in doubt: it leaves the store (the
    /// session starts afresh), loudly.
    fn drop_poisoned(&self, key: &str, entry: &Arc<Held>) {
        if self.holds(key, entry) {
            self.sessions.invalidate(key);
        }
        crate::telemetry::metric::store_corrupt();
        tracing::warn!(session = %key, "session state left in doubt by a panic dropped; the session starts afresh");
    }

    /// Counts a run in its model's histogram, kept under the model's key like what was learned
    /// of the model.
    fn count_run(&self, run: &ModelRun) {
        let entry = self.sessions.get_with(run.store_key.clone(), || Arc::new(Held::new(&run.store_key)));
        if let Ok(mut session) = entry.session.lock() {
            session.state.runs.count(run.bucket);
        }
    }

    /// The histogram of run lengths kept under a model's key.
    pub fn run_lengths(&self, key: &str) -> RunLengths {
        let Some(entry) = self.sessions.get(key) else { return RunLengths::default() };
        entry.session.lock().map(|session| session.state.runs).unwrap_or_default()
    }

    fn apply(&self, session: &mut MemorySession, conversation: &str, update: &Update) {
        session.state.apply(&update.session);
        let use_order = self.uses.fetch_add(1, Ordering::Relaxed);
        let kept = session.conversations.entry(conversation.to_string()).or_insert_with(|| Kept {
            use_order,
            last_used_unix_ms: 0,
            state: Arc::default(),
            bytes: 0,
            pruned_bytes: 0,
            log: VecDeque::new(),
            log_bytes: 0,
        });
        kept.use_order = use_order;
        kept.last_used_unix_ms = super::unix_ms();
        let added: usize = update
            .conversation
            .pruned
            .iter()
            .filter(|id| !kept.state.pruned.contains(id.as_str()))
            .map(|id| pruned_id_bytes(id))
            .sum();
        Arc::make_mut(&mut kept.state).apply(&update.conversation);
        kept.pruned_bytes += added;
        if let Some(record) = update.conversation.record.as_deref().filter(|_| self.request_log > 0) {
            kept.log_bytes += logged_bytes(record);
            kept.log.push_back(record.into());
            while kept.log.len() > self.request_log {
                if let Some(gone) = kept.log.pop_front() {
                    kept.log_bytes -= logged_bytes(&gone);
                }
            }
        }
        // The log is charged in steps of LOG_STEP: a session is weighed again (a cache insert) when
        // its charge changes, and a request's summary alone should not make every commit do that.
        kept.bytes = conversation_bytes(conversation, &kept.state, kept.pruned_bytes)
            + kept.log_bytes.next_multiple_of(LOG_STEP);
        while session.conversations.len() > self.max_conversations {
            let oldest = session.conversations.iter().min_by_key(|(_, kept)| kept.use_order).map(|(id, _)| id.clone());
            let Some(oldest) = oldest else { break };
            session.conversations.remove(&oldest);
        }
    }

    fn index_key(&self, key: &str) {
        if let (Some(hash), Ok(mut index)) = (session_part(key), self.index.lock()) {
            // Allocates only for a session not indexed yet: a commit path, once per session.
            match index.get_mut(hash) {
                Some(keys) if keys.contains(key) => {}
                Some(keys) => {
                    keys.insert(key.to_string());
                }
                None => {
                    index.insert(hash.to_string(), std::collections::BTreeSet::from([key.to_string()]));
                }
            }
        }
    }

    /// The keys of the sessions whose session part is `hash`, in every tenant.
    pub fn find(&self, hash: &str) -> Vec<String> {
        let Ok(index) = self.index.lock() else { return Vec::new() };
        index.get(hash).map(|keys| keys.iter().cloned().collect()).unwrap_or_default()
    }

    /// Changes the session's own state only (the admin API's requests).
    pub fn update_session(&self, key: &str, update: &SessionUpdate) {
        self.index_key(key);
        self.with_session(key, "update", |_, session, _| session.state.apply(update));
    }

    /// Applies `update` to a session the store holds; false (and nothing created) for any other.
    /// Made like every other change ([`Self::under_lock`]): to an entry evicted before its lock was
    /// taken, it would be a change to a copy nobody reads again, reported as made.
    pub fn update_existing_session(&self, key: &str, update: &SessionUpdate) -> bool {
        let existing = || self.sessions.get(key).map(|entry| (entry, false));
        self.under_lock(key, "update", existing, |_, session, _| session.state.apply(update)).is_some()
    }

    /// The store's estimated size, once pending evictions are applied.
    pub fn size(&self) -> CacheSize {
        self.sessions.run_pending_tasks();
        CacheSize { bytes: self.sessions.weighted_size(), entries: self.sessions.entry_count() }
    }

    pub fn forget(&self, key: &str) -> bool {
        self.sessions.remove(key).is_some()
    }

    /// Ends the inspector login `id`, good until Unix second `expires`.
    pub fn end_login(&self, id: &str, expires: u64, now: u64) {
        self.logouts.lock().unwrap_or_else(PoisonError::into_inner).end(id, expires, now);
    }

    /// Maps the recovered chain `key` to `value`.
    pub fn map_chain(&self, key: &str, value: &str) {
        self.chains.insert(key.to_string(), Arc::from(value));
    }

    /// What the recovered chain `key` maps to.
    pub fn chain(&self, key: &str) -> Option<String> {
        self.chains.get(key).map(|value| value.to_string())
    }

    /// Whether the inspector login `id` was ended.
    pub fn login_ended(&self, id: &str, expires: u64, now: u64) -> bool {
        self.logouts.lock().unwrap_or_else(PoisonError::into_inner).ended(id, expires, now)
    }
}

/// The session part of a key, `<session hash>` of `<tenant>.<session hash>`.
pub(super) fn session_part(key: &str) -> Option<&str> {
    key.split_once('.').map(|(_, hash)| hash).filter(|hash| !hash.is_empty())
}

#[cfg(test)]
mod tests;
