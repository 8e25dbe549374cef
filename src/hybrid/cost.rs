//! The cost model: how long a node takes on each device and how long moving bytes between host
//! and GPU takes, from numbers measured on this machine (calibration, in `calibrate`) and refined
//! online from measured node times.
//!
//! Formulas (µs; GB/s · 1e3 = bytes/µs, GFLOP/s · 1e3 = flop/µs):
//! - every computed node: `fixed(place) + work`; view ops cost nothing (a token 0.01 µs);
//! - matrix products (MUL_MAT, MUL_MAT_ID), weight `[K, M, ...]` of type class `c`, `N` columns
//!   per weight matrix (a weight broadcast over the activation's batch sees them all): `work = max(flops · s / g_c(N), bytes / bw)` with `flops = 2·K·M·N·batch`,
//!   `bytes` = weight bytes read + activations + output, `g_c(N)` the product throughput measured
//!   at N = 1, 16, 64 and a large batch and interpolated linearly in log N – log g (at N = 1 it is
//!   the weights' read bandwidth in flops, at large N the GEMM throughput; the power law between
//!   two points is exact for the max of a bandwidth and a compute bound), flat outside the
//!   measured range. A class without a measured curve (synthetic profiles, an unmeasured type)
//!   gets the two-bound curve `g(N) = min(N · 2·bw/bytes_per_weight, gflops)`. `s` scales a type
//!   that maps to a class of a different size (Q5_0 → Q4_1 class, Q2_K → Q4_K class) by its bytes
//!   per weight relative to the class's type, clamped to 0.5..2. MUL_MAT_ID reads only the experts
//!   used: the expected number of distinct experts among `n_used · tokens` picks of E (at least
//!   n_used, at most E), each of `n_used · tokens / distinct` columns;
//! - FLASH_ATTN_EXT: `work = max(4·D·n_q·n_kv·heads / fa_gflops, bytes / bw)`;
//! - everything else streams: `work = (bytes in + bytes out) / bw` (GET_ROWS and SET_ROWS count
//!   only the rows they touch);
//! - a transfer: `latency + bytes / rate` (rate by direction and pinned or pageable memory).
//!
//! `observe` keeps the last `CORR_WINDOW` values of ln(measured / predicted) (each ratio clamped
//! to 0.1..10) twice: per node shape (op, the node's and its sources' types and sizes) and per
//! (op, weight type class, place, size bucket); `compute_us` multiplies by the exponential of
//! their trimmed mean (a third of them off each end: one preempted run in a window moves
//! nothing), the shape's where it has one. The shape keeps two nodes of one bucket apart (a
//! token's KQ and KQV products: 7.7 and 5.5 µs, each predicted 20-30% off by their shared
//! bucket); the bucket (log4 of the batch for products and attention, log16 of the bytes for
//! streaming ops) carries a correction to shapes not seen yet and keeps a prompt's large
//! products from correcting a generated token's small ones.

use super::Place;
use crate::device::Device;
use crate::ggml_types::{op, GgmlType};
use crate::tensor::Tensor;
use std::collections::HashMap;

/// Weight types with their own measured product curve; every other type maps to the nearest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TypeClass {
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q6K,
    F16,
    F32,
}

impl TypeClass {
    /// In the order calibration measures them (most used first: a calibration cut short by its
    /// time budget loses the rarest).
    pub const ALL: [TypeClass; 7] = [
        TypeClass::Q4_0,
        TypeClass::Q8_0,
        TypeClass::F16,
        TypeClass::Q4K,
        TypeClass::Q6K,
        TypeClass::F32,
        TypeClass::Q4_1,
    ];

    pub fn of(t: GgmlType) -> TypeClass {
        use GgmlType::*;
        match t {
            Q4_0 | IQ4_NL | MXFP4 => TypeClass::Q4_0,
            // Dotted with Q8_0 as Q4_0, and no denser.
            NVFP4 | Q1_0 | Q2_0 => TypeClass::Q4_0,
            Q4_1 | Q5_0 | Q5_1 => TypeClass::Q4_1,
            Q8_0 | Q8_1 | Q8_K | I8 => TypeClass::Q8_0,
            Q2_K | Q3_K | Q4_K | Q5_K | IQ4_XS | TQ1_0 | TQ2_0 => TypeClass::Q4K,
            // Super-blocks dotted with Q8_K, as the K-quants.
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M => TypeClass::Q4K,
            Q6_K => TypeClass::Q6K,
            F16 | BF16 | I16 => TypeClass::F16,
            F32 | I32 | I64 | F64 => TypeClass::F32,
        }
    }

    /// The type calibration measures for the class.
    pub fn rep(self) -> GgmlType {
        match self {
            TypeClass::Q4_0 => GgmlType::Q4_0,
            TypeClass::Q4_1 => GgmlType::Q4_1,
            TypeClass::Q8_0 => GgmlType::Q8_0,
            TypeClass::Q4K => GgmlType::Q4_K,
            TypeClass::Q6K => GgmlType::Q6_K,
            TypeClass::F16 => GgmlType::F16,
            TypeClass::F32 => GgmlType::F32,
        }
    }

    pub fn name(self) -> &'static str {
        self.rep().name()
    }

    pub fn from_name(s: &str) -> Option<TypeClass> {
        TypeClass::ALL.into_iter().find(|c| c.name() == s)
    }

    fn index(self) -> u8 {
        self as u8
    }
}

fn bytes_per_weight(t: GgmlType) -> f64 {
    t.type_size() as f64 / t.block_size() as f64
}

/// Matrix-product throughput of one device and weight class against the batch: points
/// (N columns, GFLOP/s) with N ascending.
#[derive(Clone, Debug, PartialEq)]
pub struct MatCurve {
    pub class: TypeClass,
    pub points: Vec<(f64, f64)>,
}

impl MatCurve {
    /// GFLOP/s at `n` columns: linear in log N – log g between the points, flat outside.
    pub fn gflops_at(&self, n: f64) -> f64 {
        interp_loglog(&self.points, n)
    }
}

fn interp_loglog(points: &[(f64, f64)], n: f64) -> f64 {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return 0.0;
    };
    if n.is_nan() || n <= first.0 {
        return first.1;
    }
    if n >= last.0 {
        return last.1;
    }
    for w in points.windows(2) {
        let ((n0, g0), (n1, g1)) = (w[0], w[1]);
        if n <= n1 {
            if n1 <= n0 || g0 <= 0.0 || g1 <= 0.0 {
                return g1;
            }
            let f = (n.ln() - n0.ln()) / (n1.ln() - n0.ln());
            return (g0.ln() + f * (g1.ln() - g0.ln())).exp();
        }
    }
    last.1
}

/// What calibration measured (or a synthetic profile for tests).
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Fixed cost of one node, µs (CPU: thread wake-up; GPU: launch).
    pub cpu_node_us: f64,
    pub gpu_node_us: f64,
    /// Effective bandwidth of streaming ops (GB/s), and of weight reads in a
    /// matrix-vector product.
    pub cpu_bw_gbs: f64,
    pub gpu_bw_gbs: f64,
    /// Matrix-product throughput at large batches, GFLOP/s.
    pub cpu_gflops: f64,
    pub gpu_gflops: f64,
    /// Host to device and back, GB/s, from pinned and from pageable memory.
    pub h2d_pinned_gbs: f64,
    pub h2d_pageable_gbs: f64,
    pub d2h_gbs: f64,
    /// Latency of one transfer, µs.
    pub transfer_us: f64,
    /// What a change of place between consecutive nodes costs besides moving data, µs: a
    /// one-node graph on each device, launched and waited for (the GPU's stream synchronised
    /// before the CPU reads, the CPU's threads woken, the GPU launched again).
    pub switch_us: f64,
    /// What a graph of one node costs beyond the node on each device, µs (a GPU's launch and
    /// wait, a CPU's thread wake-up): taken off a node timed alone before it is compared with
    /// its prediction, which is of the node inside a graph.
    pub cpu_alone_us: f64,
    pub gpu_alone_us: f64,
    /// Device to pinned host memory, GB/s (`d2h_gbs` is to pageable memory).
    pub d2h_pinned_gbs: f64,
    /// FLASH_ATTN_EXT throughput at a prompt-sized batch, GFLOP/s.
    pub cpu_fa_gflops: f64,
    pub gpu_fa_gflops: f64,
    /// Measured product curves per weight class (a class absent uses `*_bw_gbs`/`*_gflops`).
    pub cpu_mm: Vec<MatCurve>,
    pub gpu_mm: Vec<MatCurve>,
    /// CPU threads the CPU numbers were measured with (the backend's default).
    pub cpu_threads: usize,
    /// How long calibration took, ms (0: not measured).
    pub calib_ms: f64,
}

impl Profile {
    /// A profile for tests: the given CPU and GPU bandwidths (GB/s) and PCIe rate; the rest
    /// derived from them.
    pub fn synthetic(cpu_bw_gbs: f64, gpu_bw_gbs: f64, pcie_gbs: f64) -> Profile {
        Profile {
            cpu_node_us: 2.0,
            gpu_node_us: 5.0,
            cpu_bw_gbs,
            gpu_bw_gbs,
            cpu_gflops: cpu_bw_gbs * 20.0,
            gpu_gflops: gpu_bw_gbs * 200.0,
            h2d_pinned_gbs: pcie_gbs,
            h2d_pageable_gbs: pcie_gbs / 3.0,
            d2h_gbs: pcie_gbs,
            transfer_us: 10.0,
            switch_us: 10.0,
            cpu_alone_us: 0.0,
            gpu_alone_us: 0.0,
            d2h_pinned_gbs: pcie_gbs,
            cpu_fa_gflops: cpu_bw_gbs * 10.0,
            gpu_fa_gflops: gpu_bw_gbs * 100.0,
            cpu_mm: Vec::new(),
            gpu_mm: Vec::new(),
            cpu_threads: 16,
            calib_ms: 0.0,
        }
    }

    /// Built-in numbers for ROCMFORGE_HYBRID_CALIBRATE=0 (no measuring): a desktop-class CPU
    /// (20 GB/s, 300 GFLOP/s, 3 µs per node) and a mid-range discrete GPU on PCIe 4 x16
    /// (900 GB/s, 40 TFLOP/s, 8 µs per launch, 20 GB/s pinned, 8 GB/s pageable). Without a GPU
    /// the GPU's compute numbers are 0 (any GPU placement then predicts as very slow).
    pub fn default_guess(gpu: bool) -> Profile {
        let g = if gpu { 1.0 } else { 0.0 };
        Profile {
            cpu_node_us: 3.0,
            gpu_node_us: 8.0,
            cpu_bw_gbs: 20.0,
            gpu_bw_gbs: 900.0 * g,
            cpu_gflops: 300.0,
            gpu_gflops: 40_000.0 * g,
            h2d_pinned_gbs: 20.0,
            h2d_pageable_gbs: 8.0,
            d2h_gbs: 8.0,
            transfer_us: 15.0,
            switch_us: 70.0,
            cpu_alone_us: 0.0,
            gpu_alone_us: 0.0,
            d2h_pinned_gbs: 20.0,
            cpu_fa_gflops: 150.0,
            gpu_fa_gflops: 20_000.0 * g,
            cpu_mm: Vec::new(),
            gpu_mm: Vec::new(),
            cpu_threads: crate::cpu::default_threads(),
            calib_ms: 0.0,
        }
    }

    fn side(&self, place: Place) -> Side<'_> {
        match place {
            Place::Cpu => Side {
                node_us: self.cpu_node_us,
                bw: self.cpu_bw_gbs,
                gflops: self.cpu_gflops,
                fa: self.cpu_fa_gflops,
                mm: &self.cpu_mm,
            },
            Place::Gpu => Side {
                node_us: self.gpu_node_us,
                bw: self.gpu_bw_gbs,
                gflops: self.gpu_gflops,
                fa: self.gpu_fa_gflops,
                mm: &self.gpu_mm,
            },
        }
    }

    /// What a graph of one node costs on `place` beyond the node, µs.
    pub fn alone_us(&self, place: Place) -> f64 {
        match place {
            Place::Cpu => self.cpu_alone_us,
            Place::Gpu => self.gpu_alone_us,
        }
    }

    /// Whether the products of `class` on `place` were measured.
    pub fn has_curve(&self, place: Place, class: TypeClass) -> bool {
        self.side(place)
            .mm
            .iter()
            .any(|c| c.class == class && !c.points.is_empty())
    }

    /// Product throughput (GFLOP/s) on `place` for weights of `class` at `n` columns.
    pub fn mm_gflops(&self, place: Place, class: TypeClass, n: f64) -> f64 {
        let s = self.side(place);
        let n = if n >= 1.0 { n } else { 1.0 };
        if let Some(c) =
            s.mm.iter()
                .find(|c| c.class == class && !c.points.is_empty())
        {
            return c.gflops_at(n);
        }
        // Bounds: reading the weights at the streaming bandwidth, computing at the large-batch rate.
        let g1 = 2.0 * s.bw / bytes_per_weight(class.rep());
        (n * g1).min(s.gflops)
    }
}

struct Side<'a> {
    node_us: f64,
    bw: f64,
    gflops: f64,
    fa: f64,
    mm: &'a [MatCurve],
}

/// A prediction for a node that is not finite (a broken profile): very slow, never chosen.
const UNUSABLE_US: f64 = 1e12;
/// What a view node (nothing to compute) costs, µs: positive, negligible.
const VIEW_US: f64 = 0.01;
/// Measurements a correction keeps: a node timed alone varies by up to 2x between graphs on a
/// busy host (an 8B attention output on 16 threads: 160 and 336 µs), and a correction from the
/// last few alone chased that noise (a token's CPU products 20-60% off after it).
const CORR_WINDOW: usize = 9;
/// Shortest wall time of a GPU node timed alone that corrects predictions, µs (device times
/// and the CPU's compute times count however short).
const OBSERVE_MIN_US: f64 = 20.0;

/// The work of one node, from its shape.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Work {
    View,
    /// A matrix product: flops, weight type scale, class, columns per weight matrix.
    Product {
        flops: f64,
        scale: f64,
        class: TypeClass,
        n: f64,
    },
    Attention {
        flops: f64,
        n_q: f64,
    },
    Stream,
}

/// Key of an online correction: op, weight class (255: none), place, size bucket.
type CorrKey = (i32, u8, Place, u8);
/// Key of a shape's correction: place and a hash of the op, types and sizes (`shape_hash`).
type ShapeKey = (Place, u64);

/// The last `CORR_WINDOW` values of ln(measured / predicted) of one kind of node.
#[derive(Clone, Copy, Default)]
struct Corr {
    recent: [f32; CORR_WINDOW],
    len: u8,
    next: u8,
}

impl Corr {
    fn push(&mut self, ln_ratio: f64) {
        self.recent[self.next as usize] = ln_ratio as f32;
        self.next = ((self.next as usize + 1) % CORR_WINDOW) as u8;
        self.len = (self.len as usize + 1).min(CORR_WINDOW) as u8;
    }

    /// exp of the mean of the values left when a third of them is taken off each end (the
    /// median of three). One value is taken as it is (a prompt's next layer is predicted from
    /// its first); of two, the median with no correction (0) as the third, so that one of two
    /// that disagree (a kernel loaded in the first launch) is not half of the correction.
    fn factor(&self) -> f64 {
        let n = self.len as usize;
        if n == 0 {
            return 1.0;
        }
        if n == 2 {
            let (a, b) = (
                self.recent[0].min(self.recent[1]),
                self.recent[0].max(self.recent[1]),
            );
            return f64::from(b.min(0.0).max(a)).exp();
        }
        let mut v = self.recent;
        let v = &mut v[..n];
        v.sort_by(f32::total_cmp);
        let cut = n / 3;
        let mid = &v[cut..n - cut];
        (mid.iter().map(|&x| f64::from(x)).sum::<f64>() / mid.len() as f64).exp()
    }
}

pub struct CostModel {
    pub profile: Profile,
    corr: HashMap<CorrKey, Corr>,
    shape: HashMap<ShapeKey, Corr>,
    /// Kinds of GPU node measured once already.
    seen_gpu: std::collections::HashSet<CorrKey>,
}

fn nbytes(t: Option<Tensor>) -> f64 {
    t.map_or(0.0, |t| t.nbytes() as f64)
}

fn nef(t: &Tensor) -> [f64; 4] {
    t.ne().map(|v| v as f64)
}

/// Expected distinct experts among `picks` of `e` (each token picks `n_used` distinct ones).
fn experts_touched(e: f64, n_used: f64, picks: f64) -> f64 {
    if picks <= 0.0 || e <= 0.0 {
        return 0.0;
    }
    let expected = e * (1.0 - (1.0 - 1.0 / e).powf(picks));
    expected.max(n_used.min(e)).min(e).min(picks)
}

/// Classifies `node` and counts the bytes it reads and writes.
fn work_of(node: &Tensor) -> (Work, f64) {
    let o = node.op();
    if op::is_view(o) {
        return (Work::View, 0.0);
    }
    let all_bytes = || {
        nbytes(Some(*node))
            + (0..crate::ffi::abi::GGML_MAX_SRC)
                .map(|i| nbytes(node.src(i)))
                .sum::<f64>()
    };
    match o {
        op::MUL_MAT | op::MUL_MAT_ID => {
            let Some(w) = node.src(0) else {
                return (Work::Stream, all_bytes());
            };
            let wty = w.ty().unwrap_or(GgmlType::F32);
            let class = TypeClass::of(wty);
            let scale = (bytes_per_weight(wty) / bytes_per_weight(class.rep())).clamp(0.5, 2.0);
            let [k, m, e, _] = nef(&w);
            let out = nef(node);
            let (flops, n, weight_bytes) = if o == op::MUL_MAT {
                let (n, batch) = match node.src(1) {
                    Some(x) => {
                        let xn = nef(&x);
                        (xn[1], xn[2] * xn[3])
                    }
                    None => (out[1], out[2] * out[3]),
                };
                // Columns per weight matrix: a 2-D weight broadcast over a 3-D activation sees
                // all of its columns (attention's K over grouped query heads: n_q · group).
                let mats = (w.ne()[2] * w.ne()[3]).max(1) as f64;
                let cols = n * (batch / mats).max(1.0);
                (2.0 * k * m * n * batch, cols, nbytes(Some(w)))
            } else {
                let (n_used, tokens) = match node.src(2) {
                    Some(ids) => {
                        let i = nef(&ids);
                        (i[0], i[1])
                    }
                    None => (out[1], out[2]),
                };
                let picks = n_used * tokens;
                let distinct = experts_touched(e, n_used, picks);
                let per_expert = match w.nb()[2] as f64 {
                    b if b > 0.0 => b,
                    _ => nbytes(Some(w)) / e.max(1.0),
                };
                let n = if distinct > 0.0 {
                    picks / distinct
                } else {
                    1.0
                };
                (2.0 * k * m * picks, n, distinct * per_expert)
            };
            let bytes = weight_bytes
                + (1..crate::ffi::abi::GGML_MAX_SRC)
                    .map(|i| nbytes(node.src(i)))
                    .sum::<f64>()
                + nbytes(Some(*node));
            (
                Work::Product {
                    flops,
                    scale,
                    class,
                    n,
                },
                bytes,
            )
        }
        op::FLASH_ATTN_EXT => {
            let (Some(q), Some(k), Some(v)) = (node.src(0), node.src(1), node.src(2)) else {
                return (Work::Stream, all_bytes());
            };
            let (qn, kn, vn) = (nef(&q), nef(&k), nef(&v));
            let heads = qn[2] * qn[3];
            let flops = 2.0 * qn[1] * kn[1] * heads * (qn[0] + vn[0]);
            (Work::Attention { flops, n_q: qn[1] }, all_bytes())
        }
        op::GET_ROWS => {
            // Only the rows picked are read from the table.
            let row = node.src(0).map_or(0.0, |t| t.nb()[1] as f64);
            let rows = node.nrows() as f64;
            let bytes = nbytes(Some(*node)) + nbytes(node.src(1)) + rows * row;
            (Work::Stream, bytes)
        }
        op::SET_ROWS => {
            // The node is the whole destination (a KV cache); only the rows written count.
            let rows = node.src(0).map_or(0.0, |s| s.nrows() as f64);
            let row = node.nb()[1] as f64;
            let bytes = nbytes(node.src(0)) + nbytes(node.src(1)) + rows * row;
            (Work::Stream, bytes)
        }
        _ => (Work::Stream, all_bytes()),
    }
}

/// The op, the node's type and sizes and its sources' (FNV-1a): nodes with one hash do the
/// same work.
fn shape_hash(node: &Tensor) -> u64 {
    fn mix(h: u64, x: u64) -> u64 {
        (h ^ x).wrapping_mul(0x0000_0100_0000_01b3)
    }
    fn tensor(h: u64, t: &Tensor) -> u64 {
        t.ne()
            .iter()
            .fold(mix(h, t.raw().type_ as u64), |h, &v| mix(h, v as u64))
    }
    let h = mix(tensor(0xcbf2_9ce4_8422_2325, node), node.op() as u64);
    (0..crate::ffi::abi::GGML_MAX_SRC).fold(h, |h, i| match node.src(i) {
        Some(t) => tensor(h, &t),
        None => mix(h, u64::MAX),
    })
}

/// log4 of a batch, log16 of a byte count (per KiB): the buckets of the online correction.
fn bucket(work: &Work, bytes: f64) -> u8 {
    let b = match *work {
        // Columns, and the weight's size: a node timed alone pays a fixed part that weighs more
        // on a small matrix (an 8B attention output beside its feed-forward products).
        Work::Product { n, .. } => {
            let cols = n.max(1.0).log(4.0).ceil().min(15.0);
            let size = (bytes / (1 << 20) as f64)
                .max(1.0)
                .log(4.0)
                .ceil()
                .min(15.0);
            return (cols * 16.0 + size) as u8;
        }
        Work::Attention { n_q, .. } => n_q.max(1.0).log(4.0).ceil(),
        Work::Stream => (bytes / 1024.0).max(1.0).log(16.0).ceil(),
        Work::View => 0.0,
    };
    b.clamp(0.0, 15.0) as u8
}

impl CostModel {
    pub fn new(profile: Profile) -> CostModel {
        CostModel {
            profile,
            corr: HashMap::new(),
            shape: HashMap::new(),
            seen_gpu: Default::default(),
        }
    }

    /// µs to compute `node` on `place` with its inputs already there.
    pub fn compute_us(&self, node: &Tensor, place: Place) -> f64 {
        let (work, bytes) = work_of(node);
        let base = self.predict(&work, bytes, place);
        sane(base * self.factor(node, &work, bytes, place))
    }

    /// The shape's correction, else its bucket's, else none.
    fn factor(&self, node: &Tensor, work: &Work, bytes: f64, place: Place) -> f64 {
        if *work == Work::View {
            return 1.0;
        }
        self.shape
            .get(&(place, shape_hash(node)))
            .or_else(|| self.corr.get(&self.key(node, work, bytes, place)))
            .map_or(1.0, Corr::factor)
    }

    /// The prediction before online corrections.
    pub fn base_us(&self, node: &Tensor, place: Place) -> f64 {
        let (work, bytes) = work_of(node);
        sane(self.predict(&work, bytes, place))
    }

    fn predict(&self, work: &Work, bytes: f64, place: Place) -> f64 {
        let s = self.profile.side(place);
        // bytes/µs and flop/µs, never 0 (a profile without a GPU predicts it as very slow).
        let bw = (s.bw * 1e3).max(1e-6);
        let stream = bytes / bw;
        let t = match *work {
            Work::View => return VIEW_US,
            Work::Stream => stream,
            Work::Product {
                flops,
                scale,
                class,
                n,
            } => {
                let g = (self.profile.mm_gflops(place, class, n) * 1e3).max(1e-6);
                // A measured curve already holds the weight reads (its one-column point reads
                // weights larger than the caches): a streaming ADD's bandwidth is no bound on it
                // (on the H200 host an ADD streams at 26 GB/s, a matrix-vector product reads
                // Q4_0 weights at 107 GB/s, and the bound made the CPU look 3x slower).
                if self.profile.has_curve(place, class) {
                    flops * scale / g
                } else {
                    (flops * scale / g).max(stream)
                }
            }
            Work::Attention { flops, .. } => {
                let g = (s.fa * 1e3).max(1e-6);
                (flops / g).max(stream)
            }
        };
        s.node_us + t
    }

    fn key(&self, node: &Tensor, work: &Work, bytes: f64, place: Place) -> CorrKey {
        let class = match *work {
            Work::Product { class, .. } => class.index(),
            _ => node.ty().map_or(255, |t| TypeClass::of(t).index()),
        };
        (node.op(), class, place, bucket(work, bytes))
    }

    /// µs to move `bytes` to `to` (from the other side); `pinned`: the host side is page-locked.
    pub fn transfer_us(&self, bytes: usize, to: Place, pinned: bool) -> f64 {
        if bytes == 0 {
            return 0.0;
        }
        let p = &self.profile;
        let gbs = match (to, pinned) {
            (Place::Gpu, true) => p.h2d_pinned_gbs,
            (Place::Gpu, false) => p.h2d_pageable_gbs,
            (Place::Cpu, true) => p.d2h_pinned_gbs,
            (Place::Cpu, false) => p.d2h_gbs,
        };
        sane(p.transfer_us.max(0.0) + bytes as f64 / (gbs * 1e3).max(1e-6))
    }

    /// A measured time for `node` on `place`: later predictions of its kind move towards it.
    /// False: not a measurement of the node (the first of its kind on the GPU, whose launch
    /// may load kernels: cuBLAS loads its own at their first use; 102 ms for an 8B prompt's
    /// first product on an H200), left out.
    pub fn observe(&mut self, node: &Tensor, place: Place, measured_us: f64) -> bool {
        self.observe_above(node, place, measured_us, OBSERVE_MIN_US)
    }

    /// `observe` for a node's compute alone: a GPU node's device time, measured by events
    /// around it alone in its stream, or the CPU backend's compute (no launch or wait in
    /// either), so short times count too (a CPU router's GLU measures 10-20 µs where 3.8 were
    /// predicted; corrected only from its slowest runs above 20 µs, it was predicted 29).
    pub fn observe_compute_time(&mut self, node: &Tensor, place: Place, measured_us: f64) -> bool {
        self.observe_above(node, place, measured_us, f64::MIN_POSITIVE)
    }

    fn observe_above(
        &mut self,
        node: &Tensor,
        place: Place,
        measured_us: f64,
        min_us: f64,
    ) -> bool {
        let (work, bytes) = work_of(node);
        if work == Work::View {
            return true;
        }
        let key = self.key(node, &work, bytes, place);
        if place == Place::Gpu && self.seen_gpu.insert(key) {
            return false;
        }
        // Below OBSERVE_MIN_US a node timed alone measures mostly its launch and wait: such
        // corrections made a GPU's small nodes look three times slower than in a stream and
        // took a token's attention off the GPU.
        if !(measured_us.is_finite() && measured_us >= min_us) {
            return true;
        }
        let base = self.predict(&work, bytes, place);
        if !(base.is_finite() && base > 0.0) {
            return true;
        }
        let r = (measured_us / base).clamp(0.1, 10.0).ln();
        self.corr.entry(key).or_default().push(r);
        self.shape
            .entry((place, shape_hash(node)))
            .or_default()
            .push(r);
        true
    }

    /// The online correction factor applied to `node` on `place` (1: none yet).
    pub fn correction(&self, node: &Tensor, place: Place) -> f64 {
        let (work, bytes) = work_of(node);
        self.factor(node, &work, bytes, place)
    }
}

fn sane(us: f64) -> f64 {
    if us.is_finite() && us > 0.0 {
        us.max(VIEW_US)
    } else if us.is_finite() {
        VIEW_US
    } else {
        UNUSABLE_US
    }
}

/// The profile of this machine: read from the cache beside the kernel cache when one was
/// measured for this CPU, GPU, driver and library version, else measured now (seconds, logged)
/// and cached (not when the machine was busy). ROCMFORGE_HYBRID_CALIBRATE: "cached" (default),
/// "force" (measure and store again), "0" (no measuring: `Profile::default_guess`). The cache
/// and the measurements: `calibrate`.
pub fn load_or_calibrate(cpu: &dyn Device, gpu: Option<&dyn Device>) -> Profile {
    super::calibrate::load_or_calibrate(cpu, gpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hybrid::synth::Synth;

    fn model() -> CostModel {
        CostModel::new(Profile::synthetic(50.0, 2000.0, 25.0))
    }

    /// MUL_MAT of a `ty` weight [k, m] by an F32 activation [k, n] (no data: the model only
    /// reads shapes).
    struct Mm {
        w: Synth,
        x: Synth,
    }

    impl Mm {
        fn new(ty: GgmlType, k: usize, m: usize, n: usize) -> Mm {
            Mm {
                w: Synth::new(ty, [k, m, 1, 1]),
                x: Synth::new(GgmlType::F32, [k, n, 1, 1]),
            }
        }
        fn node(&self) -> Synth {
            let mut d = Synth::new(
                GgmlType::F32,
                [self.w.t.ne[1] as usize, self.x.t.ne[1] as usize, 1, 1],
            );
            d.op(op::MUL_MAT).src(0, &self.w).src(1, &self.x);
            d
        }
    }

    fn mm_us(m: &CostModel, ty: GgmlType, n: usize, place: Place) -> f64 {
        let mm = Mm::new(ty, 4096, 4096, n);
        let d = mm.node();
        m.compute_us(&d.tensor(), place)
    }

    #[test]
    fn products_bandwidth_bound_at_one_column_compute_bound_at_512() {
        let m = model();
        let p = &m.profile;
        let (k, mm) = (4096.0, 4096.0);
        for (place, fixed, bw, gflops) in [
            (Place::Cpu, p.cpu_node_us, p.cpu_bw_gbs, p.cpu_gflops),
            (Place::Gpu, p.gpu_node_us, p.gpu_bw_gbs, p.gpu_gflops),
        ] {
            // N = 1: the bytes read (weights, activation, output) at the bandwidth.
            let bytes = k * mm * 18.0 / 32.0 + k * 4.0 + mm * 4.0;
            let t1 = mm_us(&m, GgmlType::Q4_0, 1, place);
            let want = fixed + bytes / (bw * 1e3);
            assert!(
                (t1 - want).abs() < 0.01 * want,
                "{place:?} N=1: {t1} vs {want}"
            );
            // Two columns read the same weights: barely more time.
            let t2 = mm_us(&m, GgmlType::Q4_0, 2, place);
            assert!(t2 < 1.01 * t1, "{place:?}: N=2 {t2} vs N=1 {t1}");
            // N = 512: the flops at the throughput, twice the time of N = 256.
            let t512 = mm_us(&m, GgmlType::Q4_0, 512, place);
            let want = fixed + 2.0 * k * mm * 512.0 / (gflops * 1e3);
            assert!(
                (t512 - want).abs() < 0.01 * want,
                "{place:?} N=512: {t512} vs {want}"
            );
            let t256 = mm_us(&m, GgmlType::Q4_0, 256, place);
            assert!((t512 - fixed) > 1.95 * (t256 - fixed), "{t512} {t256}");
        }
        // The GPU is faster at large batches (and here at N = 1 too).
        for n in [1, 64, 512] {
            assert!(
                mm_us(&m, GgmlType::Q4_0, n, Place::Gpu) < mm_us(&m, GgmlType::Q4_0, n, Place::Cpu)
            );
        }
        // Wider weights read more bytes.
        assert!(
            mm_us(&m, GgmlType::Q8_0, 1, Place::Cpu)
                > 1.5 * mm_us(&m, GgmlType::Q4_0, 1, Place::Cpu)
        );
    }

    #[test]
    fn broadcast_weights_see_every_column() {
        // A 2-D weight by a [K, 1, 8] activation is a product of 8 columns, not 8 of one:
        // it reads the weights once.
        let m = model();
        let w = Synth::new(GgmlType::Q4_0, [4096, 4096, 1, 1]);
        let x = Synth::new(GgmlType::F32, [4096, 1, 8, 1]);
        let mut d = Synth::new(GgmlType::F32, [4096, 1, 8, 1]);
        d.op(op::MUL_MAT).src(0, &w).src(1, &x);
        let t = m.compute_us(&d.tensor(), Place::Cpu);
        assert!(t < 1.1 * mm_us(&m, GgmlType::Q4_0, 8, Place::Cpu), "{t}");
        // Per-head matrices (a K cache of 8 heads by 8 query heads of 1 token each): one
        // column each, bandwidth-bound.
        let k = Synth::new(GgmlType::F16, [128, 4096, 8, 1]);
        let q = Synth::new(GgmlType::F32, [128, 1, 8, 1]);
        let mut kq = Synth::new(GgmlType::F32, [4096, 1, 8, 1]);
        kq.op(op::MUL_MAT).src(0, &k).src(1, &q);
        let t = m.compute_us(&kq.tensor(), Place::Cpu);
        let want = 2.0 + (128.0 * 4096.0 * 8.0 * 2.0 + 128.0 * 32.0 + 4096.0 * 32.0) / 50e3;
        assert!((t - want).abs() < 0.01 * want, "{t} vs {want}");
    }

    #[test]
    fn measured_curves_interpolate_in_log_space() {
        let c = MatCurve {
            class: TypeClass::Q4_0,
            points: vec![(1.0, 10.0), (16.0, 160.0), (256.0, 400.0)],
        };
        assert_eq!(c.gflops_at(1.0), 10.0);
        assert_eq!(c.gflops_at(0.5), 10.0);
        assert!((c.gflops_at(4.0) - 40.0).abs() < 1e-9);
        assert!((c.gflops_at(16.0) - 160.0).abs() < 1e-9);
        assert_eq!(c.gflops_at(1024.0), 400.0);
        let g64 = c.gflops_at(64.0);
        assert!(g64 > 160.0 && g64 < 400.0);
        // The model uses a measured curve instead of the bounds.
        let mut p = Profile::synthetic(50.0, 2000.0, 25.0);
        let before = p.mm_gflops(Place::Cpu, TypeClass::Q4_0, 4.0);
        p.cpu_mm.push(c);
        assert!((p.mm_gflops(Place::Cpu, TypeClass::Q4_0, 4.0) - 40.0).abs() < 1e-9);
        assert_ne!(before, 40.0);
        // Another class keeps the bounds.
        assert_eq!(
            p.mm_gflops(Place::Cpu, TypeClass::Q8_0, 4.0),
            Profile::synthetic(50.0, 2000.0, 25.0).mm_gflops(Place::Cpu, TypeClass::Q8_0, 4.0)
        );
    }

    #[test]
    fn mul_mat_id_reads_only_the_experts_used() {
        let m = model();
        let (k, f, e) = (2048, 768, 128);
        let w = Synth::new(GgmlType::Q4_0, [k, f, e, 1]);
        let node = |tokens: usize| {
            let x = Synth::new(GgmlType::F32, [k, 8, tokens, 1]);
            let ids = Synth::new(GgmlType::I32, [8, tokens, 1, 1]);
            let mut d = Synth::new(GgmlType::F32, [f, 8, tokens, 1]);
            d.op(op::MUL_MAT_ID).src(0, &w).src(1, &x).src(2, &ids);
            let t = m.compute_us(&d.tensor(), Place::Cpu);
            t
        };
        let expert = (k / 32 * 18 * f) as f64;
        let one = node(1);
        let want = 2.0 + 8.0 * expert / 50e3;
        assert!((one - want).abs() < 0.02 * want, "{one} vs {want}");
        // Many tokens touch every expert at most once: no more than all the weights, and
        // compute-bound at 512 tokens.
        let many = node(512);
        let flops = 2.0 * (k * f * 8 * 512) as f64;
        assert!(many >= flops / (m.profile.cpu_gflops * 1e3));
        assert!(node(4) < 4.0 * one);
    }

    #[test]
    fn attention_and_streaming_ops() {
        let m = model();
        let q = Synth::new(GgmlType::F32, [128, 512, 32, 1]);
        let k = Synth::new(GgmlType::F16, [128, 4096, 8, 1]);
        let v = Synth::new(GgmlType::F16, [128, 4096, 8, 1]);
        let mut d = Synth::new(GgmlType::F32, [128, 32, 512, 1]);
        d.op(op::FLASH_ATTN_EXT).src(0, &q).src(1, &k).src(2, &v);
        let flops = 4.0 * 128.0 * 512.0 * 4096.0 * 32.0;
        let t = m.compute_us(&d.tensor(), Place::Cpu);
        let want = 2.0 + flops / (m.profile.cpu_fa_gflops * 1e3);
        assert!((t - want).abs() < 0.01 * want, "{t} vs {want}");
        // An ADD streams its three operands.
        let a = Synth::new(GgmlType::F32, [1 << 20, 1, 1, 1]);
        let mut s = Synth::new(GgmlType::F32, [1 << 20, 1, 1, 1]);
        s.op(op::ADD).src(0, &a).src(1, &a);
        let t = m.compute_us(&s.tensor(), Place::Cpu);
        let want = 2.0 + 12.0 * (1 << 20) as f64 / 50e3;
        assert!((t - want).abs() < 1e-6 * want, "{t} vs {want}");
        // GET_ROWS of one row reads one row, not the table.
        let table = Synth::new(GgmlType::Q8_0, [2048, 49152, 1, 1]);
        let ids = Synth::new(GgmlType::I32, [1, 1, 1, 1]);
        let mut g = Synth::new(GgmlType::F32, [2048, 1, 1, 1]);
        g.op(op::GET_ROWS).src(0, &table).src(1, &ids);
        assert!(m.compute_us(&g.tensor(), Place::Cpu) < 2.5);
    }

    #[test]
    fn odd_nodes_predict_finite_positive() {
        let m = model();
        let none = CostModel::new(Profile::synthetic(50.0, 0.0, 0.0));
        let mut nodes = Vec::new();
        for o in [
            op::MUL_MAT,
            op::MUL_MAT_ID,
            op::FLASH_ATTN_EXT,
            op::ADD,
            op::GET_ROWS,
            op::SET_ROWS,
            op::VIEW,
            9999,
        ] {
            // No sources at all.
            let mut s = Synth::new(GgmlType::F32, [0, 3, 1, 1]);
            s.op(o);
            nodes.push(s);
        }
        // An unknown type, and empty sources.
        let mut u = Synth::new(GgmlType::F32, [4, 4, 1, 1]);
        u.t.type_ = 99;
        let empty = Synth::new(GgmlType::Q4_0, [0, 0, 0, 0]);
        for o in [op::MUL_MAT, op::MUL_MAT_ID, op::FLASH_ATTN_EXT] {
            let mut s = Synth::new(GgmlType::F32, [4, 0, 1, 1]);
            s.op(o).src(0, &u).src(1, &empty).src(2, &empty);
            nodes.push(s);
            let mut s = Synth::new(GgmlType::F32, [4, 0, 1, 1]);
            s.op(o).src(0, &empty).src(1, &u);
            nodes.push(s);
        }
        // Huge strides.
        let mut huge = Synth::new(GgmlType::F32, [3, 3, 3, 3]);
        huge.t.nb = [4, 1 << 62, 1 << 62, 1 << 62];
        let mut s = Synth::new(GgmlType::F32, [3, 3, 3, 3]);
        s.op(op::MUL_MAT).src(0, &huge).src(1, &huge);
        nodes.push(s);
        for s in &nodes {
            for model in [&m, &none] {
                for place in [Place::Cpu, Place::Gpu] {
                    let t = model.compute_us(&s.tensor(), place);
                    assert!(t.is_finite() && t > 0.0, "op {} {place:?}: {t}", s.t.op);
                }
            }
        }
    }

    #[test]
    fn transfers_grow_with_bytes_and_pinned_is_faster() {
        let m = model();
        for to in [Place::Gpu, Place::Cpu] {
            let mut last = 0.0;
            for b in [1usize, 4096, 1 << 20, 1 << 30] {
                let t = m.transfer_us(b, to, false);
                assert!(t > last && t.is_finite());
                last = t;
            }
        }
        assert!(
            m.transfer_us(1 << 26, Place::Gpu, true) < m.transfer_us(1 << 26, Place::Gpu, false)
        );
        assert_eq!(m.transfer_us(0, Place::Gpu, true), 0.0);
        // 1 GiB at 25 GB/s pinned: 43 ms.
        let t = m.transfer_us(1 << 30, Place::Gpu, true);
        assert!((t - 10.0 - (1u64 << 30) as f64 / 25e3).abs() < 1e-6);
    }

    #[test]
    fn observe_moves_predictions_towards_measurements() {
        let mut m = model();
        let small = Mm::new(GgmlType::Q4_0, 4096, 4096, 1);
        let large = Mm::new(GgmlType::Q4_0, 4096, 4096, 512);
        let (s, l) = (small.node(), large.node());
        let (s, l) = (s.tensor(), l.tensor());
        let p0 = m.compute_us(&s, Place::Cpu);
        let l0 = m.compute_us(&l, Place::Cpu);
        let g0 = m.compute_us(&s, Place::Gpu);
        let target = 3.0 * p0;
        let mut last = p0;
        for _ in 0..80 {
            m.observe(&s, Place::Cpu, target);
            let p = m.compute_us(&s, Place::Cpu);
            assert!(
                p > last - 1e-9 && p <= target * 1.0001,
                "{p} {last} {target}"
            );
            last = p;
        }
        assert!((last - target).abs() < 0.01 * target, "{last} vs {target}");
        // Other batches, places and ops keep their predictions.
        assert_eq!(m.compute_us(&l, Place::Cpu), l0);
        assert_eq!(m.compute_us(&s, Place::Gpu), g0);
        assert_eq!(m.base_us(&s, Place::Cpu), p0);
        // Ratios are clamped to 0.1..10; nonsense is ignored.
        for bad in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
            m.observe(&s, Place::Gpu, bad);
        }
        assert_eq!(m.compute_us(&s, Place::Gpu), g0);
        for _ in 0..100 {
            m.observe(&s, Place::Gpu, g0 * 1e6);
        }
        let c = m.correction(&s, Place::Gpu);
        assert!(c <= 10.0 + 1e-5 && c > 9.0, "{c}");
        // A node measured in a few microseconds (mostly a launch and a wait) corrects nothing.
        let tiny = Mm::new(GgmlType::Q4_0, 256, 64, 1);
        let t = tiny.node();
        let t = t.tensor();
        let t0 = m.compute_us(&t, Place::Gpu);
        for _ in 0..10 {
            m.observe(&t, Place::Gpu, OBSERVE_MIN_US * 0.9);
        }
        assert_eq!(m.compute_us(&t, Place::Gpu), t0);
    }

    fn close(a: f64, b: f64) -> bool {
        (a / b - 1.0).abs() < 1e-6
    }

    /// After one measurement the next node of the kind is predicted at what it measured (a
    /// prompt's 32 layers are right from the second); of two, the median of them and no
    /// correction counts; from three on, a third of the window off each end: one outlier in a
    /// window moves nothing, a majority moves it. Compute times count however short.
    #[test]
    fn the_first_measurements_set_the_correction() {
        let mut m = model();
        let mm = Mm::new(GgmlType::Q4_0, 4096, 14336, 512);
        let n = mm.node();
        let n = n.tensor();
        let c0 = m.compute_us(&n, Place::Cpu);
        assert!(m.observe(&n, Place::Cpu, 1.5 * c0));
        let c1 = m.compute_us(&n, Place::Cpu);
        assert!(close(c1, 1.5 * c0), "{c1} vs {}", 1.5 * c0);
        for _ in 0..20 {
            m.observe(&n, Place::Cpu, 1.5 * c0);
        }
        m.observe(&n, Place::Cpu, 100.0 * c0);
        assert!(close(m.compute_us(&n, Place::Cpu), 1.5 * c0));
        for _ in 0..4 {
            m.observe(&n, Place::Cpu, 3.0 * c0);
        }
        let c2 = m.compute_us(&n, Place::Cpu);
        assert!(c2 > 2.0 * c0 && c2 < 3.0 * c0, "{c2}");
        for _ in 0..CORR_WINDOW {
            m.observe(&n, Place::Cpu, 3.0 * c0);
        }
        assert!(close(m.compute_us(&n, Place::Cpu), 3.0 * c0));

        // Two: a first launch that loaded kernels (10x), then the node (1.5x).
        let other = Mm::new(GgmlType::Q4_0, 4096, 14336, 1);
        let o = other.node();
        let o = o.tensor();
        let o0 = m.compute_us(&o, Place::Cpu);
        m.observe(&o, Place::Cpu, 10.0 * o0);
        assert!(close(m.compute_us(&o, Place::Cpu), 10.0 * o0));
        m.observe(&o, Place::Cpu, 1.5 * o0);
        assert!(close(m.compute_us(&o, Place::Cpu), 1.5 * o0));

        let tiny = Mm::new(GgmlType::Q4_0, 256, 64, 1);
        let t = tiny.node();
        let t = t.tensor();
        let t0 = m.compute_us(&t, Place::Gpu);
        assert!(
            !m.observe_compute_time(&t, Place::Gpu, 2.0 * t0),
            "the first of a kind"
        );
        assert!(m.observe_compute_time(&t, Place::Gpu, 2.0 * t0));
        assert!(close(m.compute_us(&t, Place::Gpu), 2.0 * t0));
        // A CPU node's compute of a microsecond corrects too (a wall time that short does not).
        let c0 = m.compute_us(&t, Place::Cpu);
        assert!(m.observe_compute_time(&t, Place::Cpu, 3.0 * c0));
        assert!(close(m.compute_us(&t, Place::Cpu), 3.0 * c0));
    }

    /// Two shapes in one bucket keep their own corrections; a third shape of the bucket gets
    /// the bucket's.
    #[test]
    fn each_shape_keeps_its_correction() {
        let mut m = model();
        let (a, b, c) = (
            Mm::new(GgmlType::F16, 128, 256, 8),
            Mm::new(GgmlType::F16, 256, 128, 8),
            Mm::new(GgmlType::F16, 192, 192, 8),
        );
        let (a, b, c) = (a.node(), b.node(), c.node());
        let (a, b, c) = (a.tensor(), b.tensor(), c.tensor());
        let (w, x) = (GgmlType::F16, GgmlType::F32);
        let key = |n: &Tensor| {
            let (work, bytes) = work_of(n);
            m.key(n, &work, bytes, Place::Cpu)
        };
        assert!(
            key(&a) == key(&b) && key(&b) == key(&c),
            "{w:?} {x:?}: one bucket"
        );
        let (a0, b0, c0) = (
            m.compute_us(&a, Place::Cpu),
            m.compute_us(&b, Place::Cpu),
            m.compute_us(&c, Place::Cpu),
        );
        for _ in 0..4 {
            m.observe_compute_time(&a, Place::Cpu, 2.0 * a0);
            m.observe_compute_time(&b, Place::Cpu, 0.5 * b0);
        }
        assert!(close(m.compute_us(&a, Place::Cpu), 2.0 * a0));
        assert!(close(m.compute_us(&b, Place::Cpu), 0.5 * b0));
        let f = m.compute_us(&c, Place::Cpu) / c0;
        assert!((0.5..=2.0).contains(&f), "{f}");
    }

    /// The first GPU measurement of a kind (its launch may have loaded kernels) is left out;
    /// the next one counts. On the CPU the first counts.
    #[test]
    fn the_first_gpu_measurement_of_a_kind_is_left_out() {
        let mut m = model();
        let mm = Mm::new(GgmlType::Q4_0, 4096, 14336, 1);
        let n = mm.node();
        let n = n.tensor();
        let g0 = m.compute_us(&n, Place::Gpu);
        assert!(!m.observe(&n, Place::Gpu, 1000.0 * g0));
        assert_eq!(m.compute_us(&n, Place::Gpu), g0);
        assert!(m.observe(&n, Place::Gpu, 2.0 * g0));
        assert!(m.compute_us(&n, Place::Gpu) > g0 * 1.05);
        let c0 = m.compute_us(&n, Place::Cpu);
        assert!(m.observe(&n, Place::Cpu, 2.0 * c0));
        assert!(m.compute_us(&n, Place::Cpu) > c0 * 1.05);
    }
}
