//! Work done off the request's path: the conversation's next summary prepared in the background
//! when its growth says it will pass the threshold within `compaction.background_turns_ahead`
//! turns, and, in front of a local server, the prefill of a prepared summary (the rebuilt prompt
//! sent while the agent's tool runs). Each waits for the answer of the request that started it
//! ([`AnsweredGate`]).

use std::sync::Arc;

use bytes::Bytes;

use super::budget;
use super::decision::{BackgroundOutcome, Trigger};
use super::engine::{Engine, NoCompaction, Sizing, Summarized};
use super::ladder::BackgroundSkip;
use super::prepare::Derived;
use super::request::RequestState;
use super::{AnsweredGate, Compactor, Summarizer, lock, prefill};
use crate::config::compaction::CompactionSettings;
use crate::error::Chain;
use crate::inflight::Held;
use crate::rewrite::{Estimated, RewriteReport, Rewriter};
use crate::session::{ConversationId, SessionCtx, SessionKey, Store};
use crate::telemetry::metric;
use crate::upstream::RequestHead;

/// How long work started by a request waits for that request's answer.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// A summary prepared in the background, on its own task: what it needs of the request that
/// started it, owned.
struct Job {
    head: RequestHead,
    /// The starting request's state, carrying the record it applied, and the body it sent.
    state: RequestState,
    settings: Arc<CompactionSettings>,
    rewriter: Arc<Rewriter>,
    summarizer: Arc<Summarizer>,
    store: Store,
    key: SessionKey,
    conversation: ConversationId,
    sizing: Sizing,
    due_tokens: u64,
    /// In front of a local server: the prefill of the record once it is ready.
    prefill: Option<prefill::Prefill>,
}

impl Compactor {
    /// The work this request starts off its path, after its own compaction (if any): the next
    /// crossing is prepared from what goes now, also right after a request that compacted or
    /// applied a prepared summary, where a window that holds few turns is passed again within a
    /// turn or two (a summary started only at the next request would be on that request's path).
    /// A record held back that was not prefilled yet (its job found the conversation moved on)
    /// is prefilled once this request is answered, and the next request applies it.
    pub(super) fn prepare_next(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &SessionCtx,
        (sent, report): &Derived,
        arrival: Option<u64>,
        requested: bool,
    ) -> Option<AnsweredGate> {
        if self.settings.background && state.ready.is_none() && !requested {
            return self.prepare_in_background(head, state, ctx, report, sent, arrival);
        }
        let (arrival, ready) = arrival.zip(state.ready.clone())?;
        Some(self.prefill_prepared(head, state.for_background(Some(ready)), ctx, arrival))
    }

    /// A summary due to be prepared in the background that is not started (see
    /// [`BackgroundSkip`]): counted, and said in the request's record. The request that passes
    /// the threshold summarizes on its path instead, as with `compaction.background = false`.
    fn skip_background(
        &self,
        state: &mut RequestState,
        ctx: &SessionCtx,
        skip: BackgroundSkip,
    ) -> Option<AnsweredGate> {
        metric::background_summary_skipped(skip.label());
        tracing::debug!(session = %ctx.key().as_str(), reason = skip.label(), "background summary not started");
        state.trace.background_skipped = Some(skip);
        None
    }

    /// Starts the conversation's next summary off the request path when its growth says it will
    /// pass the threshold within `compaction.background_turns_ahead` turns: at the newest turn's
    /// growth, the prompt crosses the size where a compaction before the overflow would happen
    /// (the budget, or the limit when a compaction there would not leave room for two more
    /// turns). The job takes the conversation's compaction lock (it never waits for it: a
    /// compaction under way makes it give up) and stores its record with `due_tokens`, the size
    /// of the client's history at which it applies, so the request that needs it applies it at
    /// once, on any replica.
    fn prepare_in_background(
        &self,
        head: &RequestHead,
        state: &mut RequestState,
        ctx: &SessionCtx,
        report: &RewriteReport,
        sent: &Bytes,
        arrival: Option<u64>,
    ) -> Option<AnsweredGate> {
        let pressure = self.pressure(ctx, report);
        let conversation = ctx.conversation();
        let growth = budget::newest_turn_tokens(conversation, state.message_count, report);
        if growth == Estimated::ZERO {
            return None;
        }
        let prompt = budget::prompt_tokens(&pressure, conversation, state.message_count, report, true);
        let target =
            if self.frees_room(state, &pressure, report, conversation) { pressure.budget() } else { pressure.limit() };
        let ahead = pressure.calibrated(growth.saturating_mul(u64::from(self.settings.background_turns_ahead)));
        if prompt > target || prompt.saturating_add(ahead) <= target {
            return None;
        }
        // In front of a local server the crossing masks old outputs first (`compact_before_overflow`):
        // what is outside the prune window now, and what the next turns' growth pushes out of
        // it. When that makes the room, no summary is due (the server would generate it).
        if state.cache.is_local() {
            let prune = &self.rewriter.settings.prune;
            let protect = prune.within(pressure.window.get()).map_or(prune.protect_tokens, |p| p.protect_tokens);
            let protected = pressure.calibrated(Estimated::from(report.protected_tokens));
            let displaced = protected
                .saturating_add(ahead)
                .saturating_sub(pressure.calibrated(Estimated::from(protect)))
                .min(protected);
            let masked = pressure.calibrated(Estimated::from(report.maskable_tokens)).saturating_add(displaced);
            if prompt.saturating_add(ahead).saturating_sub(masked) <= target {
                return None;
            }
        }
        // Bounded: each job holds its conversation's body and the summary call built from it
        // until the summary is ready, past the request that started it.
        let Ok(slot) = self.background_slots.clone().try_acquire_owned() else {
            return self.skip_background(state, ctx, BackgroundSkip::Capacity);
        };
        let mut held = Held::default();
        if self.inflight.hold(&mut held, (sent.len() as u64).saturating_mul(2)).is_err() {
            return self.skip_background(state, ctx, BackgroundSkip::BodyBudget);
        }
        let due_in = pressure.uncalibrated(target.saturating_sub(prompt)) + Estimated::new(1);
        let due_tokens = (report.estimated_before() + due_in).get();
        // The record applies at the first request past `due_tokens`: whole turns later, at the
        // newest turn's growth, and the history grows that much before it applies.
        let due_in = Estimated::new(due_in.get().div_ceil(growth.get()) * growth.get());
        let sizing = Sizing { due_in, ..self.sizing(state, ctx, report) };
        let mut job_state = state.for_background(state.record.clone());
        job_state.sent_body = Some(sent.clone());
        // In front of a local server the rebuilt prompt goes ahead as soon as the record is ready
        // (the request that started it answered by then), and the next request applies it: the
        // server prefills it in the agent's tool time, whichever turn the projection named.
        let prefill = arrival.map(|arrival| self.prefill(head, ctx, arrival));
        let job = Job {
            head: head.clone(),
            state: job_state,
            settings: self.settings.clone(),
            rewriter: self.rewriter.clone(),
            summarizer: self.summarizer.clone(),
            store: self.store.clone(),
            key: ctx.key().clone(),
            conversation: ctx.conversation_id().clone(),
            sizing,
            due_tokens,
            prefill,
        };
        let tenant = self.identifier.tenant(&head.headers);
        metric::background_summary(BackgroundOutcome::Started.label());
        tracing::debug!(session = %job.key.as_str(), conversation = %job.conversation, prompt = prompt.get(), target = target.get(), due_tokens, "background summary started");
        let (gate, answered) = tokio::sync::oneshot::channel::<()>();
        let work = async move {
            // The summary's call waits for this request's answer (its gate dropped), at most
            // ANSWER_WAIT: on a server that answers one request at a time it would otherwise go
            // in front of, or queue behind, the answer the agent is waiting for.
            let _ = tokio::time::timeout(ANSWER_WAIT, answered).await;
            let outcome = job.run().await;
            metric::background_summary(outcome.label());
            drop((slot, held));
        };
        tokio::spawn(async move { crate::tokens::scoped(&tenant, work).await });
        Some(AnsweredGate(gate))
    }

    /// A prefill of a prepared summary for this request's conversation (run with the request's
    /// state rebuilt around the record it prefills).
    fn prefill(&self, head: &RequestHead, ctx: &SessionCtx, arrival: u64) -> prefill::Prefill {
        prefill::Prefill {
            head: head.clone(),
            store: self.store.clone(),
            key: ctx.key().clone(),
            conversation: ctx.conversation_id().clone(),
            settings: self.settings.clone(),
            rewriter: self.rewriter.clone(),
            summarizer: self.summarizer.clone(),
            arrivals: self.arrivals.clone(),
            arrival,
        }
    }

    /// Sends the prompt rebuilt around `state`'s record ahead, once this request is answered.
    fn prefill_prepared(
        &self,
        head: &RequestHead,
        state: RequestState,
        ctx: &SessionCtx,
        arrival: u64,
    ) -> AnsweredGate {
        let prefill = self.prefill(head, ctx, arrival);
        let tenant = self.identifier.tenant(&head.headers);
        let (gate, answered) = tokio::sync::oneshot::channel::<()>();
        let work = async move {
            let _ = tokio::time::timeout(ANSWER_WAIT, answered).await;
            prefill.run(state).await;
        };
        tokio::spawn(async move { crate::tokens::scoped(&tenant, work).await });
        AnsweredGate(gate)
    }
}

impl Job {
    /// Summarizes, stores the record for the request that will need it, and prefills it when
    /// that is asked for.
    async fn run(self) -> BackgroundOutcome {
        let Job { head, state, settings, rewriter, summarizer, store, key, conversation, sizing, due_tokens, prefill } =
            self;
        let mut ctx = SessionCtx::load(store, key, conversation).await;
        let engine = Engine { settings: &settings, rewriter: &rewriter, summarizer: &summarizer };
        match engine.compact(&head, &state, &mut ctx, false, Trigger::Background, sizing, due_tokens).await {
            Ok(Summarized { record, summary_calls, .. }) => {
                if summary_calls > 0 {
                    let ready = BackgroundOutcome::Ready.label();
                    metric::background_summary_tokens(ready, record.cost.input, record.cost.output);
                }
                if let Some(prefill) = prefill {
                    prefill.run(state.for_background(Some(record))).await;
                }
                BackgroundOutcome::Ready
            }
            Err(NoCompaction::Busy) => {
                // Another request's job prepares (or prepared) this crossing's record: the
                // prefill this request's growth calls for is of that record, from this body.
                if let Some(prefill) = prefill
                    && let Some(record) = lock::prepared_record(&state, &mut ctx, settings.lock_wait).await
                {
                    prefill.run(state.for_background(Some(record))).await;
                }
                BackgroundOutcome::Busy
            }
            Err(NoCompaction::NothingToSummarize) => BackgroundOutcome::Nothing,
            Err(error) => {
                tracing::warn!(
                    error = %Chain(&error),
                    session = %ctx.key().as_str(),
                    conversation = %ctx.conversation_id(),
                    "background summary failed"
                );
                BackgroundOutcome::Failed
            }
        }
    }
}
