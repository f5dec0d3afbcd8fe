//! The client side of the tests: requests, whole answers, streamed chunks.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A request with headers and a body, ready to send.
pub fn request(method: &str, url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(body.into())).unwrap()
}

/// The response with its whole body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub async fn send(request: Request<Full<Bytes>>) -> Answer {
    let response = tokio::time::timeout(Duration::from_secs(30), client().request(request))
        .await
        .expect("answer within 30 s")
        .expect("response");
    collect(response).await
}

pub async fn collect(response: Response<Incoming>) -> Answer {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("whole body").to_bytes();
    Answer { status: parts.status, headers: parts.headers, body }
}

/// Reads the next data frame of a streamed body, within `within`.
pub async fn next_chunk(body: &mut Incoming, within: Duration) -> Option<Bytes> {
    loop {
        let frame = tokio::time::timeout(within, body.frame()).await.expect("a chunk in time")?;
        if let Ok(data) = frame.expect("frame").into_data() {
            return Some(data);
        }
    }
}

/// Asks `check` every 50 ms until it holds (true) or 15 s have passed (false).
pub async fn eventually(check: impl AsyncFnMut() -> bool) -> bool {
    eventually_within(Duration::from_secs(15), check).await
}

/// [`eventually`] with a deadline of `within`.
pub async fn eventually_within(within: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
