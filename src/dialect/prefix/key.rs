//! [`PrefixKey`]: the key skeletons are kept under, hashed with a secret drawn once per process.

use std::hash::BuildHasher;
use std::sync::LazyLock;

use crate::dialect::Dialect;

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
