//! IQ4_XS: super-blocks of 256 values in 8 sub-blocks of 32. One f16 scale `d` per
//! super-block and a 6-bit scale `ls` per sub-block (low 4 bits in `scales_l`, two per byte,
//! high 2 bits in `scales_h`, two per sub-block); x = d * (ls - 32) * TABLE[q] with IQ4_NL's
//! 16 levels and its nibble order within each sub-block. Multiplied with Q8_K (ggml-cpu's
//! vec_dot_type for it). No quantizer: ggml's needs a search RFCPU does not do, so CPY and
//! SET_ROWS into IQ4_XS are not claimed.

use super::iq4_nl::TABLE;
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq4Xs {
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIq4Xs>() == 136);

impl BlockIq4Xs {
    /// Sub-block `ib`'s scale, ls - 32 (in -32..=31).
    #[inline]
    pub fn scale(&self, ib: usize) -> i32 {
        let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let hi = ((self.scales_h >> (2 * ib)) & 3) as u8;
        (lo | (hi << 4)) as i32 - 32
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ4_XS (136 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockIq4Xs;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (ib, o) in out.chunks_exact_mut(32).enumerate() {
            let dl = d * b.scale(ib) as f32;
            let qs = &b.qs[ib * 16..ib * 16 + 16];
            for j in 0..16 {
                o[j] = dl * TABLE[(qs[j] & 0x0f) as usize] as f32;
                o[j + 16] = dl * TABLE[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

/// ggml's portable order: each sub-block's integer dot times d * dy * (ls - 32), summed in
/// one f32.
///
/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ4_XS (136 bytes each, aligned to 2)
/// and `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockIq4Xs, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let dd = f16_to_f32(bx.d) * by.d;
        for ib in 0..QK_K / 32 {
            let (qs, q8) = (&bx.qs[ib * 16..], &by.qs[ib * 32..]);
            let mut sumi = 0i32;
            for j in 0..16 {
                sumi += q8[j] as i32 * TABLE[(qs[j] & 0x0f) as usize] as i32;
                sumi += q8[j + 16] as i32 * TABLE[(qs[j] >> 4) as usize] as i32;
            }
            sum += dd * bx.scale(ib) as f32 * sumi as f32;
        }
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

/// No ggml order is matched on NEON (as for the other formats there): per super-block the
/// sub-blocks' integer dots times their scale are summed exactly, then scaled once.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    #[inline(always)]
    unsafe fn block<D: I8Dot>(table: int8x16_t, bx: &BlockIq4Xs, by: &BlockQ8K) -> i32 {
        let mut acc = vdupq_n_s32(0);
        for ib in 0..QK_K / 32 {
            // A table lookup turns the 4-bit indices into levels: elements 0..15, then 16..31.
            let q = vld1q_u8(bx.qs.as_ptr().add(ib * 16));
            let lo = vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0x0f)));
            let hi = vqtbl1q_s8(table, vshrq_n_u8::<4>(q));
            let y = by.qs.as_ptr().add(ib * 32);
            let p = D::dot(
                D::dot(vdupq_n_s32(0), lo, vld1q_s8(y)),
                hi,
                vld1q_s8(y.add(16)),
            );
            acc = vmlaq_n_s32(acc, p, bx.scale(ib));
        }
        vaddvq_s32(acc)
    }

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockIq4Xs, y as *const BlockQ8K);
        let table = vld1q_s8(TABLE.as_ptr());
        let mut sum = 0f32;
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            sum += f16(bx.d) * by.d * block::<D>(table, bx, by) as f32;
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

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: per super-block the
    /// sub-blocks' byte-pair sums times their scale are added as 8 lanes of i32 (exact), then
    /// one fused multiply-add by d * dy per lane; the lanes are summed at the end.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockIq4Xs, y as *const BlockQ8K);
        let t = _mm_loadu_si128(TABLE.as_ptr() as *const __m128i);
        let table = _mm256_set_m128i(t, t);
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let q = _mm256_shuffle_epi8(table, nibbles(bx.qs.as_ptr().add(ib * 16)));
                let q8 = _mm256_loadu_si256(by.qs.as_ptr().add(ib * 32) as *const __m256i);
                // |q| * sign-moved q8 in byte pairs (i16, no saturation: |q|, |q8| <= 127).
                let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(q8, q));
                let p = _mm256_madd_epi16(p16, _mm256_set1_epi16(bx.scale(ib) as i16));
                sumi = _mm256_add_epi32(sumi, p);
            }
            let dd = f16(bx.d) * by.d;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_f32(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition, on hand-made blocks: each sub-block's 6-bit
    /// scale from its nibble in scales_l and its two bits in scales_h.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq4Xs {
            d: super::super::f32_to_f16(0.5),
            scales_h: 0,
            scales_l: [0; 4],
            qs: [0; 128],
        };
        // ls of sub-block ib = 8 * ib + 3 (6 bits: 3, 11, ..., 59).
        for ib in 0..8 {
            let ls = 8 * ib as u16 + 3;
            b.scales_l[ib / 2] |= ((ls & 0x0f) as u8) << (4 * (ib % 2));
            b.scales_h |= (ls >> 4) << (2 * ib);
        }
        for (j, q) in b.qs.iter_mut().enumerate() {
            *q = (j % 16) as u8 | (((j + 5) % 16) as u8) << 4;
        }
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq4Xs as *const u8, &mut out) };
        for ib in 0..8 {
            assert_eq!(b.scale(ib), 8 * ib as i32 + 3 - 32);
            let dl = 0.5 * (8.0 * ib as f32 + 3.0 - 32.0);
            for j in 0..16 {
                let q = ib * 16 + j;
                assert_eq!(out[ib * 32 + j], dl * TABLE[q % 16] as f32);
                assert_eq!(out[ib * 32 + j + 16], dl * TABLE[(q + 5) % 16] as f32);
            }
        }
    }

    /// SDOT is dispatched where the CPU has it; the base-NEON dot is checked here too.
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
            "IQ4_XS: not the expected NEON kernel"
        );
        for dot in [neon::vec_dot, vec_dot_fn()] {
            check_vec_dot_extremes(
                GgmlType::IQ4_XS,
                to_f32,
                &[0],
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                dot,
                vec_dot_ref,
            );
        }
    }

    /// The dispatched dot equals the scalar reference on raw random blocks (every code and
    /// scale) against full-scale activations.
    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::IQ4_XS,
            to_f32,
            &[0],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    /// The dot approximates the product of the dequantized values (the activation side is
    /// rounded to Q8_K).
    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_blocks(n, nb as u32);
            let yv = data(n, nb as u32 + 100);
            let qy = quantize(GgmlType::Q8_K, q8_k::from_f32, &yv);
            let dx = dequantize(to_f32, &qx, n);
            let dy = dequantize(q8_k::to_f32, &qy, n);
            let exact: f64 = dx.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = dx
                .iter()
                .zip(&dy)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            for dot in [vec_dot_fn(), vec_dot_ref as VecDot] {
                let got = unsafe { dot(n, qx.as_ptr(), qy.as_ptr()) };
                assert!(
                    (got as f64 - exact).abs() <= 1e-5 * mag + 1e-6,
                    "n={n}: {got} vs {exact}"
                );
            }
        }
    }

    /// Random IQ4_XS bytes with a finite scale `d` in each block.
    fn raw_blocks(n: usize, seed: u32) -> Vec<u8> {
        let mut next = xorshift(seed.wrapping_mul(0x9e37_79b9).max(1));
        let mut q: Vec<u8> = (0..GgmlType::IQ4_XS.row_size(n))
            .map(|_| next() as u8)
            .collect();
        for block in q.chunks_exact_mut(136) {
            let h = super::super::f32_to_f16((next() % 2001) as f32 / 1000.0 - 1.0);
            block[0..2].copy_from_slice(&h.to_le_bytes());
        }
        q
    }
}
