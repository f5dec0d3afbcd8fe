//! A conversation's compaction lock: taken with a lease, renewed and released only by its owner.

use std::time::Duration;

use redis::Value as RedisValue;

use super::RedisStore;
use super::scripts::{RELEASE_LOCK, RENEW_LOCK};
use crate::session::error::StoreError;

impl RedisStore {
    /// Takes the conversation's compaction lock for `hold` unless someone else has it (SET NX PX).
    pub async fn try_lock(
        &self,
        session: &str,
        conversation: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.lock_key(session, conversation)).arg(owner).arg("NX").arg("PX").arg(hold.as_millis() as u64);
        let reply: RedisValue = self.bounded(connection.command(&cmd)).await?;
        Ok(matches!(reply, RedisValue::Okay))
    }

    /// Extends the lease of the conversation's lock to `lease` from now, only if `owner` still
    /// holds it; false when it does not (its lease lapsed and someone else may hold it).
    pub async fn renew_lock(
        &self,
        session: &str,
        conversation: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RENEW_LOCK).arg(1).arg(self.lock_key(session, conversation)).arg(owner).arg(lease.as_millis() as u64);
        let renewed: u64 = self.bounded(connection.command(&cmd)).await?;
        Ok(renewed == 1)
    }

    /// Releases the conversation's lock only if `owner` still holds it.
    pub async fn unlock(&self, session: &str, conversation: &str, owner: &str) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RELEASE_LOCK).arg(1).arg(self.lock_key(session, conversation)).arg(owner);
        let released: u64 = self.bounded(connection.command(&cmd)).await?;
        Ok(released == 1)
    }
}
