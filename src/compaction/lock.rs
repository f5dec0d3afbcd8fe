//! One compaction per conversation at a time, across replicas: the request that takes the
//! conversation's lock summarizes; a request of the same conversation that finds it taken waits
//! for the holder's record and reuses it. The lock belongs to the conversation, not the session,
//! so another conversation of the session (a subagent, a side request) never waits for it.

use std::time::{Duration, Instant};

use super::plan;
use crate::dialect::ParsedRequest;
use crate::session::SessionCtx;
use crate::session::state::CompactionRecord;

/// How often a waiting request looks for the holder's record.
const POLL: Duration = Duration::from_millis(100);

/// The conversation's compaction lock, held by this request.
pub(super) struct CompactionLock {
    owner: String,
}

impl CompactionLock {
    /// Takes the lock for `hold`; `None` when another request holds it. A store that fails does
    /// not stop the compaction: without the lock, two replicas may at worst both summarize.
    pub(super) async fn claim(ctx: &SessionCtx, hold: Duration) -> Option<Self> {
        let seed = format!("{:?}{}{}", Instant::now(), ctx.key().as_str(), ctx.conversation_id());
        let owner = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(seed.as_bytes()));
        match ctx.try_lock(&owner, hold).await {
            Some(false) => None,
            Some(true) | None => Some(Self { owner }),
        }
    }

    pub(super) async fn release(self, ctx: &SessionCtx) {
        ctx.unlock(&self.owner).await;
    }
}

/// How a wait for another request's compaction ended.
pub(super) enum Waited {
    /// Its record matches the client's conversation (and is now in `ctx`).
    Record(CompactionRecord),
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
            return Waited::Record(record);
        }
        if !locked {
            ctx.adopt(state);
            return Waited::Released;
        }
    }
    Waited::TimedOut
}
