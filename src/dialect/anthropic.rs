//! Anthropic Messages: `system` as a string or blocks; messages whose content is a string or
//! blocks (text, image, document, tool_use, tool_result, thinking, redacted_thinking), with
//! cache_control markers kept wherever they are.

use serde_json::value::RawValue;

use super::{Message, ParsedRequest, string_kind, text_of_parts};
use crate::conversation::{Edit, InsertResult, Item, Kind, Role};
use crate::json::{self, RawObject};

pub(super) fn parse_messages<'a>(parsed: &mut ParsedRequest<'a>, raw_messages: Vec<&'a RawValue>) -> Option<()> {
    if let Some(system) = parsed.top.get("system") {
        if system.get().starts_with('[') {
            let (text, _) = text_of_parts(&json::as_array(system)?);
            parsed.system.push(text.clone());
            parsed.top_system.push(text);
        } else if system.get() != "null" {
            let text = json::as_str(system)?;
            parsed.system.push(text.clone());
            parsed.top_system.push(text);
        }
    }
    for (index, raw) in raw_messages.into_iter().enumerate() {
        let object = RawObject::parse(raw)?;
        let role = match object.str("role")?.as_ref() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            // Claude Code can put a system entry inside messages: keep it as it is.
            "system" => Role::System,
            _ => return None,
        };
        let content = object.get("content")?;
        let blocks = if content.get().starts_with('[') { Some(json::as_array(content)?) } else { None };
        let items = &mut parsed.conversation.items;
        let item = |block, kind| Item { message: index, block, kind, tokens: 0, edit: Edit::Keep };
        match &blocks {
            None => {
                items.push(item(None, string_kind(role, json::as_str(content)?, &mut parsed.system)));
            }
            Some(blocks) => {
                for (b, block) in blocks.iter().enumerate() {
                    items.push(item(Some(b), block_kind(role, block)?));
                }
            }
        }
        parsed.messages.push(Message { raw, object, role, blocks });
    }
    Some(())
}

fn block_kind<'a>(role: Role, block: &'a RawValue) -> Option<Kind<'a>> {
    let object = RawObject::parse(block)?;
    let kind = match object.str("type").as_deref() {
        Some("text") if role == Role::System => Kind::System { text: object.str("text")? },
        Some("text") => Kind::Text { role, text: object.str("text")? },
        Some("image") | Some("document") | Some("search_result") => Kind::Attachment,
        Some("tool_use") | Some("server_tool_use") => Kind::ToolCall {
            id: Some(object.str("id")?),
            name: object.str("name").unwrap_or_default(),
            arguments: object.get("input").map(|i| i.get().into()).unwrap_or_default(),
        },
        Some("tool_result") => {
            let call_id = Some(object.str("tool_use_id")?);
            let (text, attachments) = match object.get("content") {
                None => (Default::default(), 0),
                Some(c) if c.get().starts_with('[') => text_of_parts(&json::as_array(c)?),
                Some(c) => (json::as_str(c)?, 0),
            };
            Kind::ToolResult { call_id, text, attachments }
        }
        Some("thinking") => Kind::Thinking { text: object.str("thinking").unwrap_or_default() },
        Some("redacted_thinking") => Kind::Thinking { text: Default::default() },
        _ => Kind::Other { raw: block.get() },
    };
    Some(kind)
}

/// The `messages` array with every edit and insert applied; untouched messages keep their bytes.
pub(super) fn render_messages(parsed: &ParsedRequest) -> String {
    let conversation = &parsed.conversation;
    let mut out = json::ArrayWriter::with_capacity(parsed.body.len());
    for (index, message) in parsed.messages.iter().enumerate() {
        // Results owed by the previous assistant turn go into this user message, first.
        let owed: Vec<&InsertResult> =
            if index > 0 && message.role == Role::User { inserts_for(parsed, index - 1) } else { Vec::new() };
        if conversation.message_changed(index) || !owed.is_empty() {
            if let Some(text) = render_message(parsed, index, message, &owed) {
                out.push(&text);
            }
        } else {
            out.push(message.raw.get());
        }
        // No user message follows this assistant turn: the results get one of their own.
        if message.role == Role::Assistant && parsed.messages.get(index + 1).is_none_or(|m| m.role != Role::User) {
            let owed = inserts_for(parsed, index);
            if !owed.is_empty() {
                let blocks: Vec<String> = owed.iter().map(|i| synthetic_block(i)).collect();
                out.push(&format!(r#"{{"role":"user","content":[{}]}}"#, blocks.join(",")));
            }
        }
    }
    out.finish()
}

fn inserts_for<'p>(parsed: &'p ParsedRequest, assistant: usize) -> Vec<&'p InsertResult> {
    let conversation = &parsed.conversation;
    conversation.inserts.iter().filter(|i| conversation.items[i.call_item].message == assistant).collect()
}

fn synthetic_block(insert: &InsertResult) -> String {
    format!(
        r#"{{"type":"tool_result","tool_use_id":{},"content":{},"is_error":true}}"#,
        json::json_string(&insert.call_id),
        json::json_string(&insert.text)
    )
}

/// A changed message with its kept blocks raw, edited tool results re-rendered, synthetic results
/// placed after the existing ones; `None` when nothing is left of it.
fn render_message(parsed: &ParsedRequest, index: usize, message: &Message, owed: &[&InsertResult]) -> Option<String> {
    let items: Vec<&Item> = parsed.conversation.items.iter().filter(|i| i.message == index).collect();
    // (is a tool_result, rendered block)
    let mut blocks: Vec<(bool, String)> = Vec::new();
    match &message.blocks {
        None => {
            let edit = items.first().map(|i| &i.edit);
            match edit {
                Some(Edit::Remove) if owed.is_empty() => return None,
                Some(Edit::Remove) => {}
                Some(Edit::Replace(text)) => {
                    blocks.push((false, format!(r#"{{"type":"text","text":{}}}"#, json::json_string(text))))
                }
                _ => {
                    if let Some(content) = message.object.get("content") {
                        blocks.push((false, format!(r#"{{"type":"text","text":{}}}"#, content.get())));
                    }
                }
            }
        }
        Some(raw_blocks) => {
            for (b, block) in raw_blocks.iter().enumerate() {
                let item = items.iter().find(|i| i.block == Some(b));
                match item.map(|i| (&i.edit, &i.kind)) {
                    Some((Edit::Remove, _)) => {}
                    Some((Edit::Replace(text), Kind::ToolResult { .. })) => {
                        let object = RawObject::parse(block)?;
                        let mut rendered = String::new();
                        object.write(&mut rendered, &[], |key| (key == "content").then(|| json::json_string(text)));
                        if object.get("content").is_none() {
                            rendered.pop();
                            rendered.push_str(&format!(r#","content":{}}}"#, json::json_string(text)));
                        }
                        blocks.push((true, rendered));
                    }
                    Some((Edit::Replace(text), _)) => {
                        blocks.push((false, format!(r#"{{"type":"text","text":{}}}"#, json::json_string(text))))
                    }
                    Some((_, kind)) => blocks.push((matches!(kind, Kind::ToolResult { .. }), block.get().to_string())),
                    None => blocks.push((false, block.get().to_string())),
                }
            }
        }
    }
    if !owed.is_empty() {
        // tool_result blocks must come before any other content of the user message.
        let at = blocks.iter().take_while(|(is_result, _)| *is_result).count();
        for (offset, insert) in owed.iter().enumerate() {
            blocks.insert(at + offset, (true, synthetic_block(insert)));
        }
    }
    if blocks.is_empty() {
        return None;
    }
    let rendered: Vec<String> = blocks.into_iter().map(|(_, block)| block).collect();
    let content = format!("[{}]", rendered.join(","));
    let mut out = String::with_capacity(content.len() + 64);
    message.object.write(&mut out, &[], |key| (key == "content").then(|| content.clone()));
    Some(out)
}
