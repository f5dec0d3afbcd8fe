//! The library-level suite: the rewrite policies, agent-compaction markers and overflow detection
//! called directly, without the binary, in one test crate so the library links once. Each module
//! is one area of behaviour. (The linear-cost timing test stays a crate of its own: it needs the
//! cores to itself.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod agent_compaction;
mod caches;
mod layers;
mod overflow_fixtures;
mod prefix_reuse;
mod prompt_cache;
mod rewrite_policies;
mod rewrite_properties;
mod server_tools;
mod window_probe;
