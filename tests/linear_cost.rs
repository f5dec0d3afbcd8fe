//! Reading a request costs time linear in its size, whatever shape a hostile client gives it:
//! doubling the input about doubles the time (issue 9). Each shape is sized so one run takes tens
//! of milliseconds in a debug build; n, 2n and 4n are timed in turn, five rounds, and the fastest
//! run of each size is compared: 4n must cost well under the 16x a quadratic step would. Taking
//! the sizes in turn spreads a busy moment of a shared machine over all three.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use compactor::dialect::{Dialect, ParsedRequest};
use compactor::json::RawObject;

/// One run must last at least this long for the timing to mean something.
const CALIBRATED_RUN: Duration = Duration::from_millis(50);
/// Past this size a shape is plainly fast enough; calibration stops there.
const LARGEST_N: usize = 1 << 22;
/// 4n against n: linear is 4, quadratic 16. The bound sits at their geometric mean: a loaded 2-core
/// machine and allocator growth push linear runs past 6x at times, while quadratic code lands near 16x.
const MAX_RATIO_AT_4N: f64 = 8.0;
/// Rounds of n, 2n, 4n; the fastest run of each size counts.
const ROUNDS: usize = 5;

/// `n` extra fields `"k0":0,"k1":1,…` ready to splice into an object.
fn many_fields(n: usize) -> String {
    let mut out = String::with_capacity(n * 12);
    for i in 0..n {
        out.push_str(&format!(",\"k{i}\":{i}"));
    }
    out
}

/// A shape of hostile body: how to build one of size `n`, and the step that reads it.
struct Shape {
    name: &'static str,
    body: fn(usize) -> Vec<u8>,
    read: fn(&[u8]) -> bool,
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "one object with n keys",
            body: |n| format!("{{\"a\":0{}}}", many_fields(n)).into_bytes(),
            read: |body| serde_json::from_slice::<RawObject>(body).is_ok(),
        },
        Shape {
            name: "a chat request with n top-level keys",
            body: |n| {
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{}}}"#, many_fields(n))
                    .into_bytes()
            },
            read: |body| ParsedRequest::parse(Dialect::ChatCompletions, body).is_some(),
        },
        Shape {
            name: "a chat message with n keys",
            body: |n| {
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"{}}}]}}"#, many_fields(n))
                    .into_bytes()
            },
            read: |body| ParsedRequest::parse(Dialect::ChatCompletions, body).is_some(),
        },
        Shape {
            name: "an anthropic content block with n keys",
            body: |n| {
                format!(
                    r#"{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":[{{"type":"text","text":"hi"{}}}]}}]}}"#,
                    many_fields(n)
                )
                .into_bytes()
            },
            read: |body| ParsedRequest::parse(Dialect::AnthropicMessages, body).is_some(),
        },
        Shape {
            name: "a responses request with n input items",
            body: |n| {
                let item = r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}"#;
                format!(r#"{{"model":"m","input":[{}]}}"#, vec![item; n.max(1)].join(",")).into_bytes()
            },
            read: |body| ParsedRequest::parse(Dialect::Responses, body).is_some(),
        },
    ]
}

/// How long one `read` of `body` takes.
fn time_one(read: fn(&[u8]) -> bool, body: &[u8]) -> Duration {
    let start = Instant::now();
    assert!(read(body), "the body must be readable, or the timing measures a refusal");
    start.elapsed()
}

/// The fastest run of each body over [`ROUNDS`] rounds that take the bodies in turn.
fn fastest_in_turn(read: fn(&[u8]) -> bool, bodies: &[Vec<u8>]) -> Vec<Duration> {
    let mut fastest = vec![Duration::MAX; bodies.len()];
    for _ in 0..ROUNDS {
        for (best, body) in fastest.iter_mut().zip(bodies) {
            *best = (*best).min(time_one(read, body));
        }
    }
    fastest
}

#[test]
fn reading_a_request_costs_time_linear_in_its_size() {
    let mut report = Vec::new();
    let mut too_slow = Vec::new();
    // One shape at a time: tests in this binary run in parallel, and timings need the cores.
    for shape in shapes() {
        let mut n = 1_000;
        // Calibrated on the fastest of five runs, so one slow run on a busy machine does not
        // leave the sizes too small to time.
        while fastest_in_turn(shape.read, &[(shape.body)(n)])[0] < CALIBRATED_RUN && n < LARGEST_N {
            n *= 2;
        }
        let bodies: Vec<Vec<u8>> = [n, 2 * n, 4 * n].into_iter().map(shape.body).collect();
        let times = fastest_in_turn(shape.read, &bodies);
        let (base, double, quadruple) = (times[0], times[1], times[2]);
        let ratio = quadruple.as_secs_f64() / base.as_secs_f64();
        let line = format!(
            "{}: n={n} {:.1} ms, 2n {:.1} ms ({:.2}x), 4n {:.1} ms ({ratio:.2}x)",
            shape.name,
            base.as_secs_f64() * 1e3,
            double.as_secs_f64() * 1e3,
            double.as_secs_f64() / base.as_secs_f64(),
            quadruple.as_secs_f64() * 1e3,
        );
        eprintln!("{line}");
        if ratio >= MAX_RATIO_AT_4N {
            too_slow.push(line.clone());
        }
        report.push(line);
    }
    assert!(too_slow.is_empty(), "not linear:\n{}\n\nall shapes:\n{}", too_slow.join("\n"), report.join("\n"));
}
