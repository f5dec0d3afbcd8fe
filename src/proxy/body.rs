//! The response body compactor hands to hyper: either its own complete body or the upstream's
//! stream, passed through frame by frame with an idle timeout and byte counting. Either way it
//! carries the request's [`Finish`], and hands it over when the body ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::finish::Finish;
use super::outcome::Ending;
use crate::telemetry::metric;
use crate::upstream::PooledBody;
use crate::usage::UsageTap;

/// Errors a response body can end with; hyper then aborts the connection so the client sees a
/// truncated message rather than a silently short one.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("upstream sent nothing for {0:?}")]
    IdleTimeout(Duration),
    #[error("upstream body failed: {0}")]
    Upstream(#[from] hyper::Error),
}

pin_project! {
    /// The upstream's body, observed on its way to the client.
    pub struct TapBody {
        #[pin]
        inner: PooledBody,
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        last_frame: Instant,
        finish: Box<Finish>,
        streaming: bool,
        usage: Option<UsageTap>,
        // Bytes compactor already read while holding the stream; sent first.
        prefix: Option<Bytes>,
        finished: bool,
        // The head, or data, went out since the body last returned Pending: hyper may still hold
        // it in its write buffer.
        unflushed: bool,
        // An error held back for one poll so what was sent before it reaches the client first.
        error: Option<BodyError>,
    }

    impl PinnedDrop for TapBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if *this.streaming {
                metric::stream_ended();
            }
        }
    }
}

impl TapBody {
    /// The upstream's `inner` body, silent since `last_frame` (the idle timeout counts from
    /// there), sent after `prefix` (what compactor already read of it).
    pub fn new(
        inner: PooledBody,
        idle_timeout: Duration,
        last_frame: Instant,
        mut finish: Box<Finish>,
        mut usage: Option<UsageTap>,
        prefix: Option<Bytes>,
    ) -> Self {
        let streaming = finish.outcome.streaming;
        if streaming {
            metric::stream_started();
        }
        let prefix = prefix.filter(|p| !p.is_empty());
        let mut finished = false;
        if prefix.is_none() && inner.is_end_stream() {
            // An empty body is never polled: it is complete as it stands.
            complete(&mut finished, &mut finish, &mut usage);
        }
        Self {
            inner,
            idle: tokio::time::sleep_until((last_frame + idle_timeout).into()),
            idle_timeout,
            last_frame,
            finish,
            streaming,
            usage,
            prefix,
            finished,
            unflushed: true,
            error: None,
        }
    }
}

/// The body was sent in full: the usage read so far is final (and read with the rest of the
/// request's recording, once the response is out).
fn complete(finished: &mut bool, finish: &mut Finish, usage: &mut Option<UsageTap>) {
    *finished = true;
    finish.outcome.ending = Ending::Complete;
    finish.tap = usage.take();
    finish.send();
}

impl Body for TapBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        {
            let this = self.as_mut().project();
            if let Some(error) = this.error.take() {
                return Poll::Ready(Some(Err(error)));
            }
            if *this.finished {
                return Poll::Ready(None);
            }
        }
        let polled = poll_upstream(self.as_mut(), cx);
        let this = self.project();
        match polled {
            Poll::Ready(Some(Err(error))) if std::mem::take(this.unflushed) => {
                // hyper aborts the connection on a body error, dropping what it has not written
                // yet: let it flush first, so the client sees the real head and every byte sent.
                *this.error = Some(error);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                *this.unflushed = true;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                *this.unflushed = false;
                Poll::Pending
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.error.is_none() && self.prefix.is_none() && (self.finished || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.prefix {
            None => self.inner.size_hint(),
            Some(prefix) => {
                let inner = self.inner.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + prefix.len() as u64);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + prefix.len() as u64);
                }
                hint
            }
        }
    }
}

/// The next frame of the upstream's body (after the held prefix), counted and tapped, with the
/// idle timeout; the request is finished when the body ends or breaks.
fn poll_upstream(body: Pin<&mut TapBody>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
    let mut this = body.project();
    {
        if let Some(prefix) = this.prefix.take() {
            this.finish.outcome.bytes_out += prefix.len() as u64;
            if let Some(tap) = this.usage.as_mut() {
                tap.observe(&prefix);
            }
            if this.inner.is_end_stream() {
                complete(this.finished, this.finish, this.usage);
            }
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        loop {
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    *this.last_frame = Instant::now();
                    if let Some(data) = frame.data_ref() {
                        this.finish.outcome.bytes_out += data.len() as u64;
                        if let Some(tap) = this.usage.as_mut() {
                            tap.observe(data);
                        }
                    }
                    // A body with a declared length (or an h2 END_STREAM) is over with its last
                    // frame: hyper will not poll again, so the end is recorded now.
                    if this.inner.is_end_stream() {
                        complete(this.finished, this.finish, this.usage);
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(error))) => {
                    *this.finished = true;
                    this.finish.outcome.ending = Ending::UpstreamError;
                    this.finish.send();
                    return Poll::Ready(Some(Err(BodyError::Upstream(error))));
                }
                Poll::Ready(None) => {
                    complete(this.finished, this.finish, this.usage);
                    return Poll::Ready(None);
                }
                Poll::Pending => {}
            }
            // The timer is reset lazily: only when it fires do we look at when the last frame came.
            ready!(this.idle.as_mut().poll(cx));
            let deadline = *this.last_frame + *this.idle_timeout;
            if deadline <= Instant::now() {
                *this.finished = true;
                this.finish.outcome.ending = Ending::IdleTimeout;
                this.finish.send();
                return Poll::Ready(Some(Err(BodyError::IdleTimeout(*this.idle_timeout))));
            }
            this.idle.as_mut().reset(deadline.into());
        }
    }
}

pin_project! {
    /// Every response compactor sends.
    #[project = ResponseBodyProj]
    pub enum ResponseBody {
        /// A body compactor made itself (its errors, health, metrics), or an error body it read.
        Full { bytes: Option<Bytes>, finish: Option<Box<Finish>> },
        /// The upstream's body, streamed through.
        Upstream { #[pin] body: TapBody },
    }
}

impl ResponseBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::Full { bytes: Some(bytes.into()), finish: None }
    }

    /// A complete body that ends a proxied request: counted as sent in full.
    pub fn finished(bytes: Bytes, mut finish: Box<Finish>) -> Self {
        finish.outcome.bytes_out = bytes.len() as u64;
        finish.outcome.ending = Ending::Complete;
        Self::Full { bytes: Some(bytes), finish: Some(finish) }
    }
}

impl From<Bytes> for ResponseBody {
    fn from(bytes: Bytes) -> Self {
        Self::full(bytes)
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.project() {
            ResponseBodyProj::Full { bytes, .. } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ResponseBodyProj::Upstream { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full { bytes, .. } => bytes.is_none(),
            Self::Upstream { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full { bytes, .. } => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Upstream { body } => body.size_hint(),
        }
    }
}
