//! Prunes old tool outputs: the newest `protect_tokens` of tool output stay, older ones are
//! replaced by a placeholder once enough of them add up. Decisions are remembered per session so
//! the rewritten prefix stays byte-stable across turns.

use std::collections::BTreeSet;

use crate::conversation::{Conversation, Edit, Kind};

/// `[prune]` settings the policy needs.
#[derive(Debug, Clone)]
pub struct PruneSettings {
    pub protect_tokens: u32,
    pub minimum_tokens: u32,
    pub placeholder: String,
    pub protected_tools: Vec<String>,
}

/// What pruning did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pruned {
    /// Call ids whose outputs are pruned in this request (earlier decisions included).
    pub call_ids: Vec<String>,
    /// Outputs replaced by the placeholder in this request.
    pub count: usize,
}

/// Prunes `conversation`; `previously` holds the call ids pruned in earlier requests.
pub fn apply(
    conversation: &mut Conversation,
    settings: &PruneSettings,
    previously: &BTreeSet<String>,
    count: &dyn Fn(&str) -> u32,
) -> Pruned {
    let protected_call = |conversation: &Conversation, call_id: Option<&str>| {
        call_id
            .and_then(|id| conversation.tool_name(id))
            .is_some_and(|name| settings.protected_tools.iter().any(|p| p.eq_ignore_ascii_case(name)))
    };
    // Outputs no bigger than the placeholder (a synthetic "aborted", an empty result) gain nothing
    // from pruning; leaving them out of the window too keeps a second pass deciding the same.
    let not_worth = count(&settings.placeholder) + crate::conversation::FRAMING_TOKENS;
    let mut protected = 0u32;
    let mut forced = Vec::new();
    let mut prunable = Vec::new();
    let mut prunable_tokens = 0u32;
    for index in (0..conversation.items.len()).rev() {
        let item = &conversation.items[index];
        let Kind::ToolResult { call_id, text, .. } = &item.kind else { continue };
        if !item.shortenable {
            // Never pruned (its block would break), but it is recent tool output all the same:
            // it fills the protected window like any other.
            if item.edit == Edit::Keep && protected < settings.protect_tokens {
                protected = protected.saturating_add(item.tokens);
            }
            continue;
        }
        let call_id = call_id.as_deref();
        let current = match &item.edit {
            Edit::Keep if text.as_ref() == settings.placeholder => continue,
            Edit::Keep => item.tokens,
            Edit::Replace(text) if *text == settings.placeholder => continue,
            // Counted as an item would be, framing included, so a second pass sees the same sizes.
            Edit::Replace(text) => count(text) + crate::conversation::FRAMING_TOKENS,
            Edit::Remove => continue,
        };
        if current <= not_worth || protected_call(conversation, call_id) {
            continue;
        }
        if call_id.is_some_and(|id| previously.contains(id)) {
            forced.push(index);
        } else if protected < settings.protect_tokens {
            // The output that crosses the window's edge stays whole: no splitting.
            protected = protected.saturating_add(current);
        } else {
            prunable.push(index);
            prunable_tokens = prunable_tokens.saturating_add(current);
        }
    }
    if prunable_tokens < settings.minimum_tokens {
        prunable.clear();
    }
    let mut pruned = Pruned::default();
    for index in forced.into_iter().chain(prunable) {
        let item = &mut conversation.items[index];
        item.edit = Edit::Replace(settings.placeholder.clone());
        pruned.count += 1;
        if let Kind::ToolResult { call_id: Some(id), .. } = &item.kind {
            pruned.call_ids.push(id.to_string());
        }
    }
    pruned
}
