//! [`RawObject`]: an object's fields in their order, each value the bytes the client sent, and
//! the duplicate-key check every object read goes through.

use std::borrow::Cow;
use std::collections::HashSet;

use super::scan::Scanner;
use super::unescape::as_str;
use super::write::push_json_string;

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
