//! compactor's own HTTP/1.1 connections to one upstream: hyper's low-level `client::conn::http1`
//! and a small pool of idle connections, cheaper per request than hyper-util's legacy client (no
//! key hashed per request, no channel and no task per request to return a connection).
//!
//! A connection goes back to the pool only once the response before it was read to its end, so a
//! request never queues behind an unread body; a dropped body drops its connection.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;

use super::UpstreamBody;

/// How long a connection may sit idle in the pool before it is closed (hyper-util's default).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Most idle connections kept per upstream; a connection returned to a full pool closes the
/// oldest idle one.
const MAX_IDLE: usize = 256;

/// How often a pool closes the connections idle for longer than [`IDLE_TIMEOUT`] when no request
/// comes to do it.
const REAP_INTERVAL: Duration = Duration::from_secs(15);

/// The sending half of one HTTP/1.1 connection to an upstream.
pub(super) type Sender = SendRequest<UpstreamBody>;

/// The idle connections to one upstream, most recently used last.
#[derive(Default)]
pub(super) struct Pool {
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    sender: Sender,
    since: Instant,
}

impl Pool {
    /// A pool, with a task that closes its long-idle connections while there is a runtime to run
    /// it (not in unit tests that only build requests).
    pub(super) fn new() -> Arc<Self> {
        let pool = Arc::new(Self::default());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(reap(Arc::downgrade(&pool)));
        }
        pool
    }

    /// The most recently used idle connection that can take a request now; closed and expired
    /// ones met on the way are dropped.
    pub(super) fn checkout(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(Idle { sender, since }) = idle.pop() {
            if sender.is_ready() && since.elapsed() < IDLE_TIMEOUT {
                return Some(sender);
            }
        }
        None
    }

    /// Keeps a connection whose last response was read whole, for the next request.
    pub(super) fn put(&self, sender: Sender) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        drop_expired(&mut idle, now);
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push(Idle { sender, since: now });
    }

    /// Returns a connection after its response ended: at once when it can take the next request
    /// (the usual case: hyper readies it before the body's end reaches us), else once it can.
    fn release(self: Arc<Self>, mut sender: Sender) {
        if sender.is_ready() {
            self.put(sender);
        } else if !sender.is_closed()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                if sender.ready().await.is_ok() {
                    self.put(sender);
                }
            });
        }
    }

    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Drops the connections idle since before [`IDLE_TIMEOUT`] ago: the oldest, at the front.
fn drop_expired(idle: &mut Vec<Idle>, now: Instant) {
    let expired = idle.partition_point(|entry| now.duration_since(entry.since) >= IDLE_TIMEOUT);
    idle.drain(..expired);
}

/// Closes a pool's expired and closed connections every [`REAP_INTERVAL`] until the pool is gone.
async fn reap(pool: Weak<Pool>) {
    let mut interval = tokio::time::interval(REAP_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let mut idle = pool.idle.lock().unwrap_or_else(PoisonError::into_inner);
        drop_expired(&mut idle, Instant::now());
        idle.retain(|entry| !entry.sender.is_closed());
    }
}

/// The connection a response came on, held by its body until the body ends.
struct Lease {
    pool: Arc<Pool>,
    sender: Sender,
}

pin_project_lite::pin_project! {
    /// An upstream's response body. When read to its end it returns its connection to the pool;
    /// dropped before that, it drops the connection (hyper closes it).
    pub struct PooledBody {
        #[pin]
        inner: Incoming,
        lease: Option<Lease>,
    }

    impl PinnedDrop for PooledBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // A body with nothing in it (or its last frame read) is never polled to its end.
            if this.inner.is_end_stream()
                && let Some(Lease { pool, sender }) = this.lease.take()
            {
                pool.release(sender);
            }
        }
    }
}

impl PooledBody {
    /// A body whose connection goes back to `pool` when it ends.
    pub(super) fn leased(inner: Incoming, pool: Arc<Pool>, sender: Sender) -> Self {
        Self { inner, lease: Some(Lease { pool, sender }) }
    }

    /// A body whose connection is someone else's (hyper-util's client for HTTP/2).
    pub(super) fn unpooled(inner: Incoming) -> Self {
        Self { inner, lease: None }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            Poll::Ready(Some(Err(_))) => {
                // A broken response leaves its connection unusable.
                this.lease.take();
                false
            }
            Poll::Pending => false,
        };
        if ended && let Some(Lease { pool, sender }) = this.lease.take() {
            pool.release(sender);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;
    use tokio::io::DuplexStream;
    use tokio::task::JoinHandle;

    /// A ready connection over an in-memory pipe, the upstream's end of that pipe, and the
    /// connection's task: it ends once it has seen the upstream close the pipe, and the sender
    /// reports itself closed from then on. Awaiting it is what a test waits for, never a delay.
    async fn connection() -> (Sender, DuplexStream, JoinHandle<()>) {
        let (client, upstream) = tokio::io::duplex(1024);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client)).await.unwrap();
        // An upstream that closes the pipe ends the connection (with an error: no response came).
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        sender.ready().await.unwrap();
        (sender, upstream, task)
    }

    /// Closes a connection from the upstream's side and waits until its task has seen it.
    async fn close(upstream: DuplexStream, task: JoinHandle<()>) {
        drop(upstream);
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_checkout_takes_the_most_recently_used_connection_and_drops_closed_ones() {
        let pool = Pool::default();
        let (older, _older_upstream, _older_task) = connection().await;
        let (recent, recent_upstream, recent_task) = connection().await;
        let (newest, newest_upstream, newest_task) = connection().await;
        pool.put(older);
        pool.put(recent);
        pool.put(newest);
        close(newest_upstream, newest_task).await;

        let taken = pool.checkout().unwrap();
        assert_eq!(pool.idle(), 1, "the closed connection was dropped, the older one kept");
        assert!(!taken.is_closed());
        close(recent_upstream, recent_task).await;
        assert!(taken.is_closed(), "the one taken was the most recently used open one");
    }

    #[tokio::test]
    async fn the_idle_list_is_bounded_and_a_full_pool_drops_its_oldest() {
        let pool = Pool::default();
        let mut connections = Vec::new();
        for _ in 0..=MAX_IDLE {
            let (sender, upstream, task) = connection().await;
            pool.put(sender);
            connections.push((upstream, task));
        }
        assert_eq!(pool.idle(), MAX_IDLE);
        let (first_upstream, first_task) = connections.remove(0);
        close(first_upstream, first_task).await;
        let mut idle = pool.idle.lock().unwrap();
        idle.retain(|entry| !entry.sender.is_closed());
        assert_eq!(idle.len(), MAX_IDLE, "the first connection, the oldest, was the one dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn the_reaper_closes_connections_idle_past_the_timeout_and_stops_with_its_pool() {
        let pool = Arc::new(Pool::default());
        let reaper = tokio::spawn(reap(Arc::downgrade(&pool)));
        let (stale, _stale_upstream, _stale_task) = connection().await;
        pool.put(stale);
        // `since` is std's clock, which a paused runtime does not move: set the entry's age.
        pool.idle.lock().unwrap()[0].since = Instant::now() - IDLE_TIMEOUT;
        let (fresh, _fresh_upstream, _fresh_task) = connection().await;
        pool.put(fresh);
        assert_eq!(pool.idle(), 1, "a put drops the expired one at once");
        pool.idle.lock().unwrap()[0].since = Instant::now() - IDLE_TIMEOUT;
        // The reaper's next tick, on tokio's paused clock.
        tokio::time::sleep(REAP_INTERVAL + Duration::from_millis(1)).await;
        assert_eq!(pool.idle(), 0, "the reaper closed the connection idle past the timeout");
        drop(pool);
        tokio::time::sleep(REAP_INTERVAL + Duration::from_millis(1)).await;
        assert!(reaper.is_finished(), "the reaper stops once its pool is gone");
    }
}
