//! `HybridScheduler`: a `BackendSelection` for every node of a graph, from the strategy, what
//! each device supports, what fits in the GPU budget, and the cost model's predictions of
//! compute and transfer time given where each input's current data is.

use super::cost::CostModel;
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
            if covered_by(copied, p, len, to) {
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
        let cpu_because = if !f.gpu_ok {
            if self.cost.profile.gpu_bw_gbs <= 0.0 {
                GpuUnavailable
            } else {
                CpuFallback
            }
        } else {
            MemoryConstraint
        };
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

/// Whether [p, p + len) lies wholly in ranges marked `place`.
fn covered_by(m: &BTreeMap<usize, (usize, Place)>, p: usize, len: usize, place: Place) -> bool {
    let mut at = p;
    let first = m.range(..=p).next_back().map_or(p, |(&s, _)| s);
    for (&s, &(e, w)) in m.range(first..p + len) {
        if e <= at {
            continue;
        }
        if s > at || w != place {
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
        let view = View { resident: vec![] };
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
        let view = View { resident: vec![] };
        let s = sched(ExecutionStrategy::Automatic);
        let (_w, _x, tok) = product(4096, 14336, 1, 1 << 20);
        let sel = s.plan(&[tok.tensor()], &[ALL], &view)[0];
        assert_eq!(sel.place, Place::Cpu, "{sel:?}");
        assert!(matches!(sel.reason, SelectionReason::CostModel { .. }));
        let resident = View {
            resident: vec![(1 << 20, 4096 * 14336)],
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
