//! Q5_0: blocks of 32 values, f16 scale, 32 high bits, 16 bytes of low nibbles; x = d * (q - 16).
//! Element j (< 16) has its low 4 bits in byte j's low nibble, element j + 16 in its high
//! nibble; bit 4 of element j is bit j of `qh`.

use super::q8_0::BlockQ8_0;
use super::{f16_to_f32, f32_to_f16, use_avx2};
use crate::cpu::types::VecDot;

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// The 32 codes (0..31) of a block.
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
/// `src` must point to `dst.len() / QK` readable blocks of Q5_0 (22 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ5_0;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (o, &q) in out.iter_mut().zip(&codes(b.qh, &b.qs)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// ggml's reference: largest magnitude maps onto -16, codes = x/d + 16.5 truncated, capped at 31.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q5_0 (22 bytes each),
/// aligned to 2 bytes.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ5_0;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let code = |v: f32| ((v * id + 16.5) as i32).clamp(0, 31) as u32;
        let b = &mut *blocks.add(i);
        b.d = f32_to_f16(d);
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
/// `x` must point to `n / QK` readable blocks of Q5_0 (22 bytes each, aligned to 2)
/// and `y` to `n / QK` blocks of Q8_0 (34 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ5_0, y as *const BlockQ8_0);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let q = codes(bx.qh, &bx.qs);
        let sumi: i32 = q
            .iter()
            .zip(&by.qs)
            .map(|(&a, &b)| (a as i32 - 16) * b as i32)
            .sum();
        sum += sumi as f32 * (f16_to_f32(bx.d) * f16_to_f32(by.d));
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

    /// One accumulator over the blocks, then a horizontal sum: ggml-cpu's order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ5_0, y as *const BlockQ8_0);
        let high_clear = _mm256_set1_epi8(0xf0u8 as i8);
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            // q - 16 as a signed byte is the bare nibble where bit 4 is set and the nibble
            // with the top four bits set (nibble - 16) where it is clear.
            let set = bits_to_bytes(u32::from_le_bytes(bx.qh));
            let q = _mm256_or_si256(
                nibbles(bx.qs.as_ptr()),
                _mm256_andnot_si256(set, high_clear),
            );
            let p = dot_i8_i8(q, _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i));
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(f16_mul(bx.d, by.d)),
                _mm256_cvtepi32_ps(p),
                acc,
            );
        }
        hsum_f32(acc)
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    #[inline(always)]
    unsafe fn block<D: I8Dot>(bx: &BlockQ5_0, by: &BlockQ8_0, acc: float32x4_t) -> float32x4_t {
        let h = u32::from_le_bytes(bx.qh);
        let q = vld1q_u8(bx.qs.as_ptr());
        let sixteen = vdupq_n_s8(16);
        // Nibble plus the fifth bit, minus 16: elements 0..15, then 16..31.
        let lo = vsubq_s8(
            vreinterpretq_s8_u8(vorrq_u8(
                vandq_u8(q, vdupq_n_u8(0x0f)),
                bit4_bytes(h as u16),
            )),
            sixteen,
        );
        let hi = vsubq_s8(
            vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(q), bit4_bytes((h >> 16) as u16))),
            sixteen,
        );
        let y = by.qs.as_ptr();
        let p = D::dot(
            D::dot(vdupq_n_s32(0), lo, vld1q_s8(y)),
            hi,
            vld1q_s8(y.add(16)),
        );
        vfmaq_n_f32(acc, vcvtq_f32_s32(p), f16_mul(bx.d, by.d))
    }

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ5_0, y as *const BlockQ8_0);
        vaddvq_f32(sum_blocks(n / QK, |i, acc| {
            block::<D>(&*x.add(i), &*y.add(i), acc)
        }))
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
    use crate::cpu::quants::{q8_0, testutil::*};
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
            "Q5_0: not the expected NEON kernel"
        );
        for dot in [neon::vec_dot, vec_dot_fn()] {
            check_vec_dot(
                GgmlType::Q5_0,
                from_f32,
                to_f32,
                GgmlType::Q8_0,
                q8_0::from_f32,
                q8_0::to_f32,
                dot,
                vec_dot_ref,
            );
            check_vec_dot_extremes(
                GgmlType::Q5_0,
                to_f32,
                &[0],
                GgmlType::Q8_0,
                q8_0::from_f32,
                q8_0::to_f32,
                dot,
                vec_dot_ref,
            );
        }
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q5_0, from_f32, to_f32, 0.07);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q5_0,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q5_0,
            to_f32,
            &[0],
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn high_bits_land_in_qh() {
        // Largest magnitude -16 → d = 1, code = x + 16; element 20 = 15 → code 31 (bit 4 set).
        let mut x = [0f32; 32];
        x[0] = -16.0;
        x[20] = 15.0;
        let q = quantize(GgmlType::Q5_0, from_f32, &x);
        let h = u32::from_le_bytes([q[2], q[3], q[4], q[5]]);
        // Every element other than x[0] has code 16 (bit 4 set); x[0] has code 0.
        assert_eq!(h, !1u32);
        assert_eq!(q[6 + 4] >> 4, 15);
        assert_eq!(dequantize(to_f32, &q, 32)[..], x[..]);
    }
}
