//! One request as compaction sees it ([`RequestState`]): the body the client sent, the
//! compaction record its conversation carries (and one prepared in the background held back),
//! what was sent last and its rewrite, the upstream's cache prices, and its overflow ladder.
//! Made by [`super::Compactor::prepare`], carried to each [`super::Compactor::recover`], and
//! copied for the work done off the request's path.

use bytes::Bytes;

use super::ladder::{Recovery, RungOutcome, Rungs};
use crate::config::compaction::Rung;
use crate::dialect::{Dialect, ParsedRequest, PathModel};
use crate::rewrite::{CachePricing, RewriteReport};
use crate::session::state::CompactionRecord;

/// One request's compaction state: created by [`super::Compactor::prepare`], advanced by each
/// [`super::Compactor::recover`].
#[derive(Debug)]
pub struct RequestState {
    pub(super) dialect: Dialect,
    /// The body as the client sent it: every rung derives its body from this one.
    pub(super) client_body: Bytes,
    pub(super) message_count: usize,
    /// The compaction applied to the body being sent.
    pub(super) record: Option<CompactionRecord>,
    /// A record prepared in the background that this request did not need yet: the first thing
    /// a compaction of this request applies, with no summary call.
    pub(super) ready: Option<CompactionRecord>,
    /// The body this request sent, for a summary prepared in the background on a provider that
    /// caches prefixes: the summary call is that body with the instruction appended.
    pub(super) sent_body: Option<Bytes>,
    /// Lead system messages of the client's conversation.
    pub(super) lead: usize,
    /// The rewrite of the body being sent.
    pub(super) sent: Option<RewriteReport>,
    /// The prompt-cache prices of the upstream the request goes to.
    pub(super) cache: CachePricing,
    /// The model the request's path names, and whether it rules over the body's
    /// ([`PathModel`]).
    pub(super) path_model: Option<(String, bool)>,
    /// The request's id (`x-compactor-request-id`): the compaction records it makes name it.
    pub(super) request_id: String,
    /// The overflow ladder: the rungs left and the retries made.
    pub(super) rungs: Rungs,
    /// What this request's recovery did, for its log line.
    pub(super) trace: Recovery,
    /// A stateful request's chain and its rungs ([`super::stateful`]).
    pub(super) stateful: Option<Box<super::stateful::chain::ChainState>>,
}

impl RequestState {
    pub(super) fn new(
        dialect: Dialect,
        client_body: Bytes,
        message_count: usize,
        record: Option<CompactionRecord>,
        order: &[Rung],
    ) -> Self {
        Self {
            dialect,
            client_body,
            message_count,
            record,
            ready: None,
            sent_body: None,
            request_id: String::new(),
            lead: 0,
            sent: None,
            cache: CachePricing::NONE,
            path_model: None,
            rungs: Rungs::new(order),
            trace: Recovery::default(),
            stateful: None,
        }
    }

    /// The same request's state for work done off its path (a summary prepared in the
    /// background, a prefill of a prepared summary), carrying `record`: a fresh climb, the
    /// request's body, shape and upstream.
    pub(super) fn for_background(&self, record: Option<CompactionRecord>) -> RequestState {
        let mut state =
            RequestState::new(self.dialect, self.client_body.clone(), self.message_count, record, self.rungs.order());
        state.lead = self.lead;
        state.cache = self.cache;
        state.path_model = self.path_model.clone();
        state.request_id = self.request_id.clone();
        state
    }

    /// What this request's recovery did.
    pub fn recovery(&self) -> &Recovery {
        &self.trace
    }

    /// Notes one rung's outcome for the log line and the metrics.
    pub(super) fn note(&mut self, rung: &'static str, outcome: RungOutcome) {
        crate::telemetry::metric::recovery_rung(rung, outcome.label());
        self.trace.rungs.push(format!("{rung}:{}", outcome.label()));
    }

    /// The model the request's path names.
    fn path_model(&self) -> Option<PathModel<'_>> {
        self.path_model
            .as_ref()
            .map(|(name, rules)| PathModel { name: std::borrow::Cow::Borrowed(name), rules: *rules })
    }

    /// Parses `body` in the request's dialect, the model named in its path filled in.
    pub(super) fn parse<'b>(&self, body: &'b [u8]) -> Option<ParsedRequest<'b>> {
        ParsedRequest::parse(self.dialect, body).map(|parsed| parsed.with_model(self.path_model()))
    }

    /// Parses `body`, rebuilt on a compaction record whose summary stands for `summarized_turns`
    /// assistant turns of the client's body ([`ParsedRequest::parse_rebuilt`]).
    pub(super) fn parse_rebuilt<'b>(&self, body: &'b [u8], summarized_turns: usize) -> Option<ParsedRequest<'b>> {
        ParsedRequest::parse_rebuilt(self.dialect, body, summarized_turns)
            .map(|parsed| parsed.with_model(self.path_model()))
    }

    /// Retries so far.
    pub fn retries(&self) -> u32 {
        self.rungs.retries()
    }

    /// The compaction generation of the body being sent.
    pub fn compacted(&self) -> Option<u32> {
        self.record.as_ref().map(|r| r.generation)
    }
}
