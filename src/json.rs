//! Raw JSON objects: keys in their original order, values as the client's original bytes, so
//! compactor re-serializes only what it changes.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// A JSON object as ordered `(key, raw value)` pairs borrowed from the request body. Values are
/// the raw JSON text (`&str`, not `&RawValue`), so a value found in one body can be re-made from
/// another body holding the same bytes at the same offsets by slicing it (see `dialect::prefix`).
#[derive(Debug, Clone, Default)]
pub struct RawObject<'a> {
    pub fields: Vec<(Cow<'a, str>, &'a str)>,
}

impl<'a> RawObject<'a> {
    /// `raw` must be valid JSON text (a value borrowed from a body [`Scanner::new`] has read):
    /// its strings are not checked again.
    pub fn parse(raw: &'a str) -> Option<Self> {
        let mut scan = Scanner::trusted(raw, 0);
        let (_, object) = scan.object()?;
        scan.at_end().then_some(object)
    }

    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// A string field, unescaped.
    pub fn str(&self, key: &str) -> Option<Cow<'a, str>> {
        self.get(key).and_then(as_str)
    }

    /// Writes the object with `replace(key)` deciding each field: `Some(text)` writes `text` as the
    /// value, `None` keeps the original bytes. Fields listed in `drop` are left out.
    pub fn write(&self, out: &mut String, drop: &[&str], mut replace: impl FnMut(&str) -> Option<String>) {
        out.push('{');
        let mut first = true;
        for (key, value) in &self.fields {
            if drop.contains(&key.as_ref()) {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            push_json_string(out, key);
            out.push(':');
            match replace(key) {
                Some(text) => out.push_str(&text),
                None => out.push_str(value),
            }
        }
        out.push('}');
    }
}

/// `bytes` as text when they are UTF-8: the one check a request body gets before it is read
/// (SIMD-accelerated; agent bodies are full of non-ASCII text, where the std check is slow).
pub fn utf8(bytes: &[u8]) -> Result<&str, simdutf8::basic::Utf8Error> {
    simdutf8::basic::from_utf8(bytes)
}

/// Parses a raw value as a string (unescaped), borrowing when there was nothing to unescape.
pub fn as_str(raw: &str) -> Option<Cow<'_, str>> {
    if raw.starts_with('"') && raw.ends_with('"') {
        return unescape(raw);
    }
    // Not a bare literal (whitespace around it, or another value): serde_json decides.
    serde_json::from_str::<CowStr>(raw).ok().map(|s| s.0)
}

/// A string deserialized borrowed when possible (no escapes), owned otherwise.
pub struct CowStr<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for CowStr<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> Visitor<'de> for StrVisitor {
            type Value = CowStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(StrVisitor)
    }
}

/// Parses a raw value as an array of raw elements; like [`RawObject::parse`], `raw` must be
/// valid JSON text.
pub fn as_array(raw: &str) -> Option<Vec<&str>> {
    let mut scan = Scanner::trusted(raw, 0);
    let (_, elements) = scan.array()?;
    scan.at_end().then_some(elements)
}

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

/// Reads JSON text one value at a time from a position: the top level of a body and the elements
/// of its history array, each byte scanned once, every value's text kept with what it parsed to.
pub struct Scanner<'a> {
    text: &'a str,
    at: usize,
    /// The text is known to be valid JSON (read once already): strings are measured, not checked.
    trusted: bool,
}

impl<'a> Scanner<'a> {
    /// A scanner that checks what it reads: anything serde_json would refuse is `None`.
    pub fn new(text: &'a str, at: usize) -> Self {
        Self { text, at, trusted: false }
    }

    /// A scanner over text already read by [`Scanner::new`]: every value of a body is re-read
    /// by the dialect readers (a message, its content array, each block, its text), and only the
    /// first reading needs to check escapes and control characters.
    pub fn trusted(text: &'a str, at: usize) -> Self {
        Self { text, at, trusted: true }
    }

    /// The byte offset reached.
    pub fn at(&self) -> usize {
        self.at
    }

    fn skip_whitespace(&mut self) {
        self.at = skip_whitespace(self.text.as_bytes(), self.at);
    }

    /// The offset of the next value, after whitespace.
    pub fn start(&mut self) -> usize {
        self.skip_whitespace();
        self.at
    }

    /// The text from `start` to the offset reached.
    pub fn since(&self, start: usize) -> Option<&'a str> {
        self.text.get(start..self.at)
    }

    /// Consumes `byte` (after whitespace) when it comes next.
    pub fn eat(&mut self, byte: u8) -> bool {
        self.skip_whitespace();
        let next = self.text.as_bytes().get(self.at) == Some(&byte);
        if next {
            self.at += 1;
        }
        next
    }

    /// The next value's raw text, measured by [`value_end`]: every byte read once, nothing built.
    pub fn raw(&mut self) -> Option<&'a str> {
        self.skip_whitespace();
        let start = self.at;
        let end = value_end(self.text.as_bytes(), start, self.trusted)?;
        self.at = end;
        self.text.get(start..end)
    }

    /// The next value as an array of raw elements, with its text; anything but an array is `None`.
    pub fn array(&mut self) -> Option<(&'a str, Vec<&'a str>)> {
        let start = self.start();
        if !self.eat(b'[') {
            return None;
        }
        let mut elements = Vec::new();
        if !self.eat(b']') {
            loop {
                elements.push(self.raw()?);
                if self.eat(b']') {
                    break;
                }
                if !self.eat(b',') {
                    return None;
                }
            }
        }
        Some((self.since(start)?, elements))
    }

    /// An object key (or any string), borrowed when it has no escapes.
    pub fn key(&mut self) -> Option<Cow<'a, str>> {
        self.skip_whitespace();
        let start = self.at;
        let bytes = self.text.as_bytes();
        if bytes.get(start) != Some(&b'"') {
            return None;
        }
        let end = string_end(bytes, start + 1, self.trusted)?;
        self.at = end;
        let inner = self.text.get(start + 1..end - 1)?;
        if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
            return Some(Cow::Borrowed(inner));
        }
        // Escapes: serde_json unescapes (and refuses a lone surrogate, as it always did).
        as_str(self.text.get(start..end)?)
    }

    /// The next value as an object of raw fields, with its text; a duplicate key, or anything
    /// but an object, is `None` (as it is for serde_json reading a [`RawObject`]).
    pub fn object(&mut self) -> Option<(&'a str, RawObject<'a>)> {
        let start = self.start();
        if !self.eat(b'{') {
            return None;
        }
        let mut fields = UniqueFields::with_capacity(8);
        if !self.eat(b'}') {
            loop {
                let key = self.key()?;
                if !self.eat(b':') {
                    return None;
                }
                let value = self.raw()?;
                fields.push(key, value).ok()?;
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return None;
                }
            }
        }
        Some((self.since(start)?, RawObject { fields: fields.fields }))
    }

    /// Whether only whitespace is left.
    pub fn at_end(&mut self) -> bool {
        self.skip_whitespace();
        self.at == self.text.len()
    }
}

/// The end of a JSON number at `start` (RFC 8259: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`).
fn number_end(bytes: &[u8], start: usize) -> Option<usize> {
    let digits = |at: usize| bytes.get(at..).map_or(0, |rest| rest.iter().take_while(|b| b.is_ascii_digit()).count());
    let mut at = start + usize::from(bytes[start] == b'-');
    match bytes.get(at)? {
        b'0' => at += 1,
        b'1'..=b'9' => at += digits(at),
        _ => return None,
    }
    if bytes.get(at) == Some(&b'.') {
        let fraction = digits(at + 1);
        if fraction == 0 {
            return None;
        }
        at += 1 + fraction;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let exponent = digits(at);
        if exponent == 0 {
            return None;
        }
        at += exponent;
    }
    Some(at)
}

/// The end of the JSON value at `start` (no whitespace before it), or `None` when it is not
/// valid JSON. Accepts and refuses exactly what serde_json does when it skips a value (as for a
/// `RawValue`): any depth, `\\u` escapes checked for four hex digits only, control characters
/// refused in strings; the text is already known to be UTF-8. Agent bodies are mostly strings
/// dense with escapes (a `\\n` every few bytes), so strings are read eight bytes at a time up to
/// the next quote, backslash or control character, with no call per escape.
///
/// `trusted`: the text is known to be valid JSON; strings are only measured ([`trusted_string_end`]).
pub fn value_end(bytes: &[u8], start: usize, trusted: bool) -> Option<usize> {
    // Open containers, innermost last: one bit each (1 = object) while they fit in `bits`,
    // the rest in `deeper`.
    let mut bits: u128 = 0;
    let mut depth = 0usize;
    let mut deeper: Vec<bool> = Vec::new();
    let mut at = start;
    loop {
        // A value.
        let mut opened = None;
        match *bytes.get(at)? {
            b'"' => at = string_end(bytes, at + 1, trusted)?,
            b'{' => opened = Some(true),
            b'[' => opened = Some(false),
            b't' => at = literal_end(bytes, at, b"true")?,
            b'f' => at = literal_end(bytes, at, b"false")?,
            b'n' => at = literal_end(bytes, at, b"null")?,
            b'-' | b'0'..=b'9' => at = number_end(bytes, at)?,
            _ => return None,
        }
        let mut comma;
        if let Some(object) = opened {
            at = skip_whitespace(bytes, at + 1);
            let closer = if object { b'}' } else { b']' };
            if bytes.get(at) == Some(&closer) {
                at += 1;
                if depth == 0 {
                    return Some(at);
                }
                comma = true;
            } else {
                if depth < 128 {
                    bits = (bits << 1) | u128::from(object);
                } else {
                    deeper.push(object);
                }
                depth += 1;
                if object {
                    at = key_end(bytes, at, trusted)?;
                }
                continue;
            }
        } else if depth == 0 {
            return Some(at);
        } else {
            comma = true;
        }
        // After a value inside a container: a comma and the next member, or closers.
        while comma {
            at = skip_whitespace(bytes, at);
            let object = if depth > 128 { deeper.last().copied()? } else { bits & 1 == 1 };
            match *bytes.get(at)? {
                b',' => {
                    at = skip_whitespace(bytes, at + 1);
                    if object {
                        at = key_end(bytes, at, trusted)?;
                    }
                    comma = false;
                }
                b'}' if object => at += 1,
                b']' if !object => at += 1,
                _ => return None,
            }
            if comma {
                depth -= 1;
                if depth >= 128 {
                    deeper.pop();
                } else {
                    bits >>= 1;
                }
                if depth == 0 {
                    return Some(at);
                }
            }
        }
    }
}

/// Past an object key and its colon, to the start of the member's value.
fn key_end(bytes: &[u8], at: usize, trusted: bool) -> Option<usize> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let at = skip_whitespace(bytes, string_end(bytes, at + 1, trusted)?);
    (bytes.get(at) == Some(&b':')).then(|| skip_whitespace(bytes, at + 1))
}

fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|b| matches!(b, b' ' | b'\n' | b'\r' | b'\t')) {
        at += 1;
    }
    at
}

fn literal_end(bytes: &[u8], at: usize, literal: &[u8]) -> Option<usize> {
    bytes.get(at..)?.starts_with(literal).then_some(at + literal.len())
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = ONES << 7;

/// The end (past the closing quote) of the string whose first byte after the opening quote is
/// at `at`; `None` for an unterminated string, a control character or a bad escape.
fn string_end(bytes: &[u8], at: usize, trusted: bool) -> Option<usize> {
    if trusted { trusted_string_end(bytes, at) } else { checked_string_end(bytes, at) }
}

/// The end of a string known to be valid: the first quote after `at` not escaped (not after an
/// odd run of backslashes). One `memchr` per quote, none per escape.
fn trusted_string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let quote = at + memchr::memchr(b'"', bytes.get(at..)?)?;
        let backslashes = bytes.get(at..quote)?.iter().rev().take_while(|b| **b == b'\\').count();
        if backslashes % 2 == 0 {
            return Some(quote + 1);
        }
        at = quote + 1;
    }
}

/// [`string_end`] checking every byte.
fn checked_string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        at = next_stop(bytes, at);
        match *bytes.get(at)? {
            b'"' => return Some(at + 1),
            b'\\' => match *bytes.get(at + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at += 2,
                b'u' if bytes.get(at + 2..at + 6)?.iter().all(u8::is_ascii_hexdigit) => at += 6,
                _ => return None,
            },
            byte if byte < 0x20 => return None,
            _ => at += 1,
        }
    }
}

/// The offset of the next quote, backslash or control character at or after `at` (or, near the
/// end, of a byte within the last eight to look at one by one). Eight bytes at a time: the
/// lowest flagged byte is exact (SWAR; bytes above it may be flagged falsely, and are not used).
fn next_stop(bytes: &[u8], mut at: usize) -> usize {
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let flags = (word.wrapping_sub(ONES * 0x20) & !word)
            | (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash);
        let flags = flags & HIGHS;
        if flags != 0 {
            return at + (flags.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at
}

/// The text of the JSON string literal `raw` (exactly one literal, no whitespace around it),
/// unescaped; `None` when it is not a valid literal, as serde_json would refuse it (lone
/// surrogates included). One pass, escapes decoded inline.
fn unescape(raw: &str) -> Option<Cow<'_, str>> {
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'"') {
        return None;
    }
    let mut out: Option<String> = None;
    let mut run = 1;
    let mut at = 1;
    loop {
        at = next_stop(bytes, at);
        match *bytes.get(at)? {
            b'"' => {
                if at + 1 != bytes.len() {
                    return None;
                }
                return Some(match out {
                    None => Cow::Borrowed(raw.get(1..at)?),
                    Some(mut text) => {
                        text.push_str(raw.get(run..at)?);
                        Cow::Owned(text)
                    }
                });
            }
            b'\\' => {
                let text = out.get_or_insert_with(|| String::with_capacity(bytes.len()));
                text.push_str(raw.get(run..at)?);
                let (decoded, length) = match *bytes.get(at + 1)? {
                    b'"' => ('"', 2),
                    b'\\' => ('\\', 2),
                    b'/' => ('/', 2),
                    b'b' => ('\u{8}', 2),
                    b'f' => ('\u{c}', 2),
                    b'n' => ('\n', 2),
                    b'r' => ('\r', 2),
                    b't' => ('\t', 2),
                    b'u' => {
                        let unit = hex4(bytes.get(at + 2..at + 6)?)?;
                        match unit {
                            0xD800..=0xDBFF => {
                                // A leading surrogate needs its trailing half, escaped right after.
                                if bytes.get(at + 6..at + 8)? != b"\\u" {
                                    return None;
                                }
                                let low = hex4(bytes.get(at + 8..at + 12)?)?;
                                if !(0xDC00..=0xDFFF).contains(&low) {
                                    return None;
                                }
                                let code = 0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                                (char::from_u32(code)?, 12)
                            }
                            0xDC00..=0xDFFF => return None,
                            _ => (char::from_u32(u32::from(unit))?, 6),
                        }
                    }
                    _ => return None,
                };
                text.push(decoded);
                at += length;
                run = at;
            }
            byte if byte < 0x20 => return None,
            _ => at += 1,
        }
    }
}

/// Four hex digits as a UTF-16 code unit.
fn hex4(digits: &[u8]) -> Option<u16> {
    digits.iter().try_fold(0u16, |unit, digit| Some(unit << 4 | char::from(*digit).to_digit(16)? as u16))
}

/// Objects with up to this many fields look for a duplicate key by scanning them: no allocation
/// for the small objects every request is made of. Past it, a hash set keeps the check linear, so
/// a hostile body with 100,000 keys costs milliseconds, not seconds.
const SCANNED_FIELDS: usize = 16;

/// The fields of an object being read. A duplicate key makes the object unreadable (and the
/// request is forwarded as it came): compactor and the provider could each take a different value.
pub(crate) struct UniqueFields<'de> {
    pub(crate) fields: Vec<(Cow<'de, str>, &'de str)>,
    /// Every key so far, once the object has outgrown [`SCANNED_FIELDS`]. The std hasher is
    /// randomly keyed, so a client cannot pick keys that collide.
    keys: Option<HashSet<Cow<'de, str>>>,
}

impl<'de> UniqueFields<'de> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self { fields: Vec::with_capacity(capacity), keys: None }
    }

    /// Appends the field, or hands its key back when the object already has it.
    pub(crate) fn push(&mut self, key: Cow<'de, str>, value: &'de str) -> Result<(), Cow<'de, str>> {
        if let Some(keys) = &mut self.keys {
            // A borrowed key clones as a pointer; only keys with escapes own (and copy) their text.
            if !keys.insert(key.clone()) {
                return Err(key);
            }
        } else if self.fields.iter().any(|(k, _)| *k == key) {
            return Err(key);
        } else if self.fields.len() >= SCANNED_FIELDS {
            let mut keys = HashSet::with_capacity(2 * self.fields.len());
            keys.extend(self.fields.iter().map(|(k, _)| k.clone()));
            keys.insert(key.clone());
            self.keys = Some(keys);
        }
        self.fields.push((key, value));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    #[test]
    fn rewriting_one_field_keeps_every_other_byte_and_the_key_order() {
        let body = r#"{"z":1.00000000000000000001,"content":"old","a":{"b" : [1, 2]}}"#;
        let raw: &RawValue = serde_json::from_str(body).unwrap();
        let object = RawObject::parse(raw.get()).unwrap();
        let mut out = String::new();
        object.write(&mut out, &[], |key| (key == "content").then(|| json_string("new")));
        assert_eq!(out, r#"{"z":1.00000000000000000001,"content":"new","a":{"b" : [1, 2]}}"#);
    }

    #[test]
    fn escaped_strings_are_unescaped() {
        let raw: &RawValue = serde_json::from_str(r#"{"t":"line\nnext \u00e9"}"#).unwrap();
        let object = RawObject::parse(raw.get()).unwrap();
        assert_eq!(object.str("t").unwrap(), "line\nnext é");
    }

    #[test]
    fn a_nested_value_is_replaced_in_place() {
        let body = r#"{"type":"x","content":{"stdout" : "long\nlog","n":1.50}}"#;
        let raw: &RawValue = serde_json::from_str(body).unwrap();
        let content = RawObject::parse(RawObject::parse(raw.get()).unwrap().get("content").unwrap()).unwrap();
        let out = replace_within(raw.get(), content.get("stdout").unwrap(), &json_string("short")).unwrap();
        assert_eq!(out, r#"{"type":"x","content":{"stdout" : "short","n":1.50}}"#);
        let elsewhere: &RawValue = serde_json::from_str(r#""other""#).unwrap();
        assert_eq!(replace_within(raw.get(), elsewhere.get(), "\"\""), None);
    }

    #[test]
    fn span_finds_a_borrowed_value_in_its_body() {
        let body = br#"{"messages": [1,2], "x": 3}"#;
        let object = RawObject::parse(std::str::from_utf8(body).unwrap()).unwrap();
        let span = span_in(body, object.get("messages").unwrap()).unwrap();
        assert_eq!(&body[span], b"[1,2]");
    }

    fn object_with_keys(keys: &[String]) -> String {
        let fields: Vec<String> = keys.iter().enumerate().map(|(i, k)| format!("\"{k}\":{i}")).collect();
        format!("{{{}}}", fields.join(","))
    }

    #[test]
    fn a_duplicate_key_is_refused_in_small_and_large_objects_wherever_it_stands() {
        for size in [2, SCANNED_FIELDS - 1, SCANNED_FIELDS, SCANNED_FIELDS + 1, 1000] {
            let keys: Vec<String> = (0..size).map(|i| format!("k{i}")).collect();
            assert!(scanned_object(&object_with_keys(&keys)).is_some(), "{size} distinct keys");
            for (first, second) in [(0, size - 1), (size - 1, size), (size / 2, size + 3)] {
                let mut with_duplicate = keys.clone();
                with_duplicate.insert(second.min(with_duplicate.len()), keys[first].clone());
                let body = object_with_keys(&with_duplicate);
                assert!(scanned_object(&body).is_none(), "{size} keys, k{first} twice");
            }
        }
    }

    #[test]
    fn keys_that_differ_only_in_escapes_are_duplicates() {
        let mut keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        keys.push("\\u006b3".into());
        assert!(scanned_object(&object_with_keys(&keys)).is_none());
        let small = r#"{"a":1,"\u0061":2}"#;
        assert!(scanned_object(small).is_none());
    }

    #[test]
    fn a_large_object_keeps_its_keys_in_order() {
        let keys: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
        let body = object_with_keys(&keys);
        let object = scanned_object(&body).unwrap();
        let read: Vec<&str> = object.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(read, keys.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(RawObject::parse(&body).unwrap().get("k499").unwrap(), "499");
    }

    /// serde_json's reading of an object of raw fields, duplicates refused: the reference the
    /// scanner is compared with (production reads objects with [`Scanner`] only).
    fn serde_object(text: &str) -> Option<Vec<(String, String)>> {
        struct Fields(Vec<(String, String)>);
        impl<'de> Deserialize<'de> for Fields {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct ObjectVisitor;
                impl<'de> Visitor<'de> for ObjectVisitor {
                    type Value = Fields;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("a JSON object")
                    }
                    fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Fields, M::Error> {
                        let mut fields: Vec<(String, String)> = Vec::new();
                        while let Some(CowStr(key)) = map.next_key::<CowStr<'de>>()? {
                            let value: &'de RawValue = map.next_value()?;
                            if fields.iter().any(|(k, _)| *k == key) {
                                return Err(serde::de::Error::custom("duplicate key"));
                            }
                            fields.push((key.into_owned(), value.get().to_string()));
                        }
                        Ok(Fields(fields))
                    }
                }
                deserializer.deserialize_map(ObjectVisitor)
            }
        }
        serde_json::from_str::<Fields>(text).ok().map(|fields| fields.0)
    }

    /// A body's reading of an object: checked, then nothing but whitespace.
    fn scanned_object(text: &str) -> Option<Vec<(String, String)>> {
        let mut scan = Scanner::new(text, 0);
        let (_, object) = scan.object()?;
        scan.at_end().then(|| object.fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    /// `base` with each `(offset, text)` inserted in turn (offsets wrapped to the text's length and
    /// moved back to a character boundary): the property tests' mutated JSON.
    fn mutated(base: &str, edits: &[(usize, &str)]) -> String {
        let mut text = base.to_string();
        for (at, insert) in edits {
            let mut at = at % (text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            text.insert_str(at, insert);
        }
        text
    }

    /// serde_json's measure of a whole text as one value (whitespace around it allowed).
    fn serde_value(text: &str) -> Option<&str> {
        serde_json::from_str::<&RawValue>(text).ok().map(RawValue::get)
    }

    fn scanned_value(text: &str) -> Option<&str> {
        let mut scan = Scanner::new(text, 0);
        let value = scan.raw()?;
        scan.at_end().then_some(value)
    }

    #[test]
    fn values_nested_past_the_bit_stack_are_measured_as_serde_json_measures_them() {
        for depth in [1, 127, 128, 129, 300] {
            let nested =
                |open: &str, inner: &str, close: &str| format!("{}{inner}{}", open.repeat(depth), close.repeat(depth));
            for text in [
                nested("[", "1", "]"),
                nested("{\"k\":[", "\"v\\n\"", "]}"),
                nested("[{\"a\" : ", "{}", "} ]"),
                nested("[", "[]", "]").replacen(']', "}", 1),
                nested("[", "1", "]") + "]",
                nested("[", "1", "],"),
                nested("{\"k\":", "null", "}").replacen(':', " ", depth.min(2)),
            ] {
                assert_eq!(scanned_value(&text), serde_value(&text), "depth {depth}: {text:.80}");
            }
        }
    }

    #[test]
    fn strings_dense_with_escapes_are_measured_wherever_an_escape_falls() {
        // Every offset of an escape, control character or quote against the eight-byte stride.
        for pad in 0..17 {
            let pad = "a".repeat(pad);
            for inner in
                ["\\n", "\\u00e9", "\\uD83D\\uDE00", "\\\"", "\\\\", "\\x", "\\u12g4", "\u{1}", "\u{1f}", "é€", "\\"]
            {
                for text in [format!("\"{pad}{inner}{pad}\""), format!("[\"{pad}{inner}\",\"{inner}{pad}\"]")] {
                    let serde = serde_value(&text);
                    assert_eq!(scanned_value(&text), serde, "{text}");
                    if serde.is_some() {
                        assert_eq!(value_end(text.as_bytes(), 0, true), Some(text.len()), "trusted: {text}");
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

        /// Any text is escaped exactly as serde_json escapes it.
        #[test]
        fn texts_are_escaped_exactly_as_serde_json_does(text in "(\\PC|[\u{0}-\u{1f}\u{7f}\"\\\\])*") {
            let mut out = String::from("prefix");
            push_json_string(&mut out, &text);
            proptest::prop_assert_eq!(&out[6..], serde_json::to_string(&text).unwrap());
        }

        /// Any string literal, valid or not, is unescaped exactly as serde_json unescapes it:
        /// the same text, or refused alike (bad escapes, control characters, lone surrogates).
        #[test]
        fn strings_are_unescaped_exactly_as_serde_json_does(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "a", "é", "€", "😀", " ", "\\n", "\\t", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\r", "\\u0041",
                "\\u00e9", "\\uD83D", "\\uDE00", "\\uD83D\\uDE00", "\\udbff\\udfff", "\\u12", "\\uZZZZ", "\\x",
                "\\", "\"", "\u{1}", "\u{1f}", "\u{7f}", "0123456789",
            ]), 0..12),
        ) {
            let text = format!("\"{}\"", parts.concat());
            let serde = serde_json::from_str::<CowStr>(&text).ok().map(|s| s.0.into_owned());
            proptest::prop_assert_eq!(as_str(&text).map(Cow::into_owned), serde, "{}", text);
        }

        /// Any value, valid or not, is measured exactly as serde_json measures a raw value: the
        /// same accept or refuse, the same text; arrays give the same elements.
        #[test]
        fn the_scanner_measures_values_exactly_as_serde_json_does(
            base in proptest::sample::select(vec![
                r#"{"a":[1,{"b":"c\nd","e":[[],{}]}],"f":"\u00e9\t\"x\"","g":-1.5e3}"#,
                r#"[ {"role" : "user", "content" : [ {"type":"text","text":"line\nline\n\\ end"} ] } , null , true ]"#,
                r#""just a string with \/ and \b\f\r and é""#,
                r#"[[[[["deep"]]]],{"x":{"y":{"z":0}}}]"#,
                "-0.0e+1",
            ]),
            edits in proptest::collection::vec((0usize..200, proptest::sample::select(vec![
                "", "\"", "\\", "\\u", "\\uABCD", "\\u12", "\\n", "-", ".", "e", "0", "01", " ", "\t", ",", ":",
                "{", "}", "[", "]", "[]", "{}", "tru", "null", "x", "\u{1}", "\u{1f}", "\u{7f}", "é", "\"a\":", "\"k\":1,",
            ])), 0..5),
        ) {
            let text = mutated(base, &edits);
            proptest::prop_assert_eq!(scanned_value(&text), serde_value(&text), "{}", text);
            let serde_array = serde_json::from_str::<Vec<&RawValue>>(&text)
                .ok()
                .map(|values| values.into_iter().map(RawValue::get).collect::<Vec<_>>());
            let mut scan = Scanner::new(&text, 0);
            let checked_array = scan.array().filter(|_| scan.at_end()).map(|(_, elements)| elements);
            proptest::prop_assert_eq!(checked_array, serde_array.clone(), "{}", text);
            if serde_array.is_some() {
                proptest::prop_assert_eq!(as_array(&text), serde_array, "{}", text);
            }
            if let Some(value) = serde_value(&text) {
                proptest::prop_assert_eq!(value_end(value.as_bytes(), 0, true), Some(value.len()), "{}", text);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// The scanner's fast path (plain strings, literals, numbers) accepts exactly what
        /// serde_json accepts, and reads the same keys and raw values, valid input or not.
        #[test]
        fn the_scanner_reads_objects_exactly_as_serde_json_does(
            base in proptest::sample::select(vec![
                r#"{"a":1,"b":-0.5e+3,"c":"x","d":true,"e":null,"f":false,"g":[1,{"h":"i"}],"j":{"k":"\\u00e9\\n"}}"#,
                r#"{ "model" : "gpt-4o" , "n" : 10 , "t" : 0.25 , "s" : "" , "u" : "a\\"b" }"#,
                r#"{"n":-0,"m":1E9,"o":0.0e-0,"p":123456789012345678901234567890}"#,
                "{}",
            ]),
            edits in proptest::collection::vec((0usize..200, proptest::sample::select(vec![
                "", "\"", "\\", "-", "+", ".", "e", "E", "0", "01", "1", " ", "\n", ",", ":", "{", "}", "[", "]",
                "tru", "nul", "x", "\u{1}", "\u{7f}", "é", "\"a\"", "\"a\":", "\\u", "\\\"",
            ])), 0..4),
        ) {
            let text = mutated(base, &edits);
            let serde = serde_object(&text);
            proptest::prop_assert_eq!(scanned_object(&text), serde.clone(), "{}", text);
            // Valid text re-read without checks (as the dialect readers do) reads the same.
            if serde.is_some() {
                let trusted = RawObject::parse(&text)
                    .map(|o| o.fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>());
                proptest::prop_assert_eq!(trusted, serde, "{}", text);
            }
        }
    }
}
