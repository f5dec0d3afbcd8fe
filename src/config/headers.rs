//! `trace.headers`: the `name=value,name=value` form of the exporter's headers, read when the
//! configuration is validated and again when the exporter is built.

use std::collections::HashMap;

use http::{HeaderName, HeaderValue};

/// `name=value,name=value` (the `OTEL_EXPORTER_OTLP_HEADERS` form) as header pairs; an empty text
/// is no headers. The error never quotes a value (it may be a key).
pub fn parse_headers(text: &str) -> Result<HashMap<String, String>, String> {
    let mut headers = HashMap::new();
    for (index, pair) in text.split(',').map(str::trim).filter(|p| !p.is_empty()).enumerate() {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!("entry {} is not `name=value`", index + 1));
        };
        let name = name.trim();
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("entry {} has an invalid header name", index + 1));
        }
        if HeaderValue::from_str(value.trim()).is_err() {
            return Err(format!("entry {} (`{name}`) has an invalid header value", index + 1));
        }
        headers.insert(name.to_string(), value.trim().to_string());
    }
    Ok(headers)
}
