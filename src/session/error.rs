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
    #[error("skipped: it failed too often in a row (circuit breaker open)")]
    CircuitOpen,
    #[error("stored value unreadable: {0}")]
    Corrupt(String),
    /// Written by another schema version of compactor (a replica of another release during a
    /// rolling deploy): not this version's to read, nor to delete or overwrite.
    #[error("stored by schema version {0}, this is version {current}", current = super::state::STATE_VERSION)]
    OtherVersion(u32),
}

impl StoreError {
    /// Whether the store itself is unreachable or too slow (what the circuit breaker counts), as
    /// opposed to answering with something compactor cannot use.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::NotConnected | Self::Timeout(_) => true,
            Self::Redis(error) => {
                use redis::{ErrorKind, ServerErrorKind};
                error.is_io_error()
                    || error.is_timeout()
                    || error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || matches!(
                        error.kind(),
                        ErrorKind::ClusterConnectionNotFound
                            | ErrorKind::Server(
                                ServerErrorKind::BusyLoading
                                    | ServerErrorKind::TryAgain
                                    | ServerErrorKind::ClusterDown
                                    | ServerErrorKind::MasterDown
                            )
                    )
            }
            Self::Serialize(_) | Self::CircuitOpen | Self::Corrupt(_) | Self::OtherVersion(_) => false,
        }
    }
}

/// The admin API answers a store failure with a 503 the client may retry.
impl From<StoreError> for ProxyError {
    fn from(error: StoreError) -> Self {
        ProxyError::StoreUnavailable(Box::new(error))
    }
}
