//! OpenAI Responses: `input` items (messages, function / custom tool / local shell calls and their
//! outputs paired by `call_id`, reasoning items with encrypted content, compaction items, anything
//! else kept untouched) and `instructions` as the system prompt. Every item is a "message" of the
//! neutral view; reasoning items are moved or dropped whole, never edited.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::{Message, ParsedRequest, string_kind, text_of_parts};
use crate::conversation::{Edit, Item, Kind, Role};
use crate::json::{self, RawObject};

pub(super) fn parse_messages<'a>(parsed: &mut ParsedRequest<'a>, raw_items: Vec<&'a RawValue>) -> Option<()> {
    if let Some(instructions) = parsed.top.str("instructions") {
        parsed.system.push(instructions.clone());
        parsed.top_system.push(instructions);
    }
    for (index, raw) in raw_items.into_iter().enumerate() {
        let object = RawObject::parse(raw)?;
        let kind_name = object.str("type");
        let items = &mut parsed.conversation.items;
        let item = |block, kind| Item { message: index, block, kind, tokens: 0, edit: Edit::Keep };
        let role = match kind_name.as_deref() {
            None | Some("message") => {
                let role = match object.str("role")?.as_ref() {
                    "system" | "developer" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    _ => return None,
                };
                let content = object.get("content")?;
                if content.get().starts_with('[') {
                    for (b, part) in json::as_array(content)?.into_iter().enumerate() {
                        items.push(item(Some(b), part_kind(role, part)));
                    }
                } else {
                    items.push(item(None, string_kind(role, json::as_str(content)?, &mut parsed.system)));
                }
                if role == Role::System && content.get().starts_with('[') {
                    let texts: Vec<String> = items
                        .iter()
                        .filter(|i| i.message == index)
                        .filter_map(|i| match &i.kind {
                            Kind::System { text } => Some(text.to_string()),
                            _ => None,
                        })
                        .collect();
                    parsed.system.push(Cow::Owned(texts.join("\n")));
                }
                role
            }
            Some("function_call") | Some("custom_tool_call") | Some("local_shell_call") => {
                let arguments = match kind_name.as_deref() {
                    Some("function_call") => object.str("arguments").unwrap_or_default(),
                    Some("custom_tool_call") => object.str("input").unwrap_or_default(),
                    _ => object.get("action").map(|a| Cow::Borrowed(a.get())).unwrap_or_default(),
                };
                let name = object.str("name").unwrap_or(Cow::Borrowed("local_shell"));
                items.push(item(None, Kind::ToolCall { id: Some(object.str("call_id")?), name, arguments }));
                Role::Assistant
            }
            Some("function_call_output") | Some("custom_tool_call_output") | Some("local_shell_call_output") => {
                let call_id = object.str("call_id").or_else(|| object.str("id"))?;
                let (text, attachments) = match object.get("output") {
                    Some(output) if output.get().starts_with('[') => text_of_parts(&json::as_array(output)?),
                    Some(output) => (json::as_str(output).unwrap_or(Cow::Borrowed(output.get())), 0),
                    None => (Cow::Borrowed(""), 0),
                };
                items.push(item(None, Kind::ToolResult { call_id: Some(call_id), text, attachments }));
                Role::Tool
            }
            Some("reasoning") => {
                let summary = object.get("summary").and_then(json::as_array).map(|parts| text_of_parts(&parts).0);
                items.push(item(None, Kind::Thinking { text: summary.unwrap_or_default() }));
                Role::Assistant
            }
            _ => {
                items.push(item(None, Kind::Other { raw: raw.get() }));
                Role::Assistant
            }
        };
        parsed.messages.push(Message { raw, object, role, blocks: None });
    }
    Some(())
}

fn part_kind<'a>(role: Role, part: &'a RawValue) -> Kind<'a> {
    let Some(object) = RawObject::parse(part) else { return Kind::Other { raw: part.get() } };
    match object.str("type").as_deref() {
        Some("input_text") | Some("output_text") | Some("text") => match object.str("text") {
            Some(text) if role == Role::System => Kind::System { text },
            Some(text) => Kind::Text { role, text },
            None => Kind::Other { raw: part.get() },
        },
        Some("refusal") => Kind::Text { role, text: object.str("refusal").unwrap_or_default() },
        Some("input_image") | Some("input_file") | Some("input_audio") => Kind::Attachment,
        _ => Kind::Other { raw: part.get() },
    }
}

/// The `input` array with edits and inserts applied; untouched items keep their bytes. A
/// synthetic output goes right after its call.
pub(super) fn render_items(parsed: &ParsedRequest) -> String {
    let conversation = &parsed.conversation;
    let mut out = json::ArrayWriter::with_capacity(parsed.body.len());
    for (index, message) in parsed.messages.iter().enumerate() {
        let edit = conversation.items.iter().find(|i| i.message == index).map(|i| &i.edit);
        match edit {
            Some(Edit::Remove) => {}
            Some(Edit::Replace(text)) if message.role == Role::Tool => {
                let mut rendered = String::new();
                message.object.write(&mut rendered, &[], |key| (key == "output").then(|| json::json_string(text)));
                out.push(&rendered);
            }
            _ => out.push(message.raw.get()),
        }
        for insert in conversation.inserts.iter().filter(|i| conversation.items[i.call_item].message == index) {
            let output_type = match message.object.str("type").as_deref() {
                Some("custom_tool_call") => "custom_tool_call_output",
                _ => "function_call_output",
            };
            out.push(&format!(
                r#"{{"type":"{output_type}","call_id":{},"output":{}}}"#,
                json::json_string(&insert.call_id),
                json::json_string(&insert.text)
            ));
        }
    }
    out.finish()
}
