//! The idle deadline of a client connection: one with no request in progress is closed after
//! `limits.client_idle_timeout_ms`, counted from accept and from the end of its last request.
//! hyper times an HTTP/1.1 request's headers and compactor its body, but nothing timed the wait
//! before the first byte (hyper-util's version sniffing reads it with no timer) nor an h2c
//! connection with no stream open: a connection that sent nothing held its slot for ever.
//!
//! A request is in progress from the moment hyper hands it to compactor until its response body
//! has been sent or dropped ([`Answered`]), so a slow answer or a long event stream is never idle.
//! On HTTP/1.1 a byte that comes while no request is open starts the next request: from there its
//! headers are hyper's `limits.header_read_timeout_ms` to time. On h2c bytes alone (pings,
//! settings) keep nothing open; only a stream does.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The bytes every h2c connection opens with (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection's requests, as its stream needs to know them.
#[derive(Debug, Default)]
pub struct Requests {
    /// Requests in progress.
    open: AtomicUsize,
    /// Requests begun since accept: a new count is a new idle period, with a deadline of its own.
    begun: AtomicU64,
    /// The stream's task, told when the last open request ends (its deadline starts then).
    idle: AtomicWaker,
}

impl Requests {
    /// A request begins; it is in progress until the guard is dropped. Called where hyper hands
    /// the request over, on the connection's own task (for h2c too), so the stream never reads
    /// between the two counts.
    pub fn begin(self: &Arc<Self>) -> InProgress {
        self.begun.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::AcqRel);
        InProgress(self.clone())
    }

    fn any_open(&self) -> bool {
        self.open.load(Ordering::Acquire) > 0
    }
}

/// One request in progress on its connection; dropped with the request's response body, or with
/// the request when its client left before the answer.
#[derive(Debug)]
pub struct InProgress(Arc<Requests>);

impl Drop for InProgress {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.wake();
        }
    }
}

/// Nothing came on the connection, with no request in progress, for this long.
#[derive(Debug, thiserror::Error)]
#[error("the connection was idle for {} ms", .0.as_millis())]
pub struct IdleTimeout(Duration);

/// What the first bytes said the connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// This many bytes of the h2c preface seen so far (none yet, or a preface still arriving).
    Sniffing(usize),
    Http1,
    H2c,
}

/// A client's stream whose reads fail with [`IdleTimeout`] once the connection has been idle for
/// its deadline, which ends it (hyper closes a connection whose read fails).
#[derive(Debug)]
pub struct IdleDeadline<S> {
    stream: S,
    requests: Arc<Requests>,
    idle: Duration,
    version: Version,
    /// The idle period (`Requests::begun`) last waited in, and when it began.
    armed_for: Option<u64>,
    idle_since: Instant,
    /// The idle period in which an HTTP/1.1 byte came: the next request has begun.
    heard_in: Option<u64>,
    // Made at the first idle wait; it may still be set for an earlier period (see `poll_idle`).
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> IdleDeadline<S> {
    pub fn new(stream: S, requests: Arc<Requests>, idle: Duration) -> Self {
        Self {
            stream,
            requests,
            idle,
            version: Version::Sniffing(0),
            // The first idle period, before any request, counts from accept.
            armed_for: Some(0),
            idle_since: Instant::now(),
            heard_in: None,
            deadline: None,
        }
    }

    /// Bytes came: the preface tells the version, and on HTTP/1.1 bytes while no request is open
    /// are the next request's start.
    fn heard(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if let Version::Sniffing(seen) = self.version {
            let rest = &H2_PREFACE[seen..];
            let compared = bytes.len().min(rest.len());
            self.version = if bytes[..compared] != rest[..compared] {
                Version::Http1
            } else if seen + compared == H2_PREFACE.len() {
                Version::H2c
            } else {
                Version::Sniffing(seen + compared)
            };
        }
        if self.version == Version::Http1 && !self.requests.any_open() {
            self.heard_in = Some(self.requests.begun.load(Ordering::Relaxed));
        }
    }

    /// The read is waiting: past the deadline of an idle connection it fails instead.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.requests.any_open() {
            // hyper's HTTP/1.1 reads again as soon as a response is sent, on this task; an h2c
            // stream ends on a task of its own, and this one may sleep until told. Registered
            // before looking again, so the last request's end is never missed.
            if self.version != Version::Http1 {
                self.requests.idle.register(cx.waker());
            }
            if self.requests.any_open() {
                return Poll::Pending;
            }
        }
        let period = self.requests.begun.load(Ordering::Relaxed);
        if self.heard_in == Some(period) {
            return Poll::Pending;
        }
        if self.armed_for != Some(period) {
            self.armed_for = Some(period);
            self.idle_since = Instant::now();
        }
        let due = self.idle_since + self.idle;
        let deadline = self.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        loop {
            if deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // A timer set for an earlier idle period: moved on only now that it fired, so a
            // connection's requests each cost no timer of their own.
            if deadline.deadline() < due {
                deadline.as_mut().reset(due);
                continue;
            }
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, IdleTimeout(self.idle))));
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleDeadline<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        // The stream first: bytes that came are never lost to a deadline that passed meanwhile.
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.heard(&buf.filled()[before..]);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => this.poll_idle(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleDeadline<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request in progress until hyper has sent it or dropped it.
    pub struct Answered<B> {
        #[pin]
        body: B,
        _request: InProgress,
    }
}

impl<B> Answered<B> {
    pub fn new(body: B, request: InProgress) -> Self {
        Self { body, _request: request }
    }
}

impl<B: Body<Data = Bytes>> Body for Answered<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const IDLE: Duration = Duration::from_secs(60);

    fn connection() -> (IdleDeadline<tokio::io::DuplexStream>, tokio::io::DuplexStream, Arc<Requests>) {
        let (server, client) = tokio::io::duplex(1024);
        let requests = Arc::new(Requests::default());
        (IdleDeadline::new(server, requests.clone(), IDLE), client, requests)
    }

    async fn read(stream: &mut IdleDeadline<tokio::io::DuplexStream>) -> io::Result<Vec<u8>> {
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await?;
        Ok(buf[..n].to_vec())
    }

    fn timed_out(result: io::Result<Vec<u8>>) -> bool {
        result.is_err_and(|error| error.kind() == io::ErrorKind::TimedOut)
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_times_out_at_its_deadline_from_accept() {
        let (mut stream, _client, _) = connection();
        let started = Instant::now();
        assert!(timed_out(read(&mut stream).await));
        assert_eq!(started.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_progress_is_never_idle_and_its_end_starts_a_new_deadline() {
        let (mut stream, mut client, requests) = connection();
        // Half the deadline passes before the request: its timer is the one moved on later.
        assert!(tokio::time::timeout(IDLE / 2, read(&mut stream)).await.is_err());
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        read(&mut stream).await.unwrap();
        let request = requests.begin();
        let waited = tokio::time::timeout(IDLE * 10, read(&mut stream)).await;
        assert!(waited.is_err(), "no deadline while the request is open");
        let ended = Instant::now();
        drop(request);
        assert!(timed_out(read(&mut stream).await));
        assert_eq!(ended.elapsed(), IDLE, "the deadline counts from the request's end");
    }

    #[tokio::test(start_paused = true)]
    async fn an_http1_byte_between_requests_hands_the_wait_to_the_header_timeout() {
        let (mut stream, mut client, _) = connection();
        client.write_all(b"G").await.unwrap();
        assert_eq!(read(&mut stream).await.unwrap(), b"G");
        let waited = tokio::time::timeout(IDLE * 10, read(&mut stream)).await;
        assert!(waited.is_err(), "the next request has begun: its headers are hyper's to time");
    }

    #[tokio::test(start_paused = true)]
    async fn h2c_bytes_without_a_stream_and_a_stalled_preface_keep_nothing_open() {
        for sent in [H2_PREFACE, &H2_PREFACE[..5]] {
            let (mut stream, mut client, _) = connection();
            client.write_all(sent).await.unwrap();
            read(&mut stream).await.unwrap();
            let started = Instant::now();
            assert!(timed_out(read(&mut stream).await));
            assert_eq!(started.elapsed(), IDLE);
        }
    }
}
