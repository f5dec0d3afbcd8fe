//! Repairs tool pairing before every forward: every call gets exactly one result where the API
//! wants it, and results without their call are moved to it or removed.
//!
//! Only client pairs compactor fully understands are touched (`Item::repairable`): a tool the
//! provider runs inside its own turn (Anthropic `server_tool_use`, Responses' hosted tools), a pair
//! whose output compactor cannot write, and any result claiming such a call's id are left exactly
//! as the client sent them.
//!
//! Every lookup goes through a map built once (results by call id, call ids, inserts), so a
//! hostile request with many calls, many results or one id used over and over costs time linear
//! in its size.

use std::collections::{HashMap, HashSet};

use crate::conversation::{Conversation, Edit, InsertResult, Kind, Role};

/// The content of a synthetic result for a call that never got one.
pub const ABORTED: &str = "aborted";

/// The results claiming one call id, in order, and how far the calls of that id have read them.
#[derive(Default)]
struct Claimants {
    /// Item indices of the results (repairable, not removed), in item order.
    results: Vec<usize>,
    /// Results before this position are matched or stand before every later call's zone.
    next: usize,
}

/// Repairs pairing; returns how many results were inserted, moved or removed.
pub fn apply(conversation: &mut Conversation) -> usize {
    let (removed, inserts) = decide(conversation);
    let repaired = removed.len() + inserts.len();
    for index in removed {
        conversation.items[index].edit = Edit::Remove;
    }
    conversation.inserts.extend(inserts);
    repaired
}

/// What repair changes, worked out on the conversation as it stands (every id borrowed from it):
/// the results to remove, and the results to insert.
fn decide(conversation: &Conversation) -> (Vec<usize>, Vec<InsertResult>) {
    let untouchable = untouchable_ids(conversation);
    let mut claimants = claimants(conversation);
    let matching = match_calls(conversation, &mut claimants);
    let (removed, moved) = orphans(conversation, &matching, &untouchable);
    let inserts = inserts(conversation, matching, moved);
    (removed, inserts)
}

/// Ids of calls repair must not touch: results claiming them are not orphans of ours either.
fn untouchable_ids<'c>(conversation: &'c Conversation) -> HashSet<&'c str> {
    conversation
        .items
        .iter()
        .filter(|item| !item.repairable && matches!(item.kind, Kind::ToolCall { .. }))
        .filter_map(|item| item.call_id())
        .collect()
}

/// The repairable results still sent, by the call id they claim.
fn claimants<'c>(conversation: &'c Conversation) -> HashMap<&'c str, Claimants> {
    let mut claimants: HashMap<&str, Claimants> = HashMap::new();
    for (index, item) in conversation.items.iter().enumerate() {
        if let Kind::ToolResult { call_id: Some(id), .. } = &item.kind
            && item.repairable
            && item.edit != Edit::Remove
        {
            claimants.entry(id.as_ref()).or_default().results.push(index);
        }
    }
    claimants
}

/// The repairable calls, and which of them a result answers where it stands.
struct Matching<'c> {
    /// Every repairable call still sent: its item and id, in order.
    calls: Vec<(usize, &'c str)>,
    /// The results that answer a call.
    matched: HashSet<usize>,
    /// The ids of the calls answered.
    answered: HashSet<&'c str>,
}

/// Each call's result must be in the zone right after its assistant message: the first unmatched
/// result with its id there. Assistant turns come in order and their zones start later and
/// later, so a result passed over for one call is never wanted by a later one.
fn match_calls<'c>(conversation: &'c Conversation, claimants: &mut HashMap<&'c str, Claimants>) -> Matching<'c> {
    let mut matching = Matching { calls: Vec::new(), matched: HashSet::new(), answered: HashSet::new() };
    for assistant in 0..conversation.roles.len() {
        if conversation.roles[assistant] != Role::Assistant {
            continue;
        }
        let zone = conversation.result_zone(assistant);
        for index in conversation.item_range(assistant) {
            let item = &conversation.items[index];
            if item.edit == Edit::Remove || !item.repairable {
                continue;
            }
            let Kind::ToolCall { id: Some(id), .. } = &item.kind else { continue };
            matching.calls.push((index, id.as_ref()));
            let Some(claim) = claimants.get_mut(id.as_ref()) else { continue };
            while claim.results.get(claim.next).is_some_and(|&r| conversation.items[r].message < zone.start) {
                claim.next += 1;
            }
            if let Some(&r) = claim.results.get(claim.next)
                && zone.contains(&conversation.items[r].message)
            {
                claim.next += 1;
                matching.matched.insert(r);
                matching.answered.insert(id.as_ref());
            }
        }
    }
    matching
}

/// Results that answer no call where they stand, all removed: the content of each to move to
/// its call, if that call lacks one.
fn orphans<'c>(
    conversation: &'c Conversation,
    matching: &Matching<'c>,
    untouchable: &HashSet<&str>,
) -> (Vec<usize>, HashMap<&'c str, String>) {
    let call_ids: HashSet<&str> = matching.calls.iter().map(|(_, id)| *id).collect();
    let mut removed = Vec::new();
    let mut moved: HashMap<&str, String> = HashMap::new();
    for (index, item) in conversation.items.iter().enumerate() {
        let Kind::ToolResult { call_id: Some(id), text, .. } = &item.kind else { continue };
        if matching.matched.contains(&index)
            || item.edit == Edit::Remove
            || !item.repairable
            || untouchable.contains(id.as_ref())
        {
            continue;
        }
        let exists = call_ids.contains(id.as_ref());
        if exists && !matching.answered.contains(id.as_ref()) && !moved.contains_key(id.as_ref()) {
            let content = match &item.edit {
                Edit::Replace(replaced) => replaced.clone(),
                _ => text.to_string(),
            };
            moved.insert(id.as_ref(), content);
        }
        removed.push(index);
    }
    (removed, moved)
}

/// A result for every call still without one (and none inserted already): a moved one's
/// content, else [`ABORTED`].
fn inserts(conversation: &Conversation, matching: Matching, mut moved: HashMap<&str, String>) -> Vec<InsertResult> {
    let Matching { calls, answered, .. } = matching;
    let mut inserted: HashSet<&str> = conversation.inserts.iter().map(|i| i.call_id.as_str()).collect();
    let mut inserts = Vec::new();
    for (call_item, id) in calls {
        if answered.contains(id) || inserted.contains(id) {
            continue;
        }
        let text = moved.remove(id).unwrap_or_else(|| ABORTED.to_string());
        inserted.insert(id);
        inserts.push(InsertResult { call_item, call_id: id.to_string(), text });
    }
    inserts
}
