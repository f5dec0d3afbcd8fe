//! Token-count requests (`POST /v1/messages/count_tokens`, `POST /v1/responses/input_tokens`) reach
//! the provider as the session's next request will: the stored summary re-applied and the same
//! rewrite, with no summary call and nothing written to the session. A count of a conversation
//! compactor does not know goes as sent.

use std::time::Duration;

use crate::common::window::{Api, WindowSpec, conversation, window_upstream};
use crate::common::*;
use serde_json::{Value, json};

/// A summarizer with a large window, no pruning or truncation (what changes the body is the
/// stored summary alone), and the admin API.
const CONFIG: &str = "[models.big-summarizer]\ncontext_window = 200000\nmax_output_tokens = 8192\n[admin]\ntoken = \"admin\"\n[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\nlock_wait_ms = 20000\nmodel = \"big-summarizer\"\n";

/// Pruning that acts on the Codex-shaped bodies below, and the admin API.
const PRUNING: &str = "[admin]\ntoken = \"admin\"\n[prune]\nprotect_tokens = 2000\nminimum_tokens = 500\n";

const HEADERS: [(&str, &str); 3] =
    [("authorization", "Bearer k"), ("x-api-key", "k"), ("x-claude-code-session-id", "s")];

/// The body Claude Code counts: the request's model, system, tools and messages, without
/// `max_tokens`, `stream` or `metadata`.
fn count_body(request: &Value) -> Value {
    let mut body = request.clone();
    let object = body.as_object_mut().unwrap();
    for field in ["max_tokens", "stream", "metadata"] {
        object.remove(field);
    }
    body
}

/// The session's admin view once the finishers of earlier requests have written it.
async fn settled_view(proxy: &ProxyProcess, key: &str) -> Value {
    let path = format!("/admin/sessions/{key}");
    let mut view = proxy.get_with_token(&path, "admin").await.json();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = proxy.get_with_token(&path, "admin").await.json();
        if again == view {
            return view;
        }
        view = again;
    }
    panic!("the session's view never settled: {view}");
}

/// A Codex-style stateless request of `turns` tool turns with `output_chars` of output each.
fn codex_body(turns: usize, output_chars: usize) -> Value {
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the build."}]}),
    ];
    for t in 0..turns {
        let id = format!("call_{t:024}");
        input.push(json!({"type": "function_call", "name": "exec_command", "arguments": "{\"cmd\":\"cargo build\"}", "call_id": id}));
        let output = lines_until(output_chars, |i| format!("t{t} line {i}: compiled ok\n"));
        input.push(json!({"type": "function_call_output", "call_id": id, "output": output}));
    }
    input.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Keep going."}]}));
    json!({"model": "gpt-5-codex", "input": input, "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "store": false, "stream": false, "prompt_cache_key": "0199-conv"})
}

const CODEX: [(&str, &str); 2] = [("authorization", "Bearer sk-codex"), ("session_id", "0199-conv")];

#[tokio::test]
async fn a_count_of_a_compacted_session_reaches_the_provider_as_its_next_request_will() {
    let (fake, summaries) = window_upstream(WindowSpec::window(4_000)).await;
    let proxy = ProxyProcess::start(&fake, CONFIG);
    let mut request = conversation(Api::Anthropic, 12, false);
    let first = proxy.post("/v1/messages", &HEADERS, &request).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(summaries.count(), 1, "the first request overflowed and was compacted");
    let key = first.header("x-compactor-session").unwrap().to_string();
    let before = settled_view(&proxy, &key).await;

    // The agent's next turn, counted first.
    let messages = request["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Continuing now."}));
    messages.push(json!({"role": "user", "content": "Thanks."}));
    let count = count_body(&request);
    let received = fake.received().len();
    let counted = proxy.post("/v1/messages/count_tokens", &HEADERS, &count).await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    let sent = fake.last();
    assert_eq!(fake.received().len(), received + 1, "one request upstream, no summary call");
    assert_eq!(sent.path_and_query, "/v1/messages/count_tokens");
    // The provider's answer reaches the agent as it came.
    assert_eq!(counted.json(), json!({"input_tokens": sent.body.len() / 4}));
    assert!(sent.body.len() < serde_json::to_vec(&count).unwrap().len() / 2, "the count is of the compacted body");
    assert_eq!(counted.header("x-compactor-compacted"), Some("1"));
    assert_eq!(summaries.count(), 1);
    assert_eq!(settled_view(&proxy, &key).await, before, "a count writes nothing to the session");

    // The real request that follows goes out with the same messages.
    let next = proxy.post("/v1/messages", &HEADERS, &request).await;
    assert_eq!(next.status, 200, "{}", next.text());
    assert_eq!(next.header("x-compactor-retries"), Some("0"));
    assert_eq!(summaries.count(), 1);
    let next_sent = fake.last().json();
    let counted_sent = sent.json();
    assert_eq!(counted_sent["messages"], next_sent["messages"]);
    assert_eq!(counted_sent["system"], next_sent["system"]);
    assert!(counted_sent["messages"].to_string().contains("Handoff summary 1"));
    assert!(counted_sent.get("max_tokens").is_none(), "nothing is added to the count's body");
}

#[tokio::test]
async fn a_responses_input_tokens_count_is_pruned_like_the_next_request() {
    let (fake, proxy) = ProxyProcess::with_fake(PRUNING).await;
    let request = codex_body(8, 3000);
    let first = proxy.post("/v1/responses", &CODEX, &request).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let pruned: u32 = first.header("x-compactor-pruned").unwrap().parse().unwrap();
    assert!(pruned > 0, "the session has pruned outputs");
    let key = first.header("x-compactor-session").unwrap().to_string();
    let before = settled_view(&proxy, &key).await;

    let mut count = request.clone();
    for field in ["stream", "store"] {
        count.as_object_mut().unwrap().remove(field);
    }
    let counted = proxy.post("/v1/responses/input_tokens", &CODEX, &count).await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    let sent = fake.last();
    assert_eq!(sent.path_and_query, "/v1/responses/input_tokens");
    assert_eq!(counted.json()["input_tokens"], sent.body.len() / 4);
    assert_ne!(sent.json()["input"], count["input"], "the count is of the pruned body");
    assert_eq!(settled_view(&proxy, &key).await, before, "a count writes nothing to the session");

    let next = proxy.post("/v1/responses", &CODEX, &request).await;
    assert_eq!(next.status, 200);
    assert_eq!(sent.json()["input"], fake.last().json()["input"]);
    assert_eq!(fake.received().len(), 3);
}

#[tokio::test]
async fn a_count_of_a_conversation_compactor_never_saw_goes_as_sent() {
    let (fake, proxy) = ProxyProcess::with_fake(PRUNING).await;
    let request = codex_body(8, 3000);
    let mut count = request.clone();
    count.as_object_mut().unwrap().remove("stream");
    let counted = proxy.post("/v1/responses/input_tokens", &CODEX, &count).await;
    assert_eq!(counted.status, 200);
    assert_eq!(fake.last().body, serde_json::to_vec(&count).unwrap());
    assert_eq!(counted.header("x-compactor-session"), None);

    let anthropic = count_body(&conversation(Api::Anthropic, 12, false));
    let counted = proxy.post("/v1/messages/count_tokens", &HEADERS, &anthropic).await;
    assert_eq!(counted.status, 200);
    assert_eq!(fake.last().body, serde_json::to_vec(&anthropic).unwrap());

    // The count created no session: the same request, sent for real, is the session's first and
    // is pruned (so the count above would have been rewritten, had it been taken for a request).
    let first = proxy.post("/v1/responses", &CODEX, &request).await;
    assert_ne!(first.header("x-compactor-pruned"), Some("0"));
    let sent = fake.last().json();
    assert_ne!(sent["input"], request["input"]);
}
