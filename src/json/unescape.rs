//! String literals read as text: borrowed when they hold no escape, decoded in one pass when
//! they do, refused exactly where serde_json refuses them.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::measure::next_stop;

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
