//! The session store's circuit breaker: after `session.breaker_failures` failures in a row the
//! store is skipped for `session.breaker_backoff_ms` (requests are served at full speed without
//! stored state, instead of each waiting `redis_timeout_ms`), then one operation probes it: a
//! success closes the breaker, a failure opens it for another backoff. Readiness says `degraded`
//! while it is open.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::telemetry::metric;

/// What the breaker lets an operation do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go ahead.
    Pass,
    /// Go ahead as the probe of an open breaker.
    Probe,
    /// Skip the store: it is open, or another operation is probing it.
    Skip,
}

#[derive(Debug)]
struct State {
    failures: u32,
    /// Set while open: when the next probe may go.
    open_until: Option<Instant>,
    probing: bool,
}

/// Shared by every request of the process.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    backoff: Duration,
    state: Mutex<State>,
}

impl Breaker {
    pub fn new(threshold: u32, backoff: Duration) -> Self {
        Self { threshold, backoff, state: Mutex::new(State { failures: 0, open_until: None, probing: false }) }
    }

    /// Whether an operation may reach the store now.
    pub fn admit(&self) -> Admission {
        let Ok(mut state) = self.state.lock() else { return Admission::Pass };
        match state.open_until {
            None => Admission::Pass,
            Some(until) if Instant::now() < until || state.probing => Admission::Skip,
            Some(_) => {
                state.probing = true;
                Admission::Probe
            }
        }
    }

    /// The store answered.
    pub fn success(&self) {
        let Ok(mut state) = self.state.lock() else { return };
        let was_open = state.open_until.is_some();
        *state = State { failures: 0, open_until: None, probing: false };
        if was_open {
            metric::store_breaker(false);
            tracing::info!("session store answers again: circuit breaker closed");
        }
    }

    /// The store failed (unreachable, timed out); `probe` when this was the probe.
    pub fn failure(&self, probe: bool) {
        let Ok(mut state) = self.state.lock() else { return };
        state.failures = state.failures.saturating_add(1);
        if probe {
            state.probing = false;
        }
        if state.failures >= self.threshold || probe {
            let was_open = state.open_until.is_some();
            state.open_until = Some(Instant::now() + self.backoff);
            if !was_open {
                metric::store_breaker(true);
                tracing::warn!(
                    failures = state.failures,
                    backoff_ms = self.backoff.as_millis() as u64,
                    "session store failing: circuit breaker open, serving without stored state"
                );
            }
        }
    }

    /// The operation admitted as a probe ended without telling (it was dropped): let another probe.
    pub fn abandon_probe(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.probing = false;
        }
    }

    /// Whether the breaker is open (the store is being skipped or probed).
    pub fn is_open(&self) -> bool {
        self.state.lock().map(|state| state.open_until.is_some()).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_in_a_row_then_one_probe_closes_it() {
        let breaker = Breaker::new(3, Duration::from_millis(30));
        breaker.failure(false);
        breaker.failure(false);
        breaker.success();
        breaker.failure(false);
        breaker.failure(false);
        assert_eq!(breaker.admit(), Admission::Pass, "a success resets the count");
        breaker.failure(false);
        assert!(breaker.is_open());
        assert_eq!(breaker.admit(), Admission::Skip);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(breaker.admit(), Admission::Probe);
        assert_eq!(breaker.admit(), Admission::Skip, "one probe at a time");
        breaker.failure(true);
        assert_eq!(breaker.admit(), Admission::Skip, "a failed probe opens it again");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(breaker.admit(), Admission::Probe);
        breaker.success();
        assert!(!breaker.is_open());
        assert_eq!(breaker.admit(), Admission::Pass);
    }
}
