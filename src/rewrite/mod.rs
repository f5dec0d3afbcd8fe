//! The rewrite stage: parse, count, then truncate, dedupe, prune and repair on the neutral view,
//! and render only what changed.

pub mod cache_cost;
pub mod change;
pub mod content;
pub mod dedupe;
pub mod payback;
pub mod placeholder;
pub mod prune;
pub mod repair;
pub mod truncate;
pub mod units;

use std::cell::OnceCell;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::conversation::{Conversation, FRAMING_TOKENS, Kind};
use crate::dialect::{Dialect, ParsedRequest};
use crate::tokens::{Encoding, ModelInfo, ModelTable, TokenCounter};
use crate::work::{self, Stopped};

pub use change::ChangeKind;
pub use payback::{CachePricing, History, Pending, Reason};
pub use prune::PruneSettings;
pub use units::{Estimated, ProviderTokens};

/// The policies' settings, from `[prune]`, `[truncate]`, `[repair]` and `[tokens]`.
#[derive(Debug, Clone)]
pub struct RewriteSettings {
    pub prune_enabled: bool,
    pub dedupe: bool,
    pub prune: PruneSettings,
    /// The prompt-cache prices of each family's upstream.
    pub cache: crate::route::PerFamily<CachePricing>,
    pub truncate_enabled: bool,
    pub tool_output_max_tokens: u32,
    pub repair_enabled: bool,
    pub image_tokens: u32,
    /// Uncached text above this many bytes is tokenized on a blocking thread.
    pub blocking_tokenize_bytes: usize,
    /// Bytes of changed content the inspector keeps per request (`inspector.keep_content`); 0:
    /// none, and nothing is copied.
    pub keep_content_bytes: usize,
}

/// What the rewrite did to one request.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RewriteReport {
    /// Estimated prompt tokens as the client sent it (vendor factor applied); see
    /// [`RewriteReport::estimated_before`].
    pub tokens_before: u32,
    /// Estimated prompt tokens as forwarded; see [`RewriteReport::estimated_after`].
    pub tokens_after: u32,
    pub pruned: usize,
    pub truncated: usize,
    pub deduped: usize,
    pub repaired: usize,
    pub saved_by_truncate: u32,
    pub saved_by_dedupe: u32,
    pub saved_by_prune: u32,
    /// Call ids pruned in this request, to remember for the session.
    pub pruned_call_ids: Vec<String>,
    /// Tokens a prune batch held back would free (not worth its cache break yet).
    pub held_tokens: u32,
    /// Tool output the prune window protects, and all tool output outside it (see
    /// [`prune::Pruned`]), vendor factor applied.
    pub protected_tokens: u32,
    pub maskable_tokens: u32,
    /// Why this request changed content the provider had already seen, when it did.
    pub prefix_break: Option<Reason>,
    pub model: ModelInfo,
    /// Messages in the request as the client sent it.
    pub message_count: usize,
    /// The output budget the client asked for (`max_tokens` and its siblings).
    pub max_tokens: Option<u64>,
    /// Raw tokens of each message as forwarded, for the hybrid estimate.
    pub message_tokens: Vec<u32>,
    /// The compaction generation applied to the body (0: none), set by compaction.
    pub compaction: u32,
    /// The changed items' content, when the inspector keeps it (boxed: the report is moved
    /// around on every request, and this is rarely there).
    pub content: Option<Box<content::Kept>>,
}

impl RewriteReport {
    /// `tokens_before` in its unit: compactor's estimate of the prompt as the client sent it.
    pub fn estimated_before(&self) -> Estimated {
        Estimated::from(self.tokens_before)
    }

    /// `tokens_after` in its unit: compactor's estimate of the prompt as forwarded.
    pub fn estimated_after(&self) -> Estimated {
        Estimated::from(self.tokens_after)
    }
}

/// The outcome: a new body when something changed.
#[derive(Debug)]
pub struct Rewritten {
    pub body: Option<Vec<u8>>,
    pub report: RewriteReport,
}

/// Runs the policies; shared by every request.
pub struct Rewriter {
    pub settings: RewriteSettings,
    pub counter: TokenCounter,
    pub models: ModelTable,
}

impl Rewriter {
    pub fn new(settings: RewriteSettings, counter: TokenCounter, models: ModelTable) -> Self {
        Self { settings, counter, models }
    }

    /// Rewrites a parsed request; `history` holds the session's earlier pruning decisions and
    /// what the provider's cache holds. Each step counts against the request's budget
    /// ([`work`]); a spent budget or a client that left stops it.
    pub async fn rewrite(&self, parsed: &mut ParsedRequest<'_>, history: &History<'_>) -> Result<Rewritten, Stopped> {
        self.rewrite_with(parsed, history, &self.settings).await
    }

    /// Like [`Rewriter::rewrite`] with other settings (the overflow ladder prunes harder).
    pub async fn rewrite_with(
        &self,
        parsed: &mut ParsedRequest<'_>,
        history: &History<'_>,
        settings: &RewriteSettings,
    ) -> Result<Rewritten, Stopped> {
        let model = self.count(parsed).await?;
        work::step(|| self.apply(parsed, model, history, settings)).await
    }

    /// Counts every item's tokens (tokenizing what the cache lacks on a blocking thread).
    pub async fn count(&self, parsed: &mut ParsedRequest<'_>) -> Result<ModelInfo, Stopped> {
        let model = self.models.lookup(parsed.model.as_deref().unwrap_or(""));
        // The tables load once, at start; a request never waits for them on an async worker.
        crate::tokens::loaded(model.encoding).await;
        let mut counts = work::step(|| self.look_up(parsed, model.encoding)).await?;
        if counts.missing_bytes >= self.settings.blocking_tokenize_bytes {
            self.tokenize_blocking(parsed, model.encoding, &mut counts).await?;
        }
        work::step(|| {
            self.tokenize(parsed, model.encoding, &mut counts);
            self.assign(parsed, model.encoding, &counts);
        })
        .await?;
        Ok(model)
    }

    /// Scales a raw count by the model's vendor factor.
    pub fn scaled(tokens: u32, model: ModelInfo) -> u32 {
        scale(tokens, model.token_factor)
    }

    /// Parses and rewrites in one go, on the calling thread (tests, benchmarks), as for a provider
    /// without a cache ([`History::eager`]). `None` when the body is not `dialect`.
    pub fn rewrite_body(&self, dialect: Dialect, body: &[u8], pruned_before: &BTreeSet<String>) -> Option<Rewritten> {
        self.rewrite_body_in(dialect, body, &History::eager(pruned_before))
    }

    /// [`Rewriter::rewrite_body`] knowing the conversation's history upstream.
    pub fn rewrite_body_in(&self, dialect: Dialect, body: &[u8], history: &History) -> Option<Rewritten> {
        Some(self.rewrite_parsed(&mut ParsedRequest::parse(dialect, body)?, history))
    }

    /// Counts and rewrites a parsed request on the calling thread (tests, benchmarks).
    pub fn rewrite_parsed(&self, parsed: &mut ParsedRequest, history: &History) -> Rewritten {
        let model = self.models.lookup(parsed.model.as_deref().unwrap_or(""));
        self.count_items(parsed, model.encoding);
        self.apply(parsed, model, history, &self.settings)
    }

    /// Runs the policies on a counted request.
    fn apply(
        &self,
        parsed: &mut ParsedRequest,
        model: ModelInfo,
        history: &History,
        settings: &RewriteSettings,
    ) -> Rewritten {
        let counting = CutAwareCount { counter: &self.counter, encoding: model.encoding, cuts: OnceCell::new() };
        let count = |text: &str| counting.count(text);
        let message_count = parsed.messages.len();
        let mut report = RewriteReport { model, message_count, max_tokens: parsed.max_tokens(), ..Default::default() };
        let before = parsed.conversation.tokens_before();
        run_policies(parsed, history, settings, &counting, before, &mut report);
        let after = parsed.conversation.tokens_after(count);
        let (body, after) = render_as_decided(parsed, history, &mut report, after, count);
        report.message_tokens = message_tokens(&parsed.conversation, message_count, count);
        if settings.keep_content_bytes > 0 {
            report.content = Some(Box::new(content::kept(&parsed.conversation, settings.keep_content_bytes)));
        }
        scale_report(&mut report, before, after, model.token_factor);
        // What the rewrite kept for the next turn (cuts, renders) counts against the cache's bound.
        parsed.memo.settle();
        Rewritten { body, report }
    }

    /// Fills in every item's tokens and the conversation's fixed cost, on this thread.
    pub fn count_items(&self, parsed: &mut ParsedRequest, encoding: Encoding) {
        let mut counts = self.look_up(parsed, encoding);
        self.tokenize(parsed, encoding, &mut counts);
        self.assign(parsed, encoding, &counts);
    }

    /// Every countable text's count from the cache: each text hashed and looked up once.
    fn look_up(&self, parsed: &ParsedRequest, encoding: Encoding) -> Counts {
        let mut counts = Counts::default();
        // The items re-made from the last turn come with their counts: only what the agent added
        // is hashed and looked up.
        let known = parsed.memo.known(encoding);
        counts.counts.extend_from_slice(known);
        for (slot, text) in countable_texts(parsed).enumerate().skip(known.len()) {
            if text.is_empty() {
                counts.counts.push(0);
                continue;
            }
            let hash = crate::tokens::text_hash(text);
            match self.counter.cached(encoding, hash) {
                Some(count) => counts.counts.push(count),
                None => {
                    counts.counts.push(0);
                    counts.missing.push((slot, hash));
                    counts.missing_bytes += text.len();
                }
            }
        }
        counts
    }

    /// Tokenizes the texts the cache lacked, on this thread.
    fn tokenize(&self, parsed: &ParsedRequest, encoding: Encoding, counts: &mut Counts) {
        if counts.missing.is_empty() {
            return;
        }
        let mut missing = counts.missing.iter().peekable();
        for (slot, text) in countable_texts(parsed).enumerate() {
            let Some(&&(wanted, hash)) = missing.peek() else { break };
            if slot == wanted {
                counts.counts[slot] = self.counter.count_uncached(encoding, hash, text);
                missing.next();
            }
        }
        counts.missing.clear();
        counts.missing_bytes = 0;
    }

    /// Tokenizes the texts the cache lacked on a blocking thread (a lot of text: the async
    /// worker stays free), stopping between texts when the request's budget runs out or its
    /// client leaves.
    async fn tokenize_blocking(
        &self,
        parsed: &ParsedRequest<'_>,
        encoding: Encoding,
        counts: &mut Counts,
    ) -> Result<(), Stopped> {
        let mut texts: Vec<(usize, u128, Arc<str>)> = Vec::with_capacity(counts.missing.len());
        let mut missing = counts.missing.iter().peekable();
        for (slot, text) in countable_texts(parsed).enumerate() {
            let Some(&&(wanted, hash)) = missing.peek() else { break };
            if slot == wanted {
                texts.push((slot, hash, Arc::from(text)));
                missing.next();
            }
        }
        let counter = self.counter.clone();
        let budget = work::current();
        let started = std::time::Instant::now();
        let stop = move || budget.as_ref().is_some_and(|b| b.check(Some(started)).is_err());
        let counted = tokio::task::spawn_blocking(move || {
            let mut counted = Vec::with_capacity(texts.len());
            for (slot, hash, text) in texts {
                if stop() {
                    break;
                }
                counted.push((slot, counter.count_uncached(encoding, hash, &text)));
            }
            counted
        })
        .await
        .unwrap_or_default();
        work::charge(started.elapsed());
        let done: std::collections::HashSet<usize> = counted.iter().map(|(slot, _)| *slot).collect();
        for (slot, count) in counted {
            counts.counts[slot] = count;
        }
        counts.missing.retain(|(slot, _)| !done.contains(slot));
        counts.missing_bytes = 0;
        match work::current() {
            Some(budget) => budget.check(None),
            None => Ok(()),
        }
    }

    /// Gives every item its tokens and the conversation its fixed cost from `counts` (in
    /// [`countable_texts`] order).
    fn assign(&self, parsed: &mut ParsedRequest, encoding: Encoding, counts: &Counts) {
        // Every slot is counted by now; the items' slots are kept for the next turn.
        if let Some(items) = counts.counts.get(..parsed.conversation.items.len() * 2) {
            parsed.memo.remember(encoding, items);
        }
        let image = self.settings.image_tokens;
        let mut slots = counts.counts.iter().copied();
        let mut next = || slots.next().unwrap_or(0);
        for item in &mut parsed.conversation.items {
            let (first, second) = (next(), next());
            // Saturating: a client sets the number of attachments (millions of empty parts) and an
            // operator the tokens of each; a wrapped sum would make a huge request look small.
            let content = match &item.kind {
                Kind::ToolResult { attachments, .. } => {
                    first.saturating_add(second).saturating_add(attachments.saturating_mul(image))
                }
                Kind::Attachment => image,
                _ => first.saturating_add(second),
            };
            item.tokens = FRAMING_TOKENS.saturating_add(content);
        }
        let messages = u32::try_from(parsed.messages.len()).unwrap_or(u32::MAX);
        let mut fixed = FRAMING_TOKENS.saturating_mul(messages).saturating_add(3);
        if parsed.tools.is_some() {
            fixed = fixed.saturating_add(next());
        }
        // System text outside the history is not an item: policies never touch it.
        for _ in &parsed.top_system {
            fixed = fixed.saturating_add(next()).saturating_add(FRAMING_TOKENS);
        }
        parsed.conversation.fixed_tokens = fixed;
    }
}

/// Counts a text for the policies: truncation's cuts are counted as they are made (or come
/// counted from the last turn), so compared by length, then bytes, they are not hashed again at
/// every step.
struct CutAwareCount<'r> {
    counter: &'r TokenCounter,
    encoding: Encoding,
    /// The cuts, sorted by length: a text is compared with the cuts of its length only.
    cuts: OnceCell<Vec<truncate::Cut>>,
}

impl CutAwareCount<'_> {
    fn count(&self, text: &str) -> u32 {
        let cut = self.cuts.get().and_then(|cuts| {
            let from = cuts.partition_point(|c| c.text.len() < text.len());
            cuts[from..].iter().take_while(|c| c.text.len() == text.len()).find(|c| *c.text == *text)
        });
        match cut {
            Some(cut) => cut.tokens,
            None => self.counter.count(self.encoding, text),
        }
    }
}

/// Runs repair, truncation, pruning and dedupe on `parsed`'s conversation as `settings` enable
/// them, noting in `report` what each did and saved from the `before` tokens.
fn run_policies(
    parsed: &mut ParsedRequest,
    history: &History,
    settings: &RewriteSettings,
    counting: &CutAwareCount,
    before: u32,
    report: &mut RewriteReport,
) {
    let count = |text: &str| counting.count(text);
    let encoding = counting.encoding;
    let conversation = &mut parsed.conversation;
    let mut last = before;
    let mut step = |conversation: &Conversation, saved: &mut u32| {
        let now = conversation.tokens_after(count);
        *saved = last.saturating_sub(now);
        last = now;
    };
    if settings.repair_enabled {
        // Orphans out first, so no policy sizes its windows with results that will not be sent.
        report.repaired = repair::apply(conversation);
    }
    if settings.truncate_enabled {
        let max_tokens = settings.tool_output_max_tokens;
        let earlier = |item: usize| parsed.memo.earlier_cut(encoding, max_tokens, item).cloned();
        let cuts = truncate::apply(conversation, max_tokens, &settings.prune.placeholder, &count, &earlier);
        report.truncated = cuts.len();
        parsed.memo.remember_cuts(encoding, max_tokens, cuts.clone());
        let mut by_length = cuts;
        by_length.sort_by_key(|c| c.text.len());
        let _ = counting.cuts.set(by_length);
        step(conversation, &mut report.saved_by_truncate);
    }
    if settings.prune_enabled {
        // Prune first: dedupe then never points at a pruned copy.
        let pruned = prune::apply(conversation, &settings.prune, history, &count);
        report.pruned = pruned.count;
        report.pruned_call_ids = pruned.call_ids;
        report.held_tokens = scale(pruned.held_tokens, report.model.token_factor);
        report.protected_tokens = scale(pruned.protected_tokens, report.model.token_factor);
        report.maskable_tokens = scale(pruned.maskable_tokens, report.model.token_factor);
        report.prefix_break = pruned.prefix_break;
        step(conversation, &mut report.saved_by_prune);
        if settings.dedupe {
            report.deduped = dedupe::apply(conversation, &settings.prune.placeholder);
            step(conversation, &mut report.saved_by_dedupe);
        }
    }
    if settings.repair_enabled {
        // And last, so nothing any policy did can leave a call unpaired.
        report.repaired += repair::apply(conversation);
    }
}

/// Renders the decided conversation (`after` tokens); the messages the render could not write as
/// decided go as they came, and their edits and savings are taken back. The body, if any, and the
/// tokens that go.
fn render_as_decided(
    parsed: &mut ParsedRequest,
    history: &History,
    report: &mut RewriteReport,
    mut after: u32,
    count: impl Fn(&str) -> u32 + Copy,
) -> (Option<Vec<u8>>, u32) {
    if parsed.conversation.is_changed() {
        // A rewrite of what the provider has seen keeps the prefix before it cached.
        crate::dialect::breakpoints::place(parsed, history.seen_messages);
    }
    parsed.unapplied.take();
    let mut body = parsed.render();
    let unapplied = parsed.unapplied.take();
    if !unapplied.is_empty() || (body.is_none() && parsed.conversation.is_changed()) {
        // What went upstream is not what the policies decided: the messages whose original
        // bytes went (every message, when nothing could be rendered) save nothing.
        let everything = body.is_none();
        let mut undone = vec![everything; report.message_count];
        for message in unapplied {
            if let Some(slot) = undone.get_mut(message) {
                *slot = true;
            }
        }
        undo_edits(&mut parsed.conversation, |message| undone.get(message).copied().unwrap_or(everything));
        let kept = parsed.conversation.tokens_after(count);
        undo_savings(report, kept.saturating_sub(after));
        after = kept;
        let pruned = still_pruned(&parsed.conversation);
        report.pruned_call_ids.retain(|id| pruned.contains(id.as_str()));
        report.pruned = report.pruned.min(report.pruned_call_ids.len());
        body = if parsed.conversation.is_changed() && !everything { parsed.render() } else { None };
    }
    (body, after)
}

/// The report's raw counts scaled by the model's vendor factor, `before` and `after` the rewrite.
fn scale_report(report: &mut RewriteReport, before: u32, after: u32, factor: f32) {
    report.tokens_before = scale(before, factor);
    report.tokens_after = scale(after, factor);
    report.saved_by_truncate = scale(report.saved_by_truncate, factor);
    report.saved_by_dedupe = scale(report.saved_by_dedupe, factor);
    report.saved_by_prune = scale(report.saved_by_prune, factor);
}

/// Every message's tokens as they go (items plus framing).
fn message_tokens(conversation: &Conversation, message_count: usize, count: impl Fn(&str) -> u32) -> Vec<u32> {
    let mut per_message = vec![FRAMING_TOKENS; message_count];
    for item in &conversation.items {
        if let Some(slot) = per_message.get_mut(item.message) {
            *slot = slot.saturating_add(match &item.edit {
                crate::conversation::Edit::Keep => item.tokens,
                crate::conversation::Edit::Replace(text) => count(text).saturating_add(FRAMING_TOKENS),
                crate::conversation::Edit::Remove => 0,
            });
        }
    }
    per_message
}

/// Puts back the items of the messages `undone` says, as the client sent them (their synthetic
/// results too).
fn undo_edits(conversation: &mut Conversation, undone: impl Fn(usize) -> bool) {
    for item in conversation.items.iter_mut().filter(|item| undone(item.message)) {
        item.edit = crate::conversation::Edit::Keep;
    }
    let items = &conversation.items;
    conversation.inserts.retain(|insert| !items.get(insert.call_item).is_some_and(|call| undone(call.message)));
}

/// Takes `tokens` that were counted as saved but were sent after all off the savings, the
/// policy acting last first.
fn undo_savings(report: &mut RewriteReport, mut tokens: u32) {
    for saved in [&mut report.saved_by_dedupe, &mut report.saved_by_prune, &mut report.saved_by_truncate] {
        let taken = tokens.min(*saved);
        *saved -= taken;
        tokens -= taken;
    }
}

/// The calls whose results still go pruned (replaced or removed).
fn still_pruned<'c>(conversation: &'c Conversation) -> std::collections::HashSet<&'c str> {
    let edited = conversation.items.iter().filter(|item| item.edit != crate::conversation::Edit::Keep);
    edited
        .filter_map(|item| match &item.kind {
            Kind::ToolResult { call_id: Some(call), .. } => Some(call.as_ref()),
            _ => None,
        })
        .collect()
}

/// The counts of one request's texts, slot by slot in [`countable_texts`] order, and the slots
/// the cache lacked (with their hashes).
#[derive(Default)]
struct Counts {
    counts: Vec<u32>,
    missing: Vec<(usize, u128)>,
    missing_bytes: usize,
}

/// Every text the counter will be asked about for this request.
fn countable_texts<'p>(parsed: &'p ParsedRequest<'_>) -> impl Iterator<Item = &'p str> {
    let items = parsed.conversation.items.iter().flat_map(|item| {
        let (first, second): (&str, &str) = match &item.kind {
            Kind::System { text } | Kind::Text { text, .. } | Kind::Thinking { text } => (text, ""),
            Kind::ToolCall { name, arguments, .. } => (name, arguments),
            Kind::ToolResult { text, .. } => (text, ""),
            Kind::Attachment => ("", ""),
            Kind::Other { raw } => (raw, ""),
        };
        [first, second]
    });
    items.chain(parsed.tools).chain(parsed.top_system.iter().map(|s| s.as_ref()))
}

fn scale(tokens: u32, factor: f32) -> u32 {
    (f64::from(tokens) * f64::from(factor)).round() as u32
}

#[cfg(test)]
mod tests;
