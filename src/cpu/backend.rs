//! The RFCPU backend (stream): plans scratch memory for a graph and runs it on the pool.

use super::ops::{self, Ctx};
use super::pool::{Padded, ThreadPool, Worker};
use super::profile::Profile;
use crate::device::{Backend, Error, Result};
use crate::tensor::Tensor;
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct CpuBackend {
    n_threads: usize,
    pool: ThreadPool,
    /// Scratch shared by the threads of a graph; grows, never shrinks.
    work: Vec<u64>,
    /// ROCMFORGE_CPU_PROFILE=1: node times, printed when the backend is freed.
    profile: Option<Box<Profile>>,
    /// Work counters of `Ctx::chunks`, step k using `counters[k % 2]` while thread 0 resets the
    /// other for step k + 1 (no thread reads it between the barriers around step k).
    counters: Counters,
    /// ROCMFORGE_CPU_FUSE: nodes run as one step where `ops::fused_len` finds them.
    fuse: bool,
}

#[derive(Default)]
struct Counters([Padded<AtomicUsize>; 2]);

impl CpuBackend {
    /// Err when the worker threads cannot be started.
    pub fn new(n_threads: usize) -> Result<CpuBackend> {
        let pool = ThreadPool::new(n_threads).map_err(Error::Device)?;
        Ok(CpuBackend {
            n_threads: pool.max_threads(),
            pool,
            work: Vec::new(),
            profile: crate::tuning::get().cpu_profile.then(Box::default),
            counters: Counters::default(),
            fuse: crate::tuning::get().cpu_fuse,
        })
    }

    /// Fused steps on or off for this backend (A/B benches in one process).
    #[cfg(test)]
    pub fn set_fuse(&mut self, on: bool) {
        self.fuse = on;
    }
}

/// Graphs with less work than this (elements written, see `threads_for`) run on the calling
/// thread alone: waking the workers costs more than they save. A GPU host's per-token CPU graph
/// is of this kind (the embedding lookup of one token: one GET_ROWS of one row).
/// ROCMFORGE_CPU_SMALL_GRAPH=N sets the bound (0: every graph uses every thread; test_ops sets
/// that so its small cases still test the kernels' work split).
static SMALL_GRAPH_ELEMENTS: once_cell::sync::Lazy<usize> =
    once_cell::sync::Lazy::new(|| crate::tuning::get().cpu_small_graph.unwrap_or(1 << 15));

/// How many threads a graph gets: all of them, unless it is small. Matrix products and
/// attention count as large whatever their output (their work is not in their output size).
fn threads_for(nodes: &[Tensor], n_threads: usize) -> usize {
    use crate::ggml_types::op;
    let mut work = 0usize;
    for n in nodes {
        if matches!(n.op(), op::MUL_MAT | op::MUL_MAT_ID | op::FLASH_ATTN_EXT) {
            return n_threads;
        }
        work = work.saturating_add(n.nelements());
    }
    if work < *SMALL_GRAPH_ELEMENTS {
        1
    } else {
        n_threads
    }
}

struct SendPtr(*mut u8);
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(&self) -> *mut u8 {
        self.0
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        if let Some(p) = self.profile.as_ref().filter(|p| p.graphs() > 0) {
            // On stderr, not through the host's logger (which may be quiet): it was asked for.
            eprint!("{}", p.report());
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &CStr {
        c"RFCPU"
    }

    fn compute(&mut self, nodes: &[Tensor]) -> Result<()> {
        let nth = threads_for(nodes, self.n_threads);
        let wsize = nodes
            .iter()
            .map(|n| ops::work_size(n, nth))
            .max()
            .unwrap_or(0);
        let words = wsize.div_ceil(8) + 8;
        if self.work.len() < words {
            self.work = Vec::new();
            self.work
                .try_reserve_exact(words)
                .map_err(|_| Error::Alloc(format!("scratch of {wsize} bytes")))?;
            self.work.resize(words, 0);
        }
        let wdata = SendPtr(self.work.as_mut_ptr() as *mut u8);
        if let Some(p) = self.profile.as_mut() {
            p.start(nodes.len(), nth);
        }
        let prof = self.profile.as_deref();
        let counters = &self.counters.0;
        counters[0].store(0, Relaxed);
        // Steps: a node, or several run as one (`ops::fused_len`): (first node, node count).
        let steps: Vec<(usize, usize)> = {
            let mut v = Vec::with_capacity(nodes.len());
            let mut k = 0;
            while k < nodes.len() {
                let len = if self.fuse {
                    ops::fused_len(nodes, k)
                } else {
                    1
                };
                v.push((k, len));
                k += len;
            }
            v
        };
        let job = |w: &Worker| {
            if let (Some(p), 0) = (prof, w.ith) {
                p.stamp(0);
            }
            for (si, &(k, len)) in steps.iter().enumerate() {
                if w.ith == 0 {
                    counters[(si + 1) % 2].store(0, Relaxed);
                }
                let ctx = Ctx {
                    ith: w.ith,
                    nth: w.nth,
                    worker: w,
                    wdata: wdata.get(),
                    wsize,
                    next: &counters[si % 2],
                };
                let t0 = prof.map(|p| p.now());
                ops::compute_step(&nodes[k..k + len], &ctx);
                if let (Some(p), Some(t0)) = (prof, t0) {
                    // A fused step's time counts for its first node.
                    p.computed(k, w.ith, t0);
                    for j in k + 1..k + len {
                        p.computed(j, w.ith, p.now());
                    }
                }
                if !w.sync() {
                    return;
                }
                if let (Some(p), 0) = (prof, w.ith) {
                    for j in k..k + len {
                        p.stamp(j + 1);
                    }
                }
            }
        };
        let done = self.pool.run(nth, &job).map_err(Error::Device);
        if let (Some(p), Ok(())) = (self.profile.as_mut(), &done) {
            p.finish(nodes);
        }
        done
    }

    fn wake(&mut self) {
        // An empty job on every thread: the workers then spin a while before they sleep again.
        if let Err(e) = self.pool.run(self.n_threads, &|_: &Worker| {}) {
            crate::log_warn!("RFCPU: waking the workers: {e}");
        }
    }

    fn set_n_threads(&mut self, n: usize) {
        let cap = super::pool::thread_cap();
        if n > cap {
            crate::log_warn!("RFCPU: set_n_threads({n}): using {cap} threads (the cap)");
        }
        let n = n.clamp(1, cap);
        if n > self.pool.max_threads() {
            // If the new pool cannot start, the backend keeps the old one.
            match ThreadPool::new(n) {
                Ok(p) => self.pool = p,
                Err(e) => crate::log_error!(
                    "RFCPU: set_n_threads({n}): {e}; keeping {} threads",
                    self.pool.max_threads()
                ),
            }
        }
        self.n_threads = n.min(self.pool.max_threads());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wake` runs an empty job on every worker and leaves the pool usable, also when asked for
    /// more threads than there are cores.
    #[test]
    fn wake_leaves_the_pool_usable() {
        for n in [1, 3, 8] {
            let mut be = CpuBackend::new(n).unwrap();
            for _ in 0..50 {
                be.wake();
            }
            be.compute(&[]).unwrap();
        }
    }
}
