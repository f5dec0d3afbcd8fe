//! The upstream side: one pooled HTTP client for the process and the building of upstream requests.

pub mod headers;

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::{Authority, PathAndQuery, Scheme};
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

/// One upstream, with what every request to it needs worked out once: no request formats and
/// re-parses its URL or builds its Host header.
struct Upstream {
    base: BaseUrl,
    scheme: Scheme,
    authority: Authority,
    /// The base URL's path without its trailing slash (`""`, or `/api`), put before the request's.
    prefix: String,
    host: HeaderValue,
}

impl Upstream {
    fn new(base: &BaseUrl) -> Result<Self, std::io::Error> {
        let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
        let uri: Uri = base.as_str().parse().map_err(|e| invalid(format!("upstream {base}: {e}")))?;
        let (Some(scheme), Some(authority)) = (uri.scheme().cloned(), uri.authority().cloned()) else {
            return Err(invalid(format!("upstream {base}: no scheme or host")));
        };
        let host = HeaderValue::from_str(base.authority()).map_err(|e| invalid(format!("upstream {base}: {e}")))?;
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(Self { base: base.clone(), scheme, authority, prefix, host })
    }

    /// The upstream URI of a request's path and query: the base URL's path joined with them.
    fn uri(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, ProxyError> {
        let path_and_query = match path_and_query {
            Some(path_and_query) if self.prefix.is_empty() => path_and_query.clone(),
            _ => {
                let path_and_query = path_and_query.map_or("/", PathAndQuery::as_str);
                PathAndQuery::try_from(format!("{}{path_and_query}", self.prefix))
                    .map_err(ProxyError::BadUpstreamUrl)?
            }
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path_and_query.clone());
        match Uri::from_parts(parts) {
            Ok(uri) => Ok(uri),
            // Not reached with all three parts set; the text route says what is wrong if it is.
            Err(_) => {
                format!("{}{}", self.base.as_str(), path_and_query.as_str()).parse().map_err(ProxyError::BadUpstreamUrl)
            }
        }
    }
}

/// The process-wide pooled client with both upstreams.
pub struct Upstreams {
    client: Client<HttpsConnector<HttpConnector>, UpstreamBody>,
    openai: Upstream,
    anthropic: Upstream,
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
            openai: Upstream::new(&upstream.openai)?,
            anthropic: Upstream::new(&upstream.anthropic)?,
            first_byte_timeout: upstream.first_byte_timeout,
            idle_timeout: upstream.idle_timeout,
        })
    }

    fn upstream(&self, family: ApiFamily) -> &Upstream {
        match family {
            ApiFamily::OpenAi => &self.openai,
            ApiFamily::Anthropic => &self.anthropic,
        }
    }

    pub fn base(&self, family: ApiFamily) -> &BaseUrl {
        &self.upstream(family).base
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
        let upstream = self.upstream(head.route.family);
        let uri = upstream.uri(head.uri.path_and_query())?;
        let mut headers = head.headers.clone();
        headers::strip_hop_by_hop(&mut headers);
        // The body may be rewritten; hyper sets the length of what is actually sent (a streamed
        // body's own, from the client's framing).
        headers.remove(header::CONTENT_LENGTH);
        headers.insert(header::HOST, upstream.host.clone());
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
        let upstream = || self.base(family).to_string();
        match tokio::time::timeout(self.first_byte_timeout, self.client.request(request)).await {
            Err(_) => Err(ProxyError::UpstreamTimeout { upstream: upstream(), timeout: self.first_byte_timeout }),
            Ok(Err(error)) => Err(ProxyError::UpstreamUnreachable { upstream: upstream(), source: Box::new(error) }),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(base: &str, path_and_query: &str) -> String {
        let upstream = Upstream::new(&BaseUrl::parse(base).unwrap()).unwrap();
        upstream.uri(Some(&path_and_query.parse().unwrap())).unwrap().to_string()
    }

    #[test]
    fn the_upstream_uri_is_the_base_joined_with_the_path_and_query_as_sent() {
        assert_eq!(
            joined("http://127.0.0.1:9", "/v1/chat/completions?x=1"),
            "http://127.0.0.1:9/v1/chat/completions?x=1"
        );
        assert_eq!(
            joined("https://openrouter.ai/api/", "/v1/chat/completions?x=%2F"),
            "https://openrouter.ai/api/v1/chat/completions?x=%2F"
        );
        assert_eq!(joined("https://openrouter.ai/api", "/v1/models"), "https://openrouter.ai/api/v1/models");
        let upstream = Upstream::new(&BaseUrl::parse("http://h:1/p").unwrap()).unwrap();
        assert_eq!(upstream.uri(None).unwrap().to_string(), "http://h:1/p/");
        assert_eq!(upstream.host, "h:1");
    }
}
