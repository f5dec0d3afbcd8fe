//! A provider simulator on 127.0.0.1:0 speaking Chat Completions, Anthropic Messages, Responses
//! and Gemini's `generateContent` ([`gemini`]) (plain JSON and SSE) the way a real provider with a given context window and tokenizer would:
//! it counts tokens its own way (characters / N), rejects what does not fit with each provider's
//! real overflow error (naming the window or not), reports usage with prompt-cache reads and writes
//! by prefix, rejects broken tool pairs, answers compactor's summary calls deterministically by
//! echoing the fact markers it finds in the transcript it was sent (not in the prompt around it),
//! and records every request for assertions and benchmarks.
//!
//! With a [`Script`] it plays a model for real agent CLIs (see `script.rs`): tool calls to the
//! agent's own shell, streamed in each dialect, and answers to the agents' own summary requests.
//!
//! It also prices sessions the way providers bill them (see [`bill_by_prefix`] and
//! [`bill_by_breakpoints`]).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use compactor::rewrite::{CachePricing, cache_cost};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use xxhash_rust::xxh3::xxh3_64;

pub mod chains;
pub mod gemini;

use super::agents;
use super::script::{self, Kind, Move, Script};
use super::strict;
use super::window::{markers, transcript_of};

/// What marks compactor's summary calls: its summarizer system prompt ("You are a
/// context-compaction assistant…", `compaction::DEFAULT_SYSTEM_PROMPT`).
pub const SUMMARY_MARKER: &str = "context-compaction assistant";

/// Tokens every prompt costs besides its parts, and each message's framing.
const BASE_TOKENS: usize = 3;
const MESSAGE_TOKENS: usize = 4;
/// Shortest prefix a provider caches (Anthropic and OpenAI alike).
pub const MIN_CACHEABLE: usize = 1_024;
/// Anthropic looks for a cache hit at most this many blocks before each breakpoint.
pub const LOOKBACK_BLOCKS: usize = 20;

/// The three wire formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    Chat,
    Messages,
    Responses,
}

impl Dialect {
    pub const ALL: [Dialect; 3] = [Dialect::Chat, Dialect::Messages, Dialect::Responses];

    pub fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Messages => "/v1/messages",
            Dialect::Responses => "/v1/responses",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dialect::Chat => "chat",
            Dialect::Messages => "messages",
            Dialect::Responses => "responses",
        }
    }

    fn of_path(path: &str) -> Option<Self> {
        Dialect::ALL.into_iter().find(|d| path.ends_with(d.path()))
    }
}

/// The overflow errors providers really send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorStyle {
    /// OpenAI Chat, 400 `context_length_exceeded`: "This model's maximum context length is M
    /// tokens. However, your messages resulted in N tokens…" (or "you requested T tokens (N in
    /// the messages, K in the completion)" when max_tokens is what does not fit).
    OpenAi,
    /// Anthropic, 400: "prompt is too long: N tokens > M maximum" (or "input length and
    /// `max_tokens` exceed context limit: N + K > M…").
    Anthropic,
    /// Anthropic, 413: "Request size exceeds model context window" (anthropics/claude-code#6358);
    /// names nothing.
    Anthropic413,
    /// OpenAI Responses, `context_length_exceeded`: "Your input exceeds the context window of this
    /// model…", names nothing; a 200 stream ending in `response.failed` when streaming.
    Responses,
    /// llama.cpp server, 400 `exceed_context_size_error`: "request (N tokens) exceeds the
    /// available context size (M tokens)…" with `n_prompt_tokens` and `n_ctx`.
    LlamaCpp,
    /// Ollama, 400: "prompt too long; exceeded max context length by X tokens": only the excess.
    Ollama,
    /// vLLM, 400: "This model's maximum context length is M tokens. However, your request has N
    /// input tokens…" (or "You passed N input tokens and requested K output tokens…").
    Vllm,
}

impl ErrorStyle {
    /// Whether the error states the window.
    pub fn names_window(self) -> bool {
        !matches!(self, ErrorStyle::Anthropic413 | ErrorStyle::Responses | ErrorStyle::Ollama)
    }
}

/// Which overflow errors the provider sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Errors {
    /// Errors that name the window: OpenAI (chat), Anthropic (messages), vLLM (responses, which
    /// OpenAI itself never names).
    Named,
    /// Errors that name nothing: Ollama (chat), Anthropic's 413 (messages), OpenAI (responses).
    Unnamed,
    /// This style on every route.
    Style(ErrorStyle),
    /// What the dialect's own provider sends: OpenAI on chat (names the window), Anthropic on
    /// messages (names it), OpenAI Responses (names nothing; `response.failed` when streaming).
    Real,
}

impl Errors {
    pub fn style(self, dialect: Dialect) -> ErrorStyle {
        match (self, dialect) {
            (Errors::Style(style), _) => style,
            (Errors::Real, Dialect::Chat) => ErrorStyle::OpenAi,
            (Errors::Real, Dialect::Messages) => ErrorStyle::Anthropic,
            (Errors::Real, Dialect::Responses) => ErrorStyle::Responses,
            (Errors::Named, Dialect::Chat) => ErrorStyle::OpenAi,
            (Errors::Named, Dialect::Messages) => ErrorStyle::Anthropic,
            (Errors::Named, Dialect::Responses) => ErrorStyle::Vllm,
            (Errors::Unnamed, Dialect::Chat) => ErrorStyle::Ollama,
            (Errors::Unnamed, Dialect::Messages) => ErrorStyle::Anthropic413,
            (Errors::Unnamed, Dialect::Responses) => ErrorStyle::Responses,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Errors::Named => "named",
            Errors::Unnamed => "unnamed",
            Errors::Style(_) => "fixed",
            Errors::Real => "real",
        }
    }
}

/// How the simulated provider behaves.
#[derive(Clone, Debug)]
pub struct ProviderSpec {
    /// Context window in the provider's own tokens.
    pub window: usize,
    /// Its tokenizer: tokens = characters / this (of the prompt's text, tools as raw JSON).
    pub chars_per_token: f64,
    pub errors: Errors,
    /// Whether prompt + max_tokens must fit the window (Anthropic and OpenAI: yes; llama.cpp: no).
    pub count_max_tokens: bool,
    /// Output tokens of each answer to the agent.
    pub reply_tokens: usize,
    /// Size of each summary besides the echoed markers, in the provider's tokens.
    pub summary_tokens: usize,
    /// How long a summary call takes.
    pub summary_delay: Duration,
    /// Keep every request body in its record (benchmarks of long sessions turn this off).
    pub keep_bodies: bool,
    /// Play the scripted model for a real agent CLI instead of answering with prose.
    pub script: Option<Script>,
    /// Keep Responses chains as OpenAI does ([`chains`]): `previous_response_id`, the reads back,
    /// `truncation`, `context_management` and `/v1/responses/compact`.
    pub chains: bool,
    /// Answers a local server gives about itself, by path (`/props`, `/v1/models`, `/api/ps`,
    /// `/api/show`): the recorded answers of `tests/fixtures/local-servers/`. Any other such
    /// question is answered 404, as a server that has no such endpoint.
    pub stated: Vec<(&'static str, String)>,
    /// When set, only a request carrying this bearer key is told (others get 401), as a server
    /// started with an API key.
    pub stated_key: Option<&'static str>,
}

impl Default for ProviderSpec {
    /// A 128k window, counting like o200k on agent sessions, named errors, max_tokens not counted.
    fn default() -> Self {
        Self {
            window: 128_000,
            chars_per_token: agents::session_chars_per_token(),
            errors: Errors::Named,
            count_max_tokens: false,
            reply_tokens: 150,
            summary_tokens: 300,
            summary_delay: Duration::ZERO,
            keep_bodies: true,
            script: None,
            chains: false,
            stated: Vec::new(),
            stated_key: None,
        }
    }
}

impl ProviderSpec {
    /// A provider whose tokenizer counts `factor` times what o200k (compactor's estimate for an
    /// unknown model) counts on agent sessions.
    pub fn with_density(factor: f64) -> Self {
        Self { chars_per_token: agents::session_chars_per_token() / factor, ..Self::default() }
    }

    /// The density relative to o200k on agent sessions.
    pub fn density(&self) -> f64 {
        agents::session_chars_per_token() / self.chars_per_token
    }

    fn tokens(&self, chars: usize) -> usize {
        (chars as f64 / self.chars_per_token).ceil() as usize
    }
}

/// What the provider did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Answered,
    /// Rejected as over the window.
    Overflow,
    /// Rejected for broken tool pairing, bad JSON or an unknown route.
    Rejected,
}

impl Outcome {
    pub fn is_answered(self) -> bool {
        self == Outcome::Answered
    }
}

/// One part of a prompt at message granularity (all tool definitions, a system block, a message
/// or Responses item), hashed without `cache_control` markers: they move from turn to turn and
/// change nothing of the prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub hash: u64,
    pub tokens: usize,
}

/// One content block (a tool definition, a system block, a message's content part or tool call):
/// the granularity of Anthropic's cache breakpoints. `chain` hashes every block up to this one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub chain: u64,
    pub tokens: usize,
    pub breakpoint: bool,
}

/// A prompt as the provider counts it.
#[derive(Clone, Debug, Default)]
pub struct Prompt {
    pub units: Vec<Unit>,
    pub blocks: Vec<Block>,
    pub tokens: usize,
    pub max_tokens: usize,
    pub tool_less: bool,
}

impl Prompt {
    pub fn read(dialect: Dialect, body: &Value, spec: &ProviderSpec) -> Self {
        let mut reader = PromptReader { spec, prompt: Prompt::default(), chain: 0 };
        let tools = body.get("tools").and_then(Value::as_array).filter(|t| !t.is_empty());
        reader.prompt.tool_less = tools.is_none();
        if let Some(tools) = tools {
            let mut hash = 0u64;
            let mut tokens = 0;
            for tool in tools {
                let (block_hash, block_tokens) = reader.block(tool, spec.tokens(tool.to_string().chars().count()), 0);
                hash = xxh3_64(&[hash.to_le_bytes(), block_hash.to_le_bytes()].concat());
                tokens += block_tokens;
            }
            reader.prompt.units.push(Unit { hash, tokens });
        }
        match dialect {
            Dialect::Messages => {
                match &body["system"] {
                    Value::String(_) => reader.part(&body["system"]),
                    Value::Array(blocks) => {
                        for block in blocks {
                            // Claude Code's per-request billing line is not part of what is cached.
                            let billing =
                                block["text"].as_str().is_some_and(|t| t.starts_with("x-anthropic-billing-header:"));
                            if !billing {
                                reader.part(block);
                            }
                        }
                    }
                    _ => {}
                }
                for message in body["messages"].as_array().into_iter().flatten() {
                    reader.message(message);
                }
            }
            Dialect::Chat => {
                for message in body["messages"].as_array().into_iter().flatten() {
                    reader.message(message);
                }
            }
            Dialect::Responses => {
                if body["instructions"].is_string() {
                    reader.part(&body["instructions"]);
                }
                match &body["input"] {
                    Value::String(_) => reader.part(&body["input"]),
                    Value::Array(items) => {
                        for item in items {
                            reader.part_with_framing(item);
                        }
                    }
                    _ => {}
                }
            }
        }
        let max_tokens = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .find_map(|k| body[*k].as_u64())
            .unwrap_or(0);
        reader.prompt.max_tokens = max_tokens as usize;
        reader.prompt.tokens = BASE_TOKENS + reader.prompt.units.iter().map(|u| u.tokens).sum::<usize>();
        reader.prompt
    }

    /// Tokens of the blocks up to and including the last `cache_control` breakpoint (0 without one).
    fn through_last_breakpoint(&self) -> usize {
        let Some(last) = self.blocks.iter().rposition(|b| b.breakpoint) else { return 0 };
        BASE_TOKENS + self.blocks[..=last].iter().map(|b| b.tokens).sum::<usize>()
    }
}

struct PromptReader<'s> {
    spec: &'s ProviderSpec,
    prompt: Prompt,
    chain: u64,
}

impl PromptReader<'_> {
    /// Adds a block and returns its own hash and tokens.
    fn block(&mut self, value: &Value, tokens: usize, framing: usize) -> (u64, usize) {
        let hash = xxh3_64(canonical(value).as_bytes());
        self.chain = xxh3_64(&[self.chain.to_le_bytes(), hash.to_le_bytes()].concat());
        let tokens = tokens + framing;
        self.prompt.blocks.push(Block { chain: self.chain, tokens, breakpoint: value.get("cache_control").is_some() });
        (hash, tokens)
    }

    /// A unit that is one block (a system block, instructions).
    fn part(&mut self, value: &Value) {
        let tokens = self.spec.tokens(text_chars(value));
        let (hash, tokens) = self.block(value, tokens, 0);
        self.prompt.units.push(Unit { hash, tokens });
    }

    /// A unit that is one block with a message's framing (a Responses item).
    fn part_with_framing(&mut self, value: &Value) {
        let tokens = self.spec.tokens(text_chars(value));
        let (hash, tokens) = self.block(value, tokens, MESSAGE_TOKENS);
        self.prompt.units.push(Unit { hash, tokens });
    }

    /// A Chat or Messages message: a block per content part and per tool call.
    fn message(&mut self, message: &Value) {
        let mut parts: Vec<&Value> = match &message["content"] {
            Value::Array(parts) => parts.iter().collect(),
            Value::Null => Vec::new(),
            content => vec![content],
        };
        parts.extend(message["tool_calls"].as_array().into_iter().flatten());
        let mut tokens = 0;
        if parts.is_empty() {
            tokens += self.block(message, 0, MESSAGE_TOKENS).1;
        }
        for (i, part) in parts.iter().enumerate() {
            let framing = if i == 0 { MESSAGE_TOKENS } else { 0 };
            tokens += self.block(part, self.spec.tokens(text_chars(part)), framing).1;
        }
        self.prompt.units.push(Unit { hash: xxh3_64(canonical(message).as_bytes()), tokens });
    }
}

/// Fields that carry structure, not text the model reads.
const UNCOUNTED: [&str; 9] =
    ["type", "role", "id", "call_id", "tool_call_id", "tool_use_id", "status", "cache_control", "annotations"];

/// Characters of text in a JSON value (every string, except structural fields).
pub fn text_chars(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(text_chars).sum(),
        Value::Object(map) => {
            map.iter().filter(|(k, _)| !UNCOUNTED.contains(&k.as_str())).map(|(_, v)| text_chars(v)).sum()
        }
        _ => 0,
    }
}

/// The JSON without `cache_control` markers, for hashing.
fn canonical(value: &Value) -> String {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.shift_remove("cache_control");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let text = value.to_string();
    if !text.contains("\"cache_control\"") {
        return text;
    }
    let mut value = value.clone();
    strip(&mut value);
    value.to_string()
}

/// Units the two prompts share from the start, and their tokens (with the base tokens).
pub fn common_prefix(previous: &[Unit], current: &[Unit]) -> (usize, usize) {
    let shared = previous.iter().zip(current).take_while(|(a, b)| a.hash == b.hash).count();
    let tokens = current[..shared].iter().map(|u| u.tokens).sum::<usize>();
    (shared, if shared > 0 { tokens + BASE_TOKENS } else { 0 })
}

/// One request as the provider saw it.
#[derive(Clone, Debug)]
pub struct Record {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    /// Empty unless [`ProviderSpec::keep_bodies`].
    pub body: Bytes,
    pub dialect: Option<Dialect>,
    /// A request for the model's answer in any dialect, Gemini's included (not a probe, a token
    /// count or an unknown route).
    pub model_call: bool,
    /// A compactor summary call (tool-less, with its summarizer prompt).
    pub summary: bool,
    /// One of the agent's own summary requests (its own compaction, in its own words).
    pub agent_summary: bool,
    /// Another helper call of the agent (a title, a probe): not part of its conversation.
    pub helper: bool,
    /// Scripted: the round this answer called (0: none), and whether it was the final answer.
    pub round: usize,
    pub final_answer: bool,
    pub outcome: Outcome,
    pub status: u16,
    /// The session it belongs to (by the agent's session header or key, else its opening).
    pub session: String,
    /// Prompt tokens by the provider's own count.
    pub tokens: usize,
    pub max_tokens: usize,
    pub output_tokens: usize,
    /// Tokens shared from the start with the previous answered request of the session (0 for
    /// summary calls and the first request).
    pub prefix_tokens: usize,
    /// Cache reads and writes as the usage reported them in the dialect's fields.
    pub cache_read: usize,
    pub cache_write: usize,
    /// Fact markers (`WORD-WORD-42`) anywhere in the request.
    pub markers: Vec<String>,
    pub units: Vec<Unit>,
    pub blocks: Vec<Block>,
}

struct State {
    spec: ProviderSpec,
    records: Mutex<Vec<Record>>,
    /// The units of each session's last answered request.
    previous: Mutex<HashMap<String, Vec<Unit>>>,
    summaries: AtomicUsize,
    /// Scripted with a room: the window, set by the first scripted turn.
    window: Mutex<Option<usize>>,
    chains: chains::Chains,
}

impl State {
    /// The window for a request of `kind` with a prompt of `tokens`: a scripted room sets it at
    /// the first scripted turn, else the spec's.
    fn window_for(&self, kind: Option<Kind>, tokens: usize) -> usize {
        match (&self.spec.script, kind) {
            (Some(Script { room: Some(room), .. }), Some(Kind::Turn)) => {
                *self.window.lock().unwrap().get_or_insert(tokens + room)
            }
            _ => self.window.lock().unwrap().unwrap_or(self.spec.window),
        }
    }

    /// A summary's text: the facts (and, scripted, the progress) of what it was asked to read.
    fn summary_text(&self, number: usize, source: &str) -> String {
        let spec = &self.spec;
        let padding = agents::text(
            agents::Text::Prose,
            number as u64,
            (spec.summary_tokens as f64 * spec.chars_per_token) as usize,
        );
        if spec.script.is_some() {
            script::summary(number, source, &padding)
        } else {
            format!("Handoff summary {number}. Facts carried over: {}.\n\n{padding}", markers(source).join(" "))
        }
    }
}

/// A running provider simulator.
#[derive(Clone)]
pub struct ProviderSim {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl ProviderSim {
    pub async fn start(spec: ProviderSpec) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind provider simulator");
        let addr = listener.local_addr().expect("simulator address");
        let state = Arc::new(State {
            spec,
            records: Mutex::new(Vec::new()),
            previous: Mutex::new(HashMap::new()),
            summaries: AtomicUsize::new(0),
            window: Mutex::new(None),
            chains: chains::Chains::default(),
        });
        let served = state.clone();
        serve(listener, move |request| handle(served.clone(), request));
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spec(&self) -> &ProviderSpec {
        &self.state.spec
    }

    /// compactor's configuration with every upstream pointing here and the admin API on (token
    /// [`agents::ADMIN_TOKEN`], which [`agents::drive`] uses), then `extra` (tables, no `[admin]`).
    pub fn compactor_config(&self, extra: &str) -> String {
        format!(
            "[upstream]\nopenai = \"{0}\"\nanthropic = \"{0}\"\ngemini = \"{0}\"\n[admin]\ntoken = \"{1}\"\n{extra}",
            self.url(),
            agents::ADMIN_TOKEN
        )
    }

    pub fn len(&self) -> usize {
        self.state.records.lock().unwrap().len()
    }

    pub fn records(&self) -> Vec<Record> {
        self.records_from(0)
    }

    /// Records from index `first` on.
    pub fn records_from(&self, first: usize) -> Vec<Record> {
        let records = self.state.records.lock().unwrap();
        records[first.min(records.len())..].to_vec()
    }

    pub fn last(&self) -> Record {
        self.state.records.lock().unwrap().last().cloned().expect("the simulator received a request")
    }

    /// The window in force: the spec's, or the one a scripted room set.
    pub fn window(&self) -> usize {
        self.state.window.lock().unwrap().unwrap_or(self.state.spec.window)
    }

    /// Compaction items this provider sealed (its own compaction, on a request or the endpoint).
    pub fn compactions(&self) -> usize {
        self.state.chains.compactions()
    }

    pub fn summary_calls(&self) -> usize {
        self.state.records.lock().unwrap().iter().filter(|r| r.summary).count()
    }

    /// The prompt tokens of a request body by this provider's count.
    pub fn count(&self, dialect: Dialect, body: &[u8]) -> usize {
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        Prompt::read(dialect, &value, &self.state.spec).tokens
    }
}

/// Serves HTTP/1.1 and HTTP/2 on `listener` until the runtime stops, each request answered by
/// `handler`: the accept loop every in-process fake server needs.
pub fn serve<H, F, B>(listener: TcpListener, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let answer = handler(request);
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

type Reply = Response<BoxBody<Bytes, Infallible>>;

fn respond(status: u16, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert("content-type", content_type.parse().expect("content type"));
    response
}

fn json_reply(status: u16, body: &Value) -> Reply {
    respond(status, "application/json", body.to_string())
}

/// A stream as providers send it: one frame per event, chunked, no Content-Length.
fn sse_reply(events: &[String]) -> Reply {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
        events.iter().map(|e| Ok(Frame::data(Bytes::from(e.clone())))).collect();
    let mut response = Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed());
    response.headers_mut().insert("content-type", "text/event-stream".parse().expect("header"));
    response.headers_mut().insert("cache-control", "no-cache".parse().expect("header"));
    response
}

/// The session a request belongs to: the agent's own id when it sends one, else its opening.
fn session_of(headers: &HeaderMap, body: &Value, prompt: &Prompt) -> String {
    const HEADERS: [&str; 6] = [
        "x-claude-code-session-id",
        "session_id",
        "session-id",
        "x-session-id",
        "x-session-affinity",
        "conversation_id",
    ];
    for name in HEADERS {
        if let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) {
            return format!("{name}:{value}");
        }
    }
    if let Some(key) = body["prompt_cache_key"].as_str() {
        return format!("prompt_cache_key:{key}");
    }
    if let Some(user) = body["metadata"]["user_id"].as_str() {
        return format!("user_id:{user}");
    }
    let opening: Vec<u8> = prompt.units.iter().take(2).flat_map(|u| u.hash.to_le_bytes()).collect();
    format!("opening:{:016x}", xxh3_64(&opening))
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Reply {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let path_and_query = parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let path = parts.uri.path().to_string();
    let spec = &state.spec;
    let mut record = Record {
        method: parts.method.clone(),
        path: path_and_query,
        headers: parts.headers.clone(),
        body: if spec.keep_bodies { body.clone() } else { Bytes::new() },
        dialect: None,
        model_call: false,
        summary: false,
        agent_summary: false,
        helper: false,
        round: 0,
        final_answer: false,
        outcome: Outcome::Rejected,
        status: 404,
        session: String::new(),
        tokens: 0,
        max_tokens: 0,
        output_tokens: 0,
        prefix_tokens: 0,
        cache_read: 0,
        cache_write: 0,
        markers: markers(&String::from_utf8_lossy(&body)),
        units: Vec::new(),
        blocks: Vec::new(),
    };
    let push = |record: Record| state.records.lock().unwrap().push(record);
    if parts.method == Method::HEAD || parts.method == Method::GET && path == "/" {
        // Claude Code probes the base URL first.
        record.outcome = Outcome::Answered;
        record.status = 200;
        push(record);
        return respond(200, "text/plain", "");
    }
    if let Some((_, answer)) = spec.stated.iter().find(|(at, _)| *at == path) {
        let bearer = parts.headers.get("authorization").and_then(|v| v.to_str().ok());
        if let Some(key) = spec.stated_key
            && bearer != Some(&format!("Bearer {key}"))
        {
            record.status = 401;
            push(record);
            return json_reply(401, &json!({"error": {"message": "Invalid API Key", "type": "authentication_error"}}));
        }
        record.outcome = Outcome::Answered;
        record.status = 200;
        push(record);
        return respond(200, "application/json", answer.clone());
    }
    let value: Option<Value> = serde_json::from_slice(&body).ok();
    if path.ends_with("/v1/messages/count_tokens")
        && let Some(value) = &value
    {
        let tokens = Prompt::read(Dialect::Messages, value, spec).tokens;
        record.outcome = Outcome::Answered;
        record.status = 200;
        record.tokens = tokens;
        push(record);
        return json_reply(200, &json!({"input_tokens": tokens}));
    }
    if let Some((model, method)) = gemini::method(&path).filter(|_| parts.method == Method::POST) {
        let query = parts.uri.query().unwrap_or("");
        return gemini::handle(&state, record, &parts.headers, query, &model, &method, &body, value).await;
    }
    if spec.chains
        && let Some(reply) = chain_route(&state, &parts.method, &path, parts.uri.query().unwrap_or(""), value.as_ref())
    {
        record.outcome = Outcome::Answered;
        record.status = reply.status().as_u16();
        push(record);
        return reply;
    }
    let Some(dialect) = Dialect::of_path(&path).filter(|_| parts.method == Method::POST) else {
        push(record);
        return json_reply(404, &json!({"error": {"message": format!("no route for {path}"), "type": "not_found"}}));
    };
    record.dialect = Some(dialect);
    record.model_call = true;
    let Some(value) = value else {
        record.status = 400;
        push(record);
        return json_reply(
            400,
            &json!({"error": {"message": "We could not parse the JSON body of your request.", "type": "invalid_request_error", "param": null, "code": null}}),
        );
    };
    let (value, read) = match (dialect, spec.chains) {
        (Dialect::Responses, true) => match chained(&state, value) {
            Ok(pair) => pair,
            Err(error) => {
                record.status = 400;
                push(record);
                return json_reply(400, &error);
            }
        },
        _ => (value.clone(), value),
    };
    let prompt = Prompt::read(dialect, &read, spec);
    let text = if spec.chains { read.to_string() } else { String::from_utf8_lossy(&body).into_owned() };
    if spec.chains {
        record.markers = markers(&text);
    }
    let summary = prompt.tool_less && text.contains(SUMMARY_MARKER);
    record.summary = summary;
    let kind = spec.script.as_ref().map(|_| script::kind(dialect.into(), &value, &text)).filter(|_| !summary);
    record.agent_summary = kind == Some(Kind::AgentSummary);
    record.helper = kind == Some(Kind::Helper);
    record.session = session_of(&parts.headers, &value, &prompt);
    record.tokens = prompt.tokens;
    record.max_tokens = prompt.max_tokens;
    let stream = value["stream"] == true;
    let model = value["model"].as_str().unwrap_or("sim-model").to_string();

    let pairing = match dialect {
        Dialect::Responses => strict::responses_pairing_error(&value),
        _ => strict::pairing_error(dialect.path(), &value),
    };
    if let Some(error) = pairing {
        record.status = 400;
        record.units = prompt.units;
        push(record);
        return json_reply(400, &error);
    }
    let window = state.window_for(kind, prompt.tokens);
    let over_prompt = prompt.tokens > window;
    let over_output = spec.count_max_tokens && prompt.tokens + prompt.max_tokens > window;
    if over_prompt || over_output {
        let style = spec.errors.style(dialect);
        let counted_output = if over_prompt { 0 } else { prompt.max_tokens };
        let reply = overflow_reply(style, stream, window, prompt.tokens, counted_output);
        record.outcome = Outcome::Overflow;
        record.status = reply.status().as_u16();
        record.units = prompt.units;
        record.blocks = prompt.blocks;
        push(record);
        return reply;
    }

    // A summary carries only what it was asked to read: compactor's summarizer its transcript (its
    // previous summary first), an agent's own summary request the whole conversation.
    let summary_text = |number: usize, source: &str| state.summary_text(number, source);
    let (reply, usage) = if summary {
        let number = state.summaries.fetch_add(1, Ordering::SeqCst) + 1;
        let reply = summary_text(number, transcript_of(&text));
        let output = spec.tokens(reply.chars().count());
        (Move::Text(reply), Usage { prompt: prompt.tokens, read: 0, write: 0, cached: 0, output })
    } else {
        let previous = state.previous.lock().unwrap().insert(record.session.clone(), prompt.units.clone());
        let (_, prefix) = previous.map_or((0, 0), |p| common_prefix(&p, &prompt.units));
        record.prefix_tokens = prefix;
        let cacheable = |tokens: usize| if tokens >= MIN_CACHEABLE { tokens } else { 0 };
        let usage = match dialect {
            Dialect::Messages => {
                let marked = cacheable(prompt.through_last_breakpoint());
                let read = cacheable(prefix).min(marked);
                Usage {
                    prompt: prompt.tokens,
                    read,
                    write: marked.saturating_sub(read),
                    cached: read,
                    output: spec.reply_tokens,
                }
            }
            _ => {
                let cached = cacheable(prefix) / 128 * 128;
                Usage { prompt: prompt.tokens, read: cached, write: 0, cached, output: spec.reply_tokens }
            }
        };
        let reply = match (&spec.script, kind) {
            (Some(script), Some(Kind::Turn)) => {
                script::next_move(script, dialect.into(), &value, &text, spec.chars_per_token)
            }
            (Some(_), Some(Kind::AgentSummary)) => Move::Text(summary_text(1000 + record.tokens, &text)),
            (Some(_), _) => Move::Text("Scripted task".into()),
            (None, _) => {
                let seed = record.tokens as u64;
                Move::Text(agents::text(
                    agents::Text::Prose,
                    seed,
                    (spec.reply_tokens as f64 * spec.chars_per_token) as usize,
                ))
            }
        };
        (reply, usage)
    };
    match &reply {
        Move::Call(_) => record.round = script::progress(&text).0 + 1,
        Move::Text(_) => record.final_answer = kind == Some(Kind::Turn),
    }
    record.outcome = Outcome::Answered;
    record.status = 200;
    record.output_tokens = usage.output;
    record.cache_read = usage.read;
    record.cache_write = usage.write;
    record.units = prompt.units;
    record.blocks = prompt.blocks;
    let include_usage = value["stream_options"]["include_usage"] == true;
    push(record);
    let serial = state.records.lock().unwrap().len();
    if spec.chains
        && dialect == Dialect::Responses
        && let Move::Text(text) = &reply
    {
        let message = json!({"type": "message", "id": format!("msg_sim{serial:06}"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]});
        let stored = chains::Stored { input: chains::items_of(&value), output: vec![message] };
        state.chains.store(&format!("resp_sim{serial:06}"), stored);
    }
    if summary && !spec.summary_delay.is_zero() {
        tokio::time::sleep(spec.summary_delay).await;
    }
    match reply {
        Move::Text(text) => answer(dialect, stream, include_usage, &model, &text, &usage, serial),
        Move::Call(call) => answer_call(dialect, stream, include_usage, &model, &call, &usage, serial),
    }
}

/// Token usage of one answer.
struct Usage {
    prompt: usize,
    /// Anthropic cache reads and writes.
    read: usize,
    write: usize,
    /// OpenAI cached tokens.
    cached: usize,
    output: usize,
}

impl Usage {
    fn chat(&self) -> Value {
        json!({"prompt_tokens": self.prompt, "completion_tokens": self.output, "total_tokens": self.prompt + self.output,
            "prompt_tokens_details": {"cached_tokens": self.cached}})
    }
    fn anthropic(&self, output: usize) -> Value {
        json!({"input_tokens": self.prompt - self.read - self.write, "cache_creation_input_tokens": self.write,
            "cache_read_input_tokens": self.read, "output_tokens": output})
    }
    fn responses(&self) -> Value {
        json!({"input_tokens": self.prompt, "input_tokens_details": {"cached_tokens": self.cached},
            "output_tokens": self.output, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": self.prompt + self.output})
    }
}

/// The text split into a few deltas, as a stream sends it.
fn deltas(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(3).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn answer(
    dialect: Dialect,
    stream: bool,
    include_usage: bool,
    model: &str,
    text: &str,
    usage: &Usage,
    serial: usize,
) -> Reply {
    // A fresh id per answer, as providers give: Claude Code merges assistant blocks that share a
    // message id into one message.
    let (msg_id, resp_id, chat_id) =
        (format!("msg_sim{serial:06}"), format!("resp_sim{serial:06}"), format!("chatcmpl-sim{serial:06}"));
    match (dialect, stream) {
        (Dialect::Chat, false) => json_reply(
            200,
            &json!({"id": chat_id, "object": "chat.completion", "created": 1_700_000_000,
            "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage.chat()}),
        ),
        (Dialect::Chat, true) => {
            let chunk = |delta: Value, finish: Value| {
                format!(
                    "data: {}\n\n",
                    json!({"id": chat_id, "object": "chat.completion.chunk",
                "created": 1_700_000_000, "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                )
            };
            let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
            events.extend(deltas(text).iter().map(|d| chunk(json!({"content": d}), Value::Null)));
            events.push(chunk(json!({}), json!("stop")));
            if include_usage {
                events.push(format!(
                    "data: {}\n\n",
                    json!({"id": chat_id, "object": "chat.completion.chunk",
                    "created": 1_700_000_000, "model": model, "choices": [], "usage": usage.chat()})
                ));
            }
            events.push("data: [DONE]\n\n".into());
            sse_reply(&events)
        }
        (Dialect::Messages, false) => json_reply(
            200,
            &json!({"id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": null,
            "usage": usage.anthropic(usage.output)}),
        ),
        (Dialect::Messages, true) => {
            let mut events = vec![
                event(
                    "message_start",
                    &json!({"type": "message_start", "message": {"id": msg_id, "type": "message", "role": "assistant",
                    "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage.anthropic(1)}}),
                ),
                event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                event("ping", &json!({"type": "ping"})),
            ];
            events.extend(deltas(text).iter().map(|d| {
                event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}}),
                )
            }));
            events.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})));
            events.push(event(
                "message_delta",
                &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": usage.output}}),
            ));
            events.push(event("message_stop", &json!({"type": "message_stop"})));
            sse_reply(&events)
        }
        (Dialect::Responses, stream) => {
            let message = json!({"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]});
            let completed = json!({"id": resp_id, "object": "response", "created_at": 1_700_000_000, "status": "completed",
                "model": model, "output": [message], "usage": usage.responses()});
            if !stream {
                return json_reply(200, &completed);
            }
            let started = json!({"id": resp_id, "object": "response", "created_at": 1_700_000_000, "status": "in_progress",
                "model": model, "output": []});
            let mut sequence = 0;
            let mut next = |name: &str, mut data: Value| {
                data["type"] = json!(name);
                data["sequence_number"] = json!(sequence);
                sequence += 1;
                event(name, &data)
            };
            let mut events = vec![
                next("response.created", json!({"response": started})),
                next("response.in_progress", json!({"response": started})),
                next(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": {"type": "message", "id": msg_id,
                    "status": "in_progress", "role": "assistant", "content": []}}),
                ),
                next(
                    "response.content_part.added",
                    json!({"item_id": msg_id, "output_index": 0, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
                ),
            ];
            for delta in deltas(text) {
                events.push(next(
                    "response.output_text.delta",
                    json!({"item_id": msg_id, "output_index": 0, "content_index": 0, "delta": delta}),
                ));
            }
            events.push(next(
                "response.output_text.done",
                json!({"item_id": msg_id, "output_index": 0, "content_index": 0, "text": text}),
            ));
            events.push(next("response.output_item.done", json!({"output_index": 0, "item": message})));
            events.push(next("response.completed", json!({"response": completed})));
            sse_reply(&events)
        }
    }
}

/// The provider's overflow error. `max_tokens` is non-zero when the prompt itself fits and only
/// prompt + max_tokens does not.
fn overflow_reply(style: ErrorStyle, stream: bool, window: usize, prompt: usize, max_tokens: usize) -> Reply {
    let openai = |message: String, param: &str| json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": "context_length_exceeded"}});
    let anthropic = |message: &str| json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}, "request_id": "req_011CSimulated"});
    match style {
        ErrorStyle::OpenAi if max_tokens > 0 => json_reply(
            400,
            &openai(
                format!(
                    "This model's maximum context length is {window} tokens. However, you requested {} tokens ({prompt} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
                    prompt + max_tokens
                ),
                "messages",
            ),
        ),
        ErrorStyle::OpenAi => json_reply(
            400,
            &openai(
                format!(
                    "This model's maximum context length is {window} tokens. However, your messages resulted in {prompt} tokens. Please reduce the length of the messages."
                ),
                "messages",
            ),
        ),
        ErrorStyle::Anthropic if max_tokens > 0 => json_reply(
            400,
            &anthropic(&format!(
                "input length and `max_tokens` exceed context limit: {prompt} + {max_tokens} > {window}, decrease input length or `max_tokens` and try again"
            )),
        ),
        ErrorStyle::Anthropic => {
            json_reply(400, &anthropic(&format!("prompt is too long: {prompt} tokens > {window} maximum")))
        }
        ErrorStyle::Anthropic413 => json_reply(413, &anthropic("Request size exceeds model context window")),
        ErrorStyle::Responses => {
            let message =
                "Your input exceeds the context window of this model. Please adjust your input and try again.";
            if !stream {
                return json_reply(400, &openai(message.to_string(), "input"));
            }
            let response = |status: &str, error: Value| {
                json!({"id": "resp_sim", "object": "response", "created_at": 1_700_000_000,
                "status": status, "error": error, "output": [], "usage": null})
            };
            sse_reply(&[
                event(
                    "response.created",
                    &json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress", Value::Null)}),
                ),
                event(
                    "response.in_progress",
                    &json!({"type": "response.in_progress", "sequence_number": 1, "response": response("in_progress", Value::Null)}),
                ),
                event(
                    "response.failed",
                    &json!({"type": "response.failed", "sequence_number": 2,
                    "response": response("failed", json!({"code": "context_length_exceeded", "message": message}))}),
                ),
            ])
        }
        ErrorStyle::LlamaCpp => json_reply(
            400,
            &json!({"error": {"code": 400, "message": format!(
            "request ({prompt} tokens) exceeds the available context size ({window} tokens), try increasing it"),
            "type": "exceed_context_size_error", "n_prompt_tokens": prompt, "n_ctx": window}}),
        ),
        ErrorStyle::Ollama => json_reply(
            400,
            &json!({"error": format!(
            "prompt too long; exceeded max context length by {} tokens", (prompt + max_tokens).saturating_sub(window).max(1))}),
        ),
        ErrorStyle::Vllm if max_tokens > 0 => json_reply(
            400,
            &json!({"error": {"message": format!(
            "You passed {prompt} input tokens and requested {max_tokens} output tokens. However, the model's context length is only {window} tokens, resulting in a maximum input length of {} tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={prompt})",
            window.saturating_sub(max_tokens)), "type": "BadRequestError", "param": "input_tokens", "code": 400}}),
        ),
        ErrorStyle::Vllm => json_reply(
            400,
            &json!({"error": {"message": format!(
            "This model's maximum context length is {window} tokens. However, your request has {prompt} input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value={prompt})"),
            "type": "BadRequestError", "param": "input_tokens", "code": 400}}),
        ),
    }
}

/// Prices relative to the base input price.
#[derive(Clone, Copy, Debug)]
pub struct Prices {
    pub name: &'static str,
    pub cache_read: f64,
    pub cache_write: f64,
    pub output: f64,
    /// Cached prefixes count in steps of this many tokens (OpenAI: 128).
    pub step: usize,
}

/// Claude Sonnet 4.5: $3 input, $0.30 cache read, $3.75 cache write (5-minute TTL), $15 output.
pub const ANTHROPIC: Prices = Prices { name: "Anthropic", cache_read: 0.1, cache_write: 1.25, output: 5.0, step: 1 };
/// GPT-4.1: $2 input, $0.50 cached input, $8 output; no write surcharge.
pub const OPENAI: Prices =
    Prices { name: "OpenAI gpt-4.1", cache_read: 0.25, cache_write: 1.0, output: 4.0, step: 128 };
/// Gemini's implicit caching as compactor's `gemini` preset prices it (cached input 0.25x, no
/// write surcharge); output at Gemini 2.5 Pro's 8x ($1.25 input, $10 output).
pub const GEMINI: Prices =
    Prices { name: "Gemini (cached 0.25x)", cache_read: 0.25, cache_write: 1.0, output: 8.0, step: 1 };

impl Prices {
    /// The same prices as compactor's cache model takes them.
    pub fn cache(&self) -> CachePricing {
        CachePricing {
            read: self.cache_read,
            write: self.cache_write,
            lifetime: Duration::from_secs(300),
            preset: None,
        }
    }
}

/// What a session's upstream requests cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bill {
    /// The agent's answered requests.
    pub requests: usize,
    /// Their prompt tokens.
    pub input_tokens: usize,
    pub cache_read: usize,
    pub cache_write: usize,
    /// Requests whose prefix did not extend the previous request's whole prompt.
    pub breaks: usize,
    pub summary_calls: usize,
    pub summary_input: usize,
    pub summary_output: usize,
    /// Tokens a local server re-prefills: everything after the first changed token, plus every
    /// summary call's prompt.
    pub prefilled: usize,
    /// In units of one base-price input token; main requests' output (the same with and without
    /// compactor) left out, summary calls' output in.
    pub cost: f64,
}

fn summary_costs(bill: &mut Bill, records: &[Record], prices: &Prices) {
    for record in records.iter().filter(|r| r.summary && r.outcome.is_answered()) {
        bill.summary_calls += 1;
        bill.summary_input += record.tokens;
        bill.summary_output += record.output_tokens;
        bill.prefilled += record.tokens;
        bill.cost += record.tokens as f64 + record.output_tokens as f64 * prices.output;
    }
}

/// Prices answered requests by their longest common prefix with the previous one, message by
/// message (markers ignored), as if the whole prompt were cached every turn: the prefix is read,
/// the rest written (Anthropic) or uncached (OpenAI, at `step` granularity).
pub fn bill_by_prefix(records: &[Record], prices: &Prices) -> Bill {
    let mut bill = Bill::default();
    let mut previous: Option<&Record> = None;
    for record in records.iter().filter(|r| !r.summary && r.outcome.is_answered() && r.model_call) {
        let (shared, prefix) = previous.map_or((0, 0), |p| common_prefix(&p.units, &record.units));
        if previous.is_some_and(|p| shared < p.units.len()) {
            bill.breaks += 1;
        }
        let read = if prefix >= MIN_CACHEABLE { prefix / prices.step * prices.step } else { 0 };
        let rest = record.tokens - read;
        bill.requests += 1;
        bill.input_tokens += record.tokens;
        bill.cache_read += read;
        bill.cache_write += rest;
        bill.prefilled += record.tokens - prefix;
        bill.cost += cache_cost::request(&prices.cache(), record.tokens as u64, read as u64);
        previous = Some(record);
    }
    summary_costs(&mut bill, records, prices);
    bill
}

/// Prices answered requests as Anthropic caches them: entries are written at `cache_control`
/// breakpoints only, and a request reads the longest entry found within [`LOOKBACK_BLOCKS`]
/// blocks before one of its breakpoints, so a change re-writes from the last breakpoint before
/// it. Tokens after the last breakpoint are plain input.
pub fn bill_by_breakpoints(records: &[Record], prices: &Prices) -> Bill {
    let mut bill = Bill::default();
    let mut cached: HashSet<u64> = HashSet::new();
    let mut previous: Option<&Record> = None;
    for record in records.iter().filter(|r| !r.summary && r.outcome.is_answered() && r.model_call) {
        let (shared, prefix) = previous.map_or((0, 0), |p| common_prefix(&p.units, &record.units));
        if previous.is_some_and(|p| shared < p.units.len()) {
            bill.breaks += 1;
        }
        let mut through = Vec::with_capacity(record.blocks.len());
        let mut sum = BASE_TOKENS;
        for block in &record.blocks {
            sum += block.tokens;
            through.push(sum);
        }
        let breakpoints: Vec<usize> = (0..record.blocks.len()).filter(|&i| record.blocks[i].breakpoint).collect();
        let mut read = 0;
        for &b in &breakpoints {
            let hit = (b.saturating_sub(LOOKBACK_BLOCKS)..=b).rev().find(|&j| cached.contains(&record.blocks[j].chain));
            if let Some(j) = hit {
                read = read.max(through[j]);
            }
        }
        let marked = breakpoints.last().map_or(0, |&b| through[b]);
        let write = if marked >= MIN_CACHEABLE { marked.saturating_sub(read) } else { 0 };
        for &b in &breakpoints {
            if through[b] >= MIN_CACHEABLE {
                cached.insert(record.blocks[b].chain);
            }
        }
        let plain = record.tokens - read - write;
        bill.requests += 1;
        bill.input_tokens += record.tokens;
        bill.cache_read += read;
        bill.cache_write += write;
        bill.prefilled += record.tokens - prefix;
        // Reads and writes as the cache model prices them; what follows the last breakpoint is
        // plain input.
        bill.cost += cache_cost::request(&prices.cache(), (read + write) as u64, read as u64) + plain as f64;
        previous = Some(record);
    }
    summary_costs(&mut bill, records, prices);
    bill
}

/// A tool call as each dialect's provider sends it, plain or streamed (the arguments in a few
/// deltas, as providers stream them).
fn answer_call(
    dialect: Dialect,
    stream: bool,
    include_usage: bool,
    model: &str,
    call: &script::Call,
    usage: &Usage,
    serial: usize,
) -> Reply {
    // A fresh id per answer, as providers give: Claude Code merges assistant blocks that share a
    // message id into one message.
    let (msg_id, resp_id, chat_id) =
        (format!("msg_sim{serial:06}"), format!("resp_sim{serial:06}"), format!("chatcmpl-sim{serial:06}"));
    let arguments = call.arguments.to_string();
    match (dialect, stream) {
        (Dialect::Chat, false) => json_reply(
            200,
            &json!({"id": chat_id, "object": "chat.completion", "created": 1_700_000_000, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [{"id": call.id,
            "type": "function", "function": {"name": call.name, "arguments": arguments}}]}, "finish_reason": "tool_calls"}],
            "usage": usage.chat()}),
        ),
        (Dialect::Chat, true) => {
            let chunk = |delta: Value, finish: Value| {
                format!(
                    "data: {}\n\n",
                    json!({"id": chat_id, "object": "chat.completion.chunk",
                "created": 1_700_000_000, "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                )
            };
            let mut events = vec![chunk(
                json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}]}),
                Value::Null,
            )];
            events.extend(
                deltas(&arguments)
                    .iter()
                    .map(|d| chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": d}}]}), Value::Null)),
            );
            events.push(chunk(json!({}), json!("tool_calls")));
            if include_usage {
                events.push(format!(
                    "data: {}\n\n",
                    json!({"id": chat_id, "object": "chat.completion.chunk",
                    "created": 1_700_000_000, "model": model, "choices": [], "usage": usage.chat()})
                ));
            }
            events.push("data: [DONE]\n\n".into());
            sse_reply(&events)
        }
        (Dialect::Messages, false) => json_reply(
            200,
            &json!({"id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}],
            "stop_reason": "tool_use", "stop_sequence": null, "usage": usage.anthropic(usage.output)}),
        ),
        (Dialect::Messages, true) => {
            let mut events = vec![
                event(
                    "message_start",
                    &json!({"type": "message_start", "message": {"id": msg_id, "type": "message", "role": "assistant",
                    "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage.anthropic(1)}}),
                ),
                event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use",
                    "id": call.id, "name": call.name, "input": {}}}),
                ),
            ];
            events.extend(deltas(&arguments).iter().map(|d| {
                event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": d}}),
                )
            }));
            events.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})));
            events.push(event(
                "message_delta",
                &json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"output_tokens": usage.output}}),
            ));
            events.push(event("message_stop", &json!({"type": "message_stop"})));
            sse_reply(&events)
        }
        (Dialect::Responses, stream) => {
            let item_id = format!("fc_{}", call.id.trim_start_matches("call_"));
            let item = |status: &str, arguments: &str| {
                json!({"type": "function_call", "id": item_id, "status": status, "call_id": call.id,
                "name": call.name, "arguments": arguments})
            };
            let completed = json!({"id": resp_id, "object": "response", "created_at": 1_700_000_000, "status": "completed",
                "model": model, "output": [item("completed", &arguments)], "usage": usage.responses()});
            if !stream {
                return json_reply(200, &completed);
            }
            let started = json!({"id": resp_id, "object": "response", "created_at": 1_700_000_000, "status": "in_progress",
                "model": model, "output": []});
            let mut sequence = 0;
            let mut next = |name: &str, mut data: Value| {
                data["type"] = json!(name);
                data["sequence_number"] = json!(sequence);
                sequence += 1;
                event(name, &data)
            };
            let mut events = vec![
                next("response.created", json!({"response": started})),
                next("response.in_progress", json!({"response": started})),
                next("response.output_item.added", json!({"output_index": 0, "item": item("in_progress", "")})),
            ];
            for delta in deltas(&arguments) {
                events.push(next(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": 0, "delta": delta}),
                ));
            }
            events.push(next(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": 0, "arguments": arguments}),
            ));
            events.push(next(
                "response.output_item.done",
                json!({"output_index": 0, "item": item("completed", &arguments)}),
            ));
            events.push(next("response.completed", json!({"response": completed})));
            sse_reply(&events)
        }
    }
}

/// The chain routes ([`chains`]): a stored response and its input items read back, and the
/// compaction endpoint; `None` for any other request.
fn chain_route(state: &State, method: &Method, path: &str, query: &str, body: Option<&Value>) -> Option<Reply> {
    let not_found = |id: &str| {
        json_reply(
            404,
            &json!({"error": {"message": format!("Response with id '{id}' not found."), "type": "invalid_request_error", "param": null, "code": null}}),
        )
    };
    if *method == Method::POST && path.ends_with("/v1/responses/compact") {
        let body = body?;
        let mut items = Vec::new();
        if let Some(id) = body["previous_response_id"].as_str() {
            let Some(stored) = state.chains.get(id) else { return Some(not_found(id)) };
            items.extend(stored.input.into_iter().chain(stored.output));
        }
        items.extend(chains::items_of(body));
        let read = chains::as_read(&json!({"input": items})).ok()?;
        let number = state.summaries.fetch_add(1, Ordering::SeqCst) + 1;
        let sealed = state.chains.seal(&state.summary_text(number, &read.to_string()));
        return Some(json_reply(
            200,
            &json!({"id": format!("resp_cmp{number:04}"), "object": "response.compaction",
            "created_at": 1_700_000_000, "output": [sealed],
            "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0, "total_tokens": 0}}),
        ));
    }
    if *method != Method::GET {
        return None;
    }
    let rest = path.strip_prefix("/v1/responses/")?;
    let (id, items) = match rest.strip_suffix("/input_items") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    let Some(stored) = state.chains.get(id) else { return Some(not_found(id)) };
    if items {
        let limit = chains::query_value(query, "limit").and_then(|l| l.parse().ok()).unwrap_or(20);
        return Some(json_reply(200, &chains::page(&stored, chains::query_value(query, "after"), limit)));
    }
    Some(json_reply(200, &json!({"id": id, "object": "response", "status": "completed", "output": stored.output})))
}

/// A Responses request as this provider reads it with its chains kept: its chain prepended
/// (`previous_response_id`), compacted (`context_management`) or truncated (`truncation: "auto"`)
/// when it does not fit; the stored body, and the body as the model reads it.
fn chained(state: &State, mut value: Value) -> Result<(Value, Value), Value> {
    let error = |message: String| json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}});
    let mut chain = Vec::new();
    if let Some(id) = value["previous_response_id"].as_str().map(str::to_string) {
        let stored =
            state.chains.get(&id).ok_or_else(|| error(format!("Previous response with id '{id}' not found.")))?;
        chain.extend(stored.input.into_iter().chain(stored.output));
        value.as_object_mut().map(|o| o.remove("previous_response_id"));
    }
    let own = chains::items_of(&value);
    let window = state.window_for(None, 0);
    let tokens = |items: &[Value]| {
        let body = json!({"instructions": value["instructions"], "input": items});
        chains::as_read(&body).map(|read| Prompt::read(Dialect::Responses, &read, &state.spec).tokens)
    };
    let all = |chain: &[Value]| chain.iter().chain(&own).cloned().collect::<Vec<_>>();
    let compacting =
        value["context_management"].as_array().is_some_and(|c| c.iter().any(|m| m["type"] == "compaction"));
    if compacting && !chain.is_empty() {
        let threshold = value["context_management"][0]["compact_threshold"].as_u64().map_or(window, |t| t as usize);
        if tokens(&all(&chain)).map_err(error)? > threshold {
            let read = chains::as_read(&json!({"input": chain})).map_err(error)?;
            let number = state.summaries.fetch_add(1, Ordering::SeqCst) + 1;
            chain = vec![state.chains.seal(&state.summary_text(number, &read.to_string()))];
        }
    }
    if value["truncation"] == "auto" {
        while !chain.is_empty() && tokens(&all(&chain)).map_err(error)? > window {
            chain.remove(0);
        }
    }
    value["input"] = Value::Array(all(&chain));
    let read = chains::as_read(&value).map_err(error)?;
    Ok((value, read))
}
