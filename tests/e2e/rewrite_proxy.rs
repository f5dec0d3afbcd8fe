//! Rewriting through the proxy: a strict upstream that rejects broken tool pairs as the providers
//! do, pruning that stays put across the turns of a session, and the figures clients can see.

use crate::common::*;
use serde_json::{Value, json};

/// Whether a message's content is the placeholder of a pruned output of the `run` calls here.
fn pruned(content: &Value) -> bool {
    content.as_str().is_some_and(|text| cleared(text, "run", "{}"))
}
const SMALL_WINDOWS: &str = "[prune]\nprotect_tokens = 300\nminimum_tokens = 100\n";

fn chat(outputs: &[(&str, String)]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Fix the build."})];
    for (id, text) in outputs {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

/// A request of session `session`, with both dialects' credentials.
async fn post(proxy: &ProxyProcess, path: &str, session: &str, body: &Value) -> Answer {
    let headers = [
        ("authorization", "Bearer sk-user"),
        ("x-api-key", "sk-user"),
        ("x-session-id", session),
        ("content-type", "application/json"),
    ];
    proxy.post(path, &headers, body).await
}

#[tokio::test]
async fn broken_tool_pairs_are_repaired_before_a_strict_upstream_sees_them() {
    let fake = FakeUpstream::builder().strict_pairing().start().await;
    let proxy = ProxyProcess::start(&fake, "");
    let openai = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "user", "content": "stop, do something else"},
        {"role": "tool", "tool_call_id": "call_ghost", "content": "orphan"}
    ]});
    let anthropic = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "text", "text": "interrupted"}]}
    ]});

    // The fake really is strict: straight to it, both are rejected with the providers' words.
    let direct = fake.direct("/v1/chat/completions", serde_json::to_vec(&openai).unwrap()).await;
    assert_eq!(direct.status, 400);
    assert!(direct.text().contains("did not have response messages: call_1"));
    let direct = fake.direct("/v1/messages", serde_json::to_vec(&anthropic).unwrap()).await;
    assert_eq!(direct.status, 400);
    assert!(direct.text().contains("without `tool_result` blocks immediately after"));

    let through = post(&proxy, "/v1/chat/completions", "s1", &openai).await;
    assert_eq!(through.status, 200, "{}", through.text());
    let sent = fake.last().json();
    assert_eq!(sent["messages"][2], json!({"role": "tool", "tool_call_id": "call_1", "content": "aborted"}));
    assert_eq!(sent["messages"].as_array().unwrap().len(), 4, "the orphan is gone");

    let through = post(&proxy, "/v1/messages", "s2", &anthropic).await;
    assert_eq!(through.status, 200, "{}", through.text());
    assert_eq!(fake.last().json()["messages"][2]["content"][0]["tool_use_id"], "toolu_1");
}

#[tokio::test]
async fn pruning_is_visible_in_headers_and_untouched_messages_arrive_byte_identical() {
    let (fake, proxy) = ProxyProcess::with_fake(SMALL_WINDOWS).await;
    let body = chat(&[
        ("call_a", tool_output("a", 200)),
        ("call_b", tool_output("b", 200)),
        ("call_c", tool_output("c", 400)),
    ]);
    let client_bytes = serde_json::to_vec(&body).unwrap();
    let answer = post(&proxy, "/v1/chat/completions", "s", &body).await;
    assert_eq!(answer.status, 200);
    let before: u32 = answer.header("x-compactor-tokens-before").unwrap().parse().unwrap();
    let after: u32 = answer.header("x-compactor-tokens-after").unwrap().parse().unwrap();
    assert!(after < before, "{after} < {before}");
    assert_eq!(answer.header("x-compactor-pruned"), Some("2"));
    assert!(answer.header("x-compactor-session").is_some());

    let upstream = fake.last();
    let sent = upstream.json();
    assert!(pruned(&sent["messages"][2]["content"]), "{}", sent["messages"][2]["content"]);
    assert!(pruned(&sent["messages"][4]["content"]), "{}", sent["messages"][4]["content"]);
    // Every message the policies did not touch is the client's exact bytes.
    let client = String::from_utf8(client_bytes).unwrap();
    let forwarded = String::from_utf8(upstream.body.to_vec()).unwrap();
    for index in [0usize, 1, 3, 5, 6] {
        let raw = serde_json::to_string(&body["messages"][index]).unwrap();
        assert!(client.contains(&raw) && forwarded.contains(&raw), "message {index} changed");
    }

    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    assert!(metrics.contains(r#"compactor_tool_outputs_total{action="pruned"} 2"#), "{metrics}");
    assert!(metrics.contains(r#"compactor_tokens_saved_total{step="prune"}"#), "{metrics}");
    let line = proxy.wait_for_log("route=chat_completions").await;
    assert!(line.contains("pruned=2"), "{line}");
}

#[tokio::test]
async fn pruning_is_monotonic_across_the_turns_of_a_session() {
    let (fake, proxy) = ProxyProcess::with_fake(SMALL_WINDOWS).await;
    let mut outputs =
        vec![("call_a", tool_output("a", 200)), ("call_b", tool_output("b", 200)), ("call_c", tool_output("c", 400))];
    post(&proxy, "/v1/chat/completions", "agent-1", &chat(&outputs)).await;
    let first = fake.last().json();
    assert!(pruned(&first["messages"][2]["content"]), "{}", first["messages"][2]["content"]);

    // Next turn: the same history plus one more call. The rewritten prefix is byte-stable.
    outputs.push(("call_d", tool_output("d", 50)));
    post(&proxy, "/v1/chat/completions", "agent-1", &chat(&outputs)).await;
    let second = fake.last();
    let first_messages: Vec<String> =
        first["messages"].as_array().unwrap().iter().map(|m| serde_json::to_string(m).unwrap()).collect();
    let second_json = second.json();
    for (index, message) in first_messages.iter().enumerate() {
        assert_eq!(&serde_json::to_string(&second_json["messages"][index]).unwrap(), message, "message {index} moved");
    }

    // The agent rewinds to an early point: on their own these outputs would not be pruned, but
    // the session remembers they were.
    let rewound = chat(&outputs[..2]);
    post(&proxy, "/v1/chat/completions", "agent-1", &rewound).await;
    let sent = fake.last().json();
    assert!(pruned(&sent["messages"][2]["content"]), "{}", sent["messages"][2]["content"]);
    assert!(pruned(&sent["messages"][4]["content"]), "{}", sent["messages"][4]["content"]);
    // Another session with the same history starts afresh.
    post(&proxy, "/v1/chat/completions", "agent-2", &rewound).await;
    assert_eq!(fake.last().body, serde_json::to_vec(&rewound).unwrap());
}

#[tokio::test]
async fn each_step_can_be_turned_off() {
    let fake = FakeUpstream::start().await;
    let proxy = ProxyProcess::start(
        &fake,
        &format!("{SMALL_WINDOWS}enabled = false\n[truncate]\nenabled = false\n[repair]\nenabled = false\n"),
    );
    let body = chat(&[
        ("call_a", tool_output("a", 200)),
        ("call_b", tool_output("b", 200)),
        ("call_c", tool_output("c", 12_000)),
    ]);
    let answer = post(&proxy, "/v1/chat/completions", "s", &body).await;
    assert_eq!(fake.last().body, serde_json::to_vec(&body).unwrap());
    assert_eq!(answer.header("x-compactor-pruned"), Some("0"));
}

#[tokio::test]
async fn a_body_compactor_cannot_parse_is_forwarded_as_it_came() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    for body in [
        &b"{not json"[..],
        br#"{"model":"gpt-4o","messages":"oops"}"#,
        br#"{"model":"gpt-4o","input":"responses-style"}"#,
    ] {
        send(request("POST", &proxy.url("/v1/chat/completions"), &[], body)).await;
        assert_eq!(fake.last().body, body);
        send(request("POST", &proxy.url("/v1/messages"), &[], body)).await;
        assert_eq!(fake.last().body, body);
    }
}

fn conversation_fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/conversations/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[tokio::test]
async fn recorded_agent_conversations_shrink_and_still_pass_a_strict_upstream() {
    let fake = FakeUpstream::builder().strict_pairing().start().await;
    let proxy = ProxyProcess::start(&fake, "");
    for (name, path) in [
        ("anthropic_claude_code_long.json", "/v1/messages?beta=true"),
        ("openai_chat_agent_long.json", "/v1/chat/completions"),
    ] {
        let body = conversation_fixture(name);
        let answer =
            send(request("POST", &proxy.url(path), &[("x-api-key", "k"), ("authorization", "Bearer k")], body.clone()))
                .await;
        assert_eq!(answer.status, 200, "{name}: {}", answer.text());
        let before: u32 = answer.header("x-compactor-tokens-before").unwrap().parse().unwrap();
        let after: u32 = answer.header("x-compactor-tokens-after").unwrap().parse().unwrap();
        assert!(before > 150_000, "{name}: {before}");
        assert!(after < before * 3 / 4, "{name}: {before} -> {after}");
        let sent = fake.last();
        assert!(sent.body.len() < body.len());
        let client: Value = serde_json::from_slice(&body).unwrap();
        let forwarded = sent.json();
        let (client_messages, sent_messages) =
            (client["messages"].as_array().unwrap(), forwarded["messages"].as_array().unwrap());
        assert_eq!(client_messages.len(), sent_messages.len());
        for (c, s) in client_messages.iter().zip(sent_messages) {
            if c["role"] == "assistant" {
                // Assistant turns (thinking blocks with signatures, tool calls) arrive untouched.
                assert_eq!(c, s);
            }
        }
        let text = String::from_utf8_lossy(&sent.body);
        for marker in ["ZEPHYR-LANTERN-42", "COBALT-HERON-19", "FINAL-KESTREL-55"] {
            assert!(text.contains(marker), "{name}: user text with {marker} must survive");
        }
    }
}

#[tokio::test]
async fn recorded_broken_pairs_are_repaired_for_a_strict_upstream() {
    let fake = FakeUpstream::builder().strict_pairing().start().await;
    let proxy = ProxyProcess::start(&fake, "");
    for (name, path) in
        [("anthropic_broken_pairs.json", "/v1/messages"), ("openai_broken_pairs.json", "/v1/chat/completions")]
    {
        let body = conversation_fixture(name);
        let direct = fake.direct(path, body.clone()).await;
        assert_eq!(direct.status, 400, "{name} must be broken to begin with");
        let answer = send(request("POST", &proxy.url(path), &[("x-api-key", "k")], body)).await;
        assert_eq!(answer.status, 200, "{name}: {}", answer.text());
    }
}

/// The metric line of the prefix reuse counter for `route` and `outcome`.
fn reuse_count(metrics: &str, route: &str, outcome: &str) -> Option<u64> {
    let key = format!(r#"compactor_prefix_reuse_total{{route="{route}",outcome="{outcome}"}} "#);
    metrics.lines().find_map(|line| line.strip_prefix(&key)).and_then(|n| n.trim().parse().ok())
}

#[tokio::test]
async fn a_sessions_next_turn_reuses_the_last_parse_and_the_upstream_gets_the_same_bytes() {
    let fake = FakeUpstream::start().await;
    // Every turn through the cache, however small its body.
    let reusing = ProxyProcess::start(&fake, &format!("{SMALL_WINDOWS}[limits]\nprefix_min_bytes = 0\n"));
    let fresh = ProxyProcess::start(&fake, &format!("{SMALL_WINDOWS}[limits]\nprefix_cache_bytes = 0\n"));
    let at_start = send(request("GET", &reusing.url("/metrics"), &[], "")).await.text();
    assert_eq!(reuse_count(&at_start, "chat_completions", "hit"), Some(0), "{at_start}");
    assert_eq!(reuse_count(&at_start, "messages", "miss"), Some(0), "{at_start}");

    let ids = ["call_1", "call_2", "call_3", "call_4", "call_5", "call_6"];
    let outputs: Vec<(&str, String)> = ids.iter().map(|id| (*id, tool_output(id, 400))).collect();
    for turn in 1..=outputs.len() {
        let openai = chat(&outputs[..turn]);
        let mut anthropic =
            json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": "Be brief.", "messages": []});
        for (id, text) in &outputs[..turn] {
            let messages = anthropic["messages"].as_array_mut().unwrap();
            messages.push(json!({"role": "user", "content": format!("run {id}")}));
            messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "ls"}}]}));
            messages.push(
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": text}]}),
            );
        }
        for (path, body) in [("/v1/chat/completions", &openai), ("/v1/messages", &anthropic)] {
            assert_eq!(post(&reusing, path, "reuse", body).await.status, 200);
            let through_reuse = fake.last().body;
            assert_eq!(post(&fresh, path, "reuse", body).await.status, 200);
            assert_eq!(through_reuse, fake.last().body, "turn {turn} of {path}: the same bytes upstream");
        }
    }

    let metrics = send(request("GET", &reusing.url("/metrics"), &[], "")).await.text();
    for route in ["chat_completions", "messages"] {
        assert_eq!(reuse_count(&metrics, route, "miss"), Some(1), "only the first turn is parsed whole: {metrics}");
        assert_eq!(reuse_count(&metrics, route, "hit"), Some(5), "{metrics}");
    }
    let metrics = send(request("GET", &fresh.url("/metrics"), &[], "")).await.text();
    assert_eq!(reuse_count(&metrics, "chat_completions", "hit"), Some(0), "a cache of 0 bytes is off: {metrics}");
}
