//! RFHYBRID's backend, replaying: a graph computed all on the GPU in one launch runs again from its
//! shadows, copying in only what changed.

use super::super::residency::{Copy, Residency};
use super::super::scheduler::range;
use super::super::Place;
use super::{writes_part, HybridBackend};
use crate::device::Result;
use crate::ffi::abi::{ggml_tensor, GGML_MAX_SRC};
use crate::tensor::Tensor;
use std::time::Instant;

impl HybridBackend {
    /// The copies a graph all on the GPU needs before it runs again after other graphs, node
    /// by node as `run_gpu` walks a segment; and what it writes, marked as the GPU's.
    pub(super) fn walk_for_replay(nodes: &[Tensor], res: &mut Residency) -> Vec<Copy> {
        let mut copies = Vec::new();
        for n in nodes {
            for s in (0..GGML_MAX_SRC).filter_map(|j| n.src(j)) {
                if let Some((p, len)) = range(&s) {
                    copies.extend(res.make_current(p, len, Place::Gpu));
                }
            }
            if let Some((p, len)) = range(n) {
                if writes_part(n) {
                    copies.extend(res.make_current(p, len, Place::Gpu));
                }
                res.written(p, len, Place::Gpu);
            }
        }
        copies
    }

    /// The graph computed last again, all on the GPU with nothing streamed: copy in what the
    /// host wrote since, replay the shadows, fetch the outputs.
    pub(super) fn compute_fast(
        &mut self,
        nodes: &[Tensor],
        res: &mut Residency,
        log: &[(usize, usize)],
    ) -> Result<()> {
        let t0 = Instant::now();
        let fast = self.fast.take().unwrap();
        let k = self.gpu_backend(0)?;
        let restored = std::mem::take(&mut self.restored);
        let note = |phases: &mut Option<super::Phases>, copies: &[Copy]| {
            if let Some(p) = phases.as_mut() {
                p.fast_walk_us += t0.elapsed().as_secs_f64() * 1e6;
                p.fast_copies += copies.len() as u64;
                p.fast_bytes += copies.iter().map(|c| c.len as u64).sum::<u64>();
                p.fast_restored += u64::from(restored);
            }
        };
        if restored {
            // Other graphs ran since this one last did: the map, not the log, says what
            // changed.
            let copies = Self::walk_for_replay(nodes, res);
            note(&mut self.phases, &copies);
            self.upload(res, k, &copies)?;
        } else {
            let mut copies = Vec::new();
            for &(p, len) in log {
                copies.extend(res.make_current(p, len, Place::Gpu));
            }
            note(&mut self.phases, &copies);
            self.upload(res, k, &copies)?;
            // Outputs over bytes the host wrote are the GPU's again once the graph runs.
            for &(p, len) in log {
                for &(o, ol) in &fast.outs {
                    let (x, y) = (o.max(p), (o + ol).min(p + len));
                    if x < y {
                        res.written(x, y - x, Place::Gpu);
                    }
                }
            }
        }
        if let Some(p) = self.phases.as_mut() {
            p.fast_upload_us += t0.elapsed().as_secs_f64() * 1e6;
        }
        self.pending[k] = true;
        // The GPU backend computed these very shadows last (unless another graph came between):
        // it replays its captured graph without comparing them again.
        if restored || !self.gpus[k].replay_last()? {
            let shadows: Vec<Tensor> = fast
                .ptrs
                .iter()
                .map(|&p| unsafe { Tensor::from_ptr(p as *const ggml_tensor) }.unwrap())
                .collect();
            let r = self.gpus[k].compute(&shadows);
            drop(shadows);
            r?;
        }
        if let Some(p) = self.phases.as_mut() {
            p.fast_launch_us += t0.elapsed().as_secs_f64() * 1e6;
        }
        let mut copies = Vec::new();
        for &(p, len) in &fast.sinks {
            res.written(p, len, Place::Gpu);
            copies.extend(res.make_current(p, len, Place::Cpu));
        }
        self.download(res, &copies)?;
        self.sync_gpus()?;
        if self.telemetry {
            let plan = self.last_plan.clone();
            self.record_segment(nodes, &plan, t0.elapsed().as_secs_f64() * 1e6);
        }
        self.fast = Some(fast);
        Ok(())
    }
}
