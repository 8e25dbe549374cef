//! SOFT_MAX with ggml's extensions: dst = softmax(src0 * scale + slope * mask), where the
//! optional mask (F32 or F16) is shared by all heads up to broadcasting over dims 2 and 3,
//! slope is the ALiBi slope of the head when max_bias > 0, and optional per-head "sinks"
//! take part in the normalization as an extra logit.

use super::Ctx;
use crate::ggml_types::GgmlType;
use crate::tensor::Tensor;

pub fn supports(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    if a.dtype() != GgmlType::F32 || node.dtype() != GgmlType::F32 {
        return false;
    }
    if !a.same_shape(node) || !a.has_dense_rows() || !node.is_contiguous() {
        return false;
    }
    let (ne, nea) = (node.ne(), a.ne());
    if let Some(m) = node.src(1) {
        let mne = m.ne();
        if !matches!(m.dtype(), GgmlType::F32 | GgmlType::F16) || !m.has_dense_rows() {
            return false;
        }
        if mne[0] != nea[0] || mne[1] < nea[1] || nea[2] % mne[2] != 0 || nea[3] % mne[3] != 0 {
            return false;
        }
    }
    if let Some(s) = node.src(2) {
        if s.dtype() != GgmlType::F32 || s.nelements() < ne[2] || !s.is_contiguous() {
            return false;
        }
    }
    true
}

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    (node.ne()[0] + 16) * 4 * nth
}

/// ALiBi slope of head `h` (1.0 when max_bias is 0).
pub fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1u32 << (n_head as f32).log2().floor() as u32;
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if (h as u32) < n_head_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h as i32 - n_head_log2 as i32) + 1)
    }
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let mask = node.src(1);
    let sinks = node.src(2);
    let (scale, max_bias) = (node.param_f32(0), node.param_f32(1));
    let ne = node.ne();
    let n = ne[0];
    let wp = unsafe { std::slice::from_raw_parts_mut((ctx.wdata as *mut f32).add((n + 16) * ctx.ith), n) };

    let mut row = 0usize;
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            let slope = alibi_slope(max_bias, ne[2], i2);
            let sink = sinks.map(|s| unsafe { *(s.data() as *const f32).add(i2) });
            for i1 in 0..ne[1] {
                row += 1;
                if (row - 1) % ctx.nth != ctx.ith {
                    continue;
                }
                unsafe {
                    let sp = a.data().add(a.row_offset(i1, i2, i3)) as *const f32;
                    let dp = std::slice::from_raw_parts_mut(node.data().add(node.row_offset(i1, i2, i3)) as *mut f32, n);
                    for i in 0..n {
                        wp[i] = *sp.add(i) * scale;
                    }
                    if let Some(m) = mask {
                        let mne = m.ne();
                        let mp = m.data().add(m.row_offset(i1, i2 % mne[2], i3 % mne[3]));
                        if m.dtype() == GgmlType::F16 {
                            for i in 0..n {
                                wp[i] += slope * half::f16::from_bits(*(mp as *const u16).add(i)).to_f32();
                            }
                        } else {
                            for i in 0..n {
                                wp[i] += slope * *(mp as *const f32).add(i);
                            }
                        }
                    }
                    let mut max = wp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    if let Some(s) = sink {
                        max = max.max(s);
                    }
                    let mut sum = 0f64;
                    for i in 0..n {
                        let e = (wp[i] - max).exp();
                        dp[i] = e;
                        sum += e as f64;
                    }
                    if let Some(s) = sink {
                        sum += ((s - max).exp()) as f64;
                    }
                    let inv = (1.0 / sum) as f32;
                    dp.iter_mut().for_each(|v| *v *= inv);
                }
            }
        }
    }
}
