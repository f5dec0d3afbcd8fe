//! Token accounting: tiktoken counts cached by content hash, so the next turn of a long
//! conversation tokenizes only what it added.

pub mod models;

use std::sync::Arc;

use tiktoken_rs::CoreBPE;
use xxhash_rust::xxh3::xxh3_128;

pub use models::{Encoding, ModelInfo, ModelTable};

/// Counts tokens, remembering every count by (encoding, content hash) in a bounded cache.
#[derive(Clone)]
pub struct TokenCounter {
    cache: moka::sync::Cache<(Encoding, u128), u32>,
}

impl TokenCounter {
    pub fn new(cache_entries: u64) -> Self {
        Self { cache: moka::sync::Cache::new(cache_entries) }
    }

    /// Tokens in `text`; tokenizes only on a cache miss.
    pub fn count(&self, encoding: Encoding, text: &str) -> u32 {
        if text.is_empty() {
            return 0;
        }
        let key = (encoding, xxh3_128(text.as_bytes()));
        if let Some(count) = self.cache.get(&key) {
            return count;
        }
        let count = tokenize_len(encoding, text);
        self.cache.insert(key, count);
        count
    }

    /// Whether `text` would be a cache hit (or needs no tokenizing at all).
    pub fn is_cached(&self, encoding: Encoding, text: &str) -> bool {
        text.is_empty() || self.cache.contains_key(&(encoding, xxh3_128(text.as_bytes())))
    }

    /// Tokenizes `texts` and caches their counts, until `stop` says otherwise (asked between
    /// texts); meant for a blocking thread.
    pub fn warm(&self, encoding: Encoding, texts: &[Arc<str>], stop: impl Fn() -> bool) {
        for text in texts {
            if stop() {
                return;
            }
            self.count(encoding, text);
        }
    }
}

fn bpe(encoding: Encoding) -> &'static CoreBPE {
    match encoding {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    }
}

/// The raw tokenizer count, uncached.
pub fn tokenize_len(encoding: Encoding, text: &str) -> u32 {
    u32::try_from(bpe(encoding).encode_ordinary(text).len()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_the_tokenizer_and_are_cached() {
        let counter = TokenCounter::new(100);
        let text = "The quick brown fox jumps over the lazy dog.";
        assert!(!counter.is_cached(Encoding::O200kBase, text));
        let count = counter.count(Encoding::O200kBase, text);
        assert_eq!(count, tokenize_len(Encoding::O200kBase, text));
        assert!(count > 5 && count < 15);
        assert!(counter.is_cached(Encoding::O200kBase, text));
        assert!(!counter.is_cached(Encoding::Cl100kBase, text));
    }
}
