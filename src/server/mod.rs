//! The listening side: accepts HTTP/1.1 and h2c connections, answers compactor's own endpoints,
//! hands everything else to the proxy pipeline, and drains gracefully on shutdown.

mod ops;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::proxy::{Proxy, ResponseBody};
use crate::session::Store;

/// Shared by every connection.
pub struct AppState {
    pub config: Arc<Config>,
    pub proxy: Proxy,
    /// The session store, for readiness and the admin API (the proxy's requests reach it through
    /// their session contexts).
    pub store: Store,
    pub metrics: Option<PrometheusHandle>,
    ready: AtomicBool,
}

impl AppState {
    pub fn new(config: Arc<Config>, metrics: Option<PrometheusHandle>) -> Result<Self, std::io::Error> {
        let store = Store::from_config(&config.session);
        let proxy = Proxy::new(config.clone(), store.clone())?;
        Ok(Self { config, proxy, store, metrics, ready: AtomicBool::new(true) })
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// Routes a request: compactor's own endpoints first, then the proxy.
async fn route(state: Arc<AppState>, request: Request<Incoming>) -> Response<ResponseBody> {
    if let Some(response) = ops::answer(&state, &request).await {
        return response;
    }
    state.proxy.handle(request).await
}

/// Serves until `shutdown` resolves, then stops accepting, reports not ready, and lets in-flight
/// requests finish (their log lines written, their session state committed) for up to
/// `shutdown.drain_timeout_ms`.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let drain = state.config.shutdown.drain_timeout;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(60));
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, %peer, "cannot set TCP_NODELAY");
        }
        let state = state.clone();
        let service = service_fn(move |request| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(route(state, request).await) }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
        });
    }

    state.ready.store(false, Ordering::Relaxed);
    drop(listener);
    tracing::info!(drain_timeout_ms = drain.as_millis() as u64, "shutting down: draining in-flight requests");
    let drained = async {
        graceful.shutdown().await;
        state.proxy.finished().await;
    };
    match tokio::time::timeout(drain, drained).await {
        Ok(()) => tracing::info!("all connections drained"),
        Err(_) => tracing::warn!("drain timeout reached; closing remaining connections"),
    }
    Ok(())
}

/// Binds the configured address; the log line carries the real port (tests bind port 0).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!("listening on {}", listener.local_addr()?);
    Ok(listener)
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {},
                    _ = terminate.recv() => {},
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
