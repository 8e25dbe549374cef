//! Mirror of the parts of ggml's C ABI (ggml 0.26.0, backend API version 3) that a backend touches.
//!
//! Every struct here is checked against the real headers by `c_tests/test_abi.c`
//! (sizes and field offsets, printed by `rocmforge_abi_layout` below).
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

pub const GGML_BACKEND_API_VERSION: c_int = 3;
pub const GGML_MAX_DIMS: usize = 4;
pub const GGML_MAX_SRC: usize = 10;
pub const GGML_MAX_OP_PARAMS: usize = 64;
pub const GGML_MAX_NAME: usize = 64;

pub type ggml_status = c_int;
pub const GGML_STATUS_ALLOC_FAILED: ggml_status = -2;
pub const GGML_STATUS_FAILED: ggml_status = -1;
pub const GGML_STATUS_SUCCESS: ggml_status = 0;
pub const GGML_STATUS_ABORTED: ggml_status = 1;

pub type ggml_log_level = c_int;
pub const GGML_LOG_LEVEL_DEBUG: ggml_log_level = 1;
pub const GGML_LOG_LEVEL_INFO: ggml_log_level = 2;
pub const GGML_LOG_LEVEL_WARN: ggml_log_level = 3;
pub const GGML_LOG_LEVEL_ERROR: ggml_log_level = 4;
pub type ggml_log_callback =
    Option<unsafe extern "C" fn(ggml_log_level, *const c_char, *mut c_void)>;

pub const GGML_TENSOR_FLAG_COMPUTE: i32 = 16;

pub type ggml_backend_dev_type = c_int;
pub const GGML_BACKEND_DEVICE_TYPE_CPU: ggml_backend_dev_type = 0;
pub const GGML_BACKEND_DEVICE_TYPE_GPU: ggml_backend_dev_type = 1;

pub type ggml_backend_buffer_usage = c_int;

#[repr(C)]
pub struct ggml_tensor {
    pub type_: c_int,
    pub buffer: *mut ggml_backend_buffer,
    pub ne: [i64; GGML_MAX_DIMS],
    pub nb: [usize; GGML_MAX_DIMS],
    pub op: c_int,
    pub op_params: [i32; GGML_MAX_OP_PARAMS / 4],
    pub flags: i32,
    pub src: [*mut ggml_tensor; GGML_MAX_SRC],
    pub view_src: *mut ggml_tensor,
    pub view_offs: usize,
    pub data: *mut c_void,
    pub name: [c_char; GGML_MAX_NAME],
    pub extra: *mut c_void,
    pub padding: [c_char; 8],
}

/// `struct ggml_hash_set` (ggml-impl.h), only mirrored to keep `ggml_cgraph`'s layout.
#[repr(C)]
pub struct ggml_hash_set {
    pub size: usize,
    pub used: *mut u32,
    pub keys: *mut *mut ggml_tensor,
}

/// `struct ggml_cgraph` (ggml-impl.h). Backends only read `n_nodes` and `nodes`.
#[repr(C)]
pub struct ggml_cgraph {
    pub size: c_int,
    pub n_nodes: c_int,
    pub n_leafs: c_int,
    pub nodes: *mut *mut ggml_tensor,
    pub grads: *mut *mut ggml_tensor,
    pub grad_accs: *mut *mut ggml_tensor,
    pub leafs: *mut *mut ggml_tensor,
    pub use_counts: *mut i32,
    pub visited_hash_set: ggml_hash_set,
    pub order: c_int,
    pub uid: u64,
}

pub type ggml_guid = [u8; 16];
pub type ggml_guid_t = *mut ggml_guid;

// Opaque handle aliases with ggml's names; cbindgen leaves them to ggml-backend.h.
pub type ggml_backend_t = *mut ggml_backend;
pub type ggml_backend_reg_t = *mut ggml_backend_reg;
pub type ggml_backend_dev_t = *mut ggml_backend_device;
pub type ggml_backend_buffer_type_t = *mut ggml_backend_buffer_type;
pub type ggml_backend_buffer_t = *mut ggml_backend_buffer;
pub type ggml_backend_event_t = *mut ggml_backend_event;
pub type ggml_backend_graph_plan_t = *mut c_void;

#[repr(C)]
pub struct ggml_backend_buffer_type_i {
    pub get_name: Option<unsafe extern "C" fn(ggml_backend_buffer_type_t) -> *const c_char>,
    pub alloc_buffer:
        Option<unsafe extern "C" fn(ggml_backend_buffer_type_t, usize) -> ggml_backend_buffer_t>,
    pub alloc_buffer_n: Option<
        unsafe extern "C" fn(
            ggml_backend_buffer_type_t,
            *mut *mut ggml_tensor,
            c_int,
        ) -> ggml_backend_buffer_t,
    >,
    pub get_alignment: Option<unsafe extern "C" fn(ggml_backend_buffer_type_t) -> usize>,
    pub get_max_size: Option<unsafe extern "C" fn(ggml_backend_buffer_type_t) -> usize>,
    pub get_alloc_size:
        Option<unsafe extern "C" fn(ggml_backend_buffer_type_t, *const ggml_tensor) -> usize>,
    pub get_alloc_size_n: Option<
        unsafe extern "C" fn(ggml_backend_buffer_type_t, *mut *mut ggml_tensor, c_int) -> usize,
    >,
    pub is_host: Option<unsafe extern "C" fn(ggml_backend_buffer_type_t) -> bool>,
}

#[repr(C)]
pub struct ggml_backend_buffer_type {
    pub iface: ggml_backend_buffer_type_i,
    pub device: ggml_backend_dev_t,
    pub context: *mut c_void,
}

#[repr(C)]
pub struct ggml_backend_buffer_i {
    pub free_buffer: Option<unsafe extern "C" fn(ggml_backend_buffer_t)>,
    pub get_base: Option<unsafe extern "C" fn(ggml_backend_buffer_t) -> *mut c_void>,
    pub init_tensor:
        Option<unsafe extern "C" fn(ggml_backend_buffer_t, *mut ggml_tensor) -> ggml_status>,
    pub memset_tensor:
        Option<unsafe extern "C" fn(ggml_backend_buffer_t, *mut ggml_tensor, u8, usize, usize)>,
    pub set_tensor: Option<
        unsafe extern "C" fn(ggml_backend_buffer_t, *mut ggml_tensor, *const c_void, usize, usize),
    >,
    pub get_tensor: Option<
        unsafe extern "C" fn(ggml_backend_buffer_t, *const ggml_tensor, *mut c_void, usize, usize),
    >,
    pub set_tensor_2d: Option<
        unsafe extern "C" fn(
            ggml_backend_buffer_t,
            *mut ggml_tensor,
            *const c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    pub get_tensor_2d: Option<
        unsafe extern "C" fn(
            ggml_backend_buffer_t,
            *const ggml_tensor,
            *mut c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    pub cpy_tensor: Option<
        unsafe extern "C" fn(ggml_backend_buffer_t, *const ggml_tensor, *mut ggml_tensor) -> bool,
    >,
    pub clear: Option<unsafe extern "C" fn(ggml_backend_buffer_t, u8)>,
    pub reset: Option<unsafe extern "C" fn(ggml_backend_buffer_t)>,
}

#[repr(C)]
pub struct ggml_backend_buffer {
    pub iface: ggml_backend_buffer_i,
    pub buft: ggml_backend_buffer_type_t,
    pub context: *mut c_void,
    pub size: usize,
    pub usage: ggml_backend_buffer_usage,
}

#[repr(C)]
pub struct ggml_backend_graph_optimize_params {
    pub add_alloc_dep:
        Option<unsafe extern "C" fn(*mut c_void, *mut ggml_tensor, *mut ggml_tensor)>,
    pub user_data: *mut c_void,
}

#[repr(C)]
pub struct ggml_backend_i {
    pub get_name: Option<unsafe extern "C" fn(ggml_backend_t) -> *const c_char>,
    pub free: Option<unsafe extern "C" fn(ggml_backend_t)>,
    pub set_tensor_async:
        Option<unsafe extern "C" fn(ggml_backend_t, *mut ggml_tensor, *const c_void, usize, usize)>,
    pub get_tensor_async:
        Option<unsafe extern "C" fn(ggml_backend_t, *const ggml_tensor, *mut c_void, usize, usize)>,
    pub set_tensor_2d_async: Option<
        unsafe extern "C" fn(
            ggml_backend_t,
            *mut ggml_tensor,
            *const c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    pub get_tensor_2d_async: Option<
        unsafe extern "C" fn(
            ggml_backend_t,
            *const ggml_tensor,
            *mut c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    pub cpy_tensor_async: Option<
        unsafe extern "C" fn(
            ggml_backend_t,
            ggml_backend_t,
            *const ggml_tensor,
            *mut ggml_tensor,
        ) -> bool,
    >,
    pub synchronize: Option<unsafe extern "C" fn(ggml_backend_t)>,
    pub graph_plan_create: Option<
        unsafe extern "C" fn(ggml_backend_t, *const ggml_cgraph) -> ggml_backend_graph_plan_t,
    >,
    pub graph_plan_free: Option<unsafe extern "C" fn(ggml_backend_t, ggml_backend_graph_plan_t)>,
    pub graph_plan_update:
        Option<unsafe extern "C" fn(ggml_backend_t, ggml_backend_graph_plan_t, *const ggml_cgraph)>,
    pub graph_plan_compute:
        Option<unsafe extern "C" fn(ggml_backend_t, ggml_backend_graph_plan_t) -> ggml_status>,
    pub graph_compute:
        Option<unsafe extern "C" fn(ggml_backend_t, *mut ggml_cgraph) -> ggml_status>,
    pub event_record: Option<unsafe extern "C" fn(ggml_backend_t, ggml_backend_event_t)>,
    pub event_wait: Option<unsafe extern "C" fn(ggml_backend_t, ggml_backend_event_t)>,
    pub graph_optimize: Option<
        unsafe extern "C" fn(
            ggml_backend_t,
            *mut ggml_cgraph,
            *mut ggml_backend_graph_optimize_params,
        ),
    >,
}

#[repr(C)]
pub struct ggml_backend {
    pub guid: ggml_guid_t,
    pub iface: ggml_backend_i,
    pub device: ggml_backend_dev_t,
    pub context: *mut c_void,
}

#[repr(C)]
pub struct ggml_backend_event {
    pub device: ggml_backend_dev_t,
    pub context: *mut c_void,
}

#[repr(C)]
pub struct ggml_backend_dev_caps {
    pub async_: bool,
    pub host_buffer: bool,
    pub buffer_from_host_ptr: bool,
    pub events: bool,
    pub mmap_support: bool,
}

#[repr(C)]
pub struct ggml_backend_dev_props {
    pub name: *const c_char,
    pub description: *const c_char,
    pub memory_free: usize,
    pub memory_total: usize,
    pub type_: ggml_backend_dev_type,
    pub device_id: *const c_char,
    pub caps: ggml_backend_dev_caps,
}

#[repr(C)]
pub struct ggml_backend_device_i {
    pub get_name: Option<unsafe extern "C" fn(ggml_backend_dev_t) -> *const c_char>,
    pub get_description: Option<unsafe extern "C" fn(ggml_backend_dev_t) -> *const c_char>,
    pub get_memory: Option<unsafe extern "C" fn(ggml_backend_dev_t, *mut usize, *mut usize)>,
    pub get_type: Option<unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_dev_type>,
    pub get_props: Option<unsafe extern "C" fn(ggml_backend_dev_t, *mut ggml_backend_dev_props)>,
    pub init_backend:
        Option<unsafe extern "C" fn(ggml_backend_dev_t, *const c_char) -> ggml_backend_t>,
    pub get_buffer_type:
        Option<unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_buffer_type_t>,
    pub get_host_buffer_type:
        Option<unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_buffer_type_t>,
    pub buffer_from_host_ptr: Option<
        unsafe extern "C" fn(
            ggml_backend_dev_t,
            *mut c_void,
            usize,
            usize,
        ) -> ggml_backend_buffer_t,
    >,
    pub supports_op: Option<unsafe extern "C" fn(ggml_backend_dev_t, *const ggml_tensor) -> bool>,
    pub supports_buft:
        Option<unsafe extern "C" fn(ggml_backend_dev_t, ggml_backend_buffer_type_t) -> bool>,
    pub offload_op: Option<unsafe extern "C" fn(ggml_backend_dev_t, *const ggml_tensor) -> bool>,
    pub event_new: Option<unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_event_t>,
    pub event_free: Option<unsafe extern "C" fn(ggml_backend_dev_t, ggml_backend_event_t)>,
    pub event_synchronize: Option<unsafe extern "C" fn(ggml_backend_dev_t, ggml_backend_event_t)>,
}

#[repr(C)]
pub struct ggml_backend_device {
    pub iface: ggml_backend_device_i,
    pub reg: ggml_backend_reg_t,
    pub context: *mut c_void,
}

#[repr(C)]
pub struct ggml_backend_reg_i {
    pub get_name: Option<unsafe extern "C" fn(ggml_backend_reg_t) -> *const c_char>,
    pub get_device_count: Option<unsafe extern "C" fn(ggml_backend_reg_t) -> usize>,
    pub get_device: Option<unsafe extern "C" fn(ggml_backend_reg_t, usize) -> ggml_backend_dev_t>,
    pub get_proc_address:
        Option<unsafe extern "C" fn(ggml_backend_reg_t, *const c_char) -> *mut c_void>,
}

#[repr(C)]
pub struct ggml_backend_reg {
    pub api_version: c_int,
    pub iface: ggml_backend_reg_i,
    pub context: *mut c_void,
}

/// `struct ggml_backend_feature` (ggml-backend.h): a name/value pair, list ends with a NULL name.
#[repr(C)]
pub struct ggml_backend_feature {
    pub name: *const c_char,
    pub value: *const c_char,
}

// The handles are shared between ggml's threads; the data behind them is ours to guard.
unsafe impl Sync for ggml_backend_reg {}
unsafe impl Send for ggml_backend_reg {}
unsafe impl Sync for ggml_backend_device {}
unsafe impl Send for ggml_backend_device {}
unsafe impl Sync for ggml_backend_buffer_type {}
unsafe impl Send for ggml_backend_buffer_type {}

/// One line of the layout report: struct, field ("" for the struct itself), offset or size.
pub struct LayoutEntry {
    pub what: &'static str,
    pub field: &'static str,
    pub value: usize,
}

macro_rules! layout {
    ($($ty:ident { $($field:ident),* }),* $(,)?) => {
        /// Sizes and field offsets of every mirrored struct, for the ABI test.
        pub fn layout_table() -> Vec<LayoutEntry> {
            let mut v = Vec::new();
            $(
                v.push(LayoutEntry { what: stringify!($ty), field: "", value: std::mem::size_of::<$ty>() });
                $( v.push(LayoutEntry { what: stringify!($ty), field: stringify!($field), value: std::mem::offset_of!($ty, $field) }); )*
            )*
            v
        }
    };
}

layout! {
    ggml_tensor { type_, buffer, ne, nb, op, op_params, flags, src, view_src, view_offs, data, name, extra },
    ggml_hash_set { size, used, keys },
    ggml_cgraph { size, n_nodes, n_leafs, nodes, grads, grad_accs, leafs, use_counts, visited_hash_set, order, uid },
    ggml_backend_buffer_type_i { get_name, alloc_buffer, alloc_buffer_n, get_alignment, get_max_size, get_alloc_size, get_alloc_size_n, is_host },
    ggml_backend_buffer_type { iface, device, context },
    ggml_backend_buffer_i { free_buffer, get_base, init_tensor, memset_tensor, set_tensor, get_tensor, set_tensor_2d, get_tensor_2d, cpy_tensor, clear, reset },
    ggml_backend_buffer { iface, buft, context, size, usage },
    ggml_backend_graph_optimize_params { add_alloc_dep, user_data },
    ggml_backend_i { get_name, free, set_tensor_async, get_tensor_async, set_tensor_2d_async, get_tensor_2d_async, cpy_tensor_async, synchronize, graph_plan_create, graph_plan_free, graph_plan_update, graph_plan_compute, graph_compute, event_record, event_wait, graph_optimize },
    ggml_backend { guid, iface, device, context },
    ggml_backend_event { device, context },
    ggml_backend_dev_caps { async_, host_buffer, buffer_from_host_ptr, events, mmap_support },
    ggml_backend_dev_props { name, description, memory_free, memory_total, type_, device_id, caps },
    ggml_backend_device_i { get_name, get_description, get_memory, get_type, get_props, init_backend, get_buffer_type, get_host_buffer_type, buffer_from_host_ptr, supports_op, supports_buft, offload_op, event_new, event_free, event_synchronize },
    ggml_backend_device { iface, reg, context },
    ggml_backend_reg_i { get_name, get_device_count, get_device, get_proc_address },
    ggml_backend_reg { api_version, iface, context },
    ggml_backend_feature { name, value },
}
