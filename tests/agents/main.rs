//! The agents suite: the real agent CLIs (Claude Code, Codex CLI, OpenCode, Qwen Code, Gemini CLI,
//! pinned in `tests/agents/package-lock.json`, installed by `scripts/agents-install`) run a
//! scripted task against the provider simulator through the compactor binary, past the provider's
//! window.
//! A CLI that is not installed is skipped, unless `COMPACTOR_REQUIRE_AGENT_TESTS=1` (CI).
//!
//! `bench` holds the agents bench (`scripts/bench-agents`), ignored in normal runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod bench;
mod clis;
mod platforms;
mod scenario;
mod suite;
