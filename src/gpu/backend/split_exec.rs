//! Graphs with row-split MUL_MATs (`-sm row`, weights in a split buffer: `gpu/split.rs`).
//! The main device runs the graph; at a split MUL_MAT every other GPU holding rows gets src1
//! by peer copy on a stream of its own (a `Lane`, ordered after the main stream by an event),
//! multiplies its rows, and copies its part of dst back; meanwhile the main device multiplies
//! its own rows straight into dst. The main stream waits for the lanes' events, and where dst
//! has several columns a copy kernel puts each lane's rows in place (the peer copy is flat).
//! A graph seen twice in a row is captured, the lanes' streams joining the main stream's capture
//! through the events, into one runtime graph over every device, and replayed from then on
//! (token generation); a lane's memory that moved makes the next graph a new one. A graph
//! whose capture fails (peer copies, taken for products of many columns, cannot be captured)
//! runs launch by launch, and so do later graphs of its shape; other shapes are still captured.

use super::{capture_graph, GpuBackend, GpuCtx};
use crate::device::{Error, Result};
use crate::ffi::abi::{ggml_tensor, GGML_MAX_SRC, GGML_TENSOR_FLAG_COMPUTE};
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::DevPtr;
use crate::gpu::api::GraphExec;
use crate::gpu::ops;
use crate::gpu::split::{Part, SplitTensor};
use crate::gpu::Memory;
use crate::tensor::Tensor;
use std::ffi::CString;
use std::sync::Arc;

/// The split weights of each node (None for a node without), or None for a graph without any.
pub(super) fn split_sources(nodes: &[Tensor]) -> Option<Vec<Option<Arc<SplitTensor>>>> {
    let mut any = false;
    let v: Vec<_> = nodes
        .iter()
        .map(|n| {
            let s = (n.op() == op::MUL_MAT)
                .then(|| n.src(0).and_then(|w| crate::ffi::split::split_tensor(&w)))
                .flatten();
            any |= s.is_some();
            s
        })
        .collect();
    any.then_some(v)
}

/// Device memory that grows on demand (freed after the device is idle: the driver's free
/// waits, and the owner drains its stream first).
struct Grown {
    ctx: Arc<GpuCtx>,
    ptr: DevPtr,
    len: usize,
    /// Reallocated since last asked (a captured graph holding the old address is stale).
    moved: bool,
}

impl Grown {
    fn new(ctx: Arc<GpuCtx>) -> Grown {
        Grown {
            ctx,
            ptr: 0,
            len: 0,
            moved: false,
        }
    }

    fn release(&mut self) {
        if self.ptr != 0 {
            let _ = self.ctx.api.device_sync(self.ctx.ord);
            self.ctx.untrack(self.ptr);
            self.ctx.api.free(self.ctx.ord, self.ptr);
            (self.ptr, self.len) = (0, 0);
        }
    }

    fn at_least(&mut self, bytes: usize) -> Result<DevPtr> {
        if bytes > self.len {
            self.release();
            let size = bytes.next_power_of_two().max(1 << 16);
            let p = self
                .ctx
                .api
                .alloc(self.ctx.ord, size)
                .map_err(Error::Alloc)?;
            self.ctx.track(p, size, Memory::Device);
            (self.ptr, self.len, self.moved) = (p, size, true);
        }
        Ok(self.ptr)
    }
}

impl Drop for Grown {
    fn drop(&mut self) {
        self.release();
    }
}

/// What another GPU uses to compute its rows for this backend: its own backend (stream,
/// events, ordering after the host's writes there), a scratch, src1 copied there, its part of
/// dst, and room on the main device that part is copied back to.
pub(super) struct Lane {
    backend: GpuBackend,
    scratch: Grown,
    x: Grown,
    y: Grown,
    back: Grown,
}

impl Lane {
    /// Whether any of the lane's memory moved since last asked.
    fn take_moved(&mut self) -> bool {
        let mut m = false;
        for g in [&mut self.scratch, &mut self.x, &mut self.y, &mut self.back] {
            m |= std::mem::take(&mut g.moved);
        }
        m
    }
}

/// Products of at most this many columns read src1 and write dst across devices directly
/// where peer access is on (a token's: the copies cost more than the kernels' remote reads).
const DIRECT_COLS: usize = 16;

/// A tensor made here (a device's rows of a weight, a lane's part of dst): ggml's struct,
/// zeroed, then the fields the kernels read.
fn made(ty: GgmlType, ne: [usize; 4], nb: [usize; 4], data: DevPtr) -> Box<ggml_tensor> {
    // SAFETY: ggml_tensor is plain data; all zeroes is a tensor without sources or name.
    let mut t: Box<ggml_tensor> = Box::new(unsafe { std::mem::zeroed() });
    t.type_ = ty as i32;
    t.ne = ne.map(|v| v as i64);
    t.nb = nb;
    t.data = data as usize as *mut std::ffi::c_void;
    t.flags = GGML_TENSOR_FLAG_COMPUTE;
    t
}

fn contiguous(ty: GgmlType, ne: [usize; 4]) -> [usize; 4] {
    let nb1 = ty.row_size(ne[0]);
    [ty.type_size(), nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]]
}

/// `part`'s rows of the weight `w` as a tensor of their own.
fn rows_of(w: &Tensor, part: &Part) -> Box<ggml_tensor> {
    let rows = part.rows.1 - part.rows.0;
    let ne = [w.ne()[0], rows, 1, 1];
    made(w.dtype(), ne, contiguous(w.dtype(), ne), part.ptr)
}

impl GpuBackend {
    fn lane(&mut self, gpu: usize, ctx: &Arc<GpuCtx>) -> Result<&mut Lane> {
        if self.lanes.len() <= gpu {
            self.lanes.resize_with(gpu + 1, || None);
        }
        if self.lanes[gpu].is_none() {
            let name = format!("RFGPU{gpu} for {}", self.name.to_string_lossy());
            let backend = GpuBackend::new(ctx.clone(), CString::new(name).unwrap_or_default())?;
            self.lanes[gpu] = Some(Lane {
                backend,
                scratch: Grown::new(ctx.clone()),
                x: Grown::new(ctx.clone()),
                y: Grown::new(ctx.clone()),
                back: Grown::new(self.ctx.clone()),
            });
        }
        Ok(self.lanes[gpu].as_mut().unwrap())
    }

    /// Runs a graph some of whose MUL_MATs read row-split weights (`splits`, per node):
    /// launched directly the first time, captured the second, replayed after.
    pub(super) fn compute_with_splits(
        &mut self,
        nodes: &[Tensor],
        splits: &[Option<Arc<SplitTensor>>],
    ) -> Result<()> {
        self.abort_capture();
        if let Some(e) = self.failed.take() {
            return Err(Error::Device(format!(
                "earlier work on this stream failed: {e}"
            )));
        }
        self.after_staged_writes()?;
        self.queued = true;
        let graphs = self.graphs_ok;
        let repeated = match self.known_repeat.take() {
            Some(r) => r,
            None => graphs && self.is_last_graph(nodes),
        };
        if !repeated {
            self.prepare(nodes)?;
            for (n, s) in nodes.iter().zip(splits) {
                match s {
                    None => self.check_memory(n)?,
                    Some(_) => self.check_split_node(n)?,
                }
            }
            if graphs {
                super::graph_key(&mut self.key, nodes, self.scratch.0);
            }
            self.exec_current = false;
            let r = self.launch_splits(nodes, splits);
            if graphs {
                std::mem::swap(&mut self.last_key, &mut self.key);
                // A lane's memory that moved is not in the key: the next graph is a new one.
                let moved = self.lanes.iter_mut().flatten().any(|l| l.take_moved());
                if moved || r.is_err() {
                    self.last_key.clear();
                }
            }
            return r;
        }
        let (api, ord) = (self.ctx.api.clone(), self.ctx.ord);
        if !self.exec_current {
            let shape = super::shape_key(nodes);
            if self.split_uncaptured.contains(&shape) {
                return self.launch_splits(nodes, splits);
            }
            match self.capture_splits(nodes, splits) {
                Ok(e) => {
                    if let Some(old) = self.exec.replace(e) {
                        api.graph_exec_destroy(ord, old);
                    }
                    // Made from a capture over several devices: never updated in place.
                    (self.exec_current, self.exec_nodes) = (true, None);
                }
                Err(e) => {
                    crate::log_info!(
                        "{}: a graph with row-split products could not be captured, graphs of its shape run launch by launch: {e}",
                        self.name.to_string_lossy()
                    );
                    if self.split_uncaptured.len() >= 64 {
                        self.split_uncaptured.remove(0);
                    }
                    self.split_uncaptured.push(shape);
                    return self.launch_splits(nodes, splits);
                }
            }
        }
        match self.exec {
            Some(e) => api.graph_launch(ord, e, self.stream).map_err(Error::Device),
            None => self.launch_splits(nodes, splits),
        }
    }

    /// Captures `launch_splits` into an executable graph (every stream drained first).
    fn capture_splits(
        &mut self,
        nodes: &[Tensor],
        splits: &[Option<Arc<SplitTensor>>],
    ) -> Result<GraphExec> {
        let (api, ord) = (self.ctx.api.clone(), self.ctx.ord);
        for lane in self.lanes.iter().flatten() {
            let c = &lane.backend.ctx;
            api.stream_sync(c.ord, lane.backend.stream)
                .map_err(Error::Device)?;
        }
        api.stream_sync(ord, self.stream).map_err(Error::Device)?;
        self.capturing = true;
        let stream = self.stream;
        let graph = capture_graph(api.as_ref(), ord, stream, || {
            self.launch_splits(nodes, splits)
        });
        self.capturing = false;
        let graph = graph?;
        let exec = api.graph_instantiate(ord, graph).map_err(Error::Device);
        api.graph_destroy(ord, graph);
        exec
    }

    /// Queues every node: runs of ordinary nodes as usual, split MUL_MATs over the devices.
    fn launch_splits(
        &mut self,
        nodes: &[Tensor],
        splits: &[Option<Arc<SplitTensor>>],
    ) -> Result<()> {
        let ctx = self.ctx.clone();
        let lc = ops::LaunchCtx {
            api: ctx.api.as_ref(),
            ord: ctx.ord,
            stream: self.stream,
            kernels: &ctx.kernels,
            warp_size: ctx.info.warp_size,
            compute_units: ctx.info.compute_units,
            scratch: self.scratch.0,
            scratch_len: self.scratch.1,
            fa_counters: self.fa_counters,
            q8: Default::default(),
            q8_next: Default::default(),
            fuse: self.fuse,
            mma: ops::arch_has_mma(&ctx.info.arch),
            wants: None,
        };
        let uses = ops::Uses::of(nodes);
        let mut i = 0;
        while i < nodes.len() {
            let node = &nodes[i];
            if let Some(st) = &splits[i] {
                self.split_mul_mat(node, st, &lc)
                    .map_err(|e| Error::Device(format!("node '{}': {e}", node.name())))?;
                i += 1;
                continue;
            }
            // Runs of ordinary nodes, fused as usual but never across a split node.
            let end = splits[i..]
                .iter()
                .position(Option::is_some)
                .map_or(nodes.len(), |p| i + p);
            i += ops::launch_at(&nodes[..end], i, &uses, &lc)
                .map_err(|e| Error::Device(format!("node '{}': {e}", node.name())))?
                .max(1);
        }
        Ok(())
    }

    /// A split MUL_MAT's output and src1 are in this device's memory (its weights are in the
    /// devices' slices, checked when they were placed).
    fn check_split_node(&self, n: &Tensor) -> Result<()> {
        let x = n
            .src(1)
            .ok_or_else(|| Error::Unsupported("MUL_MAT without src1".into()))?;
        let (a, b) = n.data_range().map_err(Error::Unsupported)?;
        let (c, d) = x.data_range().map_err(Error::Unsupported)?;
        if !self.ctx.owns_writable(a as u64, b - a) || !self.ctx.owns_device(c as u64, d - c) {
            return Err(Error::Unsupported(format!(
                "'{}' or its src1 is not in {} memory",
                n.name(),
                self.name.to_string_lossy()
            )));
        }
        Ok(())
    }

    /// One MUL_MAT whose weights are split: every GPU multiplies its rows (see the file's
    /// comment); the result is in dst on this stream when it returns.
    fn split_mul_mat(
        &mut self,
        node: &Tensor,
        st: &SplitTensor,
        lc: &ops::LaunchCtx,
    ) -> Result<()> {
        let (w, x) = match (node.src(0), node.src(1)) {
            (Some(w), Some(x)) => (w, x),
            _ => return Err(Error::Unsupported("MUL_MAT without sources".into())),
        };
        let api = self.ctx.api.clone();
        let (mord, mstream) = (self.ctx.ord, self.stream);
        let dev = |e: String| Error::Device(e);
        let (dne, dnb) = (node.ne(), node.nb());
        let cols = dne[1] * dne[2] * dne[3];
        let x_bytes = x.nbytes();
        let dst = node.data() as usize as DevPtr;
        // Where this stream is now: the lanes start from here (src1 is written).
        let start = self.copy_event()?;
        api.event_record(mord, start, mstream).map_err(dev)?;
        // Per other GPU: its event, and where its rows came back to and which (None: in place).
        let mut back = Vec::new();
        for part in &st.parts {
            if Arc::ptr_eq(&part.ctx, &self.ctx) {
                continue;
            }
            let rows = part.rows.1 - part.rows.0;
            let dord = part.ctx.ord;
            let lane = self.lane(part.gpu, &part.ctx)?;
            // After the host's writes to that device (its weights); nothing to wait for once
            // they were waited for, which keeps a capture free of outside events.
            lane.backend.after_staged_writes()?;
            let ls = lane.backend.stream;
            api.stream_wait_event(dord, ls, start).map_err(dev)?;
            // Few columns with peer access: the lane's kernels read src1 and write their rows of
            // dst in this device's memory directly (no copies); else copies both ways.
            let direct = cols <= DIRECT_COLS && api.peer_access(dord, mord);
            let (xd, yd) = if direct {
                (x.data() as usize as DevPtr, dst + (part.rows.0 * 4) as u64)
            } else {
                let xd = lane.x.at_least(x_bytes)?;
                let yd = lane.y.at_least(rows * cols * 4)?;
                api.copy_peer_async(
                    dord,
                    xd,
                    mord,
                    x.data() as usize as DevPtr,
                    x_bytes,
                    dord,
                    ls,
                )
                .map_err(dev)?;
                (xd, yd)
            };
            let a = rows_of(&w, part);
            let mut b = made(x.dtype(), x.ne(), x.nb(), xd);
            b.op = op::NONE;
            let yne = [rows, dne[1], dne[2], dne[3]];
            let ynb = if direct {
                dnb
            } else {
                contiguous(GgmlType::F32, yne)
            };
            let mut y = made(GgmlType::F32, yne, ynb, yd);
            y.op = op::MUL_MAT;
            y.src[0] = &*a as *const ggml_tensor as *mut ggml_tensor;
            y.src[1] = &*b as *const ggml_tensor as *mut ggml_tensor;
            debug_assert!(y.src[2..GGML_MAX_SRC].iter().all(|s| s.is_null()));
            // SAFETY: `y` and its sources live until the launches are queued.
            let yt = unsafe { Tensor::from_ptr(&*y) }.unwrap();
            let need = ops::scratch_bytes(&yt);
            let scratch = if need > 0 {
                lane.scratch.at_least(need)?
            } else {
                lane.scratch.ptr
            };
            let lctx = part.ctx.clone();
            let llc = ops::LaunchCtx {
                api: lctx.api.as_ref(),
                ord: dord,
                stream: ls,
                kernels: &lctx.kernels,
                warp_size: lctx.info.warp_size,
                compute_units: lctx.info.compute_units,
                scratch,
                scratch_len: lane.scratch.len,
                fa_counters: 0,
                q8: Default::default(),
                q8_next: Default::default(),
                fuse: false,
                mma: ops::arch_has_mma(&lctx.info.arch),
                wants: None,
            };
            ops::launch(&yt, &llc).map_err(dev)?;
            let done = lane.backend.copy_event()?;
            if direct {
                api.event_record(dord, done, ls).map_err(dev)?;
                lane.backend.queued = true;
                back.push((done, None));
                continue;
            }
            let to = if cols == 1 {
                dst + (part.rows.0 * 4) as u64
            } else {
                lane.back.at_least(rows * cols * 4)?
            };
            api.copy_peer_async(mord, to, dord, yd, rows * cols * 4, dord, ls)
                .map_err(dev)?;
            api.event_record(dord, done, ls).map_err(dev)?;
            lane.backend.queued = true;
            back.push((done, (cols > 1).then_some((to, part.rows))));
        }
        // This device's rows, straight into dst, while the lanes work.
        if let Some(part) = st.parts.iter().find(|p| Arc::ptr_eq(&p.ctx, &self.ctx)) {
            let a = rows_of(&w, part);
            let yne = [part.rows.1 - part.rows.0, dne[1], dne[2], dne[3]];
            let mut y = made(GgmlType::F32, yne, dnb, dst + (part.rows.0 * 4) as u64);
            y.op = op::MUL_MAT;
            y.src[0] = &*a as *const ggml_tensor as *mut ggml_tensor;
            y.src[1] = x.as_ptr();
            let yt = unsafe { Tensor::from_ptr(&*y) }.unwrap();
            ops::launch(&yt, lc).map_err(dev)?;
        }
        for (done, gather) in back {
            api.stream_wait_event(mord, mstream, done).map_err(dev)?;
            let Some((from, rows)) = gather else {
                continue;
            };
            // The lane's rows, contiguous, into their place in each column of dst.
            let yne = [rows.1 - rows.0, dne[1], dne[2], dne[3]];
            let s = made(GgmlType::F32, yne, contiguous(GgmlType::F32, yne), from);
            let mut d = made(GgmlType::F32, yne, dnb, dst + (rows.0 * 4) as u64);
            d.op = op::DUP;
            d.src[0] = &*s as *const ggml_tensor as *mut ggml_tensor;
            let dt = unsafe { Tensor::from_ptr(&*d) }.unwrap();
            ops::launch(&dt, lc).map_err(dev)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::testutil::TT;
    use crate::device::{Backend, BufferType};
    use crate::gpu::buffer::GpuBufferType;
    use crate::gpu::mock::MockApi;
    use crate::gpu::split::SplitBufferType;
    use std::sync::atomic::Ordering;

    fn count(api: &MockApi, what: &str) -> usize {
        api.log
            .lock()
            .unwrap()
            .iter()
            .filter(|&&c| c == what)
            .count()
    }

    /// A graph whose capture fails (a prompt's product: peer copies, which CUDA cannot capture)
    /// runs launch by launch, and a graph of another shape (a token's product: the other GPU
    /// reads and writes across directly) is still captured and then replayed. A failed capture
    /// used to turn capturing off for the backend, every token then launched product by product.
    #[test]
    fn a_failed_capture_leaves_other_shapes_captured() {
        let api = Arc::new(MockApi::new(0));
        api.peer.store(true, Ordering::SeqCst);
        let c0 = GpuCtx::for_test(api.clone(), MockApi::info(), None);
        let c1 = GpuCtx::for_test(api.clone(), MockApi::info(), None);
        let ty = SplitBufferType::new(0, vec![c0.clone(), c1.clone()], vec![0.5, 0.5]).unwrap();
        let sb = ty.alloc(1 << 20);
        let w = TT::new(GgmlType::Q4_0, [256, 128, 1, 1]);
        sb.init_tensor(&w.tensor()).unwrap();
        let st = sb.tensor(&w.tensor()).unwrap();
        assert_eq!(st.parts.len(), 2, "rows on both devices");
        let bt = GpuBufferType::new(c0.clone(), CString::new("MOCK0").unwrap());
        let buf = bt.alloc(1 << 20).unwrap();
        let at = |off: usize| buf.base().wrapping_add(off) as *mut std::ffi::c_void;
        let mut be = GpuBackend::new(c0.clone(), CString::new("MOCK0").unwrap()).unwrap();
        let splits = [Some(st.clone())];
        let mut run = |cols: usize, times: usize| {
            let mut x = TT::new(GgmlType::F32, [256, cols, 1, 1]);
            x.t.data = at(0);
            let mut y = TT::new(GgmlType::F32, [128, cols, 1, 1]);
            y.op(op::MUL_MAT).src(0, &w).src(1, &x);
            y.t.data = at(512 << 10);
            let nodes = [y.tensor()];
            for _ in 0..times {
                // As the ffi layer does: ask whether it repeats, then compute.
                be.repeats_last(&nodes);
                be.compute_with_splits(&nodes, &splits).unwrap();
            }
        };
        run(20, 3);
        assert_eq!(
            count(&api, "capture_begin"),
            1,
            "the prompt's graph tried once"
        );
        assert_eq!(count(&api, "graph_instantiate"), 0);
        run(1, 3);
        assert_eq!(
            count(&api, "graph_instantiate"),
            1,
            "the token's graph captured"
        );
        assert_eq!(count(&api, "graph_launch"), 2, "and launched twice");
        drop(be);
    }
}
