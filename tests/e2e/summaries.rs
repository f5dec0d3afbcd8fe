//! What the agent read reaches the summary on any window (issue 28): sessions whose facts sit in
//! the middle of user messages and of single-line and multi-line tool outputs, summarized by the
//! request's own small model through the binary, in every dialect; and the placeholder of a pruned
//! output, which names its call and reads the same on every turn.

use serde_json::Value;

use crate::common::agents::*;
use crate::common::provider::*;
use crate::common::*;

/// A model no table knows: compactor learns its window from the provider's errors.
const UNKNOWN: &str = "sim-local-model";
/// The turns: a ~600-token tool output, and every turn a ~250-token user message.
const OUTPUT_TOKENS: usize = 600;
const USER_TOKENS: usize = 250;
/// The windows and the turns that outgrow them.
const WINDOWS: [(usize, usize); 2] = [(8_192, 13), (4_096, 6)];

/// A session of `turns` on a provider of `window` tokens through compactor with `extra` config.
async fn session(dialect: Dialect, window: usize, turns: usize, extra: &str) -> (Run, ProxyProcess) {
    let provider = ProviderSim::start(ProviderSpec { window, ..ProviderSpec::default() }).await;
    let proxy = ProxyProcess::start_with(&provider.compactor_config(extra), &[]);
    let spec = SessionSpec::new(Agent::Plain(dialect), UNKNOWN)
        .outputs(&[OUTPUT_TOKENS])
        .facts_in_middle(USER_TOKENS, 1)
        .seed(window as u64 + turns as u64);
    (drive(&proxy.url(""), &provider, &mut AgentSession::new(spec), turns).await, proxy)
}

/// Facts of the run that reached the model on every turn from the one that planted them, and
/// those planted, from user messages and from tool outputs.
fn kept(run: &Run) -> [(usize, usize); 2] {
    let lost: Vec<String> = run.lost_facts().into_iter().map(|(marker, _)| marker).collect();
    [false, true].map(|in_output| {
        let planted: Vec<&Fact> = run.facts.iter().filter(|f| f.in_tool_output == in_output).collect();
        (planted.iter().filter(|f| !lost.contains(&f.marker)).count(), planted.len())
    })
}

/// Whether every summary call fit the window with the answer it asked for.
fn summaries_fit(run: &Run, window: usize) -> bool {
    run.records.iter().filter(|r| r.summary).all(|r| r.outcome.is_answered() && r.tokens + r.max_tokens <= window)
}

#[tokio::test]
async fn every_fact_in_the_middle_of_messages_and_outputs_reaches_the_model_on_4k_and_8k_windows() {
    for dialect in Dialect::ALL {
        for (window, turns) in WINDOWS {
            let (run, _proxy) = session(dialect, window, turns, "").await;
            let stats = run.stats();
            let case = format!("{dialect:?} {window} x {turns}: {stats:?}");
            assert_eq!(stats.client_errors, 0, "{case}");
            assert!(stats.summary_calls > 0, "the session outgrew the window: {case}");
            assert!(summaries_fit(&run, window), "every summary call fits: {case}");
            let [(users_kept, users), (outputs_kept, outputs)] = kept(&run);
            assert!(users >= 2 && outputs >= 2, "facts were planted in both: {case}");
            assert_eq!((users_kept, outputs_kept), (users, outputs), "{case}: lost {:?}", run.lost_facts());
        }
    }
}

#[tokio::test]
async fn the_request_that_summarized_says_in_its_log_line_and_the_metrics_how_many_summary_calls_it_made() {
    // Summaries on the requests' own paths: one prepared in the background is nobody's request
    // (its calls reach the provider between two turns; its `compacted` line says
    // `trigger=background`, tests/e2e/background.rs).
    let (run, proxy) = session(Dialect::Chat, 4_096, 6, "[compaction]\nbackground = false\n").await;
    let mut total = 0;
    for turn in &run.turns {
        let calls = run.records[turn.records.clone()].iter().filter(|r| r.summary).count();
        total += calls;
        let id = turn.compactor.iter().find(|(n, _)| n == "x-compactor-request-id").map(|(_, v)| v.clone()).unwrap();
        let line = proxy.wait_for_log(&format!("request_id={id}")).await;
        assert!(line.contains(&format!("summary_calls={calls} ")), "turn {}: {calls} calls: {line}", turn.index);
    }
    assert!(total >= 2, "the whole transcript took pieces: {total}");
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let sum = metrics.lines().find_map(|l| l.strip_prefix("compactor_summary_calls_per_compaction_sum "));
    assert_eq!(sum.map(str::trim), Some(total.to_string().as_str()), "{metrics}");
}

/// The placeholders in a request body, by the call id of the output they replace.
fn placeholders(body: &[u8]) -> Vec<(String, String)> {
    fn walk(value: &Value, found: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) => {
                let id = ["tool_call_id", "tool_use_id", "call_id"].iter().find_map(|k| map.get(*k)?.as_str());
                let text = ["content", "output"].iter().find_map(|k| map.get(*k)?.as_str());
                if let (Some(id), Some(text)) = (id, text)
                    && text.starts_with("[Old tool result content cleared")
                {
                    found.push((id.to_string(), text.to_string()));
                }
                map.values().for_each(|v| walk(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(&serde_json::from_slice(body).unwrap_or(Value::Null), &mut found);
    found
}

/// The tool name and arguments (as compactor shows them) of call `id` in a request body.
fn call_of(body: &[u8], id: &str) -> Option<(String, String)> {
    fn walk(value: &Value, id: &str) -> Option<(String, String)> {
        match value {
            Value::Object(map) => {
                let own = ["id", "call_id"].iter().any(|k| map.get(*k).and_then(Value::as_str) == Some(id));
                let function = map.get("function").unwrap_or(value);
                if own && let Some(name) = function.get("name").and_then(Value::as_str) {
                    let arguments = match (function.get("arguments"), map.get("input")) {
                        (Some(Value::String(text)), _) => text.clone(),
                        (_, Some(input)) => input.to_string(),
                        _ => String::new(),
                    };
                    return Some((name.to_string(), arguments));
                }
                map.values().find_map(|v| walk(v, id))
            }
            Value::Array(items) => items.iter().find_map(|v| walk(v, id)),
            _ => None,
        }
    }
    walk(&serde_json::from_slice(body).ok()?, id)
}

#[tokio::test]
async fn a_pruned_output_names_its_call_and_reads_the_same_on_every_later_turn() {
    // A large window: outputs are pruned by the policy, never summarized; no cache prices, so each
    // batch goes as soon as it clears the minimum.
    let no_cache = "openai_cache = \"none\"\nanthropic_cache = \"none\"\n[admin]";
    let prune = "[prune]\nprotect_tokens = 3000\nminimum_tokens = 1500\n";
    for dialect in Dialect::ALL {
        let provider = ProviderSim::start(ProviderSpec::default()).await;
        let config = provider.compactor_config(prune).replacen("[admin]", no_cache, 1);
        let proxy = ProxyProcess::start_with(&config, &[]);
        let spec = SessionSpec::new(Agent::Plain(dialect), UNKNOWN).outputs(&[1_000]).seed(28);
        let run = drive(&proxy.url(""), &provider, &mut AgentSession::new(spec), 14).await;
        assert_eq!(run.stats().client_errors, 0, "{dialect:?}");
        let answered = run.answered_requests();
        let mut first_seen: std::collections::HashMap<String, (usize, String)> = Default::default();
        for (turn, record) in answered.iter().enumerate() {
            for (id, text) in placeholders(&record.body) {
                let (tool, args) = call_of(&record.body, &id).expect("the pruned output's call is in the request");
                assert!(cleared(&text, &tool, &args), "{dialect:?}: {text} does not name {tool} {args}");
                assert!(text.len() <= 300, "{dialect:?}: a placeholder stays short: {text}");
                let (since, first) = first_seen.entry(id.clone()).or_insert((turn, text.clone()));
                assert_eq!(&text, first, "{dialect:?}: the placeholder of {id} changed after turn {since}");
            }
        }
        assert!(first_seen.len() >= 3, "{dialect:?}: outputs were pruned: {first_seen:?}");
        // Once pruned, an output stays pruned on every later turn.
        let last = placeholders(&answered.last().unwrap().body);
        assert_eq!(last.len(), first_seen.len(), "{dialect:?}");
    }
}

/// The windows table of issue 28, re-measured for `docs/summaries.md`: for each transcript mode,
/// window and dialect, the summary calls of the session, the agent requests that overflowed,
/// whether every summary call fit, and the facts kept. Run with
/// `cargo test --test e2e summaries::windows_table -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement: prints the table docs/summaries.md shows"]
async fn windows_table() {
    println!(
        "| transcript | dialect | window, turns | summary calls | overflows | every summary call fits | facts from user messages | facts from tool outputs |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for transcript in ["whole", "head_tail"] {
        for (window, turns) in WINDOWS {
            for dialect in Dialect::ALL {
                let extra = format!(
                    "[compaction]
transcript = \"{transcript}\"
"
                );
                let (run, _proxy) = session(dialect, window, turns, &extra).await;
                let stats = run.stats();
                let [(users_kept, users), (outputs_kept, outputs)] = kept(&run);
                println!(
                    "| {transcript} | {} | {}k, {turns} | {} | {} | {} | {users_kept} of {users} | {outputs_kept} of {outputs} |",
                    dialect.name(),
                    window / 1024,
                    stats.summary_calls,
                    stats.overflows,
                    if summaries_fit(&run, window) { "yes" } else { "no" },
                );
            }
        }
    }
}
