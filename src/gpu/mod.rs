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

use crate::device::{Backend, BufferType, Device, DeviceCaps, DeviceKind, Result};
use crate::tensor::Tensor;
use api::{DevPtr, DeviceInfo, GpuApi};
use kernels::Kernels;
use once_cell::sync::OnceCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};

/// What the device, its buffers and its backends share.
pub struct GpuCtx {
    pub api: Arc<dyn GpuApi>,
    pub ord: usize,
    pub info: DeviceInfo,
    kernels: OnceCell<std::result::Result<Kernels, String>>,
    /// Live allocations (base -> size): kernels only ever get addresses inside these.
    allocs: Mutex<BTreeMap<DevPtr, usize>>,
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

    pub fn track(&self, ptr: DevPtr, size: usize) {
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).insert(ptr, size);
    }

    pub fn untrack(&self, ptr: DevPtr) {
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr);
    }

    /// Whether [ptr, ptr+len) lies inside one of our allocations.
    pub fn owns(&self, ptr: DevPtr, len: usize) -> bool {
        let allocs = self.allocs.lock().unwrap_or_else(|e| e.into_inner());
        match allocs.range(..=ptr).next_back() {
            Some((&base, &size)) => ptr.checked_add(len as u64).is_some_and(|end| end <= base + size as u64),
            None => false,
        }
    }
}

pub struct GpuDevice {
    ctx: Arc<GpuCtx>,
    name: CString,
    description: CString,
    buffer_type: buffer::GpuBufferType,
}

impl GpuDevice {
    fn new(api: Arc<dyn GpuApi>, ord: usize, info: DeviceInfo, index: usize) -> GpuDevice {
        let name = CString::new(format!("RFGPU{index}")).unwrap();
        let description = CString::new(info.name.replace('\0', "")).unwrap_or_default();
        let ctx = Arc::new(GpuCtx { api, ord, info, kernels: OnceCell::new(), allocs: Mutex::new(BTreeMap::new()) });
        let buffer_type = buffer::GpuBufferType::new(ctx.clone(), name.clone());
        GpuDevice { ctx, name, description, buffer_type }
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
        self.ctx.api.mem_info(self.ctx.ord).unwrap_or((self.ctx.info.total_mem, self.ctx.info.total_mem))
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps { async_: false, host_buffer: false, buffer_from_host_ptr: false, events: false }
    }
    fn buffer_type(&self) -> &dyn BufferType {
        &self.buffer_type
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(backend::GpuBackend::new(self.ctx.clone(), self.name.clone())?))
    }
    fn supports_op(&self, node: &Tensor) -> bool {
        let ok = !self.ctx.kernels_failed() && ops::supports(node);
        if !ok && crate::ffi::log::debug_enabled() && node.types_known() {
            // ROCMFORGE_DEBUG: which nodes the scheduler has to place elsewhere, and why.
            let types: Vec<String> = (0..4).filter_map(|i| node.src(i)).map(|s| format!("{:?}", s.dtype())).collect();
            crate::log_debug!("{}: declines op {} -> {:?} <- [{}] ne {:?}", self.name.to_string_lossy(), node.op(), node.dtype(), types.join(" "), node.ne());
        }
        ok
    }
}

/// Which vendor runtimes to try: `ROCMFORGE_GPU=0` disables GPUs, `ROCMFORGE_GPU=hip|cuda` picks one.
fn wanted(vendor: &str) -> bool {
    match std::env::var("ROCMFORGE_GPU").map(|v| v.to_ascii_lowercase()) {
        Ok(v) if v == "0" || v == "off" || v == "none" => false,
        Ok(v) if v == "hip" || v == "cuda" => v == vendor,
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
    #[test]
    fn discovery_without_a_gpu_is_quiet_and_empty_or_valid() {
        // On machines without a GPU this must return nothing, and never panic.
        let devs = super::discover();
        for (i, d) in devs.iter().enumerate() {
            assert_eq!(d.name().to_str().unwrap(), format!("RFGPU{i}"));
        }
    }
}
