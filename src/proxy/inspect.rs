//! Looking at what came back before the client sees it, when compactor may still retry: an error
//! body is read (a bounded prefix: a larger one is passed on as it came); a stream is held only
//! until its first event, which is either content (release it) or an error (an overflow to
//! recover from, or passed on as it came). Nothing is waited for longer than the upstream's own
//! timeouts, and an upstream that breaks while held is an error for the client, never a clean end.

use std::borrow::Cow;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header;
use http::response;
use http_body_util::BodyExt;
use serde_json::value::RawValue;

use crate::error::ProxyError;
use crate::overflow::{Overflow, OverflowDetector};
use crate::route::ApiFamily;
use crate::sse;
use crate::upstream::{PooledBody, Upstreams};

/// Largest error body or held stream prefix compactor reads to look for an overflow.
const MAX_INSPECT_BYTES: usize = 1 << 20;

/// What came back from one attempt.
pub(super) enum Inspected {
    /// Pass it on: the head, the body (possibly with a held prefix already read), and when the
    /// upstream last sent something (the idle timeout counts from there).
    Pass { parts: response::Parts, body: PooledBody, held: Option<Bytes>, last_frame: Instant },
    /// A complete error response, already read.
    Buffered { parts: response::Parts, body: Bytes },
    /// An overflow, already read (the body is kept to return unchanged if recovery fails).
    Overflow { overflow: Overflow, parts: response::Parts, body: Bytes },
}

impl Inspected {
    /// A response passed on without looking.
    pub(super) fn pass(response: http::Response<PooledBody>) -> Self {
        let (parts, body) = response.into_parts();
        Self::Pass { parts, body, held: None, last_frame: Instant::now() }
    }

    pub(super) fn is_error(&self) -> bool {
        match self {
            Self::Buffered { parts, .. } | Self::Pass { parts, .. } => !parts.status.is_success(),
            Self::Overflow { .. } => true,
        }
    }
}

/// Reads an error body or holds a stream until its first event, and classifies what came as the
/// answer to `sent` (what the error merely echoes of it is no overflow).
pub(super) async fn inspect(
    upstreams: &Upstreams,
    detector: &OverflowDetector,
    family: ApiFamily,
    response: http::Response<PooledBody>,
    sent: &[u8],
) -> Result<Inspected, ProxyError> {
    let (parts, body) = response.into_parts();
    if !parts.status.is_success() {
        return read_error(upstreams, detector, family, parts, body, sent).await;
    }
    let streaming =
        parts.headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        return Ok(Inspected::Pass { parts, body, held: None, last_frame: Instant::now() });
    }
    hold_stream(upstreams, detector, family, parts, body, sent).await
}

/// Reads an error body, at most [`MAX_INSPECT_BYTES`] and never waiting longer than the idle
/// timeout for its next chunk. A larger body, or one that stalls, is passed on as it came: the
/// client gets the real status and what the upstream sent (a stalled body is then cut).
async fn read_error(
    upstreams: &Upstreams,
    detector: &OverflowDetector,
    family: ApiFamily,
    parts: response::Parts,
    mut body: PooledBody,
    sent: &[u8],
) -> Result<Inspected, ProxyError> {
    let idle = upstreams.idle_timeout();
    let mut held = BytesMut::new();
    let mut last_frame = Instant::now();
    loop {
        if held.len() > MAX_INSPECT_BYTES {
            return Ok(Inspected::Pass { parts, body, held: Some(held.freeze()), last_frame });
        }
        match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                last_frame = Instant::now();
                if let Ok(data) = frame.into_data() {
                    held.extend_from_slice(&data);
                }
            }
            Ok(None) => break,
            Ok(Some(Err(error))) => return Err(upstreams.cut(family, error)),
            Err(_) => return Ok(Inspected::Pass { parts, body, held: Some(held.freeze()), last_frame }),
        }
    }
    let bytes = held.freeze();
    Ok(match detector.detect_answer(parts.status.as_u16(), &bytes, Some(sent)) {
        Some(overflow) => Inspected::Overflow { overflow, parts, body: bytes },
        None => Inspected::Buffered { parts, body: bytes },
    })
}

/// Holds a stream until its first event that carries content or an error; never longer than the
/// first-byte timeout, never more than [`MAX_INSPECT_BYTES`]. An upstream that breaks off while
/// the stream is held is a 502 for the client: no byte was sent yet, and a clean end would lie.
async fn hold_stream(
    upstreams: &Upstreams,
    detector: &OverflowDetector,
    family: ApiFamily,
    parts: response::Parts,
    mut body: PooledBody,
    sent: &[u8],
) -> Result<Inspected, ProxyError> {
    let deadline = tokio::time::Instant::now() + upstreams.first_byte_timeout();
    let mut held = BytesMut::new();
    let mut first = FirstEvent::new();
    let mut verdict = Verdict::Wait;
    let mut last_frame = Instant::now();
    loop {
        match verdict {
            Verdict::Release => return Ok(Inspected::Pass { parts, body, held: Some(held.freeze()), last_frame }),
            Verdict::Error => {
                return Ok(match detector.detect_answer(200, &held, Some(sent)) {
                    Some(overflow) => Inspected::Overflow { overflow, parts, body: held.freeze() },
                    None => Inspected::Pass { parts, body, held: Some(held.freeze()), last_frame },
                });
            }
            Verdict::Wait if held.len() > MAX_INSPECT_BYTES => {
                return Ok(Inspected::Pass { parts, body, held: Some(held.freeze()), last_frame });
            }
            Verdict::Wait => {}
        }
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                last_frame = Instant::now();
                if let Ok(data) = frame.into_data() {
                    held.extend_from_slice(&data);
                    verdict = first.push(&data);
                }
            }
            Ok(Some(Err(error))) => return Err(upstreams.cut(family, error)),
            // The stream ended while held, with no verdict: pass on what the upstream sent. Past
            // the first-byte timeout it is released, and the idle timeout watches it from here.
            Ok(None) | Err(_) => {
                return Ok(Inspected::Pass { parts, body, held: Some(held.freeze()), last_frame });
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Wait,
    Release,
    Error,
}

/// Watches a held stream's events: comments, pings and Responses' bookkeeping events keep the
/// hold; the first event with content releases it; an error event is inspected.
struct FirstEvent {
    reader: sse::Reader,
    verdict: Verdict,
}

impl FirstEvent {
    fn new() -> Self {
        Self { reader: sse::Reader::new(MAX_INSPECT_BYTES), verdict: Verdict::Wait }
    }

    /// Reads the next chunk of the held stream; the verdict stands once it is not `Wait`.
    fn push(&mut self, chunk: &[u8]) -> Verdict {
        let verdict = &mut self.verdict;
        self.reader.push(chunk, |event| {
            if *verdict == Verdict::Wait {
                *verdict = event_verdict(event);
            }
        });
        self.verdict
    }
}

/// The two fields of a first event the verdict reads; the rest (the answer's first words, a
/// response object) is skipped, never built: this parse is on the way to the client's first byte.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    /// `null` reads as absent.
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

fn event_verdict(event: &sse::Event) -> Verdict {
    if event.error.is_some() {
        return Verdict::Error;
    }
    let (name, data) = (event.name.as_str(), event.data.trim());
    if data.is_empty() && name.is_empty() {
        return Verdict::Wait;
    }
    if name == "error" || name == "response.failed" {
        return Verdict::Error;
    }
    if data == "[DONE]" {
        return Verdict::Release;
    }
    // Only an object is read as one (serde also reads a struct from an array).
    let head = if data.starts_with('{') { serde_json::from_str::<Head>(data).ok() } else { None };
    let (kind, error) = match head {
        Some(head) => {
            let kind = head.kind.and_then(|raw| serde_json::from_str::<Cow<str>>(raw.get()).ok());
            (kind, head.error.is_some())
        }
        // Not an object of that shape (an array, a number, a duplicate key): read whole, as any
        // JSON value, which is rare enough to build.
        None => match serde_json::from_str::<serde_json::Value>(data) {
            Ok(value) => (
                value.get("type").and_then(|t| t.as_str()).map(|t| Cow::Owned(t.to_string())),
                value.get("error").is_some_and(|e| !e.is_null()),
            ),
            Err(_) => return Verdict::Release,
        },
    };
    let kind = kind.as_deref().unwrap_or(name);
    if error || kind == "error" || kind == "response.failed" {
        return Verdict::Error;
    }
    match kind {
        "ping" | "response.created" | "response.in_progress" | "response.queued" => Verdict::Wait,
        _ => Verdict::Release,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_event_verdict(held: &[u8]) -> Verdict {
        FirstEvent::new().push(held)
    }

    #[test]
    fn a_stream_is_held_through_pings_and_bookkeeping_and_released_at_content() {
        assert_eq!(first_event_verdict(b": OPENROUTER PROCESSING\n\n"), Verdict::Wait);
        assert_eq!(first_event_verdict(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"), Verdict::Wait);
        assert_eq!(
            first_event_verdict(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"),
            Verdict::Release
        );
        assert_eq!(
            first_event_verdict(b"event: response.created\ndata: {\"type\":\"response.created\"}\n\n"),
            Verdict::Wait
        );
        assert_eq!(first_event_verdict(b"data: {\"choices\":[{\"delta\":{\"content\""), Verdict::Wait);
    }

    #[test]
    fn error_events_inside_a_200_stream_are_inspected() {
        assert_eq!(first_event_verdict(b"data: {\"error\":{\"message\":\"prompt is too long\"}}\n\n"), Verdict::Error);
        assert_eq!(
            first_event_verdict(b"event: response.failed\ndata: {\"type\":\"response.failed\"}\n\n"),
            Verdict::Error
        );
        assert_eq!(first_event_verdict(b"error: {\"code\":400}\n\n"), Verdict::Error);
    }

    #[test]
    fn the_verdict_reads_type_and_error_whatever_their_shape() {
        // An escaped type is still the type.
        assert_eq!(first_event_verdict(b"data: {\"type\":\"pi\\u006eg\"}\n\n"), Verdict::Wait);
        assert_eq!(first_event_verdict(b"data: {\"type\":\"response.fail\\u0065d\"}\n\n"), Verdict::Error);
        // A null error is no error; any other is one, even beside content.
        assert_eq!(first_event_verdict(b"data: {\"error\":null,\"choices\":[]}\n\n"), Verdict::Release);
        assert_eq!(first_event_verdict(b"data: {\"choices\":[],\"error\":\"overloaded\"}\n\n"), Verdict::Error);
        // A type that is not a string falls back to the event's name.
        assert_eq!(first_event_verdict(b"event: ping\ndata: {\"type\":7}\n\n"), Verdict::Wait);
        // Not an object: the event's name decides; a duplicate key, the last one, as any JSON reader.
        assert_eq!(first_event_verdict(b"event: ping\ndata: [1,2]\n\n"), Verdict::Wait);
        assert_eq!(first_event_verdict(b"data: {\"type\":\"ping\",\"type\":\"error\"}\n\n"), Verdict::Error);
        // Not JSON at all: content the proxy cannot read, released.
        assert_eq!(first_event_verdict(b"event: ping\ndata: {oops\n\n"), Verdict::Release);
    }

    #[test]
    fn the_verdict_stands_at_the_first_event_that_decides_even_across_chunks() {
        let mut first = FirstEvent::new();
        assert_eq!(first.push(b": keep-alive\r\n\r\nevent: ping\r\ndata: {\"type\":"), Verdict::Wait);
        assert_eq!(
            first.push(b"\"ping\"}\r\n\r\ndata: {\"choices\":[]}\r\n\r\ndata: {\"error\":{}}\r\n\r\n"),
            Verdict::Release
        );
        assert_eq!(first.push(b"error: late\n\n"), Verdict::Release);
    }
}
