use std::time::Duration;

use super::*;
use crate::work::{Budget, PARSE_BYTES_PER_MESSAGE};

fn messages(n: usize) -> String {
    let each = r#"{"role":"user","content":"a"}"#;
    format!(r#"{{"model":"m","messages":[{}]}}"#, vec![each; n].join(","))
}

/// Parses `body` in `dialect` as a request whose parse may take `bound` bytes: whether it
/// parsed, and whether the request's budget says the bound refused it.
async fn parse_within(dialect: Dialect, body: &str, bound: usize) -> (bool, bool) {
    let budget = Budget::new(Duration::from_secs(60), body.len());
    budget.bound_parse(bound);
    let parsed = budget.scope(async { ParsedRequest::parse(dialect, body.as_bytes()).is_some() }).await;
    (parsed, budget.parse_refused())
}

/// Two messages of 100 one-letter text parts each, in `dialect`'s shape.
fn parts(dialect: Dialect) -> String {
    let (part, field, list) = match dialect {
        Dialect::ChatCompletions => (r#"{"type":"text","text":"a"}"#, "content", "messages"),
        Dialect::AnthropicMessages => (r#"{"type":"text","text":"a"}"#, "content", "messages"),
        Dialect::Responses => (r#"{"type":"input_text","text":"a"}"#, "content", "input"),
        Dialect::Gemini => (r#"{"text":"a"}"#, "parts", "contents"),
    };
    let message = format!(r#"{{"role":"user","{field}":[{}]}}"#, vec![part; 100].join(","));
    format!(r#"{{"model":"m","max_tokens":8,"{list}":[{message},{message}]}}"#)
}

#[tokio::test]
async fn a_parse_counts_the_parts_of_its_messages_against_the_bound() {
    use crate::work::PARSE_BYTES_PER_ITEM;
    // Two messages and 200 parts (198 beyond each message's first): what the parse would hold.
    let weight = 2 * PARSE_BYTES_PER_MESSAGE + 198 * PARSE_BYTES_PER_ITEM;
    for dialect in [Dialect::ChatCompletions, Dialect::AnthropicMessages, Dialect::Responses, Dialect::Gemini] {
        let body = parts(dialect);
        assert_eq!(parse_within(dialect, &body, weight).await, (true, false), "{dialect:?}");
        assert_eq!(parse_within(dialect, &body, weight - 1).await, (false, true), "{dialect:?}");
    }
}

#[tokio::test]
async fn a_parse_stops_at_the_messages_its_memory_bound_allows() {
    let body = messages(100);
    assert_eq!(parse_within(Dialect::ChatCompletions, &body, 100 * PARSE_BYTES_PER_MESSAGE).await, (true, false));
    assert_eq!(parse_within(Dialect::ChatCompletions, &body, 99 * PARSE_BYTES_PER_MESSAGE).await, (false, true));
    // Outside a request nothing bounds it; a body that is not JSON is no refusal.
    assert!(ParsedRequest::parse(Dialect::ChatCompletions, body.as_bytes()).is_some());
    assert_eq!(
        parse_within(Dialect::ChatCompletions, "{\"messages\":[", 100 * PARSE_BYTES_PER_MESSAGE).await,
        (false, false)
    );
}
