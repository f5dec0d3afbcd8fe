//! The listening side: accepts HTTP/1.1 and h2c connections, answers compactor's own endpoints,
//! hands everything else to the proxy pipeline, and drains gracefully on shutdown.

mod idle;
mod ops;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;
use crate::error::ProxyError;
use crate::proxy::{Proxy, ResponseBody};
use crate::route::Route;
use crate::session::Store;
use crate::telemetry::metric;

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
        // Off the async workers, while the listener starts: readiness waits for it.
        crate::tokens::preload();
        // Nothing is recorded while the inspector's pages are off (no admin token): no one could read it.
        let recorded = if config.admin.token.is_empty() { 0 } else { config.inspector.requests_per_conversation };
        let store = Store::from_config(&config.session).recording(recorded as usize);
        let proxy = Proxy::new(config.clone(), store.clone())?;
        Ok(Self { config, proxy, store, metrics, ready: AtomicBool::new(true) })
    }

    /// False once shutting down.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// False until the tokenizer tables are loaded (see [`crate::tokens::preload`]).
    pub fn is_started(&self) -> bool {
        crate::tokens::is_loaded(crate::tokens::DEFAULT_ENCODING)
    }
}

/// Routes a request: compactor's own endpoints first, then the proxy; both see the normalized
/// path ([`crate::route::normalize_path`]), which is also the path sent upstream.
async fn route(state: Arc<AppState>, mut request: Request<Incoming>) -> Response<ResponseBody> {
    if let Some(path) = crate::route::normalize_path(request.uri().path()) {
        let mut parts = request.uri().clone().into_parts();
        let path_and_query = match request.uri().query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        if let Ok(normal) = path_and_query.parse() {
            parts.path_and_query = Some(normal);
            if let Ok(uri) = http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
    }
    // compactor's own readings (the inspector, the admin API, metrics) include every response
    // already sent: its recording follows the response by microseconds (see `proxy::recorded`).
    let path = request.uri().path();
    let page = crate::inspector::owns(path);
    if page || path.starts_with("/admin/") || path == "/metrics" {
        crate::proxy::recorded(crate::proxy::RECORDED_WITHIN).await;
    }
    if page {
        // Boxed: the pages' futures are large, and this one is held by every request otherwise.
        return Box::pin(crate::inspector::answer(&state.config, &state.store, request)).await;
    }
    if let Some(response) = ops::answer(&state, &request).await {
        return response;
    }
    state.proxy.handle(request).await
}

/// Serves until `shutdown` resolves, then stops accepting, reports not ready, and lets in-flight
/// requests finish (their log lines written, their session state committed) for up to
/// `shutdown.drain_timeout_ms`. At most `limits.max_connections` connections are served at once;
/// one more is refused (see [`refuse`]). A connection with no request in progress is closed after
/// `limits.client_idle_timeout_ms` (see [`idle`]), so a silent one cannot keep its slot.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let drain = state.config.shutdown.drain_timeout;
    let limits = &state.config.limits;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(usize::try_from(limits.max_connections).unwrap_or(usize::MAX)));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSING));
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
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            metric::connection_refused();
            if let Ok(slot) = refusals.clone().try_acquire_owned() {
                tokio::spawn(refuse(state.clone(), stream, slot));
            }
            // Past even the refusing slots the socket is simply closed.
            continue;
        };
        metric::connection_opened();
        let state = state.clone();
        let requests = Arc::new(idle::Requests::default());
        let stream = idle::IdleDeadline::new(stream, requests.clone(), limits.client_idle_timeout);
        let service = service_fn(move |request| {
            let in_progress = requests.begin();
            let state = state.clone();
            async move {
                let response = route(state, request).await;
                Ok::<_, Infallible>(response.map(|body| idle::Answered::new(body, in_progress)))
            }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        // The requests the connection ends are recorded after each poll, once hyper wrote the
        // responses out (see `proxy::recording`).
        let connection = crate::proxy::recording(graceful.watch(connection));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
            drop(permit);
            metric::connection_closed();
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

/// Connections being refused at once; past this a connection over the limit is closed unanswered.
const MAX_REFUSING: usize = 64;

/// The longest a refused connection is kept: long enough to read a request and answer it.
const REFUSAL_TIME: Duration = Duration::from_secs(5);

/// A connection over `limits.max_connections`: every request on it is answered 503 `overloaded`
/// in its API dialect, with `retry-after` and `connection: close` (compactor's own /healthz and
/// /readyz still answer), and the connection is closed. A client sees why, instead of hanging in
/// the listen backlog.
async fn refuse(state: Arc<AppState>, stream: tokio::net::TcpStream, _slot: OwnedSemaphorePermit) {
    let limit = state.config.limits.max_connections;
    let service = service_fn(move |request: Request<Incoming>| {
        let state = state.clone();
        async move {
            if matches!(request.uri().path(), "/healthz" | "/readyz")
                && let Some(response) = ops::answer(&state, &request).await
            {
                return Ok::<_, Infallible>(response);
            }
            let family = Route::of(request.method(), request.uri().path(), request.headers()).family;
            let mut response: Response<ResponseBody> = ProxyError::Overloaded { limit }.into_response(family);
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            Ok(response)
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).keep_alive(false).header_read_timeout(REFUSAL_TIME);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(REFUSAL_TIME, connection).await;
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
