//! The token budget: the window a session works with (the one an overflow error named, else the
//! model table's), when a conversation's estimate crosses the compaction threshold, the hybrid
//! estimate, the conversation's circuit breaker, and the sizes the harder rungs use. Pure
//! arithmetic, no I/O.

use super::settings::CompactionSettings;
use crate::overflow::Overflow;
use crate::rewrite::{RewriteReport, RewriteSettings, Rewriter};
use crate::session::{Breaker, ConversationState, SessionState};
use crate::tokens::ModelInfo;

/// The window an overflow error named, worth remembering for the session's later estimates.
pub fn window_named(overflow: &Overflow) -> Option<u64> {
    overflow.limit.filter(|limit| *limit > 0)
}

/// True when the conversation's estimate (hybrid, or the full count) exceeds `threshold` x
/// (the session's window - output reserve). `message_count`: messages of the client's request.
pub fn over_threshold(
    settings: &CompactionSettings,
    session: &SessionState,
    conversation: &ConversationState,
    message_count: usize,
    report: &RewriteReport,
    hybrid: bool,
) -> bool {
    let estimate = if hybrid { estimate(conversation, message_count, report) } else { u64::from(report.tokens_after) };
    estimate > room(session, report, settings.threshold)
}

/// Window pressure for the rewrite policies: the conversation's hybrid estimate exceeds `share` x
/// (the session's window - output reserve) (`prune.pressure`). Above it a held-back prune batch
/// goes whatever it costs the prompt cache. The one place the rewrite asks about the window.
pub fn window_pressure(
    share: f64,
    session: &SessionState,
    conversation: &ConversationState,
    message_count: usize,
    report: &RewriteReport,
) -> bool {
    estimate(conversation, message_count, report) > room(session, report, share)
}

/// `share` x (the session's window - output reserve).
fn room(session: &SessionState, report: &RewriteReport, share: f64) -> u64 {
    let window = match session.counters.learned_window {
        0 => u64::from(report.model.context_window),
        learned => learned,
    };
    let reserve = report.max_tokens.unwrap_or(u64::from(report.model.max_output_tokens)).min(window / 2);
    (window.saturating_sub(reserve) as f64 * share) as u64
}

/// Hybrid estimate: the last prompt size the upstream reported plus an estimate of only what was
/// added since; a full count when there is no usable report.
fn estimate(conversation: &ConversationState, message_count: usize, report: &RewriteReport) -> u64 {
    let full = u64::from(report.tokens_after);
    let Some(usage) = conversation.usage else { return full };
    let since = usage.message_count as usize;
    if usage.prompt_tokens == 0 || since == 0 || since > message_count {
        return full;
    }
    let added = message_count - since;
    let tail: u32 = report.message_tokens.iter().rev().take(added).sum();
    usage.prompt_tokens + u64::from(Rewriter::scaled(tail, report.model))
}

/// Whether this conversation failed to compact too often, at this same length.
pub fn breaker_open(settings: &CompactionSettings, breaker: &Breaker, message_count: usize) -> bool {
    breaker.failures >= u64::from(settings.max_failures) && breaker.at_messages == message_count as u64
}

/// Settings for the prune-harder rung: a small protected window, no minimum.
pub fn hard_settings(base: &RewriteSettings, settings: &CompactionSettings) -> RewriteSettings {
    let mut hard = base.clone();
    hard.prune_enabled = true;
    hard.prune.protect_tokens = settings.emergency_protect_tokens;
    hard.prune.minimum_tokens = 0;
    hard
}

/// Tokens the transcript may take in a summary call to `summarizer`: its window (in the
/// tokenizer's units) less the answer and the prompt, with a tenth to spare.
pub fn transcript_budget(summarizer: ModelInfo, max_tokens: u32, prompt_tokens: u32) -> u32 {
    let window = (f64::from(summarizer.context_window) / f64::from(summarizer.token_factor)) as u32;
    window.saturating_sub(max_tokens).saturating_sub(prompt_tokens) * 9 / 10
}

/// How many recent tokens stay verbatim, and the budget for the user's own messages: a quarter of
/// each on the harder rung.
pub fn kept_tokens(settings: &CompactionSettings, harder: bool) -> (u32, u32) {
    let divisor = if harder { 4 } else { 1 };
    (settings.keep_recent_tokens / divisor, settings.user_message_max_tokens / divisor)
}

/// The harder rung's cap on each user message (0: none).
pub fn user_message_cap(settings: &CompactionSettings, harder: bool) -> u32 {
    if harder { (settings.user_message_max_tokens / 4).max(256) } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Usage;

    fn report(tokens_after: u32, message_tokens: Vec<u32>) -> RewriteReport {
        let model = ModelInfo { context_window: 10_000, max_output_tokens: 1_000, ..ModelInfo::default() };
        RewriteReport { tokens_after, message_tokens, model, ..RewriteReport::default() }
    }

    #[test]
    fn the_threshold_uses_a_learned_window_over_the_model_table() {
        let settings = CompactionSettings::default();
        let mut session = SessionState::default();
        let conversation = ConversationState::default();
        // 0.8 x (10000 - 1000) = 7200.
        assert!(!over_threshold(&settings, &session, &conversation, 3, &report(7_000, vec![]), false));
        session.counters.learned_window = 8_000;
        // 0.8 x (8000 - 1000) = 5600.
        assert!(over_threshold(&settings, &session, &conversation, 3, &report(7_000, vec![]), false));
    }

    #[test]
    fn the_hybrid_estimate_adds_only_what_came_after_the_reported_usage() {
        let settings = CompactionSettings::default();
        let usage = Usage { prompt_tokens: 7_000, message_count: 2, ..Usage::default() };
        let session = SessionState::default();
        let conversation = ConversationState { usage: Some(usage), ..ConversationState::default() };
        let grown = report(100, vec![10, 10, 150, 150]);
        assert!(over_threshold(&settings, &session, &conversation, 4, &grown, true), "7000 + 300 > 7200");
        assert!(!over_threshold(&settings, &session, &conversation, 4, &grown, false), "the full count alone is 100");
        // A conversation shorter than the one reported: the report says nothing about it.
        assert!(!over_threshold(&settings, &session, &conversation, 1, &grown, true));
    }

    #[test]
    fn the_breaker_opens_after_max_failures_on_the_same_conversation_only() {
        let settings = CompactionSettings::default();
        let breaker = Breaker { failures: 3, at_messages: 12 };
        assert!(breaker_open(&settings, &breaker, 12));
        assert!(!breaker_open(&settings, &breaker, 14));
    }
}
