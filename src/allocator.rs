//! The process's allocator (mimalloc) and the one setting compactor gives it: how soon freed
//! memory goes back to the system.
//!
//! mimalloc returns a thread's freed pages to the system only when that thread allocates or frees
//! again after the purge delay. A large request's parse is built and dropped on workers (and
//! blocking threads) that may then sit idle, and with the default delay its memory stays resident
//! for seconds after the request (`scripts/measure-memory BINARY 1` shows it; docs/limits.md).

// The only unsafe code in compactor: two calls into mimalloc's C API, which has no safe wrapper
// for its options. Both take plain integers, touch no Rust memory and may be called at any time.
#![allow(unsafe_code)]

use libmimalloc_sys as sys;

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (the binding names no constant for it);
/// the test below checks it against the environment variable of the same option.
const PURGE_DELAY: sys::mi_option_t = 15;

/// Sets mimalloc's purge delay (milliseconds; 0 gives freed pages back at once), unless the
/// operator set `MIMALLOC_PURGE_DELAY` in the environment, which wins.
pub fn set_purge_delay(millis: u64) {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    let millis = std::os::raw::c_long::try_from(millis).unwrap_or(std::os::raw::c_long::MAX);
    // SAFETY: mi_option_set stores an integer in mimalloc's option table; any value is valid.
    unsafe { sys::mi_option_set(PURGE_DELAY, millis) }
}

/// mimalloc's purge delay now (milliseconds).
pub fn purge_delay() -> std::os::raw::c_long {
    // SAFETY: mi_option_get reads an integer from mimalloc's option table.
    unsafe { sys::mi_option_get(PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    /// The option's index is right when the value mimalloc read from `MIMALLOC_PURGE_DELAY` is
    /// what [`super::purge_delay`] reads: run in a child process that has the variable set.
    #[test]
    fn the_purge_delay_option_is_the_one_the_environment_sets() {
        if let Some(expected) = std::env::var_os("COMPACTOR_TEST_PURGE_DELAY") {
            assert_eq!(super::purge_delay().to_string(), expected.to_string_lossy());
            return;
        }
        let this = std::env::current_exe().expect("the test binary's path");
        for delay in ["37", "0"] {
            let status = std::process::Command::new(&this)
                .args(["--exact", "allocator::tests::the_purge_delay_option_is_the_one_the_environment_sets"])
                .env("MIMALLOC_PURGE_DELAY", delay)
                .env("COMPACTOR_TEST_PURGE_DELAY", delay)
                .status()
                .expect("the test binary runs again");
            assert!(status.success(), "with MIMALLOC_PURGE_DELAY={delay}");
        }
    }
}
