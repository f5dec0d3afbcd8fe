//! Bedrock's streamed answers: the sim's SSE events, as they come, re-framed into AWS event-stream
//! messages (`:event-type: chunk`, payload `{"bytes": base64 of the event's data}`), one body chunk
//! per message; and the decoding a test does of such a body.

use std::collections::VecDeque;
use std::time::Instant;

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder, write_message_to};
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::BoxError;

/// A message with the three string headers Bedrock puts on every frame.
fn message(event_type: &'static str, message_type: &'static str, payload: Vec<u8>) -> Message {
    let header = |name: &'static str, value: &'static str| Header::new(name, HeaderValue::String(value.into()));
    Message::new_from_parts(
        vec![
            header(if message_type == "exception" { ":exception-type" } else { ":event-type" }, event_type),
            header(":content-type", "application/json"),
            header(":message-type", message_type),
        ],
        payload,
    )
}

fn encode(message: &Message) -> Result<Bytes, BoxError> {
    let mut buffer = Vec::new();
    write_message_to(message, &mut buffer)?;
    Ok(buffer.into())
}

/// What Bedrock counts while it relays a stream, for the metrics it adds to `message_stop`.
struct Metrics {
    started: Instant,
    first_byte_ms: Option<u128>,
    input_tokens: u64,
    output_tokens: u64,
}

/// The translation in progress: the sim's body, what of it is not a whole event yet, and the
/// frames ready to send.
struct Relay {
    body: Incoming,
    pending: Vec<u8>,
    ready: VecDeque<Result<Bytes, BoxError>>,
    ended: bool,
    metrics: Metrics,
}

impl Relay {
    /// Moves each whole SSE event of `pending` (or, at the end, the rest) into `ready`.
    fn drain(&mut self, at_end: bool) {
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = self.pending.drain(..end + 2).collect();
            self.event(&block);
        }
        if at_end && !self.pending.is_empty() {
            let block = std::mem::take(&mut self.pending);
            self.event(&block);
        }
    }

    fn event(&mut self, block: &[u8]) {
        let text = String::from_utf8_lossy(block);
        let mut name = "";
        let mut data = Vec::new();
        for line in text.lines() {
            if let Some(value) = line.strip_prefix("event:") {
                name = value.trim();
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push(value.strip_prefix(' ').unwrap_or(value));
            }
        }
        if data.is_empty() {
            return;
        }
        let data = data.join("\n");
        self.metrics.first_byte_ms.get_or_insert_with(|| self.metrics.started.elapsed().as_millis());
        let frame = if name == "error" {
            // Bedrock ends a stream that fails midway with an exception message, not a chunk.
            let error: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            let text = error["error"]["message"].as_str().unwrap_or(&data).to_string();
            message("internalServerException", "exception", json!({"message": text}).to_string().into_bytes())
        } else {
            message(
                "chunk",
                "event",
                json!({"bytes": STANDARD.encode(self.with_metrics(&data))}).to_string().into_bytes(),
            )
        };
        self.ready.push_back(encode(&frame));
    }

    /// The event's data as Bedrock relays it: as it came, but for `message_stop`, which gains
    /// Bedrock's `amazon-bedrock-invocationMetrics`.
    fn with_metrics(&mut self, data: &str) -> Vec<u8> {
        let Ok(mut event) = serde_json::from_str::<Value>(data) else { return data.as_bytes().to_vec() };
        match event["type"].as_str() {
            Some("message_start") => {
                let usage = &event["message"]["usage"];
                self.metrics.input_tokens = ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"]
                    .iter()
                    .filter_map(|k| usage[k].as_u64())
                    .sum();
            }
            Some("message_delta") => {
                self.metrics.output_tokens = event["usage"]["output_tokens"].as_u64().unwrap_or(0);
            }
            Some("message_stop") => {
                let m = &self.metrics;
                event["amazon-bedrock-invocationMetrics"] = json!({
                    "inputTokenCount": m.input_tokens,
                    "outputTokenCount": m.output_tokens,
                    "invocationLatency": m.started.elapsed().as_millis() as u64,
                    "firstByteLatency": m.first_byte_ms.unwrap_or(0) as u64,
                });
                return event.to_string().into_bytes();
            }
            _ => {}
        }
        data.as_bytes().to_vec()
    }

    /// The next frame to send, reading the sim's body as far as needed.
    async fn next(mut self) -> Option<(Result<Frame<Bytes>, BoxError>, Self)> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Some((frame.map(Frame::data), self));
            }
            if self.ended {
                return None;
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending.extend_from_slice(&data);
                        self.drain(false);
                    }
                }
                Some(Err(error)) => {
                    self.ended = true;
                    return Some((Err(error.into()), self));
                }
                None => {
                    self.ended = true;
                    self.drain(true);
                }
            }
        }
    }
}

/// The sim's SSE body as an event-stream body, framed event by event as they arrive.
pub(super) fn relay(body: Incoming) -> BoxBody<Bytes, BoxError> {
    let relay = Relay {
        body,
        pending: Vec::new(),
        ready: VecDeque::new(),
        ended: false,
        metrics: Metrics { started: Instant::now(), first_byte_ms: None, input_tokens: 0, output_tokens: 0 },
    };
    StreamBody::new(futures_util::stream::unfold(relay, Relay::next)).boxed()
}

/// Every message of an event-stream body (panics on a broken frame or trailing bytes).
pub fn decode_event_stream(body: &[u8]) -> Vec<Message> {
    let mut buffer = body;
    let mut decoder = MessageFrameDecoder::new();
    let mut messages = Vec::new();
    while !buffer.is_empty() {
        match decoder.decode_frame(&mut buffer).expect("a valid event-stream frame") {
            DecodedFrame::Complete(message) => messages.push(message),
            DecodedFrame::Incomplete => panic!("{} bytes of an incomplete frame at the end", buffer.len()),
        }
    }
    messages
}

/// The Anthropic events carried by a Bedrock stream's `chunk` messages, in order.
pub fn chunk_events(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| {
            m.headers().iter().any(|h| {
                h.name().as_str() == ":event-type" && h.value().as_string().is_ok_and(|v| v.as_str() == "chunk")
            })
        })
        .map(|m| {
            let payload: Value = serde_json::from_slice(m.payload()).expect("a JSON chunk payload");
            let bytes = STANDARD.decode(payload["bytes"].as_str().expect("bytes in the chunk")).expect("base64 bytes");
            serde_json::from_slice(&bytes).expect("an Anthropic event in the chunk")
        })
        .collect()
}
