//! The request pipeline. `proxy/` moves bytes: it reads the body, asks the
//! [`Compactor`] what to send, forwards it (retrying after an overflow with what the compactor
//! says), taps the response on its way to the client, and hands what is left of the request to
//! its finisher.

mod ahead;
pub mod body;
mod finish;
pub use finish::{RECORDED_WITHIN, recorded, recording};
mod forward;
mod inspect;
pub mod outcome;
mod phases;
pub mod record;
pub mod request_body;
/// The usage reader lives at the crate root (the summary calls read it too).
pub use crate::usage;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use tokio_util::task::TaskTracker;

use crate::boxed::boxed;
use crate::compaction::{Compactor, ProviderSizes};
use crate::config::Config;
use crate::error::{Chain, ProxyError};
use crate::rewrite::RewriteReport;
use crate::route::Route;
use crate::session::Store;
use crate::telemetry::trace;
use crate::upstream::{RequestHead, Upstreams, headers};
use outcome::{REQUEST_ID, RequestOutcome, header_value};
use record::Rewrite;
use tracing::Instrument;

pub use body::ResponseBody;
use body::TapBody;
use finish::Finish;
use forward::Forwarded;
use inspect::Inspected;
use request_body::ClientBody;
use usage::{Framing, UsageTap};

/// What the pipeline needs for every request, built once at start.
pub struct Proxy {
    config: Arc<Config>,
    upstreams: Arc<Upstreams>,
    compactor: Compactor,
    /// The finishers of requests that took session state, so shutdown can wait for their writes.
    finishers: TaskTracker,
    request_ids: RequestIds,
    /// `bypass.header`, when it names one.
    bypass: Option<header::HeaderName>,
}

impl Proxy {
    pub fn new(config: Arc<Config>, store: Store) -> Result<Self, std::io::Error> {
        let upstreams = Arc::new(Upstreams::new(&config)?);
        // compactor's AWS credentials, found while the listener starts: a client-signed Bedrock
        // request is only rewritten when compactor can sign what it changed.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let warming = upstreams.clone();
            runtime.spawn(async move { warming.cloud().keep_fresh().await });
        }
        Ok(Self {
            bypass: header::HeaderName::from_bytes(config.bypass.header.as_bytes()).ok(),
            compactor: Compactor::new(&config, store, upstreams.clone()),
            upstreams,
            config,
            finishers: TaskTracker::new(),
            request_ids: RequestIds::new(),
        })
    }

    /// Sets the gauges of the in-process caches' sizes (before a scrape).
    pub fn record_cache_sizes(&self) {
        for (cache, size) in self.compactor.cache_sizes() {
            crate::telemetry::metric::cache_size(cache, size);
        }
    }

    /// Waits until every request's finisher is done; requests that start later are not waited for.
    pub async fn finished(&self) {
        self.finishers.close();
        self.finishers.wait().await;
    }

    /// Handles one proxied request end to end; never fails, errors become dialect-shaped responses.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<ResponseBody> {
        let route = Route::of(request.method(), request.uri().path(), request.headers());
        let mut log = RequestOutcome::new(self.request_ids.next(), request.method().clone(), route.label());
        log.family = route.family.label();
        // The request's span lives as long as its Finish: until the response body has ended.
        let span = trace::request_span(request.method(), &route, &log.request_id);
        trace::continue_trace(&span, request.headers());
        // Only a request served outside a recording connection (an HTTP/2 stream's task) spawns
        // its recording, on the tracked finishers.
        let tracker = (!finish::in_recording_connection()).then(|| self.finishers.clone());
        let finish = Finish::new(log, span.clone(), tracker);
        // Boxed where it runs: held inline, this future and every one around it were copied whole
        // as they moved (see `crate::boxed`).
        boxed(|| self.handle_traced(request, route, finish)).instrument(span).await
    }

    /// The pipeline, phase by phase ([`phases`]): admit, read, prepare (or send ahead), forward
    /// (recovering from an overflow), respond; the record follows the response ([`finish`]).
    async fn handle_traced(
        &self,
        request: Request<Incoming>,
        route: Route,
        mut finish: Box<Finish>,
    ) -> Response<ResponseBody> {
        let (mut parts, body) = request.into_parts();
        let bypassed = self.bypassed(&mut parts.headers);
        let counted = match self.admit(route, &parts.headers) {
            Ok(phases::Admitted::PassThrough) => {
                return self.pass_through(RequestHead::new(route, parts), body, finish).await;
            }
            Ok(phases::Admitted::Rewritable { .. }) if bypassed => {
                finish.outcome.untouched = Some(crate::compaction::decision::Untouched::Bypass.label());
                return self.pass_through(RequestHead::new(route, parts), body, finish).await;
            }
            Ok(phases::Admitted::Rewritable { counted }) => counted,
            Err(error) => return fail(error, route, finish),
        };
        // Each phase awaited here, not inside an async block of its own: a block is one more
        // future around the phases', and each move between them copies its state.
        let read = match self.read(parts, body, &mut finish).await {
            Ok(read) => read,
            Err(error) => return fail(error, route, finish),
        };
        let ready = match self.prepare(route, read, counted, &mut finish).await {
            Ok(ready) => ready,
            Err(error) => return fail(error, route, finish),
        };
        match self.forward(ready, &mut finish).await {
            Ok((forwarded, answer)) => self.respond(forwarded, answer, finish),
            Err(error) => fail(error, route, finish),
        }
    }

    /// Whether the client asked for its request to go as it came (`bypass.header`); the header is
    /// removed whatever it says, so that it never reaches the provider.
    fn bypassed(&self, headers: &mut http::HeaderMap) -> bool {
        let Some(value) = self.bypass.as_ref().and_then(|name| headers.remove(name)) else { return false };
        ["1", "true", "yes", "on"].iter().any(|yes| value.as_bytes().eq_ignore_ascii_case(yes.as_bytes()))
    }

    /// A request compactor never rewrites: its body streams to the upstream as it arrives, with no
    /// cap of compactor's own, and the response comes back as it is.
    async fn pass_through(&self, head: RequestHead, body: Incoming, mut finish: Box<Finish>) -> Response<ResponseBody> {
        let route = head.route;
        let timeout = self.config.limits.client_body_timeout;
        if self.upstreams.cloud().signs_whole_body(route.family, &head.headers) {
            return self.pass_through_signed(head, body, finish).await;
        }
        let body = ClientBody::new(body, timeout);
        let progress = body.progress();
        let request = match self.upstreams.build_streamed(&head, body) {
            Ok(request) => request,
            Err(error) => return fail(error, route, finish),
        };
        let forwarded_at = forwarded_now(&mut finish);
        let sent = self.upstreams.send(route.family, request).await;
        finish.outcome.bytes_in = progress.bytes();
        let response = match sent {
            Ok(response) => response,
            // A body that stalled or broke off is the client's failure, not the upstream's.
            Err(error) => {
                let error = progress.client_error(timeout).unwrap_or(error);
                return fail(error, route, finish);
            }
        };
        self.respond_unread(response, forwarded_at, finish)
    }

    /// A request compactor does not rewrite but signs (a client-key request to Bedrock): a
    /// signature covers the whole body, so it is read whole first (up to `limits.max_body_bytes`),
    /// then sent as it came, signed.
    async fn pass_through_signed(
        &self,
        head: RequestHead,
        body: Incoming,
        mut finish: Box<Finish>,
    ) -> Response<ResponseBody> {
        let route = head.route;
        let limits = &self.config.limits;
        let body = match request_body::read_whole(
            &head.headers,
            body,
            limits.max_body_bytes,
            limits.client_body_timeout,
        )
        .await
        {
            Ok(body) => body,
            Err(error) => return fail(error, route, finish),
        };
        finish.outcome.bytes_in = body.len() as u64;
        let request = match self.upstreams.build_request(&head, body) {
            Ok(request) => request,
            Err(error) => return fail(error, route, finish),
        };
        let forwarded_at = forwarded_now(&mut finish);
        let response = match self.upstreams.send(route.family, request).await {
            Ok(response) => response,
            Err(error) => return fail(error, route, finish),
        };
        self.respond_unread(response, forwarded_at, finish)
    }

    /// The answer to a request compactor sent without reading it (`forwarded_at`), passed on.
    fn respond_unread(
        &self,
        response: http::Response<crate::upstream::PooledBody>,
        forwarded_at: Instant,
        mut finish: Box<Finish>,
    ) -> Response<ResponseBody> {
        finish.outcome.upstream_ttfb = Some(forwarded_at.elapsed());
        let forwarded = Forwarded {
            inspected: Inspected::pass(response),
            retries: 0,
            compacted: None,
            tokens_after: None,
            recovery: None,
        };
        let answer = Answer { report: None, compacted: None, tap_usage: false };
        self.respond(forwarded, answer, finish)
    }

    /// The response for the client: the upstream's head with compactor's headers, and its body
    /// passed on (or the error body already read, as it came).
    fn respond(&self, forwarded: Forwarded, answer: Answer, mut finish: Box<Finish>) -> Response<ResponseBody> {
        let head_at = Instant::now();
        let (mut response_parts, incoming, held) = match forwarded.inspected {
            Inspected::Pass { parts, body, held, last_frame } => (parts, Some((body, last_frame)), held),
            Inspected::Buffered { parts, body } | Inspected::Overflow { parts, body, .. } => (parts, None, Some(body)),
        };
        let headers = &mut response_parts.headers;
        headers::strip_hop_by_hop(headers);
        let outcome = &mut finish.outcome;
        outcome.status = response_parts.status.as_u16();
        outcome.retries = forwarded.retries;
        outcome.compacted = forwarded.compacted.or(answer.compacted);
        if let Some((report, sizes)) = answer.report.as_deref() {
            let after = forwarded.tokens_after.unwrap_or(sizes.after);
            // Outputs replaced by the placeholder in the body that went out, whichever rung did it.
            let pruned = forwarded.recovery.as_ref().map_or(report.pruned, |r| r.pruned.max(report.pruned));
            outcome.tokens = Some((sizes.before, after, pruned));
            let compacted = outcome.compacted;
            let rewrite = finish.ctx().filter(|ctx| ctx.records_requests()).map(|ctx| {
                // The window and threshold in the provider's tokens, as the sizes beside them
                // (the report's are calibrated by the preparation).
                let pressure = self.compactor.pressure(ctx, report);
                let (window, threshold) = (pressure.window.get(), pressure.budget().get());
                Rewrite::of(report, sizes, ctx.model_name(), compacted, window, threshold)
            });
            finish.outcome.rewrite = rewrite.map(Box::new);
            finish.span.record("compactor.retries", forwarded.retries);
        }
        finish.outcome.recovery = forwarded.recovery;
        if let Some(generation) = finish.outcome.compacted {
            finish.span.record("compactor.compaction_generation", generation);
        }
        finish.outcome.write_headers(headers);
        let content_type = headers.get(header::CONTENT_TYPE).map(HeaderValue::as_bytes).unwrap_or_default();
        let aws_frames = content_type.starts_with(crate::event_stream::CONTENT_TYPE.as_bytes());
        finish.outcome.streaming = content_type.starts_with(b"text/event-stream") || aws_frames;
        finish.outcome.overhead += head_at.elapsed();
        let Some((incoming, last_frame)) = incoming else {
            // compactor read the whole (error) body: send it on exactly as it came.
            headers.remove(header::TRANSFER_ENCODING);
            let bytes = held.unwrap_or_default();
            return Response::from_parts(response_parts, ResponseBody::finished(bytes, finish));
        };
        let framing = match (aws_frames, finish.outcome.streaming) {
            (true, _) => Framing::AwsEventStream,
            (false, true) => Framing::EventStream,
            (false, false) => Framing::Json,
        };
        let usage = (answer.tap_usage && response_parts.status.is_success()).then(|| UsageTap::new(framing));
        let idle_timeout = self.config.upstream.idle_timeout;
        let body =
            ResponseBody::Upstream { body: TapBody::new(incoming, idle_timeout, last_frame, finish, usage, held) };
        Response::from_parts(response_parts, body)
    }
}

/// A prepared request once its finish took what it keeps.
struct Taken {
    body: Bytes,
    ladder: Option<Box<crate::compaction::Ladder>>,
    answer: Answer,
}

/// What the response tells the client about what compactor did (the session and conversation
/// are on the request's outcome already).
struct Answer {
    /// The rewrite (in compactor's estimates) and its sizes in the provider's tokens.
    /// Boxed: a report is hundreds of bytes, moved from the preparation to the response.
    report: Option<Box<(RewriteReport, ProviderSizes)>>,
    /// The compaction generation applied before forwarding.
    compacted: Option<u32>,
    /// Whether the session wants the response's usage (the upstream was asked not to compress).
    tap_usage: bool,
}

/// Notes that the request goes upstream now: what came before was compactor's overhead.
fn forwarded_now(finish: &mut Finish) -> Instant {
    let forwarded_at = Instant::now();
    finish.outcome.overhead = forwarded_at - finish.outcome.started;
    finish.outcome.forwarded_at = Some(forwarded_at);
    forwarded_at
}

/// compactor's own answer to a request it could not forward.
fn fail(error: ProxyError, route: Route, mut finish: Box<Finish>) -> Response<ResponseBody> {
    let log = &mut finish.outcome;
    tracing::warn!(
        request_id = %log.request_id,
        route = route.label(),
        error = %Chain(&error),
        retryable = error.retryable(),
        "request failed"
    );
    log.status = error.status().as_u16();
    log.error = Some(error.code());
    if log.forwarded_at.is_none() {
        log.overhead = log.started.elapsed();
    }
    let request_id = header_value(&log.request_id);
    let retry_soon = matches!(error, ProxyError::InflightBodies { .. });
    let response: Response<Bytes> = error.into_response(route.family);
    let (mut parts, bytes) = response.into_parts();
    parts.headers.insert(REQUEST_ID, request_id);
    if retry_soon {
        parts.headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    Response::from_parts(parts, ResponseBody::finished(bytes, finish))
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

    /// 16 hex digits: the prefix, then the counter's low 32 bits.
    fn next(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        if n > u64::from(u32::MAX) {
            return format!("{:08x}{n:08x}", self.prefix);
        }
        crate::hex::u64((u64::from(self.prefix) << 32) | n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_the_process_prefix_then_the_counter_in_hex() {
        let ids = RequestIds::new();
        let prefix = format!("{:08x}", ids.prefix);
        assert_eq!(ids.next(), format!("{prefix}00000000"));
        assert_eq!(ids.next(), format!("{prefix}00000001"));
        ids.counter.store(0xabcd_ef12, Ordering::Relaxed);
        assert_eq!(ids.next(), format!("{prefix}abcdef12"));
        ids.counter.store(u64::from(u32::MAX) + 1, Ordering::Relaxed);
        assert_eq!(ids.next(), format!("{prefix}100000000"));
    }
}
