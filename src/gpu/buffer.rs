//! Buffers of a GPU device: device memory (the host never touches it directly: reads and
//! writes are copies), pinned host memory (`RFGPUn_Host`: plain host memory for the CPU
//! backends, fastest for the copy engines), and host ranges registered for the device
//! (`buffer_from_host_ptr`).

use super::api::DevPtr;
use super::{GpuCtx, Memory};
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
        let ptr = self
            .ctx
            .api
            .alloc(self.ctx.ord, size)
            .map_err(Error::Alloc)?;
        self.ctx.track(ptr, size.max(1), Memory::Device);
        Ok(Box::new(GpuBuffer {
            ctx: self.ctx.clone(),
            ptr,
            size,
        }))
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
            _ => Err(Error::Unsupported(format!(
                "range {offset}+{len} outside buffer of {} bytes",
                self.size
            ))),
        }
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        // A staged write into this memory may still be queued.
        self.ctx.quiesce_staging();
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
        self.ctx.write_device(dst, data).map_err(Error::Device)
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.check(offset, out.len())?;
        self.ctx.read_device(out, src).map_err(Error::Device)
    }
    fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = self.check(offset, len)?;
        self.ctx.fill_device(dst, value, len).map_err(Error::Device)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn copy_from_same_type(&mut self, offset: usize, src: *const u8, len: usize) -> Result<bool> {
        let dst = self.check(offset, len)?;
        let src = src as usize as DevPtr;
        if !self.ctx.owns_device(src, len) {
            return Ok(false);
        }
        self.ctx.copy_device(dst, src, len).map_err(Error::Device)?;
        Ok(true)
    }
}

/// Alignment of tensors in pinned host buffers: that of RFCPU's buffers, so CPU kernels see
/// the same layout.
pub const HOST_ALIGNMENT: usize = crate::cpu::buffer::ALIGNMENT;

/// Page-locked host memory (`get_host_buffer_type`): host memory in every respect (CPU
/// backends compute on it), and copies between it and the device run asynchronously at full
/// speed, which is what the scheduler's input/output copies and libllama's staging use.
pub struct GpuHostBufferType {
    ctx: Arc<GpuCtx>,
    name: CString,
}

impl GpuHostBufferType {
    pub fn new(ctx: Arc<GpuCtx>, name: CString) -> GpuHostBufferType {
        GpuHostBufferType { ctx, name }
    }
}

impl BufferType for GpuHostBufferType {
    fn name(&self) -> &CStr {
        &self.name
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        let ptr = self
            .ctx
            .api
            .host_alloc(self.ctx.ord, size)
            .map_err(Error::Alloc)?;
        Ok(Box::new(GpuHostBuffer {
            ctx: self.ctx.clone(),
            ptr,
            size,
        }))
    }
    fn alignment(&self) -> usize {
        HOST_ALIGNMENT
    }
    fn is_host(&self) -> bool {
        true
    }
}

pub struct GpuHostBuffer {
    ctx: Arc<GpuCtx>,
    ptr: *mut u8,
    size: usize,
}

// Plain bytes; ggml serializes access to a buffer.
unsafe impl Send for GpuHostBuffer {}

impl GpuHostBuffer {
    fn check(&self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(unsafe { self.ptr.add(offset) }),
            _ => Err(Error::Unsupported(format!(
                "range {offset}+{len} outside buffer of {} bytes",
                self.size
            ))),
        }
    }
}

impl Drop for GpuHostBuffer {
    fn drop(&mut self) {
        self.ctx.api.host_free(self.ctx.ord, self.ptr);
    }
}

impl Buffer for GpuHostBuffer {
    fn base(&self) -> *mut u8 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self.check(offset, data.len())?;
        unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) };
        Ok(())
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.check(offset, out.len())?;
        unsafe { std::ptr::copy(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
    fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = self.check(offset, len)?;
        unsafe { std::ptr::write_bytes(dst, value, len) };
        Ok(())
    }
    fn is_host(&self) -> bool {
        true
    }
}

/// Host memory the caller owns (e.g. a memory-mapped model file), registered with the
/// driver so kernels read it in place. Only made where the device reaches it at the host's
/// own address (tensor `data` pointers are host addresses, and the same ones go to kernels).
/// A read-only mapping is registered read-only, and kernels may then not write it.
pub struct RegisteredHostBuffer {
    ctx: Arc<GpuCtx>,
    ptr: *mut u8,
    size: usize,
    /// The registered range: `ptr..ptr+size` widened to whole pages.
    start: *mut u8,
    writable: bool,
}

unsafe impl Send for RegisteredHostBuffer {}

impl RegisteredHostBuffer {
    pub fn new(ctx: Arc<GpuCtx>, ptr: *mut u8, size: usize) -> Result<RegisteredHostBuffer> {
        let (api, ord) = (&ctx.api, ctx.ord);
        let super::pinned::RegisteredPages {
            start,
            len,
            dev,
            writable,
        } = super::pinned::register_pages(api.as_ref(), ord, ptr, size)
            .map_err(Error::Unsupported)?;
        if dev != start as u64 {
            api.host_unregister(ord, start);
            return Err(Error::Unsupported(format!(
                "the device maps host {start:p} at {dev:#x}, not at the same address"
            )));
        }
        ctx.track(start as u64, len, Memory::Host { writable });
        Ok(RegisteredHostBuffer {
            ctx,
            ptr,
            size,
            start,
            writable,
        })
    }

    fn check(&self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(unsafe { self.ptr.add(offset) }),
            _ => Err(Error::Unsupported(format!(
                "range {offset}+{len} outside buffer of {} bytes",
                self.size
            ))),
        }
    }

    /// Kernels queued on any stream may still use the memory: let them finish first.
    fn drain(&self) -> Result<()> {
        self.ctx
            .api
            .device_sync(self.ctx.ord)
            .map_err(Error::Device)
    }
}

impl Drop for RegisteredHostBuffer {
    fn drop(&mut self) {
        self.ctx.untrack(self.start as u64);
        if let Err(e) = self.drain() {
            crate::log_warn!("{e}");
        }
        self.ctx.api.host_unregister(self.ctx.ord, self.start);
    }
}

impl Buffer for RegisteredHostBuffer {
    fn base(&self) -> *mut u8 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self.check(offset, data.len())?;
        if !self.writable {
            return Err(Error::Unsupported(
                "the host memory is a read-only mapping".into(),
            ));
        }
        self.drain()?;
        unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) };
        Ok(())
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.check(offset, out.len())?;
        self.drain()?;
        unsafe { std::ptr::copy(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
    fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = self.check(offset, len)?;
        if !self.writable {
            return Err(Error::Unsupported(
                "the host memory is a read-only mapping".into(),
            ));
        }
        self.drain()?;
        unsafe { std::ptr::write_bytes(dst, value, len) };
        Ok(())
    }
    /// Not host memory as far as ggml is concerned: it belongs to the GPU buffer type.
    fn is_host(&self) -> bool {
        false
    }
}
