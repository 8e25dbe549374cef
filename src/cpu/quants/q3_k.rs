//! Q3_K: super-blocks of 256 values in 16 sub-blocks of 16, each with a 6-bit signed scale
//! (stored + 32, packed into 12 bytes), under an f16 super-scale; x = d * (sc - 32) * (q - 4),
//! q in 0..7. Value 128n + 32j + l has its low 2 bits at bit 2j of qs[32n + l] and bit 2 at
//! bit 4n + j of hmask[l].

use super::kquant_search::{fp32_to_fp16, make_q3_quants, nearest_int};
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: u16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// The 16 scales (0..63, +32 biased): low 4 bits in bytes 0..7 (low nibbles first), top 2
/// bits in bytes 8..11, two bits per group of four sub-blocks.
#[inline]
fn unpack_scales(s: &[u8; 12]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0x0f } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

fn pack_scales(v: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &x) in v.iter().enumerate() {
        if j < 8 {
            s[j] |= x & 0x0f;
        } else {
            s[j - 8] |= (x & 0x0f) << 4;
        }
        s[8 + j % 4] |= (x >> 4) << (2 * (j / 4));
    }
    s
}

/// The 256 codes (0..7) of a super-block.
#[inline]
fn codes(b: &BlockQ3K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let lo = (b.qs[32 * n + l] >> (2 * j)) & 3;
                let hi = (b.hmask[l] >> (4 * n + j)) & 1;
                q[128 * n + 32 * j + l] = lo | (hi << 2);
            }
        }
    }
    q
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of Q3_K (110 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ3K;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        let sc = unpack_scales(&b.scales);
        let q = codes(b);
        for j in 0..16 {
            let s = d * sc[j] as f32;
            for l in 0..16 {
                out[16 * j + l] = s * (q[16 * j + l] as i32 - 4) as f32;
            }
        }
    }
}

/// ggml's reference quantizer (`quantize_row_q3_K_ref`, what ggml-cpu's SET_ROWS runs), to the
/// bit: per sub-block of 16 a refined symmetric search on -4..3, the 16 scales quantized to
/// 6 bits against the one of largest magnitude, then the codes refitted.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK_K` blocks of Q3_K (110 bytes each).
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ3K;
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let b = &mut *blocks.add(i);
        let mut q = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(&x[16 * j..16 * j + 16], 4, &mut q[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        let mut biased = [0u8; 16];
        b.d = 0;
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // ggml stores the rounded value in an int8 before clamping it.
                let l = nearest_int(iscale * scales[j]) as i8 as i32;
                biased[j] = (l.clamp(-32, 31) + 32) as u8;
            }
            b.d = fp32_to_fp16(1.0 / iscale);
        }
        b.scales = pack_scales(&biased);
        let d_all = f16_to_f32(b.d);
        for j in 0..16 {
            let d = d_all * (biased[j] as i32 - 32) as f32;
            if d == 0.0 {
                continue; // keeps the search's codes, as ggml does
            }
            for l in 0..16 {
                q[16 * j + l] = (nearest_int(x[16 * j + l] / d).clamp(-4, 3) + 4) as u8;
            }
        }
        b.qs = [0; QK_K / 4];
        b.hmask = [0; QK_K / 8];
        for n in 0..2 {
            for j in 0..4 {
                for l in 0..32 {
                    let v = q[128 * n + 32 * j + l];
                    b.qs[32 * n + l] |= (v & 3) << (2 * j);
                    b.hmask[l] |= (v >> 2) << (4 * n + j);
                }
            }
        }
    }
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of Q3_K (110 bytes each, aligned to 2)
/// and `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ3K, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let sc = unpack_scales(&bx.scales);
        let q = codes(bx);
        let mut sumi = 0i32;
        for j in 0..16 {
            let s: i32 = (0..16)
                .map(|l| (q[16 * j + l] as i32 - 4) * by.qs[16 * j + l] as i32)
                .sum();
            sumi += sc[j] * s;
        }
        sum += by.d * f16_to_f32(bx.d) * sumi as f32;
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    /// The 16 biased scales as bytes, in order (the 12-byte packing undone with 32-bit masks).
    #[inline]
    fn unpack_scales_bytes(s: &[u8; 12]) -> [u32; 4] {
        let w = |k: usize| u32::from_le_bytes([s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]]);
        let (lo, mid, top) = (w(0), w(1), w(2));
        let (m4, m2) = (0x0f0f_0f0f, 0x0303_0303);
        [
            (lo & m4) | ((top & m2) << 4),
            (mid & m4) | (((top >> 2) & m2) << 4),
            ((lo >> 4) & m4) | (((top >> 4) & m2) << 4),
            ((mid >> 4) & m4) | (((top >> 6) & m2) << 4),
        ]
    }

    /// One accumulator over the blocks, then a horizontal sum: ggml-cpu's order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ3K, y as *const BlockQ8K);
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let zero = _mm256_setzero_si256();
        let pairs = scale_pairs();
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let d = _mm256_set1_ps(by.d * f16(bx.d));
            let biased = unpack_scales_bytes(&bx.scales);
            let sc = _mm_sub_epi8(
                _mm_loadu_si128(biased.as_ptr() as *const __m128i),
                _mm_set1_epi8(32),
            );
            let sc = _mm256_cvtepi8_epi16(sc);
            let hbits = _mm256_loadu_si256(bx.hmask.as_ptr() as *const __m256i);
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let q3 = _mm256_loadu_si256(bx.qs.as_ptr().add(32 * h) as *const __m256i);
                // 16-bit shifts leak bits across bytes; the mask to 2 bits drops them.
                let q = [
                    _mm256_and_si256(q3, m3),
                    _mm256_and_si256(_mm256_srli_epi16(q3, 2), m3),
                    _mm256_and_si256(_mm256_srli_epi16(q3, 4), m3),
                    _mm256_and_si256(_mm256_srli_epi16(q3, 6), m3),
                ];
                // The 8 scales of this half, as i16, in both 128-bit lanes.
                let sh = if h == 0 {
                    _mm256_permute2x128_si256(sc, sc, 0x00)
                } else {
                    _mm256_permute2x128_si256(sc, sc, 0x11)
                };
                for k in 0..4 {
                    // q - 4 = low bits - (4 where the high bit is clear): maddubs needs unsigned
                    // bytes, so the two parts get one each and are subtracted per pair.
                    let bit = _mm256_set1_epi8((1u8 << (4 * h + k)) as i8);
                    let off = _mm256_and_si256(
                        _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), zero),
                        four,
                    );
                    let yk =
                        _mm256_loadu_si256(by.qs.as_ptr().add(128 * h + 32 * k) as *const __m256i);
                    let p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(q[k], yk),
                        _mm256_maddubs_epi16(off, yk),
                    );
                    sumi = _mm256_add_epi32(
                        sumi,
                        _mm256_madd_epi16(p, _mm256_shuffle_epi8(sh, pairs[k])),
                    );
                }
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_f32(acc)
    }
}

/// Integer sums per sub-block as `vec_dot_ref` forms them.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ3K, y as *const BlockQ8K);
        let (m3, four) = (vdupq_n_u8(3), vdupq_n_s8(4));
        let mut sum = 0f32;
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            // One i32x4 per sub-block of 16: value 128n + 32j + l has its low bits at bits 2j
            // of qs[32n + l] and bit 2 at bit 4n + j of hmask[l]; sub-block 8n + 2j + l / 16.
            let mut p = [vdupq_n_s32(0); 16];
            for h in 0..2 {
                let hm = vld1q_u8(bx.hmask.as_ptr().add(16 * h));
                for n in 0..2 {
                    let q2 = vld1q_u8(bx.qs.as_ptr().add(32 * n + 16 * h));
                    for j in 0..4 {
                        let lo = vandq_u8(vshlq_u8(q2, vdupq_n_s8(-2 * j as i8)), m3);
                        let hi = vandq_u8(
                            vshlq_u8(hm, vdupq_n_s8(2 - (4 * n + j) as i8)),
                            vdupq_n_u8(4),
                        );
                        let q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), four);
                        let yq = vld1q_s8(by.qs.as_ptr().add(128 * n + 32 * j + 16 * h));
                        p[8 * n + 2 * j + h] = D::dot(vdupq_n_s32(0), q, yq);
                    }
                }
            }
            let sc = unpack_scales(&bx.scales);
            let sc32: [int32x4_t; 4] = std::array::from_fn(|k| vld1q_s32(sc.as_ptr().add(4 * k)));
            sum += by.d * f16(bx.d) * scaled_sum(&p, &sc32) as f32;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// SDOT is dispatched where the CPU has it; the base-NEON dot (dispatched elsewhere) is
    /// checked here too.
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
            "Q3_K: not the expected NEON kernel"
        );
        for dot in [neon::vec_dot, vec_dot_fn()] {
            check_vec_dot(
                GgmlType::Q3_K,
                from_f32,
                to_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                dot,
                vec_dot_ref,
            );
            check_vec_dot_extremes(
                GgmlType::Q3_K,
                to_f32,
                &[108],
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                dot,
                vec_dot_ref,
            );
        }
    }

    #[test]
    fn scale_packing_round_trips() {
        let v: [u8; 16] = [0, 63, 1, 62, 32, 31, 17, 48, 5, 6, 7, 60, 33, 20, 10, 44];
        let got = unpack_scales(&pack_scales(&v));
        assert_eq!(got.map(|s| (s + 32) as u8), v);
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q3_K, from_f32, to_f32, 0.3);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q3_K,
            from_f32,
            to_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q3_K,
            to_f32,
            &[108],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
