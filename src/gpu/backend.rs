//! An RFGPU backend: one stream. A graph's kernels are queued in order on the stream and
//! `graph_compute` returns without waiting for them (ggml's `ggml_backend_graph_compute` and
//! the scheduler call `synchronize` when results are needed), so the host prepares the next
//! split or copy while the GPU computes. Copies to and from the host, between our GPU
//! backends, and events are queued on the same stream (`set_async`, `copy_from`, `record`).
//!
//! Queued work must never lose what it reads: buffers are freed by the driver only after the
//! device is idle (cuMemFree/hipFree wait), the scratch is replaced only after the stream
//! drained, and the stream is drained before a graph is captured and when the backend goes.
//! Errors of queued work surface at `synchronize` (logged, and returned by the next compute).
//!
//! Token generation runs the same ggml graph again and again (same nodes, same addresses;
//! only the data changes). The second time a graph is seen its launches are captured into a
//! runtime graph, and from then on that graph is replayed with one launch call instead of
//! hundreds: the per-kernel launch cost is what bounds small-batch speed otherwise.

use super::api::{DevPtr, Event, GraphExec, Stream};
use super::ops;
use super::{GpuCtx, GpuEvent};
use crate::device::{Backend, Error, Result};
use crate::tensor::{node_words, Tensor, NODE_WORDS, TENSOR_WORDS};
use std::ffi::{CStr, CString};
use std::sync::Arc;

pub(crate) mod allreduce;
pub(crate) mod graph_cache;
mod split_exec;

/// Cycles the spin kernel holds the stream before a node timed alone (`compute_timed`): about
/// 100 us at 2 GHz, longer than the host takes to queue one node's launches.
const TIMED_HOLD_CYCLES: usize = 200_000;

pub struct GpuBackend {
    ctx: Arc<GpuCtx>,
    stream: Stream,
    name: CString,
    /// Scratch device memory (address, bytes) for ops that stage an operand; grows on demand.
    scratch: (DevPtr, usize),
    /// Zeroed per-row counters of the split-KV attention kernel (its last block of a row
    /// merges the row and sets the counter back to 0): allocated once, 0 until then.
    fa_counters: DevPtr,
    /// Everything the last graph's launches depended on (see `graph_key`), and the buffer the
    /// next key is written into.
    last_key: Vec<u64>,
    key: Vec<u64>,
    /// `set_prelude`'s copies for the next graph, and those of the last graph (the end of
    /// `last_key`), as key words: PRELUDE_MARK, then (device, host, bytes) per copy.
    prelude: Vec<u64>,
    last_prelude: Vec<u64>,
    /// Whether the graph `repeats_last` was just asked about matched `last_key`: the
    /// `compute` that follows takes the answer instead of walking the graph again.
    known_repeat: Option<bool>,
    /// Kernels::misses() when a dry run last found no kernel group to compile ahead: new
    /// graphs skip the dry run until a launch had to compile a group by itself again.
    prefetch_settled: Option<usize>,
    /// The executable graph last captured, and whether it was captured for `last_key` (a
    /// stale one is re-pointed at the next capture, which is cheaper than a new one).
    exec: Option<GraphExec>,
    exec_current: bool,
    /// Node count and `shape_key` of the graph `exec` was made from: an update is tried only
    /// from a graph with the same (see the capture in `compute_graph`).
    exec_nodes: Option<usize>,
    exec_shape: u64,
    /// `exec` was captured from a plain graph (no row-split products): it may be kept.
    exec_plain: bool,
    /// Captured graphs kept besides `exec` (`graph_cache`).
    pub(crate) cache: graph_cache::GraphCache,
    /// The last `compute` had no row-split sources (`replay_last` replays only such a graph).
    last_plain: bool,
    /// False once capture failed on this runtime: then every graph is launched directly.
    graphs_ok: bool,
    /// ROCMFORGE_GPU_PROFILE=1: every launch timed in the stream by events around it, totals
    /// per op and types logged when the backend is freed. Graphs are off meanwhile.
    profile: Option<std::collections::HashMap<String, (u32, f64)>>,
    /// Timed events the profile reuses, one per launch of the largest graph so far.
    profile_events: Vec<Event>,
    /// Runs of nodes fused into one kernel where possible (ops::launch_at); ROCMFORGE_GPU_FUSE=0: never.
    fuse: bool,
    /// ROCMFORGE_GPU_DUMP=1: the node sequence of big graphs logged (to see what fusion could take).
    dump: bool,
    /// Marks this stream's position for copies between backends (made on first use).
    copy_event: Option<Event>,
    /// Work was queued on the stream since the last `synchronize`: without any, synchronize
    /// returns at once (the scheduler and libllama call it several times a token, ~2 µs each).
    queued: bool,
    /// An error that queued work reported at `synchronize`; the next compute returns it.
    failed: Option<String>,
    /// Set between capture begin and end: still set afterwards means a panic (caught by the
    /// C boundary's guard) left the stream capturing; `abort_capture` ends it.
    capturing: bool,
    /// The device's staged writes this stream already waits for (`GpuCtx::order_after_staged`).
    staged_seen: u64,
    /// ROCMFORGE_GPU_TIMING=1: where a graph's time goes (see `Timing`).
    timing: Option<Timing>,
    /// Timing events around a `compute_timed` (made on first use).
    timer: Option<(Event, Event)>,
    /// Row split: per other GPU (by RFGPU number), the stream and buffers that compute its
    /// rows of split MUL_MATs (`split_exec`); made on first use.
    lanes: Vec<Option<split_exec::Lane>>,
    /// Shapes (`shape_key`) of graphs with split MUL_MATs whose capture failed (a prompt's peer
    /// copies cannot be captured): those run launch by launch, other graphs are still captured.
    split_uncaptured: Vec<u64>,
    /// `tag_next`'s tag for the next compute, and the keys of the graphs computed under each
    /// tag (`replay_tagged`) with the length of their prelude's words, at most `TAGS_MAX`.
    tag_next: Option<u64>,
    tagged: std::collections::HashMap<u64, (Vec<u64>, usize)>,
}

/// Tagged graphs' keys kept (a split token's GPU segments are a few dozen).
const TAGS_MAX: usize = 512;

/// Captures what `launch` queues on `stream` into a graph. The capture always ends, so the stream
/// is not left capturing, and a graph whose launches failed is destroyed (it was leaked before).
fn capture_graph(
    api: &dyn super::api::GpuApi,
    ord: usize,
    stream: Stream,
    launch: impl FnOnce() -> Result<()>,
) -> Result<super::api::Graph> {
    api.capture_begin(ord, stream).map_err(Error::Device)?;
    let launched = launch();
    let graph = api.capture_end(ord, stream).map_err(Error::Device);
    match (launched, graph) {
        (Ok(()), Ok(g)) => Ok(g),
        (Err(e), g) => {
            if let Ok(g) = g {
                api.graph_destroy(ord, g);
            }
            Err(e)
        }
        (Ok(()), Err(e)) => Err(e),
    }
}

/// A timed graph not yet read: ((nodes, rows), start, end, host seconds inside compute, seconds
/// since the previous compute, seconds waited in synchronize since the previous compute).
type PendingGraph = ((usize, usize), Event, Event, f64, f64, f64);

/// ROCMFORGE_GPU_TIMING=1: every graph_compute is bracketed by timed events. At `synchronize`
/// the GPU time of each graph and the stream time before it since the previous graph ended
/// (input/output copies and the GPU idle while the host builds the next graph) are added up
/// per graph size, with the host time spent inside compute, waiting in synchronize since the
/// previous compute, and the period between computes;
/// logged when the backend is freed. Shows whether generation is bound by the GPU or the host.
#[derive(Default)]
struct Timing {
    free: Vec<Event>,
    pending: Vec<PendingGraph>,
    last_end: Option<Event>,
    last_compute: Option<std::time::Instant>,
    /// Seconds waited in synchronize since the last compute.
    waited: f64,
    /// Per (node count, rows of the first node): graphs, GPU ms, ms before on the stream, host
    /// ms in compute, period ms, ms waited in synchronize.
    rows: std::collections::BTreeMap<(usize, usize), [f64; 6]>,
    /// Host seconds in compute: scratch and kernels, graph key, launching; the key compared
    /// in `repeats_last` (before compute); and how many graphs were replayed, captured,
    /// launched kernel by kernel.
    phases: [f64; 4],
    modes: [u64; 3],
}

impl Timing {
    fn event(&mut self, ctx: &GpuCtx) -> Result<Event> {
        match self.free.pop() {
            Some(e) => Ok(e),
            None => ctx.api.event_create_timed(ctx.ord).map_err(Error::Device),
        }
    }

    /// Reads the events of graphs that finished (the stream was just drained).
    fn collect(&mut self, ctx: &GpuCtx) {
        for (nodes, start, end, host, period, waited) in std::mem::take(&mut self.pending) {
            let gpu = ctx
                .api
                .event_elapsed_ms(ctx.ord, start, end)
                .unwrap_or(f32::NAN) as f64;
            let before = match self.last_end {
                Some(prev) => ctx
                    .api
                    .event_elapsed_ms(ctx.ord, prev, start)
                    .unwrap_or(f32::NAN) as f64,
                None => f64::NAN,
            };
            let r = self.rows.entry(nodes).or_default();
            for (v, x) in
                r.iter_mut()
                    .zip([1.0, gpu, before, host * 1e3, period * 1e3, waited * 1e3])
            {
                if x.is_finite() {
                    *v += x;
                }
            }
            self.free.extend(self.last_end.replace(end));
            self.free.push(start);
        }
    }

    fn report(&self, name: &str) -> String {
        let mut out = format!("{name} timing per graph (averages in µs): nodes, rows, graphs, GPU, stream before it (copies + idle), host in compute, period between computes, host waiting in synchronize in that period");
        for ((nodes, rows), r) in &self.rows {
            let n = r[0].max(1.0);
            out += &format!(
                "\n  {nodes:6} {rows:5} {:6} {:9.1} {:9.1} {:9.1} {:9.1} {:9.1}",
                r[0],
                r[1] * 1e3 / n,
                r[2] * 1e3 / n,
                r[3] * 1e3 / n,
                r[4] * 1e3 / n,
                r[5] * 1e3 / n
            );
        }
        let [a, b, c, d] = self.phases.map(|v| v * 1e3);
        let [rp, cp, dl] = self.modes;
        out += &format!("\n  host ms in compute: scratch+kernels {a:.1}, graph key {b:.1}, launching {c:.1}; key compared before compute {d:.1}; graphs replayed {rp}, captured {cp}, launched kernel by kernel {dl}");
        out
    }
}

/// ROCMFORGE_GPU_GRAPH_UPDATE=0: a new executable graph for every capture (for measuring).
fn graph_updates() -> bool {
    crate::tuning::get().gpu_graph_update
}

/// Whether two contexts come from the same vendor runtime (copies and events between them work).
fn same_runtime(a: &GpuCtx, b: &GpuCtx) -> bool {
    std::ptr::eq(
        Arc::as_ptr(&a.api) as *const u8,
        Arc::as_ptr(&b.api) as *const u8,
    )
}

/// What the kernel arguments of a graph are made of: per node its op, parameters and type,
/// and address, shape and strides of it and its sources. Equal keys launch identical kernels
/// (fusion decisions included: they follow from ops, flags and which addresses feed which).
/// The key is the scratch address, then `node_words` (src/tensor.rs) of every node, written
/// into `key` (cleared first, capacity kept).
fn graph_key(key: &mut Vec<u64>, nodes: &[Tensor], scratch: DevPtr) {
    key.clear();
    key.push(scratch);
    // No buffer freed since (a freed address may come back as another, smaller buffer).
    key.push(crate::tensor::free_epoch());
    let mut w = [0u64; NODE_WORDS];
    for n in nodes {
        let len = node_words(n, &mut w);
        key.extend_from_slice(&w[..len]);
    }
}

/// A hash of the graph's key without its addresses: equal for graphs that launch the same
/// kernels with the same shapes on other memory.
fn shape_key(nodes: &[Tensor]) -> u64 {
    let mut w = [0u64; NODE_WORDS];
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for n in nodes {
        let len = node_words(n, &mut w);
        for at in (10..len).step_by(TENSOR_WORDS) {
            w[at] = 0;
        }
        for &x in &w[..len] {
            h = (h ^ x).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Whether the graph's key equals `last`, compared node by node as it is walked (nothing
/// kept: this runs for every token, and the key is rebuilt only when it differs).
fn key_matches(last: &[u64], nodes: &[Tensor], scratch: DevPtr, prelude: &[u64]) -> bool {
    if last.first() != Some(&scratch) || last.get(1) != Some(&crate::tensor::free_epoch()) {
        return false;
    }
    let mut at = 2;
    let mut w = [0u64; NODE_WORDS];
    for n in nodes {
        let len = node_words(n, &mut w);
        if last.get(at..at + len) != Some(&w[..len]) {
            return false;
        }
        at += len;
    }
    last.get(at..) == Some(prelude)
}

/// Queues a prelude's copies (key words: PRELUDE_MARK, then device, host, bytes each).
fn queue_prelude(
    api: &dyn super::api::GpuApi,
    ord: usize,
    stream: Stream,
    prelude: &[u64],
) -> Result<()> {
    for c in prelude.get(1..).unwrap_or_default().chunks_exact(3) {
        api.copy_htod_async(ord, c[0], c[1] as usize as *const u8, c[2] as usize, stream)
            .map_err(Error::Device)?;
    }
    Ok(())
}

/// Marks the prelude's words at the end of a graph's key.
const PRELUDE_MARK: u64 = 0x7072_656c_7564_6500;

/// The lengths of a prelude's copies mixed into a shape key: an executable is re-pointed only
/// at a graph whose copies have the same sizes.
fn prelude_shape(shape: u64, prelude: &[u64]) -> u64 {
    prelude.iter().skip(3).step_by(3).fold(shape, |h, &len| {
        (h ^ len).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// ROCMFORGE_GPU_TIMING: host time per phase of a compute (to `t1`: checks and scratch, to
/// `t2`: graph key and the kernels' dry run, then launching) and how the graph ran (0 replayed,
/// 1 captured, 2 kernel by kernel).
fn note_phases(
    timing: &mut Option<Timing>,
    mode: usize,
    t0: std::time::Instant,
    t1: std::time::Instant,
    t2: std::time::Instant,
) {
    if let Some(t) = timing.as_mut() {
        let t3 = std::time::Instant::now();
        for (p, d) in t.phases.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2]) {
            *p += d.as_secs_f64();
        }
        t.modes[mode] += 1;
    }
}

/// What ROCMFORGE_GPU_PROFILE adds a launch's time to: op, how many nodes it fused, the
/// tensor's name without its layer number ("ffn_up-7" -> "ffn_up"), types and shapes.
fn profile_label(node: &Tensor, taken: usize) -> String {
    let types: Vec<String> = (0..3)
        .filter_map(|i| node.src(i))
        .map(|s| format!("{:?}", s.dtype()))
        .collect();
    let src0 = node.src(0).map(|s| s.ne()).unwrap_or_default();
    let name = node.name();
    let base = name
        .rsplit_once('-')
        .filter(|(_, n)| n.parse::<u32>().is_ok())
        .map_or(name.as_str(), |(b, _)| b);
    let fused = if taken > 1 {
        format!(" +{} fused", taken - 1)
    } else {
        String::new()
    };
    format!(
        "op {}{fused} {base} [{}] src0 {:?} out {:?}",
        node.op(),
        types.join(","),
        src0,
        node.ne()
    )
}

impl GpuBackend {
    pub fn new(ctx: Arc<GpuCtx>, name: CString) -> Result<GpuBackend> {
        let stream = ctx.api.stream_create(ctx.ord).map_err(Error::Device)?;
        let knobs = crate::tuning::get();
        let profile = knobs.gpu_profile.then(Default::default);
        let graphs_ok = profile.is_none() && knobs.gpu_graphs;
        let fuse = knobs.gpu_fuse;
        let dump = knobs.gpu_dump;
        let timing = knobs.gpu_timing.then(Timing::default);
        Ok(GpuBackend {
            ctx,
            stream,
            name,
            scratch: (0, 0),
            fa_counters: 0,
            last_key: Vec::new(),
            prelude: Vec::new(),
            last_prelude: Vec::new(),
            key: Vec::new(),
            known_repeat: None,
            prefetch_settled: None,
            exec: None,
            exec_current: false,
            exec_nodes: None,
            exec_shape: 0,
            exec_plain: false,
            cache: graph_cache::GraphCache::new(if graphs_ok { knobs.gpu_graph_cache } else { 0 }),
            last_plain: false,
            graphs_ok,
            profile,
            profile_events: Vec::new(),
            fuse,
            dump,
            copy_event: None,
            queued: false,
            capturing: false,
            failed: None,
            staged_seen: 0,
            timing,
            timer: None,
            lanes: Vec::new(),
            split_uncaptured: Vec::new(),
            tag_next: None,
            tagged: Default::default(),
        })
    }

    /// Makes work queued from now on wait for the host's staged writes to this device.
    fn after_staged_writes(&mut self) -> Result<()> {
        self.ctx
            .order_after_staged(self.stream, &mut self.staged_seen)
            .map_err(Error::Device)
    }

    fn copy_event(&mut self) -> Result<Event> {
        if let Some(e) = self.copy_event {
            return Ok(e);
        }
        let e = self
            .ctx
            .api
            .event_create(self.ctx.ord)
            .map_err(Error::Device)?;
        self.copy_event = Some(e);
        Ok(e)
    }

    /// Queues a copy of `len` bytes inside this device's memory on this stream.
    pub fn copy_local(&mut self, dst: *mut u8, src: *const u8, len: usize) -> Result<bool> {
        let (dst, src) = (dst as usize as DevPtr, src as usize as DevPtr);
        if !self.ctx.owns_device(dst, len) || !self.ctx.owns_device(src, len) {
            return Ok(false);
        }
        self.after_staged_writes()?;
        self.queued = true;
        self.ctx
            .api
            .copy_dtod_async(self.ctx.ord, dst, src, len, self.stream)
            .map_err(Error::Device)?;
        Ok(true)
    }

    /// Queues a copy of `len` bytes from `src` (device memory of `from`'s device) to `dst`
    /// (this device's memory). It runs after the work queued so far on both streams, and work
    /// queued later on either runs after it. Ok(false): not between our device memories.
    pub fn copy_from(
        &mut self,
        from: &mut GpuBackend,
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> Result<bool> {
        let (dst, src) = (dst as usize as DevPtr, src as usize as DevPtr);
        if !same_runtime(&self.ctx, &from.ctx)
            || !self.ctx.owns_device(dst, len)
            || !from.ctx.owns_device(src, len)
        {
            return Ok(false);
        }
        self.after_staged_writes()?;
        from.after_staged_writes()?;
        let api = self.ctx.api.clone();
        let (dord, sord) = (self.ctx.ord, from.ctx.ord);
        (self.queued, from.queued) = (true, true);
        let here = self.copy_event()?;
        api.event_record(dord, here, self.stream)
            .map_err(Error::Device)?;
        api.stream_wait_event(sord, from.stream, here)
            .map_err(Error::Device)?;
        if dord == sord {
            api.copy_dtod_async(sord, dst, src, len, from.stream)
                .map_err(Error::Device)?;
        } else {
            api.copy_peer_async(dord, dst, sord, src, len, sord, from.stream)
                .map_err(Error::Device)?;
        }
        let there = from.copy_event()?;
        api.event_record(sord, there, from.stream)
            .map_err(Error::Device)?;
        api.stream_wait_event(dord, self.stream, there)
            .map_err(Error::Device)?;
        Ok(true)
    }

    /// Records `e` (an event of this device) after the work queued so far.
    pub fn record(&mut self, e: &GpuEvent) -> Result<()> {
        if !Arc::ptr_eq(&e.ctx, &self.ctx) {
            return Err(Error::Unsupported(format!(
                "event of another device recorded on {}",
                self.name.to_string_lossy()
            )));
        }
        self.queued = true;
        self.ctx
            .api
            .event_record(self.ctx.ord, e.event, self.stream)
            .map_err(Error::Device)
    }

    /// Makes work queued later on this stream wait for `e` (of any device of this runtime).
    pub fn wait(&mut self, e: &GpuEvent) -> Result<()> {
        if !same_runtime(&e.ctx, &self.ctx) {
            return Err(Error::Unsupported(format!(
                "event of another runtime waited for on {}",
                self.name.to_string_lossy()
            )));
        }
        self.queued = true;
        self.ctx
            .api
            .stream_wait_event(self.ctx.ord, self.stream, e.event)
            .map_err(Error::Device)
    }

    /// Whether `nodes` have the key of the graph computed last (where graphs are kept at all).
    fn is_last_graph(&self, nodes: &[Tensor]) -> bool {
        self.graphs_ok && key_matches(&self.last_key, nodes, self.scratch.0, &self.prelude)
    }

    /// Makes the scratch at least `bytes` large. Work queued earlier may still use the old
    /// one, so the stream is drained before it is freed.
    fn ensure_scratch(&mut self, bytes: usize) -> Result<()> {
        if bytes <= self.scratch.1 {
            return Ok(());
        }
        let (api, ord) = (&self.ctx.api, self.ctx.ord);
        if self.scratch.0 != 0 {
            api.stream_sync(ord, self.stream).map_err(Error::Device)?;
            api.free(ord, self.scratch.0);
            self.scratch = (0, 0);
        }
        let size = bytes.next_power_of_two().max(1 << 20);
        let ptr = api.alloc(ord, size).map_err(Error::Device)?;
        self.scratch = (ptr, size);
        Ok(())
    }

    /// Every tensor a kernel will touch must lie in this device's memory: a host address
    /// handed to a kernel would fault and poison the whole GPU context.
    fn check_memory(&self, node: &Tensor) -> Result<()> {
        let mut ts = vec![*node];
        ts.extend((0..crate::ffi::abi::GGML_MAX_SRC).filter_map(|i| node.src(i)));
        for (i, t) in ts.into_iter().enumerate() {
            if t.is_empty() {
                continue;
            }
            let (at, end) = t.data_range().map_err(Error::Unsupported)?;
            let (at, len) = (at as u64, end - at);
            // The output (first) is written: a read-only host mapping will not do for it.
            let ok = if i == 0 {
                self.ctx.owns_writable(at, len)
            } else {
                self.ctx.owns(at, len)
            };
            if !ok {
                return Err(Error::Unsupported(format!(
                    "tensor '{}' is not in {} memory",
                    t.name(),
                    self.name.to_string_lossy()
                )));
            }
        }
        Ok(())
    }

    /// After a panic inside a capture: ends it, drops what was captured, stops using graphs
    /// on this backend and leaves an error for the next compute.
    fn abort_capture(&mut self) {
        if std::mem::take(&mut self.capturing) {
            if let Ok(g) = self.ctx.api.capture_end(self.ctx.ord, self.stream) {
                self.ctx.api.graph_destroy(self.ctx.ord, g);
            }
            (self.graphs_ok, self.exec_current) = (false, false);
            self.failed = Some("a panic interrupted a graph capture".into());
        }
    }

    /// The scratch every node needs and the attention counters, made before a new graph runs.
    fn prepare(&mut self, nodes: &[Tensor]) -> Result<()> {
        let need = nodes.iter().map(ops::scratch_bytes).max().unwrap_or(0);
        if need > 0 {
            self.ensure_scratch(need)?;
        }
        if self.fa_counters == 0
            && nodes
                .iter()
                .any(|n| n.op() == crate::ggml_types::op::FLASH_ATTN_EXT)
        {
            // Failure only costs the one-launch merge (the combine kernel runs instead).
            let (api, ord) = (&self.ctx.api, self.ctx.ord);
            if let Ok(p) = api.alloc(ord, ops::FA_COUNTERS * 4) {
                if self.ctx.fill_device(p, 0, ops::FA_COUNTERS * 4).is_ok() {
                    self.fa_counters = p;
                } else {
                    api.free(ord, p);
                }
            }
        }
        Ok(())
    }

    /// What launches on this stream need: the device's kernels and facts, the scratch, the
    /// attention counters; nothing noted yet about the scratch's contents.
    fn launch_ctx<'a>(&self, ctx: &'a GpuCtx) -> ops::LaunchCtx<'a> {
        ops::LaunchCtx {
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
        }
    }

    /// Moves the current executable (of the last graph, a plain one) into the cache.
    fn park_current(&mut self) -> Result<()> {
        if !self.cache.enabled() || !self.exec_current || !self.exec_plain {
            return Ok(());
        }
        let Some(e) = self.exec.take() else {
            return Ok(());
        };
        self.exec_current = false;
        let out = self
            .cache
            .put(self.last_key.clone(), e, self.exec_nodes, self.exec_shape);
        self.destroy_execs(out.into_iter().collect())
    }

    /// Makes a graph taken from the cache the current one (the current one parked in its
    /// place) and returns its executable.
    fn adopt_kept(&mut self, k: graph_cache::Kept) -> Result<GraphExec> {
        self.park_current()?;
        // An executable left that could not be kept (a row split's) is replaced.
        let left: Vec<GraphExec> = self.exec.take().into_iter().collect();
        self.destroy_execs(left)?;
        self.last_key = k.key;
        (self.exec, self.exec_current, self.exec_plain) = (Some(k.exec), true, true);
        (self.exec_nodes, self.exec_shape) = (k.nodes, k.shape);
        Ok(k.exec)
    }

    /// Drops kept graphs made before the scratch moved or a buffer was freed (never to match).
    fn drop_stale_kept(&mut self) -> Result<()> {
        let prefix = [self.scratch.0, crate::tensor::free_epoch()];
        let stale = self.cache.stale(&prefix);
        self.destroy_execs(stale)
    }

    /// Destroys executables once the stream has finished running them.
    fn destroy_execs(&mut self, execs: Vec<GraphExec>) -> Result<()> {
        if execs.is_empty() {
            return Ok(());
        }
        let (api, ord) = (&self.ctx.api, self.ctx.ord);
        api.stream_sync(ord, self.stream).map_err(Error::Device)?;
        for e in execs {
            api.graph_exec_destroy(ord, e);
        }
        Ok(())
    }

    /// Queues a graph's kernels (replayed as a captured graph where it repeats), after the
    /// prelude's copies.
    fn compute_graph(&mut self, nodes: &[Tensor]) -> Result<()> {
        let prelude = std::mem::take(&mut self.prelude);
        let tag = self.tag_next.take();
        let r = self.compute_graph_with(nodes, &prelude);
        // A tagged graph's key (its prelude's words at its end): what `replay_tagged` launches.
        if let Some(tag) = tag.filter(|_| r.is_ok() && self.graphs_ok && self.profile.is_none()) {
            if self.tagged.len() >= TAGS_MAX {
                self.tagged.clear();
            }
            self.tagged
                .insert(tag, (self.last_key.clone(), prelude.len()));
        }
        // What `replay_last` compares with; a failed graph is never replayed.
        self.last_prelude = if r.is_ok() { prelude } else { vec![u64::MAX] };
        r
    }

    fn compute_graph_with(&mut self, nodes: &[Tensor], prelude: &[u64]) -> Result<()> {
        self.abort_capture();
        if let Some(e) = self.failed.take() {
            return Err(Error::Device(format!(
                "earlier work on this stream failed: {e}"
            )));
        }
        self.after_staged_writes()?;
        self.queued = true;
        let t0 = std::time::Instant::now();
        // The same key as the graph before (token generation): everything below that the key
        // determines (scratch size, the attention counters, addresses checked) was done for it.
        // The scratch address is part of the key, and only a new graph grows the scratch.
        let repeated = match self.known_repeat.take() {
            Some(r) => r && prelude == self.last_prelude,
            None => self.graphs_ok && key_matches(&self.last_key, nodes, self.scratch.0, prelude),
        };
        if !repeated {
            self.prepare(nodes)?;
        }
        let ctx = self.ctx.clone();
        let kernels = &ctx.kernels;
        let t1 = std::time::Instant::now();
        // A new graph's key is taken after the scratch grew (its address is in the key).
        if self.graphs_ok && !repeated {
            graph_key(&mut self.key, nodes, self.scratch.0);
            self.key.extend_from_slice(prelude);
        }
        let (api, ord) = (ctx.api.as_ref(), ctx.ord);
        // A graph captured earlier (not just before): replayed. A graph seen before: captured.
        let mut capture_now = false;
        if self.graphs_ok && !repeated && self.cache.enabled() && self.profile.is_none() {
            self.drop_stale_kept()?;
            if let Some(k) = self.cache.take(&self.key) {
                let exec = self.adopt_kept(k)?;
                let r = api
                    .graph_launch(ord, exec, self.stream)
                    .map_err(Error::Device);
                note_phases(&mut self.timing, 0, t0, t1, t1);
                return r;
            }
            if self.cache.seen_before(&self.key) {
                self.park_current()?;
                std::mem::swap(&mut self.last_key, &mut self.key);
                self.exec_current = false;
                capture_now = true;
            }
        }
        let wants = std::cell::RefCell::new(Vec::new());
        let mut lc = self.launch_ctx(&ctx);
        if !repeated && self.prefetch_settled != Some(kernels.misses()) {
            // The kernel groups this graph launches, compiled together on a few threads
            // instead of one after another as the launches reach them.
            lc.wants = Some(&wants);
            let uses = ops::Uses::of(nodes);
            let mut i = 0;
            while i < nodes.len() {
                i += ops::launch_at(nodes, i, &uses, &lc).unwrap_or(1).max(1);
            }
            // What the dry run noted about the scratch's contents is not true.
            (lc.wants, lc.q8, lc.q8_next) = (None, Default::default(), Default::default());
            let names = wants.take();
            if kernels.prefetch(names.iter().map(String::as_str)) == 0 {
                self.prefetch_settled = Some(kernels.misses());
            } else {
                self.prefetch_settled = None;
            }
        }
        let t2 = std::time::Instant::now();
        let note = |timing: &mut Option<Timing>, mode: usize| note_phases(timing, mode, t0, t1, t2);
        let mut mode = 0;
        if !repeated {
            for node in nodes {
                self.check_memory(node)?;
            }
        }
        // Node i, fused with what follows where possible: how many nodes it took.
        let launch = |i: usize, uses: &ops::Uses| {
            ops::launch_at(nodes, i, uses, &lc)
                .map_err(|e| Error::Device(format!("node '{}': {e}", nodes[i].name())))
        };
        if self.dump && nodes.len() > 40 {
            // The node sequence (first 90 nodes), to see which runs the fusion could take.
            let mut out = format!(
                "{} graph of {} nodes:",
                self.name.to_string_lossy(),
                nodes.len()
            );
            for n in nodes.iter().take(90) {
                let srcs: Vec<String> = (0..3).filter_map(|i| n.src(i)).map(|s| s.name()).collect();
                out += &format!("\n  op {:2} {:24} <- {}", n.op(), n.name(), srcs.join(", "));
            }
            crate::log_info!("{out}");
        }
        let stream = self.stream;
        let launch_all = || -> Result<()> {
            queue_prelude(api, ord, stream, prelude)?;
            let uses = ops::Uses::of(nodes);
            let mut i = 0;
            while i < nodes.len() {
                i += launch(i, &uses)?;
            }
            Ok(())
        };
        if self.profile.is_some() {
            // A spin kernel holds the stream while the host queues every launch with a timed
            // event behind it; then the kernels run back to back, and event i-1 -> i times
            // launch i (fused runs count as one) as it runs in the stream.
            api.stream_sync(ord, self.stream).map_err(Error::Device)?;
            let mut events = std::mem::take(&mut self.profile_events);
            let result = (|| -> Result<Vec<String>> {
                queue_prelude(api, ord, self.stream, prelude)?;
                let spin_cycles = 40_000_000; // about 20 ms at 2 GHz: longer than queueing a graph
                ops::launch_spin(&lc, spin_cycles).map_err(Error::Device)?;
                let uses = ops::Uses::of(nodes);
                // Event k marks the end of launch k (event 0: the start of the first).
                let mut labels = Vec::new();
                let mut i = 0;
                while i < nodes.len() {
                    while events.len() <= labels.len() + 1 {
                        events.push(api.event_create_timed(ord).map_err(Error::Device)?);
                    }
                    if labels.is_empty() {
                        api.event_record(ord, events[0], self.stream)
                            .map_err(Error::Device)?;
                    }
                    let taken = launch(i, &uses)?;
                    api.event_record(ord, events[labels.len() + 1], self.stream)
                        .map_err(Error::Device)?;
                    labels.push(profile_label(&nodes[i], taken));
                    i += taken;
                }
                api.stream_sync(ord, self.stream).map_err(Error::Device)?;
                Ok(labels)
            })();
            let labels = match result {
                Ok(l) => l,
                Err(e) => {
                    self.profile_events = events;
                    return Err(e);
                }
            };
            if let Some(p) = self.profile.as_mut() {
                for (k, label) in labels.into_iter().enumerate() {
                    let ms = api
                        .event_elapsed_ms(ord, events[k], events[k + 1])
                        .unwrap_or(0.0) as f64;
                    let e = p.entry(label).or_insert((0, 0.0));
                    *e = (e.0 + 1, e.1 + ms * 1e-3);
                }
            }
            self.profile_events = events;
            return Ok(());
        }
        if self.graphs_ok {
            if repeated || capture_now {
                if !self.exec_current {
                    mode = 1;
                    // Seen twice in a row: capture it. The old executable is re-pointed at the
                    // new graph where the runtime allows, else replaced; on failure it is kept
                    // (and freed with the backend). The stream is drained first, so the old
                    // executable is not running while it is updated or destroyed.
                    let captured = (|| -> Result<(GraphExec, Option<usize>, u64)> {
                        // Only an old executable needs the drain (none after one was kept).
                        if self.exec.is_some() {
                            api.stream_sync(ord, self.stream).map_err(Error::Device)?;
                        }
                        self.capturing = true;
                        let graph = capture_graph(api, ord, self.stream, launch_all);
                        self.capturing = false;
                        let graph = graph?;
                        // The old executable is re-pointed only at a graph of the same kernels
                        // and shapes on other memory. With another node count the update can
                        // only fail (an error the driver reports, and sanitizers list); with
                        // the same count but other kernels (cuBLAS's among them) the driver
                        // accepted some updates that then computed wrong results (H100, the
                        // stress test: about 5 in 100,000 captured graphs).
                        let count = api.graph_node_count(ord, graph);
                        let shape = prelude_shape(shape_key(nodes), prelude);
                        let exec = match self.exec {
                            Some(e)
                                if count.is_some()
                                    && count == self.exec_nodes
                                    && shape == self.exec_shape
                                    && graph_updates()
                                    && api.graph_exec_update(ord, e, graph) =>
                            {
                                Ok(e)
                            }
                            _ => api.graph_instantiate(ord, graph).map_err(Error::Device),
                        };
                        api.graph_destroy(ord, graph);
                        exec.map(|e| (e, count, shape))
                    })();
                    match captured {
                        Ok((e, count, shape)) => {
                            if let Some(old) = self.exec.filter(|&old| old != e) {
                                api.graph_exec_destroy(ord, old);
                            }
                            (self.exec, self.exec_current, self.exec_plain) = (Some(e), true, true);
                            (self.exec_nodes, self.exec_shape) = (count, shape);
                        }
                        Err(e) => {
                            crate::log_warn!("{}: graph capture failed, launching kernels one by one from now on: {e}", self.name.to_string_lossy());
                            self.graphs_ok = false;
                        }
                    }
                }
                if let (Some(e), true) = (self.exec, self.exec_current) {
                    let r = api.graph_launch(ord, e, self.stream).map_err(Error::Device);
                    note(&mut self.timing, mode);
                    return r;
                }
            }
            // A new graph: run it directly; capture waits until it repeats.
            if crate::ffi::log::debug_enabled() {
                let at = self
                    .key
                    .iter()
                    .zip(&self.last_key)
                    .position(|(a, b)| a != b);
                crate::log_debug!(
                    "{}: graph of {} nodes differs from the last one (key word {at:?} of {})",
                    self.name.to_string_lossy(),
                    nodes.len(),
                    self.key.len()
                );
            }
            self.park_current()?;
            self.exec_current = false;
            std::mem::swap(&mut self.last_key, &mut self.key);
        }
        let r = launch_all();
        note(&mut self.timing, 2);
        r
    }
}

impl Drop for GpuBackend {
    fn drop(&mut self) {
        // The lanes' work feeds this stream: they go first (each drains its own stream).
        self.lanes.clear();
        if let Some(p) = &self.profile {
            let mut rows: Vec<_> = p.iter().collect();
            rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
            let total: f64 = rows.iter().map(|r| r.1 .1).sum();
            let mut out = format!(
                "{} kernel profile: {:.3} ms in all\n",
                self.name.to_string_lossy(),
                total * 1e3
            );
            for (label, (n, t)) in rows.iter().take(40) {
                out += &format!(
                    "  {:8.3} ms {:5.1}% {:7} x {:9.2} us  {label}\n",
                    t * 1e3,
                    100.0 * t / total,
                    n,
                    t * 1e6 / *n as f64
                );
            }
            crate::log_info!("{out}");
        }
        self.abort_capture();
        let _ = self.ctx.api.stream_sync(self.ctx.ord, self.stream);
        if let Some(mut t) = self.timing.take() {
            t.collect(&self.ctx);
            crate::log_info!("{}", t.report(&self.name.to_string_lossy()));
            for e in t.free.into_iter().chain(t.last_end) {
                self.ctx.api.event_destroy(self.ctx.ord, e);
            }
        }
        if let Some(e) = self.copy_event.take() {
            self.ctx.api.event_destroy(self.ctx.ord, e);
        }
        if let Some((a, b)) = self.timer.take() {
            self.ctx.api.event_destroy(self.ctx.ord, a);
            self.ctx.api.event_destroy(self.ctx.ord, b);
        }
        for e in std::mem::take(&mut self.profile_events) {
            self.ctx.api.event_destroy(self.ctx.ord, e);
        }
        if let Some(e) = self.exec.take() {
            self.ctx.api.graph_exec_destroy(self.ctx.ord, e);
        }
        for e in self.cache.drain() {
            self.ctx.api.graph_exec_destroy(self.ctx.ord, e);
        }
        if self.scratch.0 != 0 {
            self.ctx.api.free(self.ctx.ord, self.scratch.0);
        }
        if self.fa_counters != 0 {
            self.ctx.api.free(self.ctx.ord, self.fa_counters);
        }
        self.ctx.api.stream_destroy(self.ctx.ord, self.stream);
        // A host may unload the library once its backends are freed: no compile thread may
        // still be running its code then.
        self.ctx.kernels.quiesce();
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &CStr {
        &self.name
    }

    fn set_prelude(&mut self, copies: &[(usize, usize, usize)]) -> bool {
        if copies
            .iter()
            .any(|&(d, _, n)| !self.ctx.owns_device(d as DevPtr, n))
        {
            return false;
        }
        self.prelude.clear();
        if !copies.is_empty() {
            self.prelude.push(PRELUDE_MARK);
            for &(d, h, n) in copies {
                self.prelude.extend([d as u64, h as u64, n as u64]);
            }
        }
        true
    }

    fn replay_last(&mut self) -> Result<bool> {
        // Only the captured executable of the last plain graph, untimed and unprofiled.
        let exec = match self.exec {
            Some(e) if self.exec_current && self.graphs_ok && self.last_plain => e,
            _ => return Ok(false),
        };
        if self.timing.is_some()
            || self.profile.is_some()
            || self.failed.is_some()
            || self.prelude != self.last_prelude
        {
            return Ok(false);
        }
        self.abort_capture();
        self.after_staged_writes()?;
        self.queued = true;
        let ctx = self.ctx.clone();
        ctx.api
            .graph_launch(ctx.ord, exec, self.stream)
            .map_err(Error::Device)?;
        // The executable makes the prelude's copies.
        self.prelude.clear();
        Ok(true)
    }

    fn tag_next(&mut self, tag: u64) {
        self.tag_next = Some(tag);
    }

    fn replay_tagged(&mut self, tag: u64) -> Result<bool> {
        let Some((key, plen)) = self.tagged.get(&tag) else {
            return Ok(false);
        };
        // A key made before the scratch moved or a buffer was freed can no longer match; the
        // copies in set now must be the captured ones.
        if !self.graphs_ok
            || self.timing.is_some()
            || self.profile.is_some()
            || self.failed.is_some()
            || key.get(key.len().saturating_sub(*plen)..) != Some(&self.prelude[..])
            || key.get(..2) != Some(&[self.scratch.0, crate::tensor::free_epoch()][..])
        {
            return Ok(false);
        }
        let current = self.exec_current && self.exec_plain && self.last_key == *key;
        if !current {
            let Some(k) = self.cache.take(key) else {
                return Ok(false);
            };
            self.adopt_kept(k)?;
        }
        let Some(exec) = self.exec else {
            return Ok(false);
        };
        self.abort_capture();
        self.after_staged_writes()?;
        self.queued = true;
        (self.last_plain, self.known_repeat) = (true, None);
        // The executable makes the prelude's copies.
        self.last_prelude = std::mem::take(&mut self.prelude);
        let ctx = self.ctx.clone();
        ctx.api
            .graph_launch(ctx.ord, exec, self.stream)
            .map_err(Error::Device)?;
        Ok(true)
    }

    fn repeats_last(&mut self, nodes: &[Tensor]) -> bool {
        let t0 = std::time::Instant::now();
        let r = self.failed.is_none() && self.is_last_graph(nodes);
        self.known_repeat = Some(r);
        if let Some(t) = self.timing.as_mut() {
            t.phases[3] += t0.elapsed().as_secs_f64();
        }
        r
    }

    fn compute_timed(&mut self, nodes: &[Tensor]) -> Result<Option<f64>> {
        let ctx = self.ctx.clone();
        let (api, ord) = (&ctx.api, ctx.ord);
        if self.timer.is_none() {
            let a = api.event_create_timed(ord).map_err(Error::Device)?;
            match api.event_create_timed(ord) {
                Ok(b) => self.timer = Some((a, b)),
                Err(e) => {
                    api.event_destroy(ord, a);
                    return Err(Error::Device(e));
                }
            }
        }
        let (a, b) = self.timer.unwrap();
        // A spin kernel holds the stream while the host queues the start event, the node's
        // launches and the end event: the events then time the node's kernels alone, not the
        // host's launch between them (12-16 us for a small node, more than its kernel).
        let lc = self.launch_ctx(&ctx);
        ops::launch_spin(&lc, TIMED_HOLD_CYCLES).map_err(Error::Device)?;
        api.event_record(ord, a, self.stream)
            .map_err(Error::Device)?;
        self.compute(nodes)?;
        api.event_record(ord, b, self.stream)
            .map_err(Error::Device)?;
        self.synchronize()?;
        let ms = api.event_elapsed_ms(ord, a, b).map_err(Error::Device)?;
        Ok(Some(ms as f64 * 1e3))
    }

    fn compute(&mut self, nodes: &[Tensor]) -> Result<()> {
        let splits = split_exec::split_sources(nodes);
        self.last_plain = splits.is_none();
        if let Some(splits) = splits {
            // A split graph's copies in are made as they are, never captured with it.
            let prelude = std::mem::take(&mut self.prelude);
            self.last_prelude = vec![u64::MAX];
            self.after_staged_writes()?;
            self.queued = true;
            queue_prelude(self.ctx.api.as_ref(), self.ctx.ord, self.stream, &prelude)?;
            return self.compute_with_splits(nodes, &splits);
        }
        let Some(t) = self.timing.as_mut() else {
            return self.compute_graph(nodes);
        };
        let t0 = std::time::Instant::now();
        let ctx = self.ctx.clone();
        let period = t
            .last_compute
            .replace(t0)
            .map_or(f64::NAN, |p| (t0 - p).as_secs_f64());
        let (start, end) = (t.event(&ctx)?, t.event(&ctx)?);
        ctx.api
            .event_record(ctx.ord, start, self.stream)
            .map_err(Error::Device)?;
        let r = self.compute_graph(nodes);
        ctx.api
            .event_record(ctx.ord, end, self.stream)
            .map_err(Error::Device)?;
        if let Some(t) = self.timing.as_mut() {
            let waited = std::mem::take(&mut t.waited);
            let rows = nodes.first().map_or(0, |n| n.ne()[1]);
            t.pending.push((
                (nodes.len(), rows),
                start,
                end,
                t0.elapsed().as_secs_f64(),
                period,
                waited,
            ));
        }
        r
    }

    fn synchronize(&mut self) -> Result<()> {
        self.abort_capture();
        if !self.queued && self.timing.is_none() {
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        let r = self
            .ctx
            .api
            .stream_sync(self.ctx.ord, self.stream)
            .map_err(Error::Device);
        match &r {
            Err(e) => self.failed = Some(e.to_string()),
            Ok(()) => {
                self.queued = false;
                if let Some(t) = self.timing.as_mut() {
                    t.waited += t0.elapsed().as_secs_f64();
                    t.collect(&self.ctx);
                }
            }
        }
        r
    }

    fn set_async(&mut self, dst: *mut u8, src: *const u8, len: usize) -> Result<bool> {
        let dst = dst as usize as DevPtr;
        if !self.ctx.owns_device(dst, len) {
            return Ok(false);
        }
        self.after_staged_writes()?;
        self.queued = true;
        let (ctx, stream) = (self.ctx.clone(), self.stream);
        super::in_page_pieces(src as usize, 0, len, &mut |at, n| {
            ctx.api
                .copy_htod_async(ctx.ord, dst + at as u64, src.wrapping_add(at), n, stream)
        })
        .map_err(Error::Device)?;
        Ok(true)
    }

    fn get_async(&mut self, dst: *mut u8, src: *const u8, len: usize) -> Result<bool> {
        let src = src as usize as DevPtr;
        if !self.ctx.owns_device(src, len) {
            return Ok(false);
        }
        self.after_staged_writes()?;
        self.queued = true;
        let (ctx, stream) = (self.ctx.clone(), self.stream);
        super::in_page_pieces(dst as usize, 0, len, &mut |at, n| {
            ctx.api
                .copy_dtoh_async(ctx.ord, dst.wrapping_add(at), src + at as u64, n, stream)
        })
        .map_err(Error::Device)?;
        Ok(true)
    }

    fn copy_device(
        &mut self,
        from: Option<&mut dyn Backend>,
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> Result<bool> {
        match from {
            None => self.copy_local(dst, src, len),
            Some(from) => match from
                .as_any_mut()
                .and_then(|a| a.downcast_mut::<GpuBackend>())
            {
                Some(from) => self.copy_from(from, dst, src, len),
                None => Ok(false),
            },
        }
    }

    fn record_event(&mut self, event: &dyn crate::device::Event) -> Result<bool> {
        match event.as_any().and_then(|a| a.downcast_ref::<GpuEvent>()) {
            Some(e) => self.record(e).map(|()| true),
            None => Ok(false),
        }
    }

    fn wait_event(&mut self, event: &dyn crate::device::Event) -> Result<bool> {
        match event.as_any().and_then(|a| a.downcast_ref::<GpuEvent>()) {
            Some(e) => self.wait(e).map(|()| true),
            None => Ok(false),
        }
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::testutil::TT;
    use crate::ggml_types::{op, GgmlType};

    #[test]
    fn key_matches_only_the_same_graph() {
        let x = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        let y = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        let mut a = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        a.op(op::ADD).src(0, &x).src(1, &y);
        let mut s = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        s.op(op::SCALE).pf(0, 2.0).src(0, &a);
        let nodes = [a.tensor(), s.tensor()];
        let mut key = Vec::new();
        graph_key(&mut key, &nodes, 4096);
        assert!(key_matches(&key, &nodes, 4096, &[]));
        assert!(!key_matches(&key, &nodes, 8192, &[]), "scratch address");
        crate::tensor::bump_free_epoch();
        assert!(
            !key_matches(&key, &nodes, 4096, &[]),
            "a buffer freed since"
        );
        graph_key(&mut key, &nodes, 4096);
        assert!(
            !key_matches(&key[..key.len() - 1], &nodes, 4096, &[]),
            "a shorter key"
        );
        assert!(!key_matches(&key, &nodes[..1], 4096, &[]), "fewer nodes");
        let mut s2 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        s2.op(op::SCALE).pf(0, 3.0).src(0, &a);
        assert!(
            !key_matches(&key, &[a.tensor(), s2.tensor()], 4096, &[]),
            "an op parameter"
        );
        let mut a2 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        a2.op(op::ADD).src(0, &x).src(1, &x);
        assert!(
            !key_matches(&key, &[a2.tensor(), s.tensor()], 4096, &[]),
            "a source"
        );
        let mut key2 = Vec::new();
        graph_key(&mut key2, &[a2.tensor(), s.tensor()], 4096);
        assert!(key_matches(&key2, &[a2.tensor(), s.tensor()], 4096, &[]));
        // The last of the 16 op parameters, and a third source after an absent second one.
        let mut s3 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        s3.op(op::SCALE).pf(0, 2.0).pi(15, 1).src(0, &a);
        assert!(
            !key_matches(&key, &[a.tensor(), s3.tensor()], 4096, &[]),
            "parameter 15"
        );
        let mut a3 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        a3.op(op::ADD).src(0, &x).src(2, &y);
        let mut key3 = Vec::new();
        graph_key(&mut key3, &[a3.tensor(), s.tensor()], 4096);
        assert!(key_matches(&key3, &[a3.tensor(), s.tensor()], 4096, &[]));
        assert!(
            !key_matches(&key3, &nodes, 4096, &[]),
            "a source in another slot"
        );
    }

    /// The shape key sees types, shapes and ops, not addresses.
    #[test]
    fn shape_key_ignores_addresses_only() {
        let x = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        let y = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        let mut a = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        a.op(op::ADD).src(0, &x).src(1, &y);
        let x2 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        let mut a2 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        a2.op(op::ADD).src(0, &x2).src(1, &y);
        assert_ne!(x.t.data, x2.t.data);
        assert_eq!(shape_key(&[a.tensor()]), shape_key(&[a2.tensor()]));
        let mut m = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        m.op(op::MUL).src(0, &x).src(1, &y);
        assert_ne!(shape_key(&[a.tensor()]), shape_key(&[m.tensor()]), "op");
        let x3 = TT::new(GgmlType::F32, [8, 3, 1, 1]);
        let mut a3 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        a3.op(op::ADD).src(0, &x3).src(1, &y);
        assert_ne!(shape_key(&[a.tensor()]), shape_key(&[a3.tensor()]), "shape");
        let x4 = TT::new(GgmlType::F16, [8, 2, 1, 1]);
        let mut a4 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        a4.op(op::ADD).src(0, &x4).src(1, &y);
        assert_ne!(shape_key(&[a.tensor()]), shape_key(&[a4.tensor()]), "type");
    }

    /// A source's type or strides are in the key even where its address is the same
    /// (a view of the same bytes read another way).
    #[test]
    fn key_sees_a_source_read_another_way() {
        let x = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        let mut n = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        n.op(op::SCALE).pf(0, 1.0).src(0, &x);
        let mut key = Vec::new();
        graph_key(&mut key, &[n.tensor()], 0);
        let mut x2 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        x2.t.data = x.t.data;
        assert!(key_matches(&key, &[n.tensor()], 0, &[]));
        x2.t.type_ = GgmlType::I32 as i32;
        let mut n2 = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        n2.t.data = n.t.data;
        n2.op(op::SCALE).pf(0, 1.0).src(0, &x2);
        assert!(!key_matches(&key, &[n2.tensor()], 0, &[]), "source type");
        x2.t.type_ = GgmlType::F32 as i32;
        assert!(
            key_matches(&key, &[n2.tensor()], 0, &[]),
            "same words again"
        );
        x2.t.nb[1] = 64;
        assert!(!key_matches(&key, &[n2.tensor()], 0, &[]), "source stride");
    }
}
