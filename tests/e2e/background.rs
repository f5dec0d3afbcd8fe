//! Summaries prepared before they are needed (`compaction.background`): when a conversation's
//! growth says it will pass the threshold within the next turns, its summary call starts off the
//! request path, and the request that passes the threshold applies the ready record at once. The
//! fake upstream keeps its own log of what it received, in order, and its summary calls are slow.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// How long the fake takes to write a summary.
pub const SUMMARY_DELAY: Duration = Duration::from_secs(3);

/// A window of 8,000 tokens, nothing pruned or cut: only summaries make room. The upstream is
/// priced as a local server (the lines continue compactor's `[upstream]` table), so the summary
/// call is the conversation as sent plus the instruction.
pub const CONFIG: &str = "openai_cache = \"local\"\n[models.test-model]\ncontext_window = 8000\nmax_output_tokens = 500\n[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nbackground = true\nkeep_recent_tokens = 1500\nuser_message_max_tokens = 300\n";

/// What the fake received, in order: `summary` for a summary call, `prefill` for a prefill ahead
/// (a one-token call), else `turn N` (the number of tool outputs in the request); and whether the
/// request carried a summary.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<(String, Instant, bool)>>>);

impl Log {
    pub fn events(&self) -> Vec<(String, Instant, bool)> {
        self.0.lock().unwrap().clone()
    }
    pub fn summary_calls(&self) -> Vec<Instant> {
        self.events().into_iter().filter(|(what, ..)| what == "summary").map(|(_, at, _)| at).collect()
    }
}

/// A fake that answers summary calls after [`SUMMARY_DELAY`] and every other request at once,
/// with a usage that counts the prompt as 4 bytes a token.
pub async fn fake_with_slow_summaries() -> (FakeUpstream, Log) {
    fake_with_summaries(None).await
}

/// [`fake_with_slow_summaries`], or with `per_token`: a summary call generates every token its
/// `max_tokens` allows, at `per_token` each (a server that writes at a steady pace).
pub async fn fake_with_summaries(per_token: Option<Duration>) -> (FakeUpstream, Log) {
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
                let (tokens, delay) = match (per_token, body["max_tokens"].as_u64()) {
                    (Some(pace), Some(asked)) => (asked, pace * asked as u32),
                    _ => (20, SUMMARY_DELAY),
                };
                let answer = json!({"id": "s", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": summary}, "finish_reason": "stop"}], "usage": {"prompt_tokens": text.len() / 4, "completion_tokens": tokens}});
                return Some(Reply::json(200, answer).after(delay));
            }
            // A prefill ahead: the prompt rebuilt around a prepared summary, one token asked.
            if body["max_tokens"] == 1 && body["stream"] == false {
                seen.0.lock().unwrap().push(("prefill".into(), Instant::now(), text.contains("Handoff summary")));
                let answer = json!({"id": "p", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Ok"}, "finish_reason": "length"}], "usage": {"prompt_tokens": text.len() / 4, "completion_tokens": 1}});
                return Some(Reply::json(200, answer));
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
pub fn conversation(turns: usize) -> Value {
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
pub async fn turn(proxy: &ProxyProcess, turns: usize) -> (Duration, Answer) {
    let started = Instant::now();
    let answer = proxy
        .post("/v1/chat/completions", &[("authorization", "Bearer k"), ("x-session-id", "agent")], &conversation(turns))
        .await;
    assert_eq!(answer.status, 200, "turn {turns}: {}", answer.text());
    (started.elapsed(), answer)
}

/// The value of the counter `name` whose labels include each of `labels` (`key="value"`), 0 when
/// it is not there.
pub fn metric(metrics: &str, name: &str, labels: &[&str]) -> u64 {
    let start = format!("{name}{{");
    metrics
        .lines()
        .filter(|line| line.starts_with(&start))
        .find(|line| labels.iter().all(|label| line.contains(label)))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

pub async fn metrics(proxy: &ProxyProcess) -> String {
    send(request("GET", &proxy.url("/metrics"), &[], "")).await.text()
}

/// Turns from `first` on, one at a time, until the fake has received a summary call; waits for
/// its record (`ready`) and returns the last turn sent (the one that started it) and its answer.
pub async fn until_a_background_summary_is_ready(proxy: &ProxyProcess, log: &Log, first: usize) -> (usize, Answer) {
    let calls = log.summary_calls().len();
    let ready = metric(&metrics(proxy).await, "compactor_background_summaries_total", &["outcome=\"ready\""]);
    let mut turns = first;
    let started = loop {
        let (_, answer) = turn(proxy, turns).await;
        assert!(answer.header("x-compactor-compacted").is_none_or(|g| g != "0"), "{}", answer.text());
        let deadline = Instant::now() + Duration::from_millis(500);
        while log.summary_calls().len() == calls && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if log.summary_calls().len() > calls {
            break answer;
        }
        turns += 1;
        assert!(turns < first + 12, "no background summary started: {:?}", log.events());
    };
    let stored =
        async || metric(&metrics(proxy).await, "compactor_background_summaries_total", &["outcome=\"ready\""]) > ready;
    assert!(eventually(stored).await, "the background summary was stored: {:?}", log.events());
    (turns, started)
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
    // Its cost: the fake's usage of the one summary call (its prompt at 4 bytes a token, 20
    // tokens of answer), spent once and used once; nothing spent for nothing.
    let tokens = |outcome: &str, direction: &str| {
        let labels = [format!("outcome=\"{outcome}\""), format!("direction=\"{direction}\"")];
        metric(&metrics, "compactor_background_summary_tokens_total", &[&labels[0], &labels[1]])
    };
    assert!(tokens("ready", "input") > 1_000, "{metrics}");
    assert_eq!(tokens("ready", "output"), 20, "{metrics}");
    for direction in ["input", "output"] {
        assert_eq!(tokens("used", direction), tokens("ready", direction), "{direction}: {metrics}");
        assert_eq!(tokens("unneeded", direction), 0, "{direction}: {metrics}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_summary_a_later_compaction_replaces_is_counted_unneeded_with_what_it_cost() {
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, &format!("{CONFIG}[admin]\ntoken = \"admin\"\n"));
    let (turns, _) = until_a_background_summary_is_ready(&proxy, &log, 1).await;
    let (_, answer) = turn(&proxy, turns).await;
    assert_eq!(answer.header("x-compactor-compacted"), None, "not needed yet: {:?}", log.events());
    let session = answer.header("x-compactor-session").unwrap().to_string();
    // An operator asks for a compaction now: the next request summarizes the conversation as it
    // is, and the summary prepared for a later turn is replaced before any request applied it.
    let marked = proxy.call_with_token("POST", &format!("/admin/sessions/{session}/compact"), "admin").await;
    assert_eq!(marked.status, 202);
    let (_, answer) = turn(&proxy, turns).await;
    assert_eq!(answer.header("x-compactor-compacted"), Some("2"), "{:?}", log.events());
    assert_eq!(log.summary_calls().len(), 2, "{:?}", log.events());
    let metrics = metrics(&proxy).await;
    let count =
        |outcome: &str| metric(&metrics, "compactor_background_summaries_total", &[&format!("outcome=\"{outcome}\"")]);
    assert_eq!((count("ready"), count("used"), count("unneeded")), (1, 0, 1), "{metrics}");
    let tokens = |outcome: &str, direction: &str| {
        let labels = [format!("outcome=\"{outcome}\""), format!("direction=\"{direction}\"")];
        metric(&metrics, "compactor_background_summary_tokens_total", &[&labels[0], &labels[1]])
    };
    assert!(tokens("unneeded", "input") > 1_000, "{metrics}");
    for direction in ["input", "output"] {
        assert_eq!(tokens("unneeded", direction), tokens("ready", direction), "{direction}: {metrics}");
        assert_eq!(tokens("used", direction), 0, "{direction}: {metrics}");
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

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_that_jumps_past_its_ready_summary_is_summarized_further_on_top_of_it() {
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, &format!("{CONFIG}[admin]\ntoken = \"admin\"\n"));
    let (turns, _) = until_a_background_summary_is_ready(&proxy, &log, 1).await;
    // Twelve turns at once, far past what the summary was prepared for: it applies, is not enough
    // alone, and the request summarizes further on top of it before it goes (not after an
    // overflow, and not from the start again).
    let (_, answer) = turn(&proxy, turns + 12).await;
    assert_eq!(answer.header("x-compactor-compacted"), Some("2"), "{:?}", log.events());
    let after: u64 = answer.header("x-compactor-tokens-after").unwrap().parse().unwrap();
    assert!(after < 7_500, "the body fits the window and the answer: {after}");
    // What the jump request summarized (a rolling summary when it is more than the summarizer's
    // window takes at once) is no more than the same jump summarizes with background summaries
    // off, where it reads the conversation from its start.
    let (off_fake, off_log) = fake_with_slow_summaries().await;
    let off = ProxyProcess::start(&off_fake, &CONFIG.replace("background = true", "background = false"));
    for earlier in 1..=turns {
        turn(&off, earlier).await;
    }
    turn(&off, turns + 12).await;
    let jump_calls = log.summary_calls().len() - 1;
    assert!(
        jump_calls >= 1 && jump_calls <= off_log.summary_calls().len(),
        "{:?} / {:?}",
        log.events(),
        off_log.events()
    );
    let metrics = metrics(&proxy).await;
    let count =
        |outcome: &str| metric(&metrics, "compactor_background_summaries_total", &[&format!("outcome=\"{outcome}\"")]);
    assert_eq!((count("ready"), count("used"), count("unneeded")), (1, 1, 0), "{metrics}");
    // The inspector says so: generation 1 was applied, by the request that made generation 2.
    let (key, id) = (answer.header("x-compactor-session").unwrap(), answer.header("x-compactor-conversation").unwrap());
    let request = answer.header("x-compactor-request-id").unwrap();
    let path = format!("/ui/sessions/{key}/c/{id}");
    // The request's own record is committed once its answer is done.
    let shown = async || {
        let page = proxy.get_with_token(&path, "admin").await.text();
        page.contains(&format!("applied by request <a class=\"request\" href=\"{path}/r/{request}\""))
            && page.contains("which summarized further on top of it (generation 2)")
    };
    assert!(eventually(shown).await, "{}", proxy.get_with_token(&path, "admin").await.text());
}

/// The prefills ahead the proxy sent, by its metric.
async fn prefills_sent(proxy: &ProxyProcess) -> u64 {
    metric(&metrics(proxy).await, "compactor_prefills_ahead_total", &["outcome=\"sent\""])
}

/// Turns from the one after `last`, each after a pause (the agent's tool), until a prefill ahead
/// was sent; the last turn sent. None of them applies the summary.
async fn until_a_prefill_is_sent(proxy: &ProxyProcess, log: &Log, mut last: usize) -> usize {
    loop {
        let sent = async || prefills_sent(proxy).await > 0;
        if eventually_within(Duration::from_secs(1), sent).await {
            return last;
        }
        last += 1;
        assert!(last < 20, "no prefill ahead: {:?}", log.events());
        let (_, answer) = turn(proxy, last).await;
        assert!(
            answer.header("x-compactor-compacted").is_none(),
            "turn {last} applied before any prefill: {:?}",
            log.events()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_local_server_the_prompt_that_applies_a_summary_is_prefilled_while_the_agent_works() {
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, CONFIG);
    let (started_by, _) = until_a_background_summary_is_ready(&proxy, &log, 1).await;
    let before = until_a_prefill_is_sent(&proxy, &log, started_by).await;
    // The agent's next turn, grown as usual, applies the summary.
    let applying = before + 1;
    let (_, answer) = turn(&proxy, applying).await;
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"), "{:?}", log.events());
    // In the fake's order: the prefill, carrying the summary, right before the turn that applies
    // it, after the answer to the turn before; one prefill in all.
    let events = log.events();
    let at = events.iter().position(|(what, ..)| *what == format!("turn {applying}")).unwrap();
    assert_eq!(events[at - 1].0, "prefill", "{events:?}");
    assert!(events[at - 1].2, "the prefilled prompt carries the summary: {events:?}");
    assert_eq!(events.iter().filter(|(what, ..)| what == "prefill").count(), 1, "{events:?}");
    // The turn extends the prompt the server prefilled: the same model and tools, and its
    // messages begin with every message of the prefill.
    let received: Vec<Value> = fake.received().iter().map(|r| r.json()).collect();
    let prefill = received.iter().find(|body| body["max_tokens"] == 1).unwrap();
    let turn_body = received.last().unwrap();
    let (ahead, sent) = (prefill["messages"].as_array().unwrap(), turn_body["messages"].as_array().unwrap());
    assert!(sent.len() > ahead.len(), "{} messages prefilled, {} sent", ahead.len(), sent.len());
    assert_eq!(&sent[..ahead.len()], &ahead[..], "the turn's prompt starts with the prefilled one");
    assert_eq!((&prefill["model"], &prefill["tools"]), (&turn_body["model"], &turn_body["tools"]));
    assert_eq!(prefill["stream"], false);
    assert_eq!(prefills_sent(&proxy).await, 1);
    assert_eq!(log.summary_calls().len(), 1, "no summary call of the turn's own: {events:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prefilled_summary_is_applied_by_the_next_request_even_one_that_does_not_need_the_room() {
    // In memory, and in Redis with the next request on another replica.
    let redis = crate::common::redis_server::RedisServer::start();
    for store in std::iter::once(String::new()).chain(redis.as_ref().map(|redis| redis.config())) {
        let config = format!("{CONFIG}{store}");
        let (fake, log) = fake_with_slow_summaries().await;
        let proxy = ProxyProcess::start(&fake, &config);
        let (started_by, _) = until_a_background_summary_is_ready(&proxy, &log, 1).await;
        let last = until_a_prefill_is_sent(&proxy, &log, started_by).await;
        let replica = if store.is_empty() { None } else { Some(ProxyProcess::start(&fake, &config)) };
        let next = replica.as_ref().unwrap_or(&proxy);
        // The agent's next request adds a few words, not a tool output: nothing passes the
        // threshold. The server now holds the rebuilt prompt, so it goes rebuilt: sent as before,
        // it would be prefilled whole again.
        let mut body = conversation(last);
        let messages = body["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": "Done reading. Shall I go on?"}));
        messages.push(json!({"role": "user", "content": "Yes."}));
        let answer =
            next.post("/v1/chat/completions", &[("authorization", "Bearer k"), ("x-session-id", "agent")], &body).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("x-compactor-compacted"), Some("1"), "{store}: {:?}", log.events());
        assert!(fake.last().json()["messages"].to_string().contains("Handoff summary"));
        let messages = body["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": "Going on."}));
        messages.push(json!({"role": "user", "content": "Good."}));
        let answer =
            next.post("/v1/chat/completions", &[("authorization", "Bearer k"), ("x-session-id", "agent")], &body).await;
        assert_eq!(answer.header("x-compactor-compacted"), Some("1"), "the next request keeps it");
        assert_eq!(log.summary_calls().len(), 1, "{:?}", log.events());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_prefill_ahead_without_the_local_preset_or_with_it_turned_off() {
    for config in [
        CONFIG.replace("openai_cache = \"local\"", "openai_cache = \"openai\""),
        format!("{CONFIG}prefill_ahead = false\n"),
    ] {
        let (fake, log) = fake_with_slow_summaries().await;
        let proxy = ProxyProcess::start(&fake, &config);
        let (mut last, _) = until_a_background_summary_is_ready(&proxy, &log, 1).await;
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            last += 1;
            let (_, answer) = turn(&proxy, last).await;
            if answer.header("x-compactor-compacted").is_some() {
                break;
            }
            assert!(last < 20, "{:?}", log.events());
        }
        let events = log.events();
        assert!(!events.iter().any(|(what, ..)| what == "prefill"), "{config}: {events:?}");
        assert_eq!(prefills_sent(&proxy).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_sent_while_the_summary_is_written_has_its_prompt_prefilled_once_the_summary_is_ready() {
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, CONFIG);
    let mut turns = 0;
    while log.summary_calls().is_empty() {
        turns += 1;
        assert!(turns <= 12, "no summary started: {:?}", log.events());
        turn(&proxy, turns).await;
        let started = async || !log.summary_calls().is_empty();
        eventually_within(Duration::from_millis(500), started).await;
    }
    // The agent's next turn comes while the summary is being written (its tool was quick): that
    // request cannot carry the summary, and the job that started it sends nothing ahead (the
    // server would serve this turn's prompt after evicting the prefilled one).
    turns += 1;
    let (_, answer) = turn(&proxy, turns).await;
    assert!(answer.header("x-compactor-compacted").is_none());
    // Once the summary is ready, the prompt rebuilt around it from that turn goes ahead.
    let sent = async || prefills_sent(&proxy).await > 0;
    assert!(eventually_within(SUMMARY_DELAY * 3, sent).await, "{:?}", log.events());
    turns += 1;
    let (_, answer) = turn(&proxy, turns).await;
    assert_eq!(answer.header("x-compactor-compacted"), Some("1"), "{:?}", log.events());
    let events = log.events();
    let at = events.iter().position(|(what, ..)| *what == format!("turn {turns}")).unwrap();
    assert_eq!(events[at - 1].0, "prefill", "{events:?}");
    assert_eq!(events.iter().filter(|(what, ..)| what == "prefill").count(), 1, "{events:?}");
    let received: Vec<Value> = fake.received().iter().map(|r| r.json()).collect();
    let prefill = received.iter().find(|body| body["max_tokens"] == 1).unwrap()["messages"].as_array().unwrap().clone();
    let sent = received.last().unwrap()["messages"].as_array().unwrap().clone();
    assert_eq!(&sent[..prefill.len()], &prefill[..], "the turn's prompt starts with the prefilled one");
    assert_eq!(log.summary_calls().len(), 1, "{events:?}");
}

/// In front of a local server the server the agent waits for generates the summary: it asks for
/// a twentieth of the window (`local_summary_window_share`), not the eighth a provider gets.
#[tokio::test(flavor = "multi_thread")]
async fn a_summary_for_a_local_server_asks_for_a_twentieth_of_the_window_not_an_eighth() {
    // The model's output cap (4,000) is above both shares of its 8,000-token window.
    let config = CONFIG.replace("max_output_tokens = 500", "max_output_tokens = 4000");
    let mut asked = Vec::new();
    for preset in ["local", "openai"] {
        let (fake, log) = fake_with_slow_summaries().await;
        let proxy = ProxyProcess::start(
            &fake,
            &config.replace("openai_cache = \"local\"", &format!("openai_cache = \"{preset}\"")),
        );
        until_a_background_summary_is_ready(&proxy, &log, 1).await;
        let summary = fake
            .received()
            .into_iter()
            .find(|received| {
                let text = String::from_utf8_lossy(&received.body);
                text.contains("context-compaction assistant") || text.contains("Write a detailed handoff summary")
            })
            .expect("a summary call");
        asked.push(summary.json()["max_tokens"].as_u64().expect("the summary call's max_tokens"));
    }
    let [local, provider] = asked[..] else { unreachable!() };
    // The summarizer's window is the learned one in compactor's tokens (calibrated against the
    // fake's count): about 8,000, so about 400 against about 1,000.
    assert!((300..=480).contains(&local), "local: {local}");
    assert!((750..=1_200).contains(&provider), "provider: {provider}");
    assert!(local * 2 < provider, "local {local}, provider {provider}");
}

/// A summary prepared in the background for a local server is as long as the server writes in
/// the agent's idle time, at the pace the conversation's previous summary call measured: the
/// first (nothing measured yet) asks for the window's share, the next for what fits.
#[tokio::test(flavor = "multi_thread")]
async fn a_background_summary_for_a_local_server_fits_the_time_the_agent_leaves_between_turns() {
    // The model's output cap is above the share of its 8,000-token window (about 400 tokens; the
    // floor is a fifth of it). The fake writes 3 ms a token; the agent's tool takes 0.8 s, of which
    // nine tenths are used: about 240.
    // In memory and in Redis (the gap and the pace are read back from the store).
    let redis = crate::common::redis_server::RedisServer::start();
    for store in std::iter::once(String::new()).chain(redis.as_ref().map(|redis| redis.config())) {
        let config = format!("{}{store}", CONFIG.replace("max_output_tokens = 500", "max_output_tokens = 4000"));
        paced_by_the_agents_idle_time(&config).await;
    }
}

async fn paced_by_the_agents_idle_time(config: &str) {
    let (fake, log) = fake_with_summaries(Some(Duration::from_millis(3))).await;
    let proxy = ProxyProcess::start(&fake, config);
    let idle = Duration::from_millis(800);
    let asked = || -> Vec<u64> {
        fake.received()
            .into_iter()
            .filter(|received| String::from_utf8_lossy(&received.body).contains("Write a detailed handoff summary"))
            .map(|received| received.json()["max_tokens"].as_u64().expect("the summary call's max_tokens"))
            .collect()
    };
    let mut turns = 0;
    while asked().len() < 2 {
        turns += 1;
        assert!(turns <= 30, "two background summaries: {:?} {:?}", asked(), log.events());
        turn(&proxy, turns).await;
        tokio::time::sleep(idle).await;
    }
    let [first, paced] = asked()[..2] else { unreachable!() };
    assert!((300..=480).contains(&first), "{config}: the first asks for the share: {first}");
    assert!((190..=290).contains(&paced), "{config}: the next fits 0.72 s at 3 ms a token: {paced} (first {first})");
}

#[tokio::test(flavor = "multi_thread")]
async fn background_summaries_in_flight_are_capped_and_the_ones_past_the_cap_are_counted_skipped() {
    let (fake, log) = fake_with_slow_summaries().await;
    let proxy = ProxyProcess::start(&fake, &format!("{CONFIG}background_max_inflight = 3\n"));
    let post = async |session: &str, turns: usize| {
        let headers = [("authorization", "Bearer k"), ("x-session-id", session)];
        let answer = proxy.post("/v1/chat/completions", &headers, &conversation(turns)).await;
        assert_eq!(answer.status, 200, "{session} turn {turns}: {}", answer.text());
    };
    // The turn at which a conversation starts its background summary, found on a first session.
    let mut first = 0;
    while log.summary_calls().is_empty() {
        first += 1;
        assert!(first <= 12, "no summary started before the threshold: {:?}", log.events());
        post("probe", first).await;
        let deadline = Instant::now() + Duration::from_millis(500);
        while log.summary_calls().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Eight more conversations up to the turn before, then all eight to that turn at once, while
    // the first one's summary is still being written (the fake takes 3 s).
    let sessions: Vec<String> = (0..8).map(|i| format!("agent-{i}")).collect();
    for session in &sessions {
        for turns in 1..first {
            post(session, turns).await;
        }
    }
    futures_util::future::join_all(sessions.iter().map(|session| post(session, first))).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let calls = log.summary_calls();
    assert_eq!(calls.len(), 3, "at most background_max_inflight summaries at once: {:?}", log.events());
    let text = metrics(&proxy).await;
    assert_eq!(metric(&text, "compactor_background_summaries_skipped_total", &["reason=\"capacity\""]), 6, "{text}");
    // Once they are written, a conversation's next crossing may be prepared again.
    let ready =
        async || metric(&metrics(&proxy).await, "compactor_background_summaries_total", &["outcome=\"ready\""]) >= 3;
    assert!(eventually_within(Duration::from_secs(20), ready).await);
}
