//! Q8_1: Q8_0 plus `s = d * sum(q)`, so that dots with offset formats (Q4_1, Q5_1) get the
//! offset term for free. Activation-only: ggml-cpu has a quantizer for it and nothing else.

use super::{f16_to_f32, f32_to_f16};

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

/// Dequantizes (for tests; not exposed through the traits, as ggml has no such conversion).
///
/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of Q8_1 (36 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ8_1;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Same rounding as ggml-cpu's x86 `quantize_row_q8_1` (see q8_0::from_f32); `s` is computed
/// from the rounded integers with the unrounded f32 scale.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q8_1 (36 bytes each),
/// aligned to 2 bytes.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        return avx2::from_f32(src, dst);
    }
    #[cfg(target_arch = "aarch64")]
    if super::use_neon() {
        return neon::from_f32(src, dst);
    }
    from_f32_ref(src, dst)
}

/// Plain version of `from_f32`.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q8_1 (36 bytes each),
/// aligned to 2 bytes.
pub unsafe fn from_f32_ref(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ8_1;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let b = &mut *blocks.add(i);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        b.d = f32_to_f16(d);
        b.s = f32_to_f16(d * sum as f32);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::quantize_block_i8;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
        let blocks = dst as *mut BlockQ8_1;
        for (i, x) in src.chunks_exact(QK).enumerate() {
            let b = &mut *blocks.add(i);
            let (d, sum) = quantize_block_i8(x.as_ptr(), b.qs.as_mut_ptr());
            b.d = f32_to_f16(d);
            b.s = f32_to_f16(d * sum as f32);
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::{f32_to_f16, quantize_block_i8};

    #[target_feature(enable = "neon")]
    pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
        let blocks = dst as *mut BlockQ8_1;
        for (i, x) in src.chunks_exact(QK).enumerate() {
            let b = &mut *blocks.add(i);
            let (d, sum) = quantize_block_i8(x.as_ptr(), b.qs.as_mut_ptr());
            b.d = f32_to_f16(d);
            b.s = f32_to_f16(d * sum as f32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::testutil::*;
    use crate::ggml_types::GgmlType;

    #[test]
    fn round_trip_and_sum() {
        check_round_trip(GgmlType::Q8_1, from_f32, to_f32, 0.01);
        let x = data(32 * 9, 6);
        assert_eq!(
            quantize(GgmlType::Q8_1, from_f32, &x),
            quantize(GgmlType::Q8_1, from_f32_ref, &x)
        );
        #[cfg(target_arch = "aarch64")]
        assert_eq!(
            quantize(GgmlType::Q8_1, neon::from_f32, &x),
            quantize(GgmlType::Q8_1, from_f32_ref, &x)
        );
        let x = data(64, 3);
        let q = quantize(GgmlType::Q8_1, from_f32, &x);
        let b = unsafe { &*(q.as_ptr() as *const BlockQ8_1).add(1) };
        let sum: i32 = b.qs.iter().map(|&v| v as i32).sum();
        let d = x[32..].iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        assert_eq!(b.s, f32_to_f16(d * sum as f32));
    }
}
