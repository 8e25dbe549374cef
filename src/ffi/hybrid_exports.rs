//! RFHYBRID's exported C functions (also offered through the registry's get_proc_address):
//! strategy and GPU budget, telemetry as JSON, and every device's capabilities as JSON.

use super::abi::*;
use super::guard::guard;
use super::vtables::entries;
use crate::hybrid::capability::CapabilityProvider;
use crate::hybrid::device::{Shared, THE};
use crate::hybrid::ExecutionStrategy;
use std::ffi::{c_char, CStr};
use std::sync::Arc;

/// RFHYBRID's state when `dev` is the RFHYBRID device.
unsafe fn hybrid_of(dev: ggml_backend_dev_t) -> Option<&'static Arc<Shared>> {
    let e = entries().iter().find(|e| std::ptr::eq(e.dev_ptr(), dev))?;
    (e.imp.name() == c"RFHYBRID").then(|| THE.get()).flatten()
}

/// Copies `text` into `buf` (NUL-terminated, cut to `size` bytes); returns its full length.
unsafe fn write_out(text: &str, buf: *mut c_char, size: usize) -> usize {
    if !buf.is_null() && size > 0 {
        let n = text.len().min(size - 1);
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    text.len()
}

/// Sets how RFHYBRID places nodes: "auto" (by the cost model, the default), "gpu" (every node
/// the GPU supports), "cpu", "gpu-only" or "cpu-only" (one device; nodes it does not support
/// run on the other). Takes effect at each backend's next graph. Returns false (and logs why)
/// when `dev` is not RFHYBRID or the strategy is unknown. Same as ROCMFORGE_HYBRID_STRATEGY.
///
/// # Safety
/// `dev` is NULL or a ggml device handle; `strategy` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_hybrid_set_strategy(
    dev: ggml_backend_dev_t,
    strategy: *const c_char,
) -> bool {
    guard("ggml_backend_rocmforge_hybrid_set_strategy", false, || {
        let Some(h) = hybrid_of(dev) else {
            crate::log_error!("hybrid_set_strategy: not the RFHYBRID device");
            return false;
        };
        let s = if strategy.is_null() {
            None
        } else {
            CStr::from_ptr(strategy).to_str().ok()
        };
        match s.and_then(ExecutionStrategy::parse) {
            Some(st) => {
                h.set_strategy(st);
                true
            }
            None => {
                crate::log_error!(
                    "hybrid_set_strategy: unknown strategy {s:?} (auto, gpu, cpu, gpu-only, cpu-only)"
                );
                false
            }
        }
    })
}

/// Sets the GPU memory RFHYBRID may use, in bytes (resident weights, mirrored compute and KV
/// buffers, the staging arena); 0 keeps everything on the host. Takes effect at each backend's
/// next graph (data only the GPU holds is copied back first). Same as ROCMFORGE_HYBRID_VRAM.
/// Returns false when `dev` is not RFHYBRID.
///
/// # Safety
/// `dev` is NULL or a ggml device handle.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_hybrid_set_vram_budget(
    dev: ggml_backend_dev_t,
    bytes: usize,
) -> bool {
    guard(
        "ggml_backend_rocmforge_hybrid_set_vram_budget",
        false,
        || match hybrid_of(dev) {
            Some(h) => {
                h.set_budget(bytes);
                true
            }
            None => {
                crate::log_error!("hybrid_set_vram_budget: not the RFHYBRID device");
                false
            }
        },
    )
}

/// Turns RFHYBRID's telemetry on or off (on by ROCMFORGE_TELEMETRY / ROCMFORGE_TRACE too).
/// Returns false when `dev` is not RFHYBRID.
///
/// # Safety
/// `dev` is NULL or a ggml device handle.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_hybrid_set_telemetry(
    dev: ggml_backend_dev_t,
    on: bool,
) -> bool {
    guard(
        "ggml_backend_rocmforge_hybrid_set_telemetry",
        false,
        || match hybrid_of(dev) {
            Some(h) => {
                h.telemetry().set_enabled(on);
                true
            }
            None => false,
        },
    )
}

/// RFHYBRID's telemetry as JSON: `{"events":[{"graph","node","op","kind","device","reason",
/// "predicted_us","measured_us","bytes","start_us"}...],"stats":{...}}` (every event since
/// telemetry was turned on). Writes at most `size` bytes to `buf` (NUL-terminated; `buf` may be
/// NULL to ask for the length) and returns the JSON's full length in bytes; 0 when `dev` is not
/// RFHYBRID.
///
/// # Safety
/// `dev` is NULL or a ggml device handle; `buf` is NULL or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_hybrid_telemetry_json(
    dev: ggml_backend_dev_t,
    buf: *mut c_char,
    size: usize,
) -> usize {
    guard(
        "ggml_backend_rocmforge_hybrid_telemetry_json",
        0,
        || match hybrid_of(dev) {
            Some(h) => write_out(&h.telemetry().to_json(), buf, size),
            None => 0,
        },
    )
}

/// What each rocmforge device can run, as JSON: `{"devices":[{"name","ops":[{"op",
/// "weight_types","activation_types","kv_types","max_buffer_bytes","features"}...]}...]}`
/// (RFHYBRID supports the union of RFCPU and its GPU). Writes at most `size` bytes to `buf`
/// (NUL-terminated; NULL asks for the length); returns the full length in bytes.
///
/// # Safety
/// `buf` is NULL or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_capabilities_json(
    buf: *mut c_char,
    size: usize,
) -> usize {
    guard("ggml_backend_rocmforge_capabilities_json", 0, || {
        static JSON: once_cell::sync::OnceCell<String> = once_cell::sync::OnceCell::new();
        let json = JSON.get_or_init(|| {
            let devs: Vec<&dyn crate::device::Device> = entries().iter().map(|e| &*e.imp).collect();
            CapabilityProvider::to_json(&CapabilityProvider::collect(&devs))
        });
        write_out(json, buf, size)
    })
}
