//! The body a request goes as: the record its ladder carries re-applied (the summary and the
//! kept tail rebuilt as the client's dialect), then the rewrite's policies with the
//! conversation's history. Owned by [`Compaction`], so the request path and the work done off it
//! (a summary prepared in the background, a prefill ahead) rebuild a body the same way.

use bytes::Bytes;

use super::compact::Compaction;
use super::ladder::Ladder;
use super::plan;
use crate::dialect::ParsedRequest;
use crate::rewrite::{History, RewriteReport, RewriteSettings, Rewriter};
use crate::session::SessionCtx;
use crate::work;

impl Compaction<'_> {
    /// The body to send for the client's request: the ladder's record re-applied, then the
    /// rewrite policies with `settings`; `pressure`: the window needs room, so old content is
    /// rewritten whatever it costs the prompt cache.
    pub(super) async fn derive(
        &self,
        ladder: &Ladder,
        ctx: &SessionCtx,
        settings: &RewriteSettings,
        pressure: bool,
    ) -> Option<(Bytes, RewriteReport)> {
        self.derive_from(ladder, ctx, settings, None, pressure).await
    }

    /// [`Compactor::derive`] reusing the client's request when the caller already parsed it.
    pub(super) async fn derive_from<'c>(
        &self,
        ladder: &'c Ladder,
        ctx: &SessionCtx,
        settings: &RewriteSettings,
        client: Option<ParsedRequest<'c>>,
        pressure: bool,
    ) -> Option<(Bytes, RewriteReport)> {
        let mut client = match client {
            Some(parsed) => parsed,
            None => work::step(|| ladder.parse(&ladder.client_body)).await.ok()??,
        };
        let conversation = ctx.conversation();
        // What the provider saw: the previous request's messages, as the client counts them.
        let seen_by_client = usize::try_from(conversation.messages).unwrap_or(usize::MAX);
        let prune = &settings.prune;
        let later_turns = ctx.later_turns(ladder.cache.lifetime, prune.payback_confidence, &prune.assumed_runs);
        let history = |seen_messages: usize| History {
            pruned_before: &conversation.pruned,
            seen_messages,
            pricing: ladder.cache,
            later_turns,
            idle: ctx.idle(),
            pressure,
        };
        let Some(record) = &ladder.record else {
            let history = history(seen_by_client);
            let mut rewritten = self.rewriter.rewrite_with(&mut client, &history, settings).await.ok()?;
            let body = rewritten.body.take().map(Bytes::from).unwrap_or_else(|| ladder.client_body.clone());
            return Some((body, rewritten.report));
        };
        // The client sent more than goes out: "before" counts the client's whole history.
        let model = self.rewriter.count(&mut client).await.ok()?;
        let tokens_before = Rewriter::scaled(client.conversation.tokens_before(), model);
        let count = |text: &str| self.rewriter.counter.count(model.encoding, text);
        let rebuild = || plan::rebuild(&client, record, &self.settings.summary_prefix, &count);
        let rebuilt = work::step(rebuild).await.ok()??;
        // Counting the turns the summary stands for, the kept calls keep the client's ids.
        let summarized = plan::summarized_turns(&client, record);
        let mut parsed = work::step(|| ladder.parse_rebuilt(&rebuilt, summarized)).await.ok()??;
        // The client's newest messages end the rebuilt conversation too.
        let added = client.messages.len().saturating_sub(seen_by_client);
        let history = history(parsed.messages.len().saturating_sub(added));
        let mut rewritten = self.rewriter.rewrite_with(&mut parsed, &history, settings).await.ok()?;
        rewritten.report.tokens_before = tokens_before;
        rewritten.report.message_count = client.messages.len();
        rewritten.report.compaction = record.generation;
        let body = rewritten.body.take().unwrap_or_else(|| rebuilt.clone());
        Some((Bytes::from(body), rewritten.report))
    }
}
