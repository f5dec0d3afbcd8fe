//! Writing JSON: string literals escaped as serde_json escapes them, arrays from elements
//! already serialized, and a new value spliced into the old bytes around it.

/// Appends `text` as a JSON string literal.
/// serde_json's escaping, written straight into `out` (the rewritten tool outputs run to tens of
/// kilobytes; serde_json would build each in a string of its own first).
pub fn push_json_string(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    let bytes = text.as_bytes();
    let mut run = 0;
    for (at, byte) in bytes.iter().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..0x20 => "",
            _ => continue,
        };
        // `at` is an ASCII byte: a char boundary.
        out.push_str(&text[run..at]);
        if escape.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(crate::hex::DIGITS[usize::from(byte >> 4)]));
            out.push(char::from(crate::hex::DIGITS[usize::from(byte & 0xf)]));
        } else {
            out.push_str(escape);
        }
        run = at + 1;
    }
    out.push_str(&text[run..]);
    out.push('"');
}

/// Writes a JSON array from already-serialized elements.
pub struct ArrayWriter {
    out: String,
    empty: bool,
}

impl ArrayWriter {
    pub fn continuing(mut out: String) -> Self {
        out.push('[');
        Self { out, empty: true }
    }

    /// Appends one element, given as JSON text.
    pub fn push(&mut self, element: &str) {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        self.out.push_str(element);
    }

    pub fn finish(mut self) -> String {
        self.out.push(']');
        self.out
    }
}

/// `text` as a JSON string literal.
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    push_json_string(&mut out, text);
    out
}

/// The byte range `raw` occupies inside `body`, when it was borrowed from it.
pub fn span_in(body: &[u8], raw: &str) -> Option<std::ops::Range<usize>> {
    let start = (raw.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start + raw.len();
    (end <= body.len()).then_some(start..end)
}

/// `outer` with the value `inner` (a value borrowed from inside it) replaced by `replacement`; every
/// other byte of `outer` is kept. `None` when `inner` does not lie inside `outer`.
pub fn replace_within(outer: &str, inner: &str, replacement: &str) -> Option<String> {
    let span = span_in(outer.as_bytes(), inner)?;
    let mut out = String::with_capacity(outer.len() - span.len() + replacement.len());
    out.push_str(&outer[..span.start]);
    out.push_str(replacement);
    out.push_str(&outer[span.end..]);
    Some(out)
}
