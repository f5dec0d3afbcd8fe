//! The end of a request. When its response body ends, the client leaves, or the request is
//! dropped half-way, the request's [`Finish`] writes its log line and metrics (at once, so they
//! are there when the client has the last byte) and hands the session's state to the request's
//! finisher: a task started when the request took its state, tracked for shutdown, that commits
//! the state and waits for the write. Nothing is written to a shared store from `Drop`: a drop
//! only sends a message. The in-process store is the exception: its write is a map update that
//! neither waits nor fails, so the request applies it in place and starts no finisher.

use std::time::Instant;

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};

use crate::inspector::{RequestRecord, Rewrite};
use crate::session::{SessionCtx, Usage};
use crate::telemetry::request::RequestLog;

/// What the finisher commits.
struct Commit {
    ctx: Box<SessionCtx>,
    usage: Option<Usage>,
}

/// A request's remains, filled in as it goes; finished once, by [`Finish::send`] or when dropped.
pub struct Finish {
    pub log: RequestLog,
    /// The token usage the upstream reported, read by the tap.
    pub usage: Option<Usage>,
    /// The session's state, and the way to its finisher (none for the in-process store).
    state: Option<(Box<SessionCtx>, Option<oneshot::Sender<Commit>>)>,
    sent: bool,
    /// The request's trace span, ended with the request (after the finisher's write, if any).
    pub span: Span,
    /// What the rewrite did, for the inspector's record (set only when the store keeps records).
    pub rewrite: Option<Rewrite>,
    /// Dropped with the request, after its state is handed to the commit: a summary it started in
    /// the background goes then.
    pub answered: Option<crate::compaction::AnsweredGate>,
}

impl Finish {
    /// Boxed: the request's future and its response carry it, and a box moves as one pointer
    /// where the whole (the log line's fields, the session's state) would be copied on each move.
    pub fn new(log: RequestLog, span: Span) -> Box<Self> {
        Box::new(Self { log, usage: None, state: None, sent: false, span, rewrite: None, answered: None })
    }

    /// Takes the request's session state and starts, on `tracker`, the finisher that will commit it.
    pub fn keep(&mut self, tracker: &TaskTracker, ctx: Box<SessionCtx>) {
        if ctx.commits_in_place() {
            self.state = Some((ctx, None));
            return;
        }
        let (sender, receiver) = oneshot::channel();
        tracker.spawn(commit(receiver).instrument(self.span.clone()));
        self.state = Some((ctx, Some(sender)));
    }

    /// The session's state, while the request still changes it.
    pub fn ctx(&mut self) -> Option<&mut SessionCtx> {
        self.state.as_mut().map(|(ctx, _)| &mut **ctx)
    }

    /// Writes the log line and hands the session's state to the finisher; later calls do nothing.
    pub fn send(&mut self) {
        if std::mem::replace(&mut self.sent, true) {
            return;
        }
        self.log.ended_at = Some(Instant::now());
        self.log.cache = self.usage.map(|usage| (usage.cached_tokens, usage.cache_write_tokens));
        self.log.emit();
        self.record_span();
        if let Some((ctx, _)) = self.state.as_mut().filter(|(ctx, _)| ctx.records_requests()) {
            let started = crate::session::unix_ms().saturating_sub(self.log.started.elapsed().as_millis() as u64);
            let mut record = RequestRecord::of(&self.log, self.rewrite.as_ref(), self.usage.as_ref(), started);
            record.n = ctx.conversation().requests + 1;
            ctx.inspect(&record);
        }
        let _entered = self.span.enter();
        if let Some((ctx, _)) = self.state.as_mut() {
            ctx.note_answered();
        }
        match self.state.take() {
            Some((ctx, Some(sender))) => {
                // Refused only when the runtime is shutting down and the finisher is gone with it.
                drop(sender.send(Commit { ctx, usage: self.usage.take() }));
            }
            Some((mut ctx, None)) => {
                if let Some(usage) = self.usage.take() {
                    ctx.set_usage(usage);
                }
                ctx.commit_in_place();
            }
            None => {}
        }
    }
}

impl Finish {
    /// What the request did, on its trace span.
    fn record_span(&self) {
        let span = &self.span;
        if span.is_disabled() {
            return;
        }
        let log = &self.log;
        span.record("http.response.status_code", log.status);
        if let Some(error) = log.error {
            span.record("error.type", error);
            span.record("otel.status_code", "ERROR");
        } else if log.status >= 500 {
            span.record("error.type", log.status.to_string());
            span.record("otel.status_code", "ERROR");
        }
        if let Some(session) = &log.session {
            span.record("compactor.session", session.as_str());
        }
        if let Some(conversation) = &log.conversation {
            span.record("compactor.conversation", conversation.as_str());
        }
        if let Some((before, after, pruned)) = log.tokens {
            span.record("compactor.tokens_before", before);
            span.record("compactor.tokens_after", after);
            span.record("compactor.pruned", pruned as u64);
        }
        if let Some(usage) = &self.usage {
            span.record("gen_ai.usage.input_tokens", usage.prompt_tokens);
            span.record("gen_ai.usage.output_tokens", usage.output_tokens);
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.send();
    }
}

/// The finisher: commits the session's state and waits for the write.
async fn commit(receiver: oneshot::Receiver<Commit>) {
    // The sender always sends before it goes, so an error here means the runtime is going away.
    let Ok(Commit { mut ctx, usage }) = receiver.await else { return };
    if let Some(usage) = usage {
        ctx.set_usage(usage);
    }
    // A failed commit is logged and counted by the context itself.
    ctx.commit().await;
}
