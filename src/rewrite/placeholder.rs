//! What a pruned tool output becomes, and what a deduplicated copy points at: a short text that
//! names the tool call (its name and its arguments, cut to a bounded length), so the model knows
//! which output is gone and that calling the tool again shows it. Made only from the call's own
//! bytes and the output's size as the client sent it, so an output pruned on one turn reads the
//! same on every later turn (the provider's prompt cache keeps it).

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashMap;

use crate::conversation::{Conversation, FRAMING_TOKENS, Kind};

/// `prune.placeholder`'s default: names the call, says how to see its output again.
pub const DEFAULT: &str = "[Old tool result content cleared: {tool} {args} ({tokens} tokens). Call the tool again to see its current output.]";
/// Characters of a tool's name a placeholder shows at most.
const MAX_TOOL_CHARS: usize = 64;
/// Characters of a call's arguments a placeholder shows at most.
pub const MAX_ARGS_CHARS: usize = 100;
/// The name shown when the call is not in the conversation.
const UNKNOWN_TOOL: &str = "a tool";

/// `prune.placeholder`, parsed once: a fixed text, or a template with `{tool}`, `{args}` and
/// `{tokens}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    text: String,
    /// Whether the text names anything: a fixed text is used as it is, with no work per output.
    fixed: bool,
    /// The length of the text before its first name: every placeholder rendered from the template
    /// starts with that text as it is.
    head: usize,
}

/// The names a template may hold.
const NAMES: [&str; 3] = ["{tool}", "{args}", "{tokens}"];

impl Template {
    pub fn new(text: &str) -> Self {
        let head = NAMES.iter().filter_map(|name| text.find(name)).min();
        Self { text: text.to_string(), fixed: head.is_none(), head: head.unwrap_or(text.len()) }
    }

    /// The template as configured.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The placeholder of the output of call `call_id` (`tokens`: the output's size as it would
    /// be sent, framing included).
    pub fn render<'t>(&'t self, calls: &Calls, call_id: Option<&str>, tokens: u32) -> Cow<'t, str> {
        if self.fixed {
            return Cow::Borrowed(&self.text);
        }
        Cow::Owned(self.naming(calls, call_id).replace("{tokens}", &tokens.saturating_sub(FRAMING_TOKENS).to_string()))
    }

    /// Whether `text` is the placeholder of call `call_id`'s output, whatever size it names (a
    /// placeholder rewritten again counts its own tokens, not the output's): what was pruned is
    /// never pruned again.
    pub fn rendered(&self, calls: &Calls, call_id: Option<&str>, text: &str) -> bool {
        if self.fixed || text.len() > self.max_len() {
            return self.fixed && text == self.text;
        }
        // Most outputs are not placeholders, and their first bytes say so: the call is named only
        // for those that may be (naming every short output of a long conversation, on every turn,
        // was about a tenth of an 800 KB turn's instructions).
        if !text.starts_with(&self.text[..self.head]) {
            return false;
        }
        let naming = self.naming(calls, call_id);
        let mut pieces = naming.split("{tokens}");
        let Some(mut rest) = pieces.next().and_then(|first| text.strip_prefix(first)) else { return false };
        for piece in pieces {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            match rest[digits..].strip_prefix(piece) {
                Some(after) if digits > 0 => rest = after,
                _ => return false,
            }
        }
        rest.is_empty()
    }

    /// Whether `text` is a stand-in compactor writes: this template's placeholder of call
    /// `call_id`'s output, or a duplicate's [`pointer`]. No policy shortens a stand-in again.
    pub fn stands_in(&self, calls: &Calls, call_id: Option<&str>, text: &str) -> bool {
        is_pointer(text) || self.rendered(calls, call_id, text)
    }

    /// The template with the call named (`{tokens}` left as it is).
    fn naming(&self, calls: &Calls, call_id: Option<&str>) -> String {
        let call = call_id.and_then(|id| calls.get(id));
        let tool = call.map_or(UNKNOWN_TOOL, |c| c.name);
        let args = call.map_or(String::new(), |c| bounded(c.arguments, MAX_ARGS_CHARS));
        self.text.replace("{tool}", &bounded(tool, MAX_TOOL_CHARS)).replace("{args}", &args)
    }

    /// The most tokens a rendered placeholder can take: every byte of a name, arguments and size
    /// counted as a token.
    pub fn max_tokens(&self, count: &dyn Fn(&str) -> u32) -> u32 {
        if self.fixed {
            return count(&self.text);
        }
        let frame = self.text.replace("{tool}", "").replace("{args}", "").replace("{tokens}", "");
        let names = NAMES.map(|name| self.text.matches(name).count());
        let bytes = names[0] * (4 * MAX_TOOL_CHARS + 3) + names[1] * (4 * MAX_ARGS_CHARS + 3) + names[2] * 10;
        count(&frame) + u32::try_from(bytes).unwrap_or(u32::MAX)
    }

    /// The longest text a rendered placeholder can have, in bytes: an output no longer than this
    /// may already be one.
    pub fn max_len(&self) -> usize {
        // Every character of a name or arguments is at most 4 bytes; "..." and a u32 besides.
        self.text.len() + 4 * (MAX_TOOL_CHARS + MAX_ARGS_CHARS) + 2 * 3 + 10
    }
}

/// One tool call, as a placeholder names it.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub name: &'a str,
    pub arguments: &'a str,
}

/// Every tool call of a conversation by its id (the first call with an id names it), looked up
/// the first time a placeholder needs one: a request whose outputs all stay costs no map.
#[derive(Debug)]
pub struct Calls<'a, 'c> {
    conversation: &'a Conversation<'c>,
    by_id: OnceCell<HashMap<&'a str, Call<'a>>>,
}

impl<'a, 'c> Calls<'a, 'c> {
    pub fn of(conversation: &'a Conversation<'c>) -> Self {
        Self { conversation, by_id: OnceCell::new() }
    }

    pub fn get(&self, call_id: &str) -> Option<Call<'a>> {
        let by_id = self.by_id.get_or_init(|| {
            let mut by_id = HashMap::new();
            for item in &self.conversation.items {
                if let Kind::ToolCall { id: Some(id), name, arguments } = &item.kind {
                    by_id.entry(id.as_ref()).or_insert(Call { name: name.as_ref(), arguments: arguments.as_ref() });
                }
            }
            by_id
        });
        by_id.get(call_id).copied()
    }
}

/// The text that stands in for a newer duplicate of the output of `older` (its call id): it
/// names the call it repeats like a placeholder does.
pub fn pointer(calls: &Calls, older: &str) -> String {
    match calls.get(older) {
        _ if older.is_empty() => {
            "[Duplicate tool output: identical to an earlier tool output in this conversation]".to_string()
        }
        Some(call) => format!(
            "[Duplicate tool output: identical to the earlier result of {} {} (call {})]",
            bounded(call.name, MAX_TOOL_CHARS),
            bounded(call.arguments, MAX_ARGS_CHARS),
            bounded(older, MAX_TOOL_CHARS)
        ),
        None => format!(
            "[Duplicate tool output: identical to the earlier result of tool call {}]",
            bounded(older, MAX_TOOL_CHARS)
        ),
    }
}

/// The first words of every [`pointer`].
const POINTER_HEAD: &str = "[Duplicate tool output: identical to ";

/// The longest [`pointer`], in bytes: a tool name and a call id of at most `MAX_TOOL_CHARS`
/// characters, arguments of at most `MAX_ARGS_CHARS`, each character at most 4 bytes.
const POINTER_MAX_LEN: usize = 128 + 4 * (2 * MAX_TOOL_CHARS + MAX_ARGS_CHARS) + 3 * 3;

/// Whether `text` is a duplicate's pointer (or a client's text that reads as one, which is as
/// short: left whole).
pub fn is_pointer(text: &str) -> bool {
    text.len() <= POINTER_MAX_LEN && text.starts_with(POINTER_HEAD) && text.ends_with(']')
}

/// `text` on one line (every run of whitespace one space), cut to `max` characters with "..."
/// when longer.
fn bounded(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max * 4));
    let mut chars = 0;
    for word in text.split_whitespace() {
        if chars > 0 {
            out.push(' ');
            chars += 1;
        }
        for c in word.chars() {
            if chars >= max {
                out.push_str("...");
                return out;
            }
            out.push(c);
            chars += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Item;

    fn conversation(arguments: &str) -> Conversation<'_> {
        let call = Kind::ToolCall { id: Some("call_1".into()), name: "read_file".into(), arguments: arguments.into() };
        Conversation { items: vec![Item::new(0, None, call)], ..Conversation::default() }
    }

    #[test]
    fn a_template_names_the_call_with_its_arguments_on_one_line_and_bounded() {
        let template = Template::new("[cleared: {tool} {args}, {tokens} tokens; call it again to see it]");
        let long = format!("{{\"path\": \"src/main.rs\",\n  \"note\": \"{}\"}}", "x".repeat(500));
        let conversation = conversation(&long);
        let calls = Calls::of(&conversation);
        let text = template.render(&calls, Some("call_1"), 1_204);
        assert!(text.starts_with(r#"[cleared: read_file {"path": "src/main.rs", "note": "xxx"#), "{text}");
        assert!(text.ends_with("x..., 1200 tokens; call it again to see it]"), "{text}");
        assert!(text.len() <= template.max_len() && !text.contains('\n'));
        // Recognized whatever size it names, and only for its own call.
        assert!(template.rendered(&calls, Some("call_1"), &text));
        assert!(template.rendered(&calls, Some("call_1"), &text.replace("1200 tokens", "31 tokens")));
        assert!(!template.rendered(&calls, Some("call_2"), &text));
        assert!(!template.rendered(&calls, Some("call_1"), &text.replace("1200 tokens", " tokens")));
        assert_eq!(
            template.render(&calls, Some("call_9"), 10),
            "[cleared: a tool , 6 tokens; call it again to see it]"
        );
    }

    /// An output is told from a placeholder by its first bytes first; what starts like one is
    /// still compared whole, and a template that starts with a name has no such bytes to go by.
    #[test]
    fn only_the_placeholder_itself_is_recognized_whatever_the_output_starts_with() {
        let conversation = conversation(r#"{"path":"a.rs"}"#);
        let calls = Calls::of(&conversation);
        let default = Template::new(DEFAULT);
        let text = default.render(&calls, Some("call_1"), 500);
        assert!(default.rendered(&calls, Some("call_1"), &text));
        assert!(!default.rendered(&calls, Some("call_1"), "[Old tool result content cleared: something else]"));
        assert!(!default.rendered(&calls, Some("call_1"), "fn main() {}"));

        let named_first = Template::new("{tool} output cleared ({tokens} tokens)");
        let text = named_first.render(&calls, Some("call_1"), 500);
        assert_eq!(text, "read_file output cleared (496 tokens)");
        assert!(named_first.rendered(&calls, Some("call_1"), &text));
        assert!(!named_first.rendered(&calls, Some("call_1"), "read_file output kept"));
    }

    #[test]
    fn a_fixed_text_stays_as_it_is_and_a_pointer_names_the_call_it_repeats() {
        let conversation = conversation(r#"{"path":"a.rs"}"#);
        let calls = Calls::of(&conversation);
        let fixed = Template::new("[Old tool result content cleared]");
        assert!(matches!(fixed.render(&calls, Some("call_1"), 99), Cow::Borrowed("[Old tool result content cleared]")));
        assert_eq!(
            pointer(&calls, "call_1"),
            r#"[Duplicate tool output: identical to the earlier result of read_file {"path":"a.rs"} (call call_1)]"#
        );
        assert!(pointer(&calls, "").contains("an earlier tool output"));
    }
}
