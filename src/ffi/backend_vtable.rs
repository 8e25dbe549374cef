//! ggml's backend (stream) vtable over `crate::device::Backend`: the part of the vtables that
//! runs graphs and queues copies and events; the rest is in `vtables`.

use super::abi::*;
use super::guard::guard;
use super::vtables::*;
use crate::device::{Backend, Device, DeviceKind};
use crate::ggml_types::op;
use crate::tensor::Tensor;
use std::ffi::{c_char, c_void};
use std::ptr::null_mut;

// ---------------------------------------------------------------------------------------------
// Backend (stream)
// ---------------------------------------------------------------------------------------------

/// What a `ggml_backend_t` of ours points to; `c` comes first so the two addresses are equal.
#[repr(C)]
pub struct BackendBox {
    pub c: ggml_backend,
    pub entry: &'static DeviceEntry,
    pub imp: Box<dyn Backend>,
}

const BACKEND_IFACE: ggml_backend_i = ggml_backend_i {
    get_name: Some(backend_get_name),
    free: Some(backend_free),
    set_tensor_async: None,
    get_tensor_async: None,
    set_tensor_2d_async: None,
    get_tensor_2d_async: None,
    cpy_tensor_async: None,
    synchronize: Some(backend_synchronize),
    graph_plan_create: None,
    graph_plan_free: None,
    graph_plan_update: None,
    graph_plan_compute: None,
    graph_compute: Some(backend_graph_compute),
    event_record: None,
    event_wait: None,
    graph_optimize: None,
};

/// Backends of devices with `caps.async_`: copies queued on the stream, events.
const ASYNC_BACKEND_IFACE: ggml_backend_i = ggml_backend_i {
    set_tensor_async: Some(backend_set_tensor_async),
    get_tensor_async: Some(backend_get_tensor_async),
    cpy_tensor_async: Some(backend_cpy_tensor_async),
    event_record: Some(backend_event_record),
    event_wait: Some(backend_event_wait),
    graph_optimize: Some(backend_graph_optimize),
    ..BACKEND_IFACE
};

pub fn new_backend(e: &'static DeviceEntry) -> ggml_backend_t {
    match e.imp.new_backend() {
        Ok(imp) => {
            let b = Box::new(BackendBox {
                c: ggml_backend {
                    guid: e.guid as *const ggml_guid as *mut ggml_guid,
                    iface: if e.imp.caps().async_ {
                        ASYNC_BACKEND_IFACE
                    } else {
                        BACKEND_IFACE
                    },
                    device: e.dev_ptr(),
                    context: null_mut(),
                },
                entry: e,
                imp,
            });
            Box::into_raw(b) as ggml_backend_t
        }
        Err(err) => {
            log_error!(
                "{}: cannot create backend: {}",
                e.imp.name().to_string_lossy(),
                err
            );
            null_mut()
        }
    }
}

/// Our backend behind `backend`, or None for a foreign or NULL handle.
///
/// # Safety
/// `backend` is NULL or a live ggml backend handle, and no other reference to our backend
/// behind it is in use while the returned one is.
pub unsafe fn backend_of<'a>(backend: ggml_backend_t) -> Option<&'a mut BackendBox> {
    if backend.is_null() || !is_our_guid((*backend).guid) {
        return None;
    }
    (backend as *mut BackendBox).as_mut()
}

unsafe extern "C" fn backend_get_name(backend: ggml_backend_t) -> *const c_char {
    guard("backend_get_name", c"?".as_ptr(), || {
        match backend_of(backend) {
            Some(b) => b.imp.name().as_ptr(),
            None => c"?".as_ptr(),
        }
    })
}

unsafe extern "C" fn backend_free(backend: ggml_backend_t) {
    guard("backend_free", (), || {
        if backend_of(backend).is_some() {
            drop(Box::from_raw(backend as *mut BackendBox));
        }
    })
}

unsafe extern "C" fn backend_synchronize(backend: ggml_backend_t) {
    guard("backend_synchronize", (), || {
        if let Some(b) = backend_of(backend) {
            report(b.imp.synchronize(), "synchronize");
        }
    })
}

/// The buffer holding `t`'s data (a view's is its source's).
pub(super) unsafe fn tensor_buffer(t: *const ggml_tensor) -> ggml_backend_buffer_t {
    let Some(t) = t.as_ref() else {
        return null_mut();
    };
    match t.view_src.as_ref() {
        Some(v) => v.buffer,
        None => t.buffer,
    }
}

unsafe extern "C" fn backend_set_tensor_async(
    backend: ggml_backend_t,
    t: *mut ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    guard("set_tensor_async", (), || {
        let Some(b) = backend_of(backend) else { return };
        if size == 0 || t.is_null() || data.is_null() || (*t).data.is_null() {
            return;
        }
        let dst = ((*t).data as *mut u8).wrapping_add(offset);
        match b.imp.set_async(dst, data as *const u8, size) {
            Ok(true) => {}
            Ok(false) => {
                // Not this device's memory: what ggml does without set_tensor_async.
                report(b.imp.synchronize(), "synchronize");
                let buf = tensor_buffer(t);
                match buf.as_ref().and_then(|bb| bb.iface.set_tensor) {
                    Some(set) => set(buf, t, data, offset, size),
                    None => log_error!("set_tensor_async: tensor has no buffer"),
                }
            }
            Err(e) => log_error!("{}: set_tensor_async: {e}", b.imp.name().to_string_lossy()),
        }
    })
}

unsafe extern "C" fn backend_get_tensor_async(
    backend: ggml_backend_t,
    t: *const ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    guard("get_tensor_async", (), || {
        let Some(b) = backend_of(backend) else { return };
        if size == 0 || t.is_null() || data.is_null() || (*t).data.is_null() {
            return;
        }
        let src = ((*t).data as *const u8).wrapping_add(offset);
        match b.imp.get_async(data as *mut u8, src, size) {
            Ok(true) => {}
            Ok(false) => {
                report(b.imp.synchronize(), "synchronize");
                let buf = tensor_buffer(t);
                match buf.as_ref().and_then(|bb| bb.iface.get_tensor) {
                    Some(get) => get(buf, t, data, offset, size),
                    None => log_error!("get_tensor_async: tensor has no buffer"),
                }
            }
            Err(e) => log_error!("{}: get_tensor_async: {e}", b.imp.name().to_string_lossy()),
        }
    })
}

/// Copies between tensors in device memory of our GPU backends, queued on their streams;
/// false for anything else (ggml then synchronizes both backends and copies through the host).
unsafe extern "C" fn backend_cpy_tensor_async(
    backend_src: ggml_backend_t,
    backend_dst: ggml_backend_t,
    src: *const ggml_tensor,
    dst: *mut ggml_tensor,
) -> bool {
    guard("cpy_tensor_async", false, || {
        let (Some(s), Some(d)) = (Tensor::from_ptr(src), Tensor::from_ptr(dst)) else {
            return false;
        };
        let n = s.nbytes();
        if s.data().is_null() || d.data().is_null() || d.nbytes() != n {
            return false;
        }
        // Both in the default (device) buffer type of one of our devices.
        let in_device_memory = |t: *const ggml_tensor| {
            let buf = tensor_buffer(t);
            !buf.is_null()
                && entries().iter().any(|e| {
                    std::ptr::eq(e.buft_ptr(), (*buf).buft) && e.imp.kind() == DeviceKind::Gpu
                })
        };
        if !in_device_memory(src) || !in_device_memory(dst) {
            return false;
        }
        let Some(bd) = backend_of(backend_dst) else {
            return false;
        };
        let r = if std::ptr::eq(backend_src, backend_dst) {
            bd.imp.copy_device(None, d.data(), s.data(), n)
        } else {
            let Some(bs) = backend_of(backend_src) else {
                return false;
            };
            bd.imp
                .copy_device(Some(bs.imp.as_mut()), d.data(), s.data(), n)
        };
        r.unwrap_or_else(|e| {
            log_error!("cpy_tensor_async: {e}");
            false
        })
    })
}

unsafe extern "C" fn backend_event_record(backend: ggml_backend_t, event: ggml_backend_event_t) {
    guard("event_record", (), || {
        let (Some(b), Some(ev)) = (backend_of(backend), event_of(event)) else {
            log_error!("event_record: not a backend and event of this library");
            return;
        };
        match b.imp.record_event(ev) {
            Ok(true) => {}
            Ok(false) => log_error!(
                "event_record: {} has no events",
                b.imp.name().to_string_lossy()
            ),
            Err(e) => report(Err(e), "event_record"),
        }
    })
}

unsafe extern "C" fn backend_event_wait(backend: ggml_backend_t, event: ggml_backend_event_t) {
    guard("event_wait", (), || {
        let Some(b) = backend_of(backend) else { return };
        let Some(ev) = event_of(event) else {
            // Not ours: all we can do is wait on the host for everything queued here.
            log_warn!(
                "event_wait: foreign event; synchronizing {} instead",
                b.imp.name().to_string_lossy()
            );
            report(b.imp.synchronize(), "synchronize");
            return;
        };
        match b.imp.wait_event(ev) {
            Ok(true) => {}
            Err(err) => {
                // Another runtime's event: wait for it on the host instead.
                log_debug!("event_wait: {err}; waiting on the host");
                report(ev.synchronize(), "event_synchronize");
            }
            Ok(false) => report(ev.synchronize(), "event_synchronize"),
        }
    })
}

/// Before ggml allocates a graph: row-split products of one src1 are put one after another
/// (`gpu::split_order`); nothing else is reordered, and graphs without split weights not at all.
unsafe extern "C" fn backend_graph_optimize(
    backend: ggml_backend_t,
    cgraph: *mut ggml_cgraph,
    _params: *mut ggml_backend_graph_optimize_params,
) {
    guard("graph_optimize", (), || {
        if backend_of(backend).is_none() {
            return;
        }
        let Some(g) = cgraph.as_mut() else {
            return;
        };
        let n = g.n_nodes.max(0) as usize;
        if n == 0 || g.nodes.is_null() {
            return;
        }
        // SAFETY: ggml hands a graph of `n_nodes` valid nodes.
        let nodes = std::slice::from_raw_parts_mut(g.nodes, n);
        let moved = crate::gpu::split_order::group_split_products(nodes, |w| {
            w.src(0)
                .is_some_and(|s| super::split::split_tensor(&s).is_some())
        });
        if moved > 0 {
            log_debug!(
                "graph_optimize: {moved} row-split products moved next to their src1's first"
            );
        }
    })
}

unsafe extern "C" fn backend_graph_compute(
    backend: ggml_backend_t,
    cgraph: *mut ggml_cgraph,
) -> ggml_status {
    // Timed per kind of device: a host's graphs on RFCPU and on a GPU device apart.
    let what = match backend_of(backend).filter(|_| crate::tuning::get().ffi_timing) {
        Some(b) => match b.imp.name().to_bytes() {
            [b'R', b'F', b'H', ..] => "graph_compute RFHYBRID",
            [b'R', b'F', b'G', ..] => "graph_compute RFGPU",
            _ => "graph_compute RFCPU",
        },
        None => "graph_compute",
    };
    guard(what, GGML_STATUS_FAILED, || {
        let Some(b) = backend_of(backend) else {
            return GGML_STATUS_FAILED;
        };
        let Some(g) = cgraph.as_ref() else {
            log_error!("graph_compute: NULL graph");
            return GGML_STATUS_FAILED;
        };
        let n = g.n_nodes.max(0) as usize;
        if n > 0 && g.nodes.is_null() {
            log_error!("graph_compute: graph has no node array");
            return GGML_STATUS_FAILED;
        }
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let Some(t) = Tensor::from_ptr(*g.nodes.add(i)) else {
                log_error!("graph_compute: node {i} is NULL");
                return GGML_STATUS_FAILED;
            };
            if op::is_view(t.op()) || t.is_empty() || t.raw().flags & GGML_TENSOR_FLAG_COMPUTE == 0
            {
                continue;
            }
            nodes.push(t);
        }
        for t in &nodes {
            if let Some(e) = take_buffer_error(t) {
                log_error!(
                    "{}: graph_compute failed: node '{}' uses a buffer on which an earlier {e}",
                    b.imp.name().to_string_lossy(),
                    t.name()
                );
                return GGML_STATUS_FAILED;
            }
        }
        // A graph equal to the one computed last (every generated token) was checked when it
        // was first seen: the backend's walk of its key stands in for the per-node checks.
        if !b.imp.repeats_last(&nodes) {
            for t in &nodes {
                if let Err(msg) = check_node(b.entry.imp.as_ref(), t) {
                    // The node's index in the host's graph, for the message only.
                    let i = (0..n).find(|&i| *g.nodes.add(i) == t.as_ptr()).unwrap_or(n);
                    log_error!(
                        "{}: cannot compute node {} '{}': {}",
                        b.imp.name().to_string_lossy(),
                        i,
                        t.name(),
                        msg
                    );
                    return GGML_STATUS_FAILED;
                }
            }
        }
        match b.imp.compute(&nodes) {
            Ok(()) => GGML_STATUS_SUCCESS,
            Err(e) => {
                log_error!(
                    "{}: graph_compute failed: {}",
                    b.imp.name().to_string_lossy(),
                    e
                );
                match e {
                    crate::device::Error::Alloc(_) => GGML_STATUS_ALLOC_FAILED,
                    _ => GGML_STATUS_FAILED,
                }
            }
        }
    })
}

/// A node runs only if the device claims it and it and its sources have memory: every
/// tensor's elements inside the buffer holding it.
fn check_node(dev: &dyn Device, t: &Tensor) -> Result<(), String> {
    if !geometry_ok(t) || !dev.supports_op(t) {
        return Err(format!(
            "op {} on type {} is not supported",
            t.op(),
            t.raw().type_
        ));
    }
    if t.data().is_null() {
        return Err("output is not allocated".into());
    }
    // SAFETY (check_in_buffer): the node's buffer pointers come from the host's graph.
    unsafe { check_in_buffer(t) }.map_err(|e| format!("output: {e}"))?;
    let out = t.data_range()?;
    for i in 0..GGML_MAX_SRC {
        if let Some(s) = t.src(i) {
            if s.data().is_null() && !s.is_empty() {
                return Err(format!("source {i} '{}' is not allocated", s.name()));
            }
            unsafe { check_in_buffer(&s) }
                .map_err(|e| format!("source {i} '{}': {e}", s.name()))?;
            // In place (the output at the source's address, ggml's *_inplace ops) is fine;
            // a partial overlap has kernels copy between aliasing slices.
            let r = s.data_range()?;
            if r.0 != out.0 && r.0 < out.1 && out.0 < r.1 {
                return Err(format!(
                    "output overlaps source {i} '{}' at another address",
                    s.name()
                ));
            }
        }
    }
    Ok(())
}
