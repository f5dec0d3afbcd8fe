//! compactor: a context-managing reverse proxy for LLM agents.
//!
//! A request flows one way through named stages: route, read body, rewrite, forward, tap the
//! response, record. Each stage is a module of its own.

// No function over 80 lines (`too-many-lines-threshold` in clippy.toml): a long one is split into
// the steps it takes.
#![warn(clippy::too_many_lines)]

pub mod allocator;
pub mod boxed;
pub mod cloud;
pub mod compaction;
pub mod config;
pub mod conversation;
pub mod dialect;
pub mod error;
pub mod event_stream;
pub mod healthcheck;
pub mod hex;
pub mod inflight;
pub mod inspector;
pub mod json;
pub mod overflow;
pub mod proxy;
pub mod rewrite;
pub mod route;
pub mod server;
pub mod session;
pub mod sse;
pub mod telemetry;
pub mod tokens;
pub mod upstream;
pub mod usage;
pub mod work;
