//! How many turns conversations of one (upstream, model) really run while the provider's cache
//! stays warm, measured by the deployment: the horizon over which a rewrite of cached content has
//! to pay back ([`crate::rewrite::payback`]).
//!
//! A "run" is a conversation's requests each within the cache's lifetime of the one before; a
//! pause past the lifetime starts a new run (the cache is cold: a rewrite then costs nothing).
//! The histogram counts, per bucket, the runs that *reached* the bucket's first turn. Counted as
//! a run goes, it needs no event for a run's end, which a shared store never sees (a conversation
//! that stops just expires); a run still going counts as not having reached later buckets yet,
//! which errs on the short, cheap side. A store write happens only when a run crosses a bucket
//! boundary (turns 1, 2, 3, 4, 6, 8, 12, ...), so a long conversation writes about twice per
//! doubling of its length.

use serde::{Deserialize, Serialize};

/// The first turn of each bucket: about two buckets per doubling, up to 1,024 turns.
pub const BOUNDS: [u64; 20] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024];

/// Runs that reached a conversation's current bucket before the histogram is trusted there: with
/// fewer, "most of them ran on" says little.
pub const MIN_RUNS: u64 = 10;

/// Runs that reached each bucket of [`BOUNDS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLengths {
    pub reached: [u64; BOUNDS.len()],
}

impl RunLengths {
    /// The bucket a run enters at its `turn`-th request, if that turn starts one.
    pub fn boundary(turn: u64) -> Option<usize> {
        BOUNDS.iter().position(|&bound| bound == turn)
    }

    pub fn is_empty(&self) -> bool {
        self.reached.iter().all(|&n| n == 0)
    }

    /// Counts a run that reached `bucket`.
    pub fn count(&mut self, bucket: usize) {
        if let Some(reached) = self.reached.get_mut(bucket) {
            *reached = reached.saturating_add(1);
        }
    }

    /// Adds runs assumed rather than measured (`[prune] assumed_runs`): each counts as
    /// [`MIN_RUNS`] runs of that many turns, so one is enough to decide with.
    pub fn with_assumed(mut self, lengths: &[u64]) -> Self {
        for &length in lengths {
            for (reached, &bound) in self.reached.iter_mut().zip(&BOUNDS) {
                if bound <= length {
                    *reached = reached.saturating_add(MIN_RUNS);
                }
            }
        }
        self
    }

    /// Turns a run that has made `turn` requests will still make, with probability at least
    /// `confidence`, by the histogram: the largest bucket start `s > turn` such that of the runs
    /// that reached `turn`'s bucket, a share of at least `confidence` reached `s`, less `turn`.
    /// Zero with too little data ([`MIN_RUNS`]). Runs that reached the bucket's start include
    /// some that stopped before `turn`, so the share is a lower bound: the estimate errs short.
    pub fn remaining(&self, turn: u64, confidence: f64) -> u64 {
        let Some(current) = BOUNDS.iter().rposition(|&bound| bound <= turn) else { return 0 };
        let base = self.reached[current];
        if base < MIN_RUNS {
            return 0;
        }
        let mut remaining = 0;
        for (reached, &bound) in self.reached.iter().zip(&BOUNDS).skip(current + 1) {
            if (*reached as f64) < confidence * base as f64 {
                break;
            }
            remaining = bound.saturating_sub(turn);
        }
        remaining
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A histogram of `runs` measured as they went, each of the given length.
    fn measured(runs: &[(u64, u64)]) -> RunLengths {
        let mut lengths = RunLengths::default();
        for &(length, count) in runs {
            for _ in 0..count {
                (1..=length).filter_map(RunLengths::boundary).for_each(|bucket| lengths.count(bucket));
            }
        }
        lengths
    }

    #[test]
    fn with_no_data_no_turn_is_assumed_to_follow() {
        assert_eq!(RunLengths::default().remaining(1, 0.9), 0);
        assert_eq!(RunLengths::default().remaining(200, 0.9), 0);
        assert_eq!(measured(&[(500, MIN_RUNS - 1)]).remaining(5, 0.9), 0, "too few runs to trust");
    }

    #[test]
    fn the_estimate_is_what_nearly_every_run_that_got_this_far_went_on_to_run() {
        // 90 runs of 100 turns and 10 of 30: at turn 10, 90 % reach 96, so 86 turns are assumed;
        // at 95 % confidence only the 30-turn runs' 24 count.
        let lengths = measured(&[(100, 90), (30, 10)]);
        assert_eq!(lengths.remaining(10, 0.9), 96 - 10);
        assert_eq!(lengths.remaining(10, 0.95), 24 - 10);
        // Past 96 turns no run is known to go on: nothing assumed.
        assert_eq!(lengths.remaining(97, 0.5), 0);
        // Mostly short runs: a young conversation is assumed to stop soon.
        let short = measured(&[(3, 80), (200, 20)]);
        assert_eq!(short.remaining(1, 0.9), 2);
        assert_eq!(short.remaining(4, 0.9), 192 - 4, "runs that got past 3 turns all ran 200");
    }

    #[test]
    fn assumed_runs_count_like_measured_ones() {
        let assumed = RunLengths::default().with_assumed(&[20, 60, 150]);
        assert_eq!(assumed, measured(&[(20, MIN_RUNS), (60, MIN_RUNS), (150, MIN_RUNS)]));
        assert_eq!(assumed.remaining(5, 0.9), 16 - 5);
        assert_eq!(assumed.remaining(70, 0.9), 128 - 70);
    }
}
