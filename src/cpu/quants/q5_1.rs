//! Q5_1: blocks of 32 values, f16 scale and min, 32 high bits, 16 bytes of low nibbles;
//! x = d * q + m. Bit layout as Q5_0. Multiplied with Q8_1.

use super::q8_1::BlockQ8_1;
use super::{f16_to_f32, f32_to_f16, use_avx2};
use crate::cpu::types::VecDot;

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

#[inline]
fn codes(qh: [u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let h = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0f) | (((h >> j) & 1) << 4) as u8;
        q[j + QK / 2] = (qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4) as u8;
    }
    q
}

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of Q5_1 (24 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ5_1;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for (o, &q) in out.iter_mut().zip(&codes(b.qh, &b.qs)) {
            *o = q as f32 * d + m;
        }
    }
}

/// ggml's reference: d = (max - min) / 31, codes rounded half up. (ggml lets a code of 32,
/// possible only through float rounding, wrap; it is capped at 31 here.)
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q5_1 (24 bytes each),
/// aligned to 2 bytes.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ5_1;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let (mut min, mut max) = (f32::MAX, f32::MIN);
        for &v in x {
            min = if v < min { v } else { min };
            max = if v > max { v } else { max };
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let code = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 31) as u32;
        let b = &mut *blocks.add(i);
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        let mut h = 0u32;
        for j in 0..QK / 2 {
            let (lo, hi) = (code(x[j]), code(x[j + QK / 2]));
            b.qs[j] = ((lo & 0x0f) | ((hi & 0x0f) << 4)) as u8;
            h |= ((lo >> 4) << j) | ((hi >> 4) << (j + 16));
        }
        b.qh = h.to_le_bytes();
    }
}

/// # Safety
/// `x` must point to `n / QK` readable blocks of Q5_1 (24 bytes each, aligned to 2)
/// and `y` to `n / QK` blocks of Q8_1 (36 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ5_1, y as *const BlockQ8_1);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let q = codes(bx.qh, &bx.qs);
        let sumi: i32 = q
            .iter()
            .zip(&by.qs)
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
        sum += sumi as f32 * (f16_to_f32(bx.d) * f16_to_f32(by.d))
            + f16_to_f32(bx.m) * f16_to_f32(by.s);
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

    /// As Q4_1 (see q4_1.rs): one accumulator over the blocks and the min terms summed as a
    /// scalar in block order, ggml-cpu's arithmetic order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ5_1, y as *const BlockQ8_1);
        let bit4 = _mm256_set1_epi8(0x10);
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for i in 0..n / QK {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            // Codes 0..31 are unsigned: maddubs takes them as they are.
            let high = _mm256_and_si256(bits_to_bytes(u32::from_le_bytes(bx.qh)), bit4);
            let q = _mm256_or_si256(nibbles(bx.qs.as_ptr()), high);
            let p = dot_u8_i8(q, _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i));
            // [dx, mx, dy, sy] in one conversion, then [dx·dy, mx·sy, ..].
            let xdm = (bx as *const BlockQ5_1 as *const u32).read_unaligned();
            let yds = (by as *const BlockQ8_1 as *const u32).read_unaligned();
            let v = _mm_cvtph_ps(_mm_set_epi32(0, 0, yds as i32, xdm as i32));
            let prod = _mm_mul_ps(v, _mm_movehl_ps(v, v));
            acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(p), acc);
            summs += _mm_cvtss_f32(_mm_movehdup_ps(prod));
        }
        hsum_f32(acc) + summs
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    /// Adds the block's scaled integer dot to `acc` and its min term mx·sy to lane 1 of `mins`.
    #[inline(always)]
    unsafe fn block<D: I8Dot>(
        bx: &BlockQ5_1,
        by: &BlockQ8_1,
        acc: float32x4_t,
        mins: float32x4_t,
    ) -> (float32x4_t, float32x4_t) {
        let h = u32::from_le_bytes(bx.qh);
        let q = vld1q_u8(bx.qs.as_ptr());
        // Codes 0..31 (nibble plus the fifth bit) are i8 as they are.
        let lo = vreinterpretq_s8_u8(vorrq_u8(
            vandq_u8(q, vdupq_n_u8(0x0f)),
            bit4_bytes(h as u16),
        ));
        let hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(q), bit4_bytes((h >> 16) as u16)));
        let y = by.qs.as_ptr();
        let p = D::dot(
            D::dot(vdupq_n_s32(0), lo, vld1q_s8(y)),
            hi,
            vld1q_s8(y.add(16)),
        );
        // [dx, mx, dy, sy] in one conversion; times [dy, sy, dx, mx] gives [dx·dy, mx·sy, ..].
        let xdm = (bx as *const BlockQ5_1 as *const u32).read_unaligned();
        let yds = (by as *const BlockQ8_1 as *const u32).read_unaligned();
        let v = f16x4(xdm as u64 | (yds as u64) << 32);
        let prod = vmulq_f32(v, vextq_f32::<2>(v, v));
        (
            vfmaq_laneq_f32::<0>(acc, vcvtq_f32_s32(p), prod),
            vaddq_f32(mins, prod),
        )
    }

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ5_1, y as *const BlockQ8_1);
        let mut mins = vdupq_n_f32(0.0);
        let acc = sum_blocks(n / QK, |i, acc| {
            let (acc, m) = block::<D>(&*x.add(i), &*y.add(i), acc, mins);
            mins = m;
            acc
        });
        vaddvq_f32(acc) + vgetq_lane_f32::<1>(mins)
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
    use crate::cpu::quants::{q8_1, testutil::*};
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
            "Q5_1: not the expected NEON kernel"
        );
        for dot in [neon::vec_dot, vec_dot_fn()] {
            check_vec_dot(
                GgmlType::Q5_1,
                from_f32,
                to_f32,
                GgmlType::Q8_1,
                q8_1::from_f32,
                q8_1::to_f32,
                dot,
                vec_dot_ref,
            );
            check_vec_dot_extremes(
                GgmlType::Q5_1,
                to_f32,
                &[0, 2],
                GgmlType::Q8_1,
                q8_1::from_f32,
                q8_1::to_f32,
                dot,
                vec_dot_ref,
            );
        }
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q5_1, from_f32, to_f32, 0.06);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q5_1,
            from_f32,
            to_f32,
            GgmlType::Q8_1,
            q8_1::from_f32,
            q8_1::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q5_1,
            to_f32,
            &[0, 2],
            GgmlType::Q8_1,
            q8_1::from_f32,
            q8_1::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
