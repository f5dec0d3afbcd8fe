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
