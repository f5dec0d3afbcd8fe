//! What the inspector and the admin API read of the store: a session's conversations, a
//! conversation's request summaries, the sessions used last.

use super::{Kept, MemoryStore};
use crate::session::state::{ConversationState, ConversationView, SessionView};

impl MemoryStore {
    /// The session with every conversation it keeps, most recently used first.
    pub fn view(&self, key: &str) -> SessionView {
        let Some(entry) = self.sessions.get(key) else { return SessionView::default() };
        let Ok(session) = entry.session.lock() else { return SessionView::default() };
        let mut kept: Vec<(&String, &Kept)> = session.conversations.iter().collect();
        kept.sort_by_key(|(_, kept)| std::cmp::Reverse(kept.use_order));
        let conversations = kept
            .into_iter()
            .map(|(id, kept)| {
                ConversationView::new(id.clone(), kept.last_used_unix_ms, ConversationState::clone(&kept.state))
            })
            .collect();
        SessionView::new(session.state.clone(), conversations)
    }

    /// The request summaries kept for a conversation, oldest first.
    pub fn requests(&self, key: &str, conversation: &str) -> Vec<String> {
        let Some(entry) = self.sessions.get(key) else { return Vec::new() };
        let Ok(session) = entry.session.lock() else { return Vec::new() };
        session
            .conversations
            .get(conversation)
            .map(|kept| kept.log.iter().map(|r| r.to_string()).collect())
            .unwrap_or_default()
    }

    /// The sessions with conversations, most recently used first, at most `limit`, with when
    /// each was last used (Unix ms). Walks the store: an operator's page, not a request's path.
    pub fn recent(&self, limit: usize) -> Vec<(String, u64)> {
        let mut sessions: Vec<(String, u64)> = self
            .sessions
            .iter()
            .filter_map(|(key, held)| {
                let session = held.session.lock().ok()?;
                let last = session.conversations.values().map(|kept| kept.last_used_unix_ms).max()?;
                Some((key.to_string(), last))
            })
            .collect();
        sessions.sort_by_key(|(key, last)| (std::cmp::Reverse(*last), key.clone()));
        sessions.truncate(limit);
        sessions
    }
}
