//! Lossless first: when the same tool output appears again later, the older copy becomes a short
//! pointer to the newer one.

use std::collections::HashSet;

use xxhash_rust::xxh3::xxh3_128;

use crate::conversation::{Conversation, Edit, Kind};

/// Outputs smaller than this are not worth a pointer.
const MIN_TOKENS: u32 = 64;

/// Replaces older duplicates of tool outputs with pointers; returns how many.
pub fn apply(conversation: &mut Conversation) -> usize {
    let mut seen: HashSet<u128> = HashSet::new();
    let mut newer_call: Vec<(u128, String)> = Vec::new();
    let mut deduped = 0;
    for item in conversation.items.iter_mut().rev() {
        let Kind::ToolResult { call_id, text, attachments: 0 } = &item.kind else { continue };
        if item.edit != Edit::Keep || !item.shortenable || item.tokens < MIN_TOKENS {
            continue;
        }
        let hash = xxh3_128(text.as_bytes());
        if seen.insert(hash) {
            newer_call.push((hash, call_id.as_deref().unwrap_or("").to_string()));
            continue;
        }
        let newer = newer_call.iter().find(|(h, _)| *h == hash).map(|(_, id)| id.as_str()).unwrap_or("");
        item.edit = Edit::Replace(pointer(newer));
        deduped += 1;
    }
    deduped
}

/// The text that stands in for an older duplicate.
pub fn pointer(newer_call_id: &str) -> String {
    if newer_call_id.is_empty() {
        "[Duplicate tool output: identical to a later tool output in this conversation]".to_string()
    } else {
        format!("[Duplicate tool output: identical to the later result of tool call {newer_call_id}]")
    }
}
