//! Routing held to its cases: each provider's path shapes, the headers that mark a family, the
//! path rule, and the table of every path shape the SDKs send.

use super::normalize::dots;
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
        vertex_method("/v1beta1/projects/p/locations/global/publishers/google/models/gemini-3-pro-preview:countTokens"),
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
    let allocating =
        |segment: &str| matches!(segment.len(), 2 | 4 | 6) && segment.to_ascii_lowercase().replace("%2e", ".") == "..";
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

/// The table of every path shape the SDKs and agents send, and where each must go.
mod sdk_paths {
    use super::*;
    use ApiFamily::{Anthropic, Azure, Bedrock, Gemini, OpenAi, Vertex, VertexAnthropic};
    use Endpoint::*;

    /// A request's method, path and headers, and the family and endpoint it must be routed to.
    type Case = (Method, String, &'static [(&'static str, &'static str)], ApiFamily, Endpoint);

    const ANTHROPIC: &[(&str, &str)] = &[("anthropic-version", "2023-06-01")];
    const GOOGLE: &[(&str, &str)] = &[("x-goog-api-key", "k")];
    const NONE: &[(&str, &str)] = &[];
    const VERTEX: &str = "/v1/projects/p/locations/us-east5/publishers";

    /// Every path shape the SDKs and agents send, and where it goes: a credential only ever
    /// reaches its own provider's upstream, and a platform compactor does not serve is refused.
    #[test]
    fn every_sdk_path_shape_goes_to_its_own_providers_upstream() {
        let cases =
            [openai_paths(), azure_paths(), anthropic_paths(), gemini_paths(), vertex_paths(), cloud_paths()].concat();
        for (method, path, headers, family, endpoint) in cases {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, http::HeaderValue::from_static(value));
            }
            let routed = Route::of(&method, &path, &map);
            assert_eq!((routed.family, routed.endpoint), (family, endpoint), "{method} {path} {headers:?}");
        }
    }

    /// OpenAI's paths, and Azure-style deployments.
    fn openai_paths() -> Vec<Case> {
        vec![
            // OpenAI: fine-tuned model names hold colons; files, batches, uploads, vector stores.
            (Method::GET, "/v1/models/ft:gpt-4o-mini-2024-07-18:my-org:custom:9xYz".into(), NONE, OpenAi, Models),
            (Method::DELETE, "/v1/models/ft:gpt-4o-mini-2024-07-18:my-org:custom:9xYz".into(), NONE, OpenAi, Models),
            (Method::GET, "/v1/models/ft:gpt-3.5-turbo:acme::abc123".into(), NONE, OpenAi, Models),
            (Method::GET, "/v1/models".into(), NONE, OpenAi, Models),
            (Method::GET, "/v1/models/gpt-4o".into(), NONE, OpenAi, Models),
            (Method::POST, "/v1/chat/completions".into(), NONE, OpenAi, ChatCompletions),
            (Method::POST, "/v1/responses".into(), NONE, OpenAi, Responses),
            (Method::GET, "/v1/responses/resp_1/input_items".into(), NONE, OpenAi, Other),
            (Method::POST, "/v1/responses/compact".into(), NONE, OpenAi, ResponsesCompact),
            (Method::POST, "/v1/embeddings".into(), NONE, OpenAi, Embeddings),
            (Method::POST, "/v1/files".into(), NONE, OpenAi, Other),
            (Method::GET, "/v1/files/file-abc:1/content".into(), NONE, OpenAi, Other),
            (Method::POST, "/v1/batches".into(), NONE, OpenAi, Other),
            (Method::POST, "/v1/batches/batch_1/cancel".into(), NONE, OpenAi, Other),
            (Method::POST, "/v1/fine_tuning/jobs".into(), NONE, OpenAi, Other),
            (Method::POST, "/v1/uploads/upload_1/parts".into(), NONE, OpenAi, Other),
        ]
    }

    /// Azure OpenAI's paths, as the openai SDKs' `AzureOpenAI` clients and Codex CLI send them
    /// (the `api-version` query aside, which routing does not read).
    fn azure_paths() -> Vec<Case> {
        const AZURE_KEY: &[(&str, &str)] = &[("api-key", "k")];
        vec![
            (Method::POST, "/openai/deployments/gpt-4o/chat/completions".into(), AZURE_KEY, Azure, ChatCompletions),
            (Method::POST, "/openai/deployments/my-gpt/chat/completions".into(), NONE, Azure, ChatCompletions),
            (Method::POST, "/openai/deployments/emb/embeddings".into(), AZURE_KEY, Azure, Embeddings),
            (Method::POST, "/openai/deployments/gpt-4o/completions".into(), AZURE_KEY, Azure, Other),
            (Method::POST, "/openai/v1/chat/completions".into(), AZURE_KEY, Azure, ChatCompletions),
            (Method::POST, "/openai/v1/responses".into(), AZURE_KEY, Azure, Responses),
            (Method::POST, "/openai/responses".into(), AZURE_KEY, Azure, Responses),
            (Method::POST, "/openai/v1/responses/input_tokens".into(), AZURE_KEY, Azure, InputTokens),
            (Method::POST, "/openai/v1/responses/compact".into(), AZURE_KEY, Azure, ResponsesCompact),
            (Method::GET, "/openai/v1/responses/resp_1".into(), AZURE_KEY, Azure, Other),
            (Method::GET, "/openai/models".into(), AZURE_KEY, Azure, Models),
            (Method::GET, "/openai/v1/models/gpt-4o".into(), AZURE_KEY, Azure, Models),
            (Method::POST, "/openai/deployments/gpt-4o/audio/transcriptions".into(), AZURE_KEY, Azure, Other),
            // An OpenAI path whose model happens to start with "openai" stays OpenAI's.
            (Method::GET, "/v1/models/openai-gpt".into(), NONE, OpenAi, Models),
        ]
    }

    /// Anthropic's paths, and OpenAI's shapes carrying `anthropic-version`.
    fn anthropic_paths() -> Vec<Case> {
        vec![
            // Anthropic.
            (Method::POST, "/v1/messages".into(), NONE, Anthropic, Messages),
            (Method::POST, "/v1/messages/count_tokens".into(), NONE, Anthropic, CountTokens),
            (Method::POST, "/v1/messages/batches".into(), NONE, Anthropic, Other),
            (Method::GET, "/v1/models".into(), ANTHROPIC, Anthropic, Models),
            (Method::GET, "/v1/models/claude-sonnet-4-5".into(), ANTHROPIC, Anthropic, Models),
            (Method::POST, "/v1/files".into(), ANTHROPIC, Anthropic, Other),
        ]
    }

    /// The Gemini API's paths.
    fn gemini_paths() -> Vec<Case> {
        vec![
            // Gemini: model methods, model listing, files and batches under the beta version.
            (Method::POST, "/v1beta/models/gemini-2.5-pro:generateContent".into(), NONE, Gemini, GenerateContent),
            (
                Method::POST,
                "/v1/models/gemini-2.5-pro:streamGenerateContent".into(),
                NONE,
                Gemini,
                StreamGenerateContent,
            ),
            (Method::POST, "/v1beta/models/gemini-2.5-pro:countTokens".into(), NONE, Gemini, GeminiCountTokens),
            (Method::POST, "/v1beta/models/text-embedding-004:batchEmbedContents".into(), NONE, Gemini, Other),
            (Method::GET, "/v1beta/models".into(), NONE, Gemini, Other),
            (Method::GET, "/v1beta/models/gemini-2.5-pro".into(), NONE, Gemini, Other),
            (Method::GET, "/v1/models/gemini-2.5-pro".into(), GOOGLE, Gemini, Other),
            (Method::POST, "/upload/v1beta/files".into(), GOOGLE, Gemini, Other),
            (Method::POST, "/v1beta/models/gemini-2.5-flash:batchGenerateContent".into(), NONE, Gemini, Other),
            (Method::POST, "/v1beta/openai/chat/completions".into(), NONE, OpenAi, ChatCompletions),
        ]
    }

    /// Vertex AI's paths for Google's models and its other resources.
    fn vertex_paths() -> Vec<Case> {
        vec![
            // Vertex AI: Google's models, express mode, and its other resources.
            (
                Method::POST,
                format!("{VERTEX}/google/models/gemini-2.5-pro:generateContent"),
                NONE,
                Vertex,
                GenerateContent,
            ),
            (
                Method::POST,
                "/v1/publishers/google/models/gemini-2.5-pro:generateContent".into(),
                NONE,
                Vertex,
                GenerateContent,
            ),
            (Method::POST, "/v1/projects/p/locations/l/endpoints/openapi/chat/completions".into(), NONE, Vertex, Other),
            (Method::GET, "/v1beta1/projects/p/locations/l/cachedContents".into(), NONE, Vertex, Other),
        ]
    }

    /// Claude on Vertex AI and on Bedrock, as Claude Code and the Anthropic SDKs send them; another
    /// partner's model on Vertex AI; Bedrock's control plane, which compactor does not serve.
    fn cloud_paths() -> Vec<Case> {
        const STREAM: &str = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke-with-response-stream";
        vec![
            (
                Method::POST,
                format!("{VERTEX}/anthropic/models/claude-sonnet-4-5@20250929:rawPredict"),
                NONE,
                VertexAnthropic,
                Messages,
            ),
            (
                Method::POST,
                format!("{VERTEX}/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict"),
                ANTHROPIC,
                VertexAnthropic,
                Messages,
            ),
            (
                Method::POST,
                format!("{VERTEX}/anthropic/models/count-tokens:rawPredict"),
                NONE,
                VertexAnthropic,
                CountTokens,
            ),
            (Method::GET, format!("{VERTEX}/anthropic/models/claude-sonnet-4-5@20250929"), NONE, Vertex, Other),
            (Method::POST, format!("{VERTEX}/meta/models/llama-4:rawPredict"), NONE, Vertex, Other),
            (Method::POST, "/model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke".into(), NONE, Bedrock, Messages),
            (Method::POST, STREAM.into(), ANTHROPIC, Bedrock, Messages),
            (
                Method::POST,
                "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream".into(),
                NONE,
                Bedrock,
                Messages,
            ),
            (
                Method::POST,
                "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Ainference-profile%2Fus.anthropic.claude/invoke".into(),
                NONE,
                Bedrock,
                Messages,
            ),
            (Method::POST, "/model/anthropic.claude-v2/converse-stream".into(), NONE, Bedrock, Other),
            (Method::POST, "/model/anthropic.claude-v2/count-tokens".into(), NONE, Bedrock, Other),
            (Method::GET, "/model/anthropic.claude-v2/invoke".into(), NONE, Bedrock, Other),
            (Method::GET, "/inference-profiles".into(), NONE, Bedrock, Unserved(Platform::BedrockControl)),
            (Method::GET, "/foundation-models".into(), NONE, Bedrock, Unserved(Platform::BedrockControl)),
        ]
    }
}

#[test]
fn each_family_is_found_by_its_upstream_name_and_reads_its_own_value() {
    let values = PerFamily { openai: 1, anthropic: 2, gemini: 3, vertex: 4, azure: 5, bedrock: 6, vertex_anthropic: 7 };
    for (family, value) in ApiFamily::ALL.into_iter().zip(1..) {
        assert_eq!(ApiFamily::of_label(family.label()), Some(family));
        assert_eq!(*values.get(family), value);
    }
    assert_eq!(ApiFamily::of_label("sagemaker"), None);
}

#[test]
fn an_azure_deployment_path_names_its_deployment() {
    assert_eq!(azure_deployment("/openai/deployments/my-gpt-4o/chat/completions"), Some("my-gpt-4o"));
    assert_eq!(azure_deployment("/openai/deployments/my-gpt-4o"), Some("my-gpt-4o"));
    assert_eq!(azure_deployment("/openai/deployments//chat/completions"), None);
    assert_eq!(azure_deployment("/openai/v1/chat/completions"), None);
    assert_eq!(azure_deployment("/v1/chat/completions"), None);
}

#[test]
fn a_bedrock_model_id_is_read_from_its_path_as_sent_or_percent_encoded() {
    let id = |path: &str| bedrock_operation(path).and_then(|(raw, _)| bedrock_model_id(raw)).map(|id| id.into_owned());
    let streamed = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke-with-response-stream";
    assert_eq!(id(streamed).as_deref(), Some("us.anthropic.claude-sonnet-4-5-20250929-v1:0"));
    assert_eq!(bedrock_operation(streamed).map(|(_, op)| op), Some("invoke-with-response-stream"));
    let encoded = "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Ainference-profile%2Fus.anthropic.claude/invoke";
    assert_eq!(id(encoded).as_deref(), Some("arn:aws:bedrock:us-east-1:123:inference-profile/us.anthropic.claude"));
    assert_eq!(id("/model/bad%ff/invoke"), None, "not UTF-8 once decoded");
    assert_eq!(id("/model//invoke"), None);
    assert_eq!(bedrock_operation("/model/m/invoke/extra"), None);
    assert_eq!(
        vertex_claude("/v1/projects/p/locations/l/publishers/anthropic/models/claude-opus-4@1:rawPredict"),
        Some(("claude-opus-4@1", "rawPredict"))
    );
    assert_eq!(vertex_claude("/v1/projects/p/locations/l/publishers/meta/models/llama:rawPredict"), None);
}
