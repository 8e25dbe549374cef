//! Q2_0 (ggml type 42, new in ggml 0.26): blocks of 64 values, one f16 scale d and 16 bytes of
//! 2-bit codes q; bit pair l of byte b is element 4b + l, x = d * (q - 1) (-d, 0, d, 2d). ggml's
//! quantizer takes d = max |x| and q = round(x / d) + 1 clamped to 0..=3. Multiplied with Q8_0
//! (ggml-cpu's vec_dot_type for it): one block meets two Q8_0 blocks.

use super::q8_0::BlockQ8_0;
use super::{f16_to_f32, f32_to_f16, use_avx2};
use crate::cpu::types::VecDot;

pub const QK: usize = 64;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ2_0 {
    pub d: u16,
    pub qs: [u8; QK / 4],
}
const _: () = assert!(size_of::<BlockQ2_0>() == 18);

/// Element `j`'s code (0..=3).
#[inline]
fn code(b: &BlockQ2_0, j: usize) -> i32 {
    ((b.qs[j / 4] >> (2 * (j % 4))) & 3) as i32
}

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of Q2_0 (18 bytes each), aligned to 2.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ2_0;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (j, o) in out.iter_mut().enumerate() {
            *o = (code(b, j) - 1) as f32 * d;
        }
    }
}

/// ggml's reference quantizer: d = max |x|, q = round(x / d) + 1 (half away from zero, by the
/// reciprocal of the unrounded d) clamped to 0..=3.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q2_0 (18 bytes each), aligned
/// to 2.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ2_0;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let amax = x
            .iter()
            .fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
        let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
        let mut b = BlockQ2_0 {
            d: f32_to_f16(amax),
            qs: [0; QK / 4],
        };
        for (j, &v) in x.iter().enumerate() {
            let q = ((v * id).round() as i32 + 1).clamp(0, 3);
            b.qs[j / 4] |= (q as u8) << (2 * (j % 4));
        }
        blocks.add(i).write(b);
    }
}

/// ggml's portable order as written: per Q8_0 block the integer dot times dy, summed in one
/// f32 per Q2_0 block, which is then multiplied by d and added.
///
/// # Safety
/// `x` must point to `n / QK` readable blocks of Q2_0 (18 bytes each, aligned to 2) and `y`
/// to `n / 32` blocks of Q8_0 (34 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ2_0, y as *const BlockQ8_0);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let bx = &*x.add(i);
        let mut sumi = 0f32;
        for k in 0..2 {
            let by = &*y.add(2 * i + k);
            let mut s = 0i32;
            for (j, &q) in by.qs.iter().enumerate() {
                s += (code(bx, 32 * k + j) - 1) * q as i32;
            }
            sumi += f16_to_f32(by.d) * s as f32;
        }
        sum += f16_to_f32(bx.d) * sumi;
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

    /// The integer dot of 8 code bytes (32 values) with one Q8_0 block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_sum(codes: *const u8, by: &BlockQ8_0) -> i32 {
        // 64-bit lane l gets bit pair l of each byte (element 4b + l at byte l * 8 + b) ...
        let q = _mm256_set1_epi64x((codes as *const i64).read_unaligned());
        let q = _mm256_and_si256(
            _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 2, 4, 6)),
            _mm256_set1_epi8(3),
        );
        // ... then elements 0..15 to the low 128 bits and 16..31 to the high ones, and within
        // each half byte l * 4 + b to position 4b + l: element order.
        let q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        let order = _mm256_setr_epi8(
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6,
            10, 14, 3, 7, 11, 15,
        );
        let q = _mm256_sub_epi8(_mm256_shuffle_epi8(q, order), _mm256_set1_epi8(1));
        let y = _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i);
        hsum_i32(dot_i8_i8(q, y))
    }

    /// ggml-cpu runs its portable code for Q2_0 on x86, which GCC compiles with fused
    /// multiply-adds (`sumi += d1 * sumi_block`, `sumf += d0 * sumi`): the same fusions here,
    /// so results agree with ggml's to the bit; only the exact integer sums are vectorized.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ2_0, y as *const BlockQ8_0);
        // Three scales per 64 values: table loads (see `f16_table`).
        let f16 = f16_table();
        let mut sum = 0f32;
        for i in 0..n / QK {
            let bx = &*x.add(i);
            let mut sumi = 0f32;
            for k in 0..2 {
                let by = &*y.add(2 * i + k);
                let s = block_sum(bx.qs.as_ptr().add(8 * k), by);
                sumi = f16[by.d as usize].mul_add(s as f32, sumi);
            }
            sum = sumi.mul_add(f16[bx.d as usize], sum);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_0, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition: bit pair l of byte b is element 4b + l.
    #[test]
    fn to_f32_by_definition() {
        let mut b = BlockQ2_0 {
            d: f32_to_f16(0.5),
            qs: [0; QK / 4],
        };
        let want = |j: usize| ((j * 7 + j / 5) % 4) as u8;
        for j in 0..QK {
            b.qs[j / 4] |= want(j) << (2 * (j % 4));
        }
        let mut out = vec![0f32; QK];
        unsafe { to_f32(&b as *const BlockQ2_0 as *const u8, &mut out) };
        for (j, &o) in out.iter().enumerate() {
            assert_eq!(o, 0.5 * (want(j) as f32 - 1.0), "j={j}");
        }
    }

    /// Known answers of ggml's rule: d = max |x| = 2, q = round(x / 2) + 1 (halves away from
    /// zero), so ±0.45 decode to 0 and ±0.55 to ±d; an all-zero block stays zero.
    #[test]
    fn from_f32_known_answers() {
        let mut x = vec![0f32; QK];
        let (given, want) = (
            [2.0, -2.0, 1.2, 0.9, -0.9, -1.1, 1.0, -1.0],
            [2.0, -2.0, 2.0, 0.0, 0.0, -2.0, 2.0, -2.0],
        );
        x[..8].copy_from_slice(&given);
        let y = dequantize(to_f32, &quantize(GgmlType::Q2_0, from_f32, &x), QK);
        assert_eq!(y[..8], want);
        assert!(y[8..].iter().all(|&v| v == 0.0));
        let z = dequantize(to_f32, &quantize(GgmlType::Q2_0, from_f32, &[0.0; QK]), QK);
        assert!(z.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn vec_dot_matches_scalar() {
        check_vec_dot(
            GgmlType::Q2_0,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
        check_vec_dot_extremes(
            GgmlType::Q2_0,
            to_f32,
            &[0],
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    /// Both dots approximate the product of the dequantized values on raw random blocks.
    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK;
            let dots = [vec_dot_fn(), vec_dot_ref as VecDot];
            let qx = raw_rows(GgmlType::Q2_0, &[0], n, 1, nb as u32);
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
