//! Hostile request bodies through the real binary: anyone who reaches compactor's port can send
//! it anything, and no body may cost more than time linear in its size or stall the other requests.

use std::time::{Duration, Instant};

use crate::common::*;

/// 100,000 extra fields `,"k0":0,…` (about 1 MB).
fn hundred_thousand_fields() -> String {
    (0..100_000).map(|i| format!(",\"k{i}\":{i}")).collect()
}

/// Bodies of about 1 MB whose objects hold 100,000 keys, in the places a parser walks.
fn hostile_bodies() -> Vec<(&'static str, &'static str, String)> {
    let fields = hundred_thousand_fields();
    vec![
        (
            "chat, 100,000 top-level keys",
            "/v1/chat/completions",
            format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"}}]{fields}}}"#),
        ),
        (
            "chat, one message with 100,000 keys",
            "/v1/chat/completions",
            format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"{fields}}}]}}"#),
        ),
        (
            "messages, one content block with 100,000 keys",
            "/v1/messages",
            format!(
                r#"{{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{{"role":"user","content":[{{"type":"text","text":"hi"{fields}}}]}}]}}"#
            ),
        ),
        (
            "chat, 100,000 keys and a duplicate at the end",
            "/v1/chat/completions",
            format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"}}]{fields},"k0":0}}"#),
        ),
    ]
}

#[tokio::test]
async fn objects_with_100000_keys_are_answered_quickly_and_healthz_stays_responsive() {
    let _machine = crate::one_at_a_time();
    let (fake, proxy) = proxy_with_fixed_answers().await;
    let bodies = hostile_bodies();

    // Alone, each body is answered (nothing in it to rewrite: forwarded as it came) well within a
    // second: about 0.1-0.2 s in a debug build (the pairwise duplicate check took 28 s in release).
    each_alone_is_forwarded_within(&proxy, &fake, &bodies, Duration::from_millis(1000)).await;

    // Two at once, the case that stalled a 2-core instance: /healthz is polled meanwhile. Bodies
    // this large are parsed off the async workers (`compactor::work`), but the two parses still
    // share the machine's two cores with the health check (~0.2 s each in a debug build, more on
    // a loaded machine); the pairwise check held a worker for 28 s per request in a release build.
    let slowest_health = slowest_health_while(&proxy, bodies.iter().take(2), Duration::from_millis(10)).await;
    assert!(slowest_health < Duration::from_secs(2), "/healthz took {slowest_health:?} under hostile load");
}

/// A fake upstream with a fixed answer per dialect (it shares the test's cores and should not
/// parse megabyte bodies), compactor in front of it, and the tokenizer loaded by a first request
/// (that one-time cost is not what these tests measure).
async fn proxy_with_fixed_answers() -> (FakeUpstream, ProxyProcess) {
    let fake = FakeUpstream::start().await;
    fake.respond_with(|received| {
        let answer = if received.path_and_query.starts_with("/v1/messages") {
            r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}"#
        } else {
            r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}"#
        };
        Some(Reply::json(200, serde_json::from_str(answer).unwrap()))
    });
    let proxy = ProxyProcess::start(&fake, "");
    let warm_up = send(request("POST", &proxy.url("/v1/chat/completions"), &[], chat_body(false))).await;
    assert_eq!(warm_up.status, 200);
    (fake, proxy)
}

/// Sends each body alone: answered 200 within `bound`, and gone upstream as it came.
async fn each_alone_is_forwarded_within(
    proxy: &ProxyProcess,
    fake: &FakeUpstream,
    bodies: &[(&str, &str, String)],
    bound: Duration,
) {
    for (name, path, body) in bodies {
        let started = Instant::now();
        let answer =
            send(request("POST", &proxy.url(path), &[("content-type", "application/json")], body.clone())).await;
        let took = started.elapsed();
        assert_eq!(answer.status, 200, "{name}: {}", answer.text());
        assert_eq!(fake.last().body, body.as_bytes(), "{name}: the body went upstream as it came");
        assert!(took < bound, "{name}: answered in {took:?}");
    }
}

/// Sends `bodies` all at once and polls /healthz every `poll` until they are answered (each 200);
/// the slowest health answer.
async fn slowest_health_while<'b>(
    proxy: &ProxyProcess,
    bodies: impl Iterator<Item = &'b (&'b str, &'b str, String)>,
    poll: Duration,
) -> Duration {
    let hostile: Vec<_> = bodies
        .map(|(_, path, body)| {
            let request = request("POST", &proxy.url(path), &[("content-type", "application/json")], body.clone());
            tokio::spawn(async move { send(request).await.status })
        })
        .collect();
    let mut slowest_health = Duration::ZERO;
    while !hostile.iter().all(|task| task.is_finished()) {
        let started = Instant::now();
        assert_eq!(send(request("GET", &proxy.url("/healthz"), &[], "")).await.status, 200);
        slowest_health = slowest_health.max(started.elapsed());
        tokio::time::sleep(poll).await;
    }
    for task in hostile {
        assert_eq!(task.await.unwrap(), 200);
    }
    slowest_health
}

/// A JSON string of `n` bytes that starts like a known name.
fn long_json_string(start: &str, n: usize) -> String {
    serde_json::Value::from(format!("{start}{}", "x".repeat(n))).to_string()
}

const LONG: usize = 320 * 1024;

/// Requests whose scalars (the model, a call id) are 320 KB each: nothing compactor counts.
fn oversized_scalars() -> Vec<(&'static str, &'static str, String)> {
    let model = long_json_string("gpt-4o-", LONG);
    let id = long_json_string("call_", LONG);
    vec![
        (
            "chat, a 320 KB model name",
            "/v1/chat/completions",
            format!(r#"{{"model":{model},"messages":[{{"role":"user","content":"hi"}}]}}"#),
        ),
        (
            "messages, a 320 KB model name",
            "/v1/messages",
            format!(
                r#"{{"model":{},"max_tokens":10,"messages":[{{"role":"user","content":"hi"}}]}}"#,
                long_json_string("claude-sonnet-4.5-", LONG)
            ),
        ),
        (
            "chat, a 320 KB call id",
            "/v1/chat/completions",
            format!(
                r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":{id},"type":"function","function":{{"name":"run","arguments":"{{}}"}}}}]}},{{"role":"tool","tool_call_id":{id},"content":"ok"}}]}}"#
            ),
        ),
    ]
}

#[tokio::test]
async fn a_320_kb_model_name_or_id_is_answered_in_milliseconds_and_healthz_stays_fast() {
    let _machine = crate::one_at_a_time();
    let (fake, proxy) = proxy_with_fixed_answers().await;
    let bodies = oversized_scalars();

    // Alone, each is answered in milliseconds (a debug build reads 320 KB in a few); the model
    // lookup that hashed every prefix of the name took 4 s for this one in a release build.
    each_alone_is_forwarded_within(&proxy, &fake, &bodies, Duration::from_millis(300)).await;

    // All at once, twice over, while /healthz is polled: the health check never waits behind them.
    let slowest_health =
        slowest_health_while(&proxy, bodies.iter().chain(bodies.iter()), Duration::from_millis(5)).await;
    assert!(slowest_health < Duration::from_millis(300), "/healthz took {slowest_health:?} under hostile load");
}

#[tokio::test]
async fn a_64_kb_session_header_and_credential_are_answered_in_milliseconds() {
    let _machine = crate::one_at_a_time();
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    let warm_up = send(request("POST", &proxy.url("/v1/chat/completions"), &[], chat_body(false))).await;
    assert_eq!(warm_up.status, 200);
    let long = "s".repeat(64 * 1024);
    let bearer = format!("Bearer {long}");
    for (name, value) in [("x-session-id", long.as_str()), ("authorization", bearer.as_str())] {
        let started = Instant::now();
        let answer =
            send(request("POST", &proxy.url("/v1/chat/completions"), &[(name, value)], chat_body(false))).await;
        let took = started.elapsed();
        assert_eq!(answer.status, 200, "{name}: {}", answer.text());
        assert_eq!(fake.last().headers.get(name).map(|v| v.len()), Some(value.len()), "{name} went upstream");
        assert!(took < Duration::from_millis(300), "{name}: answered in {took:?}");
    }
}

/// A request whose tool name is 320 KB of two-byte characters (any cut of it can fall inside
/// one). A tool name is text the model reads: counted like any other, on a blocking thread.
fn oversized_tool_name() -> Vec<(&'static str, &'static str, String)> {
    let tool = serde_json::Value::from(format!("run_{}", "é".repeat(LONG / 2))).to_string();
    vec![(
        "chat, a 320 KB tool name",
        "/v1/chat/completions",
        format!(
            r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_1","type":"function","function":{{"name":{tool},"arguments":"{{}}"}}}}]}},{{"role":"tool","tool_call_id":"call_1","content":"ok"}}]}}"#
        ),
    )]
}

#[tokio::test]
async fn a_320_kb_tool_name_is_counted_off_the_async_workers_and_healthz_stays_fast() {
    let _machine = crate::one_at_a_time();
    let (fake, proxy) = proxy_with_fixed_answers().await;
    let bodies = oversized_tool_name();
    // Counting 320 KB is the tokenizer's work (about 0.1 s in a debug build on an idle machine,
    // 0.4 s on a loaded one); what matters is that it is bounded and holds no async worker.
    each_alone_is_forwarded_within(&proxy, &fake, &bodies, Duration::from_secs(3)).await;
    let slowest_health =
        slowest_health_while(&proxy, bodies.iter().chain(bodies.iter()), Duration::from_millis(5)).await;
    assert!(
        slowest_health < Duration::from_millis(300),
        "/healthz took {slowest_health:?} while tool names were counted"
    );
}
