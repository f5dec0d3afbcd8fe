//! The end of a request. When its response body ends, the client leaves, or the request is
//! dropped half-way, the request's [`Finish`] writes its log line and metrics and hands the
//! session's state to the request's finisher: a task started when the request took its state,
//! tracked for shutdown, that commits the state and waits for the write. Nothing is written to a
//! shared store from `Drop`: a drop only sends a message. The in-process store is the exception:
//! its write is a map update that neither waits nor fails, so the request applies it in place and
//! starts no finisher.
//!
//! All of that runs after the client has the response's last byte. hyper drops the body (which
//! finishes the request) before it writes out what it buffered, so [`Finish::send`] only takes
//! the request's remains. The connection's own task records them once hyper's poll, and with it
//! the write, is done: the server wraps each HTTP/1 connection in [`recording`]. A request ended
//! elsewhere (an HTTP/2 stream's task) spawns its recording on the finishers' tracker, and outside
//! a runtime it is recorded in place. On the same connection the next request is read only after
//! the body ended, so it still finds the state committed. A client that reads compactor's own
//! endpoints (metrics, the admin API, the inspector) right after a response, on another
//! connection, gets them once the recordings then in flight are done ([`recorded`]); a proxied
//! request on another connection within those microseconds sees the state as before the
//! response, as it would with the Redis store, whose write also follows the response.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};

use super::outcome::RequestOutcome;
use super::record::RequestRecord;
use crate::session::{SessionCtx, Usage};
use crate::usage::UsageTap;

/// What the finisher commits.
struct Commit {
    ctx: Box<SessionCtx>,
    usage: Option<Usage>,
}

/// A request's remains, filled in as it goes; finished once, by [`Finish::send`] or when dropped.
pub struct Finish {
    /// The one record of the request's outcome: its log line, metrics, span attributes,
    /// compactor's response headers and the inspector's row are all read from it.
    pub outcome: RequestOutcome,
    /// The tap of a response read to its end, whose usage is read with the recording.
    pub tap: Option<UsageTap>,
    /// The session's state, and the way to its finisher (none for the in-process store).
    state: Option<(Box<SessionCtx>, Option<oneshot::Sender<Commit>>)>,
    sent: bool,
    /// The request's trace span, ended with the request (after the finisher's write, if any).
    pub span: Span,
    /// Dropped with the request, after its state is handed to the commit: a summary it started in
    /// the background goes then.
    pub answered: Option<crate::compaction::AnsweredGate>,
    /// Where the recording runs once the response is out (none: in place).
    tracker: Option<TaskTracker>,
}

/// Recordings spawned and finished, for [`recorded`].
static STARTED: AtomicU64 = AtomicU64::new(0);
static DONE: AtomicU64 = AtomicU64::new(0);

/// The longest compactor's own readings (the inspector, the admin API, metrics, token counts)
/// wait for the recordings in flight.
pub const RECORDED_WITHIN: Duration = Duration::from_millis(100);

/// Waits (at most `limit`) until as many recordings have finished as had started when called: what
/// compactor's own endpoints show then includes every response already sent.
pub async fn recorded(limit: Duration) {
    let target = STARTED.load(Ordering::Acquire);
    let deadline = tokio::time::Instant::now() + limit;
    // Recordings take microseconds and these reads are rare: a short poll, nothing on the request path.
    while DONE.load(Ordering::Acquire) < target && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

thread_local! {
    /// Whether a [`recording`] connection is being polled on this thread.
    static POLLING: Cell<bool> = const { Cell::new(false) };
    /// The recordings of the requests that connection ended during the poll (its capacity kept
    /// from one poll to the next). Boxed where they are taken: the queue moves pointers.
    #[allow(clippy::vec_box)]
    static DEFERRED: RefCell<Vec<Box<Remains>>> = const { RefCell::new(Vec::new()) };
}

/// Whether a [`recording`] connection is being polled here: a request it serves is recorded by
/// it, and needs no tracker.
pub fn in_recording_connection() -> bool {
    POLLING.get()
}

/// Queues `remains` for the connection being polled, or gives it back when there is none.
fn defer(remains: Box<Remains>) -> Result<(), Box<Remains>> {
    if !POLLING.get() {
        return Err(remains);
    }
    DEFERRED.with_borrow_mut(|deferred| deferred.push(remains));
    Ok(())
}

pin_project_lite::pin_project! {
    /// A connection that records the requests it ended once each of its polls is done: after
    /// hyper wrote out what the poll produced, with no task spawned and no other worker woken.
    pub struct Recording<F> {
        #[pin]
        connection: F,
    }
}

/// Wraps a connection's future (see [`Recording`]).
pub fn recording<F: Future>(connection: F) -> Recording<F> {
    Recording { connection }
}

impl<F: Future> Future for Recording<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let outer = POLLING.replace(true);
        let polled = self.project().connection.poll(cx);
        POLLING.set(outer);
        // One at a time: a recording never ends a request, but the queue is not borrowed while
        // one runs all the same.
        while let Some(remains) = DEFERRED.with_borrow_mut(Vec::pop) {
            remains.record();
        }
        polled
    }
}

/// What [`Finish::send`] takes from the request to record after the response.
struct Remains {
    outcome: RequestOutcome,
    tap: Option<UsageTap>,
    state: Option<(Box<SessionCtx>, Option<oneshot::Sender<Commit>>)>,
    span: Span,
    /// Held until the recording is done, then dropped (see [`Finish::answered`]).
    _answered: Option<crate::compaction::AnsweredGate>,
}

impl Finish {
    /// Boxed: the request's future and its response carry it, and a box moves as one pointer
    /// where the whole (the log line's fields, the session's state) would be copied on each move.
    /// `tracker` runs the recording after the response (and shutdown waits for it).
    pub fn new(outcome: RequestOutcome, span: Span, tracker: Option<TaskTracker>) -> Box<Self> {
        Box::new(Self { outcome, tap: None, state: None, sent: false, span, answered: None, tracker })
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

    /// Ends the request: its end time is taken now, and the log line, metrics, trace fields,
    /// inspector record and the state's commit follow once the response is out (see the module's
    /// comment); later calls do nothing.
    pub fn send(&mut self) {
        if std::mem::replace(&mut self.sent, true) {
            return;
        }
        self.outcome.ended_at = Some(Instant::now());
        let remains = Box::new(Remains {
            outcome: std::mem::replace(&mut self.outcome, RequestOutcome::new(String::new(), http::Method::GET, "")),
            tap: self.tap.take(),
            state: self.state.take(),
            span: std::mem::replace(&mut self.span, Span::none()),
            _answered: self.answered.take(),
        });
        STARTED.fetch_add(1, Ordering::AcqRel);
        let Err(remains) = defer(remains) else { return };
        match (self.tracker.take(), tokio::runtime::Handle::try_current()) {
            (Some(tracker), Ok(runtime)) => {
                drop(tracker.spawn_on(async move { remains.record() }, &runtime));
            }
            _ => remains.record(),
        }
    }
}

impl Remains {
    /// Writes the log line and hands the session's state to the finisher (or commits it in place).
    fn record(self: Box<Self>) {
        /// Counts the recording done even if it panicked: readings would wait on it otherwise.
        struct Done;
        impl Drop for Done {
            fn drop(&mut self) {
                DONE.fetch_add(1, Ordering::AcqRel);
            }
        }
        let _done = Done;
        (*self).record_now();
    }

    fn record_now(mut self) {
        if let Some(tap) = self.tap.take() {
            self.outcome.usage = tap.finish();
        }
        // The session's state first: the client has the response, and its next request may be
        // on its way.
        if let Some((ctx, _)) = self.state.as_mut().filter(|(ctx, _)| ctx.records_requests()) {
            let started = crate::session::unix_ms().saturating_sub(self.outcome.started.elapsed().as_millis() as u64);
            let mut record = RequestRecord::of(&self.outcome, started);
            record.n = ctx.conversation().requests + 1;
            match serde_json::to_string(&record) {
                Ok(json) => ctx.inspect(json, record.marks()),
                Err(error) => tracing::debug!(%error, "request record not serializable"),
            }
        }
        if let Some((mut ctx, sender)) = self.state.take() {
            let _entered = self.span.enter();
            ctx.note_answered();
            ctx.note_status(self.outcome.status);
            match sender {
                // Refused only when the runtime is shutting down and the finisher is gone with it.
                Some(sender) => drop(sender.send(Commit { ctx, usage: self.outcome.usage })),
                None => {
                    if let Some(usage) = self.outcome.usage {
                        ctx.set_usage(usage);
                    }
                    ctx.commit_in_place();
                }
            }
        }
        self.outcome.emit();
        self.record_span();
    }

    /// What the request did, on its trace span.
    fn record_span(&self) {
        let span = &self.span;
        if span.is_disabled() {
            return;
        }
        let outcome = &self.outcome;
        span.record("http.response.status_code", outcome.status);
        if let Some(error) = outcome.error {
            span.record("error.type", error);
            span.record("otel.status_code", "ERROR");
        } else if outcome.status >= 500 {
            span.record("error.type", outcome.status.to_string());
            span.record("otel.status_code", "ERROR");
        }
        if let Some(session) = &outcome.session {
            span.record("compactor.session", session.as_str());
        }
        if let Some(conversation) = &outcome.conversation {
            span.record("compactor.conversation", conversation.as_str());
        }
        if let Some((before, after, pruned)) = outcome.tokens {
            span.record("compactor.tokens_before", before);
            span.record("compactor.tokens_after", after);
            span.record("compactor.pruned", pruned as u64);
        }
        if let Some(usage) = &outcome.usage {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::AnsweredGate;
    use tokio::sync::oneshot::error::TryRecvError;

    fn finish(tracker: Option<TaskTracker>) -> (Box<Finish>, oneshot::Receiver<()>) {
        let (gate, answered) = oneshot::channel();
        let mut finish =
            Finish::new(RequestOutcome::new("r1".into(), http::Method::POST, "chat"), Span::none(), tracker);
        finish.answered = Some(AnsweredGate::of(gate));
        (finish, answered)
    }

    /// hyper drops a response's body, which ends the request, before it writes out what it
    /// buffered: the recording must wait for the task to yield, or the client waits for it.
    #[tokio::test(flavor = "current_thread")]
    async fn the_recording_runs_once_the_task_that_ended_the_request_yields() {
        let tracker = TaskTracker::new();
        let (mut finish, mut answered) = finish(Some(tracker.clone()));
        finish.send();
        assert!(finish.outcome.request_id.is_empty(), "the request's remains were taken");
        assert_eq!(answered.try_recv(), Err(TryRecvError::Empty), "nothing recorded before the task yields");
        tokio::task::yield_now().await;
        assert_eq!(answered.try_recv(), Err(TryRecvError::Closed), "recorded (and the gate let go) after it");
        drop(finish);
        tracker.close();
        tracker.wait().await;
    }

    /// A connection's own task records what its poll ended once the poll is done: after hyper
    /// wrote the response out, with no task spawned.
    #[tokio::test(flavor = "current_thread")]
    async fn a_recording_connection_records_what_its_poll_ended_once_the_poll_is_done() {
        let tracker = TaskTracker::new();
        let (mut finish, answered) = finish(Some(tracker.clone()));
        let (during, mut answered) = recording(async move {
            let mut answered = answered;
            finish.send();
            drop(finish);
            (answered.try_recv(), answered)
        })
        .await;
        assert_eq!(during, Err(TryRecvError::Empty), "nothing recorded inside the connection's poll");
        assert_eq!(answered.try_recv(), Err(TryRecvError::Closed), "recorded when the poll returned");
        assert!(tracker.is_empty(), "no task spawned");
    }

    /// Shutdown waits for the recordings still to run: they are tracked.
    #[tokio::test(flavor = "current_thread")]
    async fn shutdown_waits_for_a_recording_still_to_run() {
        let tracker = TaskTracker::new();
        let (mut finish, mut answered) = finish(Some(tracker.clone()));
        finish.send();
        tracker.close();
        assert_eq!(tracker.len(), 1);
        tracker.wait().await;
        assert_eq!(answered.try_recv(), Err(TryRecvError::Closed));
    }

    /// compactor's own endpoints wait for the recordings in flight: what they show includes
    /// every response already sent.
    #[tokio::test(flavor = "current_thread")]
    async fn a_reading_waits_for_the_recordings_in_flight() {
        let tracker = TaskTracker::new();
        let (mut finish, mut answered) = finish(Some(tracker.clone()));
        finish.send();
        recorded(Duration::from_secs(5)).await;
        assert_eq!(answered.try_recv(), Err(TryRecvError::Closed), "recorded before the reading goes on");
    }

    /// With no runtime (or no tracker) there is no later: the request is recorded in place.
    #[test]
    fn outside_a_runtime_the_recording_runs_in_place() {
        for tracker in [Some(TaskTracker::new()), None] {
            let (finish, mut answered) = finish(tracker);
            drop(finish);
            assert_eq!(answered.try_recv(), Err(TryRecvError::Closed));
        }
    }
}
