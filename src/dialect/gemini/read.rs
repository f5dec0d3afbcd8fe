//! Reading a Gemini body: `systemInstruction`, the output cap, and each content's parts as
//! neutral items.

use std::borrow::Cow;

use super::MADE_UP;
use super::pairing::{Naming, Response, made_up_id, pair_responses};
use crate::conversation::{Item, Kind, Role};
use crate::dialect::{Message, ParsedRequest};
use crate::json::{self, RawObject};

/// Reads `systemInstruction` (or its snake_case spelling) into `parsed`.
pub(in crate::dialect) fn parse_top<'a>(parsed: &mut ParsedRequest<'a>) -> Option<()> {
    for key in ["systemInstruction", "system_instruction"] {
        let Some(raw) = parsed.top.get(key).filter(|raw| *raw != "null") else { continue };
        let content = RawObject::parse(raw)?;
        let parts = content.get("parts").map(json::as_array).unwrap_or_default().unwrap_or_default();
        let texts: Vec<Cow<'a, str>> = parts.iter().filter_map(|part| RawObject::parse(part)?.str("text")).collect();
        let text =
            if texts.len() == 1 { texts.into_iter().next().unwrap_or_default() } else { Cow::Owned(texts.join("\n")) };
        parsed.push_top_system(text);
    }
    Some(())
}

/// The output cap of a Gemini request: `generationConfig.maxOutputTokens` (or the snake_case
/// spellings the API also takes), read without parsing anything else of the config.
pub(in crate::dialect) fn max_output_tokens(parsed: &ParsedRequest) -> Option<u64> {
    ["generationConfig", "generation_config"].into_iter().find_map(|key| {
        let config = RawObject::parse(parsed.top.get(key)?)?;
        ["maxOutputTokens", "max_output_tokens"].into_iter().find_map(|field| config.get(field)?.parse::<u64>().ok())
    })
}

/// Reads content `index` (`raw`, already read as `object`) into `parsed`.
pub(in crate::dialect) fn parse_message<'a>(
    parsed: &mut ParsedRequest<'a>,
    index: usize,
    raw: &'a str,
    object: RawObject<'a>,
) -> Option<()> {
    let role = match object.str("role").as_deref() {
        // countTokens' contents may leave the role out: a user's.
        None | Some("user") => Role::User,
        Some("model") => Role::Assistant,
        Some("function") | Some("tool") => Role::Tool,
        Some(_) => return None,
    };
    let parts = match object.get("parts") {
        Some(parts) if parts.starts_with('[') => json::as_array(parts)?,
        None | Some("null") => Vec::new(),
        Some(_) => return None,
    };
    crate::dialect::admit_items(parsed.bound, parsed.messages.len(), parsed.conversation.items.len(), parts.len())?;
    let mut naming = Naming {
        // The model turns before this content: a model content's own turn.
        turn: parsed.assistant_turns,
        by_name: Vec::new(),
        code_runs: (0, 0),
        responses: Vec::new(),
    };
    let first_item = parsed.conversation.items.len();
    for (b, part) in parts.iter().enumerate() {
        let item = part_item(index, b, role, part, &mut naming)?;
        parsed.conversation.items.push(item);
    }
    if !naming.responses.is_empty() {
        // The responses answer the calls of the last model turn before this content.
        pair_responses(&mut parsed.conversation, parsed.last_assistant, index, first_item, &naming.responses);
    }
    parsed.messages.push(Message { raw, object, role, blocks: Some(parts) });
    Some(())
}

/// The neutral item of one part; `None` when a part compactor knows lacks a field it requires
/// (the request then goes untouched).
fn part_item<'a>(message: usize, b: usize, role: Role, part: &'a str, naming: &mut Naming<'a>) -> Option<Item<'a>> {
    let item = |kind| Item::new(message, Some(b), kind);
    let Some(object) = RawObject::parse(part) else { return Some(item(Kind::Other { raw: part })) };
    let text_role = if role == Role::Assistant { Role::Assistant } else { Role::User };
    if let Some(call) = object.get("functionCall") {
        let call = RawObject::parse(call)?;
        let name = call.str("name")?;
        let id = match call.str("id") {
            Some(id) => id,
            None => Cow::Owned(made_up_id(naming.turn, &name, naming.ordinal(&name))),
        };
        let arguments = call.get("args").map(Cow::Borrowed).unwrap_or_default();
        return Some(item(Kind::ToolCall { id: Some(id), name, arguments }));
    }
    if let Some(response) = object.get("functionResponse") {
        let response = RawObject::parse(response)?;
        let name = response.str("name")?;
        // Which call it answers is known once the whole content is read ([`pair_responses`]).
        let call_id = response.str("id");
        naming.responses.push(Response { block: b, name });
        let attachments = response.get("parts").and_then(json::as_array).map_or(0, |p| p.len() as u32);
        let body = response.get("response");
        let (text, shortenable) = match body.and_then(RawObject::parse) {
            Some(body) => (response_text(&body).unwrap_or(Cow::Borrowed(body_raw(&response))), attachments == 0),
            None => (Cow::Borrowed(body.unwrap_or("")), false),
        };
        let kind = Kind::ToolResult { call_id, text, attachments };
        return Some(item(kind).shortenable(shortenable));
    }
    if object.get("inlineData").is_some() || object.get("fileData").is_some() {
        return Some(item(Kind::Attachment));
    }
    // Code the provider ran inside its own turn, paired with its result by order.
    if let Some(code) = object.get("executableCode").and_then(RawObject::parse) {
        let id = Cow::Owned(format!("{MADE_UP}code:{message}:{}", naming.code_runs.0));
        naming.code_runs.0 += 1;
        let kind = Kind::ToolCall {
            id: Some(id),
            name: Cow::Borrowed("code_execution"),
            arguments: code.str("code").unwrap_or_default(),
        };
        return Some(item(kind).provider_run());
    }
    if let Some(result) = object.get("codeExecutionResult").and_then(RawObject::parse) {
        let id = Cow::Owned(format!("{MADE_UP}code:{message}:{}", naming.code_runs.1));
        naming.code_runs.1 += 1;
        let kind =
            Kind::ToolResult { call_id: Some(id), text: result.str("output").unwrap_or_default(), attachments: 0 };
        return Some(item(kind).provider_run().shortenable(false));
    }
    if let Some(text) = object.get("text") {
        let text = json::as_str(text)?;
        if object.get("thought").is_some_and(|t| t == "true") {
            return Some(item(Kind::Thinking { text }));
        }
        return Some(item(Kind::Text { role: text_role, text }));
    }
    Some(item(Kind::Other { raw: part }))
}

/// The raw `response` object of a function response.
fn body_raw<'a>(response: &RawObject<'a>) -> &'a str {
    response.get("response").unwrap_or("")
}

/// A response object's one string, when it is all it holds (`{"output": "…"}`, `{"error": "…"}`).
fn response_text<'a>(body: &RawObject<'a>) -> Option<Cow<'a, str>> {
    match body.fields.as_slice() {
        [(_, value)] if value.starts_with('"') => json::as_str(value),
        _ => None,
    }
}
