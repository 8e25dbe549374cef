//! MUL_MAT_ID (mixture of experts): for token t and slot e, expert x = ids[e, t] and
//! dst[:, e, t] = src0[:, :, x] · src1[:, e % ne11, t]. src0 [K, M, n_expert] in any type with
//! CPU kernels; src1 F32, F16 or BF16 [K, ne11 (n_used or 1), n_tokens]; ids I32 [n_used, n_tokens];
//! dst F32 [M, n_used, n_tokens]. src1 is first converted to the weight type's dot type;
//! work is spread as (expert, block of weight rows) tasks so each expert's rows stay hot.

use super::Ctx;
use crate::cpu::types::traits;
use crate::ggml_types::{glu, op, GgmlType};
use crate::tensor::{split_range, Tensor};

const ROWS_PER_TASK: usize = 16;

pub fn supports(node: &Tensor) -> bool {
    let (Some(w), Some(x), Some(ids)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let Some(tr) = traits(w.dtype()) else {
        return false;
    };
    if tr.vec_dot.is_none()
        || (tr.vec_dot_type != GgmlType::F32
            && traits(tr.vec_dot_type).and_then(|t| t.from_f32).is_none())
    {
        return false;
    }
    let (wne, xne, ine, dne) = (w.ne(), x.ne(), ids.ne(), node.ne());
    matches!(x.dtype(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        && node.dtype() == GgmlType::F32
        && ids.dtype() == GgmlType::I32
        && wne[3] == 1
        && xne[3] == 1
        && wne[0] == xne[0]
        && wne[0] % w.dtype().block_size() == 0
        && ine[2] == 1
        && ine[1] == xne[2]
        && xne[1] > 0
        && ine[0] % xne[1] == 0
        && dne == [wne[1], ine[0], ine[1], 1]
        && w.has_dense_rows()
        && x.has_dense_rows()
        && node.has_dense_rows()
}

fn dot_row_size(node: &Tensor) -> usize {
    let w = node.src(0).unwrap();
    traits(w.dtype()).unwrap().vec_dot_type.row_size(w.ne()[0])
}

pub fn work_size(node: &Tensor, _nth: usize) -> usize {
    let x = node.src(1).unwrap();
    let xne = x.ne();
    dot_row_size(node) * xne[1] * xne[2] + 64
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let Some(routed) = prepare(node, ctx) else {
        return;
    };
    let p = Product::new(node);
    let m = p.w.ne()[1];
    let row_blocks = m.div_ceil(ROWS_PER_TASK);
    for task in ctx.chunks(routed.groups.len() * row_blocks) {
        let ((ex, a, b), rb) = (routed.groups[task / row_blocks], task % row_blocks);
        let rows = rb * ROWS_PER_TASK..((rb + 1) * ROWS_PER_TASK).min(m);
        for &(_, e, t) in &routed.slots[a..b] {
            p.rows(ctx, ex, rows.clone(), e, t);
        }
    }
}

/// The slots (expert, used index, token) a batch routes to an expert, sorted by expert, and
/// their groups (expert, first slot, end).
struct Routed {
    slots: Vec<(usize, usize, usize)>,
    groups: Vec<(usize, usize, usize)>,
}

/// src1 converted into the scratch by all threads (then a barrier), and the batch's routing.
/// None when a thread failed at the barrier.
fn prepare(node: &Tensor, ctx: &Ctx) -> Option<Routed> {
    let (w, x, ids) = (
        node.src(0).unwrap(),
        node.src(1).unwrap(),
        node.src(2).unwrap(),
    );
    let tr = traits(w.dtype()).unwrap();
    let (wne, xne, ine) = (w.ne(), x.ne(), ids.ne());
    let xrow = dot_row_size(node);

    // src1 in the dot type, every column, laid out densely in the scratch (F16/BF16 widened
    // to F32 first, as MUL_MAT does).
    let mut tmp = Vec::new();
    for r in split_range(xne[1] * xne[2], ctx.ith, ctx.nth) {
        let (i1, i2) = (r % xne[1], r / xne[1]);
        unsafe {
            super::mul_mat::convert_row(
                x.dtype(),
                x.data().add(x.row_offset(i1, i2, 0)),
                wne[0],
                tr.vec_dot_type,
                ctx.wdata.add(r * xrow),
                &mut tmp,
            );
        }
    }
    if !ctx.sync() {
        return None;
    }

    let n_expert = wne[2];
    let (n_used, n_tok) = (ine[0], ine[1]);
    // The slots routed to an expert, grouped by expert: the tasks are the used experts' row
    // blocks only. Splitting every expert's blocks among the threads left most threads without
    // work when a token uses 8 of 128 experts (RFCPU generated a Qwen3-30B-A3B-shaped MoE at a
    // third of ggml-cpu's speed on 16 threads).
    let mut slots: Vec<(usize, usize, usize)> = Vec::with_capacity(n_tok * n_used);
    for t in 0..n_tok {
        for e in 0..n_used {
            let id = unsafe { *(ids.data().add(ids.offset(e, t, 0, 0)) as *const i32) };
            if id >= 0 && (id as usize) < n_expert {
                slots.push((id as usize, e, t));
            }
        }
    }
    slots.sort_unstable();
    let mut groups: Vec<(usize, usize, usize)> = Vec::new();
    for (i, &(ex, _, _)) in slots.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if g.0 == ex => g.2 = i + 1,
            _ => groups.push((ex, i, i + 1)),
        }
    }
    Some(Routed { slots, groups })
}

/// A MUL_MAT_ID node's kernels and strides, looked up once per node (not per task).
struct Product<'a> {
    node: &'a Tensor<'a>,
    w: Tensor<'a>,
    vec_dot: crate::cpu::types::VecDot,
    tile: Option<crate::cpu::types::Tile>,
    k: usize,
    ne11: usize,
    xrow: usize,
    wrow: usize,
}

impl<'a> Product<'a> {
    fn new(node: &'a Tensor<'a>) -> Product<'a> {
        let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
        let tr = traits(w.dtype()).unwrap();
        Product {
            node,
            vec_dot: tr.vec_dot.unwrap(),
            // Whole row groups through the one-column register tile MUL_MAT generates with (it
            // prefetches the next rows; the same bits as `vec_dot`), the rest one dot at a
            // time. One dot per row read the experts at half the host's bandwidth.
            tile: tr.gemv.filter(|t| t.cols == 1),
            k: w.ne()[0],
            ne11: x.ne()[1],
            xrow: dot_row_size(node),
            wrow: w.nb()[1],
            w,
        }
    }

    /// Rows `rows` of expert `ex`'s product with slot (e, t)'s column (in the scratch).
    fn rows(&self, ctx: &Ctx, ex: usize, rows: std::ops::Range<usize>, e: usize, t: usize) {
        let (w, node, k) = (&self.w, self.node, self.k);
        let col = (e % self.ne11) + t * self.ne11;
        let xp = unsafe { ctx.wdata.add(col * self.xrow) };
        let mut i = rows.start;
        if let Some(tl) = self.tile {
            while i + tl.rows <= rows.end {
                unsafe {
                    let wp = w.data().add(w.row_offset(i, ex, 0));
                    let dp = node.data().add(node.offset(i, e, t, 0));
                    (tl.dot)(k, wp, self.wrow, xp, self.xrow, dp, 0);
                }
                i += tl.rows;
            }
        }
        for i in i..rows.end {
            unsafe {
                let wp = w.data().add(w.row_offset(i, ex, 0));
                *(node.data().add(node.offset(i, e, t, 0)) as *mut f32) = (self.vec_dot)(k, wp, xp);
            }
        }
    }
}

/// Whether nodes [k, k+1, k+2] are a mixture of experts' gate and up products (either order)
/// and their SWIGLU, which `compute_gate_up_glu` runs as one step: both products read the
/// same activations through the same ids, weights of one type and shape; the GLU's result
/// lies apart from both products or exactly over one (ggml's allocator may reuse it).
pub fn gate_up_glu(nodes: &[Tensor], k: usize) -> bool {
    let [a, b, g] = match nodes.get(k..k + 3) {
        Some([a, b, g]) => [a, b, g],
        _ => return false,
    };
    if a.op() != op::MUL_MAT_ID
        || b.op() != op::MUL_MAT_ID
        || g.op() != op::GLU
        || g.param_i32(0) != glu::SWIGLU
        || g.param_i32(1) != 0
        || g.dtype() != GgmlType::F32
    {
        return false;
    }
    let (Some(gate), Some(up)) = (g.src(0), g.src(1)) else {
        return false;
    };
    let same = |p: &Tensor, q: &Tensor| p.as_ptr() == q.as_ptr();
    if !((same(&gate, a) && same(&up, b)) || (same(&gate, b) && same(&up, a))) {
        return false;
    }
    let (wa, wb) = (a.src(0).unwrap(), b.src(0).unwrap());
    let same_input = |j: usize| match (a.src(j), b.src(j)) {
        (Some(p), Some(q)) => same(&p, &q),
        _ => false,
    };
    let dense = |t: &Tensor| t.is_contiguous_from(0);
    let apart_or_over = |t: &Tensor| {
        let (p, q) = (g.data() as usize, t.data() as usize);
        p == q || p + g.nbytes() <= q || q + t.nbytes() <= p
    };
    supports(a)
        && supports(b)
        && super::glu::supports(g)
        && same_input(1)
        && same_input(2)
        && wa.dtype() == wb.dtype()
        && wa.ne() == wb.ne()
        && wa.nb() == wb.nb()
        && a.ne() == g.ne()
        && dense(a)
        && dense(b)
        && dense(g)
        && apart_or_over(a)
        && apart_or_over(b)
}

/// Nodes [gate, up, glu] (as `gate_up_glu` found them, in graph order) in one pass: each
/// task computes a row block of both products for its expert's slots, then their SWIGLU,
/// the same bits as the three nodes one by one (`silu_row` works element by element in
/// groups of 8 from the row's start; the blocks start at multiples of 16). One conversion of
/// the activations, one barrier and one pass over the ids instead of two, no GLU node; the
/// products still write their results (a later node may read them).
pub fn compute_gate_up_glu(nodes: &[Tensor], ctx: &Ctx) {
    let (a, b, g) = (&nodes[0], &nodes[1], &nodes[2]);
    let gate_first = g.src(0).is_some_and(|s| s.as_ptr() == a.as_ptr());
    let (gate, up) = if gate_first { (a, b) } else { (b, a) };
    // Both products read the same activations in the same dot type: one conversion.
    let Some(routed) = prepare(gate, ctx) else {
        return;
    };
    let (pg, pu) = (Product::new(gate), Product::new(up));
    let m = pg.w.ne()[1];
    let row_blocks = m.div_ceil(ROWS_PER_TASK);
    for task in ctx.chunks(routed.groups.len() * row_blocks) {
        let ((ex, s0, s1), rb) = (routed.groups[task / row_blocks], task % row_blocks);
        let rows = rb * ROWS_PER_TASK..((rb + 1) * ROWS_PER_TASK).min(m);
        let n = rows.len();
        for &(_, e, t) in &routed.slots[s0..s1] {
            pg.rows(ctx, ex, rows.clone(), e, t);
            pu.rows(ctx, ex, rows.clone(), e, t);
            // Through a stack copy: the GLU's result may lie over a product's.
            let mut out = [0f32; ROWS_PER_TASK];
            unsafe {
                let x = std::slice::from_raw_parts(
                    gate.data().add(gate.offset(rows.start, e, t, 0)) as *const f32,
                    n,
                );
                let u = std::slice::from_raw_parts(
                    up.data().add(up.offset(rows.start, e, t, 0)) as *const f32,
                    n,
                );
                crate::cpu::simd::silu_row(x, Some(u), &mut out[..n]);
                let d = g.data().add(g.offset(rows.start, e, t, 0)) as *mut f32;
                std::ptr::copy_nonoverlapping(out.as_ptr(), d, n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    #[test]
    fn mul_mat_id_matches_reference() {
        let (k, m, n_exp, n_used, n_tok) = (32, 5, 4, 2, 3);
        for wt in [GgmlType::F32, GgmlType::F16] {
            for x_shared in [false, true] {
                for nth in [1, 3] {
                    let mut w = TT::new(wt, [k, m, n_exp, 1]);
                    w.set(&rand_vec(k * m * n_exp, 1, -1.0, 1.0));
                    let ne11 = if x_shared { 1 } else { n_used };
                    let mut x = TT::new(GgmlType::F32, [k, ne11, n_tok, 1]);
                    x.set(&rand_vec(k * ne11 * n_tok, 2, -1.0, 1.0));
                    let idv = [3.0, 0.0, 1.0, 3.0, 2.0, 2.0];
                    let mut ids = TT::new(GgmlType::I32, [n_used, n_tok, 1, 1]);
                    ids.set(&idv);
                    let mut d = TT::new(GgmlType::F32, [m, n_used, n_tok, 1]);
                    d.op(op::MUL_MAT_ID).src(0, &w).src(1, &x).src(2, &ids);
                    run(&d, nth);
                    let (wv, mut xv) = (w.get(), x.get());
                    if wt == GgmlType::F16 {
                        // F16 weights take f16-rounded activations (their vec_dot_type), as in ggml.
                        xv.iter_mut()
                            .for_each(|v| *v = half::f16::from_f32(*v).to_f32());
                    }
                    let mut want = vec![];
                    for t in 0..n_tok {
                        for e in 0..n_used {
                            let ex = idv[t * n_used + e] as usize;
                            let c = (e % ne11) + t * ne11;
                            for i in 0..m {
                                let s: f32 = (0..k)
                                    .map(|j| wv[(ex * m + i) * k + j] * xv[c * k + j])
                                    .sum();
                                want.push(s);
                            }
                        }
                    }
                    assert_close(&d.get(), &want, 1e-5);
                }
            }
        }
    }

    /// A MoE layer's gate and up products over `x` routed by `ids`, and their SWIGLU.
    fn gate_up_swiglu(wg: &TT, wu: &TT, x: &TT, ids: &TT) -> (TT, TT, TT) {
        use crate::ggml_types::glu;
        let out = [wg.ne()[1], ids.ne()[0], ids.ne()[1], 1];
        let mut gate = TT::new(GgmlType::F32, out);
        gate.op(op::MUL_MAT_ID).src(0, wg).src(1, x).src(2, ids);
        let mut up = TT::new(GgmlType::F32, out);
        up.op(op::MUL_MAT_ID).src(0, wu).src(1, x).src(2, ids);
        let mut g = TT::new(GgmlType::F32, out);
        g.op(op::GLU).src(0, &gate).src(1, &up).pi(0, glu::SWIGLU);
        (gate, up, g)
    }

    /// The gate and up products and their SWIGLU in one step (`compute_gate_up_glu`) give
    /// what the three nodes give one by one, to the bit: rows not a multiple of the task
    /// block, either node order, 1 and several tokens and threads, the GLU apart from the
    /// products or over the gate's result.
    #[test]
    fn gate_up_glu_in_one_step_equals_node_by_node() {
        use crate::cpu::backend::CpuBackend;
        use crate::device::Backend;
        for (wt, k) in [
            (GgmlType::Q4_0, 64),
            (GgmlType::Q4_K, 256),
            (GgmlType::F32, 40),
        ] {
            for (m, n_tok) in [(37, 1), (48, 3), (1, 2)] {
                for gate_first in [true, false] {
                    for over_gate in [false, true] {
                        for nth in [1, 3, 4] {
                            let (n_exp, n_used) = (5, 3);
                            let mut wg = TT::new(wt, [k, m, n_exp, 1]);
                            wg.set(&rand_vec(k * m * n_exp, 11, -1.0, 1.0));
                            let mut wu = TT::new(wt, [k, m, n_exp, 1]);
                            wu.set(&rand_vec(k * m * n_exp, 12, -1.0, 1.0));
                            let mut x = TT::new(GgmlType::F32, [k, 1, n_tok, 1]);
                            x.set(&rand_vec(k * n_tok, 13, -2.0, 2.0));
                            let idv = [4.0, 0.0, 2.0, 2.0, 4.0, 1.0, 3.0, 0.0, 4.0];
                            let mut ids = TT::new(GgmlType::I32, [n_used, n_tok, 1, 1]);
                            ids.set(&idv[..n_used * n_tok]);
                            let (mut gate, mut up, mut g) = gate_up_swiglu(&wg, &wu, &x, &ids);
                            // Node by node first (the GLU apart), then in one step.
                            let mut be = CpuBackend::new(nth).unwrap();
                            for t in [&gate, &up, &g] {
                                be.compute(&[t.tensor()]).unwrap();
                            }
                            let want = [gate.get(), up.get(), g.get()];
                            for t in [&mut gate, &mut up, &mut g] {
                                t.set(&vec![0.0; m * n_used * n_tok]);
                            }
                            if over_gate {
                                g.t.data = gate.t.data;
                            }
                            let nodes = if gate_first {
                                [gate.tensor(), up.tensor(), g.tensor()]
                            } else {
                                [up.tensor(), gate.tensor(), g.tensor()]
                            };
                            assert!(super::gate_up_glu(&nodes, 0));
                            be.compute(&nodes).unwrap();
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            let case = format!("{wt:?} m={m} n_tok={n_tok} gate_first={gate_first} over_gate={over_gate} nth={nth}");
                            assert_eq!(bits(&g.get()), bits(&want[2]), "glu {case}");
                            if !over_gate {
                                assert_eq!(bits(&gate.get()), bits(&want[0]), "gate {case}");
                            }
                            assert_eq!(bits(&up.get()), bits(&want[1]), "up {case}");
                        }
                    }
                }
            }
        }
    }

    /// A Qwen3-30B-A3B token's gate / up / SWIGLU (2048 x 768, 8 of 128 experts, Q4_0, new
    /// ids each time so the experts come from memory) as one step and node by node on the
    /// same backend, alternating; prints µs per token-layer. THREADS (default all), REPS.
    /// `cargo test --release --lib -- --ignored bench_moe_gate_up_glu --nocapture`
    #[test]
    #[ignore]
    fn bench_moe_gate_up_glu() {
        use crate::cpu::backend::CpuBackend;
        use crate::device::Backend;
        let env = |n: &str, d: usize| {
            std::env::var(n)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let nth = env(
            "THREADS",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        );
        let reps = env("REPS", 400);
        let (k, m, n_exp, n_used) = (2048, 768, 128, 8);
        let wt = GgmlType::Q4_0;
        let weights = |seed: u32| {
            let w = TT::new(wt, [k, m, n_exp, 1]);
            let row = rand_vec(k * m, seed, -1.0, 1.0);
            let mut one = TT::new(wt, [k, m, 1, 1]);
            one.set(&row);
            let bytes = wt.row_size(k) * m;
            for e in 0..n_exp {
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        one.t.data as *const u8,
                        (w.t.data as *mut u8).add(e * bytes),
                        bytes,
                    )
                };
            }
            w
        };
        let (wg, wu) = (weights(1), weights(2));
        let mut x = TT::new(GgmlType::F32, [k, 1, 1, 1]);
        x.set(&rand_vec(k, 3, -1.0, 1.0));
        let mut ids = TT::new(GgmlType::I32, [n_used, 1, 1, 1]);
        let (gate, up, g) = gate_up_swiglu(&wg, &wu, &x, &ids);
        let mut be = CpuBackend::new(nth).unwrap();
        let mut us = [0f64; 2];
        let mut seed = 7u32;
        for r in 0..2 * reps {
            // 8 distinct experts.
            let mut pick: Vec<f32> = Vec::new();
            while pick.len() < n_used {
                seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                let e = ((seed >> 8) % n_exp as u32) as f32;
                if !pick.contains(&e) {
                    pick.push(e);
                }
            }
            ids.set(&pick);
            let fused = r % 2 == 0;
            be.set_fuse(fused);
            let t = std::time::Instant::now();
            be.compute(&[gate.tensor(), up.tensor(), g.tensor()])
                .unwrap();
            us[fused as usize] += t.elapsed().as_secs_f64() * 1e6;
        }
        let bytes = 2.0 * (n_used * wt.row_size(k) * m) as f64;
        for (name, t) in [("node by node", us[0]), ("one step", us[1])] {
            let per = t / reps as f64;
            eprintln!(
                "gate/up/SWIGLU {nth} threads, {name}: {per:.1} us ({:.1} GB/s)",
                bytes / per / 1e3
            );
        }
    }

    /// Only a gate / up / SWIGLU triple over the same activations and ids is one step.
    #[test]
    fn gate_up_glu_declines_other_triples() {
        use crate::ggml_types::glu;
        let (k, m) = (32, 8);
        let mut w = TT::new(GgmlType::Q4_0, [k, m, 4, 1]);
        w.set(&rand_vec(k * m * 4, 1, -1.0, 1.0));
        let x = TT::new(GgmlType::F32, [k, 1, 1, 1]);
        let x2 = TT::new(GgmlType::F32, [k, 1, 1, 1]);
        let mut ids = TT::new(GgmlType::I32, [2, 1, 1, 1]);
        ids.set(&[0.0, 3.0]);
        let mut a = TT::new(GgmlType::F32, [m, 2, 1, 1]);
        a.op(op::MUL_MAT_ID).src(0, &w).src(1, &x).src(2, &ids);
        let mut b = TT::new(GgmlType::F32, [m, 2, 1, 1]);
        b.op(op::MUL_MAT_ID).src(0, &w).src(1, &x2).src(2, &ids);
        let mut g = TT::new(GgmlType::F32, [m, 2, 1, 1]);
        g.op(op::GLU).src(0, &a).src(1, &b).pi(0, glu::SWIGLU);
        // Different activations.
        assert!(!super::gate_up_glu(
            &[a.tensor(), b.tensor(), g.tensor()],
            0
        ));
        b.src(1, &x);
        assert!(super::gate_up_glu(&[a.tensor(), b.tensor(), g.tensor()], 0));
        // Another activation, halves swapped, or too few nodes.
        g.pi(0, glu::GEGLU);
        assert!(!super::gate_up_glu(
            &[a.tensor(), b.tensor(), g.tensor()],
            0
        ));
        g.pi(0, glu::SWIGLU).pi(1, 1);
        assert!(!super::gate_up_glu(
            &[a.tensor(), b.tensor(), g.tensor()],
            0
        ));
        g.pi(1, 0);
        assert!(!super::gate_up_glu(&[a.tensor(), b.tensor()], 0));
        // The GLU half over a product.
        g.t.data = unsafe { (a.t.data as *mut u8).add(4) } as *mut std::ffi::c_void;
        assert!(!super::gate_up_glu(
            &[a.tensor(), b.tensor(), g.tensor()],
            0
        ));
    }

    /// F16/BF16 activations give, to the bit, the product of the same values given as F32.
    #[test]
    fn mul_mat_id_half_activations_equal_widened_f32() {
        let (m, n_exp, n_used, n_tok) = (9, 4, 2, 5);
        let idv = [3.0, 0.0, 1.0, 3.0, 2.0, 2.0, 0.0, 1.0, 1.0, 2.0];
        for wt in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
        ] {
            let k = if wt.block_size() == 256 { 256 } else { 96 };
            for xt in [GgmlType::F16, GgmlType::BF16] {
                for nth in [1, 3] {
                    let mut w = TT::new(wt, [k, m, n_exp, 1]);
                    w.set(&rand_vec(k * m * n_exp, 5, -1.0, 1.0));
                    let mut xh = TT::new(xt, [k, n_used, n_tok, 1]);
                    xh.set(&rand_vec(k * n_used * n_tok, 6, -1.0, 1.0));
                    let mut xf = TT::new(GgmlType::F32, [k, n_used, n_tok, 1]);
                    xf.set(&xh.get());
                    let mut ids = TT::new(GgmlType::I32, [n_used, n_tok, 1, 1]);
                    ids.set(&idv);
                    let mut out = vec![];
                    for x in [&xh, &xf] {
                        let mut d = TT::new(GgmlType::F32, [m, n_used, n_tok, 1]);
                        d.op(op::MUL_MAT_ID).src(0, &w).src(1, x).src(2, &ids);
                        assert!(super::supports(&d.tensor()));
                        run(&d, nth);
                        out.push(d.get());
                    }
                    let same = out[0]
                        .iter()
                        .zip(&out[1])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{wt:?} x {xt:?} nth={nth}");
                }
            }
        }
    }
}
