//! Q4_K: super-blocks of 256 values in 8 sub-blocks of 32, each with a 6-bit scale and 6-bit
//! min (packed into 12 bytes), under f16 super-scales d and dmin; x = d*sc*q - dmin*m.
//! Codes: 4 chunks of 32 bytes; chunk c holds sub-block 2c in its low nibbles, 2c+1 in its high.

use super::kquant_search::{fp32_to_fp16, make_qkx2_quants, nearest_int, Qkx2};
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, use_neon, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// The 8 (scale, min) pairs of the shared Q4_K/Q5_K 12-byte packing: entries 0..3 use the low
/// 6 bits of bytes 0..3 / 4..7; entries 4..7 take 4 bits from bytes 8..11 and their top 2 bits
/// from the spare high bits of bytes 0..3 / 4..7.
#[inline]
pub fn unpack_scales(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, mn)
}

/// The 8 scales and the 8 mins as bytes (the 12-byte packing undone with 32-bit masks).
#[inline]
pub fn unpack_scales_u64(s: &[u8; 12]) -> (u64, u64) {
    let w = |k: usize| u32::from_le_bytes([s[4 * k], s[4 * k + 1], s[4 * k + 2], s[4 * k + 3]]);
    let (s0, s1, s2) = (w(0), w(1), w(2));
    let sc_lo = s0 & 0x3f3f_3f3f;
    let mn_lo = s1 & 0x3f3f_3f3f;
    let sc_hi = (s2 & 0x0f0f_0f0f) | (((s0 >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((s2 >> 4) & 0x0f0f_0f0f) | (((s1 >> 6) & 0x0303_0303) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        mn_lo as u64 | (mn_hi as u64) << 32,
    )
}

/// Inverse of `unpack_scales` (values must be < 64).
pub fn pack_scales(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4);
    }
    s
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of Q4_K (144 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ4K;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let (sc, mn) = unpack_scales(&b.scales);
        for c in 0..4 {
            let (d1, m1) = (d * sc[2 * c] as f32, dmin * mn[2 * c] as f32);
            let (d2, m2) = (d * sc[2 * c + 1] as f32, dmin * mn[2 * c + 1] as f32);
            for l in 0..32 {
                let q = b.qs[32 * c + l];
                out[64 * c + l] = d1 * (q & 0x0f) as f32 - m1;
                out[64 * c + 32 + l] = d2 * (q >> 4) as f32 - m2;
            }
        }
    }
}

/// ggml's reference K-quant super-block quantizer shared by Q4_K (nmax 15, rmin -1, 20 steps)
/// and Q5_K (nmax 31, rmin -0.5, 15 steps), to the bit (`quantize_row_q4_K_ref` /
/// `_q5_K_ref`, what ggml-cpu's SET_ROWS runs): per sub-block of 32 a weighted asymmetric
/// search (weights rms + |x|), the scales and mins quantized to 6 bits against the largest of
/// each, then the codes refitted. Returns (d, dmin, scales, codes).
pub fn quantize_super_block(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> (u16, u16, [u8; 12], [u8; QK_K]) {
    let search = Qkx2 {
        nmax,
        rmin,
        rdelta: 0.1,
        nstep,
        use_mad: false,
    };
    let mut codes = [0u8; QK_K];
    let mut laux = [0u8; 32];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        let qs = &mut codes[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx2_quants(xs, &weights, qs, &mut laux, &search);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml stores the rounded values in a uint8 before taking the min with 63.
    let sc: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let mn: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let d = fp32_to_fp16(max_scale / 63.0);
    let dmin = fp32_to_fp16(max_min / 63.0);
    let (df, dminf) = (f16_to_f32(d), f16_to_f32(dmin));
    for j in 0..8 {
        let s = df * sc[j] as f32;
        if s == 0.0 {
            continue; // keeps the search's codes, as ggml does
        }
        let m = dminf * mn[j] as f32;
        for l in 0..32 {
            codes[32 * j + l] = nearest_int((x[32 * j + l] + m) / s).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, pack_scales(&sc, &mn), codes)
}

/// Quantizes `src` into Q4_K blocks as ggml-cpu does (see `q4_k::quantize_super_block`).
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK_K` blocks of Q4_K (144 bytes each).
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ4K;
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let b = &mut *blocks.add(i);
        let (d, dmin, scales, codes) = quantize_super_block(x, 15, -1.0, 20);
        b.d = d;
        b.dmin = dmin;
        b.scales = scales;
        for c in 0..4 {
            for l in 0..32 {
                b.qs[32 * c + l] = codes[64 * c + l] | (codes[64 * c + 32 + l] << 4);
            }
        }
    }
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of Q4_K (144 bytes each, aligned to 2)
/// and `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ4K, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let (sc, mn) = unpack_scales(&bx.scales);
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for c in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = bx.qs[32 * c + l];
                lo += (q & 0x0f) as i32 * by.qs[64 * c + l] as i32;
                hi += (q >> 4) as i32 * by.qs[64 * c + 32 + l] as i32;
            }
            sumi += sc[2 * c] as i32 * lo + sc[2 * c + 1] as i32 * hi;
        }
        for (&m, bs) in mn.iter().zip(by.bsums.chunks_exact(2)) {
            summ += m as i32 * (bs[0] as i32 + bs[1] as i32);
        }
        sum += by.d * (f16_to_f32(bx.d) * sumi as f32 - f16_to_f32(bx.dmin) * summ as f32);
    }
    sum
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if super::use_avx512() {
        return avx512::vec_dot;
    }
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return avx2::vec_dot;
    }
    #[cfg(target_arch = "aarch64")]
    if use_neon() {
        return if crate::cpu::simd::has_dotprod() {
            neon::vec_dot_sdot
        } else {
            neon::vec_dot
        };
    }
    let _ = (use_avx2, use_neon);
    vec_dot_ref
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ4K, y as *const BlockQ8K);
        let m4 = _mm256_set1_epi8(0x0f);
        let bcast = scale_broadcasts();
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let dd = f16_pair((bx as *const BlockQ4K as *const u32).read_unaligned());
            let d = _mm256_set1_ps(by.d * _mm_cvtss_f32(dd));
            let dmin = _mm_set1_ps(by.d * _mm_cvtss_f32(_mm_movehdup_ps(dd)));
            let (sc, mn) = unpack_scales_u64(&bx.scales);
            let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
            let mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
            // Mins meet the activations only through their sums per 32 (pairs of bsums).
            let bs = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
            let bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(_mm_madd_epi16(mn16, bs32)), acc_m);
            let scv = _mm256_broadcastsi128_si256(sc16);
            let mut sumi = _mm256_setzero_si256();
            for c in 0..4 {
                let q = _mm256_loadu_si256(bx.qs.as_ptr().add(32 * c) as *const __m256i);
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let y0 = _mm256_loadu_si256(by.qs.as_ptr().add(64 * c) as *const __m256i);
                let y1 = _mm256_loadu_si256(by.qs.as_ptr().add(64 * c + 32) as *const __m256i);
                let p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(lo, y0),
                    _mm256_shuffle_epi8(scv, bcast[2 * c]),
                );
                let p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, y1),
                    _mm256_shuffle_epi8(scv, bcast[2 * c + 1]),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        hsum_f32(acc) - _mm_cvtss_f32(m)
    }

    /// `vec_dot` of R rows by C ≤ 4 columns, each pair summed exactly as `vec_dot` sums it:
    /// per super-block the same i32 lanes (integer sums, so their order is free), the same
    /// f32 products, FMAs and final reductions. Sub-block by sub-block, each row's nibbles
    /// and scale vector are made once for all columns and each column's 32 activations are
    /// loaded once for all rows.
    // The loop indices address the register tile, the row and column pointers and the
    // output together (as ggml's tiled kernels do): iterators would hide that.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile<const R: usize, const C: usize>(
        n: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        const { assert!(C <= 4) };
        let m4 = _mm256_set1_epi8(0x0f);
        let bcast = scale_broadcasts();
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut acc_m = [[_mm_setzero_ps(); C]; R];
        for i in 0..n / QK_K {
            let bx = |r: usize| &*(x.add(r * xs) as *const BlockQ4K).add(i);
            let by = |c: usize| &*(y.add(c * ys) as *const BlockQ8K).add(i);
            let mut dy = [0f32; C];
            let mut bs32 = [_mm_setzero_si128(); C];
            for c in 0..C {
                dy[c] = by(c).d;
                let bs = _mm256_loadu_si256(by(c).bsums.as_ptr() as *const __m256i);
                bs32[c] =
                    _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            }
            let mut dx = [0f32; R];
            let mut scv = [_mm256_setzero_si256(); R];
            for r in 0..R {
                let b = bx(r);
                if C == 1 {
                    // One column streams the matrix once: fetch the next tile's rows (the
                    // memory right after these R rows) while this one is summed.
                    let p = (b as *const BlockQ4K as *const i8).add(R * xs);
                    for o in [0, 64, 128] {
                        _mm_prefetch::<_MM_HINT_T0>(p.add(o));
                    }
                }
                let dd = f16_pair((b as *const BlockQ4K as *const u32).read_unaligned());
                dx[r] = _mm_cvtss_f32(dd);
                let dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
                let (sc, mn) = unpack_scales_u64(&b.scales);
                let mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
                scv[r] =
                    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
                for c in 0..C {
                    // by.d · dmin: the product vec_dot forms.
                    let m = _mm_set1_ps(dy[c] * dmin);
                    acc_m[r][c] = _mm_fmadd_ps(
                        m,
                        _mm_cvtepi32_ps(_mm_madd_epi16(mn16, bs32[c])),
                        acc_m[r][c],
                    );
                }
            }
            let mut sumi = [[_mm256_setzero_si256(); C]; R];
            // Sub-block j: low nibbles of code chunk j / 2 for even j, high for odd.
            for j in 0..8 {
                let mut q = [_mm256_setzero_si256(); R];
                let mut s = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    let v =
                        _mm256_loadu_si256(bx(r).qs.as_ptr().add(32 * (j / 2)) as *const __m256i);
                    q[r] = if j % 2 == 0 {
                        _mm256_and_si256(v, m4)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)
                    };
                    s[r] = _mm256_shuffle_epi8(scv[r], bcast[j]);
                }
                for c in 0..C {
                    let yv = _mm256_loadu_si256(by(c).qs.as_ptr().add(32 * j) as *const __m256i);
                    for r in 0..R {
                        sumi[r][c] = _mm256_add_epi32(
                            sumi[r][c],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], yv), s[r]),
                        );
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    // by.d · d: the product vec_dot forms.
                    acc[r][c] = _mm256_fmadd_ps(
                        _mm256_set1_ps(dy[c] * dx[r]),
                        _mm256_cvtepi32_ps(sumi[r][c]),
                        acc[r][c],
                    );
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                let am = acc_m[r][c];
                let m = _mm_add_ps(am, _mm_movehl_ps(am, am));
                let m = _mm_add_ss(m, _mm_movehdup_ps(m));
                *(out.add(r * 4 + c * os) as *mut f32) = hsum_f32(acc[r][c]) - _mm_cvtss_f32(m);
            }
        }
    }
}

/// AVX-512: the AVX2 kernel with two chunks of the integer work per instruction. Chunk c's
/// 32 code bytes are loaded into both halves, low nibbles (sub-block 2c) kept in the low half
/// and high nibbles (2c + 1) in the high one, against 64 contiguous activation bytes; the halves
/// are added before the one conversion per super-block, so the i32 lanes, and with them the
/// result, are the AVX2 kernel's to the bit.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::*;
    use crate::cpu::quants::avx512::join;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    // The loop indices address the register tile, the row and column pointers and the
    // output together (as ggml's tiled kernels do): iterators would hide that.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ4K, y as *const BlockQ8K);
        let m4 = _mm512_set1_epi8(0x0f);
        // 16-bit shifts by 0 (low half) and 4 (high half): low nibbles, then high ones.
        let shifts = join(_mm256_setzero_si256(), _mm256_set1_epi16(4));
        let b = scale_broadcasts();
        let tabs: [__m512i; 4] = std::array::from_fn(|c| join(b[2 * c], b[2 * c + 1]));
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let dd = f16_pair((bx as *const BlockQ4K as *const u32).read_unaligned());
            let d = _mm256_set1_ps(by.d * _mm_cvtss_f32(dd));
            let dmin = _mm_set1_ps(by.d * _mm_cvtss_f32(_mm_movehdup_ps(dd)));
            let (sc, mn) = unpack_scales_u64(&bx.scales);
            let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
            let mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
            let bs = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
            let bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(_mm_madd_epi16(mn16, bs32)), acc_m);
            let scv = _mm512_broadcast_i32x4(sc16);
            let mut sumi = _mm512_setzero_si512();
            for c in 0..4 {
                let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    bx.qs.as_ptr().add(32 * c) as *const __m256i
                ));
                let q = _mm512_and_si512(_mm512_srlv_epi16(q, shifts), m4);
                let yv = _mm512_loadu_si512(by.qs.as_ptr().add(64 * c) as *const _);
                let p = _mm512_madd_epi16(
                    _mm512_maddubs_epi16(q, yv),
                    _mm512_shuffle_epi8(scv, tabs[c]),
                );
                sumi = _mm512_add_epi32(sumi, p);
            }
            let sumi = _mm256_add_epi32(
                _mm512_castsi512_si256(sumi),
                _mm512_extracti64x4_epi64::<1>(sumi),
            );
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        hsum_f32(acc) - _mm_cvtss_f32(m)
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ4K, y as *const BlockQ8K);
        let m4 = vdupq_n_u8(0x0f);
        let mut sum = 0f32;
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let dd = f16x4((bx as *const BlockQ4K as *const u32).read_unaligned() as u64);
            let (sc, mn) = unpack_scales_u64(&bx.scales);
            // Mins meet the activations only through their sums per 32 (pairs of bsums).
            let bs = vpaddq_s16(
                vld1q_s16(by.bsums.as_ptr()),
                vld1q_s16(by.bsums.as_ptr().add(8)),
            );
            let mn16 = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(mn)));
            let summ = vaddvq_s32(vmlal_high_s16(
                vmull_s16(vget_low_s16(mn16), vget_low_s16(bs)),
                mn16,
                bs,
            ));
            // One i32x4 per sub-block: each chunk of 32 code bytes holds sub-block 2c in its
            // low nibbles and 2c + 1 in its high ones.
            let mut p = [vdupq_n_s32(0); 8];
            for c in 0..4 {
                let (qx, qy) = (bx.qs.as_ptr().add(32 * c), by.qs.as_ptr().add(64 * c));
                for h in 0..2 {
                    let q = vld1q_u8(qx.add(16 * h));
                    let lo = vreinterpretq_s8_u8(vandq_u8(q, m4));
                    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
                    p[2 * c] = D::dot(p[2 * c], lo, vld1q_s8(qy.add(16 * h)));
                    p[2 * c + 1] = D::dot(p[2 * c + 1], hi, vld1q_s8(qy.add(32 + 16 * h)));
                }
            }
            let sc16 = vmovl_u8(vcreate_u8(sc));
            let sc32 = [vmovl_u16(vget_low_u16(sc16)), vmovl_high_u16(sc16)]
                .map(|v| vreinterpretq_s32_u32(v));
            let sumi = scaled_sum(&p, &sc32);
            sum += by.d
                * (vgetq_lane_f32::<0>(dd) * sumi as f32 - vgetq_lane_f32::<1>(dd) * summ as f32);
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

    #[test]
    fn scale_packing_round_trips() {
        let sc = [0, 1, 63, 17, 32, 63, 5, 48];
        let mn = [63, 2, 0, 33, 15, 16, 62, 1];
        assert_eq!(unpack_scales(&pack_scales(&sc, &mn)), (sc, mn));
    }

    /// The AVX-512 dot equals the AVX2 one to the bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_dot_equals_avx2() {
        check_same_dot(
            GgmlType::Q4_K,
            from_f32,
            &[0, 2],
            GgmlType::Q8_K,
            q8_k::from_f32,
            avx512::vec_dot,
            avx2::vec_dot,
        );
    }

    /// The registered tile, and other shapes, equal the dispatched dot to the bit.
    #[test]
    fn tiles_equal_vec_dot() {
        // The generation tile is registered only where AVX-512 does not run.
        let [gemm, gemv] = tiles(GgmlType::Q4_K);
        check_tiles(
            GgmlType::Q4_K,
            from_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            vec_dot_fn(),
            &[gemm],
        );
        assert_eq!(
            gemv.is_some(),
            use_avx2() && !crate::cpu::quants::use_avx512()
        );
        check_tiles(
            GgmlType::Q4_K,
            from_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            vec_dot_fn(),
            &[gemv].map(|t| t.or(gemm)),
        );
        #[cfg(target_arch = "x86_64")]
        if use_avx2() {
            use crate::cpu::types::{DotTile, Tile};
            let tile = |rows, cols, dot: DotTile| Tile { rows, cols, dot };
            let shapes = [
                tile(2, 4, avx2::tile::<2, 4>),
                tile(4, 1, avx2::tile::<4, 1>),
                tile(2, 1, avx2::tile::<2, 1>),
                tile(1, 1, avx2::tile::<1, 1>),
                tile(3, 2, avx2::tile::<3, 2>),
                tile(2, 2, avx2::tile::<2, 2>),
                tile(1, 4, avx2::tile::<1, 4>),
                tile(3, 4, avx2::tile::<3, 4>),
            ];
            check_tiles(
                GgmlType::Q4_K,
                from_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                vec_dot_fn(),
                &shapes.map(Some),
            );
            check_tiles_raw(
                GgmlType::Q4_K,
                &[0, 2],
                GgmlType::Q8_K,
                q8_k::from_f32,
                vec_dot_fn(),
                &shapes,
            );
        }
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q4_K, from_f32, to_f32, 0.12);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q4_K,
            from_f32,
            to_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

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
            "Q4_K: not the expected NEON kernel"
        );
        check_vec_dot(
            GgmlType::Q4_K,
            from_f32,
            to_f32,
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
        check_vec_dot_extremes(
            GgmlType::Q4_K,
            to_f32,
            &[0, 2],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q4_K,
            to_f32,
            &[0, 2],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
