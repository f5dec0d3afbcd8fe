//! Google's Gemini API (`generateContent`): `contents` of roles `user` and `model` (and the older
//! `function`), each a list of `parts`; `systemInstruction` as the system prompt; the model is in
//! the path, not the body.
//!
//! Client tool pairs are a model turn's `functionCall` parts answered by `functionResponse` parts
//! in the next user turn, paired as the Gemini API pairs them: by `id` when the call and the
//! response both have one, else by name and order (the k-th remaining response of a name answers
//! the k-th remaining call of that name), so a call without an id answered by a response carrying
//! one of its own (older Gemini CLI releases) is a pair, and so is the reverse. A call without an
//! id goes under an id made of the model turn's ordinal among model turns, which neither repair
//! nor a later turn shifts; its response takes the same id. Pruning and truncation replace a
//! response's `response` object with one of the same shape (`{"output": "<placeholder>"}`, or
//! the one key the response had), keeping `name` and `id`; a response carrying `parts` (inline
//! data) is never shortened. `thoughtSignature` is never read or written: the part that carries it
//! (a call, a thought, a text) keeps its bytes and its place in its turn, which compactor never
//! splits. `executableCode` / `codeExecutionResult` are the provider's (run inside its turn):
//! never repaired or shortened. `inlineData` / `fileData` are counted, never touched.

use std::borrow::Cow;
use std::collections::HashMap;

use super::{Message, ParsedRequest};
use crate::conversation::{Conversation, Edit, InsertResult, Item, Kind, Role};
use crate::json::{self, RawObject};

/// The first character of an id compactor made up for a call the model gave none: never one a
/// provider writes, so it never meets a real id.
const MADE_UP: char = '\u{1}';

/// Reads `systemInstruction` (or its snake_case spelling) into `parsed`.
pub(super) fn parse_top<'a>(parsed: &mut ParsedRequest<'a>) -> Option<()> {
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
pub(super) fn max_output_tokens(parsed: &ParsedRequest) -> Option<u64> {
    ["generationConfig", "generation_config"].into_iter().find_map(|key| {
        let config = RawObject::parse(parsed.top.get(key)?)?;
        ["maxOutputTokens", "max_output_tokens"].into_iter().find_map(|field| config.get(field)?.parse::<u64>().ok())
    })
}

/// Reads content `index` (`raw`, already read as `object`) into `parsed`.
pub(super) fn parse_message<'a>(
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
    super::admit_items(parsed.bound, parsed.messages.len(), parsed.conversation.items.len(), parts.len())?;
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

/// What names the calls of one content that carry no id, and what its responses need to be paired.
struct Naming<'a> {
    /// How many model contents come before this one: a model content's calls are named by it.
    /// Not the content's index: repair drops contents that only answer no call, which would name
    /// the same call otherwise in the rewritten body (and a remembered pruned id another call).
    turn: usize,
    /// Calls of each name without id seen so far in this content.
    by_name: Vec<(String, usize)>,
    /// Code runs and their results seen so far in this content.
    code_runs: (usize, usize),
    /// The function responses of this content, in order, paired once all are read.
    responses: Vec<Response<'a>>,
}

/// A function response waiting for its call.
struct Response<'a> {
    /// Its part's index in the content (each part is one item).
    block: usize,
    name: Cow<'a, str>,
}

impl Naming<'_> {
    /// The ordinal of the next call of `name` in this content, counted.
    fn ordinal(&mut self, name: &str) -> usize {
        match self.by_name.iter_mut().find(|(n, _)| n == name) {
            Some((_, count)) => {
                *count += 1;
                *count - 1
            }
            None => {
                self.by_name.push((name.to_string(), 1));
                0
            }
        }
    }
}

/// The id standing for a call the model gave no id: its model turn, name and ordinal.
fn made_up_id(model_turn: usize, name: &str, ordinal: usize) -> String {
    format!("{MADE_UP}{model_turn}:{ordinal}:{name}")
}

/// The id of a response without one that answers no call: its place, which no call's id is.
fn unanswered_id(message: usize, block: usize) -> String {
    format!("{MADE_UP}answers-none:{message}:{block}")
}

/// Calls of one name in a model turn, in order, and how far the pairing has taken them.
#[derive(Default)]
struct Queue {
    calls: Vec<usize>,
    next: usize,
}

impl Queue {
    /// The first call still unanswered, taken.
    fn take(&mut self, taken: &mut [bool]) -> Option<usize> {
        while let Some(&call) = self.calls.get(self.next) {
            self.next += 1;
            if !taken[call] {
                taken[call] = true;
                return Some(call);
            }
        }
        None
    }
}

/// Names the call each function response of content `message` answers, as the Gemini API pairs
/// them: a response whose id a call of the `calling` model turn has answers that call; every
/// other one, in order, answers the first unanswered call of its name there (a response with an
/// id of its own only a call without one, as two ids that differ never pair). A response left
/// over keeps its own id, which repair moves to its call elsewhere or removes, or without one an
/// id no call has. Each lookup goes through a map built once: linear in the turn's size.
fn pair_responses(
    conversation: &mut Conversation,
    calling: Option<usize>,
    message: usize,
    first_item: usize,
    responses: &[Response],
) {
    let calls_range = calling.map_or(0..0, |calling| conversation.item_range(calling));
    let (before, here) = conversation.items.split_at_mut(first_item);
    // (name, id, whether the model gave the id) of each call the client answers.
    let calls: Vec<(&str, &Cow<str>, bool)> = before
        .get(calls_range)
        .unwrap_or_default()
        .iter()
        .filter(|item| item.repairable)
        .filter_map(|item| match &item.kind {
            Kind::ToolCall { id: Some(id), name, .. } => Some((name.as_ref(), id, !id.starts_with(MADE_UP))),
            _ => None,
        })
        .collect();
    let mut by_id: HashMap<&str, Queue> = HashMap::new();
    let mut by_name: HashMap<&str, Queue> = HashMap::new();
    let mut without_id_by_name: HashMap<&str, Queue> = HashMap::new();
    for (c, (name, id, own)) in calls.iter().enumerate() {
        by_name.entry(name).or_default().calls.push(c);
        match own {
            true => by_id.entry(id.as_ref()).or_default().calls.push(c),
            false => without_id_by_name.entry(name).or_default().calls.push(c),
        }
    }
    let mut taken = vec![false; calls.len()];
    let mut answers: Vec<Option<usize>> = vec![None; responses.len()];
    {
        // The id the response itself carries (none was made up for it yet).
        let read: &[Item] = here;
        let own_id = |response: &Response| read.get(response.block).and_then(Item::call_id);
        for (r, response) in responses.iter().enumerate() {
            if let Some(id) = own_id(response) {
                answers[r] = by_id.get_mut(id).and_then(|queue| queue.take(&mut taken));
            }
        }
        for (r, response) in responses.iter().enumerate() {
            if answers[r].is_some() {
                continue;
            }
            let queues = if own_id(response).is_some() { &mut without_id_by_name } else { &mut by_name };
            answers[r] = queues.get_mut(response.name.as_ref()).and_then(|queue| queue.take(&mut taken));
        }
    }
    for (response, answer) in responses.iter().zip(answers) {
        let Some(Kind::ToolResult { call_id, .. }) = here.get_mut(response.block).map(|item| &mut item.kind) else {
            continue;
        };
        match answer.and_then(|c| calls.get(c)) {
            Some((_, id, _)) => *call_id = Some(Cow::clone(id)),
            None if call_id.is_none() => *call_id = Some(Cow::Owned(unanswered_id(message, response.block))),
            None => {}
        }
    }
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

/// The `contents` array with every edit and insert applied; untouched contents keep their bytes.
pub(super) fn render_contents(parsed: &ParsedRequest, out: &mut json::ArrayWriter) {
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
fn replace_response(part: &str, text: &str) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{Dialect, ParsedRequest};

    #[test]
    fn a_shortened_response_keeps_its_shape_name_and_id() {
        let part = r#"{"functionResponse":{"id":"c1","name":"read_file","response":{"output":"long text"}},"x":1}"#;
        let replaced = replace_response(part, "[cleared]").unwrap();
        assert_eq!(
            replaced,
            r#"{"functionResponse":{"id":"c1","name":"read_file","response":{"output":"[cleared]"}},"x":1}"#
        );
        let error = r#"{"functionResponse":{"name":"run","response":{"error":"boom"}}}"#;
        assert_eq!(
            replace_response(error, "cut").unwrap(),
            r#"{"functionResponse":{"name":"run","response":{"error":"cut"}}}"#
        );
        let structured = r#"{"functionResponse":{"name":"run","response":{"a":1,"b":"x"}}}"#;
        assert_eq!(
            replace_response(structured, "cut").unwrap(),
            r#"{"functionResponse":{"name":"run","response":{"output":"cut"}}}"#
        );
    }

    #[test]
    fn calls_without_ids_pair_with_responses_by_name_and_order() {
        let body = r#"{"contents":[
            {"role":"user","parts":[{"text":"go"}]},
            {"role":"model","parts":[{"functionCall":{"name":"a","args":{}},"thoughtSignature":"s1"},{"functionCall":{"name":"b","args":{}}},{"functionCall":{"name":"a","args":{}}}]},
            {"role":"user","parts":[{"functionResponse":{"name":"b","response":{"output":"B"}}},{"functionResponse":{"name":"a","response":{"output":"A0"}}},{"functionResponse":{"name":"a","response":{"output":"A1"}}}]}
        ]}"#;
        let parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        let pairs: Vec<(String, String)> = parsed
            .conversation
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::ToolResult { call_id: Some(id), text, .. } => Some((id.to_string(), text.to_string())),
                _ => None,
            })
            .collect();
        let call_ids: Vec<String> = parsed
            .conversation
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::ToolCall { id: Some(id), .. } => Some(id.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(pairs[0], (call_ids[1].clone(), "B".to_string()));
        assert_eq!(pairs[1], (call_ids[0].clone(), "A0".to_string()));
        assert_eq!(pairs[2], (call_ids[2].clone(), "A1".to_string()));
    }

    /// The made-up ids of a Gemini body's calls and responses, in order.
    fn made_up_ids(body: &str) -> (Vec<String>, Vec<String>) {
        let parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        let mut calls = Vec::new();
        let mut responses = Vec::new();
        for item in &parsed.conversation.items {
            match &item.kind {
                Kind::ToolCall { id: Some(id), .. } => calls.push(id.to_string()),
                Kind::ToolResult { call_id: Some(id), .. } => responses.push(id.to_string()),
                _ => {}
            }
        }
        (calls, responses)
    }

    #[test]
    fn a_call_without_id_keeps_its_name_when_repair_drops_an_earlier_content() {
        let turn = |n: usize| {
            format!(
                r#"{{"role":"model","parts":[{{"functionCall":{{"name":"run","args":{{"n":{n}}}}}}}]}},
                {{"role":"user","parts":[{{"functionResponse":{{"name":"run","response":{{"output":"out {n}"}}}}}}]}}"#
            )
        };
        // A content answering no call: repair drops it, and the rewritten body goes without it.
        let orphan =
            r#"{"role":"user","parts":[{"functionResponse":{"id":"ghost","name":"run","response":{"output":"x"}}}]}"#;
        let sent = format!(r#"{{"contents":[{},{orphan},{}]}}"#, turn(1), turn(2));
        let repaired = format!(r#"{{"contents":[{},{}]}}"#, turn(1), turn(2));
        let (calls, responses) = made_up_ids(&sent);
        let (calls_after, responses_after) = made_up_ids(&repaired);
        // A pruned id remembered from the first pass names the same call in the rewritten body.
        assert_eq!(calls, calls_after);
        // The orphan's response (the second) pairs by name with the first call, which the first
        // response answers already: repair drops it as a second answer.
        assert_eq!(responses[1], calls[0]);
        assert_eq!(
            responses.iter().enumerate().filter(|(k, _)| *k != 1).map(|(_, id)| id).collect::<Vec<_>>(),
            responses_after.iter().collect::<Vec<_>>()
        );
        assert_eq!(calls, responses_after, "each response names the call it answers");
        // Two identical calls in two model turns keep two names.
        assert_ne!(calls[0], calls[1]);
    }

    /// Each response's text with the name of the call it answers (by that call's `args.path`).
    fn answered(parsed: &ParsedRequest) -> Vec<(String, String)> {
        let calls: Vec<(String, String)> = parsed
            .conversation
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::ToolCall { id: Some(id), arguments, .. } => Some((id.to_string(), arguments.to_string())),
                _ => None,
            })
            .collect();
        parsed
            .conversation
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::ToolResult { call_id: Some(id), text, .. } => {
                    let call = calls.iter().find(|(c, _)| c == id).map_or("no call".to_string(), |(_, a)| a.clone());
                    Some((text.to_string(), call))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_response_with_an_id_of_its_own_answers_its_call_without_one_and_repair_keeps_its_output() {
        // Older Gemini CLI releases: the model gave no id, the CLI answered with one it made up.
        let body = r#"{"contents":[
            {"role":"user","parts":[{"text":"read it"}]},
            {"role":"model","parts":[{"functionCall":{"name":"read_file","args":{"path":"a"}},"thoughtSignature":"s1"}]},
            {"role":"user","parts":[{"functionResponse":{"id":"cli-1","name":"read_file","response":{"output":"PLANTED tool output"}}}]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        crate::rewrite::repair::apply(&mut parsed.conversation);
        assert_eq!(parsed.conversation.inserts, [], "no call is answered \"aborted\"");
        assert!(parsed.render().is_none(), "the body goes as it came");
        assert_eq!(answered(&parsed), [("PLANTED tool output".to_string(), r#"{"path":"a"}"#.to_string())]);
    }

    #[test]
    fn a_response_without_id_answers_its_call_with_one() {
        let body = r#"{"contents":[
            {"role":"model","parts":[{"functionCall":{"id":"m1","name":"run","args":{"path":"a"}}}]},
            {"role":"user","parts":[{"functionResponse":{"name":"run","response":{"output":"PLANTED run output"}}}]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        crate::rewrite::repair::apply(&mut parsed.conversation);
        assert_eq!(parsed.conversation.inserts, [], "no call is answered \"aborted\"");
        assert!(parsed.render().is_none(), "the body goes as it came");
        assert_eq!(answered(&parsed), [("PLANTED run output".to_string(), r#"{"path":"a"}"#.to_string())]);
    }

    #[test]
    fn ids_pair_first_then_name_and_order_pairs_the_rest() {
        // r1 names m1's id: it answers m1 wherever it stands. The responses without an id, or
        // with one no call has, answer the remaining calls of their name in order; a response
        // with an id never answers a call with another id.
        let body = r#"{"contents":[
            {"role":"model","parts":[
                {"functionCall":{"id":"m1","name":"run","args":{"path":"1"}}},
                {"functionCall":{"id":"m2","name":"run","args":{"path":"2"}}},
                {"functionCall":{"name":"run","args":{"path":"3"}}},
                {"functionCall":{"name":"read","args":{"path":"4"}}}
            ]},
            {"role":"user","parts":[
                {"functionResponse":{"name":"run","response":{"output":"r0"}}},
                {"functionResponse":{"id":"cli-x","name":"run","response":{"output":"r3"}}},
                {"functionResponse":{"id":"m1","name":"run","response":{"output":"r1"}}},
                {"functionResponse":{"id":"cli-y","name":"read","response":{"output":"r4"}}}
            ]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        let pairs: Vec<(String, String)> = [("r0", "2"), ("r3", "3"), ("r1", "1"), ("r4", "4")]
            .iter()
            .map(|(text, path)| (text.to_string(), format!(r#"{{"path":"{path}"}}"#)))
            .collect();
        assert_eq!(answered(&parsed), pairs);
        assert_eq!(crate::rewrite::repair::apply(&mut parsed.conversation), 0, "nothing to repair");
    }

    #[test]
    fn a_response_no_call_of_the_turn_takes_is_still_an_orphan() {
        // More responses of a name than calls, and one whose id another call holds: repair moves
        // the last to its call, removes the extra one, and no output goes "aborted".
        let body = r#"{"contents":[
            {"role":"model","parts":[{"functionCall":{"id":"early","name":"run","args":{}}}]},
            {"role":"user","parts":[{"text":"no answer here"}]},
            {"role":"model","parts":[{"functionCall":{"name":"run","args":{}}}]},
            {"role":"user","parts":[
                {"functionResponse":{"name":"run","response":{"output":"late"}}},
                {"functionResponse":{"name":"run","response":{"output":"extra"}}},
                {"functionResponse":{"id":"early","name":"run","response":{"output":"moved"}}}
            ]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        crate::rewrite::repair::apply(&mut parsed.conversation);
        let inserted: Vec<&str> = parsed.conversation.inserts.iter().map(|i| i.text.as_str()).collect();
        assert_eq!(inserted, ["moved"]);
        let rendered = String::from_utf8(parsed.render().unwrap()).unwrap();
        assert!(rendered.contains("late") && !rendered.contains("extra"), "{rendered}");
    }

    #[test]
    fn responses_with_inline_data_and_provider_code_are_never_shortenable() {
        let body = r#"{"contents":[
            {"role":"model","parts":[{"functionCall":{"id":"c","name":"shot","args":{}}},{"executableCode":{"language":"PYTHON","code":"1"}},{"codeExecutionResult":{"outcome":"OUTCOME_OK","output":"1"}}]},
            {"role":"user","parts":[{"functionResponse":{"id":"c","name":"shot","response":{"output":"png"},"parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]}},{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]}
        ]}"#;
        let parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        let kinds: Vec<(bool, bool)> =
            parsed.conversation.items.iter().map(|i| (i.repairable, i.shortenable)).collect();
        // call, code (provider's), result (provider's), response with parts, attachment.
        assert_eq!(kinds[1], (false, true));
        assert_eq!(kinds[2], (false, false));
        assert_eq!(kinds[3], (true, false));
        assert!(matches!(parsed.conversation.items[4].kind, Kind::Attachment));
    }

    #[test]
    fn the_nested_max_output_tokens_is_the_output_cap() {
        let cap = |body: &str| ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap().max_tokens();
        let contents = r#""contents":[{"role":"user","parts":[{"text":"hi"}]}]"#;
        let nested = format!(r#"{{{contents},"generationConfig":{{"temperature":1,"maxOutputTokens":2048}}}}"#);
        assert_eq!(cap(&nested), Some(2048));
        let snake = format!(r#"{{{contents},"generation_config":{{"max_output_tokens":512}}}}"#);
        assert_eq!(cap(&snake), Some(512));
        assert_eq!(cap(&format!(r#"{{{contents},"generationConfig":{{"topK":64}}}}"#)), None);
        // A top-level field is not Gemini's: no cap, and nothing the lower-max_tokens rung rewrites.
        let top = format!(r#"{{{contents},"max_tokens":99}}"#);
        assert_eq!(cap(&top), None);
        let parsed = ParsedRequest::parse(Dialect::Gemini, nested.as_bytes()).unwrap();
        assert_eq!(parsed.max_tokens_field(), None);
    }
}
