//! compactor's own errors: each knows its HTTP status and renders itself in the client's dialect.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::route::ApiFamily;

/// A cause carried along: anything that can fail below compactor (hyper, the connector, a body).
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// An error compactor itself answers with (upstream errors pass through untouched instead). Its
/// message, and every cause it carries, is shown to the client: none may hold a credential.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("request body is larger than the configured limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("could not read the request body")]
    ClientBody(#[source] Cause),
    #[error("the request body stalled: nothing arrived for {} ms", timeout.as_millis())]
    ClientBodyTimeout { timeout: std::time::Duration },
    #[error("the request body's content-encoding `{encoding}` could not be decoded")]
    BadContentEncoding { encoding: String, source: Cause },
    #[error("the request body has {count} content codings; compactor decodes at most {max}")]
    TooManyCodings { count: usize, max: usize },
    #[error(
        "the request's transfer coding `{coding}` is not supported; send the body chunked or with a content-length"
    )]
    UnsupportedTransferCoding { coding: String },
    #[error("the upstream at {upstream} could not be reached")]
    UpstreamUnreachable { upstream: String, source: Cause },
    #[error("the upstream at {upstream} broke off its response")]
    UpstreamCut { upstream: String, source: Cause },
    #[error("the upstream at {upstream} did not answer within {} ms", timeout.as_millis())]
    UpstreamTimeout { upstream: String, timeout: std::time::Duration },
    #[error("compactor has no {what} upstream: set `{key}` in its configuration")]
    NoUpstream { what: &'static str, key: &'static str },
    #[error("cannot build the upstream request: invalid upstream URL")]
    BadUpstreamUrl(#[source] http::uri::InvalidUri),
    #[error("cannot build the upstream request: invalid upstream host")]
    BadUpstreamHost(#[source] http::header::InvalidHeaderValue),
    #[error("missing or wrong admin token")]
    Unauthorized,
    #[error("not found")]
    NotFound,
    #[error("method not allowed; use {allow}")]
    MethodNotAllowed { allow: &'static str },
    #[error("session store unavailable")]
    StoreUnavailable(#[source] Cause),
    #[error("compactor holds its limit of {limit} request body bytes in flight; retry shortly")]
    InflightBodies { limit: u64 },
    #[error("compactor is serving its limit of {limit} connections; retry shortly")]
    Overloaded { limit: u64 },
    #[error(
        "compactor does not serve {} yet; point this client at the provider directly (the request was not sent anywhere)",
        platform.name()
    )]
    Unserved { platform: crate::route::Platform },
    #[error(
        "this route needs a credential: a compactor client key (`Authorization: Bearer` or `x-compactor-key`) or the provider's own, and {reason}"
    )]
    ClientKey { reason: &'static str },
    #[error("compactor could not get its {platform} credential to authenticate this request")]
    NoCloudCredential { platform: &'static str, source: Cause },
    #[error("compactor could not sign the request")]
    Signing(#[source] Cause),
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ClientBodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::BadContentEncoding { .. } | Self::TooManyCodings { .. } => StatusCode::BAD_REQUEST,
            Self::UnsupportedTransferCoding { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::ClientBody(_) | Self::BadUpstreamUrl(_) | Self::BadUpstreamHost(_) => StatusCode::BAD_REQUEST,
            Self::UpstreamUnreachable { .. } | Self::UpstreamCut { .. } => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Unauthorized | Self::ClientKey { .. } => StatusCode::UNAUTHORIZED,
            Self::NoCloudCredential { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Signing(_) => StatusCode::INTERNAL_SERVER_ERROR,
            // Not a 5xx: the SDKs retry those, and this route will not appear by retrying.
            Self::NotFound | Self::NoUpstream { .. } | Self::Unserved { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::StoreUnavailable(_) | Self::Overloaded { .. } | Self::InflightBodies { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// A stable machine-readable code, also sent as `x-compactor-error` and used as a metric label.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BodyTooLarge { .. } => "request_too_large",
            Self::ClientBody(_) => "bad_request_body",
            Self::ClientBodyTimeout { .. } => "request_body_timeout",
            Self::BadContentEncoding { .. } => "bad_content_encoding",
            Self::TooManyCodings { .. } => "too_many_content_codings",
            Self::UnsupportedTransferCoding { .. } => "unsupported_transfer_coding",
            Self::UpstreamUnreachable { .. } => "upstream_unreachable",
            Self::UpstreamCut { .. } => "upstream_cut",
            Self::UpstreamTimeout { .. } => "upstream_timeout",
            Self::BadUpstreamUrl(_) | Self::BadUpstreamHost(_) => "bad_upstream_request",
            Self::Unauthorized => "unauthorized",
            Self::NotFound => "not_found",
            Self::NoUpstream { .. } => "no_upstream",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::StoreUnavailable(_) => "store_unavailable",
            Self::Overloaded { .. } => "overloaded",
            Self::InflightBodies { .. } => "inflight_body_limit",
            Self::Unserved { .. } => "unserved_platform",
            Self::ClientKey { .. } => "client_key_required",
            Self::NoCloudCredential { .. } => "no_cloud_credential",
            Self::Signing(_) => "signing_failed",
        }
    }

    /// Whether the same request may succeed when sent again unchanged: the trouble was on the
    /// way (an upstream or the store), not in the request.
    pub fn retryable(&self) -> bool {
        match self {
            Self::UpstreamUnreachable { .. }
            | Self::UpstreamCut { .. }
            | Self::UpstreamTimeout { .. }
            | Self::StoreUnavailable(_)
            | Self::Overloaded { .. }
            | Self::InflightBodies { .. }
            | Self::NoCloudCredential { .. } => true,
            Self::BodyTooLarge { .. }
            | Self::ClientBody(_)
            | Self::ClientBodyTimeout { .. }
            | Self::BadContentEncoding { .. }
            | Self::TooManyCodings { .. }
            | Self::UnsupportedTransferCoding { .. }
            | Self::Unserved { .. }
            | Self::ClientKey { .. }
            | Self::Signing(_)
            | Self::BadUpstreamUrl(_)
            | Self::BadUpstreamHost(_)
            | Self::Unauthorized
            | Self::NoUpstream { .. }
            | Self::NotFound
            | Self::MethodNotAllowed { .. } => false,
        }
    }

    /// The `error.type` Anthropic's SDKs know for this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status() {
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::GATEWAY_TIMEOUT => "timeout_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The `x-amzn-ErrorType` AWS's SDKs read for this status.
    fn aws_type(&self) -> &'static str {
        match self.status() {
            StatusCode::UNAUTHORIZED => "UnrecognizedClientException",
            StatusCode::NOT_FOUND => "ResourceNotFoundException",
            StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => "ModelTimeoutException",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableException",
            s if s.is_client_error() => "ValidationException",
            _ => "InternalServerException",
        }
    }

    /// The `google.rpc.Code` name Google's APIs give with this status.
    fn google_status(&self) -> &'static str {
        match self.status() {
            StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
            StatusCode::NOT_FOUND => "NOT_FOUND",
            StatusCode::METHOD_NOT_ALLOWED => "UNIMPLEMENTED",
            StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => "DEADLINE_EXCEEDED",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => "UNAVAILABLE",
            s if s.is_client_error() => "INVALID_ARGUMENT",
            _ => "INTERNAL",
        }
    }

    /// The `error.type` OpenAI's SDKs know for this status.
    fn openai_type(&self) -> &'static str {
        match self.status() {
            StatusCode::UNAUTHORIZED => "authentication_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The JSON body in the dialect the client parses.
    pub fn body(&self, family: ApiFamily) -> Bytes {
        let message = Chain(self).to_string();
        let value = match family {
            ApiFamily::OpenAi | ApiFamily::Azure => serde_json::json!({
                "error": { "message": message, "type": self.openai_type(), "param": null, "code": self.code() }
            }),
            // AWS's JSON errors: the message alone, the type in `x-amzn-ErrorType`.
            ApiFamily::Bedrock => serde_json::json!({ "message": message }),
            ApiFamily::Anthropic | ApiFamily::VertexAnthropic => serde_json::json!({
                "type": "error",
                "error": { "type": self.anthropic_type(), "message": message }
            }),
            // google.rpc.Status, as the Gemini API answers its own errors.
            ApiFamily::Gemini | ApiFamily::Vertex => serde_json::json!({
                "error": { "code": self.status().as_u16(), "message": message, "status": self.google_status() }
            }),
        };
        Bytes::from(value.to_string())
    }

    pub fn into_response<B: From<Bytes>>(self, family: ApiFamily) -> Response<B> {
        let mut response = Response::new(B::from(self.body(family)));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(http::HeaderName::from_static("x-compactor-error"), HeaderValue::from_static(self.code()));
        if family == ApiFamily::Bedrock {
            headers
                .insert(http::HeaderName::from_static("x-amzn-errortype"), HeaderValue::from_static(self.aws_type()));
        }
        if let Self::MethodNotAllowed { allow } = self {
            headers.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

/// Shows an error with every cause under it, `outer: inner: innermost`: the innermost cause is
/// usually what says what actually went wrong.
pub struct Chain<'e>(pub &'e (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_clients_get_the_openai_error_envelope() {
        let err =
            ProxyError::UpstreamTimeout { upstream: "http://x".into(), timeout: std::time::Duration::from_millis(5) };
        let body: serde_json::Value = serde_json::from_slice(&err.body(ApiFamily::OpenAi)).unwrap();
        assert_eq!(body["error"]["code"], "upstream_timeout");
        assert_eq!(body["error"]["type"], "api_error");
        assert!(body["error"]["message"].as_str().unwrap().contains("5 ms"));
    }

    #[test]
    fn anthropic_clients_get_the_anthropic_error_envelope() {
        let err = ProxyError::BodyTooLarge { limit: 10 };
        let body: serde_json::Value = serde_json::from_slice(&err.body(ApiFamily::Anthropic)).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "request_too_large");
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn gemini_clients_get_google_s_error_shape() {
        let err = ProxyError::BodyTooLarge { limit: 10 };
        let body: serde_json::Value = serde_json::from_slice(&err.body(ApiFamily::Gemini)).unwrap();
        assert_eq!(body["error"]["code"], 413);
        assert_eq!(body["error"]["status"], "INVALID_ARGUMENT");
        assert!(body["error"]["message"].as_str().unwrap().contains("10 bytes"));
        let timeout =
            ProxyError::UpstreamTimeout { upstream: "http://x".into(), timeout: std::time::Duration::from_millis(5) };
        let body: serde_json::Value = serde_json::from_slice(&timeout.body(ApiFamily::Gemini)).unwrap();
        assert_eq!(
            (body["error"]["code"].as_u64(), body["error"]["status"].as_str()),
            (Some(504), Some("DEADLINE_EXCEEDED"))
        );
    }

    #[test]
    fn bedrock_clients_get_aws_s_error_shape_and_claude_on_vertex_gets_anthropic_s() {
        let refused = ProxyError::ClientKey { reason: "the request carries no credential" };
        let response: Response<Bytes> = refused.into_response(ApiFamily::Bedrock);
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["x-amzn-errortype"], "UnrecognizedClientException");
        let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert!(body["message"].as_str().unwrap().contains("client key"), "{body}");
        let vertex = ProxyError::ClientKey { reason: "x" }.body(ApiFamily::VertexAnthropic);
        let body: serde_json::Value = serde_json::from_slice(&vertex).unwrap();
        assert_eq!(body["error"]["type"], "authentication_error");
    }

    #[test]
    fn the_message_keeps_every_cause_and_says_whether_to_retry() {
        let cause = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let err = ProxyError::UpstreamUnreachable { upstream: "http://x".into(), source: Box::new(cause) };
        assert!(std::error::Error::source(&err).is_some());
        let body: serde_json::Value = serde_json::from_slice(&err.body(ApiFamily::OpenAi)).unwrap();
        assert_eq!(body["error"]["message"], "the upstream at http://x could not be reached: connection refused");
        assert!(err.retryable());
        assert!(!ProxyError::BodyTooLarge { limit: 1 }.retryable());
    }

    #[test]
    fn the_admin_api_errors_are_proxy_errors_too() {
        let response: Response<Bytes> =
            ProxyError::MethodNotAllowed { allow: "GET, DELETE" }.into_response(ApiFamily::OpenAi);
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[header::ALLOW], "GET, DELETE");
        let cause = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let unavailable = ProxyError::StoreUnavailable(Box::new(cause));
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(unavailable.retryable());
        let body: serde_json::Value = serde_json::from_slice(&unavailable.body(ApiFamily::OpenAi)).unwrap();
        assert_eq!(body["error"]["code"], "store_unavailable");
    }
}
