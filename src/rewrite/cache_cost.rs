//! The provider's prompt cache as a price list: what a request costs given how much of it the
//! cache already holds. One model, used by the pay-back rule to decide ([`super::payback`]) and by
//! the benchmarks to bill (`tests/common/provider.rs`), so the decision and the figures that judge
//! it cannot disagree about the arithmetic.
//!
//! Prefix caching as Anthropic and OpenAI bill it: the longest prefix of a request equal to one
//! cached is read at `read`; everything after it is written to the cache at `write` (Anthropic's
//! 1.25x) or sent as plain input (OpenAI's `write = 1`). Prices are relative to the base input
//! price, so costs are in base-price input tokens.

use super::payback::CachePricing;

/// A request of `tokens` prompt tokens whose first `cached` tokens the cache holds.
pub fn request(pricing: &CachePricing, tokens: u64, cached: u64) -> f64 {
    let cached = cached.min(tokens);
    pricing.read * cached as f64 + pricing.write * (tokens - cached) as f64
}

/// The next turns of a conversation on a warm cache: this request, `tokens` long, of which the
/// cache holds the first `cached`; then `later` more, each the previous prompt plus `growth` new
/// tokens (the agent's answer and what it adds), the previous prompt read from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turns {
    pub tokens: u64,
    pub cached: u64,
    pub later: u64,
    pub growth: u64,
}

impl Turns {
    /// What the turns cost, request by request.
    pub fn cost(&self, pricing: &CachePricing) -> f64 {
        let mut total = request(pricing, self.tokens, self.cached);
        let mut previous = self.tokens;
        for _ in 0..self.later {
            let next = previous.saturating_add(self.growth);
            total += request(pricing, next, previous);
            previous = next;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_what_is_cached_and_writes_the_rest() {
        // Anthropic: 10k cached at 0.1x, 2k written at 1.25x.
        assert!((request(&CachePricing::ANTHROPIC, 12_000, 10_000) - 3_500.0).abs() < 1e-6);
        // Nothing cached: every token at the write price; no cache at all: every token at 1x.
        assert!((request(&CachePricing::ANTHROPIC, 1_000, 0) - 1_250.0).abs() < 1e-6);
        assert!((request(&CachePricing::NONE, 1_000, 900) - 1_000.0).abs() < 1e-6);
        // A claimed cached part longer than the request is the request.
        assert!((request(&CachePricing::OPENAI, 100, 500) - 25.0).abs() < 1e-6);
    }

    #[test]
    fn later_turns_read_the_previous_prompt_and_write_what_they_add() {
        let turns = Turns { tokens: 10_000, cached: 8_000, later: 2, growth: 1_000 };
        // 8k read + 2k written, then 10k read + 1k written, then 11k read + 1k written.
        let expected = (0.8 + 2.5) * 1_000.0 + (1.0 + 1.25) * 1_000.0 + (1.1 + 1.25) * 1_000.0;
        assert!((turns.cost(&CachePricing::ANTHROPIC) - expected).abs() < 1e-6);
    }
}
