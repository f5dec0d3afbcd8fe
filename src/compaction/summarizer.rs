//! The summary call: what the summarizer reads (a plain-text transcript of the covered part, the
//! previous summary first), the tool-less, non-streaming request in the client's dialect sent
//! upstream with the client's own credentials, and the summary read from its answer.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::compaction::CompactionSettings;
pub use crate::config::compaction::Transcript;
use crate::conversation::{Kind, Role};
use crate::dialect::{Dialect, ParsedRequest};
use crate::error::ProxyError;
use crate::json::json_string;
use crate::overflow::OverflowDetector;
use crate::rewrite::truncate::head_and_tail;
use crate::session::SummaryCost;
use crate::telemetry::{metric, trace};
use crate::upstream::{RequestHead, Upstreams};
use crate::work;
use tracing::Instrument;

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
            let body = self.request_body(input.parsed.dialect, input.model, &transcript, input.max_tokens);
            calls += 1;
            let gemini_head = (input.parsed.dialect == Dialect::Gemini).then(|| gemini_summary_head(head, input.model));
            match self.call(gemini_head.as_ref().unwrap_or(head), body).instrument(span.clone()).await {
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
    fn request_body(&self, dialect: Dialect, model: &str, transcript: &str, max_tokens: u32) -> Vec<u8> {
        let user = format!("<transcript>\n{transcript}</transcript>\n\n{}", self.instruction);
        let body = match dialect {
            Dialect::ChatCompletions => format!(
                r#"{{"model":{},"messages":[{{"role":"system","content":{}}},{{"role":"user","content":{}}}],"{}":{max_tokens},"stream":false}}"#,
                json_string(model),
                json_string(&self.system_prompt),
                json_string(&user),
                chat_output_field(model)
            ),
            Dialect::AnthropicMessages => format!(
                r#"{{"model":{},"max_tokens":{max_tokens},"system":{},"messages":[{{"role":"user","content":{}}}],"stream":false}}"#,
                json_string(model),
                json_string(&self.system_prompt),
                json_string(&user)
            ),
            Dialect::Responses => format!(
                r#"{{"model":{},"instructions":{},"input":[{{"type":"message","role":"user","content":[{{"type":"input_text","text":{}}}]}}],"max_output_tokens":{max_tokens},"store":false,"stream":false}}"#,
                json_string(model),
                json_string(&self.system_prompt),
                json_string(&user)
            ),
            // The model is in the path (see `gemini_summary_head`).
            Dialect::Gemini => format!(
                r#"{{"systemInstruction":{{"parts":[{{"text":{}}}]}},"contents":[{{"role":"user","parts":[{{"text":{}}}]}}],"generationConfig":{{"maxOutputTokens":{max_tokens}}}}}"#,
                json_string(&self.system_prompt),
                json_string(&user)
            ),
        };
        body.into_bytes()
    }
}

/// The head of a Gemini summary call: the client's headers and query (its key may be there), sent
/// to `:generateContent` of the summarizing model, without `alt=sse` (the answer is read whole).
/// The path is the client's up to its `models/` (a Vertex AI path keeps its project and location).
fn gemini_summary_head(head: &RequestHead, model: &str) -> RequestHead {
    let client_path = head.uri.path();
    let models = match client_path.rfind("/models/") {
        Some(at) => &client_path[..at + "/models/".len()],
        None => "/v1beta/models/",
    };
    let query: Vec<&str> = head
        .uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.starts_with("alt="))
        .collect();
    let mut path = format!("{models}{model}:generateContent");
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    RequestHead {
        route: crate::route::Route { family: head.route.family, endpoint: crate::route::Endpoint::GenerateContent },
        method: http::Method::POST,
        uri: path.parse().unwrap_or_else(|_| head.uri.clone()),
        headers: head.headers.clone(),
    }
}

/// The output cap's field in a Chat summary call: OpenAI's reasoning models refuse `max_tokens`.
fn chat_output_field(model: &str) -> &'static str {
    let name = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    let reasoning = ["o1", "o3", "o4", "gpt-5"].iter().any(|prefix| name.starts_with(prefix));
    if reasoning { "max_completion_tokens" } else { "max_tokens" }
}

/// The transcript of messages `from..cut`, one entry per item, each tool output cut to
/// `per_output` tokens (its head and tail); the user's own words are never cut.
pub fn transcript_entries(
    parsed: &ParsedRequest,
    from: usize,
    cut: usize,
    per_output: u32,
    count: &dyn Fn(&str) -> u32,
) -> Vec<String> {
    let cut_to = |text: &str, budget: u32| {
        if count(text) > budget { head_and_tail(text, budget.max(16), count) } else { text.to_string() }
    };
    let mut entries = Vec::new();
    for item in parsed.conversation.items.iter().filter(|i| i.message >= from && i.message < cut) {
        let line = match &item.kind {
            Kind::Text { role: Role::User, text } => format!("USER: {text}"),
            Kind::Text { text, .. } => format!("ASSISTANT: {text}"),
            Kind::System { text } => format!("SYSTEM: {text}"),
            Kind::ToolCall { id, name, arguments } => {
                format!(
                    "ASSISTANT CALLED TOOL {name} [{}]: {}",
                    id.as_deref().unwrap_or("-"),
                    cut_to(arguments, per_output / 4)
                )
            }
            Kind::ToolResult { call_id, text, attachments } => {
                let note =
                    if *attachments > 0 { format!(" (+{attachments} attachments omitted)") } else { String::new() };
                let text = cut_keeping_facts(text, per_output, count);
                format!("TOOL RESULT [{}]{note}: {text}", call_id.as_deref().unwrap_or("-"))
            }
            Kind::Attachment => "[attachment omitted]".to_string(),
            Kind::Thinking { .. } => continue,
            Kind::Other { .. } => "[unsupported content omitted]".to_string(),
        };
        entries.push(line);
    }
    entries
}

/// A tool output cut to `budget` tokens for the summarizer: its head and tail and, from the middle
/// the cut removes, the lines that state something (`key: value`, `key = value`, errors, warnings,
/// failures), in order, in up to a quarter of the budget. A fact the agent read in the middle of a
/// long output still reaches the summary.
fn cut_keeping_facts(text: &str, budget: u32, count: &dyn Fn(&str) -> u32) -> String {
    let total = count(text).max(1);
    let budget = budget.max(16);
    if total <= budget {
        return text.to_string();
    }
    let bytes_per_token = text.len() as f64 / f64::from(total);
    let fact_bytes = (f64::from(budget / 4) * bytes_per_token) as usize;
    // head_and_tail with the rest of the budget keeps about 3/8 of it at each end.
    let edge = (f64::from(budget * 3 / 8) * bytes_per_token) as usize;
    let (from, to) =
        (text.ceil_char_boundary(edge.min(text.len())), text.floor_char_boundary(text.len().saturating_sub(edge)));
    let mut facts = String::new();
    if from < to {
        let middle = &text[from..to];
        // Whole lines only: the first and last lines of the middle may be cut.
        let whole = match (middle.find('\n'), middle.rfind('\n')) {
            (Some(first), Some(last)) if first < last => &middle[first + 1..last],
            _ => "",
        };
        for line in whole.lines().map(str::trim).filter(|line| looks_like_fact(line)) {
            if facts.len() + line.len() + 1 > fact_bytes {
                break;
            }
            facts.push_str(line);
            facts.push('\n');
        }
    }
    if facts.is_empty() {
        return head_and_tail(text, budget, count);
    }
    let room = budget.saturating_sub(count(&facts) + 16).max(16);
    let mut out = head_and_tail(text, room, count);
    out.push_str("\nLines kept from the cut middle:\n");
    out.push_str(&facts);
    out
}

/// A short line that states something: `key: value`, `key = value`, or an error, warning or
/// failure.
fn looks_like_fact(line: &str) -> bool {
    if !(6..=240).contains(&line.len()) {
        return false;
    }
    let keyed = line.split_once([':', '=']).is_some_and(|(key, value)| {
        let key = key.trim();
        !key.is_empty()
            && key.len() <= 48
            && !value.trim().is_empty()
            && key.chars().all(|c| c.is_alphanumeric() || " _-./\"'".contains(c))
    });
    let alarming = ["error", "fail", "warn", "panic", "exception", "fatal"]
        .iter()
        .any(|word| line.as_bytes().windows(word.len()).any(|w| w.eq_ignore_ascii_case(word.as_bytes())));
    keyed || alarming
}

/// What one summary call reads: the summary so far, then the piece.
fn render(summary: Option<&str>, piece: &str) -> String {
    let mut out = String::with_capacity(piece.len() + summary.map_or(0, str::len) + 64);
    if let Some(summary) = summary {
        out.push_str("SUMMARY OF THE EARLIER CONVERSATION:\n");
        out.push_str(summary);
        out.push_str("\n\n");
    }
    out.push_str(piece);
    out.push_str("\n\n");
    out
}

/// The next piece of a rolling summary: the oldest entries, in order, up to `room` tokens (at
/// least one entry, or the first part of one larger than `room`, split at a line or character
/// boundary, its rest left first in `entries`). Nothing is dropped. Linear in the piece's size.
pub fn next_piece(entries: &mut VecDeque<String>, room: u32, count: &dyn Fn(&str) -> u32) -> String {
    let mut piece = String::new();
    let mut used = 0u32;
    while let Some(entry) = entries.front() {
        let tokens = count(entry) + 2;
        if used + tokens <= room {
            used += tokens;
            if !piece.is_empty() {
                piece.push_str("\n\n");
            }
            piece.push_str(entry);
            entries.pop_front();
            continue;
        }
        if piece.is_empty() {
            // One entry larger than the room: cut in parts of about the room, in order; the first
            // goes now, the others stay first in line.
            let Some(entry) = entries.pop_front() else { break };
            let mut parts = split_text(&entry, room, tokens);
            let first = parts.remove(0);
            for part in parts.into_iter().rev() {
                entries.push_front(part);
            }
            piece = first;
        }
        break;
    }
    piece
}

/// `text` (`tokens` long) in consecutive parts of about `room` tokens: each ends at a line end
/// in its second half, else (inside an overlong line) after a space there, so a word (a value, a
/// path) stays whole, else at a character boundary. Nothing is dropped: the parts joined are the
/// text. Linear in the text.
fn split_text(text: &str, room: u32, tokens: u32) -> Vec<String> {
    let share = f64::from(room.max(1)) / f64::from(tokens.max(1));
    let step = ((text.len() as f64 * share * 0.9) as usize).max(1);
    let mut parts = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = text.ceil_char_boundary((start + step).min(text.len()));
        if end < text.len() {
            let part = &text[start..end];
            let at = |found: Option<usize>| found.filter(|&n| n >= step / 2).map(|n| start + n + 1);
            if let Some(cut) = at(part.rfind('\n')).or_else(|| at(part.rfind(' '))) {
                end = cut;
            }
        }
        parts.push(text[start..end].to_string());
        start = end;
    }
    if parts.is_empty() {
        parts.push(String::new());
    }
    parts
}

/// The summary text of the summarizer's answer.
pub fn extract(dialect: Dialect, body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = match dialect {
        Dialect::ChatCompletions => value["choices"][0]["message"]["content"].as_str()?.to_string(),
        Dialect::AnthropicMessages => value["content"]
            .as_array()?
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Dialect::Responses => value["output"]
            .as_array()?
            .iter()
            .filter(|item| item["type"] == "message")
            .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
            .filter(|part| part["type"] == "output_text")
            .filter_map(|part| part["text"].as_str().map(str::to_string))
            .collect::<Vec<_>>()
            .join("\n"),
        // Thoughts are the model's reasoning, not the summary.
        Dialect::Gemini => value["candidates"][0]["content"]["parts"]
            .as_array()?
            .iter()
            .filter(|part| part["thought"] != true)
            .filter_map(|part| part["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
    };
    let text = text.trim();
    let text = if stopped_at_cap(dialect, &value) { complete_part(text) } else { text };
    (!text.is_empty()).then(|| text.to_string())
}

/// Whether the summarizer stopped because it reached its output cap, as each dialect says it.
fn stopped_at_cap(dialect: Dialect, value: &serde_json::Value) -> bool {
    match dialect {
        Dialect::ChatCompletions => value["choices"][0]["finish_reason"] == "length",
        Dialect::AnthropicMessages => value["stop_reason"] == "max_tokens",
        Dialect::Responses => {
            value["status"] == "incomplete" && value["incomplete_details"]["reason"] == "max_output_tokens"
        }
        Dialect::Gemini => value["candidates"][0]["finishReason"] == "MAX_TOKENS",
    }
}

/// A summary cut at its output cap, up to the end of its last complete line or sentence, when that
/// keeps at least half of it: the rebuilt conversation hands it to the model, and the next summary
/// reads it, and neither should continue a half sentence.
fn complete_part(text: &str) -> &str {
    if text.ends_with(['.', '!', '?']) {
        return text;
    }
    let mut end = text.rfind('\n').unwrap_or(0);
    for stop in [". ", "! ", "? ", ".\n", "!\n", "?\n"] {
        if let Some(at) = text.rfind(stop) {
            end = end.max(at + 1);
        }
    }
    if end > 0 && end >= text.len() / 2 { text[..end].trim_end() } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn count(text: &str) -> u32 {
        (text.len() / 4) as u32
    }

    #[test]
    fn a_summary_cut_at_its_output_cap_ends_at_its_last_complete_sentence_in_every_dialect() {
        let text = "The parser is done.\nThe codename is ZEPHYR-LANTERN-42. Next the lexer, whose tests";
        let kept = "The parser is done.\nThe codename is ZEPHYR-LANTERN-42.";
        let answers = [
            (
                Dialect::ChatCompletions,
                json!({"choices": [{"message": {"content": text}, "finish_reason": "length"}]}),
                json!({"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}),
            ),
            (
                Dialect::AnthropicMessages,
                json!({"content": [{"type": "text", "text": text}], "stop_reason": "max_tokens"}),
                json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}),
            ),
            (
                Dialect::Responses,
                json!({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]}),
                json!({"status": "completed", "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]}),
            ),
            (
                Dialect::Gemini,
                json!({"candidates": [{"content": {"parts": [{"text": text}]}, "finishReason": "MAX_TOKENS"}]}),
                json!({"candidates": [{"content": {"parts": [{"text": text}]}, "finishReason": "STOP"}]}),
            ),
        ];
        for (dialect, cut, finished) in answers {
            let read = |answer: &serde_json::Value| extract(dialect, &serde_json::to_vec(answer).unwrap());
            assert_eq!(read(&cut).as_deref(), Some(kept), "{dialect:?}");
            // An answer the model finished is kept whole, whatever its last words.
            assert_eq!(read(&finished).as_deref(), Some(text), "{dialect:?}");
        }
        // Nothing complete in its second half: kept as it came rather than lose most of it.
        assert_eq!(
            complete_part("Done. Then a long list of files that the agent read and changed"),
            "Done. Then a long list of files that the agent read and changed"
        );
        assert_eq!(complete_part("All tests pass."), "All tests pass.");
        assert_eq!(complete_part("x"), "x", "never emptied");
    }

    #[test]
    fn a_long_output_keeps_head_tail_and_the_facts_from_its_middle_within_the_budget() {
        let mut lines: Vec<String> = (0..3_000).map(|i| format!("row {i} of the listing")).collect();
        lines[1_400] = "DEPLOY_KEY = ZEPHYR-LANTERN-42".to_string();
        lines[1_700] = "  error: disk full on /var/lib/build".to_string();
        let text = lines.join("\n");
        let cut = cut_keeping_facts(&text, 400, &count);
        assert!(count(&cut) <= 400, "{} tokens", count(&cut));
        assert!(cut.starts_with("Total output lines: 3000") && cut.contains("row 0 of") && cut.contains("row 2999 of"));
        assert!(cut.contains("DEPLOY_KEY = ZEPHYR-LANTERN-42\nerror: disk full on /var/lib/build\n"), "{cut}");
        assert!(!cut.contains("row 1500 of"), "the middle is cut");
    }

    #[test]
    fn an_output_without_facts_is_cut_to_head_and_tail_and_a_short_one_is_kept() {
        let text: String = (0..3_000).map(|i| format!("row {i} of the listing\n")).collect();
        assert_eq!(cut_keeping_facts(&text, 400, &count), head_and_tail(&text, 400, &count));
        assert_eq!(cut_keeping_facts("short: output", 400, &count), "short: output");
        assert!(!looks_like_fact("row 12 of the listing") && looks_like_fact("status: green"));
    }

    #[test]
    fn an_output_larger_than_a_piece_is_read_in_consecutive_parts_at_line_ends_and_nothing_is_lost() {
        let lines: Vec<String> = (0..400).map(|i| format!("line {i} of the build log, all green")).collect();
        let text = lines.join("\n");
        let mut entries: VecDeque<String> = [text.clone()].into();
        let mut parts = Vec::new();
        while !entries.is_empty() {
            let piece = next_piece(&mut entries, 500, &count);
            assert!(count(&piece) <= 500, "{} tokens", count(&piece));
            parts.push(piece);
        }
        assert!(parts.len() >= 4, "{} parts", parts.len());
        assert_eq!(parts.concat(), text, "the parts are the text, in order");
        assert!(parts[..parts.len() - 1].iter().all(|p| p.ends_with('\n')), "every cut at a line end");
    }

    #[test]
    fn a_single_long_line_is_cut_between_words_so_a_value_stays_whole() {
        let words: Vec<String> = (0..2_000).map(|i| format!("ZEPHYR-LANTERN-{i}")).collect();
        let text = words.join(" ");
        let parts = split_text(&text, 300, count(&text));
        assert!(parts.len() > 5);
        assert_eq!(parts.concat(), text);
        for part in &parts {
            assert!(part.split(' ').filter(|w| !w.is_empty()).all(|w| words.contains(&w.to_string())), "{part}");
        }
        // No line end and no space: cut at character boundaries, still nothing lost.
        let wide = "\u{00e9}".repeat(3_000);
        let parts = split_text(&wide, 100, count(&wide));
        assert_eq!(parts.concat(), wide);
    }
}
