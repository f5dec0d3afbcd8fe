//! The SSE reader and the usage tap: whatever the bytes and wherever the chunks split them, they
//! never panic, and reading in chunks gives exactly what reading the whole gives.
#![no_main]

use bytes::Bytes;
use compactor::proxy::usage::{Framing, UsageTap};
use compactor::sse;
use libfuzzer_sys::fuzz_target;

fn tap(framing: Framing, chunks: &[&[u8]]) -> Option<compactor::session::Usage> {
    let mut tap = UsageTap::new(framing);
    for chunk in chunks {
        tap.observe(&Bytes::copy_from_slice(chunk));
    }
    tap.finish()
}

fuzz_target!(|input: &[u8]| {
    let Some((&step, body)) = input.split_first() else { return };
    let step = usize::from(step).max(1);
    let chunks: Vec<&[u8]> = body.chunks(step).collect();
    for framing in [Framing::EventStream, Framing::Json] {
        assert_eq!(tap(framing, &chunks), tap(framing, &[body]), "{framing:?}: split every {step} bytes");
    }
    let bound = 64 + usize::from(step) * 8;
    let mut reader = sse::Reader::new(bound);
    let mut events = Vec::new();
    for chunk in &chunks {
        reader.push(chunk, |event| events.push(event.clone()));
    }
    reader.finish(|event| events.push(event.clone()));
    assert_eq!(events, sse::events(body, bound), "events split every {step} bytes");
});
