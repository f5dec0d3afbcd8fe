//! Bedrock's streamed answers, `application/vnd.amazon.eventstream`: binary frames (a prelude, headers, a
//! payload, CRCs), each event's payload `{"bytes":"<base64>"}` wrapping one of Anthropic's stream
//! events as JSON. Read as the frames pass, for the usage they report; the frames themselves go to
//! the client untouched.

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use base64::Engine;
use bytes::BytesMut;

/// Its media type.
pub const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// Reads frames as chunks come, handing each event's inner JSON to a callback.
#[derive(Debug)]
pub struct Reader {
    decoder: MessageFrameDecoder,
    buffer: BytesMut,
    /// The most bytes held for one frame; past it (or on a broken frame) reading stops.
    limit: usize,
    stopped: bool,
}

impl Reader {
    pub fn new(limit: usize) -> Self {
        Self { decoder: MessageFrameDecoder::new(), buffer: BytesMut::new(), limit, stopped: false }
    }

    /// Takes a chunk; `event` gets the JSON text of each complete event in it.
    pub fn push(&mut self, chunk: &[u8], mut event: impl FnMut(&str)) {
        if self.stopped {
            return;
        }
        self.buffer.extend_from_slice(chunk);
        loop {
            match self.decoder.decode_frame(&mut self.buffer) {
                Ok(DecodedFrame::Complete(message)) => {
                    if let Some(text) = inner_json(&message) {
                        event(&text);
                    }
                }
                Ok(DecodedFrame::Incomplete) => break,
                Err(_) => {
                    self.stop();
                    return;
                }
            }
        }
        if self.buffer.len() > self.limit {
            self.stop();
        }
    }

    fn stop(&mut self) {
        self.stopped = true;
        self.buffer = BytesMut::new();
    }
}

/// The JSON an event frame carries: its payload's `bytes`, base64-decoded. Exceptions and
/// frames of another shape carry none that compactor reads.
fn inner_json(message: &Message) -> Option<String> {
    let is_event = message.headers().iter().any(|header| {
        header.name().as_str() == ":message-type"
            && matches!(header.value(), HeaderValue::String(kind) if kind.as_str() == "event")
    });
    if !is_event {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Chunk<'a> {
        #[serde(borrow)]
        bytes: &'a str,
    }
    let chunk: Chunk = serde_json::from_slice(message.payload()).ok()?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(chunk.bytes).ok()?;
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::Header;

    /// One event frame as Bedrock sends it, wrapping `json`.
    pub(crate) fn frame(json: &str) -> Vec<u8> {
        let payload = serde_json::json!({"bytes": base64::engine::general_purpose::STANDARD.encode(json)}).to_string();
        let message = Message::new(payload.into_bytes())
            .add_header(Header::new(":event-type", HeaderValue::String("chunk".into())))
            .add_header(Header::new(":content-type", HeaderValue::String("application/json".into())))
            .add_header(Header::new(":message-type", HeaderValue::String("event".into())));
        let mut out = Vec::new();
        write_message_to(&message, &mut out).unwrap();
        out
    }

    #[test]
    fn events_are_read_across_chunk_boundaries_and_exceptions_are_skipped() {
        let mut stream = frame(r#"{"type":"message_start","message":{"usage":{"input_tokens":12}}}"#);
        let exception = Message::new(&b"{\"message\":\"throttled\"}"[..])
            .add_header(Header::new(":message-type", HeaderValue::String("exception".into())));
        write_message_to(&exception, &mut stream).unwrap();
        stream.extend(frame(r#"{"type":"message_delta","usage":{"output_tokens":7}}"#));
        for size in [1, 7, 64, stream.len()] {
            let mut reader = Reader::new(1 << 20);
            let mut seen = Vec::new();
            for chunk in stream.chunks(size) {
                reader.push(chunk, |json| seen.push(json.to_string()));
            }
            assert_eq!(seen.len(), 2, "chunks of {size}: {seen:?}");
            assert!(seen[0].contains("message_start") && seen[1].contains("\"output_tokens\":7"));
        }
    }

    #[test]
    fn a_broken_frame_stops_the_reader_without_a_panic() {
        let mut reader = Reader::new(1 << 20);
        let mut seen = 0;
        let mut broken = frame(r#"{"type":"ping"}"#);
        broken[9] ^= 0xff;
        reader.push(&broken, |_| seen += 1);
        reader.push(&frame(r#"{"type":"ping"}"#), |_| seen += 1);
        assert_eq!(seen, 0);
    }
}
