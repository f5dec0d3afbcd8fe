//! Claude on Amazon Bedrock and on Vertex AI through compactor, in front of fakes of both
//! (`common::cloud`) that check every request's credential as the platforms do: a SigV4 signature
//! recomputed from what arrived, a Google access token the fake's own OAuth endpoint issued to
//! compactor's service account. (The real Claude Code is driven through them in the agents suite.)

use sha2::Digest;

use crate::common::cloud::*;
use bytes::Bytes;

use crate::common::agents;
use crate::common::provider::{self, Dialect, ProviderSim, ProviderSpec};
use crate::common::window::{Api, conversation};
use crate::common::*;
use serde_json::{Value, json};

const MODEL_ID: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
const CLIENT_KEY: &str = "ck-team-a-7f3e91c2";
const VERTEX_MODEL: &str = "claude-sonnet-4-5@20250929";
const VERTEX_PATH: &str = "/v1/projects/proj-test/locations/us-east5/publishers/anthropic/models";

fn bedrock_path(operation: &str) -> String {
    format!("/model/{MODEL_ID}/{operation}")
}

/// `[clients.team-a]` with [`CLIENT_KEY`]'s digest.
fn clients() -> String {
    let digest: String = sha2::Sha256::digest(CLIENT_KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!("[clients.team-a]\nkey_sha256 = \"{digest}\"\n")
}

/// The environment compactor finds its AWS credentials in (and nothing else of the machine's).
fn aws_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("AWS_ACCESS_KEY_ID", AWS_ACCESS_KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET_ACCESS_KEY),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_CONFIG_FILE", "/nonexistent/aws-config"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials"),
    ]
}

/// A Messages body as Claude Code sends it to Bedrock: its version, no model, no stream key.
fn for_bedrock(mut body: Value) -> Value {
    let object = body.as_object_mut().unwrap();
    object.remove("model");
    object.remove("stream");
    object.insert("anthropic_version".into(), json!("bedrock-2023-05-31"));
    body
}

/// The same for Vertex AI: its version, no model, the stream flag kept.
fn for_vertex(mut body: Value) -> Value {
    let object = body.as_object_mut().unwrap();
    object.remove("model");
    object.insert("anthropic_version".into(), json!("vertex-2023-10-16"));
    body
}

/// A provider whose window the conversation of `turns` turns passes by half.
async fn small_provider(body: &Value) -> ProviderSim {
    let probe = ProviderSim::start(ProviderSpec::default()).await;
    let tokens = probe.count(Dialect::Messages, &serde_json::to_vec(body).unwrap());
    ProviderSim::start(ProviderSpec { window: tokens * 2 / 3, ..ProviderSpec::default() }).await
}

/// Settings under which a compaction is one summary call and nothing is pruned first.
const COMPACTION: &str = "[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\n";

fn closed() -> String {
    format!("http://{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap())
}

async fn post_bytes(proxy: &ProxyProcess, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(request("POST", &proxy.url(path), &all, serde_json::to_vec(body).unwrap())).await
}

#[tokio::test]
async fn a_client_key_request_to_bedrock_is_signed_by_compactor_and_its_framed_stream_comes_back_whole() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::NamesWindow).await;
    let toml = format!(
        "[upstream]\nanthropic = \"{}\"\nbedrock = \"{}\"\nbedrock_region = \"{AWS_REGION}\"\n[admin]\ntoken = \"{}\"\n{}",
        closed(),
        front.url(),
        agents::ADMIN_TOKEN,
        clients()
    );
    let proxy = ProxyProcess::start_with(&toml, &aws_env());
    let body = for_bedrock(conversation(Api::Anthropic, 2, false));
    let bearer = format!("Bearer {CLIENT_KEY}");
    let answer = post_bytes(
        &proxy,
        &bedrock_path("invoke-with-response-stream"),
        &[("authorization", &bearer), ("x-claude-code-session-id", "bedrock-1")],
        &body,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("application/vnd.amazon.eventstream"));
    let events = chunk_events(&decode_event_stream(&answer.body));
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"message_stop"), "{kinds:?}");

    // The front saw one request, signed by compactor's credentials, without the client's key.
    let received = front.requests();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].verdict, Verdict::Verified, "{:?}", received[0]);
    let authorization = received[0].headers["authorization"].to_str().unwrap();
    assert!(authorization.starts_with(&format!("AWS4-HMAC-SHA256 Credential={AWS_ACCESS_KEY_ID}/")), "{authorization}");
    let forwarded = format!("{:?}", received[0].headers);
    assert!(!forwarded.contains(CLIENT_KEY), "the client key left compactor: {forwarded}");
    assert_eq!(sim.last().path, "/v1/messages");
    let sent: Value = serde_json::from_slice(&sim.last().body).unwrap();
    assert_eq!(sent["model"], MODEL_ID, "the path's model id is the model");

    // The usage inside the frames was read: the session knows the provider's count.
    let session = answer.header("x-compactor-session").unwrap().to_string();
    let read = async || {
        let view = proxy.get_with_token(&format!("/admin/sessions/{session}"), agents::ADMIN_TOKEN).await;
        view.status == 200 && view.text().contains(&format!("\"prompt_tokens\":{}", sim.last().tokens))
    };
    assert!(eventually(read).await, "the usage in Bedrock's frames reached the session");
}

#[tokio::test]
async fn a_bedrock_or_vertex_request_without_a_credential_or_with_a_wrong_key_is_refused_before_it_is_signed() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let bedrock = BedrockFront::start(sim.url(), BedrockOverflow::NamesWindow).await;
    let vertex = VertexFront::start(sim.url()).await;
    let toml = format!(
        "[upstream]\nbedrock = \"{}\"\nbedrock_region = \"{AWS_REGION}\"\nvertex = \"{}\"\n{}",
        bedrock.url(),
        vertex.url(),
        clients()
    );
    let proxy = ProxyProcess::start_with(&toml, &aws_env());
    let body = for_bedrock(conversation(Api::Anthropic, 1, false));
    for headers in [vec![], vec![("x-compactor-key", "ck-not-a-key")]] {
        let answer = post_bytes(&proxy, &bedrock_path("invoke"), &headers, &body).await;
        assert_eq!(answer.status, 401, "{headers:?}: {}", answer.text());
        assert_eq!(answer.header("x-compactor-error"), Some("client_key_required"));
        assert_eq!(answer.header("x-amzn-errortype"), Some("UnrecognizedClientException"));
        assert!(answer.json()["message"].as_str().unwrap().contains("client key"), "{}", answer.text());
    }
    let vertex_body = for_vertex(conversation(Api::Anthropic, 1, false));
    let answer = post_bytes(&proxy, &format!("{VERTEX_PATH}/{VERTEX_MODEL}:rawPredict"), &[], &vertex_body).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(answer.json()["error"]["type"], "authentication_error", "Anthropic's shape on Vertex AI");
    assert!(bedrock.requests().is_empty() && vertex.requests().is_empty(), "nothing was sent anywhere");
    assert_eq!(sim.len(), 0);
}

#[tokio::test]
async fn a_request_the_client_signed_that_compactor_leaves_alone_arrives_byte_identical_with_its_signature() {
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::NamesWindow).await;
    let toml = format!("[upstream]\nbedrock = \"{}\"\nbedrock_region = \"{AWS_REGION}\"\n", front.url());
    // compactor holds credentials too: it still leaves the client's signature on a body it keeps.
    let proxy = ProxyProcess::start_with(&toml, &aws_env());
    let body = serde_json::to_vec(&for_bedrock(conversation(Api::Anthropic, 1, false))).unwrap();
    let url = proxy.url(&bedrock_path("invoke"));
    let signed = sign_bedrock("POST", &url, &[("content-type", "application/json")], body.clone());
    let client_authorization = signed.headers()["authorization"].clone();
    let answer = send(signed).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let received = front.requests();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].verdict, Verdict::Verified, "{:?}", received[0].verdict);
    assert_eq!(received[0].body, body, "the body arrived byte for byte");
    assert_eq!(received[0].headers["authorization"], client_authorization, "with the client's own signature");
}

#[tokio::test]
async fn an_overflow_on_bedrock_is_recovered_with_compactor_s_signature_and_without_credentials_goes_as_it_came() {
    let body = for_bedrock(conversation(Api::Anthropic, 12, false));
    let bytes = serde_json::to_vec(&body).unwrap();

    // compactor holds AWS credentials: the client-signed request that overflows is summarized
    // (a call to /invoke) and sent again, both signed by compactor.
    let sim = small_provider(&body).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::Silent).await;
    let toml = format!("[upstream]\nbedrock = \"{}\"\nbedrock_region = \"{AWS_REGION}\"\n{COMPACTION}", front.url());
    let proxy = ProxyProcess::start_with(&toml, &aws_env());
    let url = proxy.url(&bedrock_path("invoke"));
    let answer = send(sign_bedrock("POST", &url, &[("content-type", "application/json")], bytes.clone())).await;
    assert_eq!(answer.status, 200, "the overflow never reached the client: {}", answer.text());
    assert_eq!(answer.header("x-compactor-retries"), Some("1"));
    let received = front.requests();
    assert!(received.iter().all(|r| r.verdict == Verdict::Verified), "{received:?}");
    let summary = received.iter().find(|r| String::from_utf8_lossy(&r.body).contains(provider::SUMMARY_MARKER));
    let summary = summary.expect("a summary call went to Bedrock");
    assert_eq!(summary.path, format!("/model/{MODEL_ID}/invoke"));
    let summary_body: Value = serde_json::from_slice(&summary.body).unwrap();
    assert_eq!(summary_body["anthropic_version"], "bedrock-2023-05-31");
    assert!(summary_body.get("model").is_none() && summary_body.get("stream").is_none(), "{summary_body}");
    let last = received.last().unwrap();
    assert_ne!(last.body, bytes, "the retry carried the rebuilt conversation");
    assert!(String::from_utf8_lossy(&last.body).contains("QUASAR-MAPLE-7"), "the summary kept the fact");

    // No AWS credentials: compactor cannot sign a changed body, so the request goes as it came
    // (the client's signature intact) and the overflow is the client's to see; counted.
    let sim = small_provider(&body).await;
    let front = BedrockFront::start(sim.url(), BedrockOverflow::Silent).await;
    let toml = format!("[upstream]\nbedrock = \"{}\"\nbedrock_region = \"{AWS_REGION}\"\n{COMPACTION}", front.url());
    let no_credentials = [
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_CONFIG_FILE", "/nonexistent/aws-config"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials"),
    ];
    let proxy = ProxyProcess::start_with(&toml, &no_credentials);
    proxy.wait_for_log("compactor holds no AWS credentials").await;
    let url = proxy.url(&bedrock_path("invoke"));
    let answer = send(sign_bedrock("POST", &url, &[("content-type", "application/json")], bytes.clone())).await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(answer.json()["message"], "Input is too long for requested model.");
    let received = front.requests();
    assert_eq!(received.len(), 1);
    assert_eq!((&received[0].verdict, &received[0].body), (&Verdict::Verified, &Bytes::from(bytes)));
    let metrics = send(request("GET", &proxy.url("/metrics"), &[], "")).await.text();
    assert!(metrics.contains("compactor_forwarded_as_signed_total{family=\"bedrock\"} 1"), "{metrics}");
}

#[tokio::test]
async fn claude_on_vertex_gets_compactor_s_google_token_for_a_client_key_and_passes_the_client_s_own() {
    let body = for_vertex(conversation(Api::Anthropic, 12, true));
    let sim = small_provider(&body).await;
    let front = VertexFront::start(sim.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = service_account_file(dir.path(), &front.token_uri());
    let key_file = key_file.to_str().unwrap();
    let toml =
        format!("[upstream]\nanthropic = \"{}\"\nvertex = \"{}\"\n{COMPACTION}{}", closed(), front.url(), clients());
    let proxy = ProxyProcess::start_with(&toml, &[("GOOGLE_APPLICATION_CREDENTIALS", key_file)]);
    let stream_path = format!("{VERTEX_PATH}/{VERTEX_MODEL}:streamRawPredict");

    // A client key: compactor's own token, and an overflow recovered at :rawPredict.
    let bearer = format!("Bearer {CLIENT_KEY}");
    let answer = post_bytes(&proxy, &stream_path, &[("authorization", &bearer)], &body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().contains("event: message_stop"), "the SSE stream came through");
    let issued = front.issued_tokens();
    assert!(!issued.is_empty(), "compactor's service account got a token");
    let received: Vec<_> = front.requests().into_iter().filter(|r| r.path.starts_with(VERTEX_PATH)).collect();
    assert!(received.iter().all(|r| r.verdict == Verdict::Verified), "{received:?}");
    for request in &received {
        let authorization = request.headers["authorization"].to_str().unwrap();
        assert!(issued.iter().any(|token| authorization == format!("Bearer {token}")), "{authorization}");
    }
    let summary = received.iter().find(|r| String::from_utf8_lossy(&r.body).contains(provider::SUMMARY_MARKER));
    let summary = summary.expect("a summary call went to Vertex AI");
    assert_eq!(summary.path, format!("{VERTEX_PATH}/{VERTEX_MODEL}:rawPredict"));
    assert_eq!(serde_json::from_slice::<Value>(&summary.body).unwrap()["anthropic_version"], "vertex-2023-10-16");
    assert_eq!(answer.header("x-compactor-retries"), Some("1"));

    // Its token count is counted as the next request would be sent, at Vertex AI's count-tokens.
    let mut count = conversation(Api::Anthropic, 12, false);
    count.as_object_mut().unwrap().remove("stream");
    count["model"] = json!(VERTEX_MODEL);
    let counted =
        post_bytes(&proxy, &format!("{VERTEX_PATH}/count-tokens:rawPredict"), &[("authorization", &bearer)], &count)
            .await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    assert!(counted.json()["input_tokens"].as_u64().is_some_and(|n| n > 0), "{}", counted.text());
    assert_eq!(front.requests().last().unwrap().path, format!("{VERTEX_PATH}/count-tokens:rawPredict"));

    // The client's own Google bearer passes as it came.
    front.accept_token("ya29.the-clients-own");
    let small = for_vertex(conversation(Api::Anthropic, 1, false));
    let path = format!("{VERTEX_PATH}/{VERTEX_MODEL}:rawPredict");
    let answer = post_bytes(&proxy, &path, &[("authorization", "Bearer ya29.the-clients-own")], &small).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(front.requests().last().unwrap().headers["authorization"], "Bearer ya29.the-clients-own");
}

/// The `href="/ui/…"` links of an inspector page.
fn ui_links(page: &str) -> Vec<String> {
    page.split("href=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|l| l.starts_with("/ui/"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn compactor_s_cloud_credentials_never_reach_a_log_a_trace_or_the_inspector() {
    const SESSION_TOKEN: &str = "aws-session-token-for-the-leak-test-93c1";
    let (endpoint, collected) = crate::traces::collector().await;
    let sim = ProviderSim::start(ProviderSpec::default()).await;
    let bedrock = BedrockFront::start(sim.url(), BedrockOverflow::NamesWindow).await;
    let vertex = VertexFront::start(sim.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = service_account_file(dir.path(), &vertex.token_uri());
    let toml = format!(
        "[upstream]\nanthropic = \"{}\"\nbedrock = \"{}\"\nbedrock_region = \"{AWS_REGION}\"\nvertex = \"{}\"\n[admin]\ntoken = \"{}\"\n[log]\nlevel = \"debug\"\n[trace]\nenabled = true\nendpoint = \"{endpoint}\"\n{}",
        closed(),
        bedrock.url(),
        vertex.url(),
        agents::ADMIN_TOKEN,
        clients()
    );
    let mut env = aws_env();
    env.push(("AWS_SESSION_TOKEN", SESSION_TOKEN));
    env.push(("GOOGLE_APPLICATION_CREDENTIALS", key_file.to_str().unwrap()));
    let proxy = ProxyProcess::start_with(&toml, &env);
    let bearer = format!("Bearer {CLIENT_KEY}");
    let mut sessions = Vec::new();
    for (path, body) in [
        (bedrock_path("invoke-with-response-stream"), for_bedrock(conversation(Api::Anthropic, 2, false))),
        (format!("{VERTEX_PATH}/{VERTEX_MODEL}:streamRawPredict"), for_vertex(conversation(Api::Anthropic, 2, true))),
    ] {
        let answer =
            post_bytes(&proxy, &path, &[("authorization", &bearer), ("x-session-id", "leak-test")], &body).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        sessions.push(answer.header("x-compactor-session").unwrap().to_string());
    }
    // What compactor sent: its signature and its Google token, as the fakes received them.
    let mut secrets = vec![AWS_SECRET_ACCESS_KEY.to_string(), SESSION_TOKEN.to_string(), CLIENT_KEY.to_string()];
    for request in bedrock.requests() {
        let authorization = request.headers["authorization"].to_str().unwrap().to_string();
        secrets.push(authorization.rsplit("Signature=").next().unwrap().to_string());
        assert_eq!(request.headers["x-amz-security-token"], SESSION_TOKEN, "the session token went to AWS");
    }
    let issued = vertex.issued_tokens();
    assert!(!issued.is_empty());
    secrets.extend(issued);

    assert!(eventually(async || collected.lock().unwrap().spans.len() >= 4).await, "spans were exported");
    let spans: Vec<String> = {
        let collected = collected.lock().unwrap();
        collected.spans.iter().map(|span| format!("{} {:?}", span.name, crate::traces::attributes(span))).collect()
    };
    let mut pages = String::new();
    let mut queue: Vec<String> = sessions.iter().map(|key| format!("/ui/sessions/{key}")).collect();
    queue.push("/ui/sessions".into());
    let mut seen = std::collections::HashSet::new();
    while let Some(path) = queue.pop() {
        if seen.len() > 40 || !seen.insert(path.clone()) {
            continue;
        }
        let page = send(request(
            "GET",
            &proxy.url(&path),
            &[("authorization", &format!("Bearer {}", agents::ADMIN_TOKEN))],
            "",
        ))
        .await;
        assert_eq!(page.status, 200, "{path}");
        queue.extend(ui_links(&page.text()).into_iter().filter(|link| link.starts_with("/ui/sessions/")));
        pages.push_str(&page.text());
    }
    assert!(seen.len() >= 4, "the inspector showed the sessions, their conversations and requests: {seen:?}");
    let logs = proxy.logs().join("\n");
    assert!(logs.contains("DEBUG") || logs.contains("debug"), "debug logging was on");
    for secret in &secrets {
        assert!(!logs.contains(secret.as_str()), "a log line holds {secret}");
        assert!(!spans.iter().any(|span| span.contains(secret.as_str())), "a span holds {secret}");
        assert!(!pages.contains(secret.as_str()), "the inspector shows {secret}");
    }
}
