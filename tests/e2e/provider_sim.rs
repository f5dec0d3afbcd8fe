//! The provider simulator and the agent-shaped sessions are instruments other tests and the
//! session benchmarks rely on: it counts by its own density, names or hides its window as told,
//! reports cache reads by prefix in each dialect's fields, answers summary calls with every fact it
//! was given, rejects broken tool pairs; the sessions look like the agents' own and grow without
//! ever breaking the provider's cache by themselves.

use std::time::{Duration, Instant};

use crate::common::agents::*;
use crate::common::provider::*;
use crate::common::*;
use serde_json::{Value, json};

/// Four characters per token, so expected counts can be worked out by hand.
fn exact(window: usize) -> ProviderSpec {
    ProviderSpec { window, chars_per_token: 4.0, ..ProviderSpec::default() }
}

async fn post(provider: &ProviderSim, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(request("POST", &format!("{}{path}", provider.url()), &all, serde_json::to_vec(body).unwrap())).await
}

/// The usage object of a JSON answer or of the SSE event that carries it.
fn usage(answer: &Answer) -> Value {
    let found = |value: &Value| {
        [&value["usage"], &value["message"]["usage"], &value["response"]["usage"]]
            .into_iter()
            .find(|u| u.get("input_tokens").is_some() || u.get("prompt_tokens").is_some())
            .cloned()
    };
    if let Ok(value) = serde_json::from_slice::<Value>(&answer.body) {
        return found(&value).expect("usage in the answer");
    }
    answer
        .text()
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find_map(|event| found(&event))
        .expect("usage in the stream")
}

fn chat(system: &str, users: &[&str]) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system})];
    for (i, user) in users.iter().enumerate() {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": "ok"}));
        }
        messages.push(json!({"role": "user", "content": user}));
    }
    json!({"model": "m", "messages": messages})
}

fn anthropic(system: &str, users: &[&str]) -> Value {
    let mut messages = Vec::new();
    for (i, user) in users.iter().enumerate() {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}]}));
        }
        let mut block = json!({"type": "text", "text": user});
        if i == users.len() - 1 {
            block["cache_control"] = json!({"type": "ephemeral"});
        }
        messages.push(json!({"role": "user", "content": [block]}));
    }
    json!({"model": "m", "max_tokens": 1000, "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}], "messages": messages})
}

fn responses(system: &str, users: &[&str]) -> Value {
    let mut input = Vec::new();
    for (i, user) in users.iter().enumerate() {
        if i > 0 {
            input.push(
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}),
            );
        }
        input.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": user}]}));
    }
    json!({"model": "m", "instructions": system, "input": input})
}

fn conversation(dialect: Dialect, system: &str, users: &[&str]) -> Value {
    match dialect {
        Dialect::Chat => chat(system, users),
        Dialect::Messages => anthropic(system, users),
        Dialect::Responses => responses(system, users),
    }
}

#[tokio::test]
async fn counts_tokens_as_characters_over_its_density() {
    let provider = ProviderSim::start(exact(100_000)).await;
    let tools = json!([{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]);
    let mut body = chat(&"s".repeat(400), &[&"u".repeat(4_000)]);
    body["tools"] = tools.clone();
    let answer = post(&provider, "/v1/chat/completions", &[], &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    // Base 3, each message 4 of framing plus its characters / 4, each tool as raw JSON / 4.
    let expected = 3 + (4 + 100) + (4 + 1_000) + tools[0].to_string().len().div_ceil(4);
    assert_eq!(usage(&answer)["prompt_tokens"], expected);
    assert_eq!(provider.last().tokens, expected);

    let light = ProviderSim::start(ProviderSpec::with_density(1.0)).await;
    let heavy = ProviderSim::start(ProviderSpec::with_density(1.6)).await;
    assert!((heavy.spec().density() - 1.6).abs() < 1e-9);
    let big = chat(&"s".repeat(40_000), &[&"u".repeat(80_000)]);
    let counted = |provider: &ProviderSim| provider.count(Dialect::Chat, &serde_json::to_vec(&big).unwrap()) as f64;
    let ratio = counted(&heavy) / counted(&light);
    assert!((ratio - 1.6).abs() < 0.01, "1.6x density counts {ratio:.3}x");
}

#[tokio::test]
async fn density_one_agrees_with_compactors_estimate_and_density_1_6_counts_more_until_compactor_calibrates() {
    for (density, low, high) in [(1.0, 0.85, 1.2), (1.6, 1.6 * 0.85, 1.6 * 1.2)] {
        for agent in [Agent::OpenCode, Agent::Plain(Dialect::Responses)] {
            let provider = ProviderSim::start(ProviderSpec::with_density(density)).await;
            let proxy = ProxyProcess::start_with(&provider.compactor_config(""), &[]);
            let mut session = AgentSession::new(SessionSpec::new(agent, "sim-model").outputs(&[1_500]));
            let run = drive(&proxy.url(""), &provider, &mut session, 6).await;
            // The first turn shows the provider's density against compactor's own count; by the
            // last, compactor has calibrated its estimate from the provider's usage reports.
            let first = run.turns.first().expect("a turn");
            let last = run.turns.last().expect("a turn");
            for (turn, (low, high)) in [(first, (low, high)), (last, (0.85, 1.2))] {
                let estimate: f64 = turn
                    .compactor
                    .iter()
                    .find(|(name, _)| name == "x-compactor-tokens-after")
                    .and_then(|(_, v)| v.parse().ok())
                    .expect("compactor's estimate");
                let counted = run.answered(turn.index).expect("answered").tokens as f64;
                let ratio = counted / estimate;
                assert!(
                    (low..=high).contains(&ratio),
                    "{agent:?} density {density}: turn {} counted {counted}, compactor {estimate} ({ratio:.2}x)",
                    turn.index
                );
            }
        }
    }
}

#[tokio::test]
async fn overflow_errors_name_the_window_and_prompt_only_when_told_to() {
    let system = "s".repeat(4_000);
    for dialect in Dialect::ALL {
        let body = conversation(dialect, &system, &["hello"]);
        let named = ProviderSim::start(exact(500)).await;
        let prompt = named.count(dialect, &serde_json::to_vec(&body).unwrap());
        assert!(prompt > 1_000);
        let answer = post(&named, dialect.path(), &[], &body).await;
        assert_eq!(answer.status, 400, "{dialect:?}");
        let text = answer.text();
        let wanted = match dialect {
            Dialect::Chat => {
                format!("maximum context length is 500 tokens. However, your messages resulted in {prompt} tokens")
            }
            Dialect::Messages => format!("prompt is too long: {prompt} tokens > 500 maximum"),
            Dialect::Responses => {
                format!("maximum context length is 500 tokens. However, your request has {prompt} input tokens")
            }
        };
        assert!(text.contains(&wanted), "{dialect:?}: {text}");
        assert_eq!(named.last().outcome, Outcome::Overflow);

        let unnamed = ProviderSim::start(ProviderSpec { errors: Errors::Unnamed, ..exact(500) }).await;
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let answer = post(&unnamed, dialect.path(), &[], &body).await;
            let text = answer.text();
            assert!(!text.contains("500") && !text.contains(&prompt.to_string()), "{dialect:?} names a number: {text}");
            match dialect {
                Dialect::Chat => {
                    assert_eq!(answer.status, 400);
                    assert!(text.contains("prompt too long; exceeded max context length by"), "{text}");
                }
                Dialect::Messages => {
                    assert_eq!(answer.status, 413);
                    assert!(text.contains("Request size exceeds model context window"), "{text}");
                }
                Dialect::Responses if stream => {
                    assert_eq!(answer.status, 200, "OpenAI fails a stream inside a 200");
                    assert!(
                        text.contains("event: response.failed") && text.contains("context_length_exceeded"),
                        "{text}"
                    );
                }
                Dialect::Responses => {
                    assert_eq!(answer.status, 400);
                    assert!(text.contains("Your input exceeds the context window of this model"), "{text}");
                }
            }
        }
    }
}

#[tokio::test]
async fn max_tokens_counts_against_the_window_only_when_told_to() {
    let body = anthropic(&"s".repeat(2_000), &["hello"]);
    let counting = ProviderSim::start(ProviderSpec { count_max_tokens: true, ..exact(1_200) }).await;
    let prompt = counting.count(Dialect::Messages, &serde_json::to_vec(&body).unwrap());
    assert!(prompt < 1_200 && prompt + 1_000 > 1_200);
    let answer = post(&counting, "/v1/messages", &[], &body).await;
    assert_eq!(answer.status, 400);
    let wanted = format!("input length and `max_tokens` exceed context limit: {prompt} + 1000 > 1200");
    assert!(answer.text().contains(&wanted), "{}", answer.text());

    let mut openai = chat(&"s".repeat(2_000), &["hello"]);
    openai["max_tokens"] = json!(1_000);
    let answer = post(&counting, "/v1/chat/completions", &[], &openai).await;
    assert!(answer.text().contains("in the messages, 1000 in the completion"), "{}", answer.text());

    let local = ProviderSim::start(exact(1_200)).await;
    assert_eq!(post(&local, "/v1/messages", &[], &body).await.status, 200, "llama.cpp-like: only the prompt must fit");
}

#[tokio::test]
async fn usage_reports_cache_reads_by_prefix_in_each_dialects_fields() {
    let system = "s".repeat(6_000);
    for dialect in Dialect::ALL {
        for stream in [false, true] {
            let provider = ProviderSim::start(exact(100_000)).await;
            let session = [("x-session-id", "cache-test")];
            let with_stream = |mut body: Value| {
                body["stream"] = json!(stream);
                body["stream_options"] = json!({"include_usage": true});
                body
            };
            let first = with_stream(conversation(dialect, &system, &["start the work", "first step"]));
            let grown = with_stream(conversation(dialect, &system, &["start the work", "first step", "second step"]));
            let edited = with_stream(conversation(dialect, &system, &["start the WORK", "first step", "second step"]));
            let tokens = |body: &Value| provider.count(dialect, &serde_json::to_vec(body).unwrap());
            let answer = post(&provider, dialect.path(), &session, &first).await;
            // Streams come chunked, one frame per event, as providers send them.
            assert_eq!(answer.header("content-length").is_none(), stream, "{dialect:?}");
            let cold = usage(&answer);
            let warm = usage(&post(&provider, dialect.path(), &session, &grown).await);
            let broken = usage(&post(&provider, dialect.path(), &session, &edited).await);
            let lead = |unit_count: usize| {
                let body: Value = edited.clone();
                let prompt = Prompt::read(dialect, &body, provider.spec());
                3 + prompt.units[..unit_count].iter().map(|u| u.tokens).sum::<usize>()
            };
            match dialect {
                Dialect::Messages => {
                    // Everything up to the newest message's marker: read what the last request
                    // wrote, write the rest; input_tokens excludes both.
                    assert_eq!(cold["cache_read_input_tokens"], 0, "{stream}");
                    assert_eq!(cold["cache_creation_input_tokens"], tokens(&first));
                    assert_eq!(warm["cache_read_input_tokens"], tokens(&first), "{stream}");
                    assert_eq!(warm["cache_creation_input_tokens"], tokens(&grown) - tokens(&first));
                    assert_eq!(warm["input_tokens"], 0);
                    // The edit in the first message leaves only the system prompt cached.
                    assert_eq!(broken["cache_read_input_tokens"], lead(1), "{stream}");
                    assert_eq!(broken["cache_creation_input_tokens"], tokens(&edited) - lead(1));
                }
                Dialect::Chat | Dialect::Responses => {
                    let cached = |v: &Value| {
                        if dialect == Dialect::Chat {
                            v["prompt_tokens_details"]["cached_tokens"].clone()
                        } else {
                            v["input_tokens_details"]["cached_tokens"].clone()
                        }
                    };
                    assert_eq!(cached(&cold), 0, "{dialect:?} {stream}");
                    assert_eq!(cached(&warm), tokens(&first) / 128 * 128, "{dialect:?} {stream}");
                    assert_eq!(cached(&broken), lead(1) / 128 * 128, "{dialect:?} {stream}");
                }
            }
            let records = provider.records();
            assert_eq!(records[1].prefix_tokens, tokens(&first));
            assert_eq!(records[2].prefix_tokens, lead(1));
        }
    }
}

#[tokio::test]
async fn prompts_under_the_cacheable_minimum_are_never_cached() {
    let provider = ProviderSim::start(exact(100_000)).await;
    let session = [("x-session-id", "short")];
    post(&provider, "/v1/chat/completions", &session, &chat("short", &["a", "b"])).await;
    let answer = post(&provider, "/v1/chat/completions", &session, &chat("short", &["a", "b", "c"])).await;
    assert_eq!(usage(&answer)["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(provider.last().prefix_tokens > 0, "the prefix is still shared");
}

fn summary_request(dialect: Dialect, transcript: &str) -> Value {
    let system = "You are a context-compaction assistant. You receive the transcript of an AI agent's work session.";
    let user = format!("<transcript>\n{transcript}</transcript>\n\nWrite a detailed handoff summary.");
    let mut body = conversation(dialect, system, &[&user]);
    body["stream"] = json!(false);
    body
}

#[tokio::test]
async fn summary_calls_echo_every_fact_they_read_after_the_delay_and_overflow_when_too_big() {
    let transcript = format!(
        "USER: the codename is ZEPHYR-LANTERN-42.\n\nTOOL RESULT [call_1]: {} QUASAR-MAPLE-7 {}\n\nUSER: mind COBALT-HERON-3.",
        "x".repeat(500),
        "y".repeat(500)
    );
    for dialect in Dialect::ALL {
        let delay = Duration::from_millis(300);
        let provider =
            ProviderSim::start(ProviderSpec { summary_delay: delay, summary_tokens: 50, ..exact(100_000) }).await;
        let started = Instant::now();
        let answer = post(&provider, dialect.path(), &[], &summary_request(dialect, &transcript)).await;
        assert!(started.elapsed() >= delay, "{dialect:?} answered before its delay");
        assert_eq!(answer.status, 200, "{}", answer.text());
        let text = answer.text();
        for marker in ["ZEPHYR-LANTERN-42", "QUASAR-MAPLE-7", "COBALT-HERON-3"] {
            assert!(text.contains(marker), "{dialect:?}: {marker} missing from {text}");
        }
        let record = provider.last();
        assert!(record.summary && record.outcome.is_answered());
        assert_eq!(provider.summary_calls(), 1);

        // A small model summarizing itself: the summary call has to fit its window too.
        let small = ProviderSim::start(exact(200)).await;
        let answer = post(&small, dialect.path(), &[], &summary_request(dialect, &transcript)).await;
        assert!(answer.status.is_client_error(), "{dialect:?}: {}", answer.text());
        assert!(small.last().summary);
        assert_eq!(small.last().outcome, Outcome::Overflow);

        // The same words with tools attached are the agent's turn, not a summary call.
        let mut with_tools = summary_request(dialect, &transcript);
        with_tools["tools"] = json!([{"name": "run", "type": "function", "input_schema": {"type": "object"}}]);
        post(&provider, dialect.path(), &[], &with_tools).await;
        assert!(!provider.last().summary);
    }
}

#[tokio::test]
async fn broken_tool_pairs_are_rejected_as_each_provider_rejects_them() {
    let provider = ProviderSim::start(exact(100_000)).await;
    let chat = json!({"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "user", "content": "well?"}]});
    let answer = post(&provider, "/v1/chat/completions", &[], &chat).await;
    assert_eq!(answer.status, 400);
    assert!(answer.text().contains("did not have response messages: call_1"), "{}", answer.text());
    assert_eq!(provider.last().outcome, Outcome::Rejected);

    let messages = json!({"model": "m", "max_tokens": 100, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "well?"}]}]});
    let answer = post(&provider, "/v1/messages", &[], &messages).await;
    assert_eq!(answer.status, 400);
    assert!(answer.text().contains("`tool_use` ids were found without `tool_result` blocks"), "{}", answer.text());

    let responses = json!({"model": "m", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "function_call_output", "call_id": "call_9", "output": "orphan"}]});
    let answer = post(&provider, "/v1/responses", &[], &responses).await;
    assert_eq!(answer.status, 400);
    assert!(
        answer.text().contains("No tool call found for function call output with call_id call_9"),
        "{}",
        answer.text()
    );
    assert_eq!(provider.records().iter().filter(|r| r.outcome == Outcome::Rejected).count(), 3);
}

/// Every tool output of a request body, in order.
fn tool_outputs(dialect: Dialect, body: &Value) -> Vec<String> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    };
    match dialect {
        Dialect::Chat => body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| text(&m["content"]))
            .collect(),
        Dialect::Messages => body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == "tool_result")
            .map(|b| text(&b["content"]))
            .collect(),
        Dialect::Responses => body["input"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"].as_str().is_some_and(|t| t.ends_with("_output")))
            .map(|i| text(&i["output"]))
            .collect(),
    }
}

#[tokio::test]
async fn agent_sessions_grow_one_turn_per_request_without_breaking_the_cache() {
    let agents = Agent::REAL.into_iter().chain(Dialect::ALL.map(Agent::Plain));
    for agent in agents {
        let provider = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
        let mut session = AgentSession::new(SessionSpec::new(agent, "sim-model").outputs(&[300, 900, 2_000]));
        let run = drive(&provider.url(), &provider, &mut session, 13).await;
        let stats = run.stats();
        assert_eq!((stats.client_errors, stats.rejected, stats.overflows), (0, 0, 0), "{agent:?}");
        assert_eq!(stats.upstream_calls, 13);
        // Straight to the provider, each request extends the previous one: nothing to re-write.
        let bill = bill_by_prefix(&run.records, &ANTHROPIC);
        assert_eq!(bill.breaks, 0, "{agent:?}");
        assert!(run.lost_facts().is_empty(), "{agent:?}: {:?}", run.lost_facts());
        // A fact in the first user message, every fifth turn's user message, every third output.
        assert_eq!(stats.facts_planted, 1 + 2 + 4, "{agent:?}");
        assert!(run.facts.iter().any(|f| f.in_tool_output) && run.facts.iter().any(|f| !f.in_tool_output));
        let records = run.answered_requests();
        for pair in records.windows(2) {
            assert!(pair[1].units.len() > pair[0].units.len(), "{agent:?}: every turn adds messages");
        }
        let last: Value = serde_json::from_slice(&records[12].body).unwrap();
        let outputs = tool_outputs(agent.dialect(), &last);
        assert_eq!(outputs.len(), 12, "{agent:?}: one tool output per turn");
        // Calls 6 and 12 re-read an earlier file: the same output, byte for byte.
        for reread in [5, 11] {
            assert!(outputs[..reread].contains(&outputs[reread]), "{agent:?}: call {reread} is not a re-read");
        }
        let sizes: Vec<usize> = outputs.iter().map(|o| o.len()).collect();
        assert!(sizes[2] > 3 * sizes[0], "{agent:?}: outputs follow the configured sizes {sizes:?}");
    }
}

fn header<'r>(record: &'r Record, name: &str) -> Option<&'r str> {
    record.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn each_agent_sends_what_clients_md_says_it_sends() {
    let provider = ProviderSim::start(ProviderSpec { window: 1_000_000, ..ProviderSpec::default() }).await;
    let mut runs = Vec::new();
    for agent in Agent::REAL {
        let mut session = AgentSession::new(SessionSpec::new(agent, "sim-model").outputs(&[500]));
        let id = session.session_id().map(str::to_string);
        let run = drive(&provider.url(), &provider, &mut session, 3).await;
        runs.push((agent, id, run));
    }
    for (agent, id, run) in &runs {
        let records = run.answered_requests();
        let record = records[2];
        let body: Value = serde_json::from_slice(&record.body).unwrap();
        match agent {
            Agent::ClaudeCode => {
                assert_eq!(record.path, "/v1/messages?beta=true");
                assert_eq!(header(record, "x-claude-code-session-id"), id.as_deref());
                assert!(header(record, "anthropic-beta").is_some_and(|b| b.contains(',')));
                assert_eq!(body["max_tokens"], 32_000);
                assert_eq!(body["stream"], true);
                let billing = |r: &Record| {
                    let body: Value = serde_json::from_slice(&r.body).unwrap();
                    body["system"][0]["text"].as_str().unwrap().to_string()
                };
                assert!(billing(record).starts_with("x-anthropic-billing-header: cc_version="));
                assert_ne!(billing(records[1]), billing(record), "the billing line changes on every request");
                assert!(body["system"][1]["cache_control"].is_object());
                let marked: Vec<usize> = (0..body["messages"].as_array().unwrap().len())
                    .filter(|&i| body["messages"][i].to_string().contains("cache_control"))
                    .collect();
                assert_eq!(
                    marked,
                    vec![body["messages"].as_array().unwrap().len() - 1],
                    "only the newest message is marked"
                );
                assert!(body["metadata"]["user_id"].as_str().unwrap().contains("_session_"));
            }
            Agent::Codex => {
                assert_eq!(record.path, "/v1/responses");
                assert_eq!(header(record, "session_id"), id.as_deref());
                assert_eq!(header(record, "originator"), Some("codex_cli_rs"));
                assert_eq!(body["prompt_cache_key"].as_str(), id.as_deref());
                assert!(body.get("instructions").is_none());
                assert_eq!(body["input"][0]["role"], "developer");
                assert_eq!((body["store"].clone(), body["stream"].clone()), (json!(false), json!(true)));
                let kinds: Vec<&str> =
                    body["input"].as_array().unwrap().iter().filter_map(|i| i["type"].as_str()).collect();
                assert!(kinds.contains(&"reasoning") && kinds.contains(&"function_call"), "{kinds:?}");
                assert!(body.to_string().contains("encrypted_content"));
            }
            Agent::OpenCode => {
                assert_eq!(header(record, "x-session-id"), id.as_deref());
                assert_eq!(header(record, "x-session-affinity"), id.as_deref());
                assert!(id.as_deref().is_some_and(|i| i.starts_with("ses_")));
                assert_eq!(body["max_tokens"], 32_000);
                assert_eq!(body["stream_options"]["include_usage"], true);
                let system = body["messages"][0]["content"].as_str().unwrap();
                assert!((9_000..10_200).contains(&system.len()), "{}", system.len());
                assert_eq!(body["tools"].as_array().unwrap().len(), 9);
                assert_eq!(body["messages"][2]["content"], "");
                assert!(body["messages"][3]["content"].is_string());
            }
            Agent::QwenCode => {
                assert!(id.is_none());
                for name in ["x-session-id", "session_id", "x-claude-code-session-id", "x-session-affinity"] {
                    assert!(header(record, name).is_none(), "Qwen Code sends no {name}");
                }
                assert!(body.get("prompt_cache_key").is_none());
                assert_eq!(body["max_tokens"], 32_000);
                let system = body["messages"][0]["content"].as_str().unwrap();
                assert!((26_000..28_000).contains(&system.len()), "{}", system.len());
                assert_eq!(body["tools"].as_array().unwrap().len(), 14);
                assert_eq!(body["messages"][1]["content"].as_array().unwrap().len(), 3);
                assert!(body["messages"][2]["content"].is_null());
                let shell = body["messages"][5]["content"][0]["text"].as_str().unwrap();
                assert!(
                    shell.starts_with("Command: ") && shell.contains("\nOutput: ") && shell.contains("\nExit Code: 0")
                );
            }
            Agent::Plain(_) => unreachable!(),
        }
    }
    // Four sessions on one provider, each its own: Qwen Code's by its opening.
    let sessions: std::collections::HashSet<&str> =
        runs.iter().flat_map(|(_, _, run)| run.records.iter().map(|r| r.session.as_str())).collect();
    assert_eq!(sessions.len(), 4);
}

#[tokio::test]
async fn lost_facts_are_found_where_compactor_replaced_what_carried_them() {
    let spec = SessionSpec::new(Agent::Plain(Dialect::Chat), "sim-model").outputs(&[400]);
    let provider = ProviderSim::start(ProviderSpec::default()).await;
    let proxy = ProxyProcess::start_with(
        &provider.compactor_config("[prune]\nprotect_tokens = 300\nminimum_tokens = 100\n"),
        &[],
    );
    let run = drive(&proxy.url(""), &provider, &mut AgentSession::new(spec.clone()), 12).await;
    let lost = run.lost_facts();
    assert!(!lost.is_empty(), "pruning every old output must lose the facts it carried");
    for (marker, _) in &lost {
        let fact = run.facts.iter().find(|f| &f.marker == marker).unwrap();
        assert!(fact.in_tool_output, "{marker} was in a user message, which is never pruned");
    }
    let stats = run.stats();
    assert_eq!(stats.facts_retained, stats.facts_planted - lost.len());
    assert!(stats.facts_retained_percent() < 100.0);

    // The same session with room and default settings keeps everything.
    let provider = ProviderSim::start(ProviderSpec::default()).await;
    let proxy = ProxyProcess::start_with(&provider.compactor_config(""), &[]);
    let run = drive(&proxy.url(""), &provider, &mut AgentSession::new(spec), 12).await;
    assert_eq!(run.lost_facts(), Vec::<(String, usize)>::new());
}

#[tokio::test]
async fn compactors_summary_calls_are_recognized_and_answered_with_the_facts() {
    let provider = ProviderSim::start(ProviderSpec { window: 4_096, ..ProviderSpec::default() }).await;
    let proxy = ProxyProcess::start_with(&provider.compactor_config(""), &[]);
    let spec = SessionSpec::new(Agent::Plain(Dialect::Chat), "sim-model").outputs(&[600]);
    let run = drive(&proxy.url(""), &provider, &mut AgentSession::new(spec), 12).await;
    let summaries: Vec<&Record> = run.records.iter().filter(|r| r.summary && r.outcome.is_answered()).collect();
    assert!(!summaries.is_empty(), "a 4k window must make compactor summarize a ~8k session");
    assert_eq!(run.stats().rejected, 0);
    // What the summarizer read comes back in the summary, and the summary reaches the model.
    let after = run
        .turns
        .iter()
        .filter_map(|t| run.answered(t.index))
        .find(|r| String::from_utf8_lossy(&r.body).contains("Handoff summary"))
        .expect("a request carrying the summary");
    let body = String::from_utf8_lossy(&after.body);
    let number: usize =
        body.split("Handoff summary ").nth(1).and_then(|t| t.split('.').next()).unwrap().parse().unwrap();
    let echoed = &summaries[number - 1].markers;
    assert!(!echoed.is_empty());
    for marker in echoed {
        assert!(after.markers.contains(marker), "{marker} did not reach the model through summary {number}");
    }
}

#[tokio::test]
async fn bills_price_breaks_by_prefix_and_by_breakpoints() {
    let provider = ProviderSim::start(exact(100_000)).await;
    let session = [("x-session-id", "bill")];
    let system = "s".repeat(8_000);
    let users: Vec<String> = (0..30).map(|i| format!("step {i} {}", "w".repeat(400))).collect();
    let refs = |n: usize| users[..n].iter().map(String::as_str).collect::<Vec<_>>();
    post(&provider, "/v1/messages", &session, &anthropic(&system, &refs(25))).await;
    post(&provider, "/v1/messages", &session, &anthropic(&system, &refs(26))).await;
    // The third request changes the second message: everything after it is new again.
    let mut edited = refs(27);
    edited[1] = "step one, rewritten";
    post(&provider, "/v1/messages", &session, &anthropic(&system, &edited)).await;
    let records = provider.records();
    let prefix = bill_by_prefix(&records, &ANTHROPIC);
    assert_eq!(prefix.breaks, 1);
    assert_eq!(prefix.cache_read, records[1].prefix_tokens + records[2].prefix_tokens);
    assert_eq!(prefix.cache_read + prefix.cache_write, prefix.input_tokens);
    let expected = prefix.cache_read as f64 * 0.1 + prefix.cache_write as f64 * 1.25;
    assert!((prefix.cost - expected).abs() < 1e-6);
    // With breakpoints on the system prompt and the newest message only, the third request finds
    // no entry within 20 blocks of its end and re-writes everything after the system prompt.
    let breakpoints = bill_by_breakpoints(&records, &ANTHROPIC);
    assert_eq!(breakpoints.breaks, 1);
    let system_tokens = 3 + 2_000;
    assert_eq!(breakpoints.cache_read, records[0].tokens.min(records[1].tokens) + system_tokens);
    assert!(breakpoints.cost > prefix.cost, "the breakpoint rule re-writes more than the prefix");
    // OpenAI counts cached prefixes in steps of 128 tokens.
    assert_eq!(bill_by_prefix(&records, &OPENAI).cache_read % 128, 0);
}

#[tokio::test]
async fn driving_through_compactor_waits_until_each_turn_is_recorded() {
    let provider = ProviderSim::start(ProviderSpec::default()).await;
    let proxy = ProxyProcess::start_with(&provider.compactor_config(""), &[]);
    let spec = SessionSpec::new(Agent::OpenCode, "sim-model").outputs(&[300]);
    let run = drive(&proxy.url(""), &provider, &mut AgentSession::new(spec), 5).await;
    let key = run.turns[4].compactor.iter().find(|(name, _)| name == "x-compactor-session").unwrap().1.clone();
    // No waiting here: the driver already waited for the last turn's write.
    let state = send(request(
        "GET",
        &proxy.url(&format!("/admin/sessions/{key}")),
        &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        "",
    ))
    .await;
    assert_eq!(state.status, 200, "{}", state.text());
    assert_eq!(state.json()["state"]["counters"]["requests"], 5);
    // The streamed usage reached compactor: what it stored is the provider's count.
    assert_eq!(state.json()["state"]["conversations"][0]["usage"]["prompt_tokens"], run.answered(4).unwrap().tokens);
}
