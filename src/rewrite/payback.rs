//! When changing what the provider has already cached is worth it. Providers bill the part of a
//! request that equals the previous one at a cache-read price and re-write (or re-prefill)
//! everything after the first changed token, so a rewrite of old content costs where it happens,
//! not what it removes. A pending rewrite of old content (a prune batch) goes only when:
//!
//! - the window needs it (`pressure`, decided by compaction's budget), or
//! - the cache is cold anyway (the conversation idle longer than the cache's lifetime), or
//! - it pays back: `freed × expected remaining turns × read` ≥ the extra it costs now,
//!   `(write − read) × seen tokens after the change − write × freed`, where the expected
//!   remaining turns are the turns the conversation has run so far (a session that ran n turns
//!   is as likely as not to run n more).
//!
//! With no cache (`none`: read = write = 1) the extra is negative and every batch goes at once,
//! as it always did.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Serialize, Serializer};

/// A provider's prompt-cache prices relative to its base input price, and how long an entry
/// lives without use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachePricing {
    pub read: f64,
    pub write: f64,
    pub lifetime: Duration,
    /// The preset's name (`openai`, `gemini`...), which is how it is shown: two presets may share
    /// their numbers. `None` for numbers given in the configuration.
    pub preset: Option<&'static str>,
}

impl std::fmt::Display for CachePricing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.preset {
            Some(name) => f.write_str(name),
            None => write!(f, "read={},write={},lifetime_secs={}", self.read, self.write, self.lifetime.as_secs_f64()),
        }
    }
}

/// Written as it is configured (`anthropic`, or `read=…,write=…,lifetime_secs=…`).
impl Serialize for CachePricing {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl CachePricing {
    /// A provider without a prompt cache: every rewrite is free.
    pub const NONE: Self = Self { read: 1.0, write: 1.0, lifetime: Duration::ZERO, preset: Some("none") };
    /// Anthropic: reads 0.1x, writes 1.25x (5-minute entries).
    pub const ANTHROPIC: Self =
        Self { read: 0.1, write: 1.25, lifetime: Duration::from_secs(300), preset: Some("anthropic") };
    /// OpenAI (gpt-4.1's 0.25x; 0.1x-0.5x by model), no write surcharge, entries kept 5-10 minutes.
    pub const OPENAI: Self =
        Self { read: 0.25, write: 1.0, lifetime: Duration::from_secs(300), preset: Some("openai") };
    /// Gemini's implicit prefix caching: cached input at a quarter of the base price, no write
    /// surcharge, entries kept minutes: OpenAI's numbers, under Gemini's name.
    pub const GEMINI: Self =
        Self { read: 0.25, write: 1.0, lifetime: Duration::from_secs(300), preset: Some("gemini") };

    /// `anthropic`, `openai`, `gemini`, `none`, or custom numbers: `read=0.1,write=1.25,lifetime_secs=300`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "anthropic" => return Ok(Self::ANTHROPIC),
            "openai" => return Ok(Self::OPENAI),
            "gemini" => return Ok(Self::GEMINI),
            "none" => return Ok(Self::NONE),
            _ => {}
        }
        let expected = "expected anthropic, openai, gemini, none or read=R,write=W,lifetime_secs=S (e.g. read=0.1,write=1.25,lifetime_secs=300)";
        let (mut read, mut write, mut lifetime) = (None, None, None);
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else { return Err(format!("{part:?}: {expected}")) };
            let number = value.trim().parse::<f64>().ok().filter(|n| n.is_finite() && *n >= 0.0);
            let Some(number) = number else { return Err(format!("{part:?}: not a non-negative number")) };
            match key.trim() {
                "read" => read = Some(number),
                "write" => write = Some(number),
                "lifetime_secs" => lifetime = Some(Duration::from_secs_f64(number)),
                other => return Err(format!("unknown {other:?}: {expected}")),
            }
        }
        match (read, write, lifetime) {
            (Some(read), Some(write), Some(lifetime)) if read <= write => {
                Ok(Self { read, write, lifetime, preset: None })
            }
            (Some(_), Some(_), Some(_)) => Err("a cache read cannot cost more than a write".into()),
            _ => Err(expected.to_string()),
        }
    }

    /// Whether the provider caches at all (a rewrite of old content can cost something).
    pub fn caches(&self) -> bool {
        self.read < self.write
    }
}

/// What the rewrite knows of the conversation's history upstream: what was decided before, what
/// the provider has seen and how warm its cache is.
#[derive(Debug, Clone)]
pub struct History<'a> {
    /// Call ids pruned in earlier requests: pruned again, so the rewritten prefix stays the same.
    pub pruned_before: &'a BTreeSet<String>,
    /// Messages the provider has already seen (the previous request's count); later ones are
    /// what the agent just added.
    pub seen_messages: usize,
    pub pricing: CachePricing,
    /// Requests the conversation has run.
    pub turns: u64,
    /// Time since the conversation's previous request; `None` for its first.
    pub idle: Option<Duration>,
    /// The window needs room: rewrite whatever helps, whatever it costs.
    pub pressure: bool,
}

impl<'a> History<'a> {
    /// No cache, nothing seen: every policy acts at once (tests, benchmarks, the fuzzers).
    pub fn eager(pruned_before: &'a BTreeSet<String>) -> Self {
        Self { pruned_before, seen_messages: 0, pricing: CachePricing::NONE, turns: 0, idle: None, pressure: false }
    }

    /// Whether the provider's cache of this conversation has expired (or never existed).
    pub fn cold(&self) -> bool {
        self.idle.is_none_or(|idle| idle >= self.pricing.lifetime)
    }
}

/// Why old content was rewritten (the label of `compactor_prefix_breaks_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The window needed room.
    Pressure,
    /// The cache had expired: the rewrite cost nothing extra.
    Cold,
    /// What it frees outweighs re-writing what follows.
    PaysBack,
    /// The provider has no cache.
    NoCache,
    /// A summary replaced the start of the conversation.
    Summary,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::Pressure => "pressure",
            Reason::Cold => "cold_cache",
            Reason::PaysBack => "pays_back",
            Reason::NoCache => "no_cache",
            Reason::Summary => "summary",
        }
    }
}

/// Whether a rewrite of seen content that frees `freed` tokens and changes the `after` seen tokens
/// that follow its first change (freed ones excluded) should go now, and why.
pub fn decide(history: &History, freed: u64, after: u64) -> Option<Reason> {
    if history.pressure {
        return Some(Reason::Pressure);
    }
    if !history.pricing.caches() {
        return Some(Reason::NoCache);
    }
    if history.cold() {
        return Some(Reason::Cold);
    }
    pays_back(&history.pricing, history.turns, freed, after).then_some(Reason::PaysBack)
}

/// The pay-back rule, in base-price input tokens.
pub fn pays_back(pricing: &CachePricing, turns: u64, freed: u64, after: u64) -> bool {
    let (freed, after) = (freed as f64, after as f64);
    let extra_now = (pricing.write - pricing.read) * after - pricing.write * freed;
    let saved_later = freed * pricing.read * turns as f64;
    saved_later >= extra_now
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_custom_numbers_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!(CachePricing::parse("Anthropic"), Ok(CachePricing::ANTHROPIC));
        assert_eq!(CachePricing::parse("none"), Ok(CachePricing::NONE));
        let custom = CachePricing::parse("read=0.5, write=1, lifetime_secs=600").unwrap();
        assert_eq!(custom, CachePricing { read: 0.5, write: 1.0, lifetime: Duration::from_secs(600), preset: None });
        assert_eq!(CachePricing::GEMINI.to_string(), "gemini");
        assert_eq!(custom.to_string(), "read=0.5,write=1,lifetime_secs=600");
        assert_eq!(CachePricing::parse("gemini"), Ok(CachePricing::GEMINI));
        for bad in ["vertex", "read=0.1,write=1.25", "read=x,write=1,lifetime_secs=1", "read=2,write=1,lifetime_secs=1"]
        {
            assert!(CachePricing::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_batch_pays_back_only_over_enough_turns_and_always_without_a_cache() {
        // 20k freed in front of 45k seen tokens, Anthropic: 1.15 x 45k - 1.25 x 20k = 26.75k
        // extra now; 2k saved per later turn, so 14 turns pay it back.
        assert!(!pays_back(&CachePricing::ANTHROPIC, 13, 20_000, 45_000));
        assert!(pays_back(&CachePricing::ANTHROPIC, 14, 20_000, 45_000));
        assert!(pays_back(&CachePricing::NONE, 0, 1, 1_000_000));
    }

    #[test]
    fn pressure_and_a_cold_cache_decide_before_the_price() {
        let none = BTreeSet::new();
        let mut history = History {
            pruned_before: &none,
            seen_messages: 10,
            pricing: CachePricing::ANTHROPIC,
            turns: 1,
            idle: Some(Duration::from_secs(10)),
            pressure: false,
        };
        assert_eq!(decide(&history, 100, 1_000_000), None);
        history.idle = Some(Duration::from_secs(301));
        assert_eq!(decide(&history, 100, 1_000_000), Some(Reason::Cold));
        history.pressure = true;
        assert_eq!(decide(&history, 100, 1_000_000), Some(Reason::Pressure));
    }
}
