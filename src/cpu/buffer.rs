//! Host-memory buffers: aligned allocations we own, or memory the host lends us
//! (`buffer_from_host_ptr`, e.g. a memory-mapped model file), used in place.

use crate::device::{Buffer, BufferType, Error, Result};
use std::ffi::CStr;

/// Alignment of tensor data; a multiple of every SIMD width we use.
pub const ALIGNMENT: usize = 64;
/// Buffers of at least this many bytes start and end on page boundaries.
pub const LARGE: usize = 1 << 20;
const PAGE: usize = 4096;

pub struct HostBufferType;

impl BufferType for HostBufferType {
    fn name(&self) -> &CStr {
        c"RFCPU"
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        Ok(Box::new(HostBuffer::alloc(size)?))
    }
    fn alignment(&self) -> usize {
        ALIGNMENT
    }
    fn is_host(&self) -> bool {
        true
    }
}

pub struct HostBuffer {
    ptr: *mut u8,
    size: usize,
    owned: bool,
}

// The memory is plain bytes; ggml serializes access to a buffer.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    pub fn alloc(size: usize) -> Result<HostBuffer> {
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        // Large buffers in whole pages: a GPU page-locks whole pages only, so a tensor at either
        // end of an unaligned buffer would be copied from pageable memory (RFHYBRID's compute
        // buffer's first input was).
        let (align, bytes) = if size >= LARGE {
            let Some(b) = size.checked_next_multiple_of(PAGE) else {
                return Err(Error::Alloc(format!("out of host memory for {size} bytes")));
            };
            (PAGE, b)
        } else {
            (ALIGNMENT, size.max(1))
        };
        let rc = unsafe { libc::posix_memalign(&mut p, align, bytes) };
        if rc != 0 || p.is_null() {
            return Err(Error::Alloc(format!("out of host memory for {size} bytes")));
        }
        Ok(HostBuffer {
            ptr: p as *mut u8,
            size,
            owned: true,
        })
    }

    pub fn borrowed(ptr: *mut u8, size: usize) -> HostBuffer {
        HostBuffer {
            ptr,
            size,
            owned: false,
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::Unsupported(format!(
                "range {offset}+{len} outside buffer of {} bytes",
                self.size
            ))),
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.owned {
            unsafe { libc::free(self.ptr as *mut libc::c_void) };
        }
    }
}

impl Buffer for HostBuffer {
    fn base(&self) -> *mut u8 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        unsafe { std::ptr::copy(data.as_ptr(), self.ptr.add(offset), data.len()) };
        Ok(())
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        unsafe { std::ptr::copy(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
    fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.check(offset, len)?;
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), value, len) };
        Ok(())
    }
    fn is_host(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_fill_and_bounds() {
        let mut b = HostBuffer::alloc(100).unwrap();
        assert_eq!(b.base() as usize % ALIGNMENT, 0);
        b.fill(0, 100, 7).unwrap();
        b.write(10, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 5];
        b.read(9, &mut out).unwrap();
        assert_eq!(out, [7, 1, 2, 3, 7]);
        assert!(b.write(99, &[1, 2]).is_err());
        assert!(b.read(usize::MAX, &mut out).is_err());
    }

    #[test]
    fn huge_allocation_fails_cleanly() {
        assert!(HostBuffer::alloc(usize::MAX / 2).is_err());
        // Rounding up to whole pages must not wrap around to a small allocation.
        assert!(HostBuffer::alloc(usize::MAX - 100).is_err());
    }

    #[test]
    fn large_buffers_are_whole_pages() {
        let b = HostBuffer::alloc(LARGE + 1).unwrap();
        assert_eq!(b.base() as usize % PAGE, 0);
        assert_eq!(b.size(), LARGE + 1);
    }
}
