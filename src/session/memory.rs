//! The in-process session store: bounded, with time-to-idle expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::state::{SessionState, SessionUpdate};

#[derive(Clone)]
pub struct MemoryStore {
    sessions: moka::sync::Cache<String, Arc<Mutex<SessionState>>>,
    locks: Arc<Mutex<HashMap<String, (String, Instant)>>>,
}

impl MemoryStore {
    pub fn new(max_sessions: u64, ttl: Duration) -> Self {
        Self {
            sessions: moka::sync::Cache::builder().max_capacity(max_sessions).time_to_idle(ttl).build(),
            locks: Arc::default(),
        }
    }

    pub fn load(&self, key: &str) -> Option<SessionState> {
        let entry = self.sessions.get(key)?;
        let state = entry.lock().map(|s| s.clone()).unwrap_or_default();
        Some(state)
    }

    pub fn update(&self, key: &str, update: &SessionUpdate) {
        let entry = self.sessions.get_with(key.to_string(), || Arc::new(Mutex::new(SessionState::default())));
        if let Ok(mut state) = entry.lock() {
            state.apply(update);
        }
    }

    pub fn forget(&self, key: &str) -> bool {
        self.sessions.remove(key).is_some()
    }

    pub fn try_lock(&self, key: &str, owner: &str, hold: Duration) -> bool {
        let Ok(mut locks) = self.locks.lock() else { return false };
        let now = Instant::now();
        locks.retain(|_, (_, until)| *until > now);
        if locks.contains_key(key) {
            return false;
        }
        locks.insert(key.to_string(), (owner.to_string(), now + hold));
        true
    }

    pub fn unlock(&self, key: &str, owner: &str) -> bool {
        let Ok(mut locks) = self.locks.lock() else { return false };
        if locks.get(key).is_some_and(|(held_by, _)| held_by == owner) {
            locks.remove(key);
            return true;
        }
        false
    }
}
