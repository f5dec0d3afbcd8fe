//! Fakes of the two clouds Claude is sold through, each an HTTP server on 127.0.0.1:0 in front of
//! a [`ProviderSim`](super::provider::ProviderSim): Amazon Bedrock's runtime ([`BedrockFront`],
//! every request's SigV4 signature checked, answers streamed back in AWS event-stream framing)
//! and Vertex AI ([`VertexFront`], bearer tokens from its own fake Google OAuth endpoint that a
//! real service-account file obtains). They translate requests and answers the way the real
//! platforms do, so compactor can be tested against them without a cloud account.

use std::convert::Infallible;
use std::sync::Mutex;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

mod bedrock;
mod event_stream;
mod google;
mod sigv4;
mod vertex;

pub use bedrock::{BedrockFront, BedrockOverflow};
pub use event_stream::{chunk_events, decode_event_stream};
pub use google::{CLOUD_PLATFORM_SCOPE, SERVICE_ACCOUNT_EMAIL, SERVICE_ACCOUNT_PROJECT, service_account_file};
pub use sigv4::{
    AWS_ACCESS_KEY_ID, AWS_REGION, AWS_SECRET_ACCESS_KEY, Refusal, sign_bedrock, sign_bedrock_at, verify_sigv4,
};
pub use vertex::VertexFront;

/// One request as a front received it, and what it made of the caller's credentials.
#[derive(Clone, Debug)]
pub struct FrontRequest {
    pub method: Method,
    /// As received, with its query.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub verdict: Verdict,
}

/// Whether a front let a request through its authentication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Verified,
    /// Refused, and why (for the test's failure message: the caller only sees the cloud's error).
    Refused(String),
}

/// The requests a front received, in order.
#[derive(Default)]
struct Log(Mutex<Vec<FrontRequest>>);

impl Log {
    fn push(&self, request: FrontRequest) {
        self.0.lock().unwrap().push(request);
    }

    fn all(&self) -> Vec<FrontRequest> {
        self.0.lock().unwrap().clone()
    }

    fn refused(&self) -> usize {
        self.0.lock().unwrap().iter().filter(|r| r.verdict != Verdict::Verified).count()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Reply = Response<BoxBody<Bytes, BoxError>>;

/// A whole answer with a content type and extra headers.
fn reply(status: u16, content_type: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()).map_err(|e: Infallible| match e {}).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let map = response.headers_mut();
    map.insert("content-type", HeaderValue::from_str(content_type).unwrap());
    for (name, value) in headers {
        map.insert(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
    }
    response
}

fn json_reply(status: u16, headers: &[(&str, &str)], body: &Value) -> Reply {
    reply(status, "application/json", headers, body.to_string())
}

/// The loopback client a front forwards with.
type SimClient = Client<HttpConnector, Full<Bytes>>;

fn sim_client() -> SimClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A JSON POST to the simulator; `headers` are added to its content type.
async fn post_to_sim(
    client: &SimClient,
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Result<Response<Incoming>, BoxError> {
    let mut builder = http::Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(Full::new(Bytes::from(body.to_string())))?;
    Ok(client.request(request).await?)
}

/// What the client sent, before the front reads it.
async fn received(request: http::Request<Incoming>) -> (http::request::Parts, Bytes) {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    (parts, body)
}

fn record_of(parts: &http::request::Parts, body: &Bytes, verdict: Verdict) -> FrontRequest {
    FrontRequest {
        method: parts.method.clone(),
        path: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default(),
        headers: parts.headers.clone(),
        body: body.clone(),
        verdict,
    }
}

/// Percent-decodes `text` (and `+` as a space in form bodies); `None` when not UTF-8 after.
fn percent_decode(text: &str, plus_is_space: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() && bytes[i + 1].is_ascii_hexdigit() && bytes[i + 2].is_ascii_hexdigit() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The fields of a form-encoded body.
fn form_fields(body: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((percent_decode(name, true)?, percent_decode(value, true)?))
        })
        .collect()
}

/// The sim's answer with its whole body.
async fn whole(response: Response<Incoming>) -> (StatusCode, HeaderMap, Bytes) {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    (parts.status, parts.headers, body)
}

/// The message of an error in Anthropic's shape (`{"type":"error","error":{"message":..}}`).
fn anthropic_error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}
