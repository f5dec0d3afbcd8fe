//! The one record of a request's outcome, [`RequestOutcome`], filled in as the request goes:
//! compactor's response headers are written from it as the response starts, and once the response
//! is done (or the client left) its log line, its metrics, its span's attributes and the
//! inspector's row ([`super::record::RequestRecord::of`]) are all read from it.

use std::time::{Duration, Instant};

use std::sync::OnceLock;

use metrics::{Counter, Histogram, counter, histogram};

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::compaction::ProviderSizes;
use crate::rewrite::RewriteReport;
use crate::rewrite::content::ContentChange;
use crate::telemetry::metric::{self, ROUTES};
use crate::usage::Usage;

/// compactor's response headers, as names (a name given as text is parsed on every insert).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-compactor-request-id");
const SESSION: HeaderName = HeaderName::from_static("x-compactor-session");
const CONVERSATION: HeaderName = HeaderName::from_static("x-compactor-conversation");
const TOKENS_BEFORE: HeaderName = HeaderName::from_static("x-compactor-tokens-before");
const TOKENS_AFTER: HeaderName = HeaderName::from_static("x-compactor-tokens-after");
const PRUNED: HeaderName = HeaderName::from_static("x-compactor-pruned");
const RETRIES: HeaderName = HeaderName::from_static("x-compactor-retries");
const COMPACTED: HeaderName = HeaderName::from_static("x-compactor-compacted");
/// The overflow recovery's rungs and outcomes (`rebuild:retry`, `truncation:mapped`).
const RUNGS: HeaderName = HeaderName::from_static("x-compactor-rungs");
/// Why compactor left a request it could have rewritten as it came (`bypass`).
const UNTOUCHED: HeaderName = HeaderName::from_static("x-compactor-untouched");

/// A header value of compactor's own text (an id, a session key): never invalid, but said so
/// rather than dropped if it were.
pub fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// How a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The body was sent in full.
    Complete,
    /// The client went away before the body ended.
    ClientGone,
    /// The upstream stopped sending for longer than the idle timeout.
    IdleTimeout,
    /// The upstream connection failed mid-body.
    UpstreamError,
}

impl Ending {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::ClientGone => "client_gone",
            Self::IdleTimeout => "idle_timeout",
            Self::UpstreamError => "upstream_error",
        }
    }
}

/// Everything the log line and the metrics of one request need; written once, by [`RequestOutcome::emit`].
#[derive(Debug)]
pub struct RequestOutcome {
    pub request_id: String,
    pub method: http::Method,
    pub route: &'static str,
    /// The upstream's API family (`openai`, `anthropic`, `gemini`): whose cache prices apply.
    pub family: &'static str,
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
    pub ending: Ending,
    /// compactor's own error code, when compactor answered instead of the upstream.
    pub error: Option<&'static str>,
    pub streaming: bool,
    /// The session key, when the request belongs to one.
    pub session: Option<String>,
    /// The conversation inside the session, when compactor keeps state for it.
    pub conversation: Option<String>,
    /// Tokens before and after rewriting (compactor's estimates, calibrated: the provider's
    /// tokens), and outputs replaced by the placeholder in the body that went out.
    pub tokens: Option<(u32, u32, usize)>,
    /// The compaction generation the body that went out carried.
    pub compacted: Option<u32>,
    /// What the rewrite did, for the inspector's record (set only when the store keeps records).
    /// Boxed: set only when the store keeps records, and large; the record is moved whole
    /// several times a request (into its `Finish`, out to the recording).
    pub rewrite: Option<Box<Rewrite>>,
    /// The token usage the upstream reported, read by the response's tap.
    pub usage: Option<Usage>,
    /// When the response ended (body done, or the client gone).
    pub ended_at: Option<Instant>,
    /// Retries after an overflow.
    pub retries: u32,
    /// What the overflow recovery did, when there was one.
    pub recovery: Option<crate::compaction::Recovery>,
    /// For a request sent upstream ahead of its preparation, `ahead` or `withdrawn`: counted with
    /// the rest of its metrics, after the response, not on its way.
    pub sent_ahead: Option<&'static str>,
    /// Why compactor did not read a request it could have rewritten (`bypass`: the client asked).
    pub untouched: Option<&'static str>,
}

impl RequestOutcome {
    pub fn new(request_id: String, method: http::Method, route: &'static str) -> Self {
        Self {
            request_id,
            method,
            route,
            family: "openai",
            status: 0,
            started: Instant::now(),
            bytes_in: 0,
            bytes_out: 0,
            upstream_ttfb: None,
            forwarded_at: None,
            overhead: Duration::ZERO,
            ending: Ending::ClientGone,
            error: None,
            streaming: false,
            session: None,
            conversation: None,
            tokens: None,
            compacted: None,
            rewrite: None,
            usage: None,
            ended_at: None,
            retries: 0,
            recovery: None,
            sent_ahead: None,
            untouched: None,
        }
    }

    /// Prompt tokens the upstream reported reading from and writing to its cache.
    fn cache(&self) -> (u64, u64) {
        self.usage.map_or((0, 0), |usage| (usage.cached_tokens, usage.cache_write_tokens))
    }

    /// compactor's headers on the response, from the record as the response starts: the
    /// request id always; the session and conversation when the request has them; the tokens,
    /// what was pruned, the retries and the compaction when compactor read the request.
    pub fn write_headers(&self, headers: &mut HeaderMap) {
        headers.insert(REQUEST_ID, header_value(&self.request_id));
        if let Some(session) = &self.session {
            headers.insert(SESSION, header_value(session));
        }
        if let Some(conversation) = &self.conversation {
            headers.insert(CONVERSATION, header_value(conversation));
        }
        if let Some((before, after, pruned)) = self.tokens {
            headers.insert(TOKENS_BEFORE, HeaderValue::from(before));
            headers.insert(TOKENS_AFTER, HeaderValue::from(after));
            headers.insert(PRUNED, HeaderValue::from(pruned as u64));
            headers.insert(RETRIES, HeaderValue::from(self.retries));
        }
        if let Some(generation) = self.compacted {
            headers.insert(COMPACTED, HeaderValue::from(generation));
        }
        if let Some(recovery) = self.recovery.as_ref().filter(|r| !r.rungs.is_empty()) {
            headers.insert(RUNGS, header_value(&recovery.rungs()));
        }
        if let Some(reason) = self.untouched {
            headers.insert(UNTOUCHED, HeaderValue::from_static(reason));
        }
    }

    /// Writes the log line and the metrics.
    pub fn emit(&self) {
        let ended_at = self.ended_at.unwrap_or_else(Instant::now);
        let upstream_latency = self.forwarded_at.map(|at| ended_at.saturating_duration_since(at));
        if tracing::enabled!(tracing::Level::INFO) {
            self.write_line(upstream_latency);
        }
        self.record_metrics(upstream_latency);
    }

    /// The request's log line (its fields are worked out only when the line is written).
    fn write_line(&self, upstream_latency: Option<Duration>) {
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0);
        let (tokens_before, tokens_after, pruned) = self.tokens.unwrap_or_default();
        let recovery = self.recovery.as_ref();
        let overflow = recovery.and_then(|r| r.overflow.as_deref()).unwrap_or("-");
        let rungs = recovery.map(|r| r.rungs()).filter(|r| !r.is_empty()).unwrap_or_else(|| "-".into());
        let summary_ms = recovery.map_or(0, |r| r.summary.as_millis() as u64);
        let summary_calls = recovery.map_or(0, |r| r.summary_calls);
        let (cache_read, cache_write) = self.cache();
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
            outcome = %self.ending.as_str(),
            error = %self.error.unwrap_or("-"),
            session = %self.session.as_deref().unwrap_or("-"),
            conversation = %self.conversation.as_deref().unwrap_or("-"),
            tokens_before,
            tokens_after,
            pruned,
            overflow = %overflow,
            rungs = %rungs,
            retries = self.retries,
            summary_ms,
            summary_calls,
            cache_read,
            cache_write,
            untouched = %self.untouched.unwrap_or("-"),
            "request"
        );
    }

    fn record_metrics(&self, upstream_latency: Option<Duration>) {
        let unknown;
        let metrics = match RouteMetrics::known(self.route) {
            Some(metrics) => metrics,
            None => {
                unknown = RouteMetrics::new(self.route);
                &unknown
            }
        };
        metrics.requests(self.status).increment(1);
        metrics.request_bytes.increment(self.bytes_in);
        metrics.response_bytes.increment(self.bytes_out);
        metrics.overhead.record(self.overhead.as_secs_f64());
        if let Some(ttfb) = self.upstream_ttfb {
            metrics.ttfb.record(ttfb.as_secs_f64());
        }
        if let Some(latency) = upstream_latency {
            metrics.duration.record(latency.as_secs_f64());
        }
        if self.usage.is_some() {
            let (read, write) = self.cache();
            metric::cache_usage(self.route, read, write);
        }
        if let Some(outcome) = self.sent_ahead {
            metric::sent_ahead(outcome);
        }
        if let Some(reason) = self.untouched {
            metric::rewrite_skipped(self.route, reason);
        }
        if let Some(code) = self.error {
            counter!("compactor_errors_total", "route" => self.route, "code" => code).increment(1);
        }
    }
}

/// Status labels [`status_label`] gives.
const STATUSES: [&str; 22] = [
    "200", "201", "204", "304", "400", "401", "403", "404", "408", "413", "422", "429", "500", "502", "503", "504",
    "529", "1xx", "2xx", "3xx", "4xx", "5xx",
];

/// One route's metric handles, resolved once (the first request of the route, after the recorder
/// is installed at start) instead of a registry lookup by name and labels on every record.
struct RouteMetrics {
    route: &'static str,
    requests: [OnceLock<Counter>; STATUSES.len()],
    request_bytes: Counter,
    response_bytes: Counter,
    overhead: Histogram,
    ttfb: Histogram,
    duration: Histogram,
}

/// One slot per route label ([`metric::ROUTES`]); any other label gets its handles looked up on
/// each record.
static ROUTE_METRICS: [OnceLock<RouteMetrics>; ROUTES.len()] = [const { OnceLock::new() }; ROUTES.len()];

impl RouteMetrics {
    fn new(route: &'static str) -> Self {
        Self {
            route,
            requests: [const { OnceLock::new() }; STATUSES.len()],
            request_bytes: counter!("compactor_request_bytes_total", "route" => route),
            response_bytes: counter!("compactor_response_bytes_total", "route" => route),
            overhead: histogram!("compactor_overhead_seconds", "route" => route),
            ttfb: histogram!("compactor_upstream_ttfb_seconds", "route" => route),
            duration: histogram!("compactor_upstream_duration_seconds", "route" => route),
        }
    }

    fn known(route: &str) -> Option<&'static Self> {
        let at = ROUTES.iter().position(|known| *known == route)?;
        Some(ROUTE_METRICS[at].get_or_init(|| Self::new(ROUTES[at])))
    }

    fn requests(&self, status: u16) -> Counter {
        let label = status_label(status);
        let new = || counter!("compactor_requests_total", "route" => self.route, "status" => label);
        match STATUSES.iter().position(|known| *known == label) {
            Some(at) => self.requests[at].get_or_init(new).clone(),
            None => new(),
        }
    }
}

/// Status codes as static strings, so labels never allocate and stay bounded.
fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        201 => "201",
        204 => "204",
        304 => "304",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        408 => "408",
        413 => "413",
        422 => "422",
        429 => "429",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        529 => "529",
        s if s < 200 => "1xx",
        s if s < 300 => "2xx",
        s if s < 400 => "3xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}

/// Pruned call ids named in one record at most (the count is always whole).
pub const NAMED_IDS: usize = 8;

/// What the proxy knows of a request's rewrite when its response starts: kept on the request's
/// record until the inspector's row is written from it.
#[derive(Debug, Default)]
pub struct Rewrite {
    pub model: String,
    pub pruned: usize,
    pub truncated: usize,
    pub deduped: usize,
    pub repaired: usize,
    pub saved_by_prune: u32,
    pub saved_by_truncate: u32,
    pub saved_by_dedupe: u32,
    pub reason: Option<&'static str>,
    pub pruned_ids: Vec<String>,
    pub held: u32,
    pub compacted: Option<u32>,
    pub window: u64,
    pub threshold: u64,
    pub content: Vec<ContentChange>,
    pub content_omitted: u32,
}

impl Rewrite {
    /// The descriptors of `report`; `window` and `threshold` in the provider's tokens.
    pub fn of(
        report: &RewriteReport,
        sizes: &ProviderSizes,
        model: &str,
        compacted: Option<u32>,
        window: u64,
        threshold: u64,
    ) -> Self {
        Self {
            model: model.to_string(),
            pruned: report.pruned,
            truncated: report.truncated,
            deduped: report.deduped,
            repaired: report.repaired,
            saved_by_prune: sizes.saved_by_prune,
            saved_by_truncate: sizes.saved_by_truncate,
            saved_by_dedupe: sizes.saved_by_dedupe,
            reason: report.prefix_break.map(|reason| reason.label()),
            pruned_ids: report.pruned_call_ids.iter().take(NAMED_IDS).cloned().collect(),
            held: report.held_tokens,
            compacted,
            window,
            threshold,
            content: report.content.as_ref().map(|kept| kept.changes.clone()).unwrap_or_default(),
            content_omitted: report.content.as_ref().map_or(0, |kept| kept.omitted),
        }
    }
}
