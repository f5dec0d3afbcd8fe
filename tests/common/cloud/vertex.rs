//! A fake Vertex AI for Claude (`rawPredict`, `streamRawPredict`, `count-tokens:rawPredict` under
//! `/v1/projects/{p}/locations/{l}/publishers/anthropic/models/`) with its own fake Google token
//! endpoint at `/token`: a request needs a bearer token that endpoint issued (or one the test
//! accepted), its body Vertex's `anthropic_version`; it then goes to the provider simulator as a
//! Messages request and the answer comes back as it came, which is what Vertex does for Claude.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::Method;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::super::provider::serve;
use super::google::{check_grant, public_key};
use super::{
    BoxError, FrontRequest, Log, Reply, SimClient, Verdict, json_reply, percent_decode, post_to_sim, received,
    record_of, sim_client,
};

/// The only `anthropic_version` Vertex accepts in a Claude request body.
const VERTEX_VERSION: &str = "vertex-2023-10-16";

struct State {
    sim_url: String,
    token_uri: String,
    public_key: Vec<u8>,
    client: SimClient,
    log: Log,
    issued: Mutex<Vec<String>>,
    accepted: Mutex<HashSet<String>>,
}

/// A running fake Vertex AI and Google token endpoint.
#[derive(Clone)]
pub struct VertexFront {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl VertexFront {
    pub async fn start(sim_url: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the Vertex front");
        let addr = listener.local_addr().expect("the Vertex front's address");
        let state = Arc::new(State {
            sim_url: sim_url.trim_end_matches('/').to_string(),
            token_uri: format!("http://{addr}/token"),
            public_key: public_key(),
            client: sim_client(),
            log: Log::default(),
            issued: Mutex::new(Vec::new()),
            accepted: Mutex::new(HashSet::new()),
        });
        let served = state.clone();
        serve(listener, move |request| handle(served.clone(), request));
        Self { addr, state }
    }

    /// The base the `/v1/projects/…` paths go under (the Anthropic Vertex SDKs' base URL is this
    /// plus `/v1`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The fake Google token endpoint, for a service-account file's `token_uri`.
    pub fn token_uri(&self) -> String {
        self.state.token_uri.clone()
    }

    pub fn requests(&self) -> Vec<FrontRequest> {
        self.state.log.all()
    }

    /// Requests refused for their credentials (a bad bearer token or a bad JWT grant).
    pub fn refused(&self) -> usize {
        self.state.log.refused()
    }

    /// The access tokens the token endpoint gave out, in order.
    pub fn issued_tokens(&self) -> Vec<String> {
        self.state.issued.lock().unwrap().clone()
    }

    /// Lets `token` through as if the token endpoint had issued it.
    pub fn accept_token(&self, token: &str) {
        self.state.accepted.lock().unwrap().insert(token.to_string());
    }
}

/// What a `…/models/{model}:{method}` path asks for.
enum Operation {
    /// `rawPredict` or `streamRawPredict` of a model (decoded), and whether it is the streaming one.
    Predict {
        model: String,
        streaming: bool,
    },
    CountTokens,
}

fn operation(path: &str) -> Option<Operation> {
    let segments: Vec<&str> = path.split('/').collect();
    let ["", "v1", "projects", _, "locations", _, "publishers", "anthropic", "models", last] = segments[..] else {
        return None;
    };
    let (model, method) = last.rsplit_once(':')?;
    let model = percent_decode(model, false)?;
    match (model.as_str(), method) {
        ("count-tokens", "rawPredict") => Some(Operation::CountTokens),
        (_, "rawPredict") => Some(Operation::Predict { model, streaming: false }),
        (_, "streamRawPredict") => Some(Operation::Predict { model, streaming: true }),
        _ => None,
    }
}

fn google_error(code: u16, status: &str, message: &str) -> Reply {
    json_reply(code, &[], &json!({"error": {"code": code, "message": message, "status": status}}))
}

/// A 400 in Anthropic's shape, which is how Vertex reports what Claude's API refuses.
fn invalid_request(message: &str) -> Reply {
    json_reply(400, &[], &json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}))
}

async fn handle(state: Arc<State>, request: http::Request<Incoming>) -> Reply {
    let (parts, body) = received(request).await;
    if parts.method == Method::POST && parts.uri.path() == "/token" {
        return match check_grant(&body, &state.token_uri, &state.public_key) {
            Ok(()) => {
                let token = {
                    let mut issued = state.issued.lock().unwrap();
                    let token = format!("ya29.fake-{}", issued.len() + 1);
                    issued.push(token.clone());
                    token
                };
                state.log.push(record_of(&parts, &body, Verdict::Verified));
                json_reply(200, &[], &json!({"access_token": token, "expires_in": 3600, "token_type": "Bearer"}))
            }
            Err(why) => {
                state.log.push(record_of(&parts, &body, Verdict::Refused(why)));
                json_reply(400, &[], &json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}))
            }
        };
    }
    let bearer = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let known = bearer.is_some_and(|t| {
        state.issued.lock().unwrap().iter().any(|i| i == t) || state.accepted.lock().unwrap().contains(t)
    });
    if !known {
        let why = match bearer {
            Some(token) => format!("bearer token {token:?} was never issued"),
            None => "no bearer token".to_string(),
        };
        state.log.push(record_of(&parts, &body, Verdict::Refused(why)));
        return google_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.");
    }
    state.log.push(record_of(&parts, &body, Verdict::Verified));
    let Some(operation) = operation(parts.uri.path()).filter(|_| parts.method == Method::POST) else {
        return google_error(404, "NOT_FOUND", &format!("{} is not served by the fake", parts.uri.path()));
    };
    let Ok(Value::Object(mut forwarded)) = serde_json::from_slice::<Value>(&body) else {
        return invalid_request("The request body is not a JSON object.");
    };
    let version = forwarded.shift_remove("anthropic_version");
    let path = match operation {
        Operation::CountTokens => "/v1/messages/count_tokens",
        Operation::Predict { model, streaming } => {
            match version.as_ref().and_then(Value::as_str) {
                Some(VERTEX_VERSION) => {}
                Some(other) => {
                    return invalid_request(&format!(
                        "anthropic_version: Input should be '{VERTEX_VERSION}', not '{other}'"
                    ));
                }
                None => return invalid_request("anthropic_version: Field required"),
            }
            forwarded.insert("model".into(), json!(model));
            if streaming && !forwarded.contains_key("stream") {
                forwarded.insert("stream".into(), json!(true));
            }
            "/v1/messages"
        }
    };
    let mut headers = vec![("anthropic-version", "2023-06-01")];
    for name in ["anthropic-beta", "x-claude-code-session-id"] {
        if let Some(value) = parts.headers.get(name).and_then(|v| v.to_str().ok()) {
            headers.push((name, value));
        }
    }
    let url = format!("{}{path}", state.sim_url);
    match post_to_sim(&state.client, &url, &headers, &Value::Object(forwarded)).await {
        Ok(answer) => {
            // As it came, streamed: status, content type and body.
            let (sim_parts, body) = answer.into_parts();
            let mut response = Reply::new(body.map_err(|e| -> BoxError { e.into() }).boxed());
            *response.status_mut() = sim_parts.status;
            for name in ["content-type", "cache-control", "request-id"] {
                if let Some(value) = sim_parts.headers.get(name) {
                    response.headers_mut().insert(name, value.clone());
                }
            }
            response
        }
        Err(error) => google_error(503, "UNAVAILABLE", &format!("the simulator did not answer: {error}")),
    }
}
