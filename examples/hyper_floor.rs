//! The floor of a hyper and tokio proxy: the least a proxy on compactor's stack does for a request
//! compactor would handle (read the whole body, forward it on an HTTP/1.1 keep-alive connection,
//! stream the answer back), with nothing of compactor's own. A reference for the low-rate latency
//! rig (`RIG_COMPARE=target/release/examples/hyper_floor scripts/latency-rig`) and the cache
//! footprint (`scripts/cache-footprint`): what no request path on hyper and tokio can go under.
//!
//! Reads compactor's configuration file for its two addresses: `listen` and `upstream.openai`
//! (plain http). Each client connection gets its own upstream connection, made at its first
//! request: no pool, no lock, no routing, no headers added.
//!
//!   cargo build --release --example hyper_floor
//!   target/release/examples/hyper_floor --config compactor.toml

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::header::{HOST, HeaderValue};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

// The allocator compactor ships with: the floor differs from compactor only in what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Upstream = SendRequest<Full<Bytes>>;

#[derive(serde::Deserialize)]
struct Config {
    listen: String,
    upstream: Addresses,
}

#[derive(serde::Deserialize)]
struct Addresses {
    openai: String,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = match (args.next().as_deref(), args.next()) {
        (Some("--config"), Some(path)) => path,
        _ => {
            eprintln!("usage: hyper_floor --config FILE");
            std::process::exit(2);
        }
    };
    let config: Config = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|text| toml::from_str(&text).map_err(|e| e.to_string()))
    {
        Ok(config) => config,
        Err(error) => {
            eprintln!("hyper_floor: {path}: {error}");
            std::process::exit(2);
        }
    };
    let upstream = config.upstream.openai.trim_start_matches("http://").trim_end_matches('/').to_string();
    // The runtime compactor starts (src/main.rs).
    let served = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .and_then(|runtime| runtime.block_on(serve(config.listen, upstream)));
    if let Err(error) = served {
        eprintln!("hyper_floor: {error}");
        std::process::exit(1);
    }
}

async fn serve(listen: String, upstream: String) -> std::io::Result<()> {
    let listener = TcpListener::bind(&listen).await?;
    let upstream: Arc<str> = upstream.into();
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let upstream = upstream.clone();
        // This connection's upstream connection, taken out while a request uses it.
        let sender: Arc<Mutex<Option<Upstream>>> = Arc::default();
        let service = service_fn(move |request| {
            let (upstream, sender) = (upstream.clone(), sender.clone());
            async move { Ok::<_, Infallible>(forward(&upstream, &sender, request).await) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

async fn forward(
    upstream: &str,
    slot: &Mutex<Option<Upstream>>,
    request: Request<Incoming>,
) -> Response<Either<Incoming, Full<Bytes>>> {
    match try_forward(upstream, slot, request).await {
        Ok(response) => response.map(Either::Left),
        Err(error) => {
            let mut response = Response::new(Either::Right(Full::new(Bytes::from(format!("{error}\n")))));
            *response.status_mut() = StatusCode::BAD_GATEWAY;
            response
        }
    }
}

async fn try_forward(
    upstream: &str,
    slot: &Mutex<Option<Upstream>>,
    request: Request<Incoming>,
) -> Result<Response<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    parts.headers.insert(HOST, HeaderValue::from_str(upstream)?);
    let mut taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    let ready = match taken.as_mut() {
        Some(sender) => sender.ready().await.is_ok(),
        None => false,
    };
    let mut sender = match taken {
        Some(sender) if ready => sender,
        _ => {
            let stream = TcpStream::connect(upstream).await?;
            stream.set_nodelay(true)?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            sender
        }
    };
    let response = sender.send_request(Request::from_parts(parts, Full::new(body))).await?;
    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        return Err("upgrades are not proxied".into());
    }
    Ok(response)
}
