//! When changing what the provider has already cached is worth it. Providers bill the part of a
//! request that equals the previous one at a cache-read price and re-write (or re-prefill)
//! everything after the first changed token, so a rewrite of old content costs where it happens,
//! not what it removes. A pending rewrite of old content (a prune batch) goes only when:
//!
//! - the window needs it (`pressure`, decided by compaction's budget), or
//! - the provider has no cache, or the cache is cold anyway (the conversation idle longer than
//!   the cache's lifetime): the rewrite costs nothing extra, or
//! - it pays back: priced by the cache model ([`super::cache_cost`]), this request and the turns
//!   the conversation will run with high probability ([`History::later_turns`], measured per
//!   model by the deployment: [`crate::session::runs`]) cost less with the rewrite than without.
//!
//! The arithmetic, in base-price tokens, for a batch that frees `f` tokens with `a` seen tokens
//! after its first change (the placeholders included): now, the rewrite re-writes `a` instead of
//! reading `a + f`, an extra `(write − read) × a − read × f`; each later turn reads `f` fewer
//! tokens, `read × f`. With no measured horizon nothing below pressure pays back.

use std::collections::BTreeSet;
use std::time::Duration;

use super::cache_cost::Turns;
pub use super::cache_cost::{CachePricing, LOCAL_READ};

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
    /// Turns the conversation will still run on a warm cache after this request, with high
    /// probability (the deployment's measured horizon; 0 when it has measured nothing).
    pub later_turns: u64,
    /// Time since the conversation's previous request; `None` for its first.
    pub idle: Option<Duration>,
    /// The window needs room: rewrite whatever helps, whatever it costs.
    pub pressure: bool,
}

impl<'a> History<'a> {
    /// No cache, nothing seen: every policy acts at once (tests, benchmarks, the fuzzers).
    pub fn eager(pruned_before: &'a BTreeSet<String>) -> Self {
        Self {
            pruned_before,
            seen_messages: 0,
            pricing: CachePricing::NONE,
            later_turns: 0,
            idle: None,
            pressure: false,
        }
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

/// A pending rewrite of content the provider has seen, in tokens as they would be sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    /// Seen tokens before the rewrite's first change: still read from the cache.
    pub before: u64,
    /// Tokens the rewrite removes.
    pub freed: u64,
    /// Seen tokens from the first change on that stay (what replaces the removed ones included):
    /// re-written instead of read.
    pub after: u64,
    /// Tokens the provider has not seen (this turn's new messages), sent either way.
    pub new: u64,
}

/// Whether a pending rewrite of seen content should go now, and why.
pub fn decide(history: &History, pending: &Pending) -> Option<Reason> {
    if history.pressure {
        return Some(Reason::Pressure);
    }
    if !history.pricing.caches() {
        return Some(Reason::NoCache);
    }
    if history.cold() {
        return Some(Reason::Cold);
    }
    pays_back(&history.pricing, history.later_turns, pending).then_some(Reason::PaysBack)
}

/// The pay-back rule: this request and `later` more cost no more with the rewrite than without,
/// priced by the cache model. Each later turn is assumed to add as much as this one did (it adds
/// the same both ways, so it does not move the decision).
pub fn pays_back(pricing: &CachePricing, later: u64, pending: &Pending) -> bool {
    let seen = pending.before + pending.freed + pending.after;
    let kept = Turns { tokens: seen + pending.new, cached: seen, later, growth: pending.new };
    let rewritten =
        Turns { tokens: seen - pending.freed + pending.new, cached: pending.before, later, growth: pending.new };
    rewritten.cost(pricing) <= kept.cost(pricing)
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
        assert_eq!(CachePricing::parse("Local"), Ok(CachePricing::LOCAL));
        assert_eq!(CachePricing::LOCAL.to_string(), "local");
        for bad in ["vertex", "read=0.1,write=1.25", "read=x,write=1,lifetime_secs=1", "read=2,write=1,lifetime_secs=1"]
        {
            assert!(CachePricing::parse(bad).is_err(), "{bad}");
        }
    }

    /// Bills a run of requests block by block, as a provider would: each request reads from the
    /// cache the blocks it shares, from the start, with the one before, and writes the rest.
    fn bill(pricing: &CachePricing, cached_first: usize, requests: &[Vec<(&str, u64)>]) -> f64 {
        let mut total = 0.0;
        for (index, blocks) in requests.iter().enumerate() {
            let tokens: u64 = blocks.iter().map(|(_, t)| t).sum();
            let shared = match index {
                0 => cached_first,
                _ => blocks.iter().zip(&requests[index - 1]).take_while(|(a, b)| a == b).count(),
            };
            let cached: u64 = blocks[..shared].iter().map(|(_, t)| t).sum();
            total += super::super::cache_cost::request(pricing, tokens, cached);
        }
        total
    }

    #[test]
    fn a_batch_goes_from_the_turn_count_where_the_bill_says_it_pays_back() {
        // The example: 20k of old output in front of 45k seen tokens, 1k new per turn.
        // The provider cached [system, old output, tail]; the rewrite swaps the old output for a
        // 10-token placeholder. Each side billed turn by turn; the break-even is where the bills
        // cross, whatever formula the rule uses.
        let (system, old, placeholder, tail, new) = (5_000, 20_010, 10, 45_000, 1_000);
        let run = |first: (&'static str, u64), later: usize| -> Vec<Vec<(&str, u64)>> {
            (0..=later)
                .map(|turn| {
                    let mut blocks = vec![("system", system), first, ("tail", tail)];
                    blocks.extend((0..=turn).map(|i| (["n0", "n1", "n2", "n3"][i % 4], new + i as u64)));
                    blocks
                })
                .collect()
        };
        let pending = Pending { before: system, freed: old - placeholder, after: tail + placeholder, new };
        for pricing in [CachePricing::ANTHROPIC, CachePricing::OPENAI, CachePricing::LOCAL] {
            let break_even = (0..1_000)
                .find(|&later| {
                    let kept = bill(&pricing, 3, &run(("old", old), later));
                    let rewritten = bill(&pricing, 1, &run(("placeholder", placeholder), later));
                    rewritten <= kept
                })
                .unwrap();
            assert!(break_even > 1, "{pricing}: a real cost to pay back");
            assert!(pays_back(&pricing, break_even as u64, &pending), "{pricing}: pays back at {break_even} turns");
            assert!(
                !pays_back(&pricing, break_even as u64 - 1, &pending),
                "{pricing}: does not pay back at {} turns",
                break_even - 1
            );
        }
        assert!(pays_back(&CachePricing::NONE, 0, &Pending { before: 0, freed: 1, after: 1_000_000, new: 0 }));
    }

    #[test]
    fn a_local_server_keeps_old_outputs_where_a_billed_cache_would_prune_them() {
        // The worked example: 20k of old output in front of 45k seen tokens, 1k new per turn.
        let pending = Pending { before: 5_000, freed: 20_000, after: 45_010, new: 1_000 };
        assert!(pays_back(&CachePricing::OPENAI, 6, &pending), "at OpenAI's prices 6 later turns pay it back");
        // Locally a cached token costs 6 % of a prefilled one: dropping 20k cached tokens saves
        // little per turn, and re-prefilling 45k costs 45k tokens' worth of prefill time now
        // (docs/local-server.md: about 35 later turns).
        assert!(!pays_back(&CachePricing::LOCAL, 6, &pending));
        assert!(!pays_back(&CachePricing::LOCAL, 30, &pending));
        assert!(pays_back(&CachePricing::LOCAL, 40, &pending), "it pays back only on long runs");
        // An idle local conversation is not cold: its KV cache waits for it.
        let none = BTreeSet::new();
        let history = History {
            pruned_before: &none,
            seen_messages: 10,
            pricing: CachePricing::LOCAL,
            later_turns: 6,
            idle: Some(Duration::from_secs(3_600)),
            pressure: false,
        };
        assert_eq!(decide(&history, &pending), None);
    }

    #[test]
    fn pressure_and_a_cold_cache_decide_before_the_price() {
        let none = BTreeSet::new();
        let mut history = History {
            pruned_before: &none,
            seen_messages: 10,
            pricing: CachePricing::ANTHROPIC,
            later_turns: 1,
            idle: Some(Duration::from_secs(10)),
            pressure: false,
        };
        let pending = Pending { before: 1_000, freed: 100, after: 1_000_000, new: 100 };
        assert_eq!(decide(&history, &pending), None);
        history.idle = Some(Duration::from_secs(301));
        assert_eq!(decide(&history, &pending), Some(Reason::Cold));
        history.pressure = true;
        assert_eq!(decide(&history, &pending), Some(Reason::Pressure));
    }
}
