//! What a phase sends: a path, headers and, per request, a body and a session id. The small
//! chat bodies are fixed; the 800 KB agent conversations come as a warm next turn of one session
//! or as the cold first turn of a new session each time.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::stub::SSE_HEADER;

/// The small chat conversation, with `$stream` (its stream settings) in the middle.
macro_rules! small_chat {
    ($stream:literal) => {
        concat!(
            r#"{"model":"gpt-4o","messages":["#,
            r#"{"role":"system","content":"You are terse. Answer in one short sentence."},"#,
            r#"{"role":"user","content":"Say hello to the load benchmark."},"#,
            r#"{"role":"assistant","content":"Hello, load benchmark."},"#,
            r#"{"role":"user","content":"Say hello"}],"#,
            r#""temperature":0,"max_tokens":16,"#,
            $stream,
            r#","user":"load-bench"}"#
        )
    };
}

pub const SMALL_BODY: &str = small_chat!(r#""stream":false"#);

/// The same conversation, streamed, as the OpenAI SDK asks for it.
pub const SMALL_STREAM_BODY: &str = small_chat!(r#""stream":true,"stream_options":{"include_usage":true}"#);

/// How long the stub waits between the first event of a stream and the rest, in the stream
/// phase: long enough that a buffering proxy would show, short enough to keep the phase light.
pub const STREAM_PAUSE: Duration = Duration::from_millis(10);

/// Variants of the warm next turn: one second of requests at the default large-body rate.
const NEXT_TURN_VARIANTS: u64 = 20;

/// A recorded ~800 KB agent conversation in `tests/fixtures/conversations/`.
pub struct LargeFixture {
    /// Its name in `LOAD_LARGE`.
    pub key: &'static str,
    pub label: &'static str,
    file: &'static str,
    path: &'static str,
    /// The session header the agent sends.
    session_header: &'static str,
    headers: &'static [(&'static str, &'static str)],
    dialect: Dialect,
}

#[derive(Clone, Copy)]
enum Dialect {
    Messages,
    Chat,
    Responses,
}

pub const LARGE_FIXTURES: [LargeFixture; 3] = [
    LargeFixture {
        key: "claude-code",
        label: "Claude Code (Messages)",
        file: "anthropic_claude_code_long.json",
        path: "/v1/messages?beta=true",
        session_header: "x-claude-code-session-id",
        headers: &[("x-api-key", "sk-ant-load-bench"), ("anthropic-version", "2023-06-01")],
        dialect: Dialect::Messages,
    },
    LargeFixture {
        key: "chat",
        label: "agent (Chat Completions)",
        file: "openai_chat_agent_long.json",
        path: "/v1/chat/completions",
        session_header: "x-session-id",
        headers: &[("authorization", "Bearer sk-load-bench")],
        dialect: Dialect::Chat,
    },
    LargeFixture {
        key: "codex",
        label: "Codex (Responses)",
        file: "responses_codex_long.json",
        path: "/v1/responses",
        // Codex's spelling, with an underscore: nginx needs `underscores_in_headers on`.
        session_header: "session_id",
        headers: &[("authorization", "Bearer sk-load-bench")],
        dialect: Dialect::Responses,
    },
];

/// The default `LOAD_LARGE`: the two conversations the rewrite bench uses.
pub const DEFAULT_LARGE: &str = "claude-code,chat";

pub struct Scenario {
    pub path: String,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    bodies: Bodies,
    session_header: Option<HeaderName>,
}

enum Bodies {
    Fixed(Bytes),
    /// The same session's next turn: the conversation plus one new exchange, cycling through
    /// variants so consecutive requests share everything but their last two messages.
    NextTurn(Vec<Bytes>),
    /// The first turn of a new session: a session id never used before, and a marker spliced
    /// into the first user message at `insert_at`, so no state keyed on the session or the
    /// conversation's opening can match. The texts of the tool outputs stay the same.
    NewSession {
        body: Bytes,
        insert_at: usize,
    },
}

/// One request of a scenario.
pub struct Outgoing {
    pub body: Bytes,
    pub session: Option<HeaderValue>,
}

/// Numbers new sessions across the whole run, so no two cold turns share one.
static NEW_SESSIONS: AtomicU64 = AtomicU64::new(0);

impl Scenario {
    /// A fixed body (the small chat bodies, or `LOAD_BODY`); the stub streams its answer when
    /// the body asks for a stream.
    pub fn fixed(path: &str, body: Bytes, sse_pause: Duration) -> Self {
        let mut headers =
            vec![(HeaderName::from_static("authorization"), HeaderValue::from_static("Bearer sk-load-bench"))];
        if path.starts_with("/v1/messages") {
            headers.push((HeaderName::from_static("anthropic-version"), HeaderValue::from_static("2023-06-01")));
        }
        if asks_for_stream(&body) {
            headers.push(sse_header(sse_pause));
        }
        Self { path: path.to_string(), headers, bodies: Bodies::Fixed(body), session_header: None }
    }

    /// The warm next turn of one session of `fixture`.
    pub fn next_turn(fixture: &LargeFixture, conversation: &Conversation) -> Self {
        let variants = (0..NEXT_TURN_VARIANTS)
            .map(|i| {
                let turn = fixture.dialect.exchange(i);
                let end = conversation.array_end;
                let mut body = Vec::with_capacity(conversation.body.len() + turn.len());
                body.extend_from_slice(&conversation.body[..end]);
                body.extend_from_slice(turn.as_bytes());
                body.extend_from_slice(&conversation.body[end..]);
                Bytes::from(body)
            })
            .collect();
        Self::large(fixture, conversation, Bodies::NextTurn(variants))
    }

    /// The cold first turn of a new session of `fixture`, every time.
    pub fn new_session(fixture: &LargeFixture, conversation: &Conversation) -> Self {
        let bodies = Bodies::NewSession { body: conversation.body.clone(), insert_at: conversation.first_user_text };
        Self::large(fixture, conversation, bodies)
    }

    fn large(fixture: &LargeFixture, conversation: &Conversation, bodies: Bodies) -> Self {
        let mut headers: Vec<_> = fixture
            .headers
            .iter()
            .map(|(name, value)| (HeaderName::from_static(name), HeaderValue::from_static(value)))
            .collect();
        if conversation.stream {
            // Everything at once: these phases measure the request path, not streaming.
            headers.push(sse_header(Duration::ZERO));
        }
        Self {
            path: fixture.path.to_string(),
            headers,
            bodies,
            session_header: Some(HeaderName::from_static(fixture.session_header)),
        }
    }

    pub fn streams(&self) -> bool {
        self.headers.iter().any(|(name, _)| name == SSE_HEADER)
    }

    pub fn body_len(&self) -> usize {
        match &self.bodies {
            Bodies::Fixed(body) | Bodies::NewSession { body, .. } => body.len(),
            Bodies::NextTurn(variants) => variants.first().map_or(0, Bytes::len),
        }
    }

    /// Request `i` of a run; `tag` names the run's session (target and scenario) for warm turns.
    pub fn request(&self, tag: &str, i: u64) -> Outgoing {
        match &self.bodies {
            Bodies::Fixed(body) => Outgoing { body: body.clone(), session: None },
            Bodies::NextTurn(variants) => {
                let body = variants[(i % variants.len() as u64) as usize].clone();
                Outgoing { body, session: self.session_value(&format!("load-bench-{tag}")) }
            }
            Bodies::NewSession { body, insert_at } => {
                let n = NEW_SESSIONS.fetch_add(1, Ordering::Relaxed);
                let marker = format!("[new session {n}] ");
                let mut fresh = Vec::with_capacity(body.len() + marker.len());
                fresh.extend_from_slice(&body[..*insert_at]);
                fresh.extend_from_slice(marker.as_bytes());
                fresh.extend_from_slice(&body[*insert_at..]);
                Outgoing { body: Bytes::from(fresh), session: self.session_value(&format!("load-bench-new-{n}")) }
            }
        }
    }

    fn session_value(&self, id: &str) -> Option<HeaderValue> {
        self.session_header.as_ref().and_then(|_| HeaderValue::from_str(id).ok())
    }

    pub fn session_header(&self) -> Option<&HeaderName> {
        self.session_header.as_ref()
    }
}

fn sse_header(pause: Duration) -> (HeaderName, HeaderValue) {
    (HeaderName::from_static(SSE_HEADER), HeaderValue::from(u64::try_from(pause.as_millis()).unwrap_or(u64::MAX)))
}

/// The body's top-level `stream` flag.
pub fn asks_for_stream(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Flag {
        #[serde(default)]
        stream: bool,
    }
    serde_json::from_slice::<Flag>(body).is_ok_and(|flag| flag.stream)
}

impl Dialect {
    /// One more exchange (an assistant answer and the user's next message), to splice in
    /// before the closing bracket of the conversation.
    fn exchange(self, i: u64) -> String {
        match self {
            Self::Messages => format!(
                r#",{{"role":"assistant","content":[{{"type":"text","text":"Step {i} is done."}}]}},{{"role":"user","content":[{{"type":"text","text":"Go on with step {i}."}}]}}"#
            ),
            Self::Chat => format!(
                r#",{{"role":"assistant","content":"Step {i} is done."}},{{"role":"user","content":"Go on with step {i}."}}"#
            ),
            Self::Responses => format!(
                r#",{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"Step {i} is done."}}]}},{{"type":"message","role":"user","content":[{{"type":"input_text","text":"Go on with step {i}."}}]}}"#
            ),
        }
    }
}

/// A fixture's body and the places the scenarios splice into.
pub struct Conversation {
    pub body: Bytes,
    /// Offset of the closing `]` of `messages` / `input`.
    array_end: usize,
    /// Offset of the first character of the first user message's first text.
    first_user_text: usize,
    stream: bool,
}

impl Conversation {
    pub fn load(fixture: &LargeFixture) -> Result<Self, String> {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conversations").join(fixture.file);
        let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let located =
            locate(&text).ok_or_else(|| format!("{}: no conversation array with a user text", file.display()))?;
        let (array_end, first_user_text) = located;
        let stream = asks_for_stream(text.as_bytes());
        Ok(Self { body: Bytes::from(text), array_end, first_user_text, stream })
    }
}

/// Offsets of the conversation array's closing bracket and of the first user message's text.
fn locate(text: &str) -> Option<(usize, usize)> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow, default)]
        messages: Option<&'a RawValue>,
        #[serde(borrow, default)]
        input: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Item {
        #[serde(default)]
        role: Option<String>,
    }
    let offset = |slice: &str| slice.as_ptr() as usize - text.as_ptr() as usize;
    let top: Top<'_> = serde_json::from_str(text).ok()?;
    let array = top.messages.or(top.input)?.get();
    let array_end = offset(array) + array.rfind(']')?;
    let items: Vec<&RawValue> = serde_json::from_str(array).ok()?;
    let user = items
        .into_iter()
        .find(|item| serde_json::from_str::<Item>(item.get()).is_ok_and(|i| i.role.as_deref() == Some("user")))?;
    let raw = user.get();
    let text_at =
        ["\"text\":\"", "\"content\":\""].iter().filter_map(|key| raw.find(key).map(|at| at + key.len())).min()?;
    Some((array_end, offset(raw) + text_at))
}
