//! Summaries prepared before they are needed (`compaction.background`): when a conversation's
//! growth says it will pass the threshold within the next turns, its summary call starts off the
//! request path, and the request that passes the threshold applies the ready record at once. The
//! fake upstream keeps its own log of what it received, in order, and its summary calls are slow.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// How long the fake takes to write a summary.
const SUMMARY_DELAY: Duration = Duration::from_secs(3);

/// A window of 8,000 tokens, nothing pruned or cut: only summaries make room. The upstream is
/// priced as a local server (the lines continue compactor's `[upstream]` table), so the summary
/// call is the conversation as sent plus the instruction.
const CONFIG: &str = "openai_cache = \"local\"\n[models.test-model]\ncontext_window = 8000\nmax_output_tokens = 500\n[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nbackground = true\nkeep_recent_tokens = 1500\nuser_message_max_tokens = 300\n";

/// What the fake received, in order: `summary` for a summary call, else `turn N` (the number of
/// tool outputs in the request) and whether the request carried a summary.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(String, Instant, bool)>>>);

impl Log {
    fn events(&self) -> Vec<(String, Instant, bool)> {
        self.0.lock().unwrap().clone()
    }
    fn summary_calls(&self) -> Vec<Instant> {
        self.events().into_iter().filter(|(what, ..)| what == "summary").map(|(_, at, _)| at).collect()
    }
}

/// A fake that answers summary calls after [`SUMMARY_DELAY`] and every other request at once,
/// with a usage that counts the prompt as 4 bytes a token.
async fn fake_with_slow_summaries() -> (FakeUpstream, Log) {
    let log = Log::default();
    let seen = log.clone();
    let fake = FakeUpstream::builder()
        .respond_with(move |received| {
            let text = String::from_utf8_lossy(&received.body).into_owned();
            let body: Value = serde_json::from_slice(&received.body).ok()?;
            // A transcript summary call, or the conversation as last sent with the instruction
            // appended (the summary prepared in the background on a provider that caches).
            if text.contains("context-compaction assistant") || text.contains("Write a detailed handoff summary") {
                seen.0.lock().unwrap().push(("summary".into(), Instant::now(), false));
                let summary = "Handoff summary: the parser is half done; the codename is ZEPHYR-LANTERN-42.";
                let answer = json!({"id": "s", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": summary}, "finish_reason": "stop"}], "usage": {"prompt_tokens": text.len() / 4, "completion_tokens": 20}});
                return Some(Reply::json(200, answer).after(SUMMARY_DELAY));
            }
            // The turn: the newest part the agent read (a compacted body keeps only the newest).
            let parts = regex::Regex::new(r"part (\d+) line").unwrap();
            let turn = parts.captures_iter(&text).filter_map(|c| c[1].parse::<usize>().ok()).max().map_or(0, |p| p + 1);
            seen.0.lock().unwrap().push((format!("turn {turn}"), Instant::now(), text.contains("Handoff summary")));
            let prompt = body["messages"].to_string().len() / 4;
            let answer = json!({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Next step."}, "finish_reason": "stop"}], "usage": {"prompt_tokens": prompt, "completion_tokens": 3}});
            Some(Reply::json(200, answer))
        })
        .start()
        .await;
    (fake, log)
}

/// The conversation after `turns` tool turns of about 650 tokens each.
fn conversation(turns: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Build the parser. The codename is ZEPHYR-LANTERN-42."}),
    ];
    for turn in 0..turns {
        let id = format!("call_{turn}");
        messages.push(json!({"role": "assistant", "content": format!("Reading part {turn}."), "tool_calls": [{"id": id, "type": "function", "function": {"name": "read", "arguments": format!("{{\"part\":{turn}}}")}}]}));
        let output =
            lines_until(2_400, |i| format!("part {turn} line {i}: the module parses its input and checks it. "));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
    }
    json!({"model": "test-model", "messages": messages, "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]})
}

/// One turn: its latency and compactor's headers.
async fn turn(proxy: &ProxyProcess, turns: usize) -> (Duration, Answer) {
    let started = Instant::now();
    let answer = proxy
        .post("/v1/chat/completions", &[("authorization", "Bearer k"), ("x-session-id", "agent")], &conversation(turns))
        .await;
    assert_eq!(answer.status, 200, "turn {turns}: {}", answer.text());
    (started.elapsed(), answer)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_request_that_passes_the_threshold_applies_a_summary_prepared_while_the_agent_worked() {
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, CONFIG);
    // Turns, back to back, until the fake has seen a summary call.
    let mut latencies = vec![Duration::ZERO];
    let mut turns = 0;
    while log.summary_calls().is_empty() {
        turns += 1;
        assert!(turns <= 12, "no summary started before the threshold: {:?}", log.events());
        let (latency, answer) = turn(&proxy, turns).await;
        assert!(answer.header("x-compactor-compacted").is_none(), "turn {turns}: nothing compacted yet");
        latencies.push(latency);
        // The job starts as the turn is answered: its call reaches the fake a moment later.
        let deadline = Instant::now() + Duration::from_millis(500);
        while log.summary_calls().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // One more turn right away, while the summary is being written.
    turns += 1;
    let (latency, _) = turn(&proxy, turns).await;
    latencies.push(latency);
    // The agent runs its tool; then it goes on until a request carries the summary.
    tokio::time::sleep(SUMMARY_DELAY + Duration::from_millis(500)).await;
    let mut applied_at = None;
    for _ in 0..4 {
        turns += 1;
        let (latency, answer) = turn(&proxy, turns).await;
        latencies.push(latency);
        if answer.header("x-compactor-compacted").is_some() {
            applied_at = Some(turns);
            break;
        }
    }
    let applied_at = applied_at.expect("a request applied the prepared summary");
    let events = log.events();
    assert_eq!(log.summary_calls().len(), 1, "one summary call in all: {events:?}");
    // In the fake's own order: the turn that started the summary, the summary call, a turn
    // received while the summary was still being written (before its answer), and later the turn
    // that applied it, carrying the summary, with no call of its own.
    let summary = events.iter().position(|(what, ..)| what == "summary").unwrap();
    let summary_at = events[summary].1;
    let started_by: usize = events[summary - 1].0.trim_start_matches("turn ").parse().unwrap();
    let during = &events[summary + 1];
    assert!(during.0.starts_with("turn ") && during.1 < summary_at + SUMMARY_DELAY, "{events:?}");
    let applied = events.iter().position(|(what, ..)| *what == format!("turn {applied_at}")).unwrap();
    assert!(applied > summary + 1 && events[applied].2, "{events:?}");
    assert!(
        !events[..applied].iter().any(|(what, _, summarized)| what.starts_with("turn ") && *summarized),
        "applied at {applied_at}, latencies {latencies:?}: {events:?}: {:#?}",
        proxy.logs().iter().filter(|l| l.contains("background") || l.contains(" request")).collect::<Vec<_>>()
    );
    // No turn waited for the summary: the one that started it, the one during it and the one
    // that applied it each took a fraction of the summarizer's time.
    for turn in [started_by, started_by + 1, applied_at] {
        assert!(latencies[turn] < SUMMARY_DELAY / 3, "turn {turn} took {:?}", latencies[turn]);
    }
    // The next turn keeps the same summary, with no new call.
    let (_, answer) = turn(&proxy, applied_at + 1).await;
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
    assert!(fake.last().json()["messages"].to_string().contains("Handoff summary"));
    assert_eq!(log.summary_calls().len(), 1);
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    // A turn that projects the crossing while the summary is being written starts no second
    // one: it finds the lock taken (`busy`).
    for line in ["outcome=\"ready\"} 1", "outcome=\"used\"} 1", "outcome=\"unneeded\"} 0", "outcome=\"failed\"} 0"] {
        assert!(metrics.contains(&format!("compactor_background_summaries_total{{{line}")), "{line}: {metrics}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_background_summaries_the_request_that_passes_the_threshold_waits_for_its_summary() {
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, &CONFIG.replace("background = true", "background = false"));
    for turns in 1..=16 {
        let (latency, answer) = turn(&proxy, turns).await;
        if answer.header("x-compactor-compacted").is_some() {
            // The summary call was on this request's path: it waited the summarizer's time.
            assert!(latency >= SUMMARY_DELAY, "turn {turns} took {latency:?}");
            let events = log.events();
            let summary = events.iter().position(|(w, ..)| w == "summary").unwrap();
            assert_eq!(events[summary + 1].0, format!("turn {turns}"), "{events:?}");
            return;
        }
        assert!(log.summary_calls().is_empty(), "no summary before the threshold: {:?}", log.events());
    }
    panic!("no compaction in 16 turns: {:?}", log.events());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_needs_the_summary_before_it_is_ready_waits_for_the_one_under_way() {
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, CONFIG);
    let mut turns = 1;
    while log.summary_calls().is_empty() {
        turn(&proxy, turns).await;
        turns += 1;
        assert!(turns < 14, "no background summary: {:?}", log.events());
    }
    // The agent jumps far past the threshold at once: the summary under way is what it waits for.
    let (_, answer) = turn(&proxy, turns + 3).await;
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"));
    assert_eq!(log.summary_calls().len(), 1, "the request waited for the background summary: {:?}", log.events());
}
