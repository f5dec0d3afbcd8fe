//! The reader, the writer and the unescaper held to serde_json: the same bytes kept, the same
//! values accepted and refused.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, Visitor};
use serde_json::value::RawValue;

use super::scan::SCANNED_FIELDS;
use super::*;

#[test]
fn rewriting_one_field_keeps_every_other_byte_and_the_key_order() {
    let body = r#"{"z":1.00000000000000000001,"content":"old","a":{"b" : [1, 2]}}"#;
    let raw: &RawValue = serde_json::from_str(body).unwrap();
    let object = RawObject::parse(raw.get()).unwrap();
    let mut out = String::new();
    object.write(&mut out, &[], |key| (key == "content").then(|| json_string("new")));
    assert_eq!(out, r#"{"z":1.00000000000000000001,"content":"new","a":{"b" : [1, 2]}}"#);
}

#[test]
fn escaped_strings_are_unescaped() {
    let raw: &RawValue = serde_json::from_str(r#"{"t":"line\nnext \u00e9"}"#).unwrap();
    let object = RawObject::parse(raw.get()).unwrap();
    assert_eq!(object.str("t").unwrap(), "line\nnext é");
}

#[test]
fn a_nested_value_is_replaced_in_place() {
    let body = r#"{"type":"x","content":{"stdout" : "long\nlog","n":1.50}}"#;
    let raw: &RawValue = serde_json::from_str(body).unwrap();
    let content = RawObject::parse(RawObject::parse(raw.get()).unwrap().get("content").unwrap()).unwrap();
    let out = replace_within(raw.get(), content.get("stdout").unwrap(), &json_string("short")).unwrap();
    assert_eq!(out, r#"{"type":"x","content":{"stdout" : "short","n":1.50}}"#);
    let elsewhere: &RawValue = serde_json::from_str(r#""other""#).unwrap();
    assert_eq!(replace_within(raw.get(), elsewhere.get(), "\"\""), None);
}

#[test]
fn span_finds_a_borrowed_value_in_its_body() {
    let body = br#"{"messages": [1,2], "x": 3}"#;
    let object = RawObject::parse(std::str::from_utf8(body).unwrap()).unwrap();
    let span = span_in(body, object.get("messages").unwrap()).unwrap();
    assert_eq!(&body[span], b"[1,2]");
}

fn object_with_keys(keys: &[String]) -> String {
    let fields: Vec<String> = keys.iter().enumerate().map(|(i, k)| format!("\"{k}\":{i}")).collect();
    format!("{{{}}}", fields.join(","))
}

#[test]
fn a_duplicate_key_is_refused_in_small_and_large_objects_wherever_it_stands() {
    for size in [2, SCANNED_FIELDS - 1, SCANNED_FIELDS, SCANNED_FIELDS + 1, 1000] {
        let keys: Vec<String> = (0..size).map(|i| format!("k{i}")).collect();
        assert!(scanned_object(&object_with_keys(&keys)).is_some(), "{size} distinct keys");
        for (first, second) in [(0, size - 1), (size - 1, size), (size / 2, size + 3)] {
            let mut with_duplicate = keys.clone();
            with_duplicate.insert(second.min(with_duplicate.len()), keys[first].clone());
            let body = object_with_keys(&with_duplicate);
            assert!(scanned_object(&body).is_none(), "{size} keys, k{first} twice");
        }
    }
}

#[test]
fn keys_that_differ_only_in_escapes_are_duplicates() {
    let mut keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    keys.push("\\u006b3".into());
    assert!(scanned_object(&object_with_keys(&keys)).is_none());
    let small = r#"{"a":1,"\u0061":2}"#;
    assert!(scanned_object(small).is_none());
}

#[test]
fn a_large_object_keeps_its_keys_in_order() {
    let keys: Vec<String> = (0..500).map(|i| format!("k{i}")).collect();
    let body = object_with_keys(&keys);
    let object = scanned_object(&body).unwrap();
    let read: Vec<&str> = object.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(read, keys.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(RawObject::parse(&body).unwrap().get("k499").unwrap(), "499");
}

/// serde_json's reading of an object of raw fields, duplicates refused: the reference the
/// scanner is compared with (production reads objects with [`Scanner`] only).
fn serde_object(text: &str) -> Option<Vec<(String, String)>> {
    struct Fields(Vec<(String, String)>);
    impl<'de> Deserialize<'de> for Fields {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct ObjectVisitor;
            impl<'de> Visitor<'de> for ObjectVisitor {
                type Value = Fields;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Fields, M::Error> {
                    let mut fields: Vec<(String, String)> = Vec::new();
                    while let Some(CowStr(key)) = map.next_key::<CowStr<'de>>()? {
                        let value: &'de RawValue = map.next_value()?;
                        if fields.iter().any(|(k, _)| *k == key) {
                            return Err(serde::de::Error::custom("duplicate key"));
                        }
                        fields.push((key.into_owned(), value.get().to_string()));
                    }
                    Ok(Fields(fields))
                }
            }
            deserializer.deserialize_map(ObjectVisitor)
        }
    }
    serde_json::from_str::<Fields>(text).ok().map(|fields| fields.0)
}

/// A body's reading of an object: checked, then nothing but whitespace.
fn scanned_object(text: &str) -> Option<Vec<(String, String)>> {
    let mut scan = Scanner::new(text, 0);
    let (_, object) = scan.object()?;
    scan.at_end().then(|| object.fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// `base` with each `(offset, text)` inserted in turn (offsets wrapped to the text's length and
/// moved back to a character boundary): the property tests' mutated JSON.
fn mutated(base: &str, edits: &[(usize, &str)]) -> String {
    let mut text = base.to_string();
    for (at, insert) in edits {
        let mut at = at % (text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.insert_str(at, insert);
    }
    text
}

/// serde_json's measure of a whole text as one value (whitespace around it allowed).
fn serde_value(text: &str) -> Option<&str> {
    serde_json::from_str::<&RawValue>(text).ok().map(RawValue::get)
}

fn scanned_value(text: &str) -> Option<&str> {
    let mut scan = Scanner::new(text, 0);
    let value = scan.raw()?;
    scan.at_end().then_some(value)
}

#[test]
fn values_nested_past_the_bit_stack_are_measured_as_serde_json_measures_them() {
    for depth in [1, 127, 128, 129, 300] {
        let nested =
            |open: &str, inner: &str, close: &str| format!("{}{inner}{}", open.repeat(depth), close.repeat(depth));
        for text in [
            nested("[", "1", "]"),
            nested("{\"k\":[", "\"v\\n\"", "]}"),
            nested("[{\"a\" : ", "{}", "} ]"),
            nested("[", "[]", "]").replacen(']', "}", 1),
            nested("[", "1", "]") + "]",
            nested("[", "1", "],"),
            nested("{\"k\":", "null", "}").replacen(':', " ", depth.min(2)),
        ] {
            assert_eq!(scanned_value(&text), serde_value(&text), "depth {depth}: {text:.80}");
        }
    }
}

#[test]
fn strings_dense_with_escapes_are_measured_wherever_an_escape_falls() {
    // Every offset of an escape, control character or quote against the eight-byte stride.
    for pad in 0..17 {
        let pad = "a".repeat(pad);
        for inner in
            ["\\n", "\\u00e9", "\\uD83D\\uDE00", "\\\"", "\\\\", "\\x", "\\u12g4", "\u{1}", "\u{1f}", "é€", "\\"]
        {
            for text in [format!("\"{pad}{inner}{pad}\""), format!("[\"{pad}{inner}\",\"{inner}{pad}\"]")] {
                let serde = serde_value(&text);
                assert_eq!(scanned_value(&text), serde, "{text}");
                if serde.is_some() {
                    assert_eq!(value_end(text.as_bytes(), 0, true), Some(text.len()), "trusted: {text}");
                }
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

    /// Any text is escaped exactly as serde_json escapes it.
    #[test]
    fn texts_are_escaped_exactly_as_serde_json_does(text in "(\\PC|[\u{0}-\u{1f}\u{7f}\"\\\\])*") {
        let mut out = String::from("prefix");
        push_json_string(&mut out, &text);
        proptest::prop_assert_eq!(&out[6..], serde_json::to_string(&text).unwrap());
    }

    /// Any string literal, valid or not, is unescaped exactly as serde_json unescapes it:
    /// the same text, or refused alike (bad escapes, control characters, lone surrogates).
    #[test]
    fn strings_are_unescaped_exactly_as_serde_json_does(
        parts in proptest::collection::vec(proptest::sample::select(vec![
            "a", "é", "€", "😀", " ", "\\n", "\\t", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\r", "\\u0041",
            "\\u00e9", "\\uD83D", "\\uDE00", "\\uD83D\\uDE00", "\\udbff\\udfff", "\\u12", "\\uZZZZ", "\\x",
            "\\", "\"", "\u{1}", "\u{1f}", "\u{7f}", "0123456789",
        ]), 0..12),
    ) {
        let text = format!("\"{}\"", parts.concat());
        let serde = serde_json::from_str::<CowStr>(&text).ok().map(|s| s.0.into_owned());
        proptest::prop_assert_eq!(as_str(&text).map(Cow::into_owned), serde, "{}", text);
    }

    /// Any value, valid or not, is measured exactly as serde_json measures a raw value: the
    /// same accept or refuse, the same text; arrays give the same elements.
    #[test]
    fn the_scanner_measures_values_exactly_as_serde_json_does(
        base in proptest::sample::select(vec![
            r#"{"a":[1,{"b":"c\nd","e":[[],{}]}],"f":"\u00e9\t\"x\"","g":-1.5e3}"#,
            r#"[ {"role" : "user", "content" : [ {"type":"text","text":"line\nline\n\\ end"} ] } , null , true ]"#,
            r#""just a string with \/ and \b\f\r and é""#,
            r#"[[[[["deep"]]]],{"x":{"y":{"z":0}}}]"#,
            "-0.0e+1",
        ]),
        edits in proptest::collection::vec((0usize..200, proptest::sample::select(vec![
            "", "\"", "\\", "\\u", "\\uABCD", "\\u12", "\\n", "-", ".", "e", "0", "01", " ", "\t", ",", ":",
            "{", "}", "[", "]", "[]", "{}", "tru", "null", "x", "\u{1}", "\u{1f}", "\u{7f}", "é", "\"a\":", "\"k\":1,",
        ])), 0..5),
    ) {
        let text = mutated(base, &edits);
        proptest::prop_assert_eq!(scanned_value(&text), serde_value(&text), "{}", text);
        let serde_array = serde_json::from_str::<Vec<&RawValue>>(&text)
            .ok()
            .map(|values| values.into_iter().map(RawValue::get).collect::<Vec<_>>());
        let mut scan = Scanner::new(&text, 0);
        let checked_array = scan.array().filter(|_| scan.at_end()).map(|(_, elements)| elements);
        proptest::prop_assert_eq!(checked_array, serde_array.clone(), "{}", text);
        if serde_array.is_some() {
            proptest::prop_assert_eq!(as_array(&text), serde_array, "{}", text);
        }
        if let Some(value) = serde_value(&text) {
            proptest::prop_assert_eq!(value_end(value.as_bytes(), 0, true), Some(value.len()), "{}", text);
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// The scanner's fast path (plain strings, literals, numbers) accepts exactly what
    /// serde_json accepts, and reads the same keys and raw values, valid input or not.
    #[test]
    fn the_scanner_reads_objects_exactly_as_serde_json_does(
        base in proptest::sample::select(vec![
            r#"{"a":1,"b":-0.5e+3,"c":"x","d":true,"e":null,"f":false,"g":[1,{"h":"i"}],"j":{"k":"\\u00e9\\n"}}"#,
            r#"{ "model" : "gpt-4o" , "n" : 10 , "t" : 0.25 , "s" : "" , "u" : "a\\"b" }"#,
            r#"{"n":-0,"m":1E9,"o":0.0e-0,"p":123456789012345678901234567890}"#,
            "{}",
        ]),
        edits in proptest::collection::vec((0usize..200, proptest::sample::select(vec![
            "", "\"", "\\", "-", "+", ".", "e", "E", "0", "01", "1", " ", "\n", ",", ":", "{", "}", "[", "]",
            "tru", "nul", "x", "\u{1}", "\u{7f}", "é", "\"a\"", "\"a\":", "\\u", "\\\"",
        ])), 0..4),
    ) {
        let text = mutated(base, &edits);
        let serde = serde_object(&text);
        proptest::prop_assert_eq!(scanned_object(&text), serde.clone(), "{}", text);
        // Valid text re-read without checks (as the dialect readers do) reads the same.
        if serde.is_some() {
            let trusted = RawObject::parse(&text)
                .map(|o| o.fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>());
            proptest::prop_assert_eq!(trusted, serde, "{}", text);
        }
    }
}
