//! The stages before forwarding: identify the session, load its state, rewrite the body.

use bytes::Bytes;
use http::HeaderMap;

use super::Proxy;
use crate::dialect::{Dialect, ParsedRequest};
use crate::rewrite::RewriteReport;
use crate::route::Route;
use crate::session::{SessionKey, SessionUpdate};
use crate::telemetry::metric;

/// What the request looks like once compactor is done with it.
pub struct Prepared {
    pub body: Bytes,
    pub session: Option<SessionKey>,
    pub report: Option<RewriteReport>,
    /// What to add to the session once the request is on its way.
    pub update: Option<SessionUpdate>,
}

impl Prepared {
    fn untouched(body: Bytes) -> Self {
        Self { body, session: None, report: None, update: None }
    }
}

impl Proxy {
    /// Identifies the session and rewrites the body when the endpoint is one compactor
    /// understands; anything it cannot parse is forwarded exactly as it came.
    pub(super) async fn prepare(&self, route: Route, headers: &HeaderMap, body: Bytes) -> Prepared {
        let Some(dialect) = Dialect::of(route.endpoint) else { return Prepared::untouched(body) };
        let Some(mut parsed) = ParsedRequest::parse(dialect, &body) else {
            metric::rewrite_skipped(route.label(), "unparsed");
            return Prepared::untouched(body);
        };
        let session = self.identifier.identify(headers, Some(&parsed));
        let state = match self.store.load(session.as_str()).await {
            Ok(state) => state,
            Err(error) => {
                // Without stored decisions the policies still work; they just start afresh.
                self.warn_store(&error);
                Default::default()
            }
        };
        let rewritten = self.rewriter.rewrite(&mut parsed, &state.pruned).await;
        let report = rewritten.report;
        metric::rewrite_done(route.label(), &report, rewritten.body.is_some());
        let update = SessionUpdate {
            pruned: report.pruned_call_ids.iter().filter(|id| !state.pruned.contains(*id)).cloned().collect(),
            usage: None,
            tokens_saved: u64::from(report.tokens_before.saturating_sub(report.tokens_after)),
            compaction: None,
        };
        let body = match rewritten.body {
            Some(new_body) => Bytes::from(new_body),
            None => body.clone(),
        };
        Prepared { body, session: Some(session), report: Some(report), update: Some(update) }
    }
}
