//! The window questions a request's decisions ask of its session: the window pressure (the
//! window, the calibration, the output reserve), the part of a prompt no compaction shrinks,
//! whether a compaction would free room, and whether a body fits.

use super::Compactor;
use super::budget::{self, Pressure};
use super::engine::Sizing;
use super::request::RequestState;
use crate::rewrite::{Estimated, ProviderTokens, RewriteReport, Rewriter};
use crate::session::{ConversationState, SessionCtx};

impl Compactor {
    /// The window pressure of a request of this session whose rewrite is `report`: the window,
    /// the calibration and the output reserve every size decision uses (see [`Pressure`]).
    pub fn pressure(&self, ctx: &SessionCtx, report: &RewriteReport) -> Pressure {
        let pressure = Pressure::of(&self.settings, ctx.learned(), report);
        self.quiet.note_window(pressure.window.get(), u64::from(report.model.context_window));
        pressure
    }

    /// The part of `report`'s prompt no compaction shrinks (tools, lead system messages, the
    /// summary the body carries), in the provider's tokens.
    fn fixed_tokens(&self, state: &RequestState, pressure: &Pressure, report: &RewriteReport) -> ProviderTokens {
        let from = state.lead + usize::from(state.record.is_some());
        let history = report.message_tokens.iter().skip(from).fold(0, |sum: u32, t| sum.saturating_add(*t));
        let history = Rewriter::scaled(history, report.model);
        pressure.calibrated(Estimated::from(report.tokens_after.saturating_sub(history)))
    }

    /// Whether a compaction of `report`'s conversation would land under the budget with margin,
    /// with room left for the next turns (see [`budget::compaction_frees_room`]).
    pub(super) fn frees_room(
        &self,
        state: &RequestState,
        pressure: &Pressure,
        report: &RewriteReport,
        conversation: &ConversationState,
    ) -> bool {
        let fixed = self.fixed_tokens(state, pressure, report);
        let (keep, _) = budget::kept_sizes(&self.settings, pressure, fixed, false);
        let keep = Estimated::from(keep);
        // A summary's size, about 4 bytes a token: what the record carries, else about what it keeps.
        let summary = state.record.as_ref().map_or(keep, |r| Estimated::new((r.summary.len() / 4) as u64));
        let growth = budget::turn_growth(conversation, state.message_count, report);
        budget::compaction_frees_room(pressure, fixed, keep, summary, growth)
    }

    /// How big a compaction of `report`'s conversation may make its parts.
    pub(super) fn sizing(&self, state: &RequestState, ctx: &SessionCtx, report: &RewriteReport) -> Sizing {
        let pressure = self.pressure(ctx, report);
        Sizing { pressure, fixed: self.fixed_tokens(state, &pressure, report), due_in: Estimated::ZERO }
    }

    /// Whether `report`'s body fits the window as the session now knows it.
    pub(super) fn fits(&self, ctx: &SessionCtx, report: &RewriteReport) -> bool {
        let pressure = self.pressure(ctx, report);
        pressure.calibrated(report.estimated_after()) <= pressure.hard_limit()
    }
}
