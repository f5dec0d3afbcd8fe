//! Recognizes an agent's own summarization request, which compactor forwards untouched: the agent
//! is compacting its history itself, and a rewrite would only get in its way.

use crate::conversation::{Kind, Role};
use crate::dialect::ParsedRequest;

/// Phrases of the agents' own compaction prompts (matched case-insensitively in the system prompt
/// and the last user message): Claude Code (its summarizer system prompt and its /compact
/// request), Codex CLI, OpenCode (both prompts), Cline and Roo Code (condense), aider.
pub const DEFAULT_MARKERS: [&str; 8] = [
    "you are a helpful ai assistant tasked with summarizing conversations",
    "your task is to create a detailed summary of the conversation so far",
    "you are performing a context checkpoint compaction",
    "provide a detailed prompt for continuing our conversation above",
    "create a new anchored summary",
    "briefly summarize this partial conversation about programming",
    "condense the conversation",
    "summarize the conversation so far in a way that",
];

/// True when the request is an agent summarizing its own history.
pub fn is_agent_compaction(parsed: &ParsedRequest, markers: &[String]) -> bool {
    let matches = |text: &str| {
        let lower = text.to_lowercase();
        markers.iter().any(|m| lower.contains(m.as_str()))
    };
    if parsed.system.iter().any(|s| matches(s)) {
        return true;
    }
    let last_user = parsed.conversation.items.iter().rev().find_map(|item| match &item.kind {
        Kind::Text { role: Role::User, text } => Some(text.as_ref()),
        _ => None,
    });
    last_user.is_some_and(matches)
}
