//! IQ3_XXS (3.06 bits per value): super-blocks of 256 values, an f16 scale `d`, 64 bytes of
//! indices into `IQ3XXS_GRID` (4 magnitudes each, two per group of 8 values), then per
//! sub-block of 32 one u32: 4 × 7 sign bits (`KSIGNS`: the 8th implied) and a 4-bit scale s
//! in its top bits; x = d * (0.5 + s) / 2 * magnitude * sign. Multiplied with Q8_K (ggml-cpu's
//! vec_dot_type for it). Weight-only: no quantizer, so CPY and SET_ROWS into it are not
//! claimed.

use super::grids::{IQ3XXS_GRID, KSIGN_BYTES};
use super::sign_grid::{self, SignGrid, Signs, Sub};
use super::{use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq3Xxs {
    pub d: u16,
    /// 64 grid indices, then the 8 sign-and-scale words.
    pub qs: [u8; 3 * QK_K / 8],
}
const _: () = assert!(size_of::<BlockIq3Xxs>() == 98);

impl SignGrid for BlockIq3Xxs {
    const MULT: f32 = 0.25;
    fn d(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    fn sub(&self, ib: usize) -> Sub {
        let q = &self.qs[8 * ib..8 * ib + 8];
        let aux = u32::from_le_bytes(self.qs[64 + 4 * ib..][..4].try_into().unwrap());
        let s = (aux >> 28) as u8;
        Sub {
            grid: std::array::from_fn(|l| {
                IQ3XXS_GRID[q[2 * l] as usize] as u64
                    | (IQ3XXS_GRID[q[2 * l + 1] as usize] as u64) << 32
            }),
            signs: Signs::Bytes(std::array::from_fn(|l| {
                KSIGN_BYTES[(aux >> (7 * l)) as usize & 127]
            })),
            s: [s, s],
        }
    }
    fn db(d: f32, s: u8) -> f32 {
        d * (0.5 + s as f32) * 0.5
    }
    #[inline(always)]
    fn grid4(&self, ib: usize) -> Option<(&'static [u32], *const u8, u8)> {
        Some((&IQ3XXS_GRID, self.qs[8 * ib..].as_ptr(), 0))
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ3_XXS (98 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    sign_grid::to_f32::<BlockIq3Xxs>(src, dst)
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ3_XXS (98 bytes each, aligned to 2) and
/// `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    sign_grid::vec_dot_ref::<BlockIq3Xxs>(n, x, y)
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return sign_grid::avx2::vec_dot::<BlockIq3Xxs>;
    }
    let _ = use_avx2;
    vec_dot_ref
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{f32_to_f16, q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition, on a hand-made block: two 4-value grid points per
    /// group of 8, 7 sign bits with the implied 8th, the scale in the top 4 bits.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq3Xxs {
            d: f32_to_f16(0.25),
            qs: [0; 96],
        };
        // Sub-block 3: grid indices 8l, 8l + 1 per group l; sign groups 0, 1, 64, 127; s = 9.
        for k in 0..8 {
            b.qs[24 + k] = (4 * k + 1) as u8;
        }
        let sg = [0u32, 1, 64, 127];
        let aux = sg
            .iter()
            .enumerate()
            .fold(9 << 28, |a, (l, s)| a | s << (7 * l));
        b.qs[64 + 12..64 + 16].copy_from_slice(&aux.to_le_bytes());
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq3Xxs as *const u8, &mut out) };
        let db = 0.25 * 9.5 * 0.5;
        for l in 0..4 {
            let sb = sg[l] | ((sg[l].count_ones() & 1) << 7);
            for j in 0..8 {
                let g = IQ3XXS_GRID[4 * (2 * l + j / 4) + 1];
                let mag = (g >> (8 * (j % 4))) as u8 as f32;
                let sign = if sb >> j & 1 != 0 { -1.0 } else { 1.0 };
                assert_eq!(out[96 + 8 * l + j], db * mag * sign, "l={l} j={j}");
            }
        }
    }

    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_rows(GgmlType::IQ3_XXS, &[0], n, 1, nb as u32);
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
            GgmlType::IQ3_XXS,
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
