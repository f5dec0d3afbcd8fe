//! The in-process session store: bounded, with time-to-idle expiry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::state::{SessionState, SessionUpdate};

#[derive(Clone)]
pub struct MemoryStore {
    sessions: moka::sync::Cache<String, Arc<Mutex<SessionState>>>,
}

impl MemoryStore {
    pub fn new(max_sessions: u64, ttl: Duration) -> Self {
        Self { sessions: moka::sync::Cache::builder().max_capacity(max_sessions).time_to_idle(ttl).build() }
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
}
