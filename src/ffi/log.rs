//! Messages to the host go through ggml's own log callback (`ggml_log_get`), so a host that
//! redirects ggml's log (llama.cpp does) sees ours there too. Without ggml: stderr.

use super::abi::*;
use super::ggml_rt::GGML;
use std::ffi::{c_void, CString};

/// Debug lines reach the host only with ROCMFORGE_DEBUG set: ggml's default logger prints
/// every level, and hosts should not see our chatter.
static DEBUG: once_cell::sync::Lazy<bool> =
    once_cell::sync::Lazy::new(|| crate::tuning::get().debug);

/// Whether debug lines are wanted (to skip building them otherwise).
pub fn debug_enabled() -> bool {
    *DEBUG
}

pub fn log(level: ggml_log_level, msg: &str) {
    if level == GGML_LOG_LEVEL_DEBUG && !*DEBUG {
        return;
    }
    let text = format!("rocmforge: {msg}\n");
    if let Some(get) = GGML.log_get {
        let mut cb: ggml_log_callback = None;
        let mut ud: *mut c_void = std::ptr::null_mut();
        unsafe { get(&mut cb, &mut ud) };
        if let (Some(cb), Ok(c)) = (cb, CString::new(text.clone())) {
            unsafe { cb(level, c.as_ptr(), ud) };
            return;
        }
    }
    if level >= GGML_LOG_LEVEL_WARN || *DEBUG {
        eprint!("{text}");
    }
}

#[macro_export]
macro_rules! log_error { ($($a:tt)*) => { $crate::ffi::log::log($crate::ffi::abi::GGML_LOG_LEVEL_ERROR, &format!($($a)*)) } }
#[macro_export]
macro_rules! log_warn { ($($a:tt)*) => { $crate::ffi::log::log($crate::ffi::abi::GGML_LOG_LEVEL_WARN, &format!($($a)*)) } }
#[macro_export]
macro_rules! log_info { ($($a:tt)*) => { $crate::ffi::log::log($crate::ffi::abi::GGML_LOG_LEVEL_INFO, &format!($($a)*)) } }
#[macro_export]
macro_rules! log_debug { ($($a:tt)*) => { $crate::ffi::log::log($crate::ffi::abi::GGML_LOG_LEVEL_DEBUG, &format!($($a)*)) } }
