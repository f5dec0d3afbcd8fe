//! The session store: in memory by default, Redis when configured. An enum, not a trait object:
//! there are exactly these backends.

use std::time::Duration;

use super::memory::MemoryStore;
use super::state::{SessionState, SessionUpdate};
use crate::config::SessionConfig;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("session store unavailable: {0}")]
    Unavailable(String),
    #[error("session store timed out after {0:?}")]
    Timeout(Duration),
}

#[derive(Clone)]
pub enum Store {
    Memory(MemoryStore),
}

impl Store {
    pub fn from_config(config: &SessionConfig) -> Self {
        Store::Memory(MemoryStore::new(config.max_sessions, Duration::from_secs(config.ttl_secs)))
    }

    /// The session's state; empty for a new session.
    pub async fn load(&self, key: &str) -> Result<SessionState, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.load(key).unwrap_or_default()),
        }
    }

    /// Adds what a request decided to its session.
    pub async fn update(&self, key: &str, update: &SessionUpdate) -> Result<(), StoreError> {
        match self {
            Store::Memory(store) => {
                store.update(key, update);
                Ok(())
            }
        }
    }

    /// Forgets a session; true when it existed.
    pub async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.forget(key)),
        }
    }
}
