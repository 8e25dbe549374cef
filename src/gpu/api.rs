//! What the GPU device needs from a vendor runtime, as one small trait with two
//! implementations: NVIDIA's driver API + nvrtc (`cuda.rs`) and AMD's HIP + hiprtc (`hip.rs`).
//! Both libraries are opened at run time with `libloading`, never linked, so the crate builds
//! without any GPU SDK and a machine without a GPU simply has no GPU devices.

use std::ffi::c_void;

/// A device address (CUdeviceptr / hipDeviceptr_t).
pub type DevPtr = u64;

/// Opaque runtime handles, stored as integers so they are `Send`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(pub usize);
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Module(pub usize);
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function(pub usize);
/// A captured graph (CUgraph / hipGraph_t) and its executable form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Graph(pub usize);
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphExec(pub usize);
/// A CUevent / hipEvent_t (created without timing unless made by `event_create_timed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event(pub usize);

pub type ApiResult<T> = std::result::Result<T, String>;

/// Static facts about one device, read once at discovery.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub total_mem: usize,
    /// Compiler target: "sm_90" (NVIDIA) or "gfx90a:sramecc+:xnack-" (AMD).
    pub arch: String,
    pub warp_size: u32,
    pub compute_units: u32,
}

/// A vendor runtime. Every call that touches a device names its ordinal; implementations
/// make that device current on the calling thread first (ggml calls from any thread).
pub trait GpuApi: Send + Sync {
    /// "CUDA" or "HIP".
    fn vendor(&self) -> &'static str;
    fn device_count(&self) -> usize;
    fn device_info(&self, ord: usize) -> ApiResult<DeviceInfo>;
    /// (free, total) bytes.
    fn mem_info(&self, ord: usize) -> ApiResult<(usize, usize)>;

    fn alloc(&self, ord: usize, size: usize) -> ApiResult<DevPtr>;
    fn free(&self, ord: usize, ptr: DevPtr);
    /// Fills `size` bytes at `dst` with `value`, queued on `s`.
    fn memset_async(
        &self,
        ord: usize,
        dst: DevPtr,
        value: u8,
        size: usize,
        s: Stream,
    ) -> ApiResult<()>;

    /// A non-blocking stream: it never synchronizes with the legacy (null) stream, which
    /// nothing here uses (work there would wait for, and so break, another thread's capture).
    fn stream_create(&self, ord: usize) -> ApiResult<Stream>;
    fn stream_sync(&self, ord: usize, s: Stream) -> ApiResult<()>;
    fn stream_destroy(&self, ord: usize, s: Stream);

    /// Version of the run-time compiler (part of the kernel cache key).
    fn compiler_version(&self) -> String;
    /// Compiles one translation unit for `arch`; returns a loadable image (cubin / code object).
    fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        options: &[String],
    ) -> ApiResult<Vec<u8>>;
    fn module_load(&self, ord: usize, image: &[u8]) -> ApiResult<Module>;
    fn module_function(&self, ord: usize, m: Module, name: &str) -> ApiResult<Function>;
    fn module_unload(&self, ord: usize, m: Module);
    /// Queues `f` on `s`; `args` holds one pointer per kernel parameter.
    // The driver's launch call takes these eight, one to one.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        ord: usize,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        s: Stream,
        args: &mut [*mut c_void],
    ) -> ApiResult<()>;

    /// Starts recording `s`: launches are captured into a graph instead of running
    /// (thread-local mode: other threads, with backends of their own, keep using the runtime).
    fn capture_begin(&self, ord: usize, s: Stream) -> ApiResult<()>;
    /// Stops recording `s` and returns what was captured.
    fn capture_end(&self, ord: usize, s: Stream) -> ApiResult<Graph>;
    fn graph_instantiate(&self, ord: usize, g: Graph) -> ApiResult<GraphExec>;
    /// How many nodes `g` has (None where the runtime cannot say).
    fn graph_node_count(&self, ord: usize, g: Graph) -> Option<usize>;
    /// Points `e` at `g`'s parameters where the two have the same shape; false where the
    /// runtime refuses (then `e` must be replaced by a new instantiation).
    fn graph_exec_update(&self, ord: usize, e: GraphExec, g: Graph) -> bool;
    fn graph_launch(&self, ord: usize, e: GraphExec, s: Stream) -> ApiResult<()>;
    fn graph_destroy(&self, ord: usize, g: Graph);
    fn graph_exec_destroy(&self, ord: usize, e: GraphExec);

    // ---- Pinned host memory, registered host ranges, asynchronous copies, events ----

    /// Page-locked host memory usable by every device of this runtime (fast, truly
    /// asynchronous DMA). Never NULL on success.
    fn host_alloc(&self, ord: usize, size: usize) -> ApiResult<*mut u8>;
    fn host_free(&self, ord: usize, ptr: *mut u8);
    /// Page-locks and maps [ptr, ptr+size) for device `ord` and returns the address the device
    /// sees it at. `read_only`: the range may be a read-only mapping (the device only reads it).
    fn host_register(
        &self,
        ord: usize,
        ptr: *mut u8,
        size: usize,
        read_only: bool,
    ) -> ApiResult<DevPtr>;
    fn host_unregister(&self, ord: usize, ptr: *mut u8);
    /// Waits for all work queued on device `ord`, by any stream.
    fn device_sync(&self, ord: usize) -> ApiResult<()>;
    /// Copies queued on `s`, ordered with the kernels on it. The host memory must stay valid
    /// (and, for `copy_dtoh_async`, unread) until the stream or a later event is synchronized.
    fn copy_htod_async(
        &self,
        ord: usize,
        dst: DevPtr,
        src: *const u8,
        size: usize,
        s: Stream,
    ) -> ApiResult<()>;
    fn copy_dtoh_async(
        &self,
        ord: usize,
        dst: *mut u8,
        src: DevPtr,
        size: usize,
        s: Stream,
    ) -> ApiResult<()>;
    fn copy_dtod_async(
        &self,
        ord: usize,
        dst: DevPtr,
        src: DevPtr,
        size: usize,
        s: Stream,
    ) -> ApiResult<()>;
    /// Whether kernels on device `from` may read and write device `to`'s memory at its own
    /// addresses (peer access enabled). Default: no.
    fn peer_access(&self, _from: usize, _to: usize) -> bool {
        false
    }
    /// Device `src_ord`'s memory to device `dst_ord`'s, queued on `s` (a stream of `stream_ord`).
    #[allow(clippy::too_many_arguments)]
    fn copy_peer_async(
        &self,
        dst_ord: usize,
        dst: DevPtr,
        src_ord: usize,
        src: DevPtr,
        size: usize,
        stream_ord: usize,
        s: Stream,
    ) -> ApiResult<()>;
    fn event_create(&self, ord: usize) -> ApiResult<Event>;
    /// Marks the point after the work queued on `s` so far (`s` is a stream of device `ord`).
    fn event_record(&self, ord: usize, e: Event, s: Stream) -> ApiResult<()>;
    /// Waits on the host until the work before the last record of `e` is done.
    fn event_sync(&self, ord: usize, e: Event) -> ApiResult<()>;
    /// Makes work queued on `s` (a stream of device `ord`) after this call wait for `e`, which
    /// may belong to another device of the same runtime.
    fn stream_wait_event(&self, ord: usize, s: Stream, e: Event) -> ApiResult<()>;
    fn event_destroy(&self, ord: usize, e: Event);
    /// An event that records time (for ROCMFORGE_GPU_TIMING; the others are made without).
    fn event_create_timed(&self, ord: usize) -> ApiResult<Event>;
    /// Milliseconds between two recorded, completed timed events.
    fn event_elapsed_ms(&self, ord: usize, start: Event, end: Event) -> ApiResult<f32>;
}

/// Opens the first library of `names` that loads; also tries each under `dirs`.
pub fn open_library(names: &[&str], dirs: &[String]) -> Option<(libloading::Library, String)> {
    for n in names {
        // SAFETY: loading a vendor runtime runs its initializers; that is what using it means.
        if let Ok(lib) = unsafe { libloading::Library::new(n) } {
            return Some((lib, n.to_string()));
        }
    }
    for d in dirs {
        for n in names {
            let p = format!("{d}/{n}");
            if std::path::Path::new(&p).exists() {
                if let Ok(lib) = unsafe { libloading::Library::new(&p) } {
                    return Some((lib, p));
                }
            }
        }
    }
    None
}

/// Directories matching `prefix*suffix` under `parent` (e.g. /usr/local/cuda*/lib64), newest name first.
pub fn glob_dirs(parent: &str, prefix: &str, suffix: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(parent)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix))
                .map(|n| format!("{parent}/{n}{suffix}"))
                .filter(|p| std::path::Path::new(p).is_dir())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out.reverse();
    out
}

/// Resolves symbol `name` of `lib` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the symbol's true C signature.
pub unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> ApiResult<T> {
    lib.get::<T>(name.as_bytes())
        .map(|s| *s)
        .map_err(|e| format!("missing symbol {name}: {e}"))
}
