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
/// publisher and what follows `models/`.
pub(super) fn vertex_partner(path: &str) -> Option<(&str, &str)> {
    if !is_vertex_resource(path) {
        return None;
    }
    let (_, rest) = path.split_once("/publishers/")?;
    let (publisher, rest) = rest.split_once('/')?;
    let model = rest.strip_prefix("models/")?;
    (publisher != "google").then_some((publisher, model))
}

/// Claude on Vertex AI, `…/publishers/anthropic/models/{model}:{method}`: the model and the
/// method (`rawPredict`, `streamRawPredict`; the model `count-tokens` counts). `None` for any
/// other path.
pub fn vertex_claude(path: &str) -> Option<(&str, &str)> {
    let ("anthropic", rest) = vertex_partner(path)? else { return None };
    let (model, method) = rest.split_once(':')?;
    (!model.is_empty() && !model.contains('/')).then_some((model, method))
}

/// Amazon Bedrock's paths: the runtime's `/model/{modelId}/{operation}` (InvokeModel, Converse,
/// CountTokens and their streams), `/async-invoke`, `/guardrail/…`, and the control plane's
/// model listings (`/inference-profiles`, `/foundation-models`), which Claude Code asks first.
pub(super) fn is_bedrock(path: &str) -> bool {
    path.starts_with("/model/")
        || path == "/async-invoke"
        || path.starts_with("/async-invoke/")
        || path.starts_with("/guardrail/")
        || is_bedrock_control(path)
}

/// The Bedrock control plane's paths a client of the runtime asks (`bedrock.{region}`, not
/// `bedrock-runtime.{region}`): compactor serves the runtime only.
pub(super) fn is_bedrock_control(path: &str) -> bool {
    ["/inference-profiles", "/foundation-models"]
        .iter()
        .any(|prefix| path == *prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/')))
}

/// A Bedrock runtime model path, `/model/{modelId}/{operation}`: the model id as sent (a model
/// id, an inference profile's, or an ARN, percent-encoded or not) and the operation.
pub fn bedrock_operation(path: &str) -> Option<(&str, &str)> {
    let (model, operation) = path.strip_prefix("/model/")?.split_once('/')?;
    (!model.is_empty() && !operation.contains('/')).then_some((model, operation))
}

/// A Bedrock model id as the path carries it, percent-decoded (`v1%3A0` is `v1:0`, an ARN's
/// `%2F` a slash); `None` when it does not decode to UTF-8.
pub fn bedrock_model_id(raw: &str) -> Option<std::borrow::Cow<'_, str>> {
    if !raw.contains('%') {
        return Some(std::borrow::Cow::Borrowed(raw));
    }
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[at], bytes.get(at + 1).copied().and_then(hex), bytes.get(at + 2).copied().and_then(hex)) {
            (b'%', Some(high), Some(low)) => {
                decoded.push((high * 16 + low) as u8);
                at += 3;
            }
            (byte, ..) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(decoded).ok().map(std::borrow::Cow::Owned)
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
