//! A fake upstream with a small context window: it counts tokens its own way (bytes / 3, not
//! compactor's tokenizer), rejects what does not fit with each provider's real error, rejects
//! broken tool pairs, and answers summary requests deterministically by echoing the marker words
//! (`WORD-WORD-42`) it finds in what it was asked to summarize.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::fake::{FakeUpstream, Reply};

/// How the fake misbehaves.
#[derive(Clone, Copy, Default)]
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
            std::thread::sleep(Duration::from_millis(150));
            if spec.summary_fails {
                return Some(Reply::json(500, json!({"error": {"message": "summarizer exploded", "type": "server_error"}})));
            }
            let summary = format!("Handoff summary {}. Markers: {}", seen.count(), markers(&text).join(" "));
            if responses {
                return Some(Reply::json(200, json!({"id": "resp_s", "object": "response", "status": "completed", "output": [{"type": "message", "id": "msg_s", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": summary, "annotations": []}]}], "usage": {"input_tokens": 10, "output_tokens": 10}})));
            }
            return Some(if anthropic {
                Reply::json(200, json!({"id": "msg_s", "type": "message", "role": "assistant", "content": [{"type": "text", "text": summary}], "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 10}}))
            } else {
                Reply::json(200, json!({"id": "chatcmpl-s", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": summary}, "finish_reason": "stop"}]}))
            });
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
