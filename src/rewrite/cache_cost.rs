//! The provider's prompt cache as a price list: what a request costs given how much of it the
//! cache already holds. One model, used by the pay-back rule to decide ([`super::payback`]) and by
//! the benchmarks to bill (`tests/common/provider.rs`), so the decision and the figures that judge
//! it cannot disagree about the arithmetic.
//!
//! Prefix caching as Anthropic and OpenAI bill it: the longest prefix of a request equal to one
//! cached is read at `read`; everything after it is written to the cache at `write` (Anthropic's
//! 1.25x) or sent as plain input (OpenAI's `write = 1`). Prices are relative to the base input
//! price, so costs are in base-price input tokens.

use std::time::Duration;

use serde::{Serialize, Serializer};

/// The `local` preset's cached-token price: seconds per token read from a local server's KV
/// cache over seconds per token prefilled again (measured: docs/local-server.md).
pub const LOCAL_READ: f64 = 0.06;

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

    /// A local inference server (llama.cpp, vLLM, SGLang, Ollama): the price is time. It keeps the
    /// previous prompt's KV cache and re-runs prefill from the first changed token, so a token
    /// after a change costs a prefilled token (`write = 1`, no surcharge: there is no bill) and a
    /// cached one about what skipping it costs: `read` is the seconds per cached token over the
    /// seconds per re-prefilled token measured on llama-cpp-python with SmolLM2-135M
    /// (docs/local-server.md). Entries do not expire with time but are evicted by the next
    /// prompt that does not share them, so the lifetime is a day: an idle conversation is not
    /// "cold" just for waiting.
    pub const LOCAL: Self =
        Self { read: LOCAL_READ, write: 1.0, lifetime: Duration::from_secs(86_400), preset: Some("local") };

    /// `anthropic`, `openai`, `gemini`, `local`, `none`, or custom numbers: `read=0.1,write=1.25,lifetime_secs=300`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "anthropic" => return Ok(Self::ANTHROPIC),
            "openai" => return Ok(Self::OPENAI),
            "gemini" => return Ok(Self::GEMINI),
            "local" => return Ok(Self::LOCAL),
            "none" => return Ok(Self::NONE),
            _ => {}
        }
        let expected = "expected anthropic, openai, gemini, local, none or read=R,write=W,lifetime_secs=S (e.g. read=0.1,write=1.25,lifetime_secs=300)";
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
