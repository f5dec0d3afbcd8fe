//! The request pipeline's phases, in the order a request passes them (pingora's `ProxyHttp`
//! names its phases the same way): each takes what the one before gave and the request's
//! [`Finish`] (its log line, span and session state, kept for the record that follows the
//! response), and gives back what the next needs or the error compactor answers with.
//!
//! 1. [`Proxy::admit`]: is there somewhere to send it, and will compactor read it?
//! 2. [`Proxy::read`]: the body, whole, inside the in-flight body budget.
//! 3. [`Proxy::prepare`]: the body to send, from the compactor; a request with nothing to decide
//!    goes upstream first and is prepared while the provider reads it (`ahead`).
//! 4. [`Proxy::forward`]: sent, and on an overflow recovered by the compactor's ladder
//!    (`forward`, `inspect`).
//! 5. `Proxy::respond` (in the parent module): the answer for the client, tapped on its way.
//! 6. The record (`finish`): once the response has ended, the usage, the session's commit, the
//!    inspector's record, the log line and the metrics.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header;
use http::request::Parts;
use hyper::body::Incoming;

use super::finish::Finish;
use super::forward::{self, Forwarded, SentAhead};
use super::request_body::{self, Encoded};
use super::{Answer, Proxy, RECORDED_WITHIN, Taken, ahead, recorded};
use crate::boxed::boxed;
use crate::cloud::Admission;
use crate::compaction::Prepared;
use crate::dialect::Dialect;
use crate::error::ProxyError;
use crate::inflight::Held;
use crate::route::{Endpoint, Route};
use crate::tokens;
use crate::upstream::RequestHead;
use crate::work::Budget;

/// What [`Proxy::admit`] lets through.
pub(super) enum Admitted {
    /// A route compactor never rewrites: its body streams upstream as it arrives.
    PassThrough,
    /// A route compactor reads whole; `counted`, the dialect of a token-count request, which is
    /// read and rewritten like the request it counts but never changes the session.
    Rewritable { counted: Option<Dialect> },
}

/// A request whose body was read whole ([`Proxy::read`]). Boxed from phase to phase, as is
/// [`Ready`]: each is hundreds of bytes (the request's head, its answer so far), copied whole at
/// each move between the phases' futures, where a box moves as a pointer.
pub(super) struct Read {
    parts: Parts,
    body: Bytes,
    /// The request's share of the body bytes in flight, held until the upstream's answer comes
    /// (the body, its parse and the rewritten body live until then).
    held: Held,
}

/// A request as its preparation leaves it for the forward.
pub(super) struct Ready {
    head: RequestHead,
    budget: Arc<Budget>,
    /// Stops the request's work when the client leaves (this is dropped with the request).
    _stop_when_gone: tokio_util::sync::DropGuard,
    tenant: String,
    taken: Taken,
    /// The client's compressed body and the bytes it decoded to, when it came compressed.
    encoded: Option<(Encoded, Bytes)>,
    /// For a request sent ahead of its preparation, the upstream's answer to it; `None` inside
    /// when the preparation changed the body and the request that went ahead was withdrawn.
    sent_ahead: Option<Option<SentAhead>>,
    held: Held,
}

impl Proxy {
    /// Phase 1: refuses at once, before the body is read or any session touched, a request that
    /// cannot go anywhere (a transfer coding compactor does not read, a family whose upstream is
    /// not configured, a platform compactor does not serve, whose credential goes nowhere), and
    /// says whether compactor reads the body.
    pub(super) fn admit(&self, route: Route, headers: &http::HeaderMap) -> Result<Admitted, ProxyError> {
        if let Some(error) = request_body::unsupported_transfer_coding(headers) {
            return Err(error);
        }
        if let Endpoint::Unserved(platform) = route.endpoint {
            return Err(ProxyError::Unserved { platform });
        }
        self.upstreams.serves(route.family)?;
        if self.upstreams.cloud().admit(route.family, headers)? == Admission::AsItCame {
            return Ok(Admitted::PassThrough);
        }
        let counted = Dialect::counted(route.endpoint);
        if Dialect::of(route.endpoint).is_none() && counted.is_none() {
            return Ok(Admitted::PassThrough);
        }
        Ok(Admitted::Rewritable { counted })
    }

    /// Phase 2: the body, whole (up to `limits.max_body_bytes`), its share of the in-flight
    /// budget taken before it is read when it declares its length, else once read.
    pub(super) async fn read(
        &self,
        parts: Parts,
        body: Incoming,
        finish: &mut Finish,
    ) -> Result<Box<Read>, ProxyError> {
        let limits = &self.config.limits;
        let mut held = Held::default();
        if let Some(length) = request_body::declared_length(&parts.headers)
            && let Err(error) = self.compactor.inflight().hold(&mut held, length.min(limits.max_body_bytes))
        {
            request_body::discard(body, limits.max_body_bytes, limits.client_body_timeout).await;
            return Err(error);
        }
        let body =
            request_body::read_whole(&parts.headers, body, limits.max_body_bytes, limits.client_body_timeout).await?;
        finish.outcome.bytes_in = body.len() as u64;
        self.compactor.inflight().hold(&mut held, body.len() as u64)?;
        Ok(Box::new(Read { parts, body, held }))
    }

    /// Phase 3: what goes upstream. A request compactor has no reason to touch goes now and is
    /// prepared while the provider reads it (see `ahead`); the preparation's body still decides
    /// what is answered. Any other is decoded and prepared (or counted) first.
    pub(super) async fn prepare(
        &self,
        route: Route,
        read: Box<Read>,
        counted: Option<Dialect>,
        finish: &mut Finish,
    ) -> Result<Box<Ready>, ProxyError> {
        let Read { parts, body, held } = *read;
        let quiet = counted.is_none()
            && !parts.headers.contains_key(header::CONTENT_ENCODING)
            && self.compactor.nothing_to_decide(route.endpoint, &body);
        if quiet {
            let head = RequestHead::new(route, parts).signed(&body);
            return Ok(self.prepare_ahead(head, body, held, finish).await);
        }
        self.prepare_decoded(route, parts, body, held, counted, finish).await
    }

    /// compactor's own work on the request, decoding it included: budgeted, off the async
    /// workers when the body is large, and stopped when the client leaves (hyper drops this
    /// future, and the guard with it).
    async fn prepare_decoded(
        &self,
        route: Route,
        mut parts: Parts,
        body: Bytes,
        mut held: Held,
        counted: Option<Dialect>,
        finish: &mut Finish,
    ) -> Result<Box<Ready>, ProxyError> {
        let limits = &self.config.limits;
        let budget = Budget::new(limits.rewrite_budget, body.len());
        let stop_when_gone = budget.stop_on_drop();
        let tenant = self.compactor.tenant(&parts.headers);
        let signed = body.clone();
        // Boxed: a decoder's state (brotli's above all) is large, and held inline it made every
        // request's future tens of kilobytes, copied at each move.
        let decoding = boxed(|| request_body::decode(&mut parts.headers, body, limits.max_body_bytes));
        let (body, encoded) = budget.scope(decoding).await?;
        self.compactor.inflight().hold(&mut held, body.len() as u64)?;
        // Bounded by the body as decoded: what the parse reads.
        budget.bound_parse(limits.parse_memory(body.len()));
        let encoded = encoded.map(|encoded| (encoded, body.clone()));
        let head = RequestHead::new(route, parts).signed(&signed);
        // Boxed: these futures are large (a summary call lives in them), and a future is copied
        // each time it is moved; a box moves as one pointer. Token counts are cached per tenant
        // (see `tokens::scoped`).
        let prepared = match counted {
            Some(dialect) => {
                // A count reads the session as the next request would: with the requests
                // already answered recorded (their recording follows the response).
                recorded(RECORDED_WITHIN).await;
                budget.scope(tokens::scoped(&tenant, boxed(|| self.compactor.count(&head, dialect, body)))).await
            }
            None => {
                let preparing = boxed(|| self.compactor.prepare(&head, body, &finish.outcome.request_id));
                budget.scope(tokens::scoped(&tenant, preparing)).await
            }
        };
        let taken = self.take(prepared, finish, counted.is_some());
        Ok(Box::new(Ready {
            head,
            budget,
            _stop_when_gone: stop_when_gone,
            tenant,
            taken,
            encoded,
            sent_ahead: None,
            held,
        }))
    }

    /// Takes a prepared request apart: its session state and what the log says go to the
    /// request's finish; the body, the ladder and what the response tells are left.
    fn take(&self, prepared: Prepared, finish: &mut Finish, counted: bool) -> Taken {
        let Prepared { body, session, conversation, report, sizes, compacted, ctx, ladder, answered } = prepared;
        finish.answered = answered;
        if let (Some(report), Some(sizes)) = (&report, &sizes) {
            finish.outcome.tokens = Some((sizes.before, sizes.after, report.pruned));
        }
        finish.outcome.session = session.as_ref().map(|s| s.key.clone());
        finish.outcome.conversation = conversation.as_ref().map(|c| c.to_string());
        if let Some(ctx) = ctx {
            finish.keep(&self.finishers, ctx);
        }
        let tap_usage = session.is_some() && !counted;
        let answer = Answer { report: report.zip(sizes).map(Box::new), compacted, tap_usage };
        Taken { body, ladder, answer }
    }

    /// A request sent upstream before its preparation (see `ahead`): the send goes first, then
    /// what the preparation needs (the budget, the tenant) and the preparation itself, while the
    /// provider reads the request.
    async fn prepare_ahead(&self, head: RequestHead, body: Bytes, held: Held, finish: &mut Finish) -> Box<Ready> {
        let forwarded_at = Instant::now();
        finish.outcome.overhead = forwarded_at - finish.outcome.started;
        finish.outcome.forwarded_at = Some(forwarded_at);
        let limits = &self.config.limits;
        let sending = ahead::send(&self.upstreams, &head, body.clone());
        let preparing = async {
            let budget = Budget::new(limits.rewrite_budget, body.len());
            let stop_when_gone = budget.stop_on_drop();
            let tenant = self.compactor.tenant(&head.headers);
            budget.bound_parse(limits.parse_memory(body.len()));
            let preparing = boxed(|| self.compactor.prepare(&head, body.clone(), &finish.outcome.request_id));
            let prepared = budget.scope(tokens::scoped(&tenant, preparing)).await;
            // Taken apart while the provider still works, not after its answer.
            let taken = self.take(prepared, finish, false);
            (budget, stop_when_gone, tenant, taken)
        };
        let same = |(.., taken): &(_, _, _, Taken)| taken.body == body;
        let (answer, (budget, stop_when_gone, tenant, taken)) = ahead::ahead_of(sending, preparing, same).await;
        Box::new(Ready {
            head,
            budget,
            _stop_when_gone: stop_when_gone,
            tenant,
            taken,
            encoded: None,
            sent_ahead: Some(answer),
            held,
        })
    }

    /// Phases 4 and 5: sent (or the answer to the request sent ahead taken), and after an
    /// overflow recovered with the next rung's body while the ladder allows (`forward`).
    pub(super) async fn forward(
        &self,
        ready: Box<Ready>,
        finish: &mut Finish,
    ) -> Result<(Forwarded, Answer), ProxyError> {
        let Ready { head, budget, _stop_when_gone, tenant, taken, encoded, sent_ahead, held } = *ready;
        let Taken { body, mut ladder, answer } = taken;
        // A compressed body compactor did not change goes as the client sent it.
        let encoded = encoded.filter(|(_, decoded)| *decoded == body).map(|(encoded, _)| encoded);
        let ahead = match sent_ahead {
            Some(Some(answer)) => {
                finish.outcome.sent_ahead = Some("ahead");
                Some(answer)
            }
            Some(None) => {
                finish.outcome.sent_ahead = Some("withdrawn");
                tracing::info!(
                    request_id = %finish.outcome.request_id,
                    "the request sent ahead of its preparation was dropped: the preparation changed its body"
                );
                None
            }
            None => None,
        };
        let forwarded_at = match (&ahead, finish.outcome.forwarded_at) {
            (Some(_), Some(at)) => at,
            _ => {
                let now = Instant::now();
                finish.outcome.overhead = now - finish.outcome.started;
                finish.outcome.forwarded_at = Some(now);
                now
            }
        };
        let tap_usage = answer.tap_usage;
        let recovery = ladder.as_deref_mut().zip(finish.ctx());
        let forwarding = boxed(|| {
            forward::forward(&self.upstreams, &self.compactor, &head, body, encoded, recovery, tap_usage, ahead)
        });
        let forwarded = budget.scope(tokens::scoped(&tenant, forwarding)).await?;
        // The answer came: the bodies it was held for are gone.
        drop(held);
        finish.outcome.upstream_ttfb = Some(forwarded_at.elapsed());
        Ok((forwarded, answer))
    }
}
