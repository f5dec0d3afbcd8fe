//! The session store: in memory by default, Redis when configured. An enum, not a trait object:
//! there are exactly these backends.

use std::time::Duration;

use super::error::StoreError;
use super::memory::MemoryStore;
use super::redis::RedisStore;
use super::state::{SessionState, SessionUpdate};
use crate::config::{SessionConfig, StoreKind};

#[derive(Clone)]
pub enum Store {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Store {
    /// Builds the configured store; a Redis store connects in the background (needs a runtime).
    pub fn from_config(config: &SessionConfig) -> Self {
        match config.store {
            StoreKind::Memory => Store::Memory(MemoryStore::new(config.max_sessions, config.ttl)),
            StoreKind::Redis => Store::Redis(RedisStore::new(config)),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
        }
    }

    /// The session's state; empty for a new session.
    pub async fn load(&self, key: &str) -> Result<SessionState, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.load(key).unwrap_or_default()),
            Store::Redis(store) => store.load(key).await,
        }
    }

    /// Adds what a request decided to its session.
    pub async fn update(&self, key: &str, update: &SessionUpdate) -> Result<(), StoreError> {
        match self {
            Store::Memory(store) => {
                store.update(key, update);
                Ok(())
            }
            Store::Redis(store) => store.update(key, update).await,
        }
    }

    /// Forgets a session; true when it existed.
    pub async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.forget(key)),
            Store::Redis(store) => store.forget(key).await,
        }
    }

    /// Takes the session's lock for at most `hold`, unless another owner holds it.
    pub async fn try_lock(&self, key: &str, owner: &str, hold: Duration) -> Result<bool, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.try_lock(key, owner, hold)),
            Store::Redis(store) => store.try_lock(key, owner, hold).await,
        }
    }

    /// Releases the lock if `owner` still holds it; true when it did.
    pub async fn unlock(&self, key: &str, owner: &str) -> Result<bool, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.unlock(key, owner)),
            Store::Redis(store) => store.unlock(key, owner).await,
        }
    }

    /// Whether the backend answers, for readiness.
    pub async fn health(&self) -> Result<(), StoreError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(store) => store.ping().await,
        }
    }
}
