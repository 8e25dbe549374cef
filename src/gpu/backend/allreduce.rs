//! AllReduce over GPU backends for ggml's tensor-parallel meta device (`-sm tensor`, ggml 0.26's
//! `ggml_backend_comm_*` proc addresses; the C side is ffi/comm.rs). Between two parts of a
//! layer every GPU holds a partial sum of the same F32 tensor; each must end with the total.
//!
//! Per call, on each GPU's own stream: its partial sum is copied into one of two send buffers
//! (alternate calls use the other) and an event is recorded; then it waits for the other GPUs'
//! events and one kernel writes `send_0 + send_1 + ...` (the same order everywhere, so the
//! copies agree to the bit) into its tensor, reading the others' send buffers across (peer
//! access). That is one wait for each other GPU a call, where ggml's fallback (a copy and an
//! ADD graph per step) costs several graphs and waits. Why two send buffers suffice: GPU i
//! overwrites send buffer p two calls later, after it waited in the call between for every
//! other GPU's event, which each recorded after its sum of this call had read buffer p.
//! Without peer access between every pair, or for other types, the call declines (false) and
//! ggml's fallback runs.
//!
//! A token's tensors (up to `SMALL_MAX` values; NVIDIA) take one launch a GPU instead
//! (`allreduce_small_f32`): each GPU writes its part into every other GPU's receive slot for it,
//! raises its flag there to the call's number, waits for the others' flags in its own memory and
//! sums. That is one launch where the above is four driver calls a GPU (a copy, an event
//! record, a wait, the sum; ~27 µs of host time a call for two GPUs, measured), and a token of
//! ggml's tensor split makes two such calls a layer. The slots alternate by call too: a GPU
//! writes a slot again two calls later, after it saw every other GPU's flag of the call between,
//! which each raised only after its sum had read that slot.

use super::split_exec::Grown;
use super::GpuBackend;
use crate::device::{Error, Result};
use crate::ffi::abi::GGML_TENSOR_FLAG_COMPUTE;
use crate::ggml_types::GgmlType;
use crate::gpu::api::{DevPtr, Event};
use crate::gpu::{ops, GpuCtx};
use crate::tensor::Tensor;
use std::sync::Arc;

/// One meta backend's AllReduce state: per GPU backend (in the meta device's order) two send
/// buffers and the event after its send.
pub struct Comm {
    ctxs: Vec<Arc<GpuCtx>>,
    sends: Vec<[Grown; 2]>,
    events: Vec<Event>,
    parity: usize,
    /// Per GPU: its receive slots (`slot`) and flags (one u32 per GPU) for small tensors,
    /// allocated at the first small call; the number of the last small call.
    small: Option<(Vec<DevPtr>, Vec<DevPtr>)>,
    seq: u32,
}

/// Most values a small AllReduce takes (one block a GPU; a token's activations are 2,048 to
/// 16,384).
pub const SMALL_MAX: usize = 65536;

/// Byte offset of GPU `sender`'s receive slot of parity `p`.
fn slot(sender: usize, p: usize) -> u64 {
    ((sender * 2 + p) * SMALL_MAX * 4) as u64
}

impl Comm {
    /// For `backends` (2 to `ALLREDUCE_MAX`, of one runtime); None where that does not hold
    /// or an event cannot be made.
    pub fn new(backends: &[&mut GpuBackend]) -> Result<Comm> {
        let n = backends.len();
        if !(2..=ops::ALLREDUCE_MAX).contains(&n) {
            return Err(Error::Unsupported(format!(
                "AllReduce over {n} GPUs (2 to {})",
                ops::ALLREDUCE_MAX
            )));
        }
        if backends
            .iter()
            .any(|b| !super::same_runtime(&b.ctx, &backends[0].ctx))
        {
            return Err(Error::Unsupported(
                "AllReduce over GPUs of two runtimes".into(),
            ));
        }
        let mut comm = Comm {
            ctxs: backends.iter().map(|b| b.ctx.clone()).collect(),
            sends: Vec::new(),
            events: Vec::new(),
            parity: 0,
            small: None,
            seq: 0,
        };
        for b in backends {
            comm.sends
                .push([Grown::new(b.ctx.clone()), Grown::new(b.ctx.clone())]);
            let e = b.ctx.api.event_create(b.ctx.ord).map_err(Error::Device)?;
            comm.events.push(e);
        }
        Ok(comm)
    }

    /// Whether `tensors` (one per backend, in order) can be summed here: F32, the same number
    /// of values, contiguous, in their own GPU's memory, and every GPU reads every other's.
    fn takes(&self, backends: &[&mut GpuBackend], tensors: &[Tensor]) -> bool {
        let n = self.ctxs.len();
        if backends.len() != n || tensors.len() != n || !crate::tuning::get().gpu_peer {
            return false;
        }
        let ne = tensors[0].nelements();
        let fits = backends
            .iter()
            .zip(tensors)
            .zip(&self.ctxs)
            .all(|((b, t), c)| {
                Arc::ptr_eq(&b.ctx, c)
                    && t.dtype() == GgmlType::F32
                    && t.nelements() == ne
                    && t.is_contiguous()
                    && (ne == 0 || c.owns_device(t.data() as usize as DevPtr, ne * 4))
            });
        let api = &self.ctxs[0].api;
        fits && self.ctxs.iter().all(|a| {
            self.ctxs
                .iter()
                .all(|b| a.ord == b.ord || api.peer_access(a.ord, b.ord))
        })
    }

    /// Sums `tensors` over the backends in place, queued on their streams. Ok(false): not
    /// taken (nothing queued). An error after work was queued marks every backend failed:
    /// their next graph reports it.
    pub fn allreduce(
        &mut self,
        backends: &mut [&mut GpuBackend],
        tensors: &[Tensor],
    ) -> Result<bool> {
        if !self.takes(backends, tensors) {
            return Ok(false);
        }
        let ne = tensors[0].nelements();
        if ne == 0 {
            return Ok(true);
        }
        let small = ne <= SMALL_MAX && self.ctxs[0].api.vendor() == "CUDA";
        let r = if small {
            self.queue_small(backends, tensors, ne)
        } else {
            self.queue(backends, tensors, ne)
        };
        if let Err(e) = &r {
            for b in backends.iter_mut() {
                b.failed = Some(format!("AllReduce: {e}"));
            }
        }
        r.map(|()| true)
    }

    fn queue(
        &mut self,
        backends: &mut [&mut GpuBackend],
        tensors: &[Tensor],
        ne: usize,
    ) -> Result<()> {
        let bytes = ne * 4;
        let p = self.parity;
        self.parity ^= 1;
        // A send buffer that must grow may still be read by another GPU: all streams drain first.
        if self.sends.iter().any(|s| s[p].len() < bytes) {
            for b in backends.iter() {
                b.ctx
                    .api
                    .stream_sync(b.ctx.ord, b.stream)
                    .map_err(Error::Device)?;
            }
        }
        let mut sends = Vec::with_capacity(backends.len());
        for (i, (b, t)) in backends.iter_mut().zip(tensors).enumerate() {
            let dst = self.sends[i][p].at_least(bytes)?;
            sends.push(dst);
            b.after_staged_writes()?;
            b.queued = true;
            let (api, ord) = (&b.ctx.api, b.ctx.ord);
            // A part with no slice on this GPU was not computed: it adds nothing.
            if t.raw().flags & GGML_TENSOR_FLAG_COMPUTE != 0 {
                let src = t.data() as usize as DevPtr;
                api.copy_dtod_async(ord, dst, src, bytes, b.stream)
            } else {
                api.memset_async(ord, dst, 0, bytes, b.stream)
            }
            .map_err(Error::Device)?;
            api.event_record(ord, self.events[i], b.stream)
                .map_err(Error::Device)?;
        }
        for (i, (b, t)) in backends.iter_mut().zip(tensors).enumerate() {
            let ctx = b.ctx.clone();
            for (k, &e) in self.events.iter().enumerate() {
                if k != i {
                    ctx.api
                        .stream_wait_event(ctx.ord, b.stream, e)
                        .map_err(Error::Device)?;
                }
            }
            let lc = b.launch_ctx(&ctx);
            ops::launch_allreduce_sum(&lc, t.data() as usize as DevPtr, &sends, ne)
                .map_err(Error::Device)?;
        }
        Ok(())
    }
}

impl Comm {
    /// The receive slots and flags on every GPU, made once (flags zeroed before any use).
    fn small_buffers(&mut self) -> Result<()> {
        if self.small.is_some() {
            return Ok(());
        }
        let n = self.ctxs.len();
        let (mut recv, mut flags) = (Vec::new(), Vec::new());
        let made = (|| -> Result<()> {
            for c in &self.ctxs {
                let r = c
                    .api
                    .alloc(c.ord, slot(n, 0) as usize)
                    .map_err(Error::Alloc)?;
                recv.push(r);
                let f = c.api.alloc(c.ord, 4 * n).map_err(Error::Alloc)?;
                flags.push(f);
                c.fill_device(f, 0, 4 * n).map_err(Error::Device)?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            for (i, c) in self.ctxs.iter().enumerate() {
                for p in [recv.get(i), flags.get(i)].into_iter().flatten() {
                    c.api.free(c.ord, *p);
                }
            }
            return Err(e);
        }
        self.small = Some((recv, flags));
        Ok(())
    }

    fn queue_small(
        &mut self,
        backends: &mut [&mut GpuBackend],
        tensors: &[Tensor],
        ne: usize,
    ) -> Result<()> {
        self.small_buffers()?;
        let n = self.ctxs.len();
        let p = self.parity;
        self.parity ^= 1;
        self.seq = self.seq.wrapping_add(1).max(1);
        let (recv, flags) = self.small.as_ref().unwrap();
        for (me, (b, t)) in backends.iter_mut().zip(tensors).enumerate() {
            b.after_staged_writes()?;
            b.queued = true;
            let not_me = |v: DevPtr, k: usize| if k == me { 0 } else { v };
            let out: Vec<DevPtr> = (0..n).map(|k| not_me(recv[k] + slot(me, p), k)).collect();
            let out_flag: Vec<DevPtr> = (0..n)
                .map(|k| not_me(flags[k] + 4 * me as u64, k))
                .collect();
            let inp: Vec<DevPtr> = (0..n).map(|k| not_me(recv[me] + slot(k, p), k)).collect();
            let args = ops::SmallAllreduce {
                out: &out,
                out_flag: &out_flag,
                inp: &inp,
                flags: flags[me],
                me,
                seq: self.seq,
                zero_me: t.raw().flags & GGML_TENSOR_FLAG_COMPUTE == 0,
            };
            let ctx = b.ctx.clone();
            let lc = b.launch_ctx(&ctx);
            ops::launch_allreduce_small(&lc, t.data() as usize as DevPtr, ne, &args)
                .map_err(Error::Device)?;
        }
        Ok(())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // The send buffers drain their device before they are freed (Grown); the events go.
        for (c, &e) in self.ctxs.iter().zip(&self.events) {
            let _ = c.api.device_sync(c.ord);
            c.api.event_destroy(c.ord, e);
        }
        if let Some((recv, flags)) = self.small.take() {
            for (c, (r, f)) in self.ctxs.iter().zip(recv.into_iter().zip(flags)) {
                c.api.free(c.ord, r);
                c.api.free(c.ord, f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::testutil::TT;
    use crate::device::BufferType;
    use crate::gpu::buffer::GpuBufferType;
    use crate::gpu::mock::MockApi;
    use std::ffi::CString;
    use std::sync::atomic::Ordering;

    /// Two backends of one (mock) GPU: an F32 sum queues per backend its copy to a send
    /// buffer, an event, a wait for the other's event and the sum kernel; other types and
    /// sizes that differ are declined with nothing queued; nothing is left live afterwards.
    #[test]
    fn sums_through_send_buffers_and_declines_what_it_cannot_take() {
        let dir = std::env::temp_dir().join(format!("rf-allreduce-{}", std::process::id()));
        let api = Arc::new(MockApi::new(0));
        let ctx = GpuCtx::for_test(api.clone(), MockApi::info(), Some(dir.clone()));
        let bt = GpuBufferType::new(ctx.clone(), CString::new("MOCK0").unwrap());
        let buf = bt.alloc(1 << 20).unwrap();
        let base = buf.base();
        let at = |off: usize| unsafe { base.add(off) } as *mut std::ffi::c_void;
        let mut a = GpuBackend::new(ctx.clone(), CString::new("MOCK0").unwrap()).unwrap();
        let mut b = GpuBackend::new(ctx.clone(), CString::new("MOCK0").unwrap()).unwrap();
        let mut comm = Comm::new(&[&mut a, &mut b]).unwrap();
        let part = |off: usize, t: GgmlType, n: usize| {
            let mut x = TT::new(t, [n, 1, 1, 1]);
            x.t.data = at(off);
            x.t.flags = GGML_TENSOR_FLAG_COMPUTE;
            x
        };
        let (x, y) = (part(0, GgmlType::F32, 777), part(8192, GgmlType::F32, 777));
        let calls = |f: &mut dyn FnMut() -> bool| {
            let from = api.log.lock().unwrap().len();
            let r = f();
            let log = api.log.lock().unwrap();
            let n = |w: &str| log[from..].iter().filter(|c| **c == w).count();
            let queued = [
                "copy_dtod_async",
                "event_record",
                "stream_wait_event",
                "launch",
            ]
            .map(n);
            (r, queued)
        };
        let (taken, queued) = calls(&mut || {
            comm.allreduce(&mut [&mut a, &mut b], &[x.tensor(), y.tensor()])
                .unwrap()
        });
        assert!(taken);
        assert_eq!(queued, [2, 2, 2, 2]);
        let (h1, h2) = (part(0, GgmlType::F16, 64), part(8192, GgmlType::F16, 64));
        let (taken, queued) = calls(&mut || {
            comm.allreduce(&mut [&mut a, &mut b], &[h1.tensor(), h2.tensor()])
                .unwrap()
        });
        assert!(!taken);
        assert_eq!(queued, [0; 4]);
        let short = part(8192, GgmlType::F32, 776);
        let (taken, _) = calls(&mut || {
            comm.allreduce(&mut [&mut a, &mut b], &[x.tensor(), short.tensor()])
                .unwrap()
        });
        assert!(!taken);
        assert!(
            Comm::new(&[&mut a]).is_err(),
            "one backend is not an AllReduce"
        );
        drop(comm);
        drop((a, b, buf));
        assert_eq!(api.live.events.load(Ordering::SeqCst), 0);
        assert_eq!(api.live.device.load(Ordering::SeqCst), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
