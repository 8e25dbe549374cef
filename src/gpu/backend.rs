//! An RFGPU backend: one stream. A graph's kernels are queued in order on the stream, then
//! the stream is synchronized, so results are ready when `graph_compute` returns.

use super::api::{DevPtr, Stream};
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
    /// Scratch device memory (address, bytes) for ops that stage an operand; grows on demand.
    scratch: (DevPtr, usize),
}

impl GpuBackend {
    pub fn new(ctx: Arc<GpuCtx>, name: CString) -> Result<GpuBackend> {
        let stream = ctx.api.stream_create(ctx.ord).map_err(Error::Device)?;
        Ok(GpuBackend { ctx, stream, name, scratch: (0, 0) })
    }

    /// Makes the scratch at least `bytes` large. Work queued earlier may still use the old
    /// one, so the stream is drained before it is freed.
    fn ensure_scratch(&mut self, bytes: usize) -> Result<()> {
        if bytes <= self.scratch.1 {
            return Ok(());
        }
        let (api, ord) = (&self.ctx.api, self.ctx.ord);
        if self.scratch.0 != 0 {
            api.stream_sync(ord, self.stream).map_err(Error::Device)?;
            api.free(ord, self.scratch.0);
            self.scratch = (0, 0);
        }
        let size = bytes.next_power_of_two().max(1 << 20);
        let ptr = api.alloc(ord, size).map_err(Error::Device)?;
        self.scratch = (ptr, size);
        Ok(())
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
        if self.scratch.0 != 0 {
            self.ctx.api.free(self.ctx.ord, self.scratch.0);
        }
        self.ctx.api.stream_destroy(self.ctx.ord, self.stream);
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &CStr {
        &self.name
    }

    fn compute(&mut self, nodes: &[Tensor]) -> Result<()> {
        let need = nodes.iter().map(ops::scratch_bytes).max().unwrap_or(0);
        if need > 0 {
            self.ensure_scratch(need)?;
        }
        let ctx = self.ctx.clone();
        let kernels = ctx.kernels().map_err(Error::Device)?;
        let lc = ops::LaunchCtx {
            api: ctx.api.as_ref(),
            ord: ctx.ord,
            stream: self.stream,
            kernels,
            warp_size: ctx.info.warp_size,
            scratch: self.scratch.0,
        };
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
