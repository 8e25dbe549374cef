//! A stand-in GPU for tests without one (ROCMFORGE_HYBRID_FAKE_GPU=1): an RFCPU device with its
//! own allocations, so that RFHYBRID's placement, copies and residency run for real and give
//! ggml-cpu's results. It declines GET_ROWS and SOFT_MAX, so graphs cross between the devices.

use crate::cpu::CpuDevice;
use crate::device::{Backend, BufferType, Device, DeviceCaps, DeviceKind, Result};
use crate::ggml_types::op;
use crate::tensor::Tensor;
use std::ffi::CStr;

pub struct FakeGpu {
    inner: CpuDevice,
}

impl FakeGpu {
    pub fn new() -> FakeGpu {
        FakeGpu {
            inner: CpuDevice::new(),
        }
    }
}

impl Default for FakeGpu {
    fn default() -> Self {
        Self::new()
    }
}

impl Device for FakeGpu {
    fn name(&self) -> &CStr {
        c"FAKEGPU"
    }
    fn description(&self) -> &CStr {
        c"stand-in GPU (host memory)"
    }
    fn memory(&self) -> (usize, usize) {
        (1 << 30, 1 << 30)
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }
    fn buffer_type(&self) -> &dyn BufferType {
        self.inner.buffer_type()
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        self.inner.new_backend()
    }
    fn supports_op(&self, node: &Tensor) -> bool {
        !matches!(node.op(), op::GET_ROWS | op::SOFT_MAX) && self.inner.supports_op(node)
    }
}
