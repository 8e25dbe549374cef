//! An RFGPU backend: one stream. A graph's kernels are queued in order on the stream, then
//! the stream is synchronized, so results are ready when `graph_compute` returns.

use super::api::Stream;
use super::ops;
use super::GpuCtx;
use crate::device::{Backend, Error, Result};
use crate::tensor::Tensor;
use std::ffi::{CStr, CString};
use std::sync::Arc;

pub struct GpuBackend {
    ctx: Arc<GpuCtx>,
    stream: Stream,
    name: CString,
}

impl GpuBackend {
    pub fn new(ctx: Arc<GpuCtx>, name: CString) -> Result<GpuBackend> {
        let stream = ctx.api.stream_create(ctx.ord).map_err(Error::Device)?;
        Ok(GpuBackend { ctx, stream, name })
    }

    /// Every tensor a kernel will touch must lie in this device's memory: a host address
    /// handed to a kernel would fault and poison the whole GPU context.
    fn check_memory(&self, node: &Tensor) -> Result<()> {
        let mut ts = vec![*node];
        ts.extend((0..crate::ffi::abi::GGML_MAX_SRC).filter_map(|i| node.src(i)));
        for t in ts {
            if t.is_empty() {
                continue;
            }
            if !self.ctx.owns(t.data() as usize as u64, t.nbytes()) {
                return Err(Error::Unsupported(format!("tensor '{}' is not in {} memory", t.name(), self.name.to_string_lossy())));
            }
        }
        Ok(())
    }
}

impl Drop for GpuBackend {
    fn drop(&mut self) {
        let _ = self.ctx.api.stream_sync(self.ctx.ord, self.stream);
        self.ctx.api.stream_destroy(self.ctx.ord, self.stream);
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &CStr {
        &self.name
    }

    fn compute(&mut self, nodes: &[Tensor]) -> Result<()> {
        let kernels = self.ctx.kernels().map_err(Error::Device)?;
        let lc = ops::LaunchCtx { api: self.ctx.api.as_ref(), ord: self.ctx.ord, stream: self.stream, kernels };
        for node in nodes {
            self.check_memory(node)?;
            ops::launch(node, &lc).map_err(|e| Error::Device(format!("node '{}': {e}", node.name())))?;
        }
        self.ctx.api.stream_sync(self.ctx.ord, self.stream).map_err(Error::Device)
    }

    fn synchronize(&mut self) -> Result<()> {
        self.ctx.api.stream_sync(self.ctx.ord, self.stream).map_err(Error::Device)
    }
}
