//! [`Skeleton`]: where one parse found everything in its body, as byte ranges (or, for a text
//! that was no slice of the body, the text itself), built from a fresh parse and weighed for the
//! cache's bound.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::rendered::RenderedAt;
use crate::conversation::Cut;
use crate::conversation::{Edit, Item, Kind, Role};
use crate::dialect::{Dialect, Layout, Message, ParsedRequest};
use crate::json;
use crate::tokens::Encoding;

/// A text of the earlier parse: where it lay in the body, or its own text when it was not a slice
/// of the body (an unescaped string, a constant), shared by the skeletons of later turns and
/// lent to their parses.
#[derive(Debug, Clone)]
pub(super) enum Piece {
    At(Range<usize>),
    Owned(Arc<str>),
}

impl Piece {
    // A borrowed text may be a slice of the body; an owned one never is.
    #[allow(clippy::ptr_arg)]
    fn of(body: &[u8], text: &Cow<str>) -> Self {
        match text {
            Cow::Borrowed(text) => match json::span_in(body, text) {
                Some(span) => Self::At(span),
                None => Self::Owned((*text).into()),
            },
            Cow::Owned(text) => Self::Owned(text.as_str().into()),
        }
    }

    /// The text in `text` (a body sharing this piece's bytes), or lent from this piece.
    pub(super) fn make<'a>(&'a self, text: &'a str) -> Option<Cow<'a, str>> {
        match self {
            Self::At(span) => text.get(span.clone()).map(Cow::Borrowed),
            Self::Owned(owned) => Some(Cow::Borrowed(owned)),
        }
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + if let Self::Owned(text) = self { text.len() } else { 0 }
    }
}

pub(super) fn make_opt<'a>(piece: &'a Option<Piece>, text: &'a str) -> Option<Option<Cow<'a, str>>> {
    match piece {
        Some(piece) => Some(Some(piece.make(text)?)),
        None => Some(None),
    }
}

/// [`Kind`] with its texts as pieces.
#[derive(Debug, Clone)]
pub(super) enum KindSkeleton {
    System { text: Piece },
    Text { role: Role, text: Piece },
    ToolCall { id: Option<Piece>, name: Piece, arguments: Piece },
    ToolResult { call_id: Option<Piece>, text: Piece, attachments: u32 },
    Attachment,
    Thinking { text: Piece },
    Other { raw: Range<usize> },
}

#[derive(Debug, Clone)]
pub(super) struct ItemSkeleton {
    pub(super) message: usize,
    pub(super) block: Option<usize>,
    pub(super) kind: KindSkeleton,
    pub(super) tokens: u32,
    pub(super) edit: Edit,
    pub(super) repairable: bool,
    pub(super) shortenable: bool,
}

#[derive(Debug, Clone)]
pub(super) struct MessageSkeleton {
    pub(super) raw: Range<usize>,
    pub(super) fields: Vec<(Piece, Range<usize>)>,
    pub(super) role: Role,
    pub(super) blocks: Option<Vec<Range<usize>>>,
}

impl MessageSkeleton {
    /// Where `message` (of the parse of `body`) lies, and its fields.
    fn of(body: &[u8], message: &Message) -> Option<Self> {
        let span = |text: &str| json::span_in(body, text);
        Some(Self {
            raw: span(message.raw)?,
            fields: message
                .object
                .fields
                .iter()
                .map(|(key, value)| Some((Piece::of(body, key), span(value)?)))
                .collect::<Option<_>>()?,
            role: message.role,
            blocks: match &message.blocks {
                Some(blocks) => Some(blocks.iter().map(|b| span(b)).collect::<Option<_>>()?),
                None => None,
            },
        })
    }
}

impl ItemSkeleton {
    /// `item` (of the parse of `body`) with its texts as pieces.
    fn of(body: &[u8], item: &Item) -> Option<Self> {
        let piece = |text: &Cow<str>| Piece::of(body, text);
        let kind = match &item.kind {
            Kind::System { text } => KindSkeleton::System { text: piece(text) },
            Kind::Text { role, text } => KindSkeleton::Text { role: *role, text: piece(text) },
            Kind::ToolCall { id, name, arguments } => {
                KindSkeleton::ToolCall { id: id.as_ref().map(piece), name: piece(name), arguments: piece(arguments) }
            }
            Kind::ToolResult { call_id, text, attachments } => KindSkeleton::ToolResult {
                call_id: call_id.as_ref().map(piece),
                text: piece(text),
                attachments: *attachments,
            },
            Kind::Attachment => KindSkeleton::Attachment,
            Kind::Thinking { text } => KindSkeleton::Thinking { text: piece(text) },
            Kind::Other { raw } => KindSkeleton::Other { raw: json::span_in(body, raw)? },
        };
        Some(Self {
            message: item.message,
            block: item.block,
            kind,
            tokens: item.tokens,
            edit: item.edit.clone(),
            repairable: item.repairable,
            shortenable: item.shortenable,
        })
    }
}

/// Where one parse found everything, by byte range of its body (kept, refcounted).
#[derive(Debug)]
pub struct Skeleton {
    pub(super) dialect: Dialect,
    pub(super) body: Bytes,
    /// Top-level fields before the history.
    pub(super) fields: Vec<(Piece, Range<usize>)>,
    pub(super) history_key: Piece,
    pub(super) history_start: usize,
    /// The top-level system texts, when their field comes before the history.
    pub(super) top_system: Option<Vec<Piece>>,
    pub(super) messages: Vec<MessageSkeleton>,
    pub(super) items: Vec<ItemSkeleton>,
    /// The in-message system texts.
    pub(super) system: Vec<Piece>,
    pub(super) system_ends: Vec<usize>,
    /// Where the first message ends: bodies that agree up to here are one conversation.
    pub(super) opening: usize,
    /// Bytes held, for the cache's bound.
    pub(super) size: usize,
    /// The token counts of its items' texts, once the request that made it has counted them: a
    /// later turn re-making these items takes their counts from here instead of hashing and
    /// looking up every text again.
    pub(super) counts: OnceLock<Counted>,
    /// The tool outputs its request's truncation cut, kept for the next turn the same way.
    pub(super) cuts: OnceLock<Cuts>,
    /// Its request's changed messages as rendered, kept for the next turn the same way.
    pub(super) rendered: OnceLock<Vec<RenderedAt>>,
    /// Where its body holds a cache marker key, once a request has looked (see [`Memo::markers`]).
    pub(super) markers: OnceLock<Vec<usize>>,
}

/// The key of the field holding the top-level system texts.
fn system_field(dialect: Dialect) -> Option<&'static str> {
    match dialect {
        Dialect::ChatCompletions => None,
        Dialect::AnthropicMessages => Some("system"),
        Dialect::Responses => Some("instructions"),
        Dialect::Gemini => Some("systemInstruction"),
    }
}

impl Skeleton {
    /// The skeleton of a fresh parse (before any policy touched it) of `body`; `None` when
    /// something in it is not where a skeleton can say (it is then simply not reused).
    pub fn of(parsed: &ParsedRequest, body: Bytes) -> Option<Self> {
        let bytes: &[u8] = &body;
        if parsed.body.as_ptr() != bytes.as_ptr() || parsed.body.len() != bytes.len() {
            return None;
        }
        let span = |text: &str| json::span_in(bytes, text);
        let piece = |text: &Cow<str>| Piece::of(bytes, text);
        let history = parsed.top.fields.iter().position(|(key, _)| key == parsed.dialect.history_field())?;
        let fields: Vec<(Piece, Range<usize>)> = parsed.top.fields[..history]
            .iter()
            .map(|(key, value)| Some((piece(key), span(value)?)))
            .collect::<Option<_>>()?;
        let history_key = piece(&parsed.top.fields[history].0);
        let system_before = system_field(parsed.dialect)
            .is_some_and(|name| parsed.top.fields[..history].iter().any(|(key, _)| key == name));
        // What the parse re-made from an earlier skeleton is that skeleton's, shared: only what
        // the agent added is looked at.
        let reused = parsed.memo.earlier.as_ref();
        let (earlier_messages, earlier_items, earlier_system) = match reused {
            Some(Reused { skeleton, items, messages, .. }) => {
                let system = messages.checked_sub(1).and_then(|last| skeleton.system_ends.get(last)).copied();
                (
                    skeleton.messages.get(..*messages)?,
                    skeleton.items.get(..*items)?,
                    skeleton.system.get(..system.unwrap_or(0))?,
                )
            }
            None => (&[][..], &[][..], &[][..]),
        };
        let top_system = match reused.and_then(|r| r.skeleton.top_system.as_ref()) {
            Some(top_system) if system_before => Some(top_system.clone()),
            _ => system_before.then(|| parsed.top_system.iter().map(piece).collect()),
        };
        let messages: Vec<MessageSkeleton> = earlier_messages
            .iter()
            .cloned()
            .map(Some)
            .chain(
                parsed
                    .messages
                    .get(earlier_messages.len()..)?
                    .iter()
                    .map(|message| MessageSkeleton::of(bytes, message)),
            )
            .collect::<Option<_>>()?;
        let items: Vec<ItemSkeleton> = earlier_items
            .iter()
            .cloned()
            .map(Some)
            .chain(
                parsed.conversation.items.get(earlier_items.len()..)?.iter().map(|item| ItemSkeleton::of(bytes, item)),
            )
            .collect::<Option<_>>()?;
        let in_messages = parsed.system.get(parsed.top_system.len()..)?;
        let system: Vec<Piece> =
            earlier_system.iter().cloned().chain(in_messages.get(earlier_system.len()..)?.iter().map(piece)).collect();
        let opening = messages.first().map_or(parsed.layout.history_start + 1, |m| m.raw.end);
        let Layout { history_start, system_ends } = parsed.layout.clone();
        let mut skeleton = Self {
            dialect: parsed.dialect,
            body,
            fields,
            history_key,
            history_start,
            top_system,
            messages,
            items,
            system,
            system_ends,
            opening,
            size: 0,
            counts: OnceLock::new(),
            cuts: OnceLock::new(),
            rendered: OnceLock::new(),
            markers: OnceLock::new(),
        };
        skeleton.size = skeleton.weigh();
        Some(skeleton)
    }

    fn weigh(&self) -> usize {
        let ranges = |n: usize| n * std::mem::size_of::<Range<usize>>();
        let kind = |kind: &KindSkeleton| match kind {
            KindSkeleton::System { text } | KindSkeleton::Text { text, .. } | KindSkeleton::Thinking { text } => {
                text.size()
            }
            KindSkeleton::ToolCall { id, name, arguments } => {
                id.as_ref().map_or(0, Piece::size) + name.size() + arguments.size()
            }
            KindSkeleton::ToolResult { call_id, text, .. } => call_id.as_ref().map_or(0, Piece::size) + text.size(),
            KindSkeleton::Attachment | KindSkeleton::Other { .. } => 0,
        };
        std::mem::size_of::<Self>()
            + self.body.len()
            + self.fields.iter().map(|(key, _)| key.size() + ranges(1)).sum::<usize>()
            + self.top_system.iter().flatten().map(Piece::size).sum::<usize>()
            + self
                .messages
                .iter()
                .map(|m| {
                    std::mem::size_of::<MessageSkeleton>()
                        + m.fields.iter().map(|(key, _)| key.size() + ranges(1)).sum::<usize>()
                        + m.blocks.as_ref().map_or(0, |b| ranges(b.len()))
                })
                .sum::<usize>()
            + self.items.iter().map(|i| std::mem::size_of::<ItemSkeleton>() + kind(&i.kind)).sum::<usize>()
            + self.system.iter().map(Piece::size).sum::<usize>()
            + self.system_ends.len() * std::mem::size_of::<usize>()
            // The counts kept once the request has counted (set after the cache weighed it).
            + std::mem::size_of::<Counted>()
            + self.items.len() * 2 * std::mem::size_of::<u32>()
    }

    /// The bytes this skeleton holds (its body included, and the truncations and renders kept).
    pub fn size(&self) -> usize {
        self.size
            + self.cuts.get().map_or(0, Cuts::size)
            + self.rendered.get().map_or(0, |r| r.iter().map(|(_, r)| r.size()).sum())
            + self.markers.get().map_or(0, |m| m.len() * std::mem::size_of::<usize>())
    }
}

/// The tool outputs one request's truncation cut, by item, with the settings it cut them with.
#[derive(Debug)]
pub(super) struct Cuts {
    pub(super) encoding: Encoding,
    pub(super) max_tokens: u32,
    pub(super) cuts: Vec<Cut>,
}

impl Cuts {
    pub(super) fn size(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.cuts.iter().map(|cut| std::mem::size_of::<Cut>() + cut.text.len()).sum::<usize>()
    }
}

/// Token counts of a skeleton's items, two slots per item (the rewrite's countable texts, in
/// order), with the encoding they were counted in.
#[derive(Debug)]
pub(super) struct Counted {
    pub(super) encoding: Encoding,
    pub(super) slots: Vec<u32>,
}

/// The earlier skeleton a parse re-made its head from, and how much of it.
#[derive(Clone)]
pub(super) struct Reused {
    pub(super) skeleton: Arc<Skeleton>,
    pub(super) items: usize,
    pub(super) messages: usize,
    /// The leading bytes the two bodies share.
    pub(super) common: usize,
}
