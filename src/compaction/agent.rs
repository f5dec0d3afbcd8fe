//! Recognizes an agent's own summarization request, which compactor forwards untouched: the agent
//! is compacting its history itself, and a rewrite would only get in its way.

use crate::conversation::{Kind, Role};
use crate::dialect::ParsedRequest;

/// Phrases of the agents' own compaction prompts (matched case-insensitively in the system prompt
/// and the last user message), each taken from the agent's published package; the request bodies
/// they come from are fixtures in `tests/fixtures/agents/`:
/// - Claude Code: its summarizer system prompt and its compact request (and the `/compact` request
///   of older versions);
/// - Codex CLI: its checkpoint compaction prompt;
/// - OpenCode: its compaction system prompt (first and later compactions), the anchored-summary
///   request, the prior-summary request its overflow path sends without a system prompt, and its
///   title generator;
/// - Qwen Code: its compression prompt, the system prompt of the dedicated summarizer and the
///   opening of the request that keeps the conversation's tools;
/// - Gemini CLI: its `<state_snapshot>` compression prompt (the summary and the check of it);
/// - Cline: its continuation-note summarizer; Cline and Roo Code's condense; aider's summarizer.
pub const DEFAULT_MARKERS: [&str; 14] = [
    "you are a helpful ai assistant tasked with summarizing conversations",
    "your task is to create a detailed summary of the conversation so far",
    "you are performing a context checkpoint compaction",
    "provide a detailed prompt for continuing our conversation above",
    "create a new anchored summary",
    "briefly summarize this partial conversation about programming",
    "condense the conversation",
    "summarize the conversation so far in a way that",
    "you are a context summarization agent",
    "the <prior-summary> summarizes everything that happened before the <conversation>",
    "you are a title generator",
    "you are the component that summarizes a conversation when its context window is about to overflow",
    "responsible for distilling chat history into a structured xml <state_snapshot>",
    "summarize the provided coding session into a concise continuation note",
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
