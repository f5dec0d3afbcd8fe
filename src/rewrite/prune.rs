//! Prunes old tool outputs: the newest `protect_tokens` of tool output stay, older ones are
//! replaced by a placeholder once enough of them add up and the batch is worth the prompt cache
//! it breaks ([`payback`]). Decisions are remembered per session so the rewritten prefix stays
//! byte-stable across turns.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashSet;

use super::payback::{self, History, Reason};
use super::placeholder::{Calls, Template, is_pointer};
use crate::conversation::{Conversation, Edit, FRAMING_TOKENS, Kind};

/// `[prune]` settings the policy needs.
#[derive(Debug, Clone)]
pub struct PruneSettings {
    pub protect_tokens: u32,
    pub minimum_tokens: u32,
    /// The most of the window `protect_tokens` and `minimum_tokens` may be ([`PruneSettings::within`]).
    pub protect_window_share: f64,
    pub minimum_window_share: f64,
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

impl PruneSettings {
    /// The settings for a request whose window is `window` tokens: protection and batch no
    /// more than their shares of it. The configured 40,000 and 20,000 tokens are a third and a
    /// sixth of a 120k window; below that they would protect every output and no batch would
    /// ever be big enough, so a small window paid a summary where masking old outputs was free.
    /// `None` when the window changes nothing.
    pub fn within(&self, window: u64) -> Option<PruneSettings> {
        let cap = |tokens: u32, share: f64| tokens.min((window as f64 * share) as u32);
        let protect = cap(self.protect_tokens, self.protect_window_share);
        let minimum = cap(self.minimum_tokens, self.minimum_window_share);
        if window == 0 || (protect == self.protect_tokens && minimum == self.minimum_tokens) {
            return None;
        }
        Some(PruneSettings { protect_tokens: protect, minimum_tokens: minimum, ..self.clone() })
    }
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
    /// Tool output the window protects now, and what every output outside it comes to
    /// (whether or not it makes a batch yet): what masking could free, now and as the newest
    /// outputs push older ones out of the window.
    pub protected_tokens: u32,
    pub maskable_tokens: u32,
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
    let protected_ids = protected_call_ids(conversation, &settings.protected_tools);
    let placeholders = Placeholders::of(conversation, &settings.placeholder, count);
    let mut selection = select(conversation, settings, history, &placeholders, &protected_ids, count);
    let mut pruned = Pruned {
        protected_tokens: selection.protected,
        maskable_tokens: selection.prunable_tokens,
        ..Pruned::default()
    };
    if selection.prunable_tokens < settings.minimum_tokens {
        selection.prunable.clear();
    }
    hold_unless_it_pays(conversation, history, &placeholders, &mut selection, &mut pruned, count);
    let Selection { forced, prunable, sizes, .. } = selection;
    let texts: Vec<(usize, String)> = forced
        .into_iter()
        .chain(prunable)
        .map(|index| (index, placeholders.text(index, sizes[index]).into_owned()))
        .collect();
    drop(placeholders);
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

/// Call ids of the `protected_tools`' calls, looked up once: one scan per result would be O(n^2).
fn protected_call_ids(conversation: &Conversation, protected_tools: &[String]) -> HashSet<String> {
    if protected_tools.is_empty() {
        return HashSet::new();
    }
    conversation
        .tool_names()
        .into_iter()
        .filter(|(_, name)| protected_tools.iter().any(|p| p.eq_ignore_ascii_case(name)))
        .map(|(id, _)| id.to_string())
        .collect()
}

/// Each output's own placeholder (it names its call and the size it replaces, `tokens`: the
/// output as it would be sent, after any cut): the same bytes on every turn, and the same again
/// when a rewritten body is rewritten (a cut output's placeholder names the cut's size, so its
/// own size cannot tip the decision the other way on a second pass).
struct Placeholders<'p, 'c> {
    conversation: &'p Conversation<'c>,
    template: &'p Template,
    calls: Calls<'p, 'c>,
    count: &'p dyn Fn(&str) -> u32,
    /// No placeholder is larger: a larger output is worth pruning without rendering its own
    /// (worked out once, at the first output: a request without any pays nothing).
    largest: OnceCell<u32>,
}

impl<'p, 'c> Placeholders<'p, 'c> {
    fn of(conversation: &'p Conversation<'c>, template: &'p Template, count: &'p dyn Fn(&str) -> u32) -> Self {
        Self { conversation, template, calls: Calls::of(conversation), count, largest: OnceCell::new() }
    }

    /// The placeholder of item `index`, replacing `tokens`.
    fn text(&self, index: usize, tokens: u32) -> Cow<'p, str> {
        match &self.conversation.items[index].kind {
            Kind::ToolResult { call_id, .. } => self.template.render(&self.calls, call_id.as_deref(), tokens),
            _ => Cow::Borrowed(self.template.as_str()),
        }
    }

    /// Whether `text` is item `index`'s placeholder already, or another stand-in compactor
    /// writes (a duplicate's pointer): nothing to prune.
    fn stands_in(&self, index: usize, text: &str) -> bool {
        let call_id = self.conversation.items[index].call_id();
        self.template.stands_in(&self.calls, call_id, text)
    }

    /// The tokens of item `index`'s placeholder as sent (framing included).
    fn tokens(&self, index: usize, tokens: u32) -> u32 {
        (self.count)(&self.text(index, tokens)) + FRAMING_TOKENS
    }

    fn largest(&self) -> u32 {
        *self.largest.get_or_init(|| self.template.max_tokens(self.count) + FRAMING_TOKENS)
    }
}

/// The tool outputs one pass over the conversation, newest first, picked to prune.
struct Selection {
    /// Outputs of calls pruned in earlier requests: pruned again, whatever the window holds.
    forced: Vec<usize>,
    /// Outputs past the protected window, newest first: the new batch.
    prunable: Vec<usize>,
    prunable_tokens: u32,
    /// Tool output inside the protected window.
    protected: u32,
    /// The size of every item as it would go with no new batch, for the pay-back rule.
    sizes: Vec<u32>,
}

/// Walks the tool outputs newest first: the newest `protect_tokens` of them stay (the window),
/// older ones worth more than their placeholder join the batch.
fn select<'c>(
    conversation: &'c Conversation,
    settings: &PruneSettings,
    history: &History,
    placeholders: &Placeholders,
    protected_ids: &HashSet<String>,
    count: &dyn Fn(&str) -> u32,
) -> Selection {
    let previously = history.pruned_before;
    let protected_call = |call_id: Option<&str>| call_id.is_some_and(|id| protected_ids.contains(id));
    let mut protected = 0u32;
    let mut selection = Selection {
        forced: Vec::new(),
        prunable: Vec::new(),
        prunable_tokens: 0,
        protected: 0,
        sizes: vec![0u32; conversation.items.len()],
    };
    // Call ids of the outputs the window keeps.
    let mut kept_calls: HashSet<&'c str> = HashSet::new();
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
            // A duplicate's pointer an earlier rewrite wrote: an output kept (losslessly), in the
            // window as the copy it stands for was, so an older output of its call stays too.
            Edit::Keep if is_pointer(text) => {
                if protected < settings.protect_tokens {
                    protected = protected.saturating_add(item.tokens);
                }
                kept_calls.extend(call_id);
                continue;
            }
            Edit::Keep if placeholders.stands_in(index, text) => continue,
            Edit::Keep => item.tokens,
            Edit::Replace(text) if placeholders.stands_in(index, text) => continue,
            // Counted as an item would be, framing included, so a second pass sees the same sizes.
            Edit::Replace(text) => count(text).saturating_add(FRAMING_TOKENS),
            Edit::Remove => continue,
        };
        selection.sizes[index] = current;
        // Outputs no bigger than their placeholder (a synthetic "aborted", an empty result) gain
        // nothing from pruning; leaving them out of the window too keeps a second pass deciding
        // the same.
        let not_worth = current <= placeholders.largest() && current <= placeholders.tokens(index, current);
        if not_worth || protected_call(call_id) {
            continue;
        }
        if call_id.is_some_and(|id| previously.contains(id)) {
            selection.forced.push(index);
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
            selection.prunable.push(index);
            selection.prunable_tokens = selection.prunable_tokens.saturating_add(current);
        }
    }
    selection.protected = protected;
    selection
}

/// A batch that changes what the provider has already seen goes only when it pays for the cache
/// it breaks ([`payback::decide`]): then `pruned` says why; else it is held back (`prunable`
/// emptied) and `pruned` notes what it would have freed.
fn hold_unless_it_pays(
    conversation: &Conversation,
    history: &History,
    placeholders: &Placeholders,
    selection: &mut Selection,
    pruned: &mut Pruned,
    count: &dyn Fn(&str) -> u32,
) {
    let (prunable, sizes) = (&mut selection.prunable, &selection.sizes);
    // `prunable` runs newest first: its last entry is the batch's first change.
    let Some(&first) = prunable.last() else { return };
    let freed = prunable
        .iter()
        .map(|&i| sizes[i].saturating_sub(placeholders.tokens(i, sizes[i])))
        .fold(0, u32::saturating_add);
    let seen = |index: usize| conversation.items[index].message < history.seen_messages;
    if !seen(first) {
        return;
    }
    let batch: HashSet<usize> = prunable.iter().copied().collect();
    let mut pending = payback::Pending { freed: u64::from(freed), ..payback::Pending::default() };
    for index in (0..conversation.items.len()).filter(|i| !batch.contains(i)) {
        let size = u64::from(item_size(conversation, index, sizes, count));
        match (seen(index), index < first) {
            (true, true) => pending.before += size,
            (true, false) => pending.after += size,
            (false, _) => pending.new += size,
        }
    }
    // What replaces the batch stays after the first change: re-written, not read.
    pending.after += prunable.iter().map(|&i| u64::from(placeholders.tokens(i, sizes[i]))).sum::<u64>();
    match payback::decide(history, &pending) {
        Some(reason) => pruned.prefix_break = Some(reason),
        None => {
            pruned.held_tokens = freed;
            prunable.clear();
        }
    }
}

/// An item's tokens as it would be sent now (`sizes` holds the tool results already sized).
fn item_size(conversation: &Conversation, index: usize, sizes: &[u32], count: &dyn Fn(&str) -> u32) -> u32 {
    let item = &conversation.items[index];
    match &item.edit {
        _ if sizes[index] > 0 => sizes[index],
        Edit::Keep => item.tokens,
        Edit::Replace(text) => count(text).saturating_add(FRAMING_TOKENS),
        Edit::Remove => 0,
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;

    fn settings() -> PruneSettings {
        PruneSettings {
            protect_tokens: 40_000,
            minimum_tokens: 20_000,
            protect_window_share: 0.33,
            minimum_window_share: 0.16,
            placeholder: Template::new("[pruned]"),
            protected_tools: Vec::new(),
            pressure: 0.8,
            payback_confidence: 0.9,
            assumed_runs: Vec::new(),
        }
    }

    #[test]
    fn a_small_window_protects_and_batches_its_shares_of_it() {
        let small = settings().within(2_048).expect("a 2k window changes them");
        assert_eq!((small.protect_tokens, small.minimum_tokens), (675, 327));
        let eight = settings().within(8_192).expect("so does an 8k one");
        assert_eq!((eight.protect_tokens, eight.minimum_tokens), (2_703, 1_310));
    }

    #[test]
    fn a_cloud_window_keeps_the_configured_sizes() {
        for window in [128_000, 200_000, 1_000_000] {
            assert!(settings().within(window).is_none(), "{window}");
        }
        assert!(settings().within(0).is_none(), "an unknown window changes nothing");
    }
}
