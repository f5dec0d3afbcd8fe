//! The in-process session store: bounded (sessions, and conversations per session, the least
//! recently used dropped first), with time-to-idle expiry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::state::{ConversationState, ConversationView, SessionState, SessionUpdate, SessionView, Update};

/// Compaction locks by (session, conversation): owner and expiry.
type Locks = HashMap<(String, String), (String, Instant)>;

/// Session keys by their session part (`<tenant>.<session hash>` by `<session hash>`).
type Index = HashMap<String, std::collections::BTreeSet<String>>;

#[derive(Clone)]
pub struct MemoryStore {
    sessions: moka::sync::Cache<String, Arc<Mutex<MemorySession>>>,
    /// Keys by session hash, for the admin API's lookup by agent session id; an entry goes when
    /// its session leaves the cache.
    index: Arc<Mutex<Index>>,
    locks: Arc<Mutex<Locks>>,
    max_conversations: usize,
    /// Orders uses: two uses in the same millisecond still have an order.
    uses: Arc<AtomicU64>,
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
}

impl MemoryStore {
    pub fn new(max_sessions: u64, max_conversations: usize, ttl: Duration) -> Self {
        let index: Arc<Mutex<Index>> = Arc::default();
        let evicted = index.clone();
        let sessions = moka::sync::Cache::builder()
            .max_capacity(max_sessions)
            .time_to_idle(ttl)
            .eviction_listener(move |key: Arc<String>, _, _| {
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
            uses: Arc::default(),
        }
    }

    /// The session's state and its conversation's; empty when unknown.
    pub fn load(&self, key: &str, conversation: &str) -> (SessionState, Arc<ConversationState>) {
        let Some(entry) = self.sessions.get(key) else { return Default::default() };
        let Ok(session) = entry.lock() else { return Default::default() };
        let kept = session.conversations.get(conversation).map(|kept| kept.state.clone());
        (session.state.clone(), kept.unwrap_or_default())
    }

    /// Applies a request's changes and marks its conversation as the most recently used, dropping
    /// the least recently used one beyond the bound.
    pub fn update(&self, key: &str, conversation: &str, update: &Update) {
        let entry = self.sessions.get_with(key.to_string(), Arc::default);
        self.index_key(key);
        let Ok(mut session) = entry.lock() else { return };
        session.state.apply(&update.session);
        let use_order = self.uses.fetch_add(1, Ordering::Relaxed);
        let kept = session.conversations.entry(conversation.to_string()).or_insert_with(|| Kept {
            use_order,
            last_used_unix_ms: 0,
            state: Arc::default(),
        });
        kept.use_order = use_order;
        kept.last_used_unix_ms = super::unix_ms();
        Arc::make_mut(&mut kept.state).apply(&update.conversation);
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
        let entry = self.sessions.get_with(key.to_string(), Arc::default);
        self.index_key(key);
        if let Ok(mut session) = entry.lock() {
            session.state.apply(update);
        }
    }

    /// The session with every conversation it keeps, most recently used first.
    pub fn view(&self, key: &str) -> SessionView {
        let Some(entry) = self.sessions.get(key) else { return SessionView::default() };
        let Ok(session) = entry.lock() else { return SessionView::default() };
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

    pub fn forget(&self, key: &str) -> bool {
        self.sessions.remove(key).is_some()
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
        let store = MemoryStore::new(10, 2, Duration::from_secs(60));
        store.update("s", "a", &request(1));
        store.update("s", "b", &request(2));
        store.update("s", "a", &request(3));
        store.update("s", "c", &request(4));
        let ids: Vec<String> = store.view("s").conversations.into_iter().map(|c| c.id).collect();
        assert_eq!(ids, ["c", "a"], "b was the least recently used");
        assert_eq!(store.load("s", "a").1.messages, 3);
        assert!(store.load("s", "b").1.is_empty());
    }

    #[test]
    fn locks_are_per_conversation() {
        let store = MemoryStore::new(10, 2, Duration::from_secs(60));
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
