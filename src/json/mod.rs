//! Raw JSON objects: keys in their original order, values as the client's original bytes, so
//! compactor re-serializes only what it changes.
//!
//! One module per job: where a value ends (`measure`), reading values one at a time and an
//! object's fields with their duplicate check (`scan`), string literals read as text
//! (`unescape`), and writing or splicing JSON (`write`).

mod measure;
mod scan;
mod unescape;
mod write;

pub use measure::value_end;
pub use scan::RawObject;
pub(crate) use scan::UniqueFields;
pub use scan::{Scanner, as_array};
pub use unescape::{CowStr, as_str};
pub use write::{ArrayWriter, json_string, push_json_string, replace_within, span_in};

/// `bytes` as text when they are UTF-8: the one check a request body gets before it is read
/// (SIMD-accelerated; agent bodies are full of non-ASCII text, where the std check is slow).
pub fn utf8(bytes: &[u8]) -> Result<&str, simdutf8::basic::Utf8Error> {
    simdutf8::basic::from_utf8(bytes)
}

#[cfg(test)]
mod tests;
