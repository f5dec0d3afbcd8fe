//! Tests whose assertions are about time: doubling tests of every step over request content, and
//! the real binary's answer times and CPU under hostile input, a client that leaves and SIGTERM.
//! They share nothing with the other suites' parallel load: this crate runs on its own, and its
//! tests take the machine one at a time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Each async test runs on a runtime of its own thread, so holding the machine's lock across its
// awaits blocks nothing but the other timing tests, which is the point.
#![allow(clippy::await_holding_lock)]

#[path = "../common/mod.rs"]
mod common;

mod doubling;
mod hostile_input;
mod work;

use std::sync::{Mutex, MutexGuard};

/// Tests of one binary run in parallel; a timing test holds this for its whole run.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
