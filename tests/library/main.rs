//! The library-level suite: the rewrite policies and overflow detection called directly, without
//! the binary, in one test crate so the library links once. Each module is one area of behaviour.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;

mod overflow_fixtures;
mod rewrite_policies;
mod rewrite_properties;
