//! An in-process fake upstream on 127.0.0.1:0 speaking OpenAI chat completions, Anthropic
//! messages, models and embeddings; it records what it receives and can be told to misbehave.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};

/// One request as the fake upstream saw it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: http::Method,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("upstream received JSON")
    }
}

/// What the fake answers with.
pub enum Reply {
    /// A complete response.
    Full { status: StatusCode, headers: Vec<(&'static str, String)>, body: Bytes },
    /// An SSE stream of these events, sent with the fake's pacing.
    Stream { events: Vec<String> },
    /// This reply after a pause, as a slow upstream answers (other requests are served meanwhile).
    Later { delay: Duration, reply: Box<Reply> },
    /// Exactly these chunks (no pacing), then `ending`: what a broken upstream sends. A
    /// `content-length` among the headers is sent as given, true or not.
    Chunks { status: StatusCode, headers: Vec<(&'static str, String)>, chunks: Vec<Bytes>, ending: Ending },
}

/// How a [`Reply::Chunks`] body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// A proper end.
    End,
    /// Silence, with the connection kept open, until the receiver goes away.
    Stall,
    /// The connection is broken off (an aborted chunked body, a body shorter than its length).
    Cut,
}

impl Reply {
    pub fn json(status: u16, body: serde_json::Value) -> Self {
        Self::body(status, body.to_string())
    }

    /// A complete JSON answer with exactly these bytes.
    pub fn body(status: u16, body: impl Into<Bytes>) -> Self {
        Reply::Full {
            status: StatusCode::from_u16(status).expect("status"),
            headers: vec![("content-type", "application/json".into())],
            body: body.into(),
        }
    }

    /// The same answer, sent after `delay`.
    pub fn after(self, delay: Duration) -> Self {
        if delay.is_zero() { self } else { Reply::Later { delay, reply: Box::new(self) } }
    }

    /// The same answer with one more header (a stream keeps its own).
    pub fn with_header(mut self, name: &'static str, value: &str) -> Self {
        if let Reply::Full { headers, .. } | Reply::Chunks { headers, .. } = &mut self {
            headers.push((name, value.to_string()));
        }
        self
    }

    /// `chunks` of a JSON body with this status, then `ending`.
    pub fn chunks(status: u16, chunks: Vec<Bytes>, ending: Ending) -> Self {
        Reply::Chunks {
            status: StatusCode::from_u16(status).expect("status"),
            headers: vec![("content-type", "application/json".into())],
            chunks,
            ending,
        }
    }

    /// A 200 SSE stream of `chunks`, then `ending`.
    pub fn event_chunks(chunks: &[&str], ending: Ending) -> Self {
        Reply::Chunks {
            status: StatusCode::OK,
            headers: vec![("content-type", "text/event-stream".into())],
            chunks: chunks.iter().map(|c| Bytes::from(c.to_string())).collect(),
            ending,
        }
    }
}

/// How the fake paces or breaks its answers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pacing {
    /// Everything at once.
    Normal,
    /// Never answer.
    Hang,
    /// Wait this long between stream events.
    Delay(Duration),
    /// Send the first event, then wait for [`FakeUpstream::release`] before each next one.
    Gated,
    /// Send one event every interval forever, until the receiver goes away.
    Endless(Duration),
    /// Send the first event, then go silent forever (keeping the connection open).
    StallAfterFirst,
}

type Responder = Arc<dyn Fn(&Received) -> Option<Reply> + Send + Sync>;

struct State {
    received: Mutex<Vec<Received>>,
    pacing: Mutex<Pacing>,
    responder: Mutex<Option<Responder>>,
    gate: Semaphore,
    streams_cancelled: AtomicUsize,
    streams_completed: AtomicUsize,
}

#[derive(Clone)]
pub struct FakeUpstream {
    pub addr: SocketAddr,
    state: Arc<State>,
}

/// A fake upstream set up before it starts: `FakeUpstream::builder().pacing(..).strict_pairing().start()`.
#[derive(Default)]
pub struct FakeBuilder {
    pacing: Option<Pacing>,
    responder: Option<Responder>,
}

impl FakeBuilder {
    pub fn pacing(mut self, pacing: Pacing) -> Self {
        self.pacing = Some(pacing);
        self
    }

    /// Overrides the built-in answers; returning `None` falls back to them.
    pub fn respond_with(mut self, responder: impl Fn(&Received) -> Option<Reply> + Send + Sync + 'static) -> Self {
        self.responder = Some(Arc::new(responder));
        self
    }

    /// Rejects requests with broken tool pairing exactly as OpenAI and Anthropic do.
    pub fn strict_pairing(self) -> Self {
        self.respond_with(strict_reply)
    }

    pub async fn start(self) -> FakeUpstream {
        let fake = FakeUpstream::start().await;
        if let Some(pacing) = self.pacing {
            fake.set_pacing(pacing);
        }
        *fake.state.responder.lock().unwrap() = self.responder;
        fake
    }
}

/// The strict providers' answer to a request whose tool calls and results do not pair up.
fn strict_reply(received: &Received) -> Option<Reply> {
    let body: serde_json::Value = serde_json::from_slice(&received.body).ok()?;
    let path = received.path_and_query.split('?').next().unwrap_or("");
    let error = if path.ends_with("/v1/responses") {
        super::strict::responses_pairing_error(&body)
    } else {
        super::strict::pairing_error(path, &body)
    };
    error.map(|error| Reply::json(400, error))
}

impl FakeUpstream {
    pub fn builder() -> FakeBuilder {
        FakeBuilder::default()
    }

    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fake upstream");
        let addr = listener.local_addr().expect("fake addr");
        let state = Arc::new(State {
            received: Mutex::new(Vec::new()),
            pacing: Mutex::new(Pacing::Normal),
            responder: Mutex::new(None),
            gate: Semaphore::new(0),
            streams_cancelled: AtomicUsize::new(0),
            streams_completed: AtomicUsize::new(0),
        });
        let accept_state = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = accept_state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(state, req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// POSTs `body` straight to the fake, without compactor: what the upstream itself answers.
    pub async fn direct(&self, path: &str, body: impl Into<Bytes>) -> super::client::Answer {
        super::client::send(super::client::request("POST", &format!("{}{path}", self.url()), &[], body)).await
    }

    pub fn set_pacing(&self, pacing: Pacing) {
        *self.state.pacing.lock().unwrap() = pacing;
    }

    /// Overrides the built-in answers; returning `None` falls back to them.
    pub fn respond_with(&self, responder: impl Fn(&Received) -> Option<Reply> + Send + Sync + 'static) {
        *self.state.responder.lock().unwrap() = Some(Arc::new(responder));
    }

    /// Lets a gated stream send its next event.
    pub fn release(&self) {
        self.state.gate.add_permits(1);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn last(&self) -> Received {
        self.received().pop().expect("the fake upstream received a request")
    }

    pub fn streams_cancelled(&self) -> usize {
        self.state.streams_cancelled.load(Ordering::SeqCst)
    }

    pub fn streams_completed(&self) -> usize {
        self.state.streams_completed.load(Ordering::SeqCst)
    }
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<ChannelBody> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let received = Received {
        method: parts.method,
        path_and_query: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default(),
        headers: parts.headers,
        body,
    };
    state.received.lock().unwrap().push(received.clone());
    let pacing = *state.pacing.lock().unwrap();
    if pacing == Pacing::Hang {
        std::future::pending::<()>().await;
    }
    let responder = state.responder.lock().unwrap().clone();
    let mut reply = responder.and_then(|r| r(&received)).unwrap_or_else(|| default_reply(&received));
    while let Reply::Later { delay, reply: later } = reply {
        tokio::time::sleep(delay).await;
        reply = *later;
    }
    match reply {
        Reply::Full { status, headers, body } => {
            let mut response = Response::new(ChannelBody::full(body));
            *response.status_mut() = status;
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().expect("header"));
            }
            response.headers_mut().insert("x-upstream-custom", "yes".parse().expect("header"));
            response
        }
        Reply::Chunks { status, headers, chunks, ending } => {
            let (tx, rx) = mpsc::channel::<Result<Bytes, FakeCut>>(1);
            tokio::spawn(async move {
                for chunk in chunks {
                    if tx.send(Ok(chunk)).await.is_err() {
                        return;
                    }
                }
                match ending {
                    Ending::End => {}
                    Ending::Stall => tx.closed().await,
                    Ending::Cut => {
                        let _ = tx.send(Err(FakeCut)).await;
                    }
                }
            });
            let mut response = Response::new(ChannelBody::Channel(rx));
            *response.status_mut() = status;
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().expect("header"));
            }
            response
        }
        Reply::Stream { events } => {
            let (tx, rx) = mpsc::channel::<Result<Bytes, FakeCut>>(1);
            tokio::spawn(send_events(state.clone(), pacing, events, tx));
            let mut response = Response::new(ChannelBody::Channel(rx));
            response.headers_mut().insert("content-type", "text/event-stream".parse().expect("header"));
            response.headers_mut().insert("cache-control", "no-cache".parse().expect("header"));
            response.headers_mut().insert("x-upstream-custom", "yes".parse().expect("header"));
            response
        }
        Reply::Later { .. } => unreachable!("a delayed reply was waited for above"),
    }
}

async fn send_events(state: Arc<State>, pacing: Pacing, events: Vec<String>, tx: mpsc::Sender<Result<Bytes, FakeCut>>) {
    let cancelled = || state.streams_cancelled.fetch_add(1, Ordering::SeqCst);
    for (index, event) in events.iter().enumerate() {
        if index > 0 {
            match pacing {
                Pacing::Delay(d) => tokio::time::sleep(d).await,
                Pacing::Gated => state.gate.acquire().await.expect("gate").forget(),
                Pacing::StallAfterFirst => {
                    tx.closed().await;
                    cancelled();
                    return;
                }
                _ => {}
            }
        }
        if tx.send(Ok(Bytes::from(event.clone()))).await.is_err() {
            cancelled();
            return;
        }
    }
    if let Pacing::Endless(every) = pacing {
        loop {
            tokio::time::sleep(every).await;
            if tx.send(Ok(Bytes::from_static(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"))).await.is_err() {
                cancelled();
                return;
            }
        }
    }
    state.streams_completed.fetch_add(1, Ordering::SeqCst);
}

const CHAT_COMPLETION: &[u8] = br#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}"#;
const ANTHROPIC_MESSAGE: &[u8] = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}"#;
const RESPONSE: &[u8] = br#"{"id":"resp_1","object":"response","created_at":1700000000,"status":"completed","model":"gpt-5-codex","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":13}}"#;
const MODELS: &[u8] =
    br#"{"object":"list","data":[{"id":"gpt-4o","object":"model","created":1715367049,"owned_by":"system"}]}"#;
const EMBEDDINGS: &[u8] = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0023064255,-0.009327292,0.12345678901234567890]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":5,"total_tokens":5}}"#;

/// The built-in answers, shaped like the real providers'.
fn default_reply(received: &Received) -> Reply {
    let path = received.path_and_query.split('?').next().unwrap_or("");
    let body: serde_json::Value = serde_json::from_slice(&received.body).unwrap_or(serde_json::Value::Null);
    let stream = body.get("stream").and_then(|s| s.as_bool()).unwrap_or(false);
    // "Hello" streamed in two deltas, or whole.
    let answer = |events: fn(&[&str]) -> Vec<String>, whole: &'static [u8]| match stream {
        true => Reply::Stream { events: events(&["Hel", "lo"]) },
        false => Reply::body(200, whole),
    };
    if path.ends_with("/chat/completions") {
        answer(openai_stream, CHAT_COMPLETION).with_header("openai-processing-ms", "12")
    } else if path.ends_with("/v1/messages") {
        answer(anthropic_stream, ANTHROPIC_MESSAGE).with_header("request-id", "req_1")
    } else if path.ends_with("/v1/messages/count_tokens") {
        Reply::json(200, serde_json::json!({"input_tokens": received.body.len() / 4}))
    } else if path.ends_with("/v1/responses/input_tokens") {
        Reply::json(
            200,
            serde_json::json!({"object": "response.input_tokens", "input_tokens": received.body.len() / 4}),
        )
    } else if path.ends_with("/v1/responses") || path == "/openai/responses" {
        answer(responses_stream, RESPONSE)
    } else if path.ends_with("/v1/models") {
        Reply::body(200, MODELS)
    } else if path.ends_with("/embeddings") {
        Reply::body(200, EMBEDDINGS)
    } else {
        Reply::body(404, format!(r#"{{"error":"no route for {path}"}}"#)).with_header("x-fake-route", "none")
    }
}

/// An OpenAI chat completions stream with these content deltas, a usage chunk and `[DONE]`.
pub fn openai_stream(deltas: &[&str]) -> Vec<String> {
    let mut events = Vec::new();
    for delta in deltas {
        events.push(format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}},\"finish_reason\":null}}]}}\n\n",
            serde_json::Value::from(*delta)
        ));
    }
    events.push("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"total_tokens\":14}}\n\n".into());
    events.push("data: [DONE]\n\n".into());
    events
}

/// An OpenAI Responses stream with these text deltas, ending in `response.completed` with usage.
pub fn responses_stream(deltas: &[&str]) -> Vec<String> {
    let event = |name: &str, data: serde_json::Value| format!("event: {name}\ndata: {data}\n\n");
    let response = serde_json::json!({"id": "resp_1", "object": "response", "created_at": 1700000000, "status": "in_progress", "model": "gpt-5-codex", "output": []});
    let mut events = vec![
        event(
            "response.created",
            serde_json::json!({"type": "response.created", "sequence_number": 0, "response": response}),
        ),
        event(
            "response.in_progress",
            serde_json::json!({"type": "response.in_progress", "sequence_number": 1, "response": response}),
        ),
        event(
            "response.output_item.added",
            serde_json::json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []}}),
        ),
        event(
            "response.content_part.added",
            serde_json::json!({"type": "response.content_part.added", "sequence_number": 3, "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
        ),
    ];
    let text: String = deltas.concat();
    for (i, delta) in deltas.iter().enumerate() {
        events.push(event("response.output_text.delta", serde_json::json!({"type": "response.output_text.delta", "sequence_number": 4 + i, "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": delta})));
    }
    events.push(event("response.completed", serde_json::json!({"type": "response.completed", "sequence_number": 4 + deltas.len(), "response": {"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5-codex", "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}], "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14}}})));
    events
}

/// An Anthropic messages stream with these text deltas.
pub fn anthropic_stream(deltas: &[&str]) -> Vec<String> {
    let mut events = vec![
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n".to_string(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".to_string(),
    ];
    for delta in deltas {
        events.push(format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}\n\n",
            serde_json::Value::from(*delta)
        ));
    }
    events.push("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n".into());
    events.push("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n".into());
    events.push("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".into());
    events
}

/// A body that is either complete or fed by a channel, so a dropped receiver is observable; an
/// error from the channel breaks the connection off.
pub enum ChannelBody {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Result<Bytes, FakeCut>>),
}

/// The fake breaking a body off on purpose.
#[derive(Debug)]
pub struct FakeCut;

impl std::fmt::Display for FakeCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the fake upstream broke the body off")
    }
}

impl std::error::Error for FakeCut {}

impl ChannelBody {
    fn full(bytes: Bytes) -> Self {
        ChannelBody::Full(Some(bytes))
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = FakeCut;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, FakeCut>>> {
        match self.get_mut() {
            ChannelBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ChannelBody::Channel(rx) => rx.poll_recv(cx).map(|b| b.map(|b| b.map(Frame::data))),
        }
    }

    // A complete reply declares its length, as providers' JSON replies do (Content-Length).
    fn is_end_stream(&self) -> bool {
        matches!(self, ChannelBody::Full(None))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            ChannelBody::Full(bytes) => http_body::SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            ChannelBody::Channel(_) => http_body::SizeHint::default(),
        }
    }
}
