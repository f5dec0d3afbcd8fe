//! Stateful Responses chains compactor recovered (`compaction::stateful`): what a response id or
//! a conversation id the agent names maps to, for every replica.

use redis::Value as RedisValue;

use super::RedisStore;
use crate::session::error::StoreError;

impl RedisStore {
    /// Maps the chain `key` (tenant and id, see [`crate::session::Store::chain`]) to `value`, for
    /// the session TTL.
    pub async fn map_chain(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.chain_key(key)).arg(value).arg("EX").arg(self.ttl_secs.max(1));
        let _: RedisValue = self.bounded(connection.command(&cmd)).await?;
        Ok(())
    }

    /// What the chain `key` maps to, if it was mapped (on any replica).
    pub async fn chain(&self, key: &str) -> Result<Option<String>, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.chain_key(key));
        self.bounded(connection.command(&cmd)).await
    }
}
