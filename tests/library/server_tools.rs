//! Repair, the shortening policies and the compaction cut on tools the provider runs itself
//! (Anthropic `server_tool_use` and MCP connector blocks, Responses' hosted tools) and on types
//! compactor does not know: they are never answered, paired, moved or split, and shortened only
//! where the block stays valid.

use std::collections::BTreeSet;

use compactor::dialect::{Dialect, ParsedRequest};
use compactor::rewrite::{RewriteSettings, Rewritten};
use serde_json::{Value, json};

use crate::common::{Settings, cleared};

fn settings(protect_tokens: u32, tool_output_max_tokens: u32) -> RewriteSettings {
    Settings::defaults()
        .prune_window(protect_tokens, 1)
        .protected_tools(&[])
        .tool_output_max_tokens(tool_output_max_tokens)
        .build()
}

/// Rewrites with nothing to prune or truncate: only repair can act.
fn repair_only(dialect: Dialect, body: &Value) -> (Rewritten, Value) {
    rewrite(settings(1_000_000, 1_000_000), dialect, body)
}

/// The rewrite of `body`, and what would go upstream: the new body, or the client's own bytes.
fn rewrite(settings: RewriteSettings, dialect: Dialect, body: &Value) -> (Rewritten, Value) {
    let rewriter = Settings::from(settings).rewriter(4 << 20);
    let bytes = serde_json::to_vec(body).unwrap();
    let rewritten = rewriter.rewrite_body(dialect, &bytes, &BTreeSet::new()).expect("parses");
    let after = serde_json::from_slice(rewritten.body.as_deref().unwrap_or(&bytes)).unwrap();
    (rewritten, after)
}

fn lines(tag: &str, count: usize) -> String {
    (0..count).map(|i| format!("{tag} line {i}: compiled module {i} ok\n")).collect()
}

fn anthropic(messages: Value) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1000, "messages": messages})
}

fn search(id: &str) -> (Value, Value) {
    (
        json!({"type": "server_tool_use", "id": id, "name": "web_search", "input": {"query": "rust release"}}),
        json!({"type": "web_search_tool_result", "tool_use_id": id, "content": [
            {"type": "web_search_result", "url": "https://blog.rust-lang.org/", "title": "Rust Blog", "encrypted_content": "RW5jcnlwdGVkIHBhZ2U=", "page_age": "1 day ago"}
        ]}),
    )
}

#[test]
fn a_server_tool_answered_in_its_own_turn_gets_no_synthetic_result() {
    let (call, result) = search("srvtoolu_01");
    let body = anthropic(json!([
        {"role": "user", "content": "Search, then list the files."},
        {"role": "assistant", "content": [call, result, {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Cargo.toml"}]},
        {"role": "user", "content": "Thanks."}
    ]));
    let (rewritten, _) = repair_only(Dialect::AnthropicMessages, &body);
    assert!(rewritten.body.is_none(), "a valid server tool turn is forwarded as sent");
    assert_eq!(rewritten.report.repaired, 0);
}

#[test]
fn a_pause_turn_continuation_is_forwarded_as_sent() {
    let body = anthropic(json!([
        {"role": "user", "content": "Search the web."},
        {"role": "assistant", "content": [{"type": "text", "text": "Searching."}, search("srvtoolu_01").0]}
    ]));
    let (rewritten, _) = repair_only(Dialect::AnthropicMessages, &body);
    assert!(rewritten.body.is_none());
}

#[test]
fn only_the_client_call_of_a_mixed_turn_is_answered_when_its_result_is_missing() {
    // The search waits for the client's tool; the client's result never came.
    let body = anthropic(json!([
        {"role": "user", "content": "Check both."},
        {"role": "assistant", "content": [search("srvtoolu_01").0, {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": "Never mind."}
    ]));
    let (rewritten, after) = repair_only(Dialect::AnthropicMessages, &body);
    assert_eq!(rewritten.report.repaired, 1);
    let answered = &after["messages"][2]["content"];
    assert_eq!(
        answered[0],
        json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "aborted", "is_error": true})
    );
    assert_eq!(answered.as_array().unwrap().len(), 2, "nothing for the server tool: {answered}");
    assert_eq!(after["messages"][1], body["messages"][1]);
}

#[test]
fn mcp_connector_calls_are_never_paired_by_repair() {
    let body = anthropic(json!([
        {"role": "user", "content": "Find the issue."},
        {"role": "assistant", "content": [
            {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "search", "server_name": "linear", "input": {}},
            {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": false, "content": [{"type": "text", "text": "LIN-1"}]},
            {"type": "mcp_tool_use", "id": "mcptoolu_2", "name": "search", "server_name": "linear", "input": {}}
        ]}
    ]));
    let (rewritten, _) = repair_only(Dialect::AnthropicMessages, &body);
    assert!(rewritten.body.is_none());
}

#[test]
fn a_result_claiming_a_server_tool_id_is_left_to_the_provider() {
    // Not a pair repair understands: it neither removes nor moves it.
    let (call, result) = search("srvtoolu_01");
    let body = anthropic(json!([
        {"role": "user", "content": "Search."},
        {"role": "assistant", "content": [call, result]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "srvtoolu_01", "content": "?"}]}
    ]));
    let (rewritten, _) = repair_only(Dialect::AnthropicMessages, &body);
    assert!(rewritten.body.is_none());
}

#[test]
fn hosted_and_unrepairable_responses_items_get_no_synthetic_output() {
    let body = json!({"model": "gpt-5-codex", "input": [
        {"type": "message", "role": "user", "content": "Go."},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "tokio"}},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "gh", "name": "list", "arguments": "{}", "output": "PR #1"},
        {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "gh", "name": "merge", "arguments": "{}"},
        {"type": "shell_call", "id": "sh_1", "call_id": "call_sh", "action": {"commands": ["ls"]}},
        {"type": "computer_call", "id": "cu_1", "call_id": "call_cu", "action": {"type": "screenshot"}, "pending_safety_checks": []},
        {"type": "function_call", "call_id": "call_fn", "name": "exec_command", "arguments": "{}"}
    ]});
    let (rewritten, after) = repair_only(Dialect::Responses, &body);
    assert_eq!(rewritten.report.repaired, 1, "only the function call is answered");
    let input = after["input"].as_array().unwrap();
    assert_eq!(input.len(), 8);
    assert_eq!(input[7], json!({"type": "function_call_output", "call_id": "call_fn", "output": "aborted"}));
    assert_eq!(&input[..7], &body["input"].as_array().unwrap()[..]);
}

#[test]
fn server_results_are_shortened_in_place_only_where_they_stay_valid() {
    let page = lines("page", 400);
    let stdout = lines("stdout", 400);
    let body = anthropic(json!([
        {"role": "user", "content": "Fetch and run."},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_f", "name": "web_fetch", "input": {"url": "https://example.org/a"}},
            {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_f", "content": {"type": "web_fetch_result", "url": "https://example.org/a", "retrieved_at": "2026-10-20T00:00:00Z",
                "content": {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": page}}}},
            {"type": "server_tool_use", "id": "srvtoolu_c", "name": "web_fetch", "input": {"url": "https://example.org/b"}},
            {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_c", "content": {"type": "web_fetch_result", "url": "https://example.org/b",
                "content": {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": page}, "citations": {"enabled": true}}}},
            {"type": "server_tool_use", "id": "srvtoolu_x", "name": "code_execution", "input": {"code": "print(1)"}},
            {"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_x", "content": {"type": "code_execution_result", "stdout": stdout, "stderr": "", "return_code": 0, "content": []}},
            {"type": "server_tool_use", "id": "srvtoolu_e", "name": "code_execution", "input": {"code": "print(2)"}},
            {"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_e", "content": {"type": "encrypted_code_execution_result", "encrypted_stdout": "ZW5jcnlwdGVk", "stderr": stdout, "return_code": 0, "content": []}}
        ]}
    ]));
    let (rewritten, after) = rewrite(settings(1_000_000, 200), Dialect::AnthropicMessages, &body);
    assert_eq!(rewritten.report.truncated, 2);
    let blocks = after["messages"][1]["content"].as_array().unwrap();
    let before = body["messages"][1]["content"].as_array().unwrap();
    let fetched = blocks[1]["content"]["content"]["source"]["data"].as_str().unwrap();
    assert!(fetched.contains("tokens truncated") && fetched.starts_with("Total output lines: 400"), "{fetched}");
    let mut unshortened = blocks[1].clone();
    unshortened["content"]["content"]["source"]["data"] = json!(page);
    assert_eq!(unshortened, before[1], "every other field of the fetch result is kept");
    assert_eq!(blocks[3], before[3], "a page citations may point into is kept whole");
    assert!(blocks[5]["content"]["stdout"].as_str().unwrap().contains("tokens truncated"));
    assert_eq!(blocks[5]["content"]["return_code"], 0);
    assert_eq!(blocks[7], before[7], "an encrypted execution result is kept whole");
}

#[test]
fn pruning_replaces_a_server_result_text_and_keeps_encrypted_search_results() {
    let (call, result) = search("srvtoolu_s");
    let body = anthropic(json!([
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": [call, result,
            {"type": "server_tool_use", "id": "srvtoolu_b", "name": "bash_code_execution", "input": {"command": "make"}},
            {"type": "bash_code_execution_tool_result", "tool_use_id": "srvtoolu_b", "content": {"type": "bash_code_execution_result", "stdout": lines("make", 100), "stderr": "", "return_code": 0, "content": []}},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": lines("new", 100)}]}
    ]));
    let (rewritten, after) = rewrite(settings(10, 1_000_000), Dialect::AnthropicMessages, &body);
    assert_eq!(rewritten.report.pruned_call_ids, ["srvtoolu_b"]);
    let blocks = after["messages"][1]["content"].as_array().unwrap();
    // The server tool's output is replaced where it lives, by a placeholder naming the call.
    let stdout = blocks[3]["content"]["stdout"].as_str().unwrap();
    assert!(cleared(stdout, "bash_code_execution", r#"{"command":"make"}"#), "{stdout}");
    assert_eq!(blocks[1], body["messages"][1]["content"][1], "search results are never pruned");
}

#[test]
fn a_tool_result_holding_tool_references_or_unknown_parts_is_never_shortened() {
    let body = anthropic(json!([
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_s", "name": "ToolSearch", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": [
            {"type": "text", "text": lines("found", 200)}, {"type": "tool_reference", "tool_name": "jira_create_issue"}
        ]}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_n", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_n", "content": [
            {"type": "text", "text": lines("new", 200)}, {"type": "hologram_2027", "frames": []}
        ]}]}
    ]));
    let (rewritten, _) = rewrite(settings(1, 40), Dialect::AnthropicMessages, &body);
    assert!(rewritten.body.is_none(), "both results are kept whole");
}

#[test]
fn an_unknown_block_is_counted_and_kept() {
    let plain = anthropic(json!([{"role": "user", "content": [{"type": "text", "text": "Hello."}]}]));
    let with_unknown = anthropic(json!([{"role": "user", "content": [
        {"type": "text", "text": "Hello."},
        {"type": "hologram_2027", "frames": [lines("frame", 30)]}
    ]}]));
    let (plain, _) = repair_only(Dialect::AnthropicMessages, &plain);
    let (unknown, _) = repair_only(Dialect::AnthropicMessages, &with_unknown);
    assert!(unknown.body.is_none());
    assert!(
        unknown.report.tokens_before > plain.report.tokens_before + 200,
        "{} vs {}",
        unknown.report.tokens_before,
        plain.report.tokens_before
    );
}

/// Messages before which the conversation may be cut without splitting a pair.
fn clean_cuts(dialect: Dialect, body: &Value) -> Vec<usize> {
    let bytes = serde_json::to_vec(body).unwrap();
    let parsed = ParsedRequest::parse(dialect, &bytes).unwrap();
    (1..parsed.messages.len()).filter(|&i| parsed.conversation.is_clean_cut(i)).collect()
}

#[test]
fn a_cut_never_separates_a_server_tool_from_a_result_in_a_later_turn() {
    // Programmatic tool calling: the code execution waits for a client tool and is answered two
    // messages later; a paused turn continued as a message of its own.
    let body = anthropic(json!([
        {"role": "user", "content": "Which region?"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_c", "name": "code_execution", "input": {}},
            {"type": "tool_use", "id": "toolu_q", "name": "query", "input": {}, "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_c"}}
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_q", "content": "rows"}]},
        {"role": "assistant", "content": [
            {"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_c", "content": {"type": "code_execution_result", "stdout": "7", "stderr": "", "return_code": 0, "content": []}}
        ]},
        {"role": "user", "content": "Search too."},
        {"role": "assistant", "content": [search("srvtoolu_s").0]},
        {"role": "assistant", "content": [search("srvtoolu_s").1]},
        {"role": "user", "content": "Thanks."}
    ]));
    assert_eq!(clean_cuts(Dialect::AnthropicMessages, &body), [1, 4, 5, 7]);
}

#[test]
fn a_cut_never_lands_next_to_an_item_compactor_does_not_know() {
    let body = json!({"model": "gpt-5-codex", "input": [
        {"type": "message", "role": "user", "content": "One."},
        {"type": "message", "role": "assistant", "content": "Two."},
        {"type": "hologram_2027", "frames": []},
        {"type": "message", "role": "user", "content": "Three."},
        {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "gh", "name": "merge", "arguments": "{}"},
        {"type": "message", "role": "user", "content": "Four."},
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": true},
        {"type": "message", "role": "user", "content": "Five."}
    ]});
    assert_eq!(clean_cuts(Dialect::Responses, &body), [1, 4, 7]);
}
