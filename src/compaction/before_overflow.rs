//! A compaction before the overflow, on the request's path: when the conversation's estimate
//! passes the compaction threshold (and a compaction there is worth its summary call), or an
//! operator asked for one (the admin API). A summary prepared in the background is applied
//! first, with no summary call; else prune harder, and summarize when that is not enough.

use tracing::Instrument;

use super::budget;
use super::decision::{CompactionOutcome, Trigger};
use super::engine::{NoCompaction, Summarized};
use super::prepare::Derived;
use super::request::RequestState;
use super::{Compactor, count_used, with_summary_break};
use crate::boxed::boxed;
use crate::error::Chain;
use crate::rewrite::{ProviderTokens, Reason, RewriteReport};
use crate::session::SessionCtx;
use crate::telemetry::metric;
use crate::upstream::RequestHead;

/// A compaction before the overflow that is due ([`Compactor::due`]).
pub(super) struct Due {
    requested: bool,
    prefilled: bool,
    pressure: budget::Pressure,
    prompt: ProviderTokens,
}

impl Compactor {
    /// Whether a compaction before the overflow is due for `derived`: `Err` with whether an
    /// operator asked when it is not (most requests), told without entering the compaction's
    /// future; `Ok` with what [`Compactor::compact_if_due`] goes on from.
    pub(super) fn due(&self, state: &RequestState, ctx: &SessionCtx, derived: &Derived) -> Result<Due, bool> {
        let requested = ctx.session().counters.compact_requested > 0;
        // The server's cache holds the prompt rebuilt around the ready record (a prefill of the
        // prepared summary): applying it now extends that prefix, not applying it re-prefills the
        // lot.
        let prefilled = state.ready.as_ref().is_some_and(|ready| ready.generation == ctx.conversation().prefilled);
        let pressure = self.pressure(ctx, &derived.1);
        let prompt = budget::prompt_tokens(&pressure, ctx.conversation(), state.message_count, &derived.1, true);
        if !(requested || prefilled || prompt > pressure.budget()) {
            return Err(requested);
        }
        Ok(Due { requested, prefilled, pressure, prompt })
    }

    /// Compacts `derived` before it goes, a compaction being [`due`](Compactor::due), when it is
    /// worth its call; whether an operator asked (the admin API's request belongs to the session:
    /// the first of its conversations with something to summarize answers it).
    pub(super) async fn compact_if_due(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        derived: &mut Derived,
        rewrite: &tracing::Span,
        due: Due,
    ) -> bool {
        let Due { requested, prefilled, pressure, prompt } = due;
        let report = &derived.1;
        let trigger = if requested { Trigger::Admin } else { Trigger::Threshold };
        // A compaction is worth its summary call only when what it leaves, and two more turns,
        // land under the budget; when they cannot (the fixed part leaves room for a turn or two),
        // only a request that would overflow is compacted: the rebuild is the same, a turn or
        // more later, so the session pays fewer summary calls.
        let worth = requested
            || prefilled
            || prompt > pressure.limit()
            || self.frees_room(state, &pressure, report, ctx.conversation());
        if !worth {
            metric::futile_compaction_avoided();
            tracing::debug!(
                session = %ctx.key().as_str(),
                prompt = prompt.get(),
                budget = pressure.budget().get(),
                "compaction ahead of time skipped: it would not leave room for the next turns under the budget"
            );
            return requested;
        }
        if !requested && let Some(applied) = boxed(|| self.apply_ready(state, ctx)).instrument(rewrite.clone()).await {
            *derived = applied;
            if self.fits(ctx, &derived.1) {
                return requested;
            }
            // A conversation that jumped past what the ready record was prepared for: summarized
            // further on top of it now, not after an overflow.
        }
        let compacting = boxed(|| self.compact_before_overflow(head, state, ctx, trigger, &derived.1));
        if let Some(compacted) = compacting.instrument(rewrite.clone()).await {
            *derived = compacted;
        }
        requested
    }

    /// Compacts before forwarding (threshold or admin request): prune harder first, summarize when
    /// that is not enough. `None` when nothing better than `report`'s body came of it.
    async fn compact_before_overflow(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        trigger: Trigger,
        report: &RewriteReport,
    ) -> Option<Derived> {
        let mut best = None;
        // In front of a local server masking comes first whatever the ladder's order: a summary
        // there is generated by the server the agent waits for, a placeholder costs nothing.
        if trigger == Trigger::Threshold
            && self.rewriter.settings.prune_enabled
            && (self.settings.prunes_before_summarizing() || state.cache.is_local())
            && let Some((body, hard)) = self.engine().derive(state, ctx, &self.hard_settings(), true).await
        {
            let pressure = self.pressure(ctx, &hard);
            if !budget::over_threshold(&pressure, ctx.conversation(), state.message_count, &hard, false) {
                metric::compaction(trigger.label(), CompactionOutcome::Pruned.label());
                return Some((body, hard));
            }
            best = Some((body, hard));
        }
        let sizing = self.sizing(state, ctx, report);
        for harder in [false, true] {
            // Boxed: see the overflow rung.
            match Box::pin(self.engine().compact(head, state, ctx, harder, trigger, sizing, 0)).await {
                Ok(Summarized { record, summary_time, summary_calls }) => {
                    state.trace.summary += summary_time;
                    state.trace.summary_calls += summary_calls;
                    state.record = Some(record);
                    // Everything after the summary is new to the provider: prune as under pressure.
                    let derived =
                        self.engine().derive(state, ctx, &self.rewriter.settings, true).await.map(with_summary_break);
                    let Some(derived) = derived else { break };
                    // A rebuild already estimated to overflow is not what goes out: summarize
                    // harder (a quarter of the tail kept) once.
                    let fits = self.fits(ctx, &derived.1);
                    best = Some(derived);
                    if fits {
                        break;
                    }
                }
                // A conversation with nothing to summarize (a title request, a young subagent)
                // leaves the admin API's request for the next one that has.
                Err(NoCompaction::NothingToSummarize) => break,
                Err(error) => {
                    tracing::warn!(
                        error = %Chain(&error),
                        session = %ctx.key().as_str(),
                        conversation = %ctx.conversation_id(),
                        tokens = report.tokens_after,
                        "compaction ahead of time failed"
                    );
                    break;
                }
            }
        }
        best
    }

    /// Applies the summary prepared in the background that this request held back (its
    /// `state.ready`): the body rebuilt around it, as after a compaction, with no summary call.
    /// `None` (and nothing changed) when there is none or the rebuild fails.
    pub(super) async fn apply_ready(&self, state: &mut RequestState, ctx: &SessionCtx) -> Option<Derived> {
        let ready = state.ready.take()?;
        let before = state.record.replace(ready);
        // Everything after the summary is new to the provider: prune as under pressure.
        match self.engine().derive(state, ctx, &self.rewriter.settings, true).await {
            Some(derived) => {
                if let Some(ready) = &state.record {
                    count_used(ready);
                }
                metric::prefix_break(Reason::Summary.label());
                Some(with_summary_break(derived))
            }
            None => {
                state.ready = std::mem::replace(&mut state.record, before);
                None
            }
        }
    }
}
