//! An agent-shaped Chat loop against the real server, straight and through compactor.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::ONE_AT_A_TIME;
use super::common::*;
use super::server::{self, Installed, LocalServer, MODEL};

/// The server's window in these tests.
const N_CTX: u32 = 2_048;

/// A POST that may wait for a summary on two busy cores.
async fn post_json(url: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let request = request("POST", url, &all, serde_json::to_vec(body).unwrap());
    let response =
        tokio::time::timeout(Duration::from_secs(240), client().request(request)).await.expect("an answer").unwrap();
    collect(response).await
}

/// Turn `turn`'s user message: a tool output the agent pastes (about 550 of the server's tokens),
/// with one fact in its middle.
fn tool_output(turn: usize) -> String {
    let mut lines: Vec<String> =
        (0..24).map(|i| format!("src/module_{turn}.rs:{i}: let value = compute(input, limit);")).collect();
    lines.insert(12, format!("NOTE: the deploy key of module {turn} is LANTERN-{turn}"));
    format!(
        "Output of `cat src/module_{turn}.rs`:\n{}\nWhat should I look at next? Answer in one sentence.",
        lines.join("\n")
    )
}

/// The request of the loop's next turn.
fn chat(messages: &[Value], stream: bool) -> Value {
    json!({"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0, "stream": stream})
}

/// The assistant's text of an answer, streamed or not.
fn answer_text(answer: &Answer, stream: bool) -> String {
    if !stream {
        return answer.json()["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
    }
    answer
        .text()
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|event| event["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

/// One turn of the loop: what came back and how long it took.
struct Turn {
    status: u16,
    text: String,
    seconds: f64,
    prompt_tokens: u64,
    /// compactor's calibrated estimate of what it sent (`x-compactor-tokens-after`).
    estimate: Option<u64>,
    compacted: Option<String>,
    /// The session key compactor gave it (`x-compactor-session`).
    key: Option<String>,
    error: String,
}

/// Runs `turns` turns at `url`, stopping at the first error; the messages grow by a tool output and
/// the model's answer each turn.
async fn run_loop(url: &str, session: &str, turns: usize) -> Vec<Turn> {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent. Be brief."})];
    let mut done = Vec::new();
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": tool_output(turn)}));
        let started = Instant::now();
        let answer = post_json(url, &[("x-session-id", session)], &chat(&messages, false)).await;
        let seconds = started.elapsed().as_secs_f64();
        let status = answer.status.as_u16();
        if status != 200 {
            done.push(Turn {
                status,
                text: String::new(),
                seconds,
                prompt_tokens: 0,
                estimate: None,
                compacted: None,
                key: None,
                error: answer.text(),
            });
            break;
        }
        let body = answer.json();
        let text = answer_text(&answer, false);
        messages.push(json!({"role": "assistant", "content": text}));
        done.push(Turn {
            status,
            text,
            seconds,
            prompt_tokens: body["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            estimate: answer.header("x-compactor-tokens-after").and_then(|t| t.parse().ok()),
            compacted: answer.header("x-compactor-compacted").map(str::to_string),
            key: answer.header("x-compactor-session").map(str::to_string),
            error: String::new(),
        });
    }
    done
}

/// compactor as it ships in front of the server: no cache preset set, so the loopback address
/// makes it `local`.
fn compactor_in_front(local: &LocalServer, extra: &str) -> ProxyProcess {
    ProxyProcess::start_as_shipped(
        &format!("[upstream]\nopenai = \"{}\"\n[admin]\ntoken = \"admin\"\n{extra}", local.url()),
        &[],
    )
}

fn start() -> Option<(Installed, LocalServer)> {
    let installed = server::installed()?;
    let local = LocalServer::start(&installed, N_CTX);
    Some((installed, local))
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_is_answered_by_the_real_model_through_compactor_streamed_and_not() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some((_installed, local)) = start() else { return };
    let proxy = compactor_in_front(&local, "");
    let messages = [json!({"role": "user", "content": "Say hello in three words."})];
    for stream in [false, true] {
        let answer =
            post_json(&proxy.url("/v1/chat/completions"), &[("x-session-id", "hello")], &chat(&messages, stream)).await;
        assert_eq!(answer.status, 200, "stream={stream}: {}", answer.text());
        assert!(!answer_text(&answer, stream).trim().is_empty(), "stream={stream}: {}", answer.text());
        if stream {
            assert!(answer.text().contains("data: [DONE]"), "{}", answer.text());
        } else {
            assert!(answer.json()["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_loop_outlives_the_window_of_a_real_server() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some((_installed, local)) = start() else { return };
    const TURNS: usize = 7;

    // Straight at the server the loop dies when the conversation passes 2,048 tokens.
    let direct = run_loop(&format!("{}/v1/chat/completions", local.url()), "direct", TURNS).await;
    let failed = direct.last().unwrap();
    assert_ne!(failed.status, 200, "the loop outgrew the window straight at the server");
    assert!(failed.error.contains("context"), "a context-length error: {}", failed.error);
    let died_at = direct.len();
    assert!(died_at < TURNS, "died at turn {died_at}");

    // Through compactor every turn is answered.
    let proxy = compactor_in_front(&local, "");
    let turns = run_loop(&proxy.url("/v1/chat/completions"), "agent", TURNS).await;
    let table: Vec<String> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "turn {i}: status {} {:.2}s prompt {} estimate {:?} compacted {:?} {:?}",
                t.status, t.seconds, t.prompt_tokens, t.estimate, t.compacted, t.text
            )
        })
        .collect();
    println!("direct died at turn {died_at}\n{}", table.join("\n"));
    assert_eq!(turns.len(), TURNS, "{table:#?}");
    assert!(
        turns.iter().all(|t| t.status == 200 && !t.text.trim().is_empty()),
        "{table:#?}: {}",
        turns.last().unwrap().error
    );
    assert!(turns.iter().any(|t| t.compacted.is_some()), "a summary was applied: {table:#?}");

    // At most one overflow: the first, which names the window. llama-cpp-python's server states
    // no window (no `/props`, ids only in `/v1/models`): compactor asked and learned it from there.
    let logs = proxy.logs();
    assert!(logs.iter().any(|l| l.contains("priced as a local inference server")), "{logs:#?}");
    assert!(logs.iter().any(|l| l.contains("the local server states no window")), "{logs:#?}");
    let overflows = logs.iter().filter(|l| l.contains("overflow=openai:")).count();
    assert!(overflows <= 1, "{overflows} overflows: {logs:#?}");
    // The summary calls were answered by the model (a message the server refused would fail them).
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let calls = |outcome: &str| -> u64 {
        let prefix = format!("compactor_summary_calls_total{{outcome=\"{outcome}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    };
    assert!(calls("ok") >= 1, "{metrics}");
    assert_eq!(calls("failed"), 0, "{metrics}");
    assert!(logs.iter().any(|l| l.contains("compacted")), "{logs:#?}");

    // The window compactor learned is the server's, and its estimate meets the server's counts.
    let key = turns.last().unwrap().key.clone().unwrap();
    let session = proxy.get_with_token(&format!("/admin/sessions/{key}"), "admin").await;
    let counters = &session.json()["state"]["counters"];
    assert_eq!(counters["learned_window"], u64::from(N_CTX), "{counters}");
    let last = turns.last().unwrap();
    let estimate = last.estimate.unwrap() as f64;
    let off = (estimate - last.prompt_tokens as f64).abs() / last.prompt_tokens as f64;
    assert!(off < 0.10, "calibrated estimate {estimate} against the server's {} ({counters})", last.prompt_tokens);
}

/// The counter `name{outcome}` as the proxy reports it now.
async fn counter(proxy: &ProxyProcess, name: &str, outcome: &str) -> u64 {
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let prefix = format!("{name}{{outcome=\"{outcome}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

/// `compactor_background_summaries_total{outcome}` as the proxy reports it now.
async fn background(proxy: &ProxyProcess, outcome: &str) -> u64 {
    counter(proxy, "compactor_background_summaries_total", outcome).await
}

#[tokio::test(flavor = "multi_thread")]
async fn after_the_first_overflow_every_summary_is_prepared_in_the_background() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some((_installed, local)) = start() else { return };
    let proxy = compactor_in_front(&local, "[log]\nlevel = \"info,compactor::compaction=debug\"\n");
    let url = proxy.url("/v1/chat/completions");
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent. Be brief."})];
    for turn in 0..12 {
        messages.push(json!({"role": "user", "content": tool_output(turn)}));
        let answer = post_json(&url, &[("x-session-id", "background")], &chat(&messages, false)).await;
        assert_eq!(answer.status, 200, "turn {turn}: {}", answer.text());
        messages.push(json!({"role": "assistant", "content": answer_text(&answer, false)}));
        // The agent's tool runs while a summary is prepared (a single-slot server answers one
        // request at a time: the agent's next turn would queue behind the summary call), and
        // for a second at least: an agent that sends its next turn at once gets no prefill ahead.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let deadline = Instant::now() + Duration::from_secs(120);
        while background(&proxy, "started").await
            > background(&proxy, "ready").await
                + background(&proxy, "busy").await
                + background(&proxy, "failed").await
                + background(&proxy, "nothing").await
        {
            assert!(Instant::now() < deadline, "a background summary still under way after 120 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let logs = proxy.logs();
    let requests: Vec<&String> = logs.iter().filter(|l| l.contains(" request ") || l.ends_with("request")).collect();
    let recovered = requests.iter().position(|l| l.contains("overflow=openai:")).expect("the first overflow");
    // The first overflow met a window compactor did not know yet: its summary was on its path.
    // Every later summary was prepared in the background and applied by the request that needed
    // it, with no summary call of its own.
    for line in &requests[recovered + 1..] {
        assert!(line.contains("summary_calls=0"), "{line}\n\n{logs:#?}");
        assert!(line.contains("overflow=-"), "{line}");
    }
    assert!(background(&proxy, "used").await >= 1, "{logs:#?}");
    assert_eq!(background(&proxy, "failed").await, 0, "{logs:#?}");
    // The prompts rebuilt around those summaries went ahead while the agent's tool ran, and the
    // server took every one (a body it refused would count `failed`).
    let prefills = async |outcome: &str| counter(&proxy, "compactor_prefills_ahead_total", outcome).await;
    assert!(prefills("sent").await >= 1, "{logs:#?}");
    assert_eq!(prefills("failed").await, 0, "{logs:#?}");
    assert!(logs.iter().any(|l| l.contains("compacted") && l.contains("trigger=background")), "{logs:#?}");
}
