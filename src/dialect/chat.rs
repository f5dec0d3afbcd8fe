//! OpenAI Chat Completions: `messages` with roles system, developer, user, assistant, tool and the
//! legacy function; content as a string or an array of parts (text, image_url, input_audio, file,
//! refusal); assistant `tool_calls` (function and custom tools), the legacy `function_call` and
//! `audio` references, kept as they came. A part type compactor does not know is kept as it
//! came, and a tool message holding one is never shortened.

use std::borrow::Cow;
use std::collections::HashMap;

use super::{Message, ParsedRequest, only_text_and_media, text_of_parts};
use crate::conversation::{Edit, InsertResult, Item, Kind, Role};
use crate::json::{self, RawObject};

/// Reads message `index` (`raw`, already read as `object`) into `parsed`.
pub(super) fn parse_message<'a>(
    parsed: &mut ParsedRequest<'a>,
    index: usize,
    raw: &'a str,
    object: RawObject<'a>,
) -> Option<()> {
    let role_name = object.str("role")?;
    let content = object.get("content");
    let blocks = content.filter(|c| c.starts_with('[')).and_then(json::as_array);
    let role = match role_name.as_ref() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" | "function" => Role::Tool,
        _ => return None,
    };
    let (messages, bound) = (parsed.messages.len(), parsed.bound);
    let items = &mut parsed.conversation.items;
    let item = |block, kind| Item::new(index, block, kind);
    match role {
        Role::Tool => {
            let call_id = if role_name == "tool" { Some(object.str("tool_call_id")?) } else { None };
            let (text, attachments) = content_text(content, blocks.as_deref());
            let shortenable = blocks.as_deref().is_none_or(|parts| only_text_and_media(parts, MEDIA_PARTS));
            items.push(item(None, Kind::ToolResult { call_id, text, attachments }).shortenable(shortenable));
        }
        Role::System => {
            let (text, _) = content_text(content, blocks.as_deref());
            parsed.system.push(text.clone());
            items.push(item(None, Kind::System { text }));
        }
        Role::User | Role::Assistant => {
            match (&blocks, content) {
                (Some(parts), _) => {
                    super::admit_items(bound, messages, items.len(), parts.len())?;
                    for (b, part) in parts.iter().enumerate() {
                        items.push(item(Some(b), part_kind(role, part)));
                    }
                }
                (None, Some(text)) if text != "null" => {
                    items.push(item(None, Kind::Text { role, text: json::as_str(text)? }));
                }
                _ => {}
            }
            if let Some(refusal) = object.str("refusal") {
                items.push(item(None, Kind::Text { role, text: refusal }));
            }
            if let Some(calls) = object.get("tool_calls").filter(|c| *c != "null") {
                let calls = json::as_array(calls)?;
                super::admit_items(bound, messages, items.len(), calls.len())?;
                for (b, call) in calls.into_iter().enumerate() {
                    let call = RawObject::parse(call)?;
                    // A function call's name and arguments, or a custom tool's name and input.
                    let (spec, input) = match call.get("custom") {
                        Some(custom) => (RawObject::parse(custom), "input"),
                        None => (call.get("function").and_then(RawObject::parse), "arguments"),
                    };
                    let name = spec.as_ref().and_then(|f| f.str("name")).unwrap_or_default();
                    let arguments = spec.as_ref().and_then(|f| f.str(input)).unwrap_or_default();
                    items.push(item(Some(b), Kind::ToolCall { id: Some(call.str("id")?), name, arguments }));
                }
            }
            if let Some(function) = object.get("function_call").and_then(RawObject::parse) {
                let name = function.str("name").unwrap_or_default();
                let arguments = function.str("arguments").unwrap_or_default();
                items.push(item(None, Kind::ToolCall { id: None, name, arguments }));
            }
        }
    }
    parsed.messages.push(Message { raw, object, role, blocks });
    Some(())
}

/// Parts a tool message may hold and still be replaced by one text.
const MEDIA_PARTS: &[&str] = &["image_url", "input_audio", "file"];

fn content_text<'a>(content: Option<&'a str>, blocks: Option<&[&'a str]>) -> (Cow<'a, str>, u32) {
    match (blocks, content) {
        (Some(parts), _) => text_of_parts(parts),
        (None, Some(raw)) => (json::as_str(raw).unwrap_or_default(), 0),
        (None, None) => (Cow::Borrowed(""), 0),
    }
}

fn part_kind<'a>(role: Role, part: &'a str) -> Kind<'a> {
    let Some(object) = RawObject::parse(part) else { return Kind::Other { raw: part } };
    match object.str("type").as_deref() {
        Some("text") => match object.str("text") {
            Some(text) => Kind::Text { role, text },
            None => Kind::Other { raw: part },
        },
        Some("refusal") => Kind::Text { role, text: object.str("refusal").unwrap_or_default() },
        Some("image_url") | Some("input_audio") | Some("file") => Kind::Attachment,
        _ => Kind::Other { raw: part },
    }
}

/// The `messages` array with every edit and insert applied; untouched messages keep their bytes.
pub(super) fn render_messages(parsed: &ParsedRequest, out: &mut json::ArrayWriter) {
    let conversation = &parsed.conversation;
    let owed = inserts_by_anchor(parsed);
    let mut renders = parsed.memo.renders(&parsed.unapplied);
    for (index, message) in parsed.messages.iter().enumerate() {
        if conversation.message_changed(index) {
            let items = conversation.items_of(index);
            if let Some(text) = renders.message(index, items, None, || render_message(parsed, index, message)) {
                out.push(&text);
            }
        } else {
            out.push(message.raw);
        }
        for insert in owed.get(index).into_iter().flatten() {
            let mut text = String::from(r#"{"role":"tool","tool_call_id":"#);
            json::push_json_string(&mut text, &insert.call_id);
            text.push_str(r#","content":"#);
            json::push_json_string(&mut text, &insert.text);
            text.push('}');
            out.push(&text);
        }
    }
    renders.keep();
}

/// The synthetic results to write after each message: right after the last tool message
/// answering their assistant turn (or the turn itself). Each turn's zone is looked up once.
fn inserts_by_anchor<'p>(parsed: &'p ParsedRequest) -> Vec<Vec<&'p InsertResult>> {
    let conversation = &parsed.conversation;
    let mut anchors: HashMap<usize, usize> = HashMap::new();
    conversation.inserts_by(parsed.messages.len(), |assistant| {
        *anchors.entry(assistant).or_insert_with(|| {
            let zone = conversation.result_zone(assistant);
            if conversation.roles.get(zone.start) == Some(&Role::Tool) { zone.end - 1 } else { assistant }
        })
    })
}

/// A changed message: a tool message with new content, or nothing when removed.
fn render_message(parsed: &ParsedRequest, index: usize, message: &Message) -> Option<String> {
    let items = parsed.conversation.items_of(index);
    if items.iter().any(|i| i.edit == Edit::Remove && i.block.is_none()) {
        return None;
    }
    let mut out = String::with_capacity(message.raw.len());
    match message.role {
        Role::Tool => {
            let replacement = items.iter().find_map(|i| match &i.edit {
                Edit::Replace(text) => Some(json::json_string(text)),
                _ => None,
            });
            message.object.write(&mut out, &[], |key| if key == "content" { replacement.clone() } else { None });
        }
        _ => {
            // Part-level edits of user and assistant content.
            let Some(blocks) = &message.blocks else {
                return Some(message.raw.to_string());
            };
            // The part item of each block (tool calls number their own blocks), found once.
            let mut by_block: Vec<Option<&Item>> = vec![None; blocks.len()];
            for item in items.iter().filter(|i| !matches!(i.kind, Kind::ToolCall { .. })) {
                if let Some(slot) = item.block.and_then(|b| by_block.get_mut(b))
                    && slot.is_none()
                {
                    *slot = Some(item);
                }
            }
            let mut content = String::from("[");
            let mut first = true;
            for (block, edit) in blocks.iter().zip(&by_block) {
                let text = match edit.map(|i| &i.edit) {
                    Some(Edit::Remove) => continue,
                    Some(Edit::Replace(text)) => format!(r#"{{"type":"text","text":{}}}"#, json::json_string(text)),
                    _ => block.to_string(),
                };
                if !first {
                    content.push(',');
                }
                first = false;
                content.push_str(&text);
            }
            content.push(']');
            message.object.write(&mut out, &[], |key| (key == "content").then(|| content.clone()));
        }
    }
    Some(out)
}
