//! Prefill ahead, for a local inference server (the `local` cache preset). Such a server keeps
//! the KV cache of the prompt it served last and prefills a new prompt from its first changed
//! token, so the request that applies a prepared summary pays for prefilling the whole rebuilt
//! prompt (the summary and the recent turns): seconds on a small machine, 2x a plain turn
//! (docs/local-server.md). Once the record is ready and the agent's last request answered,
//! compactor sends that rebuilt prompt itself with a one-token answer, while the agent's tool
//! runs; the next request extends a prefix the server holds. The server's cache then no longer
//! holds the conversation as the client sent it, so the conversation's state says the record was
//! prefilled and the next request applies it whether or not it needs the room yet.

use std::sync::Arc;
use std::time::Duration;

use super::decision::PrefillOutcome;
use super::engine::Engine;
use super::request::RequestState;
use super::summarizer::Summarizer;
use crate::config::compaction::CompactionSettings;
use crate::dialect::Dialect;
use crate::rewrite::Rewriter;
use crate::session::{ConversationId, SessionCtx, SessionKey, Store};
use crate::telemetry::metric;
use crate::upstream::RequestHead;

/// How long a prefill waits, once the request before it is answered, for the agent's next
/// request: an agent that sends it at once leaves the server no idle time to prefill in (the
/// prefill would only go in front of that request), and one whose tool runs gives it seconds.
const GRACE: Duration = Duration::from_millis(200);

/// Conversations tracked for [`Arrivals`] at once (the least recently used go first).
const TRACKED_CONVERSATIONS: u64 = 10_000;

/// How many requests of each conversation arrived at this replica: a prefill started for one
/// request is dropped when another of its conversation arrived since (that request did not
/// apply the record, and the server would serve its prompt after evicting it for this one).
#[derive(Clone)]
pub(super) struct Arrivals(moka::sync::Cache<String, u64>);

impl Arrivals {
    pub fn new() -> Self {
        Self(
            moka::sync::Cache::builder()
                .max_capacity(TRACKED_CONVERSATIONS)
                .time_to_idle(Duration::from_secs(3_600))
                .build(),
        )
    }

    /// Counts a request of the conversation; its number.
    pub fn arrived(&self, key: &SessionKey, conversation: &ConversationId) -> u64 {
        let name = format!("{}/{conversation}", key.as_str());
        let count = self.0.get(&name).unwrap_or(0) + 1;
        self.0.insert(name, count);
        count
    }

    fn latest(&self, key: &SessionKey, conversation: &ConversationId) -> u64 {
        self.0.get(&format!("{}/{conversation}", key.as_str())).unwrap_or(0)
    }
}

/// Whether a request of `dialect` going to an upstream priced `preset` is one whose summaries are
/// prefilled ahead.
pub(super) fn applies(settings: &CompactionSettings, dialect: Dialect, preset: Option<&str>) -> bool {
    settings.prefill_ahead && dialect == Dialect::ChatCompletions && preset == Some("local")
}

/// The Chat body that makes a server prefill `rebuilt`'s prompt and answer with one token: the
/// same model, messages and tools (the prompt's tokens), not streamed, no log-probabilities.
/// `None` for a body that is not a Chat object with messages.
pub(super) fn body(rebuilt: &[u8]) -> Option<Vec<u8>> {
    let mut body: serde_json::Value = serde_json::from_slice(rebuilt).ok()?;
    let object = body.as_object_mut()?;
    object.get("messages")?.as_array()?;
    for key in ["stream_options", "max_completion_tokens", "n", "logprobs", "top_logprobs"] {
        object.remove(key);
    }
    object.insert("stream".into(), serde_json::Value::Bool(false));
    object.insert("max_tokens".into(), 1.into());
    serde_json::to_vec(&body).ok()
}

/// One prefill ahead for the conversation of the request whose answer it waits for; it runs with
/// that request's state carrying the prepared record (`state.record`).
pub(super) struct Prefill {
    pub head: RequestHead,
    pub store: Store,
    pub key: SessionKey,
    pub conversation: ConversationId,
    pub settings: Arc<CompactionSettings>,
    pub rewriter: Arc<Rewriter>,
    pub summarizer: Arc<Summarizer>,
    pub arrivals: Arrivals,
    /// The number [`Arrivals::arrived`] gave the request.
    pub arrival: u64,
}

impl Prefill {
    /// Rebuilds the body, says in the conversation's state that its record is prefilled, and
    /// sends it; nothing when another request of the conversation arrived first.
    pub async fn run(self, state: RequestState) {
        let outcome = self.send(&state).await;
        metric::prefill_ahead(outcome.label());
        tracing::debug!(
            session = %self.key.as_str(),
            conversation = %self.conversation,
            generation = state.compacted().unwrap_or(0),
            outcome = outcome.label(),
            "prefill ahead"
        );
    }

    async fn send(&self, state: &RequestState) -> PrefillOutcome {
        let Some(generation) = state.compacted() else { return PrefillOutcome::Failed };
        let moved_on = || self.arrivals.latest(&self.key, &self.conversation) != self.arrival;
        tokio::time::sleep(GRACE).await;
        if moved_on() {
            return PrefillOutcome::MovedOn;
        }
        let mut ctx = SessionCtx::load(self.store.clone(), self.key.clone(), self.conversation.clone()).await;
        let engine = Engine { settings: &self.settings, rewriter: &self.rewriter, summarizer: &self.summarizer };
        // As the request that applies it will derive it: everything after the summary is new.
        let Some((rebuilt, _)) = engine.derive(state, &ctx, &self.rewriter.settings, true).await else {
            return PrefillOutcome::Failed;
        };
        let Some(body) = body(&rebuilt) else { return PrefillOutcome::Failed };
        // Said before it is checked again: a request counted after the check reads its state
        // after this write and applies the record; one counted before it sends nothing ahead
        // (the flag left behind only makes a later request apply the record a little early).
        ctx.publish_prefilled(generation).await;
        if moved_on() {
            return PrefillOutcome::MovedOn;
        }
        match self.summarizer.prefill(&self.head, body).await {
            Ok(()) => PrefillOutcome::Sent,
            Err(_) => PrefillOutcome::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_body_keeps_the_prompt_and_asks_for_one_token_unstreamed() {
        let rebuilt = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":900,"n":2}"#;
        let body: serde_json::Value = serde_json::from_slice(&body(rebuilt).unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "stream": false,
                "max_tokens": 1
            })
        );
        assert_eq!(super::body(br#"{"contents":[]}"#), None, "not a Chat body");
    }

    #[test]
    fn a_request_of_the_conversation_after_the_one_counted_is_seen() {
        let arrivals = Arrivals::new();
        let key = SessionKey { key: "t.s".into(), source: crate::session::SessionSource::Header };
        let conversation = ConversationId::parse("00000000000000c1").unwrap();
        let first = arrivals.arrived(&key, &conversation);
        assert_eq!(arrivals.latest(&key, &conversation), first);
        arrivals.arrived(&key, &conversation);
        assert_ne!(arrivals.latest(&key, &conversation), first);
    }
}
