//! The per-request bypass (`bypass.header`): a client that asks has its request forwarded as it
//! sent it, the header never reaches the provider, and what happened is in the log line, the
//! response's headers and the metrics.

use crate::common::*;
use serde_json::{Value, json};

/// Small enough that the conversation below is pruned and its large output truncated.
const TIGHT: &str = "[prune]\nprotect_tokens = 300\nminimum_tokens = 100\n[truncate]\ntool_output_max_tokens = 200\n";

/// Three tool outputs, the first two old enough to be pruned, the last over the truncation cap.
fn conversation() -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Fix the build."})];
    for (id, tokens) in [("call_a", 400), ("call_b", 400), ("call_c", 900)] {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": tool_output(id, tokens)}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

async fn post(proxy: &ProxyProcess, session: &str, bypass: Option<&str>) -> Answer {
    let mut headers =
        vec![("authorization", "Bearer sk-user"), ("x-session-id", session), ("content-type", "application/json")];
    if let Some(value) = bypass {
        headers.push(("x-compactor-bypass", value));
    }
    proxy.post("/v1/chat/completions", &headers, &conversation()).await
}

#[tokio::test]
async fn a_bypassed_request_reaches_the_provider_as_sent_without_the_header_and_is_recorded() {
    let (fake, proxy) = ProxyProcess::with_fake(TIGHT).await;
    let sent = serde_json::to_vec(&conversation()).unwrap();

    // Without the header the same body is rewritten: the bypass below has something to keep.
    let normal = post(&proxy, "s-normal", None).await;
    assert_eq!(normal.status, 200, "{}", normal.text());
    assert_ne!(fake.last().body, sent, "the conversation is rewritten when nobody asks for a bypass");
    assert_eq!(normal.header("x-compactor-untouched"), None);

    let bypassed = post(&proxy, "s-bypass", Some("1")).await;
    assert_eq!(bypassed.status, 200, "{}", bypassed.text());
    let received = fake.last();
    assert_eq!(received.body, sent, "forwarded byte for byte as the client sent it");
    assert!(!received.headers.contains_key("x-compactor-bypass"), "the header never reaches the provider");
    assert_eq!(received.headers.get("x-session-id").unwrap(), "s-bypass", "the client's other headers go on");
    assert_eq!(bypassed.header("x-compactor-untouched"), Some("bypass"));
    assert_eq!(bypassed.header("x-compactor-tokens-after"), None, "nothing was counted or decided");
    let id = bypassed.header("x-compactor-request-id").unwrap().to_string();
    let line = proxy.wait_for_log(&format!("request_id={id}")).await;
    assert!(line.contains("untouched=bypass"), "{line}");

    // A value that does not ask for it: rewritten as usual, and the header still stripped.
    let declined = post(&proxy, "s-declined", Some("0")).await;
    assert_eq!(declined.status, 200);
    assert_ne!(fake.last().body, sent);
    assert!(!fake.last().headers.contains_key("x-compactor-bypass"));

    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let counted = metrics
        .lines()
        .find(|line| line.starts_with("compactor_rewrites_total") && line.contains("outcome=\"bypass\""))
        .unwrap_or_else(|| panic!("no bypass count in:\n{metrics}"));
    assert!(counted.ends_with(" 1"), "{counted}");
}

#[tokio::test]
async fn with_the_bypass_turned_off_the_header_is_an_ordinary_one() {
    let (fake, proxy) = ProxyProcess::with_fake(&format!("{TIGHT}[bypass]\nheader = \"\"\n")).await;
    let answer = post(&proxy, "s", Some("1")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let received = fake.last();
    assert_ne!(received.body, serde_json::to_vec(&conversation()).unwrap(), "no bypass: rewritten");
    assert_eq!(received.headers.get("x-compactor-bypass").unwrap(), "1", "forwarded as any other header");
    assert_eq!(answer.header("x-compactor-untouched"), None);
}
