//! The RFCPU device: host-memory buffers and a multi-threaded graph executor over Rust kernels.

pub mod amx;
pub mod backend;
pub mod buffer;
pub mod ops;
pub mod pool;
pub mod profile;
pub mod quants;
pub mod repack;
pub mod simd;
pub mod types;

use crate::device::{Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Result};
use crate::tensor::Tensor;
use std::ffi::{CStr, CString};

pub struct CpuDevice {
    description: CString,
    buffer_type: buffer::HostBufferType,
    repack_type: repack::RepackBufferType,
}

impl CpuDevice {
    pub fn new() -> CpuDevice {
        if !repack::enabled() {
            crate::log_info!("RFCPU_REPACK disabled: {}", repack::why_disabled());
        }
        CpuDevice {
            description: CString::new(cpu_model_name()).unwrap_or_default(),
            buffer_type: buffer::HostBufferType,
            repack_type: repack::RepackBufferType,
        }
    }
}

impl Default for CpuDevice {
    fn default() -> Self {
        Self::new()
    }
}

fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "CPU".to_string())
}

/// (available, total) system memory in bytes.
pub fn system_memory() -> (usize, usize) {
    let mut avail = 0usize;
    let mut total = 0usize;
    if let Ok(s) = std::fs::read_to_string("/proc/meminfo") {
        for l in s.lines() {
            let kb = || {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0)
                    * 1024
            };
            if l.starts_with("MemTotal:") {
                total = kb();
            } else if l.starts_with("MemAvailable:") {
                avail = kb();
            }
        }
    }
    (avail, total)
}

impl Device for CpuDevice {
    fn name(&self) -> &CStr {
        c"RFCPU"
    }
    fn description(&self) -> &CStr {
        &self.description
    }
    fn memory(&self) -> (usize, usize) {
        system_memory()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_: false,
            host_buffer: false,
            buffer_from_host_ptr: true,
            events: false,
            mmap_support: true,
        }
    }
    fn buffer_type(&self) -> &dyn BufferType {
        &self.buffer_type
    }
    fn extra_buffer_type(&self) -> Option<&dyn BufferType> {
        repack::enabled().then_some(&self.repack_type as &dyn BufferType)
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(backend::CpuBackend::new(default_threads())?))
    }
    fn supports_op(&self, node: &Tensor) -> bool {
        ops::supports(node)
    }
    fn buffer_from_host_ptr(&self, ptr: *mut u8, size: usize) -> Option<Box<dyn Buffer>> {
        Some(Box::new(buffer::HostBuffer::borrowed(ptr, size)))
    }
}

/// Threads used until the host sets a number: the machine's available parallelism.
pub fn default_threads() -> usize {
    crate::tuning::get()
        .threads
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .max(1)
}
