//! ggml's split buffer type (`-sm row`), which libllama finds through the registry's
//! `get_proc_address("ggml_backend_split_buffer_type")`: one buffer type per main device and
//! normalised `tensor_split`, made once and kept for the process, whose buffers spread each
//! weight matrix's rows over the GPUs (`crate::gpu::split`). Also what the GPU device asks
//! before it claims an op: whether the op reads a split tensor in a way that is implemented.

use super::abi::*;
use super::backend_vtable::tensor_buffer;
use super::guard::guard;
use super::vtables::{entries, DeviceEntry, GUID_GPU};
use crate::ggml_types::op;
use crate::gpu::split::{SplitBuffer, SplitBufferType, SplitTensor};
use crate::tensor::Tensor;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex};

/// A split buffer type handed to ggml: `buft` first, its context points back here.
#[repr(C)]
struct SplitBuftEntry {
    buft: ggml_backend_buffer_type,
    imp: SplitBufferType,
}

unsafe impl Sync for SplitBuftEntry {}
unsafe impl Send for SplitBuftEntry {}

/// Every split buffer type made so far (a handful: one per main device and split).
static SPLIT_BUFTS: Mutex<Vec<&'static SplitBuftEntry>> = Mutex::new(Vec::new());

fn split_bufts() -> std::sync::MutexGuard<'static, Vec<&'static SplitBuftEntry>> {
    SPLIT_BUFTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The GPU entries of the registry, RFGPU0 first.
fn gpu_entries() -> Vec<&'static DeviceEntry> {
    entries()
        .iter()
        .copied()
        .filter(|e| std::ptr::eq(e.guid, &GUID_GPU))
        .collect()
}

/// `ggml_backend_split_buffer_type`: the buffer type spreading weight rows over every GPU,
/// computed on `main_device`, which is the device's index in the rocmforge registry (what
/// libllama passes: RFCPU is 0, RFGPU0 is 1, ...). `tensor_split`: NULL or one weight per GPU
/// (RFGPU0 first); all zero means in proportion to each GPU's free memory. NULL (and a log
/// line) where `main_device` is not a GPU or a GPU given rows is of another runtime.
///
/// # Safety
/// `tensor_split` is NULL or points to at least as many floats as there are GPUs.
pub unsafe extern "C" fn split_buffer_type(
    main_device: c_int,
    tensor_split: *const f32,
) -> ggml_backend_buffer_type_t {
    guard("ggml_backend_split_buffer_type", null_mut(), || {
        let all = super::registry::devices();
        let gpus = gpu_entries();
        let main_entry = usize::try_from(main_device).ok().and_then(|i| all.get(i));
        let Some(main) = main_entry.and_then(|m| gpus.iter().position(|g| std::ptr::eq(*g, *m)))
        else {
            log_error!(
                "ggml_backend_split_buffer_type: device {main_device} is not a GPU of the rocmforge registry"
            );
            return null_mut();
        };
        let ctxs = crate::gpu::contexts().to_vec();
        if ctxs.len() != gpus.len() {
            log_error!("ggml_backend_split_buffer_type: GPU list changed");
            return null_mut();
        }
        let weights: Vec<f32> = if tensor_split.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(tensor_split, ctxs.len()).to_vec()
        };
        let free: Vec<f32> = ctxs
            .iter()
            .map(|c| c.api.mem_info(c.ord).map_or(0.0, |m| m.0 as f32))
            .collect();
        let fractions = crate::gpu::split_rows::normalise(&weights, &free);
        let mut cache = split_bufts();
        if let Some(e) = cache
            .iter()
            .find(|e| e.imp.main == main && e.imp.fractions == fractions)
        {
            return &e.buft as *const _ as *mut _;
        }
        let imp = match SplitBufferType::new(main, ctxs, fractions) {
            Ok(t) => t,
            Err(e) => {
                log_error!("ggml_backend_split_buffer_type: {e}");
                return null_mut();
            }
        };
        log_info!("{}: rows split over the GPUs", imp.name().to_string_lossy());
        let entry = Box::leak(Box::new(SplitBuftEntry {
            buft: ggml_backend_buffer_type {
                iface: SPLIT_BUFT_IFACE,
                device: gpus[main].dev_ptr(),
                context: null_mut(),
            },
            imp,
        }));
        entry.buft.context = entry as *mut SplitBuftEntry as *mut c_void;
        cache.push(entry);
        &entry.buft as *const _ as *mut _
    })
}

/// Our split buffer type behind `buft`, if it is one.
///
/// # Safety
/// `buft` is NULL or a ggml buffer type handle (only compared, never read).
unsafe fn split_buft_of(buft: ggml_backend_buffer_type_t) -> Option<&'static SplitBuftEntry> {
    if buft.is_null() {
        return None;
    }
    split_bufts()
        .iter()
        .copied()
        .find(|e| std::ptr::eq(&e.buft, buft))
}

/// The main GPU of a split buffer type (None: not a split buffer type of ours).
///
/// # Safety
/// `buft` is NULL or a ggml buffer type handle.
pub unsafe fn split_buft_main(buft: ggml_backend_buffer_type_t) -> Option<usize> {
    split_buft_of(buft).map(|e| e.imp.main)
}

/// Our split buffer behind `buffer` (None also for ggml's empty stand-in of size 0, which
/// has no context).
///
/// # Safety
/// `buffer` is NULL or a live ggml buffer handle.
unsafe fn split_buffer_of<'a>(buffer: ggml_backend_buffer_t) -> Option<&'a SplitBuffer> {
    let b = buffer.as_ref()?;
    split_buft_of(b.buft)?;
    (b.context as *const SplitBuffer).as_ref()
}

/// Where `t`'s data lives in a split buffer: the main GPU of its buffer type.
fn split_main_of(t: &Tensor) -> Option<usize> {
    // SAFETY: the buffer pointers come from the host's graph.
    unsafe {
        let buf = tensor_buffer(t.as_ptr());
        buf.as_ref().and_then(|b| split_buft_main(b.buft))
    }
}

/// The device slices of `t` if it lives in a split buffer and was placed there.
pub fn split_tensor(t: &Tensor) -> Option<Arc<SplitTensor>> {
    // SAFETY: as above.
    unsafe { split_buffer_of(tensor_buffer(t.as_ptr())).and_then(|b| b.tensor(t)) }
}

/// Whether RFGPU`gpu` may claim `node` as far as split tensors go: a node reading no split
/// tensor, a split weight itself (op NONE) on its main GPU, a MUL_MAT whose weights (src0, a
/// whole contiguous matrix) are split with `gpu` as the main device, or a MUL_MAT_ID whose
/// experts (src0, a whole contiguous 3-D tensor) are, with contiguous activations and output
/// in ordinary memory. libllama's placement probe may put every source of its test
/// node in the split buffer with no data; such sources are let through, since a real graph's
/// activations never live there.
pub fn split_reads_ok(node: &Tensor, gpu: usize) -> bool {
    let split_at: Vec<(usize, usize)> = (0..GGML_MAX_SRC)
        .filter_map(|i| node.src(i).and_then(|s| split_main_of(&s).map(|m| (i, m))))
        .collect();
    if split_at.is_empty() {
        return match split_main_of(node) {
            None => true,
            // A split weight itself (ggml's scheduler places leaves by asking who runs them):
            // its main GPU holds it. Views of it would read the slices as one memory: declined.
            Some(m) => node.op() == op::NONE && m == gpu,
        };
    }
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else {
        return false;
    };
    let ne = w.ne();
    let shape_ok = match node.op() {
        op::MUL_MAT => ne[2] == 1 && ne[3] == 1,
        op::MUL_MAT_ID => ne[3] == 1 && node.src(2).is_some(),
        _ => false,
    };
    shape_ok
        && split_main_of(node).is_none()
        && split_at[0] == (0, gpu)
        && split_at[1..]
            .iter()
            .all(|&(i, _)| i <= 2 && node.src(i).is_some_and(|s| s.data().is_null()))
        && w.raw().view_src.is_null()
        && w.is_contiguous()
        && x.is_contiguous()
        && node.is_contiguous()
}

// ---------------------------------------------------------------------------------------------
// Buffer type and buffer vtables
// ---------------------------------------------------------------------------------------------

const SPLIT_BUFT_IFACE: ggml_backend_buffer_type_i = ggml_backend_buffer_type_i {
    get_name: Some(split_buft_get_name),
    alloc_buffer: Some(split_buft_alloc_buffer),
    alloc_buffer_n: None,
    get_alignment: Some(split_buft_get_alignment),
    get_max_size: None,
    get_alloc_size: None,
    get_alloc_size_n: None,
    is_host: Some(split_buft_is_host),
};

unsafe extern "C" fn split_buft_get_name(buft: ggml_backend_buffer_type_t) -> *const c_char {
    guard("split_buft_get_name", c"?".as_ptr(), || {
        split_buft_of(buft).map_or(c"?".as_ptr(), |e| e.imp.name().as_ptr())
    })
}

unsafe extern "C" fn split_buft_get_alignment(_buft: ggml_backend_buffer_type_t) -> usize {
    crate::gpu::buffer::ALIGNMENT
}

unsafe extern "C" fn split_buft_is_host(_buft: ggml_backend_buffer_type_t) -> bool {
    false
}

/// Where tensors of a split buffer seem to lie: an address range nothing else uses (the data
/// is in the device slices; ggml only needs offsets inside the buffer).
const SPLIT_BASE: usize = 0x1000;

unsafe extern "C" fn split_buft_alloc_buffer(
    buft: ggml_backend_buffer_type_t,
    size: usize,
) -> ggml_backend_buffer_t {
    guard("split_buft_alloc_buffer", null_mut(), || {
        let Some(e) = split_buft_of(buft) else {
            return null_mut();
        };
        let Some(init) = super::ggml_rt::GGML.buffer_init else {
            log_error!("ggml_backend_buffer_init not found in this process");
            return null_mut();
        };
        let ctx = Box::into_raw(Box::new(e.imp.alloc(size)));
        let buf = init(buft, SPLIT_BUFFER_IFACE, ctx as *mut c_void, size);
        if buf.is_null() {
            drop(Box::from_raw(ctx));
        }
        buf
    })
}

const SPLIT_BUFFER_IFACE: ggml_backend_buffer_i = ggml_backend_buffer_i {
    free_buffer: Some(split_buffer_free),
    get_base: Some(split_buffer_get_base),
    init_tensor: Some(split_buffer_init_tensor),
    memset_tensor: Some(split_buffer_memset_tensor),
    set_tensor: Some(split_buffer_set_tensor),
    get_tensor: Some(split_buffer_get_tensor),
    set_tensor_2d: None,
    get_tensor_2d: None,
    cpy_tensor: None,
    clear: Some(split_buffer_clear),
    reset: None,
};

unsafe extern "C" fn split_buffer_free(buffer: ggml_backend_buffer_t) {
    guard("split_buffer_free", (), || {
        if split_buffer_of(buffer).is_some() {
            drop(Box::from_raw((*buffer).context as *mut SplitBuffer));
            (*buffer).context = null_mut();
        }
    })
}

unsafe extern "C" fn split_buffer_get_base(_buffer: ggml_backend_buffer_t) -> *mut c_void {
    SPLIT_BASE as *mut c_void
}

unsafe extern "C" fn split_buffer_init_tensor(
    buffer: ggml_backend_buffer_t,
    t: *mut ggml_tensor,
) -> ggml_status {
    guard("split_buffer_init_tensor", GGML_STATUS_FAILED, || {
        let (Some(b), Some(t)) = (split_buffer_of(buffer), Tensor::from_ptr(t)) else {
            return GGML_STATUS_FAILED;
        };
        if !t.raw().view_src.is_null() {
            // A view of a split tensor reads the same slices; nothing to place.
            return GGML_STATUS_SUCCESS;
        }
        match b.init_tensor(&t) {
            Ok(()) => GGML_STATUS_SUCCESS,
            Err(e) => {
                log_error!("split buffer: {e}");
                match e {
                    crate::device::Error::Alloc(_) => GGML_STATUS_ALLOC_FAILED,
                    _ => GGML_STATUS_FAILED,
                }
            }
        }
    })
}

/// The tensor whose slices hold `t`'s bytes and `t`'s byte offset in it (a view reads its
/// source's slices).
///
/// # Safety
/// `t` is NULL or a live ggml tensor whose `view_src` is NULL or live.
unsafe fn base_of<'a>(t: *const ggml_tensor) -> Option<(Tensor<'a>, usize)> {
    let t = Tensor::from_ptr(t)?;
    match Tensor::from_ptr(t.raw().view_src) {
        Some(v) => Some((v, t.raw().view_offs)),
        None => Some((t, 0)),
    }
}

unsafe extern "C" fn split_buffer_set_tensor(
    buffer: ggml_backend_buffer_t,
    t: *mut ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    guard("split_buffer_set_tensor", (), || {
        let (Some(b), Some((base, off))) = (split_buffer_of(buffer), base_of(t)) else {
            return;
        };
        if size == 0 || data.is_null() {
            return;
        }
        let bytes = std::slice::from_raw_parts(data as *const u8, size);
        if let Err(e) = b.write(&base, off + offset, bytes) {
            log_error!("split buffer: set_tensor '{}': {e}", base.name());
        }
    })
}

unsafe extern "C" fn split_buffer_get_tensor(
    buffer: ggml_backend_buffer_t,
    t: *const ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    guard("split_buffer_get_tensor", (), || {
        let (Some(b), Some((base, off))) = (split_buffer_of(buffer), base_of(t)) else {
            return;
        };
        if size == 0 || data.is_null() {
            return;
        }
        let out = std::slice::from_raw_parts_mut(data as *mut u8, size);
        if let Err(e) = b.read(&base, off + offset, out) {
            log_error!("split buffer: get_tensor '{}': {e}", base.name());
        }
    })
}

unsafe extern "C" fn split_buffer_memset_tensor(
    buffer: ggml_backend_buffer_t,
    t: *mut ggml_tensor,
    value: u8,
    offset: usize,
    size: usize,
) {
    guard("split_buffer_memset_tensor", (), || {
        let (Some(b), Some((base, off))) = (split_buffer_of(buffer), base_of(t)) else {
            return;
        };
        if let Err(e) = b.fill(&base, off + offset, size, value) {
            log_error!("split buffer: memset_tensor '{}': {e}", base.name());
        }
    })
}

unsafe extern "C" fn split_buffer_clear(buffer: ggml_backend_buffer_t, value: u8) {
    guard("split_buffer_clear", (), || {
        if let Some(b) = split_buffer_of(buffer) {
            if let Err(e) = b.clear(value) {
                log_error!("split buffer: clear: {e}");
            }
        }
    })
}
