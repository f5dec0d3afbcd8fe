//! The neutral view of a conversation that every rewrite policy works on, whatever API it came
//! from. Policies never change bytes themselves: they mark items (replace, remove) and ask for
//! inserts; the dialect renders those marks back into its own JSON.

use std::borrow::Cow;
use std::sync::Arc;

/// Who a message is from, folded to what the policies need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// System or developer instructions.
    System,
    User,
    Assistant,
    /// A Chat Completions `tool` (or legacy `function`) message.
    Tool,
}

/// One unit of a conversation: a text, a tool call, a tool result, an image...
#[derive(Debug, Clone)]
pub struct Item<'a> {
    /// Index of the message this item belongs to.
    pub message: usize,
    /// Index within that message's content blocks, when the dialect has blocks.
    pub block: Option<usize>,
    pub kind: Kind<'a>,
    /// Estimated tokens of this item as it was sent.
    pub tokens: u32,
    /// What the policies decided for it.
    pub edit: Edit,
    /// Whether repair may pair, move, remove or answer this call or result: only client tool
    /// pairs whose shape compactor fully knows. A tool the provider runs inside its own turn
    /// (Anthropic `server_tool_use`, MCP connector calls, Responses' hosted tools) and a pair
    /// compactor cannot write a result for are forwarded as sent.
    pub repairable: bool,
    /// Whether pruning, truncation and dedupe may replace this result's text: false where the
    /// shortened block would no longer be valid for the provider (encrypted or structured
    /// results, tool references, parts compactor does not know).
    pub shortenable: bool,
}

impl<'a> Item<'a> {
    /// An item of message `message` (block `block`) as the client sent it; tool calls and results
    /// are a client's pair, which the policies may repair and shorten.
    pub fn new(message: usize, block: Option<usize>, kind: Kind<'a>) -> Self {
        Self { message, block, kind, tokens: 0, edit: Edit::Keep, repairable: true, shortenable: true }
    }

    /// The same item, marked as a call or result the provider runs (or one repair cannot
    /// answer): repair leaves it, and every result claiming its id, alone.
    pub fn provider_run(mut self) -> Self {
        self.repairable = false;
        self
    }

    /// The same item with `shortenable` set: whether its text may be replaced.
    pub fn shortenable(mut self, shortenable: bool) -> Self {
        self.shortenable = shortenable;
        self
    }

    /// The call id of a tool call or result item.
    pub fn call_id(&self) -> Option<&str> {
        match &self.kind {
            Kind::ToolCall { id, .. } => id.as_deref(),
            Kind::ToolResult { call_id, .. } => call_id.as_deref(),
            _ => None,
        }
    }
}

/// What an item is.
#[derive(Debug, Clone)]
pub enum Kind<'a> {
    /// System or developer text.
    System { text: Cow<'a, str> },
    /// User or assistant text.
    Text { role: Role, text: Cow<'a, str> },
    /// An assistant's tool call. `id` is `None` for legacy function calls.
    ToolCall { id: Option<Cow<'a, str>>, name: Cow<'a, str>, arguments: Cow<'a, str> },
    /// A tool's output. `call_id` is `None` for legacy function results. For a result the provider
    /// wrote (a web search, a fetched page, code execution), `text` is what a reader can make of
    /// it and `attachments` counts its opaque parts (encrypted pages, PDFs, images).
    ToolResult { call_id: Option<Cow<'a, str>>, text: Cow<'a, str>, attachments: u32 },
    /// An image, document or other attachment outside tool results.
    Attachment,
    /// Model reasoning (thinking blocks): kept whole, never edited.
    Thinking { text: Cow<'a, str> },
    /// Anything compactor does not understand, kept as it came.
    Other { raw: &'a str },
}

/// A policy's decision for one item.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Edit {
    #[default]
    Keep,
    /// Replace a tool result's content with this text (attachments inside it are dropped).
    Replace(String),
    /// Leave the item out.
    Remove,
}

/// A synthetic tool result for a call that has none, placed by the dialect where its API wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertResult {
    /// Index of the tool call item this result answers.
    pub call_item: usize,
    pub call_id: String,
    pub text: String,
}

/// A parsed conversation: items in order, plus fixed costs (tools, framing).
#[derive(Debug, Clone, Default)]
pub struct Conversation<'a> {
    pub items: Vec<Item<'a>>,
    pub inserts: Vec<InsertResult>,
    /// Tokens that policies cannot change: tool definitions, per-message framing.
    pub fixed_tokens: u32,
    /// The role of every message, by index.
    pub roles: Vec<Role>,
    pub pairing: Pairing,
}

/// Where a dialect wants tool results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pairing {
    /// Right after the calling turn (Chat Completions, Anthropic).
    #[default]
    Adjacent,
    /// Anywhere after the call (Responses).
    AnywhereAfter,
}

impl<'a> Conversation<'a> {
    /// Tokens as the conversation would be sent now, with every edit applied.
    pub fn tokens_after(&self, count: impl Fn(&str) -> u32) -> u32 {
        let items = self.items.iter().map(|item| match &item.edit {
            Edit::Keep => item.tokens,
            Edit::Replace(text) => count(text).saturating_add(FRAMING_TOKENS),
            Edit::Remove => 0,
        });
        let inserted = self.inserts.iter().map(|i| count(&i.text).saturating_add(FRAMING_TOKENS));
        items.chain(inserted).fold(self.fixed_tokens, u32::saturating_add)
    }

    /// Tokens as the client sent it.
    pub fn tokens_before(&self) -> u32 {
        self.items.iter().map(|i| i.tokens).fold(self.fixed_tokens, u32::saturating_add)
    }

    /// Whether any policy changed anything.
    pub fn is_changed(&self) -> bool {
        !self.inserts.is_empty() || self.items.iter().any(|i| i.edit != Edit::Keep)
    }

    /// Whether message `index` must be re-rendered.
    pub fn message_changed(&self, index: usize) -> bool {
        self.items_of(index).iter().any(|i| i.edit != Edit::Keep)
    }

    /// The positions in `items` of message `index`'s items. Items are in message order (every
    /// dialect parses them so), so two binary searches find them: asking this for every message
    /// costs O(m log n), where a scan per message would cost O(m x n) on a hostile request.
    pub fn item_range(&self, index: usize) -> std::ops::Range<usize> {
        let start = self.items.partition_point(|i| i.message < index);
        let len = self.items[start..].partition_point(|i| i.message == index);
        start..start + len
    }

    /// The items of message `index`.
    pub fn items_of(&self, index: usize) -> &[Item<'a>] {
        &self.items[self.item_range(index)]
    }

    /// The synthetic results grouped by the message each goes after: `anchor` maps the message
    /// of the call to that message (`messages` of them in all).
    pub fn inserts_by(&self, messages: usize, mut anchor: impl FnMut(usize) -> usize) -> Vec<Vec<&InsertResult>> {
        let mut owed: Vec<Vec<&InsertResult>> = vec![Vec::new(); messages];
        for insert in &self.inserts {
            let Some(call) = self.items.get(insert.call_item) else { continue };
            if let Some(slot) = owed.get_mut(anchor(call.message)) {
                slot.push(insert);
            }
        }
        owed
    }

    /// The name of the tool of every call id (the first call with an id names it).
    pub fn tool_names(&self) -> std::collections::HashMap<&str, &str> {
        let mut names = std::collections::HashMap::new();
        for item in &self.items {
            if let Kind::ToolCall { id: Some(id), name, .. } = &item.kind {
                names.entry(id.as_ref()).or_insert(name.as_ref());
            }
        }
        names
    }
}

impl Conversation<'_> {
    /// Whether the conversation may be cut right before message `index` (everything before it
    /// summarized, everything from it kept) without separating a tool call from its result,
    /// client or provider run, or an item compactor does not know from its neighbours. One
    /// question costs a pass over the conversation; [`Conversation::clean_cuts`] answers all.
    pub fn is_clean_cut(&self, index: usize) -> bool {
        self.clean_cuts().get(index).copied().unwrap_or(true)
    }

    /// For every message index, whether the conversation may be cut right before it (see
    /// [`Conversation::is_clean_cut`]), in one pass over the items.
    pub fn clean_cuts(&self) -> Vec<bool> {
        let count = self.roles.len();
        // Pairs straddling each cut, as a difference array: a pair whose call is in message c
        // and result in message r (c < r) forbids the cuts c+1 ..= r.
        let mut straddling = vec![0i64; count + 2];
        let mut unknown = vec![false; count];
        // A result answers the nearest call with its id before it (some agents reuse ids).
        let mut calls: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for item in &self.items {
            if matches!(item.kind, Kind::Other { .. })
                && let Some(slot) = unknown.get_mut(item.message)
            {
                *slot = true;
            }
            match (&item.kind, item.call_id()) {
                (Kind::ToolCall { .. }, Some(id)) => {
                    calls.insert(id, item.message);
                }
                (Kind::ToolResult { .. }, Some(id)) => {
                    if let Some(&call) = calls.get(id)
                        && call < item.message
                    {
                        straddling[call + 1] += 1;
                        straddling[(item.message + 1).min(count + 1)] -= 1;
                    }
                }
                _ => {}
            }
        }
        let mut open = 0i64;
        (0..count)
            .map(|index| {
                open += straddling[index];
                index == 0 || (open == 0 && !unknown[index - 1] && !unknown[index])
            })
            .collect()
    }

    /// The messages where results of assistant message `assistant`'s tool calls belong: the run
    /// of `tool` messages right after it (Chat Completions), else the next user message
    /// (Anthropic).
    pub fn result_zone(&self, assistant: usize) -> std::ops::Range<usize> {
        let start = assistant + 1;
        if self.pairing == Pairing::AnywhereAfter {
            return start..self.roles.len();
        }
        let mut end = start;
        while self.roles.get(end) == Some(&Role::Tool) {
            end += 1;
        }
        if end == start && self.roles.get(start) == Some(&Role::User) {
            end = start + 1;
        }
        start..end
    }
}

/// Per-item overhead of the wire format (role markers, block wrappers), in tokens.
pub const FRAMING_TOKENS: u32 = 4;

/// A tool output cut to its head and tail (`rewrite::truncate`): the item, its new text and that text's count.
#[derive(Debug, Clone)]
pub struct Cut {
    pub item: usize,
    pub text: Arc<str>,
    pub tokens: u32,
}
