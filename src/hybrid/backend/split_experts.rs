//! RFHYBRID, a token's experts shared between the CPU and the GPU.
//!
//! A token of a mixture-of-experts model whose experts stay in host memory runs its expert
//! products on the CPU (8 experts of 128 a layer: copying them all over would take longer than
//! the CPU takes to read them), while the GPU and its copy engine wait. Here the GPU takes the
//! last few slots of the chain (gate, up, GLU, down): once the CPU has the ids, those experts are copied into
//! the arena, packed (the GPU's weights are a shadow holding just them, its ids their places
//! there, -1 for the CPU's slots, which the kernels skip), and run on the GPU while the CPU runs
//! the other slots (its ids with -1 for the GPU's). The chain's result then has the GPU's
//! columns on the GPU and the CPU's on the host (the next GPU segment, on the same stream,
//! copies in only the CPU's). The CPU and the copy engine read host memory side by side; how
//! many slots the GPU takes is measured (`SplitTuner`).

use super::super::residency::{Copy, Residency, ARENA_ALIGN};
use super::super::scheduler::range;
use super::super::trial::median;
use super::super::Place;
use super::{HybridBackend, Uses, FLAG_OUTPUT};
use crate::device::{Error, Result};
use crate::ffi::abi::{ggml_tensor, GGML_MAX_SRC};
use crate::ggml_types::{op, GgmlType};
use crate::tensor::Tensor;

/// Widths `SplitTuner` runs against each other, and the order of its turns (each width early
/// and late, so a host drifting over the first tokens counts against all alike).
const TUNE_WIDTHS: [usize; 3] = [0, 2, 4];
const TUNE_ORDER: [usize; 6] = [0, 1, 2, 2, 1, 0];
/// A width kept for later processes beat every other by this (`SplitTuner::clear_win`).
const CLEAR_WIN: f64 = 0.97;
/// Measured graphs a turn (after one left out: a new width's first run captures its graphs).
const TUNE_RUNS: usize = 3;

/// The widest split `split_chain` admits: the knob, or the widest width tried.
fn max_width() -> usize {
    crate::tuning::get()
        .hybrid_split_experts
        .unwrap_or(TUNE_WIDTHS[TUNE_WIDTHS.len() - 1])
}

/// How many slots the GPU takes: the knob's, or measured. Whether sharing pays depends on how
/// the CPU's read rate compares with the PCIe link and on how much of the host's memory
/// bandwidth the CPU already takes: on the H200 machine's 16-core host, Qwen3-30B-A3B's shapes at
/// 1024 MiB, no width beat 0 at 16 threads (107-108 t/s against 101-113 for 2), while at 4
/// threads 4 slots gave 60 t/s against 47 for 0. So each width runs for a few tokens of the
/// first graph that has a chain to share (after the plan trial; none is shared before), and the
/// fastest median stays; a width other than 0 then has the graph planned and tried again.
#[derive(Default)]
pub(in crate::hybrid) struct SplitTuner {
    /// The turn running (an index into TUNE_ORDER) and its runs; None: not started.
    turn: Option<usize>,
    runs: usize,
    times: [Vec<f64>; TUNE_WIDTHS.len()],
    settled: Option<usize>,
}

impl SplitTuner {
    /// The width to run now.
    pub fn width(&self) -> usize {
        if let Some(w) = crate::tuning::get().hybrid_split_experts {
            return w;
        }
        match (self.settled, self.turn) {
            (Some(w), _) => w,
            (None, Some(t)) => TUNE_WIDTHS[TUNE_ORDER[t]],
            (None, None) => TUNE_WIDTHS[TUNE_ORDER[0]],
        }
    }

    /// A graph that shared chains at `width()` took `us`; Some(width) when that settled it.
    pub fn ran(&mut self, us: f64) -> Option<usize> {
        if self.settled.is_some() || crate::tuning::get().hybrid_split_experts.is_some() {
            return None;
        }
        let t = *self.turn.get_or_insert(0);
        self.runs += 1;
        if self.runs == 1 || !us.is_finite() {
            return None;
        }
        self.times[TUNE_ORDER[t]].push(us);
        if self.runs <= TUNE_RUNS {
            return None;
        }
        self.runs = 0;
        if t + 1 < TUNE_ORDER.len() {
            self.turn = Some(t + 1);
            return None;
        }
        let best = (0..TUNE_WIDTHS.len())
            .min_by(|&a, &b| median(&self.times[a]).total_cmp(&median(&self.times[b])))
            .unwrap_or(0);
        self.settled = Some(TUNE_WIDTHS[best]);
        self.settled
    }

    /// Whether the width is decided (measured here, or taken from an earlier process).
    pub fn settled(&self) -> bool {
        self.settled.is_some()
    }

    /// Takes the width an earlier process measured for this graph shape and thread count.
    pub fn settle(&mut self, width: usize) {
        self.settled = Some(width);
    }

    /// Whether the measured width won clearly: its median at least `CLEAR_WIN` below every
    /// other width's. Only such a width is kept for later processes: on the H200 host's MoE at 16
    /// threads one process measured 0, 2 and 4 slots at 10.3, 11.2 and 10.4 ms a token and kept
    /// 0, while fixed widths in turns ran 4 slots 10-15% faster in two rounds of three.
    pub fn clear_win(&self) -> bool {
        let Some(w) = self.settled else { return false };
        let m: Vec<f64> = self.times.iter().map(|t| median(t)).collect();
        let Some(best) = TUNE_WIDTHS.iter().position(|&x| x == w) else {
            return false;
        };
        m.iter()
            .enumerate()
            .all(|(i, &x)| i == best || m[best] <= CLEAR_WIN * x)
    }

    /// The medians measured per width (for the log).
    pub fn medians(&self) -> String {
        TUNE_WIDTHS
            .iter()
            .zip(&self.times)
            .map(|(w, t)| format!("{w}: {:.0} us", median(t)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The most tokens a split chain takes (a token, a few parallel sequences' or a draft's); larger
/// batches' expert products go where the plan puts them.
const SPLIT_MAX_TOKENS: usize = 16;

impl HybridBackend {
    /// The expert chain in CPU segment `seg` (nodes `a..` of the graph) that the GPU can share:
    /// its first and last index in `seg`. The chain: MUL_MAT_IDs of up to 16 tokens over the same ids
    /// and GLUs between them; weights in host memory only, whole experts of a multiple of the
    /// arena's alignment; each chain result but the last read only inside the chain; the GPU
    /// segment `next` after it streams no weight (the arena holds the GPU's experts).
    pub(super) fn split_chain(
        &mut self,
        seg: &[Tensor],
        a: usize,
        uses: &Uses,
        res: &Residency,
        next: Option<&[Tensor]>,
    ) -> Option<(usize, usize)> {
        let g = max_width();
        let gpu = self.shared.gpu?;
        // Settled at 0 (or fixed at 0): nothing to share or to measure, so nothing to look for.
        if g == 0
            || self.split.settled == Some(0)
            || self.time_device
            || self.time_copies
            || self.prefetched.is_some()
        {
            return None;
        }
        let f = seg.iter().position(|n| n.op() == op::MUL_MAT_ID)?;
        let l = seg.iter().rposition(|n| n.op() == op::MUL_MAT_ID)?;
        let chain = &seg[f..=l];
        let streams = |n: &Tensor| {
            (0..GGML_MAX_SRC).filter_map(|j| n.src(j)).any(|s| {
                super::super::usage(&s) == Some(super::super::USAGE_WEIGHTS)
                    && range(&s).is_some_and(|(p, len)| res.region_of(p, len).is_none())
            })
        };
        if next.is_some_and(|next| next.iter().any(streams)) {
            return None;
        }
        let ids = chain[0].src(2)?;
        let (ine, inb) = (ids.ne(), ids.nb());
        if chain.len() < 2
            || ids.dtype() != GgmlType::I32
            || ine[0] < 2
            || !(1..=SPLIT_MAX_TOKENS).contains(&ine[1])
            || ine[2..] != [1, 1]
            || inb[0] != 4
        {
            return None;
        }
        let end = a + l;
        let mut arena = 0;
        for (o, n) in chain.iter().enumerate() {
            match n.op() {
                op::MUL_MAT_ID => {
                    let (w, i) = (n.src(0)?, n.src(2)?);
                    let (p, len) = range(&w)?;
                    if i.data() != ids.data()
                        || i.ne() != ine
                        || w.ne()[3] != 1
                        || w.nb()[2] * w.ne()[2] != w.nbytes()
                        || !w.nb()[2].is_multiple_of(ARENA_ALIGN)
                        || res.region_of(p, len).is_some()
                        || n.dtype() != GgmlType::F32
                    {
                        return None;
                    }
                    arena += g * ine[1] * w.nb()[2];
                }
                op::GLU => {}
                _ => return None,
            }
            let last = o + 1 == chain.len();
            let k = a + f + o;
            if !last
                && (n.raw().flags & FLAG_OUTPUT != 0 || uses.last_use[k].is_none_or(|u| u > end))
            {
                return None;
            }
            if !gpu.supports_op(n) {
                return None;
            }
        }
        (arena <= res.arena_half_size() && res.dev_addr(range(&ids)?.0, ids.nbytes()).is_some())
            .then_some((f, l))
    }

    /// CPU segment `seg` with an expert chain at `f..=l` (`split_chain`): the nodes before it on
    /// the CPU, the chain on both (the GPU's part on stream `k`, the next GPU segment's), the
    /// nodes after it on the CPU (then the GPU segment `next`).
    pub(super) fn run_split(
        &mut self,
        seg: &[Tensor],
        (f, l): (usize, usize),
        res: &mut Residency,
        next: Option<&[Tensor]>,
        k: usize,
    ) -> Result<()> {
        self.split_seen = true;
        if self.split.width() == 0 {
            if let Some(r) = self.rec.as_mut() {
                r.chains = true;
            }
            return self.run_cpu(seg, res, next);
        }
        if let Some(r) = self.rec.as_mut() {
            r.ok = false;
        }
        let chain = &seg[f..=l];
        let inside = |t: &Tensor| chain.iter().any(|n| n.as_ptr() == t.as_ptr());
        // The chain's inputs from outside it, made current on the host with the nodes before it
        // (one wait), then on the GPU (its weights and ids aside).
        let (mut outside, mut to_gpu) = (Vec::new(), Vec::new());
        for n in chain {
            for (j, s) in (0..GGML_MAX_SRC).filter_map(|j| Some((j, n.src(j)?))) {
                if inside(&s) {
                    continue;
                }
                if !(n.op() == op::MUL_MAT_ID && (j == 0 || j == 2)) {
                    to_gpu.extend(range(&s));
                }
                outside.push(s);
            }
        }
        self.run_cpu_also(&seg[..f], &outside, res, None)?;
        self.run_chain(chain, res, to_gpu, k)?;
        if l + 1 < seg.len() {
            self.run_cpu(&seg[l + 1..], res, next)?;
        }
        Ok(())
    }

    fn run_chain(
        &mut self,
        chain: &[Tensor],
        res: &mut Residency,
        to_gpu: Vec<(usize, usize)>,
        k: usize,
    ) -> Result<()> {
        let mut copies = Vec::new();
        for (p, len) in to_gpu {
            copies.extend(res.make_current(p, len, Place::Gpu));
        }

        // The GPU's slots and their experts, packed in the arena in order of first use.
        let ids = chain[0].src(2).unwrap();
        let (n_used, n_tok) = (ids.ne()[0], ids.ne()[1]);
        // The CPU keeps one slot at least (a model using 2 experts a token shares 1).
        let g = self.split.width().min(n_used - 1);
        // SAFETY: RFHYBRID's buffers are host memory, and the ids are current there now.
        let all = unsafe { super::super::experts::read_ids(&ids) };
        // (slot, token) pairs of the GPU, as indices into the dense ids.
        let slots: Vec<usize> = (0..n_tok)
            .flat_map(|t| (n_used - g..n_used).map(move |u| u + t * n_used))
            .collect();
        let mut experts: Vec<i32> = Vec::new();
        self.split_ids = vec![-1; n_used * n_tok];
        for &u in &slots {
            let e = all[u];
            let local = match experts.iter().position(|&x| x == e) {
                Some(l) => l,
                None => {
                    experts.push(e);
                    experts.len() - 1
                }
            };
            self.split_ids[u] = local as i32;
        }
        res.reset_arena();
        let (mut keys, mut boxes) = (Vec::new(), Vec::new());
        for n in chain.iter().filter(|n| n.op() == op::MUL_MAT_ID) {
            let w = n.src(0).unwrap();
            if keys.contains(&(w.as_ptr() as usize)) {
                continue;
            }
            let (p, _) = range(&w).unwrap();
            let nb02 = w.nb()[2];
            let mut base = 0;
            for (l, &e) in experts.iter().enumerate() {
                let e = usize::try_from(e)
                    .ok()
                    .filter(|&e| e < w.ne()[2])
                    .ok_or_else(|| {
                        Error::Device(format!("RFHYBRID: expert id {e} out of range"))
                    })?;
                let at = p + e * nb02;
                if !res.add_stream_region(at, nb02) {
                    return Err(Error::Alloc(
                        "RFHYBRID: no arena room for split experts".into(),
                    ));
                }
                let d = res.dev_addr(at, nb02).unwrap();
                if l == 0 {
                    base = d;
                } else if d != base + l * nb02 {
                    return Err(Error::Device("RFHYBRID: split experts not packed".into()));
                }
                copies.extend(res.make_current(at, nb02, Place::Gpu));
            }
            let mut s = leaf_shadow(&w, base);
            s.ne[2] = experts.len() as i64;
            s.nb[3] = nb02 * experts.len();
            keys.push(w.as_ptr() as usize);
            boxes.push(s);
        }
        // The GPU's ids into the ids' device copy (which then no longer holds the host's).
        let (ip, ilen) = range(&ids).unwrap();
        let idev = res.dev_addr(ip, ilen).unwrap();
        copies.push(Copy {
            host: self.split_ids.as_ptr() as usize,
            dev: idev,
            len: n_used * n_tok * 4,
            to: Place::Gpu,
            pinned: false,
        });
        let mut s = leaf_shadow(&ids, idev);
        // Dense there (the host's may be a view with a longer row: argsort's output).
        s.nb[1] = n_used * 4;
        s.nb[2] = n_used * n_tok * 4;
        s.nb[3] = s.nb[2];
        keys.push(ids.as_ptr() as usize);
        boxes.push(s);
        crate::log_debug!(
            "RFHYBRID: '{}' experts split: {} of {} slots on the GPU",
            chain.last().unwrap().name(),
            g,
            n_used
        );

        self.upload(res, k, &copies)?;
        self.shadow_overrides = (keys, super::Shadows(boxes));
        let last = chain.last().unwrap().as_ptr();
        let r = self.launch(chain, res, k, &|n: &Tensor| n.as_ptr() == last);
        // Overrides a failed launch left are not for the next one.
        self.shadow_overrides.0.clear();
        self.shadow_overrides.1 .0.clear();
        r?;

        // The CPU's slots, with the GPU's ids at -1 in the host's ids meanwhile.
        let put = |v: &[i32]| {
            for (i, &x) in v.iter().enumerate() {
                let at = (i % n_used) * ids.nb()[0] + (i / n_used) * ids.nb()[1];
                // SAFETY: host memory of the ids ([n_used, n_tok] I32), current there.
                unsafe { std::ptr::write_unaligned(ids.data().add(at) as *mut i32, x) };
            }
        };
        let mut masked = all.clone();
        for &u in &slots {
            masked[u] = -1;
        }
        put(&masked);
        let r = self.cpu.compute(chain);
        put(&all);
        r?;

        // The chain's result: the GPU's columns there, the CPU's on the host (the next GPU
        // segment, on the same stream, copies in only the CPU's; a CPU node reading it would
        // copy out the GPU's). Its other results are the host's (nothing outside reads them).
        let out = chain.last().unwrap();
        let (op_, olen) = range(out).unwrap();
        for n in chain {
            if let Some((p, len)) = range(n) {
                res.written(p, len, Place::Cpu);
            }
        }
        res.written(op_, olen, Place::Gpu);
        for t in 0..n_tok {
            for u in 0..n_used - g {
                let at = op_ + u * out.nb()[1] + t * out.nb()[2];
                res.written(at, out.ne()[0] * 4, Place::Cpu);
            }
        }
        res.written(ip, ilen, Place::Cpu);
        // The streamed experts' half is free again once the launch has read it.
        res.reset_arena();
        self.arena_read_by(k)?;
        Ok(())
    }
}

/// A shadow of graph tensor `t` as a leaf at device address `data` (no view, no sources).
fn leaf_shadow(t: &Tensor, data: usize) -> Box<ggml_tensor> {
    // SAFETY: `t` is a tensor of the host's graph, alive for this compute.
    let mut s: Box<ggml_tensor> = Box::new(unsafe { std::ptr::read(t.as_ptr()) });
    s.data = data as *mut std::ffi::c_void;
    s.view_src = std::ptr::null_mut();
    s.extra = std::ptr::null_mut();
    s.src = [std::ptr::null_mut(); GGML_MAX_SRC];
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each width runs its turns in TUNE_ORDER (the first run of a turn left out), and the
    /// width with the lowest median stays.
    #[test]
    fn the_fastest_width_stays() {
        if crate::tuning::get().hybrid_split_experts.is_some() {
            return; // a fixed width set for this process: nothing is measured
        }
        let us = |w: usize| match w {
            0 => 1000.0,
            2 => 800.0,
            _ => 900.0,
        };
        let mut t = SplitTuner::default();
        let mut seen = Vec::new();
        let mut settled = None;
        for _ in 0..TUNE_ORDER.len() * (TUNE_RUNS + 1) {
            let w = t.width();
            seen.push(w);
            // A left-out run is slow: it must not count.
            let first = seen.len() % (TUNE_RUNS + 1) == 1;
            settled = t.ran(if first { 1e9 } else { us(w) });
        }
        assert_eq!(settled, Some(2));
        assert_eq!(t.width(), 2);
        let turns: Vec<usize> = seen.chunks(TUNE_RUNS + 1).map(|c| c[0]).collect();
        assert_eq!(turns, TUNE_ORDER.map(|i| TUNE_WIDTHS[i]));
        assert!(seen
            .chunks(TUNE_RUNS + 1)
            .all(|c| c.iter().all(|&w| w == c[0])));
        // Settled: no more measuring.
        assert_eq!(t.ran(1.0), None);
        assert_eq!(t.width(), 2);
        assert!(t.clear_win());
    }

    /// A width within 3% of another is kept by this process but is no clear win (not kept for
    /// later ones); a width taken from an earlier process is none either.
    #[test]
    fn a_near_tie_is_no_clear_win() {
        if crate::tuning::get().hybrid_split_experts.is_some() {
            return;
        }
        let mut t = SplitTuner::default();
        let mut settled = None;
        while settled.is_none() {
            let us = match t.width() {
                0 => 1000.0,
                2 => 1100.0,
                _ => 1010.0,
            };
            settled = t.ran(us);
        }
        assert_eq!(settled, Some(0));
        assert!(!t.clear_win());
        let mut u = SplitTuner::default();
        u.settle(4);
        assert_eq!(u.width(), 4);
        assert!(!u.clear_win());
    }
}
