//! Which upstream a request goes to, which API dialect its errors speak, and which endpoint it is.
//!
//! The path shapes of each provider live in `provider_paths`, the one path rule (dot segments,
//! repeated slashes) in `normalize`, query strings in `query`; this module holds the names a
//! request is routed to and the order the rules are asked in.

mod normalize;
mod provider_paths;
mod query;

use http::{HeaderMap, Method};

pub use normalize::normalize_path;
pub use provider_paths::azure_deployment;
pub use provider_paths::{bedrock_model_id, bedrock_operation, vertex_claude};
pub use provider_paths::{gemini_method, model_method, vertex_method};
use provider_paths::{is_azure, is_bedrock, is_bedrock_control, is_vertex_resource, vertex_partner};
pub use query::query_value;

/// The API family of a request: decides the upstream and the shape of compactor's own errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiFamily {
    OpenAi,
    Anthropic,
    /// Google's Gemini API (`generateContent`): Gemini CLI and the google-genai SDKs.
    Gemini,
    /// Gemini models on Vertex AI (`/v1/projects/{p}/locations/{l}/publishers/google/models/…`):
    /// the same dialect as [`ApiFamily::Gemini`], its own upstream (`upstream.vertex`).
    Vertex,
    /// Azure OpenAI (`/openai/deployments/{d}/…`, `/openai/v1/…`): OpenAI's dialect and errors,
    /// its own upstream (`upstream.azure`), its `api-key` header passed through.
    Azure,
    /// Claude on Amazon Bedrock's runtime (`/model/{modelId}/invoke…`): Anthropic's Messages
    /// bodies, AWS's errors, its own upstream (`upstream.bedrock`), signed with SigV4.
    Bedrock,
    /// Claude on Vertex AI (`…/publishers/anthropic/models/{model}:rawPredict`): Anthropic's
    /// Messages bodies and errors, Vertex AI's upstream (`upstream.vertex`), Google's bearer.
    VertexAnthropic,
}

impl ApiFamily {
    /// The upstream's name, as in `[upstream]`.
    pub fn label(self) -> &'static str {
        match self {
            ApiFamily::OpenAi => "openai",
            ApiFamily::Anthropic => "anthropic",
            ApiFamily::Gemini => "gemini",
            ApiFamily::Vertex => "vertex",
            ApiFamily::Azure => "azure",
            ApiFamily::Bedrock => "bedrock",
            ApiFamily::VertexAnthropic => "vertex_anthropic",
        }
    }

    /// Whether its bodies and errors are Gemini's (`generateContent`, `google.rpc.Status`).
    pub fn speaks_gemini(self) -> bool {
        matches!(self, ApiFamily::Gemini | ApiFamily::Vertex)
    }
}

impl ApiFamily {
    /// Every family, in the order of `[upstream]`.
    pub const ALL: [ApiFamily; 7] = [
        ApiFamily::OpenAi,
        ApiFamily::Anthropic,
        ApiFamily::Gemini,
        ApiFamily::Vertex,
        ApiFamily::Azure,
        ApiFamily::Bedrock,
        ApiFamily::VertexAnthropic,
    ];

    /// The family an upstream's name (`openai`, `anthropic`...) names.
    pub fn of_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|family| family.label() == label)
    }
}

/// One value per API family, read by family: what each provider has of its own (its upstream,
/// its prompt-cache prices) held in one place, instead of a field per provider in each owner and
/// a match per provider at each use.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PerFamily<T> {
    pub openai: T,
    pub anthropic: T,
    pub gemini: T,
    pub vertex: T,
    pub azure: T,
    pub bedrock: T,
    pub vertex_anthropic: T,
}

impl<T> PerFamily<T> {
    /// The value of `family`.
    pub fn get(&self, family: ApiFamily) -> &T {
        match family {
            ApiFamily::OpenAi => &self.openai,
            ApiFamily::Anthropic => &self.anthropic,
            ApiFamily::Gemini => &self.gemini,
            ApiFamily::Vertex => &self.vertex,
            ApiFamily::Azure => &self.azure,
            ApiFamily::Bedrock => &self.bedrock,
            ApiFamily::VertexAnthropic => &self.vertex_anthropic,
        }
    }
}

/// The endpoint, as far as compactor cares: the ones it may rewrite, and everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Messages,
    Responses,
    /// Anthropic's `POST /v1/messages/count_tokens`: a Messages body whose tokens are counted.
    CountTokens,
    /// OpenAI's `POST /v1/responses/input_tokens`: a Responses body whose tokens are counted.
    InputTokens,
    /// OpenAI's `POST /v1/responses/compact`: the client compacting its own conversation with the
    /// provider; forwarded as it came (its answer is an opaque compaction item), and counted.
    ResponsesCompact,
    Embeddings,
    Models,
    /// Gemini's `POST /{version}/models/{model}:generateContent`.
    GenerateContent,
    /// Gemini's `:streamGenerateContent`: SSE with `?alt=sse`, else a JSON array sent as it comes.
    StreamGenerateContent,
    /// Gemini's `:countTokens`: a `contents` body whose tokens are counted.
    GeminiCountTokens,
    /// A path of a platform compactor does not serve yet: refused, never sent to another
    /// provider's upstream with the client's credential.
    Unserved(Platform),
    Other,
}

/// A provider platform whose paths compactor recognizes but does not serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Amazon Bedrock's control plane (`/inference-profiles`, `/foundation-models`, on
    /// `bedrock.{region}`): compactor serves the runtime (`bedrock-runtime.{region}`) only.
    BedrockControl,
}

impl Platform {
    /// The platform's name, as an error tells it.
    pub fn name(self) -> &'static str {
        match self {
            Platform::BedrockControl => "Amazon Bedrock's control plane (model and inference-profile listings)",
        }
    }
}

/// Where a request goes and how compactor treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub family: ApiFamily,
    pub endpoint: Endpoint,
}

const ANTHROPIC_VERSION: http::HeaderName = http::HeaderName::from_static("anthropic-version");
const GOOG_API_KEY: http::HeaderName = http::HeaderName::from_static("x-goog-api-key");

/// The endpoint of an Azure OpenAI path: OpenAI's endpoints under `/openai/` (a deployment's,
/// `/openai/deployments/{d}/chat/completions`; the v1 API's, `/openai/v1/responses`; the preview
/// API's, `/openai/responses`).
fn openai_endpoint(path: &str, post: bool) -> Endpoint {
    match path {
        p if post && p.ends_with("/responses/input_tokens") => Endpoint::InputTokens,
        p if post && p.ends_with("/responses/compact") => Endpoint::ResponsesCompact,
        p if post && p.ends_with("/chat/completions") => Endpoint::ChatCompletions,
        p if post && p.ends_with("/responses") => Endpoint::Responses,
        p if p.ends_with("/embeddings") => Endpoint::Embeddings,
        p if p.ends_with("/models") || p.contains("/models/") => Endpoint::Models,
        _ => Endpoint::Other,
    }
}

/// The endpoint of a Bedrock path: InvokeModel of Claude (streamed or not) is a Messages body;
/// every other runtime operation (Converse, CountTokens...) goes as it came, signed.
fn bedrock_endpoint(path: &str, post: bool) -> Endpoint {
    if is_bedrock_control(path) {
        return Endpoint::Unserved(Platform::BedrockControl);
    }
    match bedrock_operation(path) {
        Some((_, "invoke" | "invoke-with-response-stream")) if post => Endpoint::Messages,
        _ => Endpoint::Other,
    }
}

/// The endpoint of a Gemini model method.
fn gemini_endpoint(method: &str, post: bool) -> Endpoint {
    match method {
        "generateContent" if post => Endpoint::GenerateContent,
        "streamGenerateContent" if post => Endpoint::StreamGenerateContent,
        "countTokens" if post => Endpoint::GeminiCountTokens,
        _ => Endpoint::Other,
    }
}

impl Route {
    /// `/v1/messages` and below go to Anthropic; so does anything carrying `anthropic-version`
    /// (the Anthropic SDK's `/v1/models`), because that header only ever means Anthropic.
    /// Gemini's paths (a model method, anything under `/v1beta/` or `/v1alpha/` but Google's
    /// OpenAI-compatible `/v1beta/openai/`, which OpenAI clients call as they call OpenAI) and
    /// anything carrying `x-goog-api-key` go to Gemini. Vertex AI's Gemini model methods go to
    /// Vertex AI, whatever their headers.
    ///
    /// Amazon Bedrock's runtime paths go to Bedrock (its InvokeModel of Claude read as Messages),
    /// Claude's on Vertex AI to Vertex AI (`rawPredict` and `streamRawPredict` read as Messages);
    /// any other Vertex AI resource path goes to Vertex AI as it came. Bedrock's control plane
    /// is [`Endpoint::Unserved`], answered in AWS's error shape. Azure OpenAI's paths
    /// (`/openai/…`) go to Azure, read as OpenAI's.
    pub fn of(method: &Method, path: &str, headers: &HeaderMap) -> Self {
        let path = path.trim_end_matches('/');
        let post = method == Method::POST;
        // The paths almost every request takes have no provider's shape (a model method, a
        // project or publisher resource, Bedrock's runtime): not read against each of them.
        if matches!(path, "/v1/chat/completions" | "/v1/messages" | "/v1/responses") {
            return Self::plain(path, post, headers, None);
        }
        if let Some((_, vertex)) = vertex_method(path) {
            return Self { family: ApiFamily::Vertex, endpoint: gemini_endpoint(vertex, post) };
        }
        if is_bedrock(path) {
            return Self { family: ApiFamily::Bedrock, endpoint: bedrock_endpoint(path, post) };
        }
        if let Some((model, method)) = vertex_claude(path) {
            let endpoint = match method {
                "rawPredict" | "streamRawPredict" if post && model == "count-tokens" => Endpoint::CountTokens,
                "rawPredict" | "streamRawPredict" if post => Endpoint::Messages,
                _ => Endpoint::Other,
            };
            return Self { family: ApiFamily::VertexAnthropic, endpoint };
        }
        // Another partner's model (Llama, Mistral...) is Vertex AI's to answer, as it came.
        if vertex_partner(path).is_some() || is_vertex_resource(path) {
            return Self { family: ApiFamily::Vertex, endpoint: Endpoint::Other };
        }
        if is_azure(path) {
            return Self { family: ApiFamily::Azure, endpoint: openai_endpoint(path, post) };
        }
        Self::plain(path, post, headers, gemini_method(path))
    }

    /// A path of no Vertex AI or Bedrock shape: Gemini's (a model method, `gemini`, or a beta
    /// path, or a Google key), Anthropic's or OpenAI's.
    fn plain(path: &str, post: bool, headers: &HeaderMap, gemini: Option<(&str, &str)>) -> Self {
        let beta = path.starts_with("/v1beta/") || path.starts_with("/v1alpha/") || path == "/v1beta";
        let openai_compatible = path.starts_with("/v1beta/openai/");
        if !openai_compatible && (gemini.is_some() || beta || headers.contains_key(GOOG_API_KEY)) {
            let endpoint = gemini.map_or(Endpoint::Other, |(_, method)| gemini_endpoint(method, post));
            return Self { family: ApiFamily::Gemini, endpoint };
        }
        let anthropic_path = path == "/v1/messages" || path.starts_with("/v1/messages/");
        let family = if anthropic_path || headers.contains_key(ANTHROPIC_VERSION) {
            ApiFamily::Anthropic
        } else {
            ApiFamily::OpenAi
        };
        let endpoint = match path {
            "/v1/messages" if post => Endpoint::Messages,
            "/v1/messages/count_tokens" if post => Endpoint::CountTokens,
            p if post && p.ends_with("/v1/responses/input_tokens") => Endpoint::InputTokens,
            p if post && p.ends_with("/v1/responses/compact") => Endpoint::ResponsesCompact,
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
            (_, Endpoint::CountTokens) => "count_tokens",
            (_, Endpoint::InputTokens) => "input_tokens",
            (_, Endpoint::ResponsesCompact) => "responses_compact",
            (_, Endpoint::Embeddings) => "embeddings",
            (_, Endpoint::GenerateContent) => "generate_content",
            (_, Endpoint::StreamGenerateContent) => "stream_generate_content",
            (_, Endpoint::GeminiCountTokens) => "gemini_count_tokens",
            (_, Endpoint::Unserved(Platform::BedrockControl)) => "bedrock_control_unserved",
            (ApiFamily::Bedrock, _) => "bedrock_other",
            (ApiFamily::VertexAnthropic, _) => "vertex_anthropic_other",
            (ApiFamily::Gemini, _) => "gemini_other",
            (ApiFamily::Vertex, _) => "vertex_other",
            (ApiFamily::Azure, Endpoint::Models) => "azure_models",
            (ApiFamily::Azure, _) => "azure_other",
            (ApiFamily::Anthropic, Endpoint::Models) => "anthropic_models",
            (ApiFamily::OpenAi, Endpoint::Models) => "models",
            (ApiFamily::Anthropic, Endpoint::Other) => "anthropic_other",
            (ApiFamily::OpenAi, Endpoint::Other) => "other",
        }
    }
}

#[cfg(test)]
mod tests;
