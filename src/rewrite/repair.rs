//! Repairs tool pairing before every forward: every call gets exactly one result where the API
//! wants it, and results without their call are moved to it or removed.
//!
//! Only client pairs compactor fully understands are touched (`Item::repairable`): a tool the
//! provider runs inside its own turn (Anthropic `server_tool_use`, Responses' hosted tools), a pair
//! whose output compactor cannot write, and any result claiming such a call's id are left exactly
//! as the client sent them.

use std::collections::{HashMap, HashSet};

use crate::conversation::{Conversation, Edit, InsertResult, Kind, Role};

/// The content of a synthetic result for a call that never got one.
pub const ABORTED: &str = "aborted";

/// Repairs pairing; returns how many results were inserted, moved or removed.
pub fn apply(conversation: &mut Conversation) -> usize {
    // Each call's result must be in the zone right after its assistant message.
    let mut calls: Vec<(usize, String)> = Vec::new();
    let mut matched: HashSet<usize> = HashSet::new();
    let mut answered: HashSet<String> = HashSet::new();
    let message_count = conversation.roles.len();
    // Ids of calls repair must not touch: results claiming them are not orphans of ours either.
    let untouchable: HashSet<String> = conversation
        .items
        .iter()
        .filter(|item| !item.repairable && matches!(item.kind, Kind::ToolCall { .. }))
        .filter_map(|item| item.call_id().map(str::to_string))
        .collect();
    for assistant in 0..message_count {
        if conversation.roles[assistant] != Role::Assistant {
            continue;
        }
        let zone = conversation.result_zone(assistant);
        for (index, item) in conversation.items.iter().enumerate() {
            if item.message != assistant || item.edit == Edit::Remove || !item.repairable {
                continue;
            }
            let Kind::ToolCall { id: Some(id), .. } = &item.kind else { continue };
            calls.push((index, id.to_string()));
            let result = conversation.items.iter().enumerate().position(|(r, result)| {
                zone.contains(&result.message)
                    && result.repairable
                    && result.edit != Edit::Remove
                    && !matched.contains(&r)
                    && matches!(&result.kind, Kind::ToolResult { call_id: Some(c), .. } if c == id)
            });
            if let Some(r) = result {
                matched.insert(r);
                answered.insert(id.to_string());
            }
        }
    }

    // Results that answer no call where they stand: moved to their call if it lacks one, else removed.
    let mut repaired = 0;
    let mut moved: HashMap<String, String> = HashMap::new();
    for (index, item) in conversation.items.iter_mut().enumerate() {
        let Kind::ToolResult { call_id: Some(id), text, .. } = &item.kind else { continue };
        if matched.contains(&index)
            || item.edit == Edit::Remove
            || !item.repairable
            || untouchable.contains(id.as_ref())
        {
            continue;
        }
        let exists = calls.iter().any(|(_, call)| call == id.as_ref());
        if exists && !answered.contains(id.as_ref()) && !moved.contains_key(id.as_ref()) {
            let content = match &item.edit {
                Edit::Replace(replaced) => replaced.clone(),
                _ => text.to_string(),
            };
            moved.insert(id.to_string(), content);
        }
        item.edit = Edit::Remove;
        repaired += 1;
    }

    for (call_item, id) in calls {
        if answered.contains(&id) || conversation.inserts.iter().any(|i| i.call_id == id) {
            continue;
        }
        let text = moved.remove(&id).unwrap_or_else(|| ABORTED.to_string());
        conversation.inserts.push(InsertResult { call_item, call_id: id, text });
        repaired += 1;
    }
    repaired
}
