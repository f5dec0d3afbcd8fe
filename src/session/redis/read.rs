//! The store's reads: a request's state in one round trip, the inspector's and the admin API's
//! views, and the models' histograms of run lengths.

use redis::Pipeline;

use super::connection::Connection;
use super::hashes::{Hash, conversation_state, corrupt_if_unreadable, readable, run_lengths, session_state};
use super::{RUNS_CACHED_MODELS, RUNS_REFRESH, RedisStore};
use crate::session::error::StoreError;
use crate::session::runs::RunLengths;
use crate::session::state::{ConversationState, ConversationView, SessionState, SessionView};

impl RedisStore {
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

    /// The keys indexed under a session part; some may have expired since (the caller checks).
    pub async fn find(&self, hash: &str) -> Result<Vec<String>, StoreError> {
        let connection = self.connection()?;
        let mut command = redis::cmd("SMEMBERS");
        command.arg(self.index_key(hash));
        self.bounded(connection.command(&command)).await
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
}
