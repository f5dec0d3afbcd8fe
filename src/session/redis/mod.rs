//! The Redis session store, shared by every replica. One round trip to read a request's state (a
//! pipeline), one write pipeline per commit, off the request's path; every key with a TTL, one hash
//! tag per session so its keys live on one Redis Cluster shard.
//!
//! Layout, under `<prefix>:{<session key>}:` (the braces are the hash tag):
//! - `session`: hash of the session's own values (`requests`, `tokens_saved`, `compact_requested`,
//!   what was learned of its model, merged field by field, and `schema`: the version that wrote it);
//! - `conversations`: sorted set of the session's conversation ids by last use (server time in
//!   microseconds), at most `max_conversations` long;
//! - `c:<id>`: hash of one conversation (`requests`, `messages`, `usage` as versioned JSON,
//!   `breaker_failures`, `breaker_at`, `run`, `prefilled`, `answered_ms`, `idle_ms`);
//!   `c:<id>:pruned`: set of pruned call ids;
//!   `c:<id>:compactions`: list of versioned JSON records; `c:<id>:lock`: its compaction lock;
//!   `c:<id>:requests`: list of the inspector's request summaries (JSON), the newest
//!   `inspector.requests_per_conversation`.
//!
//! Beside them, `<prefix>:recent`: sorted set of session keys by last request (ms), the newest
//! [`RECENT_SESSIONS`], for the inspector's list of sessions.
//!
//! Beside them, `<prefix>:by-session:<session hash>`: the set of session keys (one per tenant)
//! sharing a session part, for the admin API's lookup by agent session id; written with the
//! session, with its TTL, so no raw agent id or credential is stored.
//!
//! Beside them, `<prefix>:ui-logout:<login id>`: an inspector login ended by "Log out" (the id is a
//! keyed hash of its cookie, never the cookie), with a TTL of the login's remaining lifetime, so
//! every replica refuses the cookie until it would have expired anyway.
//!
//! Beside them, `<prefix>:chain:<tenant>:<id>`: what a stateful Responses chain compactor
//! recovered (a response id or conversation id the agent names, in the tenant of its credential)
//! maps to (`compaction::stateful`), with the session TTL.
//!
//! The previous version's keys (`pruned`, `usage`, `counters`, `compactions`, `lock` right under
//! the hash tag) are never read: state is a cache, they expire with their TTL, and forgetting a
//!
//! The store's parts: its connection (`connection`), the keys it names (`keys`), the Lua scripts
//! that change several keys in one step (`scripts`), the hashes and stored values read back and
//! checked (`hashes`), and its reads, writes, compaction locks and ended logins (`read`,
//! `write`, `locks`, `logins`).

mod chains;
mod connection;
mod hashes;
mod keys;
mod locks;
mod logins;
mod read;
mod scripts;
mod write;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use super::runs::RunLengths;
use crate::config::SessionConfig;
use connection::{Connection, connect};

/// The store; connects in the background so compactor starts and serves while Redis is down.
#[derive(Clone)]
pub struct RedisStore {
    connection: Arc<OnceCell<Connection>>,
    prefix: String,
    ttl_secs: i64,
    max_conversations: usize,
    timeout: Duration,
    /// Request summaries kept per conversation for the inspector (0: none).
    request_log: usize,
    /// Models' histograms of run lengths, with when they were read.
    runs: Arc<std::sync::Mutex<HashMap<String, (std::time::Instant, RunLengths)>>>,
}

/// Sessions the inspector's list of recent sessions keeps (each commit trims the rest).
pub const RECENT_SESSIONS: usize = 10_000;

/// How long a model's histogram of run lengths read from Redis is used before it is read again.
const RUNS_REFRESH: Duration = Duration::from_secs(30);

/// Models whose histograms are kept in process at most (the cache starts afresh past it).
const RUNS_CACHED_MODELS: usize = 1_024;

impl RedisStore {
    pub fn new(config: &SessionConfig) -> Self {
        let store = Self {
            connection: Arc::new(OnceCell::new()),
            prefix: config.key_prefix.clone(),
            ttl_secs: i64::try_from(config.ttl.as_secs()).unwrap_or(i64::MAX),
            max_conversations: config.max_conversations.max(1) as usize,
            timeout: config.redis_timeout,
            request_log: 0,
            runs: Arc::default(),
        };
        let cell = store.connection.clone();
        let urls: Vec<String> = config.redis_url.expose().split(',').map(|u| u.trim().to_string()).collect();
        let cluster = config.redis_cluster;
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(100);
            loop {
                match connect(&urls, cluster).await {
                    Ok(connection) => {
                        tracing::info!("connected to redis");
                        let _ = cell.set(connection);
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot connect to redis yet; serving without stored state");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
        store
    }

    /// Keeps up to `requests` request summaries per conversation for the inspector.
    pub fn with_request_log(mut self, requests: usize) -> Self {
        self.request_log = requests;
        self
    }
}
