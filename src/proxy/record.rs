//! The record stage: one log line and the metrics of a request, emitted when its response is done.

use std::time::{Duration, Instant};

use crate::session::{SessionUpdate, Store, Usage};
use crate::telemetry::metric;

/// What a request adds to its session, written when the response is done (off its path).
pub struct SessionWrite {
    pub store: Store,
    pub key: String,
    pub update: SessionUpdate,
    /// Messages in the request as the client sent it, stored with the usage.
    pub message_count: u64,
}

/// How a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The body was sent in full.
    Complete,
    /// The client went away before the body ended.
    ClientGone,
    /// The upstream stopped sending for longer than the idle timeout.
    IdleTimeout,
    /// The upstream connection failed mid-body.
    UpstreamError,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::ClientGone => "client_gone",
            Self::IdleTimeout => "idle_timeout",
            Self::UpstreamError => "upstream_error",
        }
    }
}

/// Everything the log line and the metrics of one request need; emitted once, on drop.
pub struct RequestRecord {
    pub request_id: String,
    pub method: http::Method,
    pub route: &'static str,
    pub status: u16,
    pub started: Instant,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Time from forwarding to the upstream's response head.
    pub upstream_ttfb: Option<Duration>,
    /// When the request was handed to the upstream client.
    pub forwarded_at: Option<Instant>,
    /// Time compactor spent before forwarding and after the response head arrived.
    pub overhead: Duration,
    pub outcome: Outcome,
    /// compactor's own error code, when compactor answered instead of the upstream.
    pub error: Option<&'static str>,
    pub streaming: bool,
    /// The session key, when the request belongs to one.
    pub session: Option<String>,
    /// Estimated tokens before and after rewriting, and outputs pruned.
    pub tokens: Option<(u32, u32, usize)>,
    pub session_write: Option<SessionWrite>,
}

impl RequestRecord {
    pub fn new(request_id: String, method: http::Method, route: &'static str) -> Self {
        Self {
            request_id,
            method,
            route,
            status: 0,
            started: Instant::now(),
            bytes_in: 0,
            bytes_out: 0,
            upstream_ttfb: None,
            forwarded_at: None,
            overhead: Duration::ZERO,
            outcome: Outcome::ClientGone,
            error: None,
            streaming: false,
            session: None,
            tokens: None,
            session_write: None,
        }
    }

    /// The usage the upstream reported, to store with the session.
    pub fn set_usage(&mut self, usage: Option<Usage>) {
        if let (Some(write), Some(mut usage)) = (self.session_write.as_mut(), usage) {
            usage.message_count = write.message_count;
            write.update.usage = Some(usage);
        }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        let upstream_latency = self.forwarded_at.map(|at| at.elapsed());
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0);
        let (tokens_before, tokens_after, pruned) = self.tokens.unwrap_or_default();
        tracing::info!(
            request_id = %self.request_id,
            method = %self.method,
            route = %self.route,
            status = self.status,
            upstream_ms = format_args!("{:.1}", ms(upstream_latency)),
            ttfb_ms = format_args!("{:.1}", ms(self.upstream_ttfb)),
            overhead_ms = format_args!("{:.3}", self.overhead.as_secs_f64() * 1000.0),
            bytes_in = self.bytes_in,
            bytes_out = self.bytes_out,
            outcome = %self.outcome.as_str(),
            error = %self.error.unwrap_or("-"),
            session = %self.session.as_deref().unwrap_or("-"),
            tokens_before,
            tokens_after,
            pruned,
            "request"
        );
        metric::request_done(self, upstream_latency);
        if let Some(write) = self.session_write.take() {
            // Off the request's path; a failure only costs the next request its stored state.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Err(error) = write.store.update(&write.key, &write.update).await {
                        tracing::debug!(%error, "session update failed");
                        metric::store_error();
                    }
                });
            }
        }
    }
}
