//! OpenAI Responses (Codex CLI and every Responses client): the same care as the other dialects.
//! Items stay paired by call_id, reasoning items arrive byte for byte, stateful requests and the
//! agent's own compaction pass untouched, and overflow (plain or inside a 200 stream) is recovered.

use crate::common::window::{WindowSpec, window_upstream};
use crate::common::*;
use serde_json::{Value, json};

const REASONING: &str = r#"{"type":"reasoning","id":"rs_0a1b","summary":[{"type":"summary_text","text":"**Planning** the fix"}],"content":null,"encrypted_content":"gAAAAABo9x1Zk3r+EXAMPLE/opaque=="}"#;

fn filler(tag: &str, chars: usize) -> String {
    lines_until(chars, |i| format!("{tag} line {i}: compiled ok\n"))
}

/// A Codex-style stateless request: developer prompt first, then turns of reasoning, a call and
/// its output.
fn codex_body(turns: usize, output_chars: usize, stream: bool) -> Value {
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the build. Codename ZEPHYR-LANTERN-42."}]}),
    ];
    for t in 0..turns {
        let id = format!("call_{t:024}");
        input.push(serde_json::from_str(&REASONING.replace("rs_0a1b", &format!("rs_{t}"))).unwrap());
        input.push(json!({"type": "function_call", "name": "exec_command", "arguments": "{\"cmd\":\"cargo build\"}", "call_id": id}));
        let output = if t == 0 {
            format!("QUASAR-MAPLE-7\n{}", filler("t0", output_chars))
        } else {
            filler(&format!("t{t}"), output_chars)
        };
        input.push(json!({"type": "function_call_output", "call_id": id, "output": output}));
    }
    input.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Keep going."}]}));
    json!({"model": "gpt-5-codex", "instructions": null, "input": input, "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "store": false, "stream": stream, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199-conv"})
}

/// A request with the headers Codex CLI sends.
async fn post(proxy: &ProxyProcess, path: &str, body: &Value) -> Answer {
    let headers = [("authorization", "Bearer sk-codex"), ("session_id", "0199-conv"), ("originator", "codex_cli_rs")];
    proxy.post(path, &headers, body).await
}

#[tokio::test]
async fn an_unchanged_responses_request_arrives_byte_identical() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    let body = codex_body(3, 500, true);
    let answer = post(&proxy, "/v1/responses", &body).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.text(), fake::responses_stream(&["Hel", "lo"]).concat());
    assert_eq!(fake.last().body, serde_json::to_vec(&body).unwrap());
    assert!(answer.header("x-compactor-tokens-before").is_some());
}

#[tokio::test]
async fn pruning_and_repair_keep_every_call_id_paired_and_reasoning_byte_identical() {
    let fake = FakeUpstream::builder().strict_pairing().start().await;
    let proxy = ProxyProcess::start(&fake, "[prune]\nprotect_tokens = 2000\nminimum_tokens = 500\n");
    let mut body = codex_body(8, 3000, false);
    let input = body["input"].as_array_mut().unwrap();
    // Interrupted call (no output) and an orphan output, as after a crash.
    input.insert(
        input.len() - 1,
        json!({"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": "call_interrupted"}),
    );
    input.insert(2, json!({"type": "function_call_output", "call_id": "call_ghost", "output": "orphan"}));
    let direct = fake.direct("/v1/responses", serde_json::to_vec(&body).unwrap()).await;
    assert_eq!(direct.status, 400, "the strict fake rejects the broken request");

    let answer = post(&proxy, "/v1/responses", &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let pruned: u32 = answer.header("x-compactor-pruned").unwrap().parse().unwrap();
    assert!(pruned > 0);
    let sent = fake.last();
    let forwarded = String::from_utf8(sent.body.to_vec()).unwrap();
    for t in 0..8 {
        let reasoning = REASONING.replace("rs_0a1b", &format!("rs_{t}"));
        let original = serde_json::to_string(&serde_json::from_str::<Value>(&reasoning).unwrap()).unwrap();
        assert!(forwarded.contains(&original), "reasoning item {t} changed");
    }
    let items = sent.json()["input"].as_array().unwrap().clone();
    assert!(items.iter().all(|i| i["call_id"] != "call_ghost"));
    let synthetic =
        items.iter().find(|i| i["type"] == "function_call_output" && i["call_id"] == "call_interrupted").unwrap();
    assert_eq!(synthetic["output"], "aborted");
    assert_eq!(items[0]["role"], "developer", "the developer prompt stays first");
    assert!(forwarded.contains("ZEPHYR-LANTERN-42"));
}

#[tokio::test]
async fn stateful_requests_and_the_agents_own_compaction_pass_untouched() {
    let (fake, proxy) = ProxyProcess::with_fake("[prune]\nprotect_tokens = 100\nminimum_tokens = 10\n").await;
    let mut stateful = codex_body(8, 3000, false);
    stateful["previous_response_id"] = json!("resp_abc123");
    post(&proxy, "/v1/responses", &stateful).await;
    assert_eq!(fake.last().body, serde_json::to_vec(&stateful).unwrap());

    let mut trigger = codex_body(8, 3000, false);
    trigger["input"].as_array_mut().unwrap().push(json!({"type": "compaction_trigger"}));
    post(&proxy, "/v1/responses", &trigger).await;
    assert_eq!(fake.last().body, serde_json::to_vec(&trigger).unwrap());

    let compact = codex_body(8, 3000, false);
    post(&proxy, "/v1/responses/compact", &compact).await;
    let seen = fake.last();
    assert_eq!(seen.path_and_query, "/v1/responses/compact");
    assert_eq!(seen.body, serde_json::to_vec(&compact).unwrap());

    let mut checkpoint = codex_body(8, 3000, false);
    checkpoint["input"].as_array_mut().unwrap().push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary."}]}));
    post(&proxy, "/v1/responses", &checkpoint).await;
    assert_eq!(fake.last().body, serde_json::to_vec(&checkpoint).unwrap());
}

#[tokio::test]
async fn overflow_is_recovered_plain_and_from_a_response_failed_stream() {
    for stream in [false, true] {
        let (fake, summaries) = window_upstream(WindowSpec::window(4_000)).await;
        let proxy = ProxyProcess::start(
            &fake,
            "[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nemergency_protect_tokens = 1000000\n",
        );
        let answer = post(&proxy, "/v1/responses", &codex_body(10, 1500, stream)).await;
        assert_eq!(answer.status, 200, "{}\n{:?}", answer.text(), proxy.logs());
        if stream {
            assert_eq!(
                answer.text(),
                fake::responses_stream(&["Hel", "lo"]).concat(),
                "the failed stream never reaches the client"
            );
        } else {
            assert_eq!(answer.json()["output"][0]["content"][0]["text"], "Hello");
        }
        // The request's own 4k model reads the whole transcript, in as many pieces as it needs.
        assert!((1..=3).contains(&summaries.count()), "stream={stream}: {} summary calls", summaries.count());
        assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
        let input: String = (0..summaries.count()).map(|i| summaries.input(i)).collect();
        assert!(input.contains("ZEPHYR-LANTERN-42") && input.contains("QUASAR-MAPLE-7"));
        let sent = fake.last().json();
        let items = sent["input"].as_array().unwrap();
        assert_eq!(items[0]["role"], "developer");
        // The last piece's summary, which carries the earlier pieces' facts.
        let summary = items[1].to_string();
        assert!(summary.contains(&format!("Handoff summary {}", summaries.count())), "{summary}");
        assert!(summary.contains("ZEPHYR-LANTERN-42") && summary.contains("QUASAR-MAPLE-7"), "{summary}");
        // The kept tail starts at a clean boundary: every output's call is there.
        assert!(crate::common::strict::responses_pairing_error(&sent).is_none());
    }
}

#[tokio::test]
async fn usage_from_response_completed_feeds_the_session() {
    let (_fake, proxy) = ProxyProcess::with_fake("[admin]\ntoken = \"t\"\n").await;
    let answer = post(&proxy, "/v1/responses", &codex_body(2, 200, true)).await;
    let key = answer.header("x-compactor-session").unwrap().to_string();
    let other = send(request(
        "POST",
        &proxy.url("/v1/responses"),
        &[("authorization", "Bearer sk-codex"), ("session-id", "0199-conv")],
        serde_json::to_vec(&codex_body(2, 200, true)).unwrap(),
    ))
    .await;
    assert_eq!(other.header("x-compactor-session").unwrap(), key, "session_id and session-id name the same session");
    let mut state = Value::Null;
    for _ in 0..50 {
        state =
            send(request("GET", &proxy.url(&format!("/admin/sessions/{key}")), &[("authorization", "Bearer t")], ""))
                .await
                .json();
        if state["state"]["conversations"][0]["usage"]["prompt_tokens"] == 12 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(state["state"]["conversations"][0]["usage"]["prompt_tokens"], 12, "{state}");
    assert_eq!(state["state"]["conversations"][0]["usage"]["cached_tokens"], 4);
    assert_eq!(state["state"]["conversations"][0]["usage"]["output_tokens"], 2);
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/conversations/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Every reasoning item of `body`, as its exact bytes in the client's request.
fn reasoning_items(body: &[u8]) -> Vec<String> {
    let value: Value = serde_json::from_slice(body).unwrap();
    value["input"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "reasoning")
        .map(|i| serde_json::to_string(i).unwrap())
        .collect()
}

#[tokio::test]
async fn recorded_codex_requests_keep_pairs_and_reasoning_and_small_ones_arrive_unchanged() {
    let fake = FakeUpstream::builder().strict_pairing().start().await;
    let proxy = ProxyProcess::start(&fake, "");
    let headers = [("authorization", "Bearer sk-codex"), ("session_id", "codex-fixture")];

    let small = fixture("responses_codex_small.json");
    let answer = send(request("POST", &proxy.url("/v1/responses"), &headers, small.clone())).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(fake.last().body, small, "a request with nothing to do arrives byte-identical");

    let long = fixture("responses_codex_long.json");
    let answer = send(request("POST", &proxy.url("/v1/responses"), &headers, long.clone())).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let before: u32 = answer.header("x-compactor-tokens-before").unwrap().parse().unwrap();
    let after: u32 = answer.header("x-compactor-tokens-after").unwrap().parse().unwrap();
    assert!(after < before, "{before} -> {after}");
    let sent = fake.last();
    let forwarded = String::from_utf8(sent.body.to_vec()).unwrap();
    let reasoning = reasoning_items(&long);
    assert!(reasoning.len() > 50);
    for item in &reasoning {
        assert!(forwarded.contains(item.as_str()), "a reasoning item changed");
    }
    for marker in ["ZEPHYR-LANTERN-42", "FINAL-KESTREL-55"] {
        assert!(forwarded.contains(marker));
    }
    assert_eq!(sent.json()["input"][0]["role"], "developer");

    let broken = fixture("responses_codex_broken.json");
    let direct = fake.direct("/v1/responses", broken.clone()).await;
    assert_eq!(direct.status, 400);
    let answer = send(request("POST", &proxy.url("/v1/responses"), &headers, broken)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[tokio::test]
async fn recorded_stateful_and_compaction_trigger_requests_pass_untouched() {
    let (fake, proxy) = ProxyProcess::with_fake("[prune]\nprotect_tokens = 10\nminimum_tokens = 1\n").await;
    for name in ["responses_codex_stateful.json", "responses_codex_compaction_trigger.json"] {
        let body = fixture(name);
        send(request("POST", &proxy.url("/v1/responses"), &[("authorization", "Bearer k")], body.clone())).await;
        assert_eq!(fake.last().body, body, "{name}");
    }
}
