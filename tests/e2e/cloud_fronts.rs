//! The cloud fronts (`common::cloud`) are instruments the Bedrock and Vertex tests rely on, so they
//! are checked here on their own, without compactor: Bedrock verifies SigV4 as AWS does (a client's
//! aws-sigv4 signature passes, a changed byte or no signature is refused and never forwarded),
//! streams the sim's events back as event-stream frames and words overflows as Bedrock does;
//! Vertex lets through only tokens its Google endpoint gave a real service-account client.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Uri};
use serde_json::{Value, json};

use crate::common::cloud::*;
use crate::common::provider::*;
use crate::common::*;

const MODEL: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
const VERTEX_MODEL: &str = "claude-sonnet-4-5@20250929";

fn bedrock_body() -> Value {
    json!({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 200,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]})
}

fn vertex_body() -> Value {
    json!({"anthropic_version": "vertex-2023-10-16", "max_tokens": 200,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]})
}

/// A request as the front's server sees it: origin-form path, the Host header the client added.
fn as_received(request: &http::Request<impl Sized>) -> (Uri, HeaderMap) {
    let uri: Uri = request.uri().path_and_query().unwrap().as_str().parse().unwrap();
    let mut headers = request.headers().clone();
    let authority = request.uri().authority().unwrap().as_str();
    headers.insert("host", HeaderValue::from_str(authority).unwrap());
    (uri, headers)
}

#[test]
fn a_client_signature_verifies_however_the_model_id_is_encoded_and_a_changed_byte_does_not() {
    let body = serde_json::to_vec(&bedrock_body()).unwrap();
    let paths = [
        format!("/model/{MODEL}/invoke"),
        "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream".to_string(),
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke".to_string(),
    ];
    for host in ["bedrock-runtime.us-east-1.amazonaws.com", "127.0.0.1:41234"] {
        for path in &paths {
            let url = format!("http://{host}{path}");
            let signed = sign_bedrock("POST", &url, &[("content-type", "application/json")], body.clone());
            let (uri, headers) = as_received(&signed);
            assert_eq!(verify_sigv4(&Method::POST, &uri, &headers, &body), Ok(()), "{url}");

            let mut changed = body.clone();
            changed[20] ^= 1;
            let refusal = verify_sigv4(&Method::POST, &uri, &headers, &changed).unwrap_err();
            assert!(matches!(&refusal, Refusal::Invalid(why) if why.contains("signature mismatch")), "{refusal:?}");
        }
    }
    // A query string is signed too: Claude Code lists the inference profiles first.
    let signed =
        sign_bedrock("GET", "http://127.0.0.1:9/inference-profiles?type=SYSTEM_DEFINED&maxResults=1000", &[], "");
    let (uri, headers) = as_received(&signed);
    assert_eq!(verify_sigv4(&Method::GET, &uri, &headers, b""), Ok(()));
    let other: Uri = "/inference-profiles?type=APPLICATION".parse().unwrap();
    assert!(verify_sigv4(&Method::GET, &other, &headers, b"").is_err());
    assert_eq!(verify_sigv4(&Method::GET, &uri, &HeaderMap::new(), b""), Err(Refusal::Missing));
}

#[tokio::test]
async fn a_signed_streaming_invoke_comes_back_as_event_stream_frames_of_the_messages_events() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::NamesWindow).await;
    let url = format!("{}/model/{MODEL}/invoke-with-response-stream", front.url());
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/vnd.amazon.eventstream"),
        ("x-claude-code-session-id", "session-bedrock-1"),
    ];
    let body = serde_json::to_vec(&bedrock_body()).unwrap();
    let response = client().request(sign_bedrock("POST", &url, &headers, body)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/vnd.amazon.eventstream");
    let mut incoming = response.into_body();
    let mut chunks = Vec::new();
    while let Some(chunk) = next_chunk(&mut incoming, Duration::from_secs(10)).await {
        chunks.push(chunk);
    }
    let whole: Vec<u8> = chunks.concat();
    let messages = decode_event_stream(&whole);
    assert!(
        chunks.len() >= messages.len() && messages.len() > 3,
        "{} chunks, {} messages",
        chunks.len(),
        messages.len()
    );
    for message in &messages {
        let header = |name: &str| {
            let found = message.headers().iter().find(|h| h.name().as_str() == name).expect(name);
            found.value().as_string().unwrap().as_str().to_string()
        };
        assert_eq!(
            (header(":event-type"), header(":content-type"), header(":message-type")),
            ("chunk".into(), "application/json".into(), "event".into())
        );
    }
    let events = chunk_events(&messages);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"message_start"), "{types:?}");
    assert_eq!(types.last(), Some(&"message_stop"), "{types:?}");
    assert!(types.contains(&"content_block_delta"), "{types:?}");
    assert!(events[0]["message"]["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let delta = events.iter().find(|e| e["type"] == "message_delta").unwrap();
    assert_eq!(delta["usage"]["output_tokens"], 150);
    let metrics = &events.last().unwrap()["amazon-bedrock-invocationMetrics"];
    assert_eq!(metrics["outputTokenCount"], 150, "{metrics}");

    let record = sim.last();
    assert_eq!(record.path, "/v1/messages");
    assert_eq!(record.headers["anthropic-version"], "2023-06-01");
    assert_eq!(record.headers["x-claude-code-session-id"], "session-bedrock-1");
    let sent: Value = serde_json::from_slice(&record.body).unwrap();
    assert_eq!(sent["model"], MODEL);
    assert_eq!(sent["stream"], true);
    assert!(sent.get("anthropic_version").is_none(), "{sent}");
    let requests = front.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].verdict, Verdict::Verified);
    assert_eq!(requests[0].path, format!("/model/{MODEL}/invoke-with-response-stream"));
}

#[tokio::test]
async fn an_invoke_with_an_encoded_model_id_answers_the_sims_json_with_the_decoded_model() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::NamesWindow).await;
    let arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc123";
    for (path_id, model) in [
        ("us.anthropic.claude-sonnet-4-5-20250929-v1%3A0", MODEL),
        ("arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Aapplication-inference-profile%2Fabc123", arn),
    ] {
        let url = format!("{}/model/{path_id}/invoke", front.url());
        let mut body = bedrock_body();
        body["anthropic_beta"] = json!(["context-1m-2025-08-07"]);
        let signed = sign_bedrock("POST", &url, &[("content-type", "application/json")], body.to_string());
        let answer = send(signed).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let json = answer.json();
        assert_eq!((json["type"].as_str(), json["model"].as_str()), (Some("message"), Some(model)));
        assert!(answer.header("x-amzn-bedrock-input-token-count").is_some());
        let sent: Value = serde_json::from_slice(&sim.last().body).unwrap();
        assert_eq!(sent["model"], model);
        assert!(sent.get("stream").is_none() && sent.get("anthropic_beta").is_none(), "{sent}");
        assert_eq!(sim.last().headers["anthropic-beta"], "context-1m-2025-08-07");
    }
}

#[tokio::test]
async fn unsigned_and_tampered_requests_are_refused_403_and_never_reach_the_sim() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::NamesWindow).await;
    let url = format!("{}/model/{MODEL}/invoke", front.url());
    let body = bedrock_body().to_string();

    let unsigned = send(request("POST", &url, &[("content-type", "application/json")], body.clone())).await;
    assert_eq!(unsigned.status, 403);
    assert_eq!(unsigned.header("x-amzn-errortype"), Some("MissingAuthenticationTokenException"));
    assert_eq!(unsigned.json(), json!({"message": "Missing Authentication Token"}));

    // Signed for one body, sent with another of the same length.
    let signed = sign_bedrock("POST", &url, &[("content-type", "application/json")], body.clone());
    let (parts, _) = signed.into_parts();
    let tampered = body.replace("hello", "HELLO");
    let tampered = http::Request::from_parts(parts, http_body_util::Full::new(bytes::Bytes::from(tampered)));
    let answer = send(tampered).await;
    assert_eq!(answer.status, 403);
    assert_eq!(answer.header("x-amzn-errortype"), Some("InvalidSignatureException"));
    assert_eq!(
        answer.json(),
        json!({"message": "The request signature we calculated does not match the signature you provided."})
    );

    // Signed with someone else's secret.
    let mut forged = sign_bedrock("POST", &url, &[("content-type", "application/json")], body.clone());
    let authorization = forged.headers()["authorization"].to_str().unwrap().to_string();
    let (head, _) = authorization.rsplit_once("Signature=").unwrap();
    forged.headers_mut().insert("authorization", format!("{head}Signature={}", "0".repeat(64)).parse().unwrap());
    assert_eq!(send(forged).await.status, 403);

    assert_eq!(sim.len(), 0, "a refused request is never forwarded");
    assert_eq!(front.refused(), 3);
    assert!(front.requests().iter().all(|r| matches!(r.verdict, Verdict::Refused(_))));
}

#[tokio::test]
async fn bedrock_refuses_a_stream_key_a_model_key_or_a_foreign_version_as_validation_errors() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::NamesWindow).await;
    let url = format!("{}/model/{MODEL}/invoke-with-response-stream", front.url());
    let cases = [
        ("stream", json!(true), "extraneous key [stream] is not permitted"),
        ("model", json!(MODEL), "extraneous key [model] is not permitted"),
        ("anthropic_version", json!("2023-06-01"), "anthropic_version"),
    ];
    for (key, value, expected) in cases {
        let mut body = bedrock_body();
        body[key] = value;
        let answer = send(sign_bedrock("POST", &url, &[("content-type", "application/json")], body.to_string())).await;
        assert_eq!(answer.status, 400, "{key}");
        assert!(answer.header("x-amzn-errortype").unwrap().starts_with("ValidationException"), "{key}");
        let message = answer.json()["message"].as_str().unwrap().to_string();
        assert!(message.contains(expected), "{key}: {message}");
    }
    assert_eq!(sim.len(), 0);
}

#[tokio::test]
async fn an_overflow_comes_back_as_a_validation_exception_worded_as_the_style_says() {
    let long = "word ".repeat(2_000);
    let mut body = bedrock_body();
    body["messages"][0]["content"][0]["text"] = json!(long);
    let cases = [
        (Errors::Named, BedrockOverflow::NamesWindow, "invoke"),
        (Errors::Named, BedrockOverflow::NamesWindow, "invoke-with-response-stream"),
        (Errors::Unnamed, BedrockOverflow::Silent, "invoke"),
        (Errors::Named, BedrockOverflow::Silent, "invoke-with-response-stream"),
    ];
    for (errors, style, operation) in cases {
        let spec = ProviderSpec { window: 1_000, chars_per_token: 4.0, errors, ..ProviderSpec::default() };
        let sim = ProviderSim::start(spec).await;
        let front = BedrockFront::start(sim.url(), style).await;
        let url = format!("{}/model/{MODEL}/{operation}", front.url());
        let answer = send(sign_bedrock("POST", &url, &[("content-type", "application/json")], body.to_string())).await;
        let case = format!("{errors:?} {style:?} {operation}: {}", answer.text());
        assert_eq!(answer.status, 400, "{case}");
        assert_eq!(
            answer.header("x-amzn-errortype"),
            Some("ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            "{case}"
        );
        let message = answer.json()["message"].as_str().unwrap().to_string();
        match style {
            BedrockOverflow::NamesWindow => {
                let named = message.strip_prefix("The model returned the following errors: prompt is too long: ");
                assert!(named.is_some_and(|rest| rest.ends_with("tokens > 1000 maximum")), "{case}");
            }
            BedrockOverflow::Silent => assert_eq!(message, "Input is too long for requested model.", "{case}"),
        }
        assert_eq!(sim.records()[0].outcome, Outcome::Overflow, "{case}");
    }
}

#[tokio::test]
async fn other_paths_are_verified_then_answered_404_and_recorded_with_their_query() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::Silent).await;
    let url = format!("{}/inference-profiles?type=SYSTEM_DEFINED&maxResults=1000", front.url());
    let answer = send(sign_bedrock("GET", &url, &[], "")).await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.json(), json!({"message": "not served by the fake"}));
    assert_eq!(send(request("GET", &url, &[], "")).await.status, 403);
    let requests = front.requests();
    assert_eq!(requests[0].path, "/inference-profiles?type=SYSTEM_DEFINED&maxResults=1000");
    assert_eq!((requests[0].verdict.clone(), requests.len(), front.refused()), (Verdict::Verified, 2, 1));
    assert_eq!(sim.len(), 0);
}

fn vertex_url(front: &VertexFront, model: &str, method: &str) -> String {
    format!(
        "{}/v1/projects/{SERVICE_ACCOUNT_PROJECT}/locations/us-east5/publishers/anthropic/models/{model}:{method}",
        front.url()
    )
}

#[tokio::test]
async fn a_service_account_token_from_gcp_auth_is_accepted_and_the_sse_comes_through() {
    use gcp_auth::TokenProvider;
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = VertexFront::start(sim.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = service_account_file(dir.path(), &front.token_uri());
    let account = gcp_auth::CustomServiceAccount::from_file(&file).unwrap();
    let token = account.token(&[CLOUD_PLATFORM_SCOPE]).await.unwrap();
    assert_eq!(front.issued_tokens(), vec![token.as_str().to_string()]);
    assert!(token.as_str().starts_with("ya29.fake-"));

    let bearer = format!("Bearer {}", token.as_str());
    let headers = [("content-type", "application/json"), ("authorization", bearer.as_str())];
    let url = vertex_url(&front, VERTEX_MODEL, "streamRawPredict");
    let answer = send(request("POST", &url, &headers, vertex_body().to_string())).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    let text = answer.text();
    let first = text.find("event: message_start").unwrap();
    assert!(text[first..].contains("event: message_stop"), "{text}");

    let sent: Value = serde_json::from_slice(&sim.last().body).unwrap();
    assert_eq!((sent["model"].as_str(), sent["stream"].as_bool()), (Some(VERTEX_MODEL), Some(true)));
    assert!(sent.get("anthropic_version").is_none(), "{sent}");
    assert_eq!(front.refused(), 0);
    assert_eq!(front.requests().len(), 2, "the grant and the call");
}

#[tokio::test]
async fn vertex_refuses_a_bearer_it_never_issued_401_without_forwarding() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = VertexFront::start(sim.url()).await;
    let url = vertex_url(&front, VERTEX_MODEL, "rawPredict");
    for headers in [vec![("authorization", "Bearer ya29.not-issued")], vec![]] {
        let answer = send(request("POST", &url, &headers, vertex_body().to_string())).await;
        assert_eq!(answer.status, 401);
        assert_eq!(
            answer.json(),
            json!({"error": {"code": 401, "message": "Request had invalid authentication credentials.", "status": "UNAUTHENTICATED"}})
        );
    }
    let grant = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=e30.e30.AAAA";
    let answer =
        send(request("POST", &front.token_uri(), &[("content-type", "application/x-www-form-urlencoded")], grant))
            .await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.json()["error"], "invalid_grant");
    assert!(front.issued_tokens().is_empty());
    assert_eq!((sim.len(), front.refused()), (0, 3));
}

#[tokio::test]
async fn vertex_passes_json_errors_and_token_counts_as_they_came() {
    let spec = ProviderSpec { window: 1_000, chars_per_token: 4.0, ..ProviderSpec::default() };
    let sim = ProviderSim::start(spec).await;
    let front = VertexFront::start(sim.url()).await;
    front.accept_token("ya29.accepted");
    let headers = [("content-type", "application/json"), ("authorization", "Bearer ya29.accepted")];

    let answer =
        send(request("POST", &vertex_url(&front, VERTEX_MODEL, "rawPredict"), &headers, vertex_body().to_string()))
            .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["model"], VERTEX_MODEL);
    assert!(serde_json::from_slice::<Value>(&sim.last().body).unwrap().get("stream").is_none());

    let mut long = vertex_body();
    long["messages"][0]["content"][0]["text"] = json!("word ".repeat(2_000));
    let answer =
        send(request("POST", &vertex_url(&front, VERTEX_MODEL, "rawPredict"), &headers, long.to_string())).await;
    assert_eq!(answer.status, 400);
    let message = answer.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.starts_with("prompt is too long: ") && message.ends_with("> 1000 maximum"), "{message}");

    let mut count = vertex_body();
    count["model"] = json!(VERTEX_MODEL);
    let answer =
        send(request("POST", &vertex_url(&front, "count-tokens", "rawPredict"), &headers, count.to_string())).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.json()["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(sim.last().path, "/v1/messages/count_tokens");

    let mut foreign = vertex_body();
    foreign["anthropic_version"] = json!("bedrock-2023-05-31");
    let before = sim.len();
    let answer =
        send(request("POST", &vertex_url(&front, VERTEX_MODEL, "rawPredict"), &headers, foreign.to_string())).await;
    assert_eq!(answer.status, 400);
    assert_eq!(sim.len(), before);
}
