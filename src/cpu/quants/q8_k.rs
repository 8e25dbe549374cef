//! Q8_K: super-blocks of 256 values, f32 scale, 256 signed bytes and the sums of each group
//! of 16 (the K-quant dots use them for their offsets). Activation type of the K-quants.

use super::{nearest, QK_K};

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// Dequantizes (for tests; ggml-cpu exposes no conversion from Q8_K).
///
/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of Q8_K (292 bytes each),
/// aligned to 4 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ8K;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}

/// Matches ggml's `quantize_row_q8_K_ref` (which ggml-cpu uses on every architecture): the
/// value of largest magnitude maps onto -127, rounding is to nearest even, d = 1/multiplier.
/// Every K-quant product quantizes its activations with it, once per product.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK_K` blocks of Q8_K (292 bytes each),
/// aligned to 4 bytes.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        return avx2::from_f32(src, dst);
    }
    from_f32_ref(src, dst)
}

/// `from_f32` one value at a time (the statement of it; blocks with a NaN or an infinity).
///
/// # Safety
/// As `from_f32`.
pub unsafe fn from_f32_ref(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ8K;
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let b = &mut *blocks.add(i);
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = [0; QK_K];
            b.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest(iscale * v).min(127) as i8;
        }
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&v| v as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::hsum_i32;
    use std::arch::x86_64::*;

    /// `from_f32_ref` eight values at a time, to the bit: the same largest magnitude and the
    /// first value that has it, the same products, and `vcvtps2dq` rounds to nearest even as
    /// `nearest` does. (The scalar loop rounds through `roundevenf`, a libm call per value on a
    /// baseline x86-64 build: 20-40 us for a 4096-value column, once per K-quant product.)
    /// A block with a NaN or an infinity, or whose multiplier overflows, takes the scalar loop.
    ///
    /// # Safety
    /// As `from_f32`; the CPU must have AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
        let blocks = dst as *mut BlockQ8K;
        let sign = _mm256_set1_ps(-0.0);
        let top = _mm256_set1_epi32(127);
        let ones = _mm256_set1_epi16(1);
        // packs leave the four 8-value groups' dwords as a0 b0 c0 d0 | a1 b1 c1 d1.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (i, x) in src.chunks_exact(QK_K).enumerate() {
            let b = &mut *blocks.add(i);
            let p = x.as_ptr();
            let (mut m, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for j in (0..QK_K).step_by(8) {
                let v = _mm256_loadu_ps(p.add(j));
                m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
                odd = _mm256_or_ps(odd, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            }
            let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            if _mm256_movemask_ps(odd) != 0 || amax.is_infinite() {
                from_f32_ref(x, b as *mut BlockQ8K as *mut u8);
                continue;
            }
            if amax == 0.0 {
                b.d = 0.0;
                b.qs = [0; QK_K];
                b.bsums = [0; QK_K / 16];
                continue;
            }
            let want = _mm256_set1_ps(amax);
            let mut max = 0f32;
            for j in (0..QK_K).step_by(8) {
                let a = _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(j)));
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, want));
                if hit != 0 {
                    max = x[j + hit.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0 / max;
            if !iscale.is_finite() {
                // A largest magnitude under 127 / f32::MAX: the scalar loop's saturating casts.
                from_f32_ref(x, b as *mut BlockQ8K as *mut u8);
                continue;
            }
            let vs = _mm256_set1_ps(iscale);
            let q = b.qs.as_mut_ptr();
            for j in (0..QK_K).step_by(32) {
                let r = |o: usize| {
                    let v = _mm256_mul_ps(vs, _mm256_loadu_ps(p.add(j + o)));
                    _mm256_min_epi32(_mm256_cvtps_epi32(v), top)
                };
                let ab = _mm256_packs_epi32(r(0), r(8));
                let cd = _mm256_packs_epi32(r(16), r(24));
                let all = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
                _mm256_storeu_si256(q.add(j) as *mut __m256i, all);
            }
            for (g, s) in b.bsums.iter_mut().enumerate() {
                let v = _mm256_cvtepi8_epi16(_mm_loadu_si128(q.add(16 * g) as *const __m128i));
                *s = hsum_i32(_mm256_madd_epi16(v, ones)) as i16;
            }
            b.d = 1.0 / iscale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::testutil::*;
    use crate::ggml_types::GgmlType;

    #[test]
    fn round_trip_and_bsums() {
        // One scale per 256 values spanning blocks of very different magnitudes.
        check_round_trip(GgmlType::Q8_K, from_f32, to_f32, 0.03);
        let x = data(512, 9);
        let q = quantize(GgmlType::Q8_K, from_f32, &x);
        let b = unsafe { &*(q.as_ptr() as *const BlockQ8K).add(1) };
        for g in 0..16 {
            let s: i32 = b.qs[g * 16..g * 16 + 16].iter().map(|&v| v as i32).sum();
            assert_eq!(s, b.bsums[g] as i32);
        }
        // The largest magnitude lands exactly on ±127.
        assert_eq!(b.qs.iter().map(|v| (*v as i32).abs()).max(), Some(127));
    }

    /// `from_f32` (AVX2 where the CPU has it) gives `from_f32_ref`'s bytes: random blocks of
    /// many magnitudes, a zero block, +m and -m both present (the first one sets the sign),
    /// values on rounding ties, blocks with a NaN or an infinity, and one whose multiplier
    /// overflows.
    #[test]
    fn fast_equals_reference() {
        let mut x = data(QK_K * 12, 21);
        for (i, v) in x.iter_mut().enumerate() {
            *v *= [1e-3, 1.0, 37.0, 1e4][i / QK_K % 4];
        }
        let blk = |b: usize| b * QK_K;
        x[blk(1)..blk(2)].fill(0.0);
        x[blk(2) + 9] = 50.0;
        x[blk(2) + 3] = -50.0;
        for (j, v) in x[blk(3)..blk(4)].iter_mut().enumerate() {
            // -127 / 127 = -1: products k + 0.5 on the ties.
            *v = if j == 0 {
                127.0
            } else {
                (j % 200) as f32 * 0.5 - 50.0
            };
        }
        x[blk(4) + 17] = f32::NAN;
        x[blk(5) + 200] = f32::INFINITY;
        x[blk(6) + 1] = f32::NEG_INFINITY;
        // Magnitudes so small that -127 / max overflows (and a subnormal among them).
        for (j, v) in x[blk(7)..blk(8)].iter_mut().enumerate() {
            *v = (j as f32 - 100.0) * 1e-39;
        }
        let n = x.len() / QK_K;
        let (mut a, mut b) = (vec![0u32; n * 73], vec![1u32; n * 73]);
        unsafe {
            from_f32_ref(&x, a.as_mut_ptr() as *mut u8);
            from_f32(&x, b.as_mut_ptr() as *mut u8);
        }
        for i in 0..n {
            assert!(
                a[i * 73..(i + 1) * 73] == b[i * 73..(i + 1) * 73],
                "block {i}"
            );
        }
    }
}
