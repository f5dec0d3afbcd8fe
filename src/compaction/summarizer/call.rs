//! Where a summary call goes and what its body says besides the transcript, per platform: the
//! client's own endpoint, asked for a whole (non-streaming) answer of the summarizing model.
//! Gemini and Vertex AI name the model in the path (`…/models/{model}:generateContent`), Claude
//! on Bedrock (`/model/{modelId}/invoke`) and on Vertex AI (`…/models/{model}:rawPredict`) too,
//! and those two want their API version in the body instead of a `model`.

use crate::dialect::Dialect;
use crate::json::json_string;
use crate::route::{ApiFamily, Endpoint, Route};
use crate::upstream::RequestHead;

/// The API versions Claude's platforms want in the body.
const BEDROCK_VERSION: &str = "bedrock-2023-05-31";
const VERTEX_VERSION: &str = "vertex-2023-10-16";

/// The head of a summary call of `model`, when it is not the client's own: the client's
/// headers (its credential, for compactor's own authentication to replace where it does) and
/// the path for a whole answer.
pub(super) fn head(head: &RequestHead, dialect: Dialect, model: &str) -> Option<RequestHead> {
    let path = match (head.route.family, dialect) {
        (_, Dialect::Gemini) => gemini_path(head, model),
        (ApiFamily::Bedrock, _) => bedrock_path(head, model),
        (ApiFamily::VertexAnthropic, _) => vertex_claude_path(head, model)?,
        _ => return None,
    };
    let endpoint = if dialect == Dialect::Gemini { Endpoint::GenerateContent } else { Endpoint::Messages };
    Some(RequestHead {
        route: Route { family: head.route.family, endpoint },
        method: http::Method::POST,
        uri: path.parse().unwrap_or_else(|_| head.uri.clone()),
        headers: head.headers.clone(),
        signed_body: None,
    })
}

/// What opens a Messages summary body and what closes it: `"model":…` and `"stream":false` on
/// Anthropic's API; Bedrock's version and no `stream` (its InvokeModel refuses the key); Vertex
/// AI's version and `"stream":false`.
pub(super) fn anthropic_envelope(family: ApiFamily, model: &str) -> (String, &'static str) {
    match family {
        ApiFamily::Bedrock => (format!(r#""anthropic_version":"{BEDROCK_VERSION}""#), ""),
        ApiFamily::VertexAnthropic => (format!(r#""anthropic_version":"{VERTEX_VERSION}""#), r#","stream":false"#),
        _ => (format!(r#""model":{}"#, json_string(model)), r#","stream":false"#),
    }
}

/// Gemini's `:generateContent` of the summarizing model, without `alt=sse` (the answer is read
/// whole), the client's query (its key may be there) kept. The path is the client's up to its
/// `models/` (a Vertex AI path keeps its project and location).
fn gemini_path(head: &RequestHead, model: &str) -> String {
    let client_path = head.uri.path();
    let models = match client_path.rfind("/models/") {
        Some(at) => &client_path[..at + "/models/".len()],
        None => "/v1beta/models/",
    };
    let query: Vec<&str> = head
        .uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.starts_with("alt="))
        .collect();
    let mut path = format!("{models}{model}:generateContent");
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    path
}

/// Bedrock's InvokeModel (not its stream) of the summarizing model: the client's own model id
/// segment as it sent it when that is the model, else the model id percent-encoded as the AWS
/// SDKs send it.
fn bedrock_path(head: &RequestHead, model: &str) -> String {
    if let Some((raw, _)) = crate::route::bedrock_operation(head.uri.path())
        && crate::route::bedrock_model_id(raw).is_some_and(|id| id == model)
    {
        return format!("/model/{raw}/invoke");
    }
    let mut encoded = String::with_capacity(model.len() + 8);
    for c in model.chars() {
        match c {
            ':' => encoded.push_str("%3A"),
            '/' => encoded.push_str("%2F"),
            c => encoded.push(c),
        }
    }
    format!("/model/{encoded}/invoke")
}

/// Vertex AI's `:rawPredict` (not its stream) of the summarizing model, the client's project
/// and location kept.
fn vertex_claude_path(head: &RequestHead, model: &str) -> Option<String> {
    let path = head.uri.path();
    let at = path.rfind("/models/")?;
    Some(format!("{}{model}:rawPredict", &path[..at + "/models/".len()]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, Method};

    fn head_of(path: &str) -> RequestHead {
        let route = Route::of(&Method::POST, path, &HeaderMap::new());
        let parts = http::Request::post(path).body(()).unwrap().into_parts().0;
        RequestHead::new(route, parts)
    }

    #[test]
    fn a_summary_goes_to_the_platform_s_whole_answer_endpoint_of_the_summarizing_model() {
        let stream = head_of("/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke-with-response-stream");
        let call = head(&stream, Dialect::AnthropicMessages, "us.anthropic.claude-sonnet-4-5-20250929-v1:0").unwrap();
        assert_eq!(call.uri.path(), "/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke");
        assert_eq!((call.route.family, call.route.endpoint), (ApiFamily::Bedrock, Endpoint::Messages));
        let other =
            head(&stream, Dialect::AnthropicMessages, "arn:aws:bedrock:us-east-1:1:inference-profile/x").unwrap();
        assert_eq!(other.uri.path(), "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fx/invoke");

        let vertex = head_of(
            "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@1:streamRawPredict",
        );
        let call = head(&vertex, Dialect::AnthropicMessages, "claude-haiku-4-5@2").unwrap();
        assert_eq!(
            call.uri.path(),
            "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-haiku-4-5@2:rawPredict"
        );

        assert!(head(&head_of("/v1/messages"), Dialect::AnthropicMessages, "claude").is_none());
        let gemini = head_of("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=k");
        assert_eq!(
            head(&gemini, Dialect::Gemini, "gemini-2.5-flash").unwrap().uri.to_string(),
            "/v1beta/models/gemini-2.5-flash:generateContent?key=k"
        );
    }

    #[test]
    fn claude_s_platforms_get_their_version_and_no_model_in_the_body() {
        let body = |family| {
            let (lead, stream) = anthropic_envelope(family, "m");
            serde_json::from_str::<serde_json::Value>(&format!("{{{lead},\"max_tokens\":1{stream}}}")).unwrap()
        };
        let bedrock = body(ApiFamily::Bedrock);
        assert_eq!(bedrock["anthropic_version"], BEDROCK_VERSION);
        assert!(bedrock.get("model").is_none() && bedrock.get("stream").is_none(), "{bedrock}");
        let vertex = body(ApiFamily::VertexAnthropic);
        assert_eq!(
            (vertex["anthropic_version"].as_str(), vertex["stream"].as_bool()),
            (Some(VERTEX_VERSION), Some(false))
        );
        let anthropic = body(ApiFamily::Anthropic);
        assert_eq!((anthropic["model"].as_str(), anthropic["stream"].as_bool()), (Some("m"), Some(false)));
    }
}
