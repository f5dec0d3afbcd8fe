//! After an overflow ([`Compactor::recover`]): learn what the error says of the window, then
//! the next rung's body, skipping rungs that change nothing and bodies already estimated to
//! overflow, or give up when the retries, the breaker or the rungs are spent.

use bytes::Bytes;

use super::budget;
use super::decision::Trigger;
use super::engine::Summarized;
use super::ladder::{Rung, RungOutcome};
use super::prepare::Derived;
use super::request::RequestState;
use super::{Compactor, Next, with_summary_break};
use crate::error::Chain;
use crate::overflow::Overflow;
use crate::rewrite::{Estimated, Reason, RewriteReport};
use crate::session::SessionCtx;
use crate::telemetry::metric;
use crate::upstream::RequestHead;

impl Compactor {
    /// After an overflow of the body `sent`: the next rung's body, skipping rungs that change
    /// nothing, or give up when the retries, the breaker or the rungs are spent.
    pub async fn recover(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        overflow: &Overflow,
        sent: &Bytes,
    ) -> Next {
        // A stateful chain (not rebuilt yet) has its own rungs: what was sent is not what overflowed.
        let next = if state.stateful.as_ref().is_some_and(|chain| !chain.rebuilt) {
            self.next_stateful(head, state, ctx, overflow).await
        } else {
            self.learn_from_overflow(head, state, ctx, overflow);
            self.next_body(head, state, ctx, overflow, sent).await
        };
        let Some((body, report)) = next else {
            metric::recovery("gave_up");
            let trace = state.recovery();
            tracing::warn!(
                session = %ctx.key().as_str(),
                conversation = %ctx.conversation_id(),
                overflow = %trace.overflow.as_deref().unwrap_or("-"),
                rungs = %trace.rungs(),
                retries = state.retries(),
                "overflow recovery gave up: the client gets the provider's error"
            );
            return Next::GiveUp;
        };
        state.rungs.count_retry();
        if let Some(report) = &report {
            ctx.remember_pruned(&report.pruned_call_ids);
            ctx.note_forwarded(u64::from(report.tokens_after));
            ctx.note_generation(state.compacted().unwrap_or(0));
            let pressure = self.pressure(ctx, report);
            state.trace.tokens_after = Some(pressure.calibrated(report.estimated_after()).as_u32());
            state.trace.pruned = report.pruned;
            state.sent = Some(report.clone());
        }
        self.remember_rebuilt(state, &body).await;
        Next::Retry { body, report }
    }

    /// What an overflow teaches: the window it names, else that the window is below what was
    /// sent; the prompt size it reports measures the provider's tokenizer.
    pub(super) fn learn_from_overflow(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        overflow: &Overflow,
    ) {
        let named = budget::window_named(overflow);
        if state.trace.overflow.is_none() {
            let style = if named.is_some() { "named" } else { "unnamed" };
            state.trace.overflow = Some(format!("{}:{style}", head.route.family.label()));
        }
        let estimate = ctx.forwarded_estimate();
        if let Some(prompt) = overflow.prompt_tokens {
            ctx.measure(prompt, estimate);
        }
        match named {
            Some(window) => ctx.learn_window(window),
            None => {
                let sent = match (&state.sent, overflow.prompt_tokens) {
                    (_, Some(prompt)) => prompt,
                    (Some(report), None) => self.pressure(ctx, report).calibrated(Estimated::new(estimate)).get(),
                    (None, None) => 0,
                };
                if sent > 0 {
                    ctx.learn(|learned| {
                        if learned.window_below == 0 || sent < learned.window_below {
                            learned.window_below = sent;
                        }
                    });
                }
            }
        }
    }

    /// The next body after an overflow, `None` to give up.
    async fn next_body(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        overflow: &Overflow,
        sent: &Bytes,
    ) -> Option<(Bytes, Option<RewriteReport>)> {
        if state.retries() >= self.settings.max_retries
            || budget::breaker_open(&self.settings, &ctx.conversation().breaker, state.message_count)
        {
            return None;
        }
        if let Some(body) = state.rungs.lower_max_tokens(state.dialect, sent, overflow, self.settings.min_output_tokens)
        {
            state.note("lower_max_tokens", RungOutcome::Retry);
            return Some((body, None));
        }
        self.climb(head, state, ctx, sent).await.map(|(body, report)| (body, Some(report)))
    }

    /// The next rung that yields a new body that fits: a rung whose body compactor already
    /// estimates will overflow is passed over, never sent. With `prune.enabled = false` no
    /// output is replaced by the placeholder: the prune-harder rung is skipped.
    async fn climb(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        sent: &Bytes,
    ) -> Option<Derived> {
        while let Some(rung) = state.rungs.next_rung() {
            let (body, outcome) = match rung {
                Rung::PruneHard if !self.rewriter.settings.prune_enabled => (None, RungOutcome::Skipped),
                Rung::PruneHard => self.prune_harder(state, ctx, sent).await,
                Rung::Summarize if state.ready.is_some() => self.apply_ready_rung(state, ctx).await,
                Rung::Summarize | Rung::SummarizeHarder => {
                    self.summarize_rung(head, state, ctx, rung == Rung::SummarizeHarder).await
                }
                Rung::Exhausted => continue,
            };
            state.note(rung.name(), outcome);
            if body.is_some() {
                return body;
            }
        }
        None
    }

    /// The prune-harder rung: a small protected window, no minimum.
    async fn prune_harder(
        &self,
        state: &RequestState,
        ctx: &SessionCtx,
        sent: &Bytes,
    ) -> (Option<Derived>, RungOutcome) {
        match self.engine().derive(state, ctx, &self.hard_settings(), true).await {
            Some((body, report)) if body != *sent && self.fits(ctx, &report) => {
                if let Some(reason) = report.prefix_break {
                    metric::prefix_break(reason.label());
                }
                (Some((body, report)), RungOutcome::Retry)
            }
            Some((body, _)) if body != *sent => (None, RungOutcome::TooBig),
            _ => (None, RungOutcome::Nothing),
        }
    }

    /// The summarize rung with a summary prepared in the background: no summary call to wait for.
    async fn apply_ready_rung(&self, state: &mut RequestState, ctx: &SessionCtx) -> (Option<Derived>, RungOutcome) {
        if let Some((body, report)) = self.apply_ready(state, ctx).await
            && self.fits(ctx, &report)
        {
            metric::prefix_break(Reason::Summary.label());
            return (Some((body, report)), RungOutcome::Retry);
        }
        (None, RungOutcome::TooBig)
    }

    /// The summarize rungs: a compaction of the body that overflowed (`harder`: a quarter of the
    /// tail kept, user messages capped).
    pub(super) async fn summarize_rung(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &mut SessionCtx,
        harder: bool,
    ) -> (Option<Derived>, RungOutcome) {
        let Some(sizing) = state.sent.as_ref().map(|report| self.sizing(state, ctx, report)) else {
            return (None, RungOutcome::Nothing);
        };
        // Boxed: a compaction's future (its summary calls) is large and rarely runs; held inline
        // it made every request's future that much larger to move.
        match Box::pin(self.engine().compact(head, state, ctx, harder, Trigger::Overflow, sizing, 0)).await {
            Ok(Summarized { record, summary_time, summary_calls }) => {
                state.trace.summary += summary_time;
                state.trace.summary_calls += summary_calls;
                state.record = Some(record);
                match self.engine().derive(state, ctx, &self.settings_for_rebuild(), true).await {
                    Some((body, report)) if self.fits(ctx, &report) => {
                        metric::prefix_break(Reason::Summary.label());
                        (Some(with_summary_break((body, report))), RungOutcome::Retry)
                    }
                    Some(_) => (None, RungOutcome::TooBig),
                    None => (None, RungOutcome::Nothing),
                }
            }
            Err(error) => {
                tracing::warn!(
                    error = %Chain(&error),
                    session = %ctx.key().as_str(),
                    conversation = %ctx.conversation_id(),
                    "compaction failed"
                );
                (None, RungOutcome::Failed)
            }
        }
    }
}
