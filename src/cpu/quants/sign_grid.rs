//! What IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S share: each 32-value sub-block is 4 groups
//! of 8 unsigned grid magnitudes with 8 sign bits each, and one or two 4-bit scales s
//! (integer weight 2s + 1). A format file decodes a sub-block into `Sub`; the dequantizer
//! and both dots here work on that. The float steps follow ggml: per super-block the exact
//! integer sum times d * dy, then one factor (`SignGrid::MULT`) at the end.

use super::q8_k::BlockQ8K;
use super::{f16_to_f32, QK_K};

/// One decoded sub-block of 32 values.
pub struct Sub {
    /// Magnitudes of values 8l..8l+7 in the bytes of `grid[l]`.
    pub grid: [u64; 4],
    pub signs: Signs,
    /// The 4-bit scales of values 0..15 and 16..31.
    pub s: [u8; 2],
}

/// The signs of a sub-block's 32 values, in the form its format makes cheapest to expand.
pub enum Signs {
    /// A byte per value, 0xff negative, 0x01 positive (`grids::KSIGN_BYTES`: one lookup per 8
    /// values for the formats that store 7 bits of each 8).
    Bytes([u64; 4]),
    /// Bit j of byte l set where value 8l + j is negative (formats that store all 8 bits).
    Bits(u32),
}

impl Signs {
    /// True where value `k` (0..32) is negative.
    #[inline(always)]
    pub fn negative(&self, k: usize) -> bool {
        match self {
            Signs::Bytes(b) => byte(b[k / 8], k % 8) == 0xff,
            Signs::Bits(b) => b >> k & 1 != 0,
        }
    }
}

/// A block format of this family.
pub trait SignGrid {
    /// ggml's factor applied to the whole dot at the end.
    const MULT: f32;
    /// The f16 bits of the super-block scale.
    fn d(&self) -> u16;
    /// Sub-block `ib` (0..8).
    fn sub(&self, ib: usize) -> Sub;
    /// The dequantization scale of a half sub-block from d and its 4-bit s, as ggml writes it.
    fn db(d: f32, s: u8) -> f32;
    /// Formats with 4-value grid points (IQ3): their table, the low bytes of sub-block `ib`'s
    /// 8 indices and the byte of their 9th bits (bit k: index k), for the AVX2 dot.
    #[inline(always)]
    fn grid4(&self, _ib: usize) -> Option<(&'static [u32], *const u8, u8)> {
        None
    }
}

#[inline(always)]
fn byte(v: u64, j: usize) -> u8 {
    (v >> (8 * j)) as u8
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of `B`.
#[inline(always)]
pub unsafe fn to_f32<B: SignGrid>(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const B;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d());
        for (ib, o) in out.chunks_exact_mut(32).enumerate() {
            let sub = b.sub(ib);
            let db = [B::db(d, sub.s[0]), B::db(d, sub.s[1])];
            for (k, v) in o.iter_mut().enumerate() {
                let (l, j) = (k / 8, k % 8);
                let sign = if sub.signs.negative(k) { -1.0 } else { 1.0 };
                *v = db[k / 16] * byte(sub.grid[l], j) as f32 * sign;
            }
        }
    }
}

/// ggml's portable order: per super-block the integer sum of each half sub-block's dot times
/// its 2s + 1, times d * dy, summed in one f32; `MULT` times the total.
///
/// # Safety
/// `x` must point to `n / QK_K` readable blocks of `B` and `y` to as many of Q8_K.
#[inline(always)]
pub unsafe fn vec_dot_ref<B: SignGrid>(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const B, y as *const BlockQ8K);
    let mut sumf = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let sub = bx.sub(ib);
            for half in 0..2 {
                let mut sumi = 0i32;
                for k in 16 * half..16 * half + 16 {
                    let (l, j) = (k / 8, k % 8);
                    let sign = if sub.signs.negative(k) { -1 } else { 1 };
                    sumi += byte(sub.grid[l], j) as i32 * by.qs[ib * 32 + k] as i32 * sign;
                }
                bsum += sumi * (2 * sub.s[half] as i32 + 1);
            }
        }
        sumf += f16_to_f32(bx.d()) * by.d * bsum as f32;
    }
    B::MULT * sumf
}

#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use super::*;
    use crate::cpu::quants::grids::SCALES16;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    /// The 32 sign bits as bytes, -1 (set) or 1 (clear): byte l of `bits` spread over bytes
    /// 8l..8l+7.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn signs_x32(bits: u32) -> __m256i {
        // Byte l of the broadcast word to bytes 8l..8l+7 (the shuffle stays in 128-bit halves,
        // each of which holds the whole word).
        let spread = _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), spread);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let neg = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        _mm256_or_si256(neg, _mm256_set1_epi8(1))
    }

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: per super-block 8 i32
    /// lanes (lane k: values 4k..4k+3 of every sub-block, times their 2s + 1; exact), one
    /// fused multiply-add by d * dy per lane; `MULT` times the lanes' sum at the end.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x` must point to `n / QK_K` readable blocks of
    /// `B` and `y` to as many of Q8_K.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot<B: SignGrid>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const B, y as *const BlockQ8K);
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let sub = bx.sub(ib);
                // Set from registers: a 32-byte load of 4 values just stored stalls (no store
                // forwarding), which halved the speed.
                let g = match bx.grid4(ib) {
                    // The 8 points of 4 values each straight into the vector's 32-bit lanes
                    // (a gather, or pairing them into 64-bit values first, measured slower).
                    Some((table, lo, hi)) => {
                        let lo = std::slice::from_raw_parts(lo, 8);
                        let hi = hi as usize;
                        let g =
                            |k: usize| table[(lo[k] as usize | (hi << (8 - k) & 256)) & 511] as i32;
                        _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7))
                    }
                    None => set_u64x4(sub.grid),
                };
                let s = match sub.signs {
                    Signs::Bytes(b) => set_u64x4(b),
                    Signs::Bits(b) => signs_x32(b),
                };
                let q8 = _mm256_loadu_si256(by.qs.as_ptr().add(ib * 32) as *const __m256i);
                // Magnitudes <= 62 times |q8| <= 127, in pairs: no i16 saturation.
                let dot = _mm256_maddubs_epi16(g, _mm256_sign_epi8(q8, s));
                let sc = SCALES16.0[(sub.s[0] as usize | (sub.s[1] as usize) << 4) & 255].as_ptr();
                let p = _mm256_madd_epi16(dot, _mm256_load_si256(sc as *const __m256i));
                sumi = _mm256_add_epi32(sumi, p);
            }
            let d = _mm256_set1_ps(f16(bx.d()) * by.d);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        B::MULT * hsum_f32(acc)
    }
}
