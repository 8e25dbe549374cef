//! MXFP4 (OCP microscaling FP4, gpt-oss's expert weights): blocks of 32 values, one E8M0 scale
//! byte (a power of two, 2^(e - 127)) and 16 bytes of 4-bit E2M1 codes in Q4_0's nibble order;
//! x = 2^(e - 127) * E2M1[q]. Like ggml we store the E2M1 levels doubled (integers) and halve
//! the scale. Multiplied with Q8_0 (ggml-cpu's vec_dot_type for it). No quantizer: CPY and
//! SET_ROWS into MXFP4 are not claimed (weights only, as IQ4_XS).

use super::q8_0::BlockQ8_0;
use super::{f16_to_f32, use_avx2};
use crate::cpu::types::VecDot;

pub const QK: usize = 32;

/// The E2M1 values times two (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; part of the
/// format), so that the dot is an integer one.
pub const TABLE: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockMxfp4>() == 17);

/// Half the block scale, 2^(e - 128), built from its bits: e = 0 and 1 give the subnormals
/// 2^-128 and 2^-127 (exact: no float pow). Halved because TABLE is doubled.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of MXFP4 (17 bytes each).
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockMxfp4;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        // 17-byte blocks: only byte alignment.
        let b = blocks.add(i).read_unaligned();
        let d = e8m0_half(b.e);
        for j in 0..QK / 2 {
            out[j] = d * TABLE[(b.qs[j] & 0x0f) as usize] as f32;
            out[j + QK / 2] = d * TABLE[(b.qs[j] >> 4) as usize] as f32;
        }
    }
}

/// ggml's portable order: per block the integer dot times dy * 2^(e - 128), summed in one f32.
///
/// # Safety
/// `x` must point to `n / QK` readable blocks of MXFP4 (17 bytes each, any alignment) and `y`
/// to `n / QK` blocks of Q8_0 (34 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockMxfp4, y as *const BlockQ8_0);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let (bx, by) = (x.add(i).read_unaligned(), &*y.add(i));
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            sumi += TABLE[(bx.qs[j] & 0x0f) as usize] as i32 * by.qs[j] as i32;
            sumi += TABLE[(bx.qs[j] >> 4) as usize] as i32 * by.qs[j + QK / 2] as i32;
        }
        sum += (f16_to_f32(by.d) * e8m0_half(bx.e)) * sumi as f32;
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

    /// The block's integer dot as 8 lanes of i32 (IQ4_NL's shuffle with the E2M1 table).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(table: __m256i, bx: *const BlockMxfp4, by: &BlockQ8_0) -> __m256i {
        // qs starts at byte 1 of the block: an unaligned 16-byte load.
        let q = _mm256_shuffle_epi8(table, nibbles((bx as *const u8).add(1)));
        dot_i8_i8(q, _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i))
    }

    /// dy * 2^(e - 128), in ggml's order (activation scale first).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scale(bx: *const BlockMxfp4, by: &BlockQ8_0) -> f32 {
        f16_load(&by.d) * e8m0_half(*(bx as *const u8))
    }

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: even and odd blocks in
    /// two accumulators, added before the horizontal sum; an odd last block is added after
    /// it with a scalar fused multiply-add (as IQ4_NL, whose ggml kernel has the same shape).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockMxfp4, y as *const BlockQ8_0);
        let nb = n / QK;
        let t = _mm_loadu_si128(TABLE.as_ptr() as *const __m128i);
        let table = _mm256_set_m128i(t, t);
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..nb & !1).step_by(2) {
            let (bx0, by0) = (x.add(i), &*y.add(i));
            let (bx1, by1) = (x.add(i + 1), &*y.add(i + 1));
            acc0 = _mm256_fmadd_ps(
                _mm256_set1_ps(scale(bx0, by0)),
                _mm256_cvtepi32_ps(block(table, bx0, by0)),
                acc0,
            );
            acc1 = _mm256_fmadd_ps(
                _mm256_set1_ps(scale(bx1, by1)),
                _mm256_cvtepi32_ps(block(table, bx1, by1)),
                acc1,
            );
        }
        let sum = hsum_f32(_mm256_add_ps(acc0, acc1));
        if nb & 1 == 0 {
            return sum;
        }
        let (bx, by) = (x.add(nb - 1), &*y.add(nb - 1));
        let sumi = hsum_i32(block(table, bx, by));
        (sumi as f32).mul_add(scale(bx, by), sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_0, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition: 2^(e - 127) times the E2M1 value, over scales
    /// from the subnormal ones to the largest.
    #[test]
    fn to_f32_by_definition() {
        const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for e in [0u8, 1, 2, 100, 127, 128, 200, 254] {
            let mut b = BlockMxfp4 { e, qs: [0; QK / 2] };
            for (j, q) in b.qs.iter_mut().enumerate() {
                *q = j as u8 | (((j + 5) % 16) as u8) << 4;
            }
            let mut out = vec![0f32; QK];
            unsafe { to_f32(&b as *const BlockMxfp4 as *const u8, &mut out) };
            let scale = 2f64.powi(e as i32 - 127);
            let value = |q: usize| {
                let v = E2M1[q & 7] as f64 * scale;
                (if q & 8 != 0 { -v } else { v }) as f32
            };
            for j in 0..16 {
                assert_eq!(out[j], value(j), "e={e} j={j}");
                assert_eq!(out[j + 16], value((j + 5) % 16), "e={e} j={j}");
            }
        }
    }

    /// Random MXFP4 bytes with scales 2^-10 .. 2^5 (every code; e = 0 and 1 in some blocks).
    fn raw_blocks(n: usize, seed: u32) -> Vec<u8> {
        let mut next = xorshift(seed.wrapping_mul(0x9e37_79b9).max(1));
        let mut q: Vec<u8> = (0..GgmlType::MXFP4.row_size(n))
            .map(|_| next() as u8)
            .collect();
        for (i, block) in q.chunks_exact_mut(17).enumerate() {
            block[0] = if i % 5 == 4 {
                (i % 2) as u8
            } else {
                117 + (next() % 16) as u8
            };
        }
        q
    }

    /// The dispatched (AVX2) dot equals the scalar one within rounding and both approximate
    /// the product of the dequantized values, on raw random blocks against random and
    /// full-scale activations, over odd and even block counts.
    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 7, 8, 33] {
            let n = nb * QK;
            let dots = [vec_dot_fn(), vec_dot_ref as VecDot];
            let qx = raw_blocks(n, nb as u32);
            check_dots_dequantized(
                &qx,
                n,
                to_f32,
                GgmlType::Q8_0,
                q8_0::from_f32,
                q8_0::to_f32,
                &dots,
                &[],
                nb as u32,
            );
        }
    }

    /// The AVX2 dot is what gets dispatched where AVX2 runs, and it reads blocks at any
    /// byte offset (17-byte blocks are never aligned).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_dispatched_and_unaligned() {
        if !use_avx2() {
            return;
        }
        assert_eq!(vec_dot_fn() as usize, avx2::vec_dot as VecDot as usize);
        let n = 5 * QK;
        let qx = raw_blocks(n, 9);
        let qy = quantize(GgmlType::Q8_0, q8_0::from_f32, &data(n, 3));
        let want = unsafe { avx2::vec_dot(n, qx.as_ptr(), qy.as_ptr()) };
        for off in 1..4 {
            let mut shifted = vec![0u8; off];
            shifted.extend(&qx);
            let got = unsafe { avx2::vec_dot(n, shifted.as_ptr().add(off), qy.as_ptr()) };
            assert_eq!(got.to_bits(), want.to_bits(), "offset {off}");
        }
    }
}
