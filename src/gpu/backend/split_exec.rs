//! Graphs with row-split MUL_MATs and MUL_MAT_IDs (`-sm row`, weights in a split buffer:
//! `gpu/split.rs`; below, "product" is either, "src1" a MUL_MAT_ID's ids too).
//! The main device runs the graph; at a split product every other GPU holding rows gets src1
//! by peer copy on a stream of its own (a `Lane`, ordered after the main stream by an event),
//! multiplies its rows, and copies its part of dst back; meanwhile the main device multiplies
//! its own rows straight into dst. Where dst has several columns the main stream waits for the
//! lane at once and a copy kernel puts the lane's rows in place (the peer copy is flat).
//! Cross-device waits are kept few (each costs ~10 us against a token's ~1 us products): a lane
//! that saw only other split products on the main stream since it last waited, none touching
//! what it reads or writes, does not wait again (Q, K and V of one src1), nor gets a src1 it
//! holds again; the main stream waits for a lane's rows (written in place) only where a later
//! node touches them, once for all of the lane's products before (`settle`).
//! A graph seen twice in a row is captured, the lanes' streams joining the main stream's capture
//! through the events, into one runtime graph over every device, and replayed from then on
//! (tokens; prompts too where peer access is on, their copies then being plain device-to-device
//! ones); a lane's memory that moved makes the next graph a new one. A graph whose capture
//! fails (peer copies, taken without peer access, cannot be captured) runs launch by launch,
//! and so do later graphs of its shape; other shapes are still captured.

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
            let s = matches!(n.op(), op::MUL_MAT | op::MUL_MAT_ID)
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
pub(super) struct Grown {
    ctx: Arc<GpuCtx>,
    ptr: DevPtr,
    len: usize,
    /// Reallocated since last asked (a captured graph holding the old address is stale).
    moved: bool,
}

impl Grown {
    pub(super) fn new(ctx: Arc<GpuCtx>) -> Grown {
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

    /// Bytes allocated now.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn at_least(&mut self, bytes: usize) -> Result<DevPtr> {
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
    /// A MUL_MAT_ID's ids, copied there where the lane cannot read them across.
    ids: Grown,
    y: Grown,
    back: Grown,
    /// What the main stream queued since this lane last waited for it: spans and whether
    /// written. None: unknown (ordinary nodes ran), the lane waits before its next product.
    since: Option<Vec<(Span, bool)>>,
    /// The span of the main device's memory whose copy `x` holds, while still valid.
    held: Option<Span>,
}

/// A byte range `[lo, hi)` of device memory.
type Span = (u64, u64);

/// Any span (what an unknown range is taken as).
const EVERYWHERE: Span = (0, u64::MAX);

fn overlaps(a: Span, b: Span) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn span(t: &Tensor) -> Span {
    t.data_range()
        .map_or(EVERYWHERE, |(a, b)| (a as u64, b as u64))
}

/// The memory a node's kernels read (false) and write (true); nothing for the ops that
/// launch nothing.
fn touched(n: &Tensor) -> Vec<(Span, bool)> {
    if matches!(
        n.op(),
        op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE
    ) {
        return Vec::new();
    }
    let mut v = vec![(span(n), true)];
    v.extend((0..GGML_MAX_SRC).filter_map(|i| n.src(i).map(|s| (span(&s), false))));
    v
}

/// Whether two accesses must be ordered: they overlap and one of them writes.
fn conflict(a: (Span, bool), b: (Span, bool)) -> bool {
    (a.1 || b.1) && overlaps(a.0, b.0)
}

/// Lanes' work the main stream has not waited for yet: (GPU, span, whether the lane writes
/// it). Waiting for a lane's latest event covers all of its earlier products.
type Pending = Vec<(usize, Span, bool)>;

impl Lane {
    /// Whether the lane may read `x` and write `dst` without waiting for the main stream
    /// again: nothing the main stream queued since it last waited conflicts.
    fn in_step(&self, reads: &[Span], writes: &[Span]) -> bool {
        self.since.as_ref().is_some_and(|v| {
            v.iter().all(|&a| {
                reads.iter().all(|&r| !conflict(a, (r, false)))
                    && writes.iter().all(|&w| !conflict(a, (w, true)))
            })
        })
    }

    /// The lane is about to wait for the main stream as it is now.
    fn resync(&mut self) {
        let held_ok = match (&self.since, self.held) {
            (Some(v), Some(h)) => v.iter().all(|&a| !conflict(a, (h, false))),
            _ => false,
        };
        if !held_ok {
            self.held = None;
        }
        self.since = Some(Vec::new());
    }

    /// Whether any of the lane's memory moved since last asked.
    fn take_moved(&mut self) -> bool {
        let mut m = false;
        for g in [
            &mut self.scratch,
            &mut self.x,
            &mut self.ids,
            &mut self.y,
            &mut self.back,
        ] {
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

/// `part`'s rows of the weight `w` (of each expert of a MUL_MAT_ID's) as a tensor of their own.
fn rows_of(w: &Tensor, part: &Part) -> Box<ggml_tensor> {
    let rows = part.rows.1 - part.rows.0;
    let ne = [w.ne()[0], rows, w.ne()[2], 1];
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
                ids: Grown::new(ctx.clone()),
                y: Grown::new(ctx.clone()),
                back: Grown::new(self.ctx.clone()),
                since: None,
                held: None,
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
                    (self.exec_current, self.exec_nodes, self.exec_plain) = (true, None, false);
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
        let lc = self.launch_ctx(&ctx);
        let uses = ops::Uses::of(nodes);
        for lane in self.lanes.iter_mut().flatten() {
            (lane.since, lane.held) = (None, None);
        }
        let mut pending = Pending::new();
        let mut i = 0;
        while i < nodes.len() {
            let node = &nodes[i];
            if let Some(st) = &splits[i] {
                self.split_mul_mat(node, st, &lc, &mut pending)
                    .map_err(|e| Error::Device(format!("node '{}': {e}", node.name())))?;
                i += 1;
                continue;
            }
            // Runs of ordinary nodes, fused as usual but never across a split node, nor across
            // the first node that touches a lane's pending rows: the main stream waits there.
            let mut end = splits[i..]
                .iter()
                .position(Option::is_some)
                .map_or(nodes.len(), |p| i + p);
            let mut launches = false;
            for (j, n) in nodes.iter().enumerate().take(end).skip(i) {
                let t = touched(n);
                launches |= !t.is_empty();
                if t.iter()
                    .any(|&a| pending.iter().any(|&(_, s, w)| conflict(a, (s, w))))
                {
                    end = j;
                    break;
                }
            }
            if end == i {
                self.settle(&mut pending, &touched(node))?;
                continue;
            }
            if launches {
                for lane in self.lanes.iter_mut().flatten() {
                    lane.since = None;
                }
            }
            i += ops::launch_at(&nodes[..end], i, &uses, &lc)
                .map_err(|e| Error::Device(format!("node '{}': {e}", node.name())))?
                .max(1);
        }
        // Every lane joins the main stream before the graph ends (a capture needs it).
        self.settle(&mut pending, &[(EVERYWHERE, true)])?;
        Ok(())
    }

    /// The main stream waits for each lane with pending work that conflicts with `with`;
    /// returns whether it waited for any.
    fn settle(&mut self, pending: &mut Pending, with: &[(Span, bool)]) -> Result<bool> {
        let mut gpus: Vec<usize> = pending
            .iter()
            .filter(|&&(_, s, w)| with.iter().any(|&a| conflict(a, (s, w))))
            .map(|p| p.0)
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        let (api, mord, mstream) = (self.ctx.api.clone(), self.ctx.ord, self.stream);
        for &g in &gpus {
            let lane = self.lanes.get(g).and_then(Option::as_ref);
            let Some(done) = lane.and_then(|l| l.backend.copy_event) else {
                return Err(Error::Device(format!("no event of the lane on RFGPU{g}")));
            };
            api.stream_wait_event(mord, mstream, done)
                .map_err(Error::Device)?;
            pending.retain(|p| p.0 != g);
        }
        Ok(!gpus.is_empty())
    }

    /// A split MUL_MAT's output and src1 are in this device's memory (its weights are in the
    /// devices' slices, checked when they were placed).
    fn check_split_node(&self, n: &Tensor) -> Result<()> {
        let x = n
            .src(1)
            .ok_or_else(|| Error::Unsupported("MUL_MAT without src1".into()))?;
        let (a, b) = n.data_range().map_err(Error::Unsupported)?;
        let mut reads = vec![x.data_range().map_err(Error::Unsupported)?];
        if n.op() == op::MUL_MAT_ID {
            let ids = n
                .src(2)
                .ok_or_else(|| Error::Unsupported("MUL_MAT_ID without ids".into()))?;
            reads.push(ids.data_range().map_err(Error::Unsupported)?);
        }
        if !self.ctx.owns_writable(a as u64, b - a)
            || reads
                .iter()
                .any(|&(c, d)| !self.ctx.owns_device(c as u64, d - c))
        {
            return Err(Error::Unsupported(format!(
                "'{}' or its src1 (or ids) is not in {} memory",
                n.name(),
                self.name.to_string_lossy()
            )));
        }
        Ok(())
    }

    /// One MUL_MAT (or MUL_MAT_ID) whose weights are split: every GPU multiplies its rows (of
    /// every expert: each runs MUL_MAT_ID over its rows; see the file's comment); the lanes'
    /// rows are in dst once the main stream waited for them (`settle`).
    fn split_mul_mat(
        &mut self,
        node: &Tensor,
        st: &SplitTensor,
        lc: &ops::LaunchCtx,
        pending: &mut Pending,
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
        let (xs, ds) = (span(&x), span(node));
        // MUL_MAT_ID's ids: read by every device as src1 is.
        let ids = (node.op() == op::MUL_MAT_ID).then(|| node.src(2)).flatten();
        let is = ids.as_ref().map(span);
        let mut reads = vec![xs];
        reads.extend(is);
        // src1 or dst in a lane's pending work (one product feeding the next): the main stream
        // waits for it, and then every lane waits for the main stream.
        let mut with: Vec<(Span, bool)> = reads.iter().map(|&r| (r, false)).collect();
        with.push((ds, true));
        let settled = self.settle(pending, &with)?;
        // Where this stream is now, recorded once the first lane needs it.
        let mut start = None;
        // The other GPUs whose rows come back to a place of their own to gather from.
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
            // Few columns with peer access: the lane's kernels read src1 and write their rows of
            // dst in this device's memory directly (no copies); else copies both ways, and
            // where dst has several columns the rows come back to `back` to be gathered.
            let peer = api.peer_access(dord, mord);
            let direct = cols <= DIRECT_COLS && peer;
            let gather = !direct && cols > 1;
            // Copies between the two devices, on the lane's stream: with peer access a plain
            // device-to-device copy, which a capture takes (a peer copy fails it, as CUDA's
            // cuMemcpyPeerAsync does), so prompts' graphs are captured too; without, a peer
            // copy, which the driver stages through the host.
            let across = |to_ord: usize, to: DevPtr, from_ord: usize, from: DevPtr, n: usize| {
                if peer {
                    api.copy_dtod_async(dord, to, from, n, ls)
                } else {
                    api.copy_peer_async(to_ord, to, from_ord, from, n, dord, ls)
                }
                .map_err(dev)
            };
            let part_bytes = rows * cols * 4;
            let mut writes = vec![ds];
            if gather {
                let b = lane.back.at_least(part_bytes)?;
                writes.push((b, b + part_bytes as u64));
            }
            // A lane in step (consecutive products of one src1: Q, K and V; gate and up) does
            // not wait for the main stream again.
            if settled || !lane.in_step(&reads, &writes) {
                let e = match start {
                    Some(e) => e,
                    None => {
                        // Only `self`'s event is borrowed here: the lane is found again below.
                        let e = self.copy_event()?;
                        api.event_record(mord, e, mstream).map_err(dev)?;
                        start = Some(e);
                        e
                    }
                };
                let lane = self.lane(part.gpu, &part.ctx)?;
                lane.resync();
                api.stream_wait_event(dord, ls, e).map_err(dev)?;
            }
            let lane = self.lane(part.gpu, &part.ctx)?;
            let (xd, yd) = if direct {
                (x.data() as usize as DevPtr, dst + (part.rows.0 * 4) as u64)
            } else {
                let yd = lane.y.at_least(rows * cols * 4)?;
                // A lane that holds this src1 already (not written since) is not sent it again.
                let xd = if lane.held == Some(xs) && lane.x.len >= x_bytes {
                    lane.x.ptr
                } else {
                    let xd = lane.x.at_least(x_bytes)?;
                    across(dord, xd, mord, x.data() as usize as DevPtr, x_bytes)?;
                    lane.held = Some(xs);
                    xd
                };
                (xd, yd)
            };
            // The ids, read across or copied over (a few bytes; their whole span, strides kept).
            let ib = match (&ids, is) {
                (Some(t), Some(sp)) => {
                    let at = if direct {
                        sp.0
                    } else {
                        let n = (sp.1 - sp.0) as usize;
                        let d = lane.ids.at_least(n)?;
                        across(dord, d, mord, sp.0, n)?;
                        d
                    };
                    let mut it = made(GgmlType::I32, t.ne(), t.nb(), at);
                    it.op = op::NONE;
                    Some(it)
                }
                _ => None,
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
            y.op = node.op();
            y.src[0] = &*a as *const ggml_tensor as *mut ggml_tensor;
            y.src[1] = &*b as *const ggml_tensor as *mut ggml_tensor;
            if let Some(it) = &ib {
                y.src[2] = &**it as *const ggml_tensor as *mut ggml_tensor;
            }
            debug_assert!(y.src[3..GGML_MAX_SRC].iter().all(|s| s.is_null()));
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
            // Rows written in place (directly, or one column copied back): the main stream
            // waits where dst (or src1's memory) is next touched, not here.
            if !gather {
                if !direct {
                    across(mord, yd_in_place(dst, part), dord, yd, rows * 4)?;
                }
                api.event_record(dord, done, ls).map_err(dev)?;
                lane.backend.queued = true;
                pending.extend(reads.iter().map(|&r| (part.gpu, r, false)));
                pending.push((part.gpu, ds, true));
                continue;
            }
            let to = lane.back.ptr;
            across(mord, to, dord, yd, rows * cols * 4)?;
            api.event_record(dord, done, ls).map_err(dev)?;
            lane.backend.queued = true;
            back.push((part.gpu, done, to, part.rows));
        }
        // This device's rows, straight into dst, while the lanes work.
        if let Some(part) = st.parts.iter().find(|p| Arc::ptr_eq(&p.ctx, &self.ctx)) {
            let a = rows_of(&w, part);
            let yne = [part.rows.1 - part.rows.0, dne[1], dne[2], dne[3]];
            let mut y = made(GgmlType::F32, yne, dnb, dst + (part.rows.0 * 4) as u64);
            y.op = node.op();
            y.src[0] = &*a as *const ggml_tensor as *mut ggml_tensor;
            y.src[1] = x.as_ptr();
            if let Some(t) = &ids {
                y.src[2] = t.as_ptr();
            }
            let yt = unsafe { Tensor::from_ptr(&*y) }.unwrap();
            ops::launch(&yt, lc).map_err(dev)?;
        }
        for lane in self.lanes.iter_mut().flatten() {
            if let Some(v) = &mut lane.since {
                v.extend(reads.iter().map(|&r| (r, false)));
                v.push((ds, true));
            }
        }
        for (gpu, done, from, rows) in back {
            api.stream_wait_event(mord, mstream, done).map_err(dev)?;
            pending.retain(|p| p.0 != gpu);
            // The lane's rows, contiguous, into their place in each column of dst.
            let yne = [rows.1 - rows.0, dne[1], dne[2], dne[3]];
            let s = made(GgmlType::F32, yne, contiguous(GgmlType::F32, yne), from);
            let mut d = made(GgmlType::F32, yne, dnb, dst + (rows.0 * 4) as u64);
            d.op = op::DUP;
            d.src[0] = &*s as *const ggml_tensor as *mut ggml_tensor;
            let dt = unsafe { Tensor::from_ptr(&*d) }.unwrap();
            ops::launch(&dt, lc).map_err(dev)?;
            // The lanes write `back` again only after waiting for this gather (src1 they
            // hold stays theirs).
            let read = (from, from + ((rows.1 - rows.0) * cols * 4) as u64);
            for lane in self.lanes.iter_mut().flatten() {
                if let Some(v) = &mut lane.since {
                    v.extend([(read, false), (ds, true)]);
                }
            }
        }
        Ok(())
    }
}

/// Where a part's rows of a one-column dst start.
fn yd_in_place(dst: DevPtr, part: &Part) -> DevPtr {
    dst + (part.rows.0 * 4) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::testutil::TT;
    use crate::device::{Backend, BufferType};
    use crate::gpu::buffer::GpuBufferType;
    use crate::gpu::mock::MockApi;
    use crate::gpu::split::{SplitBuffer, SplitBufferType};
    use std::sync::atomic::Ordering;

    /// Two mocked GPUs (`peer`: each maps the other's memory), the first one's context and a
    /// 1 MiB buffer of the row split, half the rows on each.
    fn two_gpus(peer: bool) -> (Arc<MockApi>, Arc<GpuCtx>, SplitBuffer) {
        let api = Arc::new(MockApi::new(0));
        api.peer.store(peer, Ordering::SeqCst);
        let c0 = GpuCtx::for_test(api.clone(), MockApi::info(), None);
        let c1 = GpuCtx::for_test(api.clone(), MockApi::info(), None);
        let ty = SplitBufferType::new(0, vec![c0.clone(), c1], vec![0.5, 0.5]).unwrap();
        let sb = ty.alloc(1 << 20);
        (api, c0, sb)
    }

    fn count(api: &MockApi, what: &str) -> usize {
        api.log
            .lock()
            .unwrap()
            .iter()
            .filter(|&&c| c == what)
            .count()
    }

    /// A graph whose capture fails (a prompt's product without peer access: peer copies, which
    /// CUDA cannot capture) runs launch by launch, and a graph of another shape (a token's
    /// product: the other GPU reads and writes across directly) is still captured and then
    /// replayed. A failed capture used to turn capturing off for the backend, every token then
    /// launched product by product. With peer access the prompt's copies are plain
    /// device-to-device ones and its graph is captured too.
    #[test]
    fn a_failed_capture_leaves_other_shapes_captured() {
        let (api, c0, sb) = two_gpus(false);
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
        api.peer.store(true, Ordering::SeqCst);
        run(1, 3);
        assert_eq!(
            count(&api, "graph_instantiate"),
            1,
            "the token's graph captured"
        );
        assert_eq!(count(&api, "graph_launch"), 2, "and launched twice");
        // A prompt's graph with peer access: copies device to device, captured and replayed.
        let peer_copies = count(&api, "copy_peer_async");
        run(24, 4);
        assert_eq!(count(&api, "capture_begin"), 3);
        assert_eq!(
            count(&api, "graph_instantiate"),
            2,
            "the prompt's graph captured"
        );
        assert_eq!(count(&api, "graph_launch"), 5, "captured on its second run");
        assert_eq!(count(&api, "copy_peer_async"), peer_copies);
        assert!(count(&api, "copy_dtod_async") > 0);
        drop(be);
    }

    /// A graph replayed from the cache of kept graphs after a row-split graph's executable
    /// (which is never kept) frees that executable: nothing is left live once the backend goes.
    #[test]
    fn a_kept_graph_after_a_split_one_leaves_no_executable() {
        let (api, c0, sb) = two_gpus(true);
        let w = TT::new(GgmlType::Q4_0, [256, 128, 1, 1]);
        sb.init_tensor(&w.tensor()).unwrap();
        let st = sb.tensor(&w.tensor()).unwrap();
        let bt = GpuBufferType::new(c0.clone(), CString::new("MOCK0").unwrap());
        let buf = bt.alloc(1 << 20).unwrap();
        let at = |off: usize| buf.base().wrapping_add(off) as *mut std::ffi::c_void;
        let mut be = GpuBackend::new(c0.clone(), CString::new("MOCK0").unwrap()).unwrap();
        let mut x = TT::new(GgmlType::F32, [256, 1, 1, 1]);
        x.t.data = at(0);
        let mut y = TT::new(GgmlType::F32, [128, 1, 1, 1]);
        y.op(op::MUL_MAT).src(0, &w).src(1, &x);
        y.t.data = at(512 << 10);
        let split = [y.tensor()];
        let plain: Vec<TT> = (0..2)
            .map(|k| {
                let mut a = TT::new(GgmlType::F32, [256, 1, 1, 1]);
                a.op(op::ADD).src(0, &x).src(1, &x);
                a.t.data = at(4096 * (k + 1));
                a
            })
            .collect();
        let graphs: Vec<[Tensor; 1]> = plain.iter().map(|a| [a.tensor()]).collect();
        let splits = [Some(st.clone())];
        let mut compute = |nodes: &[Tensor], split: bool| {
            be.repeats_last(nodes);
            if split {
                be.compute_with_splits(nodes, &splits).unwrap();
            } else {
                be.compute(nodes).unwrap();
            }
        };
        // The split graph first: its scratch (src1 quantized) is in every key after it.
        compute(&split, true);
        for _ in 0..3 {
            for g in &graphs {
                compute(g, false);
            }
        }
        for _ in 0..3 {
            compute(&split, true);
        }
        let launches = count(&api, "graph_launch");
        compute(&graphs[0], false);
        assert_eq!(
            count(&api, "graph_launch"),
            launches + 1,
            "replayed from the cache"
        );
        drop(be);
        assert_eq!(
            api.live.execs.load(Ordering::SeqCst),
            0,
            "an executable leaked"
        );
    }

    /// Q, K and V products of one src1 followed by a node reading Q and K, on two mocked GPUs
    /// (`peer`: the other GPU reaches this one's memory; `cols`: columns of src1). Returns the
    /// calls of one run launched directly: (waits between streams, peer copies).
    fn qkv(peer: bool, cols: usize, between: bool) -> (usize, usize) {
        let (api, c0, sb) = two_gpus(peer);
        let ws: Vec<TT> = (0..3)
            .map(|_| TT::new(GgmlType::Q4_0, [256, 128, 1, 1]))
            .collect();
        let sts: Vec<_> = ws
            .iter()
            .map(|w| {
                sb.init_tensor(&w.tensor()).unwrap();
                sb.tensor(&w.tensor())
            })
            .collect();
        let bt = GpuBufferType::new(c0.clone(), CString::new("MOCK0").unwrap());
        let buf = bt.alloc(1 << 20).unwrap();
        let at = |off: usize| buf.base().wrapping_add(off) as *mut std::ffi::c_void;
        let mut be = GpuBackend::new(c0.clone(), CString::new("MOCK0").unwrap()).unwrap();
        let mut x = TT::new(GgmlType::F32, [256, cols, 1, 1]);
        x.t.data = at(0);
        let mut ys: Vec<TT> = (0..3)
            .map(|_| TT::new(GgmlType::F32, [128, cols, 1, 1]))
            .collect();
        for (k, y) in ys.iter_mut().enumerate() {
            y.op(op::MUL_MAT).src(0, &ws[k]).src(1, &x);
            y.t.data = at((k + 1) << 17);
        }
        let mut sum = TT::new(GgmlType::F32, [128, cols, 1, 1]);
        sum.op(op::ADD).src(0, &ys[0]).src(1, &ys[1]);
        sum.t.data = at(4 << 17);
        // An ordinary node between Q and K that writes elsewhere.
        let mut other = TT::new(GgmlType::F32, [256, cols, 1, 1]);
        other.op(op::ADD).src(0, &x).src(1, &x);
        other.t.data = at(5 << 17);
        let (mut nodes, mut splits) = (Vec::new(), Vec::new());
        for (k, y) in ys.iter().enumerate() {
            nodes.push(y.tensor());
            splits.push(sts[k].clone());
            if between && k == 0 {
                nodes.push(other.tensor());
                splits.push(None);
            }
        }
        nodes.push(sum.tensor());
        splits.push(None);
        let before = api.log.lock().unwrap().len();
        be.compute_with_splits(&nodes, &splits).unwrap();
        let log: Vec<_> = api.log.lock().unwrap()[before..].to_vec();
        let n = |w: &str| log.iter().filter(|&&c| c == w).count();
        (n("stream_wait_event"), n("copy_peer_async"))
    }

    /// A token's Q, K and V read across directly: the other GPU waits for the main stream
    /// once, and the main stream for it once, where Q is first read (each product used to
    /// wait twice: 6 waits).
    #[test]
    fn consecutive_products_share_the_waits() {
        assert_eq!(qkv(true, 1, false), (2, 0));
    }

    /// Without peer access, src1 is sent to the other GPU once for the three products (each
    /// used to copy it: 6 copies), and the rows still come back per product.
    #[test]
    fn a_lane_holding_src1_is_not_sent_it_again() {
        assert_eq!(qkv(false, 1, false), (2, 4));
        // A prompt's products: rows are gathered after each (a wait each), and the other GPU
        // waits for each gather before writing its rows back again, but src1 goes once.
        assert_eq!(qkv(false, 20, false), (6, 4));
    }

    /// An ordinary node between two products: the other GPU waits for the main stream again
    /// (the node may have written what it reads), and gets src1 again where it copies it.
    #[test]
    fn a_node_between_products_makes_the_lane_wait_again() {
        assert_eq!(qkv(true, 1, true), (3, 0));
        assert_eq!(qkv(false, 1, true), (3, 5));
    }

    /// The token graph over both devices is still captured on its second run and replayed.
    #[test]
    fn deferred_waits_keep_the_capture() {
        let (api, c0, sb) = two_gpus(true);
        let (wq, wk) = (
            TT::new(GgmlType::Q4_0, [256, 128, 1, 1]),
            TT::new(GgmlType::Q4_0, [256, 128, 1, 1]),
        );
        for w in [&wq, &wk] {
            sb.init_tensor(&w.tensor()).unwrap();
        }
        let bt = GpuBufferType::new(c0.clone(), CString::new("MOCK0").unwrap());
        let buf = bt.alloc(1 << 20).unwrap();
        let at = |off: usize| buf.base().wrapping_add(off) as *mut std::ffi::c_void;
        let mut be = GpuBackend::new(c0.clone(), CString::new("MOCK0").unwrap()).unwrap();
        let mut x = TT::new(GgmlType::F32, [256, 1, 1, 1]);
        x.t.data = at(0);
        let mut q = TT::new(GgmlType::F32, [128, 1, 1, 1]);
        q.op(op::MUL_MAT).src(0, &wq).src(1, &x);
        q.t.data = at(1 << 17);
        let mut k = TT::new(GgmlType::F32, [128, 1, 1, 1]);
        k.op(op::MUL_MAT).src(0, &wk).src(1, &x);
        k.t.data = at(2 << 17);
        let mut sum = TT::new(GgmlType::F32, [128, 1, 1, 1]);
        sum.op(op::ADD).src(0, &q).src(1, &k);
        sum.t.data = at(3 << 17);
        let nodes = [q.tensor(), k.tensor(), sum.tensor()];
        let splits = [sb.tensor(&wq.tensor()), sb.tensor(&wk.tensor()), None];
        // The first run takes the lane's memory (a new graph next), the third is captured.
        for _ in 0..4 {
            be.repeats_last(&nodes);
            be.compute_with_splits(&nodes, &splits).unwrap();
        }
        assert_eq!(count(&api, "capture_begin"), 1);
        assert_eq!(count(&api, "graph_instantiate"), 1);
        assert_eq!(count(&api, "graph_launch"), 2);
        drop(be);
    }

    /// A MUL_MAT_ID over split experts: each expert's rows are divided as a matrix's, each GPU
    /// runs MUL_MAT_ID over its rows (one launch each), and the other GPU reads src1 and ids
    /// across, or gets both copied over and its rows gathered.
    fn mmid(peer: bool, tokens: usize) -> (Vec<&'static str>, Arc<SplitTensor>) {
        let (api, c0, sb) = two_gpus(peer);
        let w = TT::new(GgmlType::Q8_0, [256, 128, 4, 1]);
        sb.init_tensor(&w.tensor()).unwrap();
        let st = sb.tensor(&w.tensor()).unwrap();
        let bt = GpuBufferType::new(c0.clone(), CString::new("MOCK0").unwrap());
        let buf = bt.alloc(1 << 20).unwrap();
        let at = |off: usize| buf.base().wrapping_add(off) as *mut std::ffi::c_void;
        let mut be = GpuBackend::new(c0.clone(), CString::new("MOCK0").unwrap()).unwrap();
        let mut x = TT::new(GgmlType::F32, [256, 1, tokens, 1]);
        x.t.data = at(0);
        let mut ids = TT::new(GgmlType::I32, [2, tokens, 1, 1]);
        ids.t.data = at(1 << 17);
        let mut y = TT::new(GgmlType::F32, [128, 2, tokens, 1]);
        y.op(op::MUL_MAT_ID).src(0, &w).src(1, &x).src(2, &ids);
        y.t.data = at(2 << 17);
        let nodes = [y.tensor()];
        let splits = [Some(st.clone())];
        let before = api.log.lock().unwrap().len();
        be.compute_with_splits(&nodes, &splits).unwrap();
        let log = api.log.lock().unwrap()[before..].to_vec();
        drop(be);
        (log, st)
    }

    #[test]
    fn mul_mat_id_runs_over_each_gpus_rows_of_every_expert() {
        let n = |log: &[&str], w: &str| log.iter().filter(|&&c| c == w).count();
        let (log, st) = mmid(true, 1);
        assert_eq!(st.blocks, 4);
        let rows: Vec<_> = st.parts.iter().map(|p| p.rows).collect();
        assert_eq!(rows, [(0, 64), (64, 128)], "each expert's rows halved");
        assert_eq!(n(&log, "copy_peer_async"), 0, "src1 and ids read across");
        assert_eq!(n(&log, "stream_wait_event"), 2);
        // Without peer access: src1 and ids copied over, the rows copied back.
        let (log, _) = mmid(false, 3);
        assert_eq!(n(&log, "copy_peer_async"), 3);
        assert_eq!(n(&log, "stream_wait_event"), 2);
    }
}
