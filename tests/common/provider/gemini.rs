//! The simulator's Gemini dialect (`/{version}/models/{model}:{method}`): `generateContent`, and
//! `streamGenerateContent` as SSE with `?alt=sse` or as one JSON array without; `countTokens`.
//! It counts, caches, rejects what does not fit with the Gemini API's own 400 (naming the window,
//! or, with [`Errors::Unnamed`], not), enforces its pairing rules (every call of a turn answered
//! in the next user turn; on Gemini 3 the current turn's calls must carry their thought
//! signatures), answers compactor's summary calls, and calls the first tool, with a thought
//! signature, when the last user text asks for it with [`CALL_TOOL`].
//!
//! With a [`Script`] it plays the scripted model for Gemini CLI: calls to the CLI's own shell tool
//! (`run_shell_command`) as the Gemini API gives them (no id, a thought signature), the final
//! answer, and answers to the CLI's own compression requests.

use super::*;

/// A user text holding this makes the simulator answer with a function call.
pub const CALL_TOOL: &str = "[call-tool]";
/// The thought signature the simulator gives its function calls: base64 with `+`, `/` and `=`,
/// which must come back byte for byte.
pub const SIGNATURE: &str = "CiQB0e2Kb+//vvvwP/9mb29iYXIh";

/// The model and method of a Gemini path, or of a Vertex AI one
/// (`/v1/projects/{p}/locations/{l}/publishers/google/models/{model}:{method}`).
pub(super) fn method(path: &str) -> Option<(String, String)> {
    let rest = path
        .strip_prefix("/v1beta/models/")
        .or_else(|| path.strip_prefix("/v1/models/"))
        .or_else(|| path.split_once("/publishers/google/models/").map(|(_, rest)| rest))?;
    let (model, method) = rest.rsplit_once(':')?;
    Some((model.to_string(), method.to_string()))
}

/// Whether the path is Vertex AI's: its overflow error has its own words.
fn is_vertex(path: &str) -> bool {
    path.contains("/publishers/google/models/")
}

/// The prompt as the Gemini API counts it: tools, the system instruction, each content's parts.
pub(super) fn prompt(body: &Value, spec: &ProviderSpec) -> Prompt {
    let mut reader = PromptReader { spec, prompt: Prompt::default(), chain: 0 };
    let tools = body.get("tools").and_then(Value::as_array).filter(|t| !t.is_empty());
    reader.prompt.tool_less = tools.is_none();
    if let Some(tools) = tools {
        let (hash, tokens) = reader.block(&Value::Array(tools.clone()), spec.tokens(text_chars(&json!(tools))), 0);
        reader.prompt.units.push(Unit { hash, tokens });
    }
    if body["systemInstruction"].is_object() {
        reader.part(&body["systemInstruction"]);
    }
    for content in body["contents"].as_array().into_iter().flatten() {
        let mut tokens = 0;
        for (i, part) in content["parts"].as_array().into_iter().flatten().enumerate() {
            let framing = if i == 0 { MESSAGE_TOKENS } else { 0 };
            tokens += reader.block(part, spec.tokens(text_chars(part)), framing).1;
        }
        reader.prompt.units.push(Unit { hash: xxh3_64(canonical(content).as_bytes()), tokens });
    }
    reader.prompt.max_tokens = body["generationConfig"]["maxOutputTokens"].as_u64().unwrap_or(0) as usize;
    reader.prompt.tokens = BASE_TOKENS + reader.prompt.units.iter().map(|u| u.tokens).sum::<usize>();
    reader.prompt
}

fn google_error(code: u16, message: &str, status: &str) -> Reply {
    json_reply(code, &json!({"error": {"code": code, "message": message, "status": status}}))
}

/// The Gemini API's pairing and signature rules, with its error messages.
pub fn pairing_error(model: &str, body: &Value) -> Option<String> {
    let contents = body["contents"].as_array()?;
    let calls =
        |c: &Value| c["parts"].as_array().map_or(0, |p| p.iter().filter(|p| p.get("functionCall").is_some()).count());
    let responses = |c: &Value| {
        c["parts"].as_array().map_or(0, |p| p.iter().filter(|p| p.get("functionResponse").is_some()).count())
    };
    for (i, content) in contents.iter().enumerate() {
        let asked = calls(content);
        if asked > 0 && contents.get(i + 1).is_some_and(|next| responses(next) != asked) {
            return Some("Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.".into());
        }
        if responses(content) > 0 && (i == 0 || calls(&contents[i - 1]) == 0) {
            return Some(
                "Please ensure that function response turn comes immediately after a function call turn.".into(),
            );
        }
    }
    if model.starts_with("gemini-3") {
        // The current turn: everything after the last user content with text.
        let start = contents
            .iter()
            .rposition(|c| {
                c["role"] != "model" && c["parts"].as_array().is_some_and(|p| p.iter().any(|p| p.get("text").is_some()))
            })
            .map_or(0, |i| i + 1);
        for content in &contents[start..] {
            let first_call =
                content["parts"].as_array().and_then(|p| p.iter().find(|p| p.get("functionCall").is_some()));
            if first_call.is_some_and(|part| part.get("thoughtSignature").is_none()) {
                return Some("Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call `default_api:x` , position 2. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details.".into());
            }
        }
    }
    None
}

fn usage_metadata(usage: &Usage, output: usize) -> Value {
    json!({"promptTokenCount": usage.prompt, "cachedContentTokenCount": usage.cached,
        "candidatesTokenCount": output, "totalTokenCount": usage.prompt + output})
}

/// The JSON schema a request asks its answer to follow (`generationConfig.responseJsonSchema`).
fn json_schema(body: &Value) -> Option<&Value> {
    let config = &body["generationConfig"];
    config.get("responseJsonSchema").or_else(|| config.get("responseSchema"))
}

/// A value of `schema`: every property with its type's plainest value.
fn answer_for_schema(schema: &Value) -> Value {
    let kind = schema["type"].as_str().unwrap_or("object").to_ascii_lowercase();
    match kind.as_str() {
        "object" => {
            let properties = schema["properties"].as_object().into_iter().flatten();
            Value::Object(properties.map(|(name, property)| (name.clone(), answer_for_schema(property))).collect())
        }
        "number" | "integer" => json!(0),
        "boolean" => json!(false),
        "array" => json!([]),
        _ => json!("The scripted steps make progress."),
    }
}

/// Whether the last content is a user text asking for a tool call.
fn asks_for_call(body: &Value) -> Option<String> {
    let last = body["contents"].as_array()?.last()?;
    let asks = last["parts"].as_array()?.iter().any(|p| p["text"].as_str().is_some_and(|t| t.contains(CALL_TOOL)));
    let tool = body["tools"][0]["functionDeclarations"][0]["name"].as_str()?;
    asks.then(|| tool.to_string())
}

/// Answers one Gemini request; the record is pushed here.
#[allow(clippy::too_many_arguments)]
pub(super) async fn handle(
    state: &State,
    mut record: Record,
    headers: &HeaderMap,
    query: &str,
    model: &str,
    method: &str,
    body: &Bytes,
    value: Option<Value>,
) -> Reply {
    let spec = &state.spec;
    let push = |record: Record| state.records.lock().unwrap().push(record);
    let Some(value) = value else {
        record.status = 400;
        push(record);
        return google_error(400, "Invalid JSON payload received.", "INVALID_ARGUMENT");
    };
    let prompt = prompt(&value, spec);
    if method == "countTokens" {
        record.outcome = Outcome::Answered;
        record.status = 200;
        record.tokens = prompt.tokens;
        push(record);
        return json_reply(200, &json!({"totalTokens": prompt.tokens}));
    }
    let stream = match method {
        "generateContent" => false,
        "streamGenerateContent" => true,
        _ => {
            push(record);
            return google_error(404, &format!("Method {method} not found."), "NOT_FOUND");
        }
    };
    let sse = query.split('&').any(|pair| pair == "alt=sse");
    let text = String::from_utf8_lossy(body).into_owned();
    let summary = prompt.tool_less && text.contains(SUMMARY_MARKER);
    record.summary = summary;
    record.model_call = true;
    let kind = spec.script.as_ref().map(|_| script::kind(script::Wire::Gemini, &value, &text)).filter(|_| !summary);
    record.agent_summary = kind == Some(Kind::AgentSummary);
    record.helper = kind == Some(Kind::Helper);
    record.session = session_of(headers, &value, &prompt);
    record.tokens = prompt.tokens;
    record.max_tokens = prompt.max_tokens;
    if let Some(message) = pairing_error(model, &value) {
        record.status = 400;
        record.units = prompt.units;
        push(record);
        return google_error(400, &message, "INVALID_ARGUMENT");
    }
    let window = state.window_for(kind, prompt.tokens);
    if prompt.tokens > window {
        let message = match spec.errors {
            Errors::Unnamed => "The input token count exceeds the maximum number of tokens allowed.".to_string(),
            _ if is_vertex(&record.path) => format!(
                "Unable to submit request because the input token count is {} but model only supports up to {}. Reduce the input token count and try again. You can also use the CountTokens API to calculate prompt token count and billable characters. Learn more: https://cloud.google.com/vertex-ai/generative-ai/docs/learn/models",
                prompt.tokens, window
            ),
            _ => format!(
                "The input token count ({}) exceeds the maximum number of tokens allowed ({}).",
                prompt.tokens, window
            ),
        };
        record.outcome = Outcome::Overflow;
        record.status = 400;
        record.units = prompt.units;
        push(record);
        return google_error(400, &message, "INVALID_ARGUMENT");
    }
    let (parts, usage) = if summary {
        let number = state.summaries.fetch_add(1, Ordering::SeqCst) + 1;
        // Scripted, the summary reads only the transcript compactor sent, as for the other dialects.
        let source = if spec.script.is_some() { transcript_of(&text) } else { &text };
        let text = state.summary_text(number, source);
        let output = spec.tokens(text.chars().count());
        (vec![json!({"text": text})], Usage { prompt: prompt.tokens, read: 0, write: 0, cached: 0, output })
    } else {
        let previous = state.previous.lock().unwrap().insert(record.session.clone(), prompt.units.clone());
        let (_, prefix) = previous.map_or((0, 0), |p| common_prefix(&p, &prompt.units));
        record.prefix_tokens = prefix;
        let cached = if prefix >= MIN_CACHEABLE { prefix } else { 0 };
        let usage = Usage { prompt: prompt.tokens, read: cached, write: 0, cached, output: spec.reply_tokens };
        let scripted = match (&spec.script, kind) {
            (Some(script), Some(Kind::Turn)) => {
                Some(script::next_move(script, script::Wire::Gemini, &value, &text, spec.chars_per_token))
            }
            (Some(_), Some(Kind::AgentSummary)) => Some(Move::Text(state.summary_text(1000 + record.tokens, &text))),
            // A helper asking for JSON (Gemini CLI's loop detection) gets an object of its schema:
            // zero, false and a short text say nothing is wrong.
            (Some(_), _) => Some(Move::Text(match json_schema(&value) {
                Some(schema) => answer_for_schema(schema).to_string(),
                None => "Scripted task".into(),
            })),
            (None, _) => None,
        };
        match &scripted {
            Some(Move::Call(_)) => record.round = script::progress(&text).0 + 1,
            Some(Move::Text(_)) => record.final_answer = kind == Some(Kind::Turn),
            None => {}
        }
        let parts = match (scripted, asks_for_call(&value)) {
            // As the Gemini API answers: no id (the agent makes one up), a thought signature.
            (Some(Move::Call(call)), _) => {
                vec![
                    json!({"functionCall": {"name": call.name, "args": call.arguments}, "thoughtSignature": SIGNATURE}),
                ]
            }
            (Some(Move::Text(text)), _) => vec![json!({"text": text})],
            (None, Some(tool)) => {
                vec![json!({"functionCall": {"name": tool, "args": {"city": "Paris"}}, "thoughtSignature": SIGNATURE})]
            }
            (None, None) => {
                let seed = record.tokens as u64;
                let text =
                    agents::text(agents::Text::Prose, seed, (spec.reply_tokens as f64 * spec.chars_per_token) as usize);
                vec![json!({"text": text})]
            }
        };
        (parts, usage)
    };
    record.outcome = Outcome::Answered;
    record.status = 200;
    record.output_tokens = usage.output;
    record.cache_read = usage.read;
    record.units = prompt.units;
    record.blocks = prompt.blocks;
    push(record);
    let finished = |parts: Vec<Value>, output: usize| {
        json!({"candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage_metadata(&usage, output), "modelVersion": model, "responseId": "sim"})
    };
    if !stream {
        return json_reply(200, &finished(parts, usage.output));
    }
    // Text streams in pieces; a function call comes whole, in the last chunk.
    let mut chunks: Vec<Value> = Vec::new();
    let last = match parts.first().and_then(|p| p["text"].as_str()) {
        Some(text) => {
            let pieces = deltas(text);
            let (last, first) = pieces.split_last().map_or((String::new(), &[][..]), |(l, f)| (l.clone(), f));
            for (k, piece) in first.iter().enumerate() {
                chunks.push(
                    json!({"candidates": [{"content": {"parts": [{"text": piece}], "role": "model"}, "index": 0}],
                    "usageMetadata": usage_metadata(&usage, k + 1), "modelVersion": model, "responseId": "sim"}),
                );
            }
            vec![json!({"text": last})]
        }
        None => parts,
    };
    chunks.push(finished(last, usage.output));
    if sse {
        return sse_reply(&chunks.iter().map(|c| format!("data: {c}\r\n\r\n")).collect::<Vec<_>>());
    }
    // Without alt=sse: one JSON array, sent a chunk at a time.
    let mut frames: Vec<String> =
        chunks.iter().enumerate().map(|(k, c)| format!("{}{c}", if k == 0 { "[" } else { ",\r\n" })).collect();
    frames.push("]".into());
    let mut reply = sse_reply(&frames);
    reply.headers_mut().insert("content-type", "application/json; charset=UTF-8".parse().expect("header"));
    reply
}
