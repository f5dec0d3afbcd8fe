//! The fidelity corpus (`tests/fixtures/fidelity/`): one realistic conversation per content block
//! and input item type the official SDKs define, sent through the real binary with its defaults
//! and with pruning, truncation and compaction forced, against a fake upstream that enforces the
//! providers' pairing rules (server tools included). Each must arrive valid, byte-identical when
//! nothing needed rewriting, with every encrypted field and every block compactor may not shorten
//! untouched, and be answered as the provider answers it directly. A block or item type compactor
//! does not know, injected into every fixture, arrives byte for byte.

use std::collections::{BTreeMap, BTreeSet};

use compactor::json::{self, RawObject};
use serde_json::{Value, json};

use crate::common::window::{WindowSpec, enforce_window};
use crate::common::*;

/// Every content block type of the `anthropic` SDK's `ContentBlockParam` and
/// `BetaContentBlockParam` (2.12.0), and the blocks nested in them.
const ANTHROPIC_TYPES: &[&str] = &[
    "text",
    "image",
    "document",
    "search_result",
    "thinking",
    "redacted_thinking",
    "tool_use",
    "tool_result",
    "server_tool_use",
    "web_search_tool_result",
    "web_search_result",
    "web_search_tool_result_error",
    "web_fetch_tool_result",
    "web_fetch_result",
    "web_fetch_tool_result_error",
    "advisor_tool_result",
    "advisor_result",
    "advisor_redacted_result",
    "code_execution_tool_result",
    "code_execution_result",
    "encrypted_code_execution_result",
    "bash_code_execution_tool_result",
    "bash_code_execution_result",
    "bash_code_execution_output",
    "bash_code_execution_tool_result_error",
    "text_editor_code_execution_tool_result",
    "text_editor_code_execution_view_result",
    "text_editor_code_execution_create_result",
    "text_editor_code_execution_str_replace_result",
    "tool_search_tool_result",
    "tool_search_tool_search_result",
    "tool_reference",
    "mcp_tool_use",
    "mcp_tool_result",
    "mcp_tool_listing",
    "container_upload",
    "compaction",
    "tool_addition",
    "tool_removal",
    "fallback",
    "browser_state",
    "web_search_result_location",
    "char_location",
    "search_result_location",
];

/// Every input item type of the `openai` SDK's `ResponseInputItemParam` (3.54.0), and the
/// content parts inside them.
const RESPONSES_TYPES: &[&str] = &[
    "message",
    "input_text",
    "input_image",
    "input_file",
    "output_text",
    "refusal",
    "url_citation",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "computer_screenshot",
    "web_search_call",
    "function_call",
    "function_call_output",
    "tool_search_call",
    "tool_search_output",
    "additional_tools",
    "configuration_update",
    "reasoning",
    "summary_text",
    "reasoning_text",
    "compaction",
    "image_generation_call",
    "code_interpreter_call",
    "logs",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "custom_tool_call_output",
    "custom_tool_call",
    "compaction_trigger",
    "item_reference",
    "program",
    "program_output",
];

/// Every message role and content part type of the `openai` SDK's `ChatCompletionMessageParam`
/// (3.54.0), and the tool call types.
const CHAT_TYPES: &[&str] = &[
    "role:system",
    "role:developer",
    "role:user",
    "role:assistant",
    "role:tool",
    "role:function",
    "text",
    "image_url",
    "input_audio",
    "file",
    "refusal",
    "function",
    "custom",
    "field:audio",
    "field:function_call",
    "field:refusal",
];

/// Blocks and items a policy may shorten (their text only); every other one must arrive as sent.
const SHORTENABLE: &[&str] = &[
    "tool_result",
    "mcp_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "function_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
    "mcp_call",
    "code_interpreter_call",
    "role:tool",
    "role:function",
];

/// Fields whose values the providers verify: never edited (and `data` of `redacted_thinking`).
const ENCRYPTED: &[&str] = &["encrypted_content", "encrypted_index", "signature", "encrypted_stdout", "fingerprint"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Api {
    Anthropic,
    Responses,
    Chat,
}

impl Api {
    fn dir(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::Responses => "responses",
            Api::Chat => "chat",
        }
    }
    fn path(self) -> &'static str {
        match self {
            Api::Anthropic => "/v1/messages?beta=true",
            Api::Responses => "/v1/responses",
            Api::Chat => "/v1/chat/completions",
        }
    }
    fn history(self) -> &'static str {
        if self == Api::Responses { "input" } else { "messages" }
    }
}

struct Fixture {
    api: Api,
    name: String,
    bytes: Vec<u8>,
}

impl Fixture {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap()
    }
}

fn corpus(api: Api) -> Vec<Fixture> {
    let dir = format!("{}/tests/fixtures/fidelity/{}", env!("CARGO_MANIFEST_DIR"), api.dir());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no fixtures in {dir}");
    names
        .into_iter()
        .map(|name| Fixture { api, bytes: std::fs::read(format!("{dir}/{name}")).unwrap(), name })
        .collect()
}

/// Every block or item of a history with its type (`role:…` for a Chat message), as raw bytes.
fn units(api: Api, body: &[u8]) -> Vec<(String, String)> {
    let top = RawObject::parse(std::str::from_utf8(body).unwrap()).unwrap();
    let mut out = Vec::new();
    for message in json::as_array(top.get(api.history()).unwrap()).unwrap() {
        let object = RawObject::parse(message).unwrap();
        match api {
            Api::Responses => out.push((object.str("type").unwrap_or_default().to_string(), message.to_string())),
            Api::Chat => out.push((format!("role:{}", object.str("role").unwrap()), message.to_string())),
            Api::Anthropic => match object.get("content").filter(|c| c.starts_with('[')) {
                Some(content) => {
                    for block in json::as_array(content).unwrap() {
                        let kind = RawObject::parse(block).unwrap().str("type").unwrap_or_default().to_string();
                        out.push((kind, block.to_string()));
                    }
                }
                None => out.push(("string".into(), message.to_string())),
            },
        }
    }
    out
}

/// Every `type` value (and, for Chat, role and notable field) anywhere inside the history.
fn types_in(api: Api, body: &Value) -> BTreeSet<String> {
    fn walk(value: &Value, api: Api, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(kind)) = map.get("type") {
                    out.insert(kind.clone());
                }
                if api == Api::Chat {
                    if let Some(Value::String(role)) = map.get("role") {
                        out.insert(format!("role:{role}"));
                    }
                    for field in ["audio", "function_call", "refusal"] {
                        if map.get(field).is_some_and(|v| !v.is_null()) && map.contains_key("role") {
                            out.insert(format!("field:{field}"));
                        }
                    }
                }
                map.values().for_each(|v| walk(v, api, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, api, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(&body[api.history()], api, &mut out);
    out
}

/// Every value of a verified field (signatures, encrypted content) anywhere in the body.
fn encrypted_values(body: &Value) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                let redacted = map.get("type").is_some_and(|t| t == "redacted_thinking");
                for (key, v) in map {
                    let verified = ENCRYPTED.contains(&key.as_str()) || (redacted && key == "data");
                    if let (true, Value::String(s)) = (verified, v) {
                        out.push(s.clone());
                    }
                    walk(v, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(body, &mut out);
    out.sort();
    out
}

fn headers(api: Api, session: &str) -> Vec<(&'static str, String)> {
    let mut headers = vec![("content-type", "application/json".to_string()), ("x-session-id", session.to_string())];
    match api {
        Api::Anthropic => {
            headers.push(("x-api-key", "sk-ant-test".into()));
            headers.push(("anthropic-version", "2023-06-01".into()));
            headers.push((
                "anthropic-beta",
                "web-fetch-2025-09-10,code-execution-2025-08-25,advanced-tool-use-2025-11-20".into(),
            ));
        }
        _ => headers.push(("authorization", "Bearer sk-test".into())),
    }
    headers
}

async fn post(url: &str, api: Api, session: &str, body: &[u8]) -> Answer {
    let headers = headers(api, session);
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    send(request("POST", url, &headers, body.to_vec())).await
}

/// The requests the fake received since `from`, summary calls left out.
fn forwarded(fake: &FakeUpstream, from: usize) -> Vec<Received> {
    fake.received()
        .into_iter()
        .skip(from)
        .filter(|r| !String::from_utf8_lossy(&r.body).contains("context-compaction assistant"))
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Defaults,
    Prune,
    Truncate,
}

impl Mode {
    fn config(self) -> &'static str {
        match self {
            Mode::Defaults => "",
            Mode::Prune => "[prune]\nprotect_tokens = 1\nminimum_tokens = 1\n[truncate]\nenabled = false\n",
            Mode::Truncate => "[prune]\nenabled = false\n[truncate]\ntool_output_max_tokens = 40\n",
        }
    }
}

/// What one fixture sent through compactor looked like at the upstream.
struct Outcome {
    upstream: Vec<u8>,
    changed: bool,
}

/// Sends a body straight to the strict fake and through compactor: both answers must match, and
/// the forwarded body must keep what compactor may not touch.
async fn through(fake: &FakeUpstream, proxy: &ProxyProcess, fixture: &Fixture, body: &[u8], session: &str) -> Outcome {
    let api = fixture.api;
    let direct = post(&format!("{}{}", fake.url(), api.path()), api, session, body).await;
    assert_eq!(direct.status, 200, "{}/{} is not valid as sent: {}", api.dir(), fixture.name, direct.text());
    let before = fake.received().len();
    let answer = post(&proxy.url(api.path()), api, session, body).await;
    assert_eq!(answer.status, direct.status, "{}/{}: {}", api.dir(), fixture.name, answer.text());
    assert_eq!(answer.body, direct.body, "{}/{}: answered differently", api.dir(), fixture.name);
    let sent = forwarded(fake, before);
    assert_eq!(sent.len(), 1, "{}/{}: one request upstream", api.dir(), fixture.name);
    let upstream = sent[0].body.to_vec();
    let changed = upstream != body;
    Outcome { upstream, changed }
}

/// What compactor may never change, checked on a forwarded body against the client's.
fn assert_untouched(api: Api, name: &str, client: &[u8], upstream: &[u8]) {
    let client_json: Value = serde_json::from_slice(client).unwrap();
    let upstream_json: Value = serde_json::from_slice(upstream).unwrap();
    assert_eq!(
        encrypted_values(&client_json),
        encrypted_values(&upstream_json),
        "{}/{name}: a verified field changed",
        api.dir()
    );
    let before = units(api, client);
    let after = units(api, upstream);
    assert_eq!(before.len(), after.len(), "{}/{name}: blocks added or removed", api.dir());
    for ((kind, raw), (kind_after, raw_after)) in before.iter().zip(&after) {
        assert_eq!(kind, kind_after, "{}/{name}: block order changed", api.dir());
        if !SHORTENABLE.contains(&kind.as_str()) {
            assert_eq!(raw, raw_after, "{}/{name}: a `{kind}` block was rewritten", api.dir());
        } else if raw != raw_after && api == Api::Anthropic && kind != "tool_result" {
            // A shortened server result keeps its type and every field but the text it shortened.
            let blank = |raw: &str| {
                let mut value: Value = serde_json::from_str(raw).unwrap();
                for pointer in ["/content/stdout", "/content/content/source/data", "/content/content"] {
                    if let Some(Value::String(s)) = value.pointer_mut(pointer) {
                        s.clear();
                    }
                }
                if value["type"] == "mcp_tool_result" {
                    value["content"] = json!("");
                }
                value
            };
            assert_eq!(blank(raw), blank(raw_after), "{}/{name}: a `{kind}` block lost more than its text", api.dir());
        }
    }
}

async fn run_corpus(api: Api, mode: Mode) -> BTreeMap<String, bool> {
    let fake = FakeUpstream::builder().strict_pairing().start().await;
    let proxy = ProxyProcess::start(&fake, mode.config());
    let mut changed = BTreeMap::new();
    for fixture in corpus(api) {
        let session = format!("{}-{}-{mode:?}", api.dir(), fixture.name);
        let outcome = through(&fake, &proxy, &fixture, &fixture.bytes, &session).await;
        if mode == Mode::Defaults {
            assert!(!outcome.changed, "{}/{}: rewritten with the defaults", api.dir(), fixture.name);
        }
        assert_untouched(api, &fixture.name, &fixture.bytes, &outcome.upstream);
        changed.insert(fixture.name.clone(), outcome.changed);
    }
    changed
}

#[tokio::test]
async fn the_corpus_covers_every_block_and_item_type_of_the_sdks() {
    for (api, expected) in
        [(Api::Anthropic, ANTHROPIC_TYPES), (Api::Responses, RESPONSES_TYPES), (Api::Chat, CHAT_TYPES)]
    {
        let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for fixture in corpus(api) {
            for kind in types_in(api, &fixture.json()) {
                found.entry(kind).or_default().push(fixture.name.clone());
            }
        }
        let missing: Vec<&&str> = expected.iter().filter(|t| !found.contains_key(**t)).collect();
        assert!(missing.is_empty(), "{}: no fixture covers {missing:?}", api.dir());
        for kind in expected.iter() {
            eprintln!("{:>9} {kind:<45} {}", api.dir(), found[*kind].join(", "));
        }
    }
}

#[tokio::test]
async fn anthropic_corpus_arrives_byte_identical_with_the_defaults() {
    run_corpus(Api::Anthropic, Mode::Defaults).await;
}

#[tokio::test]
async fn responses_corpus_arrives_byte_identical_with_the_defaults() {
    run_corpus(Api::Responses, Mode::Defaults).await;
}

#[tokio::test]
async fn chat_corpus_arrives_byte_identical_with_the_defaults() {
    run_corpus(Api::Chat, Mode::Defaults).await;
}

#[tokio::test]
async fn anthropic_corpus_stays_valid_with_pruning_forced() {
    let changed = run_corpus(Api::Anthropic, Mode::Prune).await;
    assert!(changed.values().all(|c| *c), "every fixture has old outputs to prune: {changed:?}");
}

/// The Responses fixtures whose client compacts with the provider (a `compaction_trigger`, a
/// `compaction` item it got back): forwarded as they came, never compacted a second time.
const CLIENT_COMPACTED: [&str; 2] = ["compaction_trigger.json", "reasoning_and_compaction.json"];

fn unchanged(changed: &BTreeMap<String, bool>) -> Vec<&str> {
    changed.iter().filter(|(_, c)| !**c).map(|(name, _)| name.as_str()).collect()
}

#[tokio::test]
async fn responses_corpus_stays_valid_with_pruning_forced() {
    let changed = run_corpus(Api::Responses, Mode::Prune).await;
    assert_eq!(unchanged(&changed), CLIENT_COMPACTED, "{changed:?}");
}

#[tokio::test]
async fn chat_corpus_stays_valid_with_pruning_forced() {
    let changed = run_corpus(Api::Chat, Mode::Prune).await;
    assert!(changed.values().all(|c| *c), "{changed:?}");
}

#[tokio::test]
async fn anthropic_corpus_stays_valid_with_truncation_forced() {
    let changed = run_corpus(Api::Anthropic, Mode::Truncate).await;
    assert!(changed.values().all(|c| *c), "{changed:?}");
}

#[tokio::test]
async fn responses_corpus_stays_valid_with_truncation_forced() {
    let changed = run_corpus(Api::Responses, Mode::Truncate).await;
    assert_eq!(unchanged(&changed), CLIENT_COMPACTED, "{changed:?}");
}

#[tokio::test]
async fn chat_corpus_stays_valid_with_truncation_forced() {
    let changed = run_corpus(Api::Chat, Mode::Truncate).await;
    assert!(changed.values().all(|c| *c), "{changed:?}");
}

/// Each fixture against a fake whose window holds 60 % of it: compactor summarizes the older part
/// and the rebuilt request must still be valid; the agent's own compaction is left alone.
async fn compaction_corpus(api: Api) {
    let mut compacted = Vec::new();
    for fixture in corpus(api) {
        let fake = FakeUpstream::start().await;
        let window = fixture.bytes.len() / 3 * 6 / 10;
        let summaries = enforce_window(&fake, WindowSpec { window, ..Default::default() });
        let keep = fixture.bytes.len() / 16;
        let config = format!(
            "[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = {keep}\nuser_message_max_tokens = 200\nemergency_protect_tokens = 1000000\n"
        );
        let proxy = ProxyProcess::start(&fake, &config);
        let session = format!("{}-{}-compaction", api.dir(), fixture.name);
        let direct = post(&format!("{}{}", fake.url(), api.path()), api, &session, &fixture.bytes).await;
        let before = fake.received().len();
        let answer = post(&proxy.url(api.path()), api, &session, &fixture.bytes).await;
        let sent = forwarded(&fake, before);
        let client: Value = fixture.json();
        let client_encrypted: BTreeSet<String> = encrypted_values(&client).into_iter().collect();
        for request in &sent {
            // Whatever was summarized away, nothing verified was edited.
            let body: Value = request.json();
            for value in encrypted_values(&body) {
                assert!(client_encrypted.contains(&value), "{}/{}: a verified field changed", api.dir(), fixture.name);
            }
        }
        if summaries.count() > 0 {
            assert_eq!(answer.status, 200, "{}/{}: {}", api.dir(), fixture.name, answer.text());
            assert!(
                !answer.text().contains("context_length_exceeded"),
                "{}/{}: {}",
                api.dir(),
                fixture.name,
                answer.text()
            );
            let last = sent.last().unwrap();
            assert!(last.body.len() < fixture.bytes.len(), "{}/{}: nothing was summarized", api.dir(), fixture.name);
            compacted.push(fixture.name.clone());
        } else {
            assert_eq!((answer.status, &answer.body), (direct.status, &direct.body), "{}/{}", api.dir(), fixture.name);
        }
    }
    let expected: Vec<String> =
        corpus(api).into_iter().map(|f| f.name).filter(|name| !CLIENT_COMPACTED.contains(&name.as_str())).collect();
    assert_eq!(compacted, expected, "{}: these fixtures were compacted", api.dir());
}

#[tokio::test]
async fn anthropic_corpus_stays_valid_when_compaction_is_forced() {
    compaction_corpus(Api::Anthropic).await;
}

#[tokio::test]
async fn responses_corpus_stays_valid_when_compaction_is_forced() {
    compaction_corpus(Api::Responses).await;
}

#[tokio::test]
async fn chat_corpus_stays_valid_when_compaction_is_forced() {
    compaction_corpus(Api::Chat).await;
}

/// A block or item of a type no API has yet, carrying the kind of fields new types do.
fn unknown(n: usize) -> String {
    format!(
        r#"{{"type":"hologram_2027","id":"holo_{n:04}","frames":[{{"t":0,"z":1.50}}],"encrypted_content":"SG9sb2dyYW0gZnJhbWVzIGZyb20gMjAyNw=="}}"#
    )
}

/// The fixture with an unknown block appended to every array content (Anthropic, Chat) or an
/// unknown item after every item but reasoning (Responses), spliced into the raw bytes; and the
/// snippets inserted.
fn inject_unknown(api: Api, body: &[u8]) -> (Vec<u8>, Vec<String>) {
    let text = std::str::from_utf8(body).unwrap();
    let top = RawObject::parse(std::str::from_utf8(body).unwrap()).unwrap();
    let history = top.get(api.history()).unwrap();
    // (byte offset, snippet to insert there)
    let mut inserts: Vec<(usize, String)> = Vec::new();
    for (i, message) in json::as_array(history).unwrap().into_iter().enumerate() {
        let object = RawObject::parse(message).unwrap();
        if api == Api::Responses {
            if object.str("type").as_deref() != Some("reasoning") {
                let end = json::span_in(body, message).unwrap().end;
                inserts.push((end, format!(",{}", unknown(i))));
            }
            continue;
        }
        if let Some(content) = object.get("content").filter(|c| c.starts_with('[') && *c != "[]") {
            let close = json::span_in(body, content).unwrap().end - 1;
            inserts.push((close, format!(",{}", unknown(i))));
        }
    }
    assert!(!inserts.is_empty());
    let mut out = String::with_capacity(text.len() + inserts.len() * 128);
    let mut at = 0;
    for (offset, snippet) in &inserts {
        out.push_str(&text[at..*offset]);
        out.push_str(snippet);
        at = *offset;
    }
    out.push_str(&text[at..]);
    (out.into_bytes(), inserts.into_iter().map(|(_, s)| s[1..].to_string()).collect())
}

async fn unknown_types_pass_through(api: Api) {
    for mode in [Mode::Defaults, Mode::Prune, Mode::Truncate] {
        let fake = FakeUpstream::builder().strict_pairing().start().await;
        let proxy = ProxyProcess::start(&fake, mode.config());
        for fixture in corpus(api) {
            let (body, snippets) = inject_unknown(api, &fixture.bytes);
            let session = format!("{}-{}-unknown-{mode:?}", api.dir(), fixture.name);
            let outcome = through(&fake, &proxy, &fixture, &body, &session).await;
            if mode == Mode::Defaults {
                assert!(!outcome.changed, "{}/{}: an unknown type changed the body", api.dir(), fixture.name);
            }
            let forwarded = String::from_utf8(outcome.upstream).unwrap();
            for snippet in &snippets {
                assert_eq!(
                    forwarded.matches(snippet.as_str()).count(),
                    1,
                    "{}/{} ({mode:?}): the unknown block did not arrive byte for byte",
                    api.dir(),
                    fixture.name
                );
            }
        }
    }
}

#[tokio::test]
async fn an_unknown_anthropic_block_in_any_fixture_arrives_byte_for_byte() {
    unknown_types_pass_through(Api::Anthropic).await;
}

#[tokio::test]
async fn an_unknown_responses_item_in_any_fixture_arrives_byte_for_byte() {
    unknown_types_pass_through(Api::Responses).await;
}

#[tokio::test]
async fn an_unknown_chat_part_in_any_fixture_arrives_byte_for_byte() {
    unknown_types_pass_through(Api::Chat).await;
}

/// The conversations of issue 18's table, by fixture: each answers as it does direct, with the
/// defaults and with pruning and truncation forced together.
#[tokio::test]
async fn the_issue_table_answers_as_direct_with_and_without_rewriting() {
    let rows: &[(Api, &str)] = &[
        (Api::Anthropic, "web_search.json"),
        (Api::Anthropic, "pause_turn.json"),
        (Api::Anthropic, "web_fetch_and_code_execution.json"),
        (Api::Anthropic, "tool_search.json"),
        (Api::Anthropic, "mcp_connector.json"),
        (Api::Anthropic, "compaction_block.json"),
        (Api::Anthropic, "thinking.json"),
        (Api::Responses, "web_search_call.json"),
        (Api::Responses, "custom_tool_call.json"),
        (Api::Responses, "local_shell_call.json"),
        (Api::Responses, "mcp.json"),
        (Api::Responses, "code_interpreter_call.json"),
    ];
    let forced = "[prune]\nprotect_tokens = 1\nminimum_tokens = 1\n[truncate]\ntool_output_max_tokens = 40\n";
    for config in ["", forced] {
        let fake = FakeUpstream::builder().strict_pairing().start().await;
        let proxy = ProxyProcess::start(&fake, config);
        for (api, name) in rows {
            let fixture = corpus(*api).into_iter().find(|f| f.name == *name).unwrap();
            let outcome =
                through(&fake, &proxy, &fixture, &fixture.bytes, &format!("row-{name}-{}", config.len())).await;
            assert_eq!(outcome.changed, !config.is_empty(), "{name}");
            assert_untouched(*api, name, &fixture.bytes, &outcome.upstream);
        }
    }
}

/// The pause_turn continuation goes upstream exactly as sent, whatever is forced.
#[tokio::test]
async fn a_pause_turn_continuation_goes_upstream_as_sent() {
    let fixture = corpus(Api::Anthropic).into_iter().find(|f| f.name == "pause_turn.json").unwrap();
    let fake = FakeUpstream::builder().strict_pairing().start().await;
    let proxy = ProxyProcess::start(&fake, "[truncate]\ntool_output_max_tokens = 40000\n[prune]\nenabled = false\n");
    let outcome = through(&fake, &proxy, &fixture, &fixture.bytes, "pause").await;
    assert!(!outcome.changed);
    let sent: Value = serde_json::from_slice(&outcome.upstream).unwrap();
    let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"].as_array().unwrap().last().unwrap()["type"], "server_tool_use");
}

/// Server results whose text may be shortened are shortened in place, with the provider's shape
/// kept; the ones that may not (encrypted search results, cited pages, PDFs) arrive as sent.
#[tokio::test]
async fn large_server_tool_results_are_shortened_only_where_they_stay_valid() {
    let fake = FakeUpstream::builder().strict_pairing().start().await;
    let proxy = ProxyProcess::start(&fake, Mode::Truncate.config());
    let fixture = corpus(Api::Anthropic).into_iter().find(|f| f.name == "web_fetch_and_code_execution.json").unwrap();
    let outcome = through(&fake, &proxy, &fixture, &fixture.bytes, "shorten").await;
    let sent: Value = serde_json::from_slice(&outcome.upstream).unwrap();
    let blocks: Vec<Value> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .collect();
    let page = blocks.iter().find(|b| b["type"] == "web_fetch_tool_result").unwrap();
    assert!(page["content"]["content"]["source"]["data"].as_str().unwrap().contains("tokens truncated"), "{page}");
    let run = blocks.iter().find(|b| b["type"] == "code_execution_tool_result").unwrap();
    assert!(run["content"]["stdout"].as_str().unwrap().contains("tokens truncated"), "{run}");

    let fixture = corpus(Api::Anthropic).into_iter().find(|f| f.name == "web_fetch_pdf_and_citations.json").unwrap();
    let outcome = through(&fake, &proxy, &fixture, &fixture.bytes, "keep").await;
    let client = units(Api::Anthropic, &fixture.bytes);
    let upstream = units(Api::Anthropic, &outcome.upstream);
    for ((kind, raw), (_, raw_after)) in client.iter().zip(&upstream) {
        if kind == "web_fetch_tool_result" {
            assert_eq!(raw, raw_after, "a cited page or a PDF was shortened");
        }
    }

    let fixture = corpus(Api::Responses).into_iter().find(|f| f.name == "mcp.json").unwrap();
    let outcome = through(&fake, &proxy, &fixture, &fixture.bytes, "mcp").await;
    let sent: Value = serde_json::from_slice(&outcome.upstream).unwrap();
    let call = sent["input"].as_array().unwrap().iter().find(|i| i["type"] == "mcp_call").unwrap().clone();
    assert!(call["output"].as_str().unwrap().contains("tokens truncated"), "{call}");
}
