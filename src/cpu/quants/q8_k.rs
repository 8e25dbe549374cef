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
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK_K` blocks of Q8_K (292 bytes each),
/// aligned to 4 bytes.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
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
}
