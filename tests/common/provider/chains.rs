//! The simulator's stateful Responses chains, as OpenAI's API keeps them: every answered
//! Responses request stored by its id (its whole input and its output); a request with
//! `previous_response_id` gets that chain prepended; `GET /v1/responses/{id}/input_items` (paged,
//! `order=asc`, `after`) and `GET /v1/responses/{id}` read it back; `truncation: "auto"` drops the
//! oldest items until the prompt fits; `context_management` (`{"type":"compaction"}`) and `POST
//! /v1/responses/compact` replace the chain by one opaque `compaction` item, which only this
//! provider can read back (its `encrypted_content` is the summary, hex-encoded).

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Value, json};

/// One stored response.
#[derive(Clone)]
pub struct Stored {
    /// Every item the response was given, the chain before it included.
    pub input: Vec<Value>,
    pub output: Vec<Value>,
}

/// The stored responses, by id.
#[derive(Default)]
pub struct Chains {
    responses: Mutex<HashMap<String, Stored>>,
    compactions: Mutex<usize>,
}

/// What prefixes this provider's compaction items.
const SEALED: &str = "sim-sealed:";

impl Chains {
    pub fn store(&self, id: &str, stored: Stored) {
        self.responses.lock().unwrap().insert(id.to_string(), stored);
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.responses.lock().unwrap().get(id).cloned()
    }

    /// A compaction item sealing `summary`.
    pub fn seal(&self, summary: &str) -> Value {
        let number = {
            let mut count = self.compactions.lock().unwrap();
            *count += 1;
            *count
        };
        let hex: String = summary.bytes().map(|b| format!("{b:02x}")).collect();
        json!({"type": "compaction", "id": format!("cmp_sim{number:04}"), "encrypted_content": format!("{SEALED}{hex}")})
    }

    pub fn compactions(&self) -> usize {
        *self.compactions.lock().unwrap()
    }
}

/// A compaction item's summary, when this provider sealed it.
pub fn unseal(item: &Value) -> Option<String> {
    let sealed = item["encrypted_content"].as_str()?.strip_prefix(SEALED)?;
    let bytes: Option<Vec<u8>> =
        (0..sealed.len()).step_by(2).map(|i| u8::from_str_radix(sealed.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

/// The request's input as items (a string input is one user message).
pub fn items_of(body: &Value) -> Vec<Value> {
    match &body["input"] {
        Value::String(text) => vec![json!({"role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

/// The body as the model reads it: compaction items opened into the summaries they carry (an
/// unreadable one, another provider's, is refused as OpenAI refuses it).
pub fn as_read(body: &Value) -> Result<Value, String> {
    let mut read = body.clone();
    let mut items = Vec::new();
    for item in items_of(body) {
        if item["type"] == "compaction" {
            let summary = unseal(&item).ok_or("The encrypted content of a compaction item could not be verified.")?;
            items.push(json!({"role": "developer", "content": summary}));
        } else {
            items.push(item);
        }
    }
    read["input"] = Value::Array(items);
    Ok(read)
}

/// One page of a stored response's input items, oldest first, after the item `after` names.
pub fn page(stored: &Stored, after: Option<&str>, limit: usize) -> Value {
    let start = after.and_then(|a| a.strip_prefix("pos_")).and_then(|n| n.parse::<usize>().ok()).map_or(0, |n| n + 1);
    let end = (start + limit).min(stored.input.len());
    let data: Vec<Value> = stored.input.get(start..end).unwrap_or(&[]).to_vec();
    json!({"object": "list", "data": data, "first_id": format!("pos_{start}"),
        "last_id": format!("pos_{}", end.saturating_sub(1)), "has_more": end < stored.input.len()})
}

/// The query's value of `key`.
pub fn query_value<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
}
