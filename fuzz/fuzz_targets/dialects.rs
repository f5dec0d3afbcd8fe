//! Parse → rewrite → render → parse, in each dialect: whatever the bytes, compactor never panics;
//! a body it rewrites is valid JSON of the same dialect, its tool pairs are whole (repair finds
//! nothing left to do), and rewriting it again changes nothing. When repair moved or answered a
//! result, the result it wrote is no item the policies saw, so the next request may still shorten
//! it: then the repaired output rewritten once must be what a further rewrite leaves alone.
//!
//! Each input is rewritten under one of the histories the proxy meets (chosen by the input's
//! length, so a crash replays alike): no cache, a warm one over half the history (pruning held
//! back unless it pays), the same under window pressure, and a cold one; and through the prefix
//! cache as the proxy parses, with its memos (earlier cuts, rendered messages) in use, which must
//! give the very bytes and report a fresh parse gives.
#![no_main]

use std::collections::BTreeSet;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use compactor::config::Config;
use compactor::dialect::prefix::{Earlier, PrefixCache, PrefixKey};
use compactor::dialect::{Dialect, ParsedRequest};
use compactor::rewrite::{CachePricing, History, Rewriter, Rewritten, repair};
use compactor::tokens::{ModelTable, TokenCounter};
use libfuzzer_sys::fuzz_target;

/// Small windows, so the policies act on small inputs too.
static REWRITER: LazyLock<Rewriter> = LazyLock::new(|| {
    let mut settings = Config::default().rewrite_settings();
    settings.prune.protect_tokens = 40;
    settings.prune.minimum_tokens = 10;
    settings.tool_output_max_tokens = 60;
    settings.blocking_tokenize_bytes = usize::MAX;
    Rewriter::new(settings, TokenCounter::new(32 << 20), ModelTable::default())
});

/// The history of the `kind`th sort for a conversation of `messages` messages.
fn history(kind: usize, pruned_before: &BTreeSet<String>, messages: usize) -> History<'_> {
    let warm = History {
        pruned_before,
        seen_messages: messages / 2,
        pricing: CachePricing::ANTHROPIC,
        later_turns: 12,
        idle: Some(Duration::from_secs(5)),
        pressure: false,
    };
    match kind % 4 {
        0 => History::eager(pruned_before),
        1 => warm,
        2 => History { pressure: true, ..warm },
        _ => History { idle: Some(Duration::from_secs(3_600)), pricing: CachePricing::OPENAI, ..warm },
    }
}

/// Rewrites `body` fresh, and through a prefix cache twice (the second parse re-made from the
/// first's skeleton, with the first's memos); all three must agree. The fresh rewrite.
fn rewrite(dialect: Dialect, cache: &PrefixCache, body: &[u8], history: &History) -> Option<Rewritten> {
    let fresh = REWRITER.rewrite_body_in(dialect, body, history)?;
    let key = PrefixKey::new(dialect, [b"fuzz".as_slice()]);
    let bytes = Bytes::copy_from_slice(body);
    for turn in ["first", "again"] {
        let earlier = Earlier::default();
        let (parsed, _) = cache.parse(|| key, dialect, &bytes, &earlier);
        let mut parsed = parsed.expect("a body a fresh parse takes parses through the cache");
        let cached = REWRITER.rewrite_parsed(&mut parsed, history);
        assert_eq!(cached.body, fresh.body, "{dialect:?}: the prefix cache ({turn} parse) changed the bytes");
        assert_eq!(cached.report, fresh.report, "{dialect:?}: the prefix cache ({turn} parse) changed the report");
    }
    Some(fresh)
}

/// The call ids pruned so far, and those `rewritten` pruned.
fn with_pruned(before: &BTreeSet<String>, rewritten: &Rewritten) -> BTreeSet<String> {
    before.iter().chain(&rewritten.report.pruned_call_ids).cloned().collect()
}

fuzz_target!(|body: &[u8]| {
    let kind = body.len();
    for dialect in [Dialect::ChatCompletions, Dialect::AnthropicMessages, Dialect::Responses, Dialect::Gemini] {
        let Some(messages) = ParsedRequest::parse(dialect, body).map(|parsed| parsed.messages.len()) else { continue };
        // One cache per input and dialect: the rewritten body below is parsed reusing the head it
        // shares with the client's.
        let cache = PrefixCache::new(64 << 20);
        let none = BTreeSet::new();
        let first = rewrite(dialect, &cache, body, &history(kind, &none, messages)).expect("it parsed");
        let Some(rewritten) = first.body.as_deref() else { continue };
        assert!(serde_json::from_slice::<serde_json::Value>(rewritten).is_ok(), "{dialect:?}: not JSON");
        let mut parsed = ParsedRequest::parse(dialect, rewritten).expect("a rewritten body parses in its dialect");
        assert_eq!(repair::apply(&mut parsed.conversation), 0, "{dialect:?}: a tool pair left broken");
        // The next request carries the session's state: the call ids pruned once are pruned
        // again (another question than whether one rewrite is complete).
        let pruned = with_pruned(&none, &first);
        let again = rewrite(dialect, &cache, rewritten, &history(kind, &pruned, messages)).expect("parses");
        let pruned = with_pruned(&pruned, &again);
        let settled = match again.body {
            None => continue,
            // Repair wrote a result the policies did not see: they may shorten it now, once.
            Some(second) if first.report.repaired > 0 => second,
            Some(second) => panic!(
                "{dialect:?}: a second rewrite changed the body\n{}\n---\n{}",
                String::from_utf8_lossy(rewritten),
                String::from_utf8_lossy(&second)
            ),
        };
        let third = rewrite(dialect, &cache, &settled, &history(kind, &pruned, messages)).expect("parses");
        if let Some(third) = third.body {
            assert_eq!(
                String::from_utf8_lossy(&third),
                String::from_utf8_lossy(&settled),
                "{dialect:?}: the repaired output, rewritten once, changed again"
            );
        }
    }
});
