//! Parse → rewrite → render → parse, in each dialect: whatever the bytes, compactor never panics;
//! a body it rewrites is valid JSON of the same dialect, its tool pairs are whole (repair finds
//! nothing left to do), and rewriting it again changes nothing. (Not when repair moved or answered
//! a result: the result it writes is no item the policies see, so only the next request shortens
//! it.)
#![no_main]

use std::collections::BTreeSet;
use std::sync::LazyLock;

use compactor::config::Config;
use compactor::dialect::{Dialect, ParsedRequest};
use compactor::rewrite::{Rewriter, repair};
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

fuzz_target!(|body: &[u8]| {
    for dialect in [Dialect::ChatCompletions, Dialect::AnthropicMessages, Dialect::Responses, Dialect::Gemini] {
        let Some(first) = REWRITER.rewrite_body(dialect, body, &BTreeSet::new()) else { continue };
        let Some(rewritten) = first.body else { continue };
        assert!(serde_json::from_slice::<serde_json::Value>(&rewritten).is_ok(), "{dialect:?}: not JSON");
        let mut parsed = ParsedRequest::parse(dialect, &rewritten).expect("a rewritten body parses in its dialect");
        assert_eq!(repair::apply(&mut parsed.conversation), 0, "{dialect:?}: a tool pair left broken");
        // The same session state as the first pass: a call id pruned once is pruned in every later
        // request, which is another question than whether one rewrite is complete.
        if first.report.repaired > 0 {
            continue;
        }
        let again = REWRITER.rewrite_body(dialect, &rewritten, &BTreeSet::new()).expect("parses");
        if let Some(second) = again.body {
            assert_eq!(
                String::from_utf8_lossy(&second),
                String::from_utf8_lossy(&rewritten),
                "{dialect:?}: a second rewrite changed the body"
            );
        }
    }
});
