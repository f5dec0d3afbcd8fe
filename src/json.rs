//! Raw JSON objects: keys in their original order, values as the client's original bytes, so
//! compactor re-serializes only what it changes.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON object as ordered `(key, raw value)` pairs borrowed from the request body. Values are
/// the raw JSON text (`&str`, not `&RawValue`), so a value found in one body can be re-made from
/// another body holding the same bytes at the same offsets by slicing it (see `dialect::prefix`).
#[derive(Debug, Clone, Default)]
pub struct RawObject<'a> {
    pub fields: Vec<(Cow<'a, str>, &'a str)>,
}

impl<'a> RawObject<'a> {
    /// `raw` must be JSON text (a value borrowed from a parsed body).
    pub fn parse(raw: &'a str) -> Option<Self> {
        let mut scan = Scanner::new(raw, 0);
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

/// Parses a raw value as an array of raw elements.
pub fn as_array(raw: &str) -> Option<Vec<&str>> {
    serde_json::from_str::<Vec<&RawValue>>(raw).ok().map(|values| values.into_iter().map(RawValue::get).collect())
}

/// Appends `text` as a JSON string literal.
pub fn push_json_string(out: &mut String, text: &str) {
    // serde_json's escaping, without an intermediate allocation per call site.
    match serde_json::to_string(text) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

/// Writes a JSON array from already-serialized elements.
pub struct ArrayWriter {
    out: String,
    empty: bool,
}

impl ArrayWriter {
    pub fn with_capacity(capacity: usize) -> Self {
        let mut out = String::with_capacity(capacity);
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

impl<'de: 'a, 'a> Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = RawObject<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut fields = UniqueFields::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(CowStr(key)) = map.next_key::<CowStr<'de>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    if let Err(key) = fields.push(key, value.get()) {
                        return Err(de::Error::custom(format!("duplicate key `{key}`")));
                    }
                }
                Ok(RawObject { fields: fields.fields })
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// Reads JSON text one value at a time from a position: the top level of a body and the elements
/// of its history array, each byte scanned once, every value's text kept with what it parsed to.
pub struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(text: &'a str, at: usize) -> Self {
        Self { text, at }
    }

    /// The byte offset reached.
    pub fn at(&self) -> usize {
        self.at
    }

    fn skip_whitespace(&mut self) {
        let bytes = self.text.as_bytes();
        while bytes.get(self.at).is_some_and(|b| matches!(b, b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
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

    /// The next value (after whitespace) read as `T`, with its JSON text.
    pub fn value<T: Deserialize<'a>>(&mut self) -> Option<(&'a str, T)> {
        self.skip_whitespace();
        let start = self.at;
        let mut values = serde_json::Deserializer::from_str(self.text.get(start..)?).into_iter::<T>();
        let value = values.next()?.ok()?;
        self.at = start + values.byte_offset();
        Some((self.text.get(start..self.at)?, value))
    }

    /// The next value's raw text. Strings without escapes, literals and numbers, what most values
    /// of a request are, are measured here; anything else (objects, arrays, escapes, and whatever
    /// is not plainly valid) is left to serde_json, which has the last word on what is JSON.
    pub fn raw(&mut self) -> Option<&'a str> {
        self.skip_whitespace();
        let start = self.at;
        match self.plain_scalar_end(start) {
            Some(end) => {
                self.at = end;
                self.text.get(start..end)
            }
            None => self.value::<&'a RawValue>().map(|(raw, _)| raw),
        }
    }

    /// An object key (or any string), borrowed when it has no escapes.
    pub fn key(&mut self) -> Option<Cow<'a, str>> {
        self.skip_whitespace();
        let start = self.at;
        if let Some(end) = self.plain_string_end(start) {
            self.at = end;
            return self.text.get(start + 1..end - 1).map(Cow::Borrowed);
        }
        self.value::<CowStr<'a>>().map(|(_, CowStr(key))| key)
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

    /// The end (past the closing quote) of a string at `start` with no escape and no control
    /// character; `None` for any other string, or no string.
    fn plain_string_end(&self, start: usize) -> Option<usize> {
        let bytes = self.text.as_bytes();
        if bytes.get(start) != Some(&b'"') {
            return None;
        }
        let rest = bytes.get(start + 1..)?;
        let close = memchr::memchr2(b'"', b'\\', rest)?;
        (rest[close] == b'"' && !rest[..close].iter().any(|b| *b < 0x20)).then_some(start + close + 2)
    }

    /// The end of a plain string, `true`, `false`, `null` or a number at `start`, when the value
    /// is certainly valid JSON; `None` leaves the value to serde_json.
    fn plain_scalar_end(&self, start: usize) -> Option<usize> {
        let bytes = self.text.as_bytes();
        match bytes.get(start)? {
            b'"' => self.plain_string_end(start),
            b't' => bytes[start..].starts_with(b"true").then_some(start + 4),
            b'f' => bytes[start..].starts_with(b"false").then_some(start + 5),
            b'n' => bytes[start..].starts_with(b"null").then_some(start + 4),
            b'-' | b'0'..=b'9' => number_end(bytes, start),
            _ => None,
        }
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
        let object: RawObject = serde_json::from_slice(body).unwrap();
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
            assert!(serde_json::from_str::<RawObject>(&object_with_keys(&keys)).is_ok(), "{size} distinct keys");
            for (first, second) in [(0, size - 1), (size - 1, size), (size / 2, size + 3)] {
                let mut with_duplicate = keys.clone();
                with_duplicate.insert(second.min(with_duplicate.len()), keys[first].clone());
                let body = object_with_keys(&with_duplicate);
                assert!(serde_json::from_str::<RawObject>(&body).is_err(), "{size} keys, k{first} twice");
            }
        }
    }

    #[test]
    fn keys_that_differ_only_in_escapes_are_duplicates() {
        let mut keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        keys.push("\\u006b3".into());
        assert!(serde_json::from_str::<RawObject>(&object_with_keys(&keys)).is_err());
        let small = r#"{"a":1,"\u0061":2}"#;
        assert!(serde_json::from_str::<RawObject>(small).is_err());
    }

    #[test]
    fn a_large_object_keeps_its_keys_in_order() {
        let keys: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
        let body = object_with_keys(&keys);
        let object: RawObject = serde_json::from_str(&body).unwrap();
        let read: Vec<&str> = object.fields.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(read, keys.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(object.get("k499").unwrap(), "499");
    }

    /// serde_json's reading of an object of raw fields: what [`RawObject::parse`] replaced.
    fn serde_object(text: &str) -> Option<Vec<(String, String)>> {
        let object: RawObject = serde_json::from_str(text).ok()?;
        Some(object.fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    fn scanned_object(text: &str) -> Option<Vec<(String, String)>> {
        let object = RawObject::parse(text)?;
        Some(object.fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
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
            let mut text = base.to_string();
            for (at, insert) in edits {
                let mut at = at % (text.len() + 1);
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text.insert_str(at, insert);
            }
            proptest::prop_assert_eq!(scanned_object(&text), serde_object(&text), "{}", text);
        }
    }
}
