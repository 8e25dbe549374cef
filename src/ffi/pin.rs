//! Pinning RFCPU's memory for a GPU: the one place that knows both devices asks the GPU to
//! page-lock the CPU device's buffers (RFCPU itself never names the GPU).

use super::vtables::{entries, DeviceEntry};
use crate::device::{Buffer, DeviceKind};
use std::any::Any;

/// Smallest plain RFCPU allocation worth pinning: weights loaded without mmap come in buffers
/// of hundreds of MiB; the small compute buffers are not copied to a GPU in bulk.
pub const PIN_MIN_ALLOC: usize = 64 << 20;

/// RFCPU memory page-locked for the first GPU (ROCMFORGE_GPU_PIN_HOST), so that the
/// scheduler's copies of CPU-resident weights to it (offloaded ops) run at DMA speed. RFCPU
/// does not know the GPU; this layer, which owns both, asks. None: not pinned (no GPU, turned
/// off, smaller than `min`, or the driver refused: copies then stay pageable).
pub fn pin_for_gpu(e: &DeviceEntry, b: &dyn Buffer, min: usize) -> Option<Box<dyn Any + Send>> {
    if e.imp.kind() != DeviceKind::Cpu
        || b.size() < min.max(1)
        || !crate::tuning::get().gpu_pin_host
    {
        return None;
    }
    let gpu = entries().iter().find(|g| g.imp.kind() == DeviceKind::Gpu)?;
    gpu.imp.pin_host(b.base(), b.size())
}

#[cfg(test)]
mod tests {
    use super::super::vtables::BufferCtx;
    use crate::cpu::buffer::HostBuffer;
    use crate::device::{Buffer, Result};
    use std::sync::{Arc, Mutex};

    /// Notes its name in a shared list when dropped.
    struct Mark(&'static str, Arc<Mutex<Vec<&'static str>>>);
    impl Drop for Mark {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    /// A host buffer that notes when its memory goes.
    struct Noted(HostBuffer, #[allow(dead_code)] Mark);
    impl Buffer for Noted {
        fn base(&self) -> *mut u8 {
            self.0.base()
        }
        fn size(&self) -> usize {
            self.0.size()
        }
        fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
            self.0.write(offset, data)
        }
        fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
            self.0.read(offset, out)
        }
        fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
            self.0.fill(offset, len, value)
        }
        fn is_host(&self) -> bool {
            true
        }
    }

    #[test]
    fn the_pin_goes_before_the_memory() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let buf = Noted(
            HostBuffer::alloc(4096).unwrap(),
            Mark("buffer", order.clone()),
        );
        let ctx = BufferCtx::new(Box::new(buf), Some(Box::new(Mark("pin", order.clone()))));
        drop(ctx);
        assert_eq!(*order.lock().unwrap(), ["pin", "buffer"]);
    }
}
