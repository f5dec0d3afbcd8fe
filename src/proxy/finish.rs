//! The end of a request. When its response body ends, the client leaves, or the request is
//! dropped half-way, the request's [`Finish`] writes its log line and metrics (at once, so they
//! are there when the client has the last byte) and hands the session's state to the request's
//! finisher: one task, started with the request and tracked for shutdown, that commits the state
//! and waits for the write. Nothing is written to the store from `Drop`: a drop only sends a message.

use std::time::Instant;

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::session::{SessionCtx, Usage};
use crate::telemetry::request::RequestLog;

/// What the finisher commits.
struct Commit {
    ctx: SessionCtx,
    usage: Option<Usage>,
}

/// A request's remains, filled in as it goes; finished once, by [`Finish::send`] or when dropped.
pub struct Finish {
    pub log: RequestLog,
    pub ctx: Option<SessionCtx>,
    /// The token usage the upstream reported, read by the tap.
    pub usage: Option<Usage>,
    sender: Option<oneshot::Sender<Commit>>,
}

impl Finish {
    /// Starts the request's finisher on `tracker`, so shutdown can wait for its write.
    pub fn start(tracker: &TaskTracker, log: RequestLog) -> Self {
        let (sender, receiver) = oneshot::channel();
        tracker.spawn(commit(receiver));
        Self { log, ctx: None, usage: None, sender: Some(sender) }
    }

    /// Writes the log line and hands the session's state to the finisher; later calls do nothing.
    pub fn send(&mut self) {
        let Some(sender) = self.sender.take() else { return };
        self.log.ended_at = Some(Instant::now());
        self.log.emit();
        if let Some(ctx) = self.ctx.take() {
            // Refused only when the runtime is shutting down and the finisher is gone with it.
            drop(sender.send(Commit { ctx, usage: self.usage.take() }));
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.send();
    }
}

/// The finisher: commits the session's state, if the request had one, and waits for the write.
async fn commit(receiver: oneshot::Receiver<Commit>) {
    let Ok(Commit { mut ctx, usage }) = receiver.await else { return };
    if let Some(usage) = usage {
        ctx.set_usage(usage);
    }
    // A failed commit is logged and counted by the context itself.
    ctx.commit().await;
}
