//! compactor's CPU work on a request's content (parsing, counting, the policies, rendering,
//! rebuilding), kept from harming other requests: each step of a large request runs off the async
//! workers, every step counts against the request's budget (`limits.rewrite_budget_ms`), and a
//! client that leaves stops the work at the next step.
//!
//! The request's [`Budget`] travels with its task ([`Budget::scope`]), so the code that does the
//! work only marks its steps with [`step`]; outside a scope (tests, benchmarks) steps run as plain
//! calls. Every step is linear in the request's size (`tests/timing/doubling.rs`), so a step is short
//! and the budget is checked often.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::{CancellationToken, DropGuard};

/// Requests at least this large run their steps off the async workers: a step of a small
/// request costs microseconds, less than moving it to another thread would.
pub const OFFLOAD_BYTES: usize = 256 * 1024;

/// What a parse holds per message at its peak, whatever the message's size: the message's entry,
/// its fields, its item in the neutral view, its counts and the layout (measured: ~990 bytes for a
/// one-letter message, `scripts/measure-memory` with the bound off; docs/limits.md).
pub const PARSE_BYTES_PER_MESSAGE: usize = 1024;

/// What a parse holds per content part or tool call beyond a message's first: its entry in the
/// message's blocks, its item and its counts (measured: ~290 bytes for a one-letter text part,
/// `MEASURE_SHAPE=parts scripts/measure-memory` with the bound off).
pub const PARSE_BYTES_PER_ITEM: usize = 320;

tokio::task_local! {
    static BUDGET: Arc<Budget>;
}

/// Why the work stopped before it was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stopped {
    #[error("the request's rewrite budget is spent")]
    OverBudget,
    #[error("the client went away")]
    Cancelled,
}

/// One request's allowance of CPU work.
#[derive(Debug)]
pub struct Budget {
    limit: Duration,
    spent_nanos: AtomicU64,
    /// Run steps off the async workers.
    offload: AtomicBool,
    cancel: CancellationToken,
    /// Memory the request's parse may take (`limits.parse_memory_*`); unbounded unless set.
    parse_memory: AtomicUsize,
    /// A parse stopped at that bound.
    parse_refused: AtomicBool,
}

impl Budget {
    /// A budget of `limit` for a request of `body_bytes`.
    pub fn new(limit: Duration, body_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            spent_nanos: AtomicU64::new(0),
            offload: AtomicBool::new(body_bytes >= OFFLOAD_BYTES),
            cancel: CancellationToken::new(),
            parse_memory: AtomicUsize::new(usize::MAX),
            parse_refused: AtomicBool::new(false),
        })
    }

    /// Bounds the memory the request's parse may take: a body with more messages than
    /// `bytes` / [`PARSE_BYTES_PER_MESSAGE`] is not parsed (it goes as it came).
    pub fn bound_parse(&self, bytes: usize) {
        self.parse_memory.store(bytes, Ordering::Relaxed);
    }

    /// Whether a parse of this request stopped at its memory bound.
    pub fn parse_refused(&self) -> bool {
        self.parse_refused.load(Ordering::Relaxed)
    }

    /// Runs `work` with this budget: the steps inside it are counted against it.
    pub async fn scope<F: Future>(self: &Arc<Self>, work: F) -> F::Output {
        BUDGET.scope(self.clone(), work).await
    }

    /// A guard that stops the work when dropped: held by the request, so a client that leaves
    /// (hyper drops the request's future) stops work running on other threads too.
    pub fn stop_on_drop(&self) -> DropGuard {
        self.cancel.clone().drop_guard()
    }

    /// Sizes the rest of the work by what is left to do: a large body whose parse re-made all but
    /// `new_bytes` of it from the previous turn (the agent's next turn) has little left, and each
    /// step handed to another thread costs context switches worth a tenth of such a turn.
    pub fn left_to_do(&self, new_bytes: usize) {
        if new_bytes < OFFLOAD_BYTES {
            self.offload.store(false, Ordering::Relaxed);
        }
    }

    pub fn spent(&self) -> Duration {
        Duration::from_nanos(self.spent_nanos.load(Ordering::Relaxed))
    }

    /// Whether work that began at `started` (not yet counted) must stop now.
    pub fn check(&self, started: Option<Instant>) -> Result<(), Stopped> {
        if self.cancel.is_cancelled() {
            return Err(Stopped::Cancelled);
        }
        let running = started.map_or(Duration::ZERO, |at| at.elapsed());
        if self.spent() + running > self.limit {
            return Err(Stopped::OverBudget);
        }
        Ok(())
    }

    fn charge(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.spent_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// The budget of the request this task serves, if any.
pub fn current() -> Option<Arc<Budget>> {
    BUDGET.try_with(Arc::clone).ok()
}

/// A step that ran at least this long yields before the next one.
const YIELD_AFTER: Duration = Duration::from_micros(100);

/// Runs one step of CPU work for the current request: refused when its budget is spent or its
/// client gone; off the async workers when the request is large. A step that took long (or ran
/// off the worker) then yields, so the worker's other tasks run and a client that left is noticed
/// before the next step. A short one goes straight on: every step of a small request takes
/// microseconds, and each yield costs the worker a poll of the I/O driver (a system call) and the
/// request's task a poll from the top.
pub async fn step<T>(work: impl FnOnce() -> T) -> Result<T, Stopped> {
    let Some(budget) = current() else { return Ok(work()) };
    budget.check(None)?;
    let started = Instant::now();
    let offload = budget.offload.load(Ordering::Relaxed) && on_worker_pool();
    let value = if offload { tokio::task::block_in_place(work) } else { work() };
    let elapsed = started.elapsed();
    budget.charge(elapsed);
    if offload || elapsed >= YIELD_AFTER {
        tokio::task::yield_now().await;
    }
    Ok(value)
}

/// The memory the current request's parse may take ([`Budget::bound_parse`]), read once when the
/// parse starts; no bound outside a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseBound {
    bytes: usize,
}

impl ParseBound {
    pub fn current() -> Self {
        Self { bytes: current().map_or(usize::MAX, |budget| budget.parse_memory.load(Ordering::Relaxed)) }
    }

    /// The most messages a parse within the bound may hold.
    pub fn messages(self) -> usize {
        self.bytes / PARSE_BYTES_PER_MESSAGE
    }

    /// Whether a parse may hold `messages` and `items` (a message's first item is in its own
    /// weight); a refusal is noted on the request's budget ([`Budget::parse_refused`]).
    pub fn holds(self, messages: usize, items: usize) -> bool {
        let more = items.saturating_sub(messages);
        let weight =
            messages.saturating_mul(PARSE_BYTES_PER_MESSAGE).saturating_add(more.saturating_mul(PARSE_BYTES_PER_ITEM));
        let holds = weight <= self.bytes;
        if !holds {
            refuse_parse();
        }
        holds
    }
}

/// Notes that the current request's parse stopped at its memory bound.
pub fn refuse_parse() {
    if let Some(budget) = current() {
        budget.parse_refused.store(true, Ordering::Relaxed);
    }
}

/// Charges the current request for work done elsewhere (on a blocking thread) while it waited.
pub fn charge(elapsed: Duration) {
    if let Some(budget) = current() {
        budget.charge(elapsed);
    }
}

/// Whether this thread belongs to a multi-threaded runtime, where `block_in_place` may hand the
/// async worker's other tasks to another thread (it panics on a current-thread runtime).
fn on_worker_pool() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn steps_outside_a_request_just_run() {
        assert_eq!(step(|| 7).await, Ok(7));
    }

    #[tokio::test]
    async fn a_spent_budget_refuses_the_next_step() {
        let budget = Budget::new(Duration::from_millis(20), 0);
        let result = budget
            .scope(async {
                step(|| std::thread::sleep(Duration::from_millis(30))).await?;
                step(|| "never").await
            })
            .await;
        assert_eq!(result, Err(Stopped::OverBudget));
        assert!(budget.spent() >= Duration::from_millis(30));
    }

    #[tokio::test]
    async fn a_dropped_request_stops_its_work() {
        let budget = Budget::new(Duration::from_secs(60), 0);
        drop(budget.stop_on_drop());
        assert_eq!(budget.scope(step(|| 1)).await, Err(Stopped::Cancelled));
        assert_eq!(budget.check(None), Err(Stopped::Cancelled));
    }

    /// Whether a task spawned while a 50 ms step of a request of `body_bytes` runs gets to run
    /// before the step ends, on a runtime with one async worker (the request a task on it).
    async fn others_run_during_a_step(body_bytes: usize, left: Option<usize>) -> bool {
        tokio::spawn(request_with_another_task(body_bytes, left)).await.unwrap()
    }

    async fn request_with_another_task(body_bytes: usize, left: Option<usize>) -> bool {
        let budget = Budget::new(Duration::from_secs(60), body_bytes);
        if let Some(new_bytes) = left {
            budget.left_to_do(new_bytes);
        }
        let ran = Arc::new(std::sync::Mutex::new(None));
        let other = tokio::spawn({
            let ran = ran.clone();
            async move { *ran.lock().unwrap() = Some(Instant::now()) }
        });
        let ended = budget
            .scope(step(|| {
                std::thread::sleep(Duration::from_millis(50));
                Instant::now()
            }))
            .await
            .unwrap();
        other.await.unwrap();
        let ran = ran.lock().unwrap().unwrap();
        ran < ended
    }

    /// Whether a task spawned before a step gets to run between that step and the next, on a
    /// runtime with one thread: only when the step yielded.
    async fn others_run_between_steps(step_takes: Option<Duration>) -> bool {
        let budget = Budget::new(Duration::from_secs(60), 1024);
        let ran = Arc::new(AtomicBool::new(false));
        tokio::spawn({
            let ran = ran.clone();
            async move { ran.store(true, Ordering::Relaxed) }
        });
        budget
            .scope(async {
                step(|| step_takes.map(std::thread::sleep)).await.unwrap();
                step(|| ran.load(Ordering::Relaxed)).await.unwrap()
            })
            .await
    }

    #[tokio::test(flavor = "current_thread")]
    async fn only_a_long_step_lets_other_tasks_run_before_the_next() {
        // A thread preempted inside the step could stretch a short one: one try in five is enough.
        let mut went_on = false;
        for _ in 0..5 {
            went_on |= !others_run_between_steps(None).await;
        }
        assert!(went_on, "a short step goes straight on");
        assert!(others_run_between_steps(Some(Duration::from_millis(2))).await, "a long step yields");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_large_request_with_little_left_to_do_steps_on_its_worker() {
        assert!(others_run_during_a_step(OFFLOAD_BYTES, None).await, "a large request's step goes off the worker");
        assert!(others_run_during_a_step(OFFLOAD_BYTES, Some(OFFLOAD_BYTES)).await, "much left: still off");
        assert!(!others_run_during_a_step(OFFLOAD_BYTES, Some(4096)).await, "a warm turn's steps stay on it");
        assert!(!others_run_during_a_step(1024, None).await, "a small request's steps stay on it");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_requests_step_off_the_async_workers() {
        let budget = Budget::new(Duration::from_secs(60), OFFLOAD_BYTES);
        let other = tokio::spawn(async { "the other task ran" });
        let done = budget.scope(step(|| std::thread::sleep(Duration::from_millis(50)))).await;
        assert_eq!(done, Ok(()));
        assert_eq!(other.await.unwrap(), "the other task ran");
    }
}
