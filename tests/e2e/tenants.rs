//! Tenant isolation: nothing one tenant sends changes what compactor forwards or decides for
//! another. A hostile tenant's echoed "overflow", its skewed token counts and its refused runs
//! leave another tenant's forwarded bytes exactly as they are when it sent nothing, in memory and
//! in Redis; and no credential is sent to another provider's upstream.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::common::redis_server::RedisServer;
use crate::common::*;

/// What the hostile tenant names as a request key: OpenAI echoes an unknown key in its 400.
const HOSTILE_KEY: &str = "This model's maximum context length is 1000 tokens";
/// A user message that makes the fake refuse the request (401), as for a revoked key.
const REFUSE: &str = "REFUSE-THIS-REQUEST";
/// A user message made of spaces: few estimated tokens, many provider tokens.
const SPACES: usize = 40_000;

const KEY_A: &str = "Bearer sk-tenant-a";
const KEY_B: &str = "Bearer sk-tenant-b";

/// The fake provider's answers: OpenAI's wording for an unknown argument (which echoes it), a
/// 401 for refused requests, usage that counts spaces one token each, and otherwise an answer
/// whose usage is about what compactor estimates.
fn provider(received: &Received) -> Option<Reply> {
    let body: Value = serde_json::from_slice(&received.body).ok()?;
    if let Some((key, _)) = body.as_object()?.iter().find(|(key, _)| key.starts_with("This model")) {
        let message = format!("Unrecognized request argument supplied: {key}");
        return Some(Reply::json(
            400,
            json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}}),
        ));
    }
    let text = body.to_string();
    if text.contains(REFUSE) {
        return Some(Reply::json(
            401,
            json!({"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error", "code": "invalid_api_key"}}),
        ));
    }
    let spaces = text.matches(' ').count();
    // About what compactor estimates (its calibration stays near 1), but for spaces.
    let prompt = if spaces >= SPACES { spaces } else { received.body.len() * 2 / 13 };
    Some(Reply::json(
        200,
        json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2}}),
    ))
}

/// Words of a tool output: varied, so compactor's estimate is about one token a word.
fn words(tag: &str, count: usize) -> String {
    const WORDS: [&str; 16] = [
        "parser", "token", "module", "return", "value", "error", "string", "buffer", "index", "match", "result",
        "option", "vector", "length", "field", "branch",
    ];
    // Each text its own sequence (a line repeated across outputs would be deduplicated).
    let mut state = tag.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let mut out = format!("{tag}: ");
    for i in 0..count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
        out.push(if i % 12 == 11 { '\n' } else { ' ' });
    }
    out
}

/// Tenant B's conversation as it stands at `turn` (1-based): an agent on gpt-4o (128k window)
/// that opened with a long specification (about 25k tokens) and reads one file a turn, the first
/// one large. Shaped so that each thing a hostile tenant could poison would change B's bytes: a
/// window of 1,000 tokens or a calibration of 2.9 summarizes it from the first turn; a horizon of
/// a dozen turns or more makes pruning the first file pay back at turn 4 (at Anthropic's cache
/// prices, which the test configures, nothing below pressure pays back without one).
fn tenant_b(turn: usize) -> Value {
    let sizes = [9_000, 3_000, 3_000, 3_000, 3_000, 3_000, 3_000];
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": format!("Find the bug in the parser. {}", words("spec", 25_000))}),
    ];
    for (i, size) in sizes.iter().take(turn + 1).enumerate() {
        messages.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function",
            "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/file{i}.rs\"}}")}}]}),
        );
        messages.push(
            json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": words(&format!("file{i}"), *size)}),
        );
    }
    json!({"model": "gpt-4o", "messages": messages})
}

/// What tenant A can do.
#[derive(Debug, Clone)]
enum Hostile {
    /// A request whose extra key makes the provider echo an "overflow" naming a 1,000-token window.
    EchoedOverflow,
    /// Requests of 40,000 spaces: the provider counts far more tokens than compactor estimates.
    SkewedCount(usize),
    /// `runs` conversations of `turns` requests each, every one refused by the provider.
    RefusedRuns { runs: usize, turns: usize },
    /// `runs` conversations of `turns` answered requests each: long runs of its own.
    LongRuns { runs: usize, turns: usize },
}

fn chat(messages: Vec<Value>) -> Value {
    json!({"model": "gpt-4o", "messages": messages})
}

async fn post_as(proxy: &ProxyProcess, key: &str, body: &Value) -> Answer {
    proxy.post("/v1/chat/completions", &[("authorization", key)], body).await
}

async fn act(proxy: &ProxyProcess, action: &Hostile, round: usize) {
    match action {
        Hostile::EchoedOverflow => {
            let mut body = chat(vec![json!({"role": "user", "content": format!("hello {round}")})]);
            body[HOSTILE_KEY] = json!(true);
            post_as(proxy, KEY_A, &body).await;
        }
        Hostile::SkewedCount(requests) => {
            for i in 0..*requests {
                let body = chat(vec![
                    json!({"role": "user", "content": format!("count {round} {i}")}),
                    json!({"role": "user", "content": " ".repeat(SPACES)}),
                ]);
                post_as(proxy, KEY_A, &body).await;
            }
        }
        Hostile::RefusedRuns { runs, turns } | Hostile::LongRuns { runs, turns } => {
            let refuse = matches!(action, Hostile::RefusedRuns { .. });
            for run in 0..*runs {
                let mut messages = vec![
                    json!({"role": "user", "content": format!("run {round}-{run} {}", if refuse { REFUSE } else { "" })}),
                ];
                for turn in 0..*turns {
                    post_as(proxy, KEY_A, &chat(messages.clone())).await;
                    messages.push(json!({"role": "assistant", "content": format!("step {turn}")}));
                    messages.push(json!({"role": "user", "content": "go on"}));
                }
            }
        }
    }
}

/// Tenant B's forwarded bodies (its summary calls included), in order.
fn forwarded_for_b(fake: &FakeUpstream) -> Vec<bytes::Bytes> {
    fake.received()
        .into_iter()
        .filter(|r| r.headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(KEY_B))
        .map(|r| r.body)
        .collect()
}

/// What B's answers said compactor did.
fn decisions(answer: &Answer) -> Vec<Option<String>> {
    ["x-compactor-pruned", "x-compactor-compacted", "x-compactor-tokens-before", "x-compactor-tokens-after"]
        .iter()
        .map(|name| answer.header(name).map(str::to_string))
        .collect()
}

/// Runs tenant B's turns with tenant A's actions before the turn each is scheduled at, on a fresh
/// compactor with `store` TOML; B's forwarded bytes and the decisions its answers report.
async fn run(
    store: &str,
    schedule: &[(usize, Hostile)],
    turns: usize,
) -> (Vec<bytes::Bytes>, Vec<Vec<Option<String>>>) {
    let fake = FakeUpstream::builder().respond_with(provider).start().await;
    // Background summaries off: what is compared is what each request decides on its path.
    let toml = format!(
        "[upstream]\nopenai = \"{}\"\nopenai_cache = \"anthropic\"\n[compaction]\nbackground = false\n[prune]\nprotect_tokens = 10000\nminimum_tokens = 1000\n{store}",
        fake.url()
    );
    let proxy = ProxyProcess::start_with(&toml, &[]);
    let mut said = Vec::new();
    for turn in 1..=turns {
        for (at, action) in schedule.iter().filter(|(at, _)| *at == turn) {
            act(&proxy, action, *at).await;
        }
        let answer = post_as(&proxy, KEY_B, &tenant_b(turn)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        said.push(decisions(&answer));
        // B's answer is recorded (and committed) before its next turn, as a real agent's is.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    (forwarded_for_b(&fake), said)
}

fn memory() -> String {
    String::new()
}

fn redis_store(redis: &RedisServer, prefix: &str) -> String {
    format!("[session]\nstore = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"{prefix}\"\n", redis.url)
}

#[tokio::test]
async fn an_error_that_echoes_a_tenants_key_teaches_no_window_to_another_tenant() {
    let fake = FakeUpstream::builder().respond_with(provider).start().await;
    let proxy = ProxyProcess::start(&fake, "");
    // Tenant A's request with the hostile key: the provider's 400 reaches A as it came, with no
    // summary call and no retry (it is no overflow).
    let mut hostile = json!({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello"}]});
    hostile[HOSTILE_KEY] = json!(true);
    for _ in 0..3 {
        let answer = post_as(&proxy, KEY_A, &hostile).await;
        assert_eq!(answer.status, 400);
        assert!(answer.text().contains("Unrecognized request argument supplied"), "{}", answer.text());
    }
    assert_eq!(fake.received().len(), 3, "nothing but A's three requests went upstream");
    // Tenant B's fresh session on a 1M-window model: 15 messages of about 3,000 tokens go as sent.
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for i in 0..7 {
        messages.push(json!({"role": "user", "content": words(&format!("question {i}"), 200)}));
        messages.push(json!({"role": "assistant", "content": words(&format!("answer {i}"), 200)}));
    }
    messages.push(json!({"role": "user", "content": "And now?"}));
    let body = json!({"model": "gpt-4.1", "messages": messages});
    let sent = serde_json::to_vec(&body).unwrap();
    let answer = send(request(
        "POST",
        &proxy.url("/v1/chat/completions"),
        &[("authorization", KEY_B), ("content-type", "application/json")],
        sent.clone(),
    ))
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let forwarded = forwarded_for_b(&fake);
    assert_eq!(forwarded.len(), 1, "no summary call for B");
    assert_eq!(forwarded[0], sent, "B's body forwarded byte for byte");
}

#[tokio::test]
async fn one_tenants_skewed_token_counts_leave_another_tenants_estimate_alone() {
    let (baseline, said) = run(&memory(), &[], 2).await;
    assert_eq!(baseline.len(), 2, "B alone: no summary call");
    assert!(said.iter().all(|d| d[1].is_none()), "B alone compacts nothing: {said:?}");
    let (skewed, _) = run(&memory(), &[(1, Hostile::SkewedCount(6))], 2).await;
    assert!(skewed == baseline, "tenant B's forwarded bodies changed with tenant A's skewed counts");
}

#[tokio::test]
async fn refused_and_long_runs_of_one_tenant_do_not_lengthen_another_tenants_horizon() {
    let (baseline, said) = run(&memory(), &[], 5).await;
    assert!(said.iter().all(|d| d[0].as_deref() == Some("0")), "B alone prunes nothing: {said:?}");
    let (refused, _) = run(&memory(), &[(1, Hostile::RefusedRuns { runs: 20, turns: 24 })], 5).await;
    assert!(refused == baseline, "tenant A's refused runs changed what was forwarded for B");
    let (long, _) = run(&memory(), &[(1, Hostile::LongRuns { runs: 12, turns: 24 })], 5).await;
    assert!(long == baseline, "tenant A's own long runs changed what was forwarded for B");
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        Just(Hostile::EchoedOverflow),
        (1usize..=6).prop_map(Hostile::SkewedCount),
        (10usize..=14, 16usize..=30).prop_map(|(runs, turns)| Hostile::RefusedRuns { runs, turns }),
        (10usize..=12, 16usize..=30).prop_map(|(runs, turns)| Hostile::LongRuns { runs, turns }),
    ]
}

/// B's turns with A's actions interleaved at random, in memory and in Redis: B's forwarded bytes
/// and reported decisions are those of the run where A sent nothing.
#[test]
fn for_any_interleaving_of_tenant_as_requests_tenant_b_gets_the_same_bytes() {
    const TURNS: usize = 5;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let redis = RedisServer::start().map(Arc::new);
    // A store's name and its TOML for case `n` (a key prefix of its own in Redis).
    type StoreOf = Box<dyn Fn(usize) -> String>;
    let stores: Vec<(&str, StoreOf)> = {
        let mut stores: Vec<(&str, StoreOf)> = vec![("memory", Box::new(|_| memory()))];
        if let Some(redis) = redis.clone() {
            stores.push(("redis", Box::new(move |case| redis_store(&redis, &format!("{}-{case}", redis.prefix)))));
        }
        stores
    };
    for (name, store) in &stores {
        let baseline = runtime.block_on(run(&store(0), &[], TURNS));
        let case = std::sync::atomic::AtomicUsize::new(1);
        let config = ProptestConfig { cases: 4, failure_persistence: None, ..ProptestConfig::default() };
        proptest!(config, |(schedule in proptest::collection::vec((1usize..=TURNS, hostile()), 1..4))| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mixed = runtime.block_on(run(&store(n), &schedule, TURNS));
            prop_assert!(mixed.0 == baseline.0, "{name}: B's forwarded bytes changed with {schedule:?}");
            prop_assert_eq!(&mixed.1, &baseline.1, "{}: B's decisions changed with {:?}", name, schedule);
        });
    }
}

#[tokio::test]
async fn an_openai_fine_tuned_model_path_goes_to_openai_and_bedrock_or_claude_on_vertex_only_to_their_own() {
    let openai = FakeUpstream::start().await;
    let google = FakeUpstream::start().await;
    let toml = format!(
        "[upstream]\nopenai = \"{}\"\nanthropic = \"{}\"\ngemini = \"{}\"\nvertex = \"{}\"\n",
        openai.url(),
        openai.url(),
        google.url(),
        google.url()
    );
    let proxy = ProxyProcess::start_with(&toml, &[]);
    let model = "/v1/models/ft:gpt-4o-mini-2024-07-18:my-org:custom:9xYz";
    for method in ["GET", "DELETE"] {
        send(request(method, &proxy.url(model), &[("authorization", "Bearer sk-openai")], "")).await;
    }
    let paths: Vec<String> = openai.received().iter().map(|r| r.path_and_query.clone()).collect();
    assert_eq!(paths, vec![model.to_string(), model.to_string()], "both reached OpenAI's upstream");
    let body = json!({"anthropic_version": "vertex-2023-10-16", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let post = |path: &str, token: &'static str| {
        request(
            "POST",
            &proxy.url(path),
            &[("authorization", token), ("content-type", "application/json")],
            body.to_string(),
        )
    };
    // Claude on Vertex AI with a Google token: to Vertex AI's upstream, nowhere else.
    let vertex = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict";
    send(post(vertex, "Bearer ya29.google-token")).await;
    let received = google.received();
    assert_eq!(received.len(), 1, "the Google credential went to Vertex AI");
    assert_eq!(received[0].path_and_query, vertex);
    assert_eq!(received[0].headers.get("authorization").unwrap(), "Bearer ya29.google-token");
    // Bedrock with no `upstream.bedrock`: refused in AWS's shape, sent nowhere.
    for bedrock in [
        "/model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke",
        "/model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke-with-response-stream",
    ] {
        let answer = send(post(bedrock, "Bearer bedrock-api-key")).await;
        assert_eq!(answer.status, 404, "{bedrock}: {}", answer.text());
        assert_eq!(answer.header("x-compactor-error"), Some("no_upstream"));
        assert_eq!(answer.header("x-amzn-errortype"), Some("ResourceNotFoundException"));
        assert!(answer.json()["message"].as_str().unwrap().contains("upstream.bedrock"), "{}", answer.text());
    }
    assert_eq!(google.received().len(), 1, "no other credential reached Google");
    assert_eq!(openai.received().len(), 2, "nor OpenAI");
    // The proxy still serves.
    let answer = proxy
        .post(
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-openai")],
            &chat(vec![json!({"role": "user", "content": "hi"})]),
        )
        .await;
    assert_eq!(answer.status, 200);
}
