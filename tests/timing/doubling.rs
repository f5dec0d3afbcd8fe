//! Every step over request content costs time linear in its size, whatever shape a hostile client
//! gives it: doubling the input about doubles the time (issue 9). Reading a request, the whole
//! rewrite pipeline (parse, count, truncate, dedupe, prune, repair, render), choosing a compaction
//! cut and rebuilding, recognizing an overflow in an error body, and reading SSE usage are each
//! timed on hostile shapes; so is every scalar a client chooses (the model, call ids, tool names,
//! header values), each made long (issue 34).
//!
//! Each shape is sized so its smallest run takes about ten milliseconds of CPU in a debug build
//! (CPU time of the process, so other work on the shared machine does not count); n, 2n,
//! 4n, 8n and 16n are timed in turn, five rounds, and the median run of each size counts. The
//! growth is the slope of log(time) against log(size), fitted over the five sizes: 1 for linear
//! work, 2 for quadratic. A shape fails at 1.5 or more (16n costing 64x n, where linear work costs
//! 16x and quadratic 256x): four times the linear cost either side, so neither a busy moment of
//! the shared machine nor a quadratic step hides behind the bound. No run is ever taken again.

use std::collections::BTreeSet;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use compactor::compaction::{plan, summarizer};
use compactor::config::Config;
use compactor::dialect::{Dialect, ParsedRequest};
use compactor::overflow::OverflowDetector;
use compactor::proxy::usage::{Framing, UsageTap};
use compactor::rewrite::Rewriter;
use compactor::session::state::CompactionRecord;
use compactor::tokens::{ModelTable, TokenCounter};

/// The smallest size's run must last at least this long for the timing to mean something.
const CALIBRATED_RUN: Duration = Duration::from_millis(10);
/// Past this size a shape is plainly fast enough; calibration stops there.
const LARGEST_N: usize = 1 << 22;
/// Sizes n, 2n, … 16n.
const DOUBLINGS: u32 = 4;
/// The growth (slope of log time over log size) at which a shape fails: linear is 1, quadratic 2.
const MAX_GROWTH: f64 = 1.5;
/// Rounds of every size, taken in turn; the median run of each size counts.
const ROUNDS: usize = 5;

/// `n` extra fields `"k0":0,"k1":1,…` ready to splice into an object.
fn many_fields(n: usize) -> String {
    let mut out = String::with_capacity(n * 12);
    for i in 0..n {
        out.push_str(&format!(",\"k{i}\":{i}"));
    }
    out
}

/// A shape of hostile input: how to build one of size `n`, and the step that reads it (true when
/// it did the work it is timed for, so a refusal is never what is measured).
struct Shape {
    name: &'static str,
    body: Box<dyn Fn(usize) -> Vec<u8>>,
    step: Box<Step>,
    /// The largest body the step does its work on (4n stays within it).
    max_bytes: usize,
}

impl Shape {
    /// The same shape, never timed past `bytes` (a fast machine would otherwise calibrate past
    /// what the step accepts).
    fn up_to(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }
}

/// A step over an input: true when it did its work.
type Step = dyn Fn(&[u8]) -> bool;

fn shape(
    name: &'static str,
    body: impl Fn(usize) -> Vec<u8> + 'static,
    step: impl Fn(&[u8]) -> bool + 'static,
) -> Shape {
    Shape { name, body: Box::new(body), step: Box::new(step), max_bytes: usize::MAX }
}

/// The CPU time this process has used: what a step costs, whatever else the shared machine runs
/// meanwhile (wall time counts the moments the test waits for a core). Every thread counts, so
/// work a step hands to a blocking thread is counted too.
fn cpu_now() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a pointer to a live one.
    #[allow(unsafe_code)]
    let status = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "the process CPU clock is unavailable");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The CPU time one `step` over `body` takes.
fn time_one(step: &Step, body: &[u8]) -> Duration {
    let start = cpu_now();
    assert!(step(body), "the step must do its work, or the timing measures a refusal");
    cpu_now().saturating_sub(start)
}

/// The median run of each body over [`ROUNDS`] rounds that take the bodies in turn (so a busy
/// moment of the machine lands on one run of one size, and the median drops it).
fn median_in_turn(step: &Step, bodies: &[Vec<u8>]) -> Vec<Duration> {
    let mut runs = vec![Vec::with_capacity(ROUNDS); bodies.len()];
    for _ in 0..ROUNDS {
        for (runs, body) in runs.iter_mut().zip(bodies) {
            runs.push(time_one(step, body));
        }
    }
    runs.into_iter()
        .map(|mut runs| {
            runs.sort();
            runs[runs.len() / 2]
        })
        .collect()
}

/// The least-squares slope of log(time) against log(size): how the cost grows with the input.
fn growth(sizes: &[usize], times: &[Duration]) -> f64 {
    let points: Vec<(f64, f64)> =
        sizes.iter().zip(times).map(|(size, time)| ((*size as f64).ln(), time.as_secs_f64().max(1e-9).ln())).collect();
    let count = points.len() as f64;
    let (mean_x, mean_y) = points.iter().fold((0.0, 0.0), |(x, y), (px, py)| (x + px / count, y + py / count));
    let covariance: f64 = points.iter().map(|(x, y)| (x - mean_x) * (y - mean_y)).sum();
    let variance: f64 = points.iter().map(|(x, _)| (x - mean_x).powi(2)).sum();
    covariance / variance
}

/// Times every shape at n, 2n, … 16n and fails naming each shape whose cost grew faster than
/// linear (with every shape's figures, for docs/architecture.md and docs/correctness.md).
fn assert_linear(shapes: Vec<Shape>) {
    let _machine = crate::one_at_a_time();
    let mut report = Vec::new();
    let mut too_slow = Vec::new();
    let largest = 1usize << DOUBLINGS;
    for shape in shapes {
        let mut n = 1_000;
        loop {
            let body = (shape.body)(n);
            // The sizes grow linearly with n: the next calibration's largest body is estimated,
            // not built.
            let fits = body.len().saturating_mul(2 * largest) <= shape.max_bytes;
            if n >= LARGEST_N || !fits || median_in_turn(&*shape.step, &[body])[0] >= CALIBRATED_RUN {
                break;
            }
            n *= 2;
        }
        let sizes: Vec<usize> = (0..=DOUBLINGS).map(|k| n << k).collect();
        let bodies: Vec<Vec<u8>> = sizes.iter().map(|size| (shape.body)(*size)).collect();
        let times = median_in_turn(&*shape.step, &bodies);
        let growth = growth(&sizes, &times);
        let millis: Vec<String> = times.iter().map(|t| format!("{:.1}", t.as_secs_f64() * 1e3)).collect();
        let line = format!(
            "{}: n={n} ({} KB), n..{largest}n in ms [{}], {largest}n/n {:.1}x, growth {growth:.2}",
            shape.name,
            bodies[0].len() / 1000,
            millis.join(", "),
            times[DOUBLINGS as usize].as_secs_f64() / times[0].as_secs_f64(),
        );
        eprintln!("{line}");
        if growth >= MAX_GROWTH {
            too_slow.push(line.clone());
        }
        report.push(line);
    }
    assert!(too_slow.is_empty(), "not linear:\n{}\n\nall shapes:\n{}", too_slow.join("\n"), report.join("\n"));
}

#[test]
fn reading_a_request_costs_time_linear_in_its_size() {
    let parses = |dialect: Dialect| move |body: &[u8]| ParsedRequest::parse(dialect, body).is_some();
    assert_linear(vec![
        shape(
            "a chat request with n top-level keys",
            |n| {
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{}}}"#, many_fields(n))
                    .into_bytes()
            },
            parses(Dialect::ChatCompletions),
        ),
        shape(
            "a chat message with n keys",
            |n| {
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"{}}}]}}"#, many_fields(n))
                    .into_bytes()
            },
            parses(Dialect::ChatCompletions),
        ),
        shape(
            "an anthropic content block with n keys",
            |n| {
                format!(
                    r#"{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":[{{"type":"text","text":"hi"{}}}]}}]}}"#,
                    many_fields(n)
                )
                .into_bytes()
            },
            parses(Dialect::AnthropicMessages),
        ),
        shape(
            "a responses request with n input items",
            |n| {
                let item = r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}"#;
                format!(r#"{{"model":"m","input":[{}]}}"#, vec![item; n.max(1)].join(",")).into_bytes()
            },
            parses(Dialect::Responses),
        ),
        shape(
            "a responses request with n developer messages made of parts",
            |n| {
                let item =
                    r#"{"type":"message","role":"developer","content":[{"type":"input_text","text":"be terse"}]}"#;
                format!(r#"{{"model":"m","input":[{}]}}"#, vec![item; n.max(1)].join(",")).into_bytes()
            },
            parses(Dialect::Responses),
        ),
    ]);
}

/// The policies with small windows, so every hostile shape makes them act; the token cache is
/// shared and warm after the first run, so what is timed is compactor's own work.
static REWRITER: LazyLock<Rewriter> = LazyLock::new(|| {
    let mut settings = Config::default().rewrite_settings();
    settings.prune.protect_tokens = 500;
    settings.prune.minimum_tokens = 100;
    settings.tool_output_max_tokens = 2_000;
    settings.blocking_tokenize_bytes = usize::MAX;
    Rewriter::new(settings, TokenCounter::new(256 << 20), ModelTable::default())
});

/// Parse, count, repair, truncate, dedupe, prune, repair and render; true when the body changed.
fn rewrites(dialect: Dialect) -> impl Fn(&[u8]) -> bool {
    move |body| REWRITER.rewrite_body(dialect, body, &BTreeSet::new()).is_some_and(|r| r.body.is_some())
}

fn chat(messages: &[String]) -> Vec<u8> {
    format!(r#"{{"model":"gpt-4o","messages":[{}]}}"#, messages.join(",")).into_bytes()
}

fn anthropic(messages: &[String]) -> Vec<u8> {
    format!(r#"{{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{}]}}"#, messages.join(",")).into_bytes()
}

/// A tool output of about 80 tokens, the same for every call: dedupe's food.
fn repeated_output() -> String {
    "src/lib.rs:12: warning: unused variable `count`, prefix it with an underscore\n".repeat(5)
}

#[test]
fn the_rewrite_pipeline_costs_time_linear_in_the_request() {
    assert_linear(vec![
        shape(
            "chat, n tiny messages after a call without its result",
            |n| {
                let mut messages = vec![
                    r#"{"role":"user","content":"go"}"#.to_string(),
                    r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c0","type":"function","function":{"name":"run","arguments":"{}"}}]}"#.to_string(),
                ];
                for i in 0..n {
                    let role = if i % 2 == 0 { "user" } else { "assistant" };
                    messages.push(format!(r#"{{"role":"{role}","content":"hi"}}"#));
                }
                chat(&messages)
            },
            rewrites(Dialect::ChatCompletions),
        ),
        shape(
            "chat, one turn with n calls without results and n orphaned results",
            |n| {
                let calls: Vec<String> = (0..n)
                    .map(|i| {
                        format!(r#"{{"id":"c{i}","type":"function","function":{{"name":"run","arguments":"{{}}"}}}}"#)
                    })
                    .collect();
                let mut messages = vec![
                    r#"{"role":"user","content":"go"}"#.to_string(),
                    format!(r#"{{"role":"assistant","content":null,"tool_calls":[{}]}}"#, calls.join(",")),
                ];
                messages.extend((0..n).map(|i| format!(r#"{{"role":"tool","tool_call_id":"x{i}","content":"ok"}}"#)));
                chat(&messages)
            },
            rewrites(Dialect::ChatCompletions),
        ),
        shape(
            "chat, one tool output of n lines",
            |n| {
                let output: String = (0..n / 4).map(|i| format!("line {i}: compiled crate number {i}\n")).collect();
                chat(&[
                    r#"{"role":"user","content":"build"}"#.to_string(),
                    r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c0","type":"function","function":{"name":"run","arguments":"{}"}}]}"#.to_string(),
                    format!(r#"{{"role":"tool","tool_call_id":"c0","content":{}}}"#, serde_json::Value::from(output)),
                ])
            },
            rewrites(Dialect::ChatCompletions),
        ),
        shape(
            "anthropic, one id used by n calls and n results",
            |n| {
                let mut messages = vec![r#"{"role":"user","content":"go"}"#.to_string()];
                for _ in 0..n / 2 {
                    messages.push(
                        r#"{"role":"assistant","content":[{"type":"tool_use","id":"same","name":"run","input":{}}]}"#
                            .to_string(),
                    );
                    messages.push(r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"same","content":"ok"},{"type":"tool_result","tool_use_id":"same","content":"again"}]}"#.to_string());
                }
                anthropic(&messages)
            },
            rewrites(Dialect::AnthropicMessages),
        ),
        shape(
            "anthropic, n calls answered in one message of n blocks, one result too long",
            |n| {
                let calls: Vec<String> =
                    (0..n).map(|i| format!(r#"{{"type":"tool_use","id":"t{i}","name":"run","input":{{}}}}"#)).collect();
                let mut results: Vec<String> = (1..n)
                    .map(|i| format!(r#"{{"type":"tool_result","tool_use_id":"t{i}","content":"ok"}}"#))
                    .collect();
                let long: String = (0..1_000).map(|i| format!("row {i} of the table\n")).collect();
                results.push(format!(
                    r#"{{"type":"tool_result","tool_use_id":"t0","content":{}}}"#,
                    serde_json::Value::from(long)
                ));
                anthropic(&[
                    r#"{"role":"user","content":"go"}"#.to_string(),
                    format!(r#"{{"role":"assistant","content":[{}]}}"#, calls.join(",")),
                    format!(r#"{{"role":"user","content":[{}]}}"#, results.join(",")),
                ])
            },
            rewrites(Dialect::AnthropicMessages),
        ),
        shape(
            "anthropic, n calls without results before a user message of n text blocks",
            |n| {
                let calls: Vec<String> =
                    (0..n).map(|i| format!(r#"{{"type":"tool_use","id":"t{i}","name":"run","input":{{}}}}"#)).collect();
                let texts = vec![r#"{"type":"text","text":"and then"}"#; n];
                anthropic(&[
                    r#"{"role":"user","content":"go"}"#.to_string(),
                    format!(r#"{{"role":"assistant","content":[{}]}}"#, calls.join(",")),
                    format!(r#"{{"role":"user","content":[{}]}}"#, texts.join(",")),
                ])
            },
            rewrites(Dialect::AnthropicMessages),
        ),
        shape(
            "responses, n function calls with the same long output",
            |n| {
                let output = serde_json::Value::from(repeated_output());
                let mut items = vec![r#"{"type":"message","role":"user","content":"go"}"#.to_string()];
                for i in 0..n / 8 {
                    items.push(format!(
                        r#"{{"type":"function_call","call_id":"f{i}","name":"read","arguments":"{{}}"}}"#
                    ));
                    items.push(format!(r#"{{"type":"function_call_output","call_id":"f{i}","output":{output}}}"#));
                }
                format!(r#"{{"model":"gpt-5","input":[{}]}}"#, items.join(",")).into_bytes()
            },
            rewrites(Dialect::Responses),
        ),
        shape(
            "chat, n distinct outputs of a tool that is never pruned",
            |n| {
                let mut messages = vec![r#"{"role":"user","content":"go"}"#.to_string()];
                for i in 0..n / 8 {
                    let name = if i % 2 == 0 { "skill" } else { "read" };
                    messages.push(format!(r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":"c{i}","type":"function","function":{{"name":"{name}","arguments":"{{}}"}}}}]}}"#));
                    let output = serde_json::Value::from(format!("{i}: {}", repeated_output()));
                    messages.push(format!(r#"{{"role":"tool","tool_call_id":"c{i}","content":{output}}}"#));
                }
                chat(&messages)
            },
            rewrites(Dialect::ChatCompletions),
        ),
    ]);
}

/// Choose where to cut, pick the user's messages to keep, hash the covered prefix, rebuild the
/// conversation and find the record again, as a compaction and every later turn do.
fn cuts_and_rebuilds(dialect: Dialect, keep_recent_tokens: u32) -> impl Fn(&[u8]) -> bool {
    move |body| {
        let mut parsed = ParsedRequest::parse(dialect, body).unwrap();
        let model = REWRITER.models.lookup(parsed.model.as_deref().unwrap_or(""));
        REWRITER.count_items(&mut parsed, model.encoding);
        let count = |text: &str| REWRITER.counter.count(model.encoding, text);
        let cut = plan::choose_cut(&parsed, keep_recent_tokens, 0).unwrap_or(parsed.messages.len() / 2);
        let record = CompactionRecord {
            generation: 1,
            summary: "The user asked for a fix; it is done.".into(),
            covered_messages: cut as u64,
            covered_hash: plan::prefix_hash(&parsed, cut),
            first_kept: cut as u64,
            user_messages: plan::user_messages(&parsed, cut, 1_000_000),
            truncate_user_tokens: 256,
            tokens_before: 0,
            tokens_after: 0,
            trigger: "overflow".into(),
            model: "m".into(),
            at_unix_ms: 0,
            due_tokens: 0,
            cost: Default::default(),
            started_by: String::new(),
            built_on: 0,
            us_per_token: 0,
        };
        let Some(rebuilt) = plan::rebuild(&parsed, &record, "Summary: ", &count) else { return false };
        let records = [record];
        plan::matching_record(&parsed, &records).is_some() && ParsedRequest::parse(dialect, &rebuilt).is_some()
    }
}

#[test]
fn choosing_a_compaction_cut_and_rebuilding_cost_time_linear_in_the_request() {
    assert_linear(vec![
        shape(
            "chat, n tiny messages",
            |n| {
                let messages: Vec<String> = (0..n)
                    .map(|i| {
                        let role = if i % 2 == 0 { "user" } else { "assistant" };
                        format!(r#"{{"role":"{role}","content":"message {i}"}}"#)
                    })
                    .collect();
                chat(&messages)
            },
            cuts_and_rebuilds(Dialect::ChatCompletions, 200),
        ),
        shape(
            "chat, n messages inside one call answered only at the end (no clean cut)",
            |n| {
                let mut messages = vec![
                    r#"{"role":"user","content":"go"}"#.to_string(),
                    r#"{"role":"assistant","content":null,"tool_calls":[{"id":"long","type":"function","function":{"name":"run","arguments":"{}"}}]}"#.to_string(),
                ];
                for i in 0..n {
                    let role = if i % 2 == 0 { "user" } else { "assistant" };
                    messages.push(format!(r#"{{"role":"{role}","content":"waiting {i}"}}"#));
                }
                messages.push(r#"{"role":"tool","tool_call_id":"long","content":"done"}"#.to_string());
                chat(&messages)
            },
            cuts_and_rebuilds(Dialect::ChatCompletions, 200),
        ),
        shape(
            "anthropic, n tool pairs, every result a turn late",
            |n| {
                let mut messages = vec![r#"{"role":"user","content":"go"}"#.to_string()];
                for i in 0..n / 2 {
                    messages.push(format!(r#"{{"role":"assistant","content":[{{"type":"thinking","thinking":"hm","signature":"s"}},{{"type":"tool_use","id":"t{i}","name":"run","input":{{}}}}]}}"#));
                    messages.push(format!(r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t{i}","content":"ok {i}"}},{{"type":"text","text":"next"}}]}}"#));
                }
                anthropic(&messages)
            },
            cuts_and_rebuilds(Dialect::AnthropicMessages, 100_000_000),
        ),
    ]);
}

/// Build the summarizer's transcript of the whole conversation and split it into the pieces of a
/// rolling summary, as a compaction whose transcript does not fit the summarizer does.
fn splits_into_pieces(dialect: Dialect, room: u32) -> impl Fn(&[u8]) -> bool {
    move |body| {
        let mut parsed = ParsedRequest::parse(dialect, body).unwrap();
        let model = REWRITER.models.lookup(parsed.model.as_deref().unwrap_or(""));
        REWRITER.count_items(&mut parsed, model.encoding);
        let count = |text: &str| REWRITER.counter.count(model.encoding, text);
        let entries = summarizer::transcript_entries(&parsed, 0, parsed.messages.len(), 2_000, &count);
        let mut entries: std::collections::VecDeque<String> = entries.into();
        let mut pieces = 0;
        while !entries.is_empty() {
            if summarizer::next_piece(&mut entries, room, &count).is_empty() {
                return false;
            }
            pieces += 1;
        }
        pieces > 0
    }
}

#[test]
fn splitting_a_transcript_into_rolling_summary_pieces_costs_time_linear_in_the_request() {
    assert_linear(vec![
        shape(
            "chat, n small messages in pieces of 300 tokens",
            |n| {
                let messages: Vec<String> = (0..n)
                    .map(|i| {
                        let role = if i % 2 == 0 { "user" } else { "assistant" };
                        format!(r#"{{"role":"{role}","content":"message {i} about the exporter"}}"#)
                    })
                    .collect();
                chat(&messages)
            },
            splits_into_pieces(Dialect::ChatCompletions, 300),
        ),
        shape(
            "chat, one user message of n lines split across pieces of 300 tokens",
            |n| {
                let text: String = (0..n).map(|i| format!("line {i} of the user's notes\\n")).collect();
                chat(&[format!(r#"{{"role":"user","content":"{text}"}}"#)])
            },
            splits_into_pieces(Dialect::ChatCompletions, 300),
        ),
    ]);
}

#[test]
fn recognizing_an_overflow_costs_time_linear_in_the_error_body() {
    let detector = OverflowDetector::new(&["never matches (\\d+) here".to_string()]).unwrap();
    let detects = move |body: &[u8]| detector.detect(400, body).is_some();
    let detector = OverflowDetector::default();
    let detects_in_stream = move |body: &[u8]| detector.detect(200, body).is_some();
    assert_linear(vec![
        shape(
            "a JSON error whose message is n bytes",
            |n| {
                let message =
                    format!("prompt is too long: 250000 tokens > 200000 maximum. {}", "context ".repeat(n / 8));
                serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}})
                    .to_string()
                    .into_bytes()
            },
            detects.clone(),
        ),
        shape(
            "a JSON error with n detail entries",
            |n| {
                let details: Vec<serde_json::Value> =
                    (0..n / 16).map(|i| serde_json::json!({"msg": format!("field {i}"), "code": "x"})).collect();
                serde_json::json!({"error": {"message": "This model's maximum context length is 8192 tokens", "details": details}})
                    .to_string()
                    .into_bytes()
            },
            detects.clone(),
        ),
        shape(
            "a plain-text error of n lines",
            |n| {
                let mut text = "the input exceeds the context window\n".to_string();
                text.push_str(&"upstream said something unrelated\n".repeat(n / 32));
                text.into_bytes()
            },
            detects,
        ),
        shape(
            "a 200 stream of n events ending in an overflow error",
            |n| {
                let mut text = ": processing\n\n".repeat(n / 16);
                text.push_str(
                    "data: {\"error\":{\"message\":\"prompt is too long\",\"code\":\"context_length_exceeded\"}}\n\n",
                );
                text.into_bytes()
            },
            detects_in_stream,
        ),
    ]);
}

/// Feeds the body to a usage tap in `chunk`-byte pieces; true when it read a usage.
fn taps(framing: Framing, chunk: usize) -> impl Fn(&[u8]) -> bool {
    move |body| {
        let mut tap = UsageTap::new(framing);
        for piece in body.chunks(chunk) {
            tap.observe(&Bytes::copy_from_slice(piece));
        }
        tap.finish().is_some()
    }
}

#[test]
fn reading_usage_from_a_response_costs_time_linear_in_its_size() {
    let usage = r#"{"type":"message_delta","usage":{"output_tokens":42}}"#;
    assert_linear(vec![
        shape(
            "a stream of n small events, in 100-byte chunks",
            move |n| {
                let mut text = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"a\"}}\n\n"
                    .repeat(n / 64);
                text.push_str(&format!("event: message_delta\ndata: {usage}\n\n"));
                text.into_bytes()
            },
            taps(Framing::EventStream, 100),
        ),
        shape(
            "n events of two data lines, in 7-byte chunks",
            move |n| {
                let mut text = "data: {\"a\":\ndata: 1}\n\n".repeat(n / 24);
                text.push_str(&format!("event: message_delta\ndata: {usage}\n\n"));
                text.into_bytes()
            },
            taps(Framing::EventStream, 7),
        ),
        shape(
            "a stream with CR line endings and n comments, in 1000-byte chunks",
            move |n| {
                let mut text = ":\r".repeat(n / 2);
                text.push_str(&format!("\rdata: {usage}\r\r"));
                text.into_bytes()
            },
            taps(Framing::EventStream, 1000),
        ),
        shape(
            "a plain JSON reply of n content blocks, in 16-byte chunks",
            |n| {
                let blocks = vec![r#"{"type":"text","text":"a"}"#; n / 32 + 1].join(",");
                format!(r#"{{"content":[{blocks}],"usage":{{"input_tokens":5,"output_tokens":1}}}}"#).into_bytes()
            },
            taps(Framing::Json, 16),
        )
        // A plain reply is read whole up to 4 MiB (usage.rs); past that it passes unread.
        .up_to(4 << 20),
    ]);
}

/// Compactor's whole work before forwarding (`Compactor::prepare`: parse, session
/// identification, session load, model lookups, every derivation of the rewrite), on its own
/// runtime, with the default configuration and an in-memory store. The prefix cache is off: its
/// reuse of an earlier run of the same body would make some runs of a size cheaper than others
/// (what it adds is a comparison with the earlier body, linear in the body).
struct RequestPath {
    compactor: compactor::compaction::Compactor,
    runtime: tokio::runtime::Runtime,
}

static REQUEST_PATH: LazyLock<RequestPath> = LazyLock::new(|| {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut config = Config::default();
    config.limits.prefix_cache_bytes = 0;
    let compactor = runtime.block_on(async {
        let store = compactor::session::Store::from_config(&config.session);
        let upstreams = std::sync::Arc::new(compactor::upstream::Upstreams::new(&config).unwrap());
        compactor::compaction::Compactor::new(&config, store, upstreams)
    });
    RequestPath { compactor, runtime }
});

/// Prepares a request to `path` with `headers` and `body`; true when compactor read and rewrote
/// it (a report means the whole pipeline ran, not a refusal).
fn prepares(path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> bool {
    let mut map = http::HeaderMap::new();
    map.insert("content-type", http::HeaderValue::from_static("application/json"));
    for (name, value) in headers {
        map.insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(value).unwrap(),
        );
    }
    let route = compactor::route::Route::of(&http::Method::POST, path, &map);
    let head = compactor::upstream::RequestHead {
        route,
        method: http::Method::POST,
        uri: path.parse().unwrap(),
        headers: map,
        signed_body: None,
    };
    let prepared = REQUEST_PATH.runtime.block_on(REQUEST_PATH.compactor.prepare(
        &head,
        Bytes::copy_from_slice(body),
        "req-timing",
    ));
    prepared.report.is_some()
}

/// The body as a request to `path`.
fn prepared_at(path: &'static str) -> impl Fn(&[u8]) -> bool {
    move |body| prepares(path, &[], body)
}

/// The input as the value of header `name` on a request of `body` to `path`.
fn prepared_with_header(path: &'static str, name: &'static str, body: &'static str) -> impl Fn(&[u8]) -> bool {
    move |value| prepares(path, &[(name, value)], body.as_bytes())
}

/// A name of `n` characters that starts like a known one, in two-byte characters past its start
/// (so every cut of it can fall inside a character).
fn long_name(start: &str, n: usize) -> String {
    let mut name = start.to_string();
    name.extend(std::iter::repeat_n('é', n / 2));
    name
}

/// A value of `n` header-safe bytes.
fn long_value(n: usize) -> Vec<u8> {
    (0..n).map(|i| b"abcdefghijklmnopqrstuvwxyz0123456789-_"[i % 38]).collect()
}

const CHAT_PATH: &str = "/v1/chat/completions";
const MESSAGES_PATH: &str = "/v1/messages";
const RESPONSES_PATH: &str = "/v1/responses";
const SMALL_CHAT: &str =
    r#"{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#;

/// A chat turn that called `tool` under `id` and got its output back.
fn chat_with_call(model: &str, id: &str, tool: &str) -> Vec<u8> {
    let (model, id, tool) = (json_string(model), json_string(id), json_string(tool));
    format!(
        r#"{{"model":{model},"tools":[{{"type":"function","function":{{"name":{tool},"parameters":{{}}}}}}],"messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":{id},"type":"function","function":{{"name":{tool},"arguments":"{{}}"}}}}]}},{{"role":"tool","tool_call_id":{id},"content":"done"}},{{"role":"user","content":"thanks"}}]}}"#
    )
    .into_bytes()
}

fn anthropic_with_call(model: &str, id: &str, tool: &str) -> Vec<u8> {
    let (model, id, tool) = (json_string(model), json_string(id), json_string(tool));
    format!(
        r#"{{"model":{model},"max_tokens":100,"messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":[{{"type":"tool_use","id":{id},"name":{tool},"input":{{}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":{id},"content":"done"}}]}}]}}"#
    )
    .into_bytes()
}

fn responses_with_call(model: &str, id: &str, tool: &str) -> Vec<u8> {
    let (model, id, tool) = (json_string(model), json_string(id), json_string(tool));
    format!(
        r#"{{"model":{model},"input":[{{"type":"message","role":"user","content":"go"}},{{"type":"function_call","call_id":{id},"name":{tool},"arguments":"{{}}"}},{{"type":"function_call_output","call_id":{id},"output":"done"}}]}}"#
    )
    .into_bytes()
}

fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

#[test]
fn every_scalar_a_client_chooses_costs_time_linear_in_its_length() {
    assert_linear(vec![
        shape(
            "chat, a model name of n characters",
            |n| chat_with_call(&long_name("gpt-4o-", n), "c1", "run"),
            prepared_at(CHAT_PATH),
        ),
        shape(
            "anthropic, a model name of n characters",
            |n| anthropic_with_call(&long_name("claude-sonnet-4.5-", n), "t1", "run"),
            prepared_at(MESSAGES_PATH),
        ),
        shape(
            "responses, a model name of n characters",
            |n| responses_with_call(&long_name("openai/gpt-5-", n), "f1", "run"),
            prepared_at(RESPONSES_PATH),
        ),
        shape(
            "chat, a call id of n characters",
            |n| chat_with_call("gpt-4o", &long_name("call_", n), "run"),
            prepared_at(CHAT_PATH),
        ),
        shape(
            "anthropic, a tool_use id of n characters",
            |n| anthropic_with_call("claude-sonnet-4-5", &long_name("toolu_", n), "run"),
            prepared_at(MESSAGES_PATH),
        ),
        shape(
            "responses, a call_id of n characters",
            |n| responses_with_call("gpt-5", &long_name("fc_", n), "run"),
            prepared_at(RESPONSES_PATH),
        ),
        shape(
            "chat, a tool name of n characters",
            |n| chat_with_call("gpt-4o", "c1", &long_name("run_", n)),
            prepared_at(CHAT_PATH),
        ),
        shape(
            "anthropic, a tool name of n characters",
            |n| anthropic_with_call("claude-sonnet-4-5", "t1", &long_name("read_", n)),
            prepared_at(MESSAGES_PATH),
        ),
        shape(
            "responses, a tool name of n characters",
            |n| responses_with_call("gpt-5", "f1", &long_name("shell_", n)),
            prepared_at(RESPONSES_PATH),
        ),
        shape(
            "chat, a prompt_cache_key of n characters",
            |n| {
                let key = json_string(&long_name("session-", n));
                format!(
                    r#"{{"model":"gpt-4o","prompt_cache_key":{key},"messages":[{{"role":"user","content":"hi"}}]}}"#
                )
                .into_bytes()
            },
            prepared_at(CHAT_PATH),
        ),
        shape(
            "anthropic, a metadata.user_id of n characters",
            |n| {
                let user =
                    json_string(&format!("user_{}_account_x_session_{}", long_name("", n / 2), long_name("", n / 2)));
                format!(r#"{{"model":"claude-sonnet-4-5","max_tokens":10,"metadata":{{"user_id":{user}}},"messages":[{{"role":"user","content":"hi"}}]}}"#)
                    .into_bytes()
            },
            prepared_at(MESSAGES_PATH),
        ),
        shape("a session header of n bytes", long_value, prepared_with_header(CHAT_PATH, "x-session-id", SMALL_CHAT)),
        shape(
            "Claude Code's session header of n bytes",
            long_value,
            prepared_with_header(
                MESSAGES_PATH,
                "x-claude-code-session-id",
                r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#,
            ),
        ),
        shape(
            "a bearer credential of n bytes",
            |n| [b"Bearer ".as_slice(), &long_value(n)].concat(),
            prepared_with_header(CHAT_PATH, "authorization", SMALL_CHAT),
        ),
        shape(
            "an x-api-key of n bytes",
            long_value,
            prepared_with_header(
                MESSAGES_PATH,
                "x-api-key",
                r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#,
            ),
        ),
    ]);
}
