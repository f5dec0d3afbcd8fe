//! The session store: in memory by default, Redis when configured. An enum, not a trait object:
//! there are exactly these backends.

use std::time::Duration;

use super::error::StoreError;
use super::memory::MemoryStore;
use super::redis::RedisStore;
use super::state::{ConversationState, SessionState, SessionUpdate, SessionView, Update};
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
            StoreKind::Memory => {
                Store::Memory(MemoryStore::new(config.max_sessions, config.max_conversations as usize, config.ttl))
            }
            StoreKind::Redis => Store::Redis(RedisStore::new(config)),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
        }
    }

    /// The session's state and its conversation's; empty when new.
    pub async fn load(&self, key: &str, conversation: &str) -> Result<(SessionState, ConversationState), StoreError> {
        match self {
            Store::Memory(store) => Ok(store.load(key, conversation)),
            Store::Redis(store) => store.load(key, conversation).await,
        }
    }

    /// Whether a conversation's compaction lock is held, and then its state (read in that order:
    /// a holder publishes its record before it releases the lock).
    pub async fn poll(&self, key: &str, conversation: &str) -> Result<(ConversationState, bool), StoreError> {
        match self {
            Store::Memory(store) => {
                let locked = store.locked(key, conversation);
                Ok((store.load(key, conversation).1, locked))
            }
            Store::Redis(store) => store.poll(key, conversation).await,
        }
    }

    /// Adds what a request decided to its session and conversation, and marks the conversation as
    /// the session's most recently used (the least recently used beyond the bound is dropped).
    pub async fn update(&self, key: &str, conversation: &str, update: &Update) -> Result<(), StoreError> {
        match self {
            Store::Memory(store) => {
                store.update(key, conversation, update);
                Ok(())
            }
            Store::Redis(store) => store.update(key, conversation, update).await,
        }
    }

    /// Changes the session's own state only (the admin API).
    pub async fn update_session(&self, key: &str, update: &SessionUpdate) -> Result<(), StoreError> {
        match self {
            Store::Memory(store) => {
                store.update_session(key, update);
                Ok(())
            }
            Store::Redis(store) => store.update_session(key, update).await,
        }
    }

    /// The session with the conversations it keeps, most recently used first (the admin API).
    pub async fn view(&self, key: &str) -> Result<SessionView, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.view(key)),
            Store::Redis(store) => store.view(key).await,
        }
    }

    /// Forgets a session and all its conversations; true when it existed.
    pub async fn forget(&self, key: &str) -> Result<bool, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.forget(key)),
            Store::Redis(store) => store.forget(key).await,
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
        match self {
            Store::Memory(store) => Ok(store.try_lock(key, conversation, owner, hold)),
            Store::Redis(store) => store.try_lock(key, conversation, owner, hold).await,
        }
    }

    /// Releases a conversation's lock if `owner` still holds it; true when it did.
    pub async fn unlock(&self, key: &str, conversation: &str, owner: &str) -> Result<bool, StoreError> {
        match self {
            Store::Memory(store) => Ok(store.unlock(key, conversation, owner)),
            Store::Redis(store) => store.unlock(key, conversation, owner).await,
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
