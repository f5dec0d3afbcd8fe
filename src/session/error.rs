//! What can go wrong with the session store; the causes are kept.

use std::time::Duration;

use crate::error::ProxyError;

/// Why the session store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not connected to redis")]
    NotConnected,
    #[error("redis failed")]
    Redis(#[source] redis::RedisError),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("cannot serialize session state")]
    Serialize(#[source] serde_json::Error),
}

/// The admin API answers a store failure with a 503 the client may retry.
impl From<StoreError> for ProxyError {
    fn from(error: StoreError) -> Self {
        ProxyError::StoreUnavailable(Box::new(error))
    }
}
