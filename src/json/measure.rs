//! Where a JSON value ends: numbers, literals, strings (eight bytes at a time) and nested
//! containers measured without building anything, accepting exactly what serde_json accepts.

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

pub(super) fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
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
pub(super) fn string_end(bytes: &[u8], at: usize, trusted: bool) -> Option<usize> {
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
pub(super) fn next_stop(bytes: &[u8], mut at: usize) -> usize {
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
