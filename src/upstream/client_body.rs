//! The client's body on its way upstream, frame by frame: counted, and cut with an error when the
//! client stalls between two frames for longer than `limits.client_body_timeout_ms` or breaks off
//! (the upstream request goes with it). The proxy streams every non-rewritten route's body
//! through it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::error::{Cause, ProxyError};

/// What happened to a client body on its way: bytes received, and how it failed if it did.
#[derive(Debug, Default)]
pub struct Progress {
    bytes: AtomicU64,
    stalled: AtomicBool,
    broken: AtomicBool,
}

impl Progress {
    /// Bytes received from the client so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Whether the body stalled past its timeout.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// The client's side of a failure that surfaced elsewhere (in the upstream request that was
    /// streaming the body), if the body is what failed.
    pub fn client_error(&self, timeout: Duration) -> Option<ProxyError> {
        if self.stalled.load(Ordering::Relaxed) {
            Some(ProxyError::ClientBodyTimeout { timeout })
        } else if self.broken.load(Ordering::Relaxed) {
            Some(ProxyError::ClientBody(Box::new(BrokenOff)))
        } else {
            None
        }
    }
}

/// The client broke off the body it was sending (the upstream request went with it).
#[derive(Debug, thiserror::Error)]
#[error("the client broke off the request body")]
struct BrokenOff;

/// The body stalled: nothing arrived within the timeout.
#[derive(Debug, thiserror::Error)]
#[error("no request body data for {} ms", .0.as_millis())]
struct Stalled(Duration);

pin_project_lite::pin_project! {
    /// The client's body passed on frame by frame, counted, and cut with an error when the client
    /// stalls between two frames for longer than `idle`.
    pub struct ClientBody {
        #[pin]
        inner: Incoming,
        idle: Duration,
        // When the last frame came (or the body was taken up): the stall is counted from here.
        last_frame: Instant,
        // Made, and armed, only when the body has to be waited for: a body that came with its
        // request head (most do) is read without touching the runtime's timers.
        deadline: Option<Pin<Box<Sleep>>>,
        progress: Arc<Progress>,
    }
}

impl ClientBody {
    pub fn new(inner: Incoming, idle: Duration) -> Self {
        Self { inner, idle, last_frame: Instant::now(), deadline: None, progress: Arc::default() }
    }

    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Cause;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Cause>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.progress.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                *this.last_frame = Instant::now();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.progress.broken.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(Box::new(error))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let deadline = *this.last_frame + *this.idle;
                let sleep = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.deadline() != deadline {
                    sleep.as_mut().reset(deadline);
                }
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.progress.stalled.store(true, Ordering::Relaxed);
                        Poll::Ready(Some(Err(Box::new(Stalled(*this.idle)))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
