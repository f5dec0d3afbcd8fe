//! One compaction per session at a time, across replicas: the request that takes the session's
//! lock summarizes; a request that finds it taken waits for the winner's record and reuses it.

use std::time::{Duration, Instant};

use super::plan;
use crate::dialect::ParsedRequest;
use crate::session::SessionCtx;
use crate::session::state::CompactionRecord;

/// How often a waiting request looks for the winner's record.
const POLL: Duration = Duration::from_millis(100);

/// The session's compaction lock, held by this request.
pub(super) struct CompactionLock {
    owner: String,
}

impl CompactionLock {
    /// Takes the lock for `hold`; `None` when another request holds it. A store that fails does
    /// not stop the compaction: without the lock, two replicas may at worst both summarize.
    pub(super) async fn claim(ctx: &SessionCtx, hold: Duration) -> Option<Self> {
        let seed = format!("{:?}{}", Instant::now(), ctx.key().as_str());
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

/// Waits up to `wait` for a record newer than `generation` that still matches the client's
/// conversation, and adopts the state that carries it; `None` when none came in time.
pub(super) async fn await_winner(
    ctx: &mut SessionCtx,
    client: &ParsedRequest<'_>,
    generation: u32,
    wait: Duration,
) -> Option<CompactionRecord> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        let Some(state) = ctx.fetch().await else { continue };
        let newer: Vec<CompactionRecord> =
            state.compactions.iter().filter(|r| r.generation > generation).cloned().collect();
        if let Some(record) = plan::matching_record(client, &newer).cloned() {
            ctx.adopt(state);
            return Some(record);
        }
    }
    None
}
