//! compactor in front of a real inference server: llama-cpp-python's OpenAI-compatible server
//! running SmolLM2-135M-Instruct with a 2,048-token window (`tests/local/server.rs`). What the
//! fake upstreams cannot show: a real tokenizer that is not o200k, a real overflow error, a real
//! model writing the summary, and a server that refuses malformed messages (an assistant message
//! whose content is null is a 500 there).
//!
//! Needs `scripts/local-server-venv` (`.venv-local`); skipped without it unless
//! `COMPACTOR_REQUIRE_LOCAL_TESTS=1` (CI). The tests take the server one at a time: two cores.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod agent_loop;
#[path = "../common/mod.rs"]
mod common;
mod server;

/// The tests share two cores with the server: one server at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
