//! The store's writes: a request's commit in one pipeline (increments and set unions, so replicas
//! never undo each other), the admin API's changes, and forgetting a session.

use redis::Pipeline;

use super::connection::Connection;
use super::hashes::Versioned;
use super::keys::PREVIOUS_LAYOUT;
use super::scripts::{FORGET_SESSION, MERGE_LEARNED, PUSH_RECORD, REQUEST_COMPACTION, TOUCH_CONVERSATION};
use super::{RECENT_SESSIONS, RedisStore};
use crate::session::error::StoreError;
use crate::session::runs::BOUNDS;
use crate::session::state::{CALIBRATION_MILLI, ConversationUpdate, MAX_RECORDS, STATE_VERSION, SessionUpdate, Update};

impl RedisStore {
    /// Adds the session to the index of its session part, with the sessions' TTL.
    fn write_index(&self, pipeline: &mut Pipeline, session: &str) {
        if let Some(hash) = crate::session::memory::session_part(session) {
            let index = self.index_key(hash);
            pipeline.sadd(&index, session).ignore().expire(&index, self.ttl_secs).ignore();
        }
    }

    /// Marks the session as just used in the list of recent sessions, when the inspector records.
    fn write_recent(&self, pipeline: &mut Pipeline, session: &str) {
        if self.request_log > 0 {
            let recent = self.recent_key();
            pipeline.zadd(&recent, session, crate::session::unix_ms()).ignore();
            pipeline.zremrangebyrank(&recent, 0, -(RECENT_SESSIONS as isize) - 1).ignore();
            pipeline.expire(&recent, self.ttl_secs).ignore();
        }
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
        self.write_conversation(&mut pipeline, session, conversation, &update.conversation)?;
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

    /// The conversation's part of a commit: pruned ids, usage, breaker, numbers, the fenced
    /// compaction record and the inspector's summary, each key with the TTL.
    fn write_conversation(
        &self,
        pipeline: &mut Pipeline,
        session: &str,
        conversation: &str,
        change: &ConversationUpdate,
    ) -> Result<(), StoreError> {
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
        Ok(())
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
        if let Some(hash) = crate::session::memory::session_part(session) {
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
}
