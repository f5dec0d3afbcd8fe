//! A request compactor has no reason to touch, told from its bytes before anything else is done
//! for it: such a request goes upstream at once, and the request's own preparation (its parse,
//! session, count and decision) runs while the provider reads it (see `proxy::handle_traced`).
//!
//! The test is conservative; what it lets through, the preparation checks after the fact. Nothing
//! in compactor rewrites a conversation without tool calls or results except a compaction, and a
//! compaction needs a conversation near its window: so a small Chat Completions or Messages body
//! with no tool and no function anywhere in its bytes, far under its model's window, is sent as it
//! came. Where the preparation still decides otherwise (a window learned smaller than the table's
//! on another replica, an operator's compact request), the request that went ahead is dropped
//! before its answer is read and the prepared body is sent instead: a wasted request, never a
//! wrong answer.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::dialect::Dialect;
use crate::json;
#[cfg(test)]
use crate::tokens::models::ModelInfo;
use crate::tokens::models::ModelTable;

use crate::config::compaction::CompactionSettings;

/// The largest body sent ahead of its preparation. A token is at least a byte, so this bounds the
/// prompt's tokens too; larger bodies are rare among requests far from every threshold.
pub const MAX_BYTES: usize = 16 * 1024;

/// Byte strings whose presence means there may be something to decide: tool calls and results
/// (`tool_calls`, `tool_use`, `tool_result`, `"role":"tool"`, legacy `function_call`), and a
/// `\u` escape, which could spell any of them. Each starts with a different byte.
const SUSPECT: [&[u8]; 3] = [b"tool", b"function", b"\\u"];

/// Whether one of [`SUSPECT`] is in `body`: one pass over the places where one could start.
/// Called before the request goes out, so kept to a few lines of code and no tables.
fn suspect(body: &[u8]) -> bool {
    let [tool, function, escape] = SUSPECT;
    memchr::memchr3_iter(tool[0], function[0], escape[0], body).any(|at| {
        let rest = &body[at..];
        rest.starts_with(tool) || rest.starts_with(function) || rest.starts_with(escape)
    })
}

/// What the test knows beyond the body: the smallest window the model table gives any model, and
/// the smallest any session learned below its model's table entry (a provider's overflow said
/// so). Requests are sent ahead only far under the window that applies.
pub struct Quiet {
    smallest_table_window: u64,
    smallest_learned_window: AtomicU64,
}

impl Quiet {
    pub fn new(models: &ModelTable) -> Self {
        Self {
            smallest_table_window: u64::from(models.smallest_window()),
            smallest_learned_window: AtomicU64::new(u64::MAX),
        }
    }

    /// Notes the window a session's request works with, when it is below its model's table entry.
    pub fn note_window(&self, window: u64, table: u64) {
        if window < table {
            self.smallest_learned_window.fetch_min(window, Ordering::Relaxed);
        }
    }

    /// True when `body` can go upstream before its preparation: a Chat Completions or Messages
    /// request, uncompressed, a JSON object of at most [`MAX_BYTES`], with none of [`SUSPECT`] in
    /// it, whose tokens (at most its bytes), doubled, stay under the compaction budget of its
    /// model's window (or of the smallest learned) less the largest output reserve. A body under
    /// the budget of every window the process knows goes without its model being read.
    pub fn nothing_to_decide(
        &self,
        dialect: Dialect,
        body: &[u8],
        models: &ModelTable,
        settings: &CompactionSettings,
    ) -> bool {
        if !matches!(dialect, Dialect::ChatCompletions | Dialect::AnthropicMessages)
            || body.len() > MAX_BYTES
            || !body.trim_ascii_start().starts_with(b"{")
            || suspect(body)
        {
            return false;
        }
        let learned = self.smallest_learned_window.load(Ordering::Relaxed);
        if far_under(body.len(), self.smallest_table_window.min(learned), settings) {
            return true;
        }
        let Some(model) = top_level_model(body) else { return false };
        far_under(body.len(), u64::from(models.lookup(&model).context_window).min(learned), settings)
    }
}

/// Whether a body of `bytes`, doubled, stays under the compaction budget of `window` less the
/// largest output reserve.
fn far_under(bytes: usize, window: u64, settings: &CompactionSettings) -> bool {
    let budget = window.saturating_sub(u64::from(settings.output_reserve_tokens)) as f64 * settings.threshold;
    (bytes as f64) * 2.0 < budget
}

/// The top-level `model` of a JSON object body, read up to that key; `None` when the body does not
/// open as an object with one. A body malformed after it goes ahead and is forwarded as it came,
/// as its preparation (which cannot parse it) would have it.
fn top_level_model(body: &[u8]) -> Option<String> {
    let text = json::utf8(body).ok()?;
    let mut scan = json::Scanner::new(text, 0);
    if !scan.eat(b'{') {
        return None;
    }
    loop {
        let key = scan.key()?;
        if !scan.eat(b':') {
            return None;
        }
        let value = scan.raw()?;
        if key == "model" {
            return Some(json::as_str(value)?.into_owned());
        }
        if !scan.eat(b',') {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> CompactionSettings {
        crate::config::Config::default().compaction
    }

    fn nothing_to_decide(dialect: Dialect, body: &[u8], models: &ModelTable, settings: &CompactionSettings) -> bool {
        Quiet::new(models).nothing_to_decide(dialect, body, models, settings)
    }

    /// A table whose smallest window (`tiny`'s) leaves room for no body, so every test reads the
    /// body's model.
    fn with_a_tiny_model() -> ModelTable {
        let tiny = ModelInfo { context_window: 4_100, ..ModelTable::default().lookup("gpt-4o") };
        ModelTable::new(vec![("tiny".to_string(), tiny)])
    }

    const CHAT: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"Say hello."}],"max_tokens":16}"#;

    #[test]
    fn a_small_plain_chat_goes_ahead_and_anything_with_tools_does_not() {
        let models = ModelTable::default();
        assert!(nothing_to_decide(Dialect::ChatCompletions, CHAT.as_bytes(), &models, &settings()));
        assert!(nothing_to_decide(Dialect::AnthropicMessages, CHAT.as_bytes(), &models, &settings()));
        let with_tools = CHAT.replace(r#","max_tokens":16"#, r#","tools":[{"type":"function"}]"#);
        assert!(!nothing_to_decide(Dialect::ChatCompletions, with_tools.as_bytes(), &models, &settings()));
        let escaped = CHAT.replace("Say hello.", r"Say \u0068ello.");
        assert!(!nothing_to_decide(Dialect::ChatCompletions, escaped.as_bytes(), &models, &settings()));
        assert!(!nothing_to_decide(Dialect::Responses, CHAT.as_bytes(), &models, &settings()));
        assert!(!nothing_to_decide(Dialect::Gemini, CHAT.as_bytes(), &models, &settings()));
    }

    #[test]
    fn a_body_near_its_model_window_or_malformed_is_prepared_first() {
        let models = ModelTable::default();
        let large = CHAT.replace("Say hello.", &"word ".repeat(4_000));
        assert!(!nothing_to_decide(Dialect::ChatCompletions, large.as_bytes(), &models, &settings()), "over MAX_BYTES");
        // gpt-4-0613's window is 8,192 tokens: 4,000 bytes may come near its budget.
        let small_window = CHAT.replace("gpt-4o-mini", "gpt-4-0613").replace("Say hello.", &"word ".repeat(800));
        assert!(!nothing_to_decide(Dialect::ChatCompletions, small_window.as_bytes(), &models, &settings()));
        // A window learned below the table's, on any session of the process, holds the same body back.
        let quiet = Quiet::new(&models);
        quiet.note_window(200_000, 128_000);
        assert!(quiet.nothing_to_decide(Dialect::ChatCompletions, CHAT.as_bytes(), &models, &settings()));
        quiet.note_window(4_300, 128_000);
        assert!(!quiet.nothing_to_decide(Dialect::ChatCompletions, CHAT.as_bytes(), &models, &settings()));
        for broken in [r#"[1,2]"#, "not json"] {
            assert!(!nothing_to_decide(Dialect::ChatCompletions, broken.as_bytes(), &models, &settings()), "{broken}");
        }
    }

    #[test]
    fn where_some_model_has_a_small_window_the_body_s_own_model_decides() {
        let models = with_a_tiny_model();
        assert!(nothing_to_decide(Dialect::ChatCompletions, CHAT.as_bytes(), &models, &settings()));
        let tiny = CHAT.replace("gpt-4o-mini", "tiny");
        assert!(!nothing_to_decide(Dialect::ChatCompletions, tiny.as_bytes(), &models, &settings()));
        // Under the default table this body is too small to need its model read.
        let unread = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        assert!(nothing_to_decide(Dialect::ChatCompletions, unread.as_bytes(), &ModelTable::default(), &settings()));
        for broken in [unread, r#"{"max_tokens":1 "model":"gpt-4o"}"#, r#"{"model":1}"#, r#"{"model" "gpt-4o"}"#] {
            assert!(!nothing_to_decide(Dialect::ChatCompletions, broken.as_bytes(), &models, &settings()), "{broken}");
        }
    }
}
