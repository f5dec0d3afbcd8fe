//! OpenTelemetry traces over OTLP/HTTP (protobuf), from `[trace]`: the `tracing` spans compactor
//! opens (`compactor.request` and its children) become OpenTelemetry spans, exported in batches
//! on a background thread so a slow or dead collector neither slows nor fails a request (spans
//! beyond `trace.queue_size` are dropped). The W3C `traceparent` of the client continues in the
//! request span, and the upstream gets the `traceparent` of the span that sends to it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use tracing::Span;
use tracing::field::Empty;

use crate::config::TraceConfig;
use crate::dialect::Dialect;
use crate::route::{ApiFamily, Route};

/// The target of every span compactor opens for traces (the logs leave it out).
pub const TARGET: &str = "compactor::trace";

/// Set once traces are exported: only then does compactor touch `traceparent`.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The largest collector answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

pub use crate::config::headers::parse_headers;

/// The exporter's pipeline, kept by the server so that shutdown flushes what is queued.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Sends the spans still queued (bounded by the export timeout) and stops the exporter thread.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(error = %error, "trace export did not finish at shutdown");
        }
    }
}

/// The `tracing` layer that turns compactor's spans into OpenTelemetry spans, and the pipeline
/// behind it; `None` when `[trace]` is off. Must run inside the Tokio runtime (the exporter's
/// HTTP client sends from it).
pub fn pipeline(
    config: &TraceConfig,
) -> Result<Option<(opentelemetry_sdk::trace::Tracer, Tracing)>, Box<dyn std::error::Error + Send + Sync>> {
    if !config.enabled {
        return Ok(None);
    }
    let client = ExportClient::new(config.export_timeout)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(config.endpoint.clone())
        .with_timeout(config.export_timeout)
        .with_headers(parse_headers(config.headers.expose())?)
        .build()?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(config.queue_size as usize)
        .with_scheduled_delay(Duration::from_millis(500))
        .build();
    let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batch).build();
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(config.service_name.clone()).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("compactor");
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some((tracer, Tracing { provider })))
}

/// Whether traces are exported (and `traceparent` is compactor's business).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The request's span: compactor's own attributes and the OpenTelemetry GenAI ones, recorded as
/// the request learns them ([`describe_request`], the finish). A disabled span when traces are off.
pub fn request_span(method: &http::Method, route: &Route, request_id: &str) -> Span {
    // Without an exporter no layer wants these spans (the logs leave them out): not opening them
    // saves the subscriber's bookkeeping on every request.
    if !enabled() {
        return Span::none();
    }
    let rewritable = Dialect::of(route.endpoint).is_some();
    tracing::info_span!(
        target: TARGET,
        "compactor.request",
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %method,
        http.route = route.label(),
        http.response.status_code = Empty,
        error.type = Empty,
        compactor.request_id = request_id,
        gen_ai.operation.name = rewritable.then_some("chat"),
        gen_ai.provider.name = rewritable.then_some(provider(route.family)),
        gen_ai.system = rewritable.then_some(provider(route.family)),
        gen_ai.request.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        compactor.session = Empty,
        compactor.conversation = Empty,
        compactor.tokens_before = Empty,
        compactor.tokens_after = Empty,
        compactor.pruned = Empty,
        compactor.retries = Empty,
        compactor.compaction_generation = Empty,
    )
}

/// The GenAI provider name of an upstream family.
pub fn provider(family: ApiFamily) -> &'static str {
    match family {
        ApiFamily::OpenAi => "openai",
        ApiFamily::Anthropic => "anthropic",
        ApiFamily::Gemini => "gcp.gemini",
        ApiFamily::Vertex => "gcp.vertex_ai",
        ApiFamily::Azure => "azure.ai.openai",
        // OpenTelemetry's GenAI names for the platforms Claude is served on.
        ApiFamily::Bedrock => "aws.bedrock",
        ApiFamily::VertexAnthropic => "gcp.vertex_ai",
    }
}

/// Records the request's model on the current (request) span. (The span keeps its name: an
/// OpenTelemetry span's name is fixed once it started, before the model is known.)
pub fn describe_request(model: Option<&str>) {
    let Some(model) = model else { return };
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("gen_ai.request.model", model);
}

/// A child of the current span, for one stage of the request (`compactor.rewrite`,
/// `compactor.session.load`, `compactor.store.write` with its operation).
pub fn stage(name: &'static str, session: &str) -> Span {
    if !enabled() {
        return Span::none();
    }
    match name {
        "compactor.session.load" => {
            tracing::info_span!(target: TARGET, "compactor.session.load", compactor.session = session)
        }
        "compactor.store.write" => {
            tracing::info_span!(target: TARGET, "compactor.store.write", compactor.session = session, compactor.operation = Empty, otel.status_code = Empty)
        }
        _ => tracing::info_span!(target: TARGET, "compactor.rewrite", compactor.session = session),
    }
}

/// One call to the upstream, from sending to the response head.
pub fn upstream_span(family: ApiFamily, host: &str) -> Span {
    if !enabled() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "compactor.upstream",
        otel.kind = "client",
        otel.status_code = Empty,
        server.address = host,
        gen_ai.provider.name = provider(family),
        http.response.status_code = Empty,
        error.type = Empty,
    )
}

/// The summary call of a compaction, under the rewrite (or the recovery) that asked for it.
pub fn summary_span(family: ApiFamily, model: &str) -> Span {
    if !enabled() {
        return Span::none();
    }
    tracing::info_span!(
        target: TARGET,
        "compactor.summary",
        otel.name = format!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider(family),
        gen_ai.system = provider(family),
        gen_ai.request.model = model,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        compactor.summary_calls = Empty,
        error.type = Empty,
    )
}

/// Continues the client's trace in `span` when the request carries a W3C `traceparent`.
pub fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
    if !enabled() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if opentelemetry::trace::TraceContextExt::span(&parent).span_context().is_valid() {
        // Refused only when the span is already gone or has no OpenTelemetry layer: nothing to continue.
        drop(span.set_parent(parent));
    }
}

/// Sets `traceparent` (and `tracestate`) of the upstream request to the current span, so the
/// provider's side of the call joins the same trace; without traces, the client's pass unchanged.
pub fn inject(span: &Span, headers: &mut HeaderMap) {
    if !enabled() || span.is_disabled() {
        return;
    }
    let context = span.context();
    if !opentelemetry::trace::TraceContextExt::span(&context).span_context().is_valid() {
        return;
    }
    TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(&value)) {
            self.0.insert(name, value);
        }
    }
}

/// The exporter's HTTP client: the hyper and rustls compactor already uses for upstreams (no
/// second TLS stack). The batch processor exports from its own thread, outside the runtime, so
/// each export is spawned on the runtime captured at start and awaited from there.
struct ExportClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl std::fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportClient").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl ExportClient {
    fn new(timeout: Duration) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let runtime = tokio::runtime::Handle::try_current()?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { client, runtime, timeout })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        let client = self.client.clone();
        let timeout = self.timeout;
        let call = async move {
            let response = client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES).collect().await?.to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(Response::from_parts(parts, body))
        };
        let exported = self.runtime.spawn(async move {
            tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| Err("trace export timed out".into()))
        });
        exported.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_in_the_otel_form_and_errors_never_quote_a_value() {
        let headers = parse_headers(" authorization=Bearer abc , x-team = t1 ,").unwrap();
        assert_eq!(headers.get("authorization").map(String::as_str), Some("Bearer abc"));
        assert_eq!(headers.get("x-team").map(String::as_str), Some("t1"));
        assert!(parse_headers("").unwrap().is_empty());
        let error = parse_headers("authorization").unwrap_err();
        assert!(error.contains("entry 1"), "{error}");
        let error = parse_headers("x=ok,bad header=secret-value").unwrap_err();
        assert!(!error.contains("secret-value"), "{error}");
        let error = parse_headers("k=secret\nvalue").unwrap_err();
        assert!(!error.contains("secret"), "{error}");
    }
}
