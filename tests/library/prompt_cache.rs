//! Rewrites that keep the provider's prompt cache (issue 17): sessions grown turn by turn through
//! the rewrite with what the provider has seen, asserting on the bytes that would go upstream.

use std::collections::BTreeSet;
use std::time::Duration;

use compactor::dialect::{Dialect, ParsedRequest};
use compactor::rewrite::{CachePricing, History, Reason, Rewriter, Rewritten};
use serde_json::{Value, json};

use crate::common::{Settings, cleared, tool_output};

/// Small windows: 4,000 tokens of recent output protected, batches of at least 500.
fn rewriter() -> Rewriter {
    Settings::defaults().prune_window(4_000, 500).tool_output_max_tokens(2_000).rewriter(10_000)
}

/// A warm Anthropic cache: the previous request came a few seconds ago.
fn warm<'a>(pruned: &'a BTreeSet<String>, seen_messages: usize, turns: u64) -> History<'a> {
    History {
        pruned_before: pruned,
        seen_messages,
        pricing: CachePricing::ANTHROPIC,
        later_turns: turns,
        idle: Some(Duration::from_secs(5)),
        pressure: false,
    }
}

fn chat(outputs: &[String]) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Fix the failing test."}),
    ];
    for (i, text) in outputs.iter().enumerate() {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}"), "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"n\":{i}}}")}}
        ]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": text}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

fn anthropic(outputs: &[String]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing test."})];
    let last = outputs.len().saturating_sub(1);
    for (i, text) in outputs.iter().enumerate() {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read", "input": {"n": i}}
        ]}));
        let mut result = json!({"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": text});
        if i == last {
            // Claude Code marks the newest message.
            result["cache_control"] = json!({"type": "ephemeral"});
        }
        messages.push(json!({"role": "user", "content": [result]}));
    }
    json!({"model": "claude-sonnet-4-5", "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": messages})
}

fn body(dialect: Dialect, outputs: &[String]) -> Vec<u8> {
    let value = if dialect == Dialect::ChatCompletions { chat(outputs) } else { anthropic(outputs) };
    serde_json::to_vec(&value).unwrap()
}

/// What goes upstream: the rewritten body or the client's own.
fn sent(rewritten: &Rewritten, client: &[u8]) -> Vec<u8> {
    rewritten.body.clone().unwrap_or_else(|| client.to_vec())
}

/// Each message's bytes as they go upstream.
fn messages(dialect: Dialect, body: &[u8]) -> Vec<String> {
    ParsedRequest::parse(dialect, body).unwrap().messages.iter().map(|m| m.raw.to_string()).collect()
}

/// Tool outputs of a session: distinct files, with `reread` (index) read again at the end.
fn outputs(count: usize, tokens: usize) -> Vec<String> {
    (0..count).map(|i| tool_output(&format!("file {i}"), tokens)).collect()
}

/// Sends a session turn by turn (one output more each turn) with what the provider saw, and
/// checks every request starts with the previous one's messages, byte for byte.
fn grow(dialect: Dialect, all: &[String], turns_before: u64) -> Vec<Rewritten> {
    let rewriter = rewriter();
    let mut pruned = BTreeSet::new();
    let mut previous: Option<Vec<String>> = None;
    let mut reports = Vec::new();
    for turn in 1..=all.len() {
        let client = body(dialect, &all[..turn]);
        let seen = previous.as_ref().map_or(0, Vec::len);
        let history = warm(&pruned, seen, turns_before + turn as u64);
        let rewritten = rewriter.rewrite_body_in(dialect, &client, &history).unwrap();
        let now = messages(dialect, &sent(&rewritten, &client));
        if let Some(before) = &previous {
            for (index, message) in before.iter().enumerate() {
                // Claude Code's marker moves to the newest message: the message it left differs
                // only by it, as it does without compactor.
                let unmarked = |m: &str| m.replace(r#","cache_control":{"type":"ephemeral"}"#, "");
                assert_eq!(unmarked(message), unmarked(&now[index]), "turn {turn}: message {index} changed upstream");
            }
        }
        pruned.extend(rewritten.report.pruned_call_ids.iter().cloned());
        previous = Some(now);
        reports.push(rewritten);
    }
    reports
}

#[test]
fn a_re_read_leaves_every_earlier_message_byte_identical_upstream() {
    for dialect in [Dialect::ChatCompletions, Dialect::AnthropicMessages] {
        let mut all = outputs(3, 150);
        all.push(all[0].clone());
        let reports = grow(dialect, &all, 0);
        let last = reports.last().unwrap();
        assert_eq!(last.report.deduped, 1, "{dialect:?}: the newest copy is the one made a pointer");
        let sent = messages(dialect, last.body.as_ref().unwrap());
        // The pointer names the call it repeats: its tool, its arguments and its id.
        let pointer = sent.last().unwrap();
        let tool = if dialect == Dialect::ChatCompletions { "read_file" } else { "Read" };
        let named = format!(r#"identical to the earlier result of {tool} {{\"n\":0}} (call"#);
        assert!(pointer.contains(&named), "{pointer}");
        assert!(pointer.contains("_0)"), "{dialect:?}: it points at the first read");
    }
}

#[test]
fn below_the_pay_back_point_every_earlier_message_goes_as_the_client_sent_it() {
    // 7 outputs of ~800 tokens: a batch of two old outputs is ready, but the session is young
    // and re-writing the protected tail would cost more than the batch saves over 7 more turns.
    let all = outputs(7, 600);
    for dialect in [Dialect::ChatCompletions, Dialect::AnthropicMessages] {
        let reports = grow(dialect, &all, 0);
        let last = reports.last().unwrap();
        assert_eq!(last.report.pruned, 0, "{dialect:?}");
        assert!(last.report.held_tokens > 1_000, "{dialect:?}: a batch is pending: {}", last.report.held_tokens);
        let client = body(dialect, &all);
        assert_eq!(messages(dialect, &sent(last, &client)), messages(dialect, &client), "{dialect:?}");
    }
}

#[test]
fn a_pending_batch_goes_in_one_break_when_the_cache_is_cold_the_window_presses_or_it_pays_back() {
    let all = outputs(7, 600);
    let client = body(Dialect::ChatCompletions, &all);
    let none = BTreeSet::new();
    let rewriter = rewriter();
    let seen = 2 + 2 * 6;
    let warm_young = warm(&none, seen, 7);
    let held = rewriter.rewrite_body_in(Dialect::ChatCompletions, &client, &warm_young).unwrap();
    assert_eq!((held.report.pruned, held.report.prefix_break), (0, None));

    let cases = [
        (History { idle: Some(Duration::from_secs(600)), ..warm_young.clone() }, Reason::Cold),
        (History { pressure: true, ..warm_young.clone() }, Reason::Pressure),
        (History { later_turns: 500, ..warm_young.clone() }, Reason::PaysBack),
        (History { pricing: CachePricing::NONE, ..warm_young.clone() }, Reason::NoCache),
    ];
    for (history, reason) in cases {
        let rewritten = rewriter.rewrite_body_in(Dialect::ChatCompletions, &client, &history).unwrap();
        assert_eq!(rewritten.report.prefix_break, Some(reason));
        // Everything outside the protected window at once.
        assert!(rewritten.report.pruned >= 2, "{reason:?}: {} pruned", rewritten.report.pruned);
        assert_eq!(rewritten.report.held_tokens, 0);
    }
}

#[test]
fn a_pointer_never_points_at_a_pruned_copy() {
    // call_0 is pruned (an earlier batch); its re-read at the end is kept whole, not a pointer.
    let mut all = outputs(3, 150);
    all.push(all[0].clone());
    let client = body(Dialect::ChatCompletions, &all);
    let pruned: BTreeSet<String> = ["call_0".to_string()].into();
    let rewritten = rewriter().rewrite_body_in(Dialect::ChatCompletions, &client, &warm(&pruned, 8, 4)).unwrap();
    let sent: Value = serde_json::from_slice(rewritten.body.as_ref().unwrap()).unwrap();
    let texts: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert!(cleared(texts[0], "read_file", r#"{"n":0}"#), "{}", texts[0]);
    assert_eq!(texts[3], all[0], "the re-read is the copy the model can still read");
    assert_eq!(rewritten.report.deduped, 0);
}

#[test]
fn every_client_cache_control_marker_survives_pruning_and_truncation() {
    // Markers on the system prompt, on two older results (one inside the result's content) and
    // on the newest; old results pruned under pressure, one huge output cut.
    let mut all = outputs(10, 150);
    all.push(tool_output("huge", 6_000));
    let mut value = anthropic(&all);
    let messages_json = value["messages"].as_array_mut().unwrap();
    messages_json[2]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    messages_json[4]["content"][0]["content"] =
        json!([{"type": "text", "text": all[1].clone(), "cache_control": {"type": "ephemeral"}}]);
    let client = serde_json::to_vec(&value).unwrap();
    let markers = |body: &[u8]| String::from_utf8_lossy(body).matches("\"cache_control\"").count();
    assert_eq!(markers(&client), 4);
    let none = BTreeSet::new();
    let history = History { pressure: true, ..warm(&none, 22, 11) };
    let small = Settings::defaults().prune_window(400, 200).tool_output_max_tokens(2_000).rewriter(10_000);
    let rewritten = small.rewrite_body_in(Dialect::AnthropicMessages, &client, &history).unwrap();
    let report = &rewritten.report;
    assert!(report.pruned >= 8 && report.truncated == 1, "{report:?}");
    let forwarded = rewritten.body.unwrap();
    assert_eq!(markers(&forwarded), 4, "{}", String::from_utf8_lossy(&forwarded));
    let sent: Value = serde_json::from_slice(&forwarded).unwrap();
    assert!(cleared(sent["messages"][4]["content"][0]["content"].as_str().unwrap(), "Read", r#"{"n":1}"#));
    assert_eq!(sent["messages"][4]["content"][0]["cache_control"], json!({"type": "ephemeral"}));

    // Three client markers (the one inside the result's content gone): compactor adds its own
    // before the first pruned message, and the request carries four, every client marker kept.
    value["messages"][4]["content"][0]["content"] = json!(all[1].clone());
    let client = serde_json::to_vec(&value).unwrap();
    assert_eq!(markers(&client), 3);
    let rewritten = small.rewrite_body_in(Dialect::AnthropicMessages, &client, &history).unwrap();
    let forwarded = rewritten.body.unwrap();
    assert_eq!(markers(&forwarded), 4, "{}", String::from_utf8_lossy(&forwarded));
    let sent: Value = serde_json::from_slice(&forwarded).unwrap();
    assert_eq!(sent["system"][0]["cache_control"], json!({"type": "ephemeral"}));
    assert_eq!(sent["messages"][2]["content"][0]["cache_control"], json!({"type": "ephemeral"}));
    let newest = sent["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(newest["content"][0]["cache_control"], json!({"type": "ephemeral"}));
}

/// Where compactor's own marker is in a forwarded Anthropic body: (message, block) of every
/// marked block the client did not mark.
fn added_markers(client: &Value, forwarded: &[u8]) -> Vec<(usize, usize)> {
    let sent: Value = serde_json::from_slice(forwarded).unwrap();
    let mut added = Vec::new();
    for (m, message) in sent["messages"].as_array().unwrap().iter().enumerate() {
        for (b, block) in message["content"].as_array().into_iter().flatten().enumerate() {
            let was = &client["messages"][m]["content"][b]["cache_control"];
            if !block["cache_control"].is_null() && was.is_null() {
                added.push((m, b));
            }
        }
    }
    added
}

#[test]
fn a_prune_batch_of_seen_messages_gets_a_marker_on_the_last_block_before_the_first_changed_message() {
    // The client marks its system prompt and its newest message; a batch goes on a cold cache.
    let all = outputs(7, 600);
    let value = anthropic(&all);
    let client = serde_json::to_vec(&value).unwrap();
    let none = BTreeSet::new();
    let seen = 1 + 2 * 6;
    let cold = History { idle: Some(Duration::from_secs(600)), ..warm(&none, seen, 7) };
    let rewritten = rewriter().rewrite_body_in(Dialect::AnthropicMessages, &client, &cold).unwrap();
    assert_eq!(rewritten.report.prefix_break, Some(Reason::Cold));
    let forwarded = rewritten.body.clone().unwrap();
    let sent: Value = serde_json::from_slice(&forwarded).unwrap();
    let unmarked = |m: &Value| m.to_string().replace(r#","cache_control":{"type":"ephemeral"}"#, "");
    let first_changed = (0..value["messages"].as_array().unwrap().len())
        .find(|&m| unmarked(&sent["messages"][m]) != unmarked(&value["messages"][m]))
        .unwrap();
    assert!(first_changed > 1, "an old result was pruned: {first_changed}");
    // The assistant's tool_use right before the first pruned result: the untouched prefix.
    assert_eq!(added_markers(&value, &forwarded), vec![(first_changed - 1, 0)]);
    assert_eq!(sent["messages"][first_changed - 1]["content"][0]["cache_control"], json!({"type": "ephemeral"}));
    // Nothing else of the prefix changed but the marker.
    for m in 0..first_changed {
        assert_eq!(unmarked(&sent["messages"][m]), unmarked(&value["messages"][m]));
    }

    // Only the newest message changed (a fresh output cut to head and tail): nothing the provider
    // has seen changed, so no marker of compactor's own.
    let mut big = outputs(2, 150);
    big.push(tool_output("huge", 6_000));
    let value = anthropic(&big);
    let client = serde_json::to_vec(&value).unwrap();
    let rewritten = rewriter().rewrite_body_in(Dialect::AnthropicMessages, &client, &warm(&none, 5, 3)).unwrap();
    assert_eq!(rewritten.report.truncated, 1);
    assert_eq!(added_markers(&value, rewritten.body.as_ref().unwrap()), vec![]);
}

#[test]
fn a_client_that_sends_no_marker_gets_none_from_compactor() {
    let all = outputs(7, 600);
    let mut value = anthropic(&all);
    let text = value.to_string().replace(r#","cache_control":{"type":"ephemeral"}"#, "");
    value = serde_json::from_str(&text).unwrap();
    let client = serde_json::to_vec(&value).unwrap();
    assert!(!text.contains("cache_control"));
    let none = BTreeSet::new();
    let cold = History { idle: Some(Duration::from_secs(600)), ..warm(&none, 13, 7) };
    let rewritten = rewriter().rewrite_body_in(Dialect::AnthropicMessages, &client, &cold).unwrap();
    assert!(rewritten.report.pruned >= 2);
    assert!(!String::from_utf8_lossy(rewritten.body.as_ref().unwrap()).contains("cache_control"));
}

#[test]
fn a_summary_gets_a_marker_when_one_is_free_and_the_same_bytes_every_turn() {
    use compactor::compaction::plan;
    use compactor::session::state::CompactionRecord;

    let record = |covered: u64| CompactionRecord {
        generation: 1,
        summary: "The agent read four files.".into(),
        covered_messages: covered,
        covered_hash: String::new(),
        first_kept: covered,
        user_messages: Vec::new(),
        truncate_user_tokens: 0,
        tokens_before: 0,
        tokens_after: 0,
        trigger: "threshold".into(),
        model: "m".into(),
        at_unix_ms: 0,
        due_tokens: 0,
        cost: Default::default(),
        started_by: String::new(),
        built_on: 0,
        us_per_token: 0,
    };
    let count = |text: &str| text.len() as u32 / 4;
    let rebuilt = |value: &Value| {
        let client = serde_json::to_vec(value).unwrap();
        let parsed = ParsedRequest::parse(Dialect::AnthropicMessages, &client).unwrap();
        let body = plan::rebuild(&parsed, &record(5), "Summary: ", &count).unwrap();
        let summary = messages(Dialect::AnthropicMessages, &body)[0].clone();
        (body, summary)
    };
    let markers = |body: &[u8]| String::from_utf8_lossy(body).matches("\"cache_control\"").count();
    // System and newest message marked: the summary gets the third, turn after turn.
    let (body, summary) = rebuilt(&anthropic(&outputs(4, 100)));
    assert_eq!(
        summary,
        r#"{"role":"user","content":[{"type":"text","text":"Summary: The agent read four files.","cache_control":{"type":"ephemeral"}}]}"#
    );
    assert_eq!(markers(&body), 3);
    let (_, next) = rebuilt(&anthropic(&outputs(5, 100)));
    assert_eq!(next, summary, "the next turn's summary is the same bytes");

    // A one-hour marker after it: the summary's marker takes its TTL (1h entries come first).
    let mut value = anthropic(&outputs(4, 100));
    let text = value.to_string().replace(r#"{"type":"ephemeral"}"#, r#"{"ttl":"1h","type":"ephemeral"}"#);
    value = serde_json::from_str(&text).unwrap();
    let (_, summary) = rebuilt(&value);
    assert!(summary.contains(r#""cache_control":{"type":"ephemeral","ttl":"1h"}"#), "{summary}");

    // Four client markers: none free, the summary goes as plain text; none at all: no marker.
    let mut value = anthropic(&outputs(4, 100));
    value["system"] = json!([
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "c", "cache_control": {"type": "ephemeral"}},
    ]);
    let (body, summary) = rebuilt(&value);
    assert_eq!(summary, r#"{"role":"user","content":"Summary: The agent read four files."}"#);
    assert_eq!(markers(&body), 4);
    let text = anthropic(&outputs(4, 100)).to_string().replace(r#","cache_control":{"type":"ephemeral"}"#, "");
    let (body, summary) = rebuilt(&serde_json::from_str(&text).unwrap());
    assert_eq!(summary, r#"{"role":"user","content":"Summary: The agent read four files."}"#);
    assert_eq!(markers(&body), 0);
}
