//! The summary read from the summarizer's answer, in each dialect, ending at its last complete
//! sentence when the answer stopped at its output cap.

use crate::dialect::Dialect;

/// The summary text of the summarizer's answer.
pub fn extract(dialect: Dialect, body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = match dialect {
        Dialect::ChatCompletions => value["choices"][0]["message"]["content"].as_str()?.to_string(),
        Dialect::AnthropicMessages => value["content"]
            .as_array()?
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Dialect::Responses => value["output"]
            .as_array()?
            .iter()
            .filter(|item| item["type"] == "message")
            .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
            .filter(|part| part["type"] == "output_text")
            .filter_map(|part| part["text"].as_str().map(str::to_string))
            .collect::<Vec<_>>()
            .join("\n"),
        // Thoughts are the model's reasoning, not the summary.
        Dialect::Gemini => value["candidates"][0]["content"]["parts"]
            .as_array()?
            .iter()
            .filter(|part| part["thought"] != true)
            .filter_map(|part| part["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
    };
    let text = text.trim();
    let text = if stopped_at_cap(dialect, &value) { complete_part(text) } else { text };
    (!text.is_empty()).then(|| text.to_string())
}

/// Whether the summarizer stopped because it reached its output cap, as each dialect says it.
fn stopped_at_cap(dialect: Dialect, value: &serde_json::Value) -> bool {
    match dialect {
        Dialect::ChatCompletions => value["choices"][0]["finish_reason"] == "length",
        Dialect::AnthropicMessages => value["stop_reason"] == "max_tokens",
        Dialect::Responses => {
            value["status"] == "incomplete" && value["incomplete_details"]["reason"] == "max_output_tokens"
        }
        Dialect::Gemini => value["candidates"][0]["finishReason"] == "MAX_TOKENS",
    }
}

/// A summary cut at its output cap, up to the end of its last complete line or sentence, when that
/// keeps at least half of it: the rebuilt conversation hands it to the model, and the next summary
/// reads it, and neither should continue a half sentence.
fn complete_part(text: &str) -> &str {
    if text.ends_with(['.', '!', '?']) {
        return text;
    }
    let mut end = text.rfind('\n').unwrap_or(0);
    for stop in [". ", "! ", "? ", ".\n", "!\n", "?\n"] {
        if let Some(at) = text.rfind(stop) {
            end = end.max(at + 1);
        }
    }
    if end > 0 && end >= text.len() / 2 { text[..end].trim_end() } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_summary_cut_at_its_output_cap_ends_at_its_last_complete_sentence_in_every_dialect() {
        let text = "The parser is done.\nThe codename is ZEPHYR-LANTERN-42. Next the lexer, whose tests";
        let kept = "The parser is done.\nThe codename is ZEPHYR-LANTERN-42.";
        let answers = [
            (
                Dialect::ChatCompletions,
                json!({"choices": [{"message": {"content": text}, "finish_reason": "length"}]}),
                json!({"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}),
            ),
            (
                Dialect::AnthropicMessages,
                json!({"content": [{"type": "text", "text": text}], "stop_reason": "max_tokens"}),
                json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}),
            ),
            (
                Dialect::Responses,
                json!({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]}),
                json!({"status": "completed", "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]}),
            ),
            (
                Dialect::Gemini,
                json!({"candidates": [{"content": {"parts": [{"text": text}]}, "finishReason": "MAX_TOKENS"}]}),
                json!({"candidates": [{"content": {"parts": [{"text": text}]}, "finishReason": "STOP"}]}),
            ),
        ];
        for (dialect, cut, finished) in answers {
            let read = |answer: &serde_json::Value| extract(dialect, &serde_json::to_vec(answer).unwrap());
            assert_eq!(read(&cut).as_deref(), Some(kept), "{dialect:?}");
            // An answer the model finished is kept whole, whatever its last words.
            assert_eq!(read(&finished).as_deref(), Some(text), "{dialect:?}");
        }
        // Nothing complete in its second half: kept as it came rather than lose most of it.
        assert_eq!(
            complete_part("Done. Then a long list of files that the agent read and changed"),
            "Done. Then a long list of files that the agent read and changed"
        );
        assert_eq!(complete_part("All tests pass."), "All tests pass.");
        assert_eq!(complete_part("x"), "x", "never emptied");
    }
}
