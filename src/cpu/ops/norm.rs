//! RMS_NORM, NORM, L2_NORM over each row of an F32 tensor (op param 0: eps as f32).
//! Sums of squares accumulate in f64 like ggml-cpu; the scale itself is an f32. NORM's centred sum of
//! squares follows ggml-cpu's AVX2 order (8-lane groups summed as f32, then added to the f64), so
//! LayerNorm models (BERT) agree with it to the bit.

use super::Ctx;
use crate::cpu::simd::hsum8;
use crate::ggml_types::{op, GgmlType};
use crate::tensor::{split_range, Tensor};

pub fn supports(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    a.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && a.same_shape(node)
        && a.has_dense_rows()
        && node.has_dense_rows()
        && node.param_f32(0) >= 0.0
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let eps = node.param_f32(0);
    let ne = node.ne();
    let n = ne[0];
    for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
        let (x, y) = unsafe {
            (
                std::slice::from_raw_parts(a.data().add(a.row_offset(i1, i2, i3)) as *const f32, n),
                std::slice::from_raw_parts_mut(
                    node.data().add(node.row_offset(i1, i2, i3)) as *mut f32,
                    n,
                ),
            )
        };
        match node.op() {
            op::RMS_NORM => {
                let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
                let mean = (sum / n as f64) as f32;
                let scale = 1.0 / (mean + eps).sqrt();
                y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * scale);
            }
            op::L2_NORM => {
                let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
                let scale = 1.0 / (sum as f32).sqrt().max(eps);
                y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * scale);
            }
            _ => {
                // NORM: subtract the mean, divide by the standard deviation.
                let sum: f64 = x.iter().map(|&v| v as f64).sum();
                let mean = (sum as f32) / n as f32;
                let variance = (centered_sum_sq(x, mean, y) / n as f64) as f32;
                let scale = 1.0 / (variance + eps).sqrt();
                y.iter_mut().for_each(|y| *y *= scale);
            }
        }
    }
}

/// y = x - mean; returns the sum of y^2 as ggml-cpu's `ggml_vec_cvar_f32` (AVX2 build) forms it: each
/// whole group of 8 squared in f32 and summed in the lane order of [`hsum8`], added to an f64; the
/// remaining values added to it one by one. A plain f64 sum differs in the last bits.
fn centered_sum_sq(x: &[f32], mean: f32, y: &mut [f32]) -> f64 {
    let whole = x.len() / 8 * 8;
    let mut sum = 0f64;
    for (xs, ys) in x[..whole]
        .chunks_exact(8)
        .zip(y[..whole].chunks_exact_mut(8))
    {
        let mut sq = [0f32; 8];
        for i in 0..8 {
            let v = xs[i] - mean;
            ys[i] = v;
            sq[i] = v * v;
        }
        sum += hsum8(&sq) as f64;
    }
    for (yv, &xv) in y[whole..].iter_mut().zip(&x[whole..]) {
        let v = xv - mean;
        *yv = v;
        sum += (v * v) as f64;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::cpu::simd::hsum8;
    use crate::ggml_types::{op, GgmlType};

    // ggml-cpu's LayerNorm of one row, its AVX2 build's operations in its order.
    fn ggml_norm_row(x: &[f32], eps: f32) -> Vec<f32> {
        let n = x.len();
        let mean = (x.iter().map(|&v| v as f64).sum::<f64>() as f32) / n as f32;
        let whole = n / 8 * 8;
        let mut sum = 0f64;
        for c in x[..whole].chunks_exact(8) {
            let sq: [f32; 8] = std::array::from_fn(|i| (c[i] - mean) * (c[i] - mean));
            sum += hsum8(&sq) as f64;
        }
        for &v in &x[whole..] {
            sum += ((v - mean) * (v - mean)) as f64;
        }
        let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
        x.iter().map(|&v| (v - mean) * scale).collect()
    }

    #[test]
    fn layer_norm_matches_ggml_bits() {
        // Rows of 8-lane groups, with a tail, shorter than one group; offset values so that the
        // centring matters.
        for ne0 in [64usize, 13, 7, 4096] {
            let ne = [ne0, 5, 2, 1];
            let v = rand_vec(ne.iter().product(), 7 + ne0 as u32, -2.0, 3.0);
            for nth in [1, 3] {
                let mut a = TT::new(GgmlType::F32, ne);
                a.set(&v);
                let mut d = TT::new(GgmlType::F32, ne);
                d.op(op::NORM).src(0, &a).pf(0, 1e-12);
                run(&d, nth);
                let got = d.get();
                for (r, row) in v.chunks(ne0).enumerate() {
                    let want = ggml_norm_row(row, 1e-12);
                    for (i, (g, w)) in got[r * ne0..(r + 1) * ne0].iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "ne0 {ne0} row {r} [{i}]: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
