//! compactor's own errors: each knows its HTTP status and renders itself in the client's dialect.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::route::ApiFamily;

/// An error compactor itself answers with (upstream errors pass through untouched instead).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("request body is larger than the configured limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("could not read the request body: {0}")]
    ClientBody(String),
    #[error("the upstream at {upstream} could not be reached: {reason}")]
    UpstreamUnreachable { upstream: String, reason: String },
    #[error("the upstream at {upstream} did not answer within {timeout_ms} ms")]
    UpstreamTimeout { upstream: String, timeout_ms: u64 },
    #[error("cannot build the upstream request: {0}")]
    BadUpstreamRequest(String),
    #[error("missing or wrong admin token")]
    Unauthorized,
    #[error("not found")]
    NotFound,
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ClientBody(_) | Self::BadUpstreamRequest(_) => StatusCode::BAD_REQUEST,
            Self::UpstreamUnreachable { .. } => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound => StatusCode::NOT_FOUND,
        }
    }

    /// A stable machine-readable code, also sent as `x-compactor-error` and used as a metric label.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BodyTooLarge { .. } => "request_too_large",
            Self::ClientBody(_) => "bad_request_body",
            Self::UpstreamUnreachable { .. } => "upstream_unreachable",
            Self::UpstreamTimeout { .. } => "upstream_timeout",
            Self::BadUpstreamRequest(_) => "bad_upstream_request",
            Self::Unauthorized => "unauthorized",
            Self::NotFound => "not_found",
        }
    }

    /// The `error.type` Anthropic's SDKs know for this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status() {
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::GATEWAY_TIMEOUT => "timeout_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "api_error",
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
        let message = self.to_string();
        let value = match family {
            ApiFamily::OpenAi => serde_json::json!({
                "error": { "message": message, "type": self.openai_type(), "param": null, "code": self.code() }
            }),
            ApiFamily::Anthropic => serde_json::json!({
                "type": "error",
                "error": { "type": self.anthropic_type(), "message": message }
            }),
        };
        Bytes::from(value.to_string())
    }

    pub fn into_response<B: From<Bytes>>(self, family: ApiFamily) -> Response<B> {
        let mut response = Response::new(B::from(self.body(family)));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert("x-compactor-error", HeaderValue::from_static(self.code()));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_clients_get_the_openai_error_envelope() {
        let err = ProxyError::UpstreamTimeout { upstream: "http://x".into(), timeout_ms: 5 };
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
}
