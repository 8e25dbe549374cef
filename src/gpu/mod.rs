//! The RFGPU devices: one per GPU found through AMD's HIP or NVIDIA's CUDA driver, both
//! opened at run time (`api`, `hip`, `cuda`). Kernels are HIP C++ compiled on first use
//! (`kernels`); buffers live in device memory (`buffer`); a backend is a stream (`backend`)
//! running the ops of `ops`. No GPU, no driver or no run-time compiler = no RFGPU device.

pub mod api;
pub mod backend;
pub mod blas;
pub mod buffer;
pub mod cuda;
pub mod hip;
pub mod kernel_cache;
pub mod kernel_groups;
pub mod kernels;
#[cfg(test)]
mod mock;
pub mod ops;
pub mod pinned;
pub mod sha256;
pub mod split;
pub mod split_order;
pub mod split_rows;
pub mod staging;

use crate::device::{
    Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Error, Event, Result,
};
use crate::tensor::Tensor;
use api::{DevPtr, DeviceInfo, GpuApi};
use kernels::Kernels;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What kind of memory a tracked range is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Device memory.
    Device,
    /// Host memory registered for the device (buffer_from_host_ptr), readable and writable,
    /// or only readable (a read-only file mapping).
    Host { writable: bool },
}

/// What the device, its buffers and its backends share.
pub struct GpuCtx {
    pub api: Arc<dyn GpuApi>,
    pub ord: usize,
    pub info: DeviceInfo,
    /// Compiled group by group on first use (kernels.rs).
    pub kernels: Kernels,
    /// Live allocations (base -> size, kind): kernels only ever get addresses inside these.
    allocs: Mutex<BTreeMap<DevPtr, (usize, Memory)>>,
    /// The host's reads and writes of device memory (made on first use; see `Io`).
    io: Mutex<Option<Io>>,
    /// Staged writes queued so far (a backend compares it with what it last waited for).
    staged: AtomicU64,
}

/// Reads, writes, fills and copies of device memory that the host asks for (buffer
/// get/set/memset/cpy) run on one non-blocking stream per device, under the lock, and are
/// waited for before the call returns, except small staged writes (staging.rs). Never the
/// legacy stream: with several backends of one device used from several threads, work on
/// the legacy stream would wait for (and so break) a graph capture on another thread's stream.
struct Io {
    stream: api::Stream,
    /// Recorded after the staged writes when a backend asks to wait for them.
    staged_event: api::Event,
    /// Staged writes were queued since `staged_event` was last recorded.
    unrecorded: bool,
    /// None where the runtime gave no pinned memory or ROCMFORGE_GPU_STAGING=0.
    staging: Option<staging::Staging>,
}

impl GpuCtx {
    /// A context over any runtime (the fault-injecting mock of the tests).
    #[cfg(test)]
    pub fn for_test(
        api: Arc<dyn GpuApi>,
        info: DeviceInfo,
        cache_dir: Option<std::path::PathBuf>,
    ) -> Arc<GpuCtx> {
        Arc::new(GpuCtx {
            kernels: Kernels::new(api.clone(), 0, &info, cache_dir),
            api,
            ord: 0,
            info,
            allocs: Mutex::new(BTreeMap::new()),
            io: Mutex::new(None),
            staged: AtomicU64::new(0),
        })
    }

    /// Kernel groups were tried and every one failed: the device can then compute nothing
    /// (one failed group only fails the graphs that launch its kernels).
    pub fn kernels_failed(&self) -> bool {
        self.kernels.all_failed()
    }

    /// The I/O stream and staging, made on first use (a failure is not remembered).
    fn io(&self) -> api::ApiResult<MutexGuard<'_, Option<Io>>> {
        let mut g = self.io.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let (api, ord) = (self.api.as_ref(), self.ord);
            let stream = api.stream_create(ord)?;
            let staged_event = match api.event_create(ord) {
                Ok(e) => e,
                Err(e) => {
                    api.stream_destroy(ord, stream);
                    return Err(e);
                }
            };
            let wanted = crate::tuning::get().gpu_staging;
            *g = Some(Io {
                stream,
                staged_event,
                unrecorded: false,
                staging: wanted.then(|| staging::Staging::new(api, ord)).flatten(),
            });
        }
        Ok(g)
    }

    /// Queues `op` on the I/O stream and waits for it (and for the staged writes before it).
    fn io_sync(
        &self,
        op: impl FnOnce(&dyn GpuApi, usize, api::Stream) -> api::ApiResult<()>,
    ) -> api::ApiResult<()> {
        let g = self.io()?;
        let io = g.as_ref().ok_or("no I/O stream")?;
        let (api, ord) = (self.api.as_ref(), self.ord);
        op(api, ord, io.stream)?;
        api.stream_sync(ord, io.stream)
    }

    /// Writes `data` to device memory at `dst`; every later reader sees it as after a
    /// synchronous copy. Small writes return without waiting for the copy (staging.rs).
    pub fn write_device(&self, dst: DevPtr, data: &[u8]) -> api::ApiResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        if data.len() <= staging::STAGE_MAX {
            let mut g = self.io()?;
            let io = g.as_mut().ok_or("no I/O stream")?;
            if let Some(st) = io.staging.as_mut() {
                st.write(self.api.as_ref(), self.ord, io.stream, dst, data)?;
                io.unrecorded = true;
                self.staged.fetch_add(1, Ordering::Release);
                return Ok(());
            }
        }
        in_page_pieces(data.as_ptr() as usize, 0, data.len(), &mut |at, len| {
            let src = data[at..at + len].as_ptr();
            self.io_sync(|api, ord, s| api.copy_htod_async(ord, dst + at as u64, src, len, s))
        })
    }

    /// Reads device memory at `src` into `out` (after every write the host made before).
    pub fn read_device(&self, out: &mut [u8], src: DevPtr) -> api::ApiResult<()> {
        if out.is_empty() {
            return Ok(());
        }
        let (ptr, len) = (out.as_mut_ptr(), out.len());
        self.io_sync(|api, ord, s| api.copy_dtoh_async(ord, ptr, src, len, s))
    }

    /// Fills `len` bytes of device memory at `dst` with `value`.
    pub fn fill_device(&self, dst: DevPtr, value: u8, len: usize) -> api::ApiResult<()> {
        if len == 0 {
            return Ok(());
        }
        self.io_sync(|api, ord, s| api.memset_async(ord, dst, value, len, s))
    }

    /// Copies `len` bytes inside this device's memory.
    pub fn copy_device(&self, dst: DevPtr, src: DevPtr, len: usize) -> api::ApiResult<()> {
        if len == 0 {
            return Ok(());
        }
        self.io_sync(|api, ord, s| api.copy_dtod_async(ord, dst, src, len, s))
    }

    /// Makes work queued on `s` (a backend's stream) after this call wait for the staged
    /// writes made so far. `seen`: the count of staged writes `s` already waits for.
    pub fn order_after_staged(&self, s: api::Stream, seen: &mut u64) -> api::ApiResult<()> {
        if self.staged.load(Ordering::Acquire) == *seen {
            return Ok(());
        }
        let mut g = self.io()?;
        let io = g.as_mut().ok_or("no I/O stream")?;
        let now = self.staged.load(Ordering::Acquire);
        let (api, ord) = (self.api.as_ref(), self.ord);
        if io.unrecorded {
            api.event_record(ord, io.staged_event, io.stream)?;
            io.unrecorded = false;
        }
        api.stream_wait_event(ord, s, io.staged_event)?;
        *seen = now;
        Ok(())
    }

    /// Waits for the staged writes still queued (before device memory is freed).
    pub fn quiesce_staging(&self) {
        let mut g = self.io.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(io) = g.as_mut() {
            if let Some(st) = io.staging.as_mut() {
                if let Err(e) = st.quiesce(self.api.as_ref(), self.ord, io.stream) {
                    crate::log_warn!("waiting for staged writes: {e}");
                }
            }
        }
    }

    pub fn track(&self, ptr: DevPtr, size: usize, kind: Memory) {
        self.allocs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr, (size, kind));
    }

    pub fn untrack(&self, ptr: DevPtr) {
        self.allocs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ptr);
    }

    /// Whether [ptr, ptr+len) lies inside one of our ranges (kernels may read it).
    pub fn owns(&self, ptr: DevPtr, len: usize) -> bool {
        self.region(ptr, len).is_some()
    }

    /// Whether kernels may write [ptr, ptr+len).
    pub fn owns_writable(&self, ptr: DevPtr, len: usize) -> bool {
        matches!(
            self.region(ptr, len),
            Some(Memory::Device | Memory::Host { writable: true })
        )
    }

    /// Whether [ptr, ptr+len) lies in device memory (what the copy engines take as device addresses).
    pub fn owns_device(&self, ptr: DevPtr, len: usize) -> bool {
        self.region(ptr, len) == Some(Memory::Device)
    }

    /// The kind of the one range holding [ptr, ptr+len), if any.
    fn region(&self, ptr: DevPtr, len: usize) -> Option<Memory> {
        let allocs = self.allocs.lock().unwrap_or_else(|e| e.into_inner());
        let (&base, &(size, kind)) = allocs.range(..=ptr).next_back()?;
        let end = ptr.checked_add(len as u64)?;
        (end <= base + size as u64).then_some(kind)
    }
}

/// Makes the copy of bytes [at, at + len) of a host range starting at address `base` with `f`;
/// where the driver refuses it, in two pieces split at a page boundary, and so on down to single
/// pages. The driver refuses a copy whose host range is partly page-locked and partly not: RFCPU
/// page-locks the part of a mapped model file it holds, and a GPU tensor tied to it (the output
/// head of a model with tied embeddings) is copied from the same pages, its first and last
/// partial pages not locked.
/// Copies the driver refused (counted for ROCMFORGE_FFI_TIMING's phases).
pub static REFUSED_COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn in_page_pieces(
    base: usize,
    at: usize,
    len: usize,
    f: &mut dyn FnMut(usize, usize) -> api::ApiResult<()>,
) -> api::ApiResult<()> {
    const PAGE: usize = 4096;
    let r = f(at, len);
    if r.is_err() {
        REFUSED_COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    match r {
        Ok(()) => Ok(()),
        // Only the driver's "invalid value" (CUDA_ERROR_INVALID_VALUE, hipErrorInvalidValue:
        // code 1, the APIs' messages end in "(1)") is what a partly locked range gives; any
        // other failure is the caller's to report.
        Err(e) if !e.ends_with("(1)") => Err(e),
        Err(e) => {
            let start = base + at;
            let mid = ((start + len / 2) & !(PAGE - 1)).max((start + 1).next_multiple_of(PAGE));
            if mid <= start || mid >= start + len {
                return Err(e);
            }
            in_page_pieces(base, at, mid - start, f)?;
            in_page_pieces(base, at + (mid - start), len - (mid - start), f)
        }
    }
}

impl Drop for GpuCtx {
    fn drop(&mut self) {
        let (api, ord) = (self.api.as_ref(), self.ord);
        if let Some(mut io) = self.io.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            if let Some(st) = io.staging.as_mut() {
                st.free(api, ord, io.stream);
            }
            let _ = api.stream_sync(ord, io.stream);
            api.event_destroy(ord, io.staged_event);
            api.stream_destroy(ord, io.stream);
        }
    }
}

/// A `ggml_backend_event` of a GPU device.
pub struct GpuEvent {
    pub ctx: Arc<GpuCtx>,
    pub event: api::Event,
}

impl Drop for GpuEvent {
    fn drop(&mut self) {
        self.ctx.api.event_destroy(self.ctx.ord, self.event);
    }
}

impl Event for GpuEvent {
    fn synchronize(&self) -> Result<()> {
        self.ctx
            .api
            .event_sync(self.ctx.ord, self.event)
            .map_err(Error::Device)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

pub struct GpuDevice {
    ctx: Arc<GpuCtx>,
    /// n of RFGPUn.
    index: usize,
    name: CString,
    /// "rocmforge-gpu<ordinal>": RFHYBRID over this GPU reports the same id.
    device_id: CString,
    description: CString,
    buffer_type: buffer::GpuBufferType,
    host_buffer_type: buffer::GpuHostBufferType,
}

impl GpuDevice {
    fn new(api: Arc<dyn GpuApi>, ord: usize, info: DeviceInfo, index: usize) -> GpuDevice {
        let name = CString::new(format!("RFGPU{index}")).unwrap();
        let description = CString::new(info.name.replace('\0', "")).unwrap_or_default();
        let ctx = Arc::new(GpuCtx {
            kernels: Kernels::new(api.clone(), ord, &info, kernels::cache_dir()),
            api,
            ord,
            info,
            allocs: Mutex::new(BTreeMap::new()),
            io: Mutex::new(None),
            staged: AtomicU64::new(0),
        });
        let buffer_type = buffer::GpuBufferType::new(ctx.clone(), name.clone());
        let host_name = CString::new(format!("RFGPU{index}_Host")).unwrap();
        let host_buffer_type = buffer::GpuHostBufferType::new(ctx.clone(), host_name);
        GpuDevice {
            ctx,
            index,
            name,
            device_id: CString::new(format!("rocmforge-gpu{index}")).unwrap(),
            description,
            buffer_type,
            host_buffer_type,
        }
    }
}

impl Device for GpuDevice {
    fn name(&self) -> &CStr {
        &self.name
    }
    fn description(&self) -> &CStr {
        &self.description
    }
    fn memory(&self) -> (usize, usize) {
        self.ctx
            .api
            .mem_info(self.ctx.ord)
            .unwrap_or((self.ctx.info.total_mem, self.ctx.info.total_mem))
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_: true,
            host_buffer: true,
            // False although `buffer_from_host_ptr` works where the driver allows (as ggml-cuda
            // reports): with it, libllama (llama-model.cpp, load_tensors) would wrap every
            // mmap'd weight of this device in host memory instead of copying it to the GPU,
            // so kernels would read the weights over PCIe on every token, and a NULL from us
            // (driver without it) aborts the model load. Hosts may still call it directly.
            buffer_from_host_ptr: false,
            events: true,
            // Loading from a mapped file works: weights are copied from the mapping into
            // device memory. (False here would turn mmap off for the whole model.)
            mmap_support: true,
        }
    }
    fn buffer_type(&self) -> &dyn BufferType {
        &self.buffer_type
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(backend::GpuBackend::new(
            self.ctx.clone(),
            self.name.clone(),
        )?))
    }
    fn offload_op(&self, node: &Tensor) -> bool {
        offload_pays(node, offload_min_batch())
    }
    fn supports_op(&self, node: &Tensor) -> bool {
        let ok = !self.ctx.kernels_failed()
            && ops::supports(node)
            && crate::ffi::split::split_reads_ok(node, self.index);
        if !ok && crate::ffi::log::debug_enabled() && node.types_known() {
            // ROCMFORGE_DEBUG: which nodes the scheduler has to place elsewhere, and why.
            let types: Vec<String> = (0..4)
                .filter_map(|i| node.src(i))
                .map(|s| format!("{:?}", s.dtype()))
                .collect();
            crate::log_debug!(
                "{}: declines op {} -> {:?} <- [{}] ne {:?}",
                self.name.to_string_lossy(),
                node.op(),
                node.dtype(),
                types.join(" "),
                node.ne()
            );
        }
        ok
    }
    fn host_buffer_type(&self) -> Option<&dyn BufferType> {
        Some(&self.host_buffer_type)
    }
    fn device_id(&self) -> Option<&CStr> {
        Some(&self.device_id)
    }
    fn buffer_from_host_ptr(&self, ptr: *mut u8, size: usize) -> Option<Box<dyn Buffer>> {
        match buffer::RegisteredHostBuffer::new(self.ctx.clone(), ptr, size) {
            Ok(b) => Some(Box::new(b)),
            Err(e) => {
                crate::log_info!(
                    "{}: host memory not usable by the device: {e}",
                    self.name.to_string_lossy()
                );
                None
            }
        }
    }
    fn pin_host(&self, ptr: *mut u8, len: usize) -> Option<Box<dyn std::any::Any + Send>> {
        match pinned::PinnedHost::new(self.ctx.clone(), ptr, len) {
            Ok(p) => {
                crate::log_debug!(
                    "{}: pinned {} KiB of host memory at {ptr:p} for copies to the device",
                    self.name.to_string_lossy(),
                    p.bytes() >> 10
                );
                Some(Box::new(p))
            }
            Err(e) => {
                crate::log_debug!(
                    "{}: host memory at {ptr:p} ({len} bytes) not pinned, copies from it stay pageable: {e}",
                    self.name.to_string_lossy()
                );
                None
            }
        }
    }
    fn new_event(&self) -> Option<Result<Box<dyn Event>>> {
        let made = self
            .ctx
            .api
            .event_create(self.ctx.ord)
            .map_err(Error::Device);
        Some(made.map(|event| {
            Box::new(GpuEvent {
                ctx: self.ctx.clone(),
                event,
            }) as Box<dyn Event>
        }))
    }
}

/// Fewest columns (tokens) of a batch for which the GPU takes an op whose weights live in host
/// memory (ggml's scheduler then copies the weights over for every batch, as it does for
/// ggml-cuda's `offload_op`): a prompt's products are worth the copy, a token's are not.
fn offload_min_batch() -> usize {
    crate::tuning::get().gpu_offload_min_batch
}

/// Whether a node with host-resident weights runs faster on the GPU with its weights copied
/// over: every op but GET_ROWS (which reads a few rows of its table) once its batch reaches
/// `min_batch`. The batch is what one weight byte is reused over: a product's columns, the
/// tokens of MUL_MAT_ID and ROPE, the rows of the rest.
fn offload_pays(node: &Tensor, min_batch: usize) -> bool {
    use crate::ggml_types::op;
    let ne = node.ne();
    let batch = match node.op() {
        op::GET_ROWS => return false,
        op::MUL_MAT => ne[1] * ne[2] * ne[3],
        op::MUL_MAT_ID | op::ROPE => ne[2],
        _ => ne[1] * ne[2] * ne[3],
    };
    min_batch > 0 && batch >= min_batch
}

/// Which vendor runtimes to try: `ROCMFORGE_GPU=0` disables GPUs, `ROCMFORGE_GPU=hip|cuda` picks one.
fn wanted(vendor: &str) -> bool {
    match crate::tuning::get().gpu.as_deref() {
        Some(v) if v == "0" || v == "off" || v == "none" => false,
        Some(v) if v == "hip" || v == "cuda" => v == vendor,
        _ => true,
    }
}

/// The contexts of the GPUs `discover` found, in RFGPU order (the row split's devices).
static CONTEXTS: once_cell::sync::OnceCell<Vec<Arc<GpuCtx>>> = once_cell::sync::OnceCell::new();

/// Every GPU's context, RFGPU0 first; empty before discovery or without GPUs.
pub fn contexts() -> &'static [Arc<GpuCtx>] {
    CONTEXTS.get().map_or(&[], Vec::as_slice)
}

/// Finds every usable GPU. Never fails: what is missing is logged and skipped.
pub fn discover() -> Vec<Box<dyn Device>> {
    let mut apis: Vec<Arc<dyn GpuApi>> = Vec::new();
    if wanted("hip") {
        match hip::HipApi::open() {
            Ok(a) => apis.push(Arc::new(a)),
            Err(e) => crate::log_info!("no AMD GPU: {e}"),
        }
    }
    if wanted("cuda") {
        match cuda::CudaApi::open() {
            Ok(a) => apis.push(Arc::new(a)),
            Err(e) => crate::log_info!("no NVIDIA GPU: {e}"),
        }
    }
    let mut devices: Vec<Box<dyn Device>> = Vec::new();
    let mut ctxs = Vec::new();
    for api in apis {
        for ord in 0..api.device_count() {
            match api.device_info(ord) {
                Ok(info) => {
                    let index = devices.len();
                    crate::log_info!(
                        "RFGPU{index}: {} ({} {}, {} MiB, {} compute units)",
                        info.name,
                        api.vendor(),
                        info.arch,
                        info.total_mem >> 20,
                        info.compute_units
                    );
                    let dev = GpuDevice::new(api.clone(), ord, info, index);
                    ctxs.push(dev.ctx.clone());
                    devices.push(Box::new(dev));
                }
                Err(e) => crate::log_warn!("{} device {ord} skipped: {e}", api.vendor()),
            }
        }
    }
    // Discovery runs once (the registry's); a second call keeps the first list.
    let _ = CONTEXTS.set(ctxs);
    devices
}

#[cfg(test)]
mod tests {
    /// A copy refused over a range that is partly page-locked is made in pieces that never
    /// straddle the locked pages' ends.
    #[test]
    fn a_refused_copy_is_made_in_page_pieces() {
        let (lo, hi) = (0x10_3000usize, 0x10_9000usize); // locked pages
        let base = 0x10_2f00usize; // the tensor starts 256 bytes before them
        let len = 0x7000usize;
        let mut done = Vec::new();
        let r = super::in_page_pieces(base, 0, len, &mut |at, n| {
            let (a, b) = (base + at, base + at + n);
            let partly = (a < lo && b > lo) || (a < hi && b > hi);
            if partly {
                return Err("cuMemcpyHtoDAsync: invalid argument (1)".into());
            }
            done.push((at, n));
            Ok(())
        });
        assert!(r.is_ok());
        done.sort();
        let mut next = 0;
        for (at, n) in done {
            assert_eq!(at, next, "pieces in order without gaps");
            next = at + n;
        }
        assert_eq!(next, len);
        // Another failure is reported as it is, not retried in pieces.
        let mut calls = 0;
        let r = super::in_page_pieces(base, 0, len, &mut |_, _| {
            calls += 1;
            Err("cuMemcpyHtoDAsync: out of memory (2)".into())
        });
        assert!(r.is_err() && calls == 1);
    }

    use crate::cpu::ops::testutil::TT;
    use crate::ggml_types::{op, GgmlType};

    #[test]
    fn offload_takes_batches_from_the_threshold_on() {
        let mut mm = TT::new(GgmlType::F32, [4096, 31, 1, 1]);
        mm.op(op::MUL_MAT);
        assert!(!super::offload_pays(&mm.tensor(), 32));
        let mut mm = TT::new(GgmlType::F32, [4096, 32, 1, 1]);
        mm.op(op::MUL_MAT);
        assert!(super::offload_pays(&mm.tensor(), 32));
        assert!(
            !super::offload_pays(&mm.tensor(), 0),
            "0 turns offloading off"
        );
        // MUL_MAT_ID: [rows, experts used, tokens]; the tokens are the batch.
        let mut id = TT::new(GgmlType::F32, [768, 8, 16, 1]);
        id.op(op::MUL_MAT_ID);
        assert!(!super::offload_pays(&id.tensor(), 32));
        let mut id = TT::new(GgmlType::F32, [768, 8, 512, 1]);
        id.op(op::MUL_MAT_ID);
        assert!(super::offload_pays(&id.tensor(), 32));
        // GET_ROWS reads a few rows of its table: never worth copying the table.
        let mut gr = TT::new(GgmlType::F32, [4096, 512, 1, 1]);
        gr.op(op::GET_ROWS);
        assert!(!super::offload_pays(&gr.tensor(), 32));
    }

    #[test]
    fn discovery_without_a_gpu_is_quiet_and_empty_or_valid() {
        // On machines without a GPU this must return nothing, and never panic.
        let devs = super::discover();
        for (i, d) in devs.iter().enumerate() {
            assert_eq!(d.name().to_str().unwrap(), format!("RFGPU{i}"));
        }
    }
}
