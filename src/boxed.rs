//! Futures boxed where they will run.
//!
//! A move copies a future's whole size, and an async fn's future is as large as its largest state
//! (kilobytes on the request path: the rewrite's derivations, a session's load) even before its
//! first poll. `wrapper(fut).await` copies it into the wrapper (`Instrumented`, a task-local
//! scope), then into the await's slot; `Box::pin(fut)` into the box. Boxed here, first, it is
//! copied once (the compiler still builds it on the stack) and after that moves as a pointer
//! (`scripts/cache-footprint` counts the chat path's data misses, most of them `memcpy` when a
//! large future is not boxed).

use std::pin::Pin;

/// The future `make` builds, boxed and pinned where it will be polled.
#[inline(always)]
pub fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_boxed_future_keeps_its_state_across_polls() {
        let words = String::from("built in place");
        let future = boxed(|| async move {
            // Large state held across a suspension, as the request path's futures hold theirs.
            let table = [7u8; 4096];
            tokio::task::yield_now().await;
            format!("{words}: {}", table.iter().map(|&b| u32::from(b)).sum::<u32>())
        });
        assert_eq!(future.await, "built in place: 28672");
    }
}
