//! Q6_K: super-blocks of 256 values in 16 sub-blocks of 16, each with a signed 8-bit scale,
//! under an f16 super-scale; x = d * sc * (q - 32), q in 0..63. Per half (128 values) n:
//! value 128n + 32k + l (k < 4, l < 32) has its low 4 bits in ql[64n + 32(k & 1) + l]
//! (low nibble for k < 2, high for k >= 2) and its top 2 bits at bit 2k of qh[32n + l].

use super::kquant_search::{fp32_to_fp16, make_qx_quants, nearest_int, GROUP_MAX_EPS};
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, use_neon, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// The 256 codes (0..63) of a super-block.
#[inline]
pub(crate) fn codes(b: &BlockQ6K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..2 {
        for l in 0..32 {
            let (a, c, h) = (b.ql[64 * n + l], b.ql[64 * n + 32 + l], b.qh[32 * n + l]);
            q[128 * n + l] = (a & 0x0f) | ((h & 3) << 4);
            q[128 * n + 32 + l] = (c & 0x0f) | (((h >> 2) & 3) << 4);
            q[128 * n + 64 + l] = (a >> 4) | (((h >> 4) & 3) << 4);
            q[128 * n + 96 + l] = (c >> 4) | (((h >> 6) & 3) << 4);
        }
    }
    q
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of Q6_K (210 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ6K;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        let q = codes(b);
        for j in 0..16 {
            let s = d * b.scales[j] as f32;
            for l in 0..16 {
                out[16 * j + l] = s * (q[16 * j + l] as i32 - 32) as f32;
            }
        }
    }
}

/// ggml's reference quantizer (`quantize_row_q6_K_ref`, what ggml-cpu's SET_ROWS runs), to the
/// bit: per sub-block of 16 a symmetric search weighted by x² on -32..31, the 16 scales
/// quantized to 8 bits against the one of largest magnitude, then the codes refitted.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK_K` blocks of Q6_K (210 bytes each).
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ6K;
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let b = &mut *blocks.add(i);
        let mut q = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = make_qx_quants(&x[16 * j..16 * j + 16], 32, &mut q[16 * j..16 * j + 16]);
            if scales[j].abs() > max_abs_scale {
                max_abs_scale = scales[j].abs();
                max_scale = scales[j];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *b = BlockQ6K {
                ql: [0; QK_K / 2],
                qh: [0; QK_K / 4],
                scales: [0; QK_K / 16],
                d: 0,
            };
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = fp32_to_fp16(1.0 / iscale);
        for (sc, &s) in b.scales.iter_mut().zip(&scales) {
            *sc = nearest_int(iscale * s).min(127) as i8;
        }
        let d_all = f16_to_f32(b.d);
        for j in 0..16 {
            let d = d_all * b.scales[j] as f32;
            if d == 0.0 {
                continue; // keeps the search's codes, as ggml does
            }
            for l in 0..16 {
                q[16 * j + l] = (nearest_int(x[16 * j + l] / d).clamp(-32, 31) + 32) as u8;
            }
        }
        b.ql = [0; QK_K / 2];
        b.qh = [0; QK_K / 4];
        for n in 0..2 {
            for l in 0..32 {
                let [q1, q2, q3, q4] = [0, 32, 64, 96].map(|o| q[128 * n + o + l]);
                b.ql[64 * n + l] = (q1 & 0x0f) | ((q3 & 0x0f) << 4);
                b.ql[64 * n + 32 + l] = (q2 & 0x0f) | ((q4 & 0x0f) << 4);
                b.qh[32 * n + l] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of Q6_K (210 bytes each, aligned to 2)
/// and `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ6K, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let q = codes(bx);
        let mut sumi = 0i32;
        for j in 0..16 {
            let s: i32 = (0..16)
                .map(|l| (q[16 * j + l] as i32 - 32) * by.qs[16 * j + l] as i32)
                .sum();
            sumi += bx.scales[j] as i32 * s;
        }
        sum += by.d * f16_to_f32(bx.d) * sumi as f32;
    }
    sum
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if super::use_avx512() {
        return avx512::vec_dot;
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return avx2::vec_dot;
    }
    #[cfg(target_arch = "aarch64")]
    if use_neon() {
        return if crate::cpu::simd::has_dotprod() {
            neon::vec_dot_sdot
        } else {
            neon::vec_dot
        };
    }
    let _ = (use_avx2, use_neon);
    vec_dot_ref
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ6K, y as *const BlockQ8K);
        let m4 = _mm256_set1_epi8(0x0f);
        let m30 = _mm256_set1_epi8(0x30);
        let pairs = scale_pairs();
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            // d is the block's last two bytes: a 32-bit load ending there puts it in lane 1.
            let dv = f16_pair((bx.scales.as_ptr().add(14) as *const u32).read_unaligned());
            let d = _mm256_set1_ps(by.d * _mm_cvtss_f32(_mm_movehdup_ps(dv)));
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(bx.scales.as_ptr() as *const __m128i));
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let ql0 = _mm256_loadu_si256(bx.ql.as_ptr().add(64 * h) as *const __m256i);
                let ql1 = _mm256_loadu_si256(bx.ql.as_ptr().add(64 * h + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(bx.qh.as_ptr().add(32 * h) as *const __m256i);
                // 16-bit shifts leak bits across bytes; the 0x30 mask drops exactly those.
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_and_si256(qh, m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                    ),
                ];
                // The 8 scales of this half, as i16, in both 128-bit lanes.
                let sh = if h == 0 {
                    _mm256_permute2x128_si256(sc, sc, 0x00)
                } else {
                    _mm256_permute2x128_si256(sc, sc, 0x11)
                };
                for k in 0..4 {
                    let yk =
                        _mm256_loadu_si256(by.qs.as_ptr().add(128 * h + 32 * k) as *const __m256i);
                    let s = _mm256_shuffle_epi8(sh, pairs[k]);
                    sumi = _mm256_add_epi32(
                        sumi,
                        _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], yk), s),
                    );
                }
            }
            // Codes are used unsigned (0..63); the -32 comes back through the per-16 sums,
            // subtracted in integers before the one conversion, as ggml-cpu does (bit-exact).
            let bsums = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
            sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(sc, bsums), 5));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_f32(acc)
    }

    /// `vec_dot` of R rows by C ≤ 4 columns, each pair summed exactly as `vec_dot` sums it:
    /// per super-block the same i32 lanes (integer sums, so their order is free), the same f32
    /// product, FMA and final sum. Per 32 codes, each row's codes and scale vector are made
    /// once for all columns and each column's 32 activations are loaded once for all rows.
    // The loop indices address the register tile, the row and column pointers and the
    // output together (as ggml's tiled kernels do): iterators would hide that.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile<const R: usize, const C: usize>(
        n: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        const { assert!(C <= 4) };
        let m4 = _mm256_set1_epi8(0x0f);
        let m30 = _mm256_set1_epi8(0x30);
        let pairs = scale_pairs();
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for i in 0..n / QK_K {
            let bx = |r: usize| &*(x.add(r * xs) as *const BlockQ6K).add(i);
            let by = |c: usize| &*(y.add(c * ys) as *const BlockQ8K).add(i);
            let mut dx = [0f32; R];
            let mut sc = [_mm256_setzero_si256(); R];
            for r in 0..R {
                let b = bx(r);
                if C == 1 {
                    // One column streams the matrix once: fetch the next tile's rows (the
                    // memory right after these R rows) while this one is summed.
                    let p = (b as *const BlockQ6K as *const i8).add(R * xs);
                    for o in [0, 64, 128, 192] {
                        _mm_prefetch::<_MM_HINT_T0>(p.add(o));
                    }
                }
                dx[r] = f16_load(&b.d);
                sc[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.scales.as_ptr() as *const __m128i));
            }
            let mut sumi = [[_mm256_setzero_si256(); C]; R];
            for h in 0..2 {
                // The 8 scales of this half, as i16, in both 128-bit lanes.
                let mut sh = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    sh[r] = if h == 0 {
                        _mm256_permute2x128_si256(sc[r], sc[r], 0x00)
                    } else {
                        _mm256_permute2x128_si256(sc[r], sc[r], 0x11)
                    };
                }
                for k in 0..4 {
                    let mut q = [_mm256_setzero_si256(); R];
                    let mut s = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let b = bx(r);
                        let ql = _mm256_loadu_si256(
                            b.ql.as_ptr().add(64 * h + 32 * (k & 1)) as *const __m256i
                        );
                        let qh = _mm256_loadu_si256(b.qh.as_ptr().add(32 * h) as *const __m256i);
                        // As vec_dot: 16-bit shifts leak bits across bytes; the 0x30 mask drops them.
                        let lo = if k < 2 {
                            _mm256_and_si256(ql, m4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4)
                        };
                        let hi = match k {
                            0 => _mm256_slli_epi16(qh, 4),
                            1 => _mm256_slli_epi16(qh, 2),
                            2 => qh,
                            _ => _mm256_srli_epi16(qh, 2),
                        };
                        q[r] = _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
                        s[r] = _mm256_shuffle_epi8(sh[r], pairs[k]);
                    }
                    for c in 0..C {
                        let yk = _mm256_loadu_si256(
                            by(c).qs.as_ptr().add(128 * h + 32 * k) as *const __m256i
                        );
                        for r in 0..R {
                            sumi[r][c] = _mm256_add_epi32(
                                sumi[r][c],
                                _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], yk), s[r]),
                            );
                        }
                    }
                }
            }
            for c in 0..C {
                let b = by(c);
                let bsums = _mm256_loadu_si256(b.bsums.as_ptr() as *const __m256i);
                for r in 0..R {
                    // The -32 of the codes, in integers before the conversion, as vec_dot.
                    let si = _mm256_sub_epi32(
                        sumi[r][c],
                        _mm256_slli_epi32(_mm256_madd_epi16(sc[r], bsums), 5),
                    );
                    // by.d · d: the product vec_dot forms.
                    acc[r][c] = _mm256_fmadd_ps(
                        _mm256_set1_ps(b.d * dx[r]),
                        _mm256_cvtepi32_ps(si),
                        acc[r][c],
                    );
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                *(out.add(r * 4 + c * os) as *mut f32) = hsum_f32(acc[r][c]);
            }
        }
    }
}

/// AVX-512: the AVX2 kernel with two of its 32-byte code vectors per instruction (k = 0, 1 and
/// k = 2, 3 of each half, over 64 contiguous code and activation bytes); the halves are added
/// before the one conversion per super-block, so the i32 lanes, and with them the result, are
/// the AVX2 kernel's to the bit.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::*;
    use crate::cpu::quants::avx512::join;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ6K, y as *const BlockQ8K);
        let m4 = _mm512_set1_epi8(0x0f);
        let m30 = _mm512_set1_epi8(0x30);
        // qh's 16-bit shifts: left by 4 | 2 for k = 0 | 1, right by 0 | 2 for k = 2 | 3.
        let shl = join(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
        let shr = join(_mm256_setzero_si256(), _mm256_set1_epi16(2));
        let pairs = scale_pairs();
        let tabs = [join(pairs[0], pairs[1]), join(pairs[2], pairs[3])];
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let dv = f16_pair((bx.scales.as_ptr().add(14) as *const u32).read_unaligned());
            let d = _mm256_set1_ps(by.d * _mm_cvtss_f32(_mm_movehdup_ps(dv)));
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(bx.scales.as_ptr() as *const __m128i));
            let mut sumi = _mm512_setzero_si512();
            for h in 0..2 {
                let ql = _mm512_loadu_si512(bx.ql.as_ptr().add(64 * h) as *const _);
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    bx.qh.as_ptr().add(32 * h) as *const __m256i
                ));
                // 16-bit shifts leak bits across bytes; the 0x30 mask drops exactly those.
                let q = [
                    _mm512_or_si512(
                        _mm512_and_si512(ql, m4),
                        _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30),
                    ),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                        _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30),
                    ),
                ];
                // The 8 scales of this half, as i16, in every 128-bit lane.
                let sh = _mm512_broadcast_i32x4(if h == 0 {
                    _mm256_castsi256_si128(sc)
                } else {
                    _mm256_extracti128_si256::<1>(sc)
                });
                for k in 0..2 {
                    let yk = _mm512_loadu_si512(by.qs.as_ptr().add(128 * h + 64 * k) as *const _);
                    let s = _mm512_shuffle_epi8(sh, tabs[k]);
                    sumi = _mm512_add_epi32(
                        sumi,
                        _mm512_madd_epi16(_mm512_maddubs_epi16(q[k], yk), s),
                    );
                }
            }
            let mut sumi = _mm256_add_epi32(
                _mm512_castsi512_si256(sumi),
                _mm512_extracti64x4_epi64::<1>(sumi),
            );
            let bsums = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
            sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(sc, bsums), 5));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_f32(acc)
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    /// Integer sums exactly as `vec_dot_ref` forms them, so the result is the reference's to the bit.
    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ6K, y as *const BlockQ8K);
        let (m4, m30, c32) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x30), vdupq_n_s8(32));
        let mut sum = 0f32;
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            // One i32x4 per sub-block of 16: vector (n, k, h) below holds sub-block 8n + 2k + h.
            let mut p = [vdupq_n_s32(0); 16];
            for n in 0..2 {
                for h in 0..2 {
                    let ql0 = vld1q_u8(bx.ql.as_ptr().add(64 * n + 16 * h));
                    let ql1 = vld1q_u8(bx.ql.as_ptr().add(64 * n + 32 + 16 * h));
                    let qh = vld1q_u8(bx.qh.as_ptr().add(32 * n + 16 * h));
                    let q = [
                        vorrq_u8(vandq_u8(ql0, m4), vandq_u8(vshlq_n_u8::<4>(qh), m30)),
                        vorrq_u8(vandq_u8(ql1, m4), vandq_u8(vshlq_n_u8::<2>(qh), m30)),
                        vorrq_u8(vshrq_n_u8::<4>(ql0), vandq_u8(qh, m30)),
                        vorrq_u8(vshrq_n_u8::<4>(ql1), vandq_u8(vshrq_n_u8::<2>(qh), m30)),
                    ];
                    for (k, &qk) in q.iter().enumerate() {
                        let yk = vld1q_s8(by.qs.as_ptr().add(128 * n + 32 * k + 16 * h));
                        p[8 * n + 2 * k + h] =
                            D::dot(vdupq_n_s32(0), vsubq_s8(vreinterpretq_s8_u8(qk), c32), yk);
                    }
                }
            }
            let sc8 = vld1q_s8(bx.scales.as_ptr());
            let (lo, hi) = (vmovl_s8(vget_low_s8(sc8)), vmovl_high_s8(sc8));
            let sc = [
                vmovl_s16(vget_low_s16(lo)),
                vmovl_high_s16(lo),
                vmovl_s16(vget_low_s16(hi)),
                vmovl_high_s16(hi),
            ];
            sum += by.d * f16(bx.d) * scaled_sum(&p, &sc) as f32;
        }
        sum
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        dot::<Widen>(n, x, y)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn vec_dot_sdot(n: usize, x: *const u8, y: *const u8) -> f32 {
        dot::<Sdot>(n, x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// The AVX-512 dot equals the AVX2 one to the bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_dot_equals_avx2() {
        check_same_dot(
            GgmlType::Q6_K,
            from_f32,
            &[208],
            GgmlType::Q8_K,
            q8_k::from_f32,
            avx512::vec_dot,
            avx2::vec_dot,
        );
    }

    /// The registered tile, and other shapes, equal the dispatched dot to the bit.
    #[test]
    fn tiles_equal_vec_dot() {
        // A prompt tile only: generation keeps vec_dot.
        check_tiles(
            GgmlType::Q6_K,
            from_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            vec_dot_fn(),
            &tiles(GgmlType::Q6_K)[..1],
        );
        assert!(tiles(GgmlType::Q6_K)[1].is_none());
        #[cfg(target_arch = "x86_64")]
        if use_avx2() {
            use crate::cpu::types::{DotTile, Tile};
            let tile = |rows, cols, dot: DotTile| Tile { rows, cols, dot };
            let shapes = [
                tile(2, 4, avx2::tile::<2, 4>),
                tile(4, 1, avx2::tile::<4, 1>),
                tile(1, 1, avx2::tile::<1, 1>),
                tile(3, 2, avx2::tile::<3, 2>),
                tile(2, 2, avx2::tile::<2, 2>),
                tile(1, 4, avx2::tile::<1, 4>),
                tile(3, 4, avx2::tile::<3, 4>),
            ];
            check_tiles(
                GgmlType::Q6_K,
                from_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                vec_dot_fn(),
                &shapes.map(Some),
            );
            check_tiles_raw(
                GgmlType::Q6_K,
                &[208],
                GgmlType::Q8_K,
                q8_k::from_f32,
                vec_dot_fn(),
                &shapes,
            );
        }
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q6_K, from_f32, to_f32, 0.04);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q6_K,
            from_f32,
            to_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    /// SDOT is dispatched where the CPU has it; the base-NEON dot (dispatched elsewhere) is
    /// checked here too.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_kernels() {
        let want = if crate::cpu::simd::has_dotprod() {
            neon::vec_dot_sdot
        } else {
            neon::vec_dot
        };
        assert_eq!(
            vec_dot_fn() as usize,
            want as usize,
            "Q6_K: not the expected NEON kernel"
        );
        check_vec_dot(
            GgmlType::Q6_K,
            from_f32,
            to_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
        check_vec_dot_extremes(
            GgmlType::Q6_K,
            to_f32,
            &[208],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q6_K,
            to_f32,
            &[208],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
