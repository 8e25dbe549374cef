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

pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ5K;
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let b = &mut *blocks.add(i);
        let (d, dmin, scales, q) = quantize_super_block(x, 31);
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

pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ5K, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let (sc, mn) = unpack_scales(&bx.scales);
        let q = codes(bx);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..8 {
            let s: i32 = (0..32).map(|l| q[32 * j + l] as i32 * by.qs[32 * j + l] as i32).sum();
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
                let lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
                h = _mm256_srli_epi16(h, 1);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
                h = _mm256_srli_epi16(h, 1);
                let y0 = _mm256_loadu_si256(by.qs.as_ptr().add(64 * c) as *const __m256i);
                let y1 = _mm256_loadu_si256(by.qs.as_ptr().add(64 * c + 32) as *const __m256i);
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), _mm256_shuffle_epi8(scv, bcast[2 * c]));
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), _mm256_shuffle_epi8(scv, bcast[2 * c + 1]));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_f32(acc) + summs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q5_K, from_f32, to_f32, 0.06);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(GgmlType::Q5_K, from_f32, to_f32, GgmlType::Q8_K, q8_k::from_f32, q8_k::to_f32, vec_dot_fn(), vec_dot_ref);
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(GgmlType::Q5_K, to_f32, &[0, 2], GgmlType::Q8_K, q8_k::from_f32, q8_k::to_f32, vec_dot_fn(), vec_dot_ref);
    }
}
