//! Gemini's native API through the real binary, against the provider simulator's Gemini dialect
//! (`tests/common/provider/gemini.rs`, which enforces the API's pairing and thought-signature
//! rules): the fidelity corpus (`tests/fixtures/fidelity/gemini/`) byte-identical when nothing
//! needs rewriting and valid when pruning or truncation is forced, signatures, media and the
//! provider's own parts never touched, an overflow recovered (pruned, or summarized by a tool-less
//! `generateContent`), the JSON-array stream passed through, compactor's own errors in Google's
//! shape, `?key=` scoping the tenant and never logged, Gemini CLI's sessions kept as one and its
//! own compression left alone.

use serde_json::{Value, json};

use crate::common::provider::gemini::SIGNATURE;
use crate::common::provider::{Outcome, ProviderSim, ProviderSpec};
use crate::common::*;

const STREAM: &str = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse";
const KEY: &str = "AIzaSy-test-key-4242";

fn corpus() -> Vec<u8> {
    std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fidelity/gemini/every_part.json")).unwrap()
}

async fn post(proxy: &ProxyProcess, path: &str, body: impl Into<bytes::Bytes>) -> Answer {
    send(request("POST", &proxy.url(path), &[("x-goog-api-key", KEY), ("content-type", "application/json")], body))
        .await
}

/// Every part of the contents, with the content's index.
fn parts(body: &Value) -> Vec<(usize, Value)> {
    let contents = body["contents"].as_array().unwrap();
    contents
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c["parts"].as_array().unwrap().iter().map(move |p| (i, p.clone())))
        .collect()
}

/// The parts compactor may never change: signed parts, media, the provider's code and tools,
/// responses carrying parts of their own, and anything it does not know.
fn untouchable(body: &Value) -> Vec<Value> {
    parts(body)
        .into_iter()
        .map(|(_, p)| p)
        .filter(|p| {
            let response_with_parts = p["functionResponse"].get("parts").is_some();
            let keys = [
                "thoughtSignature",
                "inlineData",
                "fileData",
                "executableCode",
                "codeExecutionResult",
                "toolCall",
                "toolResponse",
                "futurePart",
            ];
            response_with_parts || keys.iter().any(|k| p.get(*k).is_some())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_corpus_arrives_byte_identical_when_nothing_needs_rewriting() {
    let sim = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
    let proxy = ProxyProcess::start_with(&sim.compactor_config(""), &[]);
    let body = corpus();
    let answer = post(&proxy, STREAM, body.clone()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.header("x-compactor-session").is_some(), "compactor took the request as a session's");
    assert_eq!(sim.last().body.as_ref(), &body[..], "the body went upstream byte for byte");
    assert!(answer.text().starts_with("data: "), "an SSE stream came back");
}

#[tokio::test(flavor = "multi_thread")]
async fn forced_pruning_and_truncation_keep_the_pairing_rules_and_never_touch_signatures_or_media() {
    let mut value: Value = serde_json::from_slice(&corpus()).unwrap();
    // A part type compactor does not know, in a model turn.
    value["contents"][3]["parts"].as_array_mut().unwrap().push(json!({"futurePart": {"blob": "x+y/z=="}}));
    let sent = serde_json::to_vec(&value).unwrap();
    let modes = [
        ("prune", "[prune]\nprotect_tokens = 1\nminimum_tokens = 1\n[truncate]\nenabled = false\n"),
        ("truncate", "[prune]\nenabled = false\n[truncate]\ntool_output_max_tokens = 40\n"),
    ];
    for (mode, config) in modes {
        let sim = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
        let proxy = ProxyProcess::start_with(&sim.compactor_config(config), &[]);
        let answer = post(&proxy, "/v1beta/models/gemini-3-pro-preview:generateContent", sent.clone()).await;
        assert_eq!(answer.status, 200, "{mode}: the provider accepted it: {}", answer.text());
        let out: Value = serde_json::from_slice(&sim.last().body).unwrap();
        assert_ne!(sim.last().body.as_ref(), &sent[..], "{mode}: something was rewritten");
        assert_eq!(untouchable(&out), untouchable(&value), "{mode}: signed parts, media and the provider's parts");
        let texts = |body: &Value| -> Vec<Value> {
            parts(body)
                .into_iter()
                .filter(|(_, p)| p.get("text").is_some())
                .collect::<Vec<_>>()
                .into_iter()
                .map(|(_, p)| p)
                .collect()
        };
        assert_eq!(texts(&out), texts(&value), "{mode}: every text and thought");
        let responses = |body: &Value| -> Vec<(usize, Value)> {
            parts(body).into_iter().filter(|(_, p)| p.get("functionResponse").is_some()).collect()
        };
        let (before, after) = (responses(&value), responses(&out));
        assert_eq!(before.len(), after.len(), "{mode}: every response stays");
        let mut shortened = 0;
        for ((i, old), (j, new)) in before.iter().zip(&after) {
            let (old, new) = (&old["functionResponse"], &new["functionResponse"]);
            assert_eq!(i, j, "{mode}: a response stays in its turn");
            assert_eq!((&old["name"], old.get("id")), (&new["name"], new.get("id")), "{mode}: name and id kept");
            let keys: Vec<&String> = new["response"].as_object().unwrap().keys().collect();
            assert_eq!(keys, ["output"], "{mode}: the response keeps its shape");
            if old != new {
                shortened += 1;
                assert!(
                    new["response"]["output"].as_str().unwrap().len()
                        < old["response"]["output"].as_str().unwrap().len()
                );
            }
        }
        assert!(shortened >= 2, "{mode}: the large outputs were shortened ({shortened})");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overflow_is_recovered_by_pruning_and_by_a_tool_less_summary_call() {
    let body = corpus();
    // The corpus as the simulator counts it: windows it overflows (by 15 %, which pruning frees,
    // and by a third, with pruning off).
    let probe = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
    let proxy = ProxyProcess::start_with(&probe.compactor_config(""), &[]);
    post(&proxy, STREAM, body.clone()).await;
    let tokens = probe.last().tokens;
    let cases = [
        ("prune", tokens * 85 / 100, "[compaction]\nladder = [\"prune_hard\"]\n"),
        (
            "summarize",
            tokens * 2 / 3,
            "[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 300\n",
        ),
    ];
    for (rung, window, config) in cases {
        let sim = ProviderSim::start(ProviderSpec { window, ..ProviderSpec::default() }).await;
        let proxy = ProxyProcess::start_with(&sim.compactor_config(config), &[]);
        let answer = post(&proxy, STREAM, body.clone()).await;
        assert_eq!(answer.status, 200, "{rung}: recovered: {}", answer.text());
        assert_eq!(answer.header("x-compactor-retries"), Some("1"), "{rung}");
        let records = sim.records();
        assert_eq!(records[0].outcome, Outcome::Overflow, "{rung}: the first attempt overflowed");
        let last = records.last().unwrap();
        assert!(last.outcome.is_answered() && !last.summary, "{rung}: the retry was answered");
        let retried: Value = serde_json::from_slice(&last.body).unwrap();
        assert!(String::from_utf8_lossy(&last.body).contains(SIGNATURE) || rung == "summarize");
        if rung == "summarize" {
            let summary = records.iter().find(|r| r.summary).expect("a summary call");
            assert!(summary.path.starts_with("/v1beta/models/gemini-2.5-pro:generateContent"), "{}", summary.path);
            assert!(!summary.path.contains("alt=sse"));
            let call: Value = serde_json::from_slice(&summary.body).unwrap();
            assert!(call.get("tools").is_none() && call["contents"][0]["role"] == "user", "{call}");
            assert!(retried["contents"][0]["parts"][0]["text"].as_str().unwrap().contains("Handoff summary"));
        } else {
            assert!(!records.iter().any(|r| r.summary), "pruning was enough");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_json_array_stream_passes_through_untouched() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let proxy = ProxyProcess::start_with(&sim.compactor_config(""), &[]);
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "Tell me a story."}]}]}).to_string();
    let path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";
    let through = post(&proxy, path, body.clone()).await;
    let direct = send(request("POST", &format!("{}{path}", sim.url()), &[("x-goog-api-key", KEY)], body)).await;
    assert_eq!(through.status, 200);
    assert!(through.text().starts_with('[') && through.text().ends_with(']'), "{}", through.text());
    assert_eq!(through.body, direct.body, "the array came as the provider sent it");
    assert_eq!(through.header("content-type"), direct.header("content-type"));
}

#[tokio::test(flavor = "multi_thread")]
async fn compactor_errors_speak_gemini_and_the_query_key_scopes_the_tenant_unlogged() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let proxy = ProxyProcess::start_with(&sim.compactor_config("[limits]\nmax_body_bytes = 2000\n"), &[]);
    let big = json!({"contents": [{"role": "user", "parts": [{"text": "x".repeat(5000)}]}]});
    let refused = proxy.post("/v1beta/models/gemini-2.5-flash:generateContent", &[], &big).await;
    assert_eq!(refused.status, 413);
    let error = &refused.json()["error"];
    assert_eq!((error["code"].as_u64(), error["status"].as_str()), (Some(413), Some("INVALID_ARGUMENT")), "{error}");
    assert!(error["message"].as_str().unwrap().contains("2000 bytes"));

    let small = json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]});
    let session = |key: &str| {
        let path = format!("/v1beta/models/gemini-2.5-flash:generateContent?key={key}");
        let proxy = &proxy;
        let small = small.clone();
        async move { proxy.post(&path, &[], &small).await.header("x-compactor-session").unwrap().to_string() }
    };
    let (a, a_again, b) = (session("secret-key-a").await, session("secret-key-a").await, session("secret-key-b").await);
    let tenant = |s: &str| s.split('.').next().unwrap().to_string();
    assert_eq!(a, a_again);
    assert_ne!(tenant(&a), tenant(&b), "another key, another tenant");
    assert_ne!(tenant(&a), "anonymous");
    assert!(sim.last().path.contains("key=secret-key-b"), "the key goes upstream as sent");
    let logs = proxy.logs().join("\n");
    assert!(!logs.contains("secret-key"), "a key in the logs:\n{logs}");
}

/// A Gemini CLI turn: its system prompt, the `<session_context>` part (with `listing`), the prompt.
fn cli_turn(listing: &str, system: &str, extra: &[Value]) -> Value {
    let mut contents = vec![json!({"role": "user", "parts": [
        {"text": format!("<session_context>\nToday's date is Thursday.\n{listing}\n</session_context>")},
        {"text": "Refactor the parser."}
    ]})];
    contents.extend_from_slice(extra);
    json!({"contents": contents, "systemInstruction": {"role": "user", "parts": [{"text": system}]},
        "tools": [{"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": {"type": "object"}}]}]})
}

#[tokio::test(flavor = "multi_thread")]
async fn gemini_cli_sessions_stay_one_and_its_own_compression_is_left_alone() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let config = "[prune]\nprotect_tokens = 1\nminimum_tokens = 1\n[truncate]\nenabled = false\n";
    let proxy = ProxyProcess::start_with(&sim.compactor_config(config), &[]);
    let agent = "You are an interactive CLI agent.";
    let first = proxy.post(STREAM, &[("x-goog-api-key", KEY)], &cli_turn("src/a.rs", agent, &[])).await;
    let turn = [
        json!({"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "read_file", "args": {}}, "thoughtSignature": SIGNATURE}]}),
        json!({"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "read_file", "response": {"output": "line\n".repeat(2000)}}}]}),
        json!({"role": "model", "parts": [{"functionCall": {"id": "c2", "name": "read_file", "args": {}}, "thoughtSignature": SIGNATURE}]}),
        json!({"role": "user", "parts": [{"functionResponse": {"id": "c2", "name": "read_file", "response": {"output": "src/a.rs: fifty lines of a parser\n".repeat(20)}}}]}),
    ];
    let later = [
        turn[0].clone(),
        turn[1].clone(),
        turn[2].clone(),
        turn[3].clone(),
        json!({"role": "model", "parts": [{"text": "Read it."}]}),
        json!({"role": "user", "parts": [{"text": "Go on."}]}),
    ];
    let second = proxy.post(STREAM, &[("x-goog-api-key", KEY)], &cli_turn("src/a.rs\nsrc/b.rs", agent, &later)).await;
    assert_eq!(first.header("x-compactor-session"), second.header("x-compactor-session"), "one session");
    assert_eq!(first.header("x-compactor-conversation"), second.header("x-compactor-conversation"), "one conversation");
    assert!(
        sim.last().body.len() < 6000,
        "the large output was pruned: {:?} {}",
        second.headers,
        sim.last().body.len()
    );

    let compression = "You are a specialized system component responsible for distilling chat history into a structured XML <state_snapshot>.";
    let body = serde_json::to_vec(&cli_turn("src/a.rs", compression, &turn)).unwrap();
    let answer = post(&proxy, "/v1beta/models/gemini-2.5-pro:generateContent", body.clone()).await;
    assert_eq!(answer.status, 200);
    assert_eq!(sim.last().body.as_ref(), &body[..], "Gemini CLI's compression request went as it came");
}

/// A model turn calling `read_file` without an id, and the user turn answering it with `output`.
fn call_without_id(output: String) -> [Value; 2] {
    [
        json!({"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {}}, "thoughtSignature": SIGNATURE}]}),
        json!({"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": output}}}]}),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_compaction_the_newest_output_of_a_call_without_id_is_not_taken_for_a_pruned_one() {
    let sim = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
    let config = "[prune]\nprotect_tokens = 1\nminimum_tokens = 1\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 300\n";
    let proxy = ProxyProcess::start_with(&sim.compactor_config(config), &[]);
    let agent = "You are an interactive CLI agent.";
    let mut turns: Vec<Value> =
        (0..6).flat_map(|k| call_without_id(format!("src/f{k}.rs: a line of the file\n").repeat(60))).collect();
    // The first request prunes every output but the newest: the session remembers their ids.
    let first = proxy.post(STREAM, &[("x-goog-api-key", KEY)], &cli_turn("src/a.rs", agent, &turns)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let pruned = String::from_utf8_lossy(&sim.last().body).matches("Old tool result content cleared").count();
    assert!(pruned >= 4, "the older outputs were pruned ({pruned})");
    let key = first.header("x-compactor-session").unwrap().to_string();
    let path = format!("/admin/sessions/{key}");
    let token = crate::common::agents::ADMIN_TOKEN;
    assert!(eventually(async || proxy.get_with_token(&path, token).await.status == 200).await);
    assert_eq!(proxy.call_with_token("POST", &format!("{path}/compact"), token).await.status, 202);
    // The next turn is compacted: the summary replaces all but the last turns, whose calls stand
    // at other positions of the body that goes.
    let newest = "src/g.rs: the file the model reads now\n".repeat(40);
    turns.extend(call_without_id(newest.clone()));
    let second = proxy.post(STREAM, &[("x-goog-api-key", KEY)], &cli_turn("src/a.rs", agent, &turns)).await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.header("x-compactor-compacted"), Some("1"), "{:?}", second.headers);
    let sent: Value = serde_json::from_slice(&sim.last().body).unwrap();
    let contents = sent["contents"].as_array().unwrap();
    assert!(contents.len() < 14, "the summary replaced the older turns ({} contents)", contents.len());
    let last = &contents.last().unwrap()["parts"][0]["functionResponse"]["response"]["output"];
    assert_eq!(last.as_str(), Some(newest.as_str()), "the newest output goes whole");
}

/// Tool outputs planted in responses whose id the call does not share: each must reach the model.
const OUTPUT_A: &str = "PLANTED-OUTPUT-a.rs-4f1c";
const OUTPUT_B: &str = "PLANTED-OUTPUT-b.rs-8e2d";
const OUTPUT_SHELL: &str = "PLANTED-OUTPUT-shell-3a9b";

#[tokio::test(flavor = "multi_thread")]
async fn responses_whose_ids_the_calls_do_not_share_reach_the_model_as_the_client_sent_them() {
    let sim = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
    let proxy = ProxyProcess::start_with(&sim.compactor_config(""), &[]);
    // Older Gemini CLI releases: calls the model gave no id answered by responses with ids the
    // CLI made up; and a call with an id answered by a response without one.
    let turn = [
        json!({"role": "model", "parts": [
            {"functionCall": {"name": "read_file", "args": {"path": "a.rs"}}, "thoughtSignature": SIGNATURE},
            {"functionCall": {"name": "read_file", "args": {"path": "b.rs"}}},
            {"functionCall": {"id": "model-call-7", "name": "run_shell_command", "args": {"command": "ls"}}}
        ]}),
        json!({"role": "user", "parts": [
            {"functionResponse": {"id": "cli-made-up-1", "name": "read_file", "response": {"output": OUTPUT_A}}},
            {"functionResponse": {"id": "cli-made-up-2", "name": "read_file", "response": {"output": OUTPUT_B}}},
            {"functionResponse": {"name": "run_shell_command", "response": {"output": OUTPUT_SHELL}}}
        ]}),
    ];
    let body = serde_json::to_vec(&cli_turn("src/a.rs", "You are an interactive CLI agent.", &turn)).unwrap();
    let answer = post(&proxy, STREAM, body.clone()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let forwarded = String::from_utf8_lossy(&sim.last().body).to_string();
    for output in [OUTPUT_A, OUTPUT_B, OUTPUT_SHELL] {
        assert!(forwarded.contains(output), "the tool's output {output} reached the model: {forwarded}");
    }
    assert!(!forwarded.contains("aborted"), "no output was replaced: {forwarded}");
    assert_eq!(sim.last().body.as_ref(), &body[..], "every call was answered: the body went as it came");
}

#[tokio::test(flavor = "multi_thread")]
async fn count_tokens_counts_the_conversation_as_its_next_request_is_sent() {
    let sim = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
    let config = "[prune]\nprotect_tokens = 1\nminimum_tokens = 1\n[truncate]\nenabled = false\n";
    let proxy = ProxyProcess::start_with(&sim.compactor_config(config), &[]);
    let body = corpus();
    let sent = post(&proxy, STREAM, body.clone()).await;
    assert_eq!(sent.status, 200);
    let forwarded = sim.last().tokens;
    let counted = post(&proxy, "/v1beta/models/gemini-2.5-pro:countTokens", body.clone()).await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    assert_eq!(counted.json()["totalTokens"].as_u64(), Some(forwarded as u64), "counted as it is sent, pruned");
    let direct =
        send(request("POST", &format!("{}/v1beta/models/gemini-2.5-pro:countTokens", sim.url()), &[], body)).await;
    assert!(direct.json()["totalTokens"].as_u64().unwrap() > forwarded as u64, "the client's body counts more");
    // A count never changes the session: the next request goes out the same.
    post(&proxy, STREAM, corpus()).await;
    assert_eq!(sim.last().tokens, forwarded);
}

const VERTEX_MODEL_PATH: &str = "/v1/projects/my-project/locations/us-central1/publishers/google/models/gemini-2.5-pro";
const BEARER: &str = "Bearer ya29.vertex-oauth-token-4242";

/// compactor with Gemini's (and every other) upstream at `gemini`, Vertex AI's at `vertex`.
fn vertex_config(gemini: &ProviderSim, vertex: Option<&ProviderSim>, extra: &str) -> String {
    let vertex = vertex.map(|v| format!("vertex = \"{}\"\n", v.url())).unwrap_or_default();
    format!("[upstream]\nopenai = \"{0}\"\nanthropic = \"{0}\"\ngemini = \"{0}\"\n{vertex}{extra}", gemini.url())
}

#[tokio::test(flavor = "multi_thread")]
async fn vertex_paths_go_to_upstream_vertex_with_their_bearer_which_scopes_the_tenant_unlogged() {
    let gemini = ProviderSim::start(ProviderSpec::default()).await;
    // A window the corpus overflows by a third, with pruning off: recovered by a summary call,
    // which must go to Vertex AI's path too.
    let probe = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
    let probing = ProxyProcess::start_with(&vertex_config(&gemini, Some(&probe), ""), &[]);
    let path = format!("{VERTEX_MODEL_PATH}:streamGenerateContent?alt=sse");
    let headers = [("authorization", BEARER), ("content-type", "application/json")];
    let answer = send(request("POST", &probing.url(&path), &headers, corpus())).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().starts_with("data: "), "an SSE stream came back");
    assert_eq!(probe.last().path, path, "the path went to Vertex AI as sent");
    assert_eq!(probe.last().headers.get("authorization").unwrap(), BEARER, "the bearer went along");
    assert_eq!(probe.last().body.as_ref(), &corpus()[..], "nothing to rewrite: byte for byte");
    let tokens = probe.last().tokens;

    let vertex = ProviderSim::start(ProviderSpec { window: tokens * 2 / 3, ..ProviderSpec::default() }).await;
    let config = "[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 300\n";
    let proxy = ProxyProcess::start_with(&vertex_config(&gemini, Some(&vertex), config), &[]);
    let answer = send(request("POST", &proxy.url(&path), &headers, corpus())).await;
    assert_eq!(answer.status, 200, "recovered: {}", answer.text());
    assert_eq!(answer.header("x-compactor-retries"), Some("1"));
    let records = vertex.records();
    assert_eq!(records[0].outcome, Outcome::Overflow, "Vertex AI's own overflow error came first");
    assert!(String::from_utf8_lossy(&records[0].body).len() > 1000);
    let summary = records.iter().find(|r| r.summary).expect("a summary call");
    assert_eq!(summary.path, format!("{VERTEX_MODEL_PATH}:generateContent"), "the summary call stays on Vertex AI");
    assert_eq!(summary.headers.get("authorization").unwrap(), BEARER);
    let last = records.last().unwrap();
    assert!(last.outcome.is_answered() && !last.summary && last.path == path, "the retry was answered");
    assert_eq!(gemini.len(), 0, "nothing reached the Gemini API's upstream");

    // The bearer scopes the tenant, and never shows in a log.
    let small = json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}).to_string();
    let session = |bearer: &'static str| {
        let (proxy, path, small) = (&proxy, format!("{VERTEX_MODEL_PATH}:generateContent"), small.clone());
        async move {
            let answer = send(request("POST", &proxy.url(&path), &[("authorization", bearer)], small)).await;
            answer.header("x-compactor-session").unwrap().to_string()
        }
    };
    let (a, a_again, b) = (session(BEARER).await, session(BEARER).await, session("Bearer ya29.other-token").await);
    let tenant = |s: &str| s.split('.').next().unwrap().to_string();
    assert_eq!(a, a_again);
    assert_ne!(tenant(&a), tenant(&b), "another bearer, another tenant");
    assert_ne!(tenant(&a), "anonymous");
    let logs = [probing.logs(), proxy.logs()].concat().join("\n");
    assert!(!logs.contains("ya29"), "a bearer in the logs:\n{logs}");
    assert!(!logs.contains("my-project"), "a path in the logs:\n{logs}");
}

#[tokio::test(flavor = "multi_thread")]
async fn vertex_paths_without_upstream_vertex_get_a_gemini_error_and_go_nowhere() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let proxy = ProxyProcess::start_with(&vertex_config(&sim, None, ""), &[]);
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}).to_string();
    for method in ["streamGenerateContent?alt=sse", "generateContent", "countTokens", "predict"] {
        let path = format!("{VERTEX_MODEL_PATH}:{method}");
        let answer = send(request("POST", &proxy.url(&path), &[("authorization", BEARER)], body.clone())).await;
        assert_eq!(answer.status, 404, "{method}: {}", answer.text());
        assert_eq!(answer.header("x-compactor-error"), Some("no_upstream"));
        let error = &answer.json()["error"];
        assert_eq!((error["code"].as_u64(), error["status"].as_str()), (Some(404), Some("NOT_FOUND")), "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("Vertex AI") && message.contains("upstream.vertex"), "{message}");
    }
    assert_eq!(sim.len(), 0, "nothing was forwarded anywhere");
    // The Gemini API's own paths are unaffected.
    let answer = post(&proxy, "/v1beta/models/gemini-2.5-flash:generateContent", body).await;
    assert_eq!(answer.status, 200);
}

/// `generationConfig.maxOutputTokens` is the request's output cap: the room compactor keeps for
/// the answer. A prompt that fits the window less 100 tokens of answer goes as it is; the same
/// prompt asking for more than the default reserve (4,096) is compacted ahead of time.
#[tokio::test(flavor = "multi_thread")]
async fn the_nested_max_output_tokens_sets_the_room_kept_for_the_answer() {
    let model =
        "[models.gemini-window-test]\nmax_output_tokens = 65536\ntoken_factor = 1.0\nencoding = \"o200k_base\"\n";
    let config = |window: u64| {
        format!(
            "{model}context_window = {window}\n[prune]\nenabled = false\n[truncate]\nenabled = false\n\
             [compaction]\nkeep_recent_tokens = 300\n"
        )
    };
    let capped = |cap: u64| {
        let mut body: Value = serde_json::from_slice(&corpus()).unwrap();
        body["generationConfig"]["maxOutputTokens"] = json!(cap);
        serde_json::to_vec(&body).unwrap()
    };
    let path = "/v1beta/models/gemini-window-test:generateContent";
    let sim = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
    let probe = ProxyProcess::start_with(&sim.compactor_config(&config(1_000_000)), &[]);
    let answer = post(&probe, path, capped(100)).await;
    let prompt: f64 = answer.header("x-compactor-tokens-before").unwrap().parse().unwrap();
    // Over (window - 4096) x 0.95 (would overflow with the default reserve), under
    // (window - 100) x 0.8 (the threshold with 100 tokens kept).
    let window = ((prompt / 0.8 + 100.0 + prompt / 0.95 + 4096.0) / 2.0) as u64;

    for (cap, compacted) in [(100, false), (60_000, true)] {
        let sim = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
        let proxy = ProxyProcess::start_with(&sim.compactor_config(&config(window)), &[]);
        let body = capped(cap);
        let answer = post(&proxy, path, body.clone()).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(sim.summary_calls() > 0, compacted, "maxOutputTokens {cap} on a {window} window, prompt {prompt}");
        assert_eq!(answer.header("x-compactor-compacted").is_some(), compacted);
        if !compacted {
            assert_eq!(sim.last().body.as_ref(), &body[..], "sent as it came");
        }
    }
}
