//! The engine's two jobs, shared by the request path and the work done off it (a summary
//! prepared in the background, a prefill of a prepared summary), so that all of them do them the
//! same way:
//! - the body a request goes as ([`Engine::derive`]): the record its state carries re-applied
//!   (the summary and the kept tail rebuilt as the client's dialect), then the rewrite's
//!   policies with the conversation's history;
//! - one compaction ([`Engine::compact`]): find the cut (nothing to summarize means no lock, no
//!   call), take the conversation's lock (or wait for the request of the same conversation that
//!   holds it), summarize the older part of the conversation, build the record that replaces it,
//!   and publish the record before the lock is released.

use std::time::Duration;

use bytes::Bytes;

use super::budget::Pressure;
use super::decision::{BackgroundOutcome, CompactionOutcome, Trigger};
use super::lock::{self, ConversationLock, Waited};
use super::request::RequestState;
use super::summarizer::{Summarizer, Summary, SummaryError, SummaryInput};
use super::{budget, plan};
use crate::config::compaction::CompactionSettings;
use crate::dialect::ParsedRequest;
use crate::rewrite::{Estimated, History, ProviderTokens, RewriteReport, RewriteSettings, Rewriter};
use crate::session::SessionCtx;
use crate::session::state::CompactionRecord;
use crate::telemetry::metric;
use crate::tokens::ModelInfo;
use crate::upstream::RequestHead;
use crate::work;

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub enum NoCompaction {
    #[error("nothing left to summarize")]
    NothingToSummarize,
    #[error("another request of this conversation is compacting it")]
    Busy,
    #[error("summary call failed")]
    SummaryFailed(#[source] SummaryError),
    #[error("stopped")]
    Stopped(#[source] crate::work::Stopped),
}

/// The engine's parts, borrowed from the [`super::Compactor`] (or owned by the work done off a
/// request's path) for one derivation or compaction.
pub(super) struct Engine<'c> {
    pub settings: &'c CompactionSettings,
    pub rewriter: &'c Rewriter,
    pub summarizer: &'c Summarizer,
}

/// How big a compaction's parts may be, from the request's window pressure.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizing {
    pub pressure: Pressure,
    /// The part of the prompt no compaction shrinks (system, tools, the summary it carries), in
    /// the provider's tokens.
    pub fixed: ProviderTokens,
    /// For a summary prepared in the background: how much the client's history grows (compactor's
    /// tokens, whole turns) before its record applies. The tail kept verbatim is that much
    /// shorter, so that when the record applies the tail has grown back to what a compaction at
    /// that request keeps: the same rebuild, not one a turn or two longer that passes the
    /// threshold again sooner and costs another summary call.
    pub due_in: Estimated,
}

/// What one compaction did.
#[derive(Debug, Clone)]
pub(super) struct Summarized {
    pub record: CompactionRecord,
    /// Time spent in summary calls (zero when another request's record was reused).
    pub summary_time: Duration,
    /// Summary calls made (zero when another request's record was reused).
    pub summary_calls: u32,
}

/// The summary call of one compaction: the summarizing model, its window (compactor's raw
/// tokens) and the summary's budget.
struct SummaryCall {
    model: String,
    window: u32,
    max_tokens: u32,
    /// The request's own model summarizes (no `compaction.model`).
    own_model: bool,
    /// In front of a local server (the `local` cache preset).
    local: bool,
}

/// Where the client's conversation is cut: it is counted, and `cut` is the first message kept.
struct Cut<'b> {
    parsed: ParsedRequest<'b>,
    model: ModelInfo,
    /// The first message the summary covers (after the previous record's part).
    from: usize,
    cut: usize,
    user_budget: u32,
    /// The harder rung: a quarter of the tail kept, user messages capped.
    harder: bool,
    sizing: Sizing,
}

impl Engine<'_> {
    /// Summarizes the older history in a separate tool-less call and publishes the record. One
    /// compaction per conversation at a time: a request that finds its conversation's lock taken
    /// waits for the holder's record and reuses it; other conversations of the session have
    /// their own locks and never wait for this one. `due_tokens` > 0: a summary prepared in the
    /// background, foreseen to be needed at that size of the client's history; it never waits
    /// for the lock (a compaction under way makes it give up, [`NoCompaction::Busy`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn compact(
        &self,
        head: &RequestHead,
        request: &RequestState,
        ctx: &mut SessionCtx,
        harder: bool,
        trigger: Trigger,
        sizing: Sizing,
        due_tokens: u64,
    ) -> Result<Summarized, NoCompaction> {
        let cut = self.cut(request, harder, &sizing).await?;
        let hold = self.settings.lock_lease;
        let lock = match ConversationLock::claim(ctx, hold).await {
            Some(lock) => lock,
            None if due_tokens > 0 => return Err(NoCompaction::Busy),
            None => match lock::await_winner(ctx, &cut.parsed, self.settings.lock_wait).await {
                Waited::Record(record) => {
                    return Ok(Summarized { record: *record, summary_time: Duration::ZERO, summary_calls: 0 });
                }
                Waited::TimedOut => return Err(NoCompaction::Busy),
                // The holder finished without a record for this history: summarize it here,
                // unless the holder's failures opened the conversation's breaker.
                Waited::Released => {
                    if budget::breaker_open(self.settings, &ctx.conversation().breaker, request.message_count) {
                        return Err(NoCompaction::Busy);
                    }
                    ConversationLock::claim(ctx, hold).await.ok_or(NoCompaction::Busy)?
                }
            },
        };
        // The generation is taken under the lock from the stored state: a compaction another
        // request finished since this one loaded is either reused or followed.
        if let Some(record) = lock::fresh_record(ctx, &cut.parsed).await {
            lock.release(ctx).await;
            return Ok(Summarized { record, summary_time: Duration::ZERO, summary_calls: 0 });
        }
        let applied = request.compacted().unwrap_or(0);
        if due_tokens > 0 && ctx.conversation().compactions.iter().any(|r| r.generation > applied) {
            // A record newer than the one the starting request applied was stored before this
            // job loaded (another job's, prepared for the same crossing): it waits, or applies.
            // A second summary here would be a call for nothing, and a staler record later.
            lock.release(ctx).await;
            return Err(NoCompaction::Busy);
        }
        let generation = ctx.conversation().compactions.iter().map(|r| r.generation).max().unwrap_or(0) + 1;
        let summarizing = self.summarize(head, request, ctx, &cut, trigger, generation);
        let mut result = lock.renewing(ctx, self.settings.lock_lease, summarizing).await;
        if let Ok(Summarized { record, .. }) = &mut result {
            record.due_tokens = due_tokens;
        }
        // Published before the lock goes: the requests waiting for it look for this record.
        match &result {
            Ok(Summarized { record, summary_time, summary_calls }) => {
                if due_tokens == 0 {
                    // A summary prepared in the background that no request applied: replaced.
                    let compactions = &ctx.conversation().compactions;
                    for unneeded in compactions.iter().filter(|r| r.due_tokens > 0 && r.generation > applied) {
                        let label = BackgroundOutcome::Unneeded.label();
                        metric::background_summary(label);
                        metric::background_summary_tokens(label, unneeded.cost.input, unneeded.cost.output);
                    }
                }
                if ctx.publish_compaction(record).await
                    && let Some(winner) = lock::fenced(ctx, record, &cut.parsed).await
                {
                    let (summary_time, summary_calls) = (*summary_time, *summary_calls);
                    result = Ok(Summarized { record: winner, summary_time, summary_calls });
                }
            }
            Err(NoCompaction::SummaryFailed(_)) => {
                ctx.publish_failure(request.message_count).await;
            }
            Err(_) => {}
        }
        lock.release(ctx).await;
        let outcome = if result.is_ok() { CompactionOutcome::Summarized } else { CompactionOutcome::Failed };
        metric::compaction(trigger.label(), outcome.label());
        result
    }

    /// Where to cut the client's conversation: about `keep_recent_tokens` from the end (a quarter
    /// on the harder rung), after what the applied record already covers.
    async fn cut<'b>(&self, request: &'b RequestState, harder: bool, sizing: &Sizing) -> Result<Cut<'b>, NoCompaction> {
        let mut parsed = request.parse(&request.client_body).ok_or(NoCompaction::NothingToSummarize)?;
        let model = self.rewriter.count(&mut parsed).await.map_err(NoCompaction::Stopped)?;
        let after = request.record.as_ref().map_or(0, |r| r.covered_messages as usize);
        let (keep, user_budget) = budget::kept_sizes(self.settings, &sizing.pressure, sizing.fixed, harder);
        let previous = after.max(parsed.lead()).saturating_sub(1).max(after);
        let due_in = sizing.due_in.as_u32();
        // A record that applies turns from now keeps, when it applies, what it keeps now and the
        // turns added by then: it keeps that much less now. When those turns alone are as much as
        // a compaction keeps, it summarizes the whole conversation and they are its tail.
        let cut = match due_in {
            0 => plan::choose_cut(&parsed, keep, previous),
            ahead if ahead < keep => plan::choose_cut(&parsed, keep - ahead, previous),
            _ => plan::cut_at_end(&parsed, previous).or_else(|| plan::choose_cut(&parsed, keep / 4, previous)),
        }
        .ok_or(NoCompaction::NothingToSummarize)?;
        let from = after.max(parsed.lead());
        Ok(Cut { parsed, model, from, cut, user_budget, harder, sizing: *sizing })
    }

    /// The new record: the summary of what comes before the cut, the user's own messages kept
    /// from it, and the sizes before and after.
    async fn summarize(
        &self,
        head: &RequestHead,
        request: &RequestState,
        ctx: &SessionCtx,
        cut: &Cut<'_>,
        trigger: Trigger,
        generation: u32,
    ) -> Result<Summarized, NoCompaction> {
        let settings = self.settings;
        let cut_at = cut;
        let Cut { parsed, model, cut, user_budget, harder, sizing, .. } = cut;
        let (model, cut, harder) = (*model, *cut, *harder);
        let count = |text: &str| self.rewriter.counter.count(model.encoding, text);
        let previous = request.record.as_ref();
        let call = self.summary_call(request, ctx, parsed, &sizing.pressure, trigger);
        let summary = self.call_summarizer(head, request, cut_at, &call, &count).await?;
        let summary_time = summary.elapsed;
        let (calls, overflows, cost) = (summary.calls, summary.overflows, summary.cost);
        let summary = summary.text;
        let mut record = CompactionRecord {
            generation,
            summary,
            covered_messages: cut as u64,
            covered_hash: plan::prefix_hash(parsed, cut),
            first_kept: cut as u64,
            user_messages: plan::user_messages(parsed, cut, *user_budget),
            truncate_user_tokens: budget::user_message_cap(settings, harder),
            tokens_before: u64::from(Rewriter::scaled(parsed.conversation.tokens_before(), model)),
            tokens_after: 0,
            trigger: trigger.label().to_string(),
            model: call.model,
            at_unix_ms: crate::session::unix_ms(),
            due_tokens: 0,
            cost,
            started_by: request.request_id.clone(),
            built_on: previous.map_or(0, |r| r.generation),
            us_per_token: u64::try_from(summary_time.as_micros())
                .unwrap_or(u64::MAX)
                .checked_div(cost.output)
                .unwrap_or(0),
        };
        if let Some(rebuilt) = plan::rebuild(parsed, &record, &settings.summary_prefix, &count)
            && let Some(mut after) = request.parse(&rebuilt)
        {
            self.rewriter.count_items(&mut after, model.encoding);
            record.tokens_after = u64::from(Rewriter::scaled(after.conversation.tokens_before(), model));
        }
        tracing::info!(
            session = %ctx.key().as_str(),
            conversation = %ctx.conversation_id(),
            trigger = %trigger.label(),
            generation,
            tokens_before = record.tokens_before,
            tokens_after = record.tokens_after,
            covered_messages = cut,
            summary_calls = calls,
            summary_overflows = overflows,
            summary_ms = summary_time.as_millis() as u64,
            summary_max_tokens = call.max_tokens,
            summary_output_tokens = cost.output,
            idle_ms = ctx.conversation().idle_ms,
            "compacted"
        );
        metric::summary_calls_per_compaction(calls);
        Ok(Summarized { record, summary_time, summary_calls: calls })
    }

    /// Who summarizes, in how large a window, and how long a summary may be.
    fn summary_call(
        &self,
        request: &RequestState,
        ctx: &SessionCtx,
        parsed: &ParsedRequest<'_>,
        pressure: &Pressure,
        trigger: Trigger,
    ) -> SummaryCall {
        let settings = self.settings;
        let model = match settings.model.as_str() {
            "" => parsed.model.as_deref().unwrap_or("").to_string(),
            configured => configured.to_string(),
        };
        let summarizer = self.rewriter.models.lookup(&model);
        // Without `compaction.model` the request's own model summarizes: its window is the one
        // learned for the session, not the model table's.
        let own_model = settings.model.is_empty();
        let window = budget::summarizer_window(summarizer, own_model.then_some(pressure));
        // A local server (the `local` cache preset: prefill time is the price) generates the
        // summary while the agent waits, and caches the conversation as it was last sent.
        let local = request.cache.preset == Some("local");
        let mut max_tokens = budget::summary_max_tokens(settings, summarizer, window, local);
        if local && trigger == Trigger::Background {
            // Written while the agent's tool runs: no longer than the server writes in that time.
            let conversation = ctx.conversation();
            let pace = conversation.summary_pace_us().unwrap_or(0);
            max_tokens = budget::paced_summary_tokens(settings, max_tokens, window, conversation.idle_ms, pace);
        }
        SummaryCall { model, window, max_tokens, own_model, local }
    }

    /// The summary of the messages before the cut: the conversation as it was last sent with the
    /// instruction appended, when that is how it is summarized, else the transcript (a rolling
    /// summary when it is larger than the window).
    async fn call_summarizer(
        &self,
        head: &RequestHead,
        request: &RequestState,
        cut: &Cut<'_>,
        call: &SummaryCall,
        count: &(dyn Fn(&str) -> u32 + Sync),
    ) -> Result<Summary, NoCompaction> {
        let parsed = &cut.parsed;
        // Prepared in the background for a local server, by the request's own model, in Chat: the
        // conversation as it was last sent, the instruction appended, so the server reads it from
        // its cache. A call that fails goes the usual way.
        let appended = match &request.sent_body {
            Some(sent)
                if call.own_model && call.local && parsed.dialect == crate::dialect::Dialect::ChatCompletions =>
            {
                self.summarizer.summarize_appended(head, sent, &call.model, call.max_tokens).await
            }
            _ => None,
        };
        if let Some(Ok(summary)) = appended {
            return Ok(summary);
        }
        let input = SummaryInput {
            parsed,
            from: cut.from,
            cut: cut.cut,
            previous: request.record.as_ref().map(|r| r.summary.as_str()),
            model: &call.model,
            max_tokens: call.max_tokens,
            budget: budget::transcript_budget(call.window, call.max_tokens, self.summarizer.prompt_tokens(count)),
            count,
        };
        self.summarizer.summarize(head, input).await.map_err(NoCompaction::SummaryFailed)
    }
}

impl Engine<'_> {
    /// The body to send for the client's request: the request's record re-applied, then the
    /// rewrite policies with `settings`; `pressure`: the window needs room, so old content is
    /// rewritten whatever it costs the prompt cache.
    pub(super) async fn derive(
        &self,
        request: &RequestState,
        ctx: &SessionCtx,
        settings: &RewriteSettings,
        pressure: bool,
    ) -> Option<(Bytes, RewriteReport)> {
        self.derive_from(request, ctx, settings, None, pressure).await
    }

    /// [`Engine::derive`] reusing the client's request when the caller already parsed it.
    pub(super) async fn derive_from<'c>(
        &self,
        request: &'c RequestState,
        ctx: &SessionCtx,
        settings: &RewriteSettings,
        client: Option<ParsedRequest<'c>>,
        pressure: bool,
    ) -> Option<(Bytes, RewriteReport)> {
        let mut client = match client {
            Some(parsed) => parsed,
            None => work::step(|| request.parse(&request.client_body)).await.ok()??,
        };
        // In front of a local server, protection and batches within the window: a small one masks
        // old outputs before it pays for a summary the server itself would have to generate.
        // Elsewhere a summary keeps what the outputs said, for a model that bills no prefill time.
        let windowed = request.cache.is_local().then(|| {
            let table = self.rewriter.models.lookup(client.model.as_deref().unwrap_or("")).context_window;
            settings.prune.within(budget::window(ctx.learned(), table))
        });
        let windowed = windowed.flatten().map(|prune| RewriteSettings { prune, ..settings.clone() });
        let settings = windowed.as_ref().unwrap_or(settings);
        let conversation = ctx.conversation();
        // What the provider saw: the previous request's messages, as the client counts them.
        let seen_by_client = usize::try_from(conversation.messages).unwrap_or(usize::MAX);
        let prune = &settings.prune;
        let later_turns = ctx.later_turns(request.cache.lifetime, prune.payback_confidence, &prune.assumed_runs);
        let history = |seen_messages: usize| History {
            pruned_before: &conversation.pruned,
            seen_messages,
            pricing: request.cache,
            later_turns,
            idle: ctx.idle(),
            pressure,
        };
        let Some(record) = &request.record else {
            let history = history(seen_by_client);
            let mut rewritten = self.rewriter.rewrite_with(&mut client, &history, settings).await.ok()?;
            let body = rewritten.body.take().map(Bytes::from).unwrap_or_else(|| request.client_body.clone());
            return Some((body, rewritten.report));
        };
        // The client sent more than goes out: "before" counts the client's whole history.
        let model = self.rewriter.count(&mut client).await.ok()?;
        let tokens_before = Rewriter::scaled(client.conversation.tokens_before(), model);
        let count = |text: &str| self.rewriter.counter.count(model.encoding, text);
        let rebuild = || plan::rebuild(&client, record, &self.settings.summary_prefix, &count);
        let rebuilt = work::step(rebuild).await.ok()??;
        // Counting the turns the summary stands for, the kept calls keep the client's ids.
        let summarized = plan::summarized_turns(&client, record);
        let mut parsed = work::step(|| request.parse_rebuilt(&rebuilt, summarized)).await.ok()??;
        // The client's newest messages end the rebuilt conversation too.
        let added = client.messages.len().saturating_sub(seen_by_client);
        let history = history(parsed.messages.len().saturating_sub(added));
        let mut rewritten = self.rewriter.rewrite_with(&mut parsed, &history, settings).await.ok()?;
        rewritten.report.tokens_before = tokens_before;
        rewritten.report.message_count = client.messages.len();
        rewritten.report.compaction = record.generation;
        let body = rewritten.body.take().unwrap_or_else(|| rebuilt.clone());
        Some((Bytes::from(body), rewritten.report))
    }
}
