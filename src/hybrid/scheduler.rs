//! `HybridScheduler`: a `BackendSelection` for every node of a graph, from the strategy, what
//! each device supports, what fits in the GPU budget, and the cost model's predictions of
//! compute and transfer time given where each input's current data is.

use super::cost::CostModel;
use super::prefetch;
use super::{BackendSelection, ExecutionStrategy, Place, SelectionReason};
use crate::ffi::abi::GGML_MAX_SRC;
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// What the backend found out about a node before planning.
#[derive(Clone, Copy, Debug)]
pub struct NodeFacts {
    pub cpu_ok: bool,
    /// A GPU exists and supports the node.
    pub gpu_ok: bool,
    /// The node's inputs and output can all have GPU addresses within the budget.
    pub gpu_mem_ok: bool,
}

/// Where data that no node of the graph writes lives: for a byte range and a place, the bytes
/// that would have to move there, and whether the host side is page-locked.
pub trait DataView {
    fn missing(&self, ptr: usize, len: usize, to: Place) -> usize;
    fn pinned(&self, ptr: usize, len: usize) -> bool;
    /// Whether on the GPU the range would stream through the staging arena (it has no copy
    /// of its own there).
    fn streams(&self, _ptr: usize, _len: usize) -> bool {
        false
    }
    /// Bytes of one half of the arena that a GPU segment's weights can be copied into while
    /// the CPU segment before it runs (0: no prefetch).
    fn prefetch_half(&self) -> usize {
        0
    }
}

pub struct HybridScheduler {
    pub strategy: ExecutionStrategy,
    pub cost: CostModel,
}

/// A node's byte range in host memory (empty tensors: none).
pub fn range(t: &Tensor) -> Option<(usize, usize)> {
    let n = t.nbytes();
    (!t.data().is_null() && n > 0).then(|| (t.data() as usize, n))
}

impl HybridScheduler {
    pub fn new(strategy: ExecutionStrategy, cost: CostModel) -> HybridScheduler {
        HybridScheduler { strategy, cost }
    }

    /// One selection per node, in order.
    pub fn plan(
        &self,
        nodes: &[Tensor],
        facts: &[NodeFacts],
        view: &dyn DataView,
    ) -> Vec<BackendSelection> {
        if self.strategy == ExecutionStrategy::Automatic {
            return self.plan_automatic(nodes, facts, view);
        }
        // Ranges written by earlier nodes of this graph: start -> (end, where).
        let mut written: BTreeMap<usize, (usize, Place)> = BTreeMap::new();
        let mut out = Vec::with_capacity(nodes.len());
        // Sources a node copied to its place stay there for later consumers (a token's
        // positions and masks go to the GPU once, not once per layer).
        let mut copied: BTreeMap<usize, (usize, Place)> = BTreeMap::new();
        for (n, f) in nodes.iter().zip(facts) {
            let sel = self.select(n, f, &written, &copied, view);
            for s in (0..GGML_MAX_SRC).filter_map(|i| n.src(i)) {
                if let Some((p, len)) = range(&s) {
                    mark(&mut copied, p, p + len, sel.place);
                }
            }
            if let Some((p, len)) = range(n) {
                mark(&mut written, p, p + len, sel.place);
                mark(&mut copied, p, p + len, sel.place);
            }
            out.push(sel);
        }
        out
    }

    /// Automatic: the places that minimise the graph's predicted time, by dynamic programming
    /// over the node sequence: each node's compute on a place, its inputs from outside the
    /// graph moved there (shared by their consumers: a token's positions go to the GPU once),
    /// and a switch of place between consecutive nodes paying for the earlier nodes' results
    /// it reads. A small node between two GPU products stays on the GPU: leaving costs two
    /// transfers, more than it saves.
    fn plan_automatic(
        &self,
        nodes: &[Tensor],
        facts: &[NodeFacts],
        view: &dyn DataView,
    ) -> Vec<BackendSelection> {
        use SelectionReason::*;
        const INF: f64 = f64::INFINITY;
        let mut uses: std::collections::HashMap<usize, usize> = Default::default();
        for n in nodes {
            for s in (0..GGML_MAX_SRC).filter_map(|i| n.src(i)) {
                if let Some((p, _)) = range(&s) {
                    *uses.entry(p).or_default() += 1;
                }
            }
        }
        let places = [Place::Cpu, Place::Gpu];
        let mut written: BTreeMap<usize, (usize, Place)> = BTreeMap::new();
        // Per node and place: compute, inputs from outside the graph, and the switch cost.
        let mut compute = Vec::with_capacity(nodes.len());
        let mut external = Vec::with_capacity(nodes.len());
        let mut switch = Vec::with_capacity(nodes.len());
        let mut allowed = Vec::with_capacity(nodes.len());
        let mut streams = Vec::with_capacity(nodes.len());
        let mut stream_us = Vec::with_capacity(nodes.len());
        for (n, f) in nodes.iter().zip(facts) {
            let gpu_can = f.gpu_ok && f.gpu_mem_ok;
            let ok = [f.cpu_ok || !gpu_can, gpu_can];
            let mut ext = [0.0f64; 2];
            let (mut lens, mut lens_us) = (Vec::new(), 0.0);
            let mut inside = 0usize;
            let own = range(n);
            for s in (0..GGML_MAX_SRC).filter_map(|i| n.src(i)) {
                let Some((p, len)) = range(&s) else { continue };
                // The destination a node writes rows into (SET_ROWS' cache): not an input to
                // move. A layer's cache follows its attention's place (brought over whole once
                // when that place changes); charging it here made a cache written by the CPU
                // once cost its whole size on the GPU at every later token, so SET_ROWS and the
                // nodes around it left the GPU in every layer.
                if own.is_some_and(|(o, ol)| o <= p && p + len <= o + ol) {
                    continue;
                }
                if covered_by(&written, p, len, None) {
                    inside += len;
                    continue;
                }
                let share = uses.get(&p).copied().unwrap_or(1).max(1) as f64;
                for (k, &pl) in places.iter().enumerate() {
                    let bytes = view.missing(p, len, pl);
                    if bytes > 0 {
                        let us = self.cost.transfer_us(bytes, pl, view.pinned(p, len)) / share;
                        ext[k] += us;
                        if pl == Place::Gpu && view.streams(p, len) {
                            lens.push(len);
                            lens_us += us;
                        }
                    }
                }
            }
            streams.push(lens);
            stream_us.push(lens_us);
            let c = [
                self.cost.compute_us(n, Place::Cpu),
                if gpu_can {
                    self.cost.compute_us(n, Place::Gpu)
                } else {
                    INF
                },
            ];
            let sw = [
                if inside > 0 {
                    self.cost.transfer_us(inside, Place::Cpu, true)
                } else {
                    0.0
                },
                if inside > 0 {
                    self.cost.transfer_us(inside, Place::Gpu, true)
                } else {
                    0.0
                },
            ];
            if let Some((p, len)) = range(n) {
                mark(&mut written, p, p + len, Place::Cpu);
            }
            compute.push(c);
            external.push(ext);
            switch.push(sw);
            allowed.push(ok);
        }
        // dp[i][k]: least predicted µs of nodes 0..=i with node i on places[k].
        let n = nodes.len();
        let mut dp = vec![[INF; 2]; n];
        let mut from = vec![[0usize; 2]; n];
        for i in 0..n {
            for k in 0..2 {
                if !allowed[i][k] {
                    continue;
                }
                let own = compute[i][k] + external[i][k];
                let (best, arg) = if i == 0 {
                    (0.0, k)
                } else {
                    let stay = dp[i - 1][k];
                    let moved = dp[i - 1][1 - k] + switch[i][k] + self.cost.profile.switch_us;
                    if stay <= moved {
                        (stay, k)
                    } else {
                        (moved, 1 - k)
                    }
                };
                dp[i][k] = best + own;
                from[i][k] = arg;
            }
        }
        let mut choice = vec![0usize; n];
        if n > 0 {
            choice[n - 1] = if dp[n - 1][1] < dp[n - 1][0] { 1 } else { 0 };
            for i in (1..n).rev() {
                choice[i - 1] = from[i][choice[i]];
            }
        }
        let costs = prefetch::Costs {
            compute: &compute,
            external: &external,
            switch: &switch,
            allowed: &allowed,
            streams: &streams,
            stream_us: &stream_us,
            switch_us: self.cost.profile.switch_us,
        };
        let (_, hidden) = prefetch::place_groups(&mut choice, &costs, view.prefetch_half());
        (0..n)
            .map(|i| {
                let k = choice[i];
                let place = places[k];
                let moved = i > 0 && choice[i - 1] != k;
                let predicted_us = compute[i][k] + external[i][k] - hidden[i]
                    + if moved {
                        switch[i][k] + self.cost.profile.switch_us
                    } else {
                        0.0
                    };
                let f = &facts[i];
                let reason = if !(f.gpu_ok && f.gpu_mem_ok) {
                    self.why_not_gpu(f)
                } else if !f.cpu_ok {
                    GpuAvailable
                } else {
                    CostModel {
                        cpu_us: compute[i][0] + external[i][0],
                        gpu_us: compute[i][1],
                        transfer_us: external[i][1] - hidden[i],
                    }
                };
                BackendSelection {
                    place,
                    reason,
                    predicted_us,
                }
            })
            .collect()
    }

    /// Why a node the GPU cannot take runs on the CPU.
    fn why_not_gpu(&self, f: &NodeFacts) -> SelectionReason {
        if f.gpu_ok {
            SelectionReason::MemoryConstraint
        } else if self.cost.profile.gpu_bw_gbs <= 0.0 {
            SelectionReason::GpuUnavailable
        } else {
            SelectionReason::CpuFallback
        }
    }

    /// µs of moving the node's inputs to `to`.
    fn inputs_us(
        &self,
        n: &Tensor,
        to: Place,
        written: &BTreeMap<usize, (usize, Place)>,
        copied: &BTreeMap<usize, (usize, Place)>,
        view: &dyn DataView,
    ) -> f64 {
        let mut us = 0.0;
        for i in 0..GGML_MAX_SRC {
            let Some((p, len)) = n.src(i).as_ref().and_then(range) else {
                continue;
            };
            if covered_by(copied, p, len, Some(to)) {
                continue;
            }
            let (mut from_graph, mut covered) = (0usize, 0usize);
            let first = written.range(..=p).next_back().map_or(p, |(&s, _)| s);
            for (&s, &(e, w)) in written.range(first..p + len) {
                let ov = e.min(p + len).saturating_sub(s.max(p));
                covered += ov;
                if w != to {
                    from_graph += ov;
                }
            }
            let bytes = if covered >= len {
                from_graph
            } else {
                from_graph + view.missing(p, len, to).min(len - covered)
            };
            if bytes > 0 {
                us += self.cost.transfer_us(bytes, to, view.pinned(p, len));
            }
        }
        us
    }

    fn select(
        &self,
        n: &Tensor,
        f: &NodeFacts,
        written: &BTreeMap<usize, (usize, Place)>,
        copied: &BTreeMap<usize, (usize, Place)>,
        view: &dyn DataView,
    ) -> BackendSelection {
        use SelectionReason::*;
        let gpu_can = f.gpu_ok && f.gpu_mem_ok;
        // Where the GPU cannot take the node: why not.
        let cpu_because = self.why_not_gpu(f);
        let on = |place: Place, reason: SelectionReason| {
            let predicted_us =
                self.cost.compute_us(n, place) + self.inputs_us(n, place, written, copied, view);
            BackendSelection {
                place,
                reason,
                predicted_us,
            }
        };
        if !gpu_can {
            return on(Place::Cpu, cpu_because);
        }
        if !f.cpu_ok {
            return on(Place::Gpu, GpuAvailable);
        }
        match self.strategy {
            ExecutionStrategy::GpuPreferred => on(Place::Gpu, GpuAvailable),
            ExecutionStrategy::CpuPreferred => on(Place::Cpu, UserPreference),
            ExecutionStrategy::BackendOnly(p) => on(p, UserPreference),
            ExecutionStrategy::Automatic => {
                let cpu_us = self.cost.compute_us(n, Place::Cpu)
                    + self.inputs_us(n, Place::Cpu, written, copied, view);
                let gpu_us = self.cost.compute_us(n, Place::Gpu);
                let transfer_us = self.inputs_us(n, Place::Gpu, written, copied, view);
                let place = if gpu_us + transfer_us < cpu_us {
                    Place::Gpu
                } else {
                    Place::Cpu
                };
                BackendSelection {
                    place,
                    reason: CostModel {
                        cpu_us,
                        gpu_us,
                        transfer_us,
                    },
                    predicted_us: match place {
                        Place::Gpu => gpu_us + transfer_us,
                        Place::Cpu => cpu_us,
                    },
                }
            }
        }
    }
}

/// Whether [p, p + len) lies wholly in marked ranges: marked `place`, or (None) marked at all.
fn covered_by(
    m: &BTreeMap<usize, (usize, Place)>,
    p: usize,
    len: usize,
    place: Option<Place>,
) -> bool {
    let mut at = p;
    let first = m.range(..=p).next_back().map_or(p, |(&s, _)| s);
    for (&s, &(e, w)) in m.range(first..p + len) {
        if e <= at {
            continue;
        }
        if s > at || place.is_some_and(|pl| w != pl) {
            return false;
        }
        at = e;
        if at >= p + len {
            return true;
        }
    }
    at >= p + len
}

/// Records that `place` wrote [a, b) (overwriting what earlier nodes wrote there).
fn mark(w: &mut BTreeMap<usize, (usize, Place)>, a: usize, b: usize, place: Place) {
    // Cut the ranges that straddle a or b, then drop everything inside.
    for at in [a, b] {
        if let Some((&s, &(e, p))) = w.range(..at).next_back() {
            if e > at {
                w.insert(s, (at, p));
                w.insert(at, (e, p));
            }
        }
    }
    let inside: Vec<usize> = w.range(a..b).map(|(&k, _)| k).collect();
    for k in inside {
        w.remove(&k);
    }
    w.insert(a, (b, place));
}

#[cfg(test)]
mod tests {
    use super::super::cost::Profile;
    use super::*;
    use crate::ggml_types::{op, GgmlType};
    use crate::hybrid::synth::Synth;

    /// Data outside the graph: everything on the host; weights (by address) also on the GPU
    /// when listed as resident.
    struct View {
        resident: Vec<(usize, usize)>,
        /// The arena half a prefetch may fill (0: none).
        half: usize,
    }
    impl DataView for View {
        fn missing(&self, p: usize, len: usize, to: Place) -> usize {
            let res = self
                .resident
                .iter()
                .any(|&(a, l)| a <= p && p + len <= a + l);
            match to {
                Place::Cpu => 0,
                Place::Gpu if res => 0,
                Place::Gpu => len,
            }
        }
        fn pinned(&self, _: usize, _: usize) -> bool {
            true
        }
        fn streams(&self, p: usize, len: usize) -> bool {
            self.missing(p, len, Place::Gpu) > 0
        }
        fn prefetch_half(&self) -> usize {
            self.half
        }
    }

    /// A Q4_0 product [k, m] x [k, n] with fake addresses.
    fn product(k: usize, m: usize, n: usize, at: usize) -> (Synth, Synth, Synth) {
        let mut w = Synth::new(GgmlType::Q4_0, [k, m, 1, 1]);
        w.set_data(at as *mut u8);
        let mut x = Synth::new(GgmlType::F32, [k, n, 1, 1]);
        x.set_data((at + (1 << 28)) as *mut u8);
        let mut y = Synth::new(GgmlType::F32, [m, n, 1, 1]);
        y.set_data((at + (2 << 28)) as *mut u8);
        y.op(op::MUL_MAT).src(0, &w).src(1, &x);
        (w, x, y)
    }

    const ALL: NodeFacts = NodeFacts {
        cpu_ok: true,
        gpu_ok: true,
        gpu_mem_ok: true,
    };

    fn sched(s: ExecutionStrategy) -> HybridScheduler {
        HybridScheduler::new(s, CostModel::new(Profile::synthetic(100.0, 3000.0, 25.0)))
    }

    #[test]
    fn every_strategy_and_reason() {
        let (_w, _x, y) = product(4096, 4096, 1, 1 << 20);
        let nodes = [y.tensor()];
        let view = View {
            resident: vec![],
            half: 0,
        };
        let pick = |s, f: NodeFacts| sched(s).plan(&nodes, &[f], &view)[0];
        use ExecutionStrategy::*;
        use SelectionReason::*;
        let g = pick(GpuPreferred, ALL);
        assert_eq!((g.place, g.reason), (Place::Gpu, GpuAvailable));
        let c = pick(CpuPreferred, ALL);
        assert_eq!((c.place, c.reason), (Place::Cpu, UserPreference));
        let o = pick(BackendOnly(Place::Gpu), ALL);
        assert_eq!((o.place, o.reason), (Place::Gpu, UserPreference));
        let no_gpu = NodeFacts {
            gpu_ok: false,
            ..ALL
        };
        assert_eq!(pick(GpuPreferred, no_gpu).reason, CpuFallback);
        let no_mem = NodeFacts {
            gpu_mem_ok: false,
            ..ALL
        };
        assert_eq!(
            pick(BackendOnly(Place::Gpu), no_mem).reason,
            MemoryConstraint
        );
        let gpu_only = NodeFacts {
            cpu_ok: false,
            ..ALL
        };
        assert_eq!(pick(CpuPreferred, gpu_only).place, Place::Gpu);
        let none = HybridScheduler::new(
            Automatic,
            super::CostModel::new(Profile::synthetic(100.0, 0.0, 0.0)),
        );
        let s = none.plan(&nodes, &[no_gpu], &view)[0];
        assert_eq!((s.place, s.reason), (Place::Cpu, GpuUnavailable));
        assert!(s.predicted_us > 0.0 && s.predicted_us.is_finite());
    }

    /// Automatic: a token's product with weights only on the host stays on the CPU (copying
    /// the weights costs more than reading them there); with the weights resident it goes to
    /// the GPU; a prompt's product streams the weights.
    #[test]
    fn automatic_weighs_transfers() {
        let view = View {
            resident: vec![],
            half: 0,
        };
        let s = sched(ExecutionStrategy::Automatic);
        let (_w, _x, tok) = product(4096, 14336, 1, 1 << 20);
        let sel = s.plan(&[tok.tensor()], &[ALL], &view)[0];
        assert_eq!(sel.place, Place::Cpu, "{sel:?}");
        assert!(matches!(sel.reason, SelectionReason::CostModel { .. }));
        let resident = View {
            resident: vec![(1 << 20, 4096 * 14336)],
            half: 0,
        };
        let sel = s.plan(&[tok.tensor()], &[ALL], &resident)[0];
        assert_eq!(sel.place, Place::Gpu, "{sel:?}");
        let (_w, _x, prompt) = product(4096, 14336, 512, 1 << 20);
        let sel = s.plan(&[prompt.tensor()], &[ALL], &view)[0];
        assert_eq!(sel.place, Place::Gpu, "{sel:?}");
    }

    /// A node reading what an earlier node wrote on the GPU pays for moving it to the CPU.
    #[test]
    fn later_nodes_see_where_earlier_ones_wrote() {
        let view = View {
            resident: vec![(1 << 20, 64 * 64)],
            half: 0,
        };
        let s = sched(ExecutionStrategy::Automatic);
        let (_w, _x, y) = product(64, 64, 64, 1 << 20);
        let mut z = Synth::new(GgmlType::F32, [64, 64, 1, 1]);
        z.set_data((3usize << 28) as *mut u8);
        z.op(op::SCALE).param_f32(0, 2.0).src(0, &y);
        let plan = s.plan(
            &[y.tensor(), z.tensor()],
            &[
                NodeFacts {
                    cpu_ok: false,
                    ..ALL
                },
                ALL,
            ],
            &view,
        );
        assert_eq!(plan[0].place, Place::Gpu);
        assert_eq!(plan[1].place, Place::Gpu, "the input is on the GPU: stay");
        match plan[1].reason {
            SelectionReason::CostModel { transfer_us, .. } => assert_eq!(transfer_us, 0.0),
            r => panic!("{r:?}"),
        }
    }

    /// A token through `layers` 8B-shaped layers (fake addresses), the first `resident_layers`
    /// layers' weights listed as resident in VRAM.
    struct Token {
        // Boxed: the nodes point at them while the vector grows.
        #[allow(clippy::vec_box)]
        keep: Vec<Box<Synth>>,
        _x: Box<Synth>,
        nodes: Vec<*const Synth>,
        layer_of: Vec<usize>,
        resident: Vec<(usize, usize)>,
        everything: Vec<(usize, usize)>,
    }

    fn token(layers: usize, resident_layers: usize) -> Token {
        const D: usize = 4096;
        const F: usize = 14336;
        let mut next = 1usize << 32;
        let mut at = |bytes: usize| {
            let a = next;
            next += bytes.next_multiple_of(4096) + 4096;
            a as *mut u8
        };
        let mut keep: Vec<Box<Synth>> = Vec::new();
        let mk = |ty: GgmlType, ne: [usize; 4], at: &mut dyn FnMut(usize) -> *mut u8| {
            let mut t = Box::new(Synth::new(ty, ne));
            let n = t.nbytes();
            t.set_data(at(n));
            t
        };
        let pos = mk(GgmlType::I32, [1, 1, 1, 1], &mut at);
        let idx = mk(GgmlType::I64, [1, 1, 1, 1], &mut at);
        let mut x = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
        x.op(op::GET_ROWS);
        let mut resident = Vec::new();
        let mut everything = Vec::new();
        let mut nodes: Vec<*const Synth> = Vec::new();
        let mut layer_of = Vec::new();
        let mut cur: *const Synth = &*x;
        for layer in 0..layers {
            let mut w = |ne: [usize; 4], ty: GgmlType, at: &mut dyn FnMut(usize) -> *mut u8| {
                let t = mk(ty, ne, at);
                if layer < resident_layers {
                    resident.push((t.t.data as usize, t.nbytes()));
                }
                everything.push((t.t.data as usize, t.nbytes()));
                t
            };
            let wn = w([D, 1, 1, 1], GgmlType::F32, &mut at);
            let wq = w([D, D, 1, 1], GgmlType::Q4_0, &mut at);
            let wk = w([D, 1024, 1, 1], GgmlType::Q4_0, &mut at);
            let wo = w([D, D, 1, 1], GgmlType::Q4_0, &mut at);
            let wg = w([D, F, 1, 1], GgmlType::Q4_0, &mut at);
            let wu = w([D, F, 1, 1], GgmlType::Q4_0, &mut at);
            let wd = w([F, D, 1, 1], GgmlType::Q4_0, &mut at);
            let cache = mk(GgmlType::F16, [1024, 512, 1, 1], &mut at);
            let mut step = |t: Box<Synth>, keep: &mut Vec<Box<Synth>>| {
                let p: *const Synth = &*t;
                keep.push(t);
                nodes.push(p);
                layer_of.push(layer);
                p
            };
            let src = |p: *const Synth| unsafe { &*p };
            let mut n = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
            n.op(op::RMS_NORM).param_f32(0, 1e-5).src(0, src(cur));
            let n = step(n, &mut keep);
            let mut m = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
            m.op(op::MUL).src(0, src(n)).src(1, &wn);
            let m = step(m, &mut keep);
            let mut q = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
            q.op(op::MUL_MAT).src(0, &wq).src(1, src(m));
            let q = step(q, &mut keep);
            let mut k = mk(GgmlType::F32, [1024, 1, 1, 1], &mut at);
            k.op(op::MUL_MAT).src(0, &wk).src(1, src(m));
            let k = step(k, &mut keep);
            let mut kr = mk(GgmlType::F32, [1024, 1, 1, 1], &mut at);
            kr.op(op::ROPE).src(0, src(k)).src(1, &pos);
            let kr = step(kr, &mut keep);
            let mut sr = Box::new(Synth::new(GgmlType::F16, [1024, 512, 1, 1]));
            sr.set_data(cache.t.data as *mut u8);
            // ggml's SET_ROWS: values, row indices, and the destination again as src[2].
            sr.op(op::SET_ROWS)
                .src(0, src(kr))
                .src(1, &idx)
                .src(2, &cache);
            step(sr, &mut keep);
            let mut att = mk(GgmlType::F32, [512, 1, 1, 1], &mut at);
            att.op(op::MUL_MAT).src(0, &cache).src(1, src(kr));
            let att = step(att, &mut keep);
            let mut sm = mk(GgmlType::F32, [512, 1, 1, 1], &mut at);
            sm.op(op::SOFT_MAX).src(0, src(att));
            let sm = step(sm, &mut keep);
            let mut ctxv = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
            ctxv.op(op::MUL).src(0, src(q)).src(1, src(q));
            let _ = sm;
            let ctxv = step(ctxv, &mut keep);
            let mut o = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
            o.op(op::MUL_MAT).src(0, &wo).src(1, src(ctxv));
            let o = step(o, &mut keep);
            let mut x2 = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
            x2.op(op::ADD).src(0, src(o)).src(1, src(cur));
            let x2 = step(x2, &mut keep);
            let mut g = mk(GgmlType::F32, [F, 1, 1, 1], &mut at);
            g.op(op::MUL_MAT).src(0, &wg).src(1, src(x2));
            let g = step(g, &mut keep);
            let mut u = mk(GgmlType::F32, [F, 1, 1, 1], &mut at);
            u.op(op::MUL_MAT).src(0, &wu).src(1, src(x2));
            let u = step(u, &mut keep);
            let mut h = mk(GgmlType::F32, [F, 1, 1, 1], &mut at);
            h.op(op::GLU)
                .param_i32(0, crate::ggml_types::glu::SWIGLU)
                .src(0, src(g))
                .src(1, src(u));
            let h = step(h, &mut keep);
            let mut d = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
            d.op(op::MUL_MAT).src(0, &wd).src(1, src(h));
            let d = step(d, &mut keep);
            let mut x3 = mk(GgmlType::F32, [D, 1, 1, 1], &mut at);
            x3.op(op::ADD).src(0, src(d)).src(1, src(x2));
            cur = step(x3, &mut keep);
            for t in [wn, wq, wk, wo, wg, wu, wd, cache] {
                keep.push(t);
            }
        }
        Token {
            keep,
            _x: x,
            nodes,
            layer_of,
            resident,
            everything,
        }
    }

    /// A token through two 8B-shaped layers, the first layer's weights resident in VRAM, the
    /// second's only on the host (a model split by the budget): each product runs where its
    /// weights are, and the small nodes (norms, positions, cache rows) follow their layer
    /// instead of crossing back and forth (at most: into the GPU at the first layer's input,
    /// out of it at the second layer).
    #[test]
    fn a_split_token_crosses_once() {
        let Token {
            keep,
            _x: x,
            nodes,
            layer_of,
            resident,
            everything,
        } = token(2, 1);
        let tensors: Vec<Tensor> = nodes.iter().map(|&p| unsafe { &*p }.tensor()).collect();
        let facts = vec![ALL; tensors.len()];
        let view = View { resident, half: 0 };
        // H200-like: CPU 100 GB/s, GPU 4 TB/s, PCIe 50 GB/s.
        let s = HybridScheduler::new(
            ExecutionStrategy::Automatic,
            CostModel::new(Profile::synthetic(100.0, 4000.0, 50.0)),
        );
        let plan = s.plan(&tensors, &facts, &view);
        let places: String = plan
            .iter()
            .map(|p| if p.place == Place::Gpu { 'G' } else { 'C' })
            .collect();
        // The products go where their weights are; small nodes follow their inputs.
        for (i, sel) in plan.iter().enumerate() {
            if tensors[i].op() == op::MUL_MAT
                && tensors[i].src(0).unwrap().ty() == Some(GgmlType::Q4_0)
            {
                let want = if layer_of[i] == 0 {
                    Place::Gpu
                } else {
                    Place::Cpu
                };
                assert_eq!(sel.place, want, "node {i} of {places}: {sel:?}");
            }
        }
        let crossings = places
            .as_bytes()
            .windows(2)
            .filter(|w| w[0] != w[1])
            .count();
        assert!(crossings <= 2, "{places}");
        // Every weight in VRAM: the whole token on the GPU (one launch, replayed next time),
        // although the CPU computes each small node sooner (2 against 5 us) and moving a few KB
        // costs next to nothing: each change of place pays a synchronisation. Without that
        // charge the plan leaves the GPU for them.
        let view = View {
            resident: everything,
            half: 0,
        };
        let mut p = Profile::synthetic(100.0, 4000.0, 50.0);
        p.transfer_us = 1.5;
        let plan_with = |switch_us: f64| {
            let mut p = p.clone();
            p.switch_us = switch_us;
            HybridScheduler::new(ExecutionStrategy::Automatic, CostModel::new(p))
                .plan(&tensors, &facts, &view)
                .iter()
                .map(|p| if p.place == Place::Gpu { 'G' } else { 'C' })
                .collect::<String>()
        };
        assert!(plan_with(0.0).contains('C'), "{}", plan_with(0.0));
        assert!(!plan_with(12.0).contains('C'), "{}", plan_with(12.0));
        // The caches are not on the GPU (View: not resident): SET_ROWS writing rows into one
        // does not pay for moving it there, so a cheap change of place does not take it off.
        assert!(!plan_with(5.0).contains('C'), "{}", plan_with(5.0));
        drop(keep);
        drop(x);
    }

    /// With room in the arena to copy a layer's feed-forward weights in while the CPU computes
    /// the layers before it, some of the non-resident layers' products run on the GPU, their
    /// copies hidden, and the token is predicted faster; each such group's copies take no
    /// longer than the CPU work since the last GPU node. Without room, none moves.
    #[test]
    fn hidden_copies_move_some_cpu_layers_to_the_gpu() {
        let t = token(8, 2);
        let tensors: Vec<Tensor> = t.nodes.iter().map(|&p| unsafe { &*p }.tensor()).collect();
        let facts = vec![ALL; tensors.len()];
        // H200-like: CPU 100 GB/s, GPU 4 TB/s, PCIe 50 GB/s, 100 µs a change of device.
        let mut p = Profile::synthetic(100.0, 4000.0, 50.0);
        p.switch_us = 100.0;
        let s = HybridScheduler::new(ExecutionStrategy::Automatic, CostModel::new(p));
        let plan = |half: usize| {
            let view = View {
                resident: t.resident.clone(),
                half,
            };
            s.plan(&tensors, &facts, &view)
        };
        let streamed_products = |plan: &[BackendSelection]| {
            (0..tensors.len())
                .filter(|&i| {
                    t.layer_of[i] >= 2
                        && tensors[i].op() == op::MUL_MAT
                        && tensors[i].src(0).unwrap().ty() == Some(GgmlType::Q4_0)
                })
                .map(|i| plan[i].place)
                .collect::<Vec<_>>()
        };
        let total = |plan: &[BackendSelection]| plan.iter().map(|p| p.predicted_us).sum::<f64>();
        let (none, some) = (plan(0), plan(66 << 20));
        assert!(streamed_products(&none).iter().all(|&p| p == Place::Cpu));
        let moved = streamed_products(&some);
        let on_gpu = moved.iter().filter(|&&p| p == Place::Gpu).count();
        assert!(on_gpu > 0 && on_gpu < moved.len() / 2, "{moved:?}");
        assert!(total(&some) < total(&none));
        let places: String = some
            .iter()
            .map(|p| if p.place == Place::Gpu { 'G' } else { 'C' })
            .collect();
        // Every GPU run after the resident layers follows CPU work at least as long as its
        // copies (the CPU nodes' predictions against the 50 GB/s it streams).
        let mut i = 0;
        while i < some.len() {
            if some[i].place == Place::Gpu && i > 0 && some[i - 1].place == Place::Cpu {
                let cpu: f64 = (0..i)
                    .rev()
                    .take_while(|&k| some[k].place == Place::Cpu)
                    .map(|k| some[k].predicted_us)
                    .sum();
                let mut e = i;
                let mut bytes = 0;
                while e < some.len() && some[e].place == Place::Gpu {
                    bytes += (0..GGML_MAX_SRC)
                        .filter_map(|j| tensors[e].src(j))
                        .filter(|w| w.ty() == Some(GgmlType::Q4_0))
                        .map(|w| w.nbytes())
                        .sum::<usize>();
                    e += 1;
                }
                assert!(bytes as f64 / 50e3 <= cpu * 1.01, "{places}: at {i}");
                i = e;
            } else {
                i += 1;
            }
        }
        drop(t.keep);
    }

    #[test]
    fn mark_overwrites_ranges() {
        let mut w = BTreeMap::new();
        mark(&mut w, 0, 100, Place::Gpu);
        mark(&mut w, 40, 60, Place::Cpu);
        let v: Vec<_> = w.iter().map(|(&a, &(b, p))| (a, b, p)).collect();
        assert_eq!(
            v,
            vec![
                (0, 40, Place::Gpu),
                (40, 60, Place::Cpu),
                (60, 100, Place::Gpu)
            ]
        );
    }
}
