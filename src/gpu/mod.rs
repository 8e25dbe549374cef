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
pub mod kernels;
pub mod ops;
pub mod staging;

use crate::device::{
    Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Error, Event, Result,
};
use crate::tensor::Tensor;
use api::{DevPtr, DeviceInfo, GpuApi};
use kernels::Kernels;
use once_cell::sync::OnceCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};

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
    kernels: OnceCell<std::result::Result<Kernels, String>>,
    /// Live allocations (base -> size, kind): kernels only ever get addresses inside these.
    allocs: Mutex<BTreeMap<DevPtr, (usize, Memory)>>,
    /// Staging of small writes (staging.rs): made on the first one; Some(None) where the
    /// runtime gave no pinned memory or ROCMFORGE_GPU_STAGING=0.
    staging: Mutex<Option<Option<staging::Staging>>>,
}

impl GpuCtx {
    /// The compiled kernels, compiling them on first use; a failure is remembered.
    pub fn kernels(&self) -> std::result::Result<&Kernels, String> {
        self.kernels
            .get_or_init(|| {
                Kernels::load(self.api.as_ref(), self.ord, &self.info).map_err(|e| {
                    crate::log_error!("GPU kernels for {} could not be built: {e}", self.info.arch);
                    e
                })
            })
            .as_ref()
            .map_err(|e| e.clone())
    }

    /// Kernels were tried and failed: the device can then compute nothing.
    pub fn kernels_failed(&self) -> bool {
        matches!(self.kernels.get(), Some(Err(_)))
    }

    /// Writes `data` to device memory at `dst`; every later reader sees it as after a
    /// synchronous copy. Small writes return without waiting for the copy (staging.rs).
    pub fn write_device(&self, dst: DevPtr, data: &[u8]) -> api::ApiResult<()> {
        if !data.is_empty() && data.len() <= staging::STAGE_MAX {
            let mut s = self.staging.lock().unwrap_or_else(|e| e.into_inner());
            let wanted = || crate::tuning::get().gpu_staging;
            let st = s.get_or_insert_with(|| {
                if wanted() {
                    staging::Staging::new(self.api.as_ref(), self.ord)
                } else {
                    None
                }
            });
            if let Some(st) = st.as_mut() {
                return st.write(self.api.as_ref(), self.ord, dst, data);
            }
        }
        self.api.copy_htod(self.ord, dst, data)
    }

    /// Waits for the staged writes still queued (before device memory is freed).
    pub fn quiesce_staging(&self) {
        let mut s = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(st)) = s.as_mut() {
            if let Err(e) = st.quiesce(self.api.as_ref(), self.ord) {
                crate::log_warn!("waiting for staged writes: {e}");
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

impl Drop for GpuCtx {
    fn drop(&mut self) {
        if let Some(Some(st)) = self
            .staging
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            st.free(self.api.as_ref(), self.ord);
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
    name: CString,
    description: CString,
    buffer_type: buffer::GpuBufferType,
    host_buffer_type: buffer::GpuHostBufferType,
}

impl GpuDevice {
    fn new(api: Arc<dyn GpuApi>, ord: usize, info: DeviceInfo, index: usize) -> GpuDevice {
        let name = CString::new(format!("RFGPU{index}")).unwrap();
        let description = CString::new(info.name.replace('\0', "")).unwrap_or_default();
        let ctx = Arc::new(GpuCtx {
            api,
            ord,
            info,
            kernels: OnceCell::new(),
            allocs: Mutex::new(BTreeMap::new()),
            staging: Mutex::new(None),
        });
        let buffer_type = buffer::GpuBufferType::new(ctx.clone(), name.clone());
        let host_name = CString::new(format!("RFGPU{index}_Host")).unwrap();
        let host_buffer_type = buffer::GpuHostBufferType::new(ctx.clone(), host_name);
        GpuDevice {
            ctx,
            name,
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
        let ok = !self.ctx.kernels_failed() && ops::supports(node);
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
                    devices.push(Box::new(GpuDevice::new(api.clone(), ord, info, index)));
                }
                Err(e) => crate::log_warn!("{} device {ord} skipped: {e}", api.vendor()),
            }
        }
    }
    devices
}

#[cfg(test)]
mod tests {
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
