//! Google's Gemini API (`generateContent`): `contents` of roles `user` and `model` (and the older
//! `function`), each a list of `parts`; `systemInstruction` as the system prompt; the model is in
//! the path, not the body.
//!
//! Client tool pairs are a model turn's `functionCall` parts answered by `functionResponse` parts
//! in the next user turn, paired as the Gemini API pairs them: by `id` when the call and the
//! response both have one, else by name and order (the k-th remaining response of a name answers
//! the k-th remaining call of that name), so a call without an id answered by a response carrying
//! one of its own (older Gemini CLI releases) is a pair, and so is the reverse. A call without an
//! id goes under an id made of the model turn's ordinal among model turns, which neither repair
//! nor a later turn shifts; its response takes the same id. Pruning and truncation replace a
//! response's `response` object with one of the same shape (`{"output": "<placeholder>"}`, or
//! the one key the response had), keeping `name` and `id`; a response carrying `parts` (inline
//! data) is never shortened. `thoughtSignature` is never read or written: the part that carries it
//! (a call, a thought, a text) keeps its bytes and its place in its turn, which compactor never
//! splits. `executableCode` / `codeExecutionResult` are the provider's (run inside its turn):
//! never repaired or shortened. `inlineData` / `fileData` are counted, never touched.
//!
//! Reading a body into the neutral view (`read`), pairing each response with its call
//! (`pairing`), and rendering the changed contents (`render`).

mod pairing;
mod read;
mod render;

pub(super) use read::{max_output_tokens, parse_message, parse_top};
pub(super) use render::render_contents;

/// The first character of an id compactor made up for a call the model gave none: never one a
/// provider writes, so it never meets a real id.
const MADE_UP: char = '\u{1}';

#[cfg(test)]
mod tests {
    use super::render::replace_response;
    use crate::conversation::Kind;
    use crate::dialect::{Dialect, ParsedRequest};

    #[test]
    fn a_shortened_response_keeps_its_shape_name_and_id() {
        let part = r#"{"functionResponse":{"id":"c1","name":"read_file","response":{"output":"long text"}},"x":1}"#;
        let replaced = replace_response(part, "[cleared]").unwrap();
        assert_eq!(
            replaced,
            r#"{"functionResponse":{"id":"c1","name":"read_file","response":{"output":"[cleared]"}},"x":1}"#
        );
        let error = r#"{"functionResponse":{"name":"run","response":{"error":"boom"}}}"#;
        assert_eq!(
            replace_response(error, "cut").unwrap(),
            r#"{"functionResponse":{"name":"run","response":{"error":"cut"}}}"#
        );
        let structured = r#"{"functionResponse":{"name":"run","response":{"a":1,"b":"x"}}}"#;
        assert_eq!(
            replace_response(structured, "cut").unwrap(),
            r#"{"functionResponse":{"name":"run","response":{"output":"cut"}}}"#
        );
    }

    #[test]
    fn calls_without_ids_pair_with_responses_by_name_and_order() {
        let body = r#"{"contents":[
            {"role":"user","parts":[{"text":"go"}]},
            {"role":"model","parts":[{"functionCall":{"name":"a","args":{}},"thoughtSignature":"s1"},{"functionCall":{"name":"b","args":{}}},{"functionCall":{"name":"a","args":{}}}]},
            {"role":"user","parts":[{"functionResponse":{"name":"b","response":{"output":"B"}}},{"functionResponse":{"name":"a","response":{"output":"A0"}}},{"functionResponse":{"name":"a","response":{"output":"A1"}}}]}
        ]}"#;
        let parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        let pairs: Vec<(String, String)> = parsed
            .conversation
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::ToolResult { call_id: Some(id), text, .. } => Some((id.to_string(), text.to_string())),
                _ => None,
            })
            .collect();
        let call_ids: Vec<String> = parsed
            .conversation
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::ToolCall { id: Some(id), .. } => Some(id.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(pairs[0], (call_ids[1].clone(), "B".to_string()));
        assert_eq!(pairs[1], (call_ids[0].clone(), "A0".to_string()));
        assert_eq!(pairs[2], (call_ids[2].clone(), "A1".to_string()));
    }

    /// The made-up ids of a Gemini body's calls and responses, in order.
    fn made_up_ids(body: &str) -> (Vec<String>, Vec<String>) {
        let parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        let mut calls = Vec::new();
        let mut responses = Vec::new();
        for item in &parsed.conversation.items {
            match &item.kind {
                Kind::ToolCall { id: Some(id), .. } => calls.push(id.to_string()),
                Kind::ToolResult { call_id: Some(id), .. } => responses.push(id.to_string()),
                _ => {}
            }
        }
        (calls, responses)
    }

    #[test]
    fn a_call_without_id_keeps_its_name_when_repair_drops_an_earlier_content() {
        let turn = |n: usize| {
            format!(
                r#"{{"role":"model","parts":[{{"functionCall":{{"name":"run","args":{{"n":{n}}}}}}}]}},
                {{"role":"user","parts":[{{"functionResponse":{{"name":"run","response":{{"output":"out {n}"}}}}}}]}}"#
            )
        };
        // A content answering no call: repair drops it, and the rewritten body goes without it.
        let orphan =
            r#"{"role":"user","parts":[{"functionResponse":{"id":"ghost","name":"run","response":{"output":"x"}}}]}"#;
        let sent = format!(r#"{{"contents":[{},{orphan},{}]}}"#, turn(1), turn(2));
        let repaired = format!(r#"{{"contents":[{},{}]}}"#, turn(1), turn(2));
        let (calls, responses) = made_up_ids(&sent);
        let (calls_after, responses_after) = made_up_ids(&repaired);
        // A pruned id remembered from the first pass names the same call in the rewritten body.
        assert_eq!(calls, calls_after);
        // The orphan's response (the second) pairs by name with the first call, which the first
        // response answers already: repair drops it as a second answer.
        assert_eq!(responses[1], calls[0]);
        assert_eq!(
            responses.iter().enumerate().filter(|(k, _)| *k != 1).map(|(_, id)| id).collect::<Vec<_>>(),
            responses_after.iter().collect::<Vec<_>>()
        );
        assert_eq!(calls, responses_after, "each response names the call it answers");
        // Two identical calls in two model turns keep two names.
        assert_ne!(calls[0], calls[1]);
    }

    /// Each response's text with the name of the call it answers (by that call's `args.path`).
    fn answered(parsed: &ParsedRequest) -> Vec<(String, String)> {
        let calls: Vec<(String, String)> = parsed
            .conversation
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::ToolCall { id: Some(id), arguments, .. } => Some((id.to_string(), arguments.to_string())),
                _ => None,
            })
            .collect();
        parsed
            .conversation
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::ToolResult { call_id: Some(id), text, .. } => {
                    let call = calls.iter().find(|(c, _)| c == id).map_or("no call".to_string(), |(_, a)| a.clone());
                    Some((text.to_string(), call))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_response_with_an_id_of_its_own_answers_its_call_without_one_and_repair_keeps_its_output() {
        // Older Gemini CLI releases: the model gave no id, the CLI answered with one it made up.
        let body = r#"{"contents":[
            {"role":"user","parts":[{"text":"read it"}]},
            {"role":"model","parts":[{"functionCall":{"name":"read_file","args":{"path":"a"}},"thoughtSignature":"s1"}]},
            {"role":"user","parts":[{"functionResponse":{"id":"cli-1","name":"read_file","response":{"output":"PLANTED tool output"}}}]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        crate::rewrite::repair::apply(&mut parsed.conversation);
        assert_eq!(parsed.conversation.inserts, [], "no call is answered \"aborted\"");
        assert!(parsed.render().is_none(), "the body goes as it came");
        assert_eq!(answered(&parsed), [("PLANTED tool output".to_string(), r#"{"path":"a"}"#.to_string())]);
    }

    #[test]
    fn a_response_without_id_answers_its_call_with_one() {
        let body = r#"{"contents":[
            {"role":"model","parts":[{"functionCall":{"id":"m1","name":"run","args":{"path":"a"}}}]},
            {"role":"user","parts":[{"functionResponse":{"name":"run","response":{"output":"PLANTED run output"}}}]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        crate::rewrite::repair::apply(&mut parsed.conversation);
        assert_eq!(parsed.conversation.inserts, [], "no call is answered \"aborted\"");
        assert!(parsed.render().is_none(), "the body goes as it came");
        assert_eq!(answered(&parsed), [("PLANTED run output".to_string(), r#"{"path":"a"}"#.to_string())]);
    }

    #[test]
    fn ids_pair_first_then_name_and_order_pairs_the_rest() {
        // r1 names m1's id: it answers m1 wherever it stands. The responses without an id, or
        // with one no call has, answer the remaining calls of their name in order; a response
        // with an id never answers a call with another id.
        let body = r#"{"contents":[
            {"role":"model","parts":[
                {"functionCall":{"id":"m1","name":"run","args":{"path":"1"}}},
                {"functionCall":{"id":"m2","name":"run","args":{"path":"2"}}},
                {"functionCall":{"name":"run","args":{"path":"3"}}},
                {"functionCall":{"name":"read","args":{"path":"4"}}}
            ]},
            {"role":"user","parts":[
                {"functionResponse":{"name":"run","response":{"output":"r0"}}},
                {"functionResponse":{"id":"cli-x","name":"run","response":{"output":"r3"}}},
                {"functionResponse":{"id":"m1","name":"run","response":{"output":"r1"}}},
                {"functionResponse":{"id":"cli-y","name":"read","response":{"output":"r4"}}}
            ]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        let pairs: Vec<(String, String)> = [("r0", "2"), ("r3", "3"), ("r1", "1"), ("r4", "4")]
            .iter()
            .map(|(text, path)| (text.to_string(), format!(r#"{{"path":"{path}"}}"#)))
            .collect();
        assert_eq!(answered(&parsed), pairs);
        assert_eq!(crate::rewrite::repair::apply(&mut parsed.conversation), 0, "nothing to repair");
    }

    #[test]
    fn a_response_no_call_of_the_turn_takes_is_still_an_orphan() {
        // More responses of a name than calls, and one whose id another call holds: repair moves
        // the last to its call, removes the extra one, and no output goes "aborted".
        let body = r#"{"contents":[
            {"role":"model","parts":[{"functionCall":{"id":"early","name":"run","args":{}}}]},
            {"role":"user","parts":[{"text":"no answer here"}]},
            {"role":"model","parts":[{"functionCall":{"name":"run","args":{}}}]},
            {"role":"user","parts":[
                {"functionResponse":{"name":"run","response":{"output":"late"}}},
                {"functionResponse":{"name":"run","response":{"output":"extra"}}},
                {"functionResponse":{"id":"early","name":"run","response":{"output":"moved"}}}
            ]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        crate::rewrite::repair::apply(&mut parsed.conversation);
        let inserted: Vec<&str> = parsed.conversation.inserts.iter().map(|i| i.text.as_str()).collect();
        assert_eq!(inserted, ["moved"]);
        let rendered = String::from_utf8(parsed.render().unwrap()).unwrap();
        assert!(rendered.contains("late") && !rendered.contains("extra"), "{rendered}");
    }

    #[test]
    fn an_orphan_whose_id_no_call_has_answers_no_call_with_another_id() {
        // The property's shrunk case: two calls without ids never answered, a call with an id,
        // then a content holding only a response whose id is not that call's.
        let body = r#"{"contents":[
            {"role":"model","parts":[{"functionCall":{"name":"run","args":{}}},{"functionCall":{"name":"run","args":{}}}]},
            {"role":"model","parts":[{"functionCall":{"id":"fc_3","name":"run","args":{"path":"3"}}}]},
            {"role":"user","parts":[{"functionResponse":{"id":"ghost","name":"run","response":{"output":"PLANTED ghost"}}}]}
        ]}"#;
        let mut parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        assert_eq!(answered(&parsed), [("PLANTED ghost".to_string(), "no call".to_string())]);
        crate::rewrite::repair::apply(&mut parsed.conversation);
        let inserts = &parsed.conversation.inserts;
        assert_eq!(inserts.len(), 3, "every call is answered");
        assert!(inserts.iter().all(|insert| insert.text == crate::rewrite::repair::ABORTED));
        assert_eq!(inserts[2].call_id, "fc_3");
        let rendered = String::from_utf8(parsed.render().unwrap()).unwrap();
        assert!(!rendered.contains("ghost"), "the orphan is dropped: {rendered}");
        let aborted = r#"{"role":"user","parts":[{"functionResponse":{"id":"fc_3","name":"run","response":{"output":"aborted"}}}]}"#;
        assert!(rendered.contains(aborted), "{rendered}");
    }

    #[test]
    fn responses_with_inline_data_and_provider_code_are_never_shortenable() {
        let body = r#"{"contents":[
            {"role":"model","parts":[{"functionCall":{"id":"c","name":"shot","args":{}}},{"executableCode":{"language":"PYTHON","code":"1"}},{"codeExecutionResult":{"outcome":"OUTCOME_OK","output":"1"}}]},
            {"role":"user","parts":[{"functionResponse":{"id":"c","name":"shot","response":{"output":"png"},"parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]}},{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]}
        ]}"#;
        let parsed = ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap();
        let kinds: Vec<(bool, bool)> =
            parsed.conversation.items.iter().map(|i| (i.repairable, i.shortenable)).collect();
        // call, code (provider's), result (provider's), response with parts, attachment.
        assert_eq!(kinds[1], (false, true));
        assert_eq!(kinds[2], (false, false));
        assert_eq!(kinds[3], (true, false));
        assert!(matches!(parsed.conversation.items[4].kind, Kind::Attachment));
    }

    #[test]
    fn the_nested_max_output_tokens_is_the_output_cap() {
        let cap = |body: &str| ParsedRequest::parse(Dialect::Gemini, body.as_bytes()).unwrap().max_tokens();
        let contents = r#""contents":[{"role":"user","parts":[{"text":"hi"}]}]"#;
        let nested = format!(r#"{{{contents},"generationConfig":{{"temperature":1,"maxOutputTokens":2048}}}}"#);
        assert_eq!(cap(&nested), Some(2048));
        let snake = format!(r#"{{{contents},"generation_config":{{"max_output_tokens":512}}}}"#);
        assert_eq!(cap(&snake), Some(512));
        assert_eq!(cap(&format!(r#"{{{contents},"generationConfig":{{"topK":64}}}}"#)), None);
        // A top-level field is not Gemini's: no cap, and nothing the lower-max_tokens rung rewrites.
        let top = format!(r#"{{{contents},"max_tokens":99}}"#);
        assert_eq!(cap(&top), None);
        let parsed = ParsedRequest::parse(Dialect::Gemini, nested.as_bytes()).unwrap();
        assert_eq!(parsed.max_tokens_field(), None);
    }
}
