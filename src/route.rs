//! Which upstream a request goes to, which API dialect its errors speak, and which endpoint it is.

use http::{HeaderMap, Method};

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
}

impl ApiFamily {
    /// The upstream's name, as in `[upstream]`.
    pub fn label(self) -> &'static str {
        match self {
            ApiFamily::OpenAi => "openai",
            ApiFamily::Anthropic => "anthropic",
            ApiFamily::Gemini => "gemini",
            ApiFamily::Vertex => "vertex",
        }
    }

    /// Whether its bodies and errors are Gemini's (`generateContent`, `google.rpc.Status`).
    pub fn speaks_gemini(self) -> bool {
        matches!(self, ApiFamily::Gemini | ApiFamily::Vertex)
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

/// A provider platform whose paths compactor recognizes but does not serve yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Amazon Bedrock's runtime (`/model/{modelId}/invoke`, `converse`...), signed with SigV4.
    Bedrock,
    /// A partner model on Vertex AI (`…/publishers/anthropic/models/{m}:rawPredict`, or any
    /// publisher but Google's).
    VertexPartner,
}

impl Platform {
    /// The platform's name, as an error tells it.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Bedrock => "Amazon Bedrock",
            Platform::VertexPartner => "partner models on Vertex AI (Claude on Vertex)",
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

/// A Gemini model method path, `/{v1|v1beta|v1alpha}/models/{model}:{method}`: the model and the
/// method. `None` for any other path.
pub fn gemini_method(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    let (version, rest) = rest.split_once('/')?;
    if !is_gemini_version(version) {
        return None;
    }
    model_and_method(rest.strip_prefix("models/")?)
}

/// A Vertex AI model method path: the model and the method. Either
/// `/{version}/projects/{project}/locations/{location}/publishers/google/models/{model}:{method}`
/// or Vertex's express mode, `/{version}/publishers/google/models/{model}:{method}` (with a key).
pub fn vertex_method(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    let (version, rest) = rest.split_once('/')?;
    if !is_gemini_version(version) {
        return None;
    }
    let rest = match rest.strip_prefix("projects/") {
        Some(rest) => {
            let (project, rest) = rest.split_once('/')?;
            let (location, rest) = rest.strip_prefix("locations/")?.split_once('/')?;
            if project.is_empty() || location.is_empty() {
                return None;
            }
            rest
        }
        None => rest,
    };
    model_and_method(rest.strip_prefix("publishers/google/models/")?)
}

/// The model and the method of a Gemini or a Vertex AI model method path.
pub fn model_method(path: &str) -> Option<(&str, &str)> {
    gemini_method(path).or_else(|| vertex_method(path))
}

/// The methods of Google's `models/{model}:{method}` paths (the Gemini API's and Vertex AI's).
/// Only these make a path a Gemini one: OpenAI's fine-tuned model names hold colons too
/// (`/v1/models/ft:gpt-4o-mini-2024-07-18:my-org:custom:9xYz`), and such a path read as
/// `{model}:{method}` would send an OpenAI key to Google.
const GOOGLE_MODEL_METHODS: [&str; 18] = [
    "generateContent",
    "streamGenerateContent",
    "countTokens",
    "computeTokens",
    "embedContent",
    "batchEmbedContents",
    "asyncBatchEmbedContent",
    "batchGenerateContent",
    "predict",
    "predictLongRunning",
    "generateAnswer",
    "generateMessage",
    "countMessageTokens",
    "generateText",
    "countTextTokens",
    "embedText",
    "batchEmbedText",
    "fetchPredictOperation",
];

/// `{model}:{method}`: a model name without a slash or a colon, and one of Google's methods.
fn model_and_method(rest: &str) -> Option<(&str, &str)> {
    let (model, method) = rest.split_once(':')?;
    (!model.is_empty() && !model.contains('/') && GOOGLE_MODEL_METHODS.contains(&method)).then_some((model, method))
}

/// Whether a path is a Vertex AI resource path, `/{version}/projects/{project}/locations/{l}/…`:
/// Google's, whatever follows.
fn is_vertex_resource(path: &str) -> bool {
    let Some((version, rest)) = path.strip_prefix('/').and_then(|rest| rest.split_once('/')) else { return false };
    let Some((project, rest)) = rest.strip_prefix("projects/").and_then(|rest| rest.split_once('/')) else {
        return false;
    };
    is_gemini_version(version) && !project.is_empty() && rest.starts_with("locations/")
}

/// A Vertex AI model of a publisher other than Google (`…/publishers/anthropic/models/…`): the
/// publisher.
fn vertex_partner(path: &str) -> Option<&str> {
    if !is_vertex_resource(path) {
        return None;
    }
    let (_, rest) = path.split_once("/publishers/")?;
    let (publisher, rest) = rest.split_once('/')?;
    (publisher != "google" && rest.starts_with("models/")).then_some(publisher)
}

/// Amazon Bedrock's runtime paths: `/model/{modelId}/{operation}` (InvokeModel, Converse,
/// CountTokens and their streams), `/async-invoke`, `/guardrail/…`.
fn is_bedrock(path: &str) -> bool {
    path.starts_with("/model/")
        || path == "/async-invoke"
        || path.starts_with("/async-invoke/")
        || path.starts_with("/guardrail/")
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

/// `v1`, `v1beta`, `v1alpha`, `v1beta1`...: the versions of Google's APIs.
fn is_gemini_version(version: &str) -> bool {
    version
        .strip_prefix("v1")
        .is_some_and(|tail| tail.is_empty() || tail.starts_with("beta") || tail.starts_with("alpha"))
}

impl Route {
    /// `/v1/messages` and below go to Anthropic; so does anything carrying `anthropic-version`
    /// (the Anthropic SDK's `/v1/models`), because that header only ever means Anthropic.
    /// Gemini's paths (a model method, anything under `/v1beta/` or `/v1alpha/` but Google's
    /// OpenAI-compatible `/v1beta/openai/`, which OpenAI clients call as they call OpenAI) and
    /// anything carrying `x-goog-api-key` go to Gemini. Vertex AI's Gemini model methods go to
    /// Vertex AI, whatever their headers.
    ///
    /// A path of a platform compactor does not serve yet (Amazon Bedrock, a partner model on
    /// Vertex AI) is [`Endpoint::Unserved`], answered in the dialect its clients read (Claude's
    /// on both); any other Vertex AI resource path goes to Vertex AI as it came.
    pub fn of(method: &Method, path: &str, headers: &HeaderMap) -> Self {
        let path = path.trim_end_matches('/');
        let post = method == Method::POST;
        if let Some((_, vertex)) = vertex_method(path) {
            return Self { family: ApiFamily::Vertex, endpoint: gemini_endpoint(vertex, post) };
        }
        if is_bedrock(path) {
            return Self { family: ApiFamily::Anthropic, endpoint: Endpoint::Unserved(Platform::Bedrock) };
        }
        if let Some(publisher) = vertex_partner(path) {
            let family = if publisher == "anthropic" { ApiFamily::Anthropic } else { ApiFamily::Vertex };
            return Self { family, endpoint: Endpoint::Unserved(Platform::VertexPartner) };
        }
        if is_vertex_resource(path) {
            return Self { family: ApiFamily::Vertex, endpoint: Endpoint::Other };
        }
        let gemini = gemini_method(path);
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
            (_, Endpoint::Embeddings) => "embeddings",
            (_, Endpoint::GenerateContent) => "generate_content",
            (_, Endpoint::StreamGenerateContent) => "stream_generate_content",
            (_, Endpoint::GeminiCountTokens) => "gemini_count_tokens",
            (_, Endpoint::Unserved(Platform::Bedrock)) => "bedrock_unserved",
            (_, Endpoint::Unserved(Platform::VertexPartner)) => "vertex_partner_unserved",
            (ApiFamily::Gemini, _) => "gemini_other",
            (ApiFamily::Vertex, _) => "vertex_other",
            (ApiFamily::Anthropic, Endpoint::Models) => "anthropic_models",
            (ApiFamily::OpenAi, Endpoint::Models) => "models",
            (ApiFamily::Anthropic, Endpoint::Other) => "anthropic_other",
            (ApiFamily::OpenAi, Endpoint::Other) => "other",
        }
    }
}

/// The one path rule: compactor routes the path it sends upstream, and sends it normalized. Dot
/// segments are resolved (`.` and `..`, percent-encoded ones too: `%2e%2e`), repeated slashes
/// collapsed; a trailing slash stays. `/v1/messages/../chat/completions` is routed and sent as
/// `/v1/chat/completions`, so no request is rewritten as one API and sent to another's upstream.
/// `None` when the path is already normal (the common case: nothing is allocated).
pub fn normalize_path(path: &str) -> Option<String> {
    let is_dot = |segment: &str| segment == "." || segment.eq_ignore_ascii_case("%2e");
    let is_dot_dot = |segment: &str| dots(segment) == Some(2);
    let segments = path.split('/').skip(1);
    let needs = path.contains("//")
        || !path.starts_with('/')
        || segments.clone().any(|segment| is_dot(segment) || is_dot_dot(segment));
    if !needs {
        return None;
    }
    let mut kept: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        if segment.is_empty() || is_dot(segment) {
            continue;
        }
        if is_dot_dot(segment) {
            kept.pop();
        } else {
            kept.push(segment);
        }
    }
    let mut normal = format!("/{}", kept.join("/"));
    let last = path.rsplit('/').next().unwrap_or("");
    if (path.ends_with('/') || is_dot(last) || is_dot_dot(last)) && !normal.ends_with('/') {
        normal.push('/');
    }
    Some(normal)
}

/// How many dots a segment made only of `.` and `%2e` (any case) spells; `None` for any other.
/// Read without allocating: every request's path goes through here.
fn dots(segment: &str) -> Option<usize> {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', e, tail @ ..] if e.eq_ignore_ascii_case(&b'e') => tail,
            _ => return None,
        };
        dots += 1;
    }
    Some(dots)
}

/// The percent-decoded value of `name` in a query string (`+` is a space).
pub fn query_value(query: &str, name: &str) -> Option<String> {
    let raw = query.split('&').find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))?;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
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
        assert_eq!(route(Method::POST, "/v1/messages/count_tokens").endpoint, Endpoint::CountTokens);
        assert_eq!(route(Method::GET, "/v1/messages/count_tokens").endpoint, Endpoint::Other);
        assert_eq!(route(Method::POST, "/v1/responses/input_tokens").endpoint, Endpoint::InputTokens);
        assert_eq!(route(Method::POST, "/v1/responses/input_tokens").family, ApiFamily::OpenAi);
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

    #[test]
    fn gemini_model_methods_go_to_gemini() {
        let stream = route(Method::POST, "/v1beta/models/gemini-2.5-pro:streamGenerateContent");
        assert_eq!((stream.family, stream.endpoint), (ApiFamily::Gemini, Endpoint::StreamGenerateContent));
        assert_eq!(
            route(Method::POST, "/v1/models/gemini-3-pro-preview:generateContent").endpoint,
            Endpoint::GenerateContent
        );
        assert_eq!(
            route(Method::POST, "/v1beta/models/gemini-2.5-flash:countTokens").endpoint,
            Endpoint::GeminiCountTokens
        );
        assert_eq!(route(Method::POST, "/v1beta/models/gemini-2.5-flash:embedContent").endpoint, Endpoint::Other);
        assert_eq!(route(Method::GET, "/v1beta/models").family, ApiFamily::Gemini);
        assert_eq!(route(Method::GET, "/v1beta/models").label(), "gemini_other");
        // Google's OpenAI-compatible endpoint is called by OpenAI clients: Chat Completions.
        let compatible = route(Method::POST, "/v1beta/openai/chat/completions");
        assert_eq!((compatible.family, compatible.endpoint), (ApiFamily::OpenAi, Endpoint::ChatCompletions));
        assert_eq!(
            gemini_method("/v1beta/models/gemini-2.5-pro:generateContent"),
            Some(("gemini-2.5-pro", "generateContent"))
        );
        assert_eq!(gemini_method("/v2/models/x:generateContent"), None);
        assert_eq!(gemini_method("/v1/models/a/b:generateContent"), None);
        // OpenAI's model paths stay OpenAI's.
        assert_eq!(route(Method::GET, "/v1/models/gpt-4o").family, ApiFamily::OpenAi);
        let mut headers = HeaderMap::new();
        headers.insert("x-goog-api-key", http::HeaderValue::from_static("k"));
        assert_eq!(Route::of(&Method::GET, "/v1/models", &headers).family, ApiFamily::Gemini);
    }

    #[test]
    fn vertex_model_methods_go_to_vertex() {
        let path = "/v1/projects/my-project/locations/us-central1/publishers/google/models/gemini-2.5-pro";
        let stream = route(Method::POST, &format!("{path}:streamGenerateContent"));
        assert_eq!((stream.family, stream.endpoint), (ApiFamily::Vertex, Endpoint::StreamGenerateContent));
        assert_eq!(stream.label(), "stream_generate_content");
        assert_eq!(route(Method::POST, &format!("{path}:generateContent")).endpoint, Endpoint::GenerateContent);
        assert_eq!(route(Method::POST, &format!("{path}:countTokens")).endpoint, Endpoint::GeminiCountTokens);
        let other = route(Method::POST, &format!("{path}:predict"));
        assert_eq!((other.family, other.endpoint, other.label()), (ApiFamily::Vertex, Endpoint::Other, "vertex_other"));
        assert_eq!(vertex_method(&format!("{path}:generateContent")), Some(("gemini-2.5-pro", "generateContent")));
        assert_eq!(
            vertex_method(
                "/v1beta1/projects/p/locations/global/publishers/google/models/gemini-3-pro-preview:countTokens"
            ),
            Some(("gemini-3-pro-preview", "countTokens"))
        );
        // Express mode: no project, a key.
        let express = route(Method::POST, "/v1/publishers/google/models/gemini-2.5-flash:generateContent");
        assert_eq!((express.family, express.endpoint), (ApiFamily::Vertex, Endpoint::GenerateContent));
        assert_eq!(model_method("/v1/publishers/google/models/m:generateContent"), Some(("m", "generateContent")));
        assert_eq!(model_method("/v1beta/models/m:countTokens"), Some(("m", "countTokens")));
        // Not Vertex AI's Gemini models: another publisher, a missing location, a bad version.
        assert_eq!(vertex_method("/v1/projects/p/locations/l/publishers/anthropic/models/claude:rawPredict"), None);
        assert_eq!(vertex_method("/v1/projects/p/publishers/google/models/m:generateContent"), None);
        assert_eq!(vertex_method("/v2/projects/p/locations/l/publishers/google/models/m:generateContent"), None);
        // Vertex AI's OpenAI-compatible endpoint carries a Google credential: it goes to Vertex AI.
        assert_eq!(
            route(Method::POST, "/v1/projects/p/locations/l/endpoints/openapi/chat/completions").family,
            ApiFamily::Vertex
        );
    }

    /// Every path shape the SDKs and agents send, and where it goes: a credential only ever
    /// reaches its own provider's upstream, and a platform compactor does not serve is refused.
    #[test]
    fn every_sdk_path_shape_goes_to_its_own_providers_upstream() {
        use ApiFamily::{Anthropic, Gemini, OpenAi, Vertex};
        use Endpoint::*;
        let anthropic = [("anthropic-version", "2023-06-01")];
        let google = [("x-goog-api-key", "k")];
        let none: [(&str, &str); 0] = [];
        let vertex = "/v1/projects/p/locations/us-east5/publishers";
        type Case<'a> = (Method, String, &'a [(&'static str, &'static str)], ApiFamily, Endpoint);
        let cases: Vec<Case> = vec![
            // OpenAI: fine-tuned model names hold colons; files, batches, uploads, vector stores.
            (Method::GET, "/v1/models/ft:gpt-4o-mini-2024-07-18:my-org:custom:9xYz".into(), &none, OpenAi, Models),
            (Method::DELETE, "/v1/models/ft:gpt-4o-mini-2024-07-18:my-org:custom:9xYz".into(), &none, OpenAi, Models),
            (Method::GET, "/v1/models/ft:gpt-3.5-turbo:acme::abc123".into(), &none, OpenAi, Models),
            (Method::GET, "/v1/models".into(), &none, OpenAi, Models),
            (Method::GET, "/v1/models/gpt-4o".into(), &none, OpenAi, Models),
            (Method::POST, "/v1/chat/completions".into(), &none, OpenAi, ChatCompletions),
            (Method::POST, "/v1/responses".into(), &none, OpenAi, Responses),
            (Method::GET, "/v1/responses/resp_1/input_items".into(), &none, OpenAi, Other),
            (Method::POST, "/v1/embeddings".into(), &none, OpenAi, Embeddings),
            (Method::POST, "/v1/files".into(), &none, OpenAi, Other),
            (Method::GET, "/v1/files/file-abc:1/content".into(), &none, OpenAi, Other),
            (Method::POST, "/v1/batches".into(), &none, OpenAi, Other),
            (Method::POST, "/v1/batches/batch_1/cancel".into(), &none, OpenAi, Other),
            (Method::POST, "/v1/fine_tuning/jobs".into(), &none, OpenAi, Other),
            (Method::POST, "/v1/uploads/upload_1/parts".into(), &none, OpenAi, Other),
            // Azure-style deployments go where `upstream.openai` points (an Azure resource).
            (Method::POST, "/openai/deployments/gpt-4o/chat/completions".into(), &none, OpenAi, ChatCompletions),
            (Method::POST, "/openai/v1/responses".into(), &none, OpenAi, Responses),
            // Anthropic.
            (Method::POST, "/v1/messages".into(), &none, Anthropic, Messages),
            (Method::POST, "/v1/messages/count_tokens".into(), &none, Anthropic, CountTokens),
            (Method::POST, "/v1/messages/batches".into(), &none, Anthropic, Other),
            (Method::GET, "/v1/models".into(), &anthropic, Anthropic, Models),
            (Method::GET, "/v1/models/claude-sonnet-4-5".into(), &anthropic, Anthropic, Models),
            (Method::POST, "/v1/files".into(), &anthropic, Anthropic, Other),
            // Gemini: model methods, model listing, files and batches under the beta version.
            (Method::POST, "/v1beta/models/gemini-2.5-pro:generateContent".into(), &none, Gemini, GenerateContent),
            (
                Method::POST,
                "/v1/models/gemini-2.5-pro:streamGenerateContent".into(),
                &none,
                Gemini,
                StreamGenerateContent,
            ),
            (Method::POST, "/v1beta/models/gemini-2.5-pro:countTokens".into(), &none, Gemini, GeminiCountTokens),
            (Method::POST, "/v1beta/models/text-embedding-004:batchEmbedContents".into(), &none, Gemini, Other),
            (Method::GET, "/v1beta/models".into(), &none, Gemini, Other),
            (Method::GET, "/v1beta/models/gemini-2.5-pro".into(), &none, Gemini, Other),
            (Method::GET, "/v1/models/gemini-2.5-pro".into(), &google, Gemini, Other),
            (Method::POST, "/upload/v1beta/files".into(), &google, Gemini, Other),
            (Method::POST, "/v1beta/models/gemini-2.5-flash:batchGenerateContent".into(), &none, Gemini, Other),
            (Method::POST, "/v1beta/openai/chat/completions".into(), &none, OpenAi, ChatCompletions),
            // Vertex AI: Google's models, express mode, and its other resources.
            (
                Method::POST,
                format!("{vertex}/google/models/gemini-2.5-pro:generateContent"),
                &none,
                Vertex,
                GenerateContent,
            ),
            (
                Method::POST,
                "/v1/publishers/google/models/gemini-2.5-pro:generateContent".into(),
                &none,
                Vertex,
                GenerateContent,
            ),
            (
                Method::POST,
                "/v1/projects/p/locations/l/endpoints/openapi/chat/completions".into(),
                &none,
                Vertex,
                Other,
            ),
            (Method::GET, "/v1beta1/projects/p/locations/l/cachedContents".into(), &none, Vertex, Other),
            // Not served yet: Claude on Vertex AI and on Bedrock, another partner model.
            (
                Method::POST,
                format!("{vertex}/anthropic/models/claude-sonnet-4-5@20250929:rawPredict"),
                &none,
                Anthropic,
                Unserved(Platform::VertexPartner),
            ),
            (
                Method::POST,
                format!("{vertex}/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict"),
                &none,
                Anthropic,
                Unserved(Platform::VertexPartner),
            ),
            (
                Method::POST,
                format!("{vertex}/anthropic/models/count-tokens:rawPredict"),
                &none,
                Anthropic,
                Unserved(Platform::VertexPartner),
            ),
            (
                Method::POST,
                format!("{vertex}/meta/models/llama-4:rawPredict"),
                &none,
                Vertex,
                Unserved(Platform::VertexPartner),
            ),
            (
                Method::POST,
                "/model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke".into(),
                &none,
                Anthropic,
                Unserved(Platform::Bedrock),
            ),
            (
                Method::POST,
                "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream".into(),
                &none,
                Anthropic,
                Unserved(Platform::Bedrock),
            ),
            (
                Method::POST,
                "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Ainference-profile%2Fus.anthropic.claude/invoke".into(),
                &none,
                Anthropic,
                Unserved(Platform::Bedrock),
            ),
            (
                Method::POST,
                "/model/anthropic.claude-v2/converse-stream".into(),
                &none,
                Anthropic,
                Unserved(Platform::Bedrock),
            ),
            (
                Method::POST,
                "/model/anthropic.claude-v2/count-tokens".into(),
                &none,
                Anthropic,
                Unserved(Platform::Bedrock),
            ),
        ];
        for (method, path, headers, family, endpoint) in cases {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, http::HeaderValue::from_static(value));
            }
            let routed = Route::of(&method, &path, &map);
            assert_eq!((routed.family, routed.endpoint), (family, endpoint), "{method} {path} {headers:?}");
        }
    }

    #[test]
    fn paths_are_normalized_before_routing() {
        assert_eq!(normalize_path("/v1/chat/completions"), None);
        assert_eq!(normalize_path("/v1/messages/"), None);
        assert_eq!(normalize_path("/v1/messages/../chat/completions").as_deref(), Some("/v1/chat/completions"));
        assert_eq!(normalize_path("/v1/messages/%2E%2e/chat/completions").as_deref(), Some("/v1/chat/completions"));
        assert_eq!(normalize_path("/v1/chat/completions/../../messages").as_deref(), Some("/v1/messages"));
        assert_eq!(normalize_path("/v1//messages").as_deref(), Some("/v1/messages"));
        assert_eq!(normalize_path("/./v1/./models/.").as_deref(), Some("/v1/models/"));
        assert_eq!(normalize_path("/../../etc").as_deref(), Some("/etc"));
        assert_eq!(normalize_path("/v1/..").as_deref(), Some("/"));
        // A segment that merely contains dots is a name.
        assert_eq!(normalize_path("/v1/files/a..b/.hidden"), None);
        let normal = normalize_path("/v1/messages/../chat/completions").unwrap();
        let routed = Route::of(&Method::POST, &normal, &HeaderMap::new());
        assert_eq!((routed.family, routed.endpoint), (ApiFamily::OpenAi, Endpoint::ChatCompletions));
    }

    #[test]
    fn a_dot_dot_segment_is_read_as_before_without_allocating() {
        let allocating = |segment: &str| {
            matches!(segment.len(), 2 | 4 | 6) && segment.to_ascii_lowercase().replace("%2e", ".") == ".."
        };
        for segment in [
            "",
            ".",
            "..",
            "...",
            "v1",
            "%2e",
            "%2E.",
            ".%2e",
            "%2e%2E",
            "%2E%2E",
            "%2",
            "%2ee",
            "%2e%2e%2e",
            "..%2e",
            "%2f%2e",
            "%%2e",
            ".e",
            "%2e.x",
            "é.",
        ] {
            assert_eq!(dots(segment) == Some(2), allocating(segment), "{segment:?}");
        }
    }
}
