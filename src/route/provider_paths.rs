//! Which provider a path's shape belongs to: Gemini and Vertex AI model methods, Vertex AI
//! resources and partner models, Amazon Bedrock's runtime, Azure OpenAI.

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
pub(super) fn is_vertex_resource(path: &str) -> bool {
    let Some((version, rest)) = path.strip_prefix('/').and_then(|rest| rest.split_once('/')) else { return false };
    let Some((project, rest)) = rest.strip_prefix("projects/").and_then(|rest| rest.split_once('/')) else {
        return false;
    };
    is_gemini_version(version) && !project.is_empty() && rest.starts_with("locations/")
}

/// A Vertex AI model of a publisher other than Google (`…/publishers/anthropic/models/…`): the
/// publisher.
pub(super) fn vertex_partner(path: &str) -> Option<&str> {
    if !is_vertex_resource(path) {
        return None;
    }
    let (_, rest) = path.split_once("/publishers/")?;
    let (publisher, rest) = rest.split_once('/')?;
    (publisher != "google" && rest.starts_with("models/")).then_some(publisher)
}

/// Amazon Bedrock's runtime paths: `/model/{modelId}/{operation}` (InvokeModel, Converse,
/// CountTokens and their streams), `/async-invoke`, `/guardrail/…`.
pub(super) fn is_bedrock(path: &str) -> bool {
    path.starts_with("/model/")
        || path == "/async-invoke"
        || path.starts_with("/async-invoke/")
        || path.starts_with("/guardrail/")
}

/// Azure OpenAI's paths: everything under `/openai/` (deployments, the v1 API, the preview
/// API's Responses). Google's OpenAI-compatible `/v1beta/openai/` is not one of them.
pub(super) fn is_azure(path: &str) -> bool {
    path == "/openai" || path.starts_with("/openai/")
}

/// The deployment an Azure OpenAI path names (`/openai/deployments/{deployment}/…`): the model
/// Azure answers with, whatever the body's `model` says.
pub fn azure_deployment(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/openai/deployments/")?;
    let deployment = rest.split('/').next()?;
    (!deployment.is_empty()).then_some(deployment)
}

/// `v1`, `v1beta`, `v1alpha`, `v1beta1`...: the versions of Google's APIs.
fn is_gemini_version(version: &str) -> bool {
    version
        .strip_prefix("v1")
        .is_some_and(|tail| tail.is_empty() || tail.starts_with("beta") || tail.starts_with("alpha"))
}
