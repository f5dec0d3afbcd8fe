//! The stages before forwarding: identify the session, load its state, re-apply a stored
//! compaction, run the rewrite policies, and compact ahead of time when the estimate says the
//! request will not fit.

use bytes::Bytes;
use http::request::Parts;

use super::Proxy;
use crate::compaction::{agent, plan};
use crate::dialect::{Dialect, ParsedRequest};
use crate::rewrite::{RewriteReport, RewriteSettings};
use crate::route::Route;
use crate::session::state::CompactionRecord;
use crate::session::{SessionKey, SessionState, SessionUpdate};
use crate::telemetry::metric;

/// What the request looks like once compactor is done with it.
pub struct Prepared {
    pub body: Bytes,
    pub session: Option<SessionKey>,
    pub report: Option<RewriteReport>,
    /// What to add to the session once the request is on its way.
    pub update: Option<SessionUpdate>,
    /// What overflow recovery needs; `None` when compactor must not retry this request.
    pub recovery: Option<Recovery>,
    /// The compaction generation applied to this request.
    pub compacted: Option<u32>,
}

/// Everything the overflow ladder needs to derive a new body from the client's original.
pub struct Recovery {
    pub dialect: Dialect,
    pub route: Route,
    pub client_body: Bytes,
    pub key: String,
    pub state: SessionState,
    pub message_count: usize,
    /// The record applied to the body being sent, if any.
    pub record: Option<CompactionRecord>,
}

impl Prepared {
    fn untouched(body: Bytes) -> Self {
        Self { body, session: None, report: None, update: None, recovery: None, compacted: None }
    }
}

/// A Responses request whose history is stored upstream.
fn is_stateful(parsed: &ParsedRequest) -> bool {
    ["previous_response_id", "conversation"].iter().any(|key| parsed.top.get(key).is_some_and(|v| v.get() != "null"))
}

/// Codex's newest compaction: a `compaction_trigger` item that expects one `compaction` item back.
fn asks_for_compaction_item(parsed: &ParsedRequest) -> bool {
    parsed.dialect == Dialect::Responses
        && parsed.messages.iter().any(|m| m.object.str("type").as_deref() == Some("compaction_trigger"))
}

impl Proxy {
    /// Identifies the session and rewrites the body when the endpoint is one compactor
    /// understands; anything it cannot parse is forwarded exactly as it came.
    pub(super) async fn prepare(&self, route: Route, parts: &Parts, body: Bytes) -> Prepared {
        let Some(dialect) = Dialect::of(route.endpoint) else { return Prepared::untouched(body) };
        let Some(parsed) = ParsedRequest::parse(dialect, &body) else {
            metric::rewrite_skipped(route.label(), "unparsed");
            return Prepared::untouched(body);
        };
        let session = self.identifier.identify(&parts.headers, Some(&parsed));
        if is_stateful(&parsed) {
            // The history lives at the provider (previous_response_id, conversation): compactor
            // cannot see it, so it changes nothing.
            metric::rewrite_skipped(route.label(), "stateful");
            return Prepared::untouched(body.clone());
        }
        if agent::is_agent_compaction(&parsed, &self.compaction.agent_markers) || asks_for_compaction_item(&parsed) {
            // The agent is summarizing its own history: stay out of its way.
            metric::rewrite_skipped(route.label(), "agent_compaction");
            let mut prepared = Prepared::untouched(body.clone());
            prepared.session = Some(session);
            return prepared;
        }
        let state = match self.store.load(session.as_str()).await {
            Ok(state) => state,
            Err(error) => {
                // Without stored decisions the policies still work; they just start afresh.
                self.warn_store(&error);
                SessionState::default()
            }
        };
        let record = plan::matching_record(&parsed, &state.compactions).cloned();
        let message_count = parsed.messages.len();
        let mut recovery = Recovery {
            dialect,
            route,
            client_body: body.clone(),
            key: session.key.clone(),
            state,
            message_count,
            record,
        };
        // The parse is handed on to the rewrite rather than repeated.
        let derived = self.derive_from(&recovery, &self.rewriter.settings, Some(parsed)).await;
        let Some((mut sent, mut report)) = derived else {
            return Prepared::untouched(body.clone());
        };
        let mut update = SessionUpdate {
            pruned: Vec::new(),
            tokens_saved: u64::from(report.tokens_before.saturating_sub(report.tokens_after)),
            count_request: true,
            ..Default::default()
        };

        if self.compaction.auto && !self.breaker_open(&recovery) {
            let requested = recovery.state.counters.compact_requested > 0;
            if requested || self.over_threshold(&recovery, &report, true) {
                let trigger = if requested { "admin" } else { "threshold" };
                if let Some((new_body, new_report)) = self.compact_ahead(parts, &mut recovery, trigger, &report).await {
                    sent = new_body;
                    report = new_report;
                }
            }
        }
        update.pruned =
            report.pruned_call_ids.iter().filter(|id| !recovery.state.pruned.contains(*id)).cloned().collect();
        metric::rewrite_done(route.label(), &report, sent != body);
        let compacted = recovery.record.as_ref().map(|r| r.generation);
        Prepared {
            body: sent,
            session: Some(session),
            report: Some(report),
            update: Some(update),
            recovery: Some(recovery),
            compacted,
        }
    }

    /// The body to send for the client's request: the applicable record re-applied, then the
    /// rewrite policies with `settings`.
    pub(super) async fn derive(
        &self,
        recovery: &Recovery,
        settings: &RewriteSettings,
    ) -> Option<(Bytes, RewriteReport)> {
        self.derive_from(recovery, settings, None).await
    }

    /// [`Proxy::derive`] reusing the client's request when the caller already parsed it.
    async fn derive_from<'c>(
        &self,
        recovery: &'c Recovery,
        settings: &RewriteSettings,
        client: Option<ParsedRequest<'c>>,
    ) -> Option<(Bytes, RewriteReport)> {
        let mut client = match client {
            Some(parsed) => parsed,
            None => ParsedRequest::parse(recovery.dialect, &recovery.client_body)?,
        };
        let Some(record) = &recovery.record else {
            let mut rewritten = self.rewriter.rewrite_with(&mut client, &recovery.state.pruned, settings).await;
            let body = rewritten.body.take().map(Bytes::from).unwrap_or_else(|| recovery.client_body.clone());
            return Some((body, rewritten.report));
        };
        // The client sent more than goes out: "before" counts the client's whole history.
        let model = self.rewriter.count(&mut client).await;
        let tokens_before = crate::rewrite::Rewriter::scaled(client.conversation.tokens_before(), model);
        let count = |text: &str| self.rewriter.counter.count(model.encoding, text);
        let rebuilt = plan::rebuild(&client, record, &self.compaction.summary_prefix, &count)?;
        let mut parsed = ParsedRequest::parse(recovery.dialect, &rebuilt)?;
        let mut rewritten = self.rewriter.rewrite_with(&mut parsed, &recovery.state.pruned, settings).await;
        rewritten.report.tokens_before = tokens_before;
        rewritten.report.message_count = client.messages.len();
        let body = rewritten.body.take().unwrap_or_else(|| rebuilt.clone());
        Some((Bytes::from(body), rewritten.report))
    }

    /// True when the session's estimate (hybrid, or the full count) exceeds `threshold` x (window
    /// - output reserve).
    pub(super) fn over_threshold(&self, recovery: &Recovery, report: &RewriteReport, hybrid: bool) -> bool {
        let window = match recovery.state.counters.learned_window {
            0 => u64::from(report.model.context_window),
            learned => learned,
        };
        let reserve = report.max_tokens.unwrap_or(u64::from(report.model.max_output_tokens)).min(window / 2);
        let budget = (window.saturating_sub(reserve) as f64 * self.compaction.threshold) as u64;
        let estimate = if hybrid { self.estimate(recovery, report) } else { u64::from(report.tokens_after) };
        estimate > budget
    }

    /// Hybrid estimate: the last prompt size the upstream reported plus an estimate of only what
    /// was added since; a full count when there is no usable report.
    fn estimate(&self, recovery: &Recovery, report: &RewriteReport) -> u64 {
        let full = u64::from(report.tokens_after);
        let Some(usage) = recovery.state.usage else { return full };
        let since = usage.message_count as usize;
        if usage.prompt_tokens == 0 || since == 0 || since > recovery.message_count {
            return full;
        }
        let added = recovery.message_count - since;
        let tail: u32 = report.message_tokens.iter().rev().take(added).sum();
        usage.prompt_tokens + u64::from(crate::rewrite::Rewriter::scaled(tail, report.model))
    }

    /// Whether this session failed to compact too often, on this same conversation.
    pub(super) fn breaker_open(&self, recovery: &Recovery) -> bool {
        let counters = &recovery.state.counters;
        counters.compaction_failures >= u64::from(self.compaction.max_failures)
            && counters.failures_at_messages == recovery.message_count as u64
    }
}
