//! OpenAI Responses: `input` items and `instructions` as the system prompt. Every item is a
//! "message" of the neutral view.
//!
//! Client tool pairs, joined by `call_id`: `function_call` / `custom_tool_call` /
//! `local_shell_call` and their outputs, which repair looks after and the policies may shorten.
//! `shell_call`, `apply_patch_call`, `computer_call`, `tool_search_call` (client-run) and
//! `program` pairs, and `mcp_approval_request` / `_response`, are pairs too, kept together by
//! compaction but never repaired or shortened (compactor cannot write their outputs). Hosted
//! tools the provider runs (`web_search_call`, `file_search_call`, `code_interpreter_call`,
//! `image_generation_call`, `mcp_call`) carry their own results: never answered by compactor; only
//! an MCP call's text output and a code interpreter's single log may be shortened. Reasoning items
//! (encrypted content the provider verifies) are moved or dropped whole, never edited; compaction
//! items, item references and anything compactor does not know are kept untouched.

use std::borrow::Cow;

use super::{Message, ParsedRequest, only_text_and_media, string_kind, text_of_parts};
use crate::conversation::{Edit, Item, Kind, Role};
use crate::json::{self, RawObject};

/// Parts a function or custom tool output may hold and still be replaced by one text.
const MEDIA_PARTS: &[&str] = &["input_image", "input_file"];

/// Reads `instructions` into `parsed`.
pub(super) fn parse_top<'a>(parsed: &mut ParsedRequest<'a>) -> Option<()> {
    if let Some(instructions) = parsed.top.str("instructions") {
        parsed.push_top_system(instructions);
    }
    Some(())
}

/// Reads item `index` (`raw`, already read as `object`) into `parsed`.
pub(super) fn parse_message<'a>(
    parsed: &mut ParsedRequest<'a>,
    index: usize,
    raw: &'a str,
    object: RawObject<'a>,
) -> Option<()> {
    let kind_name = object.str("type");
    let items = &mut parsed.conversation.items;
    let role = match kind_name.as_deref() {
        // An item reference may leave out its type: only a role makes it a message.
        None if object.get("role").is_none() => {
            items.push(Item::new(index, None, Kind::Other { raw }));
            Role::Assistant
        }
        None | Some("message") => read_message(parsed, index, &object)?,
        Some(kind @ ("function_call" | "custom_tool_call" | "local_shell_call")) => {
            read_client_call(items, index, kind, &object)?
        }
        Some("function_call_output" | "custom_tool_call_output" | "local_shell_call_output") => {
            read_client_output(items, index, &object)?
        }
        // Client-run tools whose outputs compactor cannot write, and pairs that join by id.
        Some(kind @ ("shell_call" | "apply_patch_call" | "computer_call" | "program")) => {
            read_unwritable_call(items, index, kind, &object)?
        }
        Some(kind @ ("shell_call_output" | "apply_patch_call_output" | "computer_call_output")) => {
            read_unwritable_output(items, index, kind, &object)?
        }
        Some("program_output") => {
            items.push(result(index, object.str("call_id")?, object.str("result").unwrap_or_default(), 0));
            Role::Tool
        }
        Some("tool_search_call") if object.str("call_id").is_some() => {
            items.push(call(index, object.str("call_id")?, Cow::Borrowed("tool_search"), raw_of(&object, "arguments")));
            Role::Assistant
        }
        Some("tool_search_output") if object.str("call_id").is_some() => {
            items.push(result(index, object.str("call_id")?, raw_of(&object, "tools"), 0));
            Role::Tool
        }
        Some("mcp_approval_request") => {
            let arguments = object.str("arguments").unwrap_or_default();
            items.push(call(index, object.str("id")?, name_or(&object, "mcp"), arguments));
            Role::Assistant
        }
        Some("mcp_approval_response") => {
            let verdict = raw_of(&object, "approve");
            items.push(result(index, object.str("approval_request_id")?, verdict, 0));
            Role::Tool
        }
        // Hosted tools: the call and the provider's result in one item.
        Some("web_search_call") => {
            items.push(call(index, object.str("id")?, Cow::Borrowed("web_search"), raw_of(&object, "action")));
            Role::Assistant
        }
        Some("file_search_call") => read_file_search_call(items, index, &object)?,
        Some("image_generation_call") => read_image_generation_call(items, index, &object)?,
        Some(kind @ ("code_interpreter_call" | "mcp_call")) => read_code_or_mcp_call(items, index, kind, &object)?,
        Some("reasoning") => read_reasoning(items, index, &object),
        // Tools offered from here on: developer input, kept in place.
        Some("additional_tools") => {
            items.push(Item::new(index, None, Kind::Other { raw }));
            Role::System
        }
        _ => {
            items.push(Item::new(index, None, Kind::Other { raw }));
            Role::Assistant
        }
    };
    parsed.messages.push(Message { raw, object, role, blocks: None });
    Some(())
}

/// A `message` item: its role, and its content as one text or as parts (a system message's
/// parts also joined into one text for the fingerprint).
fn read_message<'a>(parsed: &mut ParsedRequest<'a>, index: usize, object: &RawObject<'a>) -> Option<Role> {
    let items = &mut parsed.conversation.items;
    let role = match object.str("role")?.as_ref() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        _ => return None,
    };
    let content = object.get("content")?;
    let first_part = items.len();
    if content.starts_with('[') {
        let parts = json::as_array(content)?;
        super::admit_items(parsed.bound, parsed.messages.len(), items.len(), parts.len())?;
        for (b, part) in parts.into_iter().enumerate() {
            items.push(Item::new(index, Some(b), part_kind(role, part)));
        }
    } else {
        items.push(Item::new(index, None, string_kind(role, json::as_str(content)?, &mut parsed.system)));
    }
    if role == Role::System && content.starts_with('[') {
        // This message's parts are the items just pushed.
        let texts: Vec<String> = items[first_part..]
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::System { text } => Some(text.to_string()),
                _ => None,
            })
            .collect();
        parsed.system.push(Cow::Owned(texts.join("\n")));
    }
    Some(role)
}

/// A call of a client tool whose output compactor can write: `function_call`,
/// `custom_tool_call` or `local_shell_call` (`kind`).
fn read_client_call<'a>(items: &mut Vec<Item<'a>>, index: usize, kind: &str, object: &RawObject<'a>) -> Option<Role> {
    let arguments = match kind {
        "function_call" => object.str("arguments").unwrap_or_default(),
        "custom_tool_call" => object.str("input").unwrap_or_default(),
        _ => raw_of(object, "action"),
    };
    let kind = Kind::ToolCall { id: Some(object.str("call_id")?), name: name_or(object, "local_shell"), arguments };
    items.push(Item::new(index, None, kind));
    Some(Role::Assistant)
}

/// The output of such a call: its text, and whether one text may replace it and stay valid.
fn read_client_output<'a>(items: &mut Vec<Item<'a>>, index: usize, object: &RawObject<'a>) -> Option<Role> {
    let call_id = object.str("call_id").or_else(|| object.str("id"))?;
    let (text, attachments, shortenable) = match object.get("output") {
        Some(output) if output.starts_with('[') => {
            let parts = json::as_array(output)?;
            let (text, attachments) = text_of_parts(&parts);
            (text, attachments, only_text_and_media(&parts, MEDIA_PARTS))
        }
        Some(output) => (json::as_str(output).unwrap_or(Cow::Borrowed(output)), 0, true),
        None => (Cow::Borrowed(""), 0, true),
    };
    let kind = Kind::ToolResult { call_id: Some(call_id), text, attachments };
    items.push(Item::new(index, None, kind).shortenable(shortenable));
    Some(Role::Tool)
}

/// A call of a client-run tool whose output compactor cannot write (`kind`: `shell_call`,
/// `apply_patch_call`, `computer_call` or `program`).
fn read_unwritable_call<'a>(
    items: &mut Vec<Item<'a>>,
    index: usize,
    kind: &str,
    object: &RawObject<'a>,
) -> Option<Role> {
    let (fallback, arguments) = match kind {
        "shell_call" => ("shell", raw_of(object, "action")),
        "apply_patch_call" => ("apply_patch", raw_of(object, "operation")),
        "computer_call" => ("computer", raw_of(object, "action")),
        _ => ("program", object.str("code").unwrap_or_default()),
    };
    items.push(call(index, object.str("call_id")?, name_or(object, fallback), arguments));
    Some(Role::Assistant)
}

/// The output of such a call: a computer call's screenshot is an attachment, the others' output
/// is text.
fn read_unwritable_output<'a>(
    items: &mut Vec<Item<'a>>,
    index: usize,
    kind: &str,
    object: &RawObject<'a>,
) -> Option<Role> {
    let attachments = u32::from(kind == "computer_call_output");
    let text = if attachments > 0 { Cow::Borrowed("") } else { raw_of(object, "output") };
    items.push(result(index, object.str("call_id")?, text, attachments));
    Some(Role::Tool)
}

/// A hosted file search: its queries and the provider's results.
fn read_file_search_call<'a>(items: &mut Vec<Item<'a>>, index: usize, object: &RawObject<'a>) -> Option<Role> {
    let id = object.str("id")?;
    items.push(call(index, id.clone(), Cow::Borrowed("file_search"), raw_of(object, "queries")));
    items.push(result(index, id, raw_of(object, "results"), 0));
    Some(Role::Assistant)
}

/// A hosted image generation: its result is the image, an attachment.
fn read_image_generation_call<'a>(items: &mut Vec<Item<'a>>, index: usize, object: &RawObject<'a>) -> Option<Role> {
    let id = object.str("id")?;
    items.push(call(index, id.clone(), Cow::Borrowed("image_generation"), Cow::Borrowed("")));
    items.push(result(index, id, Cow::Borrowed(""), 1));
    Some(Role::Assistant)
}

/// A hosted code interpreter or MCP call (`kind`) and its result, whose one text output may be
/// shortened ([`hosted_output`]).
fn read_code_or_mcp_call<'a>(
    items: &mut Vec<Item<'a>>,
    index: usize,
    kind: &str,
    object: &RawObject<'a>,
) -> Option<Role> {
    let id = object.str("id")?;
    let (name, arguments) = match kind {
        "mcp_call" => (name_or(object, "mcp"), object.str("arguments").unwrap_or_default()),
        _ => (Cow::Borrowed("code_interpreter"), object.str("code").unwrap_or_default()),
    };
    items.push(call(index, id.clone(), name, arguments));
    let output = match hosted_output(object) {
        Some(field) => result(index, id, json::as_str(field)?, 0).shortenable(true),
        None => result(index, id, raw_of(object, if kind == "mcp_call" { "error" } else { "outputs" }), 0),
    };
    items.push(output);
    Some(Role::Assistant)
}

/// A reasoning item: moved or dropped whole, its summary's text counted.
fn read_reasoning<'a>(items: &mut Vec<Item<'a>>, index: usize, object: &RawObject<'a>) -> Role {
    let summary = object.get("summary").and_then(json::as_array).map(|parts| text_of_parts(&parts).0);
    items.push(Item::new(index, None, Kind::Thinking { text: summary.unwrap_or_default() }));
    Role::Assistant
}

/// A call repair leaves alone (block 0 of its item).
fn call<'a>(index: usize, id: Cow<'a, str>, name: Cow<'a, str>, arguments: Cow<'a, str>) -> Item<'a> {
    Item::new(index, Some(0), Kind::ToolCall { id: Some(id), name, arguments }).provider_run()
}

/// A result repair leaves alone and no policy shortens (block 1 of its item).
fn result<'a>(index: usize, id: Cow<'a, str>, text: Cow<'a, str>, attachments: u32) -> Item<'a> {
    let kind = Kind::ToolResult { call_id: Some(id), text, attachments };
    Item::new(index, Some(1), kind).provider_run().shortenable(false)
}

/// The raw JSON of field `key`, or nothing.
fn raw_of<'a>(object: &RawObject<'a>, key: &str) -> Cow<'a, str> {
    object.get(key).map(Cow::Borrowed).unwrap_or_default()
}

/// The item's `name`, or `fallback`.
fn name_or<'a>(object: &RawObject<'a>, fallback: &'static str) -> Cow<'a, str> {
    object.str("name").unwrap_or(Cow::Borrowed(fallback))
}

/// The one text string of a hosted tool's result that may be shortened: an MCP call's `output`,
/// or a code interpreter's log when it is its only output.
fn hosted_output<'a>(object: &RawObject<'a>) -> Option<&'a str> {
    let is_string = |v: &&str| v.starts_with('"');
    if object.str("type").as_deref() == Some("mcp_call") {
        return object.get("output").filter(is_string);
    }
    let outputs = json::as_array(object.get("outputs")?)?;
    let [only] = outputs.as_slice() else { return None };
    let log = RawObject::parse(only)?;
    (log.str("type").as_deref() == Some("logs")).then(|| log.get("logs")).flatten().filter(is_string)
}

fn part_kind<'a>(role: Role, part: &'a str) -> Kind<'a> {
    let Some(object) = RawObject::parse(part) else { return Kind::Other { raw: part } };
    match object.str("type").as_deref() {
        Some("input_text") | Some("output_text") | Some("text") => match object.str("text") {
            Some(text) if role == Role::System => Kind::System { text },
            Some(text) => Kind::Text { role, text },
            None => Kind::Other { raw: part },
        },
        Some("refusal") => Kind::Text { role, text: object.str("refusal").unwrap_or_default() },
        Some("input_image") | Some("input_file") | Some("input_audio") => Kind::Attachment,
        _ => Kind::Other { raw: part },
    }
}

/// The `input` array with edits and inserts applied; untouched items keep their bytes. A
/// synthetic output goes right after its call.
pub(super) fn render_items(parsed: &ParsedRequest, out: &mut json::ArrayWriter) {
    let conversation = &parsed.conversation;
    // Each call's synthetic output, grouped by the item of the call once.
    let owed = conversation.inserts_by(parsed.messages.len(), |call| call);
    let mut renders = parsed.memo.renders(&parsed.unapplied);
    for (index, message) in parsed.messages.iter().enumerate() {
        let items = conversation.items_of(index);
        match items.iter().map(|i| &i.edit).find(|e| **e != Edit::Keep) {
            Some(Edit::Remove) => {}
            Some(Edit::Replace(text)) => {
                if let Some(rendered) =
                    renders.message(index, items, None, || Some(replace_output(parsed, index, message, text)))
                {
                    out.push(&rendered);
                }
            }
            _ => out.push(message.raw),
        }
        for insert in owed.get(index).into_iter().flatten() {
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
    renders.keep();
}

/// An item with its output text replaced: a client output's whole `output`, or the one string a
/// hosted tool's result may shorten.
fn replace_output(parsed: &ParsedRequest, index: usize, message: &Message, text: &str) -> String {
    if message.role == Role::Tool {
        let mut rendered = String::new();
        message.object.write(&mut rendered, &[], |key| (key == "output").then(|| json::json_string(text)));
        return rendered;
    }
    hosted_output(&message.object)
        .and_then(|field| json::replace_within(message.raw, field, &json::json_string(text)))
        .unwrap_or_else(|| {
            parsed.unapplied.push(index);
            message.raw.to_string()
        })
}
