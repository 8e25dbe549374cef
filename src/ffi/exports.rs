//! The library's exported C functions. cbindgen turns the doc comments here into
//! `include/ggml-rocmforge.h`. Every body runs under `guard`: no panic reaches the caller.

use super::abi::*;
use super::backend_vtable::{backend_of, new_backend};
use super::guard::guard;
use super::registry;
use super::vtables::backend_set_n_threads;
use std::ffi::{c_char, c_int};
use std::ptr::null_mut;

/// ggml's dynamic-loading entry point (`ggml_backend_load`, `GGML_BACKEND_PATH`).
#[no_mangle]
pub extern "C" fn ggml_backend_init() -> ggml_backend_reg_t {
    guard("ggml_backend_init", null_mut(), registry::reg_ptr)
}

/// ggml's dynamic-loading score: positive on every machine the library runs on.
#[no_mangle]
pub extern "C" fn ggml_backend_score() -> c_int {
    guard("ggml_backend_score", 0, || {
        10 + crate::cpu::simd::level() as c_int
    })
}

/// The rocmforge backend registry (name "rocmforge"). Its devices are RFCPU, then one
/// RFGPU<n> per GPU found, then RFHYBRID when a GPU exists. NULL only when called from
/// inside the registry's own construction (a host log callback calling back into it).
#[no_mangle]
pub extern "C" fn ggml_backend_rocmforge_reg() -> ggml_backend_reg_t {
    guard("ggml_backend_rocmforge_reg", null_mut(), registry::reg_ptr)
}

/// Creates a backend (stream) on the RFCPU device. Free it with ggml_backend_free().
/// Returns NULL (and logs why) on failure.
#[no_mangle]
pub extern "C" fn ggml_backend_rocmforge_cpu_init() -> ggml_backend_t {
    guard("ggml_backend_rocmforge_cpu_init", null_mut(), || {
        registry::cpu_entry().map_or(null_mut(), new_backend)
    })
}

/// The host-memory buffer type of the RFCPU device.
#[no_mangle]
pub extern "C" fn ggml_backend_rocmforge_cpu_buffer_type() -> ggml_backend_buffer_type_t {
    guard("ggml_backend_rocmforge_cpu_buffer_type", null_mut(), || {
        registry::cpu_entry().map_or(null_mut(), |e| e.buft_ptr())
    })
}

/// True when `backend` was created by rocmforge (any of its devices). NULL gives false.
///
/// # Safety
/// `backend` is NULL or a live ggml backend handle.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_is_rocmforge(backend: ggml_backend_t) -> bool {
    guard("ggml_backend_is_rocmforge", false, || unsafe {
        backend_of(backend).is_some()
    })
}

/// Number of rocmforge devices (RFCPU included).
#[no_mangle]
pub extern "C" fn ggml_backend_rocmforge_get_device_count() -> c_int {
    guard("ggml_backend_rocmforge_get_device_count", 0, || {
        registry::devices().len() as c_int
    })
}

/// Copies the description of device `device` (0-based, registry order) into `description`,
/// NUL-terminated and cut to `description_size` bytes. An unknown index gives "".
///
/// # Safety
/// `description` is NULL or writable for `description_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_get_device_description(
    device: c_int,
    description: *mut c_char,
    description_size: usize,
) {
    guard("ggml_backend_rocmforge_get_device_description", (), || {
        if description.is_null() || description_size == 0 {
            return;
        }
        let text = usize::try_from(device)
            .ok()
            .and_then(|i| registry::devices().get(i))
            .map(|e| e.imp.description().to_bytes().to_vec())
            .unwrap_or_default();
        let n = text.len().min(description_size - 1);
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), description.cast::<u8>(), n);
            *description.add(n) = 0;
        }
    })
}

/// Free and total memory of device `device` in bytes (0 and 0 for an unknown index).
/// Either pointer may be NULL.
///
/// # Safety
/// `free` and `total` are each NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_get_device_memory(
    device: c_int,
    free: *mut usize,
    total: *mut usize,
) {
    guard("ggml_backend_rocmforge_get_device_memory", (), || {
        let (f, t) = usize::try_from(device)
            .ok()
            .and_then(|i| registry::devices().get(i))
            .map(|e| e.imp.memory())
            .unwrap_or((0, 0));
        unsafe {
            if !free.is_null() {
                *free = f;
            }
            if !total.is_null() {
                *total = t;
            }
        }
    })
}

/// The row split (llama.cpp's `-sm row`): a buffer type whose weight matrices have their rows
/// spread over every GPU and whose MUL_MATs are computed by `main_device`, each GPU on its own
/// rows, the results gathered there. Also offered as "ggml_backend_split_buffer_type" through the
/// registry's get_proc_address (the name libllama asks for). `main_device` is the device's
/// index in the rocmforge registry (RFCPU is 0, RFGPU0 is 1, ...: what libllama passes);
/// `tensor_split` is NULL or one non-negative weight per GPU, RFGPU0 first (all zero: in
/// proportion to each GPU's free memory). The same arguments return the same buffer type.
/// Only MUL_MAT reads tensors of these buffers (other ops decline them). NULL where
/// `main_device` is not a GPU.
///
/// # Safety
/// `tensor_split` is NULL or points to at least as many floats as there are GPUs.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_split_buffer_type(
    main_device: c_int,
    tensor_split: *const f32,
) -> ggml_backend_buffer_type_t {
    unsafe { super::split::split_buffer_type(main_device, tensor_split) }
}

/// Sets the number of CPU threads a rocmforge backend uses (ignored for GPU backends and
/// for backends that are not rocmforge's). `n_threads` < 1 is treated as 1.
/// Also offered as "ggml_backend_set_n_threads" through the registry's get_proc_address.
///
/// # Safety
/// `backend` is NULL or a live ggml backend handle.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_set_n_threads(
    backend: ggml_backend_t,
    n_threads: c_int,
) {
    unsafe { backend_set_n_threads(backend, n_threads) }
}

/// Test hook for the ABI check (c_tests/test_abi.c): entry `index` of the table of sizes and
/// field offsets of rocmforge's mirrors of ggml's structs. Writes the struct name, the field
/// name ("" for the struct's size) and the value; returns false past the last entry.
///
/// # Safety
/// `what`, `field` and `value` are each NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_abi_layout(
    index: usize,
    what: *mut *const c_char,
    field: *mut *const c_char,
    value: *mut usize,
) -> bool {
    guard("ggml_backend_rocmforge_abi_layout", false, || {
        static TABLE: once_cell::sync::Lazy<Vec<(std::ffi::CString, std::ffi::CString, usize)>> =
            once_cell::sync::Lazy::new(|| {
                layout_table()
                    .into_iter()
                    .map(|e| {
                        (
                            std::ffi::CString::new(e.what).unwrap(),
                            std::ffi::CString::new(e.field).unwrap(),
                            e.value,
                        )
                    })
                    .collect()
            });
        let Some((w, f, v)) = TABLE.get(index) else {
            return false;
        };
        if what.is_null() || field.is_null() || value.is_null() {
            return false;
        }
        unsafe {
            *what = w.as_ptr();
            *field = f.as_ptr();
            *value = *v;
        }
        true
    })
}
