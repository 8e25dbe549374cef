//! ggml functions this library calls back into, found at run time in the host's libggml-base.
//!
//! We never link libggml-base: the library is loaded into a process that already has it
//! (an in-tree backend links it; ggml_backend_load runs inside it). Looking the symbols up
//! at run time keeps the build free of ggml and lets `cargo test` run without it.

use super::abi::*;
use once_cell::sync::Lazy;
use std::ffi::{c_void, CStr};

type BufferInitFn = unsafe extern "C" fn(
    ggml_backend_buffer_type_t,
    ggml_backend_buffer_i,
    *mut c_void,
    usize,
) -> ggml_backend_buffer_t;
type VersionFn = unsafe extern "C" fn() -> *const std::ffi::c_char;
type LogGetFn = unsafe extern "C" fn(*mut ggml_log_callback, *mut *mut c_void);

pub struct GgmlRuntime {
    pub buffer_init: Option<BufferInitFn>,
    pub log_get: Option<LogGetFn>,
    /// The host's `ggml_version()`; None where its ggml is not found (or has no such call).
    pub version: Option<String>,
}

unsafe fn lookup(name: &CStr) -> *mut c_void {
    let p = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
    if !p.is_null() {
        return p;
    }
    // A host may have opened libggml-base with RTLD_LOCAL; ask the already-loaded copy.
    for lib in [c"libggml-base.so", c"libggml-base.so.0", c"libggml.so"] {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if !h.is_null() {
            let p = libc::dlsym(h, name.as_ptr());
            libc::dlclose(h);
            if !p.is_null() {
                return p;
            }
        }
    }
    std::ptr::null_mut()
}

pub static GGML: Lazy<GgmlRuntime> = Lazy::new(|| unsafe {
    let bi = lookup(c"ggml_backend_buffer_init");
    let lg = lookup(c"ggml_log_get");
    let ver = lookup(c"ggml_version");
    let version = if ver.is_null() {
        None
    } else {
        let f = std::mem::transmute::<*mut c_void, VersionFn>(ver);
        let p = f();
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    };
    GgmlRuntime {
        buffer_init: if bi.is_null() {
            None
        } else {
            Some(std::mem::transmute::<*mut c_void, BufferInitFn>(bi))
        },
        log_get: if lg.is_null() {
            None
        } else {
            Some(std::mem::transmute::<*mut c_void, LogGetFn>(lg))
        },
        version,
    }
});
