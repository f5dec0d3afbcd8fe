//! Recognizes "context length exceeded" in every provider's words: structured codes first, then
//! message patterns, never a rate limit or an output-cap error that merely looks alike. Reads the
//! window and prompt size the error names, so compactor can learn the real limit and pick the
//! cheapest fix.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};
use serde_json::Value;

use crate::sse;

/// What an overflow error said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Overflow {
    /// The window the provider named.
    pub limit: Option<u64>,
    /// The prompt tokens the provider counted.
    pub prompt_tokens: Option<u64>,
    /// The output tokens requested, when the error counts them against the window.
    pub max_tokens: Option<u64>,
}

impl Overflow {
    /// True when the prompt alone fits: lowering max_tokens is enough.
    pub fn prompt_fits(&self) -> bool {
        matches!((self.prompt_tokens, self.limit, self.max_tokens), (Some(p), Some(l), Some(_)) if p < l)
    }
}

/// Codes that mean overflow whatever the message says.
const OVERFLOW_CODES: [&str; 4] =
    ["context_length_exceeded", "exceed_context_size_error", "input_too_large", "model_max_prompt_tokens_exceeded"];
/// Codes and phrases of rate limits and quotas: never an overflow.
const RATE_LIMIT_CODES: [&str; 5] =
    ["rate_limit_exceeded", "rate_limit_error", "resource_exhausted", "throttlingexception", "insufficient_quota"];
const RATE_LIMIT_PHRASES: [&str; 7] = [
    "tokens per min",
    "tokens per day",
    "(tpm)",
    "rate limit",
    "please wait before trying again",
    "exceeded your current quota",
    "too many requests",
];

/// The phrases that say "the prompt does not fit the window", in every provider's words.
const OVERFLOW_PATTERNS: [&str; 32] = [
    r"maximum context length",
    r"context length exceeded",
    r"context_length_exceeded",
    r"prompt is too long",
    r"prompt too long",
    r"exceed(s|ed)? (the )?(model'?s? )?context (limit|window|length|size)",
    r"exceeds the (available|maximum) context",
    r"input is too long",
    r"input token count .*exceeds the maximum",
    r"input token count is \d+ but model only supports",
    r"is longer than the model'?s context length",
    r"model'?s context length is only",
    r"context length of only \d+",
    r"too large for model with \d+ maximum context length",
    r"maximum prompt length is",
    r"input tokens exceed the configured limit",
    r"`inputs` tokens \+ `max_new_tokens` must be",
    r"`inputs` must have less than \d+ tokens",
    r"too many tokens: total number of tokens",
    r"cannot truncate prompt with n_keep",
    r"input length exceeds the context length",
    r"your input exceeds the context window",
    r"exceeds budget",
    r"reduce the length of the (messages|input)",
    r"prompt token count of \d+ exceeds the limit of \d+",
    r"range of input length should be \[1, ?\d+\]",
    r"but the configured context size is",
    r"exceeded model token limit",
    r"does not fit in (the )?context length",
    r"context window exceeds limit",
    r"longer than the maximum model length",
    r"context size has been exceeded",
];

static OVERFLOW_PHRASES: LazyLock<RegexSet> =
    LazyLock::new(|| RegexSet::new(OVERFLOW_PATTERNS).unwrap_or_else(|_| RegexSet::empty()));

/// The same phrases one by one, to find where each stands in an error (see [`strip_echoes`]).
static OVERFLOW_PHRASE_LIST: LazyLock<Vec<Regex>> = LazyLock::new(|| compile(&OVERFLOW_PATTERNS));

/// Output-cap errors: the prompt is fine, the requested output is not allowed.
const OUTPUT_CAP_PHRASES: [&str; 5] = [
    "maximum allowed number of output tokens",
    "max_tokens is too large",
    "maximum tokens you requested exceeds",
    "`max_completion_tokens` must be less than or equal",
    "completion tokens, whereas you provided",
];
/// Phrases that name the context window: they win over output-cap look-alikes.
const CONTEXT_PHRASES: [&str; 3] = ["context length", "context limit", "context window"];

static LIMIT: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    compile(&[
        r"exceed context limit: \d+ \+ \d+ > (\d+)",
        r"tokens > (\d+) maximum",
        r"maximum context length(?: is| of)?:? ?(\d+)",
        r"with (\d+) maximum context length",
        r"maximum number of tokens allowed \((\d+)\)",
        r"only supports up to (\d+)",
        r"available context size \((\d+) tokens\)",
        r"context length of only (\d+)",
        r"n_ctx \((\d+)\)",
        r"must have less than (\d+) tokens",
        r"must be <= (\d+)",
        r"context length \((\d+) tokens\)",
        r"context length is only (\d+)",
        r"maximum prompt length is (\d+)",
        r"exceeds budget \((\d+) tokens\)",
        r"configured limit of (\d+)",
        r"cannot exceed (\d+)",
        r"maximum context length of \S+ is (\d+)",
        r"prompt token count of \d+ exceeds the limit of (\d+)",
        r"range of input length should be \[1, ?(\d+)\]",
        r"configured context size is ([\d,]+) tokens",
        r"model token limit: (\d+)",
        r"context length only supports (\d+)",
        r"maximum model length of (\d+)",
        r"while limit is (\d+)",
    ])
});

static PROMPT: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    compile(&[
        r"exceed context limit: (\d+) \+",
        r"prompt is too long: (\d+)",
        r"resulted in (\d+) tokens",
        r"\((\d+) in the messages",
        r"\((\d+) in your prompt",
        r"input token count \((\d+)\)",
        r"input token count is (\d+)",
        r"request \((\d+) tokens\)",
        r"keep the first (\d+) tokens",
        r"n_keep \((\d+)\)",
        r"given: (\d+)",
        r"prompt contains (\d+) tokens",
        r"the input \((\d+) tokens\)",
        r"you passed (\d+) input tokens",
        r"has (\d+) input tokens",
        r"contains at least (\d+) input tokens",
        r"request contains (\d+) tokens",
        r"current message \((\d+) tokens\)",
        r"\((\d+) of text input",
        r"prompt token count of (\d+)",
        r"prompt has ([\d,]+) tokens",
        r"the input has (\d+) tokens",
        r"prompt \(length (\d+)\)",
    ])
});

static MAX_TOKENS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    compile(&[
        r"exceed context limit: \d+ \+ (\d+)",
        r"(\d+) in the completion",
        r"(\d+) for the completion",
        r"requested (\d+) output tokens",
        r"and (\d+) `max_new_tokens`",
        r"too large: (\d+)\. this model's maximum context",
        r"(\d+) in the output",
    ])
});

fn compile(patterns: &[&str]) -> Vec<Regex> {
    patterns.iter().filter_map(|p| Regex::new(p).ok()).collect()
}

/// The first number a pattern captures; thousands separators (`256,000`) are dropped.
fn first_number(patterns: &[Regex], text: &str) -> Option<u64> {
    patterns.iter().find_map(|re| re.captures(text)?.get(1)?.as_str().replace(',', "").parse().ok())
}

/// Detects overflow errors; holds the user's extra patterns, compiled once.
#[derive(Debug, Clone, Default)]
pub struct OverflowDetector {
    /// The patterns as configured, for `--check-config`.
    patterns: Vec<String>,
    extra: Vec<Regex>,
}

impl OverflowDetector {
    /// `extra` are case-insensitive regular expressions (`compaction.extra_overflow_patterns`).
    pub fn new(extra: &[String]) -> Result<Self, regex::Error> {
        let compiled = extra.iter().map(|p| Regex::new(&format!("(?i){p}"))).collect::<Result<_, _>>()?;
        Ok(Self { patterns: extra.to_vec(), extra: compiled })
    }

    /// Whether a response (status and body; SSE text for errors inside a 200 stream) is an overflow.
    pub fn detect(&self, status: u16, body: &[u8]) -> Option<Overflow> {
        self.detect_answer(status, body, None)
    }

    /// Whether the answer to `sent` is an overflow: as [`OverflowDetector::detect`], except that
    /// words the error only echoes from the request (a parameter's name, a value the provider
    /// quotes back) say nothing. A client controls those: a key named "This model's maximum
    /// context length is 1000 tokens" makes OpenAI answer `Unrecognized request argument
    /// supplied: This model's maximum context length is 1000 tokens`, which is no overflow and
    /// names no window.
    pub fn detect_answer(&self, status: u16, body: &[u8], sent: Option<&[u8]>) -> Option<Overflow> {
        let success = (200..300).contains(&status);
        if !(success || OVERFLOW_STATUSES.contains(&status)) || success && !looks_like_event_stream(body) {
            return None;
        }
        let mut found = Found::default();
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => found.walk(&value, 0),
            Err(_) if looks_like_event_stream(body) => {
                for event in sse::events(body, body.len()) {
                    for payload in std::iter::once(event.data.as_str()).chain(event.error.as_deref()) {
                        match serde_json::from_str::<Value>(payload) {
                            Ok(value) => found.walk(&value, 0),
                            Err(_) if success => {}
                            Err(_) => found.texts.push(payload.to_string()),
                        }
                    }
                }
            }
            // A plain-text error body: every line may carry the words.
            Err(_) => found.texts.extend(String::from_utf8_lossy(body).lines().map(str::to_string)),
        }
        let mut text = found.texts.join("\n").to_lowercase();
        if let Some(sent) = sent {
            strip_echoes(&mut text, sent);
        }
        let codes: Vec<String> = found.codes.iter().map(|c| c.to_lowercase()).collect();
        if codes.iter().any(|c| RATE_LIMIT_CODES.contains(&c.as_str()))
            || RATE_LIMIT_PHRASES.iter().any(|p| text.contains(p))
        {
            return None;
        }
        let coded = codes.iter().any(|c| OVERFLOW_CODES.contains(&c.as_str()));
        let names_window = CONTEXT_PHRASES.iter().any(|p| text.contains(p));
        if !coded && !names_window && OUTPUT_CAP_PHRASES.iter().any(|p| text.contains(p)) {
            return None;
        }
        let matched = coded || OVERFLOW_PHRASES.is_match(&text) || self.extra.iter().any(|re| re.is_match(&text));
        if !matched {
            return None;
        }
        Some(Overflow {
            limit: first_number(&LIMIT, &text).or(found.n_ctx),
            prompt_tokens: first_number(&PROMPT, &text).or(found.n_prompt_tokens),
            max_tokens: first_number(&MAX_TOKENS, &text),
        })
    }
}

/// Serialized as the configured patterns, the form they were given in.
impl serde::Serialize for OverflowDetector {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.patterns.serialize(serializer)
    }
}

/// The statuses an overflow comes with: 400 (most providers), 413 (Anthropic's request size,
/// some gateways), 422 (Text Generation Inference), 500 (Ollama), and errors inside a 2xx
/// stream. An authentication, permission, routing or rate-limit status is never one, whatever
/// its message says.
const OVERFLOW_STATUSES: [u16; 4] = [400, 413, 422, 500];

/// Characters after an overflow phrase that must also stand in the request for the phrase to be
/// an echo cut short by the provider (a value quoted up to a length).
const ECHO_TAIL: usize = 24;

/// Blanks from an error's text (lower-cased) what it echoes of the request `sent`: each overflow
/// phrase (and each window or prompt size it names) that, with up to [`ECHO_TAIL`] characters of
/// what follows it on its line, stands in a key or a string of the request, decoded (an echo,
/// whole or cut short by the provider). A provider's own wording carries its own numbers after
/// the phrase, which the request does not hold even when the conversation talks about overflows.
/// Read only after an error: the request is parsed again.
fn strip_echoes(text: &mut String, sent: &[u8]) {
    let Ok(request) = serde_json::from_slice::<Value>(sent) else { return };
    let mut echoed = Vec::new();
    for phrase in OVERFLOW_PHRASE_LIST.iter().chain(LIMIT.iter()).chain(PROMPT.iter()) {
        for found in phrase.find_iter(text) {
            let line_end = text[found.end()..].find('\n').map_or(text.len(), |i| found.end() + i);
            let mut end = (found.end() + ECHO_TAIL).min(line_end);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let window = text[found.start()..end].trim_end_matches(['.', '\'', '"', ' ']);
            if holds(&request, window) {
                echoed.push(found.range());
            }
        }
    }
    for range in echoed {
        let blank = " ".repeat(range.len());
        text.replace_range(range, &blank);
    }
}

/// Whether a key or string of the request holds `window` (lower-cased).
fn holds(value: &Value, window: &str) -> bool {
    let has = |s: &str| s.len() >= window.len() && s.to_lowercase().contains(window);
    match value {
        Value::String(s) => has(s),
        Value::Array(items) => items.iter().any(|v| holds(v, window)),
        Value::Object(map) => map.iter().any(|(key, value)| has(key) || holds(value, window)),
        _ => false,
    }
}

fn looks_like_event_stream(body: &[u8]) -> bool {
    let start = &body[..body.len().min(512)];
    start.starts_with(b"data:")
        || start.starts_with(b"event:")
        || start.starts_with(b"error:")
        || start.starts_with(b":")
        || start.windows(6).any(|w| w == b"\ndata:")
}

/// Strings and numbers gathered from an error body.
#[derive(Default)]
struct Found {
    texts: Vec<String>,
    codes: Vec<String>,
    n_ctx: Option<u64>,
    n_prompt_tokens: Option<u64>,
}

impl Found {
    fn walk(&mut self, value: &Value, depth: usize) {
        if depth > 6 {
            return;
        }
        match value {
            Value::Array(items) => items.iter().for_each(|v| self.walk(v, depth + 1)),
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("message" | "error" | "detail" | "msg", Value::String(s)) => self.texts.push(s.clone()),
                        ("raw", Value::String(s)) => match serde_json::from_str::<Value>(s) {
                            Ok(inner) => self.walk(&inner, depth + 1),
                            Err(_) => self.texts.push(s.clone()),
                        },
                        ("code" | "type" | "status" | "__type", Value::String(s)) => self.codes.push(s.clone()),
                        ("n_ctx", Value::Number(n)) => self.n_ctx = n.as_u64(),
                        ("n_prompt_tokens", Value::Number(n)) => self.n_prompt_tokens = n.as_u64(),
                        (_, Value::Object(_) | Value::Array(_)) => self.walk(value, depth + 1),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detector() -> OverflowDetector {
        OverflowDetector::default()
    }

    #[test]
    fn an_error_that_only_echoes_the_requests_words_is_no_overflow() {
        let sent = br#"{"model":"gpt-4.1","messages":[],"This model's maximum context length is 1000 tokens":true}"#;
        let echo = br#"{"error":{"message":"Unrecognized request argument supplied: This model's maximum context length is 1000 tokens","type":"invalid_request_error","param":null,"code":null}}"#;
        assert!(detector().detect(400, echo).is_some(), "read without the request, it looks like one");
        assert_eq!(detector().detect_answer(400, echo, Some(sent)), None);
        // An echo the provider cut short, of a value the client wrote with a JSON escape.
        let sent = br#"{"messages":[{"role":"user","content":"x"}],"metadata":{"note":"prompt is too long: 5 tokens > 1000 maximum, and then some padding text"}}"#;
        let cut = br#"{"type":"error","error":{"type":"invalid_request_error","message":"metadata.note: value 'prompt is too long: 5 tokens > 1000 maxim...' is not allowed"}}"#;
        assert_eq!(detector().detect_answer(400, cut, Some(sent)), None);
    }

    #[test]
    fn a_real_overflow_is_still_one_when_the_conversation_talks_about_overflows() {
        let sent = br#"{"messages":[{"role":"user","content":"Why does the API say maximum context length? Fix overflow.rs"}]}"#;
        let real = br#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        let found = detector().detect_answer(400, real, Some(sent)).expect("an overflow");
        assert_eq!((found.limit, found.prompt_tokens), (Some(128_000), Some(130_000)));
        let anthropic = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        let found = detector().detect_answer(
            400,
            anthropic,
            Some(br#"{"messages":[{"role":"user","content":"prompt is too long"}]}"#),
        );
        assert_eq!(found.and_then(|o| o.limit), Some(200_000));
    }

    #[test]
    fn no_authentication_permission_or_routing_status_is_an_overflow_whatever_it_says() {
        let body = br#"{"error":{"message":"This model's maximum context length is 1000 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        for status in [401, 403, 404, 405, 409, 429, 502, 503] {
            assert_eq!(detector().detect(status, body), None, "{status}");
        }
        for status in [400, 413, 422, 500] {
            assert!(detector().detect(status, body).is_some(), "{status}");
        }
    }
}
