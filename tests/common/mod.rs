//! The one test support module: the fake upstream (and its strict and small-window behaviours),
//! the provider simulator and agent-shaped sessions, fakes of Bedrock and Vertex AI in front of
//! it, a real Redis, the compactor binary as a process, an HTTP client, request bodies, and
//! rewrite settings, and the scripted model real agent CLIs run against. Every test crate includes it.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod agents;
pub mod bodies;
pub mod client;
pub mod cloud;
pub mod fake;
pub mod process;
pub mod provider;
pub mod redis_server;
pub mod script;
pub mod settings;
pub mod strict;
pub mod window;

pub use bodies::*;
pub use client::*;
pub use fake::{Ending, FakeUpstream, Pacing, Received, Reply};
pub use process::*;
pub use settings::Settings;
