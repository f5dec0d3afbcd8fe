//! Upstream connections (issue 11): kept alive and reused, replaced when the upstream closed them
//! while idle, never shared with a response still being read, and a request that went out is
//! never sent twice. The upstream here is a raw socket, so each test says exactly what it does.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

const AUTH: (&str, &str) = ("authorization", "Bearer sk-test");

const ANSWER: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":3,"total_tokens":43}}"#;

/// What the upstream does with one request.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// Answers with a complete JSON body, then keeps the connection open for the next request.
    Answer,
    /// Answers with a complete keep-alive response, then closes the connection.
    AnswerThenClose,
    /// Sends the head and part of the declared body, then closes the connection.
    CutMidBody,
    /// Reads the request and closes the connection without a word.
    CloseUnanswered,
    /// Starts an event stream with one event, then sends nothing more (the connection stays open).
    HoldStream,
    /// Answers chunked with a stale `content-length` of 10 beside `transfer-encoding: chunked`
    /// (RFC 9112 §6.3: the transfer coding wins, and a proxy drops the length).
    ChunkedWithStaleLength,
}

/// An upstream that plays its scripts in order, one a request (then [`Script::Answer`]), and
/// counts the connections and requests it saw.
struct ScriptedUpstream {
    addr: SocketAddr,
    scripts: Arc<Mutex<VecDeque<Script>>>,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl ScriptedUpstream {
    async fn start(scripts: &[Script]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = Self {
            addr: listener.local_addr().unwrap(),
            scripts: Arc::new(Mutex::new(scripts.iter().copied().collect())),
            connections: Arc::new(AtomicUsize::new(0)),
            requests: Arc::new(AtomicUsize::new(0)),
        };
        let (scripts, connections, requests) =
            (upstream.scripts.clone(), upstream.connections.clone(), upstream.requests.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, scripts.clone(), requests.clone()));
            }
        });
        upstream
    }

    fn proxy(&self) -> ProxyProcess {
        ProxyProcess::start_with(
            &format!("[upstream]\nopenai = \"http://{0}\"\nanthropic = \"http://{0}\"\n", self.addr),
            &[],
        )
    }

    fn then(&self, scripts: &[Script]) {
        self.scripts.lock().unwrap().extend(scripts);
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn serve(mut stream: TcpStream, scripts: Arc<Mutex<VecDeque<Script>>>, requests: Arc<AtomicUsize>) {
    while read_request(&mut stream).await {
        requests.fetch_add(1, Ordering::SeqCst);
        let script = scripts.lock().unwrap().pop_front().unwrap_or(Script::Answer);
        let json = |body: &str, length: usize| {
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n{body}")
        };
        match script {
            Script::Answer => {
                let _ = stream.write_all(json(ANSWER, ANSWER.len()).as_bytes()).await;
            }
            Script::AnswerThenClose => {
                let _ = stream.write_all(json(ANSWER, ANSWER.len()).as_bytes()).await;
                return;
            }
            Script::CutMidBody => {
                let _ = stream.write_all(json(&ANSWER[..20], ANSWER.len()).as_bytes()).await;
                return;
            }
            Script::CloseUnanswered => return,
            Script::ChunkedWithStaleLength => {
                let (first, second) = ANSWER.split_at(25);
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\ntransfer-encoding: chunked\r\n\r\n";
                let chunks = format!("{:x}\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\r\n", first.len(), second.len());
                let _ = stream.write_all(format!("{head}{chunks}").as_bytes()).await;
            }
            Script::HoldStream => {
                let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n";
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let _ = stream.write_all(format!("{head}{:x}\r\n{event}\r\n", event.len()).as_bytes()).await;
                tokio::time::sleep(Duration::from_secs(60)).await;
                return;
            }
        }
    }
}

/// Reads one request (head and `content-length` body); false when the connection ended first.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |value| value.trim().parse().unwrap());
    while buffer.len() < head_end + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

async fn chat(proxy: &ProxyProcess, stream: bool) -> Answer {
    send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(stream))).await
}

#[tokio::test]
async fn a_kept_alive_connection_carries_the_next_requests() {
    let upstream = ScriptedUpstream::start(&[]).await;
    let proxy = upstream.proxy();
    for round in 0..3 {
        let answer = chat(&proxy, false).await;
        assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        assert_eq!(answer.text(), ANSWER);
    }
    assert_eq!(upstream.requests(), 3);
    assert_eq!(upstream.connections(), 1, "every request after the first reuses the connection");
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_replaced_not_an_error() {
    let upstream = ScriptedUpstream::start(&[Script::AnswerThenClose; 4]).await;
    let proxy = upstream.proxy();
    for round in 0..4 {
        if round == 3 {
            // Once right after the close, and once when the close has long been seen.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let answer = chat(&proxy, false).await;
        assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        assert_eq!(answer.text(), ANSWER);
    }
    assert_eq!(upstream.requests(), 4, "no request went twice");
    assert_eq!(upstream.connections(), 4);
}

#[tokio::test]
async fn a_connection_closed_mid_response_is_an_error_for_the_client_and_never_a_resend() {
    let upstream = ScriptedUpstream::start(&[Script::Answer, Script::CutMidBody]).await;
    let proxy = upstream.proxy();
    assert_eq!(chat(&proxy, false).await.status, 200);

    // The head came: the client gets it, then a body that breaks instead of ending.
    let response =
        client().request(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect()).await;
    assert!(body.expect("the body ends instead of hanging").is_err(), "a cut body must not look complete");
    assert_eq!(upstream.requests(), 2);

    // The request went out on a kept-alive connection and nothing came back: never sent again.
    assert_eq!(chat(&proxy, false).await.status, 200);
    upstream.then(&[Script::CloseUnanswered]);
    let answer = tokio::time::timeout(Duration::from_secs(10), chat(&proxy, false)).await.expect("no hang");
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert_eq!(answer.json()["error"]["code"], "upstream_unreachable");
    assert_eq!(upstream.requests(), 4, "a request that was written is not sent again");
    assert_eq!(chat(&proxy, false).await.status, 200, "the next request finds a working connection");
}

#[tokio::test]
async fn a_response_still_being_read_keeps_its_connection_from_the_next_request() {
    let upstream = ScriptedUpstream::start(&[Script::HoldStream]).await;
    let proxy = upstream.proxy();
    let held =
        client().request(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(true))).await.unwrap();
    assert_eq!(held.status(), 200);
    let mut held = held.into_body();
    assert!(next_chunk(&mut held, Duration::from_secs(5)).await.is_some());

    let answer = tokio::time::timeout(Duration::from_secs(5), chat(&proxy, false)).await.expect("not queued");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(upstream.connections(), 2, "the held stream's connection is not shared");

    // A stream the client dropped unread closes its connection; the next request has another.
    drop(held);
    let answer = tokio::time::timeout(Duration::from_secs(5), chat(&proxy, false)).await.expect("not queued");
    assert_eq!(answer.status, 200);
    assert_eq!(upstream.requests(), 3);
}

#[tokio::test]
async fn a_chunked_answer_with_a_stale_length_reaches_the_client_whole_and_is_logged_as_sent() {
    let upstream = ScriptedUpstream::start(&[Script::ChunkedWithStaleLength]).await;
    let proxy = upstream.proxy();
    let answer = chat(&proxy, false).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.text(), ANSWER, "the whole chunked body, not the stale length's 10 bytes");
    assert_ne!(answer.header("content-length"), Some("10"));
    let line = proxy.wait_for_log("route=chat_completions").await;
    assert!(line.contains("outcome=complete"), "{line}");
    assert!(line.contains(&format!("bytes_out={}", ANSWER.len())), "{line}");
    // The connection is still good for the next request.
    assert_eq!(chat(&proxy, false).await.text(), ANSWER);
}
