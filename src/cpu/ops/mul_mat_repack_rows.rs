//! MUL_MAT of weights repacked at load whose kernels keep the plain path's summation order
//! (Q8_0, Q6_K, IQ4_NL: `quants/repack_q8_0.rs`, `repack_q6_k.rs`, `repack_iq4_nl.rs`), so the
//! results equal those over ggml's layout to the bit.
//! The activations are converted once to the weight's dot type, as `mul_mat` converts them;
//! threads split the 16-row groups evenly:
//! - fewer than 4 columns (generation): the group is read in place, one stream;
//! - more: the group is unpacked back to ggml's rows in the thread's scratch (L2-resident: 70
//!   KB at k = 4096) and the plain register tiles run every column over it.
//!
//! The rows past the last whole group are in ggml's layout and take the plain tiles directly.
//!
//! Q6_K prompts on AVX-512 VNNI take the weight panels on the plain path, so here too:
//! `mul_mat_panel::compute_repacked` unpacks each group and packs it as plain rows.

use super::mul_mat::{convert_row, tile_block};
use super::Ctx;
use crate::cpu::quants::panel::ROWS;
use crate::cpu::quants::{repack_iq4_nl as ri, repack_q6_k as r6, repack_q8_0 as r8};
use crate::cpu::types::traits;
use crate::ggml_types::GgmlType;
use crate::tensor::{split_range, Tensor};

/// `repack_q8_0::unrepack`'s type: rows, blocks per row, from, to.
type Unrepack = unsafe fn(usize, usize, *const u8, *mut u8);

/// Fewest columns the unpacked rows pay off at (as `mul_mat_repack::MIN_COLS`).
const MIN_COLS: usize = 4;
/// Columns per pass of the tiles over the unpacked rows (the plain path's tile width).
const COLS: usize = 16;

fn act_bytes(node: &Tensor) -> usize {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let vdt = traits(w.dtype()).unwrap().vec_dot_type;
    vdt.row_size(x.ne()[0]) * x.nrows()
}

/// Whether the plain path would take the weight panels (Q6_K prompts on AVX-512 VNNI).
fn panels(node: &Tensor) -> bool {
    node.src(0).unwrap().dtype() == GgmlType::Q6_K && super::mul_mat_panel::applies(node)
}

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    if panels(node) {
        return super::mul_mat_panel::work_size_repacked(node, nth);
    }
    let w = node.src(0).unwrap();
    act_bytes(node) + 64 + nth * (ROWS * w.nb()[1] + 64)
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    if panels(node) {
        return super::mul_mat_panel::compute_repacked(node, ctx, r6::unrepack);
    }
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let tr = traits(w.dtype()).unwrap();
    let (wne, xne, dne) = (w.ne(), x.ne(), node.ne());
    let k = wne[0];
    let nb = k / w.dtype().block_size();
    let rs = w.nb()[1];
    let align = |p: *mut u8| p.wrapping_add(p.align_offset(64));
    let act = align(ctx.wdata);
    let scratch_at = align(unsafe { ctx.wdata.add(act_bytes(node) + 64) });
    let scratch = unsafe { scratch_at.add(ctx.ith * (ROWS * rs + 64)) };
    let xrow = tr.vec_dot_type.row_size(k);

    let mut tmp = Vec::new();
    for r in split_range(x.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, xne[1], xne[2]);
        unsafe {
            let src = x.data().add(x.row_offset(i1, i2, i3));
            convert_row(
                x.dtype(),
                src,
                k,
                tr.vec_dot_type,
                act.add(r * xrow),
                &mut tmp,
            );
        }
    }
    if !ctx.sync() {
        return;
    }

    let (r2, r3) = (xne[2] / wne[2], xne[3] / wne[3]);
    let units_per = dne[0].div_ceil(ROWS);
    let whole = dne[0] / ROWS;
    let mb = crate::cpu::repack::matrix_bytes(&w);
    let dnb = node.nb();
    let n = dne[1];
    let vec_dot = tr.vec_dot.unwrap();
    let (gemv, unrepack): (r8::Gemv, Unrepack) = match w.dtype() {
        GgmlType::Q6_K => (r6::gemv_best, r6::unrepack),
        GgmlType::IQ4_NL => (ri::gemv_best, ri::unrepack),
        _ => (r8::gemv_best, r8::unrepack),
    };
    for u in ctx.chunks(units_per * dne[2] * dne[3]) {
        let p = u % units_per;
        let batch = u / units_per;
        let (i2, i3) = (batch % dne[2], batch / dne[2]);
        let row0 = p * ROWS;
        let rows = (dne[0] - row0).min(ROWS);
        unsafe {
            // A group fills its rows' bytes, so row0 · rs is a group's start and the tail's.
            let mat = w.data().add((i2 / r2 + (i3 / r3) * wne[2]) * mb);
            let wp = mat.add(row0 * rs);
            let acol = act.add((i3 * xne[2] + i2) * xne[1] * xrow);
            let db = node.data().add(i2 * dnb[2] + i3 * dnb[3] + row0 * 4);
            if p < whole && n < MIN_COLS {
                gemv(nb, wp, acol, xrow, n, db, dnb[1]);
                continue;
            }
            let rows_at = if p < whole {
                unrepack(ROWS, nb, wp, scratch);
                scratch as *const u8
            } else {
                wp
            };
            let tile = if n == 1 { tr.gemv } else { tr.gemm };
            for j in (0..n).step_by(COLS) {
                let cols = j..(j + COLS).min(n);
                tile_block(
                    tile, vec_dot, k, rows_at, rs, rows, acol, xrow, cols, db, dnb[1],
                );
            }
        }
    }
}

// x86-64 only: the buffer type is offered on AVX-512 VNNI machines, and elsewhere the plain
// path sums in NEON's order.
#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    /// The product over a repacked copy of Q8_0, Q6_K or IQ4_NL weights gives the bits of the
    /// product over the plain ones (the register tiles and `vec_dot`, ggml-cpu's AVX2 order):
    /// rows not a multiple of 16, one block, 1 to 3 columns (generation) and more (prompts, odd
    /// counts), broadcast batches, F16 activations, 1 and 3 threads.
    #[test]
    fn repacked_equals_the_plain_path() {
        for ty in [GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::IQ4_NL] {
            for (m, n, nb, b2, xt) in [
                (16, 1, 1, 1, GgmlType::F32),
                (37, 1, 2, 2, GgmlType::F32),
                (32, 3, 3, 1, GgmlType::F32),
                (19, 2, 1, 1, GgmlType::F16),
                (48, 5, 8, 2, GgmlType::F32),
                (7, 1, 4, 1, GgmlType::F32),
                (40, 21, 2, 1, GgmlType::F16),
                (64, 1, 16, 1, GgmlType::F32),
            ] {
                let k = nb * ty.block_size();
                let mut w = TT::new(ty, [k, m, 1, 1]);
                w.set(&rand_vec(k * m, 83, -1.0, 1.0));
                let mut x = TT::new(xt, [k, n, b2, 1]);
                x.set(&rand_vec(k * n * b2, 84, -1.0, 1.0));
                let mut want = TT::new(GgmlType::F32, [m, n, b2, 1]);
                want.op(op::MUL_MAT).src(0, &w).src(1, &x);
                run(&want, 1);
                let want = want.get();

                let wr = TT::new(ty, [k, m, 1, 1]);
                unsafe {
                    let (s, d) = (w.tensor().data(), wr.tensor().data());
                    if ty == GgmlType::Q6_K {
                        crate::cpu::quants::repack_q6_k::repack(m, nb, s, d);
                    } else if ty == GgmlType::IQ4_NL {
                        crate::cpu::quants::repack_iq4_nl::repack(m, nb, s, d);
                    } else {
                        crate::cpu::quants::repack_q8_0::repack(m, nb, s, d);
                    }
                    crate::cpu::repack::set_mark(wr.tensor().as_ptr());
                }
                for nth in [1, 3] {
                    let mut d = TT::new(GgmlType::F32, [m, n, b2, 1]);
                    d.op(op::MUL_MAT).src(0, &wr).src(1, &x);
                    run(&d, nth);
                    let got = d.get();
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty:?} m={m} n={n} k={k} b2={b2} nth={nth}");
                }
            }
        }
    }
}
