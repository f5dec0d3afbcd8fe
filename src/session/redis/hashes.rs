//! The session's and the conversation's hashes read back into state, and the check that every
//! stored value is one this version wrote (anything else is another version's, or corrupt).

use super::super::runs::RunLengths;
use crate::session::error::StoreError;
use crate::session::state::{
    Breaker, CompactionRecord, ConversationState, Counters, Learned, STATE_VERSION, SessionState, Usage,
};

/// A Redis hash as field/value pairs.
pub(super) type Hash = Vec<(String, String)>;

/// A number field of a hash; 0 when absent or not a number.
fn number(hash: &Hash, name: &str) -> u64 {
    hash.iter().find(|(field, _)| field == name).and_then(|(_, value)| value.parse().ok()).unwrap_or(0)
}

/// A session's hash, read.
pub(super) fn session_state(hash: &Hash) -> SessionState {
    SessionState {
        version: STATE_VERSION,
        counters: Counters {
            requests: number(hash, "requests"),
            tokens_saved: number(hash, "tokens_saved"),
            compact_requested: number(hash, "compact_requested"),
            learned: Learned {
                model_tag: number(hash, "model_tag"),
                window: number(hash, "learned_window"),
                window_below: number(hash, "window_below"),
                window_at_least: number(hash, "window_at_least"),
                calibration_milli: number(hash, "calibration_milli"),
                output_peak: number(hash, "output_peak"),
                stated: 0,
            },
            prompt_tokens: number(hash, "prompt_tokens"),
            cache_read_tokens: number(hash, "cache_read_tokens"),
            cache_write_tokens: number(hash, "cache_write_tokens"),
            pruned_requests: number(hash, "pruned_requests"),
            compacted_requests: number(hash, "compacted_requests"),
            overflow_requests: number(hash, "overflow_requests"),
        },
        runs: run_lengths(hash),
    }
}

/// A model's histogram of run lengths: fields `run_<bucket>` of its session hash.
pub(super) fn run_lengths(hash: &Hash) -> RunLengths {
    let mut runs = RunLengths::default();
    for (field, value) in hash {
        let bucket = field.strip_prefix("run_").and_then(|b| b.parse::<usize>().ok());
        if let (Some(slot), Ok(count)) = (bucket.and_then(|b| runs.reached.get_mut(b)), value.parse()) {
            *slot = count;
        }
    }
    runs
}

/// A conversation's three keys, read; values of another version are left out.
pub(super) fn conversation_state(hash: &Hash, pruned: Vec<String>, compactions: &[String]) -> ConversationState {
    let usage = hash
        .iter()
        .find(|(field, _)| field == "usage")
        .and_then(|(_, json)| serde_json::from_str::<Versioned<Usage>>(json).ok())
        .and_then(Versioned::current);
    ConversationState {
        pruned: pruned.into_iter().collect(),
        compactions: compactions
            .iter()
            .filter_map(|json| serde_json::from_str::<Versioned<CompactionRecord>>(json).ok())
            .filter_map(Versioned::current)
            .collect(),
        usage,
        breaker: Breaker { failures: number(hash, "breaker_failures"), at_messages: number(hash, "breaker_at") },
        requests: number(hash, "requests"),
        messages: number(hash, "messages"),
        last_request_unix_ms: number(hash, "last_request_ms"),
        run: number(hash, "run"),
        prefilled: u32::try_from(number(hash, "prefilled")).unwrap_or(0),
        answered_unix_ms: number(hash, "answered_ms"),
        idle_ms: number(hash, "idle_ms"),
    }
}

/// A stored JSON value with its schema version; values of another version are ignored.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Versioned<T> {
    v: u32,
    #[serde(flatten)]
    value: T,
}

impl<T: serde::Serialize> Versioned<&T> {
    /// The stored form of `value`; a value that cannot be serialized is an error, never an empty write.
    pub(super) fn json(value: &T) -> Result<String, StoreError> {
        serde_json::to_string(&Versioned { v: STATE_VERSION, value }).map_err(StoreError::Serialize)
    }
}

impl<T> Versioned<T> {
    fn current(self) -> Option<T> {
        (self.v == STATE_VERSION).then_some(self.value)
    }
}

impl<T: serde::de::DeserializeOwned> Versioned<T> {
    /// A stored value of the current schema; anything else is corrupt (or another version's).
    fn read(json: &str, part: &str) -> Result<T, StoreError> {
        let versioned: Versioned<T> =
            serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("{part}: not readable JSON ({e})")))?;
        let version = versioned.v;
        versioned.current().ok_or_else(|| StoreError::Corrupt(format!("{part}: schema version {version}")))
    }
}

/// Fields of the session's and the conversation's hashes that hold numbers (written with HINCRBY
/// and HSET): one that does not parse would make every later increment fail.
const NUMBER_FIELDS: [&str; 22] = [
    "schema",
    "requests",
    "tokens_saved",
    "compact_requested",
    "learned_window",
    "window_below",
    "window_at_least",
    "calibration_milli",
    "output_peak",
    "model_tag",
    "breaker_failures",
    "breaker_at",
    "messages",
    "last_request_ms",
    "answered_ms",
    "idle_ms",
    "prompt_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "pruned_requests",
    "compacted_requests",
    "overflow_requests",
];

/// Whether every value read is one this version of compactor wrote: a session whose hash or
/// values carry another schema version is [`StoreError::OtherVersion`] (left alone); otherwise
/// numbers where it keeps numbers, usage and records that parse. Anything else is corrupt, and
/// the caller ([`Store::load`](crate::session::Store::load)) deletes it so the session heals.
pub(super) fn readable(session_hash: &Hash, hash: &Hash, compactions: &[String]) -> Result<(), StoreError> {
    let schema = session_hash.iter().find(|(field, _)| field == "schema").map(|(_, value)| value.parse::<u32>());
    match schema {
        Some(Ok(version)) if version != STATE_VERSION => return Err(StoreError::OtherVersion(version)),
        _ => {}
    }
    let usage = hash.iter().find(|(field, _)| field == "usage").map(|(_, usage)| usage);
    for json in usage.into_iter().chain(compactions) {
        if let Some(version) = stored_version(json).filter(|version| *version != STATE_VERSION) {
            return Err(StoreError::OtherVersion(version));
        }
    }
    for (field, value) in session_hash.iter().chain(hash) {
        if NUMBER_FIELDS.contains(&field.as_str()) && value.parse::<u64>().is_err() {
            return Err(StoreError::Corrupt(format!("`{field}` is not a number")));
        }
    }
    if let Some((_, usage)) = hash.iter().find(|(field, _)| field == "usage") {
        Versioned::<Usage>::read(usage, "usage")?;
    }
    for record in compactions {
        Versioned::<CompactionRecord>::read(record, "compactions")?;
    }
    Ok(())
}

/// The schema version a stored JSON value says it has, if it says.
fn stored_version(json: &str) -> Option<u32> {
    #[derive(serde::Deserialize)]
    struct Version {
        v: u32,
    }
    serde_json::from_str::<Version>(json).ok().map(|version| version.v)
}

/// Redis refused a command on a key of another type (`WRONGTYPE`, alone or among a pipeline's
/// failures), or answered with a value that is not what compactor stored.
fn is_wrong_type(error: &redis::RedisError) -> bool {
    matches!(error.kind(), redis::ErrorKind::UnexpectedReturnType | redis::ErrorKind::Parse)
        || error.code() == Some("WRONGTYPE")
        || error.clone().into_server_errors().is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "WRONGTYPE"))
}

/// A reply Redis gave but compactor cannot read means the stored value is corrupt, not that the
/// store is down.
pub(super) fn corrupt_if_unreadable(error: StoreError) -> StoreError {
    match error {
        StoreError::Redis(redis_error) if is_wrong_type(&redis_error) => StoreError::Corrupt(redis_error.to_string()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Unserializable;

    impl serde::Serialize for Unserializable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }

    #[test]
    fn a_value_that_cannot_be_serialized_is_an_error_not_an_empty_write() {
        assert!(matches!(Versioned::json(&Unserializable), Err(StoreError::Serialize(_))));
        let usage = Usage { prompt_tokens: 5, ..Usage::default() };
        let stored = Versioned::json(&usage).unwrap();
        let read: Versioned<Usage> = serde_json::from_str(&stored).unwrap();
        assert_eq!(read.current(), Some(usage));
    }
}
