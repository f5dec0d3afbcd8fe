//! Overflow recovery and compaction through the proxy, against a fake upstream with a small
//! window and each provider's real overflow error: the agent gets a normal answer, the summary is
//! remembered, and later turns reuse it without another summary call.

use std::time::Duration;

use crate::common::redis_server::RedisServer;
use crate::common::window::{Api, Summaries, WindowSpec, conversation, markers, window_upstream};
use crate::common::*;
use serde_json::{Value, json};

/// A summarizer with a large window (`compaction.model`), so each compaction here is one summary
/// call; summarizing with the small model itself (in pieces) is `adaptive.rs`'s.
const CONFIG: &str = "[models.big-summarizer]\ncontext_window = 200000\nmax_output_tokens = 8192\n[admin]\ntoken = \"admin\"\n[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\nlock_wait_ms = 20000\nmodel = \"big-summarizer\"\n";
const WINDOW: usize = 4_000;
/// The model table's word for the test model: a small window, so estimates cross the threshold.
const SMALL_MODEL: &str = "[models.test-model]\ncontext_window = 4000\nmax_output_tokens = 500\n";

/// A fake upstream enforcing `spec` and a compactor with `config` in front of it.
async fn small_window(spec: WindowSpec, config: &str) -> (FakeUpstream, Summaries, ProxyProcess) {
    let (fake, summaries) = window_upstream(spec).await;
    let proxy = ProxyProcess::start(&fake, config);
    (fake, summaries, proxy)
}

/// A turn of session `session`, with both dialects' credentials.
async fn post(proxy: &ProxyProcess, api: Api, session: &str, body: &Value) -> Answer {
    proxy.post(api.path(), &[("authorization", "Bearer k"), ("x-api-key", "k"), ("x-session-id", session)], body).await
}

fn assert_answered(api: Api, answer: &Answer, stream: bool) {
    assert_eq!(answer.status, 200, "{api:?}: {}", answer.text());
    if stream {
        assert!(answer.text().contains("data:"), "{}", answer.text());
    } else {
        let json = answer.json();
        assert!(json.get("choices").is_some() || json.get("content").is_some(), "{json}");
    }
}

#[tokio::test]
async fn an_overflow_becomes_a_normal_answer_with_exactly_one_summary_call() {
    for api in [Api::Chat, Api::Anthropic] {
        for stream in [false, true] {
            let (fake, summaries, proxy) = small_window(WindowSpec::window(WINDOW), CONFIG).await;
            let answer = post(&proxy, api, "s", &conversation(api, 12, stream)).await;
            assert_answered(api, &answer, stream);
            assert_eq!(summaries.count(), 1, "{api:?} stream={stream}");
            assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
            assert_eq!(answer.header("x-compactor-retries"), Some("1"));
            // Words planted early in user text and tool output reached the summarizer.
            let input = summaries.input(0);
            for marker in ["ZEPHYR-LANTERN-42", "QUASAR-MAPLE-7", "COBALT-HERON-3"] {
                assert!(input.contains(marker), "{api:?}: {marker} missing from the summary call");
            }
            // The request that succeeded: summary first, recent turns verbatim, pairs intact.
            let sent = fake.last().json();
            let text = sent["messages"].to_string();
            assert!(text.contains("Handoff summary 1"), "{text}");
            assert!(text.contains("Yes, continue."));
            let line = proxy.wait_for_log("compacted").await;
            assert!(line.contains("trigger=overflow"), "{line}");
            // The window the error named is remembered for the session's later estimates.
            let key = answer.header("x-compactor-session").unwrap();
            let admin = |key: &str| {
                request("GET", &proxy.url(&format!("/admin/sessions/{key}")), &[("authorization", "Bearer admin")], "")
            };
            let mut learned = Value::Null;
            for _ in 0..50 {
                learned = send(admin(key)).await.json()["state"]["counters"]["learned_window"].clone();
                if learned == WINDOW {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(learned, WINDOW, "{api:?}");
        }
    }
}

#[tokio::test]
async fn later_turns_reuse_the_summary_and_a_full_context_is_compacted_again() {
    for api in [Api::Chat, Api::Anthropic] {
        let (fake, summaries, proxy) = small_window(WindowSpec::window(WINDOW), CONFIG).await;
        let mut conversation = conversation(api, 12, false);
        post(&proxy, api, "s", &conversation).await;
        assert_eq!(summaries.count(), 1);
        let first: Vec<Value> = fake.last().json()["messages"].as_array().unwrap().clone();

        // Next turn: the agent resends everything plus its new exchange.
        let messages = conversation["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": "Continuing now."}));
        messages.push(json!({"role": "user", "content": "Thanks."}));
        let answer = post(&proxy, api, "s", &conversation).await;
        assert_eq!(answer.status, 200);
        assert_eq!(summaries.count(), 1, "{api:?}: the stored summary must be reused");
        assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
        assert_eq!(answer.header("x-compactor-retries"), Some("0"));
        let second: Vec<Value> = fake.last().json()["messages"].as_array().unwrap().clone();
        let raw = |m: &[Value]| m.iter().map(|v| v.to_string()).collect::<Vec<_>>();
        assert_eq!(raw(&second[..first.len()]), raw(&first), "{api:?}: the rewritten prefix must be stable");

        // The conversation fills up again: a second compaction covers summary + newer turns.
        let mut grown = conversation.clone();
        let extra = self::conversation(api, 10, false);
        let skip = if api == Api::Chat { 2 } else { 1 };
        let more: Vec<Value> = extra["messages"].as_array().unwrap()[skip..]
            .iter()
            .map(|m| {
                let mut m = m.clone();
                let text = m.to_string().replace("\"call_", "\"later_");
                m = serde_json::from_str(&text).unwrap();
                m
            })
            .collect();
        let messages = grown["messages"].as_array_mut().unwrap();
        messages.pop();
        messages.pop();
        messages.push(json!({"role": "assistant", "content": "More work ahead."}));
        messages.extend(more);
        let answer = post(&proxy, api, "s", &grown).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(summaries.count(), 2, "{api:?}");
        assert_eq!(answer.header("x-compactor-compacted"), Some("2"));
        let input = summaries.input(1);
        assert!(input.contains("Handoff summary 1"), "the previous summary is summarized again");
        for marker in ["ZEPHYR-LANTERN-42", "QUASAR-MAPLE-7"] {
            assert!(input.contains(marker), "{api:?}: {marker} from before the first compaction is lost");
        }
    }
}

#[tokio::test]
async fn with_auto_off_the_overflow_error_passes_through_unchanged() {
    let (fake, summaries, proxy) = small_window(WindowSpec::window(WINDOW), &format!("{CONFIG}auto = false\n")).await;
    let body = conversation(Api::Anthropic, 12, false);
    let direct = fake.direct("/v1/messages", serde_json::to_vec(&body).unwrap()).await;
    let answer = post(&proxy, Api::Anthropic, "s", &body).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.text(), direct.text());
    assert_eq!(summaries.count(), 0);
}

#[tokio::test]
async fn a_failing_summary_falls_down_the_ladder_to_the_original_error_and_trips_the_breaker() {
    let (fake, summaries, proxy) =
        small_window(WindowSpec { window: WINDOW, summary_fails: true, ..Default::default() }, CONFIG).await;
    let body = conversation(Api::Chat, 12, false);
    let direct = fake.direct("/v1/chat/completions", serde_json::to_vec(&body).unwrap()).await;
    let answer = post(&proxy, Api::Chat, "s", &body).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.text(), direct.text(), "the client gets the original error, unchanged");
    assert_eq!(answer.json()["error"]["code"], "context_length_exceeded");
    // Both summary rungs were tried.
    assert_eq!(summaries.count(), 2);
    // A third failure opens the breaker; after that the same conversation costs no more calls.
    post(&proxy, Api::Chat, "s", &body).await;
    let calls = summaries.count();
    assert!(calls >= 3);
    for _ in 0..2 {
        let answer = post(&proxy, Api::Chat, "s", &body).await;
        assert_eq!(answer.status, 400);
    }
    assert_eq!(summaries.count(), calls, "an open breaker makes no summary calls");
}

#[tokio::test]
async fn ten_parallel_requests_of_one_session_cause_one_summary_call() {
    let (_fake, summaries, proxy) = small_window(WindowSpec::window(WINDOW), CONFIG).await;
    let body = conversation(Api::Chat, 12, false);
    let requests = (0..10).map(|_| post(&proxy, Api::Chat, "parallel", &body));
    let answers = futures_util::future::join_all(requests).await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(summaries.count(), 1);
}

#[tokio::test]
async fn an_error_inside_a_200_stream_is_recovered_before_the_client_sees_it() {
    let (_fake, summaries, proxy) =
        small_window(WindowSpec { window: WINDOW, in_stream_error: true, ..Default::default() }, CONFIG).await;
    let answer = post(&proxy, Api::Chat, "s", &conversation(Api::Chat, 12, true)).await;
    assert_eq!(answer.status, 200);
    assert!(!answer.text().contains("prompt is too long"), "{}", answer.text());
    assert_eq!(answer.text(), fake::openai_stream(&["Hel", "lo"]).concat());
    assert_eq!(summaries.count(), 1);
}

#[tokio::test]
async fn when_only_max_tokens_does_not_fit_it_is_lowered_without_a_summary() {
    let (fake, summaries, proxy) =
        small_window(WindowSpec { window: 20_000, count_max_tokens: true, ..Default::default() }, CONFIG).await;
    let mut body = conversation(Api::Anthropic, 12, false);
    body["max_tokens"] = json!(16_000);
    let answer = post(&proxy, Api::Anthropic, "s", &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(summaries.count(), 0);
    let sent = fake.last().json();
    let lowered = sent["max_tokens"].as_u64().unwrap();
    assert!((1_024..16_000).contains(&lowered), "{lowered}");
    assert_eq!(sent["messages"], body["messages"], "the conversation itself is untouched");
}

#[tokio::test]
async fn a_conversation_near_the_window_is_compacted_before_it_is_forwarded() {
    // The model table says the window is small: the estimate crosses 80% before the upstream complains.
    let (fake, summaries, proxy) = small_window(WindowSpec::window(1_000_000), &format!("{CONFIG}{SMALL_MODEL}")).await;
    let answer = post(&proxy, Api::Anthropic, "s", &conversation(Api::Anthropic, 12, false)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(summaries.count(), 1);
    assert_eq!(answer.header("x-compactor-retries"), Some("0"), "no overflow was needed");
    assert_eq!(
        fake.received().iter().filter(|r| !String::from_utf8_lossy(&r.body).contains("context-compaction")).count(),
        1
    );
    proxy.wait_for_log("trigger=threshold").await;
}

#[tokio::test]
async fn the_agents_own_compaction_request_is_forwarded_untouched() {
    let (fake, summaries, proxy) = small_window(WindowSpec::window(1_000_000), &format!("{CONFIG}{SMALL_MODEL}")).await;
    let mut body = conversation(Api::Anthropic, 12, false);
    body["system"] =
        json!([{"type": "text", "text": "You are a helpful AI assistant tasked with summarizing conversations."}]);
    post(&proxy, Api::Anthropic, "s", &body).await;
    assert_eq!(summaries.count(), 0);
    assert_eq!(fake.last().body, serde_json::to_vec(&body).unwrap());
}

#[tokio::test]
async fn the_admin_api_can_ask_for_a_compaction_on_the_next_request() {
    let (_fake, summaries, proxy) = small_window(WindowSpec::window(1_000_000), CONFIG).await;
    let body = conversation(Api::Chat, 12, false);
    let answer = post(&proxy, Api::Chat, "s", &body).await;
    assert_eq!(summaries.count(), 0);
    let key = answer.header("x-compactor-session").unwrap().to_string();
    // The request's state is written after its answer; only a session the store holds is marked.
    let path = format!("/admin/sessions/{key}");
    assert!(eventually(async || proxy.get_with_token(&path, "admin").await.status == 200).await);
    let marked = proxy.call_with_token("POST", &format!("/admin/sessions/{key}/compact"), "admin").await;
    assert_eq!(marked.status, 202);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = post(&proxy, Api::Chat, "s", &body).await;
    assert_eq!(summaries.count(), 1);
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
    let state = proxy.get_with_token(&format!("/admin/sessions/{key}"), "admin").await.json();
    let record = &state["state"]["conversations"][0]["compactions"][0];
    assert_eq!(record["trigger"], "admin");
    assert!(record["summary"].as_str().unwrap().contains("ZEPHYR-LANTERN-42"));
    assert_eq!(state["state"]["counters"]["compact_requested"], 0, "the request is answered");
}

#[tokio::test]
async fn a_compaction_through_one_replica_is_applied_by_the_other() {
    let Some(redis) = RedisServer::start() else { return };
    let (fake, summaries) = window_upstream(WindowSpec::window(WINDOW)).await;
    let config = format!("{CONFIG}{}", redis.config());
    let (one, two) = ProxyProcess::replicas(&fake, &config);
    let mut body = conversation(Api::Anthropic, 12, false);
    assert_eq!(post(&one, Api::Anthropic, "shared", &body).await.status, 200);
    assert_eq!(summaries.count(), 1);
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Done."}));
    messages.push(json!({"role": "user", "content": "Next."}));
    let answer = post(&two, Api::Anthropic, "shared", &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
    assert_eq!(summaries.count(), 1, "the other replica reuses the stored summary");
    assert!(!markers(&fake.last().json()["messages"].to_string()).is_empty());
}
