//! The Redis session store, shared by every replica. One round trip to read a session (a
//! pipeline), writes off the request's path, every key with a TTL, one hash tag per session so
//! its keys live on one Redis Cluster shard.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Pipeline, RedisResult, Value as RedisValue};
use tokio::sync::OnceCell;

use super::error::StoreError;
use super::state::{CompactionRecord, Counters, MAX_RECORDS, STATE_VERSION, SessionState, SessionUpdate, Usage};
use crate::config::SessionConfig;

/// A connection to one Redis or to a Redis Cluster; both reconnect by themselves.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    async fn query<T: redis::FromRedisValue>(&self, pipeline: &Pipeline) -> RedisResult<T> {
        match self {
            Connection::Single(c) => pipeline.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => pipeline.query_async(&mut c.clone()).await,
        }
    }

    async fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match self {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

/// The store; connects in the background so compactor starts and serves while Redis is down.
#[derive(Clone)]
pub struct RedisStore {
    connection: Arc<OnceCell<Connection>>,
    prefix: String,
    ttl_secs: i64,
    timeout: Duration,
}

/// Deletes the lock only when the caller still owns it.
const RELEASE_LOCK: &str =
    r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;

impl RedisStore {
    pub fn new(config: &SessionConfig) -> Self {
        let store = Self {
            connection: Arc::new(OnceCell::new()),
            prefix: config.key_prefix.clone(),
            ttl_secs: i64::try_from(config.ttl.as_secs()).unwrap_or(i64::MAX),
            timeout: config.redis_timeout,
        };
        let cell = store.connection.clone();
        let urls: Vec<String> = config.redis_url.split(',').map(|u| u.trim().to_string()).collect();
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

    /// `{prefix}:{<session key>}:<part>`: the braces are the Redis Cluster hash tag.
    fn key(&self, session: &str, part: &str) -> String {
        format!("{}:{{{session}}}:{part}", self.prefix)
    }

    fn connection(&self) -> Result<&Connection, StoreError> {
        self.connection.get().ok_or(StoreError::NotConnected)
    }

    async fn bounded<T>(&self, work: impl Future<Output = RedisResult<T>>) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, work).await {
            Err(_) => Err(StoreError::Timeout(self.timeout)),
            Ok(Err(error)) => Err(StoreError::Redis(error)),
            Ok(Ok(value)) => Ok(value),
        }
    }

    /// Reads a whole session in one round trip.
    pub async fn load(&self, session: &str) -> Result<SessionState, StoreError> {
        let connection = self.connection()?;
        let mut pipeline = redis::pipe();
        pipeline
            .smembers(self.key(session, "pruned"))
            .get(self.key(session, "usage"))
            .hgetall(self.key(session, "counters"))
            .lrange(self.key(session, "compactions"), 0, -1);
        type Loaded = (Vec<String>, Option<String>, Vec<(String, u64)>, Vec<String>);
        let (pruned, usage, counters, compactions): Loaded = self.bounded(connection.query(&pipeline)).await?;
        let usage =
            usage.and_then(|json| serde_json::from_str::<Versioned<Usage>>(&json).ok()).and_then(Versioned::current);
        let compactions = compactions
            .iter()
            .filter_map(|json| serde_json::from_str::<Versioned<CompactionRecord>>(json).ok())
            .filter_map(Versioned::current)
            .collect();
        let counter = |name: &str| counters.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v);
        Ok(SessionState {
            version: STATE_VERSION,
            pruned: pruned.into_iter().collect(),
            compactions,
            usage,
            counters: Counters {
                requests: counter("requests"),
                tokens_saved: counter("tokens_saved"),
                compaction_failures: counter("compaction_failures"),
                failures_at_messages: counter("failures_at_messages"),
                compact_requested: counter("compact_requested"),
                learned_window: counter("learned_window"),
            },
        })
    }

    /// Adds a request's decisions: set union for pruned ids, so replicas never undo each other.
    pub async fn update(&self, session: &str, update: &SessionUpdate) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let keys = ["pruned", "usage", "counters", "compactions"].map(|part| self.key(session, part));
        let mut pipeline = redis::pipe();
        if !update.pruned.is_empty() {
            pipeline.sadd(&keys[0], &update.pruned).ignore();
        }
        if let Some(usage) = &update.usage {
            pipeline.set(&keys[1], Versioned::json(usage)?).ignore();
        }
        if update.count_request {
            pipeline.hincr(&keys[2], "requests", 1).ignore();
        }
        if update.clear_usage {
            pipeline.del(&keys[1]).ignore();
        }
        if let Some((failures, at)) = update.breaker {
            pipeline.hset(&keys[2], "compaction_failures", failures).ignore();
            pipeline.hset(&keys[2], "failures_at_messages", at).ignore();
        }
        if let Some(requested) = update.compact_requested {
            pipeline.hset(&keys[2], "compact_requested", u64::from(requested)).ignore();
        }
        if let Some(window) = update.learned_window {
            pipeline.hset(&keys[2], "learned_window", window).ignore();
        }
        if update.tokens_saved > 0 {
            pipeline.hincr(&keys[2], "tokens_saved", update.tokens_saved).ignore();
        }
        if let Some(record) = &update.compaction {
            pipeline.rpush(&keys[3], Versioned::json(record)?).ignore();
            // The newest records are the ones that can still match; keep a bounded lineage.
            pipeline.ltrim(&keys[3], -(MAX_RECORDS as isize), -1).ignore();
        }
        // Every key of the session gets (or keeps) the TTL: refreshed on use.
        for key in &keys {
            pipeline.expire(key, self.ttl_secs).ignore();
        }
        self.bounded(connection.query::<()>(&pipeline)).await
    }

    pub async fn forget(&self, session: &str) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let keys: Vec<String> =
            ["pruned", "usage", "counters", "compactions", "lock"].iter().map(|p| self.key(session, p)).collect();
        let deleted: u64 = self.bounded(connection.command(redis::cmd("DEL").arg(&keys))).await?;
        Ok(deleted > 0)
    }

    /// Takes the session's lock for `hold` unless someone else has it (SET NX PX).
    pub async fn try_lock(&self, session: &str, owner: &str, hold: Duration) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.key(session, "lock")).arg(owner).arg("NX").arg("PX").arg(hold.as_millis() as u64);
        let reply: RedisValue = self.bounded(connection.command(&cmd)).await?;
        Ok(matches!(reply, RedisValue::Okay))
    }

    /// Releases the lock only if `owner` still holds it.
    pub async fn unlock(&self, session: &str, owner: &str) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RELEASE_LOCK).arg(1).arg(self.key(session, "lock")).arg(owner);
        let released: u64 = self.bounded(connection.command(&cmd)).await?;
        Ok(released == 1)
    }

    /// Round-trips a PING, for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let _: String = self.bounded(connection.command(&redis::cmd("PING"))).await?;
        Ok(())
    }
}

async fn connect(urls: &[String], cluster: bool) -> RedisResult<Connection> {
    if cluster {
        let client = ClusterClient::builder(urls.to_vec())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()?;
        return Ok(Connection::Cluster(client.get_async_connection().await?));
    }
    let client = redis::Client::open(urls.first().map(String::as_str).unwrap_or_default())?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_max_delay(Duration::from_secs(2));
    Ok(Connection::Single(ConnectionManager::new_with_config(client, config).await?))
}

/// A stored JSON value with its schema version; values of another version are ignored.
#[derive(serde::Serialize, serde::Deserialize)]
struct Versioned<T> {
    v: u32,
    #[serde(flatten)]
    value: T,
}

impl<T: serde::Serialize> Versioned<&T> {
    /// The stored form of `value`; a value that cannot be serialized is an error, never an empty write.
    fn json(value: &T) -> Result<String, StoreError> {
        serde_json::to_string(&Versioned { v: STATE_VERSION, value }).map_err(StoreError::Serialize)
    }
}

impl<T> Versioned<T> {
    fn current(self) -> Option<T> {
        (self.v == STATE_VERSION).then_some(self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Unserializable;

    impl serde::Serialize for Unserializable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }

    #[test]
    fn a_value_that_cannot_be_serialized_is_an_error_not_an_empty_write() {
        assert!(matches!(Versioned::json(&Unserializable), Err(StoreError::Serialize(_))));
        let usage = Usage { prompt_tokens: 5, ..Usage::default() };
        let stored = Versioned::json(&usage).unwrap();
        let read: Versioned<Usage> = serde_json::from_str(&stored).unwrap();
        assert_eq!(read.current(), Some(usage));
    }
}
