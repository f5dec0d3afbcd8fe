//! Rendering the `contents` array: untouched contents as they came, changed ones with their
//! parts kept, shortened, removed or answered by a synthetic response.

use super::MADE_UP;
use crate::conversation::{Edit, InsertResult, Item, Kind, Role};
use crate::dialect::{Message, ParsedRequest};
use crate::json::{self, RawObject};

/// The `contents` array with every edit and insert applied; untouched contents keep their bytes.
pub(in crate::dialect) fn render_contents(parsed: &ParsedRequest, out: &mut json::ArrayWriter) {
    let conversation = &parsed.conversation;
    // Synthetic responses, by the model turn whose calls they answer.
    let owed = conversation.inserts_by(parsed.messages.len(), |model_turn| model_turn);
    let none: &[&InsertResult] = &[];
    let answers = |index: usize| matches!(parsed.messages.get(index).map(|m| m.role), Some(Role::User | Role::Tool));
    let mut renders = parsed.memo.renders(&parsed.unapplied);
    for (index, message) in parsed.messages.iter().enumerate() {
        let owed_here = if index > 0 && answers(index) { owed[index - 1].as_slice() } else { none };
        if !owed_here.is_empty() {
            if let Some(text) = render_content(parsed, index, message, owed_here) {
                out.push(&text);
            }
        } else if conversation.message_changed(index) {
            let items = conversation.items_of(index);
            if let Some(text) = renders.message(index, items, None, || render_content(parsed, index, message, none)) {
                out.push(&text);
            }
        } else {
            out.push(message.raw);
        }
        // No user turn follows this model turn: its responses get one of their own.
        if message.role == Role::Assistant && !answers(index + 1) && !owed[index].is_empty() {
            let parts: Vec<String> = owed[index].iter().map(|insert| synthetic_part(parsed, insert)).collect();
            out.push(&format!(r#"{{"role":"user","parts":[{}]}}"#, parts.join(",")));
        }
    }
    renders.keep();
}

/// A `functionResponse` part answering the call of `insert`: with the call's id when it had one.
fn synthetic_part(parsed: &ParsedRequest, insert: &InsertResult) -> String {
    let call = &parsed.conversation.items[insert.call_item];
    let name = match &call.kind {
        Kind::ToolCall { name, .. } => name.as_ref(),
        _ => "",
    };
    let mut out = String::from(r#"{"functionResponse":{"#);
    if !insert.call_id.starts_with(MADE_UP) {
        out.push_str(r#""id":"#);
        json::push_json_string(&mut out, &insert.call_id);
        out.push(',');
    }
    out.push_str(r#""name":"#);
    json::push_json_string(&mut out, name);
    out.push_str(r#","response":{"output":"#);
    json::push_json_string(&mut out, &insert.text);
    out.push_str("}}}");
    out
}

/// A `functionResponse` part with its `response` replaced by an object of the same shape holding
/// `text`: the response's one key when it had one string, else `output`. Every other field of
/// the part and of the response (`name`, `id`) keeps its bytes.
pub(super) fn replace_response(part: &str, text: &str) -> Option<String> {
    let object = RawObject::parse(part)?;
    let response = RawObject::parse(object.get("functionResponse")?)?;
    let body = response.get("response").and_then(RawObject::parse);
    let key = match body.as_ref().map(|b| b.fields.as_slice()) {
        Some([(key, value)]) if value.starts_with('"') => key.to_string(),
        _ => "output".to_string(),
    };
    let mut replaced = String::from("{");
    json::push_json_string(&mut replaced, &key);
    replaced.push(':');
    json::push_json_string(&mut replaced, text);
    replaced.push('}');
    let mut inner = String::new();
    response.write(&mut inner, &[], |k| (k == "response").then(|| replaced.clone()));
    let mut out = String::with_capacity(part.len());
    object.write(&mut out, &[], |k| (k == "functionResponse").then(|| inner.clone()));
    Some(out)
}

/// A changed content: kept parts raw, shortened responses re-rendered, removed ones left out,
/// synthetic responses after the content's own responses; `None` when no part is left.
fn render_content(parsed: &ParsedRequest, index: usize, message: &Message, owed: &[&InsertResult]) -> Option<String> {
    let items = parsed.conversation.items_of(index);
    let parts = message.blocks.as_deref().unwrap_or_default();
    let mut by_part: Vec<Option<&Item>> = vec![None; parts.len()];
    for item in items {
        if let Some(slot) = item.block.and_then(|b| by_part.get_mut(b))
            && slot.is_none()
        {
            *slot = Some(item);
        }
    }
    // (is a function response, rendered part)
    let mut rendered: Vec<(bool, String)> = Vec::with_capacity(parts.len() + owed.len());
    for (part, item) in parts.iter().zip(by_part) {
        let response = item.is_some_and(|i| matches!(i.kind, Kind::ToolResult { .. }) && i.repairable);
        match item.map(|i| &i.edit) {
            Some(Edit::Remove) => {}
            Some(Edit::Replace(text)) if response => {
                // A response that cannot be rewritten goes as it came, and is not counted as saved.
                let replaced = replace_response(part, text).unwrap_or_else(|| {
                    parsed.unapplied.push(index);
                    part.to_string()
                });
                rendered.push((true, replaced))
            }
            _ => rendered.push((response, part.to_string())),
        }
    }
    let at = rendered.iter().take_while(|(response, _)| *response).count();
    rendered.splice(at..at, owed.iter().map(|insert| (true, synthetic_part(parsed, insert))));
    if !owed.is_empty() && index > 0 {
        // The responses in the order of the calls they answer, as the model made them.
        let calls: Vec<&str> = parsed.conversation.items_of(index - 1).iter().filter_map(|i| i.call_id()).collect();
        let kept = items.iter().filter(|i| i.edit != Edit::Remove && matches!(i.kind, Kind::ToolResult { .. }));
        let ids: Vec<Option<&str>> =
            kept.map(|i| i.call_id()).chain(owed.iter().map(|insert| Some(insert.call_id.as_str()))).collect();
        let leading = at + owed.len();
        if ids.len() == leading {
            let position =
                |id: Option<&str>| id.and_then(|id| calls.iter().position(|c| *c == id)).unwrap_or(usize::MAX);
            let mut order: Vec<usize> = (0..leading).collect();
            order.sort_by_key(|&k| position(ids[k]));
            let mut taken: Vec<Option<(bool, String)>> = rendered.drain(..leading).map(Some).collect();
            let sorted: Vec<(bool, String)> = order.iter().filter_map(|&k| taken[k].take()).collect();
            rendered.splice(0..0, sorted);
        }
    }
    if rendered.is_empty() {
        return None;
    }
    let parts: Vec<String> = rendered.into_iter().map(|(_, part)| part).collect();
    let parts = format!("[{}]", parts.join(","));
    let mut out = String::with_capacity(parts.len() + 32);
    message.object.write(&mut out, &[], |key| (key == "parts").then(|| parts.clone()));
    Some(out)
}
