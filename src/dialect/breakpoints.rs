//! Anthropic cache breakpoints of compactor's own: the one place that decides where compactor adds
//! a `cache_control` marker. Chat Completions and Responses cache every prefix by themselves, so
//! this is for Anthropic Messages only, where the provider caches a prefix only at a marker (and
//! looks back at most 20 blocks from each for an earlier entry).
//!
//! - After a summary rebuild, the summary message carries a marker, so the stable part (tools,
//!   system, summary) is cached where it ends; the same bytes every turn.
//! - When a rewrite changes a message the provider has already seen (a prune batch), the last
//!   block before the first changed message gets a marker, so the untouched prefix is read from
//!   cache (an entry a few blocks back is found) instead of re-written.
//!
//! Never more than [`MAX_MARKERS`] in a request (Anthropic refuses more), never a client's marker
//! moved or dropped, and none added to a request that carries none: a client that sends no marker
//! has opted out of caching. compactor's marker takes the TTL of the next marker after it (an
//! hour-long entry must not follow a five-minute one).

use super::{Dialect, ParsedRequest};
use crate::conversation::Edit;
use crate::json::{self, RawObject};

/// Breakpoints Anthropic accepts in one request (tools, system and messages together).
pub const MAX_MARKERS: usize = 4;

/// A marker compactor adds: on block `block` of message `message` (`None`: the message's
/// string content, sent as one text block), with this JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub message: usize,
    pub block: Option<usize>,
    pub json: String,
}

/// The key every marker is found by.
const KEY: &str = "\"cache_control\"";

/// A SIMD searcher for [`KEY`], built once: markers are counted over whole bodies (800 KB for a
/// long agent conversation), where `str::matches` costs several instructions a byte.
fn finder() -> &'static memchr::memmem::Finder<'static> {
    static FINDER: std::sync::OnceLock<memchr::memmem::Finder<'static>> = std::sync::OnceLock::new();
    FINDER.get_or_init(|| memchr::memmem::Finder::new(KEY))
}

/// The markers in raw JSON: every `"cache_control"` key. A key of that name elsewhere (a tool's
/// schema, a tool call's input) is counted too, so compactor errs towards adding none.
pub fn count(raw: &str) -> usize {
    count_bytes(raw.as_bytes())
}

/// [`count`] over bytes: a whole body, read as JSON already (and so UTF-8), needs no second check.
fn count_bytes(raw: &[u8]) -> usize {
    finder().find_iter(raw).count()
}

/// The marker to put before the raw JSON `following`: ephemeral, with the TTL of the first marker
/// in `following`, if it has one.
fn marker_before<'r>(following: impl IntoIterator<Item = &'r str>) -> String {
    marker_with_ttl_of(following.into_iter().find_map(|raw| Some((raw, finder().find(raw.as_bytes())?))))
}

/// An ephemeral marker with the TTL of the marker whose key starts at `at` in `raw`, if any.
fn marker_with_ttl_of(found: Option<(&str, usize)>) -> String {
    let ttl = found.and_then(|(raw, at)| {
        let rest = raw.get(at + KEY.len()..)?.trim_start().strip_prefix(':')?;
        let value = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>().next()?.ok()?;
        Some(value.get("ttl").cloned())
    });
    match ttl.flatten() {
        Some(ttl) => format!(r#"{{"type":"ephemeral","ttl":{ttl}}}"#),
        None => r#"{"type":"ephemeral"}"#.to_string(),
    }
}

/// The offsets of every marker key in `body` from `from` on.
fn find_from(body: &[u8], from: usize) -> Vec<usize> {
    body.get(from..).map_or_else(Vec::new, |rest| finder().find_iter(rest).map(|at| from + at).collect())
}

/// The offset inside `raw` (a slice of `body`) of the first marker key that lies wholly in it,
/// found among the `markers` of `body`.
fn first_in(body: &[u8], markers: &[usize], raw: &str) -> Option<usize> {
    let span = json::span_in(body, raw)?;
    let at = markers[markers.partition_point(|&at| at < span.start)..].first().copied()?;
    (at + KEY.len() <= span.end).then(|| at - span.start)
}

/// The summary message of a rebuilt Anthropic conversation: one text block with a marker of
/// compactor's own when the rest of the request carries between 1 and 3 (`elsewhere`), a plain
/// string otherwise. `after`: the messages that follow it.
pub fn summary_message<'r>(text: &str, elsewhere: usize, after: impl IntoIterator<Item = &'r str>) -> String {
    if elsewhere == 0 || elsewhere >= MAX_MARKERS {
        return format!(r#"{{"role":"user","content":{}}}"#, json::json_string(text));
    }
    format!(
        r#"{{"role":"user","content":[{{"type":"text","text":{},"cache_control":{}}}]}}"#,
        json::json_string(text),
        marker_before(after)
    )
}

/// Markers in `body` outside its `messages` (tools, system).
pub fn outside_messages(parsed: &ParsedRequest) -> usize {
    let whole = count_bytes(parsed.body);
    let messages = parsed.top.get("messages").map_or(0, count);
    whole.saturating_sub(messages)
}

/// Whether a block may carry a marker: the types Anthropic accepts one on (never thinking, never
/// an empty text).
fn markable(block: &str) -> bool {
    let Some(object) = RawObject::parse(block) else { return false };
    match object.str("type").as_deref() {
        Some("text") => object.str("text").is_some_and(|t| !t.is_empty()),
        Some("image" | "document" | "search_result" | "tool_use" | "tool_result") => true,
        _ => false,
    }
}

/// Decides compactor's marker for a rewritten Anthropic request, before it is rendered: when the
/// first changed message is one the provider has seen (`seen_messages`), the request carries
/// 1 to 3 markers, and the last markable block before that message has none.
pub fn place(parsed: &mut ParsedRequest, seen_messages: usize) {
    parsed.marker = None;
    if parsed.dialect != Dialect::AnthropicMessages {
        return;
    }
    let conversation = &parsed.conversation;
    let edited = conversation.items.iter().filter(|i| i.edit != Edit::Keep).map(|i| i.message);
    let inserted = conversation.inserts.iter().map(|i| conversation.items[i.call_item].message + 1);
    let Some(first) = edited.chain(inserted).min() else { return };
    if first == 0 || first >= seen_messages {
        return;
    }
    // Every marker key of the body, found once (and on the next turn, only in what it added).
    let markers = parsed.memo.markers(parsed.body, find_from, KEY.len());
    let present = markers.len();
    if present == 0 || present >= MAX_MARKERS {
        return;
    }
    let first_in = |raw: &str| first_in(parsed.body, &markers, raw);
    let marker_before = |mut following: &mut dyn Iterator<Item = &str>| {
        marker_with_ttl_of((&mut following).find_map(|raw| Some((raw, first_in(raw)?))))
    };
    // The search reads the parse while `markers` may borrow its memo: the marker is set after.
    let search = || {
        for index in (0..first).rev() {
            let message = &parsed.messages[index];
            let later = || parsed.messages[index + 1..].iter().map(|m| m.raw);
            match &message.blocks {
                None => {
                    let Some(content) = message.object.get("content") else { continue };
                    if json::as_str(content).is_none_or(|t| t.is_empty()) {
                        continue;
                    }
                    let json = marker_before(&mut later());
                    return Some(Marker { message: index, block: None, json });
                }
                Some(blocks) => {
                    for (b, block) in blocks.iter().enumerate().rev() {
                        if first_in(block).is_some() {
                            // The prefix is marked there already.
                            return None;
                        }
                        if markable(block) {
                            let json = marker_before(&mut blocks[b + 1..].iter().copied().chain(later()));
                            return Some(Marker { message: index, block: Some(b), json });
                        }
                    }
                }
            }
        }
        None
    };
    let found = search();
    drop(markers);
    parsed.marker = found;
}

/// `block` (a JSON object) with `marker` added as its `cache_control`.
pub fn with_marker(mut block: String, marker: &Marker) -> String {
    if block.ends_with('}') {
        block.pop();
        block.push_str(r#","cache_control":"#);
        block.push_str(&marker.json);
        block.push('}');
    }
    block
}
