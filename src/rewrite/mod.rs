//! The rewrite stage: parse, count, then truncate, dedupe, prune and repair on the neutral view,
//! and render only what changed.

pub mod dedupe;
pub mod prune;
pub mod repair;
pub mod truncate;

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::conversation::{Conversation, FRAMING_TOKENS, Item, Kind};
use crate::dialect::{Dialect, ParsedRequest};
use crate::tokens::{Encoding, ModelInfo, ModelTable, TokenCounter};
use crate::work::{self, Stopped};

pub use prune::PruneSettings;

/// The policies' settings, from `[prune]`, `[truncate]`, `[repair]` and `[tokens]`.
#[derive(Debug, Clone)]
pub struct RewriteSettings {
    pub prune_enabled: bool,
    pub dedupe: bool,
    pub prune: PruneSettings,
    pub truncate_enabled: bool,
    pub tool_output_max_tokens: u32,
    pub repair_enabled: bool,
    pub image_tokens: u32,
    /// Uncached text above this many bytes is tokenized on a blocking thread.
    pub blocking_tokenize_bytes: usize,
}

/// What the rewrite did to one request.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RewriteReport {
    /// Estimated prompt tokens as the client sent it (vendor factor applied).
    pub tokens_before: u32,
    /// Estimated prompt tokens as forwarded.
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
    pub model: ModelInfo,
    /// Messages in the request as the client sent it.
    pub message_count: usize,
    /// The output budget the client asked for (`max_tokens` and its siblings).
    pub max_tokens: Option<u64>,
    /// Raw tokens of each message as forwarded, for the hybrid estimate.
    pub message_tokens: Vec<u32>,
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

    /// Rewrites a parsed request; `pruned_before` holds the session's earlier pruning decisions.
    /// Each step counts against the request's budget ([`work`]); a spent budget or a client
    /// that left stops it.
    pub async fn rewrite(
        &self,
        parsed: &mut ParsedRequest<'_>,
        pruned_before: &BTreeSet<String>,
    ) -> Result<Rewritten, Stopped> {
        self.rewrite_with(parsed, pruned_before, &self.settings).await
    }

    /// Like [`Rewriter::rewrite`] with other settings (the overflow ladder prunes harder).
    pub async fn rewrite_with(
        &self,
        parsed: &mut ParsedRequest<'_>,
        pruned_before: &BTreeSet<String>,
        settings: &RewriteSettings,
    ) -> Result<Rewritten, Stopped> {
        let model = self.count(parsed).await?;
        work::step(|| self.apply(parsed, model, pruned_before, settings)).await
    }

    /// Counts every item's tokens (tokenizing what the cache lacks on a blocking thread).
    pub async fn count(&self, parsed: &mut ParsedRequest<'_>) -> Result<ModelInfo, Stopped> {
        let model = self.models.lookup(parsed.model.as_deref().unwrap_or(""));
        // The tables load once, at start; a request never waits for them on an async worker.
        crate::tokens::loaded(model.encoding).await;
        self.warm_cache(parsed, model.encoding).await?;
        work::step(|| self.count_items(parsed, model.encoding)).await?;
        Ok(model)
    }

    /// Parses and rewrites in one go, on the calling thread (tests, benchmarks). `None` when the
    /// body is not `dialect`.
    /// Scales a raw count by the model's vendor factor.
    pub fn scaled(tokens: u32, model: ModelInfo) -> u32 {
        scale(tokens, model.token_factor)
    }

    pub fn rewrite_body(&self, dialect: Dialect, body: &[u8], pruned_before: &BTreeSet<String>) -> Option<Rewritten> {
        let mut parsed = ParsedRequest::parse(dialect, body)?;
        let model = self.models.lookup(parsed.model.as_deref().unwrap_or(""));
        self.count_items(&mut parsed, model.encoding);
        Some(self.apply(&mut parsed, model, pruned_before, &self.settings))
    }

    /// Runs the policies on a counted request.
    fn apply(
        &self,
        parsed: &mut ParsedRequest,
        model: ModelInfo,
        pruned_before: &BTreeSet<String>,
        settings: &RewriteSettings,
    ) -> Rewritten {
        let encoding = model.encoding;
        let count = |text: &str| self.counter.count(encoding, text);
        let mut report = RewriteReport {
            model,
            message_count: parsed.messages.len(),
            max_tokens: parsed.max_tokens().map(|(_, n)| n),
            ..Default::default()
        };
        let message_count = parsed.messages.len();
        let conversation = &mut parsed.conversation;
        let before = conversation.tokens_before();

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
            report.truncated = truncate::apply(conversation, settings.tool_output_max_tokens, &count);
            step(conversation, &mut report.saved_by_truncate);
        }
        if settings.prune_enabled {
            if settings.dedupe {
                report.deduped = dedupe::apply(conversation);
                step(conversation, &mut report.saved_by_dedupe);
            }
            let pruned = prune::apply(conversation, &settings.prune, pruned_before, &count);
            report.pruned = pruned.count;
            report.pruned_call_ids = pruned.call_ids;
            step(conversation, &mut report.saved_by_prune);
        }
        if settings.repair_enabled {
            // And last, so nothing any policy did can leave a call unpaired.
            report.repaired += repair::apply(conversation);
        }
        let after = conversation.tokens_after(count);
        let mut per_message = vec![FRAMING_TOKENS; message_count];
        for item in &conversation.items {
            if let Some(slot) = per_message.get_mut(item.message) {
                *slot += match &item.edit {
                    crate::conversation::Edit::Keep => item.tokens,
                    crate::conversation::Edit::Replace(text) => count(text) + FRAMING_TOKENS,
                    crate::conversation::Edit::Remove => 0,
                };
            }
        }
        report.message_tokens = per_message;
        report.tokens_before = scale(before, model.token_factor);
        report.tokens_after = scale(after, model.token_factor);
        report.saved_by_truncate = scale(report.saved_by_truncate, model.token_factor);
        report.saved_by_dedupe = scale(report.saved_by_dedupe, model.token_factor);
        report.saved_by_prune = scale(report.saved_by_prune, model.token_factor);
        Rewritten { body: parsed.render(), report }
    }

    /// Tokenizes what the cache has not seen; on a blocking thread when it is a lot, stopping
    /// between texts when the request's budget runs out or its client leaves.
    async fn warm_cache(&self, parsed: &ParsedRequest<'_>, encoding: Encoding) -> Result<(), Stopped> {
        let mut missing: Vec<Arc<str>> = Vec::new();
        let mut missing_bytes = 0;
        let mut note = |text: &str| {
            if !self.counter.is_cached(encoding, text) {
                missing_bytes += text.len();
                missing.push(Arc::from(text));
            }
        };
        for text in countable_texts(parsed) {
            note(text);
        }
        if missing_bytes < self.settings.blocking_tokenize_bytes {
            return Ok(());
        }
        let counter = self.counter.clone();
        let budget = work::current();
        let started = std::time::Instant::now();
        let stop = move || budget.as_ref().is_some_and(|b| b.check(Some(started)).is_err());
        let _ = tokio::task::spawn_blocking(move || counter.warm(encoding, &missing, stop)).await;
        work::charge(started.elapsed());
        match work::current() {
            Some(budget) => budget.check(None),
            None => Ok(()),
        }
    }

    /// Fills in every item's tokens and the conversation's fixed cost.
    pub fn count_items(&self, parsed: &mut ParsedRequest, encoding: Encoding) {
        let count = |text: &str| self.counter.count(encoding, text);
        let image = self.settings.image_tokens;
        for item in &mut parsed.conversation.items {
            item.tokens = item_tokens(item, image, &count);
        }
        let mut fixed = FRAMING_TOKENS * parsed.messages.len() as u32 + 3;
        if let Some(tools) = parsed.tools {
            fixed += count(tools.get());
        }
        // System text outside the history is not an item: policies never touch it.
        for text in &parsed.top_system {
            fixed += count(text) + FRAMING_TOKENS;
        }
        parsed.conversation.fixed_tokens = fixed;
    }
}

fn item_tokens(item: &Item, image_tokens: u32, count: &dyn Fn(&str) -> u32) -> u32 {
    FRAMING_TOKENS
        + match &item.kind {
            Kind::System { text } | Kind::Text { text, .. } | Kind::Thinking { text } => count(text),
            Kind::ToolCall { name, arguments, .. } => count(name) + count(arguments),
            Kind::ToolResult { text, attachments, .. } => count(text) + attachments * image_tokens,
            Kind::Attachment => image_tokens,
            Kind::Other { raw } => count(raw),
        }
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
    items.chain(parsed.tools.map(|t| t.get())).chain(parsed.top_system.iter().map(|s| s.as_ref()))
}

fn scale(tokens: u32, factor: f32) -> u32 {
    (f64::from(tokens) * f64::from(factor)).round() as u32
}
