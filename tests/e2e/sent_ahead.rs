//! A request compactor has no reason to touch (a small conversation with no tool in it, far under
//! its model's window) goes upstream before its preparation, which runs while the provider reads
//! it. The client sees what it saw before: the same answer and headers, the session recorded. When
//! the preparation decides on another body after all, the request that went ahead is dropped and
//! the prepared body is what the client's answer comes from.

use std::time::Duration;

use crate::background::{metric, metrics};
use crate::common::window::{Api, WindowSpec, conversation, window_upstream};
use crate::common::*;
use serde_json::{Value, json};

/// A summarizer with a large window, and the admin API on.
const CONFIG: &str = "[models.big-summarizer]\ncontext_window = 200000\nmax_output_tokens = 8192\n[admin]\ntoken = \"admin\"\n[compaction]\nkeep_recent_tokens = 300\nmodel = \"big-summarizer\"\n";

/// A chat of `turns` exchanges in plain text (no tool anywhere), the codename planted in the first
/// message; about 500 bytes a turn.
fn plain_chat(turns: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a patient writing assistant."}),
        json!({"role": "user", "content": "Help me outline an essay. The codename is COBALT-HERON-17."}),
    ];
    for turn in 0..turns {
        let answer =
            format!("Draft {turn}: ").to_string() + &"the outline grows by one more paragraph here. ".repeat(8);
        messages.push(json!({"role": "assistant", "content": answer}));
        messages.push(json!({"role": "user", "content": format!("Good. Now extend part {turn} a little.")}));
    }
    json!({"model": "gpt-4o-mini", "messages": messages, "max_tokens": 64})
}

async fn post(proxy: &ProxyProcess, body: &Value) -> Answer {
    proxy.post(Api::Chat.path(), &[("authorization", "Bearer k"), ("x-session-id", "essay")], body).await
}

async fn sent_ahead(proxy: &ProxyProcess, outcome: &str) -> u64 {
    metric(&metrics(proxy).await, "compactor_sent_ahead_total", &[&format!("outcome=\"{outcome}\"")])
}

/// The admin API's path of the session `answer` names, once the store holds it (a request's state
/// is written after its answer).
async fn stored_session(proxy: &ProxyProcess, answer: &Answer) -> String {
    let session = answer.header("x-compactor-session").expect("the session header");
    let path = format!("/admin/sessions/{session}");
    assert!(eventually(async || proxy.get_with_token(&path, "admin").await.status == 200).await);
    path
}

/// The requests the fake received that were not summary calls.
fn turns(fake: &FakeUpstream) -> Vec<String> {
    fake.received()
        .into_iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .filter(|body| !body.contains("context-compaction assistant"))
        .collect()
}

#[tokio::test]
async fn a_plain_chat_goes_ahead_byte_for_byte_and_is_answered_and_recorded_as_before() {
    let (fake, _summaries) = window_upstream(WindowSpec::window(1_000_000)).await;
    let proxy = ProxyProcess::start(&fake, CONFIG);
    let body = plain_chat(3);
    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(fake.last().body, serde_json::to_vec(&body).unwrap(), "sent as the client sent it");
    assert_eq!(fake.last().headers.get("accept-encoding").map(|v| v.to_str().unwrap()), Some("identity"));
    assert_eq!(sent_ahead(&proxy, "ahead").await, 1);
    // The preparation still ran: its headers and its session record are there.
    let before: u64 = answer.header("x-compactor-tokens-before").unwrap().parse().unwrap();
    assert!(before > 100, "{before}");
    assert_eq!(answer.header("x-compactor-tokens-after"), answer.header("x-compactor-tokens-before"));
    let path = stored_session(&proxy, &answer).await;
    let state = proxy.get_with_token(&path, "admin").await.json();
    assert_eq!(state["state"]["conversations"].as_array().map(Vec::len), Some(1), "{state}");

    // A conversation with tool calls is prepared first, as before.
    let tools = conversation(Api::Chat, 2, false);
    assert_eq!(post(&proxy, &tools).await.status, 200);
    assert_eq!(sent_ahead(&proxy, "ahead").await, 1);
    assert_eq!(sent_ahead(&proxy, "withdrawn").await, 0);
}

#[tokio::test]
async fn a_request_its_preparation_changes_is_withdrawn_and_the_prepared_body_answered() {
    let (fake, summaries) = window_upstream(WindowSpec::window(1_000_000)).await;
    let proxy = ProxyProcess::start(&fake, CONFIG);
    let body = plain_chat(12);
    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(sent_ahead(&proxy, "ahead").await, 1);
    let path = stored_session(&proxy, &answer).await;
    // An operator asks for a compaction: the bytes of the next request cannot tell.
    let marked = proxy.call_with_token("POST", &format!("{path}/compact"), "admin").await;
    assert_eq!(marked.status, 202);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
    assert_eq!(summaries.count(), 1);
    assert_eq!(sent_ahead(&proxy, "withdrawn").await, 1);
    assert_eq!(sent_ahead(&proxy, "ahead").await, 1, "only the first request's went ahead and was kept");
    let last = turns(&fake).pop().unwrap();
    assert!(
        last.contains("COBALT-HERON-17") && last.contains("Handoff summary"),
        "the compacted body went last: {last}"
    );
    assert!(last.len() < serde_json::to_vec(&body).unwrap().len());
}

#[tokio::test]
async fn an_overflow_of_a_request_sent_ahead_is_recovered_and_the_window_learned_holds_the_next_back() {
    // The model table says 128k; the upstream's real window is far smaller.
    let (fake, summaries) = window_upstream(WindowSpec::window(1_500)).await;
    let proxy = ProxyProcess::start(&fake, CONFIG);
    let mut body = plain_chat(12);
    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status, 200, "the client never sees the overflow: {}", answer.text());
    assert_eq!(answer.header("x-compactor-retries"), Some("1"));
    assert_eq!(summaries.count(), 1);
    assert_eq!(sent_ahead(&proxy, "ahead").await, 1);

    // The next turn: the window the overflow taught is far too small to send anything ahead of it.
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Extended."}));
    messages.push(json!({"role": "user", "content": "Thanks. One more pass, please."}));
    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
    assert_eq!(sent_ahead(&proxy, "ahead").await, 1);
    assert_eq!(sent_ahead(&proxy, "withdrawn").await, 0);
    assert!(turns(&fake).pop().unwrap().contains("Handoff summary"));
}
