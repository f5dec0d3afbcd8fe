//! The rewrite policies on hand-built conversations in both dialects: what goes upstream shrinks,
//! everything else keeps its bytes, and tool pairs always hold.

use std::collections::BTreeSet;

use compactor::dialect::Dialect;
use compactor::rewrite::{Rewriter, Rewritten};
use serde_json::{Value, json};

use crate::common::{Settings, cleared, tool_output};

/// The arguments of every call of [`chat_turns`].
const ARGS: &str = r#"{"path":"src/lib.rs"}"#;

/// The shipped defaults (placeholder, protected `skill` tool) with small windows.
fn rewriter() -> Rewriter {
    Settings::defaults().prune_window(400, 200).tool_output_max_tokens(2_000).rewriter(4 << 20)
}

fn rewrite(dialect: Dialect, body: &Value) -> (Rewritten, Value) {
    rewrite_with(&rewriter(), dialect, body, &BTreeSet::new())
}

/// The rewrite of `body`, and what would go upstream: the new body, or the client's own bytes.
fn rewrite_with(rewriter: &Rewriter, dialect: Dialect, body: &Value, pruned: &BTreeSet<String>) -> (Rewritten, Value) {
    let bytes = serde_json::to_vec(body).unwrap();
    let rewritten = rewriter.rewrite_body(dialect, &bytes, pruned).expect("parses");
    let sent = rewritten.body.as_deref().unwrap_or(&bytes);
    let after = serde_json::from_slice(sent).expect("the forwarded body is JSON");
    (rewritten, after)
}

fn chat_turns(outputs: &[(&str, &str, String)]) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Fix the failing test."}),
    ];
    for (id, tool, text) in outputs {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": tool, "arguments": "{\"path\":\"src/lib.rs\"}"}}
        ]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    }
    json!({"model": "gpt-4o", "temperature": 0.2, "messages": messages, "tools": [
        {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}
    ]})
}

fn anthropic_turns(outputs: &[(&str, &str, Value)]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing test."})];
    for (id, tool, content) in outputs {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Let me look.", "signature": "EqQBCkYIBxgCKkD+sig/=="},
            {"type": "tool_use", "id": id, "name": tool, "input": {"file_path": "/src/lib.rs", "limit": 2000}}
        ]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": content, "cache_control": {"type": "ephemeral"}}
        ]}));
    }
    json!({"model": "claude-sonnet-4-5", "max_tokens": 32000, "system": [{"type": "text", "text": "You are Claude Code."}], "messages": messages})
}

fn tool_texts_chat(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().map(str::to_string).unwrap_or_else(|| m["content"].to_string()))
        .collect()
}

#[test]
fn an_ordinary_request_is_left_alone() {
    let body = chat_turns(&[("call_1", "read_file", tool_output("a", 100))]);
    let (rewritten, _) = rewrite(Dialect::ChatCompletions, &body);
    assert!(rewritten.body.is_none(), "nothing to do must mean the original bytes");
    assert_eq!(rewritten.report.tokens_before, rewritten.report.tokens_after);
    assert!(rewritten.report.tokens_before > 100);
}

#[test]
fn prunes_old_tool_outputs_but_keeps_the_newest_window() {
    let outputs: Vec<_> =
        (0..8).map(|i| (format!("call_{i}"), "read_file", tool_output(&format!("f{i}"), 150))).collect();
    let outputs: Vec<(&str, &str, String)> = outputs.iter().map(|(a, b, c)| (a.as_str(), *b, c.clone())).collect();
    let body = chat_turns(&outputs);
    let (rewritten, after) = rewrite(Dialect::ChatCompletions, &body);
    let texts = tool_texts_chat(&after);
    // The newest ~400 tokens (three outputs, the third crossing the edge) stay whole.
    assert_eq!(&texts[5..], &[outputs[5].2.clone(), outputs[6].2.clone(), outputs[7].2.clone()]);
    assert!(texts[..5].iter().all(|t| cleared(t, "read_file", ARGS)), "{texts:?}");
    assert_eq!(rewritten.report.pruned, 5);
    assert_eq!(rewritten.report.pruned_call_ids, ["call_4", "call_3", "call_2", "call_1", "call_0"]);
    assert!(rewritten.report.tokens_after < rewritten.report.tokens_before);
    // User and assistant messages are untouched.
    let before = body["messages"].as_array().unwrap();
    let after_messages = after["messages"].as_array().unwrap();
    for (b, a) in before.iter().zip(after_messages) {
        if b["role"] != "tool" {
            assert_eq!(a, b);
        }
    }
}

#[test]
fn nothing_is_pruned_until_the_prunable_total_reaches_the_minimum() {
    let body = chat_turns(&[
        ("call_0", "read_file", tool_output("old", 100)),
        ("call_1", "read_file", tool_output("new", 450)),
    ]);
    let (rewritten, _) = rewrite(Dialect::ChatCompletions, &body);
    assert!(rewritten.body.is_none(), "100 prunable tokens are under the 200 minimum");
}

#[test]
fn outputs_of_protected_tools_are_never_pruned() {
    let body = chat_turns(&[
        ("call_0", "skill", tool_output("skill", 300)),
        ("call_1", "read_file", tool_output("old", 300)),
        ("call_2", "read_file", tool_output("new", 450)),
    ]);
    let (_, after) = rewrite(Dialect::ChatCompletions, &body);
    let texts = tool_texts_chat(&after);
    assert_eq!(texts[0], tool_output("skill", 300));
    assert!(cleared(&texts[1], "read_file", ARGS), "{}", texts[1]);
}

#[test]
fn an_output_pruned_once_stays_pruned_even_inside_the_window() {
    let body =
        chat_turns(&[("call_0", "read_file", tool_output("a", 100)), ("call_1", "read_file", tool_output("b", 100))]);
    let pruned: BTreeSet<String> = ["call_1".to_string()].into();
    let (rewritten, after) = rewrite_with(&rewriter(), Dialect::ChatCompletions, &body, &pruned);
    let texts = tool_texts_chat(&after);
    assert_eq!(texts[0], tool_output("a", 100));
    assert!(cleared(&texts[1], "read_file", ARGS), "{}", texts[1]);
    assert_eq!(rewritten.report.pruned_call_ids, ["call_1"]);
}

#[test]
fn anthropic_tool_results_are_pruned_with_their_images_and_keep_cache_control() {
    let old = json!([{"type": "text", "text": tool_output("old", 300)}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]);
    let body = anthropic_turns(&[
        ("toolu_0", "Read", old),
        ("toolu_1", "Read", json!(tool_output("mid", 150))),
        ("toolu_2", "Read", json!(tool_output("new", 450))),
    ]);
    let (rewritten, after) = rewrite(Dialect::AnthropicMessages, &body);
    let first = &after["messages"][2]["content"][0];
    let read = r#"{"file_path":"/src/lib.rs","limit":2000}"#;
    assert!(cleared(first["content"].as_str().unwrap(), "Read", read), "{first}");
    assert_eq!(first["tool_use_id"], "toolu_0");
    assert_eq!(first["cache_control"], json!({"type": "ephemeral"}));
    assert!(cleared(after["messages"][4]["content"][0]["content"].as_str().unwrap(), "Read", read));
    assert_eq!(after["messages"][6]["content"][0]["content"], tool_output("new", 450));
    // Thinking blocks with signatures arrive exactly as sent.
    assert_eq!(after["messages"][1], body["messages"][1]);
    assert_eq!(rewritten.report.pruned, 2);
}

#[test]
fn a_huge_tool_output_keeps_head_and_tail_in_both_dialects() {
    let huge = tool_output("log", 6_000);
    let chat = chat_turns(&[("call_0", "run", huge.clone())]);
    let (rewritten, after) = rewrite(Dialect::ChatCompletions, &chat);
    let text = &tool_texts_chat(&after)[0];
    assert!(text.starts_with("Total output lines: "), "{}", &text[..80]);
    assert!(text.contains("log line 0 ok"));
    assert!(text.trim_end().ends_with(huge.trim_end().lines().last().unwrap()));
    assert!(text.contains("tokens truncated…"));
    assert_eq!(rewritten.report.truncated, 1);
    assert!(rewritten.report.saved_by_truncate > 3_000);

    let anthropic = anthropic_turns(&[("toolu_0", "Bash", json!(huge))]);
    let (_, after) = rewrite(Dialect::AnthropicMessages, &anthropic);
    let text = after["messages"][2]["content"][0]["content"].as_str().unwrap();
    assert!(text.contains("tokens truncated…"));
}

#[test]
fn a_newer_copy_of_a_repeated_output_points_to_the_older_one() {
    let same = tool_output("same file", 120);
    let body = chat_turns(&[
        ("call_0", "read_file", same.clone()),
        ("call_1", "read_file", tool_output("other", 50)),
        ("call_2", "read_file", same.clone()),
    ]);
    let (rewritten, after) = rewrite(Dialect::ChatCompletions, &body);
    let texts = tool_texts_chat(&after);
    assert_eq!(texts[0], same, "the copy the provider has cached stays as it was");
    assert!(texts[2].contains("call_0"), "{}", texts[2]);
    assert_eq!(rewritten.report.deduped, 1);
}

#[test]
fn two_copies_of_a_huge_output_are_cut_alike_and_the_newer_points_to_the_older_in_one_rewrite() {
    // Found by proptest: both copies were cut to the same head and tail, but only the rewrite of
    // the rewritten request made the pointer, so the same history went upstream two ways.
    let huge = tool_output("same huge file", 6_000);
    let body = chat_turns(&[("call_0", "read_file", huge.clone()), ("call_1", "read_file", huge)]);
    // Both copies inside the protected window: nothing is pruned, only cut and deduplicated.
    let rewriter = Settings::defaults().prune_window(100_000, 200).tool_output_max_tokens(2_000).rewriter(100_000);
    let (rewritten, after) = rewrite_with(&rewriter, Dialect::ChatCompletions, &body, &BTreeSet::new());
    let texts = tool_texts_chat(&after);
    assert!(texts[0].contains("tokens truncated"), "{}", texts[0]);
    assert!(texts[1].contains("call_0"), "{}", texts[1]);
    assert_eq!((rewritten.report.truncated, rewritten.report.deduped), (2, 1));
    let (again, _) = rewrite_with(&rewriter, Dialect::ChatCompletions, &after, &BTreeSet::new());
    assert!(again.body.is_none(), "rewriting the rewritten request changes nothing");
}

#[test]
fn chat_repair_adds_missing_results_and_drops_orphans_and_moves_misplaced_ones() {
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
            {"id": "call_b", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
            {"id": "call_c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": "a"},
        {"role": "tool", "tool_call_id": "call_zzz", "content": "orphan"},
        {"role": "user", "content": "and?"},
        {"role": "tool", "tool_call_id": "call_c", "content": "late c"}
    ]});
    let (rewritten, after) = rewrite(Dialect::ChatCompletions, &body);
    let messages = after["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool", "tool", "user"]);
    let results: Vec<(&str, &str)> =
        messages[2..5].iter().map(|m| (m["tool_call_id"].as_str().unwrap(), m["content"].as_str().unwrap())).collect();
    assert_eq!(results, [("call_a", "a"), ("call_b", "aborted"), ("call_c", "late c")]);
    assert_eq!(rewritten.report.repaired, 4);
}

#[test]
fn anthropic_repair_puts_results_first_in_the_next_user_message_or_a_new_one() {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "text", "text": "interrupted"}, {"type": "tool_result", "tool_use_id": "toolu_gone", "content": "x"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "toolu_b", "name": "Bash", "input": {}}]}
    ]});
    let (_, after) = rewrite(Dialect::AnthropicMessages, &body);
    let messages = after["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5);
    assert_eq!(
        messages[2]["content"],
        json!([{"type": "tool_result", "tool_use_id": "toolu_a", "content": "aborted", "is_error": true}, {"type": "text", "text": "interrupted"}])
    );
    assert_eq!(messages[4]["role"], "user");
    assert_eq!(messages[4]["content"][0]["tool_use_id"], "toolu_b");
}

#[test]
fn parallel_tool_calls_keep_each_result_with_its_call() {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}},
            {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}}
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "two"}]}
    ]});
    let (_, after) = rewrite(Dialect::AnthropicMessages, &body);
    let content = after["messages"][2]["content"].as_array().unwrap();
    let ids: Vec<&str> = content.iter().map(|b| b["tool_use_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["toolu_2", "toolu_1"]);
}

#[test]
fn untouched_messages_keep_their_exact_bytes_in_a_changed_request() {
    // Odd spacing and long numbers: only a byte-preserving rewrite keeps them.
    let body = format!(
        r#"{{"model":"gpt-4o","temperature":0.10000000000000001,"messages":[{{"role":"user","content":"hi",  "x":1.0e5}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_0","type":"function","function":{{"name":"r","arguments":"{{}}"}}}}]}},{{"role":"tool","tool_call_id":"call_0","content":{}}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_1","type":"function","function":{{"name":"r","arguments":"{{}}"}}}}]}},{{"role":"tool","tool_call_id":"call_1","content":{}}}],"stream":true}}"#,
        serde_json::to_string(&tool_output("old", 300)).unwrap(),
        serde_json::to_string(&tool_output("new", 500)).unwrap()
    );
    let rewritten = rewriter().rewrite_body(Dialect::ChatCompletions, body.as_bytes(), &BTreeSet::new()).unwrap();
    let new = String::from_utf8(rewritten.body.unwrap()).unwrap();
    assert!(new.starts_with(
        r#"{"model":"gpt-4o","temperature":0.10000000000000001,"messages":[{"role":"user","content":"hi",  "x":1.0e5},"#
    ));
    assert!(
        new.contains(r#"{"role":"tool","tool_call_id":"call_0","content":"[Old tool result content cleared: r {} ("#)
    );
    assert!(new.ends_with(r#"],"stream":true}"#));
}

#[test]
fn rewriting_a_rewritten_request_changes_nothing() {
    let outputs: Vec<(String, &str, String)> =
        (0..6).map(|i| (format!("toolu_{i}"), "Read", tool_output(&format!("f{i}"), 200 + i * 400))).collect();
    let outputs: Vec<(&str, &str, Value)> = outputs.iter().map(|(a, b, c)| (a.as_str(), *b, json!(c))).collect();
    let body = anthropic_turns(&outputs);
    let rewriter = rewriter();
    let (first, after) = rewrite_with(&rewriter, Dialect::AnthropicMessages, &body, &BTreeSet::new());
    assert!(first.body.is_some());
    let pruned: BTreeSet<String> = first.report.pruned_call_ids.iter().cloned().collect();
    let again = rewriter.rewrite_body(Dialect::AnthropicMessages, first.body.as_ref().unwrap(), &pruned).unwrap();
    assert!(again.body.is_none(), "a second pass must find nothing to do");
    let _ = after;
}

#[test]
fn a_body_that_is_not_the_dialect_is_not_rewritten() {
    let rewriter = rewriter();
    for body in [
        &b"not json"[..],
        br#"{"model":"x"}"#,
        br#"{"messages":"nope"}"#,
        br#"{"messages":[{"role":"wizard","content":"x"}]}"#,
    ] {
        assert!(rewriter.rewrite_body(Dialect::ChatCompletions, body, &BTreeSet::new()).is_none());
        assert!(rewriter.rewrite_body(Dialect::AnthropicMessages, body, &BTreeSet::new()).is_none());
    }
}

#[test]
fn content_part_arrays_and_refusals_are_counted_and_kept() {
    let messages = [
        json!({"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}),
        json!({"role": "assistant", "content": "sure", "refusal": null}),
        json!({"role": "developer", "content": [{"type": "text", "text": "be brief"}]}),
    ];
    let body = json!({"model": "gpt-4o", "messages": messages});
    let (rewritten, _) = rewrite(Dialect::ChatCompletions, &body);
    assert!(rewritten.body.is_none());
    assert!(rewritten.report.tokens_before >= 1_000, "the image counts as a fixed estimate");
    // In a request the policies do change (a huge tool output is cut), the same messages still
    // go upstream byte for byte.
    let mut changed = body.clone();
    let history = changed["messages"].as_array_mut().unwrap();
    history.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}));
    history.push(json!({"role": "tool", "tool_call_id": "call_0", "content": tool_output("log", 6_000)}));
    let bytes = serde_json::to_vec(&changed).unwrap();
    let rewritten = rewriter().rewrite_body(Dialect::ChatCompletions, &bytes, &BTreeSet::new()).unwrap();
    let sent = String::from_utf8(rewritten.body.expect("the huge output is truncated")).unwrap();
    for message in &messages {
        let raw = serde_json::to_string(message).unwrap();
        assert!(sent.contains(&raw), "{raw} changed on its way");
    }
}

#[test]
fn attachments_whose_tokens_pass_u32_count_as_the_most_tokens_not_as_a_small_number() {
    // 3 images in a tool result and 2 in a message at half of u32 each: a wrapped sum would make
    // this request look nearly empty (and a release build wraps silently).
    let mut settings = Settings::defaults().build();
    settings.image_tokens = u32::MAX / 2;
    let rewriter = Rewriter::new(
        settings,
        compactor::tokens::TokenCounter::new(1 << 20),
        compactor::tokens::ModelTable::default(),
    );
    let image =
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}});
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, image, image]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image, image, image]}]},
        ],
    });
    let (rewritten, _) = rewrite_with(&rewriter, Dialect::AnthropicMessages, &body, &BTreeSet::new());
    assert_eq!(rewritten.report.tokens_before, u32::MAX);
    assert!(rewritten.report.message_tokens.iter().all(|tokens| *tokens >= u32::MAX / 2 || *tokens < 100));
    assert_eq!(rewritten.report.message_tokens[2], u32::MAX, "three images in one result");
}

/// Found by the `dialects` fuzzer: a code interpreter's log cut to head and tail, a little larger
/// than its placeholder. The placeholder named the size of the output before the cut, so on a
/// second pass (the rewritten body rewritten again) it was a token shorter and the cut output now
/// outweighed it: pruned the second time, kept the first. A rewritten body rewritten again must
/// stay as it is.
#[test]
fn a_cut_output_a_little_larger_than_its_placeholder_is_decided_the_same_on_a_second_pass() {
    use compactor::config::Config;
    use compactor::tokens::{ModelTable, TokenCounter};
    let mut settings = Config::default().rewrite_settings();
    settings.prune.protect_tokens = 40;
    settings.prune.minimum_tokens = 10;
    settings.tool_output_max_tokens = 60;
    let rewriter = Rewriter::new(settings, TokenCounter::new(32 << 20), ModelTable::default());
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/regressions/responses-cut-output-then-pruned.json"
    ))
    .unwrap();
    let none = BTreeSet::new();
    let first =
        rewriter.rewrite_body(Dialect::Responses, &body, &none).unwrap().body.expect("the fixture is rewritten");
    let first = String::from_utf8(first.to_vec()).unwrap();
    assert!(first.contains("tokens truncated"), "the log is cut on the first pass");
    let again = rewriter.rewrite_body(Dialect::Responses, first.as_bytes(), &none).unwrap();
    if let Some(second) = again.body {
        assert_eq!(String::from_utf8(second.to_vec()).unwrap(), first, "a second rewrite changed the body");
    }
}

/// Found by the `dialects` fuzzer: a Claude Code conversation rewritten with a cold cache over
/// half its history (what the proxy sees after an hour idle), in which the client sent one call id
/// twice (`cargo test` run twice under the same id). The first pass kept the newer output (cut,
/// in the protected window) and pruned the older, so the call id went into the session's pruned
/// ids; the rewritten body, rewritten again with them, pruned the kept output too. A rewritten
/// body rewritten again must stay as it is.
#[test]
fn a_cut_output_kept_with_a_cold_cache_is_kept_on_a_second_pass() {
    use std::time::Duration;

    use compactor::config::Config;
    use compactor::dialect::ParsedRequest;
    use compactor::rewrite::{CachePricing, History};
    use compactor::tokens::{ModelTable, TokenCounter};
    let mut settings = Config::default().rewrite_settings();
    settings.prune.protect_tokens = 40;
    settings.prune.minimum_tokens = 10;
    settings.tool_output_max_tokens = 60;
    settings.blocking_tokenize_bytes = usize::MAX;
    let rewriter = Rewriter::new(settings, TokenCounter::new(32 << 20), ModelTable::default());
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/regressions/anthropic-cold-cache-cut-output-pruned-on-second-pass.json"
    ))
    .unwrap();
    let dialect = Dialect::AnthropicMessages;
    let messages = ParsedRequest::parse(dialect, &body).unwrap().messages.len();
    // The fuzzer's cold history: the provider saw half the conversation an hour ago.
    let cold = |pruned_before| History {
        pruned_before,
        seen_messages: messages / 2,
        pricing: CachePricing::OPENAI,
        later_turns: 12,
        idle: Some(Duration::from_secs(3_600)),
        pressure: false,
    };
    let none = BTreeSet::new();
    let first = rewriter.rewrite_body_in(dialect, &body, &cold(&none)).unwrap();
    let pruned: BTreeSet<String> = first.report.pruned_call_ids.iter().cloned().collect();
    let first = String::from_utf8(first.body.expect("the fixture is rewritten").to_vec()).unwrap();
    assert!(first.contains("tokens truncated"), "the test output is cut on the first pass");
    let again = rewriter.rewrite_body_in(dialect, first.as_bytes(), &cold(&pruned)).unwrap();
    if let Some(second) = again.body {
        assert_eq!(String::from_utf8(second.to_vec()).unwrap(), first, "a second rewrite changed the body");
    }
}

/// Found by the `dialects` fuzzer (CI): a Codex conversation in which the client sent one patch
/// call and its output twice under the same id. The first pass made the newer copy a pointer to
/// the older (dedupe runs after truncation); the pointer names the patch, so with a small
/// `tool_output_max_tokens` it is longer than the cut, and the rewritten body, rewritten again,
/// cut the pointer itself. A stand-in compactor wrote is never shortened again.
#[test]
fn a_duplicates_pointer_longer_than_the_cut_is_left_whole_on_a_second_pass() {
    use compactor::config::Config;
    use compactor::tokens::{ModelTable, TokenCounter};
    let mut settings = Config::default().rewrite_settings();
    settings.prune.protect_tokens = 40;
    settings.prune.minimum_tokens = 10;
    settings.tool_output_max_tokens = 60;
    let rewriter = Rewriter::new(settings, TokenCounter::new(32 << 20), ModelTable::default());
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/regressions/responses-duplicate-pointer-cut-on-second-pass.json"
    ))
    .unwrap();
    let first = rewriter.rewrite_body(Dialect::Responses, &body, &BTreeSet::new()).unwrap();
    let pruned: BTreeSet<String> = first.report.pruned_call_ids.iter().cloned().collect();
    let first = String::from_utf8(first.body.expect("the fixture is rewritten").to_vec()).unwrap();
    let pointer = "[Duplicate tool output: identical to the earlier result of apply_patch";
    assert!(first.contains(pointer), "the repeated patch output is a pointer after the first pass");
    let again = rewriter.rewrite_body(Dialect::Responses, first.as_bytes(), &pruned).unwrap();
    if let Some(second) = again.body {
        let second = String::from_utf8(second.to_vec()).unwrap();
        assert!(second.contains(pointer), "the pointer was cut: {second}");
        assert_eq!(second, first, "a second rewrite changed the body");
    }
}

/// Found by the `dialects` fuzzer: a Claude Code conversation in which the client sent one
/// `cargo test` call and its output twice under the same id. The first pass kept the newer output
/// in the protected window, so the older one of the same call stayed too, and dedupe then made the
/// newer a pointer to the older. Rewritten again, the pointer was no kept output any more and the
/// older copy, the one the pointer names, was pruned. A pointer stands in the window as the copy it
/// repeats did.
#[test]
fn the_output_a_pointer_names_is_kept_on_a_second_pass() {
    use compactor::config::Config;
    use compactor::tokens::{ModelTable, TokenCounter};
    let mut settings = Config::default().rewrite_settings();
    settings.prune.protect_tokens = 40;
    settings.prune.minimum_tokens = 10;
    settings.tool_output_max_tokens = 60;
    let rewriter = Rewriter::new(settings, TokenCounter::new(32 << 20), ModelTable::default());
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/regressions/anthropic-reused-call-id-pointer-then-older-pruned.json"
    ))
    .unwrap();
    let dialect = Dialect::AnthropicMessages;
    let first = rewriter.rewrite_body(dialect, &body, &BTreeSet::new()).unwrap();
    let pruned: BTreeSet<String> = first.report.pruned_call_ids.iter().cloned().collect();
    let first = String::from_utf8(first.body.expect("the fixture is rewritten").to_vec()).unwrap();
    let pointer = "[Duplicate tool output: identical to the earlier result of Bash";
    assert!(first.contains(pointer), "the repeated test output is a pointer after the first pass");
    let again = rewriter.rewrite_body(dialect, first.as_bytes(), &pruned).unwrap();
    assert_eq!(again.report.pruned, 0, "a second rewrite pruned the output the pointer names");
    if let Some(second) = again.body {
        assert_eq!(String::from_utf8(second.to_vec()).unwrap(), first, "a second rewrite changed the body");
    }
}
