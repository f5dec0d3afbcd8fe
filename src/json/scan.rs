//! [`Scanner`]: reads JSON text one value at a time, the top level of a body and its history
//! array, keeping each value's raw text with what it parsed to; and [`RawObject`], what it reads
//! an object into: its fields in their order, each value the bytes the client sent, with the
//! duplicate-key check every object read goes through. One file: each is built of the other.

use std::borrow::Cow;
use std::collections::HashSet;

use super::measure::{skip_whitespace, string_end, value_end};
use super::unescape::as_str;
use super::write::push_json_string;

/// Parses a raw value as an array of raw elements; like [`RawObject::parse`], `raw` must be
/// valid JSON text.
pub fn as_array(raw: &str) -> Option<Vec<&str>> {
    let mut scan = Scanner::trusted(raw, 0);
    let (_, elements) = scan.array()?;
    scan.at_end().then_some(elements)
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

/// Objects with up to this many fields look for a duplicate key by scanning them: no allocation
/// for the small objects every request is made of. Past it, a hash set keeps the check linear, so
/// a hostile body with 100,000 keys costs milliseconds, not seconds.
pub(super) const SCANNED_FIELDS: usize = 16;

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
