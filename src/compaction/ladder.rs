//! The overflow ladder of one request: which rung comes next and how each ended. The rungs,
//! cheapest first: lower `max_tokens` (when the prompt alone fits), prune harder, summarize,
//! summarize harder.

use bytes::Bytes;
use std::time::Duration;

pub use crate::config::compaction::{DEFAULT_ORDER, Rung};
use crate::dialect::{Dialect, ParsedRequest};
use crate::overflow::Overflow;

/// Tokens left free between prompt and output when `max_tokens` is lowered.
const MAX_TOKENS_MARGIN: u64 = 64;

/// One request's climb: the rungs in their configured order, the next one, and the retries made.
#[derive(Debug)]
pub(super) struct Rungs {
    order: Vec<Rung>,
    next: usize,
    lowered_max_tokens: bool,
    retries: u32,
}

/// How one rung ended, as the log line's `rungs` and the `rung` metric's `outcome` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RungOutcome {
    /// Its body goes upstream as the retry.
    Retry,
    /// It changed nothing (or had nothing to work on).
    Nothing,
    /// Its body is estimated not to fit either: never sent.
    TooBig,
    /// Its summary failed.
    Failed,
    /// Not tried (`prune.enabled = false` for the prune-harder rung).
    Skipped,
    /// What recovered the request's stateful chain before, applied again before it went.
    Mapped,
}

impl RungOutcome {
    /// The label in the log line and the metric.
    pub fn label(self) -> &'static str {
        match self {
            RungOutcome::Retry => "retry",
            RungOutcome::Nothing => "nothing",
            RungOutcome::TooBig => "too_big",
            RungOutcome::Failed => "failed",
            RungOutcome::Skipped => "skipped",
            RungOutcome::Mapped => "mapped",
        }
    }
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
    /// The size of the body that went out last, after a retry: compactor's estimate calibrated,
    /// in the provider's tokens (as the prepared report's sizes are).
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

impl Rungs {
    pub(super) fn new(order: &[Rung]) -> Self {
        Self { order: order.to_vec(), next: 0, lowered_max_tokens: false, retries: 0 }
    }

    /// The configured order, for a fresh climb of the same request.
    pub(super) fn order(&self) -> &[Rung] {
        &self.order
    }

    /// Retries so far.
    pub(super) fn retries(&self) -> u32 {
        self.retries
    }

    pub(super) fn count_retry(&mut self) {
        self.retries += 1;
    }

    /// The retries another climb of the same request made count for this one.
    pub(super) fn carry_retries(&mut self, other: &Rungs) {
        self.retries = other.retries;
    }

    /// The first rung, once: when the prompt fits but prompt + `max_tokens` does not, the same
    /// body (`sent`, in `dialect`) asking for fewer tokens (no fewer than `min_output_tokens`).
    pub(super) fn lower_max_tokens(
        &mut self,
        dialect: Dialect,
        sent: &[u8],
        overflow: &Overflow,
        min_output_tokens: u32,
    ) -> Option<Bytes> {
        if self.lowered_max_tokens || !overflow.prompt_fits() {
            return None;
        }
        self.lowered_max_tokens = true;
        let parsed = ParsedRequest::parse(dialect, sent)?;
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

    const MESSAGES: Dialect = Dialect::AnthropicMessages;

    fn ladder() -> Rungs {
        Rungs::new(&DEFAULT_ORDER)
    }

    #[test]
    fn the_rungs_come_in_the_configured_order_and_each_once() {
        let mut ladder = ladder();
        let rungs: Vec<Rung> = std::iter::from_fn(|| ladder.next_rung()).collect();
        assert_eq!(rungs, [Rung::Summarize, Rung::SummarizeHarder, Rung::PruneHard]);
        assert_eq!(ladder.next_rung(), None);
        let order = [Rung::PruneHard, Rung::Summarize];
        let mut ladder = Rungs::new(&order);
        let rungs: Vec<Rung> = std::iter::from_fn(|| ladder.next_rung()).collect();
        assert_eq!(rungs, order);
        assert_eq!(ladder.next_rung(), None);
    }

    #[test]
    fn max_tokens_is_lowered_once_and_only_when_the_prompt_fits() {
        let body = r#"{"model":"claude","max_tokens":16000,"messages":[{"role":"user","content":"hi"}]}"#;
        let overflow = Overflow { limit: Some(20_000), prompt_tokens: Some(12_000), max_tokens: Some(16_000) };
        let mut first = ladder();
        let lowered = first.lower_max_tokens(MESSAGES, body.as_bytes(), &overflow, 1_024).unwrap();
        assert_eq!(
            std::str::from_utf8(&lowered).unwrap(),
            r#"{"model":"claude","max_tokens":7936,"messages":[{"role":"user","content":"hi"}]}"#
        );
        assert_eq!(first.lower_max_tokens(MESSAGES, body.as_bytes(), &overflow, 1_024), None, "once");
        let too_long = Overflow { prompt_tokens: Some(19_500), ..overflow };
        assert_eq!(ladder().lower_max_tokens(MESSAGES, body.as_bytes(), &too_long, 1_024), None);
    }
}
