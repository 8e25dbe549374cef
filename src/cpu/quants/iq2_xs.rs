//! IQ2_XS (2.31 bits per value): super-blocks of 256 values, an f16 scale `d`, 32 u16 (per
//! group of 8 values: a 9-bit index into `IQ2XS_GRID`, 8 magnitudes, and 7 sign bits,
//! `KSIGNS`), then a byte per sub-block of 32 holding two 4-bit scales s (values 0..15,
//! 16..31); x = d * (0.5 + s) / 4 * magnitude * sign. Multiplied with Q8_K (ggml-cpu's
//! vec_dot_type for it). Weight-only: no quantizer (ggml's needs an importance matrix), so
//! CPY and SET_ROWS into it are not claimed.

use super::grids::{IQ2XS_GRID, KSIGN_BYTES};
use super::sign_grid::{self, SignGrid, Signs, Sub};
use super::{use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq2Xs {
    pub d: u16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq2Xs>() == 74);

impl SignGrid for BlockIq2Xs {
    const MULT: f32 = 0.125;
    fn d(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    fn sub(&self, ib: usize) -> Sub {
        let q = &self.qs[4 * ib..4 * ib + 4];
        let sc = self.scales[ib];
        Sub {
            grid: std::array::from_fn(|l| IQ2XS_GRID[(q[l] & 511) as usize]),
            signs: Signs::Bytes(std::array::from_fn(|l| KSIGN_BYTES[(q[l] >> 9) as usize])),
            s: [sc & 0x0f, sc >> 4],
        }
    }
    fn db(d: f32, s: u8) -> f32 {
        d * (0.5 + s as f32) * 0.25
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ2_XS (74 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    sign_grid::to_f32::<BlockIq2Xs>(src, dst)
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ2_XS (74 bytes each, aligned to 2) and
/// `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    sign_grid::vec_dot_ref::<BlockIq2Xs>(n, x, y)
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return sign_grid::avx2::vec_dot::<BlockIq2Xs>;
    }
    let _ = use_avx2;
    vec_dot_ref
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{f32_to_f16, q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition, on a hand-made block: 9-bit index, 7 sign bits
    /// with the implied 8th, a scale nibble per half sub-block.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq2Xs {
            d: f32_to_f16(0.5),
            qs: [0; 32],
            scales: [0; 8],
        };
        // Sub-block 2: indices 511, 300, 7, 0 with sign groups 1, 2, 0, 127; scales 3, 12.
        let groups = [(511u16, 1u16), (300, 2), (7, 0), (0, 127)];
        for (l, (i, s)) in groups.iter().enumerate() {
            b.qs[8 + l] = i | s << 9;
        }
        b.scales[2] = 3 | 12 << 4;
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq2Xs as *const u8, &mut out) };
        for (l, (i, s)) in groups.iter().enumerate() {
            let db = 0.5 * (0.5 + [3.0, 12.0][l / 2]) * 0.25;
            let sb = *s as u32 | ((s.count_ones() & 1) << 7);
            for j in 0..8 {
                let mag = (IQ2XS_GRID[*i as usize] >> (8 * j)) as u8 as f32;
                let sign = if sb >> j & 1 != 0 { -1.0 } else { 1.0 };
                assert_eq!(out[64 + 8 * l + j], db * mag * sign, "l={l} j={j}");
            }
        }
    }

    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_rows(GgmlType::IQ2_XS, &[0], n, 1, nb as u32);
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
            GgmlType::IQ2_XS,
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
