//! The upstream side: one pooled HTTP client for the process and the building of upstream requests.

pub mod headers;

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::{BaseUrl, Config, UpstreamConfig};
use crate::error::ProxyError;
use crate::proxy::request_body::ClientBody;
use crate::route::{ApiFamily, Route};

/// The request body compactor sends upstream: complete on rewritable routes (it may have been
/// rewritten), the client's own body streamed as it arrives on every other route.
pub type UpstreamBody = Either<Full<Bytes>, ClientBody>;

/// The client's request without its body: what every attempt sends upstream again. compactor may
/// change the body (and the summary call sends its own), never the method, path or headers.
#[derive(Debug)]
pub struct RequestHead {
    pub route: Route,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
}

impl RequestHead {
    pub fn new(route: Route, parts: Parts) -> Self {
        Self { route, method: parts.method, uri: parts.uri, headers: parts.headers }
    }
}

/// The process-wide pooled client with both upstream bases.
pub struct Upstreams {
    client: Client<HttpsConnector<HttpConnector>, UpstreamBody>,
    openai: BaseUrl,
    anthropic: BaseUrl,
    first_byte_timeout: Duration,
    idle_timeout: Duration,
}

impl Upstreams {
    pub fn new(config: &Config) -> Result<Self, std::io::Error> {
        let upstream: &UpstreamConfig = &config.upstream;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(upstream.connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let roots = hyper_rustls::HttpsConnectorBuilder::new();
        let roots = if upstream.native_roots { roots.with_native_roots()? } else { roots.with_webpki_roots() };
        let builder = roots.https_or_http().enable_http1();
        let connector =
            if upstream.http2 { builder.enable_http2().wrap_connector(http) } else { builder.wrap_connector(http) };
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Self {
            client,
            openai: upstream.openai.clone(),
            anthropic: upstream.anthropic.clone(),
            first_byte_timeout: upstream.first_byte_timeout,
            idle_timeout: upstream.idle_timeout,
        })
    }

    pub fn base(&self, family: ApiFamily) -> &BaseUrl {
        match family {
            ApiFamily::OpenAi => &self.openai,
            ApiFamily::Anthropic => &self.anthropic,
        }
    }

    /// The upstream request for a client request: base URL joined with path and query, Host set
    /// for the upstream, hop-by-hop headers dropped, every other header kept in order.
    pub fn build_request(&self, head: &RequestHead, body: Bytes) -> Result<Request<UpstreamBody>, ProxyError> {
        self.build(head, Either::Left(Full::new(body)))
    }

    /// The upstream request for a client request whose body streams through as it arrives.
    pub fn build_streamed(&self, head: &RequestHead, body: ClientBody) -> Result<Request<UpstreamBody>, ProxyError> {
        self.build(head, Either::Right(body))
    }

    fn build(&self, head: &RequestHead, body: UpstreamBody) -> Result<Request<UpstreamBody>, ProxyError> {
        let base = self.base(head.route.family);
        let path_and_query = head.uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("/");
        let uri: Uri = format!("{}{}", base.as_str(), path_and_query).parse().map_err(ProxyError::BadUpstreamUrl)?;
        let mut headers = head.headers.clone();
        headers::strip_hop_by_hop(&mut headers);
        // The body may be rewritten; hyper sets the length of what is actually sent (a streamed
        // body's own, from the client's framing).
        headers.remove(header::CONTENT_LENGTH);
        let host = HeaderValue::from_str(base.authority()).map_err(ProxyError::BadUpstreamHost)?;
        headers.insert(header::HOST, host);
        let mut request = Request::new(body);
        *request.method_mut() = head.method.clone();
        *request.uri_mut() = uri;
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = headers;
        Ok(request)
    }

    pub fn first_byte_timeout(&self) -> Duration {
        self.first_byte_timeout
    }

    /// The longest silence between two chunks of a response body.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// The error for an upstream that broke off a response compactor was reading.
    pub fn cut(&self, family: ApiFamily, error: hyper::Error) -> ProxyError {
        ProxyError::UpstreamCut { upstream: self.base(family).to_string(), source: Box::new(error) }
    }

    /// Sends a request and waits for the response head, bounded by the first-byte timeout.
    pub async fn send(
        &self,
        family: ApiFamily,
        request: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, ProxyError> {
        let upstream = self.base(family).to_string();
        match tokio::time::timeout(self.first_byte_timeout, self.client.request(request)).await {
            Err(_) => Err(ProxyError::UpstreamTimeout { upstream, timeout: self.first_byte_timeout }),
            Ok(Err(error)) => Err(ProxyError::UpstreamUnreachable { upstream, source: Box::new(error) }),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// A complete call with the client's head and another body, asking for an uncompressed JSON
    /// answer: its status and whole body (up to `limit` bytes).
    pub async fn call(&self, head: &RequestHead, body: Bytes, limit: usize) -> Result<(StatusCode, Bytes), ProxyError> {
        let mut request = self.build_request(head, body)?;
        request.headers_mut().insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        request.headers_mut().insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let response = self.send(head.route.family, request).await?;
        let status = response.status();
        let body = self.read_body(head.route.family, response.into_body(), limit).await?;
        Ok((status, body))
    }

    /// An upstream body read whole, up to `limit` bytes; a break on the way is the upstream's.
    pub async fn read_body(&self, family: ApiFamily, body: Incoming, limit: usize) -> Result<Bytes, ProxyError> {
        match Limited::new(body, limit).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(source) => Err(ProxyError::UpstreamUnreachable { upstream: self.base(family).to_string(), source }),
        }
    }
}
