//! The end-to-end suite: every test that runs the real compactor binary, in one test crate so the
//! binary and the library link once. Each module is one area of behaviour.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod adaptive;
mod agent_compaction;
mod azure;
mod background;
mod bypass;
mod cloud;
mod cloud_fronts;
mod compaction;
mod connections;
mod conversations;
mod count_tokens;
mod deadlines;
mod deploy;
mod docs;
mod faults;
mod fidelity;
mod gemini;
mod inspector;
mod inspector_browser;
mod local_defaults;
mod operations;
mod prompt_cache;
mod provider_sim;
mod proxy;
mod request_bodies;
mod responses;
mod rewrite_proxy;
mod sdk_e2e;
mod sent_ahead;
mod sessions;
mod shared_state;
mod stateful;
mod summaries;
mod tenants;
mod traces;
