//! In-process caches stay within their byte bounds whatever the traffic.

use compactor::tokens::{Encoding, TOKEN_ENTRY_BYTES, TokenCounter, tokenize_len};

#[test]
fn the_token_cache_never_holds_more_than_its_byte_bound_after_counting_many_distinct_texts() {
    let bound = 1_000 * u64::from(TOKEN_ENTRY_BYTES);
    let counter = TokenCounter::new(bound);
    for i in 0..20_000 {
        let text = format!("distinct text number {i}: the build failed at step {}", i * 7);
        counter.count(Encoding::O200kBase, &text);
    }
    let size = counter.size();
    assert!(size.bytes <= bound, "{size:?} over {bound}");
    assert!(size.entries <= 1_000, "{size:?}");
    assert!(size.entries >= 500, "the cache is used, not emptied: {size:?}");
    assert_eq!(size.bytes, size.entries * u64::from(TOKEN_ENTRY_BYTES));
    // Counts stay right whether they come from the cache or not.
    let text = "distinct text number 19999: the build failed at step 139993";
    assert_eq!(counter.count(Encoding::O200kBase, text), tokenize_len(Encoding::O200kBase, text));
}

#[test]
fn the_prefix_cache_never_holds_more_than_its_byte_bound_whatever_the_conversations() {
    use bytes::Bytes;
    use compactor::dialect::Dialect;
    use compactor::dialect::prefix::{Earlier, PrefixCache, PrefixKey, Reuse};
    let bound = 2 * 1024 * 1024;
    let cache = PrefixCache::new(bound);
    for i in 0..300 {
        let output = format!("line {i}\n").repeat(2_000);
        let body = serde_json::json!({"model": "gpt-4o", "messages": [
            {"role": "user", "content": format!("task {i}")},
            {"role": "tool", "tool_call_id": "c", "content": output}
        ]});
        let body = Bytes::from(serde_json::to_vec(&body).unwrap());
        let key = PrefixKey::new(Dialect::ChatCompletions, [format!("key {}", i % 7).as_bytes()]);
        let earlier_turn = Earlier::default();
        let (parsed, reuse) = cache.parse(|| key, Dialect::ChatCompletions, &body, &earlier_turn);
        assert!(parsed.is_some() && reuse != Reuse::Off);
    }
    let size = cache.size();
    assert!(size.bytes <= bound, "{size:?} over {bound}");
    assert!(size.bytes >= bound / 4, "the cache is used: {size:?}");
}
