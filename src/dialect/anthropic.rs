//! Anthropic Messages: `system` as a string or blocks; messages whose content is a string or
//! blocks, with cache_control markers kept wherever they are.
//!
//! Client tools are `tool_use` blocks answered by `tool_result` blocks in the next user message:
//! the pairs repair looks after. Tools the API runs itself (`server_tool_use` and `mcp_tool_use`)
//! are answered inside the assistant's own turn by a `*_tool_result` block (web search, web fetch,
//! code execution, tool search, MCP, and any result type the API adds in the same shape): never
//! paired, moved or answered by compactor. Of those results only plain text fields (a fetched
//! text page, code execution stdout, a viewed text file, MCP text) may be shortened; everything
//! else, encrypted content and signatures above all, keeps its bytes. A block type compactor does
//! not know is kept as it came.

use std::borrow::Cow;

use super::{Message, ParsedRequest, breakpoints, only_text_and_media, string_kind, text_of_parts};
use crate::conversation::{Edit, InsertResult, Item, Kind, Role};
use crate::json::{self, RawObject};

/// Parts a client `tool_result` may hold and still be replaced by one text: compactor drops
/// images and documents knowingly; anything else (tool references that load deferred tools,
/// search results that citations point at, parts it does not know) keeps the result whole.
const MEDIA_PARTS: &[&str] = &["image", "document"];

/// Reads the top-level `system` into `parsed`.
pub(super) fn parse_top<'a>(parsed: &mut ParsedRequest<'a>) -> Option<()> {
    if let Some(system) = parsed.top.get("system") {
        if system.starts_with('[') {
            let (text, _) = text_of_parts(&json::as_array(system)?);
            parsed.push_top_system(text);
        } else if system != "null" {
            parsed.push_top_system(json::as_str(system)?);
        }
    }
    Some(())
}

/// Reads message `index` (`raw`, already read as `object`) into `parsed`.
pub(super) fn parse_message<'a>(
    parsed: &mut ParsedRequest<'a>,
    index: usize,
    raw: &'a str,
    object: RawObject<'a>,
) -> Option<()> {
    let role = match object.str("role")?.as_ref() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        // Claude Code can put a system entry inside messages: keep it as it is.
        "system" => Role::System,
        _ => return None,
    };
    let content = object.get("content")?;
    let blocks = if content.starts_with('[') { Some(json::as_array(content)?) } else { None };
    let items = &mut parsed.conversation.items;
    match &blocks {
        None => {
            let kind = string_kind(role, json::as_str(content)?, &mut parsed.system);
            items.push(Item::new(index, None, kind));
        }
        Some(blocks) => {
            super::admit_items(parsed.bound, parsed.messages.len(), items.len(), blocks.len())?;
            for (b, block) in blocks.iter().enumerate() {
                items.push(block_item(index, b, role, block)?);
            }
        }
    }
    parsed.messages.push(Message { raw, object, role, blocks });
    Some(())
}

/// The neutral item of one content block; `None` when a block compactor knows lacks a field its
/// type requires (the request is then forwarded untouched).
fn block_item<'a>(message: usize, b: usize, role: Role, block: &'a str) -> Option<Item<'a>> {
    let object = RawObject::parse(block)?;
    let item = |kind| Item::new(message, Some(b), kind);
    let type_name = object.str("type");
    let item = match type_name.as_deref() {
        Some("text") if role == Role::System => item(Kind::System { text: object.str("text")? }),
        Some("text") => item(Kind::Text { role, text: object.str("text")? }),
        Some("image") | Some("document") | Some("search_result") | Some("container_upload") => item(Kind::Attachment),
        Some("tool_use") => item(call_kind(&object)?),
        // Run by the API inside the assistant's turn, answered there by a `*_tool_result`.
        Some("server_tool_use") | Some("mcp_tool_use") => item(call_kind(&object)?).provider_run(),
        Some("tool_result") => {
            let call_id = Some(object.str("tool_use_id")?);
            let (text, attachments, shortenable) = match object.get("content") {
                None => (Cow::Borrowed(""), 0, true),
                Some(c) if c.starts_with('[') => {
                    let parts = json::as_array(c)?;
                    let (text, attachments) = text_of_parts(&parts);
                    (text, attachments, only_text_and_media(&parts, MEDIA_PARTS))
                }
                Some(c) => (json::as_str(c)?, 0, true),
            };
            item(Kind::ToolResult { call_id, text, attachments }).shortenable(shortenable)
        }
        Some("thinking") => item(Kind::Thinking { text: object.str("thinking").unwrap_or_default() }),
        Some("redacted_thinking") => item(Kind::Thinking { text: Default::default() }),
        // The API's own summary of earlier turns: text the summarizer must read, kept byte for
        // byte (its encrypted content is verified).
        Some("compaction") => item(Kind::Text { role, text: object.str("content").unwrap_or_default() }),
        Some(kind) if is_provider_result(kind) && object.str("tool_use_id").is_some() => {
            provider_result(message, b, kind, &object, block)?
        }
        _ => item(Kind::Other { raw: block }),
    };
    Some(item)
}

fn call_kind<'a>(object: &RawObject<'a>) -> Option<Kind<'a>> {
    Some(Kind::ToolCall {
        id: Some(object.str("id")?),
        name: object.str("name").unwrap_or_default(),
        arguments: object.get("input").map(|i| i.into()).unwrap_or_default(),
    })
}

/// A result block the API writes for its own tools: `web_search_tool_result`,
/// `code_execution_tool_result`, `mcp_tool_result`... and whatever it adds in the same shape.
fn is_provider_result(type_name: &str) -> bool {
    type_name.ends_with("_tool_result") && type_name != "tool_result"
}

/// Where the text of a result block that a policy may replace lives.
enum ResultText<'a> {
    /// The block's whole `content` (a string or text blocks), replaced by a string: a client
    /// `tool_result`, an `mcp_tool_result`.
    Content,
    /// One string inside the block, replaced in place: a fetched text page, code execution
    /// stdout, a viewed text file.
    Nested(&'a str),
}

/// The replaceable text of a provider's result block, `None` when nothing in it may be shortened
/// without breaking the block (encrypted results, PDFs, tool references, errors).
fn provider_text<'a>(type_name: &str, object: &RawObject<'a>) -> Option<ResultText<'a>> {
    if type_name == "mcp_tool_result" {
        let content = object.get("content")?;
        let parts = if content.starts_with('[') { json::as_array(content)? } else { Vec::new() };
        return only_text_and_media(&parts, &[]).then_some(ResultText::Content);
    }
    let content = RawObject::parse(object.get("content")?)?;
    let string = |object: &RawObject<'a>, key: &str| object.get(key).filter(|v| v.starts_with('"'));
    let field = match (type_name, content.str("type").as_deref()) {
        ("web_fetch_tool_result", Some("web_fetch_result")) => {
            let document = RawObject::parse(content.get("content")?)?;
            let source = RawObject::parse(document.get("source")?)?;
            // A page that citations may point into keeps every character.
            let cited = document.get("citations").and_then(RawObject::parse).and_then(|c| c.get("enabled"));
            if source.str("type").as_deref() != Some("text") || cited.is_some_and(|e| e == "true") {
                return None;
            }
            string(&source, "data")?
        }
        ("code_execution_tool_result", Some("code_execution_result"))
        | ("bash_code_execution_tool_result", Some("bash_code_execution_result")) => string(&content, "stdout")?,
        ("text_editor_code_execution_tool_result", Some("text_editor_code_execution_view_result"))
            if content.str("file_type").as_deref() == Some("text") =>
        {
            string(&content, "content")?
        }
        _ => return None,
    };
    Some(ResultText::Nested(field))
}

/// The item of a provider's result block: its replaceable text when it has one, else what a
/// reader (the summarizer, the token count) can make of it.
fn provider_result<'a>(
    message: usize,
    b: usize,
    type_name: &str,
    object: &RawObject<'a>,
    block: &'a str,
) -> Option<Item<'a>> {
    let call_id = Some(object.str("tool_use_id")?);
    let content = object.get("content");
    let (text, attachments, shortenable) = match provider_text(type_name, object) {
        Some(ResultText::Content) => match content {
            Some(c) if c.starts_with('[') => (text_of_parts(&json::as_array(c)?).0, 0, true),
            Some(c) => (json::as_str(c)?, 0, true),
            None => (Cow::Borrowed(""), 0, true),
        },
        Some(ResultText::Nested(field)) => (json::as_str(field)?, 0, true),
        None => {
            let (text, attachments) = readable(type_name, content, block);
            (text, attachments, false)
        }
    };
    let kind = Kind::ToolResult { call_id, text, attachments };
    Some(Item::new(message, Some(b), kind).provider_run().shortenable(shortenable))
}

/// What a reader can make of a result block nothing may shorten: search results as title and URL
/// (their encrypted pages counted like attachments), a fetched PDF as its URL and one attachment,
/// the names of the tools a tool search found; anything else as its JSON.
fn readable<'a>(type_name: &str, content: Option<&'a str>, block: &'a str) -> (Cow<'a, str>, u32) {
    let whole = (Cow::Borrowed(block), 0);
    let Some(content) = content else { return whole };
    let entries = |raw: &'a str| json::as_array(raw).unwrap_or_default();
    match type_name {
        "web_search_tool_result" if content.starts_with('[') => {
            let results = entries(content);
            let lines: Vec<String> = results
                .iter()
                .filter_map(|r| RawObject::parse(r))
                .map(|r| format!("{} <{}>", r.str("title").unwrap_or_default(), r.str("url").unwrap_or_default()))
                .collect();
            (Cow::Owned(lines.join("\n")), results.len() as u32)
        }
        "web_fetch_tool_result" => match RawObject::parse(content) {
            Some(result) if result.str("type").as_deref() == Some("web_fetch_result") => {
                (result.str("url").unwrap_or_default(), 1)
            }
            _ => whole,
        },
        "tool_search_tool_result" => {
            let names: Option<Vec<String>> =
                RawObject::parse(content).and_then(|c| c.get("tool_references")).map(|refs| {
                    entries(refs)
                        .iter()
                        .filter_map(|r| RawObject::parse(r)?.str("tool_name"))
                        .map(String::from)
                        .collect()
                });
            match names {
                Some(names) => (Cow::Owned(format!("tools found: {}", names.join(", "))), 0),
                None => whole,
            }
        }
        _ => whole,
    }
}

/// The `messages` array with every edit and insert applied; untouched messages keep their bytes.
pub(super) fn render_messages(parsed: &ParsedRequest, out: &mut json::ArrayWriter) {
    let conversation = &parsed.conversation;
    let owed_by = inserts_by_assistant(parsed);
    let none: &[&InsertResult] = &[];
    let owed_after = |assistant: usize| owed_by.get(assistant).map_or(none, Vec::as_slice);
    let mut renders = parsed.memo.renders(&parsed.unapplied);
    for (index, message) in parsed.messages.iter().enumerate() {
        // Results owed by the previous assistant turn go into this user message, first.
        let owed = if index > 0 && message.role == Role::User { owed_after(index - 1) } else { none };
        let marker = parsed.marker.as_ref().filter(|m| m.message == index);
        if !owed.is_empty() {
            if let Some(text) = render_message(parsed, index, message, owed) {
                out.push(&text);
            }
        } else if conversation.message_changed(index) || marker.is_some() {
            let items = conversation.items_of(index);
            if let Some(text) = renders.message(index, items, marker, || render_message(parsed, index, message, none)) {
                out.push(&text);
            }
        } else {
            out.push(message.raw);
        }
        // No user message follows this assistant turn: the results get one of their own.
        if message.role == Role::Assistant && parsed.messages.get(index + 1).is_none_or(|m| m.role != Role::User) {
            let owed = owed_after(index);
            if !owed.is_empty() {
                let blocks: Vec<String> = owed.iter().map(|i| synthetic_block(i)).collect();
                out.push(&format!(r#"{{"role":"user","content":[{}]}}"#, blocks.join(",")));
            }
        }
    }
    renders.keep();
}

/// The synthetic results each assistant turn owes, grouped once.
fn inserts_by_assistant<'p>(parsed: &'p ParsedRequest) -> Vec<Vec<&'p InsertResult>> {
    parsed.conversation.inserts_by(parsed.messages.len(), |assistant| assistant)
}

fn synthetic_block(insert: &InsertResult) -> String {
    format!(
        r#"{{"type":"tool_result","tool_use_id":{},"content":{},"is_error":true}}"#,
        json::json_string(&insert.call_id),
        json::json_string(&insert.text)
    )
}

/// A result block with its text replaced by `text`; `None` when the block has no replaceable
/// text (the policies never ask for that).
fn replace_result_text(block: &str, text: &str) -> Option<String> {
    let object = RawObject::parse(block)?;
    let type_name = object.str("type")?;
    let target = if type_name == "tool_result" { ResultText::Content } else { provider_text(&type_name, &object)? };
    match target {
        ResultText::Nested(field) => json::replace_within(block, field, &json::json_string(text)),
        ResultText::Content => {
            let mut rendered = String::new();
            object.write(&mut rendered, &[], |key| (key == "content").then(|| json::json_string(text)));
            if object.get("content").is_none() {
                rendered.pop();
                rendered.push_str(&format!(r#","content":{}}}"#, json::json_string(text)));
            }
            // A client's cache breakpoint inside the replaced content moves up to the block, so
            // the prefix it marks is still cached.
            if object.get("cache_control").is_none()
                && let Some(marker) = object.get("content").and_then(nested_cache_control)
            {
                rendered.pop();
                rendered.push_str(&format!(r#","cache_control":{marker}}}"#));
            }
            Some(rendered)
        }
    }
}

/// The first `cache_control` marker inside a block's content, as JSON.
fn nested_cache_control(content: &str) -> Option<String> {
    if !content.contains("\"cache_control\"") {
        return None;
    }
    fn find(value: &serde_json::Value) -> Option<&serde_json::Value> {
        match value {
            serde_json::Value::Object(map) => map.get("cache_control").or_else(|| map.values().find_map(find)),
            serde_json::Value::Array(items) => items.iter().find_map(find),
            _ => None,
        }
    }
    let value: serde_json::Value = serde_json::from_str(content).ok()?;
    find(&value).map(|marker| marker.to_string())
}

/// A changed message with its kept blocks raw, edited results re-rendered, synthetic results
/// placed after the existing ones; `None` when nothing is left of it.
fn render_message(parsed: &ParsedRequest, index: usize, message: &Message, owed: &[&InsertResult]) -> Option<String> {
    let items = parsed.conversation.items_of(index);
    // (is a client tool_result, rendered block)
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
                        let block = format!(r#"{{"type":"text","text":{}}}"#, content);
                        let block = match parsed.marker.as_ref().filter(|m| m.message == index) {
                            Some(marker) => breakpoints::with_marker(block, marker),
                            None => block,
                        };
                        blocks.push((false, block));
                    }
                }
            }
        }
        Some(raw_blocks) => {
            // The item of each block, found once: one item per block, in block order.
            let mut by_block: Vec<Option<&Item>> = vec![None; raw_blocks.len()];
            for item in items {
                if let Some(slot) = item.block.and_then(|b| by_block.get_mut(b))
                    && slot.is_none()
                {
                    *slot = Some(item);
                }
            }
            for (b, (block, item)) in raw_blocks.iter().zip(by_block).enumerate() {
                let client_result = item.is_some_and(|i| i.repairable && matches!(i.kind, Kind::ToolResult { .. }));
                match item.map(|i| (&i.edit, &i.kind)) {
                    Some((Edit::Remove, _)) => {}
                    Some((Edit::Replace(text), Kind::ToolResult { .. })) => {
                        let rendered = replace_result_text(block, text).unwrap_or_else(|| {
                            parsed.unapplied.push(index);
                            block.to_string()
                        });
                        blocks.push((client_result, rendered));
                    }
                    Some((Edit::Replace(text), _)) => {
                        blocks.push((false, format!(r#"{{"type":"text","text":{}}}"#, json::json_string(text))))
                    }
                    _ => blocks.push((client_result, block.to_string())),
                }
                if let Some(marker) = parsed.marker.as_ref().filter(|m| m.message == index && m.block == Some(b))
                    && let Some((_, last)) = blocks.last_mut()
                {
                    *last = breakpoints::with_marker(std::mem::take(last), marker);
                }
            }
        }
    }
    if !owed.is_empty() {
        // tool_result blocks must come before any other content of the user message.
        let at = blocks.iter().take_while(|(is_result, _)| *is_result).count();
        blocks.splice(at..at, owed.iter().map(|insert| (true, synthetic_block(insert))));
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
