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
        // Runs inside libc's exit: a panic here would unwind into C.
        extern "C" fn report() {
            let _ = catch_unwind(report_times);
        }
        fn report_times() {
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

/// When the last entry point returned (ROCMFORGE_FFI_TIMING=1): the host's own time between
/// two calls is added up under "(host) before <entry>", to see where a host loop spends the
/// time it is not in this library.
static LAST_EXIT: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// ROCMFORGE_FFI_TRACE=<file>: the last `TRACE_LEN` entry calls (start and length in µs from
/// the first, the entry) written to the file at exit, to see one host loop's calls in order.
const TRACE_LEN: usize = 16384;

struct Trace {
    t0: std::time::Instant,
    path: std::path::PathBuf,
    ring: Vec<(f64, f64, &'static str)>,
    next: usize,
}

fn trace() -> Option<&'static std::sync::Mutex<Trace>> {
    static T: once_cell::sync::OnceCell<Option<std::sync::Mutex<Trace>>> =
        once_cell::sync::OnceCell::new();
    T.get_or_init(|| {
        let path = crate::tuning::get().ffi_trace.clone()?;
        extern "C" fn write() {
            let _ = catch_unwind(write_trace);
        }
        fn write_trace() {
            let Some(t) = trace() else { return };
            let t = t.lock().unwrap_or_else(|e| e.into_inner());
            let n = t.ring.len();
            let mut out = String::from("# start_us length_us entry\n");
            for i in 0..n {
                let (s, d, what) = t.ring[(t.next + i) % n];
                out += &format!("{s:.1} {d:.1} {what}\n");
            }
            if let Err(e) = std::fs::write(&t.path, out) {
                eprintln!("rocmforge: ROCMFORGE_FFI_TRACE: {}: {e}", t.path.display());
            }
        }
        // SAFETY: registering a function with no captured state to run at exit.
        unsafe { libc::atexit(write) };
        Some(std::sync::Mutex::new(Trace {
            t0: std::time::Instant::now(),
            path,
            ring: Vec::with_capacity(TRACE_LEN),
            next: 0,
        }))
    })
    .as_ref()
}

fn traced(what: &'static str, t0: std::time::Instant, t1: std::time::Instant) {
    let Some(t) = trace() else { return };
    let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
    let e = (
        (t0 - t.t0).as_secs_f64() * 1e6,
        (t1 - t0).as_secs_f64() * 1e6,
        what,
    );
    if t.ring.len() < TRACE_LEN {
        t.ring.push(e);
    } else {
        let i = t.next;
        t.ring[i] = e;
        t.next = (i + 1) % TRACE_LEN;
    }
}

/// Runs `f`; on panic logs `what` and returns `on_panic`.
pub fn guard<T>(what: &'static str, on_panic: T, f: impl FnOnce() -> T) -> T {
    if let Some(times) = entry_times() {
        let t0 = std::time::Instant::now();
        let gap = LAST_EXIT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .map(|t| (t0 - t).as_secs_f64());
        let r = guarded(what, on_panic, f);
        let t1 = std::time::Instant::now();
        let dt = (t1 - t0).as_secs_f64();
        let mut map = times.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.entry(what.to_string()).or_insert((0, 0.0));
        *e = (e.0 + 1, e.1 + dt);
        // Gaps over a second are the host loading or waiting for input, not its loop.
        if let Some(g) = gap.filter(|&g| g < 1.0) {
            let e = map
                .entry(format!("(host) before {what}"))
                .or_insert((0, 0.0));
            *e = (e.0 + 1, e.1 + g);
        }
        drop(map);
        traced(what, t0, t1);
        *LAST_EXIT.lock().unwrap_or_else(|e| e.into_inner()) = Some(t1);
        return r;
    }
    guarded(what, on_panic, f)
}

fn guarded<T>(what: &'static str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(e) => {
            // Logging goes through the host's callback and allocates: it may panic too, and
            // that must not unwind into C either (then a fixed line goes to stderr).
            let logged = catch_unwind(AssertUnwindSafe(|| {
                let msg = e
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| e.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                crate::log_error!("internal error in {what}: {msg}");
            }));
            if logged.is_err() {
                let line = b"rocmforge: internal error (a panic while logging a panic)\n";
                // SAFETY: writing a static buffer to fd 2.
                unsafe { libc::write(2, line.as_ptr() as *const libc::c_void, line.len()) };
            }
            // The payload's own drop may panic as well.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(e)));
            on_panic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload whose drop panics: the guard still returns its value.
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                panic!("bomb");
            }
        }
    }

    #[test]
    fn panic_payload_that_panics_on_drop_is_contained() {
        let r = guard("test", 7, || -> i32 { std::panic::panic_any(Bomb) });
        assert_eq!(r, 7);
    }

    #[test]
    fn plain_panic_returns_the_error_value() {
        assert_eq!(guard("test", -1, || -> i32 { panic!("x") }), -1);
    }
}
