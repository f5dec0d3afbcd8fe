//! The in-process session store: bounded in bytes (by an estimate of each session's size) and in
//! sessions, and in conversations per session, the least recently used dropped first; with
//! time-to-idle expiry.

use std::collections::{HashMap, VecDeque};
use std::mem::size_of;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::logouts::Logouts;
use super::runs::RunLengths;
use super::state::{
    CompactionRecord, ConversationState, ConversationView, ModelRun, SessionState, SessionUpdate, SessionView, Update,
};
use crate::tokens::CacheSize;

/// Compaction locks by (session, conversation): owner and expiry.
type Locks = HashMap<(String, String), (String, Instant)>;

/// How often an update looks its session up again when it was evicted between the lookup and
/// the lock (or its lock poisoned).
const ATTEMPTS: usize = 4;

/// Session keys by their session part (`<tenant>.<session hash>` by `<session hash>`).
type Index = HashMap<String, std::collections::BTreeSet<String>>;

#[derive(Clone)]
pub struct MemoryStore {
    sessions: moka::sync::Cache<String, Arc<Held>>,
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
}

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
    conversations: HashMap<String, Kept>,
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
            .build();
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

    /// The session with every conversation it keeps, most recently used first.
    pub fn view(&self, key: &str) -> SessionView {
        let Some(entry) = self.sessions.get(key) else { return SessionView::default() };
        let Ok(session) = entry.session.lock() else { return SessionView::default() };
        let mut kept: Vec<(&String, &Kept)> = session.conversations.iter().collect();
        kept.sort_by_key(|(_, kept)| std::cmp::Reverse(kept.use_order));
        let conversations = kept
            .into_iter()
            .map(|(id, kept)| {
                ConversationView::new(id.clone(), kept.last_used_unix_ms, ConversationState::clone(&kept.state))
            })
            .collect();
        SessionView::new(session.state.clone(), conversations)
    }

    /// The request summaries kept for a conversation, oldest first.
    pub fn requests(&self, key: &str, conversation: &str) -> Vec<String> {
        let Some(entry) = self.sessions.get(key) else { return Vec::new() };
        let Ok(session) = entry.session.lock() else { return Vec::new() };
        session
            .conversations
            .get(conversation)
            .map(|kept| kept.log.iter().map(|r| r.to_string()).collect())
            .unwrap_or_default()
    }

    /// The sessions with conversations, most recently used first, at most `limit`, with when
    /// each was last used (Unix ms). Walks the store: an operator's page, not a request's path.
    pub fn recent(&self, limit: usize) -> Vec<(String, u64)> {
        let mut sessions: Vec<(String, u64)> = self
            .sessions
            .iter()
            .filter_map(|(key, held)| {
                let session = held.session.lock().ok()?;
                let last = session.conversations.values().map(|kept| kept.last_used_unix_ms).max()?;
                Some((key.to_string(), last))
            })
            .collect();
        sessions.sort_by_key(|(key, last)| (std::cmp::Reverse(*last), key.clone()));
        sessions.truncate(limit);
        sessions
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

    /// Whether the inspector login `id` was ended.
    pub fn login_ended(&self, id: &str, expires: u64, now: u64) -> bool {
        self.logouts.lock().unwrap_or_else(PoisonError::into_inner).ended(id, expires, now)
    }

    pub fn try_lock(&self, key: &str, conversation: &str, owner: &str, hold: Duration) -> bool {
        let Ok(mut locks) = self.locks.lock() else { return false };
        let now = Instant::now();
        locks.retain(|_, (_, until)| *until > now);
        let lock = (key.to_string(), conversation.to_string());
        if locks.contains_key(&lock) {
            return false;
        }
        locks.insert(lock, (owner.to_string(), now + hold));
        true
    }

    /// Extends `owner`'s lock to `lease` from now; false when its lease lapsed.
    pub fn renew_lock(&self, key: &str, conversation: &str, owner: &str, lease: Duration) -> bool {
        let Ok(mut locks) = self.locks.lock() else { return false };
        let now = Instant::now();
        match locks.get_mut(&(key.to_string(), conversation.to_string())) {
            Some((held_by, until)) if held_by == owner && *until > now => {
                *until = now + lease;
                true
            }
            _ => false,
        }
    }

    pub fn unlock(&self, key: &str, conversation: &str, owner: &str) -> bool {
        let Ok(mut locks) = self.locks.lock() else { return false };
        let lock = (key.to_string(), conversation.to_string());
        if locks.get(&lock).is_some_and(|(held_by, _)| held_by == owner) {
            locks.remove(&lock);
            return true;
        }
        false
    }

    /// Whether someone holds the conversation's lock.
    pub fn locked(&self, key: &str, conversation: &str) -> bool {
        let Ok(locks) = self.locks.lock() else { return false };
        let now = Instant::now();
        locks.get(&(key.to_string(), conversation.to_string())).is_some_and(|(_, until)| *until > now)
    }
}

/// What one cache entry costs beyond its key and value: moka's bookkeeping (map bucket, deque
/// node, entry info, their share of the map's table) and the allocator's headers. Measured as the
/// resident memory of a million token counts ([`crate::tokens::TOKEN_ENTRY_BYTES`]).
const ENTRY_OVERHEAD: usize = crate::tokens::TOKEN_ENTRY_BYTES as usize;

/// What the allocator adds to each heap allocation (header and rounding).
const ALLOCATION: usize = 16;

/// A B-tree set's nodes beyond their elements, per element: partly filled nodes and node headers.
const BTREE_SLACK: usize = 16;

/// The one leaf node (11 slots) a B-tree set of a single element allocates.
const BTREE_LEAF: usize = 11 * size_of::<String>() + 16 + ALLOCATION;

impl MemorySession {
    /// An estimate of the memory the session holds, its key and index entry included: fixed parts
    /// by their type sizes, strings and collections by their lengths and capacities, each heap
    /// allocation with the allocator's overhead. Checked against resident memory with mimalloc: 97 %
    /// of it for sessions of one conversation, 98 % for agent sessions with 600 pruned ids.
    fn estimated_bytes(&self, key: &str) -> u32 {
        let string = |text: &str| size_of::<String>() + text.len() + ALLOCATION;
        let hash = session_part(key).unwrap_or_default();
        // The cache's key; the index's session hash, its slot, and the key's copy in its set.
        let index = string(hash) + 2 * size_of::<String>() + BTREE_LEAF + key.len() + ALLOCATION;
        let held = 2 * size_of::<usize>() + size_of::<Held>() + ALLOCATION;
        let table = self.conversations.capacity() * (size_of::<(String, Kept)>() + 1) + ALLOCATION;
        let conversations: usize = self.conversations.values().map(|kept| kept.bytes).sum();
        let total = ENTRY_OVERHEAD + string(key) + index + held + table + conversations;
        u32::try_from(total).unwrap_or(u32::MAX)
    }
}

/// The step in which a conversation's request log is charged.
const LOG_STEP: usize = 1024;

/// One request summary in a conversation's log.
fn logged_bytes(record: &str) -> usize {
    record.len() + ALLOCATION + 2 * size_of::<usize>()
}

/// One pruned id in a conversation's set.
fn pruned_id_bytes(id: &str) -> usize {
    size_of::<String>() + id.len() + ALLOCATION + BTREE_SLACK
}

/// An estimate of the memory one conversation's state holds, its id and `Arc` included, given
/// what its pruned ids hold (at most [`super::state::MAX_RECORDS`] records are walked).
fn conversation_bytes(id: &str, state: &ConversationState, pruned: usize) -> usize {
    let records = state.compactions.capacity() * size_of::<CompactionRecord>() + ALLOCATION;
    let record_text: usize = state
        .compactions
        .iter()
        .map(|r| {
            let text = r.summary.len() + r.covered_hash.len() + r.trigger.len() + r.model.len();
            text + r.user_messages.capacity() * size_of::<u32>() + 5 * ALLOCATION
        })
        .sum();
    let own = id.len() + ALLOCATION + 2 * size_of::<usize>() + size_of::<ConversationState>() + ALLOCATION;
    own + pruned + records + record_text
}

/// The session part of a key, `<session hash>` of `<tenant>.<session hash>`.
pub(super) fn session_part(key: &str) -> Option<&str> {
    key.split_once('.').map(|(_, hash)| hash).filter(|hash| !hash.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::state::ConversationUpdate;

    fn request(messages: u64) -> Update {
        let conversation = ConversationUpdate { request_messages: Some(messages), ..ConversationUpdate::default() };
        Update { conversation, ..Update::default() }
    }

    #[test]
    fn a_session_keeps_its_most_recently_used_conversations() {
        let store = MemoryStore::new(10, 1 << 20, 2, Duration::from_secs(60));
        store.update("s", "a", &request(1));
        store.update("s", "b", &request(2));
        store.update("s", "a", &request(3));
        store.update("s", "c", &request(4));
        let ids: Vec<String> = store.view("s").conversations.into_iter().map(|c| c.id).collect();
        assert_eq!(ids, ["c", "a"], "b was the least recently used");
        assert_eq!(store.load("s", "a").1.messages, 3);
        assert!(store.load("s", "b").1.is_empty());
    }

    fn pruning(ids: &[&str]) -> Update {
        let conversation = ConversationUpdate {
            pruned: ids.iter().map(|id| (*id).to_string()).collect(),
            request_messages: Some(1),
            ..ConversationUpdate::default()
        };
        Update { conversation, ..Update::default() }
    }

    #[test]
    fn a_sessions_weight_grows_with_what_it_keeps_and_is_kept_up_to_date_without_walking_it() {
        // A count bound that charges every session at least 1 byte: the weights are the estimates.
        let store = MemoryStore::new(1 << 20, 1 << 20, 4, Duration::from_secs(60));
        store.update("t.s", "a", &request(1));
        let empty = store.size().bytes;
        let long_id = "x".repeat(1_000);
        store.update("t.s", "a", &pruning(&["call_1", &long_id]));
        store.update("t.s", "a", &pruning(&["call_1", "call_2"]));
        store.update("t.s", "b", &pruning(&["call_3"]));
        let grown = store.size().bytes;
        assert!(grown > empty + 1_000, "{empty} -> {grown}");
        // The estimate kept by updates equals the one walked from scratch.
        let entry = store.sessions.get("t.s").unwrap();
        let session = entry.session.lock().unwrap();
        for (id, kept) in &session.conversations {
            let walked: usize = kept.state.pruned.iter().map(|id| pruned_id_bytes(id)).sum();
            assert_eq!(kept.bytes, conversation_bytes(id, &kept.state, walked), "{id}");
        }
        assert_eq!(u64::from(session.estimated_bytes("t.s")), grown);
    }

    #[test]
    fn max_sessions_still_caps_the_count_and_the_least_recently_used_go_first() {
        let store = MemoryStore::new(2, 1 << 20, 4, Duration::from_secs(60));
        store.update("t.a", "x", &request(1));
        store.update("t.b", "x", &request(1));
        store.load("t.a", "x");
        store.update("t.c", "x", &request(1));
        assert_eq!(store.size().entries, 2);
        assert!(store.load("t.b", "x").1.is_empty(), "b was the least recently used");
        assert!(!store.load("t.a", "x").1.is_empty() && !store.load("t.c", "x").1.is_empty());
        assert!(store.find("b").is_empty() && store.find("a") == ["t.a"], "the index follows");
    }

    #[test]
    fn a_session_bigger_than_the_whole_store_is_not_kept() {
        let store = MemoryStore::new(1 << 20, 8 * 1024, 4, Duration::from_secs(60));
        store.update("t.small", "x", &request(1));
        let ids: Vec<String> = (0..200).map(|i| format!("call_{i}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        store.update("t.huge", "x", &pruning(&ids));
        let size = store.size();
        assert!(size.bytes <= 8 * 1024, "{size:?}");
        assert!(store.load("t.huge", "x").1.is_empty(), "the huge one starts afresh every time");
        assert!(!store.load("t.small", "x").1.is_empty(), "and pushes nobody out: {size:?}");
    }

    #[test]
    fn concurrent_updates_leave_each_session_weighed_at_its_last_size() {
        // Four threads update the same sessions in the same order, each adding ids of its own
        // length: a weight taken before another thread's change and stored after it would leave
        // a session weighed below its size.
        let store = MemoryStore::new(1 << 20, 1 << 30, 4, Duration::from_secs(60));
        let keys: Vec<String> = (0..2_000).map(|i| format!("t.s{i}")).collect();
        let start = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|thread| {
                let (store, keys, start) = (store.clone(), keys.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for key in &keys {
                        let id = format!("call_{thread}_{}", "x".repeat(thread * 40));
                        store.update(key, "a", &pruning(&[&id]));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        for key in &keys {
            let entry = store.sessions.get(key).unwrap();
            let estimated = entry.session.lock().unwrap().estimated_bytes(key);
            assert_eq!(store.load(key, "a").1.pruned.len(), 4, "{key}: every update applied");
            assert_eq!(entry.bytes.load(Ordering::Relaxed), estimated, "{key}: weighed at a stale size");
        }
    }

    #[test]
    fn an_update_to_a_session_evicted_between_its_lookup_and_its_lock_is_not_lost() {
        let store = MemoryStore::new(10, 1 << 20, 4, Duration::from_secs(60));
        store.update("t.s", "a", &pruning(&["call_1"]));
        let entry = store.sessions.get("t.s").unwrap();
        let locked = entry.session.lock().unwrap();
        let updater = {
            let store = store.clone();
            std::thread::spawn(move || store.update("t.s", "a", &pruning(&["call_2"])))
        };
        // The updater has looked the entry up (the cache, this test and it hold it) and waits for
        // its lock; meanwhile the entry leaves the cache.
        while Arc::strong_count(&entry) < 3 {
            std::thread::yield_now();
        }
        store.sessions.invalidate("t.s");
        drop(locked);
        updater.join().unwrap();
        assert!(store.load("t.s", "a").1.pruned.contains("call_2"), "the update reached the session the store holds");
    }

    fn compact_requested() -> SessionUpdate {
        SessionUpdate { compact_requested: Some(true), ..SessionUpdate::default() }
    }

    /// Runs `mark` (the admin API's "compact next") on another thread while this one holds the
    /// lock of the entry under `t.s`; once the marker has looked the entry up and waits for its
    /// lock, `meanwhile` changes the store; then the lock is let go. What `mark` returned.
    fn mark_racing(store: &MemoryStore, meanwhile: impl FnOnce(&MemoryStore)) -> bool {
        let entry = store.sessions.get("t.s").unwrap();
        let locked = entry.session.lock().unwrap();
        let marker = {
            let store = store.clone();
            std::thread::spawn(move || store.update_existing_session("t.s", &compact_requested()))
        };
        // The cache, this test and the marker hold the entry: the marker looked it up.
        while Arc::strong_count(&entry) < 3 {
            std::thread::yield_now();
        }
        meanwhile(store);
        drop(locked);
        marker.join().unwrap()
    }

    #[test]
    fn an_admin_mark_on_a_session_evicted_between_its_lookup_and_its_lock_is_not_reported_as_made() {
        let store = MemoryStore::new(10, 1 << 20, 4, Duration::from_secs(60));
        store.update("t.s", "a", &request(1));
        let marked = mark_racing(&store, |store| store.sessions.invalidate("t.s"));
        assert!(!marked, "the session is gone: the mark landed nowhere and must not say it did");
        assert!(store.sessions.get("t.s").is_none(), "and the session is not made again");
    }

    #[test]
    fn an_admin_mark_on_a_session_replaced_between_its_lookup_and_its_lock_lands_on_the_new_one() {
        let store = MemoryStore::new(10, 1 << 20, 4, Duration::from_secs(60));
        store.update("t.s", "a", &request(1));
        let marked = mark_racing(&store, |store| {
            store.sessions.invalidate("t.s");
            // The session's next request starts it afresh while the mark waits.
            store.update("t.s", "a", &request(2));
        });
        assert!(marked);
        assert_eq!(
            store.view("t.s").session.counters.compact_requested,
            1,
            "the mark is on the session the store holds"
        );
    }

    #[test]
    fn admin_writes_racing_requests_that_reweigh_the_session_are_each_applied_once() {
        // Four admin writers and one request thread start together; the requests grow the session,
        // so it is weighed and inserted again under them: every write lands on the entry held.
        let store = MemoryStore::new(1 << 20, 1 << 30, 4, Duration::from_secs(60));
        store.update("t.s", "a", &request(1));
        let start = Arc::new(std::sync::Barrier::new(5));
        let saved_one = SessionUpdate { tokens_saved: 1, ..SessionUpdate::default() };
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let (store, start, update) = (store.clone(), start.clone(), saved_one.clone());
                std::thread::spawn(move || {
                    start.wait();
                    (0..500).filter(|_| store.update_existing_session("t.s", &update)).count()
                })
            })
            .collect();
        let requests = {
            let (store, start) = (store.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..500 {
                    store.update("t.s", "a", &pruning(&[&format!("call_{i}")]));
                }
            })
        };
        let applied: usize = writers.into_iter().map(|writer| writer.join().unwrap()).sum();
        requests.join().unwrap();
        assert_eq!(applied, 2_000, "the session existed throughout");
        assert_eq!(store.view("t.s").session.counters.tokens_saved, 2_000, "no write was lost");
    }

    /// A store holding `t.s` (conversation `a` pruned `call_1`), whose lock a panic poisoned.
    #[allow(clippy::panic)] // the panic is what the tests are about
    fn poisoned_store() -> MemoryStore {
        let store = MemoryStore::new(10, 1 << 20, 4, Duration::from_secs(60));
        store.update("t.s", "a", &pruning(&["call_1"]));
        let entry = store.sessions.get("t.s").unwrap();
        let poisoner = std::thread::spawn(move || {
            let _locked = entry.session.lock().unwrap();
            panic!("a panic while the session is locked");
        });
        assert!(poisoner.join().is_err());
        store
    }

    #[test]
    fn an_admin_mark_on_a_session_whose_lock_a_panic_poisoned_drops_it_loudly() {
        let store = poisoned_store();
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let marked =
            metrics::with_local_recorder(&recorder, || store.update_existing_session("t.s", &compact_requested()));
        assert!(!marked, "the session in doubt is gone: no mark was made");
        assert!(store.sessions.get("t.s").is_none(), "dropped at once, not left for a later request to find");
        let rendered = handle.render();
        assert!(rendered.contains("compactor_session_store_corrupt_total 1"), "counted: {rendered}");
    }

    #[test]
    fn a_panic_under_a_sessions_lock_drops_its_state_loudly_and_the_next_update_still_lands() {
        let store = poisoned_store();
        store.update("t.s", "a", &pruning(&["call_2"]));
        let (_, kept) = store.load("t.s", "a");
        assert!(kept.pruned.contains("call_2"), "{kept:?}");
        assert!(!kept.pruned.contains("call_1"), "the state in doubt is not served");
    }

    #[test]
    fn a_conversations_request_log_keeps_the_newest_up_to_its_bound_and_weighs_in() {
        let logged = |n: usize| {
            let mut update = request(1);
            update.conversation.record = Some(format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(3_000)));
            update
        };
        let store = MemoryStore::new(1 << 20, 1 << 24, 4, Duration::from_secs(60)).with_request_log(3);
        store.update("t.s", "a", &request(1));
        let empty = store.size().bytes;
        for n in 0..5 {
            store.update("t.s", "a", &logged(n));
        }
        let kept: Vec<u64> = store
            .requests("t.s", "a")
            .iter()
            .map(|json| serde_json::from_str::<serde_json::Value>(json).unwrap()["n"].as_u64().unwrap())
            .collect();
        assert_eq!(kept, [2, 3, 4], "the newest three, oldest first");
        assert!(store.size().bytes >= empty + 9_000, "the log counts in the session's weight");
        assert_eq!(store.recent(10).into_iter().map(|(key, _)| key).collect::<Vec<_>>(), ["t.s"]);
        let off = MemoryStore::new(1 << 20, 1 << 24, 4, Duration::from_secs(60));
        off.update("t.s", "a", &logged(0));
        assert!(off.requests("t.s", "a").is_empty(), "no bound, no log");
    }

    #[test]
    fn locks_are_per_conversation() {
        let store = MemoryStore::new(10, 1 << 20, 2, Duration::from_secs(60));
        let hold = Duration::from_secs(5);
        assert!(store.try_lock("s", "a", "one", hold));
        assert!(store.locked("s", "a"));
        assert!(!store.try_lock("s", "a", "two", hold));
        assert!(store.try_lock("s", "b", "two", hold), "another conversation has its own lock");
        assert!(!store.unlock("s", "a", "two"));
        assert!(store.unlock("s", "a", "one"));
        assert!(!store.locked("s", "a"));
    }
}
