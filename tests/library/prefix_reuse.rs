//! Prefix reuse across turns gives exactly what a fresh parse gives: for generated conversations
//! in every dialect, an earlier turn (a prefix of the messages, or an edited, re-spaced or
//! otherwise different body) is parsed and kept as a skeleton, the next turn is parsed reusing it,
//! and the parse, the rewritten bytes and the report all equal those of a fresh parse.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use compactor::dialect::prefix::{self, Earlier, PrefixCache, PrefixKey, Reuse, Skeleton};
use compactor::dialect::{Dialect, ParsedRequest};
use compactor::rewrite::{CachePricing, History, Rewriter};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use crate::rewrite_properties::{Turn, anthropic_body, chat_body, gemini_body, responses_body, rewriter, turn};

/// How the next turn's body differs from the earlier one, besides the messages added.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// Only messages appended.
    Appended,
    /// One earlier message edited.
    EditedHistory(usize),
    /// The system prompt changed.
    ChangedSystem,
    /// The tool definitions (after the messages) changed.
    ChangedToolsAfter,
    /// Both bodies pretty-printed: whitespace everywhere the scanner reads.
    Pretty,
    /// The earlier body compact, the next one pretty-printed.
    Respaced,
    /// The next body cut short (not JSON).
    Truncated(usize),
    /// The next body repeats a top-level key after the history.
    DuplicateKeyAfter,
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => Just(Change::Appended),
        2 => (0usize..100).prop_map(Change::EditedHistory),
        1 => Just(Change::ChangedSystem),
        1 => Just(Change::ChangedToolsAfter),
        2 => Just(Change::Pretty),
        1 => Just(Change::Respaced),
        1 => (0usize..10_000).prop_map(Change::Truncated),
        1 => Just(Change::DuplicateKeyAfter),
    ]
}

/// A body of `dialect` with a system prompt before the history and tools after it.
fn body(dialect: Dialect, turns: &[Turn], system: &str, tools: usize) -> Value {
    let generated = match dialect {
        Dialect::ChatCompletions => chat_body(turns),
        Dialect::AnthropicMessages => anthropic_body(turns),
        Dialect::Responses => responses_body(turns),
        Dialect::Gemini => gemini_body(turns),
    };
    let Value::Object(generated) = generated else { unreachable!() };
    let mut out = Map::new();
    for (key, value) in generated {
        if key == dialect.history_field() && dialect == Dialect::AnthropicMessages {
            out.insert(
                "system".into(),
                json!([{"type": "text", "text": "billing"}, {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]),
            );
        }
        match key.as_str() {
            "instructions" => out.insert(key, json!(system)),
            "systemInstruction" => out.insert(key, json!({"parts": [{"text": system}]})),
            "messages" if dialect == Dialect::ChatCompletions => {
                let mut messages = value;
                messages[0]["content"] = json!(system);
                out.insert(key, messages)
            }
            _ => out.insert(key, value),
        };
    }
    let tools: Vec<Value> =
        (0..tools).map(|i| json!({"name": format!("tool_{i}"), "description": "runs\nit"})).collect();
    out.insert("tools".into(), json!(tools));
    Value::Object(out)
}

/// Puts `marker` on the last block of Anthropic message `index`, when its content is blocks.
fn mark(body: &mut Value, index: usize, marker: Value) {
    if let Some(Value::Array(blocks)) = body["messages"].get_mut(index).map(|m| &mut m["content"])
        && let Some(Value::Object(block)) = blocks.last_mut()
        && block.get("type") != Some(&json!("thinking"))
    {
        block.insert("cache_control".into(), marker);
    }
}

fn message_count(dialect: Dialect, bytes: &[u8]) -> usize {
    ParsedRequest::parse(dialect, bytes).map_or(0, |p| p.messages.len())
}

/// The earlier body, the next body, and how many messages the reuse must re-make (when known).
fn turns_of(dialect: Dialect, turns: &[Turn], cut: usize, change: Change) -> (Vec<u8>, Vec<u8>, Option<usize>) {
    let cut = cut % (turns.len() + 1);
    let old = body(dialect, &turns[..cut], "sys", 2);
    let mut next_turns = turns.to_vec();
    let (mut system, mut tools) = ("sys", 2);
    match change {
        Change::EditedHistory(at) if cut > 0 => next_turns[at % cut] = Turn::User("edited".into()),
        Change::ChangedSystem => system = "sys changed",
        Change::ChangedToolsAfter => tools = 3,
        _ => {}
    }
    let mut new = body(dialect, &next_turns, system, tools);
    let mut old = old;
    if dialect == Dialect::AnthropicMessages {
        // Cache markers in the history, as Claude Code sends them: one on an early message that
        // stays, and one on the newest message (an hour-long one, which a marker compactor adds
        // before it must take).
        mark(&mut old, 1, json!({"type": "ephemeral"}));
        mark(&mut new, 1, json!({"type": "ephemeral"}));
        if next_turns.len() > cut {
            let last = new["messages"].as_array().map_or(0, Vec::len).saturating_sub(1);
            mark(&mut new, last, json!({"type": "ephemeral", "ttl": "1h"}));
        }
    }
    if let Change::DuplicateKeyAfter = change {
        new.as_object_mut().unwrap().insert("tools".into(), json!(null));
    }
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).unwrap();
    let compact = |v: &Value| serde_json::to_vec(v).unwrap();
    let (old, mut new) = match change {
        Change::Pretty => (pretty(&old), pretty(&new)),
        Change::Respaced => (compact(&old), pretty(&new)),
        _ => (compact(&old), compact(&new)),
    };
    if let Change::DuplicateKeyAfter = change {
        // serde_json's map has one "tools": repeat a key by hand.
        let close = new.iter().rposition(|b| *b == b'}').unwrap();
        new.splice(close..close, br#","model":"again""#.iter().copied());
    }
    if let Change::Truncated(at) = change {
        new.truncate(at % new.len());
    }
    let reused = match change {
        Change::Appended | Change::ChangedToolsAfter | Change::Pretty => Some(message_count(dialect, &old)),
        _ => None,
    };
    (old, new, reused)
}

/// Parses `new` reusing the skeleton of `old`, and checks it against a fresh parse of `new`:
/// the same structures, then the same rewritten bytes and report.
fn check(dialect: Dialect, old: &[u8], new: &[u8], expect_reused: Option<usize>) {
    let old = Bytes::copy_from_slice(old);
    let earlier = ParsedRequest::parse(dialect, &old).expect("the earlier turn parses");
    let skeleton = Arc::new(Skeleton::of(&earlier, old.clone()).expect("a fresh parse has a skeleton"));
    let (reused, count) = prefix::parse_reusing(dialect, new, &skeleton);
    let fresh = ParsedRequest::parse(dialect, new);
    assert_same(format!("{reused:?}"), format!("{fresh:?}"), "the reusing parse must equal a fresh one");
    if let Some(expected) = expect_reused {
        assert_eq!(count, expected, "every message of the earlier turn is re-made");
    }
    let rewriter = rewriter();
    let none = BTreeSet::new();
    let eager = History::eager(&none);
    let (Some(mut reused), Some(mut fresh)) = (reused, fresh) else { return };
    let from_reused = rewriter.rewrite_parsed(&mut reused, &eager);
    let from_fresh = rewriter.rewrite_parsed(&mut fresh, &eager);
    assert_eq!(from_reused.body, from_fresh.body, "the same bytes go upstream");
    assert_eq!(from_reused.report, from_fresh.report);
    assert_same(format!("{reused:?}"), format!("{fresh:?}"), "after the rewrite");

    // As the proxy runs it: the earlier turn parsed through the cache and counted, or rewritten,
    // so the next one also carries the re-made items' counts (and the earlier turn's truncations
    // and rendered messages, taken where this turn decides the same). The earlier turn decided
    // alike (the same settings), with compactor's cache markers (every message seen), or
    // otherwise (another truncation limit, every call of the earlier turn pruned).
    let old_calls: BTreeSet<String> = match ParsedRequest::parse(dialect, &old) {
        Some(parsed) => parsed.conversation.items.iter().filter_map(|i| i.call_id().map(String::from)).collect(),
        None => BTreeSet::new(),
    };
    let other = crate::common::Settings::defaults()
        .prune_window(500, 300)
        .placeholder("[cleared]")
        .protected_tools(&[])
        .tool_output_max_tokens(400)
        .rewriter(32 << 20);
    // A provider's cache warm over half the history (pruning held back unless it pays), and the
    // same under window pressure (the held-back batch goes).
    let warm = History {
        seen_messages: message_count(dialect, new) / 2,
        pricing: CachePricing::ANTHROPIC,
        later_turns: 12,
        idle: Some(Duration::from_secs(5)),
        ..eager.clone()
    };
    let pressed = History { pressure: true, ..warm.clone() };
    let earlier_turns = [
        ("counted", EarlierTurn::Counted, eager.clone()),
        ("rewritten alike, a warm cache", EarlierTurn::Rewritten(&rewriter, warm.clone()), warm.clone()),
        ("rewritten alike, under pressure", EarlierTurn::Rewritten(&rewriter, pressed.clone()), pressed.clone()),
        ("counted, under pressure", EarlierTurn::Counted, pressed),
        ("rewritten alike", EarlierTurn::Rewritten(&rewriter, eager.clone()), eager.clone()),
        ("rewritten alike, with markers", EarlierTurn::Rewritten(&rewriter, seen(eager.clone())), seen(eager.clone())),
        ("rewritten otherwise", EarlierTurn::Rewritten(&other, seen(History::eager(&old_calls))), seen(eager.clone())),
    ];
    for (what, done, history) in earlier_turns {
        let cache = PrefixCache::new(64 << 20);
        let key = PrefixKey::new(dialect, [b"check".as_slice()]);
        let before_old = Earlier::default();
        let (earlier, _) = cache.parse(|| key, dialect, &old, &before_old);
        let mut earlier = earlier.expect("the earlier turn parses");
        match done {
            EarlierTurn::Counted => {
                let model = rewriter.models.lookup(earlier.model.as_deref().unwrap_or(""));
                rewriter.count_items(&mut earlier, model.encoding);
            }
            EarlierTurn::Rewritten(earlier_rewriter, earlier_history) => {
                earlier_rewriter.rewrite_parsed(&mut earlier, &earlier_history);
            }
        }
        let new_bytes = Bytes::copy_from_slice(new);
        let before_new = Earlier::default();
        let (carried, _) = cache.parse(|| key, dialect, &new_bytes, &before_new);
        let mut carried = carried.expect("a fresh parse of the same bytes succeeded");
        let mut fresh = ParsedRequest::parse(dialect, new).expect("it parsed before");
        let from_carried = rewriter.rewrite_parsed(&mut carried, &history);
        let from_fresh = rewriter.rewrite_parsed(&mut fresh, &history);
        assert_eq!(from_carried.body, from_fresh.body, "the same bytes go upstream, the earlier turn {what}");
        assert_eq!(from_carried.report, from_fresh.report, "the same report, the earlier turn {what}");
        assert_same(
            format!("{carried:?}"),
            format!("{fresh:?}"),
            &format!("after the rewrite, the earlier turn {what}"),
        );
        // And the turn after, the same bytes again: re-made from a skeleton that was itself
        // made by reuse (its texts shared with the first one's).
        let again = Earlier::default();
        let (third, _) = cache.parse(|| key, dialect, &new_bytes, &again);
        let mut third = third.expect("a fresh parse of the same bytes succeeded");
        let from_third = rewriter.rewrite_parsed(&mut third, &history);
        assert_eq!(from_third.body, from_fresh.body, "the same bytes go upstream a turn later, {what}");
        assert_eq!(from_third.report, from_fresh.report, "the same report a turn later, {what}");
        assert_same(format!("{third:?}"), format!("{fresh:?}"), &format!("a turn later, {what}"));
    }
}

/// What the proxy did with the earlier turn parsed through the cache.
enum EarlierTurn<'r> {
    /// Counted its tokens only.
    Counted,
    /// Rewrote it, with this rewriter and history.
    Rewritten(&'r Rewriter, History<'r>),
}

/// `history` with every message seen by the provider: compactor places its cache markers.
fn seen(history: History<'_>) -> History<'_> {
    History { seen_messages: usize::MAX, ..history }
}

/// Asserts two Debug renderings are equal, showing where they part (they are long).
fn assert_same(reused: String, fresh: String, what: &str) {
    if reused != fresh {
        let at = prefix::common_prefix(reused.as_bytes(), fresh.as_bytes());
        let around = |s: &str| s.get(at.saturating_sub(200)..(at + 200).min(s.len())).unwrap_or("").to_string();
        panic!("{what}: they part at {at}\nreused: …{}…\nfresh:  …{}…", around(&reused), around(&fresh));
    }
}

fn dialect() -> impl Strategy<Value = Dialect> {
    prop_oneof![
        Just(Dialect::ChatCompletions),
        Just(Dialect::AnthropicMessages),
        Just(Dialect::Responses),
        Just(Dialect::Gemini)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_parse_reusing_the_last_turn_equals_a_fresh_parse_byte_for_byte(
        dialect in dialect(),
        turns in prop::collection::vec(turn(), 1..16),
        cut in 0usize..16,
        change in change(),
    ) {
        let (old, new, reused) = turns_of(dialect, &turns, cut, change);
        check(dialect, &old, &new, reused);
    }

    #[test]
    fn the_cache_reuses_a_conversations_last_turn_and_keeps_parallel_ones_apart(
        dialect in dialect(),
        turns in prop::collection::vec(turn(), 2..12),
        other in prop::collection::vec(turn(), 1..6),
    ) {
        let cache = PrefixCache::new(64 << 20);
        let key = PrefixKey::new(dialect, [b"credential".as_slice()]);
        let first = Bytes::from(serde_json::to_vec(&body(dialect, &turns[..1], "sys", 1)).unwrap());
        let earlier_turn = Earlier::default();
        let (_, reuse) = cache.parse(|| key, dialect, &first, &earlier_turn);
        prop_assert_eq!(reuse, Reuse::Miss);
        // A subagent under the same key, with its own opening message.
        let mut side = vec![Turn::User("subagent task".into())];
        side.extend(other);
        let side = Bytes::from(serde_json::to_vec(&body(dialect, &side, "sys", 1)).unwrap());
        let earlier_turn = Earlier::default();
        cache.parse(|| key, dialect, &side, &earlier_turn);
        let next = Bytes::from(serde_json::to_vec(&body(dialect, &turns, "sys", 1)).unwrap());
        let earlier_turn = Earlier::default();
        let (parsed, reuse) = cache.parse(|| key, dialect, &next, &earlier_turn);
        prop_assert_eq!(reuse, Reuse::Hit);
        assert_same(format!("{parsed:?}"), format!("{:?}", ParsedRequest::parse(dialect, &next)), "through the cache");
    }
}

#[test]
fn a_cache_of_zero_bytes_is_off() {
    let cache = PrefixCache::new(0);
    let body = Bytes::from(serde_json::to_vec(&chat_body(&[Turn::User("hi".into())])).unwrap());
    let key = PrefixKey::new(Dialect::ChatCompletions, []);
    assert_eq!(cache.parse(|| key, Dialect::ChatCompletions, &body, &Earlier::default()).1, Reuse::Off);
    assert_eq!(cache.parse(|| key, Dialect::ChatCompletions, &body, &Earlier::default()).1, Reuse::Off);
}

#[test]
fn a_parse_heavier_than_half_the_cache_is_not_kept_nor_built_and_a_light_one_is() {
    let cache = PrefixCache::new(4 << 20);
    let key = PrefixKey::new(Dialect::ChatCompletions, []);
    // 100,000 one-letter messages: a 3 MB body whose skeleton weighs more than 2 MiB.
    let heavy = [
        &b"{\"model\":\"m\",\"messages\":["[..],
        &[&br#"{"role":"user","content":"a"}"#[..]; 100_000].join(&b","[..]),
        b"]}",
    ]
    .concat();
    let heavy = Bytes::from(heavy);
    let earlier = Earlier::default();
    let (parsed, _) = cache.parse(|| key, Dialect::ChatCompletions, &heavy, &earlier);
    assert!(parsed.unwrap().memo.own().is_none(), "no skeleton built for a parse the cache cannot hold");
    assert_eq!(cache.size().entries, 0);
    let light = Bytes::from(serde_json::to_vec(&chat_body(&[Turn::User("hi".into())])).unwrap());
    let (parsed, _) = cache.parse(|| key, Dialect::ChatCompletions, &light, &earlier);
    assert!(parsed.unwrap().memo.own().is_some());
    assert_eq!(cache.size().entries, 1);
}

#[test]
fn bodies_a_fresh_parse_refuses_are_refused_when_reusing_too() {
    let old = br#"{"model":"m","messages":[{"role":"user","content":"a"}],"x":1}"#;
    for new in [
        r#"{"model":"m","messages":[{"role":"user","content":"a"},]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"} {"role":"user","content":"b"}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"}],"x":1} trailing"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"}],"model":"n"}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"}],"messages":[]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"},"text"]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"}],}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"}]"#,
    ] {
        check(Dialect::ChatCompletions, old, new.as_bytes(), None);
        assert!(ParsedRequest::parse(Dialect::ChatCompletions, new.as_bytes()).is_none(), "{new}");
    }
    let fine = r#"{"model":"m","messages":[{"role":"user","content":"a"} , {"role":"user","content":"b"}] ,"x":1 }  "#;
    check(Dialect::ChatCompletions, old, fine.as_bytes(), Some(1));
}

/// `body` as the agent sent it `drop` messages earlier: the same bytes without its last messages.
fn without_last(dialect: Dialect, body: &[u8], drop: usize) -> Vec<u8> {
    let parsed = ParsedRequest::parse(dialect, body).unwrap();
    let kept = parsed.messages.len() - drop;
    let last_kept = compactor::json::span_in(body, parsed.messages[kept - 1].raw).unwrap();
    let history = compactor::json::span_in(body, parsed.top.get(dialect.history_field()).unwrap()).unwrap();
    let mut out = body[..last_kept.end].to_vec();
    out.extend_from_slice(&body[history.end - 1..]);
    out
}

#[test]
fn the_recorded_agent_conversations_reuse_every_earlier_turn_and_parse_the_same() {
    for (name, dialect) in [
        ("anthropic_claude_code_long.json", Dialect::AnthropicMessages),
        ("openai_chat_agent_long.json", Dialect::ChatCompletions),
        ("responses_codex_long.json", Dialect::Responses),
    ] {
        let path = format!("{}/tests/fixtures/conversations/{name}", env!("CARGO_MANIFEST_DIR"));
        let body = std::fs::read(&path).unwrap();
        let messages = message_count(dialect, &body);
        for drop in [1, 3, 20, messages - 1] {
            let earlier = without_last(dialect, &body, drop);
            check(dialect, &earlier, &body, Some(messages - drop));
        }
    }
}

/// Work proportional to what the agent added: on the next turn of a recorded agent conversation,
/// the re-made messages bring their token counts, so a counter that has never seen the
/// conversation hashes, looks up and tokenizes only the texts of the added messages (and the
/// tools and system prompt outside the history), and every count is what a fresh count gives.
#[test]
fn the_next_turn_counts_only_the_texts_the_agent_added() {
    use compactor::rewrite::Rewriter;
    use compactor::tokens::{ModelTable, TokenCounter};
    let settings = compactor::config::Config::default().rewrite_settings();
    let rewriter = || Rewriter::new(settings.clone(), TokenCounter::new(256 << 20), ModelTable::default());
    for (name, dialect) in [
        ("anthropic_claude_code_long.json", Dialect::AnthropicMessages),
        ("openai_chat_agent_long.json", Dialect::ChatCompletions),
        ("responses_codex_long.json", Dialect::Responses),
    ] {
        let path = format!("{}/tests/fixtures/conversations/{name}", env!("CARGO_MANIFEST_DIR"));
        let body = Bytes::from(std::fs::read(&path).unwrap());
        let earlier = Bytes::from(without_last(dialect, &body, 3));
        let cache = PrefixCache::new(64 << 20);
        let key = PrefixKey::new(dialect, [b"agent".as_slice()]);

        // The earlier turn, counted as the proxy counts it.
        let first = rewriter();
        let earlier_turn = Earlier::default();
        let (parsed, reuse) = cache.parse(|| key, dialect, &earlier, &earlier_turn);
        assert_eq!(reuse, Reuse::Miss);
        let mut parsed = parsed.unwrap();
        let encoding = first.models.lookup(parsed.model.as_deref().unwrap_or("")).encoding;
        first.count_items(&mut parsed, encoding);

        // The next turn, counted by a counter that has seen nothing.
        let next = rewriter();
        let earlier_turn = Earlier::default();
        let (carried, reuse) = cache.parse(|| key, dialect, &body, &earlier_turn);
        assert_eq!(reuse, Reuse::Hit, "{name}");
        let mut carried = carried.unwrap();
        next.count_items(&mut carried, encoding);
        let looked_up = next.counter.size().entries;

        let fresh_counter = rewriter();
        let mut fresh = ParsedRequest::parse(dialect, &body).unwrap();
        fresh_counter.count_items(&mut fresh, encoding);
        let all = fresh_counter.counter.size().entries;

        let tokens = |p: &ParsedRequest| p.conversation.items.iter().map(|i| i.tokens).collect::<Vec<_>>();
        assert_eq!(tokens(&carried), tokens(&fresh), "{name}: every item's count is the fresh one");
        assert_eq!(carried.conversation.fixed_tokens, fresh.conversation.fixed_tokens, "{name}");
        // Only the added messages' texts, the tools and the system prompt were counted.
        let added: Vec<&str> = fresh
            .conversation
            .items
            .iter()
            .filter(|i| i.message >= fresh.messages.len() - 3)
            .flat_map(|i| item_texts(&i.kind))
            .filter(|t| !t.is_empty())
            .collect();
        let outside = usize::from(fresh.tools.is_some()) + fresh.top_system.len();
        assert!(
            looked_up as usize <= added.len() + outside,
            "{name}: {looked_up} texts counted on the next turn, {} added (+{outside} outside the history), {all} in all",
            added.len()
        );
        assert!(all > 10 * looked_up.max(1), "{name}: {looked_up} of {all} texts counted");
    }
}

fn item_texts<'k>(kind: &'k compactor::conversation::Kind<'_>) -> Vec<&'k str> {
    use compactor::conversation::Kind;
    match kind {
        Kind::System { text } | Kind::Text { text, .. } | Kind::Thinking { text } | Kind::ToolResult { text, .. } => {
            vec![text]
        }
        Kind::ToolCall { name, arguments, .. } => vec![name, arguments],
        Kind::Other { raw } => vec![raw],
        Kind::Attachment => vec![],
    }
}

/// A body below `limits.prefix_min_bytes` is parsed whole and not kept (it parses faster than the
/// cache's lookup and insert); a larger one of the same conversation is kept and reused.
#[test]
fn bodies_below_the_minimum_are_parsed_whole_and_not_kept() {
    let dialect = Dialect::ChatCompletions;
    let body = |outputs: usize| {
        let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
        for i in 0..outputs {
            messages.push(json!({"role": "user", "content": format!("step {i}: {}", "x".repeat(500))}));
        }
        Bytes::from(serde_json::to_vec(&json!({"model": "gpt-4o", "messages": messages})).unwrap())
    };
    let cache = PrefixCache::new(64 << 20).for_bodies_from(4_000);
    let key = PrefixKey::new(dialect, [b"small".as_slice()]);
    let (small, next_small) = (body(2), body(3));
    assert!(next_small.len() < 4_000);
    for small in [&small, &next_small] {
        let earlier_turn = Earlier::default();
        let (parsed, reuse) = cache.parse(|| key, dialect, small, &earlier_turn);
        assert_eq!(reuse, Reuse::Off, "a small body is parsed whole");
        assert_same(format!("{parsed:?}"), format!("{:?}", ParsedRequest::parse(dialect, small)), "small");
    }
    assert_eq!(cache.size().entries, 0, "and nothing is kept");
    let (large, next_large) = (body(10), body(11));
    assert_eq!(cache.parse(|| key, dialect, &large, &Earlier::default()).1, Reuse::Miss);
    let earlier_turn = Earlier::default();
    let (parsed, reuse) = cache.parse(|| key, dialect, &next_large, &earlier_turn);
    assert_eq!(reuse, Reuse::Hit, "a large body's next turn is reused");
    assert_same(format!("{parsed:?}"), format!("{:?}", ParsedRequest::parse(dialect, &next_large)), "large");
}
