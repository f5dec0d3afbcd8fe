//! One compaction per conversation at a time, across replicas: the request that takes the
//! conversation's lock summarizes; a request of the same conversation that finds it taken waits
//! for the holder's record and reuses it. The lock belongs to the conversation, not the session,
//! so another conversation of the session (a subagent, a side request) never waits for it.
//!
//! The lock is a lease: its holder renews it every third of `compaction.lock_lease_ms` for as
//! long as it summarizes (a rolling summary may make many calls), so it lapses only when the
//! holder died or lost the store for a whole lease. Its record is fenced by its generation: the
//! store keeps no second record of a generation it holds, so a holder whose lease lapsed while
//! another took over cannot lay its record beside the winner's.

use std::time::{Duration, Instant};

use super::plan;
use super::request::RequestState;
use crate::dialect::ParsedRequest;
use crate::session::SessionCtx;
use crate::session::state::CompactionRecord;

/// How often a waiting request looks for the holder's record.
const POLL: Duration = Duration::from_millis(100);

/// The conversation's compaction lock, held by this request.
pub(super) struct ConversationLock {
    owner: String,
    /// False when the store failed and the compaction goes on without the lock: nothing to renew.
    held: bool,
}

impl ConversationLock {
    /// Takes the lock for `hold`; `None` when another request holds it. A store that fails does
    /// not stop the compaction: without the lock, two replicas may at worst both summarize.
    pub(super) async fn claim(ctx: &SessionCtx, hold: Duration) -> Option<Self> {
        let seed = format!("{:?}{}{}", Instant::now(), ctx.key().as_str(), ctx.conversation_id());
        let owner = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(seed.as_bytes()));
        match ctx.try_lock(&owner, hold).await {
            Some(false) => None,
            Some(true) => Some(Self { owner, held: true }),
            None => Some(Self { owner, held: false }),
        }
    }

    /// Runs `work` while renewing the lock's `lease` every third of it; a lease found lapsed is
    /// logged and no longer renewed (the record's fencing decides then).
    pub(super) async fn renewing<T>(&self, ctx: &SessionCtx, lease: Duration, work: impl Future<Output = T>) -> T {
        let renew = async {
            if self.held {
                loop {
                    tokio::time::sleep(lease / 3).await;
                    if ctx.renew_lock(&self.owner, lease).await == Some(false) {
                        tracing::warn!(
                            session = %ctx.key().as_str(),
                            conversation = %ctx.conversation_id(),
                            "compaction lock lapsed while its holder summarized; its record is fenced by its generation"
                        );
                        break;
                    }
                }
            }
            std::future::pending::<std::convert::Infallible>().await
        };
        tokio::select! {
            done = work => done,
            never = renew => match never {},
        }
    }

    pub(super) async fn release(self, ctx: &SessionCtx) {
        ctx.unlock(&self.owner).await;
    }
}

/// How a wait for another request's compaction ended.
pub(super) enum Waited {
    /// Its record matches the client's conversation (and is now in `ctx`). Boxed: a record is
    /// large beside the other variants.
    Record(Box<CompactionRecord>),
    /// It released the lock without a record that matches: nothing more to wait for.
    Released,
    /// It still held the lock after the wait.
    TimedOut,
}

/// Waits up to `wait` for a record newer than those `ctx` has that still matches the client's
/// conversation, and adopts the conversation's state that carries it. Stops waiting as soon as
/// the lock is free without such a record: the holder is done and cannot help any more.
pub(super) async fn await_winner(ctx: &mut SessionCtx, client: &ParsedRequest<'_>, wait: Duration) -> Waited {
    let seen = ctx.conversation().compactions.iter().map(|r| r.generation).max().unwrap_or(0);
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        let Some((state, locked)) = ctx.poll().await else { continue };
        let newer: Vec<CompactionRecord> = state.compactions.iter().filter(|r| r.generation > seen).cloned().collect();
        if let Some(record) = plan::matching_record(client, &newer).cloned() {
            ctx.adopt(state);
            return Waited::Record(Box::new(record));
        }
        if !locked {
            ctx.adopt(state);
            return Waited::Released;
        }
    }
    Waited::TimedOut
}

/// Reads the conversation as stored now, under the lock just taken, into `ctx`: a record newer
/// than those the request loaded that matches the client's conversation is returned for reuse.
pub(super) async fn fresh_record(ctx: &mut SessionCtx, client: &ParsedRequest<'_>) -> Option<CompactionRecord> {
    let seen = ctx.conversation().compactions.iter().map(|r| r.generation).max().unwrap_or(0);
    let (state, _) = ctx.poll().await?;
    let newer: Vec<CompactionRecord> = state.compactions.iter().filter(|r| r.generation > seen).cloned().collect();
    let reuse = plan::matching_record(client, &newer).cloned();
    ctx.adopt(state);
    reuse
}

/// After publishing `record`: `None` when the store kept it; when the fencing refused it
/// (another holder stored that generation first), the record that won, if it matches the
/// client's conversation, adopted in `ctx`.
pub(super) async fn fenced(
    ctx: &mut SessionCtx,
    record: &CompactionRecord,
    client: &ParsedRequest<'_>,
) -> Option<CompactionRecord> {
    let (state, _) = ctx.poll().await?;
    if state.compactions.contains(record) {
        return None;
    }
    tracing::warn!(
        session = %ctx.key().as_str(),
        conversation = %ctx.conversation_id(),
        generation = record.generation,
        "compaction record fenced: another holder stored this generation first"
    );
    let winner = state.compactions.iter().filter(|r| r.generation >= record.generation).cloned().collect::<Vec<_>>();
    let winner = plan::matching_record(client, &winner).cloned();
    ctx.adopt(state);
    winner
}

/// The record prepared in the background for the crossing `job`'s request foresaw, by another
/// request's job: stored already, or awaited from the job that holds the lock (up to `wait`).
/// `None` when there is none that matches the request's conversation, or it is applied already.
pub(super) async fn prepared_record(
    job: &RequestState,
    ctx: &mut SessionCtx,
    wait: Duration,
) -> Option<CompactionRecord> {
    let client = job.parse(&job.client_body)?;
    let applied = job.compacted().unwrap_or(0);
    let stored: Vec<CompactionRecord> =
        ctx.conversation().compactions.iter().filter(|r| r.generation > applied).cloned().collect();
    let record = match plan::matching_record(&client, &stored).cloned() {
        Some(record) => record,
        None => match await_winner(ctx, &client, wait).await {
            Waited::Record(record) => *record,
            Waited::Released | Waited::TimedOut => return None,
        },
    };
    let unapplied = ctx.conversation().usage.is_none_or(|usage| usage.generation < record.generation);
    (record.due_tokens > 0 && unapplied).then_some(record)
}
