//! One compaction: take the session's lock (or wait for the request that holds it), summarize the
//! older part of the conversation, build the record that replaces it, and publish the record
//! before the lock is released.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::ladder::Ladder;
use super::lock::{self, CompactionLock};
use super::settings::CompactionSettings;
use super::summarizer::{Summarizer, SummaryError, SummaryInput};
use super::{budget, plan};
use crate::dialect::ParsedRequest;
use crate::rewrite::Rewriter;
use crate::session::SessionCtx;
use crate::session::state::CompactionRecord;
use crate::telemetry::metric;
use crate::upstream::RequestHead;

/// How much longer than a summary call the lock is held at most, should its holder vanish.
const LOCK_MARGIN: Duration = Duration::from_secs(10);

/// Why a compaction did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error("nothing left to summarize")]
    NothingToSummarize,
    #[error("another request of this session is compacting it")]
    Busy,
    #[error("summary call failed")]
    SummaryFailed(#[source] SummaryError),
}

/// What one compaction needs, borrowed from the [`super::Compactor`].
pub(super) struct Compaction<'c> {
    pub settings: &'c CompactionSettings,
    pub rewriter: &'c Rewriter,
    pub summarizer: &'c Summarizer,
}

impl Compaction<'_> {
    /// Summarizes the older history in a separate tool-less call and publishes the record. One
    /// compaction per session at a time: a request that finds the lock taken waits for the
    /// winner's record and reuses it.
    pub(super) async fn run(
        &self,
        head: &RequestHead,
        ladder: &Ladder,
        ctx: &mut SessionCtx,
        harder: bool,
        trigger: &'static str,
    ) -> Result<CompactionRecord, CompactError> {
        let generation = ctx.state().compactions.iter().map(|r| r.generation).max().unwrap_or(0);
        let Some(lock) = CompactionLock::claim(ctx, self.settings.summary_timeout + LOCK_MARGIN).await else {
            let client =
                ParsedRequest::parse(ladder.dialect, &ladder.client_body).ok_or(CompactError::NothingToSummarize)?;
            return lock::await_winner(ctx, &client, generation, self.settings.lock_wait)
                .await
                .ok_or(CompactError::Busy);
        };
        let result = self.summarize(head, ladder, ctx, harder, trigger, generation + 1).await;
        // Published before the lock goes: the requests waiting for it look for this record.
        match &result {
            Ok(record) => {
                ctx.publish_compaction(record).await;
            }
            Err(CompactError::SummaryFailed(_)) => {
                ctx.publish_failure(ladder.message_count).await;
            }
            Err(_) => {}
        }
        lock.release(ctx).await;
        metric::compaction(trigger, if result.is_ok() { "summarized" } else { "failed" });
        result
    }

    /// The new record: where to cut, the summary of what comes before the cut, the user's own
    /// messages kept from it, and the sizes before and after.
    async fn summarize(
        &self,
        head: &RequestHead,
        ladder: &Ladder,
        ctx: &SessionCtx,
        harder: bool,
        trigger: &'static str,
        generation: u32,
    ) -> Result<CompactionRecord, CompactError> {
        let settings = self.settings;
        let mut parsed =
            ParsedRequest::parse(ladder.dialect, &ladder.client_body).ok_or(CompactError::NothingToSummarize)?;
        let model = self.rewriter.count(&mut parsed).await;
        let count = |text: &str| self.rewriter.counter.count(model.encoding, text);
        let previous = ladder.record.as_ref();
        let after = previous.map_or(0, |r| r.covered_messages as usize);
        let (keep, user_budget) = budget::kept_tokens(settings, harder);
        let cut = plan::choose_cut(&parsed, keep, after.max(parsed.lead()).saturating_sub(1).max(after))
            .ok_or(CompactError::NothingToSummarize)?;

        let summary_model = match settings.model.as_str() {
            "" => parsed.model.as_deref().unwrap_or("").to_string(),
            configured => configured.to_string(),
        };
        let summarizer = self.rewriter.models.lookup(&summary_model);
        let max_tokens = settings.summary_max_tokens.min(summarizer.max_output_tokens);
        let input = SummaryInput {
            parsed: &parsed,
            from: after.max(parsed.lead()),
            cut,
            previous: previous.map(|r| r.summary.as_str()),
            model: &summary_model,
            max_tokens,
            budget: budget::transcript_budget(summarizer, max_tokens, self.summarizer.prompt_tokens(&count)),
            count: &count,
        };
        let summary = self.summarizer.summarize(head, input).await.map_err(CompactError::SummaryFailed)?;
        let mut record = CompactionRecord {
            generation,
            summary,
            covered_messages: cut as u64,
            covered_hash: plan::prefix_hash(&parsed, cut),
            first_kept: cut as u64,
            user_messages: plan::user_messages(&parsed, cut, user_budget),
            truncate_user_tokens: budget::user_message_cap(settings, harder),
            tokens_before: u64::from(Rewriter::scaled(parsed.conversation.tokens_before(), model)),
            tokens_after: 0,
            trigger: trigger.to_string(),
            model: summary_model,
            at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        };
        if let Some(rebuilt) = plan::rebuild(&parsed, &record, &settings.summary_prefix, &count)
            && let Some(mut after) = ParsedRequest::parse(ladder.dialect, &rebuilt)
        {
            self.rewriter.count_items(&mut after, model.encoding);
            record.tokens_after = u64::from(Rewriter::scaled(after.conversation.tokens_before(), model));
        }
        tracing::info!(
            session = %ctx.key().as_str(),
            trigger = %trigger,
            generation,
            tokens_before = record.tokens_before,
            tokens_after = record.tokens_after,
            covered_messages = cut,
            "compacted"
        );
        Ok(record)
    }
}
