//! The first-byte deadline of an upstream request, whose timer is made only when the answer has
//! to be waited for.
//!
//! `tokio::time::timeout` registers its timer in the runtime's wheel at its first poll and takes
//! it out again when dropped, whether or not the answer was already in. A request sent ahead of
//! its preparation (see `proxy::ahead`) is polled once to hand it to its connection, then again
//! once the preparation is done, and by then the answer has most often come: its timer waits for
//! that second poll ([`Armed::AtSecondWait`]), and is never made when the answer is in. The
//! deadline itself is fixed when the request is sent: a timer made later ends at the same time.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// When the deadline's timer is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Armed {
    /// At the first poll that has to wait: the caller may not poll again before the answer.
    AtFirstWait,
    /// At the second poll that has to wait. Only for a caller that polls again after its first
    /// poll whatever happens (or drops the request): until then nothing would wake it at the deadline.
    AtSecondWait,
}

/// The deadline passed before the answer came.
#[derive(Debug)]
pub struct Elapsed;

pin_project_lite::pin_project! {
    /// `inner`, ended with [`Elapsed`] at `at` if it has not ended by then.
    pub struct Deadline<F> {
        #[pin]
        inner: F,
        at: Instant,
        // The first wait goes without a timer (`Armed::AtSecondWait`).
        skip_first_wait: bool,
        #[pin]
        timer: Option<Sleep>,
    }
}

impl<F: Future> Deadline<F> {
    /// `inner`, bounded by `timeout` from now.
    pub fn new(inner: F, timeout: Duration, armed: Armed) -> Self {
        // A timeout too large for an instant (configured as "never") waits for about 30 years.
        let now = Instant::now();
        let at = now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30));
        Self { inner, at, skip_first_wait: armed == Armed::AtSecondWait, timer: None }
    }
}

impl<F: Future> Future for Deadline<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(output) = this.inner.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        if this.timer.is_none() {
            if *this.skip_first_wait {
                *this.skip_first_wait = false;
                return Poll::Pending;
            }
            this.timer.set(Some(tokio::time::sleep_until(*this.at)));
        }
        match this.timer.as_pin_mut().map(|timer| timer.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(Elapsed)),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{pending, poll_fn};
    use std::pin::pin;

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_deadline_ends_with_elapsed() {
        let started = Instant::now();
        let result = Deadline::new(pending::<()>(), Duration::from_secs(5), Armed::AtFirstWait).await;
        assert!(result.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_time_is_returned() {
        let answer = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            7
        };
        assert_eq!(Deadline::new(answer, Duration::from_secs(5), Armed::AtFirstWait).await.unwrap(), 7);
    }

    /// A request sent ahead: polled once, then again later. Its deadline counts from the send,
    /// not from the second poll, and the timer is made only at that poll.
    #[tokio::test(start_paused = true)]
    async fn armed_at_the_second_wait_the_deadline_still_counts_from_the_send() {
        let started = Instant::now();
        let mut request = pin!(Deadline::new(pending::<()>(), Duration::from_secs(5), Armed::AtSecondWait));
        let first = poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx).is_pending())).await;
        assert!(first);
        assert!(request.timer.is_none(), "no timer at the first poll");
        // The preparation takes 2 s; then the request is awaited.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(request.await.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_by_the_second_poll_never_makes_a_timer() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut request = pin!(Deadline::new(rx, Duration::from_secs(5), Armed::AtSecondWait));
        assert!(poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx).is_pending())).await);
        tx.send(3).unwrap();
        let second = poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
        assert!(matches!(second, Poll::Ready(Ok(Ok(3)))));
        assert!(request.timer.is_none());
    }
}
