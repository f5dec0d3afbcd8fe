//! One compaction: find the cut (nothing to summarize means no lock, no call), take the
//! conversation's lock (or wait for the request of the same conversation that holds it), summarize
//! the older part of the conversation, build the record that replaces it, and publish the record
//! before the lock is released.

use std::time::Duration;

use super::budget::Pressure;
use super::ladder::Ladder;
use super::lock::{self, CompactionLock, Waited};
use super::summarizer::{Summarizer, SummaryError, SummaryInput};
use super::{budget, plan};
use crate::config::compaction::CompactionSettings;
use crate::dialect::ParsedRequest;
use crate::rewrite::Rewriter;
use crate::session::SessionCtx;
use crate::session::state::CompactionRecord;
use crate::telemetry::metric;
use crate::tokens::ModelInfo;
use crate::upstream::RequestHead;

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error("nothing left to summarize")]
    NothingToSummarize,
    #[error("another request of this conversation is compacting it")]
    Busy,
    #[error("summary call failed")]
    SummaryFailed(#[source] SummaryError),
    #[error("stopped")]
    Stopped(#[source] crate::work::Stopped),
}

/// What one compaction needs, borrowed from the [`super::Compactor`].
pub(super) struct Compaction<'c> {
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
    pub fixed: u64,
    /// For a summary prepared in the background: how much the client's history grows (compactor's
    /// tokens, whole turns) before its record applies. The tail kept verbatim is that much
    /// shorter, so that when the record applies the tail has grown back to what a compaction at
    /// that request keeps: the same rebuild, not one a turn or two longer that passes the
    /// threshold again sooner and costs another summary call.
    pub due_in: u64,
}

/// What one compaction did.
#[derive(Debug, Clone)]
pub(super) struct Compacted {
    pub record: CompactionRecord,
    /// Time spent in summary calls (zero when another request's record was reused).
    pub summary_time: Duration,
    /// Summary calls made (zero when another request's record was reused).
    pub summary_calls: u32,
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

impl Compaction<'_> {
    /// Summarizes the older history in a separate tool-less call and publishes the record. One
    /// compaction per conversation at a time: a request that finds its conversation's lock taken
    /// waits for the holder's record and reuses it; other conversations of the session have
    /// their own locks and never wait for this one. `due_tokens` > 0: a summary prepared in the
    /// background, foreseen to be needed at that size of the client's history; it never waits
    /// for the lock (a compaction under way makes it give up, [`CompactError::Busy`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run(
        &self,
        head: &RequestHead,
        ladder: &Ladder,
        ctx: &mut SessionCtx,
        harder: bool,
        trigger: &'static str,
        sizing: Sizing,
        due_tokens: u64,
    ) -> Result<Compacted, CompactError> {
        let cut = self.cut(ladder, harder, &sizing).await?;
        let hold = self.settings.lock_lease;
        let lock = match CompactionLock::claim(ctx, hold).await {
            Some(lock) => lock,
            None if due_tokens > 0 => return Err(CompactError::Busy),
            None => match lock::await_winner(ctx, &cut.parsed, self.settings.lock_wait).await {
                Waited::Record(record) => {
                    return Ok(Compacted { record: *record, summary_time: Duration::ZERO, summary_calls: 0 });
                }
                Waited::TimedOut => return Err(CompactError::Busy),
                // The holder finished without a record for this history: summarize it here,
                // unless the holder's failures opened the conversation's breaker.
                Waited::Released => {
                    if budget::breaker_open(self.settings, &ctx.conversation().breaker, ladder.message_count) {
                        return Err(CompactError::Busy);
                    }
                    CompactionLock::claim(ctx, hold).await.ok_or(CompactError::Busy)?
                }
            },
        };
        // The generation is taken under the lock from the stored state: a compaction another
        // request finished since this one loaded is either reused or followed.
        if let Some(record) = lock::fresh_record(ctx, &cut.parsed).await {
            lock.release(ctx).await;
            return Ok(Compacted { record, summary_time: Duration::ZERO, summary_calls: 0 });
        }
        let applied = ladder.compacted().unwrap_or(0);
        if due_tokens > 0 && ctx.conversation().compactions.iter().any(|r| r.generation > applied) {
            // A record newer than the one the starting request applied was stored before this
            // job loaded (another job's, prepared for the same crossing): it waits, or applies.
            // A second summary here would be a call for nothing, and a staler record later.
            lock.release(ctx).await;
            return Err(CompactError::Busy);
        }
        let generation = ctx.conversation().compactions.iter().map(|r| r.generation).max().unwrap_or(0) + 1;
        let summarizing = self.summarize(head, ladder, ctx, &cut, trigger, generation);
        let mut result = lock.renewing(ctx, self.settings.lock_lease, summarizing).await;
        if let Ok(Compacted { record, .. }) = &mut result {
            record.due_tokens = due_tokens;
        }
        // Published before the lock goes: the requests waiting for it look for this record.
        match &result {
            Ok(Compacted { record, summary_time, summary_calls }) => {
                if due_tokens == 0 {
                    // A summary prepared in the background that no request applied: replaced.
                    let compactions = &ctx.conversation().compactions;
                    for unneeded in compactions.iter().filter(|r| r.due_tokens > 0 && r.generation > applied) {
                        metric::background_summary("unneeded");
                        metric::background_summary_tokens("unneeded", unneeded.cost.input, unneeded.cost.output);
                    }
                }
                if ctx.publish_compaction(record).await
                    && let Some(winner) = lock::fenced(ctx, record, &cut.parsed).await
                {
                    let (summary_time, summary_calls) = (*summary_time, *summary_calls);
                    result = Ok(Compacted { record: winner, summary_time, summary_calls });
                }
            }
            Err(CompactError::SummaryFailed(_)) => {
                ctx.publish_failure(ladder.message_count).await;
            }
            Err(_) => {}
        }
        lock.release(ctx).await;
        metric::compaction(trigger, if result.is_ok() { "summarized" } else { "failed" });
        result
    }

    /// Where to cut the client's conversation: about `keep_recent_tokens` from the end (a quarter
    /// on the harder rung), after what the applied record already covers.
    async fn cut<'b>(&self, ladder: &'b Ladder, harder: bool, sizing: &Sizing) -> Result<Cut<'b>, CompactError> {
        let mut parsed = ladder.parse(&ladder.client_body).ok_or(CompactError::NothingToSummarize)?;
        let model = self.rewriter.count(&mut parsed).await.map_err(CompactError::Stopped)?;
        let after = ladder.record.as_ref().map_or(0, |r| r.covered_messages as usize);
        let (keep, user_budget) = budget::kept_sizes(self.settings, &sizing.pressure, sizing.fixed, harder);
        let previous = after.max(parsed.lead()).saturating_sub(1).max(after);
        let due_in = u32::try_from(sizing.due_in).unwrap_or(u32::MAX);
        // A record that applies turns from now keeps, when it applies, what it keeps now and the
        // turns added by then: it keeps that much less now. When those turns alone are as much as
        // a compaction keeps, it summarizes the whole conversation and they are its tail.
        let cut = match due_in {
            0 => plan::choose_cut(&parsed, keep, previous),
            ahead if ahead < keep => plan::choose_cut(&parsed, keep - ahead, previous),
            _ => plan::cut_at_end(&parsed, previous).or_else(|| plan::choose_cut(&parsed, keep / 4, previous)),
        }
        .ok_or(CompactError::NothingToSummarize)?;
        let from = after.max(parsed.lead());
        Ok(Cut { parsed, model, from, cut, user_budget, harder, sizing: *sizing })
    }

    /// The new record: the summary of what comes before the cut, the user's own messages kept
    /// from it, and the sizes before and after.
    async fn summarize(
        &self,
        head: &RequestHead,
        ladder: &Ladder,
        ctx: &SessionCtx,
        cut: &Cut<'_>,
        trigger: &'static str,
        generation: u32,
    ) -> Result<Compacted, CompactError> {
        let settings = self.settings;
        let Cut { parsed, model, from, cut, user_budget, harder, sizing } = cut;
        let (model, cut, harder) = (*model, *cut, *harder);
        let count = |text: &str| self.rewriter.counter.count(model.encoding, text);
        let previous = ladder.record.as_ref();
        let summary_model = match settings.model.as_str() {
            "" => parsed.model.as_deref().unwrap_or("").to_string(),
            configured => configured.to_string(),
        };
        let summarizer = self.rewriter.models.lookup(&summary_model);
        // Without `compaction.model` the request's own model summarizes: its window is the one
        // learned for the session, not the model table's.
        let own_model = settings.model.is_empty();
        let window = budget::summarizer_window(summarizer, own_model.then_some(&sizing.pressure));
        // A local server (the `local` cache preset: prefill time is the price) generates the
        // summary while the agent waits, and caches the conversation as it was last sent.
        let local = ladder.cache.preset == Some("local");
        let mut max_tokens = budget::summary_max_tokens(settings, summarizer, window, local);
        if local && trigger == "background" {
            // Written while the agent's tool runs: no longer than the server writes in that time.
            let conversation = ctx.conversation();
            let pace = conversation.summary_pace_us().unwrap_or(0);
            max_tokens = budget::paced_summary_tokens(settings, max_tokens, window, conversation.idle_ms, pace);
        }
        let input = SummaryInput {
            parsed,
            from: *from,
            cut,
            previous: previous.map(|r| r.summary.as_str()),
            model: &summary_model,
            max_tokens,
            budget: budget::transcript_budget(window, max_tokens, self.summarizer.prompt_tokens(&count)),
            count: &count,
        };
        // Prepared in the background for a local server, by the request's own model, in Chat: the
        // conversation as it was last sent, the instruction appended, so the server reads it from
        // its cache. A call that fails goes the usual way.
        let appended = match &ladder.sent_body {
            Some(sent) if own_model && local && parsed.dialect == crate::dialect::Dialect::ChatCompletions => {
                self.summarizer.summarize_appended(head, sent, &summary_model, max_tokens).await
            }
            _ => None,
        };
        let summary = match appended {
            Some(Ok(summary)) => summary,
            _ => self.summarizer.summarize(head, input).await.map_err(CompactError::SummaryFailed)?,
        };
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
            trigger: trigger.to_string(),
            model: summary_model,
            at_unix_ms: crate::session::unix_ms(),
            due_tokens: 0,
            cost,
            started_by: ladder.request_id.clone(),
            built_on: previous.map_or(0, |r| r.generation),
            us_per_token: u64::try_from(summary_time.as_micros())
                .unwrap_or(u64::MAX)
                .checked_div(cost.output)
                .unwrap_or(0),
        };
        if let Some(rebuilt) = plan::rebuild(parsed, &record, &settings.summary_prefix, &count)
            && let Some(mut after) = ladder.parse(&rebuilt)
        {
            self.rewriter.count_items(&mut after, model.encoding);
            record.tokens_after = u64::from(Rewriter::scaled(after.conversation.tokens_before(), model));
        }
        tracing::info!(
            session = %ctx.key().as_str(),
            conversation = %ctx.conversation_id(),
            trigger = %trigger,
            generation,
            tokens_before = record.tokens_before,
            tokens_after = record.tokens_after,
            covered_messages = cut,
            summary_calls = calls,
            summary_overflows = overflows,
            summary_ms = summary_time.as_millis() as u64,
            summary_max_tokens = max_tokens,
            summary_output_tokens = cost.output,
            idle_ms = ctx.conversation().idle_ms,
            "compacted"
        );
        metric::summary_calls_per_compaction(calls);
        Ok(Compacted { record, summary_time, summary_calls: calls })
    }
}
