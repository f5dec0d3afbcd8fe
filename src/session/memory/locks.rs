//! The in-process compaction locks, per conversation: taken with a lease, renewed and released
//! only by their owner.

use std::time::{Duration, Instant};

use super::MemoryStore;

impl MemoryStore {
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
