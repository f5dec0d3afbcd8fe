//! Tool-pairing rules as OpenAI and Anthropic enforce them, with their real error bodies, so the
//! fake upstream rejects what the providers would reject.

use serde_json::{Value, json};

/// The provider's 400 body when `body` breaks tool pairing, `None` when it is well formed.
pub fn pairing_error(path: &str, body: &Value) -> Option<Value> {
    let messages = body["messages"].as_array()?;
    if path.ends_with("/v1/messages") { anthropic(messages) } else { openai(messages) }
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
            let id = item["call_id"].as_str().unwrap_or("");
            if !input[..i]
                .iter()
                .any(|c| c["call_id"].as_str() == Some(id) && !c["type"].as_str().unwrap_or("").ends_with("_output"))
            {
                return Some(error(format!("No tool call found for function call output with call_id {id}.")));
            }
        }
    }
    None
}
