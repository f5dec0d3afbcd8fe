//! The window a local inference server states: asked once per (upstream, model) instead of
//! learned from the first overflow, which costs the agent a failed prefill and a summary on its
//! request path. Each server kind answers in its own place:
//! - llama.cpp's `llama-server`: `GET /props`, `default_generation_settings.n_ctx` (per slot);
//! - vLLM: `GET /v1/models`, the model's `max_model_len`;
//! - Ollama: `GET /api/ps`, the loaded model's `context_length`, else `POST /api/show`'s
//!   `num_ctx` parameter (Ollama cuts a longer prompt silently: its window matters most there).
//!
//! A server that answers none of them (llama-cpp-python's server says nothing of its window) is
//! left to what compactor learns from its answers, as before. The stated window is the model's
//! table window for the session ([`crate::session::state::Learned::stated`]): an overflow error
//! that names another still wins, and one that names none still lowers it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;

use crate::upstream::{RequestHead, Upstreams};

/// Longest one question may take: a local server answers these at once.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the first request of a model waits for the answer before it goes without it (the
/// questions go on, for the next request).
const FIRST_WAIT: Duration = Duration::from_millis(500);

/// After a server answered none of the questions: asked again no sooner than this (it may have
/// been restarted with another model), at most once in flight.
const RETRY_AFTER: Duration = Duration::from_secs(600);

/// Largest answer read (a `/props` carries the chat template).
const ANSWER_LIMIT: usize = 1 << 20;

/// Models asked about at most; past it nothing more is remembered (each is a few bytes).
const MAX_MODELS: usize = 4_096;

#[derive(Debug, Clone)]
enum Asked {
    /// The questions are out.
    Asking,
    Stated(u64),
    /// None answered, at this time.
    Unstated(Instant),
}

type Table = Arc<Mutex<HashMap<(&'static str, String), Asked>>>;

/// The windows local servers stated, per upstream (its API family: one configured URL each) and
/// model, for this process.
#[derive(Debug, Default)]
pub struct StatedWindows {
    asked: Table,
}

impl StatedWindows {
    /// The window the upstream of `head` states for `model`, asking it when nobody has yet: the
    /// first request waits up to [`FIRST_WAIT`] for the answer, every later one only reads it.
    pub async fn window(&self, upstreams: &Arc<Upstreams>, head: &RequestHead, model: &str) -> Option<u64> {
        let key = (head.route.family.label(), model.to_string());
        let answered = {
            let Ok(mut asked) = self.asked.lock() else { return None };
            match asked.get(&key) {
                Some(Asked::Stated(window)) => return Some(*window),
                Some(Asked::Asking) => return None,
                Some(Asked::Unstated(at)) if at.elapsed() < RETRY_AFTER => return None,
                None if asked.len() >= MAX_MODELS => return None,
                _ => {}
            }
            asked.insert(key.clone(), Asked::Asking);
            let (sender, answered) = tokio::sync::oneshot::channel();
            let (table, head, upstreams, model) =
                (self.asked.clone(), probe_head(head), upstreams.clone(), key.1.clone());
            tokio::spawn(async move {
                let told = ask(&upstreams, &head, &model).await;
                let entry = match told {
                    Told::Window(window) => {
                        tracing::info!(%model, window, "the local server states its window");
                        Some(Asked::Stated(window))
                    }
                    Told::Nothing => {
                        tracing::info!(%model, "the local server states no window: it is learned from its answers");
                        Some(Asked::Unstated(Instant::now()))
                    }
                    // One client's credential decides nothing for the others: the next request asks.
                    Told::Refused => None,
                };
                if let Ok(mut asked) = table.lock() {
                    match entry {
                        Some(entry) => asked.insert(key, entry),
                        None => asked.remove(&key),
                    };
                }
                let _ = sender.send(match told {
                    Told::Window(window) => Some(window),
                    _ => None,
                });
            });
            answered
        };
        tokio::time::timeout(FIRST_WAIT, answered).await.ok()?.ok()?
    }
}

/// The client's head for the questions: its credential and route, no body headers.
fn probe_head(head: &RequestHead) -> RequestHead {
    let mut headers = head.headers.clone();
    for name in [http::header::CONTENT_TYPE, http::header::CONTENT_LENGTH, http::header::CONTENT_ENCODING] {
        headers.remove(name);
    }
    RequestHead { route: head.route, method: http::Method::GET, uri: head.uri.clone(), headers, signed_body: None }
}

/// What the server said to the questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Window(u64),
    Nothing,
    /// A question was refused for the credential it carried (401, 403) and none stated a
    /// window: another client's credential may be answered, so nothing is recorded.
    Refused,
}

/// Reads a window out of a server's answer about the model.
type Reader = fn(&Value, &str) -> Option<u64>;

/// Asks each server kind in turn; the first window stated.
async fn ask(upstreams: &Upstreams, head: &RequestHead, model: &str) -> Told {
    let mut refused = false;
    let show = Bytes::from(serde_json::json!({"model": model}).to_string());
    let questions: [(&str, Option<Bytes>, Reader); 4] = [
        ("/props", None, |v, _| llama_cpp_window(v)),
        ("/v1/models", None, vllm_window),
        ("/api/ps", None, ollama_loaded_window),
        ("/api/show", Some(show), |v, _| ollama_shown_window(v)),
    ];
    for (path, body, read) in questions {
        match question(upstreams, head, path, body).await {
            Answer::Json(answer) => {
                if let Some(window) = read(&answer, model) {
                    return Told::Window(window);
                }
            }
            Answer::Refused => refused = true,
            Answer::Nothing => {}
        }
    }
    if refused { Told::Refused } else { Told::Nothing }
}

enum Answer {
    Json(Value),
    Refused,
    Nothing,
}

/// One question: its JSON answer; `Refused` for a 401 or 403; `Nothing` for anything else (an
/// error status, no JSON, no answer within [`ASK_TIMEOUT`]).
async fn question(upstreams: &Upstreams, head: &RequestHead, path: &str, body: Option<Bytes>) -> Answer {
    let mut asked = probe_head(head);
    let Ok(uri) = path.parse() else { return Answer::Nothing };
    asked.uri = uri;
    if body.is_some() {
        asked.method = http::Method::POST;
        asked.headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    }
    let call = upstreams.call(&asked, body.unwrap_or_default(), ANSWER_LIMIT);
    let Ok(Ok((status, answer))) = tokio::time::timeout(ASK_TIMEOUT, call).await else { return Answer::Nothing };
    if matches!(status.as_u16(), 401 | 403) {
        return Answer::Refused;
    }
    if !status.is_success() {
        return Answer::Nothing;
    }
    serde_json::from_slice(&answer).map_or(Answer::Nothing, Answer::Json)
}

/// A count that can be a window: positive and no more than any model has.
fn window_of(value: &Value) -> Option<u64> {
    value.as_u64().filter(|w| (256..=100_000_000).contains(w))
}

/// llama.cpp's `/props`: `default_generation_settings.n_ctx` (older builds: `n_ctx` at the top).
pub fn llama_cpp_window(props: &Value) -> Option<u64> {
    window_of(&props["default_generation_settings"]["n_ctx"]).or_else(|| window_of(&props["n_ctx"]))
}

/// vLLM's `/v1/models`: the `max_model_len` of the model asked for (by id or root), else of the
/// only model served.
pub fn vllm_window(models: &Value, model: &str) -> Option<u64> {
    let data = models["data"].as_array()?;
    let named = data.iter().find(|m| m["id"].as_str() == Some(model) || m["root"].as_str() == Some(model));
    let entry = named.or_else(|| (data.len() == 1).then(|| &data[0]))?;
    window_of(&entry["max_model_len"])
}

/// Ollama's `/api/ps`: the loaded model's `context_length` (what it runs with now).
pub fn ollama_loaded_window(loaded: &Value, model: &str) -> Option<u64> {
    let models = loaded["models"].as_array()?;
    let same = |m: &&Value| {
        let names = [m["name"].as_str(), m["model"].as_str()];
        names.iter().flatten().any(|n| *n == model || n.strip_suffix(":latest") == Some(model))
    };
    window_of(&models.iter().find(same)?["context_length"])
}

/// Ollama's `/api/show`: a `num_ctx` in the model's `parameters` text (one `name value` per
/// line). Its `model_info` context length is what the model was trained for, not what Ollama runs
/// it with (4096 by default on a small GPU): not taken.
pub fn ollama_shown_window(shown: &Value) -> Option<u64> {
    let parameters = shown["parameters"].as_str()?;
    parameters.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("num_ctx")).then(|| words.next()?.parse::<u64>().ok()).flatten()
    })
}
