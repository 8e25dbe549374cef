//! Q2_K: super-blocks of 256 values in 16 sub-blocks of 16, each with a 4-bit scale and a
//! 4-bit min in one byte, under f16 super-scales; x = d*sc*q - dmin*m, q in 0..3. Value
//! 128n + 32j + l sits at bit 2j of qs[32n + l].

use super::q8_k::BlockQ8K;
use super::{f16_to_f32, f32_to_f16, nearest, scale_min, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: u16,
    pub dmin: u16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

#[inline]
fn codes(b: &BlockQ2K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                q[128 * n + 32 * j + l] = (b.qs[32 * n + l] >> (2 * j)) & 3;
            }
        }
    }
    q
}

pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ2K;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let q = codes(b);
        for j in 0..16 {
            let (s, m) = (d * (b.scales[j] & 0x0f) as f32, dmin * (b.scales[j] >> 4) as f32);
            for l in 0..16 {
                out[16 * j + l] = s * q[16 * j + l] as f32 - m;
            }
        }
    }
}

pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ2K;
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let b = &mut *blocks.add(i);
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        for j in 0..16 {
            (scales[j], mins[j]) = scale_min(&x[16 * j..16 * j + 16], 3);
        }
        let max_scale = scales.iter().cloned().fold(0f32, f32::max);
        let max_min = mins.iter().cloned().fold(0f32, f32::max);
        b.d = f32_to_f16(max_scale / 15.0);
        b.dmin = f32_to_f16(max_min / 15.0);
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let mut q = [0u8; QK_K];
        for j in 0..16 {
            let sc = if d > 0.0 { nearest(scales[j] / d).clamp(0, 15) } else { 0 };
            let m = if dmin > 0.0 { nearest(mins[j] / dmin).clamp(0, 15) } else { 0 };
            b.scales[j] = (sc | (m << 4)) as u8;
            let (s, mf) = (d * sc as f32, dmin * m as f32);
            if s != 0.0 {
                for l in 0..16 {
                    q[16 * j + l] = nearest((x[16 * j + l] + mf) / s).clamp(0, 3) as u8;
                }
            }
        }
        b.qs = [0; QK_K / 4];
        for n in 0..2 {
            for j in 0..4 {
                for l in 0..32 {
                    b.qs[32 * n + l] |= q[128 * n + 32 * j + l] << (2 * j);
                }
            }
        }
    }
}

pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ2K, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let q = codes(bx);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..16 {
            let s: i32 = (0..16).map(|l| q[16 * j + l] as i32 * by.qs[16 * j + l] as i32).sum();
            sumi += (bx.scales[j] & 0x0f) as i32 * s;
            summ += (bx.scales[j] >> 4) as i32 * by.bsums[j] as i32;
        }
        sum += by.d * (f16_to_f32(bx.d) * sumi as f32 - f16_to_f32(bx.dmin) * summ as f32);
    }
    sum
}

pub fn vec_dot_fn() -> VecDot {
    vec_dot_ref
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q2_K, from_f32, to_f32, 0.45);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(GgmlType::Q2_K, from_f32, to_f32, GgmlType::Q8_K, q8_k::from_f32, q8_k::to_f32, vec_dot_fn(), vec_dot_ref);
    }
}
