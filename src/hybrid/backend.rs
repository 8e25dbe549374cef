//! RFHYBRID's backend: plans a graph (`HybridScheduler`), then runs it as segments of
//! consecutive nodes on one device each. GPU segments run on copies of the nodes' structs
//! ("shadows") whose data pointers are the GPU copies of the same bytes; the residency map says
//! which bytes must be copied before each segment and records what each segment wrote.

use super::cost::CostModel;
use super::device::Shared;
use super::placement::{choose_resident, weight_value, Candidate};
use super::residency::{copy_in_pieces, Copy, RegionKind, Residency};
use super::scheduler::{range, DataView, HybridScheduler, NodeFacts};
use super::telemetry::{EventKind, ExecutionEvent};
use super::trial::PlanTrial;
use super::{usage, USAGE_COMPUTE, USAGE_WEIGHTS};
use super::{BackendSelection, ExecutionStrategy, Place, SelectionReason};
use crate::device::{Backend, Error, Result};
use crate::ffi::abi::{ggml_tensor, GGML_MAX_SRC};
use crate::ggml_types::op;
use crate::tensor::{node_words, Tensor, NODE_WORDS};
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::Arc;
use std::time::Instant;

mod replay;
mod script;
mod split_experts;
mod timing;

/// ggml's tensor flag: the host reads the tensor after the graph.
const FLAG_OUTPUT: i32 = 2;
/// `ggml_backend_buffer_usage` values.
/// GPU backends kept per RFHYBRID backend, one per GPU segment of a graph (each keeps its own
/// captured graph, so a split model's token replays every segment).
const MAX_GPU_STREAMS: usize = 8;
const PROBE: usize = MAX_GPU_STREAMS;
/// The stream weights are streamed on (beside the segments' streams).
const COPIER: usize = PROBE + 1;
/// With telemetry on, every this many graphs runs node by node, timing each node (the
/// measurements refine the cost model); other graphs are timed per segment. An 8B-class token
/// timed node by node takes ~20 ms (each node launched and waited for): every 4096th keeps
/// that under 0.2% of generation.
const SAMPLE_EVERY: u64 = 4096;
/// Without telemetry, a graph this often runs node by node for the cost model.
const REFINE_EVERY: u64 = 1024;
/// Re-plans of a graph shape that take its last trial's winner before a trial runs again.
const TRIAL_REUSE: u32 = 8;
/// Graphs with at most this many activation columns in their products are tokens: their plan
/// is tried against the plan that streams no weight (`plan`).
const TOKEN_COLUMNS: usize = 8;
/// Graphs after a recording of a run that was not plain before the next is tried (the run's
/// choices may change: a plan trial, the sharing width).
const RECORD_RETRY: u64 = 32;
/// Graphs whose plans are kept besides the last one's (a prompt's and a token's alternate).
const KNOWN_GRAPHS: usize = 4;
/// Smallest staging arena for streamed weights.
const ARENA_MIN: usize = 64 << 20;

/// Shadow tensor structs (their raw pointers are into this backend's own boxes and the host's
/// graph, used only inside `compute` on the calling thread).
/// Boxed: the kernels and the replay hold pointers to them while the vector grows.
#[allow(clippy::vec_box)]
struct Shadows(Vec<Box<ggml_tensor>>);
unsafe impl Send for Shadows {}

pub struct HybridBackend {
    shared: Arc<Shared>,
    cpu: Box<dyn Backend>,
    /// One GPU backend per GPU segment of a graph (created as needed), and the last one
    /// (`PROBE`) for timing nodes one by one.
    gpus: Vec<Box<dyn Backend>>,
    /// Which of `gpus` have work queued.
    pending: Vec<bool>,
    sched: HybridScheduler,
    graphs: u64,
    /// The last graph's key and plan (a token's graph repeats).
    /// The last graph's words (`graph_words`), plan and uses; `words` is scratch.
    last_words: Vec<u64>,
    words: Vec<u64>,
    last_plan: Vec<BackendSelection>,
    last_uses: Option<Uses>,
    /// `repeats_last`'s answer for the `compute` that follows it.
    known_same: Option<bool>,
    /// Earlier graphs' plans, most recent first, and whether the graph being computed is one
    /// of them come back (its replay must first bring the residency map up to date).
    known: Vec<Known>,
    restored: bool,
    /// The last graph, all on the GPU in one launch, to replay.
    fast: Option<Fast>,
    /// This graph streamed weights / how many GPU launches it made.
    streamed: bool,
    launches: usize,
    /// Created at the first GPU segment when the GPU has events.
    events: Option<StreamEvents>,
    /// This backend's id in the residency map's logs.
    log: u64,
    /// Copies are timed (nodes timed alone: their copies' time is not theirs), and the µs
    /// they took so far.
    time_copies: bool,
    copy_us: f64,
    /// ROCMFORGE_HYBRID_GRAPH_COPIES: a replay's copies in made by the captured graph.
    in_graph_copies: bool,
    /// The GPU stream of the last GPU segment run (a CPU segment's copies out queue on it).
    last_gpu_stream: usize,
    /// Telemetry's segment templates by a hash of the segment and its plan (timing.rs).
    templates: HashMap<u64, std::sync::Arc<super::telemetry::SegmentTemplate>>,
    shadows: Shadows,
    shadow_of: HashMap<usize, usize>,
    /// Shadows the next launch takes as they are (an expert split's weights and ids).
    shadow_overrides: (Vec<usize>, Shadows),
    /// An expert split's ids for the GPU, alive until its copy is done.
    split_ids: Vec<i32>,
    /// How many slots of an expert chain the GPU takes, and whether this graph had a chain.
    split: split_experts::SplitTuner,
    split_seen: bool,
    n_threads: usize,
    /// Telemetry is on for the graph being computed (copies are then timed).
    telemetry: bool,
    /// Nodes timed alone: GPU launches measure their device time, the CPU its backend's
    /// compute (`device_us`).
    time_device: bool,
    device_us: Option<f64>,
    /// The next GPU segment's weights were queued on the copy stream before the CPU segment
    /// ran (`prefetch`), and whether they fill both halves of the arena.
    prefetched: Option<bool>,
    /// ROCMFORGE_FFI_TIMING=1: host time per phase of `compute`, logged when freed.
    phases: Option<Phases>,
    /// Two plans of the last graph run against each other (`trial`), and the one not in
    /// `last_plan` while it runs.
    trial: PlanTrial,
    trial_other: Option<Vec<BackendSelection>>,
    /// Each graph shape's (`shape_key`) trial winner (its `plan_fingerprint`) and how often it
    /// was taken since: a shape planned again (a token's graph after every prompt) takes the
    /// winner at once where it is one of the candidates, and runs the trial again every
    /// `TRIAL_REUSE` times (a trial on a busy moment does not decide for the whole process).
    trial_won: std::collections::HashMap<u64, (u64, u32)>,
    /// The shape whose trial runs.
    trial_key: Option<u64>,
    /// The last split graph's run, recorded to replay (script.rs), the run being recorded,
    /// the next tag for a recorded launch, and scratch for the map's state words.
    script: Option<script::Script>,
    rec: Option<script::Recording>,
    next_tag: u64,
    state_words: Vec<u64>,
    /// The graph count and sharing width when a recording last found its run not plain
    /// (weights streamed, expert slots shared): the next is tried `RECORD_RETRY` graphs later,
    /// or at once with another plan or width.
    record_failed: Option<(u64, usize)>,
}

/// Host µs spent in each phase of `compute` and how many graphs took each path.
#[derive(Default)]
pub(super) struct Phases {
    plan_us: f64,
    uses_us: f64,
    segments_us: f64,
    /// Inside the segments: GPU launches (shadows, the GPU backend's compute).
    launch_us: f64,
    /// Inside the launches: building the shadows.
    shadow_us: f64,
    /// Inside the segments: CPU segments waiting for the GPU and their copies out, then
    /// computing.
    cpu_wait_us: f64,
    cpu_us: f64,
    /// The segments' whole host time, GPU and CPU (the rest is residency work and copies).
    gpu_seg_us: f64,
    cpu_seg_us: f64,
    /// After the segments: waiting for the GPU before the downloads.
    wait_us: f64,
    finish_us: f64,
    fast_us: f64,
    /// Before a replay: comparing the graph, the placement check, the log.
    pre_fast_us: f64,
    /// Inside the replays: until the copies in were queued, and until the GPU backend's
    /// compute returned.
    fast_upload_us: f64,
    fast_launch_us: f64,
    /// Inside the copies in: finding what changed (the map or the log), and what was copied.
    fast_walk_us: f64,
    fast_copies: u64,
    fast_bytes: u64,
    fast_restored: u64,
    /// The driver's copy calls made for uploads (pieces included), and those it refused.
    copy_calls: u64,
    refused: u64,
    /// The last `repeats_last`'s µs, and per replay: that, then µs from the replay's start to
    /// its copies in queued, to its launch, to its end (medians reported).
    same_us_last: f64,
    replays: Vec<[f32; 4]>,
    planned: u64,
    slow: u64,
    fast: u64,
    /// Split graphs replayed from their scripts (script.rs): host µs inside them, of which
    /// comparing the map's state; scripts recorded; replays not taken (another state).
    script_us: f64,
    script_check_us: f64,
    /// Inside them: the GPU segments' copies in and launches, and how many launches made
    /// their copies in themselves.
    script_gpu_us: f64,
    script_folded: u64,
    scripts: u64,
    recorded: u64,
    script_misses: u64,
}

impl Phases {
    fn report(&self) -> String {
        let med = |i: usize| {
            let mut v: Vec<f32> = self.replays.iter().map(|r| r[i]).collect();
            v.sort_by(f32::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f32::NAN)
        };
        let medians = format!(
            "; per replay, medians: graph compared {:.1} us, then from the replay's start: copies in queued {:.1} us, launched {:.1} us, done {:.1} us",
            med(0),
            med(1),
            med(2),
            med(3)
        );
        format!(
            "RFHYBRID host ms in compute: planning {:.1} ({} plans), uses {:.1}, segments {:.1} (GPU segments {:.1}: launches {:.1}, their shadows {:.1}; CPU segments {:.1}: waiting for the GPU {:.1}, computing {:.1}) and after them {:.1} (waiting {:.1}) ({} graphs), replays {:.1} after {:.1} before them (copies in queued after {:.1}: {:.1} finding them, {} copies of {} bytes, {} graphs walked whole; {} copy calls, {} refused; launched after {:.1}) ({} graphs)",
            self.plan_us * 1e-3,
            self.planned,
            self.uses_us * 1e-3,
            self.segments_us * 1e-3,
            self.gpu_seg_us * 1e-3,
            self.launch_us * 1e-3,
            self.shadow_us * 1e-3,
            self.cpu_seg_us * 1e-3,
            self.cpu_wait_us * 1e-3,
            self.cpu_us * 1e-3,
            self.finish_us * 1e-3,
            self.wait_us * 1e-3,
            self.slow,
            self.fast_us * 1e-3,
            self.pre_fast_us * 1e-3,
            self.fast_upload_us * 1e-3,
            self.fast_walk_us * 1e-3,
            self.fast_copies,
            self.fast_bytes,
            self.fast_restored,
            self.copy_calls,
            self.refused,
            self.fast_launch_us * 1e-3,
            self.fast
        ) + &medians
            + &format!(
                "; split graphs replayed {} ({:.1} ms, comparing the map {:.1}, GPU segments' copies in and launches {:.1}, {} with their copies in the graph), recorded {}, not taken {}",
                self.scripts,
                self.script_us * 1e-3,
                self.script_check_us * 1e-3,
                self.script_gpu_us * 1e-3,
                self.script_folded,
                self.recorded,
                self.script_misses
            )
    }
}

/// A graph's shape for the plan trial's memory: its ops in order and each product's width
/// (activation columns), not its addresses or its cache length (every token's graph of a
/// model has one shape; the prompt's another).
fn shape_key(nodes: &[Tensor]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    nodes.len().hash(&mut h);
    for n in nodes {
        n.op().hash(&mut h);
        if matches!(n.op(), op::MUL_MAT | op::MUL_MAT_ID) {
            n.src(1).map(|b| b.ne()[1]).hash(&mut h);
        }
    }
    h.finish()
}

/// One line about a plan: nodes and predicted time per place, changes of place, the batch.
/// Where a plan puts each node, as one hash (what `learned.rs` keeps of a trial's winner).
fn plan_fingerprint(plan: &[BackendSelection]) -> u64 {
    plan.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, s| {
        (h ^ (s.place as u64 + 1)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn plan_summary(nodes: &[Tensor], plan: &[BackendSelection]) -> String {
    let (mut n, mut us) = ([0usize; 2], [0f64; 2]);
    for s in plan {
        let i = usize::from(s.place == Place::Gpu);
        n[i] += 1;
        us[i] += s.predicted_us;
    }
    let switches = plan.windows(2).filter(|w| w[0].place != w[1].place).count();
    let rows = nodes.iter().map(|t| t.ne()[1]).max().unwrap_or(0);
    format!(
        "plan of {} nodes (widest {rows} rows): CPU {} nodes {:.0} us, GPU {} nodes {:.0} us predicted, {switches} changes of place",
        plan.len(),
        n[0],
        us[0],
        n[1],
        us[1]
    )
}

/// Events ordering the copy stream and the segments' streams around the arena's halves:
/// `copied` after a batch of weight copies, `done[h]` after the last launch reading half h.
struct StreamEvents {
    copied: Box<dyn crate::device::Event>,
    done: [Box<dyn crate::device::Event>; 2],
    /// `done[h]` recorded after a launch that read half h, and not yet waited for by the copy
    /// stream (once it has, the copy stream's later copies are ordered after that launch).
    recorded: [bool; 2],
    /// Weights were placed in the arena since the last launch: the next launch reads it.
    staged: bool,
}

/// A graph to replay: its nodes' shadows (addresses of boxes in `HybridBackend::shadows`),
/// their output ranges, and the ranges the host reads after it.
struct Fast {
    ptrs: Vec<usize>,
    outs: Vec<(usize, usize)>,
    sinks: Vec<(usize, usize)>,
    /// The host log of the last replay, and the parts of the graph's outputs over it (merged,
    /// in order): the same every token, so computed once (the compute buffer's temporaries
    /// reuse the inputs' bytes, hundreds of overlaps for an 8B-class token).
    marks_for: Vec<(usize, usize)>,
    marks: Vec<(usize, usize)>,
}

impl Fast {
    /// The parts of the outputs inside the ranges of `log`, merged.
    fn marks(&mut self, log: &[(usize, usize)]) -> &[(usize, usize)] {
        if self.marks_for != log {
            let mut m: Vec<(usize, usize)> = Vec::new();
            for &(p, len) in log {
                for &(o, ol) in &self.outs {
                    let (x, y) = (o.max(p), (o + ol).min(p + len));
                    if x < y {
                        m.push((x, y));
                    }
                }
            }
            m.sort_unstable();
            let mut merged: Vec<(usize, usize)> = Vec::with_capacity(m.len());
            for (x, y) in m {
                match merged.last_mut() {
                    Some(last) if x <= last.1 => last.1 = last.1.max(y),
                    _ => merged.push((x, y)),
                }
            }
            self.marks = merged;
            self.marks_for = log.to_vec();
        }
        &self.marks
    }
}

/// A graph computed before the last one: what `same_graph` keeps of it for when it comes back.
struct Known {
    words: Vec<u64>,
    plan: Vec<BackendSelection>,
    uses: Uses,
    fast: Option<Fast>,
    shadows: Shadows,
    shadow_of: HashMap<usize, usize>,
}

/// What a graph's nodes need from the residency map, computed once per graph.
struct Uses {
    /// Per node: index of its last consumer in the graph (None: no consumer).
    last_use: Vec<Option<usize>>,
}

impl Uses {
    fn of(nodes: &[Tensor]) -> Uses {
        let index: HashMap<usize, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_ptr() as usize, i))
            .collect();
        let mut last_use = vec![None; nodes.len()];
        for (j, n) in nodes.iter().enumerate() {
            for i in 0..GGML_MAX_SRC {
                let mut t = n.raw().src[i] as *const ggml_tensor;
                // A view's consumer uses the tensor it views.
                while !t.is_null() {
                    if let Some(&k) = index.get(&(t as usize)) {
                        if k < j {
                            last_use[k] = Some(j);
                        }
                    }
                    t = unsafe { (*t).view_src };
                }
            }
        }
        Uses { last_use }
    }
}

/// Whether the node may leave bytes of its output range unwritten (a view, rows of a cache,
/// gaps between strided rows): the writer's copy must be current before it writes.
fn writes_part(n: &Tensor) -> bool {
    !n.raw().view_src.is_null() || n.op() == op::SET_ROWS || !n.is_contiguous()
}

/// What the plan and the shadows depend on, word by word: the configuration, freed buffers,
/// and per node its address, op, flags, parameters, type, shape, strides and data address, and
/// its sources' addresses and data. Equal words: the same graph as before (a token's).
fn graph_words(nodes: &[Tensor], epoch: u64, out: &mut Vec<u64>) {
    out.clear();
    out.push(epoch);
    out.push(crate::tensor::free_epoch());
    let mut w = [0u64; NODE_WORDS];
    for n in nodes {
        // The structs themselves too: the shadows point at them.
        let r = n.raw();
        out.push(n.as_ptr() as u64);
        out.push(r.view_src as u64);
        out.extend(r.src.iter().map(|&s| s as u64));
        let len = node_words(n, &mut w);
        out.extend_from_slice(&w[..len]);
    }
}

/// Whether `graph_words` of `nodes` would equal `last`, compared as they are walked (nothing
/// built: every token's graph is compared, ~45 µs for an 8B-class token when built first).
fn words_match(last: &[u64], nodes: &[Tensor], epoch: u64) -> bool {
    if last.first() != Some(&epoch) || last.get(1) != Some(&crate::tensor::free_epoch()) {
        return false;
    }
    let mut at = 2;
    let mut w = [0u64; NODE_WORDS];
    for n in nodes {
        let r = n.raw();
        let head = [n.as_ptr() as u64, r.view_src as u64];
        let Some(got) = last.get(at..at + 2 + r.src.len()) else {
            return false;
        };
        if got[..2] != head
            || got[2..]
                .iter()
                .zip(r.src.iter())
                .any(|(&a, &s)| a != s as u64)
        {
            return false;
        }
        at += 2 + r.src.len();
        let len = node_words(n, &mut w);
        if last.get(at..at + len) != Some(&w[..len]) {
            return false;
        }
        at += len;
    }
    at == last.len()
}

/// The residency map for the planner, the arena's half size, and the half size prefetches may
/// use (0: none).
struct ResView<'a>(&'a Residency, usize, usize);

impl DataView for ResView<'_> {
    fn missing(&self, p: usize, len: usize, to: Place) -> usize {
        // Streamed weights that would not fit the arena cannot go to the GPU at all.
        if to == Place::Gpu && self.0.region_of(p, len).is_none() && len > self.1 {
            return usize::MAX / 4;
        }
        self.0.bytes_missing(p, len, to)
    }
    fn pinned(&self, p: usize, len: usize) -> bool {
        self.0.buffer_of(p, len).is_some_and(|(_, b)| b.pinned)
    }
    fn streams(&self, p: usize, len: usize) -> bool {
        self.0.region_of(p, len).is_none() && len <= self.1
    }
    fn prefetch_half(&self) -> usize {
        self.2
    }
}

impl HybridBackend {
    pub fn new(shared: Arc<Shared>) -> Result<HybridBackend> {
        let cpu = shared.cpu.new_backend()?;
        let cfg = shared.config();
        let sched = HybridScheduler::new(cfg.strategy, shared.cost_model());
        let log = shared.residency().open_log();
        Ok(HybridBackend {
            shared,
            cpu,
            gpus: Vec::new(),
            pending: Vec::new(),
            sched,
            graphs: 0,
            last_words: Vec::new(),
            words: Vec::new(),
            last_plan: Vec::new(),
            last_uses: None,
            known_same: None,
            known: Vec::new(),
            restored: false,
            fast: None,
            streamed: false,
            launches: 0,
            events: None,
            log,
            time_copies: false,
            in_graph_copies: crate::tuning::get().hybrid_graph_copies,
            last_gpu_stream: 0,
            templates: HashMap::new(),
            copy_us: 0.0,
            shadows: Shadows(Vec::new()),
            shadow_of: HashMap::new(),
            n_threads: 0,
            telemetry: false,
            prefetched: None,
            time_device: false,
            shadow_overrides: (Vec::new(), Shadows(Vec::new())),
            split_ids: Vec::new(),
            split: Default::default(),
            split_seen: false,
            device_us: None,
            phases: crate::tuning::get().ffi_timing.then(Phases::default),
            trial: PlanTrial::default(),
            trial_other: None,
            trial_won: Default::default(),
            trial_key: None,
            script: None,
            rec: None,
            next_tag: 0,
            state_words: Vec::new(),
            record_failed: None,
        })
    }

    /// GPU stream `k` (`PROBE`: the one for timing single nodes, `COPIER`: the one weights
    /// stream on), created at first use.
    fn gpu_backend(&mut self, k: usize) -> Result<usize> {
        let k = k.min(COPIER);
        while self.gpus.len() <= k {
            let g = self
                .shared
                .gpu
                .ok_or_else(|| Error::Unsupported("RFHYBRID has no GPU".into()))?;
            let mut b = g.new_backend()?;
            if self.n_threads > 0 {
                b.set_n_threads(self.n_threads);
            }
            self.gpus.push(b);
            self.pending.push(false);
        }
        Ok(k)
    }

    /// Waits for every GPU stream with queued work.
    fn sync_gpus(&mut self) -> Result<()> {
        for (b, p) in self.gpus.iter_mut().zip(self.pending.iter_mut()) {
            if *p {
                b.synchronize()?;
                *p = false;
            }
        }
        Ok(())
    }

    /// Host-to-device copies, queued on GPU stream `k` (in order with its compute).
    fn upload(&mut self, res: &mut Residency, k: usize, copies: &[Copy]) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        if let Some(r) = self.rec.as_mut() {
            r.uploaded(k, copies);
        }
        // Timed for a node timed alone: every stream drained first. For telemetry only the
        // copies' own stream: waiting for the copy stream too held every GPU segment's launch
        // behind the weights prefetched for it (2048 MiB: 6-7% of a token).
        let all = self.time_copies;
        let t0 = (self.telemetry || all).then(|| {
            let _ = if all {
                self.sync_gpus()
            } else {
                self.gpus[k].synchronize()
            };
            Instant::now()
        });
        self.queue_uploads(res, k, copies)?;
        if let Some(t0) = t0 {
            if all {
                self.sync_gpus()?;
            } else {
                self.gpus[k].synchronize()?;
            }
            let us = t0.elapsed().as_secs_f64() * 1e6;
            self.copy_us += us;
            if self.telemetry {
                self.record_copies(copies, us);
            }
        }
        Ok(())
    }

    /// Queues host-to-device copies on GPU stream `k` (made at once where it has no
    /// asynchronous copy).
    fn queue_uploads(&mut self, res: &mut Residency, k: usize, copies: &[Copy]) -> Result<()> {
        for c in copies {
            let g = &mut self.gpus[k];
            let mut calls = 0;
            let refused0 = crate::gpu::REFUSED_COPIES.load(std::sync::atomic::Ordering::Relaxed);
            let queued = copy_in_pieces(c, &mut |c: &Copy| {
                calls += 1;
                g.set_async(c.dev as *mut u8, c.host as *const u8, c.len)
            })?;
            if let Some(p) = self.phases.as_mut() {
                p.copy_calls += calls;
                let refused = crate::gpu::REFUSED_COPIES.load(std::sync::atomic::Ordering::Relaxed)
                    - refused0;
                p.refused += refused;
            }
            if queued {
                self.pending[k] = true;
            } else {
                // No asynchronous copy: the stream must not be reading the bytes now.
                self.sync_gpus()?;
                Shared::copy_sync(res, std::slice::from_ref(c))?;
            }
        }
        Ok(())
    }

    /// One transfer event for a batch of copies in one direction.
    fn record_copies(&self, copies: &[Copy], us: f64) {
        self.record_transfer(copies, us, "to-GPU");
    }

    /// One transfer event; `to_gpu`: what copies to the GPU are ("to-GPU"; "to-GPU-prefetch":
    /// weights copied while a CPU segment ran, `us` until they were done, at most the
    /// segment's time when the copy was hidden; "to-GPU-in-graph": a replayed graph's inputs
    /// copied by the graph itself, their time inside the graph's, `us` 0).
    fn record_transfer(&self, copies: &[Copy], us: f64, to_gpu: &'static str) {
        let Some(first) = copies.first() else { return };
        let bytes: usize = copies.iter().map(|c| c.len).sum();
        let predicted: f64 = copies
            .iter()
            .map(|c| self.sched.cost.transfer_us(c.len, c.to, c.pinned))
            .sum();
        let mut t = self.shared.telemetry();
        let start_us = t.now_us() - us;
        t.record(ExecutionEvent {
            graph: self.graphs,
            node: format!("{} copies", copies.len()),
            op: match first.to {
                Place::Gpu => to_gpu,
                Place::Cpu => "to-CPU",
            },
            kind: EventKind::Transfer { to: first.to },
            place: first.to,
            reason: String::new(),
            predicted_us: predicted,
            measured_us: us,
            bytes_moved: bytes as u64,
            start_us,
            timed: true,
        });
    }

    /// Device-to-host copies; done when this returns.
    fn download(&mut self, res: &mut Residency, copies: &[Copy]) -> Result<()> {
        self.download_on(res, copies, 0)
    }

    /// `download` with the copies queued on GPU stream `on`, behind its work (the stream that
    /// computed them: one wait for its kernels and the copies instead of one each).
    fn download_on(&mut self, res: &mut Residency, copies: &[Copy], on: usize) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let on = if on < self.gpus.len() { on } else { 0 };
        if self.telemetry || self.time_copies {
            // The copies' own time is measured.
            self.sync_gpus()?;
        } else {
            // The copies queue on stream `on` behind its work; the other streams' is waited for.
            for (j, (b, p)) in self
                .gpus
                .iter_mut()
                .zip(self.pending.iter_mut())
                .enumerate()
            {
                if *p && j != on {
                    b.synchronize()?;
                    *p = false;
                }
            }
        }
        let t0 = Instant::now();
        let mut queued = false;
        if !self.gpus.is_empty() {
            for c in copies {
                let g = &mut self.gpus[on];
                if copy_in_pieces(c, &mut |c: &Copy| {
                    g.get_async(c.host as *mut u8, c.dev as *const u8, c.len)
                })? {
                    queued = true;
                } else {
                    self.sync_gpus()?;
                    Shared::copy_sync(res, std::slice::from_ref(c))?;
                }
            }
            if queued || self.pending[on] {
                self.gpus[on].synchronize()?;
                self.pending[on] = false;
            }
        } else {
            Shared::copy_sync(res, copies)?;
        }
        let us = t0.elapsed().as_secs_f64() * 1e6;
        self.copy_us += us;
        if self.telemetry {
            self.record_copies(copies, us);
        }
        Ok(())
    }

    /// Keeps the weights the graph reads in VRAM as far as the budget allows, in graph order
    /// (a split model's first layers, contiguous), after mirrors of its compute and KV
    /// buffers and the staging arena. Runs when the configuration changes.
    fn place(&mut self, nodes: &[Tensor], res: &mut Residency) -> Result<()> {
        let Some(gpu) = self.shared.gpu else {
            return Ok(());
        };
        let cfg = self.shared.config();
        // Bring back what only the GPU holds, then start over.
        let all: Vec<(usize, usize)> = res.regions.values().map(|r| (r.host, r.len)).collect();
        for (h, l) in all {
            let c = res.make_current(h, l, Place::Cpu);
            self.download(res, &c)?;
        }
        res.reset_arena();
        res.drop_kind(RegionKind::Resident);
        res.drop_kind(RegionKind::Mirror);
        let _ = res.set_arena(gpu.buffer_type(), 0);
        res.budget = cfg.budget;
        res.placed_epoch = Some(cfg.epoch);
        if matches!(
            cfg.strategy,
            ExecutionStrategy::CpuPreferred | ExecutionStrategy::BackendOnly(Place::Cpu)
        ) {
            return Ok(());
        }
        let bt = gpu.buffer_type();
        // Sizes of the weights the GPU could take, by how often each size occurs.
        let mut sizes: HashMap<usize, usize> = HashMap::new();
        for n in nodes {
            if gpu.supports_op(n) {
                self.mirror_for(n, res)?;
                for s in (0..GGML_MAX_SRC).filter_map(|i| n.src(i)) {
                    if usage(&s) == Some(USAGE_WEIGHTS) {
                        *sizes.entry(s.nbytes()).or_default() += 1;
                    }
                }
            }
        }
        // The arena is sized for the layers' weights (sizes that repeat), not for a one-off
        // giant such as the output head (a token's or a prompt's last row: the CPU's).
        let largest = sizes
            .iter()
            .filter(|&(_, &count)| count >= 2)
            .map(|(&size, _)| size)
            .max()
            .or_else(|| sizes.keys().copied().max())
            .unwrap_or(0);
        let free = res.budget.saturating_sub(res.used);
        // Two halves, each holding at least two of the largest layer weights.
        let arena = (4 * largest).max(ARENA_MIN).min(free / 2);
        if arena / 2 >= largest && largest > 0 {
            res.set_arena(bt, arena)?;
        }
        let mut candidates = Vec::new();
        for n in nodes {
            if !gpu.supports_op(n) {
                continue;
            }
            for (i, s) in (0..GGML_MAX_SRC).filter_map(|i| n.src(i).map(|s| (i, s))) {
                let Some((p, len)) = range(&s) else { continue };
                if usage(&s) != Some(USAGE_WEIGHTS) || res.region_of(p, len).is_some() {
                    continue;
                }
                candidates.push(Candidate {
                    host: p,
                    len,
                    value: weight_value(n, i),
                });
            }
        }
        let mut copies = Vec::new();
        let mut room = res.budget.saturating_sub(res.used);
        for c in choose_resident(&candidates, &mut room) {
            if !res.add_region(bt, c.host, c.len, RegionKind::Resident)? {
                break;
            }
            copies.extend(res.make_current(c.host, c.len, Place::Gpu));
        }
        let k = self.gpu_backend(0)?;
        self.upload(res, k, &copies)?;
        self.sync_gpus()?;
        crate::log_info!(
            "RFHYBRID: {} MiB of {} MiB GPU budget in use ({} resident weights, arena {} MiB)",
            res.used >> 20,
            res.budget >> 20,
            res.regions
                .values()
                .filter(|r| r.kind == RegionKind::Resident)
                .count(),
            res.arena_size() >> 20
        );
        Ok(())
    }

    /// Mirrors the compute or KV buffer holding the node's output or a non-weight input on
    /// the GPU, if the budget allows.
    fn mirror_for(&self, n: &Tensor, res: &mut Residency) -> Result<()> {
        let Some(gpu) = self.shared.gpu else {
            return Ok(());
        };
        let srcs = (0..GGML_MAX_SRC).filter_map(|i| n.src(i));
        for t in std::iter::once(*n).chain(srcs) {
            let Some((p, len)) = range(&t) else { continue };
            if usage(&t) == Some(USAGE_WEIGHTS) || res.region_of(p, len).is_some() {
                continue;
            }
            if let Some((base, b)) = res.buffer_of(p, len) {
                if res.region_of(base, b.len).is_none() {
                    res.add_region(gpu.buffer_type(), base, b.len, RegionKind::Mirror)?;
                }
            }
        }
        Ok(())
    }

    fn facts(&self, n: &Tensor, res: &mut Residency) -> Result<NodeFacts> {
        let cpu_ok = self.shared.cpu.supports_op(n);
        let Some(gpu) = self.shared.gpu else {
            return Ok(NodeFacts {
                cpu_ok,
                gpu_ok: false,
                gpu_mem_ok: false,
            });
        };
        let gpu_ok = gpu.supports_op(n);
        if !gpu_ok {
            return Ok(NodeFacts {
                cpu_ok,
                gpu_ok,
                gpu_mem_ok: false,
            });
        }
        self.mirror_for(n, res)?;
        let arena = res.arena_half_size();
        let out_ok = range(n).is_none_or(|(p, len)| res.region_of(p, len).is_some());
        let in_ok = (0..GGML_MAX_SRC)
            .filter_map(|i| n.src(i))
            .filter_map(|s| range(&s))
            .all(|(p, len)| res.region_of(p, len).is_some() || len <= arena);
        Ok(NodeFacts {
            cpu_ok,
            gpu_ok,
            gpu_mem_ok: out_ok && in_ok,
        })
    }

    /// The shadow of `t` for GPU segment work: its struct with GPU addresses. `node`: a
    /// segment node (its sources are shadowed too); else a source, whose own sources are
    /// cleared. `need`: its data must have a GPU copy (views' bases need not).
    fn shadow(
        &mut self,
        t: *mut ggml_tensor,
        res: &Residency,
        node: bool,
        need: bool,
    ) -> Result<*mut ggml_tensor> {
        if t.is_null() {
            return Ok(t);
        }
        if let Some(&i) = self.shadow_of.get(&(t as usize)) {
            return Ok(&mut *self.shadows.0[i] as *mut ggml_tensor);
        }
        // SAFETY: `t` is a node or source of the host's graph, alive for this compute.
        let host = unsafe { Tensor::from_ptr(t) }.unwrap();
        let mut s: Box<ggml_tensor> = Box::new(unsafe { std::ptr::read(t) });
        if let Some((p, len)) = range(&host) {
            s.data = match res.dev_addr(p, len) {
                Some(d) => d as *mut std::ffi::c_void,
                None if need => {
                    return Err(Error::Device(format!(
                        "RFHYBRID: '{}' has no GPU copy",
                        host.name()
                    )))
                }
                None => std::ptr::null_mut(),
            };
        }
        s.extra = std::ptr::null_mut();
        let idx = self.shadows.0.len();
        self.shadows.0.push(s);
        self.shadow_of.insert(t as usize, idx);
        let view = unsafe { (*t).view_src };
        let view_shadow = self.shadow(view, res, false, false)?;
        let mut srcs = [std::ptr::null_mut(); GGML_MAX_SRC];
        if node {
            for (i, slot) in srcs.iter_mut().enumerate() {
                *slot = self.shadow(unsafe { (*t).src[i] }, res, false, true)?;
            }
        }
        let s = &mut self.shadows.0[idx];
        s.view_src = view_shadow;
        s.src = srcs;
        Ok(&mut **s as *mut ggml_tensor)
    }

    /// Runs `nodes` (already made current on the GPU) on GPU stream `k`.
    fn launch(
        &mut self,
        nodes: &[Tensor],
        res: &Residency,
        k: usize,
        outputs: &dyn Fn(&Tensor) -> bool,
    ) -> Result<()> {
        if nodes.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let r = self.launch_shadows(nodes, res, k, outputs);
        if let Some(p) = self.phases.as_mut() {
            p.launch_us += t.elapsed().as_secs_f64() * 1e6;
        }
        r
    }

    fn launch_shadows(
        &mut self,
        nodes: &[Tensor],
        res: &Residency,
        k: usize,
        outputs: &dyn Fn(&Tensor) -> bool,
    ) -> Result<()> {
        let t = Instant::now();
        self.shadows.0.clear();
        self.shadow_of.clear();
        let (keys, boxes) = &mut self.shadow_overrides;
        for (t, s) in keys.drain(..).zip(boxes.0.drain(..)) {
            self.shadow_of.insert(t, self.shadows.0.len());
            self.shadows.0.push(s);
        }
        let mut ptrs = Vec::with_capacity(nodes.len());
        for n in nodes {
            let s = self.shadow(n.as_ptr(), res, true, true)?;
            if outputs(n) {
                unsafe { (*s).flags |= FLAG_OUTPUT };
            }
            ptrs.push(s);
        }
        if let Some(p) = self.phases.as_mut() {
            p.shadow_us += t.elapsed().as_secs_f64() * 1e6;
        }
        let shadows: Vec<Tensor> = ptrs
            .iter()
            .map(|&p| unsafe { Tensor::from_ptr(p) }.unwrap())
            .collect();
        self.pending[k] = true;
        self.launches += 1;
        if self.time_device {
            self.device_us = self.gpus[k].compute_timed(&shadows)?;
            return Ok(());
        }
        let Some(rec) = self.rec.as_mut() else {
            return self.gpus[k].compute(&shadows);
        };
        // Recorded: tagged, and the shadows kept with the script.
        self.next_tag += 1;
        let tag = self.next_tag;
        rec.ok &= self.shadow_overrides.0.is_empty();
        self.gpus[k].tag_next(tag);
        let r = self.gpus[k].compute(&shadows);
        drop(shadows);
        let ptrs = ptrs.iter().map(|&p| p as usize).collect();
        rec.launched(k, ptrs, tag, &mut self.shadows);
        self.shadow_of.clear();
        r
    }

    /// A GPU segment: copies in what the GPU lacks and runs. Weights not resident stream
    /// through the arena's two halves: on the copy stream when the GPU has events (the next
    /// half fills while the GPU computes on the last), else in order on the segment's stream;
    /// whenever a half is full, what is queued runs.
    fn run_gpu(
        &mut self,
        nodes: &[Tensor],
        res: &mut Residency,
        k: usize,
        outputs: &dyn Fn(&Tensor) -> bool,
    ) -> Result<()> {
        let overlap = self.overlap_ready()?;
        if overlap {
            // The halves may still be read by an earlier segment's launches.
            self.copier_waits_for_halves()?;
        }
        let (mut start, mut i) = (0, 0);
        // Weights queued before the CPU segment: the first launch waits for them too.
        let mut weights_queued = self.prefetched.is_some();
        while i < nodes.len() {
            let n = &nodes[i];
            // A batch's streamed experts: only those its ids name are copied, the ids read
            // back once the nodes before it have run.
            let mut experts = None;
            if let Some((w, ids)) = super::experts::batch_experts(n)
                .filter(|(w, _)| range(w).is_some_and(|(p, l)| res.region_of(p, l).is_none()))
            {
                if start < i {
                    self.flush(
                        &nodes[start..i],
                        res,
                        k,
                        outputs,
                        &mut weights_queued,
                        overlap,
                    )?;
                    start = i;
                }
                self.sync_gpus()?;
                if let Some((p, len)) = range(&ids) {
                    let copies = res.make_current(p, len, Place::Cpu);
                    self.download(res, &copies)?;
                }
                // SAFETY: RFHYBRID's buffers are host memory, and the ids are current there now.
                let used = unsafe { super::experts::read_ids(&ids) };
                experts = super::experts::used_expert_ranges(&used, w.ne()[2], w.nb()[2])
                    .and_then(|r| Some((range(&w)?, r)));
                if let Some((_, r)) = &experts {
                    let bytes: usize = r.iter().map(|&(_, l)| l).sum();
                    crate::log_debug!(
                        "RFHYBRID: '{}' streams {} of {} experts",
                        n.name(),
                        bytes / w.nb()[2].max(1),
                        w.ne()[2]
                    );
                }
            }
            let srcs: Vec<(usize, usize)> = (0..GGML_MAX_SRC)
                .filter_map(|j| n.src(j))
                .filter_map(|s| range(&s))
                .collect();
            let need: usize = srcs
                .iter()
                .filter(|&&(p, len)| res.region_of(p, len).is_none())
                .map(|&(_, len)| len.next_multiple_of(256))
                .sum();
            if need > res.arena_room() {
                if need > res.arena_half_size() {
                    return Err(Error::Alloc(format!(
                        "RFHYBRID: node '{}' streams {need} bytes, more than half the arena ({})",
                        n.name(),
                        res.arena_half_size()
                    )));
                }
                // This half is full: run what is queued, then fill the other half.
                if start < i {
                    self.flush(
                        &nodes[start..i],
                        res,
                        k,
                        outputs,
                        &mut weights_queued,
                        overlap,
                    )?;
                }
                res.flip_arena();
                if overlap {
                    self.copier_waits_for_halves()?;
                }
                start = i;
                continue;
            }
            for &(p, len) in &srcs {
                if res.region_of(p, len).is_none() {
                    self.streamed = true;
                    let added = res.add_stream_region(p, len);
                    debug_assert!(added, "room was checked");
                    if let Some(ev) = self.events.as_mut() {
                        ev.staged = true;
                    }
                }
            }
            let mut copies = Vec::new();
            for &(p, len) in &srcs {
                match &experts {
                    Some((w, used)) if *w == (p, len) => {
                        for &(o, l) in used {
                            copies.extend(res.make_current(p + o, l, Place::Gpu));
                        }
                    }
                    _ => copies.extend(res.make_current(p, len, Place::Gpu)),
                }
            }
            if let Some((p, len)) = range(n) {
                if writes_part(n) {
                    copies.extend(res.make_current(p, len, Place::Gpu));
                }
                res.written(p, len, Place::Gpu);
            }
            if overlap {
                let (weights, rest): (Vec<Copy>, Vec<Copy>) =
                    copies.into_iter().partition(|c| res.in_arena(c.dev));
                if !weights.is_empty() {
                    let c = self.gpu_backend(COPIER)?;
                    self.upload(res, c, &weights)?;
                    weights_queued = true;
                }
                self.upload(res, k, &rest)?;
            } else {
                self.upload(res, k, &copies)?;
            }
            i += 1;
        }
        self.flush(
            &nodes[start..],
            res,
            k,
            outputs,
            &mut weights_queued,
            overlap,
        )
    }

    /// Launches `nodes` on stream `k` after the weights queued for them on the copy stream,
    /// and marks the arena's current half as read by that launch.
    fn flush(
        &mut self,
        nodes: &[Tensor],
        res: &Residency,
        k: usize,
        outputs: &dyn Fn(&Tensor) -> bool,
        weights_queued: &mut bool,
        overlap: bool,
    ) -> Result<()> {
        if overlap && *weights_queued {
            let ev = self.events.as_ref().unwrap();
            let c = COPIER.min(self.gpus.len() - 1);
            if !self.gpus[c].record_event(ev.copied.as_ref())?
                || !self.gpus[k].wait_event(ev.copied.as_ref())?
            {
                self.sync_gpus()?;
            }
            *weights_queued = false;
        }
        self.launch(nodes, res, k, outputs)?;
        // A launch that reads no streamed weight needs no event: nothing the copy stream
        // writes next can be read by it (a token's plan streams nothing: 2 event calls and a
        // wait a GPU segment saved).
        let staged = self
            .events
            .as_mut()
            .is_some_and(|ev| std::mem::take(&mut ev.staged));
        if overlap && staged {
            // The first launch after a prefetch reads what it copied (into both halves, maybe).
            let both = self.prefetched.take() == Some(true);
            let ev = self.events.as_mut().unwrap();
            for h in 0..2 {
                if h != res.arena_half && !both {
                    continue;
                }
                if self.gpus[k].record_event(ev.done[h].as_ref())? {
                    ev.recorded[h] = true;
                } else {
                    self.sync_gpus()?;
                    break;
                }
            }
        }
        Ok(())
    }

    /// The launches queued on stream `k` read the arena's first half: the copy stream waits
    /// for them before it writes there (where the GPU has no events, they are waited for now).
    fn arena_read_by(&mut self, k: usize) -> Result<()> {
        if self.overlap_ready()? {
            let ev = self.events.as_mut().unwrap();
            if self.gpus[k].record_event(ev.done[0].as_ref())? {
                ev.recorded[0] = true;
                return Ok(());
            }
        }
        self.sync_gpus()
    }

    /// Whether weights stream on their own copy stream (the GPU has events); creates the
    /// copy stream and the events at first use.
    fn overlap_ready(&mut self) -> Result<bool> {
        if self.events.is_none() {
            let Some(gpu) = self.shared.gpu else {
                return Ok(false);
            };
            let mk = || gpu.new_event().and_then(|e| e.ok());
            match (mk(), mk(), mk()) {
                (Some(copied), Some(d0), Some(d1)) => {
                    self.gpu_backend(COPIER)?;
                    self.events = Some(StreamEvents {
                        copied,
                        done: [d0, d1],
                        recorded: [false, false],
                        staged: false,
                    });
                }
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The copy stream waits for the last launches that read each half of the arena.
    fn copier_waits_for_halves(&mut self) -> Result<()> {
        let mut waited = true;
        if let Some(ev) = self.events.as_ref() {
            for h in 0..2 {
                if ev.recorded[h] {
                    waited &= self.gpus[COPIER].wait_event(ev.done[h].as_ref())?;
                }
            }
            if waited {
                if let Some(ev) = self.events.as_mut() {
                    ev.recorded = [false, false];
                }
            }
        }
        if !waited {
            self.sync_gpus()?;
        }
        Ok(())
    }

    /// A CPU segment: waits for the GPU, copies back what only the GPU holds, starts copying
    /// the weights of the GPU segment `next` (if any), runs.
    fn run_cpu(
        &mut self,
        nodes: &[Tensor],
        res: &mut Residency,
        next: Option<&[Tensor]>,
    ) -> Result<()> {
        self.run_cpu_also(nodes, &[], res, next)
    }

    /// `run_cpu`, with tensors `also` made current on the host in the same wait.
    fn run_cpu_also(
        &mut self,
        nodes: &[Tensor],
        also: &[Tensor],
        res: &mut Residency,
        next: Option<&[Tensor]>,
    ) -> Result<()> {
        let mut copies = Vec::new();
        for t in also {
            if let Some((p, len)) = range(t) {
                copies.extend(res.make_current(p, len, Place::Cpu));
            }
        }
        for n in nodes {
            for s in (0..GGML_MAX_SRC).filter_map(|j| n.src(j)) {
                if let Some((p, len)) = range(&s) {
                    copies.extend(res.make_current(p, len, Place::Cpu));
                }
            }
            if let Some((p, len)) = range(n) {
                if writes_part(n) {
                    copies.extend(res.make_current(p, len, Place::Cpu));
                }
                res.written(p, len, Place::Cpu);
            }
        }
        // The copies queue behind the last GPU segment's kernels; then every stream is done.
        let tw = Instant::now();
        self.download_on(res, &copies, self.last_gpu_stream)?;
        self.sync_gpus()?;
        let t0 = Instant::now();
        if let Some(p) = self.phases.as_mut() {
            p.cpu_wait_us += (t0 - tw).as_secs_f64() * 1e6;
        }
        if let Some(r) = self.rec.as_mut() {
            r.ok &= also.is_empty();
            r.cpu(nodes, &copies, self.last_gpu_stream);
        }
        let prefetched = match next {
            Some(next) => self.prefetch(next, res)?,
            None => Vec::new(),
        };
        if let Some(r) = self.rec.as_mut() {
            r.ok &= prefetched.is_empty();
        }
        let t = Instant::now();
        let r = self.cpu.compute(nodes);
        if self.time_device {
            self.device_us = Some(t.elapsed().as_secs_f64() * 1e6);
        }
        if let Some(p) = self.phases.as_mut() {
            p.cpu_us += t.elapsed().as_secs_f64() * 1e6;
        }
        if self.telemetry && !prefetched.is_empty() {
            // Until the copies are done: at most the CPU segment's time when they were hidden.
            self.gpus[COPIER].synchronize()?;
            self.record_transfer(
                &prefetched,
                t0.elapsed().as_secs_f64() * 1e6,
                "to-GPU-prefetch",
            );
        }
        r
    }

    /// Queues on the copy stream the weights GPU segment `next` streams, in its order, into
    /// the arena's halves while they have room (the GPU is idle: both are free). The segment's
    /// first launch waits for them (`prefetched`). Returns the copies.
    fn prefetch(&mut self, next: &[Tensor], res: &mut Residency) -> Result<Vec<Copy>> {
        if !crate::tuning::get().hybrid_prefetch
            || !self.overlap_ready()?
            || res.arena_half_size() == 0
        {
            return Ok(Vec::new());
        }
        res.reset_arena();
        let mut copies = Vec::new();
        'nodes: for n in next {
            // A batch's experts wait for its ids (run_gpu streams only the used ones).
            let experts = super::experts::batch_experts(n).and_then(|(w, _)| range(&w));
            for s in (0..GGML_MAX_SRC).filter_map(|j| n.src(j)) {
                let Some((p, len)) = range(&s) else { continue };
                if usage(&s) != Some(USAGE_WEIGHTS)
                    || res.region_of(p, len).is_some()
                    || experts == Some((p, len))
                {
                    continue;
                }
                if !res.add_stream_region(p, len) {
                    if res.arena_half == 1 {
                        break 'nodes;
                    }
                    res.flip_arena();
                    if !res.add_stream_region(p, len) {
                        break 'nodes;
                    }
                }
                copies.extend(res.make_current(p, len, Place::Gpu));
            }
        }
        if copies.is_empty() {
            res.reset_arena();
            return Ok(copies);
        }
        let c = self.gpu_backend(COPIER)?;
        self.queue_uploads(res, c, &copies)?;
        self.streamed = true;
        self.prefetched = Some(res.arena_half == 1);
        if let Some(ev) = self.events.as_mut() {
            ev.staged = true;
        }
        Ok(copies)
    }

    /// The graph's plan and, where `with_raw`, the plan of the calibrated curves alone (no
    /// online corrections) when it differs (the second candidate of a `trial`).
    #[allow(clippy::type_complexity)]
    fn plan(
        &mut self,
        nodes: &[Tensor],
        res: &mut Residency,
        with_raw: bool,
    ) -> Result<(Vec<BackendSelection>, Option<Vec<BackendSelection>>)> {
        self.sched.strategy = self.shared.config().strategy;
        let mut facts = Vec::with_capacity(nodes.len());
        for n in nodes {
            facts.push(self.facts(n, res)?);
        }
        let prefetch = if crate::tuning::get().hybrid_prefetch && self.overlap_ready()? {
            res.arena_half_size()
        } else {
            0
        };
        let view = ResView(res, res.arena_half_size(), prefetch);
        let plan = self.sched.plan(nodes, &facts, &view);
        let mode = crate::tuning::get().hybrid_trial.as_deref();
        if !with_raw || self.sched.strategy != ExecutionStrategy::Automatic || mode == Some("0") {
            return Ok((plan, None));
        }
        let differs = |p: &[BackendSelection]| p.iter().zip(&plan).any(|(a, b)| a.place != b.place);
        if mode == Some("force") {
            // Tests: a second candidate that differs, CPU first or else GPU first.
            let mut p = Vec::new();
            for s in [
                ExecutionStrategy::CpuPreferred,
                ExecutionStrategy::GpuPreferred,
            ] {
                self.sched.strategy = s;
                p = self.sched.plan(nodes, &facts, &view);
                if differs(&p) {
                    break;
                }
            }
            self.sched.strategy = ExecutionStrategy::Automatic;
            let p = differs(&p).then_some(p);
            return Ok((plan, p));
        }
        // A token (one to a few activation columns): the other candidate is the plan that
        // streams no weight. Its slow plans stream the CPU-resident weights every token (on
        // fresh H100 hosts, 18-21 t/s at 2048 MiB against 36-42 with the CPU reading them);
        // the plan of the calibrated curves alone was as slow there, so a trial between the two
        // did not help.
        let columns = nodes
            .iter()
            .filter(|n| matches!(n.op(), op::MUL_MAT | op::MUL_MAT_ID))
            .filter_map(|n| n.src(1).map(|b| b.ne()[1]))
            .max()
            .unwrap_or(0);
        if (1..=TOKEN_COLUMNS).contains(&columns) {
            let stays = self.sched.plan(nodes, &facts, &ResView(res, 0, 0));
            if differs(&stays) {
                return Ok((plan, Some(stays)));
            }
        }
        // Otherwise the plan of the calibrated curves alone, without the online corrections.
        let raw = CostModel::new(self.sched.cost.profile.clone());
        let corrected = std::mem::replace(&mut self.sched.cost, raw);
        let other = self.sched.plan(nodes, &facts, &view);
        self.sched.cost = corrected;
        let other = differs(&other).then_some(other);
        Ok((plan, other))
    }

    /// Whether `nodes` are the graph computed last (compared word by word; kept for `compute`).
    fn same_graph(&mut self, nodes: &[Tensor]) -> bool {
        if let Some(same) = self.known_same.take() {
            return same;
        }
        let epoch = self.shared.config().epoch;
        if self.last_plan.len() == nodes.len() && words_match(&self.last_words, nodes, epoch) {
            return true;
        }
        graph_words(nodes, epoch, &mut self.words);
        let same = self.words == self.last_words && self.last_plan.len() == nodes.len();
        if same {
            return true;
        }
        std::mem::swap(&mut self.words, &mut self.last_words);
        // Another graph ends a trial with the plan the last one has.
        self.trial.stop();
        self.trial_other = None;
        // The graph before is kept for when it comes back (a prompt after tokens).
        if let Some(uses) = self.last_uses.take().filter(|_| !self.last_plan.is_empty()) {
            self.known.insert(
                0,
                Known {
                    words: std::mem::take(&mut self.words),
                    plan: std::mem::take(&mut self.last_plan),
                    uses,
                    fast: self.fast.take(),
                    shadows: std::mem::replace(&mut self.shadows, Shadows(Vec::new())),
                    shadow_of: std::mem::take(&mut self.shadow_of),
                },
            );
            self.known.truncate(KNOWN_GRAPHS);
        }
        self.last_plan.clear();
        self.fast = None;
        self.script = None;
        self.record_failed = None;
        let back = self
            .known
            .iter()
            .position(|k| k.words == self.last_words && k.plan.len() == nodes.len());
        let Some(i) = back else { return false };
        let k = self.known.remove(i);
        self.last_plan = k.plan;
        self.last_uses = Some(k.uses);
        self.fast = k.fast;
        self.shadows = k.shadows;
        self.shadow_of = k.shadow_of;
        self.restored = true;
        true
    }

    fn compute_hybrid(&mut self, nodes: &[Tensor]) -> Result<()> {
        let t_run = Instant::now();
        let same = self.same_graph(nodes);
        let shared = self.shared.clone();
        let mut res = shared.residency();
        let cfg = shared.config();
        if res.placed_epoch != Some(cfg.epoch) {
            self.place(nodes, &mut res)?;
        }
        let (log, overflow) = res.take_log(self.log);
        // Another backend's graph since ours may have changed any state: walk the nodes.
        let foreign = res.last_computer.replace(self.log) != Some(self.log);
        let telemetry = shared.telemetry().enabled();
        self.telemetry = telemetry;
        // With telemetry, the first graphs (a warm-up, the prompt, a token) are timed node by
        // node too: the prediction table covers the graphs a run is made of.
        let sample = if telemetry {
            self.graphs <= 3 || self.graphs % SAMPLE_EVERY == 1
        } else {
            self.graphs % REFINE_EVERY == 1
        };
        if same && !overflow && !foreign && !sample && self.fast.is_some() {
            let t = Instant::now();
            let r = self.compute_fast(nodes, &mut res, &log);
            if let Some(p) = self.phases.as_mut() {
                p.pre_fast_us += (t - t_run).as_secs_f64() * 1e6;
                p.fast_us += t.elapsed().as_secs_f64() * 1e6;
                p.fast += 1;
            }
            if r.is_ok() {
                self.trial_step(nodes, t_run);
            }
            return r;
        }
        // A split graph again, from its last run's script where the map is as it was then (a
        // plan trial's turns too: each plan is measured as it runs afterwards).
        let replay = same
            && !sample
            && !telemetry
            && self.script.as_ref().is_some_and(|s| {
                s.of_plan(&self.last_plan) && (!s.chains || self.split.width() == 0)
            });
        if replay {
            let mut words = std::mem::take(&mut self.state_words);
            let r = self.compute_script(nodes, &mut res, &mut words);
            self.state_words = words;
            match r {
                Ok(true) => {
                    if self.script.as_ref().is_some_and(|s| s.chains) {
                        self.split_seen = true;
                    }
                    self.after_graph(nodes, t_run);
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => {
                    self.script = None;
                    return Err(e);
                }
            }
        }
        self.fast = None;
        self.restored = false;
        let t = Instant::now();
        if !same || self.last_plan.len() != nodes.len() {
            let (mut plan, mut other) = self.plan(nodes, &mut res, true)?;
            let key = shape_key(nodes);
            let forced = crate::tuning::get().hybrid_trial.as_deref() == Some("force");
            // What an earlier process measured for this shape: its trial's winner (tried
            // again every TRIAL_REUSE plans, as this process's own), the sharing width.
            if !self.trial_won.contains_key(&key) || !self.split.settled() {
                let learned = self.shared.learned();
                if let Some(fp) = learned.trial(key).filter(|_| !forced) {
                    self.trial_won.entry(key).or_insert((fp, 0));
                }
                if let Some(w) = learned.width(key, self.n_threads) {
                    if !self.split.settled() {
                        self.split.settle(w);
                        crate::log_debug!(
                            "RFHYBRID: {w} slots of each expert chain on the GPU, as measured before"
                        );
                    }
                }
            }
            // The kept winner where it is one of the candidates: which comes first depends on
            // the online corrections, so it is found by where it puts each node.
            let reuse = self
                .trial_won
                .get_mut(&key)
                .filter(|_| other.is_some() && !forced)
                .and_then(|(fp, uses)| {
                    *uses += 1;
                    (*uses % TRIAL_REUSE != 0).then_some(*fp)
                })
                .and_then(|fp| {
                    if plan_fingerprint(&plan) == fp {
                        Some(false)
                    } else {
                        other
                            .as_deref()
                            .filter(|o| plan_fingerprint(o) == fp)
                            .map(|_| true)
                    }
                });
            match reuse {
                Some(won) => {
                    if won {
                        plan = other.take().unwrap_or(plan);
                    }
                    other = None;
                    crate::log_debug!(
                        "RFHYBRID: graph {}: the {} plan, as this shape's trial chose",
                        self.graphs,
                        if won { "second" } else { "first" }
                    );
                }
                None => self.trial_key = other.is_some().then_some(key),
            }
            self.last_plan = plan;
            self.record_failed = None;
            self.trial_other = other;
            if self.trial_other.is_some() {
                // Forced trials (tests) take one run a turn.
                self.trial
                    .start(if forced { 1 } else { super::trial::WINDOW });
                if crate::ffi::log::debug_enabled() {
                    let other = self.trial_other.as_deref().unwrap_or_default();
                    crate::log_debug!(
                        "RFHYBRID: graph {}: two plans to try: {} | the other: {}",
                        self.graphs,
                        plan_summary(nodes, &self.last_plan),
                        plan_summary(nodes, other)
                    );
                }
            }
            if let Some(p) = self.phases.as_mut() {
                p.planned += 1;
            }
            if crate::ffi::log::debug_enabled() {
                crate::log_debug!("RFHYBRID: {}", plan_summary(nodes, &self.last_plan));
            }
        }
        let plan = self.last_plan.clone();
        let t_plan = Instant::now();
        if !same || self.last_uses.is_none() {
            self.last_uses = Some(Uses::of(nodes));
        }
        let uses = self.last_uses.take().unwrap();
        self.streamed = false;
        self.launches = 0;
        // A run of a split graph is recorded to replay (script.rs).
        let split = plan.iter().any(|s| s.place == Place::Cpu)
            && plan.iter().any(|s| s.place == Place::Gpu);
        if crate::tuning::get().hybrid_scripts
            && split
            && !sample
            && !telemetry
            && self
                .record_failed
                .is_none_or(|(g, w)| self.graphs >= g + RECORD_RETRY || w != self.split.width())
        {
            self.rec = Some(script::Recording::start(nodes, &res));
        }
        let t_uses = Instant::now();
        let r = self.compute_segments(nodes, &mut res, &plan, &uses, sample);
        if r.is_err() {
            self.rec = None;
            self.last_uses = Some(uses);
            return r;
        }
        let t_segments = Instant::now();
        // A graph all on the GPU in one launch, nothing streamed: replayed as is next time.
        let mut sinks = Vec::new();
        let mut copies = Vec::new();
        for (k, n) in nodes.iter().enumerate() {
            let sink = uses.last_use[k].is_none() || n.raw().flags & FLAG_OUTPUT != 0;
            if sink && usage(n) == Some(USAGE_COMPUTE) {
                if let Some((p, len)) = range(n) {
                    sinks.push((p, len));
                    copies.extend(res.make_current(p, len, Place::Cpu));
                }
            }
        }
        // What the host or another backend may read next: current on the host.
        if self.phases.is_some() {
            let t = Instant::now();
            self.sync_gpus()?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            if let Some(p) = self.phases.as_mut() {
                p.wait_us += us;
            }
        }
        let rec = self.rec.take();
        self.download_on(&mut res, &copies, self.last_gpu_stream)?;
        self.sync_gpus()?;
        if let Some(rec) = rec {
            let plain = !self.streamed && self.prefetched.is_none();
            match rec.finish(plain, &plan, &res, &copies, self.last_gpu_stream) {
                Some(s) => {
                    self.script = Some(s);
                    self.record_failed = None;
                    if let Some(p) = self.phases.as_mut() {
                        p.recorded += 1;
                    }
                }
                None => self.record_failed = Some((self.graphs, self.split.width())),
            }
        }
        if !sample
            && !self.streamed
            && self.launches == 1
            && plan.iter().all(|s| s.place == Place::Gpu)
        {
            self.fast = Some(Fast {
                ptrs: nodes
                    .iter()
                    .map(|n| {
                        self.shadows.0[self.shadow_of[&(n.as_ptr() as usize)]].as_ref()
                            as *const ggml_tensor as usize
                    })
                    .collect(),
                outs: nodes.iter().filter_map(range).collect(),
                sinks,
                marks_for: Vec::new(),
                marks: Vec::new(),
            });
        }
        self.last_uses = Some(uses);
        if !sample {
            self.after_graph(nodes, t_run);
        }
        if let Some(p) = self.phases.as_mut() {
            p.plan_us += (t_plan - t).as_secs_f64() * 1e6;
            p.uses_us += (t_uses - t_plan).as_secs_f64() * 1e6;
            p.segments_us += (t_segments - t_uses).as_secs_f64() * 1e6;
            p.finish_us += t_segments.elapsed().as_secs_f64() * 1e6;
            p.slow += 1;
        }
        Ok(())
    }

    /// After a graph that was not sampled: the plan trial's and the sharing width's
    /// measurements.
    fn after_graph(&mut self, nodes: &[Tensor], t_run: Instant) {
        let trial = self.trial.running();
        self.trial_step(nodes, t_run);
        if std::mem::take(&mut self.split_seen) && !trial {
            if let Some(w) = self.split.ran(t_run.elapsed().as_secs_f64() * 1e6) {
                if self.split.clear_win() {
                    self.shared
                        .learned()
                        .set_width(shape_key(nodes), self.n_threads, w);
                }
                crate::log_debug!(
                    "RFHYBRID: {w} slots of each expert chain on the GPU (medians of graph time per width: {})",
                    self.split.medians()
                );
                // The plans were tried without sharing: planned and tried again (at 4
                // threads the kept plan was 15% slower than the one tried with the width).
                if w != 0 {
                    self.last_plan.clear();
                }
            }
        }
    }

    fn compute_segments(
        &mut self,
        nodes: &[Tensor],
        res: &mut Residency,
        plan: &[BackendSelection],
        uses: &Uses,
        sample: bool,
    ) -> Result<()> {
        let telemetry = self.telemetry;
        let mut i = 0;
        let mut gpu_segment = 0;
        while i < nodes.len() {
            let place = plan[i].place;
            let mut j = i + 1;
            while j < nodes.len() && plan[j].place == place {
                j += 1;
            }
            let t0 = Instant::now();
            let seg = &nodes[i..j];
            let (a, b) = (i, j);
            // A node's result must be written (not fused away) when something outside the
            // segment reads it, or the host does.
            let idx: HashMap<usize, usize> = if place == Place::Gpu {
                seg.iter()
                    .enumerate()
                    .map(|(o, n)| (n.as_ptr() as usize, a + o))
                    .collect()
            } else {
                HashMap::new()
            };
            let outputs = |n: &Tensor| {
                let k = idx[&(n.as_ptr() as usize)];
                n.raw().flags & FLAG_OUTPUT != 0 || uses.last_use[k].is_none_or(|u| u >= b)
            };
            if sample {
                self.time_copies = true;
                for (o, n) in seg.iter().enumerate() {
                    // The model's prediction as it stands now (a repeated graph reuses its
                    // plan, made before the last graph's measurements), the node's compute
                    // alone: what is measured below.
                    let sel = BackendSelection {
                        predicted_us: self.sched.cost.compute_us(n, place),
                        ..plan[a + o]
                    };
                    let (us, timed) = self.time_alone(n, place, res, sel.predicted_us)?;
                    if telemetry {
                        self.record_node(n, &sel, us, timed);
                    }
                }
                self.time_copies = false;
            } else {
                match place {
                    Place::Cpu => {
                        let mut e = j;
                        while e < nodes.len() && plan[e].place == Place::Gpu {
                            e += 1;
                        }
                        let next = (e > j).then(|| &nodes[j..e]);
                        match self.split_chain(seg, a, uses, res, next) {
                            Some(chain) => {
                                let k = self.gpu_backend(gpu_segment.min(MAX_GPU_STREAMS - 1))?;
                                self.run_split(seg, chain, res, next, k)?
                            }
                            None => self.run_cpu(seg, res, next)?,
                        }
                        if let Some(p) = self.phases.as_mut() {
                            p.cpu_seg_us += t0.elapsed().as_secs_f64() * 1e6;
                        }
                    }
                    Place::Gpu => {
                        let k = self.gpu_backend(gpu_segment.min(MAX_GPU_STREAMS - 1))?;
                        self.last_gpu_stream = k;
                        self.run_gpu(seg, res, k, &outputs)?;
                        if let Some(p) = self.phases.as_mut() {
                            p.gpu_seg_us += t0.elapsed().as_secs_f64() * 1e6;
                        }
                        if telemetry {
                            self.sync_gpus()?;
                        }
                    }
                }
                if telemetry {
                    self.record_segment(seg, &plan[a..b], t0.elapsed().as_secs_f64() * 1e6);
                }
            }
            if place == Place::Gpu {
                gpu_segment += 1;
            }
            // A CPU segment's prefetch stays for the GPU segment after it.
            if self.prefetched.is_none() {
                res.reset_arena();
            }
            i = j;
        }
        Ok(())
    }
}

impl Drop for HybridBackend {
    fn drop(&mut self) {
        let _ = self.sync_gpus();
        if let Some(p) = &self.phases {
            crate::log_info!("{}", p.report());
        }
        self.shared.residency().close_log(self.log);
        self.shared.telemetry().finish();
    }
}

impl Backend for HybridBackend {
    fn name(&self) -> &CStr {
        c"RFHYBRID"
    }

    fn repeats_last(&mut self, nodes: &[Tensor]) -> bool {
        if self.shared.gpu.is_none() {
            return self.cpu.repeats_last(nodes);
        }
        let t = Instant::now();
        let same = self.same_graph(nodes);
        self.known_same = Some(same);
        if let Some(p) = self.phases.as_mut() {
            p.same_us_last = t.elapsed().as_secs_f64() * 1e6;
        }
        same
    }

    fn compute(&mut self, nodes: &[Tensor]) -> Result<()> {
        self.graphs += 1;
        if self.shared.gpu.is_none() {
            if !self.shared.telemetry().enabled() {
                return self.cpu.compute(nodes);
            }
            let t0 = Instant::now();
            self.cpu.compute(nodes)?;
            let sel: Vec<BackendSelection> = nodes
                .iter()
                .map(|n| BackendSelection {
                    place: Place::Cpu,
                    reason: SelectionReason::GpuUnavailable,
                    predicted_us: self.sched.cost.compute_us(n, Place::Cpu),
                })
                .collect();
            self.record_segment(nodes, &sel, t0.elapsed().as_secs_f64() * 1e6);
            return Ok(());
        }
        let r = self.compute_hybrid(nodes);
        if r.is_err() {
            // Leave nothing queued behind a failed graph, and no copies in for the next one.
            for g in &mut self.gpus {
                g.set_prelude(&[]);
            }
            let _ = self.sync_gpus();
        }
        r
    }

    fn synchronize(&mut self) -> Result<()> {
        self.sync_gpus()
    }

    fn set_n_threads(&mut self, n: usize) {
        self.n_threads = n;
        self.cpu.set_n_threads(n);
        for g in &mut self.gpus {
            g.set_n_threads(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fast;

    /// Two tokens' graphs at other addresses and cache lengths share a shape; a prompt's
    /// (another width) and a graph with another op do not.
    #[test]
    fn shape_key_ignores_addresses_and_cache_length() {
        use crate::ggml_types::{op, GgmlType};
        use crate::hybrid::synth::Synth;
        let graph = |at: usize, kv: usize, cols: usize, last: i32| {
            let mut w = Synth::new(GgmlType::Q4_0, [64, 32, 1, 1]);
            w.set_data(at as *mut u8);
            let mut x = Synth::new(GgmlType::F32, [64, cols, 1, 1]);
            x.set_data((at + 4096) as *mut u8);
            let mut y = Synth::new(GgmlType::F32, [32, cols, 1, 1]);
            y.set_data((at + 8192) as *mut u8);
            y.op(op::MUL_MAT).src(0, &w).src(1, &x);
            let mut k = Synth::new(GgmlType::F32, [kv, cols, 1, 1]);
            k.set_data((at + 16384) as *mut u8);
            k.op(last).src(0, &y);
            let nodes = [y.tensor(), k.tensor()];
            super::shape_key(&nodes)
        };
        let token = graph(1 << 20, 256, 1, op::SOFT_MAX);
        assert_eq!(token, graph(1 << 24, 512, 1, op::SOFT_MAX));
        assert_ne!(token, graph(1 << 20, 256, 64, op::SOFT_MAX));
        assert_ne!(token, graph(1 << 20, 256, 1, op::SCALE));
    }

    #[test]
    fn a_replay_marks_the_outputs_over_the_host_log_once() {
        let mut f = Fast {
            ptrs: Vec::new(),
            outs: vec![(100, 50), (140, 20), (300, 10), (500, 100)],
            sinks: Vec::new(),
            marks_for: Vec::new(),
            marks: Vec::new(),
        };
        let log = [(120, 200), (550, 10)];
        // [120, 150) and [140, 160) merge; [300, 310) apart; [550, 560) inside the last out.
        assert_eq!(f.marks(&log), &[(120, 160), (300, 310), (550, 560)]);
        f.outs.clear();
        assert_eq!(f.marks(&log).len(), 3, "the same log: kept");
        assert!(
            f.marks(&[(0, 10)]).is_empty(),
            "another log: computed again"
        );
    }

    /// The walk that compares a graph with the last one agrees with building its words.
    /// A kept trial winner is recognised by where its plan puts each node, not by its turn.
    #[test]
    fn plan_fingerprint_tells_plans_apart() {
        use super::{plan_fingerprint, BackendSelection, Place, SelectionReason};
        let sel = |place| BackendSelection {
            place,
            reason: SelectionReason::GpuAvailable,
            predicted_us: 1.0,
        };
        let a = vec![sel(Place::Cpu), sel(Place::Gpu), sel(Place::Gpu)];
        let mut b = a.clone();
        b[0].predicted_us = 7.0;
        assert_eq!(
            plan_fingerprint(&a),
            plan_fingerprint(&b),
            "predictions aside"
        );
        b[2] = sel(Place::Cpu);
        assert_ne!(plan_fingerprint(&a), plan_fingerprint(&b));
        assert_ne!(plan_fingerprint(&a), plan_fingerprint(&a[..2]));
    }

    #[test]
    fn words_match_agrees_with_graph_words() {
        use crate::cpu::ops::testutil::TT;
        use crate::ggml_types::{op, GgmlType};
        let x = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        let mut a = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        a.op(op::ADD).src(0, &x).src(1, &x);
        let mut b = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        b.op(op::MUL).src(0, &a).src(1, &x);
        let nodes = [a.tensor(), b.tensor()];
        let mut words = Vec::new();
        super::graph_words(&nodes, 7, &mut words);
        assert!(super::words_match(&words, &nodes, 7));
        assert!(
            !super::words_match(&words, &nodes, 8),
            "configuration epoch"
        );
        assert!(!super::words_match(&words, &nodes[..1], 7), "fewer nodes");
        assert!(
            !super::words_match(&words[..words.len() - 1], &nodes, 7),
            "shorter"
        );
        let mut c = TT::new(GgmlType::F32, [8, 2, 1, 1]);
        c.op(op::MUL).src(0, &x).src(1, &x);
        assert!(
            !super::words_match(&words, &[a.tensor(), c.tensor()], 7),
            "another source"
        );
    }
}
