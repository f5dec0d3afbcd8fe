//! The provider's prompt cache as compactor sees it (issue 17): cache reads and writes read from
//! JSON and SSE replies of all three dialects into the log line, the metrics and the admin
//! session view, through the real binary in front of the provider simulator.

use serde_json::{Value, json};

use crate::common::agents::ADMIN_TOKEN;
use crate::common::provider::{Dialect, ProviderSim, ProviderSpec};
use crate::common::{ProxyProcess, eventually};

fn conversation(dialect: Dialect, system: &str, users: &[&str], stream: bool) -> Value {
    let mut messages = Vec::new();
    for (i, user) in users.iter().enumerate() {
        if i > 0 {
            messages.push(match dialect {
                Dialect::Messages => json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}]}),
                Dialect::Responses => json!({"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok"}]}),
                Dialect::Chat => json!({"role": "assistant", "content": "ok"}),
            });
        }
        messages.push(match dialect {
            Dialect::Messages => json!({"role": "user", "content": [{"type": "text", "text": user}]}),
            Dialect::Responses => json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": user}]}),
            Dialect::Chat => json!({"role": "user", "content": user}),
        });
    }
    match dialect {
        Dialect::Messages => json!({"model": "m", "max_tokens": 1000, "stream": stream,
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}], "messages": messages}),
        Dialect::Responses => json!({"model": "m", "instructions": system, "input": messages, "stream": stream}),
        Dialect::Chat => {
            let mut all = vec![json!({"role": "system", "content": system})];
            all.extend(messages);
            json!({"model": "m", "messages": all, "stream": stream, "stream_options": {"include_usage": true}})
        }
    }
}

/// `name{route="route"} N` in the metrics text, 0 when absent.
fn metric(text: &str, name: &str, route: &str) -> u64 {
    let prefix = format!("{name}{{route=\"{route}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn cache_reads_and_writes_are_read_from_json_and_sse_replies_of_every_dialect() {
    let system = "s".repeat(8_000);
    for dialect in Dialect::ALL {
        for stream in [false, true] {
            let provider = ProviderSim::start(ProviderSpec { window: 100_000, ..ProviderSpec::default() }).await;
            let proxy = ProxyProcess::start_with(&provider.compactor_config(""), &[]);
            let session = format!("cache-{}-{stream}", dialect.name());
            let headers = [("x-session-id", session.as_str())];
            let first = conversation(dialect, &system, &["start the work", "first step"], stream);
            let grown = conversation(dialect, &system, &["start the work", "first step", "second step"], stream);
            let mut key = String::new();
            for body in [&first, &grown] {
                let answer = proxy.post(dialect.path(), &headers, body).await;
                assert_eq!(answer.status, 200, "{dialect:?} {stream}: {}", answer.text());
                key = answer.header("x-compactor-session").expect("the session compactor identified").to_string();
            }
            let records = provider.records();
            let (read, write) = (records[1].cache_read, records[1].cache_write);
            assert!(read > 1_000, "{dialect:?} {stream}: the second request read the first from cache ({read})");
            if dialect == Dialect::Messages {
                assert!(records[0].cache_write > 1_000, "Anthropic reports the first request's cache write");
            }
            // The log line of the second request says what the provider reported.
            let needle = format!("cache_read={read} cache_write={write}");
            let found = eventually(async || proxy.logs().iter().any(|line| line.contains(&needle))).await;
            assert!(found, "{dialect:?} {stream}: no log line with {needle}: {:?}", proxy.logs());
            let route = match dialect {
                Dialect::Chat => "chat_completions",
                Dialect::Messages => "messages",
                Dialect::Responses => "responses",
            };
            let text = proxy.get_with_token("/metrics", "").await.text();
            let total_write: usize = records.iter().map(|r| r.cache_write).sum();
            assert_eq!(metric(&text, "compactor_cache_read_tokens_total", route), read as u64, "{dialect:?} {stream}");
            assert_eq!(
                metric(&text, "compactor_cache_write_tokens_total", route),
                total_write as u64,
                "{dialect:?} {stream}"
            );
            // The admin view's hit ratio: reads over the prompt tokens of both requests.
            let view = async || {
                let answer = proxy.get_with_token(&format!("/admin/sessions/{key}"), ADMIN_TOKEN).await;
                answer.json()["state"].clone()
            };
            let prompt: usize = records.iter().map(|r| r.tokens).sum();
            let expected = (read as f64 / prompt as f64 * 1000.0).round() / 1000.0;
            assert!(
                eventually(async || view().await["cache_hit_ratio"].as_f64() == Some(expected)).await,
                "{dialect:?} {stream}: {} (expected {expected})",
                view().await
            );
        }
    }
}

#[tokio::test]
async fn old_outputs_are_pruned_in_batches_that_clear_minimum_tokens_never_a_little_each_turn() {
    use crate::common::agents::{Agent, AgentSession, SessionSpec, drive};
    use crate::common::provider::{ANTHROPIC, bill_by_prefix};

    // The start of every placeholder, fixed or naming its call.
    const PLACEHOLDER: &str = "[Old tool result content cleared";
    let provider = ProviderSim::start(ProviderSpec { window: 64_000, ..ProviderSpec::default() }).await;
    let extra = "[models.\"sim-model\"]\ncontext_window = 64000\n[prune]\nprotect_tokens = 8000\nminimum_tokens = 4000\npressure = 0.5\n";
    let proxy = ProxyProcess::start_with(&provider.compactor_config(extra), &[]);
    let spec = SessionSpec::new(Agent::Plain(Dialect::Messages), "sim-model").outputs(&[1_500]);
    let turns = 30;
    let run = drive(&proxy.url(""), &provider, &mut AgentSession::new(spec), turns).await;
    assert_eq!(run.stats().client_errors, 0);
    let answered: Vec<_> = run.records.iter().filter(|r| !r.summary && r.outcome.is_answered()).collect();
    let placeholders: Vec<usize> =
        answered.iter().map(|r| String::from_utf8_lossy(&r.body).matches(PLACEHOLDER).count()).collect();
    let changed: Vec<usize> = (1..placeholders.len()).filter(|&i| placeholders[i] != placeholders[i - 1]).collect();
    let batches: Vec<usize> = changed.iter().map(|&i| placeholders[i].saturating_sub(placeholders[i - 1])).collect();
    assert!(!batches.is_empty(), "a 30-turn session of 45k tokens of output is pruned: {placeholders:?}");
    assert!(batches.iter().all(|&n| n >= 3), "each batch clears at least minimum_tokens: {placeholders:?}");
    assert!(changed.windows(2).all(|w| w[1] - w[0] >= 3), "never turn after turn: {placeholders:?}");
    assert!(batches.len() <= turns / 3, "{placeholders:?}");
    // Every other turn extends the previous request: the only breaks are the batches.
    let bill = bill_by_prefix(&run.records, &ANTHROPIC);
    assert_eq!(bill.breaks, batches.len(), "{placeholders:?}");
}

/// The raw JSON of `body`'s `system`, `tools` and first `count` messages, the billing line of
/// Claude Code (new on every request, not part of what is cached) left out of the system.
fn stable_part(body: &[u8], count: usize) -> Vec<String> {
    use serde_json::value::RawValue;
    let top: std::collections::HashMap<String, Box<RawValue>> = serde_json::from_slice(body).unwrap();
    let system: Vec<Box<RawValue>> = serde_json::from_str(top["system"].get()).unwrap();
    let messages: Vec<Box<RawValue>> = serde_json::from_str(top["messages"].get()).unwrap();
    let system = system.iter().map(|b| b.get()).filter(|b| !b.contains("x-anthropic-billing-header"));
    let mut part: Vec<String> = system.map(str::to_string).collect();
    part.push(top["tools"].get().to_string());
    part.extend(messages[..count].iter().map(|m| m.get().to_string()));
    part
}

/// An Anthropic conversation of `turns` user requests, each answered by a long assistant text
/// (never pruned), with Claude Code's markers: two system blocks and the newest message.
fn long_answers(turns: usize) -> Value {
    let mut messages = Vec::new();
    for turn in 0..turns {
        if turn > 0 {
            let text = crate::common::tool_output(&format!("answer {turn}"), 1_500);
            messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": text}]}));
        }
        messages.push(json!({"role": "user", "content": [{"type": "text", "text": format!("step {turn}")}]}));
    }
    messages.last_mut().unwrap()["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    json!({"model": "sim-model", "max_tokens": 1000, "stream": false,
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": messages})
}

#[tokio::test]
async fn after_a_compaction_the_next_requests_share_the_prefix_through_the_summary_which_carries_a_marker() {
    const PREFIX: &str = "Another language model started to solve this task";
    let provider = ProviderSim::start(ProviderSpec { window: 20_000, ..ProviderSpec::default() }).await;
    let extra = "[models.\"sim-model\"]\ncontext_window = 20000\n[compaction]\nkeep_recent_tokens = 4000\n";
    let proxy = ProxyProcess::start_with(&provider.compactor_config(extra), &[]);
    let headers = [("x-session-id", "summary-marker")];
    let mut sent: Vec<Vec<u8>> = Vec::new();
    for turns in 1..=16 {
        let answer = proxy.post("/v1/messages", &headers, &long_answers(turns)).await;
        assert_eq!(answer.status, 200, "turn {turns}");
        let last = provider.records().into_iter().rev().find(|r| !r.summary).unwrap();
        sent.push(last.body.to_vec());
    }
    assert!(provider.summary_calls() >= 1, "a 24k conversation in a 20k window is summarized");
    // Requests that carry the same summary: the stable part is the same bytes on each.
    let summary_of = |body: &[u8]| -> Option<Value> {
        let value: Value = serde_json::from_slice(body).unwrap();
        let first = value["messages"][0].clone();
        first.to_string().contains(PREFIX).then_some(first)
    };
    let mut shared = 0;
    for pair in sent.windows(2) {
        let (Some(a), Some(b)) = (summary_of(&pair[0]), summary_of(&pair[1])) else { continue };
        for body in [&pair[0], &pair[1]] {
            let value: Value = serde_json::from_slice(body).unwrap();
            // Three client markers: compactor's own on the summary makes four, never more.
            assert_eq!(value["messages"][0]["content"][0]["cache_control"], json!({"type": "ephemeral"}));
            assert_eq!(String::from_utf8_lossy(body).matches("\"cache_control\"").count(), 4);
        }
        if a == b {
            assert_eq!(stable_part(&pair[0], 1), stable_part(&pair[1], 1), "tools, system, summary: same bytes");
            shared += 1;
        }
    }
    assert!(shared >= 2, "the summary is re-applied on later turns: {shared}");
}

/// `compactor_prefix_breaks_total{reason="…"}` in the metrics text.
fn breaks(text: &str, reason: &str) -> u64 {
    let prefix = format!("compactor_prefix_breaks_total{{reason=\"{reason}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn below_pressure_nothing_the_model_read_is_removed_until_the_deployment_knows_conversations_run_on() {
    use crate::common::agents::{Agent, AgentSession, SessionSpec, drive};
    use crate::common::provider::{ANTHROPIC, bill_by_prefix};

    // Claude Code's request shape, 60 turns of ~4k tokens of output on a 1M window: 240k tokens,
    // never near pressure (half the window), far past protect_tokens + minimum_tokens.
    let turns = 60;
    let spec = SessionSpec::new(Agent::ClaudeCode, "claude-sonnet-4-5").outputs(&[4_000]).seed(26);
    let window = "[models.\"claude-sonnet-4-5\"]\ncontext_window = 1000000\n";
    let provider_spec = ProviderSpec { window: 1_000_000, keep_bodies: false, ..ProviderSpec::default() };
    let direct_provider = ProviderSim::start(provider_spec.clone()).await;
    let direct = drive(&direct_provider.url(), &direct_provider, &mut AgentSession::new(spec.clone()), turns).await;
    let direct_bill = bill_by_prefix(&direct.records, &ANTHROPIC);

    // Defaults, nothing measured: the prompt goes as the agent sent it, every fact with it.
    let provider = ProviderSim::start(provider_spec.clone()).await;
    let proxy = ProxyProcess::start_with(&provider.compactor_config(window), &[]);
    let run = drive(&proxy.url(""), &provider, &mut AgentSession::new(spec.clone()), turns).await;
    let bill = bill_by_prefix(&run.records, &ANTHROPIC);
    assert_eq!(bill.breaks, direct_bill.breaks, "no cache break of compactor's below pressure");
    assert_eq!(run.stats().facts_retained, run.stats().facts_planted);
    assert!(bill.cost <= direct_bill.cost * 1.001, "{} vs {}", bill.cost, direct_bill.cost);
    let held = proxy.get_with_token("/metrics", "").await.text();
    assert_eq!(breaks(&held, "pays_back") + breaks(&held, "pressure") + breaks(&held, "cold_cache"), 0);

    // A deployment that has seen conversations of 200 turns: old outputs go where they pay back,
    // and the session costs less than direct.
    let provider = ProviderSim::start(provider_spec).await;
    let proxy =
        ProxyProcess::start_with(&provider.compactor_config(&format!("{window}[prune]\nassumed_runs = [200]\n")), &[]);
    let run = drive(&proxy.url(""), &provider, &mut AgentSession::new(spec), turns).await;
    let pruned = bill_by_prefix(&run.records, &ANTHROPIC);
    let text = proxy.get_with_token("/metrics", "").await.text();
    assert!(breaks(&text, "pays_back") > 0, "{text}");
    assert_eq!(breaks(&text, "pressure"), 0);
    assert!(pruned.cost < direct_bill.cost, "{} vs {}", pruned.cost, direct_bill.cost);
}
