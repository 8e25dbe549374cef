//! The small device model the C layer (`ffi/`) is built on: a device offers buffer types and
//! backends (streams); a buffer holds tensor data; a backend computes graphs.
//! CPU, GPU and hybrid devices implement these traits; `ffi/` wires them to ggml's vtables.

use crate::tensor::Tensor;
use std::any::Any;
use std::ffi::CStr;

pub type Result<T> = std::result::Result<T, Error>;

/// Why a call into a device failed; the C layer logs it and turns it into ggml's error value.
#[derive(Debug, Clone)]
pub enum Error {
    /// Memory could not be obtained.
    Alloc(String),
    /// The request cannot be carried out (unsupported node, bad arguments).
    Unsupported(String),
    /// The device itself reported a failure.
    Device(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Alloc(m) => write!(f, "allocation failed: {m}"),
            Error::Unsupported(m) => write!(f, "unsupported: {m}"),
            Error::Device(m) => write!(f, "device error: {m}"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

/// Capabilities reported in `ggml_backend_dev_props.caps`.
#[derive(Clone, Copy, Default, Debug)]
pub struct DeviceCaps {
    pub async_: bool,
    pub host_buffer: bool,
    pub buffer_from_host_ptr: bool,
    pub events: bool,
    /// libllama may load weights from a memory-mapped file (it turns mmap off for every
    /// device when one device says false).
    pub mmap_support: bool,
}

/// A region of memory holding tensors. Offsets are relative to `base()`.
pub trait Buffer: Send {
    /// Address of the first byte, as tensors' `data` pointers see it.
    fn base(&self) -> *mut u8;
    fn size(&self) -> usize;
    /// Writes `data` at byte `offset` of the buffer.
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<()>;
    /// Reads `out.len()` bytes from byte `offset` of the buffer.
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()>;
    /// The host can read and write the memory directly.
    fn is_host(&self) -> bool;
    /// A tensor was placed in the buffer (`init_tensor`); a buffer that lays some tensors out
    /// its own way marks them here.
    fn init_tensor(&mut self, _t: &Tensor) -> Result<()> {
        Ok(())
    }
    /// Writes `data` to `t`'s bytes from `offset` on, which lie at byte `at` of the buffer.
    fn set_tensor(&mut self, _t: &Tensor, at: usize, _offset: usize, data: &[u8]) -> Result<()> {
        self.write(at, data)
    }
    /// Reads `t`'s bytes from `offset` on, which lie at byte `at` of the buffer, into `out`.
    fn get_tensor(&self, _t: &Tensor, at: usize, _offset: usize, out: &mut [u8]) -> Result<()> {
        self.read(at, out)
    }
    /// Copies `len` bytes at address `src`, inside another buffer of the same buffer type,
    /// to byte `offset` of this one without going through the host. Ok(false): not done
    /// (the caller falls back to a copy through the host).
    fn copy_from_same_type(
        &mut self,
        _offset: usize,
        _src: *const u8,
        _len: usize,
    ) -> Result<bool> {
        Ok(false)
    }
}

/// A kind of memory a device allocates from.
pub trait BufferType: Send + Sync {
    fn name(&self) -> &CStr;
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>>;
    fn alignment(&self) -> usize;
    fn max_size(&self) -> usize {
        usize::MAX
    }
    /// Bytes to reserve for `t` (ggml_nbytes unless the device pads).
    fn alloc_size(&self, t: &Tensor) -> usize {
        t.nbytes()
    }
    fn is_host(&self) -> bool;
}

/// A stream that runs graphs on a device.
pub trait Backend: Send {
    fn name(&self) -> &CStr;
    /// Computes every node of the graph in order (view ops and nodes without the compute flag
    /// are skipped by the caller's plan). Nodes were accepted by `supports_op`.
    fn compute(&mut self, nodes: &[Tensor]) -> Result<()>;
    /// Computes `nodes`, waits for them, and returns the time the device spent on them (µs)
    /// where it measures that (a GPU's events: no launch or wait of the host in it). Default:
    /// not measured (None).
    fn compute_timed(&mut self, nodes: &[Tensor]) -> Result<Option<f64>> {
        self.compute(nodes)?;
        self.synchronize()?;
        Ok(None)
    }
    /// Whether `nodes` equal, in everything `supports_op` and the kernels depend on, the graph
    /// this backend computed last (which the caller checked node by node then). The caller
    /// then skips checking them again; `compute` must follow. Default: never claimed.
    fn repeats_last(&mut self, _nodes: &[Tensor]) -> bool {
        false
    }
    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
    fn set_n_threads(&mut self, _n: usize) {}

    // ---- Asynchronous copies and events (defaults: not supported; ggml then falls back to
    // synchronous copies). Work queued here is finished by `synchronize` or an event. ----

    /// Queues a copy of `len` bytes from host `src` to device address `dst` (inside a tensor of
    /// this backend's device). `src` stays valid until the backend is synchronized. Ok(false):
    /// not done.
    fn set_async(&mut self, _dst: *mut u8, _src: *const u8, _len: usize) -> Result<bool> {
        Ok(false)
    }
    /// Queues a copy of `len` bytes from device address `src` to host `dst`.
    fn get_async(&mut self, _dst: *mut u8, _src: *const u8, _len: usize) -> Result<bool> {
        Ok(false)
    }
    /// Queues a copy of `len` bytes between device addresses, to `dst` (memory of this
    /// backend's device) from `src` (memory of `from`'s device; None: of this backend's). It
    /// runs after the work queued so far on both backends. Ok(false): not done (ggml then
    /// copies through the host).
    fn copy_device(
        &mut self,
        _from: Option<&mut dyn Backend>,
        _dst: *mut u8,
        _src: *const u8,
        _len: usize,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Host-to-device copies (device address, host address, bytes) that the next `compute` or
    /// `replay_last` makes first, on its stream, inside its captured graph where it is captured:
    /// a replayed graph then copies its inputs in without a driver call each. The host memory
    /// must be page-locked (a copy from pageable memory cannot be captured) and must not change
    /// until the backend is synchronized. False: not taken (the caller copies them itself).
    fn set_prelude(&mut self, _copies: &[(usize, usize, usize)]) -> bool {
        false
    }
    /// Queues the graph computed last again, as it was: the caller knows its nodes are the
    /// same structs with the same contents (RFHYBRID's replay of a kept graph), so nothing is
    /// compared. Ok(false): not possible here now (compute the nodes instead).
    fn replay_last(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// Names the graph the next `compute` runs `tag` (RFHYBRID's recorded segments): a later
    /// `replay_tagged(tag)` queues it again without comparing its nodes. Nothing where graphs
    /// are not kept.
    fn tag_next(&mut self, _tag: u64) {}
    /// Queues the graph computed under `tag` again, as it was: the caller knows its nodes are
    /// the same structs with the same contents and addresses, so nothing is compared.
    /// Ok(false): not possible here now (compute the nodes instead).
    fn replay_tagged(&mut self, _tag: u64) -> Result<bool> {
        Ok(false)
    }
    /// Gets the backend's worker threads running (spinning, not asleep), so that a node timed
    /// right after does not also time their wake-up. Nothing to do where there are none.
    fn wake(&mut self) {}
    /// Records `event` after the work queued so far. Ok(false): this backend does not record
    /// events of that kind.
    fn record_event(&mut self, _event: &dyn Event) -> Result<bool> {
        Ok(false)
    }
    /// Makes work queued later wait for `event`'s last record. Ok(false): not possible here
    /// (the caller waits on the host instead).
    fn wait_event(&mut self, _event: &dyn Event) -> Result<bool> {
        Ok(false)
    }
    /// This backend as `Any`, for a device that recognizes its own backends in `copy_device`.
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        None
    }
}

/// A marker in a backend's queue (`ggml_backend_event_t`).
pub trait Event: Send + Sync {
    /// Waits on the host until the work before the marker's last record is done.
    fn synchronize(&self) -> Result<()>;
    /// This event as `Any`, for a backend that recognizes its own device's events.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}

/// A device: what ggml sees as `ggml_backend_dev_t`.
pub trait Device: Send + Sync {
    fn name(&self) -> &CStr;
    fn description(&self) -> &CStr;
    /// (free, total) bytes.
    fn memory(&self) -> (usize, usize);
    fn kind(&self) -> DeviceKind;
    fn caps(&self) -> DeviceCaps;
    fn buffer_type(&self) -> &dyn BufferType;
    /// A buffer type for weights laid out for this device's kernels, offered to hosts through
    /// `ggml_backend_dev_get_extra_bufts` (RFCPU's `RFCPU_REPACK`). None: no such type.
    fn extra_buffer_type(&self) -> Option<&dyn BufferType> {
        None
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>>;
    /// Whether the device computes this node exactly as ggml's CPU backend does.
    fn supports_op(&self, node: &Tensor) -> bool;
    /// Wraps host memory the caller owns (memory-mapped weights) without copying.
    fn buffer_from_host_ptr(&self, _ptr: *mut u8, _size: usize) -> Option<Box<dyn Buffer>> {
        None
    }
    /// Whether a node whose weights live elsewhere should still run here.
    fn offload_op(&self, _node: &Tensor) -> bool {
        false
    }
    /// Host memory this device copies to and from fastest (pinned), if it has such a type.
    fn host_buffer_type(&self) -> Option<&dyn BufferType> {
        None
    }
    fn new_event(&self) -> Option<Result<Box<dyn Event>>> {
        None
    }
    /// `ggml_backend_dev_props.device_id`: devices of one physical device share it (libllama
    /// then uses only the first of them unless told otherwise).
    fn device_id(&self) -> Option<&CStr> {
        None
    }
    /// Page-locks host memory of another device ([ptr, ptr+len), valid until the guard is
    /// dropped) so that copies from it to this device run at full speed. The guard undoes it
    /// when dropped. None: not done (copies then work as before, only slower).
    fn pin_host(&self, _ptr: *mut u8, _len: usize) -> Option<Box<dyn Any + Send>> {
        None
    }
}
