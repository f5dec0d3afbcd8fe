//! The transparent proxy: what the client sends arrives upstream unchanged, what the upstream
//! answers arrives at the client unchanged, streams flow unbuffered, failures speak the dialect.

use std::time::Duration;

use crate::common::*;
use http_body_util::BodyExt;

const AUTH: (&str, &str) = ("authorization", "Bearer sk-test-secret-123");

#[tokio::test]
async fn chat_completion_round_trips_byte_for_byte() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    let body = chat_body(false);
    let answer = send(request(
        "POST",
        &proxy.url("/v1/chat/completions?trace=1&x=%20y"),
        &[AUTH, ("content-type", "application/json"), ("openai-organization", "org-1"), ("x-custom", "kept")],
        body.clone(),
    ))
    .await;

    let seen = fake.last();
    assert_eq!(seen.path_and_query, "/v1/chat/completions?trace=1&x=%20y");
    assert_eq!(seen.body, body.as_bytes(), "request body bytes changed");
    assert_eq!(seen.headers["authorization"], "Bearer sk-test-secret-123");
    assert_eq!(seen.headers["openai-organization"], "org-1");
    assert_eq!(seen.headers["x-custom"], "kept");
    assert_eq!(seen.headers["host"], fake.addr.to_string());

    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("openai-processing-ms"), Some("12"));
    assert_eq!(answer.header("x-upstream-custom"), Some("yes"));
    assert!(answer.header("x-compactor-request-id").is_some());
    assert!(answer.text().starts_with(r#"{"id":"chatcmpl-1","object":"chat.completion""#));
}

#[tokio::test]
async fn anthropic_messages_keep_their_headers_and_query_in_order() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    let body = messages_body(false);
    let answer = send(request(
        "POST",
        &proxy.url("/v1/messages?beta=true"),
        &[
            ("x-api-key", "sk-ant-secret"),
            ("anthropic-version", "2023-06-01"),
            (
                "anthropic-beta",
                "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
            ),
        ],
        body.clone(),
    ))
    .await;
    let seen = fake.last();
    assert_eq!(seen.path_and_query, "/v1/messages?beta=true");
    assert_eq!(seen.body, body.as_bytes());
    assert_eq!(seen.headers["x-api-key"], "sk-ant-secret");
    assert_eq!(
        seen.headers["anthropic-beta"],
        "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
    );
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("request-id"), Some("req_1"));
    assert_eq!(answer.json()["content"][0]["text"], "Hello");
}

#[tokio::test]
async fn streamed_answers_arrive_exactly_as_the_upstream_sent_them() {
    let (_fake, proxy) = ProxyProcess::with_fake("").await;
    let chat = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(true))).await;
    assert_eq!(chat.header("content-type"), Some("text/event-stream"));
    assert_eq!(chat.text(), fake::openai_stream(&["Hel", "lo"]).concat());

    let messages = send(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k")], messages_body(true))).await;
    assert_eq!(messages.text(), fake::anthropic_stream(&["Hel", "lo"]).concat());
}

#[tokio::test]
async fn models_embeddings_and_unknown_paths_pass_through() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;

    let models = send(request("GET", &proxy.url("/v1/models"), &[AUTH], "")).await;
    assert_eq!(models.status, 200);
    assert_eq!(fake.last().method, "GET");
    assert!(models.text().contains(r#""id":"gpt-4o""#));

    let embedding_request = r#"{"model":"text-embedding-3-small","input":"hello"}"#;
    let embeddings = send(request("POST", &proxy.url("/v1/embeddings"), &[AUTH], embedding_request)).await;
    assert_eq!(fake.last().body, embedding_request.as_bytes());
    // Numbers keep every digit: the body is never re-serialized.
    assert!(embeddings.text().contains("0.12345678901234567890"));

    let unknown = send(request("DELETE", &proxy.url("/v1/files/file-abc?purpose=x"), &[AUTH], "")).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.header("x-fake-route"), Some("none"));
    assert_eq!(unknown.text(), r#"{"error":"no route for /v1/files/file-abc"}"#);
    assert_eq!(fake.last().path_and_query, "/v1/files/file-abc?purpose=x");
}

#[tokio::test]
async fn a_base_url_path_prefix_is_joined_with_the_request_path() {
    let fake = FakeUpstream::start().await;
    let proxy = ProxyProcess::start_with(
        &format!("[upstream]\nopenai = \"{0}/api/\"\nanthropic = \"{0}/anthropic\"\n", fake.url()),
        &[],
    );
    send(request("POST", &proxy.url("/v1/chat/completions?a=1"), &[AUTH], chat_body(false))).await;
    assert_eq!(fake.last().path_and_query, "/api/v1/chat/completions?a=1");
    send(request("POST", &proxy.url("/v1/messages?beta=true"), &[("x-api-key", "k")], messages_body(false))).await;
    assert_eq!(fake.last().path_and_query, "/anthropic/v1/messages?beta=true");
}

#[tokio::test]
async fn events_reach_the_client_before_the_upstream_sends_the_next() {
    let fake = FakeUpstream::builder().pacing(Pacing::Gated).start().await;
    let proxy = ProxyProcess::start(&fake, "");
    for (path, body, first) in [
        ("/v1/chat/completions", chat_body(true), fake::openai_stream(&["Hel", "lo"])[0].clone()),
        ("/v1/messages", messages_body(true), fake::anthropic_stream(&["Hel", "lo"])[0].clone()),
    ] {
        let response = client().request(request("POST", &proxy.url(path), &[AUTH], body)).await.unwrap();
        let mut body = response.into_body();
        // The upstream holds every later event until released: event 1 must already be here.
        let chunk = next_chunk(&mut body, Duration::from_secs(5)).await.unwrap();
        assert_eq!(chunk, first.as_bytes());
        for _ in 0..10 {
            fake.release();
        }
        while next_chunk(&mut body, Duration::from_secs(5)).await.is_some() {}
    }
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_in_the_route_dialect() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let proxy = ProxyProcess::start_with(
        &format!("[upstream]\nopenai = \"http://{closed}\"\nanthropic = \"http://{closed}\"\n"),
        &[],
    );
    let openai = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
    assert_eq!(openai.status, 502);
    assert_eq!(openai.json()["error"]["code"], "upstream_unreachable");
    assert_eq!(openai.header("x-compactor-error"), Some("upstream_unreachable"));

    let anthropic =
        send(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k")], messages_body(false))).await;
    assert_eq!(anthropic.status, 502);
    assert_eq!(anthropic.json()["type"], "error");
    assert_eq!(anthropic.json()["error"]["type"], "api_error");
}

#[tokio::test]
async fn a_silent_upstream_is_a_504_after_the_first_byte_timeout() {
    let fake = FakeUpstream::builder().pacing(Pacing::Hang).start().await;
    let proxy = ProxyProcess::start(&fake, "first_byte_timeout_ms = 1000\n");
    let started = std::time::Instant::now();
    let answer = send(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "k")], messages_body(false))).await;
    assert_eq!(answer.status, 504);
    assert_eq!(answer.json()["error"]["type"], "timeout_error");
    // At the configured second, not at some multiple of it: 1.5 s of slack for a loaded machine.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1000) && took < Duration::from_millis(2500), "answered after {took:?}");
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_413_whether_declared_or_streamed() {
    let (fake, proxy) = ProxyProcess::with_fake("[limits]\nmax_body_bytes = 1000\n").await;
    let big = "x".repeat(2000);
    let declared = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], big.clone())).await;
    assert_eq!(declared.status, 413);
    assert_eq!(declared.json()["error"]["code"], "request_too_large");

    // Chunked, with no Content-Length: the limit is enforced while reading.
    let chunks: Vec<Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>> =
        (0..4).map(|_| Ok(http_body::Frame::data(bytes::Bytes::from("y".repeat(500))))).collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
    let chunked = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http()
        .request(http::Request::post(proxy.url("/v1/messages")).body(body).unwrap())
        .await
        .unwrap();
    let chunked = collect(chunked).await;
    assert_eq!(chunked.status, 413);
    assert_eq!(chunked.json()["error"]["type"], "request_too_large");
    assert!(fake.received().is_empty(), "an oversize body must not reach the upstream");
}

#[tokio::test]
async fn upstream_errors_pass_through_unchanged() {
    let fake = FakeUpstream::builder()
        .respond_with(|received| {
            let status = if received.path_and_query.contains("messages") { 529 } else { 429 };
            let body = format!(r#"{{"error":{{"message":"busy {status}","type":"x"}}}}"#);
            Some(Reply::body(status, body).with_header("retry-after", "7"))
        })
        .start()
        .await;
    let proxy = ProxyProcess::start(&fake, "");
    let chat = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
    assert_eq!(chat.status, 429);
    assert_eq!(chat.header("retry-after"), Some("7"));
    assert_eq!(chat.text(), r#"{"error":{"message":"busy 429","type":"x"}}"#);
    assert!(chat.header("x-compactor-error").is_none());
    let messages = send(request("POST", &proxy.url("/v1/messages"), &[AUTH], messages_body(false))).await;
    assert_eq!(messages.status, 529);
    assert_eq!(messages.text(), r#"{"error":{"message":"busy 529","type":"x"}}"#);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_cancels_the_upstream_stream() {
    let fake = FakeUpstream::builder().pacing(Pacing::Endless(Duration::from_millis(20))).start().await;
    let proxy = ProxyProcess::start(&fake, "");
    let response =
        client().request(request("POST", &proxy.url("/v1/messages"), &[AUTH], messages_body(true))).await.unwrap();
    let mut body = response.into_body();
    assert!(next_chunk(&mut body, Duration::from_secs(5)).await.is_some());
    drop(body);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fake.streams_cancelled() == 0 {
        assert!(std::time::Instant::now() < deadline, "the upstream stream was not cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_stream_that_goes_silent_is_cut_after_the_idle_timeout() {
    let fake = FakeUpstream::builder().pacing(Pacing::StallAfterFirst).start().await;
    let proxy = ProxyProcess::start(&fake, "idle_timeout_ms = 300\n");
    let response =
        client().request(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(true))).await.unwrap();
    assert_eq!(response.status(), 200);
    let result = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect()).await;
    assert!(result.expect("the stream ends instead of hanging").is_err(), "a cut stream must not look complete");
    proxy.wait_for_log("outcome=idle_timeout").await;
}

#[tokio::test]
async fn h2c_clients_are_served() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    let h2: HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).http2_only(true).build_http();
    let response =
        h2.request(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let answer = collect(response).await;
    assert_eq!(answer.status, 200);
    assert_eq!(fake.last().body, chat_body(false).as_bytes());
    assert_eq!(fake.last().headers["host"], fake.addr.to_string());
}

#[tokio::test]
async fn logs_carry_one_line_per_request_and_never_a_credential() {
    let (_fake, proxy) = ProxyProcess::with_fake("").await;
    send(request("POST", &proxy.url("/v1/chat/completions?key=sk-query-secret"), &[AUTH], chat_body(false))).await;
    send(request("POST", &proxy.url("/v1/messages"), &[("x-api-key", "sk-ant-secret")], messages_body(false))).await;
    let line = proxy.wait_for_log("route=messages").await;
    assert!(line.contains("status=200"), "{line}");
    assert!(line.contains("request_id="), "{line}");
    assert!(line.contains("ttfb_ms="), "{line}");
    let logs = proxy.logs().join("\n");
    for secret in ["sk-test-secret-123", "sk-ant-secret", "sk-query-secret", "Say hello"] {
        assert!(!logs.contains(secret), "{secret} leaked into the logs");
    }
}
