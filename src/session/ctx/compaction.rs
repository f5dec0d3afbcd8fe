//! The conversation's compaction lock, and the outcomes published at once while it is held (the
//! one exception to "commit once": other requests of the conversation wait for them).

use std::sync::Arc;
use std::time::Duration;

use super::SessionCtx;
use crate::session::state::{Breaker, CompactionRecord, ConversationState, ConversationUpdate, SessionUpdate, Update};

impl SessionCtx {
    /// Takes the conversation's compaction lock for `owner`: `Some(false)` when another owner
    /// holds it, `None` when the store failed (reported).
    pub async fn try_lock(&self, owner: &str, hold: Duration) -> Option<bool> {
        match self.store.try_lock(self.key.as_str(), self.conversation_id.as_str(), owner, hold).await {
            Ok(taken) => Some(taken),
            Err(error) => {
                self.report(&error, "lock");
                None
            }
        }
    }

    /// Extends `owner`'s lock by `lease`: `Some(false)` when its lease lapsed, `None` when the
    /// store failed (reported).
    pub async fn renew_lock(&self, owner: &str, lease: Duration) -> Option<bool> {
        match self.store.renew_lock(self.key.as_str(), self.conversation_id.as_str(), owner, lease).await {
            Ok(renewed) => Some(renewed),
            Err(error) => {
                self.report(&error, "lock");
                None
            }
        }
    }

    /// Releases the lock if `owner` still holds it.
    pub async fn unlock(&self, owner: &str) {
        if let Err(error) = self.store.unlock(self.key.as_str(), self.conversation_id.as_str(), owner).await {
            self.report(&error, "unlock");
        }
    }

    /// The conversation as stored now (another request may have changed it) and whether its
    /// compaction lock is held; `None` when the store failed (reported).
    pub async fn poll(&self) -> Option<(ConversationState, bool)> {
        match self.store.poll(self.key.as_str(), self.conversation_id.as_str()).await {
            Ok(polled) => Some(polled),
            Err(error) => {
                self.report(&error, "load");
                None
            }
        }
    }

    /// Takes a fresher stored state of the conversation in place of the one loaded (after
    /// waiting for another request's compaction); this request's own changes still stand.
    pub fn adopt(&mut self, conversation: ConversationState) {
        self.conversation = Arc::new(conversation);
    }

    /// Publishes a new compaction record at once (under the compaction lock): it makes the
    /// conversation's last usage stale, closes its breaker and answers the session's admin
    /// request to compact. False when the write failed (reported).
    pub async fn publish_compaction(&mut self, record: &CompactionRecord) -> bool {
        let update = Update {
            session: SessionUpdate { compact_requested: Some(false), ..SessionUpdate::default() },
            conversation: ConversationUpdate {
                compaction: Some(record.clone()),
                clear_usage: true,
                breaker: Some(Breaker::default()),
                ..ConversationUpdate::default()
            },
            model_run: None,
        };
        self.publish(update).await
    }

    /// Publishes a failed compaction at once: one more failure in a row on a conversation of
    /// `message_count` messages (a grown conversation starts the count again).
    pub async fn publish_failure(&mut self, message_count: usize) -> bool {
        let breaker = self.conversation.breaker;
        let at_messages = message_count as u64;
        let failures = if breaker.at_messages == at_messages { breaker.failures + 1 } else { 1 };
        let conversation =
            ConversationUpdate { breaker: Some(Breaker { failures, at_messages }), ..ConversationUpdate::default() };
        self.publish(Update { conversation, ..Update::default() }).await
    }

    /// Publishes at once that the prompt rebuilt around record `generation` was sent ahead to the
    /// upstream (a local server's cache holds it): the conversation's next request applies it.
    pub async fn publish_prefilled(&mut self, generation: u32) -> bool {
        let conversation = ConversationUpdate { prefilled: Some(generation), ..ConversationUpdate::default() };
        self.publish(Update { conversation, ..Update::default() }).await
    }

    async fn publish(&mut self, update: Update) -> bool {
        self.session.apply(&update.session);
        Arc::make_mut(&mut self.conversation).apply(&update.conversation);
        if self.foreign_session {
            return true;
        }
        self.write(&update, "publish").await
    }
}
