//! IQ3_S (3.44 bits per value): super-blocks of 256 values, an f16 scale `d`, 64 index bytes
//! and 8 bytes of their high bits (9-bit indices into `IQ3S_GRID`, 4 magnitudes each, two per
//! group of 8 values), 32 sign bytes (all 8 signs of a group stored) and a 4-bit scale s per
//! sub-block of 32 (two per byte); x = d * (1 + 2s) * magnitude * sign. Multiplied with Q8_K
//! (ggml-cpu's vec_dot_type for it). Weight-only: no quantizer, so CPY and SET_ROWS into it
//! are not claimed.

use super::grids::IQ3S_GRID;
use super::sign_grid::{self, SignGrid, Signs, Sub};
use super::{use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq3S {
    pub d: u16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}
const _: () = assert!(size_of::<BlockIq3S>() == 110);

impl SignGrid for BlockIq3S {
    const MULT: f32 = 1.0;
    fn d(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    fn sub(&self, ib: usize) -> Sub {
        let q = &self.qs[8 * ib..8 * ib + 8];
        let qh = self.qh[ib] as usize;
        let s = (self.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let idx = |k: usize| q[k] as usize | (qh << (8 - k) & 256);
        Sub {
            grid: std::array::from_fn(|l| {
                IQ3S_GRID[idx(2 * l)] as u64 | (IQ3S_GRID[idx(2 * l + 1)] as u64) << 32
            }),
            signs: Signs::Bits(u32::from_le_bytes(
                self.signs[4 * ib..][..4].try_into().unwrap(),
            )),
            s: [s, s],
        }
    }
    fn db(d: f32, s: u8) -> f32 {
        d * (1 + 2 * s as i32) as f32
    }
    #[inline(always)]
    fn grid4(&self, ib: usize) -> Option<(&'static [u32], *const u8, u8)> {
        Some((&IQ3S_GRID, self.qs[8 * ib..].as_ptr(), self.qh[ib]))
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ3_S (110 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    sign_grid::to_f32::<BlockIq3S>(src, dst)
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ3_S (110 bytes each, aligned to 2) and
/// `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    sign_grid::vec_dot_ref::<BlockIq3S>(n, x, y)
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return sign_grid::avx2::vec_dot::<BlockIq3S>;
    }
    let _ = use_avx2;
    vec_dot_ref
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{f32_to_f16, q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition, on a hand-made block: 9-bit indices (high bit k
    /// of qh for the k-th grid point of the sub-block), 8 stored signs, a scale nibble per
    /// sub-block.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq3S {
            d: f32_to_f16(0.75),
            qs: [0; 64],
            qh: [0; 8],
            signs: [0; 32],
            scales: [0; 4],
        };
        // Sub-block 5: grid point k has index 60 * k + 7 (up to 427: high bit k);
        // signs 0x0f, 0xf0, 0x55, 0; s = 13 (high nibble of scales[2]).
        let idx = |k: usize| 60 * k + 7;
        for k in 0..8 {
            b.qs[40 + k] = idx(k) as u8;
            b.qh[5] |= ((idx(k) >> 8) as u8) << k;
        }
        let sg = [0x0fu8, 0xf0, 0x55, 0];
        b.signs[20..24].copy_from_slice(&sg);
        b.scales[2] = 13 << 4 | 2;
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq3S as *const u8, &mut out) };
        let db = 0.75 * 27.0;
        for l in 0..4 {
            for j in 0..8 {
                let g = IQ3S_GRID[idx(2 * l + j / 4)];
                let mag = (g >> (8 * (j % 4))) as u8 as f32;
                let sign = if sg[l] >> j & 1 != 0 { -1.0 } else { 1.0 };
                assert_eq!(out[160 + 8 * l + j], db * mag * sign, "l={l} j={j}");
            }
        }
        // Sub-block 4 (low nibble 2), all index 0 and no signs.
        let g0 = (IQ3S_GRID[0] & 0xff) as f32;
        assert!(out[128..160].iter().all(|&v| v == 0.75 * 5.0 * g0));
    }

    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_rows(GgmlType::IQ3_S, &[0], n, 1, nb as u32);
            check_dots_dequantized(
                &qx,
                n,
                to_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                &[vec_dot_fn(), vec_dot_ref as VecDot],
                &[],
                nb as u32,
            );
        }
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::IQ3_S,
            to_f32,
            &[0],
            GgmlType::Q8_K,
            q8_k::from_f32,
            q8_k::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
