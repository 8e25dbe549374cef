//! A stand-in GPU for tests without one (ROCMFORGE_HYBRID_FAKE_GPU=1): an RFCPU device with its
//! own allocations, so that RFHYBRID's placement, copies and residency run for real and give
//! ggml-cpu's results. It declines GET_ROWS and SOFT_MAX, so graphs cross between the devices,
//! and has events (no-ops: its streams finish each call before returning), so the ordering
//! of the weight-streaming copy stream runs too.

use crate::cpu::CpuDevice;
use crate::device::{Backend, BufferType, Device, DeviceCaps, DeviceKind, Event, Result};
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
        Ok(Box::new(FakeStream(self.inner.new_backend()?)))
    }
    fn new_event(&self) -> Option<Result<Box<dyn Event>>> {
        Some(Ok(Box::new(Done)))
    }
    fn supports_op(&self, node: &Tensor) -> bool {
        !matches!(node.op(), op::GET_ROWS | op::SOFT_MAX) && self.inner.supports_op(node)
    }
}

/// An RFCPU backend whose event calls succeed (its work is done when a call returns).
struct FakeStream(Box<dyn Backend>);

impl Backend for FakeStream {
    fn name(&self) -> &CStr {
        c"FAKEGPU"
    }
    fn compute(&mut self, nodes: &[Tensor]) -> Result<()> {
        self.0.compute(nodes)
    }
    fn set_n_threads(&mut self, n: usize) {
        self.0.set_n_threads(n)
    }
    fn record_event(&mut self, _event: &dyn Event) -> Result<bool> {
        Ok(true)
    }
    fn wait_event(&mut self, _event: &dyn Event) -> Result<bool> {
        Ok(true)
    }
}

struct Done;

impl Event for Done {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
