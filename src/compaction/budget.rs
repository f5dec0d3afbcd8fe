//! The token budget: the window a session works with ([`Pressure`]: the one an overflow error
//! named, else the tightest bound learned from answers, else the model table's), the calibration
//! of compactor's estimate to the provider's tokenizer, the output reserve, when a conversation's
//! estimate crosses the compaction threshold and whether a compaction would free room, the hybrid
//! estimate, the conversation's circuit breaker, and the sizes the rungs and the summarizer use.
//! Pure arithmetic, no I/O.

use crate::config::compaction::CompactionSettings;
use crate::overflow::Overflow;
use crate::rewrite::{Estimated, ProviderTokens, RewriteReport, RewriteSettings, Rewriter};
use crate::session::{Breaker, ConversationState, Learned, Usage};
use crate::tokens::ModelInfo;

/// The window an overflow error named, worth remembering for the session's later estimates.
pub fn window_named(overflow: &Overflow) -> Option<u64> {
    overflow.limit.filter(|limit| *limit > 0)
}

/// Margin kept between a prompt and the window: compactor's estimate is an estimate.
const FIT_MARGIN: f64 = 0.95;

/// The window pressure of one request: the window the session really works with, how the
/// provider's tokenizer counts against compactor's estimate, and the room its answer needs. All
/// sizes in the provider's tokens. The one place that knows where a window comes from: the named
/// window, else the tightest learned bound, else the model table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    /// The window to work with.
    pub window: ProviderTokens,
    /// Provider tokens per token of compactor's estimate (1.0 until measured).
    pub calibration: f64,
    /// Tokens kept free for the answer.
    pub reserve: ProviderTokens,
    /// The share of `window - reserve` a prompt may take before compaction ahead of time.
    pub threshold: f64,
}

impl Pressure {
    /// The pressure of a request whose rewrite is `report`, for a session that learned `learned`.
    /// The output reserve is the smallest of what the request asks for (`max_tokens`, else the
    /// model's output cap), `output_reserve_tokens`, and what this model really generated for
    /// the session (its largest answer, with a quarter and 256 tokens to spare); never more than
    /// half the window.
    pub fn of(settings: &CompactionSettings, learned: &Learned, report: &RewriteReport) -> Self {
        let window = window(learned, report.model.context_window);
        let calibration = match learned.calibration_milli {
            0 => 1.0,
            milli => milli as f64 / 1_000.0,
        };
        let requested = report.max_tokens.unwrap_or(u64::from(report.model.max_output_tokens));
        let mut reserve = requested.min(u64::from(settings.output_reserve_tokens));
        if learned.output_peak > 0 {
            reserve = reserve.min(learned.output_peak.saturating_add(learned.output_peak / 4).saturating_add(256));
        }
        Self {
            window: ProviderTokens::new(window),
            calibration,
            reserve: ProviderTokens::new(reserve.min(window / 2)),
            threshold: settings.threshold,
        }
    }

    /// compactor's estimate (vendor factor applied) in the provider's tokens.
    pub fn calibrated(&self, estimate: Estimated) -> ProviderTokens {
        ProviderTokens::new((estimate.get() as f64 * self.calibration).ceil() as u64)
    }

    /// Provider tokens as compactor's estimate.
    pub fn uncalibrated(&self, tokens: ProviderTokens) -> Estimated {
        Estimated::new((tokens.get() as f64 / self.calibration) as u64)
    }

    /// The room for a prompt and its answer's reserve: window - reserve.
    fn room(&self) -> f64 {
        self.window.saturating_sub(self.reserve).get() as f64
    }

    /// The most a prompt may take and still fit, with a margin: (window - reserve) x 0.95.
    pub fn limit(&self) -> ProviderTokens {
        ProviderTokens::new((self.room() * FIT_MARGIN) as u64)
    }

    /// The most a prompt may take before compactor estimates the provider will refuse it: the
    /// window with a margin (an answer that does not fit is the lower-`max_tokens` rung's job).
    pub fn hard_limit(&self) -> ProviderTokens {
        ProviderTokens::new((self.window.get() as f64 * FIT_MARGIN) as u64)
    }

    /// The size above which a conversation is compacted ahead of time: threshold x (window - reserve).
    pub fn budget(&self) -> ProviderTokens {
        ProviderTokens::new((self.room() * self.threshold) as u64)
    }
}

/// The window a session of a model whose table window is `table` works with: the named one, else
/// the table's lowered to the tightest bound learned below and raised to what an answer showed.
pub fn window(learned: &Learned, table: u32) -> u64 {
    // What the server says it has beats the table's guess; an overflow error still beats both.
    let table = if learned.stated > 0 { learned.stated } else { u64::from(table) };
    if learned.window > 0 {
        return learned.window;
    }
    let mut window = table;
    if learned.window_below > 0 {
        window = window.min(learned.window_below);
    }
    window.max(learned.window_at_least.min(table))
}

/// True when the conversation's estimate (hybrid, or the full count), calibrated, exceeds the
/// pressure's budget. `message_count`: messages of the client's request.
pub fn over_threshold(
    pressure: &Pressure,
    conversation: &ConversationState,
    message_count: usize,
    report: &RewriteReport,
    hybrid: bool,
) -> bool {
    prompt_tokens(pressure, conversation, message_count, report, hybrid) > pressure.budget()
}

/// Window pressure for the rewrite policies: the conversation's calibrated hybrid estimate exceeds
/// `share` x (the window - output reserve) (`prune.pressure`). Above it a held-back prune batch
/// goes whatever it costs the prompt cache. The one place the rewrite asks about the window.
pub fn window_pressure(
    share: f64,
    pressure: &Pressure,
    conversation: &ConversationState,
    message_count: usize,
    report: &RewriteReport,
) -> bool {
    let room = ProviderTokens::new((pressure.room() * share) as u64);
    prompt_tokens(pressure, conversation, message_count, report, true) > room
}

/// The prompt's size in the provider's tokens: the hybrid estimate (the last reported prompt plus
/// what was added since, calibrated) or the calibrated full count.
pub fn prompt_tokens(
    pressure: &Pressure,
    conversation: &ConversationState,
    message_count: usize,
    report: &RewriteReport,
    hybrid: bool,
) -> ProviderTokens {
    let full = pressure.calibrated(report.estimated_after());
    if !hybrid {
        return full;
    }
    match reported_and_added(conversation, message_count, report) {
        Some((reported, added)) => reported + pressure.calibrated(added),
        None => full,
    }
}

/// Turns like the newest a compaction ahead of time must leave room for under the budget.
const ROOM_TURNS: u64 = 2;

/// Whether a compaction ahead of time is worth its summary call. What it leaves, in the provider's
/// tokens, is the part it cannot shrink (`fixed`: system, tools, the summary it carries), a summary
/// and the tail it keeps verbatim: about `keep`, but never less than the newest turn (`growth`:
/// what this request added, in compactor's tokens; the cut keeps whole turns). It is worth the
/// call only when that, plus [`ROOM_TURNS`] more turns like the newest, lands under the budget with
/// margin: a compaction that frees room for a turn or less is followed by another a turn later, so
/// the session would pay a summary call per turn. When it is not worth it, compaction waits for
/// the request that would not fit (`limit`): the rebuild is the same, a turn or more later.
pub fn compaction_frees_room(
    pressure: &Pressure,
    fixed: ProviderTokens,
    keep: Estimated,
    summary: Estimated,
    growth: Estimated,
) -> bool {
    let after = fixed + pressure.calibrated(keep.max(growth) + summary + growth * ROOM_TURNS);
    (after.get() as f64) < pressure.budget().get() as f64 * 0.9
}

/// What this request added since the last prompt size the upstream reported, in compactor's
/// tokens: the session's newest turn. 0 when there is no usable report.
pub fn turn_growth(conversation: &ConversationState, message_count: usize, report: &RewriteReport) -> Estimated {
    reported_and_added(conversation, message_count, report).map_or(Estimated::ZERO, |(_, added)| added)
}

/// What this request added since the last prompt the upstream reported, in compactor's tokens,
/// whatever summary either body carried: the client's newest messages go verbatim after any
/// summary, so their size is the turn's growth even on the request that applied a new one (where
/// [`turn_growth`] has no comparable report). 0 when there is no report.
pub fn newest_turn_tokens(conversation: &ConversationState, message_count: usize, report: &RewriteReport) -> Estimated {
    conversation.usage.and_then(|usage| added_since(&usage, message_count, report)).unwrap_or(Estimated::ZERO)
}

/// How many recent tokens a compaction keeps verbatim and the budget for the user's own
/// messages, in compactor's tokens: the configured sizes, shrunk to a sixth of the room above the
/// fixed part each when the window is small (so a compaction leaves room for several turns); a
/// quarter of that on the harder rung.
pub fn kept_sizes(
    settings: &CompactionSettings,
    pressure: &Pressure,
    fixed: ProviderTokens,
    harder: bool,
) -> (u32, u32) {
    let room = pressure.uncalibrated(pressure.budget().saturating_sub(fixed)).get() / 6;
    let room = u32::try_from(room).unwrap_or(u32::MAX).max(256);
    let divisor = if harder { 4 } else { 1 };
    (settings.keep_recent_tokens.min(room) / divisor, settings.user_message_max_tokens.min(room) / divisor)
}

/// The last prompt size the upstream reported and compactor's estimate of only what was added
/// since; `None` when there is no usable report.
fn reported_and_added(
    conversation: &ConversationState,
    message_count: usize,
    report: &RewriteReport,
) -> Option<(ProviderTokens, Estimated)> {
    let usage = conversation.usage?;
    // A usage measured on a body with another summary says nothing of this one.
    if usage.generation != report.compaction {
        return None;
    }
    Some((ProviderTokens::new(usage.prompt_tokens), added_since(&usage, message_count, report)?))
}

/// The tokens of the client's messages after those `usage` was reported for (the newest end of
/// `report`'s body); `None` when `usage` reports nothing usable for this request.
fn added_since(usage: &Usage, message_count: usize, report: &RewriteReport) -> Option<Estimated> {
    let since = usage.message_count as usize;
    if usage.prompt_tokens == 0 || since == 0 || since > message_count {
        return None;
    }
    let tail =
        report.message_tokens.iter().rev().take(message_count - since).fold(0, |sum: u32, t| sum.saturating_add(*t));
    Some(Estimated::from(Rewriter::scaled(tail, report.model)))
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

/// The summarizer's window in compactor's raw tokens: the summarizing model's, learned like any
/// window when it is the request's own model (`pressure`), else the model table's.
pub fn summarizer_window(summarizer: ModelInfo, pressure: Option<&Pressure>) -> u32 {
    let factor = f64::from(summarizer.token_factor).max(0.1);
    match pressure {
        Some(pressure) => (pressure.uncalibrated(pressure.window).get() as f64 / factor) as u32,
        None => (f64::from(summarizer.context_window) / factor) as u32,
    }
}

/// The summary's output budget: the configured one, no more than the summarizer's output cap nor an
/// eighth of its window. In front of a local server (`local` cache preset) no more than
/// `local_summary_window_share` of the window: there each token of the summary is generated by
/// the server the agent is waiting for (about four prefilled tokens' time on a CPU), and a summary
/// as long as an eighth of a small window took longer than two of the agent's turns.
pub fn summary_max_tokens(settings: &CompactionSettings, summarizer: ModelInfo, window: u32, local: bool) -> u32 {
    const EIGHTH: f64 = 0.125;
    let share = if local { settings.local_summary_window_share.min(EIGHTH) } else { EIGHTH };
    let of_window = (f64::from(window) * share) as u32;
    settings.summary_max_tokens.min(summarizer.max_output_tokens).min(of_window).max(64)
}

/// A summary prepared in the background for a local server, sized to the agent's idle time: the
/// tokens the server generates in nine tenths of `idle_ms` at the conversation's measured
/// `us_per_token`, within `cap` ([`summary_max_tokens`]) and no shorter than
/// `local_summary_min_window_share` of the window (nor 64 tokens). The server answers one request
/// at a time: a summary still being written when the agent's next request comes makes that request
/// wait for its end. Without a measurement (the conversation's first summary, an agent that never
/// left a gap) it is `cap`.
///
/// The measured time per token is the call's whole time over its tokens, its fixed part (the
/// instruction's prefill) included, so it is too high for a longer summary and too low for a
/// shorter one; sized from it, each summary's time comes closer to the target than the one before.
/// The tenth spared is the spread of that time between summaries of one length (7.5-8.9 s on
/// the 8k bench).
pub fn paced_summary_tokens(
    settings: &CompactionSettings,
    cap: u32,
    window: u32,
    idle_ms: u64,
    us_per_token: u64,
) -> u32 {
    if idle_ms == 0 || us_per_token == 0 {
        return cap;
    }
    let target_us = idle_ms.saturating_mul(900);
    let fits = u32::try_from(target_us / us_per_token).unwrap_or(u32::MAX);
    let floor = ((f64::from(window) * settings.local_summary_min_window_share) as u32).max(64).min(cap);
    fits.clamp(floor, cap)
}

/// Tokens the transcript may take in one summary call: the summarizer's window (compactor's raw
/// tokens) less the answer and the prompt, with a tenth to spare.
pub fn transcript_budget(window: u32, max_tokens: u32, prompt_tokens: u32) -> u32 {
    window.saturating_sub(max_tokens).saturating_sub(prompt_tokens) * 9 / 10
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

    fn pressure(learned: &Learned, report: &RewriteReport) -> Pressure {
        Pressure::of(&CompactionSettings::default(), learned, report)
    }

    #[test]
    fn a_summary_for_a_local_server_takes_a_smaller_share_of_the_window() {
        let settings = CompactionSettings::default();
        let summarizer = ModelInfo { context_window: 8_192, max_output_tokens: 4_096, ..ModelInfo::default() };
        // An eighth of the window for a provider, a twentieth for a local server.
        assert_eq!(summary_max_tokens(&settings, summarizer, 2_048, false), 256);
        assert_eq!(summary_max_tokens(&settings, summarizer, 2_048, true), 102);
        assert_eq!(summary_max_tokens(&settings, summarizer, 8_192, true), 409);
        // Never under 64 tokens, never over the configured budget or the model's cap.
        assert_eq!(summary_max_tokens(&settings, summarizer, 512, true), 64);
        assert_eq!(summary_max_tokens(&settings, summarizer, 200_000, true), 4_096);
        let configured = CompactionSettings { local_summary_window_share: 0.1, ..CompactionSettings::default() };
        assert_eq!(summary_max_tokens(&configured, summarizer, 2_048, true), 204);
    }

    #[test]
    fn a_background_summary_for_a_local_server_fits_the_agents_idle_time() {
        let settings = CompactionSettings::default();
        // 8k window: the share allows 409 tokens, the floor is 81.
        let cap = 409;
        // 8 s of idle time at 34 ms a token: 211 tokens, which the server writes in 7.2 s, before
        // the agent comes back.
        assert_eq!(paced_summary_tokens(&settings, cap, 8_192, 8_000, 34_000), 211);
        // Time for more than the share: the share.
        assert_eq!(paced_summary_tokens(&settings, cap, 8_192, 60_000, 34_000), cap);
        // Hardly any idle time: no shorter than the floor.
        assert_eq!(paced_summary_tokens(&settings, cap, 8_192, 500, 34_000), 81);
        // Nothing measured yet: the share.
        assert_eq!(paced_summary_tokens(&settings, cap, 8_192, 0, 34_000), cap);
        assert_eq!(paced_summary_tokens(&settings, cap, 8_192, 8_000, 0), cap);
        // A small window's floor is 64 tokens, and never above the cap.
        assert_eq!(paced_summary_tokens(&settings, 102, 2_048, 100, 23_000), 64);
        assert_eq!(paced_summary_tokens(&settings, 50, 2_048, 100, 23_000), 50);
        // A floor configured as high as the share turns the pacing off.
        let fixed = CompactionSettings { local_summary_min_window_share: 0.05, ..CompactionSettings::default() };
        assert_eq!(paced_summary_tokens(&fixed, cap, 8_192, 8_000, 34_000), cap);
    }

    #[test]
    fn the_threshold_uses_a_learned_window_over_the_model_table() {
        let conversation = ConversationState::default();
        let mut learned = Learned::default();
        let at = report(7_000, vec![]);
        // 0.8 x (10000 - 1000) = 7200.
        assert!(!over_threshold(&pressure(&learned, &at), &conversation, 3, &at, false));
        learned.window = 8_000;
        // 0.8 x (8000 - 1000) = 5600.
        assert!(over_threshold(&pressure(&learned, &at), &conversation, 3, &at, false));
    }

    #[test]
    fn the_tightest_bound_wins_and_a_named_window_beats_every_bound() {
        let at = report(100, vec![]);
        let unnamed = Learned { window_below: 6_000, window_at_least: 4_000, ..Learned::default() };
        let window = |learned: &Learned| pressure(learned, &at).window.get();
        assert_eq!(window(&unnamed), 6_000, "below what overflowed");
        let contradicted = Learned { window_below: 3_000, window_at_least: 4_000, ..Learned::default() };
        assert_eq!(window(&contradicted), 4_000, "an answer proves more than an overflow bound");
        let named = Learned { window: 9_000, window_below: 6_000, ..Learned::default() };
        assert_eq!(window(&named), 9_000);
    }

    #[test]
    fn calibration_scales_every_estimate_and_the_reserve_follows_real_answers() {
        let at = RewriteReport { max_tokens: Some(32_000), ..report(5_000, vec![]) };
        let learned = Learned { calibration_milli: 1_600, ..Learned::default() };
        let p = pressure(&learned, &at);
        assert_eq!(p.calibrated(Estimated::new(5_000)), ProviderTokens::new(8_000));
        assert_eq!(p.reserve.get(), 4_096, "the configured cap, not max_tokens 32000 nor half the window");
        assert!(over_threshold(&p, &ConversationState::default(), 3, &at, false), "8000 > 0.8 x 5904");
        let answered = Learned { output_peak: 400, ..learned };
        assert_eq!(pressure(&answered, &at).reserve.get(), 400 + 100 + 256);
    }

    #[test]
    fn a_compaction_frees_room_only_when_the_fixed_part_leaves_some() {
        let p = pressure(&Learned::default(), &report(0, vec![]));
        let frees = |fixed, keep, summary, growth| {
            let estimated = Estimated::new;
            compaction_frees_room(
                &p,
                ProviderTokens::new(fixed),
                estimated(keep),
                estimated(summary),
                estimated(growth),
            )
        };
        // Budget 7200: a 6,500-token system prompt and tools leave no room worth a summary.
        assert!(!frees(6_500, 300, 300, 0));
        assert!(frees(3_000, 1_000, 500, 0));
        // Room for the rebuild (3000 + 2000 + 500) but not for two more 2,000-token turns: a
        // compaction now would be followed by another a turn later.
        assert!(!frees(3_000, 1_000, 500, 2_000));
        // 3000 + 1000 + 500 + 2 x 800 = 6100, under 90 % of 7200.
        assert!(frees(3_000, 1_000, 500, 800));
        let (keep, user) = kept_sizes(&CompactionSettings::default(), &p, ProviderTokens::new(3_000), false);
        assert_eq!((keep, user), (700, 700), "a sixth of the room above the fixed part");
    }

    #[test]
    fn the_hybrid_estimate_adds_only_what_came_after_the_reported_usage() {
        let usage = Usage { prompt_tokens: 7_000, message_count: 2, ..Usage::default() };
        let conversation = ConversationState { usage: Some(usage), ..ConversationState::default() };
        let grown = report(100, vec![10, 10, 150, 150]);
        let p = pressure(&Learned::default(), &grown);
        assert!(over_threshold(&p, &conversation, 4, &grown, true), "7000 + 300 > 7200");
        assert!(!over_threshold(&p, &conversation, 4, &grown, false), "the full count alone is 100");
        // A conversation shorter than the one reported: the report says nothing about it.
        assert!(!over_threshold(&p, &conversation, 1, &grown, true));
    }

    #[test]
    fn the_breaker_opens_after_max_failures_on_the_same_conversation_only() {
        let settings = CompactionSettings::default();
        let breaker = Breaker { failures: 3, at_messages: 12 };
        assert!(breaker_open(&settings, &breaker, 12));
        assert!(!breaker_open(&settings, &breaker, 14));
    }
}
