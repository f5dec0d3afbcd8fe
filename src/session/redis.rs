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
//! The previous version's keys (`pruned`, `usage`, `counters`, `compactions`, `lock` right under
//! the hash tag) are never read: state is a cache, they expire with their TTL, and forgetting a
//! session deletes them too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Pipeline, RedisResult, Value as RedisValue};
use tokio::sync::OnceCell;

use super::error::StoreError;
use super::runs::{BOUNDS, RunLengths};
use super::state::{
    Breaker, CALIBRATION_MILLI, CompactionRecord, ConversationState, ConversationView, Counters, Learned, MAX_RECORDS,
    STATE_VERSION, SessionState, SessionUpdate, SessionView, Update, Usage,
};
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

/// Deletes the lock only when the caller still owns it.
const RELEASE_LOCK: &str =
    r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;

/// Extends the lock's lease only when the caller still owns it. ARGV: owner, lease in ms.
const RENEW_LOCK: &str =
    r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) else return 0 end"#;

/// Appends a compaction record unless the list already ends with one of its generation or a
/// later one: the fencing of the compaction lock, so a holder whose lease lapsed while another
/// took over cannot lay a second record of the same generation over the winner's. KEYS[1]: the
/// record list; ARGV: the record's JSON, its generation, how many records are kept.
const PUSH_RECORD: &str = r#"
local last = redis.call("LINDEX", KEYS[1], -1)
if last then
  local ok, record = pcall(cjson.decode, last)
  if ok and type(record) == "table" and tonumber(record.generation) and tonumber(record.generation) >= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call("RPUSH", KEYS[1], ARGV[1])
redis.call("LTRIM", KEYS[1], -tonumber(ARGV[3]), -1)
return 1
"#;

/// Marks a conversation as just used and drops the least recently used ones beyond the bound,
/// with their keys, in the same step. KEYS[1]: the session's `conversations`; ARGV: the
/// conversation id, the bound, the TTL in seconds, the key prefix of conversations. Server time,
/// so replicas with different clocks still agree on the order. (The keys it deletes are not
/// declared: they share the session's hash tag, hence its Cluster slot.)
const TOUCH_CONVERSATION: &str = r#"
local now = redis.call("TIME")
redis.call("ZADD", KEYS[1], now[1] * 1000000 + now[2], ARGV[1])
local excess = redis.call("ZCARD", KEYS[1]) - tonumber(ARGV[2])
if excess > 0 then
  for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, excess - 1)) do
    if id ~= ARGV[1] then
      local base = ARGV[4] .. id
      redis.call("DEL", base, base .. ":pruned", base .. ":compactions", base .. ":requests")
      redis.call("ZREM", KEYS[1], id)
    end
  end
end
redis.call("EXPIRE", KEYS[1], ARGV[3])
return 0
"#;

/// Merges what one request learned of its model into a session's (or a model's) hash, the rule
/// of [`Learned::merge`]: another model's values are replaced; the same model's are joined (the
/// smallest named window and unnamed overflow, the largest answer and output) and each
/// calibration measurement is folded into the stored smoothing; an overflow bound an answer
/// contradicts is dropped. KEYS[1]: the hash; ARGV: model tag, window, window_below,
/// window_at_least, output_peak, the calibration the request started from, the calibration's
/// bounds, then the measurements. The tag is compared as text (a 64-bit hash is no Lua number);
/// every other value is far below 2^53.
const MERGE_LEARNED: &str = r#"
local key = KEYS[1]
local function stored(field) return tonumber(redis.call("HGET", key, field) or "0") or 0 end
local function smallest_set(a, b)
  if a == 0 then return b elseif b == 0 then return a else return math.min(a, b) end
end
local window, below, least, peak, calibration
if redis.call("HGET", key, "model_tag") ~= ARGV[1] then
  window, below, least = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  peak, calibration = tonumber(ARGV[5]), tonumber(ARGV[6])
else
  window = smallest_set(stored("learned_window"), tonumber(ARGV[2]))
  below = smallest_set(stored("window_below"), tonumber(ARGV[3]))
  least = math.max(stored("window_at_least"), tonumber(ARGV[4]))
  peak = math.max(stored("output_peak"), tonumber(ARGV[5]))
  calibration = stored("calibration_milli")
  if calibration == 0 then calibration = tonumber(ARGV[6]) end
end
local low, high = tonumber(ARGV[7]), tonumber(ARGV[8])
for i = 9, #ARGV do
  local observed = tonumber(ARGV[i])
  if calibration == 0 then
    calibration = observed
  else
    calibration = math.min(math.max(math.floor((calibration * 6 + observed * 4) / 10), low), high)
  end
end
if below > 0 and below <= least then below = 0 end
local function text(n) return string.format("%d", n) end
redis.call("HSET", key, "model_tag", ARGV[1], "learned_window", text(window), "window_below", text(below),
  "window_at_least", text(least), "calibration_milli", text(calibration), "output_peak", text(peak))
return 0
"#;

/// Deletes a whole session: every conversation the sorted set KEYS[1] lists (ARGV[1]: their key
/// prefix), then KEYS (the session's own keys and the previous layout's). Returns how many keys
/// went.
const FORGET_SESSION: &str = r#"
local deleted = 0
for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
  local base = ARGV[1] .. id
  deleted = deleted + redis.call("DEL", base, base .. ":pruned", base .. ":compactions", base .. ":lock", base .. ":requests")
end
return deleted + redis.call("DEL", unpack(KEYS))
"#;

/// Sets the session's `compact_requested` when the session exists (its hash KEYS[1] or its
/// conversations KEYS[2]); 1 when it did, 0 (and nothing written) when not. ARGV[1]: the TTL.
const REQUEST_COMPACTION: &str = r#"
if redis.call("EXISTS", KEYS[1], KEYS[2]) == 0 then return 0 end
redis.call("HSET", KEYS[1], "compact_requested", 1)
redis.call("EXPIRE", KEYS[1], ARGV[1])
return 1
"#;

/// Keys of the previous layout (one set of keys per session), deleted when a session is forgotten.
const PREVIOUS_LAYOUT: [&str; 5] = ["pruned", "usage", "counters", "compactions", "lock"];

/// A Redis hash as field/value pairs.
type Hash = Vec<(String, String)>;

/// A number field of a hash; 0 when absent or not a number.
fn number(hash: &Hash, name: &str) -> u64 {
    hash.iter().find(|(field, _)| field == name).and_then(|(_, value)| value.parse().ok()).unwrap_or(0)
}

/// A session's hash, read.
fn session_state(hash: &Hash) -> SessionState {
    SessionState {
        version: STATE_VERSION,
        counters: Counters {
            requests: number(hash, "requests"),
            tokens_saved: number(hash, "tokens_saved"),
            compact_requested: number(hash, "compact_requested"),
            learned: Learned {
                model_tag: number(hash, "model_tag"),
                window: number(hash, "learned_window"),
                window_below: number(hash, "window_below"),
                window_at_least: number(hash, "window_at_least"),
                calibration_milli: number(hash, "calibration_milli"),
                output_peak: number(hash, "output_peak"),
            },
            prompt_tokens: number(hash, "prompt_tokens"),
            cache_read_tokens: number(hash, "cache_read_tokens"),
            cache_write_tokens: number(hash, "cache_write_tokens"),
            pruned_requests: number(hash, "pruned_requests"),
            compacted_requests: number(hash, "compacted_requests"),
            overflow_requests: number(hash, "overflow_requests"),
        },
        runs: run_lengths(hash),
    }
}

/// A model's histogram of run lengths: fields `run_<bucket>` of its session hash.
fn run_lengths(hash: &Hash) -> RunLengths {
    let mut runs = RunLengths::default();
    for (field, value) in hash {
        let bucket = field.strip_prefix("run_").and_then(|b| b.parse::<usize>().ok());
        if let (Some(slot), Ok(count)) = (bucket.and_then(|b| runs.reached.get_mut(b)), value.parse()) {
            *slot = count;
        }
    }
    runs
}

/// A conversation's three keys, read; values of another version are left out.
fn conversation_state(hash: &Hash, pruned: Vec<String>, compactions: &[String]) -> ConversationState {
    let usage = hash
        .iter()
        .find(|(field, _)| field == "usage")
        .and_then(|(_, json)| serde_json::from_str::<Versioned<Usage>>(json).ok())
        .and_then(Versioned::current);
    ConversationState {
        pruned: pruned.into_iter().collect(),
        compactions: compactions
            .iter()
            .filter_map(|json| serde_json::from_str::<Versioned<CompactionRecord>>(json).ok())
            .filter_map(Versioned::current)
            .collect(),
        usage,
        breaker: Breaker { failures: number(hash, "breaker_failures"), at_messages: number(hash, "breaker_at") },
        requests: number(hash, "requests"),
        messages: number(hash, "messages"),
        last_request_unix_ms: number(hash, "last_request_ms"),
        run: number(hash, "run"),
        prefilled: u32::try_from(number(hash, "prefilled")).unwrap_or(0),
        answered_unix_ms: number(hash, "answered_ms"),
        idle_ms: number(hash, "idle_ms"),
    }
}

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

    /// `{prefix}:{<session key>}:<part>`: the braces are the Redis Cluster hash tag.
    fn key(&self, session: &str, part: &str) -> String {
        format!("{}:{{{session}}}:{part}", self.prefix)
    }

    /// The prefix of a session's conversation keys: `{prefix}:{<session key>}:c:`.
    fn conversations_prefix(&self, session: &str) -> String {
        self.key(session, "c:")
    }

    /// A conversation's keys: its hash, pruned set and record list.
    fn conversation_keys(&self, session: &str, conversation: &str) -> [String; 3] {
        let base = format!("{}{conversation}", self.conversations_prefix(session));
        [format!("{base}:pruned"), format!("{base}:compactions"), base]
    }

    /// The set of session keys sharing a session part: `{prefix}:by-session:<session hash>`.
    fn index_key(&self, hash: &str) -> String {
        format!("{}:by-session:{hash}", self.prefix)
    }

    /// Adds the session to the index of its session part, with the sessions' TTL.
    fn write_index(&self, pipeline: &mut Pipeline, session: &str) {
        if let Some(hash) = super::memory::session_part(session) {
            let index = self.index_key(hash);
            pipeline.sadd(&index, session).ignore().expire(&index, self.ttl_secs).ignore();
        }
    }

    /// Marks the session as just used in the list of recent sessions, when the inspector records.
    fn write_recent(&self, pipeline: &mut Pipeline, session: &str) {
        if self.request_log > 0 {
            let recent = self.recent_key();
            pipeline.zadd(&recent, session, super::unix_ms()).ignore();
            pipeline.zremrangebyrank(&recent, 0, -(RECENT_SESSIONS as isize) - 1).ignore();
            pipeline.expire(&recent, self.ttl_secs).ignore();
        }
    }

    /// The sorted set of recent sessions: `{prefix}:recent`.
    fn recent_key(&self) -> String {
        format!("{}:recent", self.prefix)
    }

    /// The sessions used most recently, newest first, with when (Unix ms); some may have
    /// expired or been forgotten since (the caller checks).
    pub async fn recent(&self, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        let connection = self.connection()?;
        let mut command = redis::cmd("ZREVRANGE");
        command.arg(self.recent_key()).arg(0).arg(limit.max(1) as isize - 1).arg("WITHSCORES");
        let listed: Vec<(String, f64)> = self.bounded(connection.command(&command)).await?;
        Ok(listed.into_iter().map(|(key, at)| (key, at as u64)).collect())
    }

    /// The sessions' own hashes, read in one pipeline.
    pub async fn sessions(&self, keys: &[String]) -> Result<Vec<SessionState>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let connection = self.connection()?;
        if matches!(connection, Connection::Cluster(_)) {
            // Each session on its own slot: a pipeline across them would be refused.
            let mut states = Vec::with_capacity(keys.len());
            for key in keys {
                let mut command = redis::cmd("HGETALL");
                command.arg(self.key(key, "session"));
                let hash: Hash = self.bounded(connection.command(&command)).await?;
                states.push(session_state(&hash));
            }
            return Ok(states);
        }
        let mut pipeline = redis::pipe();
        for key in keys {
            pipeline.hgetall(self.key(key, "session"));
        }
        let hashes: Vec<Hash> = self.bounded(connection.query(&pipeline)).await?;
        Ok(hashes.iter().map(session_state).collect())
    }

    /// The request summaries kept for a conversation, oldest first.
    pub async fn requests(&self, session: &str, conversation: &str) -> Result<Vec<String>, StoreError> {
        let connection = self.connection()?;
        let mut command = redis::cmd("LRANGE");
        command.arg(self.requests_key(session, conversation)).arg(0).arg(-1);
        self.bounded(connection.command(&command)).await
    }

    /// A conversation's list of request summaries: `…:c:<id>:requests`.
    fn requests_key(&self, session: &str, conversation: &str) -> String {
        format!("{}{conversation}:requests", self.conversations_prefix(session))
    }

    /// The keys indexed under a session part; some may have expired since (the caller checks).
    pub async fn find(&self, hash: &str) -> Result<Vec<String>, StoreError> {
        let connection = self.connection()?;
        let mut command = redis::cmd("SMEMBERS");
        command.arg(self.index_key(hash));
        self.bounded(connection.command(&command)).await
    }

    fn lock_key(&self, session: &str, conversation: &str) -> String {
        format!("{}{conversation}:lock", self.conversations_prefix(session))
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

    /// The reads of one request's state: the session's hash, then the conversation's hash, pruned
    /// set and records.
    fn read(&self, pipeline: &mut Pipeline, session: &str, conversation: &str) {
        let [pruned, compactions, hash] = self.conversation_keys(session, conversation);
        pipeline.hgetall(self.key(session, "session")).hgetall(hash).smembers(pruned).lrange(compactions, 0, -1);
    }

    /// Reads the session's state and its conversation's in one round trip; a session another
    /// schema version wrote is [`StoreError::OtherVersion`].
    pub async fn load(
        &self,
        session: &str,
        conversation: &str,
    ) -> Result<(SessionState, ConversationState), StoreError> {
        let connection = self.connection()?;
        let mut pipeline = redis::pipe();
        self.read(&mut pipeline, session, conversation);
        type Loaded = (Hash, Hash, Vec<String>, Vec<String>);
        let (session_hash, hash, pruned, compactions): Loaded =
            self.bounded(connection.query(&pipeline)).await.map_err(corrupt_if_unreadable)?;
        readable(&session_hash, &hash, &compactions)?;
        Ok((session_state(&session_hash), conversation_state(&hash, pruned, &compactions)))
    }

    /// Whether the conversation's compaction lock is held, then its state, in one round trip (for
    /// a request waiting on another's compaction). The lock is read first: its holder publishes
    /// before it releases, so a lock seen free means its record is in what is read after.
    pub async fn poll(&self, session: &str, conversation: &str) -> Result<(ConversationState, bool), StoreError> {
        let connection = self.connection()?;
        let mut pipeline = redis::pipe();
        pipeline.exists(self.lock_key(session, conversation));
        self.read(&mut pipeline, session, conversation);
        type Polled = (bool, Hash, Hash, Vec<String>, Vec<String>);
        let (locked, _, hash, pruned, compactions): Polled = self.bounded(connection.query(&pipeline)).await?;
        Ok((conversation_state(&hash, pruned, &compactions), locked))
    }

    /// Adds a request's decisions in one pipeline: set union for pruned ids and increments for
    /// counters, so replicas never undo each other; the conversation becomes the session's most
    /// recently used, and every key written gets (or keeps) the TTL.
    pub async fn update(&self, session: &str, conversation: &str, update: &Update) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let mut pipeline = redis::pipe();
        self.write_session(&mut pipeline, session, &update.session);
        // The index has another slot than the session's keys: a Redis Cluster takes it separately.
        let cluster = matches!(connection, Connection::Cluster(_));
        if !cluster {
            self.write_index(&mut pipeline, session);
            self.write_recent(&mut pipeline, session);
        }
        let change = &update.conversation;
        let [pruned, compactions, hash] = self.conversation_keys(session, conversation);
        if !change.pruned.is_empty() {
            pipeline.sadd(&pruned, &change.pruned).ignore();
        }
        if let Some(usage) = &change.usage {
            pipeline.hset(&hash, "usage", Versioned::json(usage)?).ignore();
        }
        if change.clear_usage {
            pipeline.hdel(&hash, "usage").ignore();
        }
        if let Some(breaker) = change.breaker {
            let fields = [("breaker_failures", breaker.failures), ("breaker_at", breaker.at_messages)];
            pipeline.hset_multiple(&hash, &fields).ignore();
        }
        if change.request_messages.is_some() {
            pipeline.hincr(&hash, "requests", 1).ignore();
        }
        // The conversation's numbers a request sets, in one command.
        let numbers: Vec<(&str, u64)> = [
            ("messages", change.request_messages),
            ("last_request_ms", change.request_at_unix_ms),
            ("run", change.run),
            ("prefilled", change.prefilled.map(u64::from)),
            ("answered_ms", change.answered_at_unix_ms),
            ("idle_ms", change.idle_ms),
        ]
        .into_iter()
        .filter_map(|(field, value)| Some((field, value?)))
        .collect();
        if !numbers.is_empty() {
            pipeline.hset_multiple(&hash, &numbers).ignore();
        }
        if let Some(record) = &change.compaction {
            // The newest records are the ones that can still match; keep a bounded lineage.
            pipeline
                .cmd("EVAL")
                .arg(PUSH_RECORD)
                .arg(1)
                .arg(&compactions)
                .arg(Versioned::json(record)?)
                .arg(record.generation)
                .arg(MAX_RECORDS)
                .ignore();
        }
        for key in [&hash, &pruned, &compactions] {
            pipeline.expire(key, self.ttl_secs).ignore();
        }
        if let Some(record) = change.record.as_deref().filter(|_| self.request_log > 0) {
            // The inspector's summary rides the same pipeline: no round trip of its own.
            let requests = self.requests_key(session, conversation);
            pipeline.rpush(&requests, record).ignore();
            pipeline.ltrim(&requests, -(self.request_log as isize), -1).ignore();
            pipeline.expire(&requests, self.ttl_secs).ignore();
        }
        pipeline
            .cmd("EVAL")
            .arg(TOUCH_CONVERSATION)
            .arg(1)
            .arg(self.key(session, "conversations"))
            .arg(conversation)
            .arg(self.max_conversations)
            .arg(self.ttl_secs)
            .arg(self.conversations_prefix(session))
            .ignore();
        // A run's count rides the same round trip, unless the model's key is on another shard.
        let mut model = redis::pipe();
        if let Some(run) = &update.model_run {
            let key = self.key(&run.store_key, "session");
            let target = if cluster { &mut model } else { &mut pipeline };
            target.hincr(&key, format!("run_{}", run.bucket.min(BOUNDS.len() - 1)), 1).ignore();
            target.expire(&key, self.ttl_secs).ignore();
        }
        self.bounded(connection.query::<()>(&pipeline)).await?;
        if cluster {
            let mut index = redis::pipe();
            self.write_index(&mut index, session);
            self.bounded(connection.query::<()>(&index)).await?;
            if self.request_log > 0 {
                let mut recent = redis::pipe();
                self.write_recent(&mut recent, session);
                self.bounded(connection.query::<()>(&recent)).await?;
            }
            if update.model_run.is_some() {
                self.bounded(connection.query::<()>(&model)).await?;
            }
        }
        Ok(())
    }

    /// A model's histogram of run lengths, as read at most [`RUNS_REFRESH`] ago: it moves slowly,
    /// and a read per request would add a round trip to every request.
    pub async fn run_lengths(&self, model_key: &str) -> Result<RunLengths, StoreError> {
        if let Ok(cached) = self.runs.lock()
            && let Some((at, runs)) = cached.get(model_key)
            && at.elapsed() < RUNS_REFRESH
        {
            return Ok(*runs);
        }
        let connection = self.connection()?;
        let mut command = redis::cmd("HGETALL");
        command.arg(self.key(model_key, "session"));
        let hash: Hash = self.bounded(connection.command(&command)).await?;
        let runs = run_lengths(&hash);
        if let Ok(mut cached) = self.runs.lock() {
            if cached.len() >= RUNS_CACHED_MODELS {
                cached.clear();
            }
            cached.insert(model_key.to_string(), (std::time::Instant::now(), runs));
        }
        Ok(runs)
    }

    /// Changes the session's own values only (the admin API's requests).
    pub async fn update_session(&self, session: &str, update: &SessionUpdate) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let mut pipeline = redis::pipe();
        self.write_session(&mut pipeline, session, update);
        self.bounded(connection.query::<()>(&pipeline)).await
    }

    fn write_session(&self, pipeline: &mut Pipeline, session: &str, update: &SessionUpdate) {
        let key = self.key(session, "session");
        if update.count_request {
            pipeline.hincr(&key, "requests", 1).ignore();
        }
        if update.tokens_saved > 0 {
            pipeline.hincr(&key, "tokens_saved", update.tokens_saved).ignore();
        }
        if let Some(requested) = update.compact_requested {
            pipeline.hset(&key, "compact_requested", u64::from(requested)).ignore();
        }
        if let Some(change) = &update.learned {
            // Merged on the server in one step, field by field: a commit of what another request
            // saw earlier never undoes what was learned meanwhile.
            let known = &change.known;
            let (low, high) = CALIBRATION_MILLI;
            pipeline
                .cmd("EVAL")
                .arg(MERGE_LEARNED)
                .arg(1)
                .arg(&key)
                .arg(known.model_tag)
                .arg(known.window)
                .arg(known.window_below)
                .arg(known.window_at_least)
                .arg(known.output_peak)
                .arg(known.calibration_milli)
                .arg(low)
                .arg(high)
                .arg(&change.measured)
                .ignore();
        }
        let marks = [
            ("pruned_requests", update.marks.pruned),
            ("compacted_requests", update.marks.compacted),
            ("overflow_requests", update.marks.overflow),
        ];
        for (field, _) in marks.into_iter().filter(|(_, marked)| *marked) {
            pipeline.hincr(&key, field, 1).ignore();
        }
        if let Some(usage) = update.usage {
            let counters = [
                ("prompt_tokens", usage.prompt_tokens),
                ("cache_read_tokens", usage.cached_tokens),
                ("cache_write_tokens", usage.cache_write_tokens),
            ];
            for (field, tokens) in counters.into_iter().filter(|(_, tokens)| *tokens > 0) {
                pipeline.hincr(&key, field, tokens).ignore();
            }
        }
        // Which schema wrote the session: a replica of another version leaves it alone.
        pipeline.hset(&key, "schema", STATE_VERSION).ignore();
        pipeline.expire(&key, self.ttl_secs).ignore();
    }

    /// The session and every conversation it keeps, most recently used first, in two round
    /// trips (the list, then the conversations); conversations whose keys expired are left out.
    pub async fn view(&self, session: &str) -> Result<SessionView, StoreError> {
        let connection = self.connection()?;
        let mut pipeline = redis::pipe();
        pipeline.hgetall(self.key(session, "session"));
        pipeline.cmd("ZREVRANGE").arg(self.key(session, "conversations")).arg(0).arg(-1).arg("WITHSCORES");
        let (session_hash, listed): (Hash, Vec<(String, f64)>) = self.bounded(connection.query(&pipeline)).await?;
        let mut pipeline = redis::pipe();
        for (id, _) in &listed {
            let [pruned, compactions, hash] = self.conversation_keys(session, id);
            pipeline.hgetall(hash).smembers(pruned).lrange(compactions, 0, -1);
        }
        let read: Vec<(Hash, Vec<String>, Vec<String>)> = match listed.is_empty() {
            true => Vec::new(),
            false => self.bounded(connection.query(&pipeline)).await?,
        };
        let conversations = listed
            .into_iter()
            .zip(read)
            .map(|((id, score), (hash, pruned, compactions))| {
                // Scores are server time in microseconds.
                ConversationView::new(id, (score / 1000.0) as u64, conversation_state(&hash, pruned, &compactions))
            })
            .filter(|view| !view.state.is_empty())
            .collect();
        Ok(SessionView::new(session_state(&session_hash), conversations))
    }

    /// Marks an existing session for compaction on its next request, in one step; false (and
    /// nothing written) when the store knows no such session.
    pub async fn request_compaction(&self, session: &str) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(REQUEST_COMPACTION)
            .arg(2)
            .arg(self.key(session, "session"))
            .arg(self.key(session, "conversations"))
            .arg(self.ttl_secs);
        let marked: u64 = self.bounded(connection.command(&cmd)).await?;
        Ok(marked == 1)
    }

    /// Forgets a session with all its conversations, in one step; true when something existed.
    pub async fn forget(&self, session: &str) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut keys = vec![self.key(session, "conversations"), self.key(session, "session")];
        keys.extend(PREVIOUS_LAYOUT.iter().map(|part| self.key(session, part)));
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(FORGET_SESSION).arg(keys.len()).arg(&keys).arg(self.conversations_prefix(session));
        let deleted: u64 = self.bounded(connection.command(&cmd)).await?;
        if let Some(hash) = super::memory::session_part(session) {
            // Another slot than the session's (the index is shared by its tenants): its own command.
            let mut unindex = redis::cmd("SREM");
            unindex.arg(self.index_key(hash)).arg(session);
            self.bounded(connection.command::<u64>(&unindex)).await?;
        }
        if self.request_log > 0 {
            let mut unlist = redis::cmd("ZREM");
            unlist.arg(self.recent_key()).arg(session);
            self.bounded(connection.command::<u64>(&unlist)).await?;
        }
        Ok(deleted > 0)
    }

    /// Takes the conversation's compaction lock for `hold` unless someone else has it (SET NX PX).
    pub async fn try_lock(
        &self,
        session: &str,
        conversation: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.lock_key(session, conversation)).arg(owner).arg("NX").arg("PX").arg(hold.as_millis() as u64);
        let reply: RedisValue = self.bounded(connection.command(&cmd)).await?;
        Ok(matches!(reply, RedisValue::Okay))
    }

    /// Extends the lease of the conversation's lock to `lease` from now, only if `owner` still
    /// holds it; false when it does not (its lease lapsed and someone else may hold it).
    pub async fn renew_lock(
        &self,
        session: &str,
        conversation: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RENEW_LOCK).arg(1).arg(self.lock_key(session, conversation)).arg(owner).arg(lease.as_millis() as u64);
        let renewed: u64 = self.bounded(connection.command(&cmd)).await?;
        Ok(renewed == 1)
    }

    /// Releases the conversation's lock only if `owner` still holds it.
    pub async fn unlock(&self, session: &str, conversation: &str, owner: &str) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RELEASE_LOCK).arg(1).arg(self.lock_key(session, conversation)).arg(owner);
        let released: u64 = self.bounded(connection.command(&cmd)).await?;
        Ok(released == 1)
    }

    /// An ended inspector login: `{prefix}:ui-logout:<login id>`.
    fn logout_key(&self, login: &str) -> String {
        format!("{}:ui-logout:{login}", self.prefix)
    }

    /// Ends the inspector login `login` for every replica, for `ttl_secs` (its remaining lifetime).
    pub async fn end_login(&self, login: &str, ttl_secs: u64) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.logout_key(login)).arg(1).arg("EX").arg(ttl_secs.max(1));
        let _: RedisValue = self.bounded(connection.command(&cmd)).await?;
        Ok(())
    }

    /// Whether the inspector login `login` was ended (on any replica).
    pub async fn login_ended(&self, login: &str) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(self.logout_key(login));
        let found: u64 = self.bounded(connection.command(&cmd)).await?;
        Ok(found > 0)
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

impl<T: serde::de::DeserializeOwned> Versioned<T> {
    /// A stored value of the current schema; anything else is corrupt (or another version's).
    fn read(json: &str, part: &str) -> Result<T, StoreError> {
        let versioned: Versioned<T> =
            serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("{part}: not readable JSON ({e})")))?;
        let version = versioned.v;
        versioned.current().ok_or_else(|| StoreError::Corrupt(format!("{part}: schema version {version}")))
    }
}

/// Fields of the session's and the conversation's hashes that hold numbers (written with HINCRBY
/// and HSET): one that does not parse would make every later increment fail.
const NUMBER_FIELDS: [&str; 22] = [
    "schema",
    "requests",
    "tokens_saved",
    "compact_requested",
    "learned_window",
    "window_below",
    "window_at_least",
    "calibration_milli",
    "output_peak",
    "model_tag",
    "breaker_failures",
    "breaker_at",
    "messages",
    "last_request_ms",
    "answered_ms",
    "idle_ms",
    "prompt_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "pruned_requests",
    "compacted_requests",
    "overflow_requests",
];

/// Whether every value read is one this version of compactor wrote: a session whose hash or
/// values carry another schema version is [`StoreError::OtherVersion`] (left alone); otherwise
/// numbers where it keeps numbers, usage and records that parse. Anything else is corrupt, and
/// the caller ([`super::Store::load`]) deletes it so the session heals.
fn readable(session_hash: &Hash, hash: &Hash, compactions: &[String]) -> Result<(), StoreError> {
    let schema = session_hash.iter().find(|(field, _)| field == "schema").map(|(_, value)| value.parse::<u32>());
    match schema {
        Some(Ok(version)) if version != STATE_VERSION => return Err(StoreError::OtherVersion(version)),
        _ => {}
    }
    let usage = hash.iter().find(|(field, _)| field == "usage").map(|(_, usage)| usage);
    for json in usage.into_iter().chain(compactions) {
        if let Some(version) = stored_version(json).filter(|version| *version != STATE_VERSION) {
            return Err(StoreError::OtherVersion(version));
        }
    }
    for (field, value) in session_hash.iter().chain(hash) {
        if NUMBER_FIELDS.contains(&field.as_str()) && value.parse::<u64>().is_err() {
            return Err(StoreError::Corrupt(format!("`{field}` is not a number")));
        }
    }
    if let Some((_, usage)) = hash.iter().find(|(field, _)| field == "usage") {
        Versioned::<Usage>::read(usage, "usage")?;
    }
    for record in compactions {
        Versioned::<CompactionRecord>::read(record, "compactions")?;
    }
    Ok(())
}

/// The schema version a stored JSON value says it has, if it says.
fn stored_version(json: &str) -> Option<u32> {
    #[derive(serde::Deserialize)]
    struct Version {
        v: u32,
    }
    serde_json::from_str::<Version>(json).ok().map(|version| version.v)
}

/// Redis refused a command on a key of another type (`WRONGTYPE`, alone or among a pipeline's
/// failures), or answered with a value that is not what compactor stored.
fn is_wrong_type(error: &redis::RedisError) -> bool {
    matches!(error.kind(), redis::ErrorKind::UnexpectedReturnType | redis::ErrorKind::Parse)
        || error.code() == Some("WRONGTYPE")
        || error.clone().into_server_errors().is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "WRONGTYPE"))
}

/// A reply Redis gave but compactor cannot read means the stored value is corrupt, not that the
/// store is down.
fn corrupt_if_unreadable(error: StoreError) -> StoreError {
    match error {
        StoreError::Redis(redis_error) if is_wrong_type(&redis_error) => StoreError::Corrupt(redis_error.to_string()),
        other => other,
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
