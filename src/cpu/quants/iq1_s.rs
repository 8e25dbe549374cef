//! IQ1_S (1.56 bits per value): super-blocks of 256 values, an f16 scale `d`, 32 index bytes
//! and per sub-block of 32 a u16 holding the indices' high bits (3 per group of 8 values:
//! 11-bit indices into `IQ1S_GRID`, 8 values in {-1, 0, 1} each), a 3-bit scale s and the
//! sign of a shift; x = d * (2s + 1) * (g ± 1/8). Multiplied with Q8_K (ggml-cpu's
//! vec_dot_type for it; its block sums carry the shift). Weight-only: no quantizer (ggml's
//! needs an importance matrix), so CPY and SET_ROWS into it are not claimed.

use super::grids::IQ1S_GRID;
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

/// The shift's magnitude (ggml's IQ1S_DELTA).
const DELTA: f32 = 0.125;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq1S {
    pub d: u16,
    pub qs: [u8; QK_K / 8],
    pub qh: [u16; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq1S>() == 50);

impl BlockIq1S {
    /// Group `l` of sub-block `ib`: 8 values in {-1, 0, 1}, one per byte.
    #[inline(always)]
    fn grid(&self, ib: usize, l: usize) -> u64 {
        let hi = (self.qh[ib] as usize >> (3 * l)) & 7;
        IQ1S_GRID[self.qs[4 * ib + l] as usize | hi << 8]
    }

    /// Sub-block `ib`'s integer scale 2s + 1.
    #[inline(always)]
    fn ls(&self, ib: usize) -> i32 {
        2 * ((self.qh[ib] >> 12) & 7) as i32 + 1
    }

    /// Sub-block `ib`'s shift sign, ±1.
    #[inline(always)]
    fn delta(&self, ib: usize) -> i32 {
        if self.qh[ib] & 0x8000 != 0 {
            -1
        } else {
            1
        }
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ1_S (50 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockIq1S;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (ib, o) in out.chunks_exact_mut(32).enumerate() {
            let dl = d * b.ls(ib) as f32;
            let delta = b.delta(ib) as f32 * DELTA;
            for (k, v) in o.iter_mut().enumerate() {
                let g = (b.grid(ib, k / 8) >> (8 * (k % 8))) as u8 as i8;
                *v = dl * (g as f32 + delta);
            }
        }
    }
}

/// ggml's portable order: per super-block the integer dot with the grid and the integer sum
/// of the shift terms (from Q8_K's block sums), each weighted by 2s + 1, combined as
/// d * dy * (dot + sum / 8) and summed in one f32.
///
/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ1_S (50 bytes each, aligned to 2) and
/// `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockIq1S, y as *const BlockQ8K);
    let mut sumf = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..QK_K / 32 {
            let mut lsum = 0i32;
            for k in 0..32 {
                let g = (bx.grid(ib, k / 8) >> (8 * (k % 8))) as u8 as i8;
                lsum += by.qs[32 * ib + k] as i32 * g as i32;
            }
            let bsum = by.bsums[2 * ib] as i32 + by.bsums[2 * ib + 1] as i32;
            sumi += bx.ls(ib) * lsum;
            sumi1 += bx.ls(ib) * bx.delta(ib) * bsum;
        }
        sumf += f16_to_f32(bx.d) * by.d * (sumi as f32 + DELTA * sumi1 as f32);
    }
    sumf
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

    /// The super-block's integer shift sum, sum over sub-blocks of ±(2s + 1) times Q8_K's two
    /// 16-value sums, in-vector (8 scalar multiply-adds cost more than the grid dot's lookups).
    #[inline(always)]
    unsafe fn shift_sum(bx: &BlockIq1S, by: &BlockQ8K) -> i32 {
        let qh = _mm_loadu_si128(bx.qh.as_ptr() as *const __m128i);
        let ls = _mm_or_si128(
            _mm_and_si128(_mm_srli_epi16::<11>(qh), _mm_set1_epi16(14)),
            _mm_set1_epi16(1),
        );
        // ±ls: the sign bit of qh as 0 / -1, then (ls ^ s) - s.
        let s = _mm_srai_epi16::<15>(qh);
        let m = _mm_sub_epi16(_mm_xor_si128(ls, s), s);
        // Each sub-block's multiplier on both of its 16-value sums.
        let m = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
        let bsums = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
        hsum_i32(_mm256_madd_epi16(bsums, m))
    }

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: the grid dot in 8 i32
    /// lanes (lane k: values 4k..4k+3 of every sub-block, times 2s + 1; exact), one fused
    /// multiply-add by d * dy per lane per super-block; the shift terms in one f32, fused
    /// d * dy * sum + total per super-block (as GCC contracts ggml's `accum1 += d * sumi1`);
    /// the lanes' sum plus 1/8 of that at the end.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x` must point to `n / QK_K` readable blocks of
    /// IQ1_S (aligned to 2) and `y` to as many of Q8_K.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockIq1S, y as *const BlockQ8K);
        let mut acc = _mm256_setzero_ps();
        let mut acc1 = 0f32;
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let mut sumi = _mm256_setzero_si256();
            let sumi1 = shift_sum(bx, by);
            for ib in 0..QK_K / 32 {
                let g = set_u64x4(std::array::from_fn(|l| bx.grid(ib, l)));
                let q8 = _mm256_loadu_si256(by.qs.as_ptr().add(ib * 32) as *const __m256i);
                // |g| times q8 with g's sign, in pairs (i16, no saturation: |g| <= 1).
                let dot = _mm256_maddubs_epi16(_mm256_sign_epi8(g, g), _mm256_sign_epi8(q8, g));
                let ls = bx.ls(ib);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(dot, _mm256_set1_epi16(ls as i16)));
            }
            let d = by.d * f16(bx.d);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            acc1 = d.mul_add(sumi1 as f32, acc1);
        }
        hsum_f32(acc) + DELTA * acc1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{f32_to_f16, q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition, on a hand-made block: 11-bit indices (3 high bits
    /// per group in qh), the 3-bit scale and the shift's sign.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq1S {
            d: f32_to_f16(0.5),
            qs: [0; 32],
            qh: [0; 8],
        };
        // Sub-block 6: indices 0x7ff, 0x123, 0x456, 0x0ff; s = 5; negative shift.
        let idx = [0x7ffusize, 0x123, 0x456, 0x0ff];
        for (l, i) in idx.iter().enumerate() {
            b.qs[24 + l] = *i as u8;
            b.qh[6] |= ((i >> 8) as u16) << (3 * l);
        }
        b.qh[6] |= 5 << 12 | 0x8000;
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq1S as *const u8, &mut out) };
        for (l, i) in idx.iter().enumerate() {
            for j in 0..8 {
                let g = (IQ1S_GRID[*i] >> (8 * j)) as u8 as i8 as f32;
                assert_eq!(
                    out[192 + 8 * l + j],
                    0.5 * 11.0 * (g - 0.125),
                    "l={l} j={j}"
                );
            }
        }
        // Sub-block 0: index 0 (all -1), s = 0, positive shift.
        assert!(out[..32].iter().all(|&v| v == 0.5 * (-1.0 + 0.125)));
    }

    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_rows(GgmlType::IQ1_S, &[0], n, 1, nb as u32);
            check_dots_dequantized(
                &qx,
                n,
                to_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                &[vec_dot_fn(), vec_dot_ref as VecDot],
                &[],
                nb as u32,
            );
        }
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::IQ1_S,
            to_f32,
            &[0],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
