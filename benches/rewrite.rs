//! Criterion benchmarks of the rewrite stage on long recorded agent conversations: parse, count,
//! truncate, dedupe, prune, repair and render, with the token cache warm (the usual next turn) and
//! cold (limited by the tokenizer), against tiktoken-rs alone; and the parse of the same session's
//! next turn, which re-makes the previous turn's messages from its skeleton (prefix reuse).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::hint::black_box;

use bytes::Bytes;
use compactor::compaction::plan;
use compactor::config::Config;
use compactor::dialect::prefix::{self, Earlier, PrefixCache, PrefixKey, Skeleton};
use compactor::dialect::{Dialect, ParsedRequest};
use compactor::json;
use compactor::rewrite::{History, RewriteSettings, Rewriter};
use compactor::session::state::CompactionRecord;
use compactor::tokens::{Encoding, ModelTable, TokenCounter, tokenize_len};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// The shipped defaults, tokenizing on the calling thread.
fn settings() -> RewriteSettings {
    let mut settings = Config::default().rewrite_settings();
    settings.blocking_tokenize_bytes = usize::MAX;
    settings
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/conversations/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every text the counter sees in a request, for the tokenizer-alone comparison.
fn texts(dialect: Dialect, body: &[u8]) -> Vec<String> {
    use compactor::conversation::Kind;
    let parsed = ParsedRequest::parse(dialect, body).unwrap();
    parsed
        .conversation
        .items
        .iter()
        .flat_map(|item| match &item.kind {
            Kind::System { text }
            | Kind::Text { text, .. }
            | Kind::Thinking { text }
            | Kind::ToolResult { text, .. } => {
                vec![text.to_string()]
            }
            Kind::ToolCall { name, arguments, .. } => vec![name.to_string(), arguments.to_string()],
            Kind::Other { raw } => vec![raw.to_string()],
            Kind::Attachment => vec![],
        })
        .collect()
}

/// `body` as the agent sent it `drop` messages earlier: the same bytes without its last messages.
fn without_last(dialect: Dialect, body: &[u8], drop: usize) -> Vec<u8> {
    let parsed = ParsedRequest::parse(dialect, body).unwrap();
    let kept = parsed.messages.len() - drop;
    let last_kept = json::span_in(body, parsed.messages[kept - 1].raw).unwrap();
    let history = json::span_in(body, parsed.top.get(dialect.history_field()).unwrap()).unwrap();
    let mut out = body[..last_kept.end].to_vec();
    out.extend_from_slice(&body[history.end - 1..]);
    out
}

fn bench(c: &mut Criterion) {
    for (name, dialect) in [
        ("anthropic_claude_code_long.json", Dialect::AnthropicMessages),
        ("openai_chat_agent_long.json", Dialect::ChatCompletions),
    ] {
        let body = fixture(name);
        let none = BTreeSet::new();
        let label = name.trim_end_matches(".json");
        let mut group = c.benchmark_group(label);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.sample_size(20);

        let warm = Rewriter::new(settings(), TokenCounter::new(256 << 20), ModelTable::default());
        let first = warm.rewrite_body(dialect, &body, &none).unwrap();
        eprintln!(
            "{label}: {} bytes, {} messages, tokens {} -> {} (pruned {}, truncated {}, deduped {})",
            body.len(),
            first.report.message_count,
            first.report.tokens_before,
            first.report.tokens_after,
            first.report.pruned,
            first.report.truncated,
            first.report.deduped
        );
        group.bench_function("rewrite_warm_cache", |b| {
            b.iter(|| black_box(warm.rewrite_body(dialect, black_box(&body), &none)))
        });

        group.bench_function("rewrite_cold_cache", |b| {
            b.iter_batched(
                || Rewriter::new(settings(), TokenCounter::new(256 << 20), ModelTable::default()),
                |cold| black_box(cold.rewrite_body(dialect, &body, &none)),
                criterion::BatchSize::PerIteration,
            )
        });

        let all = texts(dialect, &body);
        group.bench_function("tiktoken_alone", |b| {
            b.iter(|| all.iter().map(|t| tokenize_len(Encoding::O200kBase, t)).sum::<u32>())
        });
        group.bench_function("parse_cold", |b| b.iter(|| black_box(ParsedRequest::parse(dialect, &body))));

        // The same session's next turn: the previous request was this one without its last 3
        // messages; its skeleton is re-made from the new body, the added messages are read, and
        // the new skeleton is kept for the turn after (what `PrefixCache::parse` does on a hit).
        let previous = Bytes::from(without_last(dialect, &body, 3));
        // Parsed through the cache and rewritten, as the proxy does: its skeleton keeps the counts,
        // the cuts and the rendered messages.
        let cache = PrefixCache::new(256 << 20);
        let earlier_turn = Earlier::default();
        let (earlier, _) =
            cache.parse(|| PrefixKey::new(dialect, [b"bench".as_slice()]), dialect, &previous, &earlier_turn);
        let mut earlier = earlier.unwrap();
        warm.rewrite_parsed(&mut earlier, &History::eager(&none));
        let earlier = earlier.memo.own().cloned().unwrap();
        let body = Bytes::from(body);
        let (reused, count) = prefix::parse_reusing(dialect, &body, &earlier);
        assert!(count > 0 && reused.is_some(), "the previous turn is reused");
        let warm_parse = || {
            let (parsed, _) = prefix::parse_reusing(dialect, &body, &earlier);
            let parsed = parsed.unwrap();
            let next = Skeleton::of(&parsed, body.clone());
            (parsed, next)
        };
        group.bench_function("parse_warm_prefix_hit", |b| b.iter(|| black_box(warm_parse())));
        let history = History::eager(&none);
        group.bench_function("rewrite_warm_prefix_hit", |b| {
            b.iter(|| {
                let (mut parsed, next) = warm_parse();
                black_box((warm.rewrite_parsed(&mut parsed, &history).body, next))
            })
        });

        // A stored compaction record covering all but the last ~20k tokens, re-applied as on every
        // later turn: hash the covered prefix, rebuild, then run the policies on the result.
        let mut parsed = ParsedRequest::parse(dialect, &body).unwrap();
        let model = ModelTable::default().lookup(parsed.model.as_deref().unwrap_or(""));
        warm.count_items(&mut parsed, model.encoding);
        let cut = plan::choose_cut(&parsed, 20_000, 0).unwrap();
        let record = CompactionRecord {
            generation: 1,
            summary: "The agent fixed the parser; tests pass except the CLI snapshot. ".repeat(60),
            covered_messages: cut as u64,
            covered_hash: plan::prefix_hash(&parsed, cut),
            first_kept: cut as u64,
            user_messages: plan::user_messages(&parsed, cut, 20_000),
            truncate_user_tokens: 0,
            tokens_before: 0,
            tokens_after: 0,
            trigger: "overflow".into(),
            model: "bench".into(),
            at_unix_ms: 0,
            due_tokens: 0,
            cost: Default::default(),
            started_by: String::new(),
            built_on: 0,
            us_per_token: 0,
        };
        let records = vec![record];
        let prefix = Config::default().compaction.summary_prefix;
        let apply = || {
            let parsed = ParsedRequest::parse(dialect, &body).unwrap();
            let record = plan::matching_record(&parsed, &records).unwrap();
            let count = |t: &str| warm.counter.count(model.encoding, t);
            let rebuilt = plan::rebuild(&parsed, record, &prefix, &count).unwrap();
            warm.rewrite_body(dialect, &rebuilt, &none).map(|r| (rebuilt.len(), r.report))
        };
        let (rebuilt_len, report) = apply().unwrap();
        eprintln!(
            "{label}: stored record applied: {} -> {} bytes, {} tokens forwarded (cut at message {cut})",
            body.len(),
            rebuilt_len,
            report.tokens_after
        );
        group.bench_function("apply_stored_compaction", |b| b.iter(|| black_box(apply())));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
