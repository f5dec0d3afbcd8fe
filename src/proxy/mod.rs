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
pub mod log;
pub mod record;
pub mod request_body;
/// The usage reader lives at the crate root (the summary calls read it too).
pub use crate::usage;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use tokio_util::task::TaskTracker;

use crate::boxed::boxed;
use crate::compaction::{Compactor, Prepared};
use crate::config::Config;
use crate::dialect::Dialect;
use crate::error::{Chain, ProxyError};
use crate::rewrite::RewriteReport;
use crate::route::Route;
use crate::session::{ConversationId, Store};
use crate::telemetry::trace;
use crate::tokens;
use crate::upstream::{RequestHead, Upstreams, headers};
use crate::work::Budget;
use log::RequestLog;
use record::Rewrite;
use tracing::Instrument;

pub use body::ResponseBody;
use body::TapBody;
use finish::Finish;
use forward::Forwarded;
use inspect::Inspected;
use request_body::{ClientBody, Encoded};
use usage::{Framing, UsageTap};

/// compactor's response headers, as names (a name given as text is parsed on every insert).
const REQUEST_ID: HeaderName = HeaderName::from_static("x-compactor-request-id");
const SESSION: HeaderName = HeaderName::from_static("x-compactor-session");
const CONVERSATION: HeaderName = HeaderName::from_static("x-compactor-conversation");
const TOKENS_BEFORE: HeaderName = HeaderName::from_static("x-compactor-tokens-before");
const TOKENS_AFTER: HeaderName = HeaderName::from_static("x-compactor-tokens-after");
const PRUNED: HeaderName = HeaderName::from_static("x-compactor-pruned");
const RETRIES: HeaderName = HeaderName::from_static("x-compactor-retries");
const COMPACTED: HeaderName = HeaderName::from_static("x-compactor-compacted");

/// What the pipeline needs for every request, built once at start.
pub struct Proxy {
    config: Arc<Config>,
    upstreams: Arc<Upstreams>,
    compactor: Compactor,
    /// The finishers of requests that took session state, so shutdown can wait for their writes.
    finishers: TaskTracker,
    request_ids: RequestIds,
}

impl Proxy {
    pub fn new(config: Arc<Config>, store: Store) -> Result<Self, std::io::Error> {
        let upstreams = Arc::new(Upstreams::new(&config)?);
        Ok(Self {
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
        let mut log = RequestLog::new(self.request_ids.next(), request.method().clone(), route.label());
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

    async fn handle_traced(
        &self,
        request: Request<Incoming>,
        route: Route,
        mut finish: Box<Finish>,
    ) -> Response<ResponseBody> {
        let (parts, body) = request.into_parts();
        if let Some(error) = request_body::unsupported_transfer_coding(&parts.headers) {
            return fail(error, route, finish);
        }
        // A family whose upstream is not configured (Vertex AI without `upstream.vertex`): said
        // at once, before the body is read or any session touched.
        if let Err(error) = self.upstreams.serves(route.family) {
            return fail(error, route, finish);
        }
        // A platform compactor does not serve yet (Bedrock, a partner model on Vertex AI): its
        // credential goes nowhere.
        if let crate::route::Endpoint::Unserved(platform) = route.endpoint {
            return fail(ProxyError::Unserved { platform }, route, finish);
        }
        // A token-count request is read and rewritten like the request it counts, never changing
        // the session (see `Compactor::count`).
        let counted = Dialect::counted(route.endpoint);
        if Dialect::of(route.endpoint).is_none() && counted.is_none() {
            return self.pass_through(RequestHead::new(route, parts), body, finish).await;
        }

        let limits = &self.config.limits;
        // This request's share of the body bytes in flight: taken before the body is read when
        // it declares its length, else once read, and grown to its decoded size; held until the
        // upstream's answer comes (the body, its parse and the rewritten body live until then).
        let mut held = crate::inflight::Held::default();
        if let Some(length) = request_body::declared_length(&parts.headers)
            && let Err(error) = self.compactor.inflight().hold(&mut held, length.min(limits.max_body_bytes))
        {
            request_body::discard(body, limits.max_body_bytes, limits.client_body_timeout).await;
            return fail(error, route, finish);
        }
        let body =
            match request_body::read_whole(&parts.headers, body, limits.max_body_bytes, limits.client_body_timeout)
                .await
            {
                Ok(body) => body,
                Err(error) => return fail(error, route, finish),
            };
        finish.log.bytes_in = body.len() as u64;
        if let Err(error) = self.compactor.inflight().hold(&mut held, body.len() as u64) {
            return fail(error, route, finish);
        }
        // A request compactor has no reason to touch goes upstream now, and is prepared while the
        // provider reads it (see `ahead`); the preparation's body still decides what is answered.
        let quiet = counted.is_none()
            && !parts.headers.contains_key(header::CONTENT_ENCODING)
            && self.compactor.nothing_to_decide(route.endpoint, &body);
        let ready = if quiet {
            self.prepare_ahead(RequestHead::new(route, parts), body, &mut finish).await
        } else {
            let mut parts = parts;
            // compactor's own work on the request (decoding it included): budgeted, off the async
            // workers when the body is large, and stopped when the client leaves (hyper drops this
            // future, and the guard with it).
            let budget = Budget::new(self.config.limits.rewrite_budget, body.len());
            let stop_when_gone = budget.stop_on_drop();
            let tenant = self.compactor.tenant(&parts.headers);
            // Boxed: a decoder's state (brotli's above all) is large, and held inline it made every
            // request's future tens of kilobytes, copied at each move (a small request went from
            // 119k to 170k instructions, most of them memcpy: scripts/callgrind-small).
            let decoding = boxed(|| request_body::decode(&mut parts.headers, body, limits.max_body_bytes));
            let (body, encoded) = match budget.scope(decoding).await {
                Ok(decoded) => decoded,
                Err(error) => return fail(error, route, finish),
            };
            if let Err(error) = self.compactor.inflight().hold(&mut held, body.len() as u64) {
                return fail(error, route, finish);
            }
            // Bounded by the body as decoded: what the parse reads.
            budget.bound_parse(limits.parse_memory(body.len()));
            let encoded = encoded.map(|encoded| (encoded, body.clone()));
            let head = RequestHead::new(route, parts);

            // Boxed: these futures are large (a summary call lives in them), and a future is copied
            // each time it is moved; a box moves as one pointer.
            // Token counts are cached per tenant (see `tokens::scoped`).
            let prepared = match counted {
                Some(dialect) => {
                    // A count reads the session as the next request would: with the requests
                    // already answered recorded (their recording follows the response).
                    recorded(RECORDED_WITHIN).await;
                    budget.scope(tokens::scoped(&tenant, boxed(|| self.compactor.count(&head, dialect, body)))).await
                }
                None => {
                    budget
                        .scope(tokens::scoped(
                            &tenant,
                            boxed(|| self.compactor.prepare(&head, body, &finish.log.request_id)),
                        ))
                        .await
                }
            };
            let taken = self.take(prepared, &mut finish, counted.is_some());
            Ready { head, budget, stop_when_gone, tenant, taken, encoded, sent_ahead: None }
        };
        let Ready { head, budget, stop_when_gone: _stop_when_gone, tenant, taken, encoded, sent_ahead } = ready;
        let Taken { body, mut ladder, answer } = taken;
        // A compressed body compactor did not change goes as the client sent it.
        let encoded = encoded.filter(|(_, decoded)| *decoded == body).map(|(encoded, _)| encoded);
        let tap_usage = answer.tap_usage;

        let ahead = match sent_ahead {
            Some(Some(answer)) => {
                finish.log.sent_ahead = Some("ahead");
                Some(answer)
            }
            Some(None) => {
                finish.log.sent_ahead = Some("withdrawn");
                tracing::info!(
                    request_id = %finish.log.request_id,
                    "the request sent ahead of its preparation was dropped: the preparation changed its body"
                );
                None
            }
            None => None,
        };
        let forwarded_at = match (&ahead, finish.log.forwarded_at) {
            (Some(_), Some(at)) => at,
            _ => {
                let now = Instant::now();
                finish.log.overhead = now - finish.log.started;
                finish.log.forwarded_at = Some(now);
                now
            }
        };
        let recovery = ladder.as_deref_mut().zip(finish.ctx());
        let forwarding = boxed(|| {
            forward::forward(&self.upstreams, &self.compactor, &head, body, encoded, recovery, tap_usage, ahead)
        });
        let forwarded = match budget.scope(tokens::scoped(&tenant, forwarding)).await {
            Ok(forwarded) => forwarded,
            Err(error) => return fail(error, route, finish),
        };
        finish.log.upstream_ttfb = Some(forwarded_at.elapsed());
        self.respond(forwarded, answer, finish)
    }

    /// Takes a prepared request apart: its session state and what the log says go to the
    /// request's finish; the body, the ladder and what the response tells are left.
    fn take(&self, prepared: Prepared, finish: &mut Finish, counted: bool) -> Taken {
        let Prepared { body, session, conversation, report, compacted, ctx, ladder, answered } = prepared;
        finish.answered = answered;
        if let Some(report) = &report {
            finish.log.tokens = Some((report.tokens_before, report.tokens_after, report.pruned));
        }
        finish.log.session = session.as_ref().map(|s| s.key.clone());
        finish.log.conversation = conversation.as_ref().map(|c| c.to_string());
        if let Some(ctx) = ctx {
            finish.keep(&self.finishers, ctx);
        }
        let tap_usage = session.is_some() && !counted;
        let answer = Answer { session: session.map(|s| s.key), conversation, report, compacted, tap_usage };
        Taken { body, ladder, answer }
    }

    /// A request sent upstream before its preparation (see `ahead`): the send goes first, then
    /// what the preparation needs (the budget, the tenant) and the preparation itself, while the
    /// provider reads the request.
    async fn prepare_ahead(&self, head: RequestHead, body: Bytes, finish: &mut Finish) -> Ready {
        let forwarded_at = Instant::now();
        finish.log.overhead = forwarded_at - finish.log.started;
        finish.log.forwarded_at = Some(forwarded_at);
        let limits = &self.config.limits;
        let sending = ahead::send(&self.upstreams, &head, body.clone());
        let preparing = async {
            let budget = Budget::new(limits.rewrite_budget, body.len());
            let stop_when_gone = budget.stop_on_drop();
            let tenant = self.compactor.tenant(&head.headers);
            budget.bound_parse(limits.parse_memory(body.len()));
            let preparing = boxed(|| self.compactor.prepare(&head, body.clone(), &finish.log.request_id));
            let prepared = budget.scope(tokens::scoped(&tenant, preparing)).await;
            // Taken apart while the provider still works, not after its answer.
            let taken = self.take(prepared, finish, false);
            (budget, stop_when_gone, tenant, taken)
        };
        let same = |(.., taken): &(_, _, _, Taken)| taken.body == body;
        let (answer, (budget, stop_when_gone, tenant, taken)) = ahead::ahead_of(sending, preparing, same).await;
        Ready { head, budget, stop_when_gone, tenant, taken, encoded: None, sent_ahead: Some(answer) }
    }

    /// A request compactor never rewrites: its body streams to the upstream as it arrives, with no
    /// cap of compactor's own, and the response comes back as it is.
    async fn pass_through(&self, head: RequestHead, body: Incoming, mut finish: Box<Finish>) -> Response<ResponseBody> {
        let route = head.route;
        let timeout = self.config.limits.client_body_timeout;
        let body = ClientBody::new(body, timeout);
        let progress = body.progress();
        let request = match self.upstreams.build_streamed(&head, body) {
            Ok(request) => request,
            Err(error) => return fail(error, route, finish),
        };
        let forwarded_at = Instant::now();
        finish.log.overhead = forwarded_at - finish.log.started;
        finish.log.forwarded_at = Some(forwarded_at);
        let sent = self.upstreams.send(route.family, request).await;
        finish.log.bytes_in = progress.bytes();
        let response = match sent {
            Ok(response) => response,
            // A body that stalled or broke off is the client's failure, not the upstream's.
            Err(error) => {
                let error = progress.client_error(timeout).unwrap_or(error);
                return fail(error, route, finish);
            }
        };
        finish.log.upstream_ttfb = Some(forwarded_at.elapsed());
        let forwarded = Forwarded {
            inspected: Inspected::pass(response),
            retries: 0,
            compacted: None,
            tokens_after: None,
            recovery: None,
        };
        let answer = Answer { session: None, conversation: None, report: None, compacted: None, tap_usage: false };
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
        headers.insert(REQUEST_ID, header_value(&finish.log.request_id));
        finish.log.status = response_parts.status.as_u16();
        if let Some(session) = &answer.session {
            headers.insert(SESSION, header_value(session));
        }
        if let Some(conversation) = &answer.conversation {
            headers.insert(CONVERSATION, header_value(conversation.as_str()));
        }
        if let Some(report) = &answer.report {
            let after = forwarded.tokens_after.unwrap_or(report.tokens_after);
            // Outputs replaced by the placeholder in the body that went out, whichever rung did it.
            let pruned = forwarded.recovery.as_ref().map_or(report.pruned, |r| r.pruned.max(report.pruned));
            headers.insert(TOKENS_BEFORE, HeaderValue::from(report.tokens_before));
            headers.insert(TOKENS_AFTER, HeaderValue::from(after));
            headers.insert(PRUNED, HeaderValue::from(pruned as u64));
            headers.insert(RETRIES, HeaderValue::from(forwarded.retries));
            finish.span.record("compactor.retries", forwarded.retries);
            finish.log.tokens = Some((report.tokens_before, after, pruned));
            let compacted = forwarded.compacted.or(answer.compacted);
            finish.rewrite = finish.ctx().filter(|ctx| ctx.records_requests()).map(|ctx| {
                // The window and threshold in the units of the estimates beside them.
                let pressure = self.compactor.pressure(ctx, report);
                let window = pressure.uncalibrated(pressure.window).get();
                let threshold = pressure.uncalibrated(pressure.budget()).get();
                Rewrite::of(report, ctx.model_name(), compacted, window, threshold)
            });
        }
        finish.log.retries = forwarded.retries;
        finish.log.recovery = forwarded.recovery;
        if let Some(generation) = forwarded.compacted.or(answer.compacted) {
            finish.span.record("compactor.compaction_generation", generation);
            headers.insert(COMPACTED, HeaderValue::from(generation));
        }
        finish.log.streaming =
            headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        finish.log.overhead += head_at.elapsed();
        let Some((incoming, last_frame)) = incoming else {
            // compactor read the whole (error) body: send it on exactly as it came.
            headers.remove(header::TRANSFER_ENCODING);
            let bytes = held.unwrap_or_default();
            return Response::from_parts(response_parts, ResponseBody::finished(bytes, finish));
        };
        let framing = if finish.log.streaming { Framing::EventStream } else { Framing::Json };
        let usage = (answer.tap_usage && response_parts.status.is_success()).then(|| UsageTap::new(framing));
        let idle_timeout = self.config.upstream.idle_timeout;
        let body =
            ResponseBody::Upstream { body: TapBody::new(incoming, idle_timeout, last_frame, finish, usage, held) };
        Response::from_parts(response_parts, body)
    }
}

/// A request as its preparation leaves it for the forward.
struct Ready {
    head: RequestHead,
    budget: Arc<Budget>,
    /// Stops the request's work when the client leaves (this is dropped with the request).
    stop_when_gone: tokio_util::sync::DropGuard,
    tenant: String,
    taken: Taken,
    /// The client's compressed body and the bytes it decoded to, when it came compressed.
    encoded: Option<(Encoded, Bytes)>,
    /// For a request sent ahead of its preparation, the upstream's answer to it; `None` inside
    /// when the preparation changed the body and the request that went ahead was withdrawn.
    sent_ahead: Option<Option<ahead::SentAhead>>,
}

/// A prepared request once its finish took what it keeps.
struct Taken {
    body: Bytes,
    ladder: Option<Box<crate::compaction::Ladder>>,
    answer: Answer,
}

/// What the response tells the client about what compactor did.
struct Answer {
    session: Option<String>,
    /// The conversation inside the session whose state the request used.
    conversation: Option<ConversationId>,
    report: Option<RewriteReport>,
    /// The compaction generation applied before forwarding.
    compacted: Option<u32>,
    /// Whether the session wants the response's usage (the upstream was asked not to compress).
    tap_usage: bool,
}

/// compactor's own answer to a request it could not forward.
fn fail(error: ProxyError, route: Route, mut finish: Box<Finish>) -> Response<ResponseBody> {
    let log = &mut finish.log;
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
