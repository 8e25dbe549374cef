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

    /// A replay's copies in (this one's, or a split graph's GPU segment's): made by the GPU
    /// backend's graph itself where every one is from page-locked memory (then a replayed token
    /// makes no driver call per input: ~5 µs each, ten a token of an 8B-class model), else
    /// queued one by one before it. Ok(true): made by the graph.
    pub(super) fn copy_in(
        &mut self,
        res: &mut Residency,
        k: usize,
        copies: &[Copy],
    ) -> Result<bool> {
        let pinned = copies.iter().all(|c| c.pinned && c.to == Place::Gpu);
        let prelude: Vec<(usize, usize, usize)> =
            copies.iter().map(|c| (c.dev, c.host, c.len)).collect();
        if !pinned || !self.in_graph_copies || !self.gpus[k].set_prelude(&prelude) {
            self.upload(res, k, copies)?;
            return Ok(false);
        }
        if self.telemetry && !copies.is_empty() {
            self.record_transfer(copies, 0.0, "to-GPU-in-graph");
        }
        Ok(true)
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
        let mut fast = self.fast.take().unwrap();
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
            self.copy_in(res, k, &copies)?;
        } else {
            let mut copies = Vec::new();
            for &(p, len) in log {
                copies.extend(res.make_current(p, len, Place::Gpu));
            }
            note(&mut self.phases, &copies);
            self.copy_in(res, k, &copies)?;
            // Outputs over bytes the host wrote are the GPU's again once the graph runs.
            for &(x, y) in fast.marks(log) {
                res.written(x, y - x, Place::Gpu);
            }
        }
        let t_queued = t0.elapsed().as_secs_f64() * 1e6;
        if let Some(p) = self.phases.as_mut() {
            p.fast_upload_us += t_queued;
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
        let t_launched = t0.elapsed().as_secs_f64() * 1e6;
        if let Some(p) = self.phases.as_mut() {
            p.fast_launch_us += t_launched;
        }
        let mut copies = Vec::new();
        for &(p, len) in &fast.sinks {
            res.written(p, len, Place::Gpu);
            copies.extend(res.make_current(p, len, Place::Cpu));
        }
        self.download(res, &copies)?;
        self.sync_gpus()?;
        if let Some(p) = self.phases.as_mut() {
            p.replays.push([
                p.same_us_last as f32,
                t_queued as f32,
                t_launched as f32,
                t0.elapsed().as_secs_f64() as f32 * 1e6,
            ]);
        }
        if self.telemetry {
            let plan = std::mem::take(&mut self.last_plan);
            self.record_segment(nodes, &plan, t0.elapsed().as_secs_f64() * 1e6);
            self.last_plan = plan;
        }
        self.fast = Some(fast);
        Ok(())
    }
}
