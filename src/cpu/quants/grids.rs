//! Lookup tables of the i-quants. The grids are the formats' definition (points picked from a
//! lattice by ggml's authors, not derivable): build.rs reads them from the pinned ggml's
//! ggml-common.h into `$OUT_DIR/iquant_grids.rs`. The sign tables follow from their definition.

include!(concat!(env!("OUT_DIR"), "/iquant_grids.rs"));

/// ggml's `ksigns_iq2xs`: 7 stored sign bits, the 8th set when they hold an odd number of
/// minus signs (the formats keep an even count, so the 8th is implied).
pub const KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | (((i as u8).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
};

/// Sign byte `b` spread over 8 bytes, 0xff where bit j is set, 0x01 where clear (the sign
/// operand of `_mm256_sign_epi8` and a multiplier for the scalar code alike).
pub const SIGN_BYTES: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if b >> j & 1 != 0 { 0xff } else { 0x01 };
            t[b] |= byte << (8 * j);
            j += 1;
        }
        b += 1;
    }
    t
};

/// `SIGN_BYTES` of each `KSIGNS` entry: one lookup per group of 8 in the dots.
pub const KSIGN_BYTES: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = SIGN_BYTES[KSIGNS[i] as usize];
        i += 1;
    }
    t
};

/// For the AVX2 dots: entry s0 | s1 << 4 holds 8 × (2 s0 + 1) then 8 × (2 s1 + 1) as i16, the
/// multipliers of a 32-value sub-block's 16 byte-pair sums (one load instead of building the
/// vector from two scalars, which costs the shuffle port the grid lookups need).
#[repr(C, align(32))]
pub struct Scales16(pub [[i16; 16]; 256]);

pub static SCALES16: Scales16 = Scales16({
    let mut t = [[0i16; 16]; 256];
    let mut i = 0;
    while i < 256 {
        let mut k = 0;
        while k < 16 {
            let s = if k < 8 { i & 15 } else { i >> 4 };
            t[i][k] = 2 * s as i16 + 1;
            k += 1;
        }
        i += 1;
    }
    t
});

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived sign table is ggml's.
    #[test]
    fn ksigns_is_ggmls() {
        assert_eq!(KSIGNS, GGML_KSIGNS_IQ2XS);
    }

    /// The grids read by build.rs have the shape the formats define: 8 (or 4) byte
    /// magnitudes from the formats' few levels, ternary points for IQ1.
    #[test]
    fn grids_have_the_formats_levels() {
        let bytes = |v: u64, n: usize| (0..n).map(move |j| (v >> (8 * j)) as u8);
        for g in IQ2XXS_GRID.iter().chain(&IQ2XS_GRID).chain(&IQ2S_GRID) {
            assert!(
                bytes(*g, 8).all(|b| [0x08, 0x19, 0x2b].contains(&b)),
                "{g:#x}"
            );
        }
        let iq3xxs = [4, 12, 20, 28, 36, 44, 52, 62];
        for g in IQ3XXS_GRID {
            assert!(bytes(g as u64, 4).all(|b| iq3xxs.contains(&b)), "{g:#x}");
        }
        for g in IQ3S_GRID {
            assert!(bytes(g as u64, 4).all(|b| b % 2 == 1 && b < 16), "{g:#x}");
        }
        for g in IQ1S_GRID {
            assert!(bytes(g, 8).all(|b| [0xff, 0, 1].contains(&b)), "{g:#x}");
        }
        assert_eq!(IQ2XXS_GRID[0], 0x0808080808080808);
        assert_eq!(IQ1S_GRID[0], u64::MAX);
    }
}
