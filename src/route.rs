//! Which upstream a request goes to, which API dialect its errors speak, and which endpoint it is.

use http::{HeaderMap, Method};

/// The API family of a request: decides the upstream and the shape of compactor's own errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFamily {
    OpenAi,
    Anthropic,
}

/// The endpoint, as far as compactor cares: the ones it may rewrite, and everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Messages,
    Responses,
    Embeddings,
    Models,
    Other,
}

/// Where a request goes and how compactor treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub family: ApiFamily,
    pub endpoint: Endpoint,
}

impl Route {
    /// `/v1/messages` and below go to Anthropic; so does anything carrying `anthropic-version`
    /// (the Anthropic SDK's `/v1/models`), because that header only ever means Anthropic.
    pub fn of(method: &Method, path: &str, headers: &HeaderMap) -> Self {
        let path = path.trim_end_matches('/');
        let anthropic_path = path == "/v1/messages" || path.starts_with("/v1/messages/");
        let family = if anthropic_path || headers.contains_key("anthropic-version") {
            ApiFamily::Anthropic
        } else {
            ApiFamily::OpenAi
        };
        let post = method == Method::POST;
        let endpoint = match path {
            "/v1/messages" if post => Endpoint::Messages,
            p if post && p.ends_with("/chat/completions") => Endpoint::ChatCompletions,
            p if post && p.ends_with("/v1/responses") => Endpoint::Responses,
            p if p.ends_with("/embeddings") => Endpoint::Embeddings,
            p if p.ends_with("/v1/models") || p.contains("/v1/models/") => Endpoint::Models,
            _ => Endpoint::Other,
        };
        Self { family, endpoint }
    }

    /// A bounded label for metrics and logs (never a raw path).
    pub fn label(&self) -> &'static str {
        match (self.family, self.endpoint) {
            (_, Endpoint::ChatCompletions) => "chat_completions",
            (_, Endpoint::Messages) => "messages",
            (_, Endpoint::Responses) => "responses",
            (_, Endpoint::Embeddings) => "embeddings",
            (ApiFamily::Anthropic, Endpoint::Models) => "anthropic_models",
            (ApiFamily::OpenAi, Endpoint::Models) => "models",
            (ApiFamily::Anthropic, Endpoint::Other) => "anthropic_other",
            (ApiFamily::OpenAi, Endpoint::Other) => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: Method, path: &str) -> Route {
        Route::of(&method, path, &HeaderMap::new())
    }

    #[test]
    fn messages_and_below_go_to_anthropic() {
        assert_eq!(route(Method::POST, "/v1/messages").endpoint, Endpoint::Messages);
        assert_eq!(route(Method::POST, "/v1/messages/count_tokens").family, ApiFamily::Anthropic);
        assert_eq!(route(Method::POST, "/v1/messagesx").family, ApiFamily::OpenAi);
    }

    #[test]
    fn everything_else_goes_to_openai() {
        assert_eq!(route(Method::POST, "/v1/chat/completions").endpoint, Endpoint::ChatCompletions);
        assert_eq!(route(Method::POST, "/openai/deployments/x/chat/completions").endpoint, Endpoint::ChatCompletions);
        assert_eq!(route(Method::GET, "/v1/models").family, ApiFamily::OpenAi);
        assert_eq!(route(Method::HEAD, "/").family, ApiFamily::OpenAi);
    }

    #[test]
    fn anthropic_version_header_marks_an_anthropic_request() {
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", http::HeaderValue::from_static("2023-06-01"));
        let route = Route::of(&Method::GET, "/v1/models", &headers);
        assert_eq!(route.family, ApiFamily::Anthropic);
        assert_eq!(route.label(), "anthropic_models");
    }
}
