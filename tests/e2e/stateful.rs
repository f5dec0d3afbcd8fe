//! Stateful Responses chains (`previous_response_id`) past their window: the official `openai`
//! SDK chaining (`tests/sdk/chains.py`) against the provider simulator with its chains kept,
//! direct (the run dies on the overflow) and through compactor, once per stateful rung; the
//! provider's compaction items byte for byte; `/v1/responses/compact` untouched; and two
//! replicas mapping a recovered chain the same way.
//!
//! Needs `COMPACTOR_SDK_PYTHON` (a Python with the `openai` SDK, `scripts/sdk-venv`), as the SDK
//! suite does: skipped without it unless `COMPACTOR_REQUIRE_SDK_TESTS` is set.

use std::path::Path;
use std::process::Command;

use crate::common::provider::{Errors, ProviderSim, ProviderSpec};
use crate::common::redis_server::RedisServer;
use crate::common::*;
use serde_json::{Value, json};

/// The simulator's window: four turns of the script's files fit, the fifth does not.
const WINDOW: usize = 2_400;
const TURNS: usize = 10;

fn python() -> Option<std::ffi::OsString> {
    let python = std::env::var_os("COMPACTOR_SDK_PYTHON").filter(|p| !p.is_empty());
    if python.is_none() {
        assert!(
            std::env::var_os("COMPACTOR_REQUIRE_SDK_TESTS").is_none(),
            "COMPACTOR_REQUIRE_SDK_TESTS is set but COMPACTOR_SDK_PYTHON is not: COMPACTOR_SDK_PYTHON=$(scripts/sdk-venv | tail -1)"
        );
        println!("skipped: COMPACTOR_SDK_PYTHON is not set");
    }
    python
}

async fn simulator() -> ProviderSim {
    ProviderSim::start(ProviderSpec { window: WINDOW, errors: Errors::Real, chains: true, ..ProviderSpec::default() })
        .await
}

/// One line of the script's output per turn.
struct Run {
    turns: Vec<Value>,
    ok: bool,
}

impl Run {
    fn died_at(&self) -> Option<u64> {
        self.turns.iter().find(|t| t.get("error").is_some()).and_then(|t| t["turn"].as_u64())
    }
    fn rungs(&self) -> Vec<String> {
        self.turns.iter().filter_map(|t| t["rungs"].as_str().map(str::to_string)).collect()
    }
}

async fn chain(python: &std::ffi::OsString, base_url: &str, stream: bool) -> Run {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/chains.py");
    let mut command = Command::new(python);
    command.arg(&script).arg("--base-url").arg(base_url).arg("--turns").arg(TURNS.to_string());
    if stream {
        command.arg("--stream");
    }
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        command.env_remove(var);
    }
    command.env("PYTHONDONTWRITEBYTECODE", "1");
    let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let turns = stdout.lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    Run { turns, ok: output.status.success() }
}

/// The facts the script planted in turn `n` (as `tests/sdk/chains.py` names them).
fn fact(turn: usize) -> String {
    let words = ["AMBER", "BIRCH", "CEDAR", "DELTA", "EMBER", "FJORD", "GROVE", "HAVEN", "IVORY", "JUNIPER"];
    format!("{}-MARKER-{turn}", words[turn % words.len()])
}

/// The facts the model read on the last turn it answered (its chain and compaction items opened).
fn facts_read_last(sim: &ProviderSim) -> Vec<String> {
    let last = sim.records().into_iter().rfind(|r| r.model_call && !r.summary && r.status == 200).expect("an answer");
    last.markers
}

/// The run direct, then through compactor with only `rungs`: direct dies on the overflow,
/// through compactor every turn is answered; the compactor's headers name the rung.
async fn survives_with(rungs: &str, stream: bool) -> Option<(ProviderSim, Run)> {
    let python = python()?;
    let direct = simulator().await;
    let run = chain(&python, &format!("{}/v1", direct.url()), stream).await;
    let died = run.died_at().expect("the direct run dies on its overflow");
    assert!(!run.ok && (3..TURNS as u64).contains(&died), "direct dies past its window, at turn {died}");

    let sim = simulator().await;
    let config = sim.compactor_config("[compaction]\nkeep_recent_tokens = 600\nbackground = false\n").replacen(
        "[admin]",
        &format!("openai_stateful = [{rungs}]\n[admin]"),
        1,
    );
    let proxy = ProxyProcess::start_with(&config, &[]);
    let run = chain(&python, &proxy.url("/v1"), stream).await;
    assert!(run.ok && run.turns.len() == TURNS, "every turn is answered through compactor: {:?}", run.turns);
    assert!(!proxy.logs().join("\n").contains("sk-chain-test"), "the key is in the logs");
    Some((sim, run))
}

fn all_facts() -> Vec<String> {
    let mut facts: Vec<String> = (0..TURNS).map(fact).collect();
    facts.sort();
    facts
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_past_its_window_survives_by_the_provider_s_compaction_with_every_fact() {
    for stream in [false, true] {
        let Some((sim, run)) = survives_with(r#""provider_compaction""#, stream).await else { return };
        assert!(run.rungs().iter().any(|r| r == "provider_compaction:retry"), "{:?}", run.rungs());
        assert!(sim.compactions() > 0, "the provider compacted the chain");
        assert_eq!(sim.summary_calls(), 0, "no summary of compactor's own");
        assert_eq!(facts_read_last(&sim), all_facts(), "stream: {stream}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_past_its_window_survives_rebuilt_and_summarized_with_every_fact() {
    for stream in [false, true] {
        let Some((sim, run)) = survives_with(r#""rebuild""#, stream).await else { return };
        assert!(run.rungs().iter().any(|r| r == "rebuild:retry"), "{:?}", run.rungs());
        assert!(sim.summary_calls() > 0, "compactor summarized the chain it read back");
        assert!(sim.records().iter().any(|r| r.path.contains("/input_items?order=asc")), "the chain was read back");
        assert_eq!(facts_read_last(&sim), all_facts(), "stream: {stream}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_past_its_window_survives_truncated_keeping_the_newest_facts() {
    for stream in [false, true] {
        let Some((sim, run)) = survives_with(r#""truncation""#, stream).await else { return };
        assert!(run.rungs().iter().any(|r| r == "truncation:retry"), "{:?}", run.rungs());
        let read = facts_read_last(&sim);
        // Truncation drops the oldest items: what a user gives up on this rung.
        assert!(read.contains(&fact(TURNS - 1)) && read.contains(&fact(TURNS - 2)), "{read:?}");
        assert!(read.len() < TURNS, "the oldest facts are gone: {read:?}");
    }
}

/// A compaction item the client got back from the provider goes back byte for byte, its request
/// never compacted again by compactor (however far past the threshold), and the compaction
/// endpoint is forwarded untouched (and counted).
#[tokio::test(flavor = "multi_thread")]
async fn compaction_items_and_the_compact_endpoint_pass_untouched() {
    let sim = simulator().await;
    // compactor knows the window, so the request below is past its threshold ahead of time.
    let config = format!(
        "{}[models.gpt-5-codex]\ncontext_window = {WINDOW}\nmax_output_tokens = 400\n",
        sim.compactor_config("[compaction]\nkeep_recent_tokens = 300\nthreshold = 0.5\nbackground = false\n")
    );
    let proxy = ProxyProcess::start_with(&config, &[]);
    let compact =
        json!({"model": "gpt-5-codex", "input": [{"role": "user", "content": "Keep GAMMA-ORBIT-5 in mind."}]});
    let answer = proxy.post("/v1/responses/compact", &[("authorization", "Bearer sk-a")], &compact).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(sim.last().body, serde_json::to_vec(&compact).unwrap(), "the compact request went as it came");
    let item = answer.json()["output"][0].clone();
    assert_eq!(item["type"], "compaction");
    // After the item, old tool outputs past the window's threshold: compactor would prune or
    // summarize them, and a summary over the item would lose what only the provider can read.
    let mut input = vec![item.clone()];
    for n in 0..4 {
        let call_id = format!("call_{n}");
        input.push(json!({"type": "function_call", "call_id": call_id, "name": "read_file", "arguments": "{}"}));
        let output = format!("part_{n}: {}", "The module compiles cleanly. ".repeat(60));
        input.push(json!({"type": "function_call_output", "call_id": call_id, "output": output}));
    }
    input.push(json!({"role": "user", "content": "What did I ask you to keep in mind?"}));
    let body = serde_json::to_string(&json!({"model": "gpt-5-codex", "input": input})).unwrap();
    let answer = send(request(
        "POST",
        &proxy.url("/v1/responses"),
        &[("authorization", "Bearer sk-a"), ("content-type", "application/json")],
        body.clone(),
    ))
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(sim.last().body, body.as_bytes(), "the compaction item's request went byte for byte");
    assert_eq!(sim.summary_calls(), 0, "no summary of compactor's over the provider's compaction");
    assert!(sim.last().markers.contains(&"GAMMA-ORBIT-5".to_string()), "the provider read its own item");
    let metrics = proxy.get_with_token("/metrics", "").await.text();
    assert!(metrics.contains(r#"route="responses_compact""#), "the compact requests are counted");
}

/// Two replicas on one Redis: a chain one of them rebuilt is sent again (the agent's retry of the
/// same turn) to the other, which sends the same rebuilt body without a second overflow or
/// summary; the agent's next turn continues from the answer on either.
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_map_a_rebuilt_chain_the_same_way() {
    let Some(redis) = RedisServer::start() else { return };
    let sim = simulator().await;
    let extra = format!("[compaction]\nkeep_recent_tokens = 600\nbackground = false\n{}", redis.config());
    let config = sim.compactor_config(&extra).replacen("[admin]", "openai_stateful = [\"rebuild\"]\n[admin]", 1);
    let (one, two) = (ProxyProcess::start_with(&config, &[]), ProxyProcess::start_with(&config, &[]));
    let headers = [("authorization", "Bearer sk-shared")];
    let turn = |n: usize, previous: Option<&str>| {
        let text =
            format!("File part_{n}:\n{}\nThe build id is {}.", "The module compiles cleanly. ".repeat(55), fact(n));
        let mut body = json!({"model": "gpt-5-codex", "input": [{"role": "user", "content": text}]});
        if let Some(previous) = previous {
            body["previous_response_id"] = json!(previous);
        }
        body
    };
    let mut previous: Option<String> = None;
    let mut recovered = None;
    for n in 0..TURNS {
        let body = turn(n, previous.as_deref());
        let answer = one.post("/v1/responses", &headers, &body).await;
        assert_eq!(answer.status, 200, "turn {n}: {}", answer.text());
        if answer.header("x-compactor-rungs").is_some_and(|r| r.contains("rebuild:retry")) {
            recovered = Some((body, sim.last().body.clone(), sim.summary_calls(), answer));
            break;
        }
        previous = answer.json()["id"].as_str().map(str::to_string);
    }
    let (body, rebuilt, summaries, recovering) = recovered.expect("replica one rebuilt the chain past its window");
    let overflows = sim.records().iter().filter(|r| r.status == 400).count();
    let again = two.post("/v1/responses", &headers, &body).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("x-compactor-rungs"), Some("rebuild:mapped"));
    assert_eq!(sim.last().body, rebuilt, "the other replica sent the same rebuilt body");
    assert_eq!(sim.summary_calls(), summaries, "no second summary");
    assert_eq!(sim.records().iter().filter(|r| r.status == 400).count(), overflows, "no second overflow");
    // The inspector says which rung recovered the request, on either replica.
    for (answer, rung) in [(&recovering, "rebuild:retry"), (&again, "rebuild:mapped")] {
        let page = format!(
            "/ui/sessions/{}/c/{}",
            answer.header("x-compactor-session").expect("a session"),
            answer.header("x-compactor-conversation").expect("a conversation")
        );
        let html = async || one.get_with_token(&page, crate::common::agents::ADMIN_TOKEN).await.text();
        assert!(eventually(async || html().await.contains(rung)).await, "{rung}: {}", html().await);
    }
    // Another tenant naming the same response id gets nothing of it.
    let stranger = two.post("/v1/responses", &[("authorization", "Bearer sk-other")], &body).await;
    assert_ne!(stranger.header("x-compactor-rungs"), Some("rebuild:mapped"));
    let next = turn(TURNS, again.json()["id"].as_str());
    let answer = one.post("/v1/responses", &headers, &next).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(sim.last().markers.contains(&fact(0)), "the first fact is still read: {:?}", sim.last().markers);
}
