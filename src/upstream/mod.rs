//! The upstream side: a pool of HTTP/1.1 connections per upstream (hyper-util's client when
//! HTTP/2 is on) and the building of upstream requests.

pub mod client_body;
mod deadline;
pub mod headers;
mod pool;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower_service::Service;
use tracing::Instrument;

use crate::cloud::Authentication;
use crate::config::{BaseUrl, Config, UpstreamConfig};
use crate::dialect::PathModel;
use crate::error::{Cause, ProxyError};
use crate::route::{ApiFamily, PerFamily, Route};
use crate::telemetry::trace;
use client_body::ClientBody;
pub use deadline::Armed;
use deadline::Deadline;
pub use pool::PooledBody;
use pool::{Pool, Sender};

/// The request body compactor sends upstream: complete on rewritable routes (it may have been
/// rewritten), the client's own body streamed as it arrives on every other route.
pub type UpstreamBody = Either<Full<Bytes>, ClientBody>;

/// The client's request without its body: what every attempt sends upstream again. compactor may
/// change the body (and the summary call sends its own), never the method, path or headers.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub route: Route,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    /// The body as a client that signed its request (SigV4) signed it: only that body goes with
    /// the client's signature, any other is signed by compactor.
    pub signed_body: Option<Bytes>,
}

impl RequestHead {
    pub fn new(route: Route, parts: Parts) -> Self {
        Self { route, method: parts.method, uri: parts.uri, headers: parts.headers, signed_body: None }
    }

    /// Keeps `body` as the one the client signed, when the client signed the request.
    pub fn signed(mut self, body: &Bytes) -> Self {
        if self.route.family == ApiFamily::Bedrock
            && self.headers.get(header::AUTHORIZATION).is_some_and(|v| v.as_bytes().starts_with(b"AWS4-HMAC-SHA256 "))
        {
            self.signed_body = Some(body.clone());
        }
        self
    }

    /// The model a Gemini or Vertex AI request's path names
    /// (`/v1beta/models/{model}:generateContent`, `…/publishers/google/models/{model}:…`), which
    /// fills in for a body that names none, or the deployment an Azure OpenAI one does
    /// (`/openai/deployments/{deployment}/…`), which is the model whatever the body says.
    pub fn path_model(&self) -> Option<PathModel<'_>> {
        let path = self.uri.path();
        match self.route.family {
            ApiFamily::Gemini | ApiFamily::Vertex => {
                crate::route::model_method(path).map(|(name, _)| PathModel { name: name.into(), rules: false })
            }
            ApiFamily::Azure => {
                crate::route::azure_deployment(path).map(|name| PathModel { name: name.into(), rules: true })
            }
            // Claude on the cloud platforms: the body names no model, the path does.
            ApiFamily::Bedrock => crate::route::bedrock_operation(path)
                .and_then(|(raw, _)| crate::route::bedrock_model_id(raw))
                .map(|name| PathModel { name, rules: true }),
            ApiFamily::VertexAnthropic => crate::route::vertex_claude(path)
                .filter(|(model, _)| *model != "count-tokens")
                .map(|(name, _)| PathModel { name: name.into(), rules: true }),
            ApiFamily::OpenAi | ApiFamily::Anthropic => None,
        }
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
    /// `scheme://authority`: what the connector connects to.
    origin: Uri,
    pool: Arc<Pool>,
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
        let origin = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| invalid(format!("upstream {base}: {e}")))?;
        Ok(Self { base: base.clone(), scheme, authority, prefix, host, origin, pool: Pool::new() })
    }

    /// The base URL's path joined with a request's path and query.
    fn path_and_query(&self, path_and_query: Option<&PathAndQuery>) -> Result<PathAndQuery, ProxyError> {
        match path_and_query {
            Some(path_and_query) if self.prefix.is_empty() => Ok(path_and_query.clone()),
            _ => {
                let path_and_query = path_and_query.map_or("/", PathAndQuery::as_str);
                PathAndQuery::try_from(format!("{}{path_and_query}", self.prefix)).map_err(ProxyError::BadUpstreamUrl)
            }
        }
    }

    /// The upstream URI of a request's path and query in absolute form (what hyper-util's client
    /// takes): the base URL's path joined with them.
    fn uri(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, ProxyError> {
        let path_and_query = self.path_and_query(path_and_query)?;
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

/// What a request needs to be authenticated with once it is sent (see [`crate::cloud`]): its
/// absolute URL and the body that goes, as it will be signed.
#[derive(Clone)]
struct Authenticate {
    how: Authentication,
    url: String,
    body: Bytes,
}

/// A request on its way: the response head to come, or why it did not.
type Dispatched<'a> = Pin<Box<dyn Future<Output = Result<Response<PooledBody>, Cause>> + Send + 'a>>;

/// How requests reach the upstreams.
enum Transport {
    /// HTTP/1.1 on connections of our own, one [`Pool`] per upstream (in [`Upstream`]).
    Pooled(HttpsConnector<HttpConnector>),
    /// hyper-util's pooled client, kept for `upstream.http2`: ALPN negotiation and multiplexing
    /// on one connection are what it is for.
    Legacy(Box<Client<HttpsConnector<HttpConnector>, UpstreamBody>>),
}

/// The upstreams and the connections to them, for the process.
pub struct Upstreams {
    transport: Transport,
    /// Client keys and compactor's cloud credentials (Bedrock's SigV4, Vertex AI's bearer).
    cloud: crate::cloud::Cloud,
    /// Each family's upstream; Vertex AI's only when configured (`upstream.vertex`).
    upstreams: PerFamily<Option<Upstream>>,
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
        let transport = if upstream.http2 {
            let client = Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .build(builder.enable_http2().wrap_connector(http));
            Transport::Legacy(Box::new(client))
        } else {
            Transport::Pooled(builder.wrap_connector(http))
        };
        Ok(Self {
            transport,
            cloud: crate::cloud::Cloud::new(config),
            upstreams: PerFamily {
                openai: Some(Upstream::new(&upstream.openai)?),
                anthropic: Some(Upstream::new(&upstream.anthropic)?),
                gemini: Some(Upstream::new(&upstream.gemini)?),
                vertex: upstream.vertex.as_ref().map(Upstream::new).transpose()?,
                azure: upstream.azure.as_ref().map(Upstream::new).transpose()?,
                bedrock: upstream.bedrock.as_ref().map(Upstream::new).transpose()?,
                // Claude on Vertex AI goes where Vertex AI's Gemini models go.
                vertex_anthropic: upstream.vertex.as_ref().map(Upstream::new).transpose()?,
            },
            first_byte_timeout: upstream.first_byte_timeout,
            idle_timeout: upstream.idle_timeout,
        })
    }

    /// The upstream of a family; an error for Vertex AI or Azure OpenAI when its upstream is not
    /// set.
    fn upstream(&self, family: ApiFamily) -> Result<&Upstream, ProxyError> {
        self.upstreams.get(family).as_ref().ok_or(match family {
            ApiFamily::Azure => ProxyError::NoUpstream { what: "Azure OpenAI", key: "upstream.azure" },
            ApiFamily::Bedrock => ProxyError::NoUpstream { what: "Amazon Bedrock", key: "upstream.bedrock" },
            _ => ProxyError::NoUpstream { what: "Vertex AI", key: "upstream.vertex" },
        })
    }

    /// Whether requests of `family` have somewhere to go: checked before a request is read, so
    /// a request to an upstream that is not configured is answered at once.
    pub fn serves(&self, family: ApiFamily) -> Result<(), ProxyError> {
        self.upstream(family).map(|_| ())
    }

    /// The upstream's URL for messages, or the family's name when it has none.
    fn name(&self, family: ApiFamily) -> String {
        self.upstream(family).map_or_else(|_| family.label().to_string(), |upstream| upstream.base.to_string())
    }

    /// The upstream request for a client request: base URL joined with path and query, Host set
    /// for the upstream, hop-by-hop headers dropped, every other header kept in order.
    pub fn build_request(&self, head: &RequestHead, body: Bytes) -> Result<Request<UpstreamBody>, ProxyError> {
        let sent = body.clone();
        self.build(head, Either::Left(Full::new(body)), Some(sent))
    }

    /// The upstream request for a client request whose body streams through as it arrives.
    pub fn build_streamed(&self, head: &RequestHead, body: ClientBody) -> Result<Request<UpstreamBody>, ProxyError> {
        self.build(head, Either::Right(body), None)
    }

    /// The cloud platforms' client keys and credentials.
    pub fn cloud(&self) -> &crate::cloud::Cloud {
        &self.cloud
    }

    fn build(
        &self,
        head: &RequestHead,
        body: UpstreamBody,
        sent: Option<Bytes>,
    ) -> Result<Request<UpstreamBody>, ProxyError> {
        let upstream = self.upstream(head.route.family)?;
        // hyper's own HTTP/1.1 connection writes the URI as it is: origin form (`/path?query`).
        let uri = match self.transport {
            Transport::Pooled(_) => Uri::from(upstream.path_and_query(head.uri.path_and_query())?),
            Transport::Legacy(_) => upstream.uri(head.uri.path_and_query())?,
        };
        let mut headers = head.headers.clone();
        headers::strip_hop_by_hop(&mut headers);
        // The body may be rewritten; hyper sets the length of what is actually sent (a streamed
        // body's own, from the client's framing).
        headers.remove(header::CONTENT_LENGTH);
        let how = self.cloud.authentication(head.route.family, &mut headers, sent.as_ref(), head.signed_body.as_ref());
        // A client's own signature covers the Host it signed for: it goes as it was signed.
        if how != Authentication::AsSigned || !headers.contains_key(header::HOST) {
            headers.insert(header::HOST, upstream.host.clone());
        }
        let mut request = Request::new(body);
        if !matches!(how, Authentication::AsSent | Authentication::AsSigned) {
            // Authenticated as it is sent (the credential may need fetching): see `send_armed`.
            let url = upstream.uri(head.uri.path_and_query())?.to_string();
            request.extensions_mut().insert(Authenticate { how, url, body: sent.unwrap_or_default() });
        }
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
        ProxyError::UpstreamCut { upstream: self.name(family), source: Box::new(error) }
    }

    /// Sends a request and waits for the response head, bounded by the first-byte timeout.
    pub async fn send(
        &self,
        family: ApiFamily,
        request: Request<UpstreamBody>,
    ) -> Result<Response<PooledBody>, ProxyError> {
        self.send_armed(family, request, Armed::AtFirstWait).await
    }

    /// [`Self::send`], with the first-byte timer made as `armed` says (see [`Armed`]).
    pub async fn send_armed(
        &self,
        family: ApiFamily,
        mut request: Request<UpstreamBody>,
        armed: Armed,
    ) -> Result<Response<PooledBody>, ProxyError> {
        let target = self.upstream(family)?;
        let upstream = || target.base.to_string();
        let span = trace::upstream_span(family, target.base.authority());
        trace::inject(&span, request.headers_mut());
        if let Some(Authenticate { how, url, body }) = request.extensions_mut().remove::<Authenticate>() {
            let method = request.method().clone();
            self.cloud.authenticate(how, &method, &url, request.headers_mut(), &body).await?;
        }
        let sent =
            Deadline::new(self.dispatch(target, request), self.first_byte_timeout, armed).instrument(span.clone());
        let result = match sent.await {
            Err(_) => Err(ProxyError::UpstreamTimeout { upstream: upstream(), timeout: self.first_byte_timeout }),
            Ok(Err(source)) => Err(ProxyError::UpstreamUnreachable { upstream: upstream(), source }),
            Ok(Ok(response)) => Ok(response),
        };
        if !span.is_disabled() {
            match &result {
                Ok(response) => span.record("http.response.status_code", response.status().as_u16()),
                Err(error) => span.record("error.type", error.code()).record("otel.status_code", "ERROR"),
            };
        }
        result
    }

    /// Sends a request on the transport; the future waits for the response head. Boxed, as
    /// hyper-util's client boxes its own, and made at once (holding the request): the future of
    /// every request holds this one inline, and every move of it would copy a larger one.
    fn dispatch<'a>(&'a self, upstream: &'a Upstream, request: Request<UpstreamBody>) -> Dispatched<'a> {
        match &self.transport {
            Transport::Pooled(connector) => Box::pin(send_pooled(connector, upstream, request)),
            Transport::Legacy(client) => {
                let response = client.request(request);
                Box::pin(async move {
                    match response.await {
                        Ok(response) => Ok(response.map(PooledBody::unpooled)),
                        Err(error) => Err(Box::new(error).into()),
                    }
                })
            }
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
    pub async fn read_body(&self, family: ApiFamily, body: PooledBody, limit: usize) -> Result<Bytes, ProxyError> {
        match Limited::new(body, limit).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(source) => Err(ProxyError::UpstreamUnreachable { upstream: self.name(family), source }),
        }
    }
}

/// Sends on the most recently used idle connection, or a new one. A request that did not go
/// out because its pooled connection had closed meanwhile (the upstream dropped a keep-alive
/// connection) goes again on the next, as hyper-util's client retries canceled requests; a
/// request that was written, even in part, never goes twice.
async fn send_pooled(
    connector: &HttpsConnector<HttpConnector>,
    upstream: &Upstream,
    mut request: Request<UpstreamBody>,
) -> Result<Response<PooledBody>, Cause> {
    while let Some(mut sender) = upstream.pool.checkout() {
        match sender.try_send_request(request).await {
            Ok(response) => return Ok(response.map(|body| PooledBody::leased(body, upstream.pool.clone(), sender))),
            Err(mut error) => match error.take_message() {
                Some(unsent) => request = unsent,
                None => return Err(Box::new(error.into_error())),
            },
        }
    }
    // Boxed: connecting (TCP, TLS, handshake) is a large future, needed only now and then.
    let mut sender = Box::pin(connect(connector, upstream)).await?;
    match sender.try_send_request(request).await {
        Ok(response) => Ok(response.map(|body| PooledBody::leased(body, upstream.pool.clone(), sender))),
        Err(error) => Err(Box::new(error.into_error())),
    }
}

/// A new HTTP/1.1 connection to an upstream (TCP, with TLS for `https://`), its connection task
/// spawned.
async fn connect(connector: &HttpsConnector<HttpConnector>, upstream: &Upstream) -> Result<Sender, Cause> {
    // The connector is always ready (HttpConnector's `poll_ready` is), as hyper-util's client assumes.
    let io = connector.clone().call(upstream.origin.clone()).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "upstream connection ended");
        }
    });
    Ok(sender)
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

    /// An upstream on loopback that answers every request on a connection with `200 ok`.
    async fn answering_upstream() -> BaseUrl {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper::service::service_fn(|_| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
        BaseUrl::parse(&url).unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_a_stale_pooled_connection_never_wrote_goes_on_a_fresh_one() {
        let upstream = Upstream::new(&answering_upstream().await).unwrap();
        let connector =
            hyper_rustls::HttpsConnectorBuilder::new().with_webpki_roots().https_or_http().enable_http1().build();

        // A pooled connection that looks ready, but whose upstream closed it while its task was
        // not looking: the request goes into it, and comes back unsent when the task sees the close.
        let (pipe, upstream_end) = tokio::io::duplex(1024);
        let (mut stale, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(pipe)).await.unwrap();
        let (look, looked) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            // One poll, so the connection says it wants a request; then it waits to be let go on.
            std::future::poll_fn(|cx| {
                let _ = std::future::Future::poll(connection.as_mut(), cx);
                std::task::Poll::Ready(())
            })
            .await;
            let _ = looked.await;
            let _ = connection.await;
        });
        stale.ready().await.unwrap();
        drop(upstream_end);
        upstream.pool.put(stale);
        look.send(()).unwrap();

        let request = Request::builder()
            .uri("/")
            .header(header::HOST, upstream.host.clone())
            .body(Either::Left(Full::new(Bytes::from_static(b"{}"))))
            .unwrap();
        let response = send_pooled(&connector, &upstream, request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
    }
}
