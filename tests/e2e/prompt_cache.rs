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

    const PLACEHOLDER: &str = "[Old tool result content cleared]";
    let provider = ProviderSim::start(ProviderSpec { window: 64_000, ..ProviderSpec::default() }).await;
    let extra =
        "[models.\"sim-model\"]\ncontext_window = 64000\n[prune]\nprotect_tokens = 8000\nminimum_tokens = 4000\n";
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
