//! The summary call: what the summarizer reads (a plain-text transcript of the covered part, the
//! previous summary first), the tool-less, non-streaming request in the client's dialect sent
//! upstream with the client's own credentials, and the summary read from its answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::settings::CompactionSettings;
use crate::conversation::{Kind, Role};
use crate::dialect::{Dialect, ParsedRequest};
use crate::error::ProxyError;
use crate::json::json_string;
use crate::overflow::OverflowDetector;
use crate::rewrite::truncate::head_and_tail;
use crate::telemetry::{metric, trace};
use crate::upstream::{RequestHead, Upstreams};
use tracing::Instrument;

/// Largest summary answer compactor reads.
const MAX_ANSWER_BYTES: usize = 8 << 20;

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
        }
    }

    /// Tokens of the summary request besides the transcript.
    pub fn prompt_tokens(&self, count: &dyn Fn(&str) -> u32) -> u32 {
        count(&self.system_prompt) + count(&self.instruction) + 64
    }

    /// The summary of `input`. When the summarizer's window turns out smaller than estimated, the
    /// transcript is halved and sent once more.
    pub async fn summarize(&self, head: &RequestHead, input: SummaryInput<'_>) -> Result<String, SummaryError> {
        let count = input.count;
        let mut budget = input.budget;
        let started = Instant::now();
        let span = trace::summary_span(head.route.family, input.model);
        let mut answer = None;
        for _ in 0..2 {
            let transcript = fitted_transcript(
                input.parsed,
                input.from,
                input.cut,
                input.previous,
                self.transcript_output_tokens,
                budget,
                count,
            );
            let input_tokens = count(&transcript);
            metric::summary_tokens("input", u64::from(input_tokens));
            span.record("gen_ai.usage.input_tokens", input_tokens);
            let body = self.request_body(input.parsed.dialect, input.model, &transcript, input.max_tokens);
            match self.call(head, body).instrument(span.clone()).await {
                Ok(body) => {
                    answer = Some(body);
                    break;
                }
                Err(SummaryError::Overflow) => budget /= 2,
                Err(error) => {
                    span.record("error.type", error.to_string()).record("otel.status_code", "ERROR");
                    return Err(error);
                }
            }
        }
        metric::summary_latency(started.elapsed());
        let summary = answer.and_then(|a| extract(input.parsed.dialect, &a));
        let Some(summary) = summary else {
            span.record("error.type", SummaryError::Unreadable.to_string()).record("otel.status_code", "ERROR");
            return Err(SummaryError::Unreadable);
        };
        let output_tokens = count(&summary);
        metric::summary_tokens("output", u64::from(output_tokens));
        span.record("gen_ai.usage.output_tokens", output_tokens);
        Ok(summary)
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
                r#"{{"model":{},"messages":[{{"role":"system","content":{}}},{{"role":"user","content":{}}}],"stream":false}}"#,
                json_string(model),
                json_string(&self.system_prompt),
                json_string(&user)
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
        };
        body.into_bytes()
    }
}

/// The transcript of messages `from..cut`, each tool output cut to `per_output` tokens.
pub fn transcript(
    parsed: &ParsedRequest,
    from: usize,
    cut: usize,
    previous: Option<&str>,
    per_output: u32,
    count: &dyn Fn(&str) -> u32,
) -> String {
    let mut out = String::new();
    if let Some(summary) = previous {
        out.push_str("SUMMARY OF THE EARLIER CONVERSATION:\n");
        out.push_str(summary);
        out.push_str("\n\n");
    }
    let cut_to = |text: &str, budget: u32| {
        if count(text) > budget { head_and_tail(text, budget.max(16), count) } else { text.to_string() }
    };
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
                format!("TOOL RESULT [{}]{note}: {}", call_id.as_deref().unwrap_or("-"), cut_to(text, per_output))
            }
            Kind::Attachment => "[attachment omitted]".to_string(),
            Kind::Thinking { .. } => continue,
            Kind::Other { .. } => "[unsupported content omitted]".to_string(),
        };
        out.push_str(&line);
        out.push_str("\n\n");
    }
    out
}

/// The transcript made to fit `budget` tokens: tool outputs cut harder first, then the oldest
/// messages dropped (the previous summary always stays).
pub fn fitted_transcript(
    parsed: &ParsedRequest,
    from: usize,
    cut: usize,
    previous: Option<&str>,
    output_tokens: u32,
    budget: u32,
    count: &dyn Fn(&str) -> u32,
) -> String {
    let per_output = output_tokens.max(64);
    for per in [per_output, per_output / 4, 64] {
        let text = transcript(parsed, from, cut, previous, per, count);
        if count(&text) <= budget {
            return text;
        }
    }
    let mut start = from;
    loop {
        let text = transcript(parsed, start, cut, previous, 64, count);
        if count(&text) <= budget || start + 1 >= cut {
            return text;
        }
        start += 1;
    }
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
    };
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}
