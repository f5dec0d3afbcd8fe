//! The overflow ladder of one request: what was sent, which compaction it carries, and which rung
//! comes next. The rungs, cheapest first: lower `max_tokens` (when the prompt alone fits), prune
//! harder, summarize, summarize harder.

use std::time::Duration;

use bytes::Bytes;

pub use crate::config::compaction::{DEFAULT_ORDER, Rung};
use crate::dialect::{Dialect, ParsedRequest};
use crate::overflow::Overflow;
use crate::rewrite::{CachePricing, RewriteReport};
use crate::session::state::CompactionRecord;

/// Tokens left free between prompt and output when `max_tokens` is lowered.
const MAX_TOKENS_MARGIN: u64 = 64;

/// One request's climb: created by [`super::Compactor::prepare`], advanced by each
/// [`super::Compactor::recover`].
#[derive(Debug)]
pub struct Ladder {
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
    /// The model the request's path names (Gemini's bodies carry none).
    pub(super) path_model: Option<String>,
    /// The request's id (`x-compactor-request-id`): the compaction records it makes name it.
    pub(super) request_id: String,
    order: Vec<Rung>,
    next: usize,
    lowered_max_tokens: bool,
    retries: u32,
    /// What this request's recovery did, for its log line.
    pub(super) trace: Recovery,
}

/// One request's overflow recovery, as its log line tells it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recovery {
    /// The overflow seen first: the provider family and whether the error named the window.
    pub overflow: Option<String>,
    /// Each rung tried, in order, with its outcome (`prune_hard:retry`, `summarize:failed`, ...).
    pub rungs: Vec<String>,
    /// Tool outputs the rungs replaced with the placeholder (in the body that went out last).
    pub pruned: usize,
    /// Time spent in summary calls (of the recovery and of a compaction ahead of time).
    pub summary: Duration,
    /// Summary calls made for this request: each piece of a rolling summary, and each retry.
    pub summary_calls: u32,
    /// compactor's estimate of the body that went out last, after a retry.
    pub tokens_after: Option<u32>,
    /// A summary this request would have prepared in the background but did not: why.
    pub background_skipped: Option<BackgroundSkip>,
}

/// Why a summary due to be prepared in the background was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackgroundSkip {
    /// `compaction.background_max_inflight` summaries were already being prepared.
    Capacity,
    /// `limits.max_inflight_body_bytes` had no room for the conversation's body.
    BodyBudget,
}

impl BackgroundSkip {
    /// The metric label, and what the inspector shows.
    pub fn label(self) -> &'static str {
        match self {
            BackgroundSkip::Capacity => "capacity",
            BackgroundSkip::BodyBudget => "body_budget",
        }
    }
}

impl Recovery {
    /// The rungs as one log field.
    pub fn rungs(&self) -> String {
        self.rungs.join(",")
    }
}

impl Ladder {
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
            order: order.to_vec(),
            next: 0,
            lowered_max_tokens: false,
            retries: 0,
            trace: Recovery::default(),
        }
    }

    /// The same request's ladder for work done off its path (a summary prepared in the
    /// background, a prefill ahead), carrying `record`: a fresh climb, the request's body, shape
    /// and upstream.
    pub(super) fn for_background(&self, record: Option<CompactionRecord>) -> Ladder {
        let mut ladder = Ladder::new(self.dialect, self.client_body.clone(), self.message_count, record, &self.order);
        ladder.lead = self.lead;
        ladder.cache = self.cache;
        ladder.path_model = self.path_model.clone();
        ladder.request_id = self.request_id.clone();
        ladder
    }

    /// What this request's recovery did.
    pub fn recovery(&self) -> &Recovery {
        &self.trace
    }

    /// Notes one rung's outcome for the log line and the metrics.
    pub(super) fn note(&mut self, rung: &'static str, outcome: &'static str) {
        crate::telemetry::metric::recovery_rung(rung, outcome);
        self.trace.rungs.push(format!("{rung}:{outcome}"));
    }

    /// Parses `body` in the request's dialect, the model named in its path filled in.
    pub(super) fn parse<'b>(&self, body: &'b [u8]) -> Option<ParsedRequest<'b>> {
        ParsedRequest::parse(self.dialect, body).map(|parsed| parsed.with_model(self.path_model.as_deref()))
    }

    /// Parses `body`, rebuilt on a compaction record whose summary stands for `summarized_turns`
    /// assistant turns of the client's body ([`ParsedRequest::parse_rebuilt`]).
    pub(super) fn parse_rebuilt<'b>(&self, body: &'b [u8], summarized_turns: usize) -> Option<ParsedRequest<'b>> {
        ParsedRequest::parse_rebuilt(self.dialect, body, summarized_turns)
            .map(|parsed| parsed.with_model(self.path_model.as_deref()))
    }

    /// Retries so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// The compaction generation of the body being sent.
    pub fn compacted(&self) -> Option<u32> {
        self.record.as_ref().map(|r| r.generation)
    }

    pub(super) fn count_retry(&mut self) {
        self.retries += 1;
    }

    /// The first rung, once: when the prompt fits but prompt + `max_tokens` does not, the same
    /// body asking for fewer tokens (no fewer than `min_output_tokens`).
    pub(super) fn lower_max_tokens(
        &mut self,
        sent: &[u8],
        overflow: &Overflow,
        min_output_tokens: u32,
    ) -> Option<Bytes> {
        if self.lowered_max_tokens || !overflow.prompt_fits() {
            return None;
        }
        self.lowered_max_tokens = true;
        let parsed = ParsedRequest::parse(self.dialect, sent)?;
        let (field, requested) = parsed.max_tokens_field()?;
        let (limit, prompt) = (overflow.limit?, overflow.prompt_tokens?);
        let fits = limit.saturating_sub(prompt).saturating_sub(MAX_TOKENS_MARGIN);
        if fits < u64::from(min_output_tokens) || fits >= requested {
            return None;
        }
        parsed.splice(&[(field, fits.to_string())]).map(Bytes::from)
    }

    /// The next rung to try, `None` once every rung was tried.
    pub(super) fn next_rung(&mut self) -> Option<Rung> {
        let rung = self.order.get(self.next).copied().filter(|rung| *rung != Rung::Exhausted)?;
        self.next += 1;
        Some(rung)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(body: &str) -> Ladder {
        Ladder::new(Dialect::AnthropicMessages, Bytes::from(body.to_string()), 1, None, &DEFAULT_ORDER)
    }

    #[test]
    fn the_rungs_come_in_the_configured_order_and_each_once() {
        let mut ladder = ladder("{}");
        let rungs: Vec<Rung> = std::iter::from_fn(|| ladder.next_rung()).collect();
        assert_eq!(rungs, [Rung::Summarize, Rung::SummarizeHarder, Rung::PruneHard]);
        assert_eq!(ladder.next_rung(), None);
        let order = [Rung::PruneHard, Rung::Summarize];
        let mut ladder = Ladder::new(Dialect::ChatCompletions, Bytes::new(), 1, None, &order);
        let rungs: Vec<Rung> = std::iter::from_fn(|| ladder.next_rung()).collect();
        assert_eq!(rungs, order);
        assert_eq!(ladder.next_rung(), None);
    }

    #[test]
    fn max_tokens_is_lowered_once_and_only_when_the_prompt_fits() {
        let body = r#"{"model":"claude","max_tokens":16000,"messages":[{"role":"user","content":"hi"}]}"#;
        let overflow = Overflow { limit: Some(20_000), prompt_tokens: Some(12_000), max_tokens: Some(16_000) };
        let mut first = ladder(body);
        let lowered = first.lower_max_tokens(body.as_bytes(), &overflow, 1_024).unwrap();
        assert_eq!(
            std::str::from_utf8(&lowered).unwrap(),
            r#"{"model":"claude","max_tokens":7936,"messages":[{"role":"user","content":"hi"}]}"#
        );
        assert_eq!(first.lower_max_tokens(body.as_bytes(), &overflow, 1_024), None, "once");
        let too_long = Overflow { prompt_tokens: Some(19_500), ..overflow };
        assert_eq!(ladder(body).lower_max_tokens(body.as_bytes(), &too_long, 1_024), None);
    }
}
