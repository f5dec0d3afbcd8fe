//! Forwarding with recovery: send, look at what came back, and on "context length exceeded" ask
//! the compactor what next; retry with the body it gives, or give the client the upstream's first
//! error unchanged.

use bytes::Bytes;
use http::Response;
use http::header::{self, HeaderValue};

use super::inspect::{self, Inspected};
use super::request_body::Encoded;
use crate::compaction::{Compactor, Ladder, Next, Recovery};
use crate::error::ProxyError;
use crate::session::SessionCtx;
use crate::telemetry::metric;
use crate::upstream::{Armed, PooledBody, RequestHead, Upstreams};

/// The upstream's answer to a request sent ahead of its preparation (`super::ahead`), or why
/// none came.
pub(super) type SentAhead = Result<Response<PooledBody>, ProxyError>;

/// The result of forwarding with recovery.
pub(super) struct Forwarded {
    pub inspected: Inspected,
    pub retries: u32,
    /// The compaction generation of the body that finally went out.
    pub compacted: Option<u32>,
    /// Tokens of the body that finally went out, when recovery rewrote it.
    pub tokens_after: Option<u32>,
    /// What the recovery did, when there was an overflow.
    pub recovery: Option<Recovery>,
}

/// Sends one attempt: `body`, or the client's compressed bytes of it (`encoded`) with their
/// coding; `identity` asks the upstream for an uncompressed answer; `armed` says when the
/// first-byte timer is made.
pub(super) async fn send(
    upstreams: &Upstreams,
    head: &RequestHead,
    body: Bytes,
    encoded: Option<Encoded>,
    identity: bool,
    armed: Armed,
) -> Result<Response<PooledBody>, ProxyError> {
    let mut request = match encoded {
        Some(Encoded { original, content_encoding }) => {
            let mut request = upstreams.build_request(head, original)?;
            request.headers_mut().insert(header::CONTENT_ENCODING, content_encoding);
            request
        }
        None => upstreams.build_request(head, body)?,
    };
    if identity {
        request.headers_mut().insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    upstreams.send_armed(head.route.family, request, armed).await
}

/// Sends `body`; on overflow, recovers when the request has a ladder. `identity` asks the
/// upstream for an uncompressed answer, which the usage tap and the inspection read. `encoded`,
/// the client's compressed bytes of an unchanged `body`, goes instead on the first attempt.
/// `ahead`, the answer to `body` sent before the request was prepared, is the first attempt's.
#[allow(clippy::too_many_arguments)]
pub(super) async fn forward(
    upstreams: &Upstreams,
    compactor: &Compactor,
    head: &RequestHead,
    mut body: Bytes,
    mut encoded: Option<Encoded>,
    mut recovery: Option<(&mut Ladder, &mut SessionCtx)>,
    identity: bool,
    mut ahead: Option<SentAhead>,
) -> Result<Forwarded, ProxyError> {
    let route = head.route.label();
    let mut first_error = None;
    loop {
        let response = match ahead.take() {
            Some(answer) => answer?,
            None => send(upstreams, head, body.clone(), encoded.take(), identity, Armed::AtFirstWait).await?,
        };
        let inspected = match recovery {
            Some(_) => {
                inspect::inspect(upstreams, &compactor.settings().overflow, head.route.family, response, &body).await?
            }
            None => Inspected::pass(response),
        };
        let (retries, compacted) =
            recovery.as_ref().map_or((0, None), |(ladder, _)| (ladder.retries(), ladder.compacted()));
        // Cloned only when there is something to tell: most requests had no overflow.
        let trace = recovery
            .as_ref()
            .map(|(ladder, _)| ladder.recovery())
            .filter(|t| {
                t.overflow.is_some() || t.summary_calls > 0 || t.background_skipped.is_some() || !t.rungs.is_empty()
            })
            .cloned();
        let tokens_after = trace.as_ref().and_then(|t| t.tokens_after);
        let done = |inspected| Ok(Forwarded { inspected, retries, compacted, tokens_after, recovery: trace });
        let Inspected::Overflow { overflow, parts: error_parts, body: error_body } = inspected else {
            if retries > 0 {
                metric::recovery(if inspected.is_error() { "failed" } else { "recovered" });
            }
            // After a retry, a failure of another kind gives the client the original error.
            return match first_error {
                Some((parts, body)) if inspected.is_error() => done(Inspected::Buffered { parts, body }),
                _ => done(inspected),
            };
        };
        metric::overflow_seen(route);
        let (original_parts, original_body) = first_error.get_or_insert((error_parts, error_body)).clone();
        let original = Inspected::Buffered { parts: original_parts, body: original_body };
        let Some((ladder, ctx)) = recovery.as_mut() else { return done(original) };
        // Boxed: recovery (a summary call inside) is most of this future's size and runs only
        // after an overflow; held inline, it would make every request's forward kilobytes
        // larger, copied as it moved.
        match Box::pin(compactor.recover(head, ladder, ctx, &overflow, &body)).await {
            Next::Retry { body: next, .. } => {
                metric::retry(route);
                body = next;
            }
            Next::GiveUp => return done(original),
        }
    }
}
