//! Prefix reuse across turns: an agent resends its whole conversation every turn, and everything
//! but the last few messages is byte for byte what compactor parsed one turn ago. A [`Skeleton`]
//! remembers where the last parse found each thing (as byte ranges of its body); when the next
//! body starts with the same bytes, the messages inside that common prefix are re-made from the
//! new body by slicing it at the same offsets, and only the rest is read. Nothing of the old body
//! is trusted beyond the bytes compared: the result is the parse of the new body, the same as a
//! fresh one (`tests/library/prefix_reuse.rs` proves it).
//!
//! Skeletons live in process memory only, in a cache bounded in bytes
//! (`limits.prefix_cache_bytes`), under a key of the client's credential and session header: a
//! collision or a stale entry only costs the reuse, never the result.

use std::borrow::Cow;
use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::{Arc, LazyLock, OnceLock};

use bytes::Bytes;

use super::breakpoints::Marker;
use super::{Dialect, Layout, Message, ParsedRequest};
use crate::conversation::Cut;
use crate::conversation::{Edit, Item, Kind, Role};
use crate::json;
use crate::tokens::Encoding;

/// Earlier bodies kept per key: parallel conversations of one client (subagents) under the same
/// credential each keep theirs.
const CANDIDATES: usize = 4;

/// A text of the earlier parse: where it lay in the body, or its own text when it was not a slice
/// of the body (an unescaped string, a constant), shared by the skeletons of later turns and
/// lent to their parses.
#[derive(Debug, Clone)]
enum Piece {
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
    fn make<'a>(&'a self, text: &'a str) -> Option<Cow<'a, str>> {
        match self {
            Self::At(span) => text.get(span.clone()).map(Cow::Borrowed),
            Self::Owned(owned) => Some(Cow::Borrowed(owned)),
        }
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + if let Self::Owned(text) = self { text.len() } else { 0 }
    }
}

fn make_opt<'a>(piece: &'a Option<Piece>, text: &'a str) -> Option<Option<Cow<'a, str>>> {
    match piece {
        Some(piece) => Some(Some(piece.make(text)?)),
        None => Some(None),
    }
}

/// [`Kind`] with its texts as pieces.
#[derive(Debug, Clone)]
enum KindSkeleton {
    System { text: Piece },
    Text { role: Role, text: Piece },
    ToolCall { id: Option<Piece>, name: Piece, arguments: Piece },
    ToolResult { call_id: Option<Piece>, text: Piece, attachments: u32 },
    Attachment,
    Thinking { text: Piece },
    Other { raw: Range<usize> },
}

#[derive(Debug, Clone)]
struct ItemSkeleton {
    message: usize,
    block: Option<usize>,
    kind: KindSkeleton,
    tokens: u32,
    edit: Edit,
    repairable: bool,
    shortenable: bool,
}

#[derive(Debug, Clone)]
struct MessageSkeleton {
    raw: Range<usize>,
    fields: Vec<(Piece, Range<usize>)>,
    role: Role,
    blocks: Option<Vec<Range<usize>>>,
}

/// Where one parse found everything, by byte range of its body (kept, refcounted).
#[derive(Debug)]
pub struct Skeleton {
    dialect: Dialect,
    body: Bytes,
    /// Top-level fields before the history.
    fields: Vec<(Piece, Range<usize>)>,
    history_key: Piece,
    history_start: usize,
    /// The top-level system texts, when their field comes before the history.
    top_system: Option<Vec<Piece>>,
    messages: Vec<MessageSkeleton>,
    items: Vec<ItemSkeleton>,
    /// The in-message system texts.
    system: Vec<Piece>,
    system_ends: Vec<usize>,
    /// Where the first message ends: bodies that agree up to here are one conversation.
    opening: usize,
    /// Bytes held, for the cache's bound.
    size: usize,
    /// The token counts of its items' texts, once the request that made it has counted them: a
    /// later turn re-making these items takes their counts from here instead of hashing and
    /// looking up every text again.
    counts: OnceLock<Counted>,
    /// The tool outputs its request's truncation cut, kept for the next turn the same way.
    cuts: OnceLock<Cuts>,
    /// Its request's changed messages as rendered, kept for the next turn the same way.
    rendered: OnceLock<Vec<RenderedAt>>,
    /// Where its body holds a cache marker key, once a request has looked (see [`Memo::markers`]).
    markers: OnceLock<Vec<usize>>,
}

/// The tool outputs one request's truncation cut, by item, with the settings it cut them with.
#[derive(Debug)]
struct Cuts {
    encoding: Encoding,
    max_tokens: u32,
    cuts: Vec<Cut>,
}

impl Cuts {
    fn size(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.cuts.iter().map(|cut| std::mem::size_of::<Cut>() + cut.text.len()).sum::<usize>()
    }
}

/// A rendered message and its index.
type RenderedAt = (usize, Arc<Rendered>);

/// One changed message as rendered, with what decided it: its items' edits and compactor's cache
/// marker on it. The same message of a later turn (the same bytes, re-made) with the same edits
/// and marker renders to the same text.
#[derive(Debug)]
pub(crate) struct Rendered {
    edits: Box<[Edit]>,
    marker: Option<Marker>,
    /// `None`: nothing is left of the message.
    text: Option<Box<str>>,
    /// Whether a replacement in it could not be written (see [`ParsedRequest::unapplied`]).
    unapplied: bool,
}

impl Rendered {
    fn size(&self) -> usize {
        let edit = |edit: &Edit| match edit {
            Edit::Replace(text) => text.len(),
            Edit::Keep | Edit::Remove => 0,
        };
        std::mem::size_of::<RenderedAt>()
            + std::mem::size_of::<Self>()
            + self.edits.iter().map(|e| std::mem::size_of::<Edit>() + edit(e)).sum::<usize>()
            + self.marker.as_ref().map_or(0, |m| m.json.len())
            + self.text.as_ref().map_or(0, |t| t.len())
    }

    fn decided_by(&self, items: &[Item], marker: Option<&Marker>) -> bool {
        self.marker.as_ref() == marker && self.edits.iter().eq(items.iter().map(|i| &i.edit))
    }
}

/// Token counts of a skeleton's items, two slots per item (the rewrite's countable texts, in
/// order), with the encoding they were counted in.
#[derive(Debug)]
struct Counted {
    encoding: Encoding,
    slots: Vec<u32>,
}

/// What a parse through the cache carries across turns: the token counts, truncations and
/// rendered messages of what it re-made from an earlier turn, and its own skeleton, which keeps
/// this turn's for the next one. Everything taken from an earlier turn is what this turn would
/// work out again from the same bytes with the same decisions. Shown as nothing in `Debug`: a
/// reusing parse and a fresh one are the same parse.
#[derive(Default, Clone)]
pub struct Memo {
    earlier: Option<Reused>,
    own: Option<Arc<Skeleton>>,
    /// Where the own skeleton is kept, to weigh it again once the rewrite has added to it.
    kept: Option<Kept>,
}

/// The earlier skeleton a parse re-made its head from, and how much of it.
#[derive(Clone)]
struct Reused {
    skeleton: Arc<Skeleton>,
    items: usize,
    messages: usize,
    /// The leading bytes the two bodies share.
    common: usize,
}

/// A cache entry holding a parse's own skeleton.
#[derive(Clone)]
struct Kept {
    cache: moka::sync::Cache<PrefixKey, Arc<[Arc<Skeleton>]>>,
    key: PrefixKey,
    candidates: Arc<[Arc<Skeleton>]>,
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

impl Memo {
    /// The leading bytes of the body re-made from an earlier turn's parse (0 for a full parse).
    pub fn reused_bytes(&self) -> usize {
        self.earlier.as_ref().map_or(0, |reused| reused.common)
    }

    /// The counts, slot by slot, of the leading items re-made from an earlier turn counted in
    /// `encoding` (empty when there are none).
    pub fn known(&self, encoding: Encoding) -> &[u32] {
        match &self.earlier {
            Some(Reused { skeleton, items, .. }) => match skeleton.counts.get() {
                Some(counted) if counted.encoding == encoding => counted.slots.get(..items * 2).unwrap_or(&[]),
                _ => &[],
            },
            None => &[],
        }
    }

    /// The cut an earlier turn's truncation made of item `item` (one re-made from it), when it
    /// cut with the same settings: the same text cut the same way.
    pub fn earlier_cut(&self, encoding: Encoding, max_tokens: u32, item: usize) -> Option<&Cut> {
        let earlier = self.earlier.as_ref().filter(|e| item < e.items)?;
        let cuts = earlier.skeleton.cuts.get().filter(|c| c.encoding == encoding && c.max_tokens == max_tokens)?;
        let at = cuts.cuts.binary_search_by_key(&item, |cut| cut.item).ok()?;
        Some(&cuts.cuts[at])
    }

    /// Keeps this parse's truncations (`cuts`, in item order) for the next turn.
    pub fn remember_cuts(&self, encoding: Encoding, max_tokens: u32, cuts: Vec<Cut>) {
        if let Some(own) = &self.own {
            let _ = own.cuts.set(Cuts { encoding, max_tokens, cuts });
        }
    }

    /// The byte offsets in `body` (this parse's) of every cache marker key (`key_len` bytes long,
    /// found by `find` from an offset on), in order: those inside the bytes shared with the
    /// earlier turn are that turn's, only the rest is searched. Kept for the next turn.
    pub(crate) fn markers(
        &self,
        body: &[u8],
        find: impl Fn(&[u8], usize) -> Vec<usize>,
        key_len: usize,
    ) -> Cow<'_, [usize]> {
        if let Some(own) = self.own.as_ref().and_then(|own| own.markers.get()) {
            return Cow::Borrowed(own);
        }
        let earlier = self.earlier.as_ref().and_then(|e| Some((e.skeleton.markers.get()?, e.common)));
        let markers = match earlier {
            Some((earlier, common)) => {
                // A key starting here ends inside the shared bytes.
                let from = (common + 1).saturating_sub(key_len);
                let mut markers: Vec<usize> = earlier.iter().copied().take_while(|&at| at < from).collect();
                markers.extend(find(body, from));
                markers
            }
            None => find(body, 0),
        };
        match &self.own {
            Some(own) => Cow::Borrowed(own.markers.get_or_init(|| markers)),
            None => Cow::Owned(markers),
        }
    }

    /// A book of this turn's rendered messages, taking those an earlier turn rendered the same way.
    pub(crate) fn renders<'r>(&'r self, unapplied: &'r super::Unapplied) -> Renders<'r> {
        let earlier = self.earlier.as_ref().and_then(|e| Some((e.skeleton.rendered.get()?.as_slice(), e.messages)));
        Renders { earlier, own: self.own.as_ref(), kept: Vec::new(), unapplied }
    }

    /// Weighs the own skeleton again in the cache, with what the rewrite added to it (kept
    /// truncations, renders and marker offsets), unless a later request has replaced it there
    /// already.
    pub fn settle(&self) {
        let Some(kept) = &self.kept else { return };
        if self
            .own
            .as_ref()
            .is_none_or(|own| own.cuts.get().is_none() && own.rendered.get().is_none() && own.markers.get().is_none())
        {
            return;
        }
        kept.cache.entry(kept.key).and_compute_with(|entry| match entry {
            Some(entry) if Arc::ptr_eq(entry.value(), &kept.candidates) => {
                moka::ops::compute::Op::Put(kept.candidates.clone())
            }
            _ => moka::ops::compute::Op::Nop,
        });
    }

    /// The skeleton of this parse, kept in the cache for the next turn (benchmarks start a warm
    /// turn from it).
    pub fn own(&self) -> Option<&Arc<Skeleton>> {
        self.own.as_ref()
    }

    /// Keeps this parse's item counts (`slots`, two per item, before any policy ran) for the
    /// next turn.
    pub fn remember(&self, encoding: Encoding, slots: &[u32]) {
        if let Some(own) = &self.own
            && slots.len() == own.items.len() * 2
        {
            let _ = own.counts.set(Counted { encoding, slots: slots.to_vec() });
        }
    }
}

/// The changed messages of one render, each rendered once: a message re-made from an earlier
/// turn with the same edits and marker takes the earlier turn's text, and the own skeleton keeps
/// this turn's for the next (see [`Memo`]).
pub(crate) struct Renders<'m> {
    earlier: Option<(&'m [RenderedAt], usize)>,
    own: Option<&'m Arc<Skeleton>>,
    kept: Vec<RenderedAt>,
    /// The parse's record of messages whose replacement could not be written.
    unapplied: &'m super::Unapplied,
}

impl<'m> Renders<'m> {
    /// Changed message `index` (its items `items`, compactor's marker on it `marker`) as rendered
    /// by `render` (`None`: nothing is left of it).
    pub(crate) fn message(
        &mut self,
        index: usize,
        items: &[Item],
        marker: Option<&Marker>,
        render: impl FnOnce() -> Option<String>,
    ) -> Option<Cow<'_, str>> {
        if let Some((earlier, messages)) = self.earlier
            && index < messages
            && let Ok(at) = earlier.binary_search_by_key(&index, |(i, _)| *i)
            && earlier[at].1.decided_by(items, marker)
        {
            let rendered: &'m Arc<Rendered> = &earlier[at].1;
            if rendered.unapplied {
                self.unapplied.push(index);
            }
            if self.own.is_some() {
                self.kept.push((index, rendered.clone()));
            }
            return rendered.text.as_deref().map(Cow::Borrowed);
        }
        let recorded = self.unapplied.len();
        let text = render();
        let unapplied = self.unapplied.len() > recorded;
        if self.own.is_none() {
            return text.map(Cow::Owned);
        }
        let rendered = Arc::new(Rendered {
            edits: items.iter().map(|i| i.edit.clone()).collect(),
            marker: marker.cloned(),
            text: text.map(String::into_boxed_str),
            unapplied,
        });
        self.kept.push((index, rendered));
        self.kept.last().and_then(|(_, rendered)| rendered.text.as_deref()).map(Cow::Borrowed)
    }

    /// Keeps this render's messages in the own skeleton for the next turn.
    pub(crate) fn keep(self) {
        if let Some(own) = self.own {
            let _ = own.rendered.set(self.kept);
        }
    }
}

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
            .chain(parsed.messages.get(earlier_messages.len()..)?.iter().map(|message| {
                Some(MessageSkeleton {
                    raw: span(message.raw)?,
                    fields: message
                        .object
                        .fields
                        .iter()
                        .map(|(key, value)| Some((piece(key), span(value)?)))
                        .collect::<Option<_>>()?,
                    role: message.role,
                    blocks: match &message.blocks {
                        Some(blocks) => Some(blocks.iter().map(|b| span(b)).collect::<Option<_>>()?),
                        None => None,
                    },
                })
            }))
            .collect::<Option<_>>()?;
        let items: Vec<ItemSkeleton> = earlier_items
            .iter()
            .cloned()
            .map(Some)
            .chain(parsed.conversation.items.get(earlier_items.len()..)?.iter().map(|item| {
                let kind = match &item.kind {
                    Kind::System { text } => KindSkeleton::System { text: piece(text) },
                    Kind::Text { role, text } => KindSkeleton::Text { role: *role, text: piece(text) },
                    Kind::ToolCall { id, name, arguments } => KindSkeleton::ToolCall {
                        id: id.as_ref().map(piece),
                        name: piece(name),
                        arguments: piece(arguments),
                    },
                    Kind::ToolResult { call_id, text, attachments } => KindSkeleton::ToolResult {
                        call_id: call_id.as_ref().map(piece),
                        text: piece(text),
                        attachments: *attachments,
                    },
                    Kind::Attachment => KindSkeleton::Attachment,
                    Kind::Thinking { text } => KindSkeleton::Thinking { text: piece(text) },
                    Kind::Other { raw } => KindSkeleton::Other { raw: span(raw)? },
                };
                Some(ItemSkeleton {
                    message: item.message,
                    block: item.block,
                    kind,
                    tokens: item.tokens,
                    edit: item.edit.clone(),
                    repairable: item.repairable,
                    shortenable: item.shortenable,
                })
            }))
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

    /// How many leading bytes `body` shares with this skeleton's body.
    fn common_prefix(&self, body: &[u8]) -> usize {
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
        let messages = self.messages[..reused]
            .iter()
            .map(|m| {
                Some(Message {
                    raw: slice(&m.raw)?,
                    object: json::RawObject {
                        fields: m
                            .fields
                            .iter()
                            .map(|(key, value)| Some((key.make(text)?, slice(value)?)))
                            .collect::<Option<_>>()?,
                    },
                    role: m.role,
                    blocks: match &m.blocks {
                        Some(blocks) => Some(blocks.iter().map(slice).collect::<Option<_>>()?),
                        None => None,
                    },
                })
            })
            .collect::<Option<_>>()?;
        let item_count = self.items.partition_point(|i| i.message < reused);
        let items = self.items[..item_count]
            .iter()
            .map(|i| {
                let kind = match &i.kind {
                    KindSkeleton::System { text: t } => Kind::System { text: t.make(text)? },
                    KindSkeleton::Text { role, text: t } => Kind::Text { role: *role, text: t.make(text)? },
                    KindSkeleton::ToolCall { id, name, arguments } => Kind::ToolCall {
                        id: make_opt(id, text)?,
                        name: name.make(text)?,
                        arguments: arguments.make(text)?,
                    },
                    KindSkeleton::ToolResult { call_id, text: t, attachments } => Kind::ToolResult {
                        call_id: make_opt(call_id, text)?,
                        text: t.make(text)?,
                        attachments: *attachments,
                    },
                    KindSkeleton::Attachment => Kind::Attachment,
                    KindSkeleton::Thinking { text: t } => Kind::Thinking { text: t.make(text)? },
                    KindSkeleton::Other { raw } => Kind::Other { raw: slice(raw)? },
                };
                Some(Item {
                    message: i.message,
                    block: i.block,
                    kind,
                    tokens: i.tokens,
                    edit: i.edit.clone(),
                    repairable: i.repairable,
                    shortenable: i.shortenable,
                })
            })
            .collect::<Option<_>>()?;
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
    fn same_opening(&self, other: &Skeleton) -> bool {
        self.opening == other.opening && self.body.get(..self.opening) == other.body.get(..other.opening)
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

/// What a parse through the cache did, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Messages of an earlier turn were re-made.
    Hit,
    /// Nothing earlier matched: a full parse.
    Miss,
    /// The cache is off.
    Off,
}

impl Reuse {
    pub fn label(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Off => "off",
        }
    }
}

/// The key skeletons are kept under: the dialect and whatever the request carries that stays the
/// same across a conversation's turns (credential, session header), hashed with this process's
/// secret ([`KEY_SECRET`]). A fixed hash would let a client craft keys that collide with other
/// tenants' and evict their entries; without the secret no key can be aimed at another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrefixKey(u128);

/// The size of an xxh3 secret (the crate's own constant is not public).
const XXH3_SECRET_SIZE: usize = 192;

/// The secret [`PrefixKey`]s are hashed with, drawn once per process: the keys live in this
/// process's memory only, so no other process needs to agree on them.
static KEY_SECRET: LazyLock<[u8; XXH3_SECRET_SIZE]> = LazyLock::new(|| {
    // std's RandomState is keyed from the OS's randomness once per thread: 128 random bits,
    // stretched into an xxh3 secret.
    let random = std::hash::RandomState::new();
    let mut seed = [0u8; 32];
    for (i, chunk) in seed.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&random.hash_one(i).to_le_bytes());
    }
    let mut secret = [0u8; XXH3_SECRET_SIZE];
    blake3::Hasher::new_keyed(&seed).update(b"compactor prefix key").finalize_xof().fill(&mut secret);
    secret
});

impl PrefixKey {
    pub fn new<'v>(dialect: Dialect, parts: impl IntoIterator<Item = &'v [u8]>) -> Self {
        let mut hasher = xxhash_rust::xxh3::Xxh3::with_secret(*KEY_SECRET);
        hasher.update(&[dialect as u8]);
        for part in parts {
            // Each part's length first, so no two splits of the same bytes hash alike.
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Self(hasher.digest128())
    }
}

/// The earlier turn a parse through the [`PrefixCache`] re-makes its head from, held by the
/// caller for as long as that parse lives.
#[derive(Debug, Default)]
pub struct Earlier(OnceLock<Arc<Skeleton>>);

/// The last parses, bounded in bytes (bodies included); `None` inside when turned off.
#[derive(Clone)]
pub struct PrefixCache {
    cache: Option<moka::sync::Cache<PrefixKey, Arc<[Arc<Skeleton>]>>>,
    /// Smaller bodies are parsed whole and not kept (`limits.prefix_min_bytes`).
    min_bytes: usize,
    /// The heaviest parse kept: half the cache. A heavier one would push every other
    /// conversation out, and moka evicts an entry over its whole bound only at its next
    /// maintenance, so until then the bound did not hold (a 30 MiB body of a million one-letter
    /// messages kept ~430 MiB).
    max_entry: usize,
}

impl PrefixCache {
    /// A cache holding at most `max_bytes`; 0 turns reuse off.
    pub fn new(max_bytes: u64) -> Self {
        let cache = (max_bytes > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, candidates: &Arc<[Arc<Skeleton>]>| {
                    let bytes: usize = candidates.iter().map(|c| c.size()).sum();
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .build()
        });
        Self { cache, min_bytes: 0, max_entry: usize::try_from(max_bytes / 2).unwrap_or(usize::MAX) }
    }

    /// Whether the skeleton of `parsed` (of a body of `body_bytes`) is light enough to keep: its
    /// weight estimated from what it will hold per message and item, before it is built.
    fn keeps(&self, parsed: &ParsedRequest, body_bytes: usize) -> bool {
        let per_item = std::mem::size_of::<ItemSkeleton>() + 2 * std::mem::size_of::<u32>();
        let estimate = body_bytes
            + parsed.messages.len() * std::mem::size_of::<MessageSkeleton>()
            + parsed.conversation.items.len() * per_item;
        estimate <= self.max_entry
    }

    /// The same cache, for bodies of `min_bytes` and more only: a small body parses faster than
    /// the cache's lookup and insert.
    pub fn for_bodies_from(mut self, min_bytes: usize) -> Self {
        self.min_bytes = min_bytes;
        self
    }

    /// The weighted size (bodies and skeletons, what `limits.prefix_cache_bytes` bounds) and the
    /// keys held.
    pub fn size(&self) -> crate::tokens::CacheSize {
        match &self.cache {
            Some(cache) => {
                cache.run_pending_tasks();
                crate::tokens::CacheSize { bytes: cache.weighted_size(), entries: cache.entry_count() }
            }
            None => crate::tokens::CacheSize { bytes: 0, entries: 0 },
        }
    }

    /// Parses `body`, re-making the head it shares with an earlier body under `key` (worked out
    /// only for a body the cache takes), and keeps this parse for the next turn. The earlier
    /// turn is held in `earlier` (a fresh one per parse) for as long as the parse lives: texts
    /// it unescaped are lent from it, not copied.
    pub fn parse<'a>(
        &self,
        key: impl FnOnce() -> PrefixKey,
        dialect: Dialect,
        body: &'a Bytes,
        earlier: &'a Earlier,
    ) -> (Option<ParsedRequest<'a>>, Reuse) {
        let Some(cache) = self.cache.as_ref().filter(|_| body.len() >= self.min_bytes) else {
            return (ParsedRequest::parse(dialect, body), Reuse::Off);
        };
        let key = key();
        let candidates = cache.get(&key);
        let best = candidates
            .iter()
            .flat_map(|c| c.iter())
            .filter(|c| c.dialect == dialect)
            .map(|c| (c.common_prefix(body), c))
            .max_by_key(|(common, _)| *common);
        let earlier = best.and_then(|(_, best)| earlier.0.set(best.clone()).ok().and(earlier.0.get()));
        let (mut parsed, reused) = match earlier {
            Some(earlier) => parse_reusing(dialect, body, earlier),
            None => (ParsedRequest::parse(dialect, body), 0),
        };
        if let Some(parsed) = &mut parsed
            && self.keeps(parsed, body.len())
            && let Some(skeleton) = Skeleton::of(parsed, body.clone())
        {
            let skeleton = Arc::new(skeleton);
            parsed.memo.own = Some(skeleton.clone());
            // This conversation's earlier turn gives way; other conversations under the key stay.
            let kept: Arc<[Arc<Skeleton>]> = std::iter::once(skeleton.clone())
                .chain(candidates.iter().flat_map(|c| c.iter()).filter(|c| !c.same_opening(&skeleton)).cloned())
                .take(CANDIDATES)
                .collect();
            cache.insert(key, kept.clone());
            parsed.memo.kept = Some(Kept { cache: cache.clone(), key, candidates: kept });
        }
        (parsed, if reused > 0 { Reuse::Hit } else { Reuse::Miss })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[&[u8]]) -> PrefixKey {
        PrefixKey::new(Dialect::ChatCompletions, parts.iter().copied())
    }

    #[test]
    fn a_key_is_the_same_for_the_same_parts_and_tells_apart_every_split() {
        assert_eq!(key(&[b"sk-a", b"session"]), key(&[b"sk-a", b"session"]));
        assert_ne!(key(&[b"sk-a", b"session"]), key(&[b"sk-b", b"session"]));
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]));
        assert_ne!(key(&[b"sk-a"]), PrefixKey::new(Dialect::AnthropicMessages, [b"sk-a".as_slice()]));
    }

    #[test]
    fn a_key_is_not_what_a_hash_anyone_can_compute_gives() {
        // The hash of the same bytes with xxh3's published secret, and with SipHash's zero keys
        // (the key before): a client could compute either and aim collisions at other tenants.
        let parts: [&[u8]; 2] = [b"sk-a", b"session"];
        let mut public = xxhash_rust::xxh3::Xxh3::new();
        public.update(&[Dialect::ChatCompletions as u8]);
        for part in parts {
            public.update(&(part.len() as u64).to_le_bytes());
            public.update(part);
        }
        assert_ne!(key(&parts), PrefixKey(public.digest128()));
        let mut sip = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&(Dialect::ChatCompletions as u8), &mut sip);
        parts.iter().for_each(|part| std::hash::Hash::hash(part, &mut sip));
        assert_ne!(key(&parts).0 as u64, std::hash::Hasher::finish(&sip));
    }
}
