//! Tool-pairing rules as OpenAI and Anthropic enforce them, with their real error bodies, so the
//! fake upstream rejects what the providers would reject.

use serde_json::{Value, json};

/// The provider's 400 body when `body` breaks tool pairing, `None` when it is well formed.
pub fn pairing_error(path: &str, body: &Value) -> Option<Value> {
    let messages = body["messages"].as_array()?;
    if path.ends_with("/v1/messages") {
        anthropic(messages).or_else(|| anthropic_server_tools(messages))
    } else {
        openai(messages)
    }
}

fn openai(messages: &[Value]) -> Option<Value> {
    let error = |message: String| json!({"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": null}});
    let mut answered = vec![false; messages.len()];
    for (i, message) in messages.iter().enumerate() {
        let Some(calls) = message["tool_calls"].as_array() else { continue };
        let mut missing: Vec<&str> = calls.iter().filter_map(|c| c["id"].as_str()).collect();
        for (j, next) in messages.iter().enumerate().skip(i + 1) {
            if next["role"] != "tool" {
                break;
            }
            answered[j] = true;
            missing.retain(|id| next["tool_call_id"].as_str() != Some(id));
        }
        if !missing.is_empty() {
            return Some(error(format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                missing.join(", ")
            )));
        }
    }
    for (j, message) in messages.iter().enumerate() {
        if message["role"] == "tool" && !answered[j] {
            return Some(error(format!(
                "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'. (messages.[{j}].role)"
            )));
        }
    }
    None
}

fn anthropic(messages: &[Value]) -> Option<Value> {
    let error =
        |message: String| json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
    let blocks = |m: &Value| m["content"].as_array().cloned().unwrap_or_default();
    for (i, message) in messages.iter().enumerate() {
        let uses: Vec<String> = blocks(message)
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["id"].as_str().map(str::to_string))
            .collect();
        let results: Vec<String> = blocks(message)
            .iter()
            .filter(|b| b["type"] == "tool_result")
            .filter_map(|b| b["tool_use_id"].as_str().map(str::to_string))
            .collect();
        if message["role"] == "user" && !results.is_empty() {
            let previous: Vec<String> = if i == 0 {
                Vec::new()
            } else {
                blocks(&messages[i - 1])
                    .iter()
                    .filter(|b| b["type"] == "tool_use")
                    .filter_map(|b| b["id"].as_str().map(str::to_string))
                    .collect()
            };
            if let Some(stray) = results.iter().find(|r| !previous.contains(r)) {
                return Some(error(format!(
                    "messages.{i}.content.0: unexpected `tool_use_id` found in `tool_result` blocks: {stray}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                )));
            }
        }
        if message["role"] == "assistant" && !uses.is_empty() {
            let next: Vec<String> = messages
                .get(i + 1)
                .map(|n| {
                    blocks(n)
                        .iter()
                        .filter(|b| b["type"] == "tool_result")
                        .filter_map(|b| b["tool_use_id"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let missing: Vec<&String> = uses.iter().filter(|u| !next.contains(u)).collect();
            if !missing.is_empty() {
                return Some(error(format!(
                    "messages.{}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                    i + 1,
                    missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )));
            }
        }
    }
    None
}

/// The Responses API's pairing rules: every call has an output after it, no output lacks its call.
pub fn responses_pairing_error(body: &Value) -> Option<Value> {
    let input = body["input"].as_array()?;
    let error = |message: String| json!({"error": {"message": message, "type": "invalid_request_error", "param": "input", "code": null}});
    for (i, item) in input.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or("");
        if kind == "function_call" || kind == "custom_tool_call" {
            let id = item["call_id"].as_str().unwrap_or("");
            if !input[i + 1..].iter().any(|o| {
                o["call_id"].as_str() == Some(id) && o["type"].as_str().is_some_and(|t| t.ends_with("_output"))
            }) {
                return Some(error(format!("No tool output found for function call {id}.")));
            }
        }
        if kind.ends_with("_call_output") {
            let id = item["call_id"].as_str().or(item["id"].as_str()).unwrap_or("");
            if !input[..i]
                .iter()
                .any(|c| c["call_id"].as_str() == Some(id) && !c["type"].as_str().unwrap_or("").ends_with("_output"))
            {
                return Some(error(format!("No tool call found for function call output with call_id {id}.")));
            }
        }
    }
    responses_more_pairs(input)
}

/// The Messages API's rules for tools it runs itself (web search, web fetch, code execution, tool
/// search, advisor, MCP connector): a `server_tool_use` / `mcp_tool_use` is answered by its
/// `*_tool_result` in the same assistant message, except while the turn is paused (`pause_turn`:
/// the request ends with it) or waits on client tools called in the same message (the API runs it
/// once their results come back, and answers it in a later assistant message). Every such result
/// answers such a call, of the matching tool, and keeps the fields its type requires.
pub fn anthropic_server_tools(messages: &[Value]) -> Option<Value> {
    let error =
        |message: String| json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
    let blocks = |m: &Value| m["content"].as_array().cloned().unwrap_or_default();
    let is_server_call = |b: &Value| b["type"] == "server_tool_use" || b["type"] == "mcp_tool_use";
    let is_server_result = |b: &Value| {
        b["type"].as_str().is_some_and(|t| t.ends_with("_tool_result") && t != "tool_result")
            && b.get("tool_use_id").is_some()
    };
    // id -> expected result type, for every server call seen so far.
    let mut calls: Vec<(String, String)> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let content = blocks(message);
        for (b, block) in content.iter().enumerate() {
            if is_server_call(block) {
                if message["role"] != "assistant" {
                    return Some(error(format!(
                        "messages.{i}.content.{b}: `{}` blocks can only appear in assistant messages",
                        block["type"].as_str().unwrap_or("")
                    )));
                }
                let (Some(id), Some(name)) = (block["id"].as_str(), block["name"].as_str()) else {
                    return Some(error(format!("messages.{i}.content.{b}: missing required field `id` or `name`")));
                };
                if !block["input"].is_object() {
                    return Some(error(format!("messages.{i}.content.{b}.input: Field required")));
                }
                let expected = if block["type"] == "mcp_tool_use" {
                    "mcp_tool_result".to_string()
                } else {
                    server_result_type(name)
                };
                calls.push((id.to_string(), expected));
            }
            if is_server_result(block) {
                let kind = block["type"].as_str().unwrap_or("");
                let id = block["tool_use_id"].as_str().unwrap_or("");
                if message["role"] != "assistant" {
                    return Some(error(format!(
                        "messages.{i}.content.{b}: `{kind}` blocks can only appear in assistant messages"
                    )));
                }
                match calls.iter().find(|(call, _)| call == id) {
                    None => {
                        return Some(error(format!(
                            "messages.{i}.content.{b}: `{kind}` block with `tool_use_id` {id} has no corresponding `server_tool_use` block before it"
                        )));
                    }
                    Some((_, expected)) if expected != kind && expected != "*" => {
                        return Some(error(format!(
                            "messages.{i}.content.{b}: `{kind}` does not match the tool of `server_tool_use` {id} (expected `{expected}`)"
                        )));
                    }
                    _ => {}
                }
                if let Some(problem) = server_result_shape(kind, block) {
                    return Some(error(format!("messages.{i}.content.{b}.{problem}")));
                }
            }
        }
        // Every server call of this assistant message is answered in it, unless the turn is
        // paused here or waits on client tools.
        if message["role"] != "assistant" {
            continue;
        }
        let waits_on_client = content.iter().any(|b| b["type"] == "tool_use");
        for block in content.iter().filter(|b| is_server_call(b)) {
            let id = block["id"].as_str().unwrap_or("");
            // Consecutive assistant messages are one turn to the API (a `pause_turn`
            // continuation may be sent back as a message of its own).
            let turn_end =
                messages[i + 1..].iter().position(|m| m["role"] != "assistant").map_or(messages.len(), |p| i + 1 + p);
            let answered_here = messages[i..turn_end]
                .iter()
                .any(|m| blocks(m).iter().any(|r| is_server_result(r) && r["tool_use_id"] == id));
            let last = turn_end == messages.len();
            let answered_later = messages[i + 1..]
                .iter()
                .filter(|m| m["role"] == "assistant")
                .any(|m| blocks(m).iter().any(|r| is_server_result(r) && r["tool_use_id"] == id));
            let client_turn_is_last = waits_on_client && i + 2 == messages.len();
            if !(answered_here || last || (waits_on_client && (answered_later || client_turn_is_last))) {
                return Some(error(format!(
                    "messages.{i}: `server_tool_use` block with id `{id}` was found without a corresponding result block in the same assistant turn"
                )));
            }
        }
    }
    None
}

/// The result block type a server tool's `server_tool_use` is answered by; `*` for a tool this
/// fake does not know.
fn server_result_type(name: &str) -> String {
    match name {
        "web_search" => "web_search_tool_result",
        "web_fetch" => "web_fetch_tool_result",
        "code_execution" => "code_execution_tool_result",
        "bash_code_execution" => "bash_code_execution_tool_result",
        "text_editor_code_execution" => "text_editor_code_execution_tool_result",
        "tool_search_tool_regex" | "tool_search_tool_bm25" => "tool_search_tool_result",
        "advisor" => "advisor_tool_result",
        _ => "*",
    }
    .to_string()
}

/// What a server result block lacks of the fields its type requires (the SDK's `Required[...]`),
/// as `path: problem`; `None` when it is complete.
fn server_result_shape(kind: &str, block: &Value) -> Option<String> {
    let content = &block["content"];
    let string = |v: &Value, path: &str| (!v.is_string()).then(|| format!("{path}: Input should be a valid string"));
    let content_type = content["type"].as_str().unwrap_or("");
    let need = |fields: &[&str]| {
        fields.iter().find(|f| content.get(**f).is_none()).map(|f| format!("content.{f}: Field required"))
    };
    match kind {
        "web_search_tool_result" => match content {
            Value::Array(results) => results.iter().enumerate().find_map(|(r, result)| {
                if result["type"] != "web_search_result" {
                    return Some(format!("content.{r}.type: Input should be 'web_search_result'"));
                }
                ["encrypted_content", "title", "url"]
                    .iter()
                    .find_map(|f| string(&result[*f], &format!("content.{r}.{f}")))
            }),
            Value::Object(_) if content_type == "web_search_tool_result_error" => need(&["error_code"]),
            _ => Some("content: Input should be a list of web_search_result blocks or an error".into()),
        },
        "web_fetch_tool_result" => match content_type {
            "web_fetch_result" => need(&["url", "content"]).or_else(|| {
                let document = &content["content"];
                (document["type"] != "document" || !document["source"].is_object())
                    .then(|| "content.content: Input should be a document block with a source".to_string())
                    .or_else(|| match document["source"]["type"].as_str() {
                        Some("text") => string(&document["source"]["data"], "content.content.source.data"),
                        Some(_) => None,
                        None => Some("content.content.source.type: Field required".into()),
                    })
            }),
            "web_fetch_tool_result_error" => need(&["error_code"]),
            _ => Some("content.type: Input tag does not match any of the expected tags".into()),
        },
        "code_execution_tool_result" | "bash_code_execution_tool_result" => {
            let prefix = kind.trim_end_matches("_tool_result");
            match content_type {
                t if t == format!("{prefix}_result") => need(&["content", "return_code", "stderr", "stdout"])
                    .or_else(|| string(&content["stdout"], "content.stdout"))
                    .or_else(|| string(&content["stderr"], "content.stderr")),
                "encrypted_code_execution_result" => need(&["content", "encrypted_stdout", "return_code", "stderr"]),
                t if t == format!("{prefix}_tool_result_error") => need(&["error_code"]),
                _ => Some("content.type: Input tag does not match any of the expected tags".into()),
            }
        }
        "text_editor_code_execution_tool_result" => match content_type {
            "text_editor_code_execution_view_result" => {
                need(&["content", "file_type"]).or_else(|| string(&content["content"], "content.content"))
            }
            "text_editor_code_execution_create_result" => need(&["is_file_update"]),
            "text_editor_code_execution_str_replace_result" => None,
            "text_editor_code_execution_tool_result_error" => need(&["error_code"]),
            _ => Some("content.type: Input tag does not match any of the expected tags".into()),
        },
        "tool_search_tool_result" => match content_type {
            "tool_search_tool_search_result" => match content["tool_references"].as_array() {
                Some(refs) => refs.iter().enumerate().find_map(|(r, reference)| {
                    (reference["type"] != "tool_reference" || !reference["tool_name"].is_string())
                        .then(|| format!("content.tool_references.{r}: Input should be a tool_reference block"))
                }),
                None => Some("content.tool_references: Field required".into()),
            },
            "tool_search_tool_result_error" => need(&["error_code"]),
            _ => Some("content.type: Input tag does not match any of the expected tags".into()),
        },
        "mcp_tool_result" => None,
        _ => block.get("content").is_none().then(|| "content: Field required".into()),
    }
}

/// The Responses API's rules for the other pairs: client-run calls (local shell, shell, apply
/// patch, computer) have an output after them; a program, client tool search or MCP approval
/// request is answered only after it was asked.
fn responses_more_pairs(input: &[Value]) -> Option<Value> {
    let error = |message: String| json!({"error": {"message": message, "type": "invalid_request_error", "param": "input", "code": null}});
    let answer_id = |o: &Value| o["call_id"].as_str().or(o["id"].as_str()).map(str::to_string);
    for (i, item) in input.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or("");
        if matches!(kind, "local_shell_call" | "shell_call" | "apply_patch_call" | "computer_call") {
            let id = item["call_id"].as_str().unwrap_or("");
            let answered = input[i + 1..].iter().any(|o| {
                o["type"].as_str().is_some_and(|t| t.ends_with("_output")) && answer_id(o).as_deref() == Some(id)
            });
            if !answered {
                return Some(error(format!("No tool output found for {kind} {id}.")));
            }
        }
        let asked =
            |call_type: &str, key: &str, id: &str| input[..i].iter().any(|c| c["type"] == call_type && c[key] == id);
        let orphan = match kind {
            "program_output" => item["call_id"].as_str().filter(|id| !asked("program", "call_id", id)),
            "tool_search_output" => item["call_id"].as_str().filter(|id| !asked("tool_search_call", "call_id", id)),
            "mcp_approval_response" => {
                item["approval_request_id"].as_str().filter(|id| !asked("mcp_approval_request", "id", id))
            }
            _ => None,
        };
        if let Some(id) = orphan {
            return Some(error(format!("No item found answering {kind} with id {id}.")));
        }
    }
    None
}
