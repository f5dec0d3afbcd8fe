//! The summary call: what the summarizer reads (a plain-text transcript of the covered part, the
//! previous summary first), the tool-less, non-streaming request in the client's dialect sent
//! upstream with the client's own credentials, and the summary read from its answer.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::compaction::CompactionSettings;
pub use crate::config::compaction::Transcript;
use crate::dialect::{Dialect, ParsedRequest};
use crate::error::ProxyError;
use crate::json::json_string;
use crate::overflow::OverflowDetector;
use crate::route::ApiFamily;
use crate::session::SummaryCost;
use crate::telemetry::{metric, trace};
use crate::upstream::{RequestHead, Upstreams};
use crate::work;
use tracing::Instrument;

mod answer;
mod call;
mod transcript;

pub use answer::extract;
use transcript::render;
pub use transcript::{next_piece, transcript_entries};

/// Largest summary answer compactor reads.
const MAX_ANSWER_BYTES: usize = 8 << 20;
/// The smallest piece of a rolling summary: below it the summarizer cannot work at all.
const MIN_PIECE_TOKENS: u32 = 256;
/// Summary calls one compaction makes at most (pieces and retries).
const MAX_SUMMARY_CALLS: u32 = 64;
/// Overflows of summary calls one compaction accepts before it gives up.
const MAX_OVERFLOWS: u32 = 4;
/// The most pieces a whole transcript is read in; a longer one is cut to head and tail first (and
/// the calls left under [`MAX_SUMMARY_CALLS`] absorb the retries of overflows).
const MAX_PIECES: u32 = 32;

/// A summary and what it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub text: String,
    /// Summary calls made (the pieces of a rolling summary and the retries of an overflow).
    pub calls: u32,
    /// Summary calls that overflowed the summarizer's window.
    pub overflows: u32,
    pub elapsed: Duration,
    /// The transcript budget that worked (halved at each overflow).
    pub piece_budget: u32,
    /// The provider's usage of the calls that answered.
    pub cost: SummaryCost,
}

/// Why a summary call gave no summary.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("the summarizer's own context overflowed")]
    Overflow,
    #[error("the summarizer answered {0}")]
    Status(http::StatusCode),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("the answer was empty or unreadable")]
    Unreadable,
    #[error("stopped")]
    Stopped,
    #[error(transparent)]
    Upstream(#[from] ProxyError),
}

/// What to summarize: messages `from..cut` of the client's conversation, after the previous summary.
pub struct SummaryInput<'a> {
    pub parsed: &'a ParsedRequest<'a>,
    pub from: usize,
    pub cut: usize,
    pub previous: Option<&'a str>,
    /// The model that summarizes, and the answer's budget.
    pub model: &'a str,
    pub max_tokens: u32,
    /// Tokens the transcript may take.
    pub budget: u32,
    pub count: &'a (dyn Fn(&str) -> u32 + Sync),
}

/// Makes summary calls; shared by every request.
pub struct Summarizer {
    upstreams: Arc<Upstreams>,
    overflow: OverflowDetector,
    timeout: Duration,
    system_prompt: String,
    instruction: String,
    transcript_output_tokens: u32,
    transcript: Transcript,
}

impl Summarizer {
    pub fn new(settings: &CompactionSettings, upstreams: Arc<Upstreams>) -> Self {
        Self {
            upstreams,
            overflow: settings.overflow.clone(),
            timeout: settings.summary_timeout,
            system_prompt: settings.system_prompt.clone(),
            instruction: settings.instruction.clone(),
            transcript_output_tokens: settings.transcript_output_tokens,
            transcript: settings.transcript,
        }
    }

    /// The transcript's entries, in order. `whole`: every message as it was, as long as at most
    /// [`MAX_PIECES`] pieces carry them (an entry larger than a piece is read in consecutive parts
    /// by [`next_piece`]); past that, and with `head_tail`, each tool output cut to head and tail
    /// (plus the lines that state something), harder until the transcript fits one piece or the
    /// cut reaches its floor.
    async fn entries(&self, input: &SummaryInput<'_>) -> Result<Vec<String>, SummaryError> {
        let count = input.count;
        let carried = input.previous.map_or(0, count) + 16;
        let size = |entries: &[String]| entries.iter().map(|e| count(e) + 2).sum::<u32>() + carried;
        if self.transcript == Transcript::Whole {
            let whole = || {
                let entries = transcript_entries(input.parsed, input.from, input.cut, u32::MAX, count);
                let tokens = size(&entries);
                (entries, tokens)
            };
            let (entries, tokens) = work::step(whole).await.map_err(|_| SummaryError::Stopped)?;
            // Each piece carries the summary so far, about a summary's answer.
            let room = input.budget.saturating_sub(input.max_tokens.min(input.budget / 2)).max(MIN_PIECE_TOKENS);
            if tokens.div_ceil(room) <= MAX_PIECES {
                return Ok(entries);
            }
        }
        let widest = self.transcript_output_tokens.min(input.budget / 4).max(64);
        let mut entries = Vec::new();
        for per_output in [widest, widest / 4, 64] {
            let attempt = || {
                let entries = transcript_entries(input.parsed, input.from, input.cut, per_output.max(64), count);
                let fit = size(&entries) <= input.budget;
                (entries, fit)
            };
            let (attempt, fit) = work::step(attempt).await.map_err(|_| SummaryError::Stopped)?;
            entries = attempt;
            if fit {
                break;
            }
        }
        Ok(entries)
    }

    /// Tokens of the summary request besides the transcript.
    pub fn prompt_tokens(&self, count: &dyn Fn(&str) -> u32) -> u32 {
        count(&self.system_prompt) + count(&self.instruction) + 64
    }

    /// The summary of `input`. A transcript larger than the summarizer's window is summarized in
    /// order, in pieces that each fit, the summary so far carried into the next piece (a rolling
    /// summary): no message is dropped. A summary call that overflows halves the piece size and
    /// tries that piece again.
    pub async fn summarize(&self, head: &RequestHead, input: SummaryInput<'_>) -> Result<Summary, SummaryError> {
        let count = input.count;
        let started = Instant::now();
        let span = trace::summary_span(head.route.family, input.model);
        let mut input_tokens = 0u32;
        let entries = self.entries(&input).await?;
        let mut entries: VecDeque<String> = entries.into();
        let mut summary = input.previous.map(str::to_string);
        let mut budget = input.budget;
        let mut calls = 0u32;
        let mut overflows = 0u32;
        let mut cost = SummaryCost::default();
        let overhead = self.prompt_tokens(count);
        while !entries.is_empty() || calls == 0 {
            let carried = summary.as_deref().map_or(0, count) + 16;
            let room = budget.saturating_sub(carried).max(MIN_PIECE_TOKENS);
            let taken = entries.clone();
            let piece =
                work::step(|| next_piece(&mut entries, room, count)).await.map_err(|_| SummaryError::Stopped)?;
            let transcript = render(summary.as_deref(), &piece);
            let piece_tokens = count(&transcript);
            metric::summary_tokens("input", u64::from(piece_tokens));
            input_tokens = input_tokens.saturating_add(piece_tokens);
            span.record("gen_ai.usage.input_tokens", input_tokens);
            let body =
                self.request_body(input.parsed.dialect, head.route.family, input.model, &transcript, input.max_tokens);
            calls += 1;
            let summary_head = call::head(head, input.parsed.dialect, input.model);
            match self.call(summary_head.as_ref().unwrap_or(head), body).instrument(span.clone()).await {
                Ok(answer) => {
                    metric::summary_call("ok");
                    let Some(text) = extract(input.parsed.dialect, &answer) else {
                        span.record("error.type", SummaryError::Unreadable.to_string())
                            .record("otel.status_code", "ERROR");
                        return Err(SummaryError::Unreadable);
                    };
                    let estimate = (u64::from(piece_tokens + overhead), u64::from(count(&text)));
                    cost.add(crate::usage::of_body(&answer).as_ref(), estimate.0, estimate.1);
                    summary = Some(text);
                }
                Err(SummaryError::Overflow) if budget / 2 >= MIN_PIECE_TOKENS && overflows < MAX_OVERFLOWS => {
                    metric::summary_call("overflow");
                    // The summarizer's window is smaller than estimated: the same piece, smaller.
                    overflows += 1;
                    budget /= 2;
                    entries = taken;
                }
                Err(error) => {
                    metric::summary_call(if matches!(error, SummaryError::Overflow) { "overflow" } else { "failed" });
                    span.record("error.type", error.to_string()).record("otel.status_code", "ERROR");
                    return Err(error);
                }
            }
            if calls >= MAX_SUMMARY_CALLS {
                break;
            }
        }
        let elapsed = started.elapsed();
        metric::summary_latency(elapsed);
        span.record("compactor.summary_calls", calls);
        let Some(text) = summary.filter(|_| entries.is_empty()) else {
            span.record("error.type", SummaryError::Unreadable.to_string()).record("otel.status_code", "ERROR");
            return Err(SummaryError::Unreadable);
        };
        let output_tokens = count(&text);
        metric::summary_tokens("output", u64::from(output_tokens));
        span.record("gen_ai.usage.output_tokens", output_tokens);
        Ok(Summary { text, calls, overflows, elapsed, piece_budget: budget, cost })
    }

    /// The summary of a Chat conversation as the provider last saw it: `sent` (the body as it
    /// was forwarded) with the summary instruction appended as a last user message, so a provider
    /// that caches prefixes (a local server's KV cache above all) reads the conversation from its
    /// cache and prefills only the instruction. One call: the body fit the window when it was
    /// sent. `None` when `sent` is not a Chat body compactor can extend.
    pub async fn summarize_appended(
        &self,
        head: &RequestHead,
        sent: &[u8],
        model: &str,
        max_tokens: u32,
    ) -> Option<Result<Summary, SummaryError>> {
        let started = Instant::now();
        let mut body: serde_json::Value = serde_json::from_slice(sent).ok()?;
        let object = body.as_object_mut()?;
        let instruction = format!(
            "Stop working on the task now: do not answer the messages above and do not call tools. {}",
            self.instruction
        );
        object.get_mut("messages")?.as_array_mut()?.push(serde_json::json!({"role": "user", "content": instruction}));
        for key in ["stream_options", "max_tokens", "max_completion_tokens", "n", "response_format", "logprobs"] {
            object.remove(key);
        }
        object.insert("stream".into(), serde_json::Value::Bool(false));
        object.insert(chat_output_field(model).into(), max_tokens.into());
        if object.contains_key("tools") {
            object.insert("tool_choice".into(), "none".into());
        }
        let body = serde_json::to_vec(&body).ok()?;
        let sent_bytes = body.len();
        let span = trace::summary_span(head.route.family, model);
        let answer = self.call(head, body).instrument(span.clone()).await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => {
                metric::summary_call(if matches!(error, SummaryError::Overflow) { "overflow" } else { "failed" });
                return Some(Err(error));
            }
        };
        metric::summary_call("ok");
        let elapsed = started.elapsed();
        metric::summary_latency(elapsed);
        let Some(text) = extract(Dialect::ChatCompletions, &answer) else { return Some(Err(SummaryError::Unreadable)) };
        // Without a reported usage: about 4 bytes a token, the body sent and the summary.
        let mut cost = SummaryCost::default();
        cost.add(crate::usage::of_body(&answer).as_ref(), (sent_bytes / 4) as u64, (text.len() / 4) as u64);
        Some(Ok(Summary { text, calls: 1, overflows: 0, elapsed, piece_budget: 0, cost }))
    }

    /// A prefill ahead ([`super::prefill`]): `body` sent like a summary call, its one-token answer
    /// dropped.
    pub async fn prefill(&self, head: &RequestHead, body: Vec<u8>) -> Result<(), SummaryError> {
        self.call(head, body).await.map(|_| ())
    }

    /// One non-streaming call, with the client's own credentials and headers.
    async fn call(&self, head: &RequestHead, body: Vec<u8>) -> Result<Bytes, SummaryError> {
        let call = async {
            let (status, answer) = self.upstreams.call(head, Bytes::from(body), MAX_ANSWER_BYTES).await?;
            if status.is_success() {
                Ok(answer)
            } else if self.overflow.detect(status.as_u16(), &answer).is_some() {
                Err(SummaryError::Overflow)
            } else {
                Err(SummaryError::Status(status))
            }
        };
        tokio::time::timeout(self.timeout, call).await.unwrap_or(Err(SummaryError::TimedOut(self.timeout)))
    }

    /// The tool-less, non-streaming summary request in the client's dialect.
    /// Claude on Bedrock and on Vertex AI name the model in the path and their API version in
    /// the body ([`call::anthropic_envelope`]).
    fn request_body(
        &self,
        dialect: Dialect,
        family: ApiFamily,
        model: &str,
        transcript: &str,
        max_tokens: u32,
    ) -> Vec<u8> {
        let user = format!("<transcript>\n{transcript}</transcript>\n\n{}", self.instruction);
        let body = match dialect {
            Dialect::ChatCompletions => format!(
                r#"{{"model":{},"messages":[{{"role":"system","content":{}}},{{"role":"user","content":{}}}],"{}":{max_tokens},"stream":false}}"#,
                json_string(model),
                json_string(&self.system_prompt),
                json_string(&user),
                chat_output_field(model)
            ),
            Dialect::AnthropicMessages => {
                let (lead, stream) = call::anthropic_envelope(family, model);
                format!(
                    r#"{{{lead},"max_tokens":{max_tokens},"system":{},"messages":[{{"role":"user","content":{}}}]{stream}}}"#,
                    json_string(&self.system_prompt),
                    json_string(&user)
                )
            }
            Dialect::Responses => format!(
                r#"{{"model":{},"instructions":{},"input":[{{"type":"message","role":"user","content":[{{"type":"input_text","text":{}}}]}}],"max_output_tokens":{max_tokens},"store":false,"stream":false}}"#,
                json_string(model),
                json_string(&self.system_prompt),
                json_string(&user)
            ),
            // The model is in the path (see `call::head`).
            Dialect::Gemini => format!(
                r#"{{"systemInstruction":{{"parts":[{{"text":{}}}]}},"contents":[{{"role":"user","parts":[{{"text":{}}}]}}],"generationConfig":{{"maxOutputTokens":{max_tokens}}}}}"#,
                json_string(&self.system_prompt),
                json_string(&user)
            ),
        };
        body.into_bytes()
    }
}

/// The output cap's field in a Chat summary call: OpenAI's reasoning models refuse `max_tokens`.
fn chat_output_field(model: &str) -> &'static str {
    let name = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    let reasoning = ["o1", "o3", "o4", "gpt-5"].iter().any(|prefix| name.starts_with(prefix));
    if reasoning { "max_completion_tokens" } else { "max_tokens" }
}
