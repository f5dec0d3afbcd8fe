//! Lossless first: when the same tool output appears again, the newer copy becomes a short
//! pointer to the older one, which the provider has already cached. Decisions depend only on what
//! comes before an item (and on what is pruned), so a turn never changes an earlier turn's bytes:
//! a pointer is made when its copy is new and stays the same on every later turn. A pointer never
//! points at a pruned (or otherwise replaced) copy: when its target is pruned, the next copy
//! becomes the one kept whole, inside the same break.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_128;

use super::placeholder::{Calls, Template, is_pointer, pointer};
use crate::conversation::{Conversation, Edit, Kind};

/// Outputs smaller than this are not worth a pointer.
const MIN_TOKENS: u32 = 64;

/// Replaces newer duplicates of tool outputs with pointers to the oldest copy sent with its
/// content; returns how many. Runs after pruning, so pruned copies (`placeholder`) are never
/// pointed at. Copies are compared by what is sent: a copy cut to head and tail counts as its cut
/// text, so the rewritten request, rewritten again, makes the same pointers (idempotent). A
/// pointer names the call it repeats (its tool and arguments), as a placeholder does.
pub fn apply(conversation: &mut Conversation, placeholder: &Template) -> usize {
    // The oldest copy of each output sent with its content, by the hash of what is sent.
    let mut older_call: HashMap<u128, String> = HashMap::new();
    let mut pointers: Vec<(usize, String)> = Vec::new();
    let calls = Calls::of(conversation);
    for (index, item) in conversation.items.iter().enumerate() {
        let Kind::ToolResult { call_id, text, attachments: 0 } = &item.kind else { continue };
        if !item.shortenable || item.tokens < MIN_TOKENS {
            continue;
        }
        let sent = match &item.edit {
            // A pointer an earlier rewrite wrote is left as it is, not pointed at.
            Edit::Keep if is_pointer(text) => continue,
            Edit::Keep => &text[..],
            Edit::Replace(cut) if !placeholder.rendered(&calls, call_id.as_deref(), cut) => &cut[..],
            _ => continue,
        };
        let hash = xxh3_128(sent.as_bytes());
        let Some(older) = older_call.get(&hash) else {
            older_call.insert(hash, call_id.as_deref().unwrap_or("").to_string());
            continue;
        };
        pointers.push((index, pointer(&calls, older)));
    }
    drop(calls);
    let deduped = pointers.len();
    for (index, text) in pointers {
        conversation.items[index].edit = Edit::Replace(text);
    }
    deduped
}
