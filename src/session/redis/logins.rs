//! Inspector logins ended by "Log out", kept for every replica until they would have expired.

use redis::Value as RedisValue;

use super::RedisStore;
use crate::session::error::StoreError;

impl RedisStore {
    /// Ends the inspector login `login` for every replica, for `ttl_secs` (its remaining lifetime).
    pub async fn end_login(&self, login: &str, ttl_secs: u64) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.logout_key(login)).arg(1).arg("EX").arg(ttl_secs.max(1));
        let _: RedisValue = self.bounded(connection.command(&cmd)).await?;
        Ok(())
    }

    /// Whether the inspector login `login` was ended (on any replica).
    pub async fn login_ended(&self, login: &str) -> Result<bool, StoreError> {
        let connection = self.connection()?;
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(self.logout_key(login));
        let found: u64 = self.bounded(connection.command(&cmd)).await?;
        Ok(found > 0)
    }
}
