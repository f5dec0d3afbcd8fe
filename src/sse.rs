//! The one reader of server-sent events: bytes in, complete events out. It only observes: callers
//! forward the original bytes untouched and push a copy of what passed through here.
//!
//! It follows the event-stream format (LF, CRLF or CR line endings, `:` comments, `data:` lines
//! joined with "\n", one optional space after the colon) and also reads `error:` lines, which some
//! gateways send instead of `data:` when a stream fails. An event larger than the bound is skipped
//! whole, and reading goes on with the next one.

/// One complete event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field; empty when the event has none.
    pub name: String,
    /// The `data:` lines, joined with "\n".
    pub data: String,
    /// The `id:` field.
    pub id: Option<String>,
    /// The `error:` lines (not standard), joined with "\n".
    pub error: Option<String>,
}

/// Reads events incrementally from chunks split at any byte.
#[derive(Debug)]
pub struct Reader {
    /// The unfinished line carried over from the previous chunk.
    line: Vec<u8>,
    event: Event,
    /// Whether the event has a field worth dispatching.
    has_fields: bool,
    has_data: bool,
    /// Bytes of the current event so far, partial line included.
    size: usize,
    max_event_bytes: usize,
    /// The current event is over the bound: drop it up to the blank line that ends it.
    skipping: bool,
    /// Bytes of the current line were dropped, so its end is not a blank line.
    line_dropped: bool,
    /// The previous chunk ended in CR: a LF that starts the next one belongs to it.
    after_cr: bool,
}

impl Reader {
    /// A reader that skips any event larger than `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            event: Event::default(),
            has_fields: false,
            has_data: false,
            size: 0,
            max_event_bytes,
            skipping: false,
            line_dropped: false,
            after_cr: false,
        }
    }

    /// Reads a chunk; `on_event` sees every event it completes, in order.
    pub fn push(&mut self, chunk: &[u8], mut on_event: impl FnMut(&Event)) {
        let mut rest = chunk;
        if self.after_cr {
            self.after_cr = false;
            if let Some(tail) = rest.strip_prefix(b"\n") {
                rest = tail;
            }
        }
        while let Some(at) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let (part, ending) = (&rest[..at], rest[at]);
            rest = &rest[at + 1..];
            if ending == b'\r' {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            if std::mem::take(&mut self.line_dropped) {
                // The end of a line too long to keep; the event it belongs to is being skipped.
                continue;
            }
            if self.line.is_empty() {
                self.line_ended(part, &mut on_event);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(part);
                self.line_ended(&line, &mut on_event);
                line.clear();
                self.line = line;
            }
        }
        self.hold(rest);
    }

    /// The stream ended: an event that was still open is handed over as it stands (a truncated
    /// stream says most in its last, unfinished event).
    pub fn finish(&mut self, mut on_event: impl FnMut(&Event)) {
        self.line_dropped = false;
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_ended(&line, &mut on_event);
        }
        self.line_ended(b"", &mut on_event);
    }

    /// Keeps the start of an unfinished line, unless that makes the event too large.
    fn hold(&mut self, partial: &[u8]) {
        if partial.is_empty() {
            return;
        }
        if self.skipping {
            self.line_dropped = true;
            return;
        }
        if self.size + self.line.len() + partial.len() > self.max_event_bytes {
            self.skip();
            self.line_dropped = true;
        } else {
            self.line.extend_from_slice(partial);
        }
    }

    fn skip(&mut self) {
        self.skipping = true;
        self.line.clear();
        self.reset_event();
    }

    fn line_ended(&mut self, line: &[u8], on_event: &mut impl FnMut(&Event)) {
        if line.is_empty() {
            if self.skipping {
                // The blank line of a skipped event, or of the line that pushed it over the bound.
                self.skipping = false;
            } else if self.has_fields {
                on_event(&self.event);
            }
            self.reset_event();
            return;
        }
        if self.skipping || line[0] == b':' {
            return;
        }
        self.size += line.len() + 1;
        if self.size > self.max_event_bytes {
            self.skip();
            return;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                if self.has_data {
                    self.event.data.push('\n');
                }
                self.event.data.push_str(&value);
                self.has_data = true;
            }
            b"event" => self.event.name = value.into_owned(),
            b"id" => self.event.id = Some(value.into_owned()),
            b"error" => match &mut self.event.error {
                Some(error) => {
                    error.push('\n');
                    error.push_str(&value);
                }
                None => self.event.error = Some(value.into_owned()),
            },
            // `retry:` and unknown fields say nothing compactor needs.
            _ => return,
        }
        self.has_fields = true;
    }

    fn reset_event(&mut self) {
        self.event.name.clear();
        self.event.data.clear();
        self.event.id = None;
        self.event.error = None;
        self.has_fields = false;
        self.has_data = false;
        self.size = 0;
    }
}

/// Every event of a complete body, the unfinished last one included.
pub fn events(body: &[u8], max_event_bytes: usize) -> Vec<Event> {
    let mut reader = Reader::new(max_event_bytes);
    let mut events = Vec::new();
    reader.push(body, |event| events.push(event.clone()));
    reader.finish(|event| events.push(event.clone()));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(chunks: &[&[u8]]) -> Vec<Event> {
        let mut reader = Reader::new(1024);
        let mut events = Vec::new();
        for chunk in chunks {
            reader.push(chunk, |event| events.push(event.clone()));
        }
        events
    }

    fn data(text: &str) -> Event {
        Event { data: text.into(), ..Event::default() }
    }

    #[test]
    fn lf_crlf_and_cr_line_endings_read_alike() {
        let expected =
            vec![Event { name: "message_start".into(), data: "{\"a\":1}".into(), ..Event::default() }, data("[DONE]")];
        for ending in ["\n", "\r\n", "\r"] {
            let text =
                format!("event: message_start{ending}data: {{\"a\":1}}{ending}{ending}data: [DONE]{ending}{ending}");
            assert_eq!(read(&[text.as_bytes()]), expected, "{ending:?}");
        }
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines_and_one_leading_space_is_dropped() {
        let events = read(&[b"data: {\"a\":\ndata:  1}\ndata\nid: 7\n\n"]);
        assert_eq!(events, vec![Event { data: "{\"a\":\n 1}\n".into(), id: Some("7".into()), ..Event::default() }]);
        let value: serde_json::Value = serde_json::from_str(events[0].data.trim()).unwrap();
        assert_eq!(value["a"], 1);
    }

    #[test]
    fn comments_and_unknown_fields_are_ignored_and_comment_only_blocks_are_no_event() {
        let events = read(&[b": OPENROUTER PROCESSING\n\n:keep-alive\nretry: 3000\nfoo: bar\ndata: x\n\n"]);
        assert_eq!(events, vec![data("x")]);
    }

    #[test]
    fn an_event_split_at_every_byte_reads_the_same() {
        let text = b"event: ping\r\ndata: {\"type\":\"ping\"}\r\n\r\nerror: {\"code\":400}\r\n\r\n";
        let whole = read(&[text]);
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[1].error.as_deref(), Some("{\"code\":400}"));
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(read(&bytes), whole);
        for split in 1..text.len() {
            assert_eq!(read(&[&text[..split], &text[split..]]), whole, "split at {split}");
        }
    }

    #[test]
    fn an_event_over_the_bound_is_skipped_and_the_next_one_is_read() {
        let big = format!("data: {}\n\ndata: small\n\n", "x".repeat(2000));
        assert_eq!(read(&[big.as_bytes()]), vec![data("small")]);
        // Split inside the oversized line, and an oversized event made of many short lines.
        for split in 1..big.len() {
            let (head, tail) = big.as_bytes().split_at(split);
            assert_eq!(read(&[head, tail]), vec![data("small")], "split at {split}");
        }
        let many = format!("{}\ndata: after\n\n", "data: 0123456789\n".repeat(100));
        assert_eq!(read(&[many.as_bytes()]), vec![data("after")]);
    }

    #[test]
    fn an_unfinished_last_event_is_read_at_the_end_of_a_whole_body() {
        assert_eq!(events(b"data: one\n\ndata: two", 1024), vec![data("one"), data("two")]);
        assert_eq!(read(&[b"data: one\n\ndata: two"]), vec![data("one")]);
    }
}
