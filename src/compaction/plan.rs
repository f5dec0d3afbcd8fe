//! Where to cut, what to keep, and the rebuilt conversation: lead system messages, the summary,
//! the user's own messages from the summarized part, then the recent turns verbatim.

use xxhash_rust::xxh3::Xxh3;

use crate::conversation::{Kind, Role};
use crate::dialect::{Dialect, ParsedRequest, breakpoints};
use crate::json;
use crate::rewrite::truncate::head_and_tail;
use crate::session::state::CompactionRecord;

/// Hash of the first `count` messages, ignoring `cache_control` markers (agents move them from turn
/// to turn, and they change nothing of the conversation) and Gemini CLI's `<session_context>`
/// part (today's date and a file listing, rewritten every turn).
pub fn prefix_hash(parsed: &ParsedRequest, count: usize) -> String {
    let mut hasher = Xxh3::new();
    for message in parsed.messages.iter().take(count) {
        let raw = message.raw;
        if raw.contains("\"cache_control\"") || raw.contains(crate::session::identify::SESSION_CONTEXT) {
            if let Ok(mut value) = serde_json::from_str::<serde_json::Value>(raw) {
                strip_cache_control(&mut value);
                strip_session_context(&mut value);
                hasher.update(value.to_string().as_bytes());
            }
        } else {
            hasher.update(raw.as_bytes());
        }
        hasher.update(b"\0");
    }
    format!("{:032x}", hasher.digest128())
}

/// Leaves out the text parts of a Gemini content that are Gemini CLI's per-turn session context.
fn strip_session_context(value: &mut serde_json::Value) {
    if let Some(parts) = value.get_mut("parts").and_then(|p| p.as_array_mut()) {
        parts.retain(|part| {
            !part["text"]
                .as_str()
                .is_some_and(|t| t.trim_start().starts_with(crate::session::identify::SESSION_CONTEXT))
        });
    }
}

fn strip_cache_control(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.shift_remove("cache_control");
            map.values_mut().for_each(strip_cache_control);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_cache_control),
        _ => {}
    }
}

/// For every message, whether the conversation may be cut right before it with every tool pair
/// intact: a user turn that carries no tool results, or an assistant turn (its results follow
/// it), never right after a reasoning item. One pass over the conversation answers every index.
fn boundaries(parsed: &ParsedRequest) -> Vec<bool> {
    let count = parsed.messages.len();
    let mut carries_results = vec![false; count];
    let mut has_thinking = vec![false; count];
    for item in &parsed.conversation.items {
        match item.kind {
            Kind::ToolResult { .. } => carries_results[item.message] = true,
            Kind::Thinking { .. } => has_thinking[item.message] = true,
            _ => {}
        }
    }
    let clean = parsed.conversation.clean_cuts();
    (0..count)
        .map(|index| {
            // A reasoning item belongs to the item after it: never cut between them.
            let after_reasoning = index > 0 && has_thinking[index - 1] && parsed.messages[index - 1].blocks.is_none();
            matches!(parsed.messages[index].role, Role::User | Role::Assistant)
                && !carries_results[index]
                && !after_reasoning
                && clean.get(index).copied().unwrap_or(true)
        })
        .collect()
}

/// The first message to keep verbatim: about `keep_recent_tokens` from the end, at a clean turn
/// boundary, strictly after `after` (the previous cut) so there is something new to summarize.
pub fn choose_cut(parsed: &ParsedRequest, keep_recent_tokens: u32, after: usize) -> Option<usize> {
    let count = parsed.messages.len();
    let lower = after.max(parsed.lead()) + 1;
    if count < 2 || lower > count - 1 {
        return None;
    }
    let mut kept = 0u32;
    let mut target = count - 1;
    for index in (lower..count).rev() {
        kept = kept.saturating_add(parsed.message_tokens(index));
        if kept >= keep_recent_tokens {
            target = index;
            break;
        }
    }
    let boundary = boundaries(parsed);
    let before = (lower..=target).rev().find(|&i| boundary[i]);
    before.or_else(|| (target + 1..count).find(|&i| boundary[i]))
}

/// The cut after the whole conversation, for a summary prepared in the background whose record
/// applies turns later (the turns added by then are its kept tail): `messages.len()` when the
/// newest message is no assistant message (the agent's turn is whole: no call waits for its
/// result, and what comes next is the assistant's answer, a clean cut), and there is something
/// after `after` (the previous cut) to summarize.
pub fn cut_at_end(parsed: &ParsedRequest, after: usize) -> Option<usize> {
    let count = parsed.messages.len();
    let lower = after.max(parsed.lead()) + 1;
    let complete = parsed.messages.last().is_some_and(|m| m.role != Role::Assistant);
    (count >= 2 && lower <= count && complete && parsed.conversation.is_clean_cut(count)).then_some(count)
}

/// Indices of the user's own messages in `lead..cut`, newest first up to `budget` tokens, returned
/// oldest first, so the user's intent is never summarized away.
pub fn user_messages(parsed: &ParsedRequest, cut: usize, budget: u32) -> Vec<u32> {
    let mut chosen = Vec::new();
    let mut used = 0u32;
    for index in (parsed.lead()..cut).rev() {
        if parsed.messages[index].role != Role::User || user_text(parsed, index).is_none() {
            continue;
        }
        let tokens = parsed.message_tokens(index);
        if used.saturating_add(tokens) > budget {
            break;
        }
        used = used.saturating_add(tokens);
        chosen.push(index as u32);
    }
    chosen.reverse();
    chosen
}

/// The text of a message that is only the user's words (no tool results), attachments left out.
fn user_text(parsed: &ParsedRequest, index: usize) -> Option<String> {
    let mut texts = Vec::new();
    for item in parsed.conversation.items_of(index) {
        match &item.kind {
            Kind::Text { text, .. } => texts.push(text.as_ref()),
            Kind::Attachment | Kind::Other { .. } => {}
            _ => return None,
        }
    }
    (!texts.is_empty()).then(|| texts.join("\n"))
}

/// The rebuilt request body for `record` applied to this conversation.
pub fn rebuild(
    parsed: &ParsedRequest,
    record: &CompactionRecord,
    prefix: &str,
    count: &dyn Fn(&str) -> u32,
) -> Option<Vec<u8>> {
    let cut = usize::try_from(record.covered_messages).ok()?;
    let mut messages: Vec<String> = parsed.messages[..parsed.lead()].iter().map(|m| m.raw.to_string()).collect();
    let summary_at = messages.len();
    messages.push(String::new());
    let limit = record.truncate_user_tokens;
    let shorten =
        |text: String| if limit > 0 && count(&text) > limit { head_and_tail(&text, limit, count) } else { text };
    for &index in &record.user_messages {
        let text = user_text(parsed, index as usize)?;
        messages.push(user_message(parsed.dialect, &shorten(text)));
    }
    for (index, message) in parsed.messages.iter().enumerate().skip(cut) {
        // The aggressive rung also cuts oversized user messages of the kept tail.
        match user_text(parsed, index) {
            Some(text) if limit > 0 && message.role == Role::User && count(&text) > limit => {
                messages.push(user_message(parsed.dialect, &shorten(text)))
            }
            _ => messages.push(message.raw.to_string()),
        }
    }
    let summary = format!("{prefix}{}", record.summary);
    messages[summary_at] = match parsed.dialect {
        // The stable part (tools, system, summary) ends at a breakpoint when one is free.
        Dialect::AnthropicMessages => {
            let elsewhere =
                breakpoints::outside_messages(parsed) + messages.iter().map(|m| breakpoints::count(m)).sum::<usize>();
            breakpoints::summary_message(&summary, elsewhere, messages[summary_at + 1..].iter().map(String::as_str))
        }
        _ => user_message(parsed.dialect, &summary),
    };
    parsed.splice(&[(parsed.dialect.history_field(), format!("[{}]", messages.join(",")))])
}

/// The assistant turns of `parsed` that [`rebuild`] leaves to `record`'s summary: the rebuilt
/// body keeps the lead and adds only user messages before the kept tail.
pub fn summarized_turns(parsed: &ParsedRequest, record: &CompactionRecord) -> usize {
    let cut = usize::try_from(record.covered_messages).unwrap_or(usize::MAX).min(parsed.messages.len());
    let lead = parsed.lead().min(cut);
    parsed.messages[lead..cut].iter().filter(|m| m.role == Role::Assistant).count()
}

fn user_message(dialect: Dialect, text: &str) -> String {
    match dialect {
        Dialect::Responses => format!(
            r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":{}}}]}}"#,
            json::json_string(text)
        ),
        Dialect::Gemini => format!(r#"{{"role":"user","parts":[{{"text":{}}}]}}"#, json::json_string(text)),
        _ => format!(r#"{{"role":"user","content":{}}}"#, json::json_string(text)),
    }
}

/// The newest stored record whose covered prefix this conversation still starts with.
pub fn matching_record<'r>(parsed: &ParsedRequest, records: &'r [CompactionRecord]) -> Option<&'r CompactionRecord> {
    records.iter().rev().find(|record| {
        let covered = record.covered_messages as usize;
        covered > 0 && covered < parsed.messages.len() && prefix_hash(parsed, covered) == record.covered_hash
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Chat conversation: the task, then `turns` tool turns; `pending`: it ends with a call
    /// whose result has not come yet.
    fn chat(turns: usize, pending: bool) -> Vec<u8> {
        let mut messages =
            vec![json!({"role": "system", "content": "Agent."}), json!({"role": "user", "content": "Fix the parser."})];
        for turn in 0..turns {
            let id = format!("call_{turn}");
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read", "arguments": "{}"}}]}));
            if !(pending && turn + 1 == turns) {
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": format!("output {turn}")}));
            }
        }
        serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap()
    }

    #[test]
    fn a_background_cut_at_the_end_keeps_only_the_turns_added_before_its_record_applies() {
        let now = chat(3, false);
        let parsed = ParsedRequest::parse(Dialect::ChatCompletions, &now).unwrap();
        let count = parsed.messages.len();
        assert_eq!(cut_at_end(&parsed, 0), Some(count));
        assert_eq!(cut_at_end(&parsed, count - 1), Some(count), "the newest message is still to summarize");
        assert_eq!(cut_at_end(&parsed, count), None, "nothing after the previous cut");
        let waiting = chat(3, true);
        let waiting = ParsedRequest::parse(Dialect::ChatCompletions, &waiting).unwrap();
        assert_eq!(cut_at_end(&waiting, 0), None, "a call waits for its result");

        // Two turns later the record applies: the summary, then those two turns verbatim.
        let record = CompactionRecord {
            generation: 1,
            summary: "Read three parts.".into(),
            covered_messages: count as u64,
            covered_hash: String::new(),
            first_kept: count as u64,
            user_messages: Vec::new(),
            truncate_user_tokens: 0,
            tokens_before: 0,
            tokens_after: 0,
            trigger: "background".into(),
            model: "m".into(),
            at_unix_ms: 0,
            due_tokens: 1,
            cost: Default::default(),
            started_by: String::new(),
            built_on: 0,
            us_per_token: 0,
        };
        let later = chat(5, false);
        let later = ParsedRequest::parse(Dialect::ChatCompletions, &later).unwrap();
        let rebuilt = rebuild(&later, &record, "Summary: ", &|text: &str| text.len() as u32 / 4).unwrap();
        let rebuilt: serde_json::Value = serde_json::from_slice(&rebuilt).unwrap();
        let roles: Vec<&str> =
            rebuilt["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant", "tool"]);
        assert!(rebuilt["messages"][1]["content"].as_str().unwrap().starts_with("Summary: Read three parts."));
        assert_eq!(rebuilt["messages"][5]["content"], "output 4");
    }
}
