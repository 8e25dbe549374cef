//! Q1_0 (ggml type 41, new in ggml 0.26: binary weights): blocks of 128 values, one f16 scale d
//! and 16 bytes of sign bits; bit j of byte b gives element 8b + j, x = +d where set, -d where
//! clear. ggml's quantizer stores d = mean |x| and each value's sign (x >= 0 sets the bit).
//! Multiplied with Q8_0 (ggml-cpu's vec_dot_type for it): one block meets four Q8_0 blocks.

use super::q8_0::BlockQ8_0;
use super::{f16_to_f32, f32_to_f16, use_avx2};
use crate::cpu::types::VecDot;

pub const QK: usize = 128;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ1_0 {
    pub d: u16,
    pub qs: [u8; QK / 8],
}
const _: () = assert!(size_of::<BlockQ1_0>() == 18);

#[inline]
fn bit(b: &BlockQ1_0, j: usize) -> bool {
    (b.qs[j / 8] >> (j % 8)) & 1 != 0
}

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of Q1_0 (18 bytes each), aligned to 2.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ1_0;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (j, o) in out.iter_mut().enumerate() {
            *o = if bit(b, j) { d } else { -d };
        }
    }
}

/// ggml's reference quantizer: d = (sum of |x| in order) / 128, the sign bits of x >= 0.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q1_0 (18 bytes each), aligned
/// to 2.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ1_0;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let sum_abs = x.iter().fold(0f32, |s, v| s + v.abs());
        let mut b = BlockQ1_0 {
            d: f32_to_f16(sum_abs / QK as f32),
            qs: [0; QK / 8],
        };
        for (j, &v) in x.iter().enumerate() {
            if v >= 0.0 {
                b.qs[j / 8] |= 1 << (j % 8);
            }
        }
        blocks.add(i).write(b);
    }
}

/// ggml's portable order: per Q8_0 block the integer sum of ±y, times dy, summed in one f32
/// per Q1_0 block, which is then multiplied by d and added.
///
/// # Safety
/// `x` must point to `n / QK` readable blocks of Q1_0 (18 bytes each, aligned to 2) and `y`
/// to `n / 32` blocks of Q8_0 (34 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ1_0, y as *const BlockQ8_0);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let bx = &*x.add(i);
        let mut sumi = 0f32;
        for k in 0..4 {
            let by = &*y.add(4 * i + k);
            let mut s = 0i32;
            for (j, &q) in by.qs.iter().enumerate() {
                s += if bit(bx, 32 * k + j) {
                    q as i32
                } else {
                    -(q as i32)
                };
            }
            sumi += f16_to_f32(by.d) * s as f32;
        }
        sum += f16_to_f32(bx.d) * sumi;
    }
    sum
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if super::use_avx512() {
        return avx2::vec_dot_evex;
    }
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

    /// ±y of one Q8_0 block (the sign from 32 bits of the weight) summed in 8 i32 lanes of 4.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(bits: u32, by: &BlockQ8_0) -> __m256 {
        let y = _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i);
        // Byte j gets source byte j / 8 and is tested against bit j % 8: 0xff where the bit is
        // clear, where y is negated (y ^ m - m).
        let which = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let spread = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), which);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let clear = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), _mm256_setzero_si256());
        let sy = _mm256_sub_epi8(_mm256_xor_si256(y, clear), clear);
        _mm256_cvtepi32_ps(dot_u8_i8(_mm256_set1_epi8(1), sy))
    }

    /// The dot, compiled for the given instruction sets: the same operations in the same order
    /// either way (only the encoding differs), so both give ggml-cpu's bits.
    macro_rules! dot {
        ($(#[$doc:meta])* $name:ident, $features:literal) => {
            $(#[$doc])*
            #[target_feature(enable = $features)]
            pub unsafe fn $name(n: usize, x: *const u8, y: *const u8) -> f32 {
                let (x, y) = (x as *const BlockQ1_0, y as *const BlockQ8_0);
                // Five scales per 128 values: table loads (see `f16_table`).
                let f16 = f16_table();
                let mut acc = _mm256_setzero_ps();
                for i in 0..n / QK {
                    let bx = &*x.add(i);
                    let word =
                        |k: usize| u32::from_le_bytes(bx.qs[4 * k..4 * k + 4].try_into().unwrap());
                    let by = |k: usize| &*y.add(4 * i + k);
                    let dy = |k: usize| _mm256_set1_ps(f16[by(k).d as usize]);
                    let mut blk = _mm256_mul_ps(dy(0), block(word(0), by(0)));
                    for k in 1..4 {
                        blk = _mm256_fmadd_ps(dy(k), block(word(k), by(k)), blk);
                    }
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16[bx.d as usize]), blk, acc);
                }
                hsum_f32(acc)
            }
        };
    }

    dot!(
        /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: per Q1_0 block the
        /// four Q8_0 blocks' lanes times dy (a multiply, then three fused multiply-adds), then
        /// one fused multiply-add by d into the running lanes; the lanes summed at the end.
        vec_dot,
        "avx2,fma,f16c"
    );
    dot!(
        /// The same 256-bit dot where AVX-512 (VL) runs: the scales' broadcasts fold into the
        /// multiplies (embedded broadcast), as in ggml-cpu's zen4 build.
        vec_dot_evex,
        "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_0, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition: bit j of byte b is element 8b + j, +d or -d.
    #[test]
    fn to_f32_by_definition() {
        let mut b = BlockQ1_0 {
            d: f32_to_f16(0.375),
            qs: [0; QK / 8],
        };
        let set = |j: usize| (j * 5 + j / 9).is_multiple_of(3);
        for j in 0..QK {
            if set(j) {
                b.qs[j / 8] |= 1 << (j % 8);
            }
        }
        let mut out = vec![0f32; QK];
        unsafe { to_f32(&b as *const BlockQ1_0 as *const u8, &mut out) };
        for (j, &o) in out.iter().enumerate() {
            assert_eq!(o, if set(j) { 0.375 } else { -0.375 }, "j={j}");
        }
    }

    /// The quantizer keeps every sign and the mean magnitude (what ggml's reference does).
    #[test]
    fn from_f32_signs_and_mean() {
        let x = data(3 * QK, 5);
        let q = quantize(GgmlType::Q1_0, from_f32, &x);
        let y = dequantize(to_f32, &q, x.len());
        for (blk, (xb, yb)) in x.chunks(QK).zip(y.chunks(QK)).enumerate() {
            let mean = xb.iter().map(|v| v.abs()).sum::<f32>() / QK as f32;
            for (j, (&a, &b)) in xb.iter().zip(yb).enumerate() {
                assert_eq!(b.abs(), f16_to_f32(f32_to_f16(mean)), "block {blk} j={j}");
                assert_eq!(a >= 0.0, b > 0.0, "block {blk} j={j}: sign of {a}");
            }
        }
    }

    #[test]
    fn vec_dot_matches_scalar() {
        check_vec_dot(
            GgmlType::Q1_0,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
        check_vec_dot_extremes(
            GgmlType::Q1_0,
            to_f32,
            &[0],
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    /// The AVX-512 build of the dot gives the AVX2 one's bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn evex_dot_is_avx2_dot() {
        check_same_dot(
            GgmlType::Q1_0,
            from_f32,
            &[0],
            GgmlType::Q8_0,
            q8_0::from_f32,
            avx2::vec_dot_evex,
            avx2::vec_dot,
        );
    }

    /// Both dots approximate the product of the dequantized values on raw random blocks.
    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK;
            let dots = [vec_dot_fn(), vec_dot_ref as VecDot];
            let qx = raw_rows(GgmlType::Q1_0, &[0], n, 1, nb as u32);
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
}
