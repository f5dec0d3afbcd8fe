//! The summary call: what the summarizer reads (a plain-text transcript of the covered part, the
//! previous summary first), the tool-less request in the client's dialect, and its answer.

use crate::compaction::CompactionSettings;
use crate::conversation::{Kind, Role};
use crate::dialect::{Dialect, ParsedRequest};
use crate::json::json_string;
use crate::rewrite::truncate::head_and_tail;

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
    settings: &CompactionSettings,
    budget: u32,
    count: &dyn Fn(&str) -> u32,
) -> String {
    let per_output = settings.transcript_output_tokens.max(64);
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

/// The tool-less, non-streaming summary request in the client's dialect.
pub fn request_body(
    dialect: Dialect,
    model: &str,
    settings: &CompactionSettings,
    transcript: &str,
    max_tokens: u32,
) -> Vec<u8> {
    let user = format!("<transcript>\n{transcript}</transcript>\n\n{}", settings.instruction);
    let body = match dialect {
        Dialect::ChatCompletions => format!(
            r#"{{"model":{},"messages":[{{"role":"system","content":{}}},{{"role":"user","content":{}}}],"stream":false}}"#,
            json_string(model),
            json_string(&settings.system_prompt),
            json_string(&user)
        ),
        Dialect::AnthropicMessages => format!(
            r#"{{"model":{},"max_tokens":{max_tokens},"system":{},"messages":[{{"role":"user","content":{}}}],"stream":false}}"#,
            json_string(model),
            json_string(&settings.system_prompt),
            json_string(&user)
        ),
        Dialect::Responses => format!(
            r#"{{"model":{},"instructions":{},"input":[{{"type":"message","role":"user","content":[{{"type":"input_text","text":{}}}]}}],"max_output_tokens":{max_tokens},"store":false,"stream":false}}"#,
            json_string(model),
            json_string(&settings.system_prompt),
            json_string(&user)
        ),
    };
    body.into_bytes()
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
