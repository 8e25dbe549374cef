//! The `rocmforge` registry: the devices found at first use, in a fixed order
//! (RFCPU, then RFGPU0..N, then RFHYBRID).

use super::abi::*;
use super::guard::guard;
use super::vtables::{
    backend_set_n_threads, entries, set_entries, DeviceEntry, GUID_CPU, GUID_GPU, GUID_HYBRID,
};
use once_cell::sync::Lazy;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::null_mut;

struct Registry {
    reg: ggml_backend_reg,
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
/// initialisation would deadlock; told on stderr, logging could recurse) or from a host whose
/// ggml is not the one built for (logged).
fn registry() -> Option<&'static Registry> {
    if BUILDING.with(|b| b.get()) {
        eprintln!("rocmforge: called back while the registry is being built (from a log callback?); returning nothing");
        return None;
    }
    if let Err(e) = &*HOST_GGML {
        // Once: a host log callback that calls back in must not loop.
        if !HOST_GGML_TOLD.swap(true, std::sync::atomic::Ordering::Relaxed) {
            crate::log_error!("{e}");
        }
        return None;
    }
    Some(*REGISTRY)
}

/// The host's ggml against the one this library mirrors: a different ggml numbers its ops and
/// lays out its structs differently, so the registry is not offered to it at all.
static HOST_GGML_TOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static HOST_GGML: Lazy<Result<(), String>> =
    Lazy::new(|| super::version::check_host_ggml(super::ggml_rt::GGML.version.as_deref()));

static REGISTRY: Lazy<&'static Registry> = Lazy::new(|| {
    BUILDING.with(|b| b.set(true));
    let _building = Building;
    let reg: &'static mut Registry = Box::leak(Box::new(Registry {
        reg: ggml_backend_reg {
            api_version: GGML_BACKEND_API_VERSION,
            iface: REG_IFACE,
            context: null_mut(),
        },
    }));
    let reg_ptr: ggml_backend_reg_t = &mut reg.reg;
    let cpu = DeviceEntry::leak(Box::new(crate::cpu::CpuDevice::new()), reg_ptr, &GUID_CPU);
    let mut devices = vec![cpu];
    // GPU discovery loads vendor libraries; whatever goes wrong there must cost only the GPUs.
    match std::panic::catch_unwind(crate::gpu::discover) {
        Ok(gpus) => {
            for g in gpus {
                devices.push(DeviceEntry::leak(g, reg_ptr, &GUID_GPU));
            }
        }
        Err(_) => crate::log_error!("GPU discovery failed; continuing without GPU devices"),
    }
    // RFHYBRID over RFCPU and the first GPU (or a stand-in for tests, or none).
    let gpu: Option<&'static dyn crate::device::Device> = if crate::tuning::get().hybrid_fake_gpu {
        Some(Box::leak(Box::new(crate::hybrid::fake::FakeGpu::new())))
    } else {
        devices.get(1).map(|e| &*e.imp)
    };
    let hybrid = crate::hybrid::device::HybridDevice::new(&*cpu.imp, gpu);
    devices.push(DeviceEntry::leak(Box::new(hybrid), reg_ptr, &GUID_HYBRID));
    let devices = set_entries(devices);
    crate::log_debug!("registry ready with {} device(s)", devices.len());
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
    match registry() {
        Some(_) => entries(),
        None => &[],
    }
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
    let versions = super::version::features();
    for (k, v) in versions.into_iter().chain(crate::cpu::simd::features()) {
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
pub extern "C" fn get_features(_reg: ggml_backend_reg_t) -> *mut ggml_backend_feature {
    guard("get_features", null_mut(), || {
        FEATURES.list.as_ptr() as *mut ggml_backend_feature
    })
}

/// The registry's vtable.
const REG_IFACE: ggml_backend_reg_i = ggml_backend_reg_i {
    get_name: Some(reg_get_name),
    get_device_count: Some(reg_get_device_count),
    get_device: Some(reg_get_device),
    get_proc_address: Some(reg_get_proc_address),
};

unsafe extern "C" fn reg_get_name(_reg: ggml_backend_reg_t) -> *const c_char {
    c"rocmforge".as_ptr()
}

unsafe extern "C" fn reg_get_device_count(_reg: ggml_backend_reg_t) -> usize {
    guard("reg_get_device_count", 0, || devices().len())
}

unsafe extern "C" fn reg_get_device(_reg: ggml_backend_reg_t, index: usize) -> ggml_backend_dev_t {
    guard("reg_get_device", null_mut(), || {
        match devices().get(index) {
            Some(e) => e.dev_ptr(),
            None => {
                log_error!("get_device: no device {index}");
                null_mut()
            }
        }
    })
}

unsafe extern "C" fn reg_get_proc_address(
    _reg: ggml_backend_reg_t,
    name: *const c_char,
) -> *mut c_void {
    guard("reg_get_proc_address", null_mut(), || {
        if name.is_null() {
            return null_mut();
        }
        match CStr::from_ptr(name).to_bytes() {
            b"ggml_backend_set_n_threads" => backend_set_n_threads as *mut c_void,
            b"ggml_backend_get_features" => get_features as *mut c_void,
            b"ggml_backend_split_buffer_type" | b"ggml_backend_rocmforge_split_buffer_type" => {
                super::exports::ggml_backend_rocmforge_split_buffer_type as *mut c_void
            }
            // ggml's meta device (-sm tensor) sums partial results through these.
            b"ggml_backend_comm_init" => {
                super::comm::ggml_backend_rocmforge_comm_init as *mut c_void
            }
            b"ggml_backend_comm_free" => {
                super::comm::ggml_backend_rocmforge_comm_free as *mut c_void
            }
            b"ggml_backend_comm_allreduce_tensor" => {
                super::comm::ggml_backend_rocmforge_comm_allreduce_tensor as *mut c_void
            }
            b"ggml_backend_dev_get_extra_bufts" => {
                super::vtables::dev_get_extra_bufts as *mut c_void
            }
            b"ggml_backend_rocmforge_hybrid_set_strategy" => {
                super::hybrid_exports::ggml_backend_rocmforge_hybrid_set_strategy as *mut c_void
            }
            b"ggml_backend_rocmforge_hybrid_set_vram_budget" => {
                super::hybrid_exports::ggml_backend_rocmforge_hybrid_set_vram_budget as *mut c_void
            }
            b"ggml_backend_rocmforge_hybrid_set_telemetry" => {
                super::hybrid_exports::ggml_backend_rocmforge_hybrid_set_telemetry as *mut c_void
            }
            b"ggml_backend_rocmforge_hybrid_telemetry_json" => {
                super::hybrid_exports::ggml_backend_rocmforge_hybrid_telemetry_json as *mut c_void
            }
            b"ggml_backend_rocmforge_capabilities_json" => {
                super::hybrid_exports::ggml_backend_rocmforge_capabilities_json as *mut c_void
            }
            _ => null_mut(),
        }
    })
}
