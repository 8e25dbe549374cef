//! RFHYBRID's backend, measuring: nodes timed alone for the cost model, the trial of a graph's two
//! candidate plans (`trial.rs`), and telemetry's records of nodes and segments.

use super::super::residency::Residency;
use super::super::telemetry::{EventKind, ExecutionEvent, SegmentTemplate, TemplateNode};
use super::super::trial::Step;
use super::super::{BackendSelection, Place, SelectionReason};
use super::{plan_summary, HybridBackend, PROBE};
use std::sync::Arc;

use crate::device::Result;
use crate::ggml_types::op;
use crate::tensor::Tensor;
use std::time::Instant;

/// Segment templates kept per backend (a prompt's and a token's segments, a few plans).
const TEMPLATES_MAX: usize = 256;
/// A node timed alone over this many times its prediction, and over `RETIME_MIN_US`, is timed
/// again.
const RETIME_OVER: f64 = 3.0;
const RETIME_MIN_US: f64 = 20.0;

/// Running `n` again gives what it gave: it writes over none of its sources (ggml-alloc puts
/// an element-wise node over an input it is the last reader of; an in-place op is a view of
/// its first source).
fn rerun_changes_nothing(n: &Tensor) -> bool {
    (0..crate::ffi::abi::GGML_MAX_SRC)
        .filter_map(|i| n.src(i))
        .all(|s| !n.overlaps(&s))
}

impl HybridBackend {
    /// The running trial's shape chose its first (false) or second plan: kept for this
    /// process's re-plans and for later processes (`learned`).
    /// The trial is over, the winner in `last_plan`: kept for this process and later ones.
    fn trial_decided(&mut self) {
        if let Some(k) = self.trial_key.take() {
            let fp = super::plan_fingerprint(&self.last_plan);
            self.trial_won.insert(k, (fp, 0));
            self.shared.learned().set_trial(k, fp);
        }
    }

    /// A run of the graph that began at `t_run` is over: the trial of its plans, if one runs,
    /// says whether to swap to the other candidate.
    pub(super) fn trial_step(&mut self, nodes: &[Tensor], t_run: Instant) {
        let step = self.trial.ran(t_run.elapsed().as_secs_f64() * 1e6);
        let what = match step {
            Step::Stay => return,
            Step::Keep => {
                self.trial_other = None;
                self.trial_decided();
                "the first plan, the faster, stays"
            }
            Step::Swap | Step::SwapBack => {
                let Some(other) = self.trial_other.as_mut().filter(|p| p.len() == nodes.len())
                else {
                    self.trial.stop();
                    self.trial_other = None;
                    return;
                };
                std::mem::swap(&mut self.last_plan, other);
                self.fast = None;
                // The other plan may record where this one could not (it streamed).
                self.record_failed = None;
                if step == Step::SwapBack {
                    self.trial_other = None;
                    self.trial_decided();
                    "the second plan, the faster, stays"
                } else {
                    "swapped plans"
                }
            }
        };
        crate::log_debug!(
            "RFHYBRID: graph {}: {what} ({})",
            self.graphs,
            plan_summary(nodes, &self.last_plan)
        );
    }

    /// `n` run alone on `place` and timed: on the GPU what its events measured, on the CPU its
    /// backend's compute (no waits or copies) less what a graph of one node adds. A run over
    /// `RETIME_OVER` times `predicted` runs once more where that changes nothing (the node
    /// writes over none of its inputs) and the faster run counts: a preempted thread or a page
    /// fault is not the node's cost (a MoE token's expert product timed alone at 6.5 ms, its
    /// like 60 µs, on the H200 host). The cost model observes it. Returns the µs and whether
    /// they count as a measurement of the node.
    pub(super) fn time_alone(
        &mut self,
        n: &Tensor,
        place: Place,
        res: &mut Residency,
        predicted: f64,
    ) -> Result<(f64, bool)> {
        let (mut us, mut compute) = self.measure_alone(n, place, res)?;
        if us > RETIME_OVER * predicted && us > RETIME_MIN_US && rerun_changes_nothing(n) {
            let (again, c) = self.measure_alone(n, place, res)?;
            if again < us {
                (us, compute) = (again, c);
            }
        }
        let cost = &mut self.sched.cost;
        let counts = if compute {
            cost.observe_compute_time(n, place, us)
        } else {
            cost.observe(n, place, us)
        };
        Ok((us, counts))
    }

    /// One run of `time_alone`: the µs, and whether they are the node's compute alone (device
    /// time or the CPU's compute) rather than a wall time.
    fn measure_alone(
        &mut self,
        n: &Tensor,
        place: Place,
        res: &mut Residency,
    ) -> Result<(f64, bool)> {
        let one = std::slice::from_ref(n);
        (self.time_device, self.device_us) = (true, None);
        let (t, copied) = (Instant::now(), self.copy_us);
        let r = match place {
            Place::Cpu => {
                // A product runs once untimed first: the first CPU product after the GPU's
                // part measured 2-13x its later runs on the H100 host (a prompt's last-layer
                // one-row products, 2026-11-26), and the correction it set for every token
                // product made one process in four stream 2 GB a token. Products never write
                // over their inputs, so running one twice changes nothing.
                let warm = if matches!(n.op(), op::MUL_MAT | op::MUL_MAT_ID) {
                    self.run_cpu(one, res, None)
                } else {
                    Ok(())
                };
                // Asleep while the GPU ran, the workers' wake-up would be timed too.
                self.cpu.wake();
                warm.and_then(|_| self.run_cpu(one, res, None))
            }
            Place::Gpu => self.gpu_backend(PROBE).and_then(|k| {
                self.run_gpu(one, res, k, &|_: &Tensor| true)?;
                self.sync_gpus()
            }),
        };
        self.time_device = false;
        r?;
        let alone = self.sched.cost.profile.alone_us(place);
        Ok(match (place, self.device_us.take()) {
            (Place::Gpu, Some(us)) => (us, true),
            (Place::Cpu, Some(us)) => ((us - alone).max(0.25 * us), true),
            // A GPU without events: the wall time less the copies made for the node and what
            // a graph of one node adds (a launch and a wait).
            (_, None) => {
                let all = t.elapsed().as_secs_f64() * 1e6 - (self.copy_us - copied);
                ((all - alone).max(0.25 * all).max(0.0), false)
            }
        })
    }

    /// A segment timed as a whole: each node gets the share of the time its prediction has (a
    /// node timed alone, all of it).
    /// A node timed alone; `timed` false: its time is not a measurement of it.
    pub(super) fn record_node(&self, n: &Tensor, sel: &BackendSelection, us: f64, timed: bool) {
        let mut t = self.shared.telemetry();
        let start_us = t.now_us() - us;
        t.record(ExecutionEvent {
            graph: self.graphs,
            node: n.name(),
            op: op::name(n.op()),
            kind: EventKind::Compute,
            place: sel.place,
            reason: sel.reason.to_string(),
            predicted_us: sel.predicted_us,
            measured_us: us,
            bytes_moved: 0,
            start_us,
            timed,
        });
    }

    pub(super) fn record_segment(&mut self, seg: &[Tensor], sels: &[BackendSelection], us: f64) {
        if seg.len() == 1 {
            // One node, but its segment's wall time (a launch, a wait, copies): not a
            // measurement of the node (a MoE token's output product, 31 µs timed alone, took
            // 70-135 µs a segment, and counted as 20% of the time timed alone in a tg128 run).
            return self.record_node(&seg[0], &sels[0], us, false);
        }
        // The same segment under the same plan (every token): recorded from its template.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |x: u64| h = (h ^ x).wrapping_mul(0x0000_0100_0000_01b3);
        mix(seg.len() as u64);
        for (n, s) in seg.iter().zip(sels) {
            mix(n.as_ptr() as u64);
            mix(u64::from(s.place == Place::Gpu));
            mix(s.predicted_us.to_bits());
            mix(match s.reason {
                SelectionReason::CostModel {
                    cpu_us,
                    gpu_us,
                    transfer_us,
                } => {
                    cpu_us.to_bits()
                        ^ gpu_us.to_bits().rotate_left(21)
                        ^ transfer_us.to_bits().rotate_left(42)
                }
                SelectionReason::GpuAvailable => 1,
                SelectionReason::GpuUnavailable => 2,
                SelectionReason::CpuFallback => 3,
                SelectionReason::MemoryConstraint => 4,
                SelectionReason::UserPreference => 5,
            });
        }
        if self.templates.len() > TEMPLATES_MAX {
            self.templates.clear();
        }
        if self.templates.get(&h).is_some_and(|t| t.len() != seg.len()) {
            self.templates.remove(&h);
        }
        let template = self
            .templates
            .entry(h)
            .or_insert_with(|| {
                Arc::new(SegmentTemplate::new(
                    seg.iter()
                        .zip(sels)
                        .map(|(n, s)| TemplateNode {
                            name: n.name(),
                            op: op::name(n.op()),
                            place: s.place,
                            reason: s.reason.to_string(),
                            predicted_us: s.predicted_us,
                        })
                        .collect(),
                ))
            })
            .clone();
        let mut t = self.shared.telemetry();
        let start_us = t.now_us() - us;
        t.record_repeat(self.graphs, &template, start_us, us);
    }
}

#[cfg(test)]
mod tests {
    use super::rerun_changes_nothing;
    use crate::ggml_types::{op, GgmlType};
    use crate::hybrid::synth::Synth;

    /// A node over memory of its own runs again; one over its input (ggml-alloc's in-place
    /// reuse, or a view of it) does not.
    #[test]
    fn rerun_only_over_memory_of_its_own() {
        let mut mem = vec![0u8; 4096];
        let base = mem.as_mut_ptr();
        let mut x = Synth::new(GgmlType::F32, [64, 2, 1, 1]);
        x.set_data(base);
        let mut own = Synth::new(GgmlType::F32, [64, 2, 1, 1]);
        own.op(op::SOFT_MAX)
            .src(0, &x)
            .set_data(base.wrapping_add(512));
        assert!(rerun_changes_nothing(&own.tensor()));
        let mut over = Synth::new(GgmlType::F32, [64, 2, 1, 1]);
        over.op(op::SOFT_MAX)
            .src(0, &x)
            .set_data(base.wrapping_add(256));
        assert!(!rerun_changes_nothing(&over.tensor()));
        let mut second = Synth::new(GgmlType::F32, [64, 2, 1, 1]);
        second
            .op(op::ADD)
            .src(0, &own)
            .src(1, &x)
            .set_data(base.wrapping_add(1024));
        assert!(rerun_changes_nothing(&second.tensor()));
        second.set_data(base.wrapping_add(512 + 4));
        assert!(!rerun_changes_nothing(&second.tensor()));
    }
}
