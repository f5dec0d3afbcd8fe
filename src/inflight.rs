//! The request body bytes compactor holds at once, across requests (`limits.max_inflight_body_bytes`).
//! A rewritten request's memory grows with its body (the body, its parse, the rewritten body), and
//! nothing else bounds it across concurrent requests: past the budget a request is refused with a
//! 503 in its dialect and `retry-after`, before its body is read when it declares its length. A
//! summary prepared in the background holds its conversation's body (and the summary call built
//! from it) in the same budget, and is skipped when the budget has no room for it.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::error::ProxyError;

/// The budget is kept in units of this many bytes (a semaphore's permits are counted in `u32`).
const UNIT: u64 = 1024;

/// The shared budget; `None` inside when it is off (`max_inflight_body_bytes = 0`).
#[derive(Clone)]
pub struct InflightBodies {
    permits: Option<Arc<Semaphore>>,
    limit: u64,
}

/// A request's share of the budget, given back when dropped.
#[derive(Default)]
pub struct Held {
    permit: Option<OwnedSemaphorePermit>,
    units: u32,
}

impl InflightBodies {
    pub fn new(limit: u64) -> Self {
        let units = usize::try_from(limit / UNIT).unwrap_or(usize::MAX).min(Semaphore::MAX_PERMITS);
        Self { permits: (limit > 0).then(|| Arc::new(Semaphore::new(units.max(1)))), limit }
    }

    /// Makes `held` cover `bytes` of body (what it has already stays taken). A body larger than the
    /// whole budget takes all of it: it goes when it is alone, never not at all.
    pub fn hold(&self, held: &mut Held, bytes: u64) -> Result<(), ProxyError> {
        let Some(permits) = &self.permits else { return Ok(()) };
        let all = u32::try_from(self.limit / UNIT).unwrap_or(u32::MAX).max(1);
        let wanted = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX).min(all);
        let more = wanted.saturating_sub(held.units);
        if more == 0 {
            return Ok(());
        }
        match permits.clone().try_acquire_many_owned(more) {
            Ok(permit) => {
                match &mut held.permit {
                    Some(taken) => taken.merge(permit),
                    None => held.permit = Some(permit),
                }
                held.units = wanted;
                Ok(())
            }
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                Err(ProxyError::InflightBodies { limit: self.limit })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_share_the_budget_and_give_it_back() {
        let budget = InflightBodies::new(64 * 1024);
        let mut first = Held::default();
        budget.hold(&mut first, 40_000).unwrap();
        let mut second = Held::default();
        assert!(budget.hold(&mut second, 40_000).is_err());
        budget.hold(&mut second, 20_000).unwrap();
        drop(first);
        budget.hold(&mut second, 64 * 1024).unwrap();
        assert!(budget.hold(&mut Held::default(), 5_000).is_err(), "second holds all of it now");
        drop(second);
        let mut alone = Held::default();
        budget.hold(&mut alone, 10 << 20).unwrap();
    }

    #[test]
    fn a_budget_of_zero_is_off() {
        let budget = InflightBodies::new(0);
        let mut held = Held::default();
        budget.hold(&mut held, u64::MAX).unwrap();
        budget.hold(&mut Held::default(), u64::MAX).unwrap();
    }
}
