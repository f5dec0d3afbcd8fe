//! The token usage an upstream reports: the tap on a response reads it from a plain JSON body or
//! from SSE events as they pass, without holding back a single byte; a summary call's answer is
//! read by the same reader ([`of_body`]).

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::sse;

/// Token usage the upstream reported for the last request of a conversation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    /// Prompt tokens the provider read from its cache.
    pub cached_tokens: u64,
    /// Prompt tokens the provider wrote to its cache (Anthropic's `cache_creation_input_tokens`).
    #[serde(default)]
    pub cache_write_tokens: u64,
    pub output_tokens: u64,
    /// How many messages (items) that request had, for the hybrid estimate.
    pub message_count: u64,
    /// The compaction generation applied to the body it measured (0: none): a request that
    /// applies another record cannot add to this usage.
    #[serde(default)]
    pub generation: u32,
}

/// Largest body or SSE event the tap looks at; beyond it the usage is simply not read.
const MAX_BUFFER: usize = 4 << 20;

/// How the response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Json,
    EventStream,
    /// Bedrock's binary event-stream frames, each event wrapping one of Anthropic's as JSON.
    AwsEventStream,
}

/// Accumulates what it needs from each data frame; the frame itself is forwarded untouched.
#[derive(Debug)]
pub struct UsageTap {
    reading: Reading,
    usage: Option<Usage>,
}

/// How the tap reads the body it observes.
#[derive(Debug)]
enum Reading {
    /// A plain JSON body, collected up to the bound (`None` once it went over).
    Json(Option<Vec<u8>>),
    EventStream(sse::Reader),
    AwsEventStream(crate::event_stream::Reader),
}

impl UsageTap {
    pub fn new(framing: Framing) -> Self {
        let reading = match framing {
            Framing::Json => Reading::Json(Some(Vec::new())),
            Framing::EventStream => Reading::EventStream(sse::Reader::new(MAX_BUFFER)),
            Framing::AwsEventStream => Reading::AwsEventStream(crate::event_stream::Reader::new(MAX_BUFFER)),
        };
        Self { reading, usage: None }
    }

    pub fn observe(&mut self, chunk: &Bytes) {
        match &mut self.reading {
            Reading::Json(buffer) => {
                if buffer.as_ref().is_some_and(|b| b.len() + chunk.len() > MAX_BUFFER) {
                    *buffer = None;
                } else if let Some(buffer) = buffer {
                    buffer.extend_from_slice(chunk);
                }
            }
            Reading::EventStream(reader) => reader.push(chunk, |event| read_event(&mut self.usage, event)),
            Reading::AwsEventStream(reader) => reader.push(chunk, |json| read_data(&mut self.usage, json)),
        }
    }

    /// The usage seen, once the body has ended.
    pub fn finish(mut self) -> Option<Usage> {
        match &mut self.reading {
            Reading::Json(Some(buffer)) => {
                if let Ok(text) = std::str::from_utf8(buffer) {
                    merge(&mut self.usage, text);
                }
            }
            Reading::Json(None) => {}
            Reading::EventStream(reader) => reader.finish(|event| read_event(&mut self.usage, event)),
            // A frame is whole or not read at all: nothing is pending at the end.
            Reading::AwsEventStream(_) => {}
        }
        self.usage
    }
}

/// The usage a whole JSON answer reports (a summary call's), read as the tap reads a plain body.
pub fn of_body(body: &[u8]) -> Option<Usage> {
    let mut usage = None;
    if let Ok(text) = std::str::from_utf8(body) {
        merge(&mut usage, text);
    }
    usage
}

/// Only events that mention usage are worth parsing.
fn read_event(usage: &mut Option<Usage>, event: &sse::Event) {
    read_data(usage, &event.data);
}

/// One event's JSON.
fn read_data(usage: &mut Option<Usage>, data: &str) {
    if !data.contains("\"usage\"") && !data.contains("\"usageMetadata\"") {
        return;
    }
    merge(usage, data);
}

/// The fields of a body or event where a usage object may be; everything else (the answer's
/// text, tool calls) is skipped without being built.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
    /// Gemini's.
    #[serde(borrow, default, rename = "usageMetadata")]
    usage_metadata: Option<&'a RawValue>,
}

/// `message` or `response`: only its `usage` is read (a value that is not an object has none).
#[derive(Deserialize)]
struct Nested<'a> {
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
}

/// The usage object the envelope carries, in the order the providers put it.
fn reported_usage(text: &str) -> Option<Reported> {
    // Only objects: serde would also read a struct from an array, by position.
    let is_object = |text: &str| text.trim_start().starts_with('{');
    if !is_object(text) {
        return None;
    }
    let envelope: Envelope = serde_json::from_str(text).ok()?;
    let object = |raw: Option<&RawValue>| {
        raw.filter(|r| is_object(r.get())).and_then(|r| serde_json::from_str::<Reported>(r.get()).ok())
    };
    let nested = |raw: Option<&RawValue>| {
        let nested: Nested = serde_json::from_str(raw.filter(|r| is_object(r.get()))?.get()).ok()?;
        object(nested.usage)
    };
    object(envelope.usage)
        .or_else(|| nested(envelope.message))
        .or_else(|| nested(envelope.response))
        .or_else(|| object(envelope.usage_metadata))
}

/// The counts of a usage object that compactor reads, each present only when it is a whole number
/// (as `serde_json::Value::as_u64` would read it); read field by field, without building a map
/// of the object, and a key given twice counts as its last value, as in a map. A details object
/// (`prompt_tokens_details`, `input_tokens_details`) is read the same way, for its `cached_tokens`.
#[derive(Debug, Default)]
struct Reported {
    prompt_tokens: Option<u64>,
    input_tokens: Option<u64>,
    /// The details' `cached_tokens`; the outer `Some` when the key is there, whatever its value:
    /// it marks the Responses API.
    input_tokens_details: Option<Option<u64>>,
    prompt_tokens_details: Option<Option<u64>>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// Read in a details object only.
    cached_tokens: Option<u64>,
    /// Gemini's `usageMetadata`: the prompt (cached part included), its cached part, the answer
    /// and the thoughts.
    prompt_token_count: Option<u64>,
    cached_content_token_count: Option<u64>,
    candidates_token_count: Option<u64>,
    thoughts_token_count: Option<u64>,
}

/// The keys [`Reported`] reads; any other is skipped.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Key {
    PromptTokens,
    InputTokens,
    InputTokensDetails,
    PromptTokensDetails,
    CacheReadInputTokens,
    CacheCreationInputTokens,
    CompletionTokens,
    OutputTokens,
    CachedTokens,
    #[serde(rename = "promptTokenCount")]
    PromptTokenCount,
    #[serde(rename = "cachedContentTokenCount")]
    CachedContentTokenCount,
    #[serde(rename = "candidatesTokenCount")]
    CandidatesTokenCount,
    #[serde(rename = "thoughtsTokenCount")]
    ThoughtsTokenCount,
    #[serde(other)]
    Other,
}

/// The most tokens one reported count is taken for: far past any model's window, and small
/// enough that the session's counters (sums over every request, HINCRBY's signed 64 bits in
/// Redis) never overflow however large the numbers an upstream sends.
pub const MAX_REPORTED_TOKENS: u64 = 1 << 40;

/// A value's whole number (at most [`MAX_REPORTED_TOKENS`]), or none for any other value.
fn whole(raw: &RawValue) -> Option<u64> {
    serde_json::from_str::<u64>(raw.get()).ok().map(|tokens| tokens.min(MAX_REPORTED_TOKENS))
}

/// A details value: an object's `cached_tokens`, or nothing in any other value.
fn details(raw: &RawValue) -> Option<u64> {
    let text = raw.get();
    if text.trim_start().starts_with('{') {
        serde_json::from_str::<Reported>(text).ok().and_then(|details| details.cached_tokens)
    } else {
        None
    }
}

impl<'de> Deserialize<'de> for Reported {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Reported;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a usage object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Reported, A::Error> {
                let mut reported = Reported::default();
                while let Some(key) = map.next_key::<Key>()? {
                    if matches!(key, Key::Other) {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        continue;
                    }
                    let raw: &RawValue = map.next_value()?;
                    match key {
                        Key::PromptTokens => reported.prompt_tokens = whole(raw),
                        Key::InputTokens => reported.input_tokens = whole(raw),
                        Key::InputTokensDetails => reported.input_tokens_details = Some(details(raw)),
                        Key::PromptTokensDetails => reported.prompt_tokens_details = Some(details(raw)),
                        Key::CacheReadInputTokens => reported.cache_read_input_tokens = whole(raw),
                        Key::CacheCreationInputTokens => reported.cache_creation_input_tokens = whole(raw),
                        Key::CompletionTokens => reported.completion_tokens = whole(raw),
                        Key::OutputTokens => reported.output_tokens = whole(raw),
                        Key::CachedTokens => reported.cached_tokens = whole(raw),
                        Key::PromptTokenCount => reported.prompt_token_count = whole(raw),
                        Key::CachedContentTokenCount => reported.cached_content_token_count = whole(raw),
                        Key::CandidatesTokenCount => reported.candidates_token_count = whole(raw),
                        Key::ThoughtsTokenCount => reported.thoughts_token_count = whole(raw),
                        Key::Other => {}
                    }
                }
                Ok(reported)
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// Folds one event's usage in: OpenAI chat (`usage` at the top), Anthropic (`message.usage` in
/// `message_start`, `usage` in `message_delta`), Responses (`response.usage`).
fn merge(usage: &mut Option<Usage>, event: &str) {
    let Some(reported) = reported_usage(event) else { return };
    let current = usage.get_or_insert_with(Usage::default);
    if let Some(prompt) = reported.prompt_token_count {
        // Gemini: every streamed chunk repeats the counts so far; the last one stands.
        current.prompt_tokens = prompt;
        current.cached_tokens = reported.cached_content_token_count.unwrap_or(0);
        current.output_tokens =
            reported.candidates_token_count.unwrap_or(0) + reported.thoughts_token_count.unwrap_or(0);
        return;
    }
    let anthropic_cache =
        reported.cache_read_input_tokens.unwrap_or(0).saturating_add(reported.cache_creation_input_tokens.unwrap_or(0));
    if let Some(prompt) = reported.prompt_tokens {
        current.prompt_tokens = prompt;
    } else if let Some(input) = reported.input_tokens {
        // Anthropic's input_tokens excludes cache reads and writes; the prompt is their sum.
        let is_responses = reported.input_tokens_details.is_some();
        current.prompt_tokens = if is_responses { input } else { input.saturating_add(anthropic_cache) };
    }
    if let Some(cached) = reported
        .prompt_tokens_details
        .flatten()
        .or(reported.input_tokens_details.flatten())
        .or(reported.cache_read_input_tokens)
    {
        current.cached_tokens = cached;
    }
    if let Some(written) = reported.cache_creation_input_tokens {
        current.cache_write_tokens = written;
    }
    if let Some(output) = reported.completion_tokens.or(reported.output_tokens) {
        current.output_tokens = output;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(framing: Framing, chunks: &[&str]) -> Option<Usage> {
        let mut tap = UsageTap::new(framing);
        for chunk in chunks {
            tap.observe(&Bytes::copy_from_slice(chunk.as_bytes()));
        }
        tap.finish()
    }

    #[test]
    fn numbers_past_any_window_are_taken_at_the_cap_and_their_sums_never_wrap() {
        let max = u64::MAX;
        let usage = feed(
            Framing::Json,
            &[&format!(
                r#"{{"type":"message","usage":{{"input_tokens":{max},"cache_creation_input_tokens":{max},"cache_read_input_tokens":{max},"output_tokens":{max}}}}}"#
            )],
        )
        .unwrap();
        assert_eq!(usage.prompt_tokens, 3 * MAX_REPORTED_TOKENS);
        assert_eq!((usage.cached_tokens, usage.cache_write_tokens), (MAX_REPORTED_TOKENS, MAX_REPORTED_TOKENS));
        assert_eq!(usage.output_tokens, MAX_REPORTED_TOKENS);
        // Past u64 the number is not a count at all.
        let beyond =
            feed(Framing::Json, &[r#"{"usage":{"prompt_tokens":18446744073709551616,"completion_tokens":1}}"#]);
        assert_eq!(beyond.map(|u| u.prompt_tokens), Some(0));
    }

    #[test]
    fn reads_openai_usage_from_a_plain_body_split_anywhere() {
        let usage = feed(
            Framing::Json,
            &[
                r#"{"id":"x","usage":{"prompt_tokens":120,"completion_tokens":7,"#,
                r#""prompt_tokens_details":{"cached_tokens":64}}}"#,
            ],
        )
        .unwrap();
        assert_eq!((usage.prompt_tokens, usage.cached_tokens, usage.output_tokens), (120, 64, 7));
    }

    #[test]
    fn reads_anthropic_usage_from_message_start_and_message_delta_across_chunk_boundaries() {
        let usage = feed(
            Framing::EventStream,
            &[
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":90,",
                "\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n",
            ],
        )
        .unwrap();
        assert_eq!((usage.prompt_tokens, usage.cached_tokens, usage.output_tokens), (100, 90, 42));
    }

    #[test]
    fn reads_anthropic_usage_from_bedrock_s_event_stream_frames_split_anywhere() {
        use crate::event_stream::tests::frame;
        let mut stream = frame(
            r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":2000,"cache_creation_input_tokens":300,"output_tokens":1}}}"#,
        );
        stream.extend(frame(r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#));
        stream.extend(frame(
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":42}}"#,
        ));
        stream.extend(frame(
            r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":2310,"outputTokenCount":42}}"#,
        ));
        for size in [1, 13, stream.len()] {
            let mut tap = UsageTap::new(Framing::AwsEventStream);
            for chunk in stream.chunks(size) {
                tap.observe(&Bytes::copy_from_slice(chunk));
            }
            let usage = tap.finish().unwrap();
            assert_eq!(
                (usage.prompt_tokens, usage.cached_tokens, usage.cache_write_tokens, usage.output_tokens),
                (2310, 2000, 300, 42),
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn reads_anthropic_cache_writes_from_a_plain_body_and_from_a_stream() {
        let plain = feed(
            Framing::Json,
            &[r#"{"type":"message","usage":{"input_tokens":5,"cache_creation_input_tokens":1200,"cache_read_input_tokens":3000,"output_tokens":8}}"#],
        )
        .unwrap();
        assert_eq!((plain.prompt_tokens, plain.cached_tokens, plain.cache_write_tokens), (4205, 3000, 1200));
        let streamed = feed(
            Framing::EventStream,
            &[
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,",
                "\"cache_creation_input_tokens\":500,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n",
            ],
        )
        .unwrap();
        assert_eq!((streamed.prompt_tokens, streamed.cached_tokens, streamed.cache_write_tokens), (507, 0, 500));
    }

    #[test]
    fn reads_the_final_openai_usage_chunk_and_responses_completed() {
        let chat = feed(
            Framing::EventStream,
            &["data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n"],
        );
        assert_eq!(chat.unwrap().prompt_tokens, 5);
        let responses = feed(
            Framing::EventStream,
            &["event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":300,\"input_tokens_details\":{\"cached_tokens\":200},\"output_tokens\":9}}}\n\n"],
        )
        .unwrap();
        assert_eq!((responses.prompt_tokens, responses.cached_tokens, responses.output_tokens), (300, 200, 9));
    }

    #[test]
    fn reads_usage_from_crlf_events_with_multi_line_data() {
        let usage = feed(
            Framing::EventStream,
            &[
                "event: message_delta\r\ndata: {\"type\":\"message_delta\",\r\n",
                "data: \"usage\":{\"output_tokens\":42}}\r\n\r\n",
            ],
        )
        .unwrap();
        assert_eq!(usage.output_tokens, 42);
    }

    #[test]
    fn a_usage_that_is_not_an_object_or_sits_beside_other_shapes_is_looked_for_further_on() {
        // `usage` null, `message` a text (no usage in it): the usage is the response's.
        let usage = feed(
            Framing::Json,
            &[r#"{"usage":null,"message":"done","choices":[{"message":{"content":"x\"y"}}],"response":{"usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":4},"output_tokens":2}}}"#],
        )
        .unwrap();
        assert_eq!((usage.prompt_tokens, usage.cached_tokens, usage.output_tokens), (11, 4, 2));
        assert_eq!(feed(Framing::Json, &[r#"[{"usage":{"prompt_tokens":1}}]"#]), None);
        assert_eq!(feed(Framing::Json, &[r#"{"message":[{"usage":{"prompt_tokens":1}}]}"#]), None);
        assert_eq!(feed(Framing::Json, &[r#"{"usage":{"prompt_tokens":1}"#]), None);
    }

    #[test]
    fn usage_counts_are_read_as_a_json_map_would_give_them() {
        // A key given twice counts as its last value; a count that is not a whole number is not
        // one; escaped keys are the keys they spell; a `null` details still marks the Responses API.
        let usage = feed(
            Framing::Json,
            &[r#"{"usage":{"prompt_tokens":1,"prompt_tokens":7,"completion_tokens":2.5,"output_tokens":"3","prompt_tokens_details":{"cached_tokens":1,"cached_tokens":4},"cached_tokens":99}}"#],
        )
        .unwrap();
        assert_eq!((usage.prompt_tokens, usage.cached_tokens, usage.output_tokens), (7, 4, 0));
        let escaped =
            feed(Framing::Json, &[r#"{"usage":{"input\u005ftokens":5,"cache_read_input_tokens":3}}"#]).unwrap();
        assert_eq!((escaped.prompt_tokens, escaped.cached_tokens), (8, 3));
        let responses = feed(
            Framing::Json,
            &[r#"{"usage":{"input_tokens":5,"cache_read_input_tokens":3,"input_tokens_details":null}}"#],
        )
        .unwrap();
        assert_eq!((responses.prompt_tokens, responses.cached_tokens), (5, 3));
        let later_wins =
            feed(Framing::Json, &[r#"{"usage":{"prompt_tokens":6,"prompt_tokens":-1,"output_tokens":1e2}}"#]);
        assert_eq!(later_wins.map(|u| (u.prompt_tokens, u.output_tokens)), Some((0, 0)));
    }

    #[test]
    fn only_a_body_that_is_one_json_object_reports_its_usage() {
        let prompt = |body: &str| feed(Framing::Json, &[body]).map(|usage| usage.prompt_tokens);
        assert_eq!(prompt(r#" {"usage":{"prompt_tokens":5}} "#), Some(5));
        assert_eq!(prompt(r#"{"usag\u0065":{"prompt_tokens":5}}"#), Some(5), "a key spelled with an escape");
        assert_eq!(prompt(r#"{"message":{"id":"m","usage":{"input_tokens":5}}}"#), Some(5));
        assert_eq!(prompt(r#"{"usage":{"prompt_tokens":5}} {}"#), None, "two values");
        assert_eq!(prompt(r#"[{"usage":{"prompt_tokens":5}}]"#), None, "an array");
        assert_eq!(prompt(r#"{"usage":{"prompt_tokens":5},"usage":{"prompt_tokens":6}}"#), None, "a key twice");
        assert_eq!(prompt(r#"{"usage":{"prompt_tokens":5},"text":"a\qb"}"#), None, "a bad escape");
    }

    #[test]
    fn reads_gemini_usage_metadata_from_a_body_and_from_the_last_event_with_counts() {
        let plain = feed(
            Framing::Json,
            &[r#"{"candidates":[{"content":{"parts":[{"text":"hi"}],"role":"model"}}],"usageMetadata":{"promptTokenCount":1200,"cachedContentTokenCount":1024,"candidatesTokenCount":7,"thoughtsTokenCount":30,"totalTokenCount":1237}}"#],
        )
        .unwrap();
        assert_eq!((plain.prompt_tokens, plain.cached_tokens, plain.output_tokens), (1200, 1024, 37));
        let streamed = feed(
            Framing::EventStream,
            &[
                "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\"}]}}],\"usageMetadata\":{\"promptTokenCount\":900,\"candidatesTokenCount\":1}}\r\n\r\n",
                "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"b\"}]},\"finishReason\":\"STOP\"}],",
                "\"usageMetadata\":{\"promptTokenCount\":900,\"cachedContentTokenCount\":512,\"candidatesTokenCount\":12,\"thoughtsTokenCount\":4}}\r\n\r\n",
            ],
        )
        .unwrap();
        assert_eq!((streamed.prompt_tokens, streamed.cached_tokens, streamed.output_tokens), (900, 512, 16));
    }

    #[test]
    fn a_stream_without_usage_reports_none() {
        assert_eq!(feed(Framing::EventStream, &["data: {\"choices\":[]}\n\n"]), None);
    }
}
