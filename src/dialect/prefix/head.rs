//! The reuse: a body that starts with the bytes of an earlier one has the messages inside the
//! common bytes re-made from the earlier skeleton by slicing the new body, and only the rest read.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use super::memo::Reused;
use super::skeleton::{ItemSkeleton, KindSkeleton, MessageSkeleton, Skeleton, make_opt};
use crate::conversation::{Item, Kind};
use crate::dialect::{Dialect, Message, ParsedRequest};
use crate::json;

/// The head of a body re-made from a [`Skeleton`]: what [`ParsedRequest::parse_after`] starts from.
#[derive(Debug, Default)]
pub(crate) struct Head<'a> {
    /// The leading bytes the body shares with the skeleton's.
    pub common: usize,
    pub fields: Vec<(Cow<'a, str>, &'a str)>,
    pub history_key: Cow<'a, str>,
    pub history_start: usize,
    /// Where reading resumes: after the last re-made message, or after the history's `[`.
    pub resume: usize,
    pub top_system: Option<Vec<Cow<'a, str>>>,
    pub messages: Vec<Message<'a>>,
    pub items: Vec<Item<'a>>,
    pub system: Vec<Cow<'a, str>>,
    pub system_ends: Vec<usize>,
}

impl Skeleton {
    /// How many leading bytes `body` shares with this skeleton's body.
    pub(super) fn common_prefix(&self, body: &[u8]) -> usize {
        common_prefix(&self.body, body)
    }

    /// The head of `text` (a body whose first `common` bytes are this skeleton's): the fields
    /// before the history and every message that ends inside the common bytes, re-made by slicing
    /// `text`. `None` when not even the history's opening lies inside them.
    pub(crate) fn head<'a>(&'a self, text: &'a str, mut common: usize) -> Option<Head<'a>> {
        while !text.is_char_boundary(common) {
            common -= 1;
        }
        if self.history_start >= common {
            return None;
        }
        // Everything re-made is sliced from the common bytes only, whatever the skeleton says.
        let text = text.get(..common)?;
        let reused = self.messages.partition_point(|m| m.raw.end <= common);
        let slice = |span: &Range<usize>| text.get(span.clone());
        let fields =
            self.fields.iter().map(|(key, value)| Some((key.make(text)?, slice(value)?))).collect::<Option<_>>()?;
        let top_system = match &self.top_system {
            Some(pieces) => Some(pieces.iter().map(|p| p.make(text)).collect::<Option<_>>()?),
            None => None,
        };
        let messages = self.messages[..reused].iter().map(|m| m.make(text)).collect::<Option<_>>()?;
        let item_count = self.items.partition_point(|i| i.message < reused);
        let items = self.items[..item_count].iter().map(|i| i.make(text)).collect::<Option<_>>()?;
        let system_ends = self.system_ends[..reused].to_vec();
        let system_count = system_ends.last().copied().unwrap_or(0);
        let system = self.system.get(..system_count)?.iter().map(|p| p.make(text)).collect::<Option<_>>()?;
        Some(Head {
            common,
            fields,
            history_key: self.history_key.make(text)?,
            history_start: self.history_start,
            resume: if reused == 0 { self.history_start + 1 } else { self.messages[reused - 1].raw.end },
            top_system,
            messages,
            items,
            system,
            system_ends,
        })
    }

    /// Whether `other` opens the same conversation (the same bytes through the first message).
    pub(super) fn same_opening(&self, other: &Skeleton) -> bool {
        self.opening == other.opening && self.body.get(..self.opening) == other.body.get(..other.opening)
    }
}

impl MessageSkeleton {
    /// The message re-made by slicing `text` (the common bytes) where this skeleton says it lies.
    fn make<'a>(&'a self, text: &'a str) -> Option<Message<'a>> {
        let slice = |span: &Range<usize>| text.get(span.clone());
        Some(Message {
            raw: slice(&self.raw)?,
            object: json::RawObject {
                fields: self
                    .fields
                    .iter()
                    .map(|(key, value)| Some((key.make(text)?, slice(value)?)))
                    .collect::<Option<_>>()?,
            },
            role: self.role,
            blocks: match &self.blocks {
                Some(blocks) => Some(blocks.iter().map(slice).collect::<Option<_>>()?),
                None => None,
            },
        })
    }
}

impl ItemSkeleton {
    /// The item re-made from `text` (the common bytes) and the pieces it keeps.
    fn make<'a>(&'a self, text: &'a str) -> Option<Item<'a>> {
        let kind = match &self.kind {
            KindSkeleton::System { text: t } => Kind::System { text: t.make(text)? },
            KindSkeleton::Text { role, text: t } => Kind::Text { role: *role, text: t.make(text)? },
            KindSkeleton::ToolCall { id, name, arguments } => {
                Kind::ToolCall { id: make_opt(id, text)?, name: name.make(text)?, arguments: arguments.make(text)? }
            }
            KindSkeleton::ToolResult { call_id, text: t, attachments } => {
                Kind::ToolResult { call_id: make_opt(call_id, text)?, text: t.make(text)?, attachments: *attachments }
            }
            KindSkeleton::Attachment => Kind::Attachment,
            KindSkeleton::Thinking { text: t } => Kind::Thinking { text: t.make(text)? },
            KindSkeleton::Other { raw } => Kind::Other { raw: text.get(raw.clone())? },
        };
        Some(Item {
            message: self.message,
            block: self.block,
            kind,
            tokens: self.tokens,
            edit: self.edit.clone(),
            repairable: self.repairable,
            shortenable: self.shortenable,
        })
    }
}

/// How many leading bytes `a` and `b` share: slices compared a chunk at a time, then the first
/// differing chunk byte by byte.
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 4096;
    let len = a.len().min(b.len());
    let mut at = 0;
    while at + CHUNK <= len && a[at..at + CHUNK] == b[at..at + CHUNK] {
        at += CHUNK;
    }
    at + a[at..len].iter().zip(&b[at..len]).take_while(|(x, y)| x == y).count()
}

/// Parses `body` reusing `earlier` (a skeleton of an earlier body) when the two share a head.
/// Returns the parse and how many messages were re-made (0: a full parse).
pub fn parse_reusing<'a>(
    dialect: Dialect,
    body: &'a [u8],
    earlier: &'a Arc<Skeleton>,
) -> (Option<ParsedRequest<'a>>, usize) {
    // Validated once, whatever follows: a body that is not UTF-8 is no JSON.
    let Ok(text) = json::utf8(body) else { return (None, 0) };
    if earlier.dialect == dialect
        && let Some(head) = earlier.head(text, earlier.common_prefix(body))
    {
        let (reused, items, common) = (head.messages.len(), head.items.len(), head.common);
        if let Some(mut parsed) = ParsedRequest::parse_after(dialect, text, Some(head), 0) {
            if reused > 0 {
                parsed.memo.earlier = Some(Reused { skeleton: earlier.clone(), items, messages: reused, common });
            }
            return (Some(parsed), reused);
        }
    }
    (ParsedRequest::parse_after(dialect, text, None, 0), 0)
}
