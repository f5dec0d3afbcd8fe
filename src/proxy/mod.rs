//! The request pipeline: route, read body, rewrite, forward, tap the response, record.

pub mod body;
mod prepare;
pub mod record;
mod recover;
pub mod usage;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::compaction::CompactionSettings;
use crate::config::Config;
use crate::error::{Chain, ProxyError};
use crate::overflow::OverflowDetector;
use crate::rewrite::{PruneSettings, RewriteSettings, Rewriter};
use crate::route::Route;
use crate::session::{Identifier, Store, StoreError};
use crate::tokens::TokenCounter;
use crate::upstream::{Upstreams, headers};

pub use body::ResponseBody;
use body::TapBody;
use prepare::Prepared;
use record::RequestRecord;
use recover::Inspected;
use usage::{Framing, UsageTap};

/// What the pipeline needs for every request, built once at start.
pub struct Proxy {
    pub config: Arc<Config>,
    pub upstreams: Upstreams,
    pub rewriter: Rewriter,
    pub identifier: Identifier,
    pub store: Store,
    pub compaction: CompactionSettings,
    pub detector: OverflowDetector,
    idle_timeout: Duration,
    request_ids: RequestIds,
    store_warnings: RateLimitedWarning,
}

impl Proxy {
    pub fn new(config: Arc<Config>) -> Result<Self, std::io::Error> {
        Ok(Self {
            upstreams: Upstreams::new(&config)?,
            idle_timeout: config.upstream.idle_timeout,
            rewriter: Rewriter::new(
                rewrite_settings(&config),
                TokenCounter::new(config.tokens.cache_entries),
                config.model_table(),
            ),
            identifier: Identifier::new(&config.session.header, config.session.tenant_secret.expose()),
            store: Store::from_config(&config.session),
            compaction: config.compaction.clone(),
            detector: config.compaction.overflow.clone(),
            config,
            request_ids: RequestIds::new(),
            store_warnings: RateLimitedWarning::new(Duration::from_secs(10)),
        })
    }

    /// Logs a session store failure at most once per interval; always counts it.
    pub(crate) fn warn_store(&self, error: &StoreError) {
        crate::telemetry::metric::store_error();
        if self.store_warnings.ready() {
            tracing::warn!(error = %Chain(error), "session store failed; serving without stored state");
        }
    }

    /// Handles one proxied request end to end; never fails, errors become dialect-shaped responses.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<ResponseBody> {
        let route = Route::of(request.method(), request.uri().path(), request.headers());
        let mut record = RequestRecord::new(self.request_ids.next(), request.method().clone(), route.label());
        let (parts, body) = request.into_parts();

        let body = match read_body(&parts.headers, body, self.config.limits.max_body_bytes).await {
            Ok(body) => body,
            Err(error) => return self.fail(error, route, record),
        };
        record.bytes_in = body.len() as u64;

        let prepared = self.prepare(route, &parts, body).await;
        if let Some(report) = &prepared.report {
            record.tokens = Some((report.tokens_before, report.tokens_after, report.pruned));
        }
        record.session = prepared.session.as_ref().map(|s| s.key.clone());
        if let (Some(session), Some(update)) = (&prepared.session, prepared.update.clone()) {
            record.session_write = Some(record::SessionWrite {
                store: self.store.clone(),
                key: session.key.clone(),
                update,
                message_count: prepared.report.as_ref().map_or(0, |r| r.message_count as u64),
            });
        }
        let tap_usage = prepared.session.is_some();

        let forwarded_at = Instant::now();
        record.overhead = forwarded_at - record.started;
        record.forwarded_at = Some(forwarded_at);
        let Prepared { body, session, report, recovery, compacted, .. } = prepared;
        let forwarded = match self.forward(route, &parts, body, recovery, tap_usage).await {
            Ok(forwarded) => forwarded,
            Err(error) => return self.fail(error, route, record),
        };
        let head_at = Instant::now();
        record.upstream_ttfb = Some(head_at - forwarded_at);

        let (mut response_parts, incoming, held) = match forwarded.inspected {
            Inspected::Pass { parts, body, held } => (parts, Some(body), held),
            Inspected::Buffered { parts, body } | Inspected::Overflow { parts, body, .. } => (parts, None, Some(body)),
        };
        let headers = &mut response_parts.headers;
        headers::strip_hop_by_hop(headers);
        headers.insert("x-compactor-request-id", header_value(&record.request_id));
        record.status = response_parts.status.as_u16();
        if let Some(session) = &session {
            headers.insert("x-compactor-session", header_value(&session.key));
        }
        if let Some(report) = &report {
            let after = forwarded.tokens_after.unwrap_or(report.tokens_after);
            headers.insert("x-compactor-tokens-before", HeaderValue::from(report.tokens_before));
            headers.insert("x-compactor-tokens-after", HeaderValue::from(after));
            headers.insert("x-compactor-pruned", HeaderValue::from(report.pruned as u64));
            headers.insert("x-compactor-retries", HeaderValue::from(forwarded.retries));
            record.tokens = Some((report.tokens_before, after, report.pruned));
        }
        if let Some(generation) = forwarded.compacted.or(compacted) {
            headers.insert("x-compactor-compacted", HeaderValue::from(generation));
        }
        record.streaming =
            headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        record.overhead += head_at.elapsed();
        let Some(incoming) = incoming else {
            // compactor read the whole (error) body: send it on exactly as it came.
            headers.remove(header::TRANSFER_ENCODING);
            let bytes = held.unwrap_or_default();
            record.outcome = record::Outcome::Complete;
            return Response::from_parts(response_parts, ResponseBody::full_with_record(bytes, record));
        };
        let usage = (tap_usage && response_parts.status.is_success())
            .then(|| UsageTap::new(if record.streaming { Framing::EventStream } else { Framing::Json }));
        let body = ResponseBody::Upstream { body: TapBody::new(incoming, self.idle_timeout, record, usage, held) };
        Response::from_parts(response_parts, body)
    }

    fn fail(&self, error: ProxyError, route: Route, mut record: RequestRecord) -> Response<ResponseBody> {
        tracing::warn!(
            request_id = %record.request_id,
            route = route.label(),
            error = %Chain(&error),
            retryable = error.retryable(),
            "request failed"
        );
        record.status = error.status().as_u16();
        record.error = Some(error.code());
        if record.forwarded_at.is_none() {
            record.overhead = record.started.elapsed();
        }
        let request_id = header_value(&record.request_id);
        let response: Response<Bytes> = error.into_response(route.family);
        let (mut parts, bytes) = response.into_parts();
        parts.headers.insert("x-compactor-request-id", request_id);
        Response::from_parts(parts, ResponseBody::full_with_record(bytes, record))
    }
}

fn rewrite_settings(config: &Config) -> RewriteSettings {
    RewriteSettings {
        prune_enabled: config.prune.enabled,
        dedupe: config.prune.dedupe,
        prune: PruneSettings {
            protect_tokens: config.prune.protect_tokens,
            minimum_tokens: config.prune.minimum_tokens,
            placeholder: config.prune.placeholder.clone(),
            protected_tools: config.prune.protected_tools.clone(),
        },
        truncate_enabled: config.truncate.enabled,
        tool_output_max_tokens: config.truncate.tool_output_max_tokens,
        repair_enabled: config.repair.enabled,
        image_tokens: config.tokens.image_tokens,
        blocking_tokenize_bytes: usize::try_from(config.tokens.blocking_tokenize_bytes).unwrap_or(usize::MAX),
    }
}

/// Lets a warning through at most once per interval, so a down dependency cannot flood the logs.
struct RateLimitedWarning {
    interval_ms: u64,
    next_ms: AtomicU64,
    epoch: Instant,
}

impl RateLimitedWarning {
    fn new(interval: Duration) -> Self {
        Self { interval_ms: interval.as_millis() as u64, next_ms: AtomicU64::new(0), epoch: Instant::now() }
    }

    fn ready(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && self.next_ms.compare_exchange(next, now + self.interval_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

/// Reads the whole request body, refusing more than `limit` bytes (by Content-Length up front).
async fn read_body(headers: &http::HeaderMap, body: Incoming, limit: u64) -> Result<Bytes, ProxyError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(body, limit_usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(ProxyError::BodyTooLarge { limit }),
        Err(error) => Err(ProxyError::ClientBody(error)),
    }
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// Request ids unique across restarts and replicas: a random per-process prefix and a counter.
struct RequestIds {
    prefix: u32,
    counter: AtomicU64,
}

impl RequestIds {
    fn new() -> Self {
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        let prefix = xxhash_rust::xxh3::xxh3_64(seed.as_bytes()) as u32;
        Self { prefix, counter: AtomicU64::new(0) }
    }

    fn next(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{:08x}{:08x}", self.prefix, n)
    }
}
