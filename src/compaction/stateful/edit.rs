//! The body edits of a stateful request's recovery, each byte the client sent kept where the edit
//! does not reach: a field set (`context_management`, `truncation`), and the stateless body a
//! rebuilt chain goes as (no `previous_response_id`, the chain's items before the client's).

use bytes::Bytes;

use crate::json::{self, ArrayWriter, RawObject};

/// The top-level object of a body compactor could parse.
fn top(body: &[u8]) -> Option<RawObject<'_>> {
    RawObject::parse(json::utf8(body).ok()?)
}

/// Whether the body has `field`, and it is not `null`.
pub fn has(body: &[u8], field: &str) -> bool {
    top(body).and_then(|top| top.get(field)).is_some_and(|value| value.trim() != "null")
}

/// A string field of the body.
pub fn string(body: &[u8], field: &str) -> Option<String> {
    top(body)?.str(field).map(|value| value.into_owned())
}

/// The body with `field` set to `value` (JSON text): replaced where it is, else added last.
pub fn with_field(body: &[u8], field: &str, value: &str) -> Option<Bytes> {
    let top = top(body)?;
    let mut out = String::with_capacity(body.len() + field.len() + value.len() + 4);
    top.write(&mut out, &[], |key| (key == field).then(|| value.to_string()));
    if top.get(field).is_none() {
        out.pop();
        if !top.fields.is_empty() {
            out.push(',');
        }
        json::push_json_string(&mut out, field);
        out.push(':');
        out.push_str(value);
        out.push('}');
    }
    Some(Bytes::from(out))
}

/// The client's own input items as JSON texts: an array's elements, or a string input as the one
/// user message it stands for.
pub fn client_items(body: &[u8]) -> Option<Vec<String>> {
    let top = top(body)?;
    let input = top.get("input")?.trim();
    if input.starts_with('"') {
        return Some(vec![format!(r#"{{"role":"user","content":{input}}}"#)]);
    }
    Some(json::as_array(input)?.into_iter().map(str::to_string).collect())
}

/// The stateless body of a chain: the client's body without `previous_response_id` (and
/// `conversation`), its `input` the chain's items (`history`, JSON texts) then the client's own.
pub fn stateless(body: &[u8], history: &[String]) -> Option<Bytes> {
    let top = top(body)?;
    let own = client_items(body)?;
    let mut input =
        ArrayWriter::continuing(String::with_capacity(body.len() + history.iter().map(String::len).sum::<usize>()));
    for item in history.iter().chain(&own) {
        input.push(item);
    }
    let input = input.finish();
    let mut out = String::with_capacity(body.len() + input.len());
    top.write(&mut out, &["previous_response_id", "conversation"], |key| (key == "input").then(|| input.clone()));
    Some(Bytes::from(out))
}

/// The part of a stateless body's `input` (`sent`) that stands for the chain: every item before
/// the client's own (`client`), when the body ends with them as the client sent them; `None` when
/// the rewrite reached into them (a mapping made from it would lose or repeat what they said).
pub fn chain_part(sent: &[u8], client: &[String]) -> Option<Vec<String>> {
    let top = top(sent)?;
    let items = json::as_array(top.get("input")?)?;
    let kept = items.len().checked_sub(client.len())?;
    let ends_with_client = items[kept..].iter().zip(client).all(|(sent, own)| sent.trim() == own.trim());
    ends_with_client.then(|| items[..kept].iter().map(|item| item.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAINED: &str =
        r#"{"model":"gpt-5","previous_response_id":"resp_1","input":[{"role":"user","content":"next"}],"stream":true}"#;

    #[test]
    fn a_field_is_set_where_it_is_or_added_last_and_nothing_else_moves() {
        let added = with_field(CHAINED.as_bytes(), "truncation", r#""auto""#).unwrap();
        assert_eq!(
            std::str::from_utf8(&added).unwrap(),
            r#"{"model":"gpt-5","previous_response_id":"resp_1","input":[{"role":"user","content":"next"}],"stream":true,"truncation":"auto"}"#
        );
        let replaced = with_field(&added, "truncation", r#""disabled""#).unwrap();
        assert!(std::str::from_utf8(&replaced).unwrap().ends_with(r#""stream":true,"truncation":"disabled"}"#));
        assert_eq!(&with_field(b"{}", "a", "1").unwrap()[..], br#"{"a":1}"#);
        assert!(with_field(b"[1]", "a", "1").is_none());
    }

    #[test]
    fn a_chain_goes_statelessly_with_its_items_before_the_client_s_own_byte_for_byte() {
        let compaction = r#"{"type":"compaction","id":"cmp_1","encrypted_content":"gAAA=="}"#;
        let history = vec![r#"{"role":"user","content":"first"}"#.to_string(), compaction.to_string()];
        let body = stateless(CHAINED.as_bytes(), &history).unwrap();
        let text = std::str::from_utf8(&body).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"model":"gpt-5","input":[{{"role":"user","content":"first"}},{compaction},{{"role":"user","content":"next"}}],"stream":true}}"#
            )
        );
        let client = client_items(CHAINED.as_bytes()).unwrap();
        assert_eq!(chain_part(&body, &client).unwrap(), history);
        // A client item the rewrite changed: no mapping from this body.
        let changed = text.replace(r#""content":"next""#, r#""content":"nex""#);
        assert!(chain_part(changed.as_bytes(), &client).is_none());
    }

    #[test]
    fn a_string_input_is_the_user_message_it_stands_for() {
        let body = r#"{"model":"m","conversation":"conv_1","input":"hello"}"#;
        assert_eq!(client_items(body.as_bytes()).unwrap(), [r#"{"role":"user","content":"hello"}"#]);
        let rebuilt = stateless(body.as_bytes(), &[]).unwrap();
        assert_eq!(&rebuilt[..], br#"{"model":"m","input":[{"role":"user","content":"hello"}]}"#);
        assert!(has(body.as_bytes(), "conversation") && !has(br#"{"conversation":null}"#, "conversation"));
    }
}
