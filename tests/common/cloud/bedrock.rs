//! A fake Amazon Bedrock runtime: `InvokeModel` and `InvokeModelWithResponseStream` for Claude,
//! every request's SigV4 signature verified before anything else, the body checked the way
//! Bedrock checks it, then forwarded as an Anthropic Messages request to the provider simulator
//! and its answer turned back into Bedrock's (event-stream frames, `x-amzn-ErrorType` errors).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::StatusCode;
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::super::provider::serve;
use super::event_stream::relay;
use super::sigv4::{Refusal, verify_sigv4};
use super::{
    FrontRequest, Log, Reply, SimClient, Verdict, anthropic_error_message, json_reply, percent_decode, post_to_sim,
    received, record_of, reply, sim_client, whole,
};

/// The only `anthropic_version` Bedrock accepts in a Claude request body.
const BEDROCK_VERSION: &str = "bedrock-2023-05-31";
/// What Bedrock sends for the errors a request's input causes.
const VALIDATION: &str = "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/";

/// How the fake words a context overflow (Bedrock has said it both ways).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BedrockOverflow {
    /// "The model returned the following errors: prompt is too long: N tokens > M maximum": the
    /// model's own message, window included, behind Bedrock's preface.
    NamesWindow,
    /// "Input is too long for requested model.": no numbers.
    Silent,
}

struct State {
    sim_url: String,
    overflow: BedrockOverflow,
    client: SimClient,
    log: Log,
    serial: AtomicUsize,
}

/// A running fake Bedrock runtime.
#[derive(Clone)]
pub struct BedrockFront {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl BedrockFront {
    pub async fn start(sim_url: String, overflow: BedrockOverflow) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the Bedrock front");
        let addr = listener.local_addr().expect("the Bedrock front's address");
        let state = Arc::new(State {
            sim_url: sim_url.trim_end_matches('/').to_string(),
            overflow,
            client: sim_client(),
            log: Log::default(),
            serial: AtomicUsize::new(0),
        });
        let served = state.clone();
        serve(listener, move |request| handle(served.clone(), request));
        Self { addr, state }
    }

    /// The endpoint, as `ANTHROPIC_BEDROCK_BASE_URL` or an AWS SDK's endpoint URL takes it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<FrontRequest> {
        self.state.log.all()
    }

    /// Requests refused for their signature.
    pub fn refused(&self) -> usize {
        self.state.log.refused()
    }
}

/// Which operation a path asks for: the decoded model id, and whether it streams.
fn operation(path: &str) -> Option<(String, bool)> {
    let rest = path.strip_prefix("/model/")?;
    let (raw, streaming) = match rest.strip_suffix("/invoke-with-response-stream") {
        Some(raw) => (raw, true),
        None => (rest.strip_suffix("/invoke")?, false),
    };
    Some((percent_decode(raw, false)?, streaming))
}

/// Bedrock's body checks for Claude; `Err` is the message of its 400 ValidationException.
fn validate(body: &[u8]) -> Result<serde_json::Map<String, Value>, String> {
    let malformed = |what: &str| format!("Malformed input request: {what}, please reformat your input and try again.");
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) else {
        return Err(malformed("expected type: JSONObject"));
    };
    for key in ["model", "stream"] {
        if map.contains_key(key) {
            return Err(malformed(&format!("#: extraneous key [{key}] is not permitted")));
        }
    }
    match map.get("anthropic_version").and_then(Value::as_str) {
        Some(BEDROCK_VERSION) => Ok(map),
        Some(other) => Err(malformed(&format!("#/anthropic_version: {other} is not a valid enum value"))),
        None => Err(malformed("#: required key [anthropic_version] not found")),
    }
}

async fn handle(state: Arc<State>, request: http::Request<Incoming>) -> Reply {
    let (parts, body) = received(request).await;
    let request_id = format!("{:08x}-0000-4000-8000-00000000b3d0", state.serial.fetch_add(1, Ordering::SeqCst) + 1);
    let id = [("x-amzn-requestid", request_id.as_str())];
    if let Err(refusal) = verify_sigv4(&parts.method, &parts.uri, &parts.headers, &body) {
        state.log.push(record_of(&parts, &body, Verdict::Refused(refusal.reason())));
        let (kind, message) = match refusal {
            Refusal::Missing => ("MissingAuthenticationTokenException", "Missing Authentication Token"),
            Refusal::Invalid(_) => (
                "InvalidSignatureException",
                "The request signature we calculated does not match the signature you provided.",
            ),
        };
        return json_reply(403, &[id[0], ("x-amzn-errortype", kind)], &json!({"message": message}));
    }
    state.log.push(record_of(&parts, &body, Verdict::Verified));
    let Some((model, streaming)) = operation(parts.uri.path()).filter(|_| parts.method == http::Method::POST) else {
        return json_reply(404, &id, &json!({"message": "not served by the fake"}));
    };
    let mut forwarded = match validate(&body) {
        Ok(map) => map,
        Err(message) => {
            return json_reply(400, &[id[0], ("x-amzn-errortype", VALIDATION)], &json!({"message": message}));
        }
    };
    forwarded.shift_remove("anthropic_version");
    // Bedrock takes the betas in the body; the Messages API as a header.
    let betas = forwarded.shift_remove("anthropic_beta");
    let betas: Vec<&str> =
        betas.as_ref().and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let betas = betas.join(",");
    forwarded.insert("model".into(), json!(model));
    if streaming {
        forwarded.insert("stream".into(), json!(true));
    }
    let mut headers = vec![("anthropic-version", "2023-06-01")];
    if !betas.is_empty() {
        headers.push(("anthropic-beta", betas.as_str()));
    }
    let session = parts.headers.get("x-claude-code-session-id").and_then(|v| v.to_str().ok());
    if let Some(session) = session {
        headers.push(("x-claude-code-session-id", session));
    }
    let url = format!("{}/v1/messages", state.sim_url);
    let answer = match post_to_sim(&state.client, &url, &headers, &Value::Object(forwarded)).await {
        Ok(answer) => answer,
        Err(error) => {
            let headers = [id[0], ("x-amzn-errortype", "InternalServerException")];
            return json_reply(500, &headers, &json!({"message": format!("the simulator did not answer: {error}")}));
        }
    };
    let is_stream = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if answer.status() == StatusCode::OK && streaming && is_stream {
        let mut response = Reply::new(relay(answer.into_body()));
        let map = response.headers_mut();
        map.insert("content-type", "application/vnd.amazon.eventstream".parse().unwrap());
        map.insert("x-amzn-requestid", request_id.parse().unwrap());
        map.insert("x-amzn-bedrock-content-type", "application/json".parse().unwrap());
        return response;
    }
    let (status, _, body) = whole(answer).await;
    if status.is_success() {
        let usage = serde_json::from_slice::<Value>(&body).map(|v| v["usage"].clone()).unwrap_or(Value::Null);
        let count = |keys: &[&str]| keys.iter().filter_map(|k| usage[k].as_u64()).sum::<u64>().to_string();
        let input = count(&["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"]);
        let output = count(&["output_tokens"]);
        let headers = [
            id[0],
            ("x-amzn-bedrock-input-token-count", input.as_str()),
            ("x-amzn-bedrock-output-token-count", output.as_str()),
        ];
        return reply(status.as_u16(), "application/json", &headers, body);
    }
    error_reply(state.overflow, status, &body, &request_id)
}

/// The sim's error as Bedrock reports it.
fn error_reply(style: BedrockOverflow, status: StatusCode, body: &[u8], request_id: &str) -> Reply {
    let message = anthropic_error_message(body);
    let overflow =
        status == StatusCode::PAYLOAD_TOO_LARGE || message.contains("prompt is too long") || message.contains("exceed");
    if overflow {
        let message = match style {
            BedrockOverflow::NamesWindow => format!("The model returned the following errors: {message}"),
            BedrockOverflow::Silent => "Input is too long for requested model.".to_string(),
        };
        let headers = [("x-amzn-requestid", request_id), ("x-amzn-errortype", VALIDATION)];
        return json_reply(400, &headers, &json!({"message": message}));
    }
    let kind = match status.as_u16() {
        400 => "ValidationException",
        401 | 403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        429 => "ThrottlingException",
        503 | 529 => "ServiceUnavailableException",
        _ => "InternalServerException",
    };
    let headers = [("x-amzn-requestid", request_id), ("x-amzn-errortype", kind)];
    json_reply(status.as_u16(), &headers, &json!({"message": message}))
}
