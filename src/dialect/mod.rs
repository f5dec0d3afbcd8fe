//! API dialects at the edge: parse a request body into the neutral [`Conversation`] and render the
//! policies' decisions back into the same dialect, re-serializing only what changed.

pub mod anthropic;
pub mod breakpoints;
pub mod chat;
pub mod gemini;
pub mod prefix;
pub mod responses;

use std::borrow::Cow;

use crate::conversation::{Conversation, Kind, Pairing, Role};
use crate::json::{self, RawObject};
use crate::route::Endpoint;
use crate::work;

/// The request formats compactor can rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    ChatCompletions,
    AnthropicMessages,
    Responses,
    /// Google's Gemini API: `contents` of `parts`, the model in the path.
    Gemini,
}

impl Dialect {
    pub fn of(endpoint: Endpoint) -> Option<Self> {
        match endpoint {
            Endpoint::ChatCompletions => Some(Self::ChatCompletions),
            Endpoint::Messages => Some(Self::AnthropicMessages),
            Endpoint::Responses => Some(Self::Responses),
            Endpoint::GenerateContent | Endpoint::StreamGenerateContent => Some(Self::Gemini),
            _ => None,
        }
    }

    /// The dialect of a token-count request's body (`/v1/messages/count_tokens`,
    /// `/v1/responses/input_tokens`): counted as the session's next request would be sent.
    pub fn counted(endpoint: Endpoint) -> Option<Self> {
        match endpoint {
            Endpoint::CountTokens => Some(Self::AnthropicMessages),
            Endpoint::InputTokens => Some(Self::Responses),
            Endpoint::GeminiCountTokens => Some(Self::Gemini),
            _ => None,
        }
    }

    /// The top-level field that holds the conversation.
    pub fn history_field(self) -> &'static str {
        match self {
            Self::Responses => "input",
            Self::Gemini => "contents",
            _ => "messages",
        }
    }

    /// Where tool results must stand: right after their call's turn, or anywhere after it.
    pub fn pairing(self) -> Pairing {
        match self {
            Self::Responses => Pairing::AnywhereAfter,
            _ => Pairing::Adjacent,
        }
    }
}

/// One message of the request, kept raw.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub raw: &'a str,
    pub object: RawObject<'a>,
    pub role: Role,
    /// The content blocks, when content is an array.
    pub blocks: Option<Vec<&'a str>>,
}

/// A parsed request: raw parts for rendering, the neutral conversation for the policies.
#[derive(Debug)]
pub struct ParsedRequest<'a> {
    pub dialect: Dialect,
    pub body: &'a [u8],
    pub top: RawObject<'a>,
    pub model: Option<Cow<'a, str>>,
    pub stream: bool,
    pub messages: Vec<Message<'a>>,
    pub conversation: Conversation<'a>,
    /// System prompt texts, in order (top-level and in-message), for fingerprints.
    pub system: Vec<Cow<'a, str>>,
    /// System text outside `messages` (Anthropic `system`, Responses `instructions`): counted as a
    /// fixed cost, since no policy touches it.
    pub top_system: Vec<Cow<'a, str>>,
    /// The tool definitions, counted as they are.
    pub tools: Option<&'a str>,
    /// A cache breakpoint of compactor's own to render (Anthropic; see [`breakpoints`]).
    pub marker: Option<breakpoints::Marker>,
    /// Where the parse found things, for the next turn's reuse ([`prefix`]).
    pub layout: Layout,
    /// How many assistant messages the parse has read so far: Gemini names a call the model gave
    /// no id by the assistant turn it stands in, a count repair never shifts (it removes only
    /// results, never an assistant message) and appended messages never change.
    pub assistant_turns: usize,
    /// The index of the last assistant message the parse has read: the turn whose calls the
    /// responses of a Gemini content answer.
    pub last_assistant: Option<usize>,
    /// Token counts, truncations and rendered messages carried from the last turn and kept for
    /// the next ([`prefix`]).
    pub memo: prefix::Memo,
    /// Messages whose replaced content the last render could not write: their original bytes
    /// went instead, so nothing may count as saved in them ([`ParsedRequest::render`]).
    pub unapplied: Unapplied,
    /// The memory the parse may take, read once when it started.
    bound: work::ParseBound,
}

/// Messages whose replaced content a render could not write (a lock only so the parse can move
/// between threads: one request renders on one thread at a time).
#[derive(Debug, Default)]
pub struct Unapplied(std::sync::Mutex<Vec<usize>>);

impl Unapplied {
    fn messages(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn push(&self, message: usize) {
        self.messages().push(message);
    }

    pub fn len(&self) -> usize {
        self.messages().len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages().is_empty()
    }

    /// The messages recorded so far, leaving none.
    pub fn take(&self) -> Vec<usize> {
        std::mem::take(&mut *self.messages())
    }
}

/// Where a parse found the history, and which system texts each message gave.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Byte offset of the history array's `[`.
    pub history_start: usize,
    /// For each message, how many of the in-message system texts (`system` after the top-level
    /// ones) come from it and the messages before it.
    pub system_ends: Vec<usize>,
}

/// Whether a parse holding `messages` messages before the one being read and `held` items may
/// add `more` (that message's parts or tool calls): `None` past its `bound`, before they are
/// built.
fn admit_items(bound: work::ParseBound, messages: usize, held: usize, more: usize) -> Option<()> {
    bound.holds(messages + 1, held + more).then_some(())
}

/// Reads one top-level `"key": value`; the history array is read element by element, each
/// message once, as an object.
fn read_field<'a>(
    scan: &mut json::Scanner<'a>,
    history_field: &str,
    fields: &mut json::UniqueFields<'a>,
    elements: &mut Vec<(&'a str, RawObject<'a>)>,
    history_start: &mut Option<usize>,
    most: usize,
) -> Option<()> {
    let key = scan.key()?;
    if !scan.eat(b':') {
        return None;
    }
    if key == history_field && history_start.is_none() {
        let start = scan.start();
        if !scan.eat(b'[') {
            return None;
        }
        scan_elements(scan, true, elements, most)?;
        *history_start = Some(start);
        return fields.push(key, scan.since(start)?).ok();
    }
    let value = scan.raw()?;
    fields.push(key, value).ok()
}

/// Reads the history array's elements from after its `[` (`first`) or after an element, through
/// its `]`. Every element must be an object. Past `most` elements the read stops: the parse would
/// take more memory than the request may ([`work::ParseBound`]).
fn scan_elements<'a>(
    scan: &mut json::Scanner<'a>,
    first: bool,
    elements: &mut Vec<(&'a str, RawObject<'a>)>,
    most: usize,
) -> Option<()> {
    if scan.eat(b']') {
        return Some(());
    }
    if !first && !scan.eat(b',') {
        return None;
    }
    loop {
        if elements.len() >= most {
            work::refuse_parse();
            return None;
        }
        elements.push(scan.object()?);
        if scan.eat(b']') {
            return Some(());
        }
        if !scan.eat(b',') {
            return None;
        }
    }
}

/// A body's top level as scanned: its fields (the history's whole span among them), the history's
/// new elements, where the history starts, and the head an earlier parse re-made (empty when
/// none was given).
struct TopLevel<'a> {
    fields: json::UniqueFields<'a>,
    elements: Vec<(&'a str, RawObject<'a>)>,
    history_start: usize,
    reused: prefix::Head<'a>,
}

/// Scans `text`'s top level in one pass, from after `head` when given, reading at most `allowed`
/// messages of `history_field` in all.
fn scan_top_level<'a>(
    text: &'a str,
    history_field: &str,
    head: Option<prefix::Head<'a>>,
    allowed: usize,
) -> Option<TopLevel<'a>> {
    let mut fields = json::UniqueFields::with_capacity(16);
    let mut elements: Vec<(&'a str, RawObject<'a>)> = Vec::new();
    let mut history_start = None;
    let mut scan;
    let mut reused = prefix::Head::default();
    match head {
        Some(mut head) => {
            for (key, value) in std::mem::take(&mut head.fields) {
                fields.push(key, value).ok()?;
            }
            scan = json::Scanner::new(text, head.resume);
            let start = head.history_start;
            let most = allowed.checked_sub(head.messages.len()).or_else(|| {
                work::refuse_parse();
                None
            })?;
            scan_elements(&mut scan, head.messages.is_empty(), &mut elements, most)?;
            let key = std::mem::take(&mut head.history_key);
            fields.push(key, text.get(start..scan.at())?).ok()?;
            history_start = Some(start);
            reused = head;
        }
        None => {
            scan = json::Scanner::new(text, 0);
            if !scan.eat(b'{') {
                return None;
            }
            if scan.eat(b'}') {
                return None;
            }
            read_field(&mut scan, history_field, &mut fields, &mut elements, &mut history_start, allowed)?;
        }
    }
    while !scan.eat(b'}') {
        if !scan.eat(b',') {
            return None;
        }
        read_field(&mut scan, history_field, &mut fields, &mut elements, &mut history_start, allowed)?;
    }
    if !scan.at_end() {
        return None;
    }
    Some(TopLevel { fields, elements, history_start: history_start?, reused })
}

/// The model a request's path names, and whether it rules over the body's `model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathModel<'a> {
    /// As the path names it (decoded where the path encodes it: a Bedrock model id's `%3A`).
    pub name: Cow<'a, str>,
    pub rules: bool,
}

impl<'a> ParsedRequest<'a> {
    /// Parses a body in `dialect`; `None` when it is not the shape compactor expects, in which case
    /// the request is forwarded untouched.
    pub fn parse(dialect: Dialect, body: &'a [u8]) -> Option<Self> {
        Self::parse_after(dialect, json::utf8(body).ok()?, None, 0)
    }

    /// Parses a body compaction rebuilt, whose summary stands for `summarized_turns` assistant
    /// turns of the client's conversation: they are counted as if they were there, so the ids
    /// made up from the count (Gemini's calls without ids) name the calls the client's body
    /// names, and the session's remembered pruned ids keep meaning the same calls.
    pub fn parse_rebuilt(dialect: Dialect, body: &'a [u8], summarized_turns: usize) -> Option<Self> {
        Self::parse_after(dialect, json::utf8(body).ok()?, None, summarized_turns)
    }

    /// Parses `body`, taking its head (the top-level fields before the history and the first
    /// messages) from `head` when given, re-made from an earlier parse of the same bytes
    /// ([`prefix`]); the rest is read in one pass: the top level and each new message once.
    /// `turns_before`: assistant turns counted before the first message (see `parse_rebuilt`).
    pub(crate) fn parse_after(
        dialect: Dialect,
        text: &'a str,
        head: Option<prefix::Head<'a>>,
        turns_before: usize,
    ) -> Option<Self> {
        // Memory a parse holds grows with its messages, not its bytes: a body of one-letter
        // messages would take 30 times its size. Past the request's bound it goes as it came.
        let bound = work::ParseBound::current();
        let TopLevel { fields, elements, history_start, mut reused } =
            scan_top_level(text, dialect.history_field(), head, bound.messages())?;
        let top = RawObject { fields: fields.fields };
        let count = reused.messages.len() + elements.len();
        let mut parsed = Self::unread(dialect, text.as_bytes(), top, history_start, count, bound);
        parsed.read_top_system(reused.top_system.take())?;
        let top_system = parsed.system.len();
        parsed.adopt_head(&mut reused, turns_before);
        parsed.read_messages(elements, top_system)?;
        parsed.conversation.roles = parsed.messages.iter().map(|m| m.role).collect();
        parsed.conversation.pairing = dialect.pairing();
        Some(parsed)
    }

    /// A request whose top level is read (`top`, the history at `history_start`) and whose
    /// `count` messages are not yet.
    fn unread(
        dialect: Dialect,
        body: &'a [u8],
        top: RawObject<'a>,
        history_start: usize,
        count: usize,
        bound: work::ParseBound,
    ) -> Self {
        let model = top.str("model");
        let stream = top.get("stream").is_some_and(|v| v == "true");
        let tools = top.get("tools");
        ParsedRequest {
            dialect,
            body,
            top,
            model,
            stream,
            messages: Vec::with_capacity(count),
            conversation: Conversation::default(),
            system: Vec::new(),
            top_system: Vec::new(),
            tools,
            marker: None,
            layout: Layout { history_start, system_ends: Vec::with_capacity(count) },
            assistant_turns: 0,
            last_assistant: None,
            memo: prefix::Memo::default(),
            unapplied: Unapplied::default(),
            bound,
        }
    }

    /// The system text outside the history: the head's when it was re-made (`reused`), else read
    /// from the top level in the dialect's way.
    fn read_top_system(&mut self, reused: Option<Vec<Cow<'a, str>>>) -> Option<()> {
        match reused {
            Some(top_system) => {
                self.system.clone_from(&top_system);
                self.top_system = top_system;
            }
            None => match self.dialect {
                Dialect::ChatCompletions => {}
                Dialect::AnthropicMessages => anthropic::parse_top(self)?,
                Dialect::Responses => responses::parse_top(self)?,
                Dialect::Gemini => gemini::parse_top(self)?,
            },
        }
        Some(())
    }

    /// Takes the messages re-made from an earlier parse (`reused`, emptied), with their items and
    /// system texts, and counts their assistant turns after `turns_before`.
    fn adopt_head(&mut self, reused: &mut prefix::Head<'a>, turns_before: usize) {
        self.messages.append(&mut reused.messages);
        self.conversation.items.append(&mut reused.items);
        self.system.append(&mut reused.system);
        self.layout.system_ends.append(&mut reused.system_ends);
        // Counted again over the re-made messages, as a fresh parse counts them.
        self.assistant_turns = turns_before + self.messages.iter().filter(|m| m.role == Role::Assistant).count();
        self.last_assistant = self.messages.iter().rposition(|m| m.role == Role::Assistant);
    }

    /// Reads each new message (`elements`, after those already held) in the dialect's way, within
    /// the parse's bound; `top_system`: how many system texts came from outside the history.
    fn read_messages(&mut self, elements: Vec<(&'a str, RawObject<'a>)>, top_system: usize) -> Option<()> {
        let first_new = self.messages.len();
        for (offset, (raw, object)) in elements.into_iter().enumerate() {
            let index = first_new + offset;
            match self.dialect {
                Dialect::ChatCompletions => chat::parse_message(self, index, raw, object)?,
                Dialect::AnthropicMessages => anthropic::parse_message(self, index, raw, object)?,
                Dialect::Responses => responses::parse_message(self, index, raw, object)?,
                Dialect::Gemini => gemini::parse_message(self, index, raw, object)?,
            }
            if !self.bound.holds(self.messages.len(), self.conversation.items.len()) {
                return None;
            }
            self.layout.system_ends.push(self.system.len() - top_system);
            let read = self.messages.get(index..).unwrap_or_default();
            self.assistant_turns += read.iter().filter(|m| m.role == Role::Assistant).count();
            if let Some(at) = read.iter().rposition(|m| m.role == Role::Assistant) {
                self.last_assistant = Some(index + at);
            }
        }
        Some(())
    }

    /// The new body when policies changed something, `None` when the original bytes stand.
    pub fn render(&self) -> Option<Vec<u8>> {
        if !self.conversation.is_changed() {
            return None;
        }
        // Written in place, between the body's bytes before and after the history: one buffer
        // for the whole new body (each 800 KB buffer more is a copy and fresh pages to fault in).
        let history = json::span_in(self.body, self.top.get(self.dialect.history_field())?)?;
        let before = json::utf8(self.body.get(..history.start)?).ok()?;
        let after = json::utf8(self.body.get(history.end..)?).ok()?;
        let mut out = String::with_capacity(self.body.len() + self.body.len() / 64);
        out.push_str(before);
        let mut array = json::ArrayWriter::continuing(out);
        match self.dialect {
            Dialect::ChatCompletions => chat::render_messages(self, &mut array),
            Dialect::AnthropicMessages => anthropic::render_messages(self, &mut array),
            Dialect::Responses => responses::render_items(self, &mut array),
            Dialect::Gemini => gemini::render_contents(self, &mut array),
        }
        let mut out = array.finish();
        out.push_str(after);
        Some(out.into_bytes())
    }

    /// The body with these top-level fields replaced (or appended when absent); every other byte
    /// stays as the client sent it.
    pub fn splice(&self, fields: &[(&str, String)]) -> Option<Vec<u8>> {
        // The values are borrowed: the history's is the whole rewritten conversation.
        let mut edits: Vec<(std::ops::Range<usize>, &str)> = Vec::with_capacity(fields.len() + 1);
        let mut appended = String::new();
        for (key, value) in fields {
            match self.top.get(key) {
                Some(raw) => edits.push((json::span_in(self.body, raw)?, value.as_str())),
                None => {
                    appended.push(',');
                    json::push_json_string(&mut appended, key);
                    appended.push(':');
                    appended.push_str(value);
                }
            }
        }
        if !appended.is_empty() {
            let close = self.body.iter().rposition(|b| *b == b'}')?;
            edits.push((close..close, appended.as_str()));
        }
        edits.sort_by_key(|(span, _)| span.start);
        let grown: usize = edits.iter().map(|(_, text)| text.len()).sum();
        let mut out = Vec::with_capacity(self.body.len() + grown);
        let mut at = 0;
        for (span, text) in edits {
            out.extend_from_slice(&self.body[at..span.start]);
            out.extend_from_slice(text.as_bytes());
            at = span.end;
        }
        out.extend_from_slice(&self.body[at..]);
        Some(out)
    }

    /// Adds a system text from outside the history (Anthropic `system`, Responses
    /// `instructions`): a fixed cost, and part of the fingerprint.
    fn push_top_system(&mut self, text: Cow<'a, str>) {
        self.system.push(text.clone());
        self.top_system.push(text);
    }

    /// The same request with the model its path names: in place of the body's when the path's
    /// rules (an Azure OpenAI deployment: the provider answers with it, whatever the body says),
    /// else only where the body names none (Gemini's bodies carry none). The body is not changed.
    pub fn with_model(mut self, model: Option<PathModel<'_>>) -> Self {
        if let Some(PathModel { name, rules }) = model
            && (rules || self.model.is_none())
        {
            self.model = Some(Cow::Owned(name.into_owned()));
        }
        self
    }

    /// The number of leading system/developer messages, which every rebuild keeps first.
    pub fn lead(&self) -> usize {
        self.messages.iter().take_while(|m| m.role == Role::System).count()
    }

    /// The output budget the client asked for: `max_tokens`, `max_completion_tokens` or
    /// `max_output_tokens`, or Gemini's `generationConfig.maxOutputTokens` (nested).
    pub fn max_tokens(&self) -> Option<u64> {
        match self.dialect {
            Dialect::Gemini => gemini::max_output_tokens(self),
            _ => self.max_tokens_field().map(|(_, n)| n),
        }
    }

    /// The top-level field capping the output, and its value: what the lower-`max_tokens` rung
    /// rewrites. None for Gemini, whose cap is nested and whose overflow counts the input alone.
    pub fn max_tokens_field(&self) -> Option<(&'static str, u64)> {
        if self.dialect == Dialect::Gemini {
            return None;
        }
        ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .into_iter()
            .find_map(|key| self.top.get(key).and_then(|v| v.parse::<u64>().ok()).map(|n| (key, n)))
    }

    /// Tokens of message `index` as counted (items plus framing).
    pub fn message_tokens(&self, index: usize) -> u32 {
        let items = self.conversation.items_of(index).iter().map(|i| i.tokens);
        items.fold(crate::conversation::FRAMING_TOKENS, u32::saturating_add)
    }
}

/// The item of a message whose content is a plain string; system text is also kept for
/// fingerprints.
pub(crate) fn string_kind<'a>(role: Role, text: Cow<'a, str>, system: &mut Vec<Cow<'a, str>>) -> Kind<'a> {
    if role == Role::System {
        system.push(text.clone());
        Kind::System { text }
    } else {
        Kind::Text { role, text }
    }
}

/// Concatenated text of an array of content parts (`{"type":"text","text":…}`), and how many
/// parts were something else (images, files).
pub(crate) fn text_of_parts<'a>(parts: &[&'a str]) -> (Cow<'a, str>, u32) {
    let mut texts: Vec<Cow<'a, str>> = Vec::new();
    let mut others = 0;
    for part in parts {
        let text = RawObject::parse(part).and_then(|o| {
            let kind = o.str("type");
            match kind.as_deref() {
                Some("text") | Some("input_text") | Some("output_text") => o.str("text"),
                _ => None,
            }
        });
        match text {
            Some(text) => texts.push(text),
            None => others += 1,
        }
    }
    let text = if texts.len() == 1 { texts.pop().unwrap_or_default() } else { Cow::Owned(texts.join("\n")) };
    (text, others)
}

/// Whether a result made of these content parts may be replaced by one text and stay valid:
/// every part is text, or a `media` type compactor drops knowingly. Any other part (a tool
/// reference that loads a deferred tool, a search result citations point at, a type compactor
/// does not know) keeps the result whole.
pub(crate) fn only_text_and_media(parts: &[&str], media: &[&str]) -> bool {
    parts.iter().all(|part| {
        let kind = RawObject::parse(part).and_then(|o| o.str("type"));
        matches!(kind.as_deref(), Some("text") | Some("input_text") | Some("output_text"))
            || kind.is_some_and(|k| media.contains(&k.as_ref()))
    })
}

#[cfg(test)]
mod tests;
