//! MUL_MAT: dst[i, j] = dot(src0 row i, src1 row j) for every batch, src0 broadcast over
//! dims 2 and 3 of src1. src1 (F32, F16 or BF16) is first converted to the weight type's
//! `vec_dot_type` when that differs, then tiles of the output are spread over threads.
//! F16/BF16 activations are widened to F32 (exact) and then converted as F32 ones are, so a
//! product with F16 src1 equals the one with the same values given as F32.

use super::Ctx;
use crate::cpu::types::{traits, Tile, VecDot};
use crate::ggml_types::GgmlType;
use crate::op_shapes::{hadamard_len, hadamard_scale};
use crate::tensor::{split_range, Tensor};

/// Unit of work: rows of src0 (kept hot in L1) by columns of src1 (16 columns of a
/// 576-wide Q8_1 activation are 10 KiB).
const TILE_ROWS: usize = 16;
const TILE_COLS: usize = 16;

pub fn supports(node: &Tensor) -> bool {
    if hadamard_len(node).is_some() {
        return true;
    }
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else {
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
    let (wne, xne, dne, dnb) = (w.ne(), x.ne(), node.ne(), node.nb());
    matches!(x.dtype(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        && node.dtype() == GgmlType::F32
        && wne[0] == xne[0]
        && wne[0] % w.dtype().block_size() == 0
        && dne[0] == wne[1]
        && dne[1] == xne[1]
        && dne[2] == xne[2]
        && dne[3] == xne[3]
        && wne[2] > 0
        && wne[3] > 0
        && xne[2] % wne[2] == 0
        && xne[3] % wne[3] == 0
        && w.has_dense_rows()
        && x.has_dense_rows()
        && dnb[0] == 4
        && dnb[0] <= dnb[1]
        && dnb[1] <= dnb[2]
        && dnb[2] <= dnb[3]
}

unsafe fn f16_single_column(n: usize, x: *const u8, y: *const u8) -> f32 {
    crate::cpu::simd::dot_f16_f16_single_column(
        std::slice::from_raw_parts(x as *const u16, n),
        std::slice::from_raw_parts(y as *const u16, n),
    )
}

fn needs_conversion(w: &Tensor, x: &Tensor) -> bool {
    traits(w.dtype()).unwrap().vec_dot_type != x.dtype()
}

/// Converts one activation row of `k` values (F32, F16 or BF16 at `src`) to `vdt` at `dst`:
/// F16/BF16 widened to F32 first (in `tmp`), then packed by `vdt`'s `from_f32` or copied.
///
/// # Safety
/// `src` must hold `k` values of `xt`, `dst` must have room for `vdt.row_size(k)` bytes.
pub unsafe fn convert_row(
    xt: GgmlType,
    src: *const u8,
    k: usize,
    vdt: GgmlType,
    dst: *mut u8,
    tmp: &mut Vec<f32>,
) {
    let row: &[f32] = if xt == GgmlType::F32 {
        std::slice::from_raw_parts(src as *const f32, k)
    } else {
        tmp.clear();
        let h = std::slice::from_raw_parts(src as *const u16, k);
        if xt == GgmlType::F16 {
            tmp.extend(h.iter().map(|&b| half::f16::from_bits(b).to_f32()));
        } else {
            tmp.extend(h.iter().map(|&b| f32::from_bits((b as u32) << 16)));
        }
        tmp
    };
    if vdt == GgmlType::F32 {
        std::ptr::copy_nonoverlapping(row.as_ptr(), dst as *mut f32, k);
    } else {
        (traits(vdt).unwrap().from_f32.unwrap())(row, dst);
    }
}

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    if super::mul_mat_amx::applies(node) {
        return super::mul_mat_amx::work_size(node, nth);
    }
    if crate::cpu::repack::is_repacked(&w) {
        return super::mul_mat_repack::work_size(node, nth);
    }
    if super::mul_mat_panel::applies(node) {
        return super::mul_mat_panel::work_size(node, nth);
    }
    if hadamard_len(node).is_some() || !needs_conversion(&w, &x) {
        return 0;
    }
    let vdt = traits(w.dtype()).unwrap().vec_dot_type;
    let xne = x.ne();
    vdt.row_size(xne[0]) * xne[1] * xne[2] * xne[3] + 64
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    if let Some(n) = hadamard_len(node) {
        return hadamard(node, n, ctx);
    }
    if super::mul_mat_amx::applies(node) {
        return super::mul_mat_amx::compute(node, ctx);
    }
    if crate::cpu::repack::is_repacked(&node.src(0).unwrap()) {
        return super::mul_mat_repack::compute(node, ctx);
    }
    if super::mul_mat_panel::applies(node) {
        return super::mul_mat_panel::compute(node, ctx);
    }
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let tr = traits(w.dtype()).unwrap();
    // ggml-cpu takes a different F16 kernel (another summation order) for a single column,
    // and for F16 activations it reads in place when they are not contiguous; follow it so
    // attention scores during generation agree with ggml's to the bit.
    let single_column = w.dtype() == GgmlType::F16
        && (x.ne()[1] == 1 || (x.dtype() == GgmlType::F16 && !x.is_contiguous()));
    let vec_dot = if single_column {
        f16_single_column
    } else {
        tr.vec_dot.unwrap()
    };
    let (wne, xne, dne) = (w.ne(), x.ne(), node.ne());
    let k = wne[0];

    // Activations in the dot product's type: either src1 itself or a converted copy.
    let convert = needs_conversion(&w, &x);
    let xrow = tr.vec_dot_type.row_size(k);
    if convert {
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
                    ctx.wdata.add(r * xrow),
                    &mut tmp,
                );
            }
        }
        if !ctx.sync() {
            return;
        }
    }
    // Column j of batch (i2, i3) starts at col_base(i2, i3) + j * col_stride.
    let xnb = x.nb();
    let col_stride = if convert { xrow } else { xnb[1] };
    let col_base = |i2: usize, i3: usize| -> *const u8 {
        if convert {
            unsafe { ctx.wdata.add((i3 * xne[2] + i2) * xne[1] * xrow) }
        } else {
            unsafe { x.data().add(i2 * xnb[2] + i3 * xnb[3]) }
        }
    };

    let (r2, r3) = (xne[2] / wne[2], xne[3] / wne[3]);
    let tile = if single_column {
        None
    } else if dne[1] == 1 {
        tr.gemv
    } else {
        tr.gemm
    };
    let tile_cols = if dne[1] == 1 { 1 } else { TILE_COLS };
    let row_blocks = dne[0].div_ceil(TILE_ROWS);
    let col_blocks = dne[1].div_ceil(tile_cols);
    let tiles = row_blocks * col_blocks * dne[2] * dne[3];
    let (wnb, dnb) = (w.nb(), node.nb());
    for t in ctx.chunks(tiles) {
        let rb = t % row_blocks;
        let cb = (t / row_blocks) % col_blocks;
        let batch = t / (row_blocks * col_blocks);
        let (i2, i3) = (batch % dne[2], batch / dne[2]);
        let (rows, cols) = (
            rb * TILE_ROWS..((rb + 1) * TILE_ROWS).min(dne[0]),
            cb * tile_cols..((cb + 1) * tile_cols).min(dne[1]),
        );
        unsafe {
            let wb = w.data().add((i2 / r2) * wnb[2] + (i3 / r3) * wnb[3]);
            let xb = col_base(i2, i3);
            let db = node.data().add(i2 * dnb[2] + i3 * dnb[3]);
            tile_block(
                tile,
                vec_dot,
                k,
                wb.add(rows.start * wnb[1]),
                wnb[1],
                rows.len(),
                xb,
                col_stride,
                cols,
                db.add(rows.start * 4),
                dnb[1],
            );
        }
    }
}

/// The results of `nrows` weight rows (`wb`, `ws` bytes apart) by columns `cols` (column j at
/// `xb + j * xs`), row i of column j to `db + i * 4 + j * ds`: whole tiles through the
/// register-blocked kernel, edges one dot at a time; both give the same bits, so where a
/// result lands never changes its value.
///
/// # Safety
/// The pointers must hold what `tile` and `vec_dot` read and write for those rows and columns.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile_block(
    tile: Option<Tile>,
    vec_dot: VecDot,
    k: usize,
    wb: *const u8,
    ws: usize,
    nrows: usize,
    xb: *const u8,
    xs: usize,
    cols: std::ops::Range<usize>,
    db: *mut u8,
    ds: usize,
) {
    let (mut j0, mut i_end) = (cols.start, 0);
    if let Some(tl) = tile {
        let i_full = (nrows / tl.rows) * tl.rows;
        let j_full = cols.start + (cols.len() / tl.cols) * tl.cols;
        for j in (cols.start..j_full).step_by(tl.cols) {
            for i in (0..i_full).step_by(tl.rows) {
                (tl.dot)(
                    k,
                    wb.add(i * ws),
                    ws,
                    xb.add(j * xs),
                    xs,
                    db.add(i * 4 + j * ds),
                    ds,
                );
            }
        }
        (j0, i_end) = (j_full, i_full);
    }
    for j in cols.clone() {
        let xp = xb.add(j * xs);
        let first = if j < j0 { i_end } else { 0 };
        for i in first..nrows {
            *(db.add(i * 4 + j * ds) as *mut f32) = vec_dot(k, wb.add(i * ws), xp);
        }
    }
}

/// A MUL_MAT with ggml's Hadamard hint, as ggml-cpu computes it (src0 not read): each src1 row
/// times 1/sqrt(n), then log2(n) butterfly passes (u + v, u - v) over pairs `len` apart. Each
/// pass's pairs are independent, so any order within a pass gives ggml's bits.
fn hadamard(node: &Tensor, n: usize, ctx: &Ctx) {
    let x = node.src(1).unwrap();
    let xne = x.ne();
    let scale = hadamard_scale(n);
    let f16 = x.dtype() == GgmlType::F16;
    for r in split_range(x.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, xne[1], xne[2]);
        unsafe {
            let src = x.data().add(x.row_offset(i1, i2, i3));
            let dst = std::slice::from_raw_parts_mut(
                node.data().add(node.row_offset(i1, i2, i3)) as *mut f32,
                n,
            );
            for (j, d) in dst.iter_mut().enumerate() {
                let v = if f16 {
                    half::f16::from_bits(*(src as *const u16).add(j)).to_f32()
                } else {
                    *(src as *const f32).add(j)
                };
                *d = v * scale;
            }
            hadamard_butterflies(dst);
        }
    }
}

/// The unnormalized fast Walsh-Hadamard transform of `v` (length a power of two) in place.
pub fn hadamard_butterflies(v: &mut [f32]) {
    let n = v.len();
    let mut len = 1;
    while len < n {
        for i in (0..n).step_by(2 * len) {
            for j in i..i + len {
                let (a, b) = (v[j], v[j + len]);
                v[j] = a + b;
                v[j + len] = a - b;
            }
        }
        len <<= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::cpu::types::traits;
    use crate::ggml_types::{op, GgmlType};

    /// A tensor of logical shape `ne` whose dims 1 and 2 are swapped in memory (rows stay dense).
    fn permuted12(ty: GgmlType, ne: [usize; 4]) -> TT {
        let row = ty.row_size(ne[0]);
        let nb = [ty.type_size(), row * ne[2], row, row * ne[1] * ne[2]];
        TT::strided(ty, ne, nb, nb[3] * ne[3])
    }

    /// dst[i, j, i2, i3] = sum_k w[k, i, i2 / r2, i3 / r3] * x[k, j, i2, i3], x rounded to the dot type.
    fn reference(w: &TT, x: &TT) -> Vec<f32> {
        let (wne, xne) = (w.ne(), x.ne());
        let (wv, mut xv) = (w.get(), x.get());
        let vdt = traits(w.ty()).unwrap().vec_dot_type;
        if vdt != GgmlType::F32 {
            let mut t = TT::new(vdt, [xv.len(), 1, 1, 1]);
            t.set(&xv);
            xv = t.get();
        }
        let (r2, r3) = (xne[2] / wne[2], xne[3] / wne[3]);
        let k = wne[0];
        let mut out = vec![];
        for i3 in 0..xne[3] {
            for i2 in 0..xne[2] {
                for j in 0..xne[1] {
                    for i in 0..wne[1] {
                        let wb = (((i3 / r3) * wne[2] + i2 / r2) * wne[1] + i) * k;
                        let xb = ((i3 * xne[2] + i2) * xne[1] + j) * k;
                        let s: f64 = (0..k).map(|t| wv[wb + t] as f64 * xv[xb + t] as f64).sum();
                        out.push(s as f32);
                    }
                }
            }
        }
        out
    }

    /// With ggml's Hadamard hint the product is the normalized Sylvester Hadamard matrix times
    /// each row, whatever src0 holds (ggml-cpu does not read it): checked against the matrix
    /// H[i][j] = (-1)^popcount(i & j) / sqrt(n), for F32 and F16 rows, batched.
    #[test]
    fn mul_mat_hadamard_hint_is_the_transform() {
        for (n, xne, xt) in [
            (64, [64, 5, 2, 1], GgmlType::F32),
            (128, [128, 3, 1, 2], GgmlType::F16),
            (2, [2, 4, 1, 1], GgmlType::F32),
        ] {
            let mut w = TT::new(GgmlType::F32, [n, n, 1, 1]);
            w.set(&rand_vec(n * n, 7, -1.0, 1.0)); // not a Hadamard matrix: ignored
            let mut x = TT::new(xt, xne);
            x.set(&rand_vec(xne.iter().product(), 8, -1.0, 1.0));
            let mut d = TT::new(GgmlType::F32, xne);
            d.op(op::MUL_MAT)
                .pi(1, crate::op_shapes::HINT_SRC0_IS_HADAMARD)
                .src(0, &w)
                .src(1, &x);
            assert!(super::supports(&d.tensor()));
            run(&d, 3);
            let xv = x.get();
            let s = 1.0 / (n as f64).sqrt();
            let want: Vec<f32> = xv
                .chunks(n)
                .flat_map(|row| {
                    (0..n).map(move |i| {
                        (0..n)
                            .map(|j| {
                                if (i & j).count_ones() % 2 == 0 {
                                    row[j] as f64
                                } else {
                                    -row[j] as f64
                                }
                            })
                            .sum::<f64>()
                            * s
                    })
                })
                .map(|v| v as f32)
                .collect();
            assert_close(&d.get(), &want, 1e-5);
        }
    }

    #[test]
    fn mul_mat_float_weights_batched_broadcast() {
        for wt in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for (wne, xne) in [
                ([64, 19, 1, 1], [64, 5, 1, 1]),
                ([40, 7, 2, 3], [40, 6, 4, 3]),
                ([40, 7, 1, 1], [40, 3, 2, 3]),
                ([33, 17, 1, 1], [33, 1, 1, 1]),
            ] {
                for nth in [1, 3] {
                    let mut w = TT::new(wt, wne);
                    w.set(&rand_vec(wne.iter().product(), 41, -1.0, 1.0));
                    let mut x = TT::new(GgmlType::F32, xne);
                    x.set(&rand_vec(xne.iter().product(), 42, -1.0, 1.0));
                    let mut d = TT::new(GgmlType::F32, [wne[1], xne[1], xne[2], xne[3]]);
                    d.op(op::MUL_MAT).src(0, &w).src(1, &x);
                    run(&d, nth);
                    assert_close(&d.get(), &reference(&w, &x), 1e-5);
                }
            }
        }
    }

    #[test]
    fn mul_mat_permuted_operands() {
        for wt in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for nth in [1, 3] {
                // Both operands permuted (dims 1 and 2 swapped in memory), as attention's K and Q are.
                let (wne, xne) = ([32, 9, 2, 1], [32, 5, 4, 1]);
                let mut w = permuted12(wt, wne);
                w.set(&rand_vec(wne.iter().product(), 43, -1.0, 1.0));
                let mut x = permuted12(GgmlType::F32, xne);
                x.set(&rand_vec(xne.iter().product(), 44, -1.0, 1.0));
                let mut d = TT::new(GgmlType::F32, [9, 5, 4, 1]);
                d.op(op::MUL_MAT).src(0, &w).src(1, &x);
                run(&d, nth);
                assert_close(&d.get(), &reference(&w, &x), 1e-5);
            }
        }
    }

    /// F16 and BF16 activations are widened to F32 and then taken as F32 ones are: the product
    /// equals, to the bit, the one with the same values given as F32 (ggml-cpu's conversion of
    /// F32 activations to the weight's vec_dot_type), for every weight type, whole-tile and
    /// edge shapes, one and three threads; permuted F16 activations too.
    #[test]
    fn mul_mat_half_activations_equal_widened_f32() {
        let weights = [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_NL,
        ];
        for wt in weights {
            let blk = wt.block_size();
            // One and three blocks (two super-blocks for the K-quants).
            let ks = if blk == 256 { [256, 512] } else { [32, 96] };
            // (m, n, batches, activation type, permuted, threads): one column, odd column
            // counts over whole tiles and edges, batched, permuted; kept small (this runs
            // under qemu too).
            let cases = [
                (7, 1, 1, GgmlType::F16, false, 1),
                (17, 5, 2, GgmlType::F16, true, 3),
                (33, 19, 1, GgmlType::F16, false, 3),
                (17, 5, 2, GgmlType::BF16, false, 3),
            ];
            for k in ks {
                for (m, n, b2, xt, permuted, nth) in cases {
                    let (wne, xne) = ([k, m, 1, 1], [k, n, b2, 1]);
                    let mut w = TT::new(wt, wne);
                    w.set(&rand_vec(k * m, 51, -1.0, 1.0));
                    let mut xh = if permuted {
                        permuted12(xt, xne)
                    } else {
                        TT::new(xt, xne)
                    };
                    xh.set(&rand_vec(k * n * b2, 52, -1.0, 1.0));
                    let mut xf = TT::new(GgmlType::F32, xne);
                    xf.set(&xh.get());
                    let mut dh = TT::new(GgmlType::F32, [m, n, b2, 1]);
                    dh.op(op::MUL_MAT).src(0, &w).src(1, &xh);
                    assert!(super::super::supports(&dh.tensor()), "{wt:?} x {xt:?}");
                    run(&dh, nth);
                    let mut df = TT::new(GgmlType::F32, [m, n, b2, 1]);
                    df.op(op::MUL_MAT).src(0, &w).src(1, &xf);
                    run(&df, nth);
                    let (gh, gf) = (dh.get(), df.get());
                    if wt == GgmlType::F16 && xt == GgmlType::F16 && permuted {
                        // ggml reads these in place with its one-column kernel: another
                        // summation order than the converted copy's.
                        assert_close(&gh, &gf, 1e-5);
                    } else {
                        let same = gh.iter().zip(&gf).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{wt:?} x {xt:?} k={k} m={m} n={n} permuted={permuted}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn mul_mat_rejects_bad_shapes() {
        let w = TT::new(GgmlType::F32, [16, 4, 3, 1]);
        let x = TT::new(GgmlType::F32, [16, 2, 4, 1]); // 4 % 3 != 0
        let mut d = TT::new(GgmlType::F32, [4, 2, 4, 1]);
        d.op(op::MUL_MAT).src(0, &w).src(1, &x);
        assert!(!super::super::supports(&d.tensor()));
    }
}
