//! Lossless first: when the same tool output appears again, the newer copy becomes a short
//! pointer to the older one, which the provider has already cached. Decisions depend only on what
//! comes before an item (and on what is pruned), so a turn never changes an earlier turn's bytes:
//! a pointer is made when its copy is new and stays the same on every later turn. A pointer never
//! points at a pruned (or otherwise replaced) copy: when its target is pruned, the next copy
//! becomes the one kept whole, inside the same break.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_128;

use crate::conversation::{Conversation, Edit, Kind};

/// Outputs smaller than this are not worth a pointer.
const MIN_TOKENS: u32 = 64;

/// Replaces newer duplicates of tool outputs with pointers to the oldest copy sent with its
/// content; returns how many. Runs after pruning, so pruned copies (`placeholder`) are never
/// pointed at. Copies are compared by what is sent: a copy cut to head and tail counts as its cut
/// text, so the rewritten request, rewritten again, makes the same pointers (idempotent).
pub fn apply(conversation: &mut Conversation, placeholder: &str) -> usize {
    // The oldest copy of each output sent with its content, by the hash of what is sent.
    let mut older_call: HashMap<u128, String> = HashMap::new();
    let mut deduped = 0;
    for item in conversation.items.iter_mut() {
        let Kind::ToolResult { call_id, text, attachments: 0 } = &item.kind else { continue };
        if !item.shortenable || item.tokens < MIN_TOKENS {
            continue;
        }
        let sent = match &item.edit {
            Edit::Keep => &text[..],
            Edit::Replace(cut) if cut != placeholder => &cut[..],
            _ => continue,
        };
        let hash = xxh3_128(sent.as_bytes());
        let Some(older) = older_call.get(&hash) else {
            older_call.insert(hash, call_id.as_deref().unwrap_or("").to_string());
            continue;
        };
        item.edit = Edit::Replace(pointer(older));
        deduped += 1;
    }
    deduped
}

/// The text that stands in for a newer duplicate.
pub fn pointer(older_call_id: &str) -> String {
    if older_call_id.is_empty() {
        "[Duplicate tool output: identical to an earlier tool output in this conversation]".to_string()
    } else {
        format!("[Duplicate tool output: identical to the earlier result of tool call {older_call_id}]")
    }
}
