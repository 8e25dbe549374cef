//! No Rust panic may unwind into the host: every `extern "C"` entry runs its body through
//! `guard`, which turns a panic into an error value and a log line.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Calls and host seconds per entry point (`ROCMFORGE_FFI_TIMING=1`), printed at exit.
type EntryTimes = std::sync::Mutex<std::collections::HashMap<String, (u64, f64)>>;

/// ROCMFORGE_FFI_TIMING=1: the host time spent inside every entry point is added up per entry
/// and printed to stderr at exit, to see how much of a host's time per token is this library's
/// (an entry that waits, like synchronize, counts its wait).
fn entry_times() -> Option<&'static EntryTimes> {
    static T: once_cell::sync::OnceCell<Option<EntryTimes>> = once_cell::sync::OnceCell::new();
    T.get_or_init(|| {
        if !crate::tuning::get().ffi_timing {
            return None;
        }
        extern "C" fn report() {
            let Some(t) = entry_times() else { return };
            let map = t.lock().unwrap_or_else(|e| e.into_inner());
            let mut rows: Vec<_> = map.iter().collect();
            rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
            let mut out = String::from("rocmforge: host time inside entry points (ROCMFORGE_FFI_TIMING): calls, ms, µs a call\n");
            for (name, (n, secs)) in rows {
                out += &format!("  {name:32} {n:9} {:10.3} {:8.2}\n", secs * 1e3, secs * 1e6 / (*n).max(1) as f64);
            }
            eprint!("{out}");
        }
        // SAFETY: registering a function with no captured state to run at exit.
        unsafe { libc::atexit(report) };
        Some(Default::default())
    })
    .as_ref()
}

/// Runs `f`; on panic logs `what` and returns `on_panic`.
pub fn guard<T>(what: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    if let Some(times) = entry_times() {
        let t0 = std::time::Instant::now();
        let r = guarded(what, on_panic, f);
        let dt = t0.elapsed().as_secs_f64();
        let mut map = times.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.entry(what.to_string()).or_insert((0, 0.0));
        *e = (e.0 + 1, e.1 + dt);
        return r;
    }
    guarded(what, on_panic, f)
}

fn guarded<T>(what: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
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
