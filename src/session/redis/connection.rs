//! The connection to one Redis or to a Redis Cluster (both reconnect by themselves), and every
//! command's deadline.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Pipeline, RedisResult};

use super::RedisStore;
use crate::session::error::StoreError;

/// A connection to one Redis or to a Redis Cluster; both reconnect by themselves.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    pub(super) async fn query<T: redis::FromRedisValue>(&self, pipeline: &Pipeline) -> RedisResult<T> {
        match self {
            Connection::Single(c) => pipeline.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => pipeline.query_async(&mut c.clone()).await,
        }
    }

    pub(super) async fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match self {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

pub(super) async fn connect(urls: &[String], cluster: bool) -> RedisResult<Connection> {
    if cluster {
        let client = ClusterClient::builder(urls.to_vec())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()?;
        return Ok(Connection::Cluster(client.get_async_connection().await?));
    }
    let client = redis::Client::open(urls.first().map(String::as_str).unwrap_or_default())?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_max_delay(Duration::from_secs(2));
    Ok(Connection::Single(ConnectionManager::new_with_config(client, config).await?))
}

impl RedisStore {
    pub(super) fn connection(&self) -> Result<&Connection, StoreError> {
        self.connection.get().ok_or(StoreError::NotConnected)
    }

    pub(super) async fn bounded<T>(&self, work: impl Future<Output = RedisResult<T>>) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, work).await {
            Err(_) => Err(StoreError::Timeout(self.timeout)),
            Ok(Err(error)) => Err(StoreError::Redis(error)),
            Ok(Ok(value)) => Ok(value),
        }
    }

    /// Round-trips a PING, for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let connection = self.connection()?;
        let _: String = self.bounded(connection.command(&redis::cmd("PING"))).await?;
        Ok(())
    }
}
