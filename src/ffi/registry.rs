//! The `rocmforge` registry: the devices found at first use, in a fixed order
//! (RFCPU, then RFGPU0..N, then RFHYBRID when a GPU exists).

use super::abi::*;
use super::vtables::{DeviceEntry, REG_IFACE};
use once_cell::sync::Lazy;
use std::ffi::CString;
use std::ptr::null_mut;

/// One guid per device kind: `ggml_backend_is_rocmforge` accepts all of them.
pub static GUID_CPU: ggml_guid = *b"rocmforge-cpu\0\0\0";
pub static GUID_GPU: ggml_guid = *b"rocmforge-gpu\0\0\0";
pub static GUID_HYBRID: ggml_guid = *b"rocmforge-hyb\0\0\0";

pub fn is_our_guid(g: ggml_guid_t) -> bool {
    if g.is_null() {
        return false;
    }
    let g = unsafe { &*g };
    [&GUID_CPU, &GUID_GPU, &GUID_HYBRID]
        .iter()
        .any(|ours| *ours == g)
}

struct Registry {
    reg: ggml_backend_reg,
    devices: Vec<&'static DeviceEntry>,
}

unsafe impl Sync for Registry {}
unsafe impl Send for Registry {}

thread_local! {
    /// This thread is building the registry: a log line it writes may reach a host callback
    /// that calls back into the library, which must not wait for the build it is inside.
    static BUILDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Clears `BUILDING` when the build ends, also by a panic.
struct Building;
impl Drop for Building {
    fn drop(&mut self) {
        BUILDING.with(|b| b.set(false));
    }
}

/// The registry, or None for a call made from inside its own construction (re-entrant
/// initialisation would deadlock); such a call is told on stderr (logging could recurse).
fn registry() -> Option<&'static Registry> {
    if BUILDING.with(|b| b.get()) {
        eprintln!("rocmforge: called back while the registry is being built (from a log callback?); returning nothing");
        return None;
    }
    Some(*REGISTRY)
}

static REGISTRY: Lazy<&'static Registry> = Lazy::new(|| {
    BUILDING.with(|b| b.set(true));
    let _building = Building;
    let reg: &'static mut Registry = Box::leak(Box::new(Registry {
        reg: ggml_backend_reg {
            api_version: GGML_BACKEND_API_VERSION,
            iface: REG_IFACE,
            context: null_mut(),
        },
        devices: Vec::new(),
    }));
    let reg_ptr: ggml_backend_reg_t = &mut reg.reg;
    reg.devices.push(DeviceEntry::leak(
        Box::new(crate::cpu::CpuDevice::new()),
        reg_ptr,
        &GUID_CPU,
    ));
    // GPU discovery loads vendor libraries; whatever goes wrong there must cost only the GPUs.
    match std::panic::catch_unwind(crate::gpu::discover) {
        Ok(gpus) => {
            for g in gpus {
                reg.devices.push(DeviceEntry::leak(g, reg_ptr, &GUID_GPU));
            }
        }
        Err(_) => crate::log_error!("GPU discovery failed; continuing without GPU devices"),
    }
    crate::log_debug!("registry ready with {} device(s)", reg.devices.len());
    reg
});

/// NULL when called from inside the registry's construction.
pub fn reg_ptr() -> ggml_backend_reg_t {
    match registry() {
        Some(r) => &r.reg as *const ggml_backend_reg as *mut ggml_backend_reg,
        None => null_mut(),
    }
}

/// Empty when called from inside the registry's construction.
pub fn devices() -> &'static [&'static DeviceEntry] {
    registry().map_or(&[], |r| &r.devices)
}

/// RFCPU's entry; None only inside the registry's construction.
pub fn cpu_entry() -> Option<&'static DeviceEntry> {
    devices().first().copied()
}

struct Features {
    _strings: Vec<CString>,
    list: Vec<ggml_backend_feature>,
}
unsafe impl Sync for Features {}
unsafe impl Send for Features {}

static FEATURES: Lazy<Features> = Lazy::new(|| {
    let mut strings = Vec::new();
    let mut list = Vec::new();
    for (k, v) in crate::cpu::simd::features() {
        let (k, v) = (CString::new(k).unwrap(), CString::new(v).unwrap());
        list.push(ggml_backend_feature {
            name: k.as_ptr(),
            value: v.as_ptr(),
        });
        strings.push(k);
        strings.push(v);
    }
    list.push(ggml_backend_feature {
        name: std::ptr::null(),
        value: std::ptr::null(),
    });
    Features {
        _strings: strings,
        list,
    }
});

/// `ggml_backend_get_features`: name/value pairs, ending with a NULL name.
pub unsafe extern "C" fn get_features(_reg: ggml_backend_reg_t) -> *mut ggml_backend_feature {
    super::guard::guard("get_features", null_mut(), || {
        FEATURES.list.as_ptr() as *mut ggml_backend_feature
    })
}
