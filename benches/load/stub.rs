//! The upstream stub: a fast fake LLM API that reads each request whole and answers in the
//! dialect of its path (Chat Completions, Anthropic Messages, Responses), as JSON, or as SSE
//! when the generator asks for it with [`SSE_HEADER`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// Present: answer with an event stream, pausing this many milliseconds after the first
/// content event. Both proxies forward it as any other header. Set by the generator (from the
/// body's own `stream` flag) so the stub never parses 800 KB bodies to find out.
pub const SSE_HEADER: &str = "x-load-stub-sse-pause-ms";

#[derive(Clone, Copy)]
enum Dialect {
    Chat,
    Messages,
    Responses,
}

impl Dialect {
    fn of(path: &str) -> Self {
        if path.contains("/messages") {
            Self::Messages
        } else if path.contains("/responses") {
            Self::Responses
        } else {
            Self::Chat
        }
    }

    fn json(self) -> &'static str {
        match self {
            Self::Chat => concat!(
                r#"{"id":"chatcmpl-loadbench","object":"chat.completion","created":1700000000,"#,
                r#""model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","#,
                r#""content":"Hello.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"#,
                r#""usage":{"prompt_tokens":42,"completion_tokens":2,"total_tokens":44},"#,
                r#""system_fingerprint":"fp_loadbench"}"#
            ),
            Self::Messages => concat!(
                r#"{"id":"msg_loadbench","type":"message","role":"assistant","model":"claude-sonnet-4-5","#,
                r#""content":[{"type":"text","text":"Hello."}],"stop_reason":"end_turn","stop_sequence":null,"#,
                r#""usage":{"input_tokens":42,"cache_read_input_tokens":0,"output_tokens":2}}"#
            ),
            Self::Responses => concat!(
                r#"{"id":"resp_loadbench","object":"response","created_at":1700000000,"status":"completed","#,
                r#""model":"gpt-5-codex","output":[{"type":"message","id":"msg_loadbench","status":"completed","#,
                r#""role":"assistant","content":[{"type":"output_text","text":"Hello.","annotations":[]}]}],"#,
                r#""usage":{"input_tokens":42,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"#,
                r#""output_tokens_details":{"reasoning_tokens":0},"total_tokens":44}}"#
            ),
        }
    }

    /// The stream up to and including the first content event, and the rest.
    fn sse(self) -> (&'static str, &'static str) {
        match self {
            Self::Chat => (
                concat!(
                    r#"data: {"id":"chatcmpl-loadbench","object":"chat.completion.chunk","created":1700000000,"#,
                    r#""model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"#,
                    r#""finish_reason":null}]}"#,
                    "\n\n"
                ),
                concat!(
                    r#"data: {"id":"chatcmpl-loadbench","object":"chat.completion.chunk","created":1700000000,"#,
                    r#""model":"gpt-4o","choices":[{"index":0,"delta":{"content":"."},"finish_reason":"stop"}]}"#,
                    "\n\n",
                    r#"data: {"id":"chatcmpl-loadbench","object":"chat.completion.chunk","created":1700000000,"#,
                    r#""model":"gpt-4o","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":2,"#,
                    r#""total_tokens":44}}"#,
                    "\n\ndata: [DONE]\n\n"
                ),
            ),
            Self::Messages => (
                concat!(
                    "event: message_start\n",
                    r#"data: {"type":"message_start","message":{"id":"msg_loadbench","type":"message","#,
                    r#""role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"#,
                    r#""usage":{"input_tokens":42,"cache_read_input_tokens":0,"output_tokens":1}}}"#,
                    "\n\nevent: content_block_start\n",
                    r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                    "\n\nevent: content_block_delta\n",
                    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
                    "\n\n"
                ),
                concat!(
                    "event: content_block_delta\n",
                    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"."}}"#,
                    "\n\nevent: content_block_stop\n",
                    r#"data: {"type":"content_block_stop","index":0}"#,
                    "\n\nevent: message_delta\n",
                    r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"#,
                    r#""usage":{"output_tokens":2}}"#,
                    "\n\nevent: message_stop\n",
                    r#"data: {"type":"message_stop"}"#,
                    "\n\n"
                ),
            ),
            Self::Responses => (
                concat!(
                    "event: response.created\n",
                    r#"data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_loadbench","#,
                    r#""object":"response","status":"in_progress","model":"gpt-5-codex","output":[]}}"#,
                    "\n\nevent: response.output_item.added\n",
                    r#"data: {"type":"response.output_item.added","sequence_number":1,"output_index":0,"#,
                    r#""item":{"type":"message","id":"msg_loadbench","status":"in_progress","role":"assistant","#,
                    r#""content":[]}}"#,
                    "\n\nevent: response.output_text.delta\n",
                    r#"data: {"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_loadbench","#,
                    r#""output_index":0,"content_index":0,"delta":"Hello"}"#,
                    "\n\n"
                ),
                concat!(
                    "event: response.output_text.delta\n",
                    r#"data: {"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_loadbench","#,
                    r#""output_index":0,"content_index":0,"delta":"."}"#,
                    "\n\nevent: response.completed\n",
                    r#"data: {"type":"response.completed","sequence_number":4,"response":{"id":"resp_loadbench","#,
                    r#""object":"response","status":"completed","model":"gpt-5-codex","output":[{"type":"message","#,
                    r#""id":"msg_loadbench","status":"completed","role":"assistant","content":[{"type":"output_text","#,
                    r#""text":"Hello.","annotations":[]}]}],"usage":{"input_tokens":42,"#,
                    r#""input_tokens_details":{"cached_tokens":0},"output_tokens":2,"#,
                    r#""output_tokens_details":{"reasoning_tokens":0},"total_tokens":44}}}"#,
                    "\n\n"
                ),
            ),
        }
    }
}

/// Starts the stub on its own OS thread and single-threaded runtime (on the generator's core);
/// it lives until the process exits.
pub fn start() -> Result<SocketAddr, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("upstream-stub".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = tx.send(Err(format!("stub runtime: {error}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                    Ok(listener) => listener,
                    Err(error) => {
                        let _ = tx.send(Err(format!("bind stub: {error}")));
                        return;
                    }
                };
                let _ = tx.send(listener.local_addr().map_err(|e| e.to_string()));
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service_fn(answer))
                            .await;
                    });
                }
            });
        })
        .map_err(|e| format!("spawn stub thread: {e}"))?;
    rx.recv_timeout(Duration::from_secs(10)).map_err(|_| "stub did not start".to_string())?
}

async fn answer(request: Request<Incoming>) -> Result<Response<BoxBody<Bytes, Infallible>>, hyper::Error> {
    let dialect = Dialect::of(request.uri().path());
    let pause =
        request.headers().get(SSE_HEADER).and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).map(Duration::from_millis);
    // Read the whole request body first, as a real upstream would.
    let _ = request.into_body().collect().await?;
    let response = match pause {
        None => {
            let mut response = Response::new(Full::new(Bytes::from_static(dialect.json().as_bytes())).boxed());
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Some(pause) => {
            let (first, rest) = dialect.sse();
            let body = if pause.is_zero() {
                Full::new(Bytes::from(format!("{first}{rest}"))).boxed()
            } else {
                // First event now, the rest after the pause: a proxy that buffers shows it in
                // its time to first byte.
                let chunks = futures_util::stream::unfold(0u8, move |step| async move {
                    let chunk = match step {
                        0 => first,
                        1 => {
                            tokio::time::sleep(pause).await;
                            rest
                        }
                        _ => return None,
                    };
                    Some((Ok::<_, Infallible>(Frame::data(Bytes::from_static(chunk.as_bytes()))), step + 1))
                });
                BodyExt::boxed(StreamBody::new(chunks))
            };
            let mut response = Response::new(body);
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
    };
    Ok(response)
}
