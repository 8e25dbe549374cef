//! RMS_NORM, NORM, L2_NORM over each row of an F32 tensor (op param 0: eps as f32).
//! Sums of squares accumulate in f64 like ggml-cpu; the scale itself is an f32.

use super::Ctx;
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
                let mut var = 0f64;
                for (y, &x) in y.iter_mut().zip(x) {
                    let v = x - mean;
                    *y = v;
                    var += (v * v) as f64;
                }
                let variance = (var / n as f64) as f32;
                let scale = 1.0 / (variance + eps).sqrt();
                y.iter_mut().for_each(|y| *y *= scale);
            }
        }
    }
}
