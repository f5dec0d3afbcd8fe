//! The keys the store names, all but the shared ones under the session's hash tag (see the
//! layout in the module above).

use super::RedisStore;

/// Keys of the previous layout (one set of keys per session), deleted when a session is forgotten.
pub(super) const PREVIOUS_LAYOUT: [&str; 5] = ["pruned", "usage", "counters", "compactions", "lock"];

impl RedisStore {
    /// `{prefix}:{<session key>}:<part>`: the braces are the Redis Cluster hash tag.
    pub(super) fn key(&self, session: &str, part: &str) -> String {
        format!("{}:{{{session}}}:{part}", self.prefix)
    }

    /// The prefix of a session's conversation keys: `{prefix}:{<session key>}:c:`.
    pub(super) fn conversations_prefix(&self, session: &str) -> String {
        self.key(session, "c:")
    }

    /// A conversation's keys: its hash, pruned set and record list.
    pub(super) fn conversation_keys(&self, session: &str, conversation: &str) -> [String; 3] {
        let base = format!("{}{conversation}", self.conversations_prefix(session));
        [format!("{base}:pruned"), format!("{base}:compactions"), base]
    }

    /// The set of session keys sharing a session part: `{prefix}:by-session:<session hash>`.
    pub(super) fn index_key(&self, hash: &str) -> String {
        format!("{}:by-session:{hash}", self.prefix)
    }

    /// The sorted set of recent sessions: `{prefix}:recent`.
    pub(super) fn recent_key(&self) -> String {
        format!("{}:recent", self.prefix)
    }

    /// A conversation's list of request summaries: `…:c:<id>:requests`.
    pub(super) fn requests_key(&self, session: &str, conversation: &str) -> String {
        format!("{}{conversation}:requests", self.conversations_prefix(session))
    }

    pub(super) fn lock_key(&self, session: &str, conversation: &str) -> String {
        format!("{}{conversation}:lock", self.conversations_prefix(session))
    }

    /// An ended inspector login: `{prefix}:ui-logout:<login id>`.
    pub(super) fn logout_key(&self, login: &str) -> String {
        format!("{}:ui-logout:{login}", self.prefix)
    }

    /// A recovered stateful chain: `{prefix}:chain:<tenant>:<response or conversation id>`.
    pub(super) fn chain_key(&self, key: &str) -> String {
        format!("{}:chain:{key}", self.prefix)
    }
}
