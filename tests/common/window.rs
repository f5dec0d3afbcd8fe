//! A fake upstream with a small context window: it counts tokens its own way (bytes / 3, not
//! compactor's tokenizer), rejects what does not fit with each provider's real error, rejects
//! broken tool pairs, and answers summary requests deterministically (after `summary_delay`) by
//! echoing the marker words (`WORD-WORD-42`) it finds in what it was asked to summarize. Also the
//! conversations that overflow it, in Chat Completions and Anthropic Messages.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::bodies::lines_until;
use super::fake::{FakeUpstream, Reply};

/// How the fake misbehaves.
#[derive(Clone, Copy)]
pub struct WindowSpec {
    /// The window in the fake's own tokens (request bytes / 3).
    pub window: usize,
    /// Chat streams get the overflow as an error event inside a 200 stream (OpenRouter style).
    pub in_stream_error: bool,
    /// Summary requests fail with 500.
    pub summary_fails: bool,
    /// Anthropic requests get "input length and `max_tokens` exceed context limit" when the prompt
    /// fits but prompt + max_tokens does not.
    pub count_max_tokens: bool,
    /// How long a summary request takes (other requests are answered meanwhile).
    pub summary_delay: Duration,
}

impl Default for WindowSpec {
    /// No window to speak of, summaries in 150 ms (long enough for parallel requests to meet).
    fn default() -> Self {
        Self {
            window: 0,
            in_stream_error: false,
            summary_fails: false,
            count_max_tokens: false,
            summary_delay: Duration::from_millis(150),
        }
    }
}

impl WindowSpec {
    /// A plain window of `window` of the fake's tokens.
    pub fn window(window: usize) -> Self {
        Self { window, ..Self::default() }
    }
}

/// What the fake saw of summary requests.
#[derive(Clone, Default)]
pub struct Summaries {
    pub calls: Arc<AtomicUsize>,
    pub inputs: Arc<Mutex<Vec<String>>>,
}

impl Summaries {
    pub fn count(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    pub fn input(&self, index: usize) -> String {
        self.inputs.lock().unwrap()[index].clone()
    }
}

/// What a summary call asks to be summarized: the text between its `<transcript>` tags (the
/// summary so far and the piece), without the prompt around it. A simulated summarizer reports
/// only the facts in there, as a real one could.
pub fn transcript_of(body: &str) -> &str {
    let start = body.find("<transcript>").map_or(0, |at| at + "<transcript>".len());
    let end = body[start..].find("</transcript>").map_or(body.len(), |at| start + at);
    &body[start..end]
}

pub fn markers(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"[A-Z]{3,}-[A-Z]{3,}-\d+").unwrap();
    let mut found: Vec<String> = re.find_iter(text).map(|m| m.as_str().to_string()).collect();
    found.sort();
    found.dedup();
    found
}

/// A fresh fake upstream that enforces `spec`, and what it saw of summary requests.
pub async fn window_upstream(spec: WindowSpec) -> (FakeUpstream, Summaries) {
    let fake = FakeUpstream::start().await;
    let summaries = enforce_window(&fake, spec);
    (fake, summaries)
}

/// Turns `fake` into a window-enforcing upstream.
pub fn enforce_window(fake: &FakeUpstream, spec: WindowSpec) -> Summaries {
    let summaries = Summaries::default();
    let seen = summaries.clone();
    fake.respond_with(move |received| {
        let body: Value = serde_json::from_slice(&received.body).ok()?;
        let path = received.path_and_query.split('?').next().unwrap_or("").to_string();
        let anthropic = path.ends_with("/v1/messages");
        let responses = path.ends_with("/v1/responses");
        let text = String::from_utf8_lossy(&received.body).into_owned();
        if body.get("tools").is_none() && text.contains("context-compaction assistant") {
            seen.calls.fetch_add(1, Ordering::SeqCst);
            seen.inputs.lock().unwrap().push(text.clone());
            let delay = spec.summary_delay;
            if spec.summary_fails {
                return Some(Reply::json(500, json!({"error": {"message": "summarizer exploded", "type": "server_error"}})).after(delay));
            }
            let summary = format!("Handoff summary {}. Markers: {}", seen.count(), markers(transcript_of(&text)).join(" "));
            if responses {
                return Some(Reply::json(200, json!({"id": "resp_s", "object": "response", "status": "completed", "output": [{"type": "message", "id": "msg_s", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": summary, "annotations": []}]}], "usage": {"input_tokens": 10, "output_tokens": 10}})).after(delay));
            }
            return Some(if anthropic {
                Reply::json(200, json!({"id": "msg_s", "type": "message", "role": "assistant", "content": [{"type": "text", "text": summary}], "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 10}}))
            } else {
                Reply::json(200, json!({"id": "chatcmpl-s", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": summary}, "finish_reason": "stop"}]}))
            }.after(delay));
        }
        if let Some(error) = super::strict::pairing_error(&path, &body) {
            return Some(Reply::json(400, error));
        }
        if responses && let Some(error) = super::strict::responses_pairing_error(&body) {
            return Some(Reply::json(400, error));
        }
        let tokens = body["messages"].to_string().len() / 3 + body["system"].to_string().len() / 3 + body["input"].to_string().len() / 3;
        let max_tokens = body["max_tokens"].as_u64().unwrap_or(0) as usize;
        if tokens > spec.window {
            if responses {
                let error = json!({"type": "invalid_request_error", "code": "context_length_exceeded", "message": "Your input exceeds the context window of this model. Please adjust your input and try again.", "param": "input"});
                if body["stream"] == true {
                    let failed = json!({"type": "response.failed", "sequence_number": 2, "response": {"id": "resp_f", "object": "response", "status": "failed", "error": {"code": "context_length_exceeded", "message": error["message"]}, "output": []}});
                    return Some(Reply::Stream {
                        events: vec![
                            format!("event: response.created\ndata: {}\n\n", json!({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_f", "status": "in_progress"}})),
                            format!("event: error\ndata: {}\n\n", json!({"type": "error", "sequence_number": 1, "error": error})),
                            format!("event: response.failed\ndata: {failed}\n\n"),
                        ],
                    });
                }
                return Some(Reply::json(400, json!({"error": error})));
            }
            if anthropic {
                return Some(Reply::json(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": format!("prompt is too long: {tokens} tokens > {} maximum", spec.window)}})));
            }
            let message = format!("prompt is too long: {tokens} tokens > {} maximum", spec.window);
            if spec.in_stream_error && body["stream"] == true {
                return Some(Reply::Stream {
                    events: vec![
                        ": OPENROUTER PROCESSING\n\n".into(),
                        format!("data: {}\n\n", json!({"id": "gen-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}], "error": {"code": 400, "message": message}})),
                        "data: [DONE]\n\n".into(),
                    ],
                });
            }
            return Some(Reply::json(400, json!({"error": {"message": format!("This model's maximum context length is {} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages.", spec.window), "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})));
        }
        if spec.count_max_tokens && anthropic && tokens + max_tokens > spec.window {
            return Some(Reply::json(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": format!("input length and `max_tokens` exceed context limit: {tokens} + {max_tokens} > {}, decrease input length or `max_tokens` and try again", spec.window)}})));
        }
        None
    });
    summaries
}

/// The two dialects the small-window conversations come in.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Api {
    Chat,
    Anthropic,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Anthropic => "/v1/messages",
        }
    }
}

fn filler(tag: &str, chars: usize) -> String {
    lines_until(chars, |i| format!("{tag} step {i} checked the module and found nothing unusual. "))
}

/// The task the small-window conversations open with.
pub const TASK: &str = "Build the parser. The codename is ZEPHYR-LANTERN-42.";

/// A conversation of `turns` tool turns with markers planted early, ending in a user message.
pub fn conversation(api: Api, turns: usize, stream: bool) -> Value {
    conversation_opening(api, TASK, turns, stream)
}

/// [`conversation`] opening with `task` instead: another conversation of the same shape.
pub fn conversation_opening(api: Api, task: &str, turns: usize, stream: bool) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    if api == Api::Chat {
        messages.push(json!({"role": "system", "content": "You are a coding agent."}));
    }
    messages.push(json!({"role": "user", "content": task}));
    for t in 0..turns {
        let id = format!("call_{t}");
        let output =
            if t == 0 { format!("QUASAR-MAPLE-7 {}", filler("out0", 1500)) } else { filler(&format!("out{t}"), 1500) };
        let thought = filler(&format!("plan{t}"), 600);
        match api {
            Api::Chat => {
                messages.push(json!({"role": "assistant", "content": thought, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": "{\"cmd\":\"make\"}"}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            Api::Anthropic => {
                messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": thought}, {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "make"}}]}));
                messages.push(
                    json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": output}]}),
                );
            }
        }
        if t % 4 == 3 {
            // A user remark between turns (Anthropic: its own turn after the assistant answers).
            messages.push(json!({"role": "assistant", "content": format!("Turn {t} done.")}));
            messages.push(json!({"role": "user", "content": format!("Good. Keep going, and mind COBALT-HERON-{t}.")}));
        }
    }
    messages.push(json!({"role": "assistant", "content": "Shall I continue?"}));
    messages.push(json!({"role": "user", "content": "Yes, continue."}));
    let mut body = json!({"model": "test-model", "messages": messages, "stream": stream,
        "tools": [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]});
    if api == Api::Anthropic {
        body["max_tokens"] = json!(1000);
        body["system"] = json!([{"type": "text", "text": "You are a coding agent."}]);
        body["tools"] = json!([{"name": "Bash", "input_schema": {"type": "object"}}]);
    }
    body
}
