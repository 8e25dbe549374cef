//! Device-memory buffers. The host never touches them directly: reads and writes are copies.

use super::api::DevPtr;
use super::GpuCtx;
use crate::device::{Buffer, BufferType, Error, Result};
use std::ffi::{CStr, CString};
use std::sync::Arc;

/// Alignment of tensor data in device memory (what the allocators give, and enough for
/// any vector load a kernel may do).
pub const ALIGNMENT: usize = 256;

pub struct GpuBufferType {
    ctx: Arc<GpuCtx>,
    name: CString,
}

impl GpuBufferType {
    pub fn new(ctx: Arc<GpuCtx>, name: CString) -> GpuBufferType {
        GpuBufferType { ctx, name }
    }
}

impl BufferType for GpuBufferType {
    fn name(&self) -> &CStr {
        &self.name
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        let ptr = self.ctx.api.alloc(self.ctx.ord, size).map_err(Error::Alloc)?;
        self.ctx.track(ptr, size.max(1));
        Ok(Box::new(GpuBuffer { ctx: self.ctx.clone(), ptr, size }))
    }
    fn alignment(&self) -> usize {
        ALIGNMENT
    }
    fn max_size(&self) -> usize {
        self.ctx.info.total_mem.max(1)
    }
    fn is_host(&self) -> bool {
        false
    }
}

pub struct GpuBuffer {
    ctx: Arc<GpuCtx>,
    ptr: DevPtr,
    size: usize,
}

impl GpuBuffer {
    fn check(&self, offset: usize, len: usize) -> Result<DevPtr> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(self.ptr + offset as u64),
            _ => Err(Error::Unsupported(format!("range {offset}+{len} outside buffer of {} bytes", self.size))),
        }
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        self.ctx.untrack(self.ptr);
        self.ctx.api.free(self.ctx.ord, self.ptr);
    }
}

impl Buffer for GpuBuffer {
    fn base(&self) -> *mut u8 {
        self.ptr as usize as *mut u8
    }
    fn size(&self) -> usize {
        self.size
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self.check(offset, data.len())?;
        self.ctx.api.copy_htod(self.ctx.ord, dst, data).map_err(Error::Device)
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.check(offset, out.len())?;
        self.ctx.api.copy_dtoh(self.ctx.ord, out, src).map_err(Error::Device)
    }
    fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.api.memset(self.ctx.ord, dst, value, len).map_err(Error::Device)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn copy_from_same_type(&mut self, offset: usize, src: *const u8, len: usize) -> Result<bool> {
        let dst = self.check(offset, len)?;
        let src = src as usize as DevPtr;
        if !self.ctx.owns(src, len) {
            return Ok(false);
        }
        self.ctx.api.copy_dtod(self.ctx.ord, dst, src, len).map_err(Error::Device)?;
        Ok(true)
    }
}
