//! Prunes old tool outputs: the newest `protect_tokens` of tool output stay, older ones are
//! replaced by a placeholder once enough of them add up and the batch is worth the prompt cache
//! it breaks ([`payback`]). Decisions are remembered per session so the rewritten prefix stays
//! byte-stable across turns.

use std::collections::HashSet;

use super::payback::{self, History, Reason};
use super::placeholder::{Calls, Template};
use crate::conversation::{Conversation, Edit, Kind};

/// `[prune]` settings the policy needs.
#[derive(Debug, Clone)]
pub struct PruneSettings {
    pub protect_tokens: u32,
    pub minimum_tokens: u32,
    /// What a pruned output becomes: a fixed text or a template naming the call.
    pub placeholder: Template,
    pub protected_tools: Vec<String>,
    /// Share of the window (less the output reserve) above which a batch goes whatever it costs
    /// the prompt cache (compaction's budget applies it).
    pub pressure: f64,
    /// Probability with which the conversation must run the turns a batch pays back over.
    pub payback_confidence: f64,
    /// Run lengths counted as if measured (`[prune] assumed_runs`).
    pub assumed_runs: Vec<u64>,
}

/// What pruning did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pruned {
    /// Call ids whose outputs are pruned in this request (earlier decisions included).
    pub call_ids: Vec<String>,
    /// Outputs replaced by the placeholder in this request.
    pub count: usize,
    /// Tokens a batch held back would free (it did not pay yet).
    pub held_tokens: u32,
    /// Why a new batch changed what the provider had already seen.
    pub prefix_break: Option<Reason>,
}

/// Prunes `conversation`; `history` holds the call ids pruned in earlier requests and what the
/// provider's cache holds.
pub fn apply(
    conversation: &mut Conversation,
    settings: &PruneSettings,
    history: &History,
    count: &dyn Fn(&str) -> u32,
) -> Pruned {
    let previously = history.pruned_before;
    // Call ids of protected tools, looked up once: one scan per result would be O(n^2).
    let protected_ids: HashSet<String> = if settings.protected_tools.is_empty() {
        HashSet::new()
    } else {
        conversation
            .tool_names()
            .into_iter()
            .filter(|(_, name)| settings.protected_tools.iter().any(|p| p.eq_ignore_ascii_case(name)))
            .map(|(id, _)| id.to_string())
            .collect()
    };
    let protected_call = |call_id: Option<&str>| call_id.is_some_and(|id| protected_ids.contains(id));
    let calls = Calls::of(conversation);
    // Each output's own placeholder (it names its call and the size it replaces, `tokens`: the
    // output as it would be sent, after any cut): the same bytes on every turn, and the same
    // again when a rewritten body is rewritten (a cut output's placeholder names the cut's size,
    // so its own size cannot tip the decision the other way on a second pass).
    let placeholder_of = |index: usize, tokens: u32| match &conversation.items[index].kind {
        Kind::ToolResult { call_id, .. } => settings.placeholder.render(&calls, call_id.as_deref(), tokens),
        _ => std::borrow::Cow::Borrowed(settings.placeholder.as_str()),
    };
    let is_placeholder = |index: usize, text: &str| {
        let call_id = conversation.items[index].call_id();
        settings.placeholder.rendered(&calls, call_id, text)
    };
    let framing = crate::conversation::FRAMING_TOKENS;
    let placeholder_tokens = |index: usize, tokens: u32| count(&placeholder_of(index, tokens)) + framing;
    // No placeholder is larger: a larger output is worth pruning without rendering its own
    // (worked out once, at the first output: a request without any pays nothing).
    let largest = std::cell::OnceCell::new();
    let largest = || *largest.get_or_init(|| settings.placeholder.max_tokens(count) + framing);
    let mut protected = 0u32;
    let mut forced = Vec::new();
    let mut prunable = Vec::new();
    let mut prunable_tokens = 0u32;
    // Call ids of the outputs the window keeps.
    let mut kept_calls: HashSet<&str> = HashSet::new();
    // The size of every item as it would go with no new batch, for the pay-back rule.
    let mut sizes = vec![0u32; conversation.items.len()];
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
            Edit::Keep if is_placeholder(index, text) => continue,
            Edit::Keep => item.tokens,
            Edit::Replace(text) if is_placeholder(index, text) => continue,
            // Counted as an item would be, framing included, so a second pass sees the same sizes.
            Edit::Replace(text) => count(text).saturating_add(crate::conversation::FRAMING_TOKENS),
            Edit::Remove => continue,
        };
        sizes[index] = current;
        // Outputs no bigger than their placeholder (a synthetic "aborted", an empty result) gain
        // nothing from pruning; leaving them out of the window too keeps a second pass deciding
        // the same.
        let not_worth = current <= largest() && current <= placeholder_tokens(index, current);
        if not_worth || protected_call(call_id) {
            continue;
        }
        if call_id.is_some_and(|id| previously.contains(id)) {
            forced.push(index);
        } else if protected < settings.protect_tokens {
            // The output that crosses the window's edge stays whole: no splitting.
            protected = protected.saturating_add(current);
            kept_calls.extend(call_id);
        } else if call_id.is_some_and(|id| kept_calls.contains(id)) {
            // An older output of a call whose newer output stays (a client that reused a call
            // id): the session remembers pruned call ids, not outputs, so pruning this one would
            // prune the kept one on the next turn, changing bytes already sent.
            continue;
        } else {
            prunable.push(index);
            prunable_tokens = prunable_tokens.saturating_add(current);
        }
    }
    let mut pruned = Pruned::default();
    if prunable_tokens < settings.minimum_tokens {
        prunable.clear();
    }
    // `prunable` runs newest first: its last entry is the batch's first change.
    if let Some(&first) = prunable.last() {
        let freed = prunable
            .iter()
            .map(|&i| sizes[i].saturating_sub(placeholder_tokens(i, sizes[i])))
            .fold(0, u32::saturating_add);
        let seen = |index: usize| conversation.items[index].message < history.seen_messages;
        if seen(first) {
            let batch: HashSet<usize> = prunable.iter().copied().collect();
            let mut pending = payback::Pending { freed: u64::from(freed), ..payback::Pending::default() };
            for index in (0..conversation.items.len()).filter(|i| !batch.contains(i)) {
                let size = u64::from(item_size(conversation, index, &sizes, count));
                match (seen(index), index < first) {
                    (true, true) => pending.before += size,
                    (true, false) => pending.after += size,
                    (false, _) => pending.new += size,
                }
            }
            // What replaces the batch stays after the first change: re-written, not read.
            pending.after += prunable.iter().map(|&i| u64::from(placeholder_tokens(i, sizes[i]))).sum::<u64>();
            match payback::decide(history, &pending) {
                Some(reason) => pruned.prefix_break = Some(reason),
                None => {
                    pruned.held_tokens = freed;
                    prunable.clear();
                }
            }
        }
    }
    let texts: Vec<(usize, String)> = forced
        .into_iter()
        .chain(prunable)
        .map(|index| (index, placeholder_of(index, sizes[index]).into_owned()))
        .collect();
    drop(calls);
    for (index, text) in texts {
        let item = &mut conversation.items[index];
        item.edit = Edit::Replace(text);
        pruned.count += 1;
        if let Kind::ToolResult { call_id: Some(id), .. } = &item.kind {
            pruned.call_ids.push(id.to_string());
        }
    }
    pruned
}

/// An item's tokens as it would be sent now (`sizes` holds the tool results already sized).
fn item_size(conversation: &Conversation, index: usize, sizes: &[u32], count: &dyn Fn(&str) -> u32) -> u32 {
    let item = &conversation.items[index];
    match &item.edit {
        _ if sizes[index] > 0 => sizes[index],
        Edit::Keep => item.tokens,
        Edit::Replace(text) => count(text).saturating_add(crate::conversation::FRAMING_TOKENS),
        Edit::Remove => 0,
    }
}
