//! Every provider's real overflow error is recognized, with the window and prompt size it names;
//! none of the look-alikes (rate limits, output caps) is.

use compactor::overflow::OverflowDetector;
use serde_json::Value;

fn fixtures() -> Vec<(String, Value)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/overflow");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap();
            (e.file_name().to_string_lossy().into_owned(), serde_json::from_str(&text).unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn body_bytes(fixture: &Value) -> Vec<u8> {
    match &fixture["body"] {
        Value::String(text) => text.clone().into_bytes(),
        other => serde_json::to_vec(other).unwrap(),
    }
}

#[test]
fn every_provider_fixture_is_recognized_and_no_lookalike_is() {
    let detector = OverflowDetector::default();
    let all = fixtures();
    assert!(all.len() >= 30, "expected the provider fixtures, found {}", all.len());
    let mut wrong = Vec::new();
    for (name, fixture) in &all {
        let status = fixture["status"].as_u64().unwrap() as u16;
        let expected = fixture["overflow"].as_bool().unwrap();
        let found = detector.detect(status, &body_bytes(fixture));
        if found.is_some() != expected {
            wrong.push(format!("{name}: expected overflow={expected}, got {found:?}"));
            continue;
        }
        if let Some(found) = found {
            if let Some(limit) = fixture["limit_tokens"].as_u64()
                && found.limit != Some(limit)
            {
                wrong.push(format!("{name}: limit {:?} != {limit}", found.limit));
            }
            if let Some(prompt) = fixture["prompt_tokens"].as_u64()
                && found.prompt_tokens != Some(prompt)
            {
                wrong.push(format!("{name}: prompt {:?} != {prompt}", found.prompt_tokens));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn prompt_plus_max_tokens_errors_say_the_prompt_fits() {
    let detector = OverflowDetector::default();
    let anthropic = br#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 143653 + 64000 > 200000, decrease input length or `max_tokens` and try again"}}"#;
    let found = detector.detect(400, anthropic).unwrap();
    assert_eq!((found.prompt_tokens, found.max_tokens, found.limit), (Some(143653), Some(64000), Some(200000)));
    assert!(found.prompt_fits());
    let too_long = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 205351 tokens > 200000 maximum"}}"#;
    assert!(!detector.detect(400, too_long).unwrap().prompt_fits());
}

#[test]
fn numbers_with_thousands_separators_are_read_whole() {
    // DS4's server writes its counts with separators (quoted in earendil-works/pi#6262).
    let body =
        br#"{"error":{"message":"Prompt has 5,958,968 tokens, but the configured context size is 256,000 tokens"}}"#;
    let found = OverflowDetector::default().detect(400, body).unwrap();
    assert_eq!((found.prompt_tokens, found.limit), (Some(5_958_968), Some(256_000)));
}

#[test]
fn extra_patterns_from_the_configuration_are_honoured() {
    let body = br#"{"error":{"message":"Conversation is way too big for this little model"}}"#;
    assert!(OverflowDetector::default().detect(400, body).is_none());
    let detector = OverflowDetector::new(&["way too big".to_string()]).unwrap();
    assert!(detector.detect(400, body).is_some());
}

#[test]
fn an_error_event_in_a_crlf_stream_split_over_data_lines_is_recognized() {
    let detector = OverflowDetector::default();
    let stream = b": PROCESSING\r\n\r\nevent: error\r\ndata: {\"error\":{\"message\":\r\ndata: \"prompt is too long: 210000 tokens > 200000 maximum\"}}\r\n\r\n";
    let found = detector.detect(200, stream).unwrap();
    assert_eq!((found.prompt_tokens, found.limit), (Some(210000), Some(200000)));
    let gateway =
        b"error: {\"code\":400,\"message\":\"the request exceeds the available context size\",\"n_ctx\":4096}\r\n\r\n";
    assert_eq!(detector.detect(200, gateway).unwrap().limit, Some(4096));
}
