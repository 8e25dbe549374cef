//! No Rust panic may unwind into the host: every `extern "C"` entry runs its body through
//! `guard`, which turns a panic into an error value and a log line.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; on panic logs `what` and returns `on_panic`.
pub fn guard<T>(what: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(e) => {
            let msg = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            crate::log_error!("internal error in {what}: {msg}");
            on_panic
        }
    }
}
