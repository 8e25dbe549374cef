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
    let wp = unsafe {
        std::slice::from_raw_parts_mut((ctx.wdata as *mut f32).add((n + 16) * ctx.ith), n)
    };

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
                    let dp = std::slice::from_raw_parts_mut(
                        node.data().add(node.row_offset(i1, i2, i3)) as *mut f32,
                        n,
                    );
                    for (i, w) in wp.iter_mut().enumerate() {
                        *w = *sp.add(i) * scale;
                    }
                    if let Some(m) = mask {
                        let mne = m.ne();
                        let mp = m.data().add(m.row_offset(i1, i2 % mne[2], i3 % mne[3]));
                        if m.dtype() == GgmlType::F16 {
                            for (i, w) in wp.iter_mut().enumerate() {
                                *w += slope
                                    * half::f16::from_bits(*(mp as *const u16).add(i)).to_f32();
                            }
                        } else {
                            for (i, w) in wp.iter_mut().enumerate() {
                                *w += slope * *(mp as *const f32).add(i);
                            }
                        }
                    }
                    let mut max = wp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    if let Some(s) = sink {
                        max = max.max(s);
                    }
                    // ggml-cpu's exp and summation order, so that results agree to the bit.
                    let mut sum = crate::cpu::simd::softmax_exp_row(wp, max, dp);
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

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    /// ALiBi slope written out from its definition, in f64.
    fn slope_ref(max_bias: f32, n_head: usize, h: usize) -> f64 {
        if max_bias <= 0.0 {
            return 1.0;
        }
        let mut p = 1usize;
        while p * 2 <= n_head {
            p *= 2;
        }
        let mb = max_bias as f64;
        if h < p {
            2f64.powf(-mb / p as f64).powi(h as i32 + 1)
        } else {
            2f64.powf(-mb / 2.0 / p as f64).powi(2 * (h - p) as i32 + 1)
        }
    }

    #[test]
    fn softmax_mask_alibi_sinks() {
        let ne = [10, 5, 6, 2];
        let x = rand_vec(ne.iter().product(), 31, -4.0, 4.0);
        for mty in [None, Some(GgmlType::F32), Some(GgmlType::F16)] {
            // mask rows: 7 >= ne1; broadcast over heads (3 divides 6) and dim 3 (1 divides 2)
            let mne = [10, 7, 3, 1];
            let mut mv = rand_vec(mne.iter().product(), 32, -1.0, 1.0);
            for (k, v) in mv.iter_mut().enumerate() {
                // causal-style -inf entries, never a whole row
                if k % 10 > (k / 10) % 7 + 3 {
                    *v = f32::NEG_INFINITY;
                }
            }
            for max_bias in [0.0f32, 8.0] {
                for with_sinks in [false, true] {
                    for nth in [1, 3] {
                        let mut a = TT::new(GgmlType::F32, ne);
                        a.set(&x);
                        let mut m = mty.map(|t| TT::new(t, mne));
                        if let Some(m) = m.as_mut() {
                            m.set(&mv);
                        }
                        let mut s = TT::new(GgmlType::F32, [ne[2], 1, 1, 1]);
                        s.set(&rand_vec(ne[2], 33, -1.0, 2.0));
                        let mut d = TT::new(GgmlType::F32, ne);
                        d.op(op::SOFT_MAX).src(0, &a).pf(0, 0.7).pf(1, max_bias);
                        if let Some(m) = m.as_ref() {
                            d.src(1, m);
                        }
                        if with_sinks {
                            d.src(2, &s);
                        }
                        run(&d, nth);

                        let mvals = m.as_ref().map(|m| m.get());
                        let sv = s.get();
                        let mut want = vec![0f32; x.len()];
                        for i3 in 0..ne[3] {
                            // i2 picks the sink, the slope and the row offsets together.
                            #[allow(clippy::needless_range_loop)]
                            for i2 in 0..ne[2] {
                                let slope = slope_ref(max_bias, ne[2], i2);
                                for i1 in 0..ne[1] {
                                    let base = ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0];
                                    let mut l: Vec<f64> =
                                        (0..ne[0]).map(|i| x[base + i] as f64 * 0.7).collect();
                                    if let Some(mv) = mvals.as_ref() {
                                        let mb = (((i3 % mne[3]) * mne[2] + i2 % mne[2]) * mne[1]
                                            + i1)
                                            * mne[0];
                                        for i in 0..ne[0] {
                                            l[i] += slope * mv[mb + i] as f64;
                                        }
                                    }
                                    let mut mx =
                                        l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                                    if with_sinks {
                                        mx = mx.max(sv[i2] as f64);
                                    }
                                    let mut sum: f64 = l.iter().map(|v| (v - mx).exp()).sum();
                                    if with_sinks {
                                        sum += (sv[i2] as f64 - mx).exp();
                                    }
                                    for i in 0..ne[0] {
                                        want[base + i] = ((l[i] - mx).exp() / sum) as f32;
                                    }
                                }
                            }
                        }
                        assert_close(&d.get(), &want, 1e-5);
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_rejects_short_mask() {
        let a = TT::new(GgmlType::F32, [8, 4, 2, 1]);
        let m = TT::new(GgmlType::F32, [8, 3, 1, 1]);
        let mut d = TT::new(GgmlType::F32, [8, 4, 2, 1]);
        d.op(op::SOFT_MAX).src(0, &a).src(1, &m).pf(0, 1.0);
        assert!(!super::super::supports(&d.tensor()));
    }
}
