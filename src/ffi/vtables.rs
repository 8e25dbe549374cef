//! ggml's vtables (registry, device, buffer type, buffer, backend) implemented over the safe
//! traits in `crate::device`. Each entry is a thin trampoline: check pointers, run the body
//! under `guard` (no panic crosses into C), turn errors into ggml's error values and a log line.

use super::abi::*;
use super::backend_vtable::{backend_of, new_backend, tensor_buffer};
use super::ggml_rt::GGML;
use super::guard::guard;
use crate::device::{Buffer, BufferType, Device, DeviceKind, Event};
use crate::tensor::Tensor;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;

// ---------------------------------------------------------------------------------------------
// Device entries: one per device, at a fixed address for the life of the process.
// ---------------------------------------------------------------------------------------------

/// Everything ggml needs for one device. `dev`, `buft` and `host_buft` are handed to ggml by
/// address; their `context` points back to this entry. `host_buft` is the device's pinned host
/// buffer type (`get_host_buffer_type`), used only where the device has one.
#[repr(C)]
pub struct DeviceEntry {
    pub dev: ggml_backend_device,
    pub buft: ggml_backend_buffer_type,
    pub host_buft: ggml_backend_buffer_type,
    /// The device's extra buffer type (`Device::extra_buffer_type`), used only where it has one.
    pub extra_buft: ggml_backend_buffer_type,
    /// What `ggml_backend_dev_get_extra_bufts` returns: the extra type or nothing, then NULL.
    extra_list: [ggml_backend_buffer_type_t; 2],
    pub imp: Box<dyn Device>,
    pub guid: &'static ggml_guid,
}

unsafe impl Sync for DeviceEntry {}
unsafe impl Send for DeviceEntry {}

impl DeviceEntry {
    /// Leaks a new entry (devices live as long as the process, as in every ggml backend).
    pub fn leak(
        imp: Box<dyn Device>,
        reg: ggml_backend_reg_t,
        guid: &'static ggml_guid,
    ) -> &'static DeviceEntry {
        let entry = Box::leak(Box::new(DeviceEntry {
            dev: ggml_backend_device {
                iface: DEVICE_IFACE,
                reg,
                context: null_mut(),
            },
            buft: ggml_backend_buffer_type {
                iface: BUFT_IFACE,
                device: null_mut(),
                context: null_mut(),
            },
            host_buft: ggml_backend_buffer_type {
                iface: BUFT_IFACE,
                device: null_mut(),
                context: null_mut(),
            },
            extra_buft: ggml_backend_buffer_type {
                iface: BUFT_IFACE,
                device: null_mut(),
                context: null_mut(),
            },
            extra_list: [null_mut(); 2],
            imp,
            guid,
        }));
        let p = entry as *mut DeviceEntry;
        entry.dev.context = p as *mut c_void;
        entry.buft.device = &mut entry.dev;
        entry.buft.context = p as *mut c_void;
        entry.host_buft.device = &mut entry.dev;
        entry.host_buft.context = p as *mut c_void;
        entry.extra_buft.device = &mut entry.dev;
        entry.extra_buft.context = p as *mut c_void;
        if entry.imp.extra_buffer_type().is_some() {
            entry.extra_list[0] = &mut entry.extra_buft;
        }
        entry
    }

    pub fn dev_ptr(&'static self) -> ggml_backend_dev_t {
        &self.dev as *const _ as *mut _
    }

    pub fn buft_ptr(&'static self) -> ggml_backend_buffer_type_t {
        &self.buft as *const _ as *mut _
    }

    /// The extra buffer type, NULL where the device has none.
    pub fn extra_buft_ptr(&'static self) -> ggml_backend_buffer_type_t {
        self.extra_list[0]
    }

    /// The pinned host buffer type, NULL where the device has none.
    pub fn host_buft_ptr(&'static self) -> ggml_backend_buffer_type_t {
        match self.imp.host_buffer_type() {
            Some(_) => &self.host_buft as *const _ as *mut _,
            None => null_mut(),
        }
    }
}

/// One guid per device kind: `ggml_backend_is_rocmforge` accepts all of them.
pub static GUID_CPU: ggml_guid = *b"rocmforge-cpu\0\0\0";
pub static GUID_GPU: ggml_guid = *b"rocmforge-gpu\0\0\0";
pub static GUID_HYBRID: ggml_guid = *b"rocmforge-hyb\0\0\0";

/// Whether `g` is the guid of one of our backends.
///
/// # Safety
/// `g` is NULL or points to a readable ggml guid.
pub unsafe fn is_our_guid(g: ggml_guid_t) -> bool {
    match g.as_ref() {
        Some(g) => [GUID_CPU, GUID_GPU, GUID_HYBRID].contains(g),
        None => false,
    }
}

/// Every device entry, in registry order; set once by the registry when it finds the devices
/// (registry.rs), empty before (no handle of ours can exist then).
static ENTRIES: once_cell::sync::OnceCell<Vec<&'static DeviceEntry>> =
    once_cell::sync::OnceCell::new();

/// Stores the device entries (the registry's first use); later calls change nothing.
pub fn set_entries(entries: Vec<&'static DeviceEntry>) -> &'static [&'static DeviceEntry] {
    ENTRIES.get_or_init(|| entries)
}

/// The device entries the registry stored (`set_entries`).
pub fn entries() -> &'static [&'static DeviceEntry] {
    ENTRIES.get().map_or(&[], Vec::as_slice)
}

/// `ggml_backend_set_n_threads` (through the registry's get_proc_address) and
/// `ggml_backend_rocmforge_set_n_threads`: the CPU threads of one of our backends.
///
/// # Safety
/// `backend` is NULL or a ggml backend handle.
pub unsafe extern "C" fn backend_set_n_threads(backend: ggml_backend_t, n_threads: c_int) {
    guard("ggml_backend_rocmforge_set_n_threads", (), || {
        if let Some(b) = backend_of(backend) {
            b.imp.set_n_threads(n_threads.max(1) as usize);
        }
    })
}

/// `ggml_backend_dev_get_extra_bufts` (through the registry's get_proc_address): the device's
/// extra buffer types, NULL-terminated (only RFCPU has one: `cpu::repack`).
///
/// # Safety
/// `dev` is NULL or a ggml device handle.
pub unsafe extern "C" fn dev_get_extra_bufts(
    dev: ggml_backend_dev_t,
) -> *mut ggml_backend_buffer_type_t {
    static NONE: [usize; 1] = [0];
    guard(
        "dev_get_extra_bufts",
        NONE.as_ptr() as *mut _,
        || match entry_of_dev(dev).filter(|e| entries().iter().any(|x| std::ptr::eq(*x, *e))) {
            Some(e) => e.extra_list.as_ptr() as *mut _,
            None => NONE.as_ptr() as *mut _,
        },
    )
}

/// The device entry whose extra buffer type (repacked weights) holds `t`'s data, if any.
unsafe fn extra_buft_entry(t: &Tensor) -> Option<&'static DeviceEntry> {
    let buf = t.raw().buffer.as_ref()?;
    entries()
        .iter()
        .copied()
        .find(|e| !buf.buft.is_null() && std::ptr::eq(e.extra_buft_ptr(), buf.buft))
}

unsafe fn entry_of_dev(dev: ggml_backend_dev_t) -> Option<&'static DeviceEntry> {
    dev.as_ref()
        .and_then(|d| (d.context as *const DeviceEntry).as_ref())
}

/// One of our buffer types (others may come from any backend): its device and implementation.
unsafe fn buft_of(
    buft: ggml_backend_buffer_type_t,
) -> Option<(&'static DeviceEntry, &'static dyn BufferType)> {
    if buft.is_null() {
        return None;
    }
    for &e in entries() {
        if std::ptr::eq(e.buft_ptr(), buft) {
            return Some((e, e.imp.buffer_type()));
        }
        if std::ptr::eq(e.host_buft_ptr(), buft) {
            return e.imp.host_buffer_type().map(|bt| (e, bt));
        }
        if std::ptr::eq(e.extra_buft_ptr(), buft) {
            return e.imp.extra_buffer_type().map(|bt| (e, bt));
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Device
// ---------------------------------------------------------------------------------------------

const DEVICE_IFACE: ggml_backend_device_i = ggml_backend_device_i {
    get_name: Some(dev_get_name),
    get_description: Some(dev_get_description),
    get_memory: Some(dev_get_memory),
    get_type: Some(dev_get_type),
    get_props: Some(dev_get_props),
    init_backend: Some(dev_init_backend),
    get_buffer_type: Some(dev_get_buffer_type),
    get_host_buffer_type: Some(dev_get_host_buffer_type),
    buffer_from_host_ptr: Some(dev_buffer_from_host_ptr),
    supports_op: Some(dev_supports_op),
    supports_buft: Some(dev_supports_buft),
    offload_op: Some(dev_offload_op),
    event_new: Some(dev_event_new),
    event_free: Some(dev_event_free),
    event_synchronize: Some(dev_event_synchronize),
};

unsafe extern "C" fn dev_get_name(dev: ggml_backend_dev_t) -> *const c_char {
    guard("dev_get_name", c"?".as_ptr(), || match entry_of_dev(dev) {
        Some(e) => e.imp.name().as_ptr(),
        None => c"?".as_ptr(),
    })
}

unsafe extern "C" fn dev_get_description(dev: ggml_backend_dev_t) -> *const c_char {
    guard(
        "dev_get_description",
        c"?".as_ptr(),
        || match entry_of_dev(dev) {
            Some(e) => e.imp.description().as_ptr(),
            None => c"?".as_ptr(),
        },
    )
}

unsafe extern "C" fn dev_get_memory(dev: ggml_backend_dev_t, free: *mut usize, total: *mut usize) {
    guard("dev_get_memory", (), || {
        let (f, t) = entry_of_dev(dev).map(|e| e.imp.memory()).unwrap_or((0, 0));
        if !free.is_null() {
            *free = f;
        }
        if !total.is_null() {
            *total = t;
        }
    })
}

fn dev_type_of(kind: DeviceKind) -> ggml_backend_dev_type {
    match kind {
        DeviceKind::Cpu => GGML_BACKEND_DEVICE_TYPE_CPU,
        DeviceKind::Gpu => GGML_BACKEND_DEVICE_TYPE_GPU,
    }
}

unsafe extern "C" fn dev_get_type(dev: ggml_backend_dev_t) -> ggml_backend_dev_type {
    guard("dev_get_type", GGML_BACKEND_DEVICE_TYPE_CPU, || {
        entry_of_dev(dev)
            .map(|e| dev_type_of(e.imp.kind()))
            .unwrap_or(GGML_BACKEND_DEVICE_TYPE_CPU)
    })
}

unsafe extern "C" fn dev_get_props(dev: ggml_backend_dev_t, props: *mut ggml_backend_dev_props) {
    guard("dev_get_props", (), || {
        let (Some(e), Some(p)) = (entry_of_dev(dev), props.as_mut()) else {
            return;
        };
        let (free, total) = e.imp.memory();
        let caps = e.imp.caps();
        *p = ggml_backend_dev_props {
            name: e.imp.name().as_ptr(),
            description: e.imp.description().as_ptr(),
            memory_free: free,
            memory_total: total,
            type_: dev_type_of(e.imp.kind()),
            device_id: e.imp.device_id().map_or(std::ptr::null(), |d| d.as_ptr()),
            caps: ggml_backend_dev_caps {
                async_: caps.async_,
                host_buffer: caps.host_buffer,
                buffer_from_host_ptr: caps.buffer_from_host_ptr,
                events: caps.events,
                mmap_support: caps.mmap_support,
            },
        };
    })
}

unsafe extern "C" fn dev_init_backend(
    dev: ggml_backend_dev_t,
    _params: *const c_char,
) -> ggml_backend_t {
    guard("dev_init_backend", null_mut(), || match entry_of_dev(dev) {
        Some(e) => new_backend(e),
        None => null_mut(),
    })
}

unsafe extern "C" fn dev_get_buffer_type(dev: ggml_backend_dev_t) -> ggml_backend_buffer_type_t {
    guard("dev_get_buffer_type", null_mut(), || {
        entry_of_dev(dev)
            .map(|e| e.buft_ptr())
            .unwrap_or(null_mut())
    })
}

unsafe extern "C" fn dev_get_host_buffer_type(
    dev: ggml_backend_dev_t,
) -> ggml_backend_buffer_type_t {
    guard("dev_get_host_buffer_type", null_mut(), || {
        entry_of_dev(dev)
            .map(|e| e.host_buft_ptr())
            .unwrap_or(null_mut())
    })
}

unsafe extern "C" fn dev_buffer_from_host_ptr(
    dev: ggml_backend_dev_t,
    ptr: *mut c_void,
    size: usize,
    _max_tensor_size: usize,
) -> ggml_backend_buffer_t {
    guard("dev_buffer_from_host_ptr", null_mut(), || {
        let Some(e) = entry_of_dev(dev) else {
            return null_mut();
        };
        if ptr.is_null() {
            log_error!("buffer_from_host_ptr: NULL pointer");
            return null_mut();
        }
        match e.imp.buffer_from_host_ptr(ptr as *mut u8, size) {
            Some(b) => {
                let pin = super::pin::pin_for_gpu(e, b.as_ref(), 0);
                wrap_buffer(e.buft_ptr(), b, pin)
            }
            None => {
                log_warn!(
                    "{}: cannot wrap host memory ({} bytes at {:p})",
                    e.imp.name().to_string_lossy(),
                    size,
                    ptr
                );
                null_mut()
            }
        }
    })
}

unsafe extern "C" fn dev_supports_op(dev: ggml_backend_dev_t, node: *const ggml_tensor) -> bool {
    guard("dev_supports_op", false, || {
        match (entry_of_dev(dev), Tensor::from_ptr(node)) {
            (Some(e), Some(t)) => geometry_ok(&t) && extra_bufts_ok(e, &t) && e.imp.supports_op(&t),
            _ => false,
        }
    })
}

/// No source of `t` lies in an extra buffer type (repacked weights) unless `e` is that
/// buffer type's device and reads it there as the weights of a repacked product
/// (`cpu::repack::product_ok`); a refusal is logged at debug level (libllama asks so for every
/// weight while it picks buffer types).
unsafe fn extra_bufts_ok(e: &'static DeviceEntry, t: &Tensor) -> bool {
    for i in 0..GGML_MAX_SRC {
        let Some(s) = t.src(i) else { continue };
        let Some(owner) = extra_buft_entry(&s) else {
            continue;
        };
        if !std::ptr::eq(owner, e) || !crate::cpu::repack::product_ok(t, i) {
            log_debug!(
                "op {} '{}' not supported: source {i} '{}' is repacked (RFCPU_REPACK)",
                t.op(),
                t.name(),
                s.name()
            );
            return false;
        }
    }
    true
}

/// The node's and its sources' shapes and strides can be computed on
/// (`Tensor::check_geometry`); a refusal is logged.
pub(super) fn geometry_ok(t: &Tensor) -> bool {
    let bad = std::iter::once((usize::MAX, *t))
        .chain((0..GGML_MAX_SRC).filter_map(|i| t.src(i).map(|s| (i, s))))
        .find_map(|(i, x)| x.check_geometry().err().map(|e| (i, x, e)));
    match bad {
        None => true,
        Some((i, x, e)) => {
            let which = if i == usize::MAX {
                "the node".to_string()
            } else {
                format!("source {i}")
            };
            log_warn!(
                "op {} '{}' not supported: {which} '{}': {e}",
                t.op(),
                t.name(),
                x.name()
            );
            false
        }
    }
}

unsafe extern "C" fn dev_supports_buft(
    dev: ggml_backend_dev_t,
    buft: ggml_backend_buffer_type_t,
) -> bool {
    guard("dev_supports_buft", false, || {
        let Some(e) = entry_of_dev(dev) else {
            return false;
        };
        if buft.is_null() {
            return false;
        }
        if std::ptr::eq(buft, e.buft_ptr()) || std::ptr::eq(buft, e.extra_buft_ptr()) {
            return true;
        }
        // A split buffer type (row split) belongs to its main GPU, which computes on it.
        if let Some(main) = super::split::split_buft_main(buft) {
            let gpus = entries().iter().filter(|x| std::ptr::eq(x.guid, &GUID_GPU));
            return gpus
                .enumerate()
                .any(|(i, x)| i == main && std::ptr::eq(*x, e));
        }
        // A CPU device reads any host buffer with ggml's standard layout, like ggml-cpu does.
        e.imp.kind() == DeviceKind::Cpu && (*buft).iface.is_host.map(|f| f(buft)).unwrap_or(false)
    })
}

unsafe extern "C" fn dev_offload_op(dev: ggml_backend_dev_t, node: *const ggml_tensor) -> bool {
    guard("dev_offload_op", false, || {
        match (entry_of_dev(dev), Tensor::from_ptr(node)) {
            (Some(e), Some(t)) => e.imp.offload_op(&t),
            _ => false,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Events: a `ggml_backend_event` whose context is a `Box<dyn Event>`.
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn dev_event_new(dev: ggml_backend_dev_t) -> ggml_backend_event_t {
    guard("event_new", null_mut(), || {
        let Some(e) = entry_of_dev(dev) else {
            return null_mut();
        };
        match e.imp.new_event() {
            None => null_mut(),
            Some(Err(err)) => {
                log_error!(
                    "{}: cannot create an event: {}",
                    e.imp.name().to_string_lossy(),
                    err
                );
                null_mut()
            }
            Some(Ok(ev)) => {
                let ctx = Box::into_raw(Box::new(ev)) as *mut c_void;
                Box::into_raw(Box::new(ggml_backend_event {
                    device: e.dev_ptr(),
                    context: ctx,
                }))
            }
        }
    })
}

/// Our event behind `event` (made by `dev_event_new` for one of our devices), or None.
pub(super) unsafe fn event_of<'a>(event: ggml_backend_event_t) -> Option<&'a dyn Event> {
    let ev = event.as_ref()?;
    let ours = entries()
        .iter()
        .any(|e| std::ptr::eq(e.dev_ptr(), ev.device));
    if !ours || ev.context.is_null() {
        return None;
    }
    Some((*(ev.context as *const Box<dyn Event>)).as_ref())
}

unsafe extern "C" fn dev_event_free(_dev: ggml_backend_dev_t, event: ggml_backend_event_t) {
    guard("event_free", (), || {
        if event_of(event).is_some() {
            let ev = Box::from_raw(event);
            drop(Box::from_raw(ev.context as *mut Box<dyn Event>));
        }
    })
}

unsafe extern "C" fn dev_event_synchronize(_dev: ggml_backend_dev_t, event: ggml_backend_event_t) {
    guard("event_synchronize", (), || match event_of(event) {
        Some(ev) => report(ev.synchronize(), "event_synchronize"),
        None => log_error!("event_synchronize: not an event of this library"),
    })
}

// ---------------------------------------------------------------------------------------------
// Buffer type
// ---------------------------------------------------------------------------------------------

const BUFT_IFACE: ggml_backend_buffer_type_i = ggml_backend_buffer_type_i {
    get_name: Some(buft_get_name),
    alloc_buffer: Some(buft_alloc_buffer),
    alloc_buffer_n: None,
    get_alignment: Some(buft_get_alignment),
    get_max_size: Some(buft_get_max_size),
    get_alloc_size: Some(buft_get_alloc_size),
    get_alloc_size_n: None,
    is_host: Some(buft_is_host),
};

unsafe extern "C" fn buft_get_name(buft: ggml_backend_buffer_type_t) -> *const c_char {
    guard("buft_get_name", c"?".as_ptr(), || match buft_of(buft) {
        Some((_, bt)) => bt.name().as_ptr(),
        None => c"?".as_ptr(),
    })
}

unsafe extern "C" fn buft_alloc_buffer(
    buft: ggml_backend_buffer_type_t,
    size: usize,
) -> ggml_backend_buffer_t {
    guard("buft_alloc_buffer", null_mut(), || {
        let Some((e, bt)) = buft_of(buft) else {
            return null_mut();
        };
        if size > bt.max_size() {
            log_error!(
                "{}: cannot allocate {} bytes (max {})",
                bt.name().to_string_lossy(),
                size,
                bt.max_size()
            );
            return null_mut();
        }
        match bt.alloc(size) {
            Ok(b) => {
                let pin = super::pin::pin_for_gpu(e, b.as_ref(), super::pin::PIN_MIN_ALLOC);
                wrap_buffer(buft, b, pin)
            }
            Err(err) => {
                log_error!("{}: {} ({} bytes)", bt.name().to_string_lossy(), err, size);
                null_mut()
            }
        }
    })
}

unsafe extern "C" fn buft_get_alignment(buft: ggml_backend_buffer_type_t) -> usize {
    guard("buft_get_alignment", 64, || {
        buft_of(buft).map(|(_, bt)| bt.alignment()).unwrap_or(64)
    })
}

unsafe extern "C" fn buft_get_max_size(buft: ggml_backend_buffer_type_t) -> usize {
    guard("buft_get_max_size", usize::MAX, || {
        buft_of(buft)
            .map(|(_, bt)| bt.max_size())
            .unwrap_or(usize::MAX)
    })
}

unsafe extern "C" fn buft_get_alloc_size(
    buft: ggml_backend_buffer_type_t,
    t: *const ggml_tensor,
) -> usize {
    guard("buft_get_alloc_size", 0, || {
        match (buft_of(buft), Tensor::from_ptr(t)) {
            (Some((_, bt)), Some(t)) => bt.alloc_size(&t),
            (None, Some(t)) => t.nbytes(),
            _ => 0,
        }
    })
}

unsafe extern "C" fn buft_is_host(buft: ggml_backend_buffer_type_t) -> bool {
    guard("buft_is_host", false, || {
        buft_of(buft).map(|(_, bt)| bt.is_host()).unwrap_or(false)
    })
}

// ---------------------------------------------------------------------------------------------
// Buffer
// ---------------------------------------------------------------------------------------------

const BUFFER_IFACE: ggml_backend_buffer_i = ggml_backend_buffer_i {
    free_buffer: Some(buffer_free),
    get_base: Some(buffer_get_base),
    init_tensor: Some(buffer_init_tensor),
    memset_tensor: Some(buffer_memset_tensor),
    set_tensor: Some(buffer_set_tensor),
    get_tensor: Some(buffer_get_tensor),
    set_tensor_2d: None,
    get_tensor_2d: None,
    cpy_tensor: Some(buffer_cpy_tensor),
    clear: Some(buffer_clear),
    reset: None,
};

/// What a buffer of ours holds as its `context`: the device's buffer and the error of the
/// last failed set/get/memset/cpy on it, kept until a `graph_compute` reading or writing
/// the buffer reports it (a failed weight upload must not go on silently).
pub struct BufferCtx {
    /// The GPU's page lock on `imp`'s memory (`pin_for_gpu`). Declared before `imp`: fields
    /// drop in order, so the memory is unregistered before it is freed.
    _pin: Option<Box<dyn std::any::Any + Send>>,
    imp: Box<dyn Buffer>,
    failed: std::sync::Mutex<Option<String>>,
}

/// Buffers holding an error not yet reported: while 0, `graph_compute` looks at none.
static BUFFER_ERRORS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl BufferCtx {
    pub(super) fn new(imp: Box<dyn Buffer>, pin: Option<Box<dyn std::any::Any + Send>>) -> Self {
        BufferCtx {
            _pin: pin,
            imp,
            failed: Default::default(),
        }
    }

    /// Logs a failed transfer and keeps it for the next `graph_compute` using this buffer.
    fn fail(&self, what: &str, msg: &str) {
        log_error!("{what}: {msg}; the next graph_compute using this buffer will fail");
        let mut f = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            BUFFER_ERRORS.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        *f = Some(format!("{what}: {msg}"));
    }

    fn take_error(&self) -> Option<String> {
        let e = self.failed.lock().unwrap_or_else(|e| e.into_inner()).take();
        if e.is_some() {
            BUFFER_ERRORS.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        e
    }

    /// Records `r`'s error, if any.
    fn check(&self, r: crate::device::Result<()>, what: &str) {
        if let Err(e) = r {
            self.fail(what, &e.to_string());
        }
    }
}

/// Hands a buffer to ggml: ggml owns the `ggml_backend_buffer` (it `delete`s it), we own the
/// context, which `buffer_free` drops.
unsafe fn wrap_buffer(
    buft: ggml_backend_buffer_type_t,
    b: Box<dyn Buffer>,
    pin: Option<Box<dyn std::any::Any + Send>>,
) -> ggml_backend_buffer_t {
    let Some(init) = GGML.buffer_init else {
        log_error!("ggml_backend_buffer_init not found in this process: is libggml-base loaded?");
        return null_mut();
    };
    let size = b.size();
    let ctx = Box::into_raw(Box::new(BufferCtx::new(b, pin)));
    let buf = init(buft, BUFFER_IFACE, ctx as *mut c_void, size);
    if buf.is_null() {
        drop(Box::from_raw(ctx));
    }
    buf
}

/// Our context behind `buffer`: only for buffers made by `wrap_buffer` (known by their
/// buffer type, one of ours; other backends' buffers hold other contexts).
unsafe fn buffer_ctx<'a>(buffer: ggml_backend_buffer_t) -> Option<&'a mut BufferCtx> {
    let b = buffer.as_ref()?;
    buft_of(b.buft)?;
    (b.context as *mut BufferCtx).as_mut()
}

unsafe fn buffer_of<'a>(buffer: ggml_backend_buffer_t) -> Option<&'a mut Box<dyn Buffer>> {
    buffer_ctx(buffer).map(|c| &mut c.imp)
}

/// Byte offset of `t`'s data (plus `offset`) inside `buffer`, checked to lie in bounds.
unsafe fn tensor_range(
    b: &dyn Buffer,
    t: *const ggml_tensor,
    offset: usize,
    size: usize,
) -> Option<usize> {
    let t = t.as_ref()?;
    let base = b.base() as usize;
    let data = t.data as usize;
    if data < base {
        return None;
    }
    let start = (data - base).checked_add(offset)?;
    if start.checked_add(size)? > b.size() {
        return None;
    }
    Some(start)
}

/// Whether a copy of `n` bytes between host addresses `a` and `b` overlaps itself: our copies
/// take the source as a shared slice, which must not alias the destination (ASan saw the
/// copy turned into an overlapping memcpy), so such a request is refused.
fn overlaps(c: &BufferCtx, at: usize, other: *const u8, n: usize) -> bool {
    let (a, b) = (c.imp.base() as usize + at, other as usize);
    c.imp.is_host() && a < b.saturating_add(n) && b < a.saturating_add(n)
}

/// Why `t`'s elements (`Tensor::data_range`) do not lie inside the buffer holding them (any
/// backend's: its base and size as ggml reports them), or Ok.
pub(super) unsafe fn check_in_buffer(t: &Tensor) -> Result<(), String> {
    let (start, end) = t.data_range()?;
    if start == end {
        return Ok(());
    }
    let buf = tensor_buffer(t.as_ptr());
    let Some(b) = buf.as_ref() else {
        return Err("data is not in a backend buffer".into());
    };
    let base = match b.iface.get_base {
        Some(f) => f(buf) as usize,
        None => return Err("its buffer has no base address".into()),
    };
    if start < base || end > base.saturating_add(b.size) {
        return Err(format!(
            "data [{:#x}, +{}) lies outside its buffer [{base:#x}, +{})",
            start,
            end - start,
            b.size
        ));
    }
    Ok(())
}

unsafe extern "C" fn buffer_free(buffer: ggml_backend_buffer_t) {
    guard("buffer_free", (), || {
        if let Some(b) = buffer.as_mut() {
            if !b.context.is_null() {
                let ctx = Box::from_raw(b.context as *mut BufferCtx);
                ctx.take_error();
                b.context = null_mut();
                drop(ctx);
                // Memory went away: graphs remembered over its addresses must be checked again.
                crate::tensor::bump_free_epoch();
            }
        }
    })
}

unsafe extern "C" fn buffer_get_base(buffer: ggml_backend_buffer_t) -> *mut c_void {
    guard("buffer_get_base", null_mut(), || {
        buffer_of(buffer)
            .map(|b| b.base() as *mut c_void)
            .unwrap_or(null_mut())
    })
}

unsafe extern "C" fn buffer_init_tensor(
    buffer: ggml_backend_buffer_t,
    t: *mut ggml_tensor,
) -> ggml_status {
    guard("buffer_init_tensor", GGML_STATUS_FAILED, || {
        let (Some(c), Some(tt)) = (buffer_ctx(buffer), Tensor::from_ptr(t)) else {
            return GGML_STATUS_FAILED;
        };
        match c.imp.init_tensor(&tt) {
            Ok(()) => GGML_STATUS_SUCCESS,
            Err(e) => {
                log_error!("init_tensor '{}': {e}", tt.name());
                GGML_STATUS_FAILED
            }
        }
    })
}

unsafe extern "C" fn buffer_memset_tensor(
    buffer: ggml_backend_buffer_t,
    t: *mut ggml_tensor,
    value: u8,
    offset: usize,
    size: usize,
) {
    guard("buffer_memset_tensor", (), || {
        let Some(c) = buffer_ctx(buffer) else { return };
        match tensor_range(c.imp.as_ref(), t, offset, size) {
            Some(at) => {
                let r = c.imp.fill(at, size, value);
                c.check(r, "memset_tensor")
            }
            None => c.fail(
                "memset_tensor",
                &format!("range +{offset}, {size} bytes outside the buffer"),
            ),
        }
    })
}

unsafe extern "C" fn buffer_set_tensor(
    buffer: ggml_backend_buffer_t,
    t: *mut ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    guard("buffer_set_tensor", (), || {
        let Some(c) = buffer_ctx(buffer) else { return };
        if size == 0 {
            return;
        }
        if data.is_null() {
            c.fail("set_tensor", "NULL data");
            return;
        }
        match tensor_range(c.imp.as_ref(), t, offset, size) {
            Some(at) if overlaps(c, at, data as *const u8, size) => {
                c.fail("set_tensor", "the data overlaps the destination")
            }
            Some(at) => {
                let r = match Tensor::from_ptr(t) {
                    Some(tt) => c.imp.set_tensor(
                        &tt,
                        at,
                        offset,
                        std::slice::from_raw_parts(data as *const u8, size),
                    ),
                    None => Err(crate::device::Error::Unsupported("NULL tensor".into())),
                };
                c.check(r, "set_tensor")
            }
            None => c.fail(
                "set_tensor",
                &format!("range +{offset}, {size} bytes outside the buffer"),
            ),
        }
    })
}

unsafe extern "C" fn buffer_get_tensor(
    buffer: ggml_backend_buffer_t,
    t: *const ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    guard("buffer_get_tensor", (), || {
        let Some(c) = buffer_ctx(buffer) else { return };
        if size == 0 {
            return;
        }
        if data.is_null() {
            c.fail("get_tensor", "NULL data");
            return;
        }
        match tensor_range(c.imp.as_ref(), t, offset, size) {
            Some(at) if overlaps(c, at, data as *const u8, size) => {
                c.fail("get_tensor", "the destination overlaps the data")
            }
            Some(at) => {
                let r = match Tensor::from_ptr(t) {
                    Some(tt) => c.imp.get_tensor(
                        &tt,
                        at,
                        offset,
                        std::slice::from_raw_parts_mut(data as *mut u8, size),
                    ),
                    None => Err(crate::device::Error::Unsupported("NULL tensor".into())),
                };
                c.check(r, "get_tensor")
            }
            None => c.fail(
                "get_tensor",
                &format!("range +{offset}, {size} bytes outside the buffer"),
            ),
        }
    })
}

/// Copies from any host-memory tensor, or from a buffer of the same device memory, into ours;
/// other sources return false so ggml falls back to a copy through the host. Both tensors
/// must span the same number of bytes and lie inside their buffers.
unsafe extern "C" fn buffer_cpy_tensor(
    buffer: ggml_backend_buffer_t,
    src: *const ggml_tensor,
    dst: *mut ggml_tensor,
) -> bool {
    guard("buffer_cpy_tensor", false, || {
        let Some(c) = buffer_ctx(buffer) else {
            return false;
        };
        let (Some(s), Some(d)) = (Tensor::from_ptr(src), Tensor::from_ptr(dst)) else {
            c.fail("cpy_tensor", "NULL tensor");
            return false;
        };
        let sbuf = tensor_buffer(src);
        if sbuf.is_null() || s.data().is_null() {
            c.fail("cpy_tensor", "source has no memory");
            return false;
        }
        let n = s.nbytes();
        if d.nbytes() != n {
            c.fail(
                "cpy_tensor",
                &format!(
                    "source '{}' spans {n} bytes, destination '{}' {}",
                    s.name(),
                    d.name(),
                    d.nbytes()
                ),
            );
            return false;
        }
        if let Err(e) = check_in_buffer(&s) {
            c.fail("cpy_tensor", &format!("source '{}': {e}", s.name()));
            return false;
        }
        let Some(at) = tensor_range(c.imp.as_ref(), dst, 0, n) else {
            c.fail(
                "cpy_tensor",
                &format!("destination '{}' lies outside the buffer", d.name()),
            );
            return false;
        };
        let sbuft = (*sbuf).buft;
        // Same buffer type (one of our devices' memory): a copy on the device.
        if !sbuft.is_null() && std::ptr::eq(sbuft, (*buffer).buft) && !c.imp.is_host() {
            return c
                .imp
                .copy_from_same_type(at, s.data(), n)
                .unwrap_or_else(|e| {
                    c.fail("cpy_tensor", &e.to_string());
                    false
                });
        }
        let src_is_host =
            !sbuft.is_null() && (*sbuft).iface.is_host.map(|f| f(sbuft)).unwrap_or(false);
        if !src_is_host {
            return false;
        }
        if overlaps(c, at, s.data(), n) {
            c.fail(
                "cpy_tensor",
                &format!("source '{}' overlaps the destination", s.name()),
            );
            return false;
        }
        match c
            .imp
            .set_tensor(&d, at, 0, std::slice::from_raw_parts(s.data(), n))
        {
            Ok(()) => true,
            Err(e) => {
                c.fail("cpy_tensor", &e.to_string());
                false
            }
        }
    })
}

unsafe extern "C" fn buffer_clear(buffer: ggml_backend_buffer_t, value: u8) {
    guard("buffer_clear", (), || {
        if let Some(c) = buffer_ctx(buffer) {
            let n = c.imp.size();
            let r = c.imp.fill(0, n, value);
            c.check(r, "clear");
        }
    })
}

/// The error recorded on the buffer of the node or of any source (`BufferCtx::fail`), taken.
pub(super) unsafe fn take_buffer_error(t: &Tensor) -> Option<String> {
    if BUFFER_ERRORS.load(std::sync::atomic::Ordering::Acquire) == 0 {
        return None;
    }
    std::iter::once(*t)
        .chain((0..GGML_MAX_SRC).filter_map(|i| t.src(i)))
        .find_map(|x| buffer_ctx(tensor_buffer(x.as_ptr())).and_then(|c| c.take_error()))
}

pub(super) fn report(r: crate::device::Result<()>, what: &str) {
    if let Err(e) = r {
        log_error!("{what}: {e}");
    }
}
