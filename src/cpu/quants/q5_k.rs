//! Q5_K: Q4_K plus a fifth bit per value: super-blocks of 256 in 8 sub-blocks of 32 with 6-bit
//! scales and mins (Q4_K's packing); x = d*sc*q - dmin*m, q in 0..31. Bit 4 of value
//! 64c + l (l < 32) is bit 2c of qh[l], of value 64c + 32 + l bit 2c + 1.

use super::q4_k::{quantize_super_block, unpack_scales};
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

/// The 256 codes (0..31) of a super-block.
#[inline]
fn codes(b: &BlockQ5K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            let (ql, h) = (b.qs[32 * c + l], b.qh[l]);
            q[64 * c + l] = (ql & 0x0f) | (((h >> (2 * c)) & 1) << 4);
            q[64 * c + 32 + l] = (ql >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
        }
    }
    q
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of Q5_K (176 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ5K;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let (sc, mn) = unpack_scales(&b.scales);
        let q = codes(b);
        for j in 0..8 {
            let (s, m) = (d * sc[j] as f32, dmin * mn[j] as f32);
            for l in 0..32 {
                out[32 * j + l] = s * q[32 * j + l] as f32 - m;
            }
        }
    }
}

/// Quantizes `src` into Q5_K blocks as ggml-cpu does (see `q4_k::quantize_super_block`).
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK_K` blocks of Q5_K (176 bytes each).
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ5K;
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let b = &mut *blocks.add(i);
        let (d, dmin, scales, q) = quantize_super_block(x, 31, -0.5, 15);
        b.d = d;
        b.dmin = dmin;
        b.scales = scales;
        b.qh = [0; QK_K / 8];
        for c in 0..4 {
            for l in 0..32 {
                let (lo, hi) = (q[64 * c + l], q[64 * c + 32 + l]);
                b.qs[32 * c + l] = (lo & 0x0f) | ((hi & 0x0f) << 4);
                b.qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            }
        }
    }
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of Q5_K (176 bytes each, aligned to 2)
/// and `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ5K, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let (sc, mn) = unpack_scales(&bx.scales);
        let q = codes(bx);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..8 {
            let s: i32 = (0..32)
                .map(|l| q[32 * j + l] as i32 * by.qs[32 * j + l] as i32)
                .sum();
            sumi += sc[j] as i32 * s;
            summ += mn[j] as i32 * (by.bsums[2 * j] as i32 + by.bsums[2 * j + 1] as i32);
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
    use crate::cpu::quants::q4_k::unpack_scales_u64;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    /// One accumulator over the blocks for the scaled codes and the min terms summed as a
    /// scalar in block order: ggml-cpu's order (its Q4_K keeps the mins in a vector instead),
    /// so results agree with it to the bit.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ5K, y as *const BlockQ8K);
        let m4 = _mm256_set1_epi8(0x0f);
        let bit4 = _mm256_set1_epi8(0x10);
        let bcast = scale_broadcasts();
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let dd = f16_pair((bx as *const BlockQ5K as *const u32).read_unaligned());
            let d = _mm256_set1_ps(by.d * _mm_cvtss_f32(dd));
            let dmin = by.d * _mm_cvtss_f32(_mm_movehdup_ps(dd));
            let (sc, mn) = unpack_scales_u64(&bx.scales);
            let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
            let mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
            // Mins meet the activations only through their sums per 32 (pairs of bsums).
            let bs = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
            let bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            // Fused, as ggml-cpu's compiler contracts its `summs += dmin * sum`.
            summs = (-dmin).mul_add(hsum_i32_x4(_mm_madd_epi16(mn16, bs32)) as f32, summs);
            let scv = _mm256_broadcastsi128_si256(sc16);
            // Bit 0 of each byte of `h` is the fifth bit of the next sub-block, `h` shifted right
            // once per sub-block. What the 16-bit shifts carry in from the neighbouring byte
            // fills bits 7, 6, .. and would reach bit 0 only at the eighth shift, after the last use.
            let mut h = _mm256_loadu_si256(bx.qh.as_ptr() as *const __m256i);
            let mut sumi = _mm256_setzero_si256();
            for c in 0..4 {
                let q = _mm256_loadu_si256(bx.qs.as_ptr().add(32 * c) as *const __m256i);
                let lo = _mm256_or_si256(
                    _mm256_and_si256(q, m4),
                    _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4),
                );
                h = _mm256_srli_epi16(h, 1);
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                    _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4),
                );
                h = _mm256_srli_epi16(h, 1);
                let y0 = _mm256_loadu_si256(by.qs.as_ptr().add(64 * c) as *const __m256i);
                let y1 = _mm256_loadu_si256(by.qs.as_ptr().add(64 * c + 32) as *const __m256i);
                let p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(lo, y0),
                    _mm256_shuffle_epi8(scv, bcast[2 * c]),
                );
                let p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, y1),
                    _mm256_shuffle_epi8(scv, bcast[2 * c + 1]),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_f32(acc) + summs
    }
}

/// Q4_K's NEON kernel with the fifth bits ORed into the codes (0..31, still i8).
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use crate::cpu::quants::q4_k::unpack_scales_u64;
    use std::arch::aarch64::*;

    // h picks both the code half and its fifth-bit vector qh[h], and the activation
    // offset: an iterator over qh would hide the pairing.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ5K, y as *const BlockQ8K);
        let (m4, bit4) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x10));
        let mut sum = 0f32;
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let dd = f16x4((bx as *const BlockQ5K as *const u32).read_unaligned() as u64);
            let (sc, mn) = unpack_scales_u64(&bx.scales);
            // Mins meet the activations only through their sums per 32 (pairs of bsums).
            let bs = vpaddq_s16(
                vld1q_s16(by.bsums.as_ptr()),
                vld1q_s16(by.bsums.as_ptr().add(8)),
            );
            let mn16 = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(mn)));
            let summ = vaddvq_s32(vmlal_high_s16(
                vmull_s16(vget_low_s16(mn16), vget_low_s16(bs)),
                mn16,
                bs,
            ));
            // One i32x4 per sub-block: chunk c of 32 code bytes holds sub-block 2c in its low
            // nibbles and 2c + 1 in its high ones; their fifth bits are bits 2c and 2c + 1 of qh.
            let qh = [vld1q_u8(bx.qh.as_ptr()), vld1q_u8(bx.qh.as_ptr().add(16))];
            let mut p = [vdupq_n_s32(0); 8];
            for c in 0..4 {
                let (qx, qy) = (bx.qs.as_ptr().add(32 * c), by.qs.as_ptr().add(64 * c));
                // Shifts that move bit 2c (2c + 1) to bit 4 (negative: right).
                let (sl, sh) = (vdupq_n_s8(4 - 2 * c as i8), vdupq_n_s8(3 - 2 * c as i8));
                for h in 0..2 {
                    let q = vld1q_u8(qx.add(16 * h));
                    let lo = vorrq_u8(vandq_u8(q, m4), vandq_u8(vshlq_u8(qh[h], sl), bit4));
                    let hi = vorrq_u8(vshrq_n_u8::<4>(q), vandq_u8(vshlq_u8(qh[h], sh), bit4));
                    p[2 * c] = D::dot(p[2 * c], vreinterpretq_s8_u8(lo), vld1q_s8(qy.add(16 * h)));
                    p[2 * c + 1] = D::dot(
                        p[2 * c + 1],
                        vreinterpretq_s8_u8(hi),
                        vld1q_s8(qy.add(32 + 16 * h)),
                    );
                }
            }
            let sc16 = vmovl_u8(vcreate_u8(sc));
            let sc32 = [vmovl_u16(vget_low_u16(sc16)), vmovl_high_u16(sc16)]
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
            "Q5_K: not the expected NEON kernel"
        );
        for dot in [neon::vec_dot, vec_dot_fn()] {
            check_vec_dot(
                GgmlType::Q5_K,
                from_f32,
                to_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                dot,
                vec_dot_ref,
            );
            check_vec_dot_extremes(
                GgmlType::Q5_K,
                to_f32,
                &[0, 2],
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
        check_round_trip(GgmlType::Q5_K, from_f32, to_f32, 0.06);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q5_K,
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
            GgmlType::Q5_K,
            to_f32,
            &[0, 2],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
