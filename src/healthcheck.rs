//! `compactor healthcheck`: asks a running compactor's `/healthz`, for container HEALTHCHECKs in
//! images that have no shell or curl.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Where to reach the proxy that listens on `listen`: a wildcard address means loopback.
pub fn probe_address(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// True when `/healthz` answered 200 within `timeout`.
pub async fn check(listen: SocketAddr, timeout: Duration) -> Result<(), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri = format!("http://{}/healthz", probe_address(listen));
    let uri: http::Uri = uri.parse().map_err(|e| format!("bad address: {e}"))?;
    match tokio::time::timeout(timeout, client.get(uri)).await {
        Err(_) => Err(format!("no answer within {timeout:?}")),
        Ok(Err(error)) => Err(format!("cannot connect: {error}")),
        Ok(Ok(response)) if response.status().is_success() => Ok(()),
        Ok(Ok(response)) => Err(format!("unhealthy: status {}", response.status())),
    }
}
