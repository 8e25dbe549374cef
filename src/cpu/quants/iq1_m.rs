//! IQ1_M (1.75 bits per value): super-blocks of 256 values, 32 index bytes, 16 bytes of
//! per-group high bits (a nibble per group of 8 values: 3 index bits, 11-bit indices into
//! `IQ1S_GRID`, 8 values in {-1, 0, 1}, and the sign of the group's shift), then 4 u16 of
//! 3-bit scales s, one per half sub-block of 16 values (four per u16), whose top nibbles hold
//! the f16 super-block scale `d`; x = d * (2s + 1) * (g ± 1/8). Multiplied with Q8_K (ggml-cpu's
//! vec_dot_type for it). Weight-only: no quantizer, so CPY and SET_ROWS into it are not
//! claimed.

use super::grids::IQ1S_GRID;
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

/// The shift's magnitude (ggml's IQ1M_DELTA).
const DELTA: f32 = 0.125;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq1M>() == 56);

impl BlockIq1M {
    #[inline(always)]
    fn sc(&self, k: usize) -> u16 {
        u16::from_le_bytes([self.scales[2 * k], self.scales[2 * k + 1]])
    }

    /// The f16 bits of the super-block scale, from the top nibbles of the 4 scale words.
    #[inline(always)]
    pub fn d(&self) -> u16 {
        (self.sc(0) >> 12)
            | ((self.sc(1) >> 8) & 0x00f0)
            | ((self.sc(2) >> 4) & 0x0f00)
            | (self.sc(3) & 0xf000)
    }

    /// Group `l` (0..4) of sub-block `ib`: 8 values in {-1, 0, 1}, one per byte.
    #[inline(always)]
    fn grid(&self, ib: usize, l: usize) -> u64 {
        let h = (self.qh[2 * ib + l / 2] as usize) << (8 - 4 * (l % 2)) & 0x700;
        IQ1S_GRID[self.qs[4 * ib + l] as usize | h]
    }

    /// The shift sign of group `l` of sub-block `ib`, ±1.
    #[inline(always)]
    fn delta(&self, ib: usize, l: usize) -> i32 {
        if self.qh[2 * ib + l / 2] & (0x08 << (4 * (l % 2))) != 0 {
            -1
        } else {
            1
        }
    }

    /// The integer scale 2s + 1 of half `h` (values 16h..16h+15) of sub-block `ib`.
    #[inline(always)]
    fn ls(&self, ib: usize, h: usize) -> i32 {
        2 * ((self.sc(ib / 2) >> (6 * (ib % 2) + 3 * h)) & 7) as i32 + 1
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ1_M (56 bytes each).
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockIq1M;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d());
        for (ib, o) in out.chunks_exact_mut(32).enumerate() {
            let dl = [d * b.ls(ib, 0) as f32, d * b.ls(ib, 1) as f32];
            for (k, v) in o.iter_mut().enumerate() {
                let l = k / 8;
                let g = (b.grid(ib, l) >> (8 * (k % 8))) as u8 as i8;
                *v = dl[k / 16] * (g as f32 + b.delta(ib, l) as f32 * DELTA);
            }
        }
    }
}

/// ggml's portable order: per super-block the integer dot with the grid and the integer sum
/// of the shift terms, each weighted by its half sub-block's 2s + 1, combined as
/// d * dy * (dot + sum / 8) and summed in one f32.
///
/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ1_M (56 bytes each) and `y` to
/// `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockIq1M, y as *const BlockQ8K);
    let mut sumf = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for ib in 0..QK_K / 32 {
            for h in 0..2 {
                let (mut sum1, mut sum2) = (0i32, 0i32);
                for l in 2 * h..2 * h + 2 {
                    let (mut lsum1, mut lsum2) = (0i32, 0i32);
                    for j in 0..8 {
                        let q8 = by.qs[32 * ib + 8 * l + j] as i32;
                        lsum1 += q8 * (bx.grid(ib, l) >> (8 * j)) as u8 as i8 as i32;
                        lsum2 += q8;
                    }
                    sum1 += lsum1;
                    sum2 += lsum2 * bx.delta(ib, l);
                }
                sumi1 += sum1 * bx.ls(ib, h);
                sumi2 += sum2 * bx.ls(ib, h);
            }
        }
        sumf += f16_to_f32(bx.d()) * by.d * (sumi1 as f32 + DELTA * sumi2 as f32);
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

    /// Shift signs of a sub-block's 4 groups as bytes (0xff negative, 0x01 positive), indexed by
    /// the 4 sign bits gathered (group l at bit l).
    #[repr(C, align(32))]
    struct Deltas([[u64; 4]; 16]);
    static DELTAS: Deltas = Deltas({
        let mut t = [[0u64; 4]; 16];
        let mut i = 0;
        while i < 16 {
            let mut l = 0;
            while l < 4 {
                t[i][l] = if i >> l & 1 != 0 {
                    u64::MAX
                } else {
                    0x0101_0101_0101_0101
                };
                l += 1;
            }
            i += 1;
        }
        t
    });

    /// One sub-block: the grid dot and the shift terms, each as 8 i32 lanes times the halves'
    /// 2s + 1 (`sc`: 8 × the first half's, 8 × the second's, as i16; `idx`: the 4 grid indices).
    #[inline(always)]
    unsafe fn sub_block(
        bx: &BlockIq1M,
        q8: *const i8,
        ib: usize,
        sc: __m256i,
        idx: &[u32; 4],
    ) -> (__m256i, __m256i) {
        let qh = &bx.qh[2 * ib..2 * ib + 2];
        let (h0, h1) = (qh[0] as usize, qh[1] as usize);
        let grid = |k: usize| IQ1S_GRID[idx[k] as usize & 2047] as i64;
        let g = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
        let k = (h0 >> 3 & 1) | (h0 >> 6 & 2) | (h1 >> 1 & 4) | (h1 >> 4 & 8);
        let dl = _mm256_load_si256(DELTAS.0[k].as_ptr() as *const __m256i);
        let y = _mm256_loadu_si256(q8 as *const __m256i);
        // |g| times q8 with g's sign, and q8 with the shift's sign, in pairs (i16).
        let dot1 = _mm256_maddubs_epi16(_mm256_sign_epi8(g, g), _mm256_sign_epi8(y, g));
        let dot2 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_sign_epi8(y, dl));
        (_mm256_madd_epi16(dot1, sc), _mm256_madd_epi16(dot2, sc))
    }

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: the grid dot and the
    /// shift terms each in 8 i32 lanes (lane k: values 4k..4k+3 of every sub-block, times
    /// their 2s + 1; exact), each with one fused multiply-add by d * dy per lane per
    /// super-block; the grid lanes' sum plus 1/8 of the shift lanes' sum at the end.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x` must point to `n / QK_K` readable blocks of
    /// IQ1_M and `y` to as many of Q8_K.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockIq1M, y as *const BlockQ8K);
        let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            // The 16 half sub-block scales 2s + 1 as i16, once per super-block: the 64-bit lanes
            // shift the 4 scale words by 0, 6, 3, 9 (even sub-blocks' first halves, odd ones',
            // then the second halves), so element w of a lane is sub-block 2w or 2w + 1's.
            let words = u64::from_le_bytes(bx.scales);
            let scales = _mm256_srlv_epi64(
                _mm256_set1_epi64x(words as i64),
                _mm256_setr_epi64x(0, 6, 3, 9),
            );
            let scales = _mm256_and_si256(scales, _mm256_set1_epi16(7));
            let scales = _mm256_or_si256(_mm256_slli_epi16::<1>(scales), _mm256_set1_epi16(1));
            // Sub-blocks in pairs: one scale word holds both pairs' 3-bit scales.
            for p in 0..QK_K / 64 {
                // The pair's 8 grid indices in-vector (fewer operations than 8 scalar ones),
                // read back as scalars for the lookups.
                let lo = _mm_loadl_epi64(bx.qs.as_ptr().add(8 * p) as *const __m128i);
                let qh = u32::from_le_bytes(bx.qh[4 * p..4 * p + 4].try_into().unwrap());
                let hi = _mm256_srlv_epi32(
                    _mm256_set1_epi32(qh as i32),
                    _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
                );
                let hi = _mm256_slli_epi32::<8>(_mm256_and_si256(hi, _mm256_set1_epi32(7)));
                let idx = _mm256_or_si256(_mm256_cvtepu8_epi32(lo), hi);
                let mut ix = [[0u32; 4]; 2];
                _mm256_storeu_si256(ix.as_mut_ptr() as *mut __m256i, idx);
                for (k, ib) in [2 * p, 2 * p + 1].into_iter().enumerate() {
                    // Element k * 4 + p of each half of `scales` to all 8 of that half.
                    let e = (k * 4 + p) as i16;
                    let sc = _mm256_shuffle_epi8(
                        scales,
                        _mm256_set1_epi16(((2 * e + 1) << 8) | (2 * e)),
                    );
                    let (p1, p2) = sub_block(bx, by.qs.as_ptr().add(32 * ib), ib, sc, &ix[k]);
                    sumi1 = _mm256_add_epi32(sumi1, p1);
                    sumi2 = _mm256_add_epi32(sumi2, p2);
                }
            }
            let d = _mm256_set1_ps(by.d * f16(bx.d()));
            acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), acc1);
            acc2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), acc2);
        }
        hsum_f32(acc1) + DELTA * hsum_f32(acc2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{f32_to_f16, q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Raw random IQ1_M rows whose scale (spread over the scale words' top nibbles) is a
    /// finite f16 in [-1, 1].
    pub fn raw_iq1_m(n: usize, seed: u32) -> Vec<u8> {
        let mut q = raw_rows(GgmlType::IQ1_M, &[], n, 1, seed);
        let mut next = xorshift(seed.wrapping_mul(31).max(1));
        for block in q.chunks_exact_mut(56) {
            let d = f32_to_f16((next() % 2001) as f32 / 1000.0 - 1.0);
            for k in 0..4 {
                let nib = ((d >> (4 * k)) & 0xf) as u8;
                block[48 + 2 * k + 1] = (block[48 + 2 * k + 1] & 0x0f) | nib << 4;
            }
        }
        q
    }

    /// Decoding by the format's definition, on a hand-made block: the scale spread over the
    /// top nibbles, 11-bit indices, two 3-bit scales and four shift signs per sub-block.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq1M {
            qs: [0; 32],
            qh: [0; 16],
            scales: [0; 8],
        };
        let d = f32_to_f16(0.25);
        // Sub-block 3: indices 0x7ff, 0x3a5, 0x100, 0x0ff; shifts -, +, +, -; scales 6, 1.
        let idx = [0x7ffusize, 0x3a5, 0x100, 0x0ff];
        let neg = [true, false, false, true];
        for (l, i) in idx.iter().enumerate() {
            b.qs[12 + l] = *i as u8;
            let nib = (i >> 8) as u8 | if neg[l] { 8 } else { 0 };
            b.qh[6 + l / 2] |= nib << (4 * (l % 2));
        }
        // Scale word 1 holds sub-blocks 2 and 3: sub-block 3's scales at bits 6..11.
        let mut sc = [0u16; 4];
        sc[1] = (6 | 1 << 3) << 6;
        for (k, w) in sc.iter_mut().enumerate() {
            *w |= ((d >> (4 * k)) & 0xf) << 12;
            b.scales[2 * k..2 * k + 2].copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(b.d(), d);
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq1M as *const u8, &mut out) };
        for (l, i) in idx.iter().enumerate() {
            let dl = 0.25 * [13.0, 3.0][l / 2];
            let delta = if neg[l] { -0.125 } else { 0.125 };
            for j in 0..8 {
                let g = (IQ1S_GRID[*i] >> (8 * j)) as u8 as i8 as f32;
                assert_eq!(out[96 + 8 * l + j], dl * (g + delta), "l={l} j={j}");
            }
        }
    }

    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_iq1_m(n, nb as u32);
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
}
