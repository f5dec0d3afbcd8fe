//! Every client connection has a deadline from accept (issue 49): one that sends nothing, or
//! goes quiet between requests, is closed at `limits.client_idle_timeout_ms` and frees its slot;
//! a request's headers are bounded by `limits.header_read_timeout_ms` (tests/e2e/faults.rs); a
//! body that stalls gets 408 at `limits.client_body_timeout_ms` on every route that reads one,
//! the inspector's forms included. A request in progress is never idle, however long its answer.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

const AUTH: (&str, &str) = ("authorization", "Bearer sk-test");

const ADMIN_TOKEN: &str = "deadline-admin-token-7c1e";

/// How long after its deadline a connection may take to be seen closed on a loaded machine.
const SLACK: Duration = Duration::from_millis(2_000);

/// Reads until the peer closes (or `within` passes); the bytes read and when the close came.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, Option<Instant>) {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (answer, Some(Instant::now())),
            Ok(Ok(n)) => answer.extend_from_slice(&chunk[..n]),
            Err(_) => return (answer, None),
        }
    }
}

/// An h2c connection (prior knowledge) driven in the background: its request sender, and the
/// task that ends when compactor closes the connection.
async fn h2c<B>(addr: SocketAddr) -> (hyper::client::conn::http2::SendRequest<B>, tokio::task::JoinHandle<()>)
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    let driven = tokio::spawn(async move {
        let _ = connection.await;
    });
    (sender, driven)
}

#[tokio::test]
async fn silent_connections_are_closed_at_the_idle_timeout_and_free_their_slots() {
    let (_fake, proxy) = ProxyProcess::with_fake("[limits]\nmax_connections = 4\nclient_idle_timeout_ms = 300\n").await;
    // The readiness probe's connection gives its slot back.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let opened = Instant::now();
    let mut silent = Vec::new();
    for shape in 0..4 {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        // One starts the h2c preface and stops: the HTTP version is never told.
        if shape == 3 {
            stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        }
        silent.push(stream);
    }
    let crowded = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
    assert_eq!(crowded.status, 503, "the four silent connections hold every slot: {}", crowded.text());

    for (shape, stream) in silent.iter_mut().enumerate() {
        let (bytes, closed) = until_closed(stream, Duration::from_millis(300) + SLACK).await;
        let closed =
            closed.unwrap_or_else(|| panic!("silent connection {shape} still open after {:?}", opened.elapsed()));
        assert!(closed - opened >= Duration::from_millis(250), "connection {shape} closed before its deadline");
        assert!(bytes.is_empty(), "connection {shape} was answered: {}", String::from_utf8_lossy(&bytes));
    }
    let served = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
    assert_eq!(served.status, 200, "the slots are free again: {}", served.text());
}

#[tokio::test]
async fn a_kept_alive_connection_that_goes_quiet_is_closed_at_the_idle_timeout_h2c_too() {
    let (_fake, proxy) = ProxyProcess::with_fake("[limits]\nclient_idle_timeout_ms = 300\n").await;

    // HTTP/1.1: one request answered and kept alive, then silence.
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n").await.unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let answered = Instant::now();
    let (_, closed) = until_closed(&mut stream, Duration::from_millis(300) + SLACK).await;
    let closed =
        closed.unwrap_or_else(|| panic!("the idle HTTP/1.1 connection still open after {:?}", answered.elapsed()));
    assert!(closed - answered >= Duration::from_millis(250), "closed before its idle timeout");

    // h2c: one request answered, then no stream open.
    let (mut sender, driven) = h2c::<Empty<Bytes>>(proxy.addr).await;
    let health = http::Request::get(proxy.url("/healthz")).body(Empty::<Bytes>::new()).unwrap();
    let response = sender.send_request(health).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    let answered = Instant::now();
    tokio::time::timeout(Duration::from_millis(300) + SLACK, driven)
        .await
        .unwrap_or_else(|_| panic!("the idle h2c connection still open after {:?}", answered.elapsed()))
        .unwrap();

    // h2c that never opens a stream (the preface and settings only).
    let (_sender, driven) = h2c::<Empty<Bytes>>(proxy.addr).await;
    let opened = Instant::now();
    tokio::time::timeout(Duration::from_millis(300) + SLACK, driven)
        .await
        .unwrap_or_else(|_| panic!("the h2c connection with no stream still open after {:?}", opened.elapsed()))
        .unwrap();
}

#[tokio::test]
async fn a_request_in_progress_is_never_idle_however_long_its_answer_takes() {
    let fake = FakeUpstream::builder().pacing(Pacing::Delay(Duration::from_millis(400))).start().await;
    let proxy = ProxyProcess::start(&fake, "[limits]\nclient_idle_timeout_ms = 300\n");
    // An answer that comes after 1 s, an event stream with 400 ms between events, and a
    // kept-alive connection's next request 100 ms after the last answer: all within the deadline.
    fake.respond_with(|received| {
        (!received.body.windows(13).any(|w| w == b"\"stream\":true")).then(|| {
            Reply::json(200, serde_json::json!({"id": "slow", "object": "chat.completion", "choices": []}))
                .after(Duration::from_millis(1_000))
        })
    });
    let client = client();
    for stream in [false, true, false] {
        let response = client
            .request(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(stream)))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.expect("the whole answer, not a cut connection");
        let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
        assert!(if stream { text.contains("[DONE]") } else { text.contains("\"slow\"") }, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The same over h2c.
    let (mut sender, _driven) = h2c(proxy.addr).await;
    let slow = http::Request::post(proxy.url("/v1/chat/completions"))
        .header(AUTH.0, AUTH.1)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(chat_body(false))))
        .unwrap();
    let response = sender.send_request(slow).await.expect("answered on the h2c connection");
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("\"slow\""));
}

/// A POST of `path` declaring a 200-byte body and sending 6 bytes of it, then nothing.
async fn stalled_form(addr: SocketAddr, path: &str, headers: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 200\r\n{headers}\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(b"token=").await.unwrap();
    stream
}

#[tokio::test]
async fn a_stalled_inspector_form_gets_408_at_the_body_timeout() {
    let config = format!("[admin]\ntoken = \"{ADMIN_TOKEN}\"\n[limits]\nclient_body_timeout_ms = 300\n");
    let (_fake, proxy) = ProxyProcess::with_fake(&config).await;
    let bearer = format!("authorization: Bearer {ADMIN_TOKEN}\r\n");
    for (path, headers) in [("/ui/login", ""), ("/ui/sessions/0a1b.2c3d/forget", bearer.as_str())] {
        let mut stream = stalled_form(proxy.addr, path, headers).await;
        let sent = Instant::now();
        let (answer, closed) = until_closed(&mut stream, Duration::from_millis(300) + SLACK).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(closed.is_some(), "{path}: the stalled form still held after {:?}: {answer:?}", sent.elapsed());
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(answer.contains("text/html"), "{path}: the inspector's own page: {answer}");
        assert!(sent.elapsed() >= Duration::from_millis(250), "{path}: answered before the body timeout");
    }
    // The admin API reads no body: a stalled one is answered at once and the connection closed.
    let mut stream = stalled_form(proxy.addr, "/admin/sessions/0a1b.2c3d", &bearer).await;
    let (answer, closed) = until_closed(&mut stream, SLACK).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(closed.is_some(), "the admin API held a stalled body: {answer:?}");
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
}
