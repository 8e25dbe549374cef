//! The RFHYBRID device: host-memory buffers whose reads and writes keep the residency map
//! current, and backends that run each node where the scheduler puts it.

use super::cost::{self, CostModel, Profile};
use super::learned::Learned;
use super::residency::{copy_in_pieces, Copy, Residency};
use super::telemetry::Telemetry;
use super::{ExecutionStrategy, Place};
use crate::device::{Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Error, Result};
use crate::tensor::Tensor;
use once_cell::sync::OnceCell;
use std::any::Any;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex, MutexGuard};

/// Host buffers at least this large are page-locked for the GPU (weights, compute and KV
/// buffers: their copies to the GPU then run as DMA).
const PIN_MIN: usize = 16 << 20;
/// GPU memory left to others when no budget is given.
const DEFAULT_MARGIN: usize = 512 << 20;

/// What the scheduler is told to do; changed from C or by the environment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    pub strategy: ExecutionStrategy,
    /// GPU bytes RFHYBRID may hold.
    pub budget: usize,
    /// Bumped on every change: backends place the weights again.
    pub epoch: u64,
}

/// What the device's buffers and backends share.
pub struct Shared {
    pub cpu: &'static dyn Device,
    pub gpu: Option<&'static dyn Device>,
    pub residency: Mutex<Residency>,
    pub config: Mutex<Config>,
    pub telemetry: Mutex<Telemetry>,
    profile: OnceCell<Profile>,
    /// Plan-trial winners and expert-sharing widths measured here or by earlier processes.
    learned: OnceCell<Mutex<Learned>>,
}

impl Shared {
    pub fn residency(&self) -> MutexGuard<'_, Residency> {
        self.residency.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> Config {
        *self.config.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn telemetry(&self) -> MutexGuard<'_, Telemetry> {
        self.telemetry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The machine's cost profile, calibrated (or read from the cache) at first use.
    pub fn profile(&self) -> Profile {
        self.profile
            .get_or_init(|| match self.gpu {
                None => Profile::synthetic(50.0, 0.0, 0.0),
                Some(g) if g.name() == c"FAKEGPU" => Profile::synthetic(50.0, 2000.0, 25.0),
                Some(g) => cost::load_or_calibrate(self.cpu, Some(g)),
            })
            .clone()
    }

    /// The choices measured on running graphs (`learned`): kept in the kernel cache's directory
    /// with a real GPU, in this process only with none or the stand-in one (tests).
    pub fn learned(&self) -> MutexGuard<'_, Learned> {
        self.learned
            .get_or_init(|| {
                let t = crate::tuning::get();
                let path = self.gpu.filter(|g| g.name() != c"FAKEGPU").and_then(|g| {
                    let key = super::calibrate::cache_key(self.cpu, Some(g));
                    crate::gpu::kernels::cache_dir().map(|d| super::learned::cache_file(&d, &key))
                });
                let fresh =
                    t.hybrid_calibrate == "force" || t.hybrid_trial.as_deref() == Some("force");
                Mutex::new(Learned::load(path, fresh))
            })
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Backends plan again at their next graph (weights placed anew).
    pub fn set_strategy(&self, s: ExecutionStrategy) {
        let mut c = self.config.lock().unwrap_or_else(|e| e.into_inner());
        c.strategy = s;
        c.epoch += 1;
    }

    /// GPU bytes RFHYBRID may hold from the next graph on (0 without a GPU).
    pub fn set_budget(&self, bytes: usize) {
        let mut c = self.config.lock().unwrap_or_else(|e| e.into_inner());
        c.budget = if self.gpu.is_some() { bytes } else { 0 };
        c.epoch += 1;
    }

    pub fn cost_model(&self) -> CostModel {
        CostModel::new(self.profile())
    }

    /// Makes the copies `copies` lists through the devices' buffers (synchronously).
    pub fn copy_sync(res: &mut Residency, copies: &[Copy]) -> Result<()> {
        for c in copies {
            copy_in_pieces(c, &mut |c: &Copy| {
                let Some((buf, off)) = res.dev_buffer(c.dev) else {
                    return Err(Error::Device(format!(
                        "no device memory at {:#x} for a copy",
                        c.dev
                    )));
                };
                // SAFETY: the host range lies in one of this device's live buffers (the
                // residency map only holds ranges of registered buffers and their tensors).
                unsafe {
                    match c.to {
                        Place::Gpu => {
                            buf.write(off, std::slice::from_raw_parts(c.host as *const u8, c.len))?
                        }
                        Place::Cpu => buf.read(
                            off,
                            std::slice::from_raw_parts_mut(c.host as *mut u8, c.len),
                        )?,
                    }
                }
                Ok(true)
            })?;
        }
        Ok(())
    }
}

pub struct HybridDevice {
    shared: Arc<Shared>,
    description: CString,
    buffer_type: HybridBufferType,
}

impl HybridDevice {
    /// RFHYBRID over `cpu` and, if there is one, `gpu`.
    pub fn new(cpu: &'static dyn Device, gpu: Option<&'static dyn Device>) -> HybridDevice {
        let knobs = crate::tuning::get();
        let strategy = knobs
            .hybrid_strategy
            .as_deref()
            .and_then(|s| {
                let p = ExecutionStrategy::parse(s);
                if p.is_none() {
                    crate::log_warn!("ROCMFORGE_HYBRID_STRATEGY={s} not understood; using auto");
                }
                p
            })
            .unwrap_or(ExecutionStrategy::Automatic);
        let budget = match (gpu, knobs.hybrid_vram) {
            (None, _) => 0,
            (Some(_), Some(b)) => b,
            (Some(g), None) => g.memory().0.saturating_sub(DEFAULT_MARGIN),
        };
        let description = match gpu {
            Some(g) => format!(
                "rocmforge hybrid: {} + {}",
                cpu.description().to_string_lossy(),
                g.description().to_string_lossy()
            ),
            None => format!(
                "rocmforge hybrid: {} (no GPU)",
                cpu.description().to_string_lossy()
            ),
        };
        let shared = Arc::new(Shared {
            cpu,
            gpu,
            residency: Mutex::new(Residency::new(budget)),
            config: Mutex::new(Config {
                strategy,
                budget,
                epoch: 0,
            }),
            telemetry: Mutex::new(Telemetry::from_tuning()),
            profile: OnceCell::new(),
            learned: OnceCell::new(),
        });
        let _ = THE.set(shared.clone());
        HybridDevice {
            buffer_type: HybridBufferType {
                shared: shared.clone(),
            },
            shared,
            description: CString::new(description.replace('\0', "")).unwrap_or_default(),
        }
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// The process's RFHYBRID (set when the registry creates it), for the exported C calls.
pub static THE: OnceCell<Arc<Shared>> = OnceCell::new();

impl Device for HybridDevice {
    fn name(&self) -> &CStr {
        c"RFHYBRID"
    }
    fn description(&self) -> &CStr {
        &self.description
    }
    /// Host memory: that is where RFHYBRID's buffers live.
    fn memory(&self) -> (usize, usize) {
        self.shared.cpu.memory()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_: false,
            host_buffer: false,
            // Weights stay in the mapped file; the scheduler copies what it keeps in VRAM.
            buffer_from_host_ptr: true,
            events: false,
            mmap_support: true,
        }
    }
    fn buffer_type(&self) -> &dyn BufferType {
        &self.buffer_type
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(super::backend::HybridBackend::new(
            self.shared.clone(),
        )?))
    }
    /// The union of the devices: a node either device runs is run.
    fn supports_op(&self, node: &Tensor) -> bool {
        self.shared.cpu.supports_op(node) || self.shared.gpu.is_some_and(|g| g.supports_op(node))
    }
    fn buffer_from_host_ptr(&self, ptr: *mut u8, size: usize) -> Option<Box<dyn Buffer>> {
        let inner = self.shared.cpu.buffer_from_host_ptr(ptr, size)?;
        Some(Box::new(HybridBuffer::wrap(
            self.shared.clone(),
            inner,
            false,
        )))
    }
    fn device_id(&self) -> Option<&CStr> {
        self.shared.gpu.and_then(|g| g.device_id())
    }
}

pub struct HybridBufferType {
    shared: Arc<Shared>,
}

impl BufferType for HybridBufferType {
    fn name(&self) -> &CStr {
        c"RFHYBRID"
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        let inner = self.shared.cpu.buffer_type().alloc(size)?;
        // RFCPU allocates large buffers in whole pages (cpu::buffer): all of it is pinned.
        Ok(Box::new(HybridBuffer::wrap(
            self.shared.clone(),
            inner,
            true,
        )))
    }
    fn alignment(&self) -> usize {
        self.shared.cpu.buffer_type().alignment()
    }
    fn max_size(&self) -> usize {
        self.shared.cpu.buffer_type().max_size()
    }
    fn is_host(&self) -> bool {
        true
    }
}

/// Host memory registered with the residency map: writes make the GPU's copies stale, reads
/// first fetch what only the GPU holds.
pub struct HybridBuffer {
    inner: Box<dyn Buffer>,
    shared: Arc<Shared>,
    _pin: Option<Box<dyn Any + Send>>,
}

impl HybridBuffer {
    /// `owned_pages`: the buffer's last page is its own (an allocation rounded up to whole
    /// pages), so it may be pinned whole.
    fn wrap(shared: Arc<Shared>, inner: Box<dyn Buffer>, owned_pages: bool) -> HybridBuffer {
        // Whole pages inside the buffer only: a neighbouring buffer (RFCPU's part of the same
        // mapped file) may have pinned the pages at its ends, and the driver refuses a range
        // that overlaps a registered one.
        let page = 4096usize;
        let lo = (inner.base() as usize).next_multiple_of(page);
        let end = inner.base() as usize + inner.size();
        let hi = if owned_pages
            && lo == inner.base() as usize
            && inner.size() >= crate::cpu::buffer::LARGE
        {
            end.checked_next_multiple_of(page)
                .unwrap_or(end & !(page - 1))
        } else {
            end & !(page - 1)
        };
        let pin = match shared.gpu {
            Some(g) if hi > lo && hi - lo >= PIN_MIN => g.pin_host(lo as *mut u8, hi - lo),
            _ => None,
        };
        let pinned = pin.as_ref().map(|_| (lo, hi));
        shared
            .residency()
            .add_buffer(inner.base() as usize, inner.size(), pinned);
        HybridBuffer {
            inner,
            shared,
            _pin: pin,
        }
    }

    fn fetch(&self, offset: usize, len: usize) -> Result<()> {
        let mut res = self.shared.residency();
        let copies = res.make_current(self.inner.base() as usize + offset, len, Place::Cpu);
        // Now held by both sides: a replayed graph that writes these bytes again must know.
        for c in &copies {
            res.log_host_access(c.host, c.len);
        }
        Shared::copy_sync(&mut res, &copies)
    }

    fn wrote(&self, offset: usize, len: usize) {
        self.shared
            .residency()
            .host_wrote(self.inner.base() as usize + offset, len);
    }
}

impl Drop for HybridBuffer {
    fn drop(&mut self) {
        self.shared
            .residency()
            .remove_buffer(self.inner.base() as usize);
    }
}

impl Buffer for HybridBuffer {
    fn base(&self) -> *mut u8 {
        self.inner.base()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        // Bytes outside the written range keep their state: nothing to fetch.
        self.inner.write(offset, data)?;
        self.wrote(offset, data.len());
        Ok(())
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.fetch(offset, out.len())?;
        self.inner.read(offset, out)
    }
    fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.size()) {
            // The inner buffer's bounds check gives the error.
            return self.inner.fill(offset, len, value);
        }
        let p = self.inner.base() as usize + offset;
        if self.shared.residency().device_fill(p, len, value) {
            return Ok(());
        }
        self.inner.fill(offset, len, value)?;
        self.shared.residency().host_filled(p, len, value);
        Ok(())
    }
    fn is_host(&self) -> bool {
        true
    }
}
