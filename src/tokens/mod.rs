//! Token accounting: tiktoken counts cached by content hash, so the next turn of a long
//! conversation tokenizes only what it added. The hash is seeded with the request's tenant
//! ([`scoped`]): a tenant's counts are never another tenant's cache hits, whose speed would tell
//! it that someone else sent a text.

pub mod models;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tiktoken_rs::CoreBPE;
use xxhash_rust::xxh3::{xxh3_64, xxh3_128_with_seed};

pub use models::{Encoding, ModelInfo, ModelTable};

/// What one cached count costs in memory: the key (encoding and 128-bit hash, 32 bytes), the count,
/// moka's own bookkeeping for the entry (its map bucket, access-order node, entry info, frequency
/// sketch and table share) and the allocator's overhead. Measured as resident memory over a
/// million counts (moka 0.12): 342 bytes an entry with mimalloc (the binary's allocator), 384 with
/// glibc's malloc; the larger stands. Every entry has this size: counts are cached by hash.
pub const TOKEN_ENTRY_BYTES: u32 = 384;

/// Counts tokens, remembering every count by (encoding, content hash seeded with the tenant) in a
/// cache bounded in bytes.
#[derive(Clone)]
pub struct TokenCounter {
    /// Keyed by a text's hash: a fast keyed hasher is enough (no SipHash over a hash).
    cache: moka::sync::Cache<(Encoding, u128), u32, foldhash::fast::RandomState>,
}

/// A cache's estimated size, for its gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheSize {
    /// The weighted size: what the cache's byte bound applies to.
    pub bytes: u64,
    pub entries: u64,
}

impl TokenCounter {
    /// A counter whose cache holds at most `cache_bytes` (at [`TOKEN_ENTRY_BYTES`] per count).
    pub fn new(cache_bytes: u64) -> Self {
        let cache = moka::sync::Cache::builder()
            .weigher(|_: &(Encoding, u128), _: &u32| TOKEN_ENTRY_BYTES)
            .max_capacity(cache_bytes)
            .build_with_hasher(foldhash::fast::RandomState::default());
        Self { cache }
    }

    /// The cache's size once its pending evictions are applied.
    pub fn size(&self) -> CacheSize {
        self.cache.run_pending_tasks();
        CacheSize { bytes: self.cache.weighted_size(), entries: self.cache.entry_count() }
    }

    /// Tokens in `text`; tokenizes only on a cache miss.
    pub fn count(&self, encoding: Encoding, text: &str) -> u32 {
        if text.is_empty() {
            return 0;
        }
        let key = (encoding, text_hash(text));
        if let Some(count) = self.cache.get(&key) {
            return count;
        }
        let count = tokenize_len(encoding, text);
        self.cache.insert(key, count);
        count
    }

    /// The cached count of a text by its hash ([`text_hash`]), for callers that hash once and
    /// look up once.
    pub fn cached(&self, encoding: Encoding, hash: u128) -> Option<u32> {
        self.cache.get(&(encoding, hash))
    }

    /// Tokenizes `text`, whose hash is `hash`, and caches its count: the miss of [`Self::cached`].
    pub fn count_uncached(&self, encoding: Encoding, hash: u128, text: &str) -> u32 {
        let count = tokenize_len(encoding, text);
        self.cache.insert((encoding, hash), count);
        count
    }

    /// Whether `text` would be a cache hit (or needs no tokenizing at all).
    pub fn is_cached(&self, encoding: Encoding, text: &str) -> bool {
        text.is_empty() || self.cache.contains_key(&(encoding, text_hash(text)))
    }
}

/// Whether each encoding's tables are in memory (index: [`slot`]).
static LOADED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];

fn slot(encoding: Encoding) -> usize {
    match encoding {
        Encoding::O200kBase => 0,
        Encoding::Cl100kBase => 1,
    }
}

/// The encoding of every model the table does not say otherwise of (today's models, every
/// other vendor's): loaded at start.
pub const DEFAULT_ENCODING: Encoding = Encoding::O200kBase;

/// Whether `encoding`'s tables are loaded, so counting with it costs no load.
pub fn is_loaded(encoding: Encoding) -> bool {
    LOADED[slot(encoding)].load(Ordering::Acquire)
}

/// Loads `encoding`'s tables on this thread (100-300 ms: a blocking thread's work). Threads that
/// ask at the same time wait for the one load.
pub fn load_blocking(encoding: Encoding) {
    let _ = bpe(encoding);
    LOADED[slot(encoding)].store(true, Ordering::Release);
}

/// Starts loading the default encoding's tables on a thread of their own and returns at once:
/// called at start, so no request pays for the load and readiness ([`is_loaded`]) can wait for it.
pub fn preload() {
    let spawned = std::thread::Builder::new().name("tokenizer-load".into()).spawn(|| {
        wait_for_load_gate();
        let started = Instant::now();
        load_blocking(DEFAULT_ENCODING);
        tracing::info!(ms = started.elapsed().as_millis() as u64, "tokenizer tables loaded");
    });
    if let Err(error) = spawned {
        // The first request that counts loads them instead (off the async workers, see `loaded`).
        tracing::warn!(%error, "cannot start the tokenizer loading thread");
    }
}

/// The variable naming a file the load at start waits for (tests of readiness only): opened for
/// reading before the tables load, so a named pipe holds the load until the test opens its other
/// end, and a test can ask `/readyz` while it is certain the tables are not in memory. Unset, or
/// naming a file that cannot be opened, it holds nothing.
pub const LOAD_GATE_VARIABLE: &str = "COMPACTOR_TEST_TOKENIZER_GATE";

fn wait_for_load_gate() {
    if let Some(gate) = std::env::var_os(LOAD_GATE_VARIABLE) {
        tracing::info!(gate = %std::path::Path::new(&gate).display(), "tokenizer tables wait for their gate");
        drop(std::fs::File::open(gate));
    }
}

/// Waits until `encoding`'s tables are loaded, loading them on a blocking thread when nobody has:
/// a request that arrives before the load at start is done (or the first one of a model with
/// another encoding) waits without holding an async worker.
pub async fn loaded(encoding: Encoding) {
    if is_loaded(encoding) {
        return;
    }
    // Outside a runtime, or while it shuts down, the count loads them itself.
    if tokio::runtime::Handle::try_current().is_ok() {
        let _ = tokio::task::spawn_blocking(move || load_blocking(encoding)).await;
    }
}

tokio::task_local! {
    /// The seed of the tenant whose request this task serves.
    static TENANT_SEED: u64;
}

/// Runs `work` (a request's) with its counts cached apart from every other tenant's: `tenant` is
/// the keyed tenant hash of the request's credential. Work outside any scope (background
/// compactions, tests) shares one space that no request reads.
pub async fn scoped<F: std::future::Future>(tenant: &str, work: F) -> F::Output {
    TENANT_SEED.scope(xxh3_64(tenant.as_bytes()) | 1, work).await
}

/// The hash a text's count is cached by, in the current tenant's space ([`scoped`]).
pub fn text_hash(text: &str) -> u128 {
    xxh3_128_with_seed(text.as_bytes(), TENANT_SEED.try_with(|seed| *seed).unwrap_or(0))
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

    #[tokio::test]
    async fn a_count_is_cached_for_the_tenant_that_made_it_only() {
        let counter = TokenCounter::new(100 * u64::from(TOKEN_ENTRY_BYTES));
        let text = "The secret build number is 4417.";
        scoped("tenant-a", async { counter.count(Encoding::O200kBase, text) }).await;
        assert!(scoped("tenant-a", async { counter.is_cached(Encoding::O200kBase, text) }).await);
        assert!(!scoped("tenant-b", async { counter.is_cached(Encoding::O200kBase, text) }).await);
        assert!(!counter.is_cached(Encoding::O200kBase, text), "nor outside any tenant");
    }

    #[test]
    fn counts_match_the_tokenizer_and_are_cached() {
        let counter = TokenCounter::new(100 * u64::from(TOKEN_ENTRY_BYTES));
        let text = "The quick brown fox jumps over the lazy dog.";
        assert!(!counter.is_cached(Encoding::O200kBase, text));
        let count = counter.count(Encoding::O200kBase, text);
        assert_eq!(count, tokenize_len(Encoding::O200kBase, text));
        assert!(count > 5 && count < 15);
        assert!(counter.is_cached(Encoding::O200kBase, text));
        assert!(!counter.is_cached(Encoding::Cl100kBase, text));
    }
}
