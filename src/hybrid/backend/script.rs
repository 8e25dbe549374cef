//! RFHYBRID's backend, replaying a split graph. A graph of several segments that repeats (a
//! token's, with the model split between the devices) runs again from what its last run
//! recorded: each GPU segment's copies in and its captured graph (by tag, nothing compared),
//! each CPU segment's copies out, the copies of what the host reads after it, and the residency
//! map's state before and after the run. The walk of the nodes that `compute_segments` makes is
//! a function of the graph, its plan and the map's state, so where the state equals the
//! recorded one before, the recorded copies are the walk's and the recorded state after is the
//! walk's too. Without the walk, a GPU segment's launch is queued at once behind its copies
//! (made by its captured graph where all are from page-locked memory); the shadows are not built
//! again. Only plain runs are recorded: nothing streamed or prefetched, no expert slots shared
//! with the GPU, telemetry off. A plan trial's turns record and replay too (a script is of one
//! plan), so each plan is measured as it runs afterwards.

use super::super::residency::{Copy, Residency, Validity};
use super::super::{BackendSelection, Place};
use super::{HybridBackend, Shadows};
use crate::device::Result;
use crate::ffi::abi::ggml_tensor;
use crate::tensor::Tensor;
use std::time::Instant;

pub(super) enum Step {
    /// The copies in queued before the launch on its stream `k` (a replay has the captured
    /// graph make them where it can: `copy_in`), its shadows (for when the tag cannot be
    /// replayed) and its tag.
    Gpu {
        copies: Vec<Copy>,
        k: usize,
        ptrs: Vec<usize>,
        tag: u64,
    },
    /// Nodes `a..b` of the graph on the CPU, after these copies out on GPU stream `on`.
    Cpu {
        a: usize,
        b: usize,
        copies: Vec<Copy>,
        on: usize,
    },
}

/// A split graph's run as it is being recorded.
pub(super) struct Recording {
    /// The graph's first node (CPU segments are found by their offset from it).
    base: usize,
    before_words: Vec<u64>,
    before: Vec<(usize, Validity)>,
    steps: Vec<Step>,
    /// Copies in queued since the last launch.
    uploads: Vec<(usize, Vec<Copy>)>,
    shadows: Shadows,
    /// Something the replay does not repeat happened (the run is not recorded).
    pub ok: bool,
    /// The graph had expert chains, run by the CPU alone (width 0).
    pub chains: bool,
}

/// A recorded split graph (see the module's notes).
pub(super) struct Script {
    places: Vec<Place>,
    before_words: Vec<u64>,
    /// The regions whose state the run changed, as it left them.
    after: Vec<(usize, Validity)>,
    steps: Vec<Step>,
    sinks: Vec<Copy>,
    sinks_on: usize,
    /// The graph had expert chains: replayed only while the sharing width is 0.
    pub chains: bool,
    /// The shadows the steps' launches point at.
    _shadows: Shadows,
}

impl Recording {
    pub fn start(nodes: &[Tensor], res: &Residency) -> Recording {
        let mut before_words = Vec::new();
        res.state_words(&mut before_words);
        Recording {
            base: nodes.as_ptr() as usize,
            before_words,
            before: res.snapshot(),
            steps: Vec::new(),
            uploads: Vec::new(),
            shadows: Shadows(Vec::new()),
            ok: true,
            chains: false,
        }
    }

    /// Copies in queued on GPU stream `k`.
    pub fn uploaded(&mut self, k: usize, copies: &[Copy]) {
        self.uploads.push((k, copies.to_vec()));
    }

    /// A launch on stream `k` of the shadows `ptrs` (the boxes in `shadows`, taken), tagged.
    /// Copies in queued on another stream (streamed weights) are not replayed.
    pub fn launched(&mut self, k: usize, ptrs: Vec<usize>, tag: u64, shadows: &mut Shadows) {
        self.shadows.0.append(&mut shadows.0);
        let uploads = std::mem::take(&mut self.uploads);
        self.ok &= uploads.iter().all(|&(c, _)| c == k);
        let copies = uploads.into_iter().flat_map(|(_, c)| c).collect();
        self.steps.push(Step::Gpu {
            copies,
            k,
            ptrs,
            tag,
        });
    }

    /// CPU segment `nodes` (a slice of the graph) after copies out on stream `on`.
    pub fn cpu(&mut self, nodes: &[Tensor], copies: &[Copy], on: usize) {
        let a = (nodes.as_ptr() as usize - self.base) / std::mem::size_of::<Tensor>();
        self.steps.push(Step::Cpu {
            a,
            b: a + nodes.len(),
            copies: copies.to_vec(),
            on,
        });
    }

    /// Each GPU step's copies in: host address, bytes, page-locked, and the host buffer's
    /// base, size and page-locked range (for the debug log).
    pub fn describe_copies(&self, res: &Residency) -> String {
        let mut out = String::new();
        for s in &self.steps {
            if let Step::Gpu { copies, .. } = s {
                for c in copies {
                    let b = res.buffer_of(c.host, c.len);
                    out += &format!(
                        " [{:#x}+{} pinned {} in {:?}]",
                        c.host,
                        c.len,
                        c.pinned,
                        b.map(|(base, b)| (base as *const u8, b.len, b.pin))
                    );
                }
            }
        }
        out
    }

    /// The recorded script, if the run was plain (`plain`: nothing was streamed or prefetched;
    /// `sinks`: the copies out at its end).
    pub fn finish(
        self,
        plain: bool,
        plan: &[BackendSelection],
        res: &Residency,
        sinks: &[Copy],
        sinks_on: usize,
    ) -> Option<Script> {
        if !plain || !self.ok || !self.uploads.is_empty() {
            return None;
        }
        if crate::ffi::log::debug_enabled() {
            let (mut gpu, mut copies, mut pinned) = (0, 0, 0);
            for s in &self.steps {
                if let Step::Gpu { copies: c, .. } = s {
                    gpu += 1;
                    copies += c.len();
                    pinned += c.iter().filter(|x| x.pinned).count();
                }
            }
            crate::log_debug!(
                "RFHYBRID: split graph recorded: {} steps, {gpu} on the GPU, {copies} copies in ({pinned} from page-locked memory):{}",
                self.steps.len(),
                self.describe_copies(res)
            );
        }
        let after: Vec<(usize, Validity)> = res
            .snapshot()
            .into_iter()
            .filter(|(k, v)| !self.before.iter().any(|(bk, bv)| bk == k && bv == v))
            .collect();
        Some(Script {
            places: plan.iter().map(|s| s.place).collect(),
            before_words: self.before_words,
            after,
            steps: self.steps,
            sinks: sinks.to_vec(),
            sinks_on,
            chains: self.chains,
            _shadows: self.shadows,
        })
    }
}

impl Script {
    /// Whether the script is of this plan.
    pub fn of_plan(&self, plan: &[BackendSelection]) -> bool {
        self.places.len() == plan.len() && self.places.iter().zip(plan).all(|(p, s)| *p == s.place)
    }
}

impl HybridBackend {
    /// The graph again from its script, where the map's state is the recorded one. Ok(false):
    /// not taken (nothing was done).
    pub(super) fn compute_script(
        &mut self,
        nodes: &[Tensor],
        res: &mut Residency,
        words: &mut Vec<u64>,
    ) -> Result<bool> {
        let t0 = Instant::now();
        let Some(script) = self.script.take() else {
            return Ok(false);
        };
        res.state_words(words);
        if *words != script.before_words
            || script.steps.iter().any(|s| Self::out_of_range(s, nodes))
        {
            if let Some(p) = self.phases.as_mut() {
                p.script_misses += 1;
            }
            self.script = Some(script);
            return Ok(false);
        }
        let t_checked = Instant::now();
        self.streamed = false;
        self.launches = 0;
        let r = self.run_script(nodes, res, &script);
        if r.is_ok() {
            res.restore(&script.after);
            self.script = Some(script);
        }
        if let Some(p) = self.phases.as_mut() {
            p.script_check_us += (t_checked - t0).as_secs_f64() * 1e6;
            p.script_us += t0.elapsed().as_secs_f64() * 1e6;
            p.scripts += 1;
        }
        r.map(|_| true)
    }

    fn out_of_range(s: &Step, nodes: &[Tensor]) -> bool {
        matches!(s, Step::Cpu { b, .. } if *b > nodes.len())
    }

    fn run_script(&mut self, nodes: &[Tensor], res: &mut Residency, script: &Script) -> Result<()> {
        for step in &script.steps {
            match step {
                Step::Gpu {
                    copies,
                    k,
                    ptrs,
                    tag,
                } => {
                    let t = Instant::now();
                    let k = *k;
                    let folded = self.copy_in(res, k, copies)?;
                    self.pending[k] = true;
                    self.launches += 1;
                    self.last_gpu_stream = k;
                    if !self.gpus[k].replay_tagged(*tag)? {
                        // SAFETY: the script's boxes, alive while it is.
                        let shadows: Vec<Tensor> = ptrs
                            .iter()
                            .map(|&p| unsafe { Tensor::from_ptr(p as *const ggml_tensor) }.unwrap())
                            .collect();
                        self.gpus[k].tag_next(*tag);
                        self.gpus[k].compute(&shadows)?;
                    }
                    if let Some(p) = self.phases.as_mut() {
                        p.script_gpu_us += t.elapsed().as_secs_f64() * 1e6;
                        p.script_folded += u64::from(folded && !copies.is_empty());
                    }
                }
                Step::Cpu { a, b, copies, on } => {
                    let tw = Instant::now();
                    self.download_on(res, copies, *on)?;
                    self.sync_gpus()?;
                    let t = Instant::now();
                    let r = self.cpu.compute(&nodes[*a..*b]);
                    if let Some(p) = self.phases.as_mut() {
                        p.cpu_wait_us += (t - tw).as_secs_f64() * 1e6;
                        p.cpu_us += t.elapsed().as_secs_f64() * 1e6;
                    }
                    r?;
                }
            }
        }
        self.download_on(res, &script.sinks, script.sinks_on)?;
        self.sync_gpus()
    }
}
