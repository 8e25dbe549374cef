//! NVFP4 (ggml type 40, new in ggml 0.26: NVIDIA's FP4): blocks of 64 values as four sub-blocks
//! of 16, each with a UE4M3 scale byte (unsigned, 4 exponent bits with bias 7, 3 mantissa bits),
//! then 32 bytes of 4-bit E2M1 codes: byte 8s + j holds element 16s + j (low nibble) and
//! 16s + 8 + j (high nibble); x = UE4M3(s) * E2M1[q]. As for MXFP4 the E2M1 levels are stored
//! doubled (integers) and the scale halved. Multiplied with Q8_0 (ggml-cpu's vec_dot_type for
//! it): one block meets two Q8_0 blocks, two sub-blocks each.

use super::mxfp4::TABLE;
use super::q8_0::BlockQ8_0;
use super::{f16_to_f32, use_avx2};
use crate::cpu::types::VecDot;

pub const QK: usize = 64;
const SUB: usize = 16;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockNvfp4 {
    pub d: [u8; QK / SUB],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockNvfp4>() == 36);

/// Half the value of a UE4M3 scale byte, as ggml decodes it: the top bit is ignored, 0x7f (the
/// NaN code) is 0, exponent 0 is subnormal (m * 2^-9).
const fn ue4m3_half_of(x: u8) -> f32 {
    let (e, m) = (((x >> 3) & 0xf) as u32, (x & 7) as u32);
    if x == 0x7f || (e == 0 && m == 0) {
        0.0
    } else if e == 0 {
        m as f32 / 1024.0
    } else {
        // (1 + m/8) * 2^(e - 7) / 2: exponent field e - 8 + 127.
        f32::from_bits((e + 119) << 23 | m << 20)
    }
}

static UE4M3_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = ue4m3_half_of(i as u8);
        i += 1;
    }
    t
};

#[inline]
pub fn ue4m3_half(x: u8) -> f32 {
    UE4M3_HALF[x as usize]
}

/// ggml's `ggml_fp32_to_ue4m3`: round half up on the mantissa, 448 the largest, subnormals by
/// `(int)(x * 512 + 0.5)`, 0 for anything not above zero (NaN too).
fn ue4m3_of(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = x.min(448.0);
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127 + 7;
    if e <= 0 {
        let m = ((x * 512.0 + 0.5) as i32).min(7);
        return if m < 1 { 0 } else { m as u8 };
    }
    if e >= 15 {
        return 0x7e;
    }
    let mut m = ((bits >> 20) & 7) as i32 + ((bits >> 19) & 1) as i32;
    if m > 7 {
        m = 0;
        e += 1;
        if e >= 15 {
            return 0x7e;
        }
    }
    (e << 3 | m) as u8
}

/// The E2M1 code nearest x / (2 d) (the first of equals), as ggml's `best_index_mxfp4`.
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = (0u8, (TABLE[0] as f32 * d - x).abs());
    for (i, &k) in TABLE.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best.1 {
            best = (i as u8, err);
        }
    }
    best.0
}

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of NVFP4 (36 bytes each).
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockNvfp4;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        for (s, o) in out.chunks_exact_mut(SUB).enumerate() {
            let d = ue4m3_half(b.d[s]);
            for j in 0..SUB / 2 {
                let q = b.qs[s * SUB / 2 + j];
                o[j] = TABLE[(q & 0x0f) as usize] as f32 * d;
                o[j + SUB / 2] = TABLE[(q >> 4) as usize] as f32 * d;
            }
        }
    }
}

/// ggml's reference quantizer: per sub-block the scale amax / 6 rounded to UE4M3, each value
/// the nearest E2M1 level times that scale.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of NVFP4 (36 bytes each).
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockNvfp4;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let mut b = BlockNvfp4 {
            d: [0; QK / SUB],
            qs: [0; QK / 2],
        };
        for (s, xs) in x.chunks_exact(SUB).enumerate() {
            let amax = xs
                .iter()
                .fold(0f32, |m, v| if m < v.abs() { v.abs() } else { m });
            b.d[s] = ue4m3_of(amax / 6.0);
            let d = ue4m3_half(b.d[s]);
            for j in 0..SUB / 2 {
                b.qs[s * SUB / 2 + j] = best_index(xs[j], d) | best_index(xs[j + SUB / 2], d) << 4;
            }
        }
        blocks.add(i).write(b);
    }
}

/// ggml's portable order: per sub-block the integer dot times dy * d, added to one f32.
///
/// # Safety
/// `x` must point to `n / QK` readable blocks of NVFP4 (36 bytes each, any alignment) and `y`
/// to `n / 32` blocks of Q8_0 (34 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockNvfp4, y as *const BlockQ8_0);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let bx = &*x.add(i);
        for s in 0..QK / SUB {
            let by = &*y.add(2 * i + s / 2);
            let off = (s % 2) * SUB;
            let mut sumi = 0i32;
            for j in 0..SUB / 2 {
                let q = bx.qs[s * SUB / 2 + j];
                sumi += by.qs[off + j] as i32 * TABLE[(q & 0x0f) as usize] as i32;
                sumi += by.qs[off + j + SUB / 2] as i32 * TABLE[(q >> 4) as usize] as i32;
            }
            sum += f16_to_f32(by.d) * ue4m3_half(bx.d[s]) * sumi as f32;
        }
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

    /// Two sub-blocks (16 code bytes) as 32 signed levels in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn levels(table: __m128i, p: *const u8) -> __m256i {
        let q = _mm_loadu_si128(p as *const __m128i);
        let m4 = _mm_set1_epi8(0x0f);
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
        _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi))
    }

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: per block two vectors of
    /// 8 i32 lanes (4 per sub-block), each multiplied by its sub-blocks' d * dy and fused into
    /// one accumulator, lanes summed at the end.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockNvfp4, y as *const BlockQ8_0);
        let table = _mm_loadu_si128(TABLE.as_ptr() as *const __m128i);
        // One activation scale per 32 values: table loads (see `f16_table`).
        let f16 = f16_table();
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK {
            let bx = &*x.add(i);
            for h in 0..2 {
                let by = &*y.add(2 * i + h);
                let q = levels(table, bx.qs.as_ptr().add(16 * h));
                let p = dot_i8_i8(q, _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i));
                let dy = f16[by.d as usize];
                let s0 = _mm_set1_ps(ue4m3_half(bx.d[2 * h]) * dy);
                let s1 = _mm_set1_ps(ue4m3_half(bx.d[2 * h + 1]) * dy);
                acc = _mm256_fmadd_ps(_mm256_set_m128(s1, s0), _mm256_cvtepi32_ps(p), acc);
            }
        }
        hsum_f32(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_0, testutil::*};
    use crate::ggml_types::GgmlType;

    /// UE4M3 by its definition (bias 7, subnormals m * 2^-6 / 8), halved; as ggml, the top bit
    /// ignored and 0x7f zero.
    fn ue4m3_by_definition(x: u8) -> f32 {
        let (e, m) = (((x >> 3) & 0xf) as i32, (x & 7) as f64);
        let v = if x == 0x7f {
            0.0
        } else if e == 0 {
            m / 8.0 * 2f64.powi(-6)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - 7)
        };
        (v * 0.5) as f32
    }

    #[test]
    fn ue4m3_table_by_definition() {
        for x in 0..=255u8 {
            assert_eq!(ue4m3_half(x), ue4m3_by_definition(x), "byte {x:#x}");
        }
    }

    /// The scale rounding: every UE4M3 value maps to its own code, the midpoints round up, the
    /// extremes clamp (256 and above to 0x7e, below half the smallest subnormal to 0).
    #[test]
    fn ue4m3_rounding() {
        for x in 1..0x78u8 {
            assert_eq!(ue4m3_of(2.0 * ue4m3_half(x)), x, "byte {x:#x}");
        }
        assert_eq!(ue4m3_of(1.0625), 0x39); // between 1 (0x38) and 1.125 (0x39)
                                            // ggml clamps every value from 2^8 up (exponent 15) to 448.
        assert_eq!(ue4m3_of(256.0), 0x7e);
        assert_eq!(ue4m3_of(1000.0), 0x7e);
        assert_eq!(ue4m3_of(0.0009), 0);
        assert_eq!(ue4m3_of(-1.0), 0);
        assert_eq!(ue4m3_of(f32::NAN), 0);
    }

    /// Decoding by the format's definition: sub-block s's scale times the E2M1 value, nibble
    /// order within the sub-block as in Q4_0.
    #[test]
    fn to_f32_by_definition() {
        const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let mut b = BlockNvfp4 {
            d: [0x38, 0x30, 0x41, 0x07],
            qs: [0; QK / 2],
        };
        for (j, q) in b.qs.iter_mut().enumerate() {
            *q = (j % 16) as u8 | (((j * 3 + 1) % 16) as u8) << 4;
        }
        let mut out = vec![0f32; QK];
        unsafe { to_f32(&b as *const BlockNvfp4 as *const u8, &mut out) };
        let value = |q: usize, s: usize| {
            let v = E2M1[q & 7] * 2.0 * ue4m3_by_definition(b.d[s]);
            if q & 8 != 0 {
                -v
            } else {
                v
            }
        };
        for s in 0..4 {
            for j in 0..8 {
                let byte = 8 * s + j;
                assert_eq!(out[16 * s + j], value(byte % 16, s), "s={s} j={j}");
                assert_eq!(
                    out[16 * s + 8 + j],
                    value((byte * 3 + 1) % 16, s),
                    "s={s} j={j}"
                );
            }
        }
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::NVFP4, from_f32, to_f32, 0.15);
    }

    #[test]
    fn vec_dot_matches_scalar() {
        check_vec_dot(
            GgmlType::NVFP4,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
        check_vec_dot_extremes(
            GgmlType::NVFP4,
            to_f32,
            &[],
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
