//! RFHYBRID's backend, measuring: nodes timed alone for the cost model, the trial of a graph's two
//! candidate plans (`trial.rs`), and telemetry's records of nodes and segments.

use super::super::residency::Residency;
use super::super::telemetry::{EventKind, ExecutionEvent, SegmentTemplate, TemplateNode};
use super::super::trial::Step;
use super::super::{BackendSelection, Place, SelectionReason};
use super::{plan_summary, HybridBackend, PROBE};
use std::sync::Arc;

/// Segment templates kept per backend (a prompt's and a token's segments, a few plans).
const TEMPLATES_MAX: usize = 256;
use crate::device::Result;
use crate::ggml_types::op;
use crate::tensor::Tensor;
use std::time::Instant;

impl HybridBackend {
    /// A run of the graph that began at `t_run` is over: the trial of its plans, if one runs,
    /// says whether to swap to the other candidate.
    pub(super) fn trial_step(&mut self, nodes: &[Tensor], t_run: Instant) {
        let step = self.trial.ran(t_run.elapsed().as_secs_f64() * 1e6);
        let what = match step {
            Step::Stay => return,
            Step::Keep => {
                self.trial_other = None;
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
                if step == Step::SwapBack {
                    self.trial_other = None;
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
    /// backend's compute (no waits or copies) less what a graph of one node adds. The cost
    /// model observes it. Returns the µs and whether they count as a measurement of the node.
    pub(super) fn time_alone(
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
            (Place::Gpu, Some(us)) => (us, self.sched.cost.observe_device_time(n, us)),
            (Place::Cpu, Some(us)) => {
                let us = (us - alone).max(0.25 * us);
                (us, self.sched.cost.observe(n, place, us))
            }
            // A GPU without events: the wall time less the copies made for the node and what
            // a graph of one node adds (a launch and a wait).
            (_, None) => {
                let all = t.elapsed().as_secs_f64() * 1e6 - (self.copy_us - copied);
                let us = (all - alone).max(0.25 * all).max(0.0);
                (us, self.sched.cost.observe(n, place, us))
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
            // One node: a measurement of it.
            return self.record_node(&seg[0], &sels[0], us, true);
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
