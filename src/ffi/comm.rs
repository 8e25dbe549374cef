//! AllReduce for ggml's tensor-parallel meta device (`-sm tensor`): the three functions ggml
//! 0.26's meta backend looks up through the registry (`ggml_backend_comm_init`, `_free`,
//! `_allreduce_tensor`), exported under our prefix. The work is in gpu/backend/allreduce.rs.

use super::abi::*;
use super::backend_vtable::backend_of;
use super::guard::guard;
use crate::gpu::backend::allreduce::Comm;
use crate::gpu::backend::GpuBackend;
use crate::tensor::Tensor;
use std::ffi::c_void;
use std::ptr::null_mut;

/// What a comm context of ours points to: the backends it was made for, in order.
struct CommBox {
    backends: Vec<ggml_backend_t>,
    comm: Comm,
}

/// Our GPU backends behind `backends`, or None if one is not ours, not a GPU's, or repeated.
///
/// # Safety
/// Each handle is a live ggml backend, not used elsewhere while the references are.
unsafe fn gpu_backends<'a>(backends: &[ggml_backend_t]) -> Option<Vec<&'a mut GpuBackend>> {
    let mut out = Vec::with_capacity(backends.len());
    for (i, &b) in backends.iter().enumerate() {
        if backends[..i].contains(&b) {
            return None;
        }
        let g = backend_of(b)?
            .imp
            .as_any_mut()?
            .downcast_mut::<GpuBackend>()?;
        out.push(g);
    }
    Some(out)
}

/// Makes the AllReduce context of ggml's meta device for `n_backends` backends of our GPU
/// devices (2 to 8, one runtime). NULL (and a log line) for anything else: the meta device
/// then sums through its own copies and ADD graphs.
///
/// # Safety
/// `backends` is NULL or points to `n_backends` live ggml backend handles, which outlive the
/// context (ggml frees it first).
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_comm_init(
    backends: *mut ggml_backend_t,
    n_backends: usize,
) -> *mut c_void {
    guard("ggml_backend_rocmforge_comm_init", null_mut(), || {
        if backends.is_null() || n_backends == 0 {
            return null_mut();
        }
        let handles = std::slice::from_raw_parts(backends, n_backends).to_vec();
        let Some(gpus) = gpu_backends(&handles) else {
            crate::log_info!("comm_init: not all of the meta device's backends are rocmforge GPUs: ggml's own AllReduce is used");
            return null_mut();
        };
        match Comm::new(&gpus) {
            Ok(comm) => Box::into_raw(Box::new(CommBox {
                backends: handles,
                comm,
            })) as *mut c_void,
            Err(e) => {
                crate::log_info!("comm_init: {e}: ggml's own AllReduce is used");
                null_mut()
            }
        }
    })
}

/// Frees a context made by `ggml_backend_rocmforge_comm_init` (NULL: nothing).
///
/// # Safety
/// `comm` is NULL or such a context, not used after this; its backends are still live.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_comm_free(comm: *mut c_void) {
    guard("ggml_backend_rocmforge_comm_free", (), || {
        if !comm.is_null() {
            drop(Box::from_raw(comm as *mut CommBox));
        }
    })
}

/// Sums `tensors` (one per backend of the context, in its order: each GPU's partial result of
/// the same F32 tensor) in place, so that every GPU holds the total, queued on the backends'
/// streams. False where it does not take them (another type, no peer access between the GPUs,
/// ROCMFORGE_GPU_PEER=0): nothing was queued, and ggml's own AllReduce runs instead. A driver
/// error after work was queued makes each backend's next graph fail.
///
/// # Safety
/// `comm` is a context of `ggml_backend_rocmforge_comm_init`; `tensors` points to as many live
/// tensors as it has backends.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_rocmforge_comm_allreduce_tensor(
    comm: *mut c_void,
    tensors: *mut *mut ggml_tensor,
) -> bool {
    guard(
        "ggml_backend_rocmforge_comm_allreduce_tensor",
        false,
        || {
            let Some(cb) = (comm as *mut CommBox).as_mut() else {
                return false;
            };
            if tensors.is_null() {
                return false;
            }
            let ptrs = std::slice::from_raw_parts(tensors, cb.backends.len());
            let Some(ts) = ptrs
                .iter()
                .map(|&t| Tensor::from_ptr(t))
                .collect::<Option<Vec<_>>>()
            else {
                return false;
            };
            let Some(mut gpus) = gpu_backends(&cb.backends) else {
                return false;
            };
            match cb.comm.allreduce(&mut gpus, &ts) {
                Ok(taken) => taken,
                Err(e) => {
                    crate::log_error!("comm_allreduce_tensor: {e}");
                    true
                }
            }
        },
    )
}
