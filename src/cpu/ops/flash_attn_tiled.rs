//! FLASH_ATTN_EXT for many queries at once (prompts). Blocks of `BQ` query rows of one head
//! meet blocks of `BK` keys: S = Q·Kᵀ as a small register-blocked GEMM on a transposed f32 copy
//! of the key block, the online softmax over the block with a vector exp, then O += P·V.
//! Key blocks the mask hides from every row of the query block (the upper triangle of causal
//! attention) are skipped whole. ggml-cpu switches to a tiled algorithm in the same cases; this
//! one does each row's arithmetic in the same order (f32 q, one fma chain per score, scale after
//! the dot, 64-key blocks for the running max, Arm's vector exp, block sums in f64, one fma
//! chain per output value), so prompts agree with ggml's to the bit.

use super::Ctx;
use crate::cpu::simd;
use crate::ggml_types::GgmlType;
use crate::tensor::Tensor;

const BQ: usize = 32;
// ggml-cpu's key block (GGML_FA_TILE_KV): the running max and the sums step by it.
const BK: usize = 64;

/// Everything the kernel needs, read once from the node.
// Only the AVX2 kernel reads it; elsewhere `usable` is false.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct Params {
    pub scale: f32,
    pub softcap: f32,
    pub max_bias: f32,
}

/// Whether this path computes `node`: F16 or F32 K and V, head sizes in whole vectors, AVX2.
pub fn usable(node: &Tensor) -> bool {
    let (k, v) = (node.src(1).unwrap(), node.src(2).unwrap());
    let plain = |t: GgmlType| matches!(t, GgmlType::F16 | GgmlType::F32);
    cfg!(target_arch = "x86_64")
        && simd::level() >= simd::Level::Avx2
        && plain(k.dtype())
        && plain(v.dtype())
        && k.ne()[0] % 8 == 0
        && v.ne()[0] % 8 == 0
}

/// f32 scratch per thread.
pub fn scratch_floats(dk: usize, dv: usize) -> usize {
    BQ * dk + dk * BK + BK * dv + BQ * BK + BQ * dv + 2 * BQ + 16
}

pub fn compute(node: &Tensor, ctx: &Ctx, p: &Params, scratch: *mut f32) {
    let q = node.src(0).unwrap();
    let qne = q.ne();
    let nqb = qne[1].div_ceil(BQ);
    let units = nqb * qne[2] * qne[3];
    // Later query blocks see more keys (causal masks): units are handed out in chunks, heads
    // fastest, so no thread is left with only the longest blocks. (A fixed interleave with the
    // query blocks fastest gave thread t only block t when the threads were as many as the
    // blocks: 16 threads, 512 queries; the busiest 1.8x the mean.)
    let heads = qne[2] * qne[3];
    for u in ctx.chunks(units) {
        let (qb, iq2, iq3) = (u / heads, u % qne[2], (u % heads) / qne[2]);
        #[cfg(target_arch = "x86_64")]
        unsafe {
            avx2::unit(node, p, scratch, qb * BQ, iq2, iq3)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (p, scratch, qb, iq2, iq3);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::cpu::simd::x86::{exp_ps, hsum};
    use std::arch::x86_64::*;

    /// 8 rows of 8 floats → 8 columns of 8 floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t = [
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        ];
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xee>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xee>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xee>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xee>(t[5], t[7]),
        ];
        [
            _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
            _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
            _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
            _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
            _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
            _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
            _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
            _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
        ]
    }

    /// 8 elements of an F16 or F32 row as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(t: GgmlType, p: *const u8, i: usize) -> __m256 {
        match t {
            GgmlType::F16 => {
                _mm256_cvtph_ps(_mm_loadu_si128((p as *const u16).add(i) as *const __m128i))
            }
            _ => _mm256_loadu_ps((p as *const f32).add(i)),
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// One block of query rows `i0..i0 + BQ` (clipped) of head `iq2`, sequence `iq3`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn unit(
        node: &Tensor,
        p: &Params,
        scratch: *mut f32,
        i0: usize,
        iq2: usize,
        iq3: usize,
    ) {
        let (q, k, v) = (
            node.src(0).unwrap(),
            node.src(1).unwrap(),
            node.src(2).unwrap(),
        );
        let (qne, kne, vne) = (q.ne(), k.ne(), v.ne());
        let (dk, dv, n_kv) = (kne[0], vne[0], kne[1]);
        let nq = BQ.min(qne[1] - i0);
        let (kt, vt) = (k.dtype(), v.dtype());
        let (knb, vnb) = (k.nb(), v.nb());
        let kbase = k
            .data()
            .add((iq2 / (qne[2] / kne[2])) * knb[2] + iq3 * knb[3]);
        let vbase = v
            .data()
            .add((iq2 / (qne[2] / vne[2])) * vnb[2] + iq3 * vnb[3]);
        let slope = super::super::softmax::alibi_slope(p.max_bias, qne[2], iq2);

        let qs = scratch;
        let kts = qs.add(BQ * dk);
        let vs = kts.add(dk * BK);
        let ss = vs.add(BK * dv);
        let os = ss.add(BQ * BK);
        let ms = os.add(BQ * dv);
        let ls = ms.add(BQ);

        // Q rows in f32 (ggml's tiled path does not round q to K's type); rows past the end
        // are zero.
        let sc = _mm256_set1_ps(p.scale);
        for r in 0..BQ {
            for d in (0..dk).step_by(8) {
                let x = if r < nq {
                    _mm256_loadu_ps(
                        (q.data().add(q.row_offset(i0 + r, iq2, iq3)) as *const f32).add(d),
                    )
                } else {
                    _mm256_setzero_ps()
                };
                _mm256_storeu_ps(qs.add(r * dk + d), x);
            }
            *ms.add(r) = f32::NEG_INFINITY;
            *ls.add(r) = 0.0;
        }
        std::ptr::write_bytes(os, 0, BQ * dv);
        let mask_row = |r: usize| {
            node.src(3).map(|m| {
                let mne = m.ne();
                m.data()
                    .add(m.row_offset(i0 + r, iq2 % mne[2], iq3 % mne[3]))
                    as *const u16
            })
        };
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);

        for j0 in (0..n_kv).step_by(BK) {
            let nk = BK.min(n_kv - j0);
            // The mask (times the ALiBi slope) into S; keys past the end are -inf.
            let mut visible = false;
            for r in 0..BQ {
                let mp = if r < nq { mask_row(r) } else { None };
                for c in (0..BK).step_by(8) {
                    let mut x = match mp {
                        Some(mp) if c + 8 <= nk => _mm256_mul_ps(
                            _mm256_cvtph_ps(_mm_loadu_si128(mp.add(j0 + c) as *const __m128i)),
                            _mm256_set1_ps(slope),
                        ),
                        Some(mp) => {
                            let mut t = [f32::NEG_INFINITY; 8];
                            for (e, tv) in t.iter_mut().enumerate().take(nk.saturating_sub(c)) {
                                *tv = slope * half::f16::from_bits(*mp.add(j0 + c + e)).to_f32();
                            }
                            _mm256_loadu_ps(t.as_ptr())
                        }
                        None if r < nq => {
                            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                            let inside =
                                _mm256_cmpgt_epi32(_mm256_set1_epi32((nk as i32) - c as i32), lane);
                            _mm256_blendv_ps(ninf, _mm256_setzero_ps(), _mm256_castsi256_ps(inside))
                        }
                        None => ninf,
                    };
                    if r >= nq {
                        x = ninf;
                    }
                    visible |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_OQ>(x, ninf)) != 0;
                    _mm256_storeu_ps(ss.add(r * BK + c), x);
                }
            }
            if !visible {
                continue;
            }
            // Kᵀ and V of the block in f32; keys past the end are zero (their weight is 0).
            for c in (0..BK).step_by(8) {
                for d in (0..dk).step_by(8) {
                    let rows = std::array::from_fn(|e| {
                        if c + e < nk {
                            load8(kt, kbase.add((j0 + c + e) * knb[1]), d)
                        } else {
                            _mm256_setzero_ps()
                        }
                    });
                    for (e, col) in transpose8(rows).into_iter().enumerate() {
                        _mm256_storeu_ps(kts.add((d + e) * BK + c), col);
                    }
                }
            }
            for c in 0..BK {
                for d in (0..dv).step_by(8) {
                    let x = if c < nk {
                        load8(vt, vbase.add((j0 + c) * vnb[1]), d)
                    } else {
                        _mm256_setzero_ps()
                    };
                    _mm256_storeu_ps(vs.add(c * dv + d), x);
                }
            }
            // S = (Q·Kᵀ)·scale [softcapped] + mask, two query rows by 32 keys at a time; each
            // score is one fma chain over d from 0, as in ggml.
            for r in (0..nq).step_by(2) {
                for c0 in (0..BK).step_by(32) {
                    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
                    for d in 0..dk {
                        let kv = [0, 8, 16, 24].map(|c| _mm256_loadu_ps(kts.add(d * BK + c0 + c)));
                        for (h, a) in acc.iter_mut().enumerate() {
                            let qv = _mm256_broadcast_ss(&*qs.add((r + h) * dk + d));
                            for (av, &kvv) in a.iter_mut().zip(&kv) {
                                *av = _mm256_fmadd_ps(qv, kvv, *av);
                            }
                        }
                    }
                    for (h, a) in acc.iter().enumerate() {
                        for (cc, &av) in a.iter().enumerate() {
                            let sp = ss.add((r + h) * BK + c0 + cc * 8);
                            let mut x = _mm256_mul_ps(av, sc);
                            if p.softcap != 0.0 {
                                let mut t = [0f32; 8];
                                _mm256_storeu_ps(t.as_mut_ptr(), x);
                                t.iter_mut().for_each(|e| *e = e.tanh() * p.softcap);
                                x = _mm256_loadu_ps(t.as_ptr());
                            }
                            _mm256_storeu_ps(sp, _mm256_add_ps(x, _mm256_loadu_ps(sp)));
                        }
                    }
                }
            }
            // Online softmax: S becomes P, O and l are rescaled to the new running max.
            for r in 0..nq {
                let row = ss.add(r * BK);
                let mut mx = _mm256_loadu_ps(row);
                for c in (8..BK).step_by(8) {
                    mx = _mm256_max_ps(mx, _mm256_loadu_ps(row.add(c)));
                }
                let block_max = hmax(mx);
                if block_max == f32::NEG_INFINITY {
                    std::ptr::write_bytes(row, 0, BK);
                    continue;
                }
                let m_old = *ms.add(r);
                let m_new = m_old.max(block_max);
                if m_new > m_old {
                    let alpha = (m_old - m_new).exp();
                    *ls.add(r) *= alpha;
                    let o = os.add(r * dv);
                    for d in (0..dv).step_by(8) {
                        _mm256_storeu_ps(
                            o.add(d),
                            _mm256_mul_ps(_mm256_loadu_ps(o.add(d)), _mm256_set1_ps(alpha)),
                        );
                    }
                }
                *ms.add(r) = m_new;
                let mut sum = 0f64;
                for c in (0..BK).step_by(8) {
                    let e = exp_ps(_mm256_sub_ps(
                        _mm256_loadu_ps(row.add(c)),
                        _mm256_set1_ps(m_new),
                    ));
                    sum += hsum(e) as f64;
                    _mm256_storeu_ps(row.add(c), e);
                }
                *ls.add(r) = (*ls.add(r) as f64 + sum) as f32;
            }
            // O += P·V, two query rows by 32 output values at a time.
            for r in (0..nq).step_by(2) {
                let h_rows = if r + 1 < nq { 2 } else { 1 };
                for d0 in (0..dv).step_by(32) {
                    let w = (dv - d0).min(32) / 8;
                    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
                    for (h, a) in acc.iter_mut().enumerate().take(h_rows) {
                        for (i, av) in a.iter_mut().enumerate().take(w) {
                            *av = _mm256_loadu_ps(os.add((r + h) * dv + d0 + i * 8));
                        }
                    }
                    for c in 0..nk {
                        let vv: [__m256; 4] = std::array::from_fn(|i| {
                            if i < w {
                                _mm256_loadu_ps(vs.add(c * dv + d0 + i * 8))
                            } else {
                                _mm256_setzero_ps()
                            }
                        });
                        for (h, a) in acc.iter_mut().enumerate().take(h_rows) {
                            let pv = _mm256_broadcast_ss(&*ss.add((r + h) * BK + c));
                            for (av, &x) in a.iter_mut().zip(&vv).take(w) {
                                *av = _mm256_fmadd_ps(pv, x, *av);
                            }
                        }
                    }
                    for (h, a) in acc.iter().enumerate().take(h_rows) {
                        for (i, &av) in a.iter().enumerate().take(w) {
                            _mm256_storeu_ps(os.add((r + h) * dv + d0 + i * 8), av);
                        }
                    }
                }
            }
        }

        // Attention sinks: one more logit per head with no value row.
        let sink = node.src(4).map(|s| *(s.data() as *const f32).add(iq2));
        let dnb1 = node.nb()[1];
        for r in 0..nq {
            let (m, mut l) = (*ms.add(r), *ls.add(r));
            let o = os.add(r * dv);
            if let Some(s) = sink {
                if s > m {
                    let alpha = (m - s).exp();
                    for d in (0..dv).step_by(8) {
                        _mm256_storeu_ps(
                            o.add(d),
                            _mm256_mul_ps(_mm256_loadu_ps(o.add(d)), _mm256_set1_ps(alpha)),
                        );
                    }
                    l = l.mul_add(alpha, 1.0); // ggml's S*ms + vs, contracted by its compiler
                } else {
                    l += (s - m).exp();
                }
            }
            let inv = if l == 0.0 { 0.0 } else { 1.0 / l };
            let out = node
                .data()
                .add((iq3 * qne[1] * qne[2] + (i0 + r) * qne[2] + iq2) * dnb1)
                as *mut f32;
            let iv = _mm256_set1_ps(inv);
            for d in (0..dv).step_by(8) {
                _mm256_storeu_ps(out.add(d), _mm256_mul_ps(_mm256_loadu_ps(o.add(d)), iv));
            }
        }
    }
}
