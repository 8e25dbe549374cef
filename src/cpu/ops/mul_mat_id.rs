//! MUL_MAT_ID (mixture of experts): for token t and slot e, expert x = ids[e, t] and
//! dst[:, e, t] = src0[:, :, x] · src1[:, e % ne11, t]. src0 [K, M, n_expert] in any type with
//! CPU kernels; src1 F32, F16 or BF16 [K, ne11 (n_used or 1), n_tokens]; ids I32 [n_used, n_tokens];
//! dst F32 [M, n_used, n_tokens]. src1 is first converted to the weight type's dot type;
//! work is spread as (expert, block of weight rows) tasks so each expert's rows stay hot.

use super::Ctx;
use crate::cpu::types::traits;
use crate::ggml_types::GgmlType;
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
    let (w, x, ids) = (
        node.src(0).unwrap(),
        node.src(1).unwrap(),
        node.src(2).unwrap(),
    );
    let tr = traits(w.dtype()).unwrap();
    let vec_dot = tr.vec_dot.unwrap();
    let (wne, xne, ine) = (w.ne(), x.ne(), ids.ne());
    let k = wne[0];
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
                k,
                tr.vec_dot_type,
                ctx.wdata.add(r * xrow),
                &mut tmp,
            );
        }
    }
    if !ctx.sync() {
        return;
    }

    let n_expert = wne[2];
    let row_blocks = wne[1].div_ceil(ROWS_PER_TASK);
    let (n_used, n_tok) = (ine[0], ine[1]);
    // The slots (expert, used index, token) routed to an expert, grouped by expert: the tasks
    // are the used experts' row blocks only. Splitting every expert's blocks among the threads
    // left most threads without work when a token uses 8 of 128 experts (RFCPU generated a
    // Qwen3-30B-A3B-shaped MoE at a third of ggml-cpu's speed on 16 threads).
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
    // Whole row groups through the one-column register tile MUL_MAT generates with (it
    // prefetches the next rows; the same bits as `vec_dot`), the rest one dot at a time. One
    // dot per row read the experts at half the host's bandwidth.
    let tile = tr.gemv.filter(|t| t.cols == 1);
    let wrow = w.nb()[1];
    for task in ctx.chunks(groups.len() * row_blocks) {
        let ((ex, a, b), rb) = (groups[task / row_blocks], task % row_blocks);
        let rows = rb * ROWS_PER_TASK..((rb + 1) * ROWS_PER_TASK).min(wne[1]);
        for &(_, e, t) in &slots[a..b] {
            let col = (e % xne[1]) + t * xne[1];
            let xp = unsafe { ctx.wdata.add(col * xrow) };
            let mut i = rows.start;
            if let Some(tl) = tile {
                while i + tl.rows <= rows.end {
                    unsafe {
                        let wp = w.data().add(w.row_offset(i, ex, 0));
                        let dp = node.data().add(node.offset(i, e, t, 0));
                        (tl.dot)(k, wp, wrow, xp, xrow, dp, 0);
                    }
                    i += tl.rows;
                }
            }
            for i in i..rows.end {
                unsafe {
                    let wp = w.data().add(w.row_offset(i, ex, 0));
                    *(node.data().add(node.offset(i, e, t, 0)) as *mut f32) = vec_dot(k, wp, xp);
                }
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
