//! TQ2_0 (ternary, from BitNet-style models): super-blocks of 256 values, 64 bytes of 2-bit
//! codes then one f16 scale; x = d * (q - 1) with q in 0..=3 (a ternary quantizer writes 0..=2;
//! 3 decodes to 2d, as in ggml). Byte j of each 32-byte half holds, in bit pair l, element
//! half * 128 + l * 32 + j. Multiplied with Q8_K (ggml-cpu's vec_dot_type for it). No quantizer:
//! CPY and SET_ROWS into TQ2_0 are not claimed (weights only, as IQ4_XS).

use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockTq2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: u16,
}
const _: () = assert!(size_of::<BlockTq2_0>() == 66);

/// Element `k` of a block's codes (0..=3).
#[inline]
fn code(b: &BlockTq2_0, k: usize) -> i32 {
    let (half, l, j) = (k / 128, (k % 128) / 32, k % 32);
    ((b.qs[half * 32 + j] >> (2 * l)) & 3) as i32
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of TQ2_0 (66 bytes each), aligned
/// to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockTq2_0;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (k, o) in out.iter_mut().enumerate() {
            *o = (code(b, k) - 1) as f32 * d;
        }
    }
}

/// ggml's portable order: per super-block the exact integer dot times dy * d, summed in one f32.
///
/// # Safety
/// `x` must point to `n / QK_K` readable blocks of TQ2_0 (66 bytes each, aligned to 2) and `y`
/// to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockTq2_0, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let mut sumi = 0i32;
        for k in 0..QK_K {
            sumi += by.qs[k] as i32 * (code(bx, k) - 1);
        }
        sum += sumi as f32 * (by.d * f16_to_f32(bx.d));
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
pub(super) mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: the codes (unsigned,
    /// 0..=3) times the activations in byte pairs, summed as i16 (|sum| <= 8 * 3 * 128: no
    /// overflow), minus the activations' 16-value sums (the -1 of every code), widened to 8
    /// lanes of i32; per super-block one multiply-add by dy * d per lane, lanes summed at the
    /// end.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockTq2_0, y as *const BlockQ8K);
        let m3 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for half in 0..2 {
                let q = _mm256_loadu_si256(bx.qs.as_ptr().add(half * 32) as *const __m256i);
                let yq = |l: usize| {
                    _mm256_loadu_si256(by.qs.as_ptr().add(half * 128 + l * 32) as *const __m256i)
                };
                let p0 = _mm256_maddubs_epi16(_mm256_and_si256(q, m3), yq(0));
                let p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 2), m3), yq(1));
                let p2 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m3), yq(2));
                let p3 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 6), m3), yq(3));
                s0 = _mm256_add_epi16(s0, _mm256_add_epi16(p0, p1));
                s1 = _mm256_add_epi16(s1, _mm256_add_epi16(p2, p3));
            }
            let bsums = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
            let s = _mm256_sub_epi16(_mm256_add_epi16(s0, s1), bsums);
            let s = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
            let d = _mm256_set1_ps(by.d * f16(bx.d));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
        }
        hsum_f32(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition: element half * 128 + l * 32 + j in bit pair l of
    /// byte half * 32 + j, value d * (q - 1).
    #[test]
    fn to_f32_by_definition() {
        let mut b = BlockTq2_0 {
            qs: [0; QK_K / 4],
            d: super::super::f32_to_f16(0.25),
        };
        let want_code = |k: usize| ((k * 7 + k / 32) % 4) as u8;
        for k in 0..QK_K {
            let (half, l, j) = (k / 128, (k % 128) / 32, k % 32);
            b.qs[half * 32 + j] |= want_code(k) << (2 * l);
        }
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockTq2_0 as *const u8, &mut out) };
        for (k, &o) in out.iter().enumerate() {
            assert_eq!(o, 0.25 * (want_code(k) as f32 - 1.0), "k={k}");
        }
    }

    /// The dispatched (AVX2) dot and the scalar one approximate the product of the dequantized
    /// values, on raw random blocks against random and full-scale activations (Q8_K codes up to
    /// ±127, where the i16 sums come closest to overflowing).
    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let dots = [vec_dot_fn(), vec_dot_ref as VecDot];
            let qx = raw_rows(GgmlType::TQ2_0, &[64], n, 1, nb as u32);
            let all_minus = vec![-1.0; n];
            check_dots_dequantized(
                &qx,
                n,
                to_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                &dots,
                &[all_minus],
                nb as u32,
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_dispatched() {
        if use_avx2() {
            assert_eq!(vec_dot_fn() as usize, avx2::vec_dot as VecDot as usize);
        }
    }
}
