//! Q2_K: super-blocks of 256 values in 16 sub-blocks of 16, each with a 4-bit scale and a
//! 4-bit min in one byte, under f16 super-scales; x = d*sc*q - dmin*m, q in 0..3. Value
//! 128n + 32j + l sits at bit 2j of qs[32n + l].

use super::kquant_search::{fp32_to_fp16, make_qkx2_quants, nearest_int, Qkx2};
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: u16,
    pub dmin: u16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

#[inline]
fn codes(b: &BlockQ2K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                q[128 * n + 32 * j + l] = (b.qs[32 * n + l] >> (2 * j)) & 3;
            }
        }
    }
    q
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of Q2_K (84 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ2K;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let q = codes(b);
        for j in 0..16 {
            let (s, m) = (
                d * (b.scales[j] & 0x0f) as f32,
                dmin * (b.scales[j] >> 4) as f32,
            );
            for l in 0..16 {
                out[16 * j + l] = s * q[16 * j + l] as f32 - m;
            }
        }
    }
}

/// ggml's reference quantizer (`quantize_row_q2_K_ref`, what ggml-cpu's SET_ROWS runs), to the
/// bit: per sub-block of 16 a weighted (|x|) asymmetric search on 0..3, then the scales and
/// mins quantized to 4 bits against the largest of each, then the codes refitted.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK_K` blocks of Q2_K (84 bytes each).
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ2K;
    let search = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let b = &mut *blocks.add(i);
        let mut q = [0u8; QK_K];
        let mut laux = [0u8; 16];
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
            let qs = &mut q[16 * j..16 * j + 16];
            (scales[j], mins[j]) = make_qkx2_quants(xs, &weights, qs, &mut laux, &search);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let mut sc = [0u8; 16];
        b.d = 0;
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for j in 0..16 {
                sc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = fp32_to_fp16(max_scale / 15.0);
        }
        b.dmin = 0;
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for j in 0..16 {
                sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            b.dmin = fp32_to_fp16(max_min / 15.0);
        }
        b.scales = sc;
        let (d_all, dmin_all) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        for j in 0..16 {
            let d = d_all * (sc[j] & 0x0f) as f32;
            if d == 0.0 {
                continue; // keeps the search's codes, as ggml does
            }
            let dm = dmin_all * (sc[j] >> 4) as f32;
            for l in 0..16 {
                q[16 * j + l] = nearest_int((x[16 * j + l] + dm) / d).clamp(0, 3) as u8;
            }
        }
        b.qs = [0; QK_K / 4];
        for n in 0..2 {
            for j in 0..4 {
                for l in 0..32 {
                    b.qs[32 * n + l] |= q[128 * n + 32 * j + l] << (2 * j);
                }
            }
        }
    }
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of Q2_K (84 bytes each, aligned to 2)
/// and `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ2K, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let q = codes(bx);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..16 {
            let s: i32 = (0..16)
                .map(|l| q[16 * j + l] as i32 * by.qs[16 * j + l] as i32)
                .sum();
            sumi += (bx.scales[j] & 0x0f) as i32 * s;
            summ += (bx.scales[j] >> 4) as i32 * by.bsums[j] as i32;
        }
        sum += by.d * (f16_to_f32(bx.d) * sumi as f32 - f16_to_f32(bx.dmin) * summ as f32);
    }
    sum
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return avx2::vec_dot;
    }
    #[cfg(target_arch = "aarch64")]
    if super::use_neon() {
        return if crate::cpu::simd::has_dotprod() {
            neon::vec_dot_sdot
        } else {
            neon::vec_dot
        };
    }
    let _ = use_avx2;
    vec_dot_ref
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    /// One accumulator over the blocks, taking each block's min term and then its scaled
    /// codes, then a horizontal sum: ggml-cpu's order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ2K, y as *const BlockQ8K);
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0f);
        let pairs = scale_pairs();
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let dd = f16_pair((&bx.d as *const u16 as *const u32).read_unaligned());
            let d = _mm256_set1_ps(by.d * _mm_cvtss_f32(dd));
            let dmin = _mm256_set1_ps(-(by.d * _mm_cvtss_f32(_mm_movehdup_ps(dd))));
            let packed = _mm_loadu_si128(bx.scales.as_ptr() as *const __m128i);
            let sc = _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4));
            let mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
            // Mins meet the activations only through their sums per 16.
            let bsums = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
            acc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(_mm256_madd_epi16(mn, bsums)), acc);
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let q2 = _mm256_loadu_si256(bx.qs.as_ptr().add(32 * h) as *const __m256i);
                // 16-bit shifts leak bits across bytes; the mask to 2 bits drops them.
                let q = [
                    _mm256_and_si256(q2, m3),
                    _mm256_and_si256(_mm256_srli_epi16(q2, 2), m3),
                    _mm256_and_si256(_mm256_srli_epi16(q2, 4), m3),
                    _mm256_and_si256(_mm256_srli_epi16(q2, 6), m3),
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
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_f32(acc)
    }
}

/// Integer sums per sub-block as `vec_dot_ref` forms them.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ2K, y as *const BlockQ8K);
        let m3 = vdupq_n_u8(3);
        let mut sum = 0f32;
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let dd = f16x4((&bx.d as *const u16 as *const u32).read_unaligned() as u64);
            let packed = vld1q_u8(bx.scales.as_ptr());
            let (sc, mn) = (vandq_u8(packed, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(packed));
            // Mins meet the activations only through their sums per 16.
            let (bs0, bs1) = (
                vld1q_s16(by.bsums.as_ptr()),
                vld1q_s16(by.bsums.as_ptr().add(8)),
            );
            let (m0, m1) = (
                vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn))),
                vreinterpretq_s16_u16(vmovl_high_u8(mn)),
            );
            let sm = vmlal_high_s16(
                vmlal_s16(
                    vmlal_high_s16(vmull_s16(vget_low_s16(m0), vget_low_s16(bs0)), m0, bs0),
                    vget_low_s16(m1),
                    vget_low_s16(bs1),
                ),
                m1,
                bs1,
            );
            let summ = vaddvq_s32(sm);
            // One i32x4 per sub-block of 16: value 128n + 32j + l sits at bits 2j of
            // qs[32n + l], in sub-block 8n + 2j + l / 16.
            let mut p = [vdupq_n_s32(0); 16];
            for n in 0..2 {
                for h in 0..2 {
                    let q2 = vld1q_u8(bx.qs.as_ptr().add(32 * n + 16 * h));
                    for j in 0..4 {
                        let q = vandq_u8(vshlq_u8(q2, vdupq_n_s8(-2 * j as i8)), m3);
                        let yq = vld1q_s8(by.qs.as_ptr().add(128 * n + 32 * j + 16 * h));
                        p[8 * n + 2 * j + h] = D::dot(vdupq_n_s32(0), vreinterpretq_s8_u8(q), yq);
                    }
                }
            }
            let (s0, s1) = (vmovl_u8(vget_low_u8(sc)), vmovl_high_u8(sc));
            let sc32 = [
                vmovl_u16(vget_low_u16(s0)),
                vmovl_high_u16(s0),
                vmovl_u16(vget_low_u16(s1)),
                vmovl_high_u16(s1),
            ]
            .map(|v| vreinterpretq_s32_u32(v));
            let sumi = scaled_sum(&p, &sc32);
            sum += by.d
                * (vgetq_lane_f32::<0>(dd) * sumi as f32 - vgetq_lane_f32::<1>(dd) * summ as f32);
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
            "Q2_K: not the expected NEON kernel"
        );
        for dot in [neon::vec_dot, vec_dot_fn()] {
            check_vec_dot(
                GgmlType::Q2_K,
                from_f32,
                to_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                dot,
                vec_dot_ref,
            );
            check_vec_dot_extremes(
                GgmlType::Q2_K,
                to_f32,
                &[80, 82],
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                dot,
                vec_dot_ref,
            );
        }
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q2_K, from_f32, to_f32, 0.45);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q2_K,
            from_f32,
            to_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q2_K,
            to_f32,
            &[80, 82],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
