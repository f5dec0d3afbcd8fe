//! Overflow recovery: send, look at what came back (holding a stream only until its first event),
//! and on "context length exceeded" climb the ladder (lower max_tokens, prune harder, summarize,
//! summarize harder) until the upstream accepts or the retries run out, in which case the client
//! gets the original error unchanged.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::response;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::Proxy;
use super::prepare::Recovery;
use crate::compaction::{plan, summary};
use crate::dialect::{Dialect, ParsedRequest};
use crate::error::{Chain, ProxyError};
use crate::overflow::Overflow;
use crate::rewrite::{RewriteReport, RewriteSettings};
use crate::route::Route;
use crate::session::SessionUpdate;
use crate::session::state::CompactionRecord;
use crate::sse;
use crate::telemetry::metric;

/// Largest error body or held stream prefix compactor reads to look for an overflow.
const MAX_INSPECT_BYTES: usize = 1 << 20;

/// What came back from one attempt.
pub(super) enum Inspected {
    /// Pass it on: the head, the body (possibly with a held prefix already read).
    Pass { parts: response::Parts, body: Incoming, held: Option<Bytes> },
    /// A complete error response, already read.
    Buffered { parts: response::Parts, body: Bytes },
    /// An overflow, already read (the body is kept to return unchanged if recovery fails).
    Overflow { overflow: Overflow, parts: response::Parts, body: Bytes },
}

/// The rungs of the ladder, cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rung {
    PruneHard,
    Summarize,
    SummarizeHarder,
    Exhausted,
}

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub(super) enum CompactError {
    #[error("nothing left to summarize")]
    NothingToSummarize,
    #[error("another request of this session is compacting it")]
    Busy,
    #[error("summary call failed")]
    SummaryFailed(#[source] SummaryError),
}

/// Why a summary call gave no summary.
#[derive(Debug, thiserror::Error)]
pub(super) enum SummaryError {
    #[error("the summarizer's own context overflowed")]
    Overflow,
    #[error("the summarizer answered {0}")]
    Status(http::StatusCode),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("the answer was empty or unreadable")]
    Unreadable,
    #[error(transparent)]
    Upstream(#[from] ProxyError),
}

/// The result of forwarding with recovery.
pub(super) struct Forwarded {
    pub inspected: Inspected,
    pub retries: u32,
    /// The compaction generation of the body that finally went out.
    pub compacted: Option<u32>,
    /// Tokens of the body that finally went out, when recovery rewrote it.
    pub tokens_after: Option<u32>,
}

impl Proxy {
    /// Sends the prepared body; on overflow, recovers when it may. `read_response` asks the
    /// upstream for an uncompressed answer, which the usage tap and the inspection read.
    pub(super) async fn forward(
        &self,
        route: Route,
        parts: &Parts,
        mut body: Bytes,
        mut recovery: Option<Recovery>,
        read_response: bool,
    ) -> Result<Forwarded, ProxyError> {
        let inspect = recovery.is_some() && self.compaction.auto;
        let mut retries = 0u32;
        let mut first_error: Option<(response::Parts, Bytes)> = None;
        let mut rung = Rung::PruneHard;
        let mut lowered_max_tokens = false;
        let mut tokens_after = None;
        loop {
            let request = self.upstream_request(route, parts, body.clone(), read_response)?;
            let response = self.upstreams.send(route.family, request).await?;
            let inspected = if inspect { self.inspect(response, route).await? } else { pass(response) };
            let compacted = recovery.as_ref().and_then(|r| r.record.as_ref().map(|r| r.generation));
            let done = |inspected| Ok(Forwarded { inspected, retries, compacted, tokens_after });
            let Inspected::Overflow { overflow, parts: error_parts, body: error_body } = inspected else {
                // After a retry, a failure of another kind gives the client the original error.
                return match first_error {
                    Some((parts, body)) if is_error(&inspected) => done(Inspected::Buffered { parts, body }),
                    _ => done(inspected),
                };
            };
            metric::overflow_seen(route.label());
            let (original_parts, original_body) = first_error.get_or_insert((error_parts, error_body)).clone();
            let original = Inspected::Buffered { parts: original_parts, body: original_body };
            let Some(rec) = recovery.as_mut() else { return done(original) };
            self.learn_window(rec, &overflow);
            if retries >= self.compaction.max_retries || self.breaker_open(rec) {
                return done(original);
            }
            let mut next = None;
            if !lowered_max_tokens && overflow.prompt_fits() {
                lowered_max_tokens = true;
                next = self.lower_max_tokens(rec.dialect, &body, &overflow).map(|b| (b, None));
            }
            if next.is_none() {
                next = self.climb(parts, rec, &mut rung, &body).await.map(|(b, report)| (b, Some(report)));
            }
            let Some((new_body, report)) = next else { return done(original) };
            if let Some(report) = report {
                tokens_after = Some(report.tokens_after);
            }
            retries += 1;
            metric::retry(route.label());
            body = new_body;
        }
    }

    /// The next rung's body, skipping rungs that change nothing; `None` when the ladder is done.
    async fn climb(
        &self,
        parts: &Parts,
        rec: &mut Recovery,
        rung: &mut Rung,
        current: &Bytes,
    ) -> Option<(Bytes, RewriteReport)> {
        while *rung != Rung::Exhausted {
            let this = *rung;
            *rung = match this {
                Rung::PruneHard => Rung::Summarize,
                Rung::Summarize => Rung::SummarizeHarder,
                _ => Rung::Exhausted,
            };
            match this {
                Rung::PruneHard => {
                    if let Some((body, report)) = self.derive(rec, &self.hard_settings()).await
                        && body != *current
                    {
                        return Some((body, report));
                    }
                }
                Rung::Summarize | Rung::SummarizeHarder => {
                    let harder = this == Rung::SummarizeHarder;
                    match self.summarize(parts, rec, harder, "overflow").await {
                        Ok(record) => {
                            rec.record = Some(record);
                            if let Some((body, report)) = self.derive(rec, &self.hard_settings()).await {
                                return Some((body, report));
                            }
                        }
                        Err(error) => tracing::warn!(error = %Chain(&error), session = %rec.key, "compaction failed"),
                    }
                }
                Rung::Exhausted => {}
            }
        }
        None
    }

    /// Compacts before forwarding (threshold or admin request): prune harder first, summarize when
    /// that is not enough.
    pub(super) async fn compact_ahead(
        &self,
        parts: &Parts,
        rec: &mut Recovery,
        trigger: &'static str,
        report: &RewriteReport,
    ) -> Option<(Bytes, RewriteReport)> {
        let mut best = None;
        if trigger == "threshold"
            && let Some((body, hard)) = self.derive(rec, &self.hard_settings()).await
        {
            if !self.over_threshold(rec, &hard, false) {
                metric::compaction(trigger, "pruned");
                return Some((body, hard));
            }
            best = Some((body, hard));
        }
        match self.summarize(parts, rec, false, trigger).await {
            Ok(record) => {
                rec.record = Some(record);
                self.derive(rec, &self.rewriter.settings).await.or(best)
            }
            Err(error) => {
                tracing::warn!(error = %Chain(&error), session = %rec.key, tokens = report.tokens_after, "compaction ahead of time failed");
                best
            }
        }
    }

    /// Settings for the prune-harder rung: a small protected window, no minimum.
    fn hard_settings(&self) -> RewriteSettings {
        let mut settings = self.rewriter.settings.clone();
        settings.prune_enabled = true;
        settings.prune.protect_tokens = self.compaction.emergency_protect_tokens;
        settings.prune.minimum_tokens = 0;
        settings
    }

    /// The cheap fix: the prompt fits but prompt + max_tokens does not, so ask for fewer tokens.
    fn lower_max_tokens(&self, dialect: Dialect, body: &Bytes, overflow: &Overflow) -> Option<Bytes> {
        let parsed = ParsedRequest::parse(dialect, body)?;
        let (field, requested) = parsed.max_tokens()?;
        let (limit, prompt) = (overflow.limit?, overflow.prompt_tokens?);
        let fits = limit.saturating_sub(prompt).saturating_sub(64);
        if fits < u64::from(self.compaction.min_output_tokens) || fits >= requested {
            return None;
        }
        parsed.splice(&[(field, fits.to_string())]).map(Bytes::from)
    }

    /// Summarizes the older history in a separate tool-less call and stores the record. One
    /// compaction per session at a time: a request that finds the lock taken waits for the
    /// winner's record and reuses it.
    pub(super) async fn summarize(
        &self,
        parts: &Parts,
        rec: &mut Recovery,
        harder: bool,
        trigger: &'static str,
    ) -> Result<CompactionRecord, CompactError> {
        let owner =
            format!("{:016x}", xxhash_rust::xxh3::xxh3_64(format!("{:?}{}", Instant::now(), rec.key).as_bytes()));
        let hold = self.compaction.summary_timeout + Duration::from_secs(10);
        let generation = rec.state.compactions.iter().map(|r| r.generation).max().unwrap_or(0);
        match self.store.try_lock(&rec.key, &owner, hold).await {
            Ok(true) => {}
            Ok(false) => return self.await_winner(rec, generation).await,
            Err(error) => self.warn_store(&error),
        }
        let result = self.summarize_locked(parts, rec, harder, trigger, generation + 1).await;
        let update = match &result {
            Ok(record) => SessionUpdate {
                compaction: Some(record.clone()),
                clear_usage: true,
                breaker: Some((0, 0)),
                compact_requested: Some(false),
                ..Default::default()
            },
            Err(CompactError::SummaryFailed(_)) => {
                let counters = &rec.state.counters;
                let same = counters.failures_at_messages == rec.message_count as u64;
                let failures = if same { counters.compaction_failures + 1 } else { 1 };
                rec.state.counters.compaction_failures = failures;
                rec.state.counters.failures_at_messages = rec.message_count as u64;
                SessionUpdate { breaker: Some((failures, rec.message_count as u64)), ..Default::default() }
            }
            Err(_) => SessionUpdate::default(),
        };
        if let Err(error) = self.store.update(&rec.key, &update).await {
            self.warn_store(&error);
        }
        if let Err(error) = self.store.unlock(&rec.key, &owner).await {
            self.warn_store(&error);
        }
        if let Ok(record) = &result {
            rec.state.compactions.push(record.clone());
        }
        metric::compaction(trigger, if result.is_ok() { "summarized" } else { "failed" });
        result
    }

    /// Waits for the lock holder's record, then reuses it.
    async fn await_winner(&self, rec: &mut Recovery, generation: u32) -> Result<CompactionRecord, CompactError> {
        let deadline = Instant::now() + self.compaction.lock_wait;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Ok(state) = self.store.load(&rec.key).await else { continue };
            let client = ParsedRequest::parse(rec.dialect, &rec.client_body).ok_or(CompactError::NothingToSummarize)?;
            let newer: Vec<CompactionRecord> =
                state.compactions.iter().filter(|r| r.generation > generation).cloned().collect();
            if let Some(record) = plan::matching_record(&client, &newer).cloned() {
                rec.state = state;
                return Ok(record);
            }
        }
        Err(CompactError::Busy)
    }

    async fn summarize_locked(
        &self,
        parts: &Parts,
        rec: &Recovery,
        harder: bool,
        trigger: &'static str,
        generation: u32,
    ) -> Result<CompactionRecord, CompactError> {
        let settings = &self.compaction;
        let mut parsed = ParsedRequest::parse(rec.dialect, &rec.client_body).ok_or(CompactError::NothingToSummarize)?;
        let model = self.rewriter.count(&mut parsed).await;
        let count = |text: &str| self.rewriter.counter.count(model.encoding, text);
        let previous = rec.record.as_ref();
        let after = previous.map_or(0, |r| r.covered_messages as usize);
        let keep = if harder { settings.keep_recent_tokens / 4 } else { settings.keep_recent_tokens };
        let cut = plan::choose_cut(&parsed, keep, after.max(parsed.lead()).saturating_sub(1).max(after))
            .ok_or(CompactError::NothingToSummarize)?;
        let from = after.max(parsed.lead());

        let summary_model = if settings.model.is_empty() {
            parsed.model.as_deref().unwrap_or("").to_string()
        } else {
            settings.model.clone()
        };
        let summarizer = self.rewriter.models.lookup(&summary_model);
        let max_tokens = settings.summary_max_tokens.min(summarizer.max_output_tokens);
        let fixed = count(&settings.system_prompt) + count(&settings.instruction) + 64;
        let window = (f64::from(summarizer.context_window) / f64::from(summarizer.token_factor)) as u32;
        let mut budget = window.saturating_sub(max_tokens).saturating_sub(fixed) * 9 / 10;
        let started = Instant::now();
        let mut text = None;
        for _ in 0..2 {
            let transcript = summary::fitted_transcript(
                &parsed,
                from,
                cut,
                previous.map(|r| r.summary.as_str()),
                settings,
                budget,
                &count,
            );
            metric::summary_tokens("input", u64::from(count(&transcript)));
            let body = summary::request_body(rec.dialect, &summary_model, settings, &transcript, max_tokens);
            match self.summary_call(parts, rec.route, body).await {
                Ok(answer) => {
                    text = summary::extract(rec.dialect, &answer);
                    break;
                }
                // The summarizer's own window was smaller than estimated: halve and try once more.
                Err(SummaryError::Overflow) => budget /= 2,
                Err(error) => return Err(CompactError::SummaryFailed(error)),
            }
        }
        metric::summary_latency(started.elapsed());
        let summary_text = text.ok_or(CompactError::SummaryFailed(SummaryError::Unreadable))?;
        metric::summary_tokens("output", u64::from(count(&summary_text)));
        let user_budget = if harder { settings.user_message_max_tokens / 4 } else { settings.user_message_max_tokens };
        let tokens_before = crate::rewrite::Rewriter::scaled(parsed.conversation.tokens_before(), model);
        let mut record = CompactionRecord {
            generation,
            summary: summary_text,
            covered_messages: cut as u64,
            covered_hash: plan::prefix_hash(&parsed, cut),
            first_kept: cut as u64,
            user_messages: plan::user_messages(&parsed, cut, user_budget),
            truncate_user_tokens: if harder { (settings.user_message_max_tokens / 4).max(256) } else { 0 },
            tokens_before: u64::from(tokens_before),
            tokens_after: 0,
            trigger: trigger.to_string(),
            model: summary_model,
            at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        };
        if let Some(rebuilt) = plan::rebuild(&parsed, &record, &settings.summary_prefix, &count)
            && let Some(mut after) = ParsedRequest::parse(rec.dialect, &rebuilt)
        {
            self.rewriter.count_items(&mut after, model.encoding);
            record.tokens_after =
                u64::from(crate::rewrite::Rewriter::scaled(after.conversation.tokens_before(), model));
        }
        tracing::info!(
            session = %rec.key,
            trigger = %trigger,
            generation,
            tokens_before = record.tokens_before,
            tokens_after = record.tokens_after,
            covered_messages = cut,
            "compacted"
        );
        Ok(record)
    }

    /// The non-streaming summary request, with the client's own credentials and headers.
    async fn summary_call(&self, parts: &Parts, route: Route, body: Vec<u8>) -> Result<Bytes, SummaryError> {
        let mut request = self.upstreams.build_request(&route, parts, Bytes::from(body))?;
        request.headers_mut().insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        request.headers_mut().insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let timeout = self.compaction.summary_timeout;
        let call = async {
            let response = self.upstreams.send(route.family, request).await?;
            let status = response.status();
            let bytes = self.upstreams.read_body(route.family, response.into_body(), 8 << 20).await?;
            if status.is_success() {
                Ok(bytes)
            } else if self.detector.detect(status.as_u16(), &bytes).is_some() {
                Err(SummaryError::Overflow)
            } else {
                Err(SummaryError::Status(status))
            }
        };
        tokio::time::timeout(timeout, call).await.unwrap_or(Err(SummaryError::TimedOut(timeout)))
    }

    /// Remembers the real window an error named, for later estimates of this session.
    fn learn_window(&self, rec: &mut Recovery, overflow: &Overflow) {
        let Some(limit) = overflow.limit.filter(|l| *l > 0) else { return };
        if rec.state.counters.learned_window == limit {
            return;
        }
        rec.state.counters.learned_window = limit;
        let store = self.store.clone();
        let key = rec.key.clone();
        tokio::spawn(async move {
            let update = SessionUpdate { learned_window: Some(limit), ..Default::default() };
            let _ = store.update(&key, &update).await;
        });
    }

    /// Reads an error body or holds a stream until its first event, and classifies what came.
    async fn inspect(&self, response: http::Response<Incoming>, route: Route) -> Result<Inspected, ProxyError> {
        let (parts, mut body) = response.into_parts();
        let status = parts.status.as_u16();
        if !parts.status.is_success() {
            let bytes = self.upstreams.read_body(route.family, body, MAX_INSPECT_BYTES).await?;
            return Ok(match self.detector.detect(status, &bytes) {
                Some(overflow) => Inspected::Overflow { overflow, parts, body: bytes },
                None => Inspected::Buffered { parts, body: bytes },
            });
        }
        let streaming =
            parts.headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if !streaming {
            return Ok(Inspected::Pass { parts, body, held: None });
        }
        // Hold the stream until its first event that carries content or an error; never longer
        // than the first-byte timeout.
        let deadline = tokio::time::Instant::now() + self.upstreams.first_byte_timeout();
        let mut held = BytesMut::new();
        let mut first = FirstEvent::new();
        let mut verdict = Verdict::Wait;
        loop {
            match verdict {
                Verdict::Release => return Ok(Inspected::Pass { parts, body, held: Some(held.freeze()) }),
                Verdict::Error => {
                    return Ok(match self.detector.detect(200, &held) {
                        Some(overflow) => Inspected::Overflow { overflow, parts, body: held.freeze() },
                        None => Inspected::Pass { parts, body, held: Some(held.freeze()) },
                    });
                }
                Verdict::Wait if held.len() > MAX_INSPECT_BYTES => {
                    return Ok(Inspected::Pass { parts, body, held: Some(held.freeze()) });
                }
                Verdict::Wait => {}
            }
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        held.extend_from_slice(&data);
                        verdict = first.push(&data);
                    }
                }
                // The stream ended (or broke) while held, with no verdict: pass on what there is.
                Ok(None) | Ok(Some(Err(_))) | Err(_) => {
                    return Ok(Inspected::Pass { parts, body, held: Some(held.freeze()) });
                }
            }
        }
    }

    /// The upstream request for a body; asks for an uncompressed answer when compactor reads it.
    pub(super) fn upstream_request(
        &self,
        route: Route,
        parts: &Parts,
        body: Bytes,
        identity: bool,
    ) -> Result<http::Request<crate::upstream::UpstreamBody>, ProxyError> {
        let mut request = self.upstreams.build_request(&route, parts, body)?;
        if identity {
            request.headers_mut().insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        Ok(request)
    }
}

fn pass(response: http::Response<Incoming>) -> Inspected {
    let (parts, body) = response.into_parts();
    Inspected::Pass { parts, body, held: None }
}

fn is_error(inspected: &Inspected) -> bool {
    match inspected {
        Inspected::Buffered { parts, .. } | Inspected::Pass { parts, .. } => !parts.status.is_success(),
        Inspected::Overflow { .. } => true,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Wait,
    Release,
    Error,
}

/// Watches a held stream's events: comments, pings and Responses' bookkeeping events keep the
/// hold; the first event with content releases it; an error event is inspected.
struct FirstEvent {
    reader: sse::Reader,
    verdict: Verdict,
}

impl FirstEvent {
    fn new() -> Self {
        Self { reader: sse::Reader::new(MAX_INSPECT_BYTES), verdict: Verdict::Wait }
    }

    /// Reads the next chunk of the held stream; the verdict stands once it is not `Wait`.
    fn push(&mut self, chunk: &[u8]) -> Verdict {
        let verdict = &mut self.verdict;
        self.reader.push(chunk, |event| {
            if *verdict == Verdict::Wait {
                *verdict = event_verdict(event);
            }
        });
        self.verdict
    }
}

fn event_verdict(event: &sse::Event) -> Verdict {
    if event.error.is_some() {
        return Verdict::Error;
    }
    let (name, data) = (event.name.as_str(), event.data.trim());
    if data.is_empty() && name.is_empty() {
        return Verdict::Wait;
    }
    if name == "error" || name == "response.failed" {
        return Verdict::Error;
    }
    if data == "[DONE]" {
        return Verdict::Release;
    }
    let value: serde_json::Value = match serde_json::from_str(data) {
        Ok(value) => value,
        Err(_) => return Verdict::Release,
    };
    let kind = value.get("type").and_then(|t| t.as_str()).unwrap_or(name);
    if value.get("error").is_some_and(|e| !e.is_null()) || kind == "error" || kind == "response.failed" {
        return Verdict::Error;
    }
    match kind {
        "ping" | "response.created" | "response.in_progress" | "response.queued" => Verdict::Wait,
        _ => Verdict::Release,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_event_verdict(held: &[u8]) -> Verdict {
        FirstEvent::new().push(held)
    }

    #[test]
    fn a_stream_is_held_through_pings_and_bookkeeping_and_released_at_content() {
        assert_eq!(first_event_verdict(b": OPENROUTER PROCESSING\n\n"), Verdict::Wait);
        assert_eq!(first_event_verdict(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"), Verdict::Wait);
        assert_eq!(
            first_event_verdict(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"),
            Verdict::Release
        );
        assert_eq!(
            first_event_verdict(b"event: response.created\ndata: {\"type\":\"response.created\"}\n\n"),
            Verdict::Wait
        );
        assert_eq!(first_event_verdict(b"data: {\"choices\":[{\"delta\":{\"content\""), Verdict::Wait);
    }

    #[test]
    fn error_events_inside_a_200_stream_are_inspected() {
        assert_eq!(first_event_verdict(b"data: {\"error\":{\"message\":\"prompt is too long\"}}\n\n"), Verdict::Error);
        assert_eq!(
            first_event_verdict(b"event: response.failed\ndata: {\"type\":\"response.failed\"}\n\n"),
            Verdict::Error
        );
        assert_eq!(first_event_verdict(b"error: {\"code\":400}\n\n"), Verdict::Error);
    }
}
