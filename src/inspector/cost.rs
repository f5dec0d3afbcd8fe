//! What each request cost under its upstream's cache prices, next to what it would have cost had
//! compactor forwarded it unchanged. Input side only, in base-price input tokens (the unit of
//! [`crate::rewrite::cache_cost`], whose arithmetic this uses).
//!
//! With compactor: the provider's own usage (tokens read from its cache, written to it, and the
//! rest at the base price). Unchanged: a request compactor left alone costs what it cost; one it
//! changed is priced as the client's request, scaled from compactor's estimate to the provider's
//! tokens by this request's own ratio, with the cache holding the previous unchanged request when
//! that came within the cache's lifetime (an append-only conversation's cache). An estimate, and
//! said so on the pages.
//!
//! Summary calls (a compaction's, ahead of time, on an overflow or in the background) are calls of
//! their own that an unchanged conversation would not make: their usage, kept on the compaction
//! record, is priced the same way and added to the cost with compactor ([`summaries`]).

use crate::rewrite::CachePricing;
use crate::rewrite::cache_cost;
use crate::session::{CompactionRecord, SummaryCost};

use crate::proxy::record::RequestRecord;

/// One request's costs; `None` when the provider reported no usage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    pub with: Option<f64>,
    pub without: Option<f64>,
}

/// The costs of a conversation's requests, in order (oldest first). `pricing` gives the cache
/// prices of an API family.
pub fn of(records: &[RequestRecord], pricing: impl Fn(&str) -> CachePricing) -> Vec<Costs> {
    let mut previous: Option<(u64, f64)> = None; // (at, unchanged prompt tokens)
    records
        .iter()
        .map(|record| {
            let prices = pricing(&record.family);
            if record.prompt == 0 {
                previous = None;
                return Costs { with: None, without: None };
            }
            let uncached = record.prompt.saturating_sub(record.cache_read).saturating_sub(record.cache_write);
            let with =
                prices.read * record.cache_read as f64 + prices.write * record.cache_write as f64 + uncached as f64;
            let (without, unchanged) = if record.sent <= record.forwarded {
                (with, record.prompt as f64)
            } else {
                let scale = record.prompt as f64 / f64::from(record.forwarded.max(1));
                let unchanged = f64::from(record.sent) * scale;
                let warm =
                    previous.filter(|(at, _)| record.at.saturating_sub(*at) < prices.lifetime.as_millis() as u64);
                let cached = warm.map_or(0.0, |(_, tokens)| tokens.min(unchanged));
                (cache_cost::request(&prices, unchanged as u64, cached as u64), unchanged)
            };
            previous = Some((record.at, unchanged));
            Costs { with: Some(with), without: Some(without) }
        })
        .collect()
}

/// The input side of a compaction's summary calls: what they read from the provider's cache at
/// the read price, wrote to it at the write price, the rest at the base price.
pub fn summary(cost: &SummaryCost, prices: &CachePricing) -> f64 {
    let uncached = cost.input.saturating_sub(cost.cache_read).saturating_sub(cost.cache_write);
    prices.read * cost.cache_read as f64 + prices.write * cost.cache_write as f64 + uncached as f64
}

/// The summary calls' costs, by the request each lands on (oldest first, as `records`): the
/// newest request that arrived before the record was stored (the one that made it, or for a
/// summary prepared in the background, the newest request before it was ready; the first one
/// when it came before every recorded request). Priced with the family of that request.
pub fn summaries(
    records: &[RequestRecord],
    compactions: &[CompactionRecord],
    pricing: impl Fn(&str) -> CachePricing,
) -> Vec<f64> {
    let mut at = vec![0.0; records.len()];
    for compaction in compactions.iter().filter(|c| !c.cost.is_empty()) {
        let Some(last) = records.len().checked_sub(1) else { break };
        let landed = records.iter().rposition(|r| r.at <= compaction.at_unix_ms).unwrap_or(0).min(last);
        at[landed] += summary(&compaction.cost, &pricing(&records[landed].family));
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(at: u64, sent: u32, forwarded: u32, prompt: u64, read: u64, write: u64) -> RequestRecord {
        RequestRecord {
            at,
            sent,
            forwarded,
            prompt,
            cache_read: read,
            cache_write: write,
            family: "anthropic".into(),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn an_unchanged_request_costs_what_the_provider_billed_and_a_changed_one_is_priced_as_sent() {
        let records = [
            record(0, 1_000, 1_000, 1_000, 0, 1_000),
            // Pruned to half; without compactor the cache would hold the previous 1,000 tokens.
            record(1_000, 2_000, 1_000, 1_000, 800, 200),
        ];
        let costs = of(&records, |_| CachePricing::ANTHROPIC);
        assert_eq!(costs[0].with, Some(1_250.0));
        assert_eq!(costs[0].without, costs[0].with);
        assert!((costs[1].with.unwrap() - (80.0 + 250.0)).abs() < 1e-9);
        // 2,000 unchanged tokens, 1,000 of them cached: 100 + 1,250.
        assert!((costs[1].without.unwrap() - 1_350.0).abs() < 1e-9, "{:?}", costs[1]);
        let none = of(&[record(0, 10, 5, 0, 0, 0)], |_| CachePricing::ANTHROPIC);
        assert_eq!(none[0], Costs { with: None, without: None });
    }

    #[test]
    fn a_summary_call_lands_on_the_newest_request_before_its_record_at_the_cache_prices() {
        let records =
            [record(1_000, 10, 10, 10, 0, 0), record(2_000, 10, 10, 10, 0, 0), record(3_000, 10, 10, 10, 0, 0)];
        let compaction = |at_unix_ms: u64, input: u64, cache_read: u64| CompactionRecord {
            trigger: "background".into(),
            at_unix_ms,
            cost: SummaryCost { calls: 1, input, cache_read, output: 500, ..SummaryCost::default() },
            ..CompactionRecord::blank(1)
        };
        // Ready after the second request arrived; one before any request; one with no cost.
        let mut free = compaction(2_500, 0, 0);
        free.cost = SummaryCost::default();
        let compactions = [compaction(2_500, 10_000, 8_000), compaction(500, 1_000, 0), free];
        let costs = summaries(&records, &compactions, |_| CachePricing::ANTHROPIC);
        // 8,000 read at 0.1 and 2,000 at the base price; the output is not an input cost.
        assert_eq!(costs, [1_000.0, 2_800.0, 0.0]);
        assert!(summaries(&[], &compactions, |_| CachePricing::ANTHROPIC).is_empty());
    }
}
