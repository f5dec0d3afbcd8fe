//! Recognizes an agent's own summarization request, which compactor forwards untouched: the agent
//! is compacting its history itself, and a rewrite would only get in its way.

use crate::conversation::{Kind, Role};
use crate::dialect::ParsedRequest;

pub use crate::config::compaction::DEFAULT_MARKERS;

/// The markers, compiled once into one automaton that finds any of them in one pass over a
/// text, ASCII case ignored, without lower-casing the text. A marker with a non-ASCII letter (a
/// configured one) is matched the old way, on the lower-cased text.
#[derive(Debug, Clone)]
pub struct AgentMarkers {
    ascii: Option<aho_corasick::AhoCorasick>,
    other: Vec<String>,
}

impl AgentMarkers {
    pub fn new<S: AsRef<str>>(markers: &[S]) -> Self {
        let (ascii, other): (Vec<&str>, Vec<&str>) =
            markers.iter().map(AsRef::as_ref).filter(|m| !m.is_empty()).partition(|m| m.is_ascii());
        let ascii = (!ascii.is_empty())
            .then(|| aho_corasick::AhoCorasick::builder().ascii_case_insensitive(true).build(&ascii).ok())
            .flatten();
        Self { ascii, other: other.into_iter().map(str::to_lowercase).collect() }
    }

    /// Whether `text` holds one of the markers, case ignored.
    pub fn found_in(&self, text: &str) -> bool {
        if self.ascii.as_ref().is_some_and(|automaton| automaton.is_match(text)) {
            return true;
        }
        if self.other.is_empty() {
            return false;
        }
        let lower = text.to_lowercase();
        self.other.iter().any(|m| lower.contains(m.as_str()))
    }
}

/// True when the request is an agent summarizing its own history.
pub fn is_agent_compaction(parsed: &ParsedRequest, markers: &AgentMarkers) -> bool {
    if parsed.system.iter().any(|s| markers.found_in(s)) {
        return true;
    }
    let last_user = parsed.conversation.items.iter().rev().find_map(|item| match &item.kind {
        Kind::Text { role: Role::User, text } => Some(text.as_ref()),
        _ => None,
    });
    last_user.is_some_and(|text| markers.found_in(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_match_whatever_the_case_of_the_text_and_of_non_ascii_markers() {
        let markers = AgentMarkers::new(&["condense the conversation", "résumé la conversation"]);
        assert!(markers.found_in("Please CONDENSE the Conversation now"));
        assert!(markers.found_in("RÉSUMÉ LA CONVERSATION, s'il te plaît"));
        assert!(!markers.found_in("condense the conv"));
        assert!(!AgentMarkers::new::<&str>(&[]).found_in("anything"));
    }
}
