//! The fault suite (issue 9): each fault an upstream, a client or the store can commit, played
//! against the real binary, and what the client sees. docs/operations.md, "Failure behaviour", lists the
//! same faults.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::common::redis_server::RedisServer;
use crate::common::*;

const AUTH: (&str, &str) = ("authorization", "Bearer sk-test");

/// A chat request with one tool output of about `tokens` tokens (distinct text), streamed or not.
fn chat_with_output(tokens: usize, stream: bool) -> String {
    serde_json::json!({
        "model": "gpt-4o",
        "stream": stream,
        "messages": [
            {"role": "user", "content": "Run the build."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_output("build", tokens)}
        ]
    })
    .to_string()
}

#[tokio::test]
async fn an_upstream_that_breaks_off_a_held_stream_is_a_502_in_the_dialect_not_a_clean_end() {
    let fake = FakeUpstream::builder()
        .respond_with(|_| {
            Some(Reply::event_chunks(&[": OPENROUTER PROCESSING\n\n", "event: ping\ndata: {}\n\n"], Ending::Cut))
        })
        .start()
        .await;
    let proxy = ProxyProcess::start(&fake, "");
    let chat = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(true))).await;
    assert_eq!(chat.status, 502, "{}", chat.text());
    assert_eq!(chat.header("x-compactor-error"), Some("upstream_cut"));
    assert_eq!(chat.json()["error"]["code"], "upstream_cut");
    let messages = send(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k")], messages_body(true))).await;
    assert_eq!(messages.status, 502);
    assert_eq!(messages.json()["type"], "error");
    let line = proxy.wait_for_log("route=messages").await;
    assert!(line.contains("status=502") && line.contains("error=upstream_cut"), "{line}");
}

#[tokio::test]
async fn a_stream_broken_after_its_first_content_is_cut_for_the_client_and_logged_so() {
    let first = fake::openai_stream(&["Hel"])[0].clone();
    let fake = FakeUpstream::builder()
        .respond_with(move |_| Some(Reply::event_chunks(&[first.as_str()], Ending::Cut)))
        .start()
        .await;
    let proxy = ProxyProcess::start(&fake, "");
    let response =
        client().request(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(true))).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.into_body().collect().await.is_err(), "a broken stream must not end cleanly");
    proxy.wait_for_log("outcome=upstream_error").await;
}

#[tokio::test]
async fn an_error_body_that_stalls_is_passed_on_and_cut_after_the_idle_timeout() {
    let fake = FakeUpstream::builder()
        .respond_with(|_| {
            Some(Reply::chunks(503, vec![Bytes::from_static(br#"{"error":{"message":"overloa"#)], Ending::Stall))
        })
        .start()
        .await;
    let proxy = ProxyProcess::start(&fake, "idle_timeout_ms = 1000\n");
    for (path, body) in [("/v1/chat/completions", chat_body(false)), ("/v1/messages", messages_body(false))] {
        let started = Instant::now();
        let response = client().request(request("POST", &proxy.url(path), &[AUTH], body)).await.unwrap();
        assert_eq!(response.status(), 503, "{path}: the upstream's own status");
        let result = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect()).await;
        assert!(
            result.expect("the body ends instead of hanging").is_err(),
            "{path}: a cut body must not look complete"
        );
        // Cut at the configured second after the stall, not at a multiple of it (1.5 s of slack).
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(1000) && took < Duration::from_millis(2500), "{path}: took {took:?}");
    }
    proxy.wait_for_log("outcome=idle_timeout").await;
}

#[tokio::test]
async fn an_error_body_over_a_mebibyte_passes_through_unchanged() {
    let big = format!(r#"{{"error":{{"message":"bad request","detail":"{}"}}}}"#, "x".repeat(3 << 20));
    let chunks: Vec<Bytes> = big.as_bytes().chunks(64 * 1024).map(Bytes::copy_from_slice).collect();
    let fake = FakeUpstream::builder()
        .respond_with(move |_| Some(Reply::chunks(400, chunks.clone(), Ending::End).with_header("x-request-id", "r1")))
        .start()
        .await;
    let proxy = ProxyProcess::start(&fake, "");
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let answer = send(request("POST", &proxy.url(path), &[AUTH], chat_body(false))).await;
        assert_eq!(answer.status, 400, "{path}");
        assert_eq!(answer.header("x-request-id"), Some("r1"));
        assert!(answer.header("x-compactor-error").is_none());
        assert!(answer.body == big.as_bytes(), "{path}: {} bytes of {}", answer.body.len(), big.len());
    }
}

#[tokio::test]
async fn an_error_body_broken_off_is_a_502_and_a_reply_shorter_than_its_length_is_cut() {
    let fake = FakeUpstream::builder()
        .respond_with(|received| {
            Some(if received.path_and_query.contains("chat") {
                Reply::chunks(400, vec![Bytes::from_static(b"{\"error\":")], Ending::Cut)
            } else {
                // Declares 500 bytes, sends 12.
                Reply::chunks(200, vec![Bytes::from_static(br#"{"id":"msg_1"#)], Ending::End)
                    .with_header("content-length", "500")
            })
        })
        .start()
        .await;
    let proxy = ProxyProcess::start(&fake, "");
    let chat = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
    assert_eq!(chat.status, 502);
    assert_eq!(chat.header("x-compactor-error"), Some("upstream_cut"));

    let response = client()
        .request(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k")], messages_body(false)))
        .await
        .unwrap_or_else(|e| panic!("{e:?} {:?}", proxy.logs()));
    assert_eq!(response.status(), 200);
    assert!(response.into_body().collect().await.is_err(), "a short body must not look complete");
    let line = proxy.wait_for_log("route=messages").await;
    assert!(line.contains("outcome=upstream_error"), "{line}");
}

#[tokio::test]
async fn usage_is_recorded_from_chunked_replies_and_for_h2_clients() {
    let (fake, proxy) = ProxyProcess::with_fake("[admin]\ntoken = \"admin-secret\"\n").await;
    let chunked = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":77,"completion_tokens":3}}"#;
    fake.respond_with(move |received| {
        received.headers.contains_key("x-chunked").then(|| {
            let chunks = chunked.chunks(20).map(Bytes::copy_from_slice).collect();
            Reply::chunks(200, chunks, Ending::End)
        })
    });
    let h2: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).http2_only(true).build_http();
    let cases =
        [("chunked reply", true, false), ("h2 client, declared length", false, true), ("h2 client, SSE", false, true)];
    for (index, (name, chunked, over_h2)) in cases.into_iter().enumerate() {
        let session = format!("s{index}");
        let mut headers = vec![AUTH, ("x-session-id", session.as_str())];
        if chunked {
            headers.push(("x-chunked", "1"));
        }
        let body = if index == 2 { chat_body(true) } else { chat_body(false) };
        let request = request("POST", &proxy.url("/v1/chat/completions"), &headers, body);
        let answer = if over_h2 { collect(h2.request(request).await.unwrap()).await } else { send(request).await };
        assert_eq!(answer.status, 200, "{name}");
        if chunked {
            assert!(answer.header("content-length").is_none(), "{name}: the reply is chunked");
        }
        let key = answer.header("x-compactor-session").unwrap().to_string();
        let expected = if chunked { 77 } else { 12 };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = proxy.get_with_token(&format!("/admin/sessions/{key}"), "admin-secret").await.json();
            if state["state"]["conversations"][0]["usage"]["prompt_tokens"] == expected {
                break;
            }
            assert!(Instant::now() < deadline, "{name}: no usage recorded: {state}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let complete =
        proxy.logs().iter().filter(|l| l.contains("route=chat_completions") && l.contains("outcome=complete")).count();
    assert_eq!(complete, 3, "{:?}", proxy.logs());
}

#[tokio::test]
async fn a_client_that_stalls_in_its_headers_is_disconnected_after_the_header_timeout() {
    let (_fake, proxy) = ProxyProcess::with_fake("[limits]\nheader_read_timeout_ms = 1000\n").await;
    let mut stream = std::net::TcpStream::connect(proxy.addr).unwrap();
    stream.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-ty").unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    // Dropped at the configured second, not at a multiple of it (1.5 s of slack for a loaded machine).
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "the connection was held {took:?}"
    );
    let text = String::from_utf8_lossy(&answer);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
}

#[tokio::test]
async fn connections_past_the_limit_get_a_503_in_their_dialect_and_health_still_answers() {
    let (fake, proxy) = ProxyProcess::with_fake("[limits]\nmax_connections = 2\n").await;
    // Two kept-alive connections hold the limit. Each is known to be served (not refused) before
    // the limit is tried: the readiness probe's connection may still hold its slot for a moment
    // after its client saw it close, and a connection opened then is refused instead.
    let mut refused_early = 0;
    let mut held = Vec::new();
    while held.len() < 2 {
        match held_connection(proxy.addr) {
            Some(stream) => held.push(stream),
            None => {
                refused_early += 1;
                assert!(refused_early < 20, "the limit never freed a slot");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let chat = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
    assert_eq!(chat.status, 503, "{}", chat.text());
    assert_eq!(chat.json()["error"]["code"], "overloaded");
    assert_eq!(chat.header("retry-after"), Some("1"));
    let messages = send(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k")], messages_body(false))).await;
    assert_eq!(messages.status, 503);
    assert_eq!(messages.json()["error"]["type"], "overloaded_error");
    assert!(held_connection(proxy.addr).is_none(), "health answers on a refused connection, which then closes");
    assert!(fake.received().is_empty(), "a refused request never reaches the upstream");

    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let served = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
    assert_eq!(served.status, 200, "a freed connection slot is served again");
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let refused = 3 + refused_early;
    assert!(metrics.contains(&format!("compactor_connections_refused_total {refused}")), "{metrics}");
}

/// A connection to compactor that it serves, kept alive: its `/healthz` answered without
/// `connection: close`. `None` when compactor refused it (a refused connection is answered and closed).
fn held_connection(addr: std::net::SocketAddr) -> Option<std::net::TcpStream> {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |value| value.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).ok()?;
    (!head.contains("connection: close")).then_some(stream)
}

#[test]
fn an_upstream_url_with_credentials_is_refused_at_start_naming_the_key_not_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[upstream]\nopenai = \"http://gateway-user:pw-4711@127.0.0.1:9\"\n").unwrap();
    for args in [vec!["--config", path.to_str().unwrap()], vec!["--config", path.to_str().unwrap(), "--check-config"]] {
        let (code, out, err) = run_binary(&args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {out}{err}");
        assert!(err.contains("`upstream.openai`") && err.contains("credentials"), "{err}");
        assert!(!out.contains("pw-4711") && !err.contains("pw-4711"), "{out}{err}");
    }
}

#[tokio::test]
async fn dot_segments_are_resolved_before_routing_and_the_request_goes_where_it_was_routed() {
    let openai = FakeUpstream::start().await;
    let anthropic = FakeUpstream::start().await;
    let proxy = ProxyProcess::start_with(
        &format!("[upstream]\nopenai = \"{}\"\nanthropic = \"{}\"\n", openai.url(), anthropic.url()),
        &[],
    );
    let answer =
        send(request("POST", &proxy.url("/v1/messages/../chat/completions?x=1"), &[AUTH], chat_body(false))).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(anthropic.received().is_empty(), "a Chat request never goes to the Anthropic upstream");
    assert_eq!(openai.last().path_and_query, "/v1/chat/completions?x=1");
    assert!(answer.header("x-compactor-tokens-before").is_some(), "it was treated as the Chat request it is");

    let answer = send(request(
        "POST",
        &proxy.url("/v1/chat/completions/%2e%2e/%2E%2E/messages"),
        &[("x-api-key", "k")],
        messages_body(false),
    ))
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(anthropic.last().path_and_query, "/v1/messages");
}

#[tokio::test]
async fn a_rewrite_over_its_budget_forwards_the_request_as_it_came() {
    let (fake, proxy) =
        ProxyProcess::with_fake("[limits]\nrewrite_budget_ms = 1\n[truncate]\ntool_output_max_tokens = 500\n").await;
    let body = chat_with_output(100_000, false);
    assert!(body.len() > compactor::work::OFFLOAD_BYTES);
    let answer = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], body.clone())).await;
    assert_eq!(answer.status, 200);
    assert!(fake.last().body == body.as_bytes(), "the body went as it came, not truncated");
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    assert!(
        metrics.contains(r#"compactor_rewrites_total{route="chat_completions",outcome="over_budget"} 1"#),
        "{metrics}"
    );
    proxy.wait_for_log("rewrite budget spent").await;
}

/// A chat request with prunable history, of session `session`.
fn session_request(proxy: &ProxyProcess, session: &str) -> http::Request<http_body_util::Full<Bytes>> {
    let body = serde_json::json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "Fix the build."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": tool_output("old", 300)},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": tool_output("new", 400)}
    ]});
    let headers = [AUTH, ("x-session-id", session)];
    request("POST", &proxy.url("/v1/chat/completions"), &headers, serde_json::to_vec(&body).unwrap())
}

const PRUNE: &str = "[prune]\nprotect_tokens = 300\nminimum_tokens = 100\n";

#[tokio::test]
async fn redis_killed_and_restarted_under_load_never_fails_a_request_and_the_breaker_skips_it_meanwhile() {
    use crate::common::redis_server::RedisServer;
    let Some(mut redis) = RedisServer::restartable() else { return };
    let config = format!("{PRUNE}{}breaker_failures = 3\nbreaker_backoff_ms = 500\n", redis.config());
    let (_fake, proxy) = ProxyProcess::with_fake(&config).await;
    let proxy = std::sync::Arc::new(proxy);
    // Load: four clients sending back to back for the whole test.
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let load: Vec<_> = (0..4)
        .map(|client_index| {
            let (proxy, running) = (proxy.clone(), running.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while running.load(std::sync::atomic::Ordering::Relaxed) {
                    let answer = send(session_request(&proxy, &format!("load-{client_index}"))).await;
                    statuses.push(answer.status.as_u16());
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    redis.stop();
    // Once the breaker is open, requests do not wait on the store at all.
    assert!(
        eventually(async || send(request("GET", &proxy.url("/readyz"), &[], "")).await.json()["breaker"] == "open")
            .await,
        "the breaker never opened"
    );
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let answer = send(session_request(&proxy, "probe")).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("x-compactor-pruned"), Some("1"), "the policies work without stored state");
        slowest = slowest.max(started.elapsed());
    }
    let ready = send(request("GET", &proxy.url("/readyz"), &[], "")).await.json();
    assert_eq!(ready["status"], "degraded", "{ready}");
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    assert!(metrics.contains("compactor_session_store_skipped_total"), "{metrics}");
    assert!(metrics.contains("compactor_session_store_breaker_open 1"), "{metrics}");

    redis.restart();
    assert!(
        eventually(async || {
            send(session_request(&proxy, "after")).await;
            redis.keys().iter().any(|k| k.contains("after") || k.ends_with(":pruned"))
        })
        .await,
        "state is written again once Redis is back: {:?}",
        redis.keys()
    );
    assert!(
        eventually(async || send(request("GET", &proxy.url("/readyz"), &[], "")).await.json()["status"] == "ready")
            .await
    );
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    for client in load {
        let statuses = client.await.unwrap();
        assert!(statuses.len() > 3, "the load kept going: {statuses:?}");
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    }
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    assert!(metrics.contains("compactor_session_store_breaker_open 0"), "{metrics}");
    // Each request while the breaker was open ran at full speed: well under the 250 ms the
    // store could have taken per request (a debug build on a busy machine, hence the margin).
    assert!(slowest < Duration::from_millis(200), "a request waited on the skipped store: {slowest:?}");
}

/// Spoils one stored value: given the session's key prefix and its conversation's.
type Corruption = fn(&mut redis::Connection, &str, &str);

#[tokio::test]
async fn a_corrupt_session_value_is_deleted_and_the_session_starts_afresh() {
    use crate::common::redis_server::RedisServer;
    let Some(redis) = RedisServer::start() else { return };
    let (_fake, proxy) = ProxyProcess::with_fake(&format!("{PRUNE}{}", redis.config())).await;
    let corruptions: [(&str, Corruption); 4] = [
        ("a conversation of the wrong type", |c, _, conversation| {
            let _: () = redis::cmd("DEL").arg(conversation).query(c).unwrap();
            let _: () = redis::cmd("SET").arg(conversation).arg("not a hash").query(c).unwrap();
        }),
        ("a counter that is not a number", |c, session, _| {
            let _: () =
                redis::cmd("HSET").arg(format!("{session}:session")).arg("requests").arg("many").query(c).unwrap();
        }),
        ("usage that is not JSON", |c, _, conversation| {
            let _: () = redis::cmd("HSET").arg(conversation).arg("usage").arg("{not json").query(c).unwrap();
        }),
        // (A record of another schema version is no corruption: see `shared_state.rs`.)
        ("a compaction record of this schema that does not parse", |c, _, conversation| {
            let record = r#"{"v":1,"something":"else"}"#;
            let _: () = redis::cmd("RPUSH").arg(format!("{conversation}:compactions")).arg(record).query(c).unwrap();
        }),
    ];
    let mut connection = redis.connection();
    for (index, (name, corrupt)) in corruptions.iter().enumerate() {
        let session = format!("corrupt-{index}");
        let first = send(session_request(&proxy, &session)).await;
        let key = first.header("x-compactor-session").unwrap().to_string();
        let prefix = format!("{}:{{{key}}}", redis.prefix);
        let pruned_key = || redis.keys().into_iter().find(|k| k.starts_with(&prefix) && k.ends_with(":pruned"));
        assert!(eventually(async || pruned_key().is_some()).await, "{name}: state stored first");
        let conversation = pruned_key().unwrap().trim_end_matches(":pruned").to_string();
        corrupt(&mut connection, &prefix, &conversation);

        let answer = send(session_request(&proxy, &session)).await;
        assert_eq!(answer.status, 200, "{name}");
        // Deleted, then written afresh by this request: every value readable again.
        let fresh = async || {
            let mut connection = redis.connection();
            let kind: String = redis::cmd("TYPE").arg(&conversation).query(&mut connection).unwrap();
            let usage: Option<String> = match kind.as_str() {
                "hash" => redis::cmd("HGET").arg(&conversation).arg("usage").query(&mut connection).unwrap(),
                _ => None,
            };
            let requests: Option<String> =
                redis::cmd("HGET").arg(format!("{prefix}:session")).arg("requests").query(&mut connection).unwrap();
            let records: Vec<String> = redis::cmd("LRANGE")
                .arg(format!("{conversation}:compactions"))
                .arg(0)
                .arg(-1)
                .query(&mut connection)
                .unwrap();
            usage.is_some_and(|u| u.starts_with("{\"v\":1")) && requests.as_deref() == Some("1") && records.is_empty()
        };
        assert!(
            eventually(fresh).await,
            "{name}: the session did not start afresh: {:?} {:?}",
            redis.keys(),
            proxy.logs()
        );
        proxy.wait_for_log(&format!("unreadable session state deleted; the session starts afresh session={key}")).await;
        // And it stays healed: the next request reads it fine.
        assert_eq!(send(session_request(&proxy, &session)).await.status, 200);
    }
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    assert!(metrics.contains("compactor_session_store_corrupt_total 4"), "{metrics}");
}

#[tokio::test]
async fn an_admin_compaction_of_an_unknown_session_is_a_404_and_creates_nothing() {
    let redis = RedisServer::start();
    let stores = [Some(String::new()), redis.as_ref().map(RedisServer::config)];
    for store in stores.into_iter().flatten() {
        let (_fake, proxy) = ProxyProcess::with_fake(&format!("[admin]\ntoken = \"admin\"\n{store}")).await;
        let unknown = "t0a1b2c3.d4e5f6a7b8c9";
        let marked = proxy.call_with_token("POST", &format!("/admin/sessions/{unknown}/compact"), "admin").await;
        assert_eq!(marked.status, 404, "{store}: {}", marked.text());
        let seen = proxy.get_with_token(&format!("/admin/sessions/{unknown}"), "admin").await;
        assert_eq!(seen.status, 404, "{store}: the request created the session: {}", seen.text());
        if let Some(redis) = redis.as_ref().filter(|_| !store.is_empty()) {
            assert!(redis.keys().iter().all(|key| !key.contains(unknown)), "{:?}", redis.keys());
        }
        // A session the store holds (once its first request is committed) is still marked.
        let answer = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
        let key = answer.header("x-compactor-session").unwrap().to_string();
        // The request's state is written after its answer: wait until the store holds it.
        let stored = async || proxy.get_with_token(&format!("/admin/sessions/{key}"), "admin").await.status == 200;
        assert!(eventually(stored).await, "{store}: the request's session was never stored");
        let marked = proxy.call_with_token("POST", &format!("/admin/sessions/{key}/compact"), "admin").await;
        assert_eq!(marked.status, 202, "{store}: {}", marked.text());
        let state = proxy.get_with_token(&format!("/admin/sessions/{key}"), "admin").await.json();
        assert_eq!(state["state"]["counters"]["compact_requested"], 1, "{store}: {state}");
    }
}

/// The token-count cache's entries, as `/metrics` shows them.
async fn token_cache_entries(proxy: &ProxyProcess) -> f64 {
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    let line = metrics.lines().find(|l| l.starts_with(r#"compactor_cache_entries{cache="tokens"}"#)).unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn one_tenants_token_counts_are_never_another_tenants_cache_hits() {
    let (_fake, proxy) = ProxyProcess::with_fake("").await;
    let body = chat_with_output(2_000, false);
    let as_tenant = |key: &'static str| [("authorization", key), ("x-session-id", "shared-id")];
    let first =
        send(request("POST", &proxy.url("/v1/chat/completions"), &as_tenant("Bearer sk-tenant-a"), body.clone())).await;
    assert_eq!(first.status, 200);
    let after_a = token_cache_entries(&proxy).await;
    assert!(after_a > 0.0);
    // Tenant B sends the same texts: counted for B (new entries), not answered from A's counts,
    // whose speed would tell B that A sent them.
    let second =
        send(request("POST", &proxy.url("/v1/chat/completions"), &as_tenant("Bearer sk-tenant-b"), body.clone())).await;
    assert_eq!(second.status, 200);
    let after_b = token_cache_entries(&proxy).await;
    assert!(after_b >= 2.0 * after_a, "B's counts were A's cache hits: {after_a} entries, then {after_b}");
    // A's own next turn still finds its counts.
    let third = send(request("POST", &proxy.url("/v1/chat/completions"), &as_tenant("Bearer sk-tenant-a"), body)).await;
    assert_eq!(third.status, 200);
    assert_eq!(token_cache_entries(&proxy).await, after_b);
}

/// A Messages request of about `bytes` bytes.
fn messages_of(bytes: usize) -> String {
    serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [
        {"role": "user", "content": lines_until(bytes, |i| format!("line {i} of the file\n"))}
    ]})
    .to_string()
}

#[tokio::test]
async fn past_the_inflight_body_budget_a_request_gets_503_with_retry_after_in_its_dialect() {
    let fake = FakeUpstream::builder()
        .respond_with(|received| {
            // The large request is held upstream a while, its body bytes in flight.
            let slow = received.body.len() > 40_000;
            Some(Reply::json(200, serde_json::json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}], "usage": {"input_tokens": 1, "output_tokens": 1}})).after(Duration::from_millis(if slow { 2_000 } else { 0 })))
        })
        .start()
        .await;
    let proxy = ProxyProcess::start(&fake, "[limits]\nmax_inflight_body_bytes = 65536\n");
    let url = proxy.url("/v1/messages");
    let headers = [("x-api-key", "k"), ("content-type", "application/json")];
    let held = tokio::spawn(send(request("POST", &url, &headers, messages_of(50_000))));
    assert!(eventually(async || !fake.received().is_empty()).await);

    let refused = send(request("POST", &url, &headers, messages_of(50_000))).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.json()["type"], "error");
    assert_eq!(refused.json()["error"]["type"], "overloaded_error");
    assert_eq!(refused.header("x-compactor-error"), Some("inflight_body_limit"));
    // A small request fits beside the held one.
    assert_eq!(send(request("POST", &url, &headers, messages_of(2_000))).await.status, 200);

    assert_eq!(held.await.unwrap().status, 200);
    // The budget is given back: the same request goes now, and one larger than the whole budget
    // goes when it is alone.
    assert_eq!(send(request("POST", &url, &headers, messages_of(50_000))).await.status, 200);
    assert_eq!(send(request("POST", &url, &headers, messages_of(100_000))).await.status, 200);
    assert_eq!(fake.received().len(), 4, "the refused request never reached the upstream");
}
