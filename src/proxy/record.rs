//! What the inspector keeps of one request: numbers and descriptors of what changed, and the
//! changed content only when an operator turns that on ([`crate::rewrite::content`]). A few hundred bytes
//! of JSON, appended to the conversation's bounded request log by the request's own commit.

use serde::{Deserialize, Serialize};

use super::outcome::RequestOutcome;
pub use super::outcome::{NAMED_IDS, Rewrite};
use crate::compaction::Recovery;
use crate::rewrite::ChangeKind;
use crate::rewrite::content::ContentChange;
use crate::session::Marks;

/// One request, as the inspector shows it. Sizes are in the provider's tokens: compactor's
/// estimates calibrated by what the session measured of the provider's tokenizer (`sent`,
/// `forwarded`, `window`, `threshold`, the changes), or the provider's own usage (`prompt`,
/// `cache_read`, `cache_write`, `output`). Zero and empty fields are left out of the JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestRecord {
    /// When the request arrived (Unix ms).
    pub at: u64,
    /// The request's number in its conversation (parallel requests may share one).
    #[serde(skip_serializing_if = "is_zero")]
    pub n: u64,
    pub id: String,
    pub route: String,
    /// The upstream's API family, whose cache prices the costs use.
    pub family: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
    pub status: u16,
    /// How the response ended (`complete`, `client_gone`...).
    pub outcome: String,
    /// compactor's own error code, when it answered instead of the upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Time from forwarding to the end of the response, in ms.
    #[serde(skip_serializing_if = "is_zero")]
    pub upstream_ms: u64,
    /// Tokens as the client sent them and as forwarded.
    pub sent: u32,
    pub forwarded: u32,
    /// The window the session works with and the size past which it compacts ahead of time, in
    /// the same units as `sent` (0: not known).
    #[serde(skip_serializing_if = "is_zero")]
    pub window: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub threshold: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
    /// Why this request changed content the provider had already cached, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The first pruned call ids (of `changes`' prune count).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pruned_ids: Vec<String>,
    /// Tokens a prune batch held back would free (waiting to pay back).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub held: u32,
    /// The compaction generation the forwarded body carried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compacted: Option<u32>,
    /// The overflow seen, and the rungs of its recovery in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overflow: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rungs: Vec<String>,
    /// Why a summary due to be prepared in the background was not (`capacity`, `body_budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_skipped: Option<String>,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub retries: u32,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub summary_calls: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub summary_ms: u64,
    /// The provider's usage: prompt tokens, of them read from and written to its cache, output.
    #[serde(skip_serializing_if = "is_zero")]
    pub prompt: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_read: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_write: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub output: u64,
    /// With `inspector.keep_content`: the changed items' original text (its head) and what
    /// replaced it, newest first, and how many more the byte bound left out.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub content: Vec<ContentChange>,
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub content_omitted: u32,
}

/// One kind of change to the request: how many items and the tokens it saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// `pruned`, `truncated`, `deduplicated`, `repaired`, `summarized`.
    pub kind: ChangeKind,
    pub items: u32,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub tokens: u32,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl RequestRecord {
    /// The record of a finished request from its log line's fields, its rewrite and its usage.
    pub fn of(log: &RequestOutcome, at_unix_ms: u64) -> Self {
        let (rewrite, usage) = (log.rewrite.as_deref(), log.usage.as_ref());
        let (sent, forwarded, pruned) = log.tokens.unwrap_or_default();
        let recovery: Option<&Recovery> = log.recovery.as_ref();
        let upstream_ms = match (log.forwarded_at, log.ended_at) {
            (Some(from), Some(to)) => to.saturating_duration_since(from).as_millis() as u64,
            _ => 0,
        };
        let mut record = Self {
            at: at_unix_ms,
            id: log.request_id.clone(),
            route: log.route.to_string(),
            family: log.family.to_string(),
            status: log.status,
            outcome: log.ending.as_str().to_string(),
            error: log.error.map(str::to_string),
            upstream_ms,
            sent,
            forwarded,
            retries: log.retries,
            overflow: recovery.and_then(|r| r.overflow.clone()),
            rungs: recovery.map(|r| r.rungs.clone()).unwrap_or_default(),
            background_skipped: recovery.and_then(|r| r.background_skipped).map(|skip| skip.label().to_string()),
            summary_calls: recovery.map_or(0, |r| r.summary_calls),
            summary_ms: recovery.map_or(0, |r| r.summary.as_millis() as u64),
            ..Self::default()
        };
        if let Some(usage) = usage {
            record.prompt = usage.prompt_tokens;
            record.cache_read = usage.cached_tokens;
            record.cache_write = usage.cache_write_tokens;
            record.output = usage.output_tokens;
        }
        if let Some(rewrite) = rewrite {
            record.model.clone_from(&rewrite.model);
            record.window = rewrite.window;
            record.threshold = rewrite.threshold;
            record.reason = rewrite.reason.map(str::to_string);
            record.pruned_ids.clone_from(&rewrite.pruned_ids);
            record.held = rewrite.held;
            record.compacted = rewrite.compacted;
            record.content.clone_from(&rewrite.content);
            record.content_omitted = rewrite.content_omitted;
            let kinds = [
                // The rungs of an overflow may have pruned more than the first rewrite.
                (ChangeKind::Pruned, pruned.max(rewrite.pruned), rewrite.saved_by_prune),
                (ChangeKind::Truncated, rewrite.truncated, rewrite.saved_by_truncate),
                (ChangeKind::Deduplicated, rewrite.deduped, rewrite.saved_by_dedupe),
                (ChangeKind::Repaired, rewrite.repaired, 0),
            ];
            for (kind, items, tokens) in kinds.into_iter().filter(|(_, items, _)| *items > 0) {
                record.changes.push(Change { kind, items: items as u32, tokens });
            }
        }
        if let Some(generation) = record.compacted {
            // What the summary took off is the rest of the difference.
            let other: u32 = record.changes.iter().map(|c| c.tokens).sum();
            let tokens = record.sent.saturating_sub(record.forwarded).saturating_sub(other);
            record.changes.push(Change { kind: ChangeKind::Summarized, items: generation, tokens });
        }
        record
    }

    /// What the session list filters on.
    pub fn marks(&self) -> Marks {
        Marks {
            pruned: self.changes.iter().any(|c| c.kind == ChangeKind::Pruned),
            compacted: self.compacted.is_some(),
            overflow: self.overflow.is_some(),
        }
    }

    /// The tokens this request's changes took off.
    pub fn saved(&self) -> u32 {
        self.sent.saturating_sub(self.forwarded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::RewriteReport;
    use crate::session::Usage;

    #[test]
    fn a_record_of_an_agent_turn_stays_a_few_hundred_bytes_and_reads_back() {
        let mut log = RequestOutcome::new("req-0000000000000042".into(), http::Method::POST, "messages");
        log.status = 200;
        log.tokens = Some((181_000, 92_000, 12));
        let report = RewriteReport {
            pruned: 12,
            truncated: 3,
            saved_by_prune: 60_000,
            saved_by_truncate: 9_000,
            pruned_call_ids: (0..12).map(|i| format!("toolu_01ABCDEFGHIJKLMNOPQRSTU{i:02}")).collect(),
            ..RewriteReport::default()
        };
        let sizes = crate::compaction::ProviderSizes {
            before: 181_000,
            after: 92_000,
            saved_by_prune: 60_000,
            saved_by_truncate: 9_000,
            saved_by_dedupe: 0,
        };
        let rewrite = Rewrite::of(&report, &sizes, "claude-sonnet-4-5-20250929", Some(2), 190_000, 150_000);
        let usage = Usage {
            prompt_tokens: 95_000,
            cached_tokens: 80_000,
            cache_write_tokens: 15_000,
            output_tokens: 900,
            message_count: 0,
            generation: 2,
        };
        (log.rewrite, log.usage) = (Some(Box::new(rewrite)), Some(usage));
        let record = RequestRecord::of(&log, 1_764_000_000_000);
        let json = serde_json::to_string(&record).unwrap();
        assert!(json.len() < 800, "{} bytes: {json}", json.len());
        let read: RequestRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(read, record);
        assert_eq!(read.pruned_ids.len(), NAMED_IDS);
        let kinds: Vec<&str> = read.changes.iter().map(|c| c.kind.label()).collect();
        assert_eq!(kinds, ["pruned", "truncated", "summarized"]);
        assert_eq!(read.marks(), Marks { pruned: true, compacted: true, overflow: false });
    }
}
