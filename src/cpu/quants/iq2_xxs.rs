//! IQ2_XXS (2.06 bits per value): super-blocks of 256 values, an f16 scale `d`, then per
//! sub-block of 32 two u32: the first holds 4 indices into `IQ2XXS_GRID` (8 magnitudes
//! each), the second 4 × 7 sign bits (`KSIGNS`: the 8th sign is implied) and a 4-bit scale
//! s in its top bits; x = d * (0.5 + s) / 4 * magnitude * sign. Multiplied with Q8_K
//! (ggml-cpu's vec_dot_type for it). Weight-only: no quantizer (ggml's needs an importance
//! matrix), so CPY and SET_ROWS into it are not claimed.

use super::grids::{IQ2XXS_GRID, KSIGN_BYTES};
use super::sign_grid::{self, SignGrid, Signs, Sub};
use super::{use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq2Xxs {
    pub d: u16,
    pub qs: [u8; QK_K / 4],
}
const _: () = assert!(size_of::<BlockIq2Xxs>() == 66);

impl SignGrid for BlockIq2Xxs {
    const MULT: f32 = 0.125;
    fn d(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    fn sub(&self, ib: usize) -> Sub {
        let word =
            |k: usize| u32::from_le_bytes(self.qs[8 * ib + 4 * k..][..4].try_into().unwrap());
        let (idx, signs) = (word(0), word(1));
        let s = (signs >> 28) as u8;
        Sub {
            grid: std::array::from_fn(|l| IQ2XXS_GRID[(idx >> (8 * l)) as usize & 0xff]),
            signs: Signs::Bytes(std::array::from_fn(|l| {
                KSIGN_BYTES[(signs >> (7 * l)) as usize & 127]
            })),
            s: [s, s],
        }
    }
    fn db(d: f32, s: u8) -> f32 {
        d * (0.5 + s as f32) * 0.25
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ2_XXS (66 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    sign_grid::to_f32::<BlockIq2Xxs>(src, dst)
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ2_XXS (66 bytes each, aligned to 2) and
/// `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    sign_grid::vec_dot_ref::<BlockIq2Xxs>(n, x, y)
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return sign_grid::avx2::vec_dot::<BlockIq2Xxs>;
    }
    let _ = use_avx2;
    vec_dot_ref
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{f32_to_f16, q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition, on a hand-made block: grid index, 7 sign bits
    /// with the implied 8th, scale in the top 4 bits.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq2Xxs {
            d: f32_to_f16(2.0),
            qs: [0; 64],
        };
        // Sub-block 1: indices 1, 2, 3, 255; sign groups 0b0000001 (8th implied set), 0,
        // 0b0000011, 0; s = 5.
        let idx = u32::from_le_bytes([1, 2, 3, 255]);
        let signs: u32 = 1 | (3 << 14) | (5 << 28);
        b.qs[8..12].copy_from_slice(&idx.to_le_bytes());
        b.qs[12..16].copy_from_slice(&signs.to_le_bytes());
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq2Xxs as *const u8, &mut out) };
        let db = 2.0 * 5.5 * 0.25;
        for (l, (gi, sb)) in [(1usize, 0x81u8), (2, 0), (3, 3), (255, 0)]
            .iter()
            .enumerate()
        {
            for j in 0..8 {
                let mag = (IQ2XXS_GRID[*gi] >> (8 * j)) as u8 as f32;
                let sign = if sb >> j & 1 != 0 { -1.0 } else { 1.0 };
                assert_eq!(out[32 + 8 * l + j], db * mag * sign, "l={l} j={j}");
            }
        }
        // Sub-block 0 is all zero bytes: index 0 (all 8s), no signs, s = 0.
        assert!(out[..32].iter().all(|&v| v == 2.0 * 0.5 * 0.25 * 8.0));
    }

    /// The dispatched (AVX2) dot and the scalar one approximate the product of the
    /// dequantized values on raw random blocks.
    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_rows(GgmlType::IQ2_XXS, &[0], n, 1, nb as u32);
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
            GgmlType::IQ2_XXS,
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
