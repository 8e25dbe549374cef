//! Host memory of another device (RFCPU's weights) page-locked for this one, so that the
//! scheduler's copies of it to the GPU (ops offloaded from CPU-resident layers, `offload_op`)
//! run as DMA at full speed instead of through the driver's pageable staging. Unlike
//! `RegisteredHostBuffer` nothing here reads the memory from kernels: it only makes the copies
//! faster, so the device's own address for it does not matter and it is not tracked.

use super::api::{DevPtr, GpuApi};
use super::GpuCtx;
use std::sync::Arc;

/// Host pages registered with the driver by `register_pages`.
pub struct RegisteredPages {
    pub start: *mut u8,
    pub len: usize,
    /// The device's address for `start`.
    pub dev: DevPtr,
    /// Registered read-write (false: the memory refused that, read-only).
    pub writable: bool,
}

/// Registers [ptr, ptr+size) widened to whole pages with device `ord`: read-write first; a
/// read-only mapping (mmap'd weights) refuses that, so then read-only. Err: why neither.
pub fn register_pages(
    api: &dyn GpuApi,
    ord: usize,
    ptr: *mut u8,
    size: usize,
) -> Result<RegisteredPages, String> {
    let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
    let start = (ptr as usize) & !(page - 1);
    let end = (ptr as usize)
        .checked_add(size.max(1))
        .and_then(|e| e.checked_add(page - 1))
        .map(|e| e & !(page - 1))
        .ok_or("address range overflows")?;
    let (start, len) = (start as *mut u8, end - start);
    let (dev, writable) = match api.host_register(ord, start, len, false) {
        Ok(d) => (d, true),
        Err(rw) => match api.host_register(ord, start, len, true) {
            Ok(d) => (d, false),
            Err(ro) => return Err(format!("{rw}; read-only: {ro}")),
        },
    };
    Ok(RegisteredPages {
        start,
        len,
        dev,
        writable,
    })
}

/// A registered range; dropping it unregisters the range (after queued work is done).
pub struct PinnedHost {
    ctx: Arc<GpuCtx>,
    /// The registered range: the caller's widened to whole pages.
    start: *mut u8,
    len: usize,
}

// Only the address is kept; the driver calls that use it are thread-safe.
unsafe impl Send for PinnedHost {}

impl PinnedHost {
    /// Registers [ptr, ptr+size) widened to whole pages: read-write, else read-only (a
    /// read-only file mapping refuses read-write). Err: why not (the caller copies as before).
    pub fn new(ctx: Arc<GpuCtx>, ptr: *mut u8, size: usize) -> Result<PinnedHost, String> {
        let r = register_pages(ctx.api.as_ref(), ctx.ord, ptr, size)?;
        Ok(PinnedHost {
            ctx,
            start: r.start,
            len: r.len,
        })
    }

    /// Bytes registered (whole pages).
    pub fn bytes(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // A copy from the memory may still be queued on some stream.
        if let Err(e) = self.ctx.api.device_sync(self.ctx.ord) {
            crate::log_warn!("before unpinning host memory: {e}");
        }
        self.ctx.api.host_unregister(self.ctx.ord, self.start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::mock::MockApi;

    fn calls(api: &MockApi, what: &str) -> usize {
        api.log
            .lock()
            .unwrap()
            .iter()
            .filter(|c| **c == what)
            .count()
    }

    #[test]
    fn registers_once_and_unregisters_once_on_drop() {
        let api = Arc::new(MockApi::new(0));
        let ctx = GpuCtx::for_test(api.clone(), MockApi::info(), None);
        let mem = vec![0u8; 3 << 12];
        let p = PinnedHost::new(ctx, mem.as_ptr().wrapping_add(100) as *mut u8, 5000).unwrap();
        assert!(p.bytes() >= 5000 && p.bytes().is_multiple_of(4096));
        assert_eq!(calls(&api, "host_register"), 1);
        assert_eq!(calls(&api, "host_unregister"), 0);
        drop(p);
        assert_eq!(calls(&api, "host_register"), 1);
        assert_eq!(calls(&api, "host_unregister"), 1);
        assert_eq!(
            api.live
                .registered
                .load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }

    #[test]
    fn read_write_refused_falls_back_to_read_only() {
        let api = Arc::new(MockApi::new(0));
        let ctx = GpuCtx::for_test(api.clone(), MockApi::info(), None);
        let n = api.log.lock().unwrap().len();
        api.fail_at
            .store(n + 1, std::sync::atomic::Ordering::SeqCst);
        let mem = vec![0u8; 4096];
        let p = PinnedHost::new(ctx, mem.as_ptr() as *mut u8, 4096).unwrap();
        assert_eq!(calls(&api, "host_register"), 2);
        drop(p);
        assert_eq!(calls(&api, "host_unregister"), 1);
        assert_eq!(
            api.live
                .registered
                .load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }

    #[test]
    fn refused_registration_is_an_error_and_unregisters_nothing() {
        let api = Arc::new(MockApi::new(0));
        let ctx = GpuCtx::for_test(api.clone(), MockApi::info(), None);
        api.refuse_register
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mem = vec![0u8; 4096];
        assert!(PinnedHost::new(ctx.clone(), mem.as_ptr() as *mut u8, 4096).is_err());
        assert_eq!(
            calls(&api, "host_register"),
            2,
            "read-write, then read-only"
        );
        assert_eq!(calls(&api, "host_unregister"), 0);
        assert_eq!(
            api.live
                .registered
                .load(std::sync::atomic::Ordering::SeqCst),
            0
        );
    }
}
