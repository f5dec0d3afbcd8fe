//! A request sent upstream before its preparation: one compactor has no reason to touch
//! ([`Compactor::nothing_to_decide`](crate::compaction::Compactor::nothing_to_decide)) goes out
//! first, and its preparation (parse, session, count, decision) runs while the provider reads it.
//! At a low rate every step of a request runs from a cold cache, and the preparation was most of
//! what compactor added before the provider saw the request.
//!
//! The preparation's body decides: when it differs from what went ahead, the request that went
//! ahead is dropped before its answer is read (hyper closes its connection) and the prepared body
//! is sent, as if nothing had gone ahead.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;

use bytes::Bytes;

use crate::upstream::{Armed, RequestHead, Upstreams};

pub(super) use super::forward::SentAhead;

/// Sends `body` as it came, as the first attempt of a forward would. The answer is asked for
/// uncompressed (`identity`), as it is for every request with a session, whose answer compactor
/// reads for its usage. [`ahead_of`] polls it again once the preparation is done, and by then the
/// answer has most often come: its first-byte timer is made at that poll, if it has to wait.
pub(super) async fn send(upstreams: &Upstreams, head: &RequestHead, body: Bytes) -> SentAhead {
    super::forward::send(upstreams, head, body, None, true, Armed::AtSecondWait).await
}

/// Starts `sending`, lets the upstream connection write it out, then runs `preparing`; finishes
/// `sending` when `keep` says the prepared request is the one that went ahead, else drops it
/// unanswered (`None`).
pub(super) async fn ahead_of<S, P>(
    sending: S,
    preparing: P,
    keep: impl FnOnce(&P::Output) -> bool,
) -> (Option<S::Output>, P::Output)
where
    S: Future,
    P: Future,
{
    let mut sending = pin!(sending);
    // The first poll takes a pooled connection and hands it the request; the connection's own
    // task writes it once this one yields.
    let answered = poll_fn(|cx| {
        Poll::Ready(match sending.as_mut().poll(cx) {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        })
    })
    .await;
    tokio::task::yield_now().await;
    let prepared = preparing.await;
    if !keep(&prepared) {
        return (None, prepared);
    }
    let answer = match answered {
        Some(answer) => answer,
        None => sending.await,
    };
    (Some(answer), prepared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn the_request_goes_out_before_the_preparation_and_is_dropped_when_not_kept() {
        let started = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let sending = {
            let (started, finished) = (started.clone(), finished.clone());
            async move {
                started.store(true, Ordering::SeqCst);
                tokio::task::yield_now().await;
                finished.store(true, Ordering::SeqCst);
                7
            }
        };
        let seen = started.clone();
        let preparing = async move { seen.load(Ordering::SeqCst) };
        let (answer, sent_first) = ahead_of(sending, preparing, |_| false).await;
        assert!(sent_first, "the send started before the preparation ran");
        assert_eq!(answer, None);
        assert!(!finished.load(Ordering::SeqCst), "a request not kept is not waited for");

        let (answer, _) = ahead_of(async { 7 }, async { true }, |kept| *kept).await;
        assert_eq!(answer, Some(7));
    }
}
