//! IQ2_S (2.56 bits per value): super-blocks of 256 values, an f16 scale `d`, 32 index bytes
//! then 32 sign bytes (one per group of 8 values, all 8 signs stored), 8 bytes of index high
//! bits (2 per group: 10-bit indices into `IQ2S_GRID`, 8 magnitudes each) and a byte per
//! sub-block of 32 holding two 4-bit scales s (values 0..15, 16..31);
//! x = d * (0.5 + s) / 4 * magnitude * sign. Multiplied with Q8_K (ggml-cpu's vec_dot_type
//! for it). Weight-only: no quantizer, so CPY and SET_ROWS into it are not claimed.

use super::grids::IQ2S_GRID;
use super::sign_grid::{self, SignGrid, Signs, Sub};
use super::{use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq2S {
    pub d: u16,
    /// Low 8 bits of the 32 grid indices, then the 32 sign bytes.
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq2S>() == 82);

impl SignGrid for BlockIq2S {
    const MULT: f32 = 0.125;
    fn d(&self) -> u16 {
        self.d
    }
    #[inline(always)]
    fn sub(&self, ib: usize) -> Sub {
        let qh = self.qh[ib] as usize;
        let sc = self.scales[ib];
        Sub {
            grid: std::array::from_fn(|l| {
                IQ2S_GRID[self.qs[4 * ib + l] as usize | (qh << (8 - 2 * l) & 0x300)]
            }),
            signs: Signs::Bits(u32::from_le_bytes(
                self.qs[32 + 4 * ib..][..4].try_into().unwrap(),
            )),
            s: [sc & 0x0f, sc >> 4],
        }
    }
    fn db(d: f32, s: u8) -> f32 {
        d * (0.5 + s as f32) * 0.25
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ2_S (82 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    sign_grid::to_f32::<BlockIq2S>(src, dst)
}

/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ2_S (82 bytes each, aligned to 2) and
/// `y` to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    sign_grid::vec_dot_ref::<BlockIq2S>(n, x, y)
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return sign_grid::avx2::vec_dot::<BlockIq2S>;
    }
    let _ = use_avx2;
    vec_dot_ref
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{f32_to_f16, q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Decoding by the format's definition, on a hand-made block: 10-bit indices from qs and
    /// qh, 8 stored signs, a scale nibble per half sub-block.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq2S {
            d: f32_to_f16(1.5),
            qs: [0; 64],
            qh: [0; 8],
            scales: [0; 8],
        };
        // Sub-block 7: indices 0x3ff, 0x105, 0x2aa, 0x011; signs 0xff, 0x80, 0x01, 0;
        // scales 15, 1.
        let groups = [
            (0x3ffusize, 0xffu8),
            (0x105, 0x80),
            (0x2aa, 0x01),
            (0x011, 0),
        ];
        for (l, (i, s)) in groups.iter().enumerate() {
            b.qs[28 + l] = *i as u8;
            b.qh[7] |= ((i >> 8) as u8) << (2 * l);
            b.qs[32 + 28 + l] = *s;
        }
        b.scales[7] = 15 | 1 << 4;
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq2S as *const u8, &mut out) };
        for (l, (i, s)) in groups.iter().enumerate() {
            let db = 1.5 * (0.5 + [15.0, 1.0][l / 2]) * 0.25;
            for j in 0..8 {
                let mag = (IQ2S_GRID[*i] >> (8 * j)) as u8 as f32;
                let sign = if s >> j & 1 != 0 { -1.0 } else { 1.0 };
                assert_eq!(out[224 + 8 * l + j], db * mag * sign, "l={l} j={j}");
            }
        }
    }

    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_rows(GgmlType::IQ2_S, &[0], n, 1, nb as u32);
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
            GgmlType::IQ2_S,
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
