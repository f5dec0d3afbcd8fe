//! OpenTelemetry traces: a loopback OTLP/HTTP receiver decodes what compactor exports and checks
//! the spans, their parent/child links and attributes, the `traceparent` the upstream received,
//! and that a dead or hanging collector fails no request.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use tokio::net::TcpListener;

use crate::common::*;

/// What the collector received: the spans of every export and the headers of each export call.
#[derive(Default)]
pub(crate) struct Collected {
    pub(crate) spans: Vec<Span>,
    headers: Vec<HeaderMap>,
    service_names: Vec<String>,
}

/// A small OTLP/HTTP traces receiver on loopback: decodes protobuf `ExportTraceServiceRequest`s.
pub(crate) async fn collector() -> (String, Arc<Mutex<Collected>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    let collected = Arc::new(Mutex::new(Collected::default()));
    let state = collected.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let state = state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let state = state.clone();
                    async move {
                        let (parts, body) = request.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let status = match (parts.uri.path(), ExportTraceServiceRequest::decode(body)) {
                            ("/v1/traces", Ok(export)) => {
                                let mut state = state.lock().unwrap();
                                state.headers.push(parts.headers.clone());
                                for resource in export.resource_spans {
                                    if let Some(resource) = &resource.resource {
                                        for kv in &resource.attributes {
                                            if kv.key == "service.name" {
                                                state.service_names.push(text(kv.value.as_ref()));
                                            }
                                        }
                                    }
                                    for scope in resource.scope_spans {
                                        state.spans.extend(scope.spans);
                                    }
                                }
                                200
                            }
                            _ => 400,
                        };
                        let response = Response::builder()
                            .status(status)
                            .header("content-type", "application/x-protobuf")
                            .body(Full::new(Bytes::new()))
                            .unwrap();
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, collected)
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

pub(crate) fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref()))).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_PARENT: &str = "b7ad6b7169203331";

#[tokio::test]
async fn a_request_is_one_trace_continued_from_the_client_and_propagated_upstream() {
    let (endpoint, collected) = collector().await;
    let fake = FakeUpstream::start().await;
    let proxy = ProxyProcess::start(
        &fake,
        &format!(
            "[trace]\nenabled = true\nendpoint = \"{endpoint}\"\nheaders = \"authorization=Bearer otlp-key-4711\"\nservice_name = \"compactor-test\"\n"
        ),
    );
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_PARENT}-01");
    let body: serde_json::Value = serde_json::from_str(&chat_body(false)).unwrap();
    let answer = proxy
        .post("/v1/chat/completions", &[("traceparent", &traceparent), ("x-session-id", "trace-session-1")], &body)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    // The upstream joined the client's trace, under compactor's upstream span.
    let sent = fake.last();
    let upstream_parent = sent.headers.get("traceparent").and_then(|v| v.to_str().ok()).unwrap().to_string();
    let fields: Vec<&str> = upstream_parent.split('-').collect();
    assert_eq!(fields.len(), 4, "{upstream_parent}");
    assert_eq!(fields[1], CLIENT_TRACE, "the upstream continues the client's trace");
    assert_ne!(fields[2], CLIENT_PARENT, "the upstream's parent is compactor's span");

    let names = [
        "compactor.request",
        "compactor.session.load",
        "compactor.rewrite",
        "compactor.upstream",
        "compactor.store.write",
    ];
    let complete = eventually(async || {
        let state = collected.lock().unwrap();
        names.iter().all(|name| {
            state
                .spans
                .iter()
                .any(|s| s.name == *name || (*name == "compactor.request" && s.kind == SpanKind::Server as i32))
        })
    })
    .await;
    let state = collected.lock().unwrap();
    assert!(
        !state
            .spans
            .iter()
            .flat_map(|s| &s.attributes)
            .any(|kv| kv.key.starts_with("code.") || kv.key.starts_with("thread.")),
        "no instrumentation noise"
    );
    let seen: Vec<&str> = state.spans.iter().map(|s| s.name.as_str()).collect();
    assert!(complete, "spans exported: {seen:?}");
    assert!(state.spans.iter().all(|s| hex(&s.trace_id) == CLIENT_TRACE), "one trace: {seen:?}");

    let request = state.spans.iter().find(|s| s.kind == SpanKind::Server as i32).unwrap();
    assert_eq!(request.name, "compactor.request");
    assert_eq!(hex(&request.parent_span_id), CLIENT_PARENT, "the client's span is the request's parent");
    let attrs = attributes(request);
    assert_eq!(attrs["gen_ai.operation.name"], "chat");
    assert_eq!(attrs["gen_ai.provider.name"], "openai");
    assert_eq!(attrs["gen_ai.system"], "openai");
    assert_eq!(attrs["gen_ai.request.model"], "gpt-4o");
    assert_eq!(attrs["gen_ai.usage.input_tokens"], "12", "the upstream's usage");
    assert_eq!(attrs["gen_ai.usage.output_tokens"], "1");
    assert_eq!(attrs["http.response.status_code"], "200");
    assert_eq!(attrs["compactor.retries"], "0");
    assert_eq!(Some(attrs["compactor.session"].as_str()), answer.header("x-compactor-session"));
    assert_eq!(Some(attrs["compactor.tokens_before"].as_str()), answer.header("x-compactor-tokens-before"));
    assert_eq!(Some(attrs["compactor.tokens_after"].as_str()), answer.header("x-compactor-tokens-after"));
    assert_eq!(attrs["compactor.pruned"], "0");
    assert_eq!(Some(attrs["compactor.request_id"].as_str()), answer.header("x-compactor-request-id"));

    for name in ["compactor.session.load", "compactor.rewrite", "compactor.upstream", "compactor.store.write"] {
        let child = state.spans.iter().find(|s| s.name == name).unwrap();
        assert_eq!(child.parent_span_id, request.span_id, "{name} is a child of the request");
        assert!(child.start_time_unix_nano >= request.start_time_unix_nano, "{name}");
        assert!(child.end_time_unix_nano <= request.end_time_unix_nano, "{name} ends within the request");
    }
    let upstream = state.spans.iter().find(|s| s.name == "compactor.upstream").unwrap();
    assert_eq!(upstream.kind, SpanKind::Client as i32);
    assert_eq!(hex(&upstream.span_id), fields[2], "the upstream's traceparent names the upstream span");
    assert_eq!(attributes(upstream)["http.response.status_code"], "200");
    let load = state.spans.iter().find(|s| s.name == "compactor.session.load").unwrap();
    assert_eq!(attributes(load)["compactor.session"], attrs["compactor.session"]);

    assert_eq!(state.service_names.first().map(String::as_str), Some("compactor-test"));
    assert!(
        state
            .headers
            .iter()
            .all(|h| h.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer otlp-key-4711")),
        "every export carries the configured headers"
    );
    assert!(state.headers.iter().all(|h| h.get("content-type").is_some_and(|v| v == "application/x-protobuf")));
    drop(state);
    let logs = proxy.logs().join("\n");
    assert!(!logs.contains("otlp-key-4711"), "the exporter's key never reaches the logs");
    assert!(!logs.contains("compactor.request"), "spans stay out of the logs");
}

#[tokio::test]
async fn without_traces_the_clients_traceparent_passes_unchanged() {
    let (fake, proxy) = ProxyProcess::with_fake("").await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_PARENT}-01");
    let body: serde_json::Value = serde_json::from_str(&chat_body(false)).unwrap();
    let answer = proxy.post("/v1/chat/completions", &[("traceparent", &traceparent)], &body).await;
    assert_eq!(answer.status, 200);
    assert_eq!(fake.last().headers.get("traceparent").and_then(|v| v.to_str().ok()), Some(traceparent.as_str()));
}

#[tokio::test]
async fn a_dead_or_hanging_collector_fails_no_request() {
    // Refused: a port nobody listens on.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = format!("http://{}/v1/traces", closed.local_addr().unwrap());
    drop(closed);
    // Hanging: accepts connections and never answers.
    let hanging = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hanging_url = format!("http://{}/v1/traces", hanging.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let holder = held.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = hanging.accept().await {
            holder.lock().unwrap().push(stream);
        }
    });
    for endpoint in [refused, hanging_url] {
        let fake = FakeUpstream::start().await;
        let proxy = ProxyProcess::start(
            &fake,
            &format!(
                "[trace]\nenabled = true\nendpoint = \"{endpoint}\"\nqueue_size = 16\nexport_timeout_ms = 60000\n"
            ),
        );
        let body: serde_json::Value = serde_json::from_str(&chat_body(false)).unwrap();
        for i in 0..40 {
            let session = format!("dead-collector-{i}");
            let answer = proxy.post("/v1/chat/completions", &[("x-session-id", &session)], &body).await;
            assert_eq!(answer.status, 200, "{endpoint}: {}", answer.text());
            assert!(fake.last().headers.contains_key("traceparent"), "traces are on");
        }
        assert_eq!(fake.received().len(), 40);
    }
}

/// The summary call's span: a GenAI client span named `chat MODEL`.
fn is_summary(span: &Span) -> bool {
    span.name.starts_with("chat ") && attributes(span).get("gen_ai.operation.name").is_some_and(|o| o == "chat")
}

#[tokio::test]
async fn an_overflow_recovery_shows_each_attempt_and_the_summary_call() {
    use crate::common::window::{Api, WindowSpec, conversation, window_upstream};
    let (endpoint, collected) = collector().await;
    let (fake, summaries) = window_upstream(WindowSpec::window(4_000)).await;
    let config = format!(
        "[models.big-summarizer]\ncontext_window = 200000\nmax_output_tokens = 8192\n[prune]\nenabled = false\n[truncate]\nenabled = false\n[compaction]\nkeep_recent_tokens = 600\nuser_message_max_tokens = 300\nemergency_protect_tokens = 1000000\nmodel = \"big-summarizer\"\n[trace]\nenabled = true\nendpoint = \"{endpoint}\"\n"
    );
    let proxy = ProxyProcess::start(&fake, &config);
    let headers = [("authorization", "Bearer k"), ("x-session-id", "traced-overflow")];
    let answer = proxy.post(Api::Chat.path(), &headers, &conversation(Api::Chat, 12, false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(summaries.count(), 1);
    assert_eq!(answer.header("x-compactor-retries"), Some("1"));

    let complete = eventually(async || {
        let state = collected.lock().unwrap();
        state.spans.iter().any(|s| s.name == "compactor.request")
            && state.spans.iter().any(is_summary)
            && state.spans.iter().filter(|s| s.name == "compactor.upstream").count() >= 3
    })
    .await;
    let state = collected.lock().unwrap();
    let seen: Vec<&str> = state.spans.iter().map(|s| s.name.as_str()).collect();
    assert!(complete, "spans exported: {seen:?}");
    let request = state.spans.iter().find(|s| s.name == "compactor.request").unwrap();
    let attrs = attributes(request);
    assert_eq!(attrs["compactor.retries"], "1");
    assert_eq!(attrs["compactor.compaction_generation"], "1");
    assert!(request.parent_span_id.is_empty(), "a request without traceparent starts a trace");

    let summary = state.spans.iter().find(|s| is_summary(s)).unwrap();
    assert_eq!(summary.parent_span_id, request.span_id, "the recovery's summary hangs off the request");
    let summary_attrs = attributes(summary);
    assert_eq!(summary_attrs["gen_ai.operation.name"], "chat");
    assert_eq!(summary_attrs["gen_ai.provider.name"], "openai");
    assert_eq!(summary.name, "chat big-summarizer", "GenAI span name");
    assert_eq!(summary_attrs["gen_ai.request.model"], "big-summarizer");
    assert_eq!(summary_attrs["compactor.summary_calls"], "1");
    assert_eq!(summary.kind, SpanKind::Client as i32);
    assert!(summary_attrs["gen_ai.usage.input_tokens"].parse::<u64>().unwrap() > 0);
    assert!(summary_attrs["gen_ai.usage.output_tokens"].parse::<u64>().unwrap() > 0);

    let upstream: Vec<&Span> = state.spans.iter().filter(|s| s.name == "compactor.upstream").collect();
    let attempts: Vec<&&Span> = upstream.iter().filter(|s| s.parent_span_id == request.span_id).collect();
    assert_eq!(attempts.len(), 2, "the overflowing attempt and the retry");
    let statuses: Vec<String> = attempts.iter().map(|s| attributes(s)["http.response.status_code"].clone()).collect();
    assert!(statuses.contains(&"200".to_string()) && statuses.iter().any(|s| s != "200"), "{statuses:?}");
    assert!(upstream.iter().any(|s| s.parent_span_id == summary.span_id), "the summary's own upstream call");
    // Every upstream call carried a traceparent of this trace.
    let trace = hex(&request.trace_id);
    for received in fake.received() {
        let parent = received.headers.get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(parent.contains(&trace), "{parent}");
    }
}
