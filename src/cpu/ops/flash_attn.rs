//! FLASH_ATTN_EXT: softmax(scale * q·K^T [softcapped] + slope * mask) · V per query row,
//! computed with an online softmax in one pass over the keys (f32 accumulators).
//! q F32 [DK, n_q, n_head, n_seq]; k [DK, n_kv, n_head_kv, n_seq] and v [DV, n_kv, ...] in
//! any type with CPU kernels (heads broadcast: n_head % n_head_kv == 0); mask F16
//! [>= n_kv, >= n_q, ...] broadcast over heads/sequences; sinks (src4) F32 per head.
//! Output F32 [DV, n_head, n_q, n_seq] (ggml's permuted layout).
//! Op params (f32): 0 scale, 1 max_bias (ALiBi), 2 logit_softcap; i32 3: precision.
//! As in ggml-cpu's row-by-row algorithm, q is rounded to K's dot-product type (f16 for F16 K)
//! before the dots; its tiled one (flash_attn_tiled.rs, 64 queries or more) keeps q in f32.

use super::flash_attn_tiled;
use super::softmax::alibi_slope;
use super::Ctx;
use crate::cpu::simd;
use crate::cpu::types::traits;
use crate::ggml_types::GgmlType;
use crate::tensor::{split_range, Tensor};

pub fn supports(node: &Tensor) -> bool {
    let (Some(q), Some(k), Some(v)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let (qne, kne, vne, dne) = (q.ne(), k.ne(), v.ne(), node.ne());
    if q.dtype() != GgmlType::F32 || node.dtype() != GgmlType::F32 || !node.is_contiguous() {
        return false;
    }
    if !matches!(node.param_i32(3), 0 | 10) {
        return false;
    }
    let Some(kt) = traits(k.dtype()) else {
        return false;
    };
    let k_ok = match k.dtype() {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => true,
        // A cache type must be writable (SET_ROWS): IQ4_XS, which has no quantizer, is not one.
        t => {
            kt.vec_dot.is_some()
                && kt.from_f32.is_some()
                && kne[0] % t.block_size() == 0
                && traits(kt.vec_dot_type).and_then(|t| t.from_f32).is_some()
        }
    };
    let v_ok = traits(v.dtype()).is_some_and(|t| t.to_f32.is_some() && t.from_f32.is_some())
        && vne[0] % v.dtype().block_size() == 0;
    if !k_ok || !v_ok || !q.has_dense_rows() || !k.has_dense_rows() || !v.has_dense_rows() {
        return false;
    }
    if qne[0] != kne[0] || kne[1] != vne[1] || dne != [vne[0], qne[2], qne[1], qne[3]] {
        return false;
    }
    if kne[2] == 0
        || vne[2] == 0
        || qne[2] % kne[2] != 0
        || qne[2] % vne[2] != 0
        || qne[3] != kne[3]
        || qne[3] != vne[3]
    {
        return false;
    }
    if let Some(m) = node.src(3) {
        let mne = m.ne();
        if m.dtype() != GgmlType::F16 || !m.has_dense_rows() || mne[0] < kne[1] || mne[1] < qne[1] {
            return false;
        }
        if qne[2] % mne[2] != 0 || qne[3] % mne[3] != 0 {
            return false;
        }
    }
    if let Some(s) = node.src(4) {
        if s.dtype() != GgmlType::F32 || !s.is_contiguous() || s.nelements() < qne[2] {
            return false;
        }
    }
    true
}

/// Per thread, in f32 units: q in the dot type (at most 4 bytes per element), the f32
/// accumulator and a V row, or the tiled path's blocks.
fn per_thread(node: &Tensor) -> usize {
    let (q, v) = (node.src(0).unwrap(), node.src(2).unwrap());
    let (dk, dv) = (q.ne()[0], v.ne()[0]);
    (dk + 2 * dv + 32).max(if use_tiled(node) {
        flash_attn_tiled::scratch_floats(dk, dv)
    } else {
        0
    })
}

/// ggml-cpu runs its tiled algorithm for F16/F32 K and V (same type) and 64 queries or more;
/// we take our tiled path in the same cases, and elsewhere follow its row-by-row arithmetic.
fn ggml_tiled(node: &Tensor) -> bool {
    kv_plain(node) && node.src(0).unwrap().ne()[1] >= 64
}

/// K and V both F16 or both F32: the cases where ggml-cpu has more than one algorithm.
fn kv_plain(node: &Tensor) -> bool {
    let (k, v) = (node.src(1).unwrap(), node.src(2).unwrap());
    matches!(k.dtype(), GgmlType::F16 | GgmlType::F32) && k.dtype() == v.dtype()
}

fn use_tiled(node: &Tensor) -> bool {
    ggml_tiled(node) && flash_attn_tiled::usable(node)
}

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    per_thread(node) * 4 * nth
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let (q, k, v) = (
        node.src(0).unwrap(),
        node.src(1).unwrap(),
        node.src(2).unwrap(),
    );
    let mask = node.src(3);
    let sinks = node.src(4);
    let (qne, kne, vne) = (q.ne(), k.ne(), v.ne());
    let (dk, dv, n_kv) = (kne[0], vne[0], kne[1]);
    let mut scale = node.param_f32(0);
    let max_bias = node.param_f32(1);
    let softcap = node.param_f32(2);
    if softcap != 0.0 {
        scale /= softcap;
    }
    let (kt, vt) = (k.dtype(), v.dtype());
    let ktr = traits(kt).unwrap();
    let v_to = traits(vt).unwrap().to_f32.unwrap();

    let base = unsafe { (ctx.wdata as *mut f32).add(per_thread(node) * ctx.ith) };
    if use_tiled(node) {
        // Subnormal softmax weights and rescaled sums change no result bit (each row's output
        // is dominated by its largest weight, 1) but cost an assist each on Intel: prompts over a
        // random 8B model's scores ran 14x slower per key on Sapphire Rapids than on Zen 4.
        let _flush = crate::cpu::simd::FlushSubnormals::new();
        return flash_attn_tiled::compute(
            node,
            ctx,
            &flash_attn_tiled::Params {
                scale,
                softcap,
                max_bias,
            },
            base,
        );
    }
    let qbuf = unsafe { std::slice::from_raw_parts_mut(base, dk + 8) };
    let acc = unsafe { std::slice::from_raw_parts_mut(base.add(dk + 16), dv) };
    let vrow = unsafe { std::slice::from_raw_parts_mut(base.add(dk + 16 + dv), dv) };

    // ggml-cpu picks one of three algorithms; where it takes its row-by-row one (few queries,
    // short cache) it accumulates F16 V in f16 and dots F16 K with its single-column kernel.
    // We follow it there so generation agrees with ggml's to the bit.
    let ggml_split_kv = qne[1] == 1 && qne[3] == 1 && kv_plain(node) && n_kv >= 512;
    let row_by_row = !ggml_split_kv && !ggml_tiled(node);
    let f16_acc = row_by_row && vt == GgmlType::F16;
    let f16_k_single = row_by_row && kt == GgmlType::F16;

    let (rk2, rv2) = (qne[2] / kne[2], qne[2] / vne[2]);
    let n_head = qne[2];
    let nrows = qne[1] * qne[2] * qne[3];
    let dnb1 = node.nb()[1];

    for ir in split_range(nrows, ctx.ith, ctx.nth) {
        let (iq1, iq2, iq3) = super::cpy::unflatten3(ir, qne[1], qne[2]);
        let slope = alibi_slope(max_bias, n_head, iq2);
        let qp = unsafe {
            std::slice::from_raw_parts(q.data().add(q.row_offset(iq1, iq2, iq3)) as *const f32, dk)
        };
        // q in K's dot type: f16/bf16 values kept as f32 (exact), or quantized blocks.
        let qdot: *const u8 = match kt {
            GgmlType::F32 => qp.as_ptr() as *const u8,
            GgmlType::F16 => {
                qbuf[..dk]
                    .iter_mut()
                    .zip(qp)
                    .for_each(|(d, &x)| *d = half::f16::from_f32(x).to_f32());
                qbuf.as_ptr() as *const u8
            }
            GgmlType::BF16 => {
                qbuf[..dk]
                    .iter_mut()
                    .zip(qp)
                    .for_each(|(d, &x)| *d = half::bf16::from_f32(x).to_f32());
                qbuf.as_ptr() as *const u8
            }
            _ => {
                unsafe {
                    (traits(ktr.vec_dot_type).unwrap().from_f32.unwrap())(
                        qp,
                        qbuf.as_mut_ptr() as *mut u8,
                    )
                };
                qbuf.as_ptr() as *const u8
            }
        };
        // q as f16 bits for the single-column K dot (once per query row).
        let mut qh = [0u16; 1024];
        let f16_k_single = f16_k_single && dk <= qh.len();
        if f16_k_single {
            qh[..dk]
                .iter_mut()
                .zip(qp)
                .for_each(|(h, &x)| *h = half::f16::from_f32(x).to_bits());
        }
        let mp = mask.map(|m| {
            let mne = m.ne();
            unsafe { m.data().add(m.row_offset(iq1, iq2 % mne[2], iq3 % mne[3])) as *const u16 }
        });
        let (ik2, iv2) = (iq2 / rk2, iq2 / rv2);

        acc.iter_mut().for_each(|a| *a = 0.0);
        let mut s_sum = 0f32;
        let mut m_max = f32::NEG_INFINITY;
        for ic in 0..n_kv {
            let mv = match mp {
                Some(p) => slope * half::f16::from_bits(unsafe { *p.add(ic) }).to_f32(),
                None => 0.0,
            };
            if mv == f32::NEG_INFINITY {
                continue;
            }
            let kp = unsafe { k.data().add(k.row_offset(ic, ik2, iq3)) };
            let mut s = unsafe {
                match kt {
                    GgmlType::F16 if f16_k_single => simd::dot_f16_f16_single_column(
                        std::slice::from_raw_parts(kp as *const u16, dk),
                        &qh[..dk],
                    ),
                    GgmlType::F32 => simd::dot_f32(
                        std::slice::from_raw_parts(kp as *const f32, dk),
                        std::slice::from_raw_parts(qdot as *const f32, dk),
                    ),
                    GgmlType::F16 => simd::dot_f16_f32(
                        std::slice::from_raw_parts(kp as *const u16, dk),
                        std::slice::from_raw_parts(qdot as *const f32, dk),
                    ),
                    GgmlType::BF16 => simd::dot_bf16_f32(
                        std::slice::from_raw_parts(kp as *const u16, dk),
                        std::slice::from_raw_parts(qdot as *const f32, dk),
                    ),
                    _ => (ktr.vec_dot.unwrap())(dk, kp, qdot),
                }
            };
            s *= scale;
            if softcap != 0.0 {
                s = softcap * s.tanh();
            }
            s += mv;

            let mut ms = 1.0f32;
            let mut vs = 1.0f32;
            if s > m_max {
                ms = (m_max - s).exp();
                m_max = s;
                if ms != 1.0 {
                    if f16_acc {
                        scale_f16_rounded(acc, ms);
                    } else {
                        acc.iter_mut().for_each(|a| *a *= ms);
                    }
                }
            } else {
                vs = (s - m_max).exp();
            }
            let vp = unsafe { v.data().add(v.row_offset(ic, iv2, iq3)) };
            if f16_acc {
                mad_f16_rounded(
                    acc,
                    unsafe { std::slice::from_raw_parts(vp as *const u16, dv) },
                    vs,
                );
            } else if vt == GgmlType::F16 {
                mad_f16(
                    acc,
                    unsafe { std::slice::from_raw_parts(vp as *const u16, dv) },
                    vs,
                );
            } else if vt == GgmlType::F32 {
                let vr = unsafe { std::slice::from_raw_parts(vp as *const f32, dv) };
                acc.iter_mut().zip(vr).for_each(|(a, &x)| *a += x * vs);
            } else {
                unsafe { v_to(vp, vrow) };
                acc.iter_mut()
                    .zip(vrow.iter())
                    .for_each(|(a, &x)| *a += x * vs);
            }
            // One fma: the compiler contracts ggml's `S = S*ms + vs` into one (GCC, FMA on).
            s_sum = s_sum.mul_add(ms, vs);
        }
        if let Some(sk) = sinks {
            let s = unsafe { *(sk.data() as *const f32).add(iq2) };
            let mut ms = 1.0f32;
            let mut vs = 1.0f32;
            if s > m_max {
                ms = (m_max - s).exp();
                acc.iter_mut().for_each(|a| *a *= ms);
            } else {
                vs = (s - m_max).exp();
            }
            s_sum = s_sum.mul_add(ms, vs);
        }
        let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
        // Output row (head iq2, query iq1, sequence iq3).
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                node.data()
                    .add((iq3 * qne[1] * qne[2] + iq1 * qne[2] + iq2) * dnb1)
                    as *mut f32,
                dv,
            )
        };
        out.iter_mut()
            .zip(acc.iter())
            .for_each(|(o, &a)| *o = a * inv);
    }
}

#[inline]
fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// acc = f16(acc * s): ggml's f16 accumulator being rescaled (values kept as f32).
fn scale_f16_rounded(acc: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd::level() >= simd::Level::Avx2 {
        return unsafe { f16_rounded_avx2(acc, None, s) };
    }
    acc.iter_mut().for_each(|a| *a = round_f16(*a * s));
}

/// acc = f16(fma(v, s, acc)): ggml's f16 accumulator taking one V row.
fn mad_f16_rounded(acc: &mut [f32], v: &[u16], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd::level() >= simd::Level::Avx2 {
        return unsafe { f16_rounded_avx2(acc, Some(v), s) };
    }
    acc.iter_mut()
        .zip(v)
        .for_each(|(a, &x)| *a = round_f16(half::f16::from_bits(x).to_f32().mul_add(s, *a)));
}

/// Both updates above with F16C conversions (round to nearest even, as the scalar path).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_rounded_avx2(acc: &mut [f32], v: Option<&[u16]>, s: f32) {
    use std::arch::x86_64::*;
    let n = acc.len();
    let vs = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        let a = _mm256_loadu_ps(acc.as_ptr().add(i));
        let r = match v {
            Some(v) => _mm256_fmadd_ps(
                _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i)),
                vs,
                a,
            ),
            None => _mm256_mul_ps(a, vs),
        };
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r);
        _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    while i < n {
        acc[i] = match v {
            Some(v) => round_f16(half::f16::from_bits(v[i]).to_f32().mul_add(s, acc[i])),
            None => round_f16(acc[i] * s),
        };
        i += 1;
    }
}

/// acc += v * s for an f16 row v.
fn mad_f16(acc: &mut [f32], v: &[u16], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd::level() >= simd::Level::Avx2 {
        return unsafe { mad_f16_avx2(acc, v, s) };
    }
    acc.iter_mut()
        .zip(v)
        .for_each(|(a, &x)| *a += half::f16::from_bits(x).to_f32() * s);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_f16_avx2(acc: &mut [f32], v: &[u16], s: f32) {
    use std::arch::x86_64::*;
    let n = acc.len().min(v.len());
    let vs = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
        let a = _mm256_loadu_ps(acc.as_ptr().add(i));
        _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(x, vs, a));
        i += 8;
    }
    while i < n {
        acc[i] += half::f16::from_bits(v[i]).to_f32() * s;
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: Option<&[f32]>,
        sinks: Option<&[f32]>,
        dk: usize,
        dv: usize,
        nq: usize,
        nh: usize,
        nkv: usize,
        nhkv: usize,
        scale: f32,
        softcap: f32,
    ) -> Vec<f32> {
        let mut out = vec![0f32; dv * nh * nq];
        for h in 0..nh {
            let hk = h / (nh / nhkv);
            for i in 0..nq {
                let mut logits = vec![0f64; nkv];
                for j in 0..nkv {
                    let mut s = 0f64;
                    for d in 0..dk {
                        s += q[(h * nq + i) * dk + d] as f64 * k[(hk * nkv + j) * dk + d] as f64;
                    }
                    s *= scale as f64;
                    if softcap != 0.0 {
                        s = softcap as f64 * (s / softcap as f64).tanh();
                    }
                    if let Some(m) = mask {
                        s += m[i * nkv + j] as f64;
                    }
                    logits[j] = s;
                }
                let mut mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if let Some(sk) = sinks {
                    mx = mx.max(sk[h] as f64);
                }
                let w: Vec<f64> = logits.iter().map(|&l| (l - mx).exp()).collect();
                let mut sum: f64 = w.iter().sum();
                if let Some(sk) = sinks {
                    sum += (sk[h] as f64 - mx).exp();
                }
                for d in 0..dv {
                    let mut a = 0f64;
                    for j in 0..nkv {
                        a += w[j] * v[(hk * nkv + j) * dv + d] as f64;
                    }
                    out[(i * nh + h) * dv + d] = (a / sum) as f32;
                }
            }
        }
        out
    }

    /// Shapes and mask of one comparison with `reference`; the mask hides key j from query i
    /// when j > i + `causal_offset`, other entries are small negative biases.
    struct Case {
        dk: usize,
        dv: usize,
        nq: usize,
        nh: usize,
        nkv: usize,
        nhkv: usize,
        mne1: usize,
        causal_offset: usize,
        bias_period: usize,
        bias_step: f32,
        scale: f32,
        seed: u32,
    }

    /// Runs FLASH_ATTN_EXT for K/V in F32 and F16, with/without mask, sinks and softcap, on
    /// 1 and 3 threads, against `reference` within `tol(kv type)`.
    fn check_against_reference(
        c: &Case,
        variants: &[(bool, bool, f32)],
        tol: impl Fn(GgmlType) -> f32,
    ) {
        let (dk, dv, nq, nh, nkv, nhkv, mne1) = (c.dk, c.dv, c.nq, c.nh, c.nkv, c.nhkv, c.mne1);
        for kvt in [GgmlType::F32, GgmlType::F16] {
            for &(use_mask, use_sinks, softcap) in variants {
                for nth in [1, 3] {
                    let mut q = TT::new(GgmlType::F32, [dk, nq, nh, 1]);
                    q.set(&rand_vec(dk * nq * nh, c.seed, -1.0, 1.0));
                    let mut k = TT::new(kvt, [dk, nkv, nhkv, 1]);
                    k.set(&rand_vec(dk * nkv * nhkv, c.seed + 1, -1.0, 1.0));
                    let mut v = TT::new(kvt, [dv, nkv, nhkv, 1]);
                    v.set(&rand_vec(dv * nkv * nhkv, c.seed + 2, -1.0, 1.0));
                    // Mask rows padded beyond the queries, as llama.cpp pads them.
                    let mvals: Vec<f32> = (0..nkv * mne1)
                        .map(|x| {
                            if x % nkv > c.causal_offset + x / nkv {
                                f32::NEG_INFINITY
                            } else {
                                ((x % c.bias_period) as f32) * c.bias_step
                            }
                        })
                        .collect();
                    let mut m = TT::new(GgmlType::F16, [nkv, mne1, 1, 1]);
                    m.set(&mvals);
                    let mut s = TT::new(GgmlType::F32, [nh, 1, 1, 1]);
                    s.set(&[0.5, -1.0, 2.0, 0.0]);
                    let mut d = TT::new(GgmlType::F32, [dv, nh, nq, 1]);
                    d.op(op::FLASH_ATTN_EXT)
                        .src(0, &q)
                        .src(1, &k)
                        .src(2, &v)
                        .pf(0, c.scale)
                        .pf(1, 0.0)
                        .pf(2, softcap);
                    if use_mask {
                        d.src(3, &m);
                    }
                    if use_sinks {
                        d.src(4, &s);
                    }
                    run(&d, nth);
                    let mut qv = q.get();
                    // The row-by-row path rounds q to f16 for F16 K; the tiled one (64+ queries) does not.
                    let tiled = nq >= 64
                        && cfg!(target_arch = "x86_64")
                        && crate::cpu::simd::level() >= crate::cpu::simd::Level::Avx2;
                    if kvt == GgmlType::F16 && !tiled {
                        qv.iter_mut()
                            .for_each(|x| *x = half::f16::from_f32(*x).to_f32());
                    }
                    let want = reference(
                        &qv,
                        &k.get(),
                        &v.get(),
                        use_mask.then_some(&m.get()[..]),
                        use_sinks.then_some(&s.get()[..]),
                        dk,
                        dv,
                        nq,
                        nh,
                        nkv,
                        nhkv,
                        c.scale,
                        softcap,
                    );
                    assert_close(&d.get(), &want, tol(kvt));
                }
            }
        }
    }

    #[test]
    fn flash_attn_matches_reference() {
        let c = Case {
            dk: 16,
            dv: 8,
            nq: 3,
            nh: 4,
            nkv: 11,
            nhkv: 2,
            mne1: 4,
            causal_offset: 8,
            bias_period: 5,
            bias_step: -0.25,
            scale: 0.3,
            seed: 1,
        };
        // F16 V with few queries accumulates in f16, as ggml-cpu does: f16 precision.
        let tol = |t| if t == GgmlType::F16 { 2e-3 } else { 1e-5 };
        check_against_reference(
            &c,
            &[
                (false, false, 0.0),
                (true, false, 0.0),
                (true, true, 0.0),
                (false, false, 20.0),
            ],
            tol,
        );
    }

    /// Enough queries for the tiled path: blocks cut short at both ends, a causal mask hiding
    /// whole key blocks, GQA, softcap and sinks.
    #[test]
    fn flash_attn_tiled_matches_reference() {
        let c = Case {
            dk: 64,
            dv: 40,
            nq: 70,
            nh: 4,
            nkv: 100,
            nhkv: 2,
            mne1: 72,
            causal_offset: 30,
            bias_period: 7,
            bias_step: -0.125,
            scale: 0.125,
            seed: 11,
        };
        check_against_reference(
            &c,
            &[
                (true, false, 0.0),
                (true, true, 0.0),
                (false, false, 0.0),
                (true, false, 30.0),
            ],
            |_| 1e-5,
        );
    }
}

#[cfg(test)]
mod bench {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    /// Timing probe (ignored by default): `cargo test --release fa_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn fa_timing() {
        let (d, nh, nhkv, nkv) = (64, 32, 8, 4096);
        for nq in [1usize, 64] {
            let mut q = TT::new(GgmlType::F32, [d, nq, nh, 1]);
            q.set(&rand_vec(d * nq * nh, 1, -1.0, 1.0));
            let mut k = TT::new(GgmlType::F16, [d, nkv, nhkv, 1]);
            k.set(&rand_vec(d * nkv * nhkv, 2, -1.0, 1.0));
            let mut v = TT::new(GgmlType::F16, [d, nkv, nhkv, 1]);
            v.set(&rand_vec(d * nkv * nhkv, 3, -1.0, 1.0));
            let mut o = TT::new(GgmlType::F32, [d, nh, nq, 1]);
            o.op(op::FLASH_ATTN_EXT)
                .src(0, &q)
                .src(1, &k)
                .src(2, &v)
                .pf(0, 0.125);
            let t = std::time::Instant::now();
            run(&o, 2);
            let s = t.elapsed().as_secs_f64();
            let flops = 4.0 * (d * nq * nh * nkv) as f64;
            println!(
                "fa nq={nq} n_kv={nkv}: {:.2} ms, {:.2} GFLOP/s",
                s * 1e3,
                flops / s / 1e9
            );
        }
    }
}
