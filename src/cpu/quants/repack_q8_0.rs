//! Q8_0 weights repacked at load (RFCPU's `RFCPU_REPACK` buffer type, `cpu/repack.rs`) into
//! groups of 16 rows that the generation kernels read as one contiguous stream.
//!
//! Layout of a matrix of `rows` rows of `nb` blocks (row size `rs` = 34·nb, the same bytes as
//! ggml's): group g (rows 16g .. 16g + 16) fills the 16 rows' bytes at 16·g·rs; its block b, at
//! 544·b inside the group, is the 16 rows' f16 scales (32 bytes), then the 32 codes of each row
//! in turn, row r at 32 + 32·r, stored as q + 128 (q ^ 0x80: unsigned, as `vpdpbusd` takes
//! them), so one 64-byte load holds a block of rows 2j and 2j + 1. Rows past the last whole
//! group stay as ggml lays them out, at their usual place.
//!
//! Products over the layout keep the plain path's order, ggml-cpu's AVX2 `vec_dot` (no change of
//! summation order, unlike Q4_0's repack): per row 8 f32 lanes, lane l summing per block
//! `fma(dx·dy, Σ_{e=4l}^{4l+3} q_e·y_e, acc_l)`, then the AVX2 horizontal sum. So every result
//! equals `q8_0::avx2::vec_dot` (and the register tiles) to the bit; `row_ref` is the scalar
//! statement of it. Prompts unpack a group back to ggml's rows (`unrepack` of one group) and run
//! the plain tiles over it.

use super::f16_to_f32;
use super::panel::ROWS;
use super::q8_0::BlockQ8_0;

/// A group's products with 1 to 3 columns (`gemv_ref`'s arguments).
pub type Gemv = unsafe fn(usize, *const u8, *const u8, usize, usize, *mut u8, usize);

/// Bytes of one block of a group: 16 scales and 16 × 32 codes.
pub const GROUP_BLOCK: usize = ROWS * size_of::<BlockQ8_0>();
const CODES_AT: usize = ROWS * 2;

/// Repacks the `rows` rows (`nb` blocks each, contiguous) at `src` into `dst` (same size).
///
/// # Safety
/// `src` and `dst` must each span `rows · nb · 34` bytes and not overlap.
pub unsafe fn repack(rows: usize, nb: usize, src: *const u8, dst: *mut u8) {
    let rs = nb * size_of::<BlockQ8_0>();
    let groups = rows / ROWS;
    for g in 0..groups {
        let (s, d) = (src.add(g * ROWS * rs), dst.add(g * ROWS * rs));
        for b in 0..nb {
            let db = d.add(b * GROUP_BLOCK);
            for r in 0..ROWS {
                let bx = &*(s.add(r * rs) as *const BlockQ8_0).add(b);
                (db as *mut u16).add(r).write_unaligned(bx.d);
                let at = db.add(CODES_AT + 32 * r);
                for (e, &q) in bx.qs.iter().enumerate() {
                    *at.add(e) = q as u8 ^ 0x80;
                }
            }
        }
    }
    let done = groups * ROWS * rs;
    std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), (rows - groups * ROWS) * rs);
}

/// The inverse of `repack`: ggml's layout of the `rows` rows repacked at `src`, to `dst`
/// (with `rows` = 16, one group back to plain rows: the prompt path's unpacking).
///
/// # Safety
/// As `repack`.
pub unsafe fn unrepack(rows: usize, nb: usize, src: *const u8, dst: *mut u8) {
    let rs = nb * size_of::<BlockQ8_0>();
    let groups = rows / ROWS;
    for g in 0..groups {
        let (s, d) = (src.add(g * ROWS * rs), dst.add(g * ROWS * rs));
        for b in 0..nb {
            let sb = s.add(b * GROUP_BLOCK);
            for r in 0..ROWS {
                let bx = &mut *(d.add(r * rs) as *mut BlockQ8_0).add(b);
                bx.d = (sb as *const u16).add(r).read_unaligned();
                let at = sb.add(CODES_AT + 32 * r);
                for (e, q) in bx.qs.iter_mut().enumerate() {
                    *q = (*at.add(e) ^ 0x80) as i8;
                }
            }
        }
    }
    let done = groups * ROWS * rs;
    std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), (rows - groups * ROWS) * rs);
}

/// Scalar statement of the AVX2 `vec_dot`'s order for row `r` of the repacked group at `g`
/// against the `nb` Q8_0 blocks at `y`: 8 lanes of 4 products each, one fma per block and lane,
/// then the AVX2 horizontal sum ((l + l+4), then pairs 2 apart, then the last two).
///
/// # Safety
/// `g` must hold a repacked group of `nb` blocks, `y` `nb` Q8_0 blocks.
pub unsafe fn row_ref(nb: usize, g: *const u8, r: usize, y: *const u8) -> f32 {
    let y = y as *const BlockQ8_0;
    let mut acc = [0f32; 8];
    for b in 0..nb {
        let gb = g.add(b * GROUP_BLOCK);
        let by = &*y.add(b);
        let dx = f16_to_f32((gb as *const u16).add(r).read_unaligned());
        let scale = dx * f16_to_f32(by.d);
        let codes = gb.add(CODES_AT + 32 * r);
        for (l, a) in acc.iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4)
                .map(|e| (*codes.add(e) as i32 - 128) * by.qs[e] as i32)
                .sum();
            *a = scale.mul_add(p as f32, *a);
        }
    }
    let s: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    let (s0, s1) = (s[0] + s[2], s[1] + s[3]);
    s0 + s1
}

/// The products of one group with `cols` Q8_0 activation columns (column c's blocks at
/// `y + c * ys`), row r of column c to `out + r * 4 + c * os` (bytes): `row_ref` for each.
///
/// # Safety
/// As `row_ref` for every column; `out` writable at every result's place (4-byte aligned).
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemv_ref(
    nb: usize,
    g: *const u8,
    y: *const u8,
    ys: usize,
    cols: usize,
    out: *mut u8,
    os: usize,
) {
    for c in 0..cols {
        for r in 0..ROWS {
            *(out.add(r * 4 + c * os) as *mut f32) = row_ref(nb, g, r, y.add(c * ys));
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::*;
    use crate::cpu::quants::avx512::{hsum_halves, lane_pair};
    use std::arch::x86_64::*;

    /// `gemv_ref` for C < 4 columns: the group streamed once, per block and column one
    /// `vpdpbusd` per row pair (its two halves are the AVX2 kernel's 8 lanes of each row),
    /// with −128·Σy per lane as the start to undo the codes' offset.
    ///
    /// # Safety
    /// As `gemv_ref`; the CPU must have AVX-512 F, BW, VL and VNNI.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn gemv<const C: usize>(
        nb: usize,
        g: *const u8,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        let off = _mm512_set1_epi8(-128);
        let zero = _mm512_setzero_si512();
        let mut acc = [[_mm512_setzero_ps(); 8]; C];
        for b in 0..nb {
            let gb = g.add(b * GROUP_BLOCK);
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(gb as *const __m256i));
            for c in 0..C {
                let by = &*(y.add(c * ys) as *const BlockQ8_0).add(b);
                let yv =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(by.qs.as_ptr() as *const __m256i));
                let nc = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off, yv));
                // dx·dy per row: the product vec_dot forms.
                let s = _mm512_mul_ps(dx, _mm512_set1_ps(f16_to_f32(by.d)));
                for j in 0..8 {
                    let u = _mm512_loadu_si512(gb.add(CODES_AT + 64 * j) as *const _);
                    let p = _mm512_dpbusd_epi32(nc, u, yv);
                    acc[c][j] = _mm512_fmadd_ps(
                        lane_pair(s, 2 * j, 2 * j + 1),
                        _mm512_cvtepi32_ps(p),
                        acc[c][j],
                    );
                }
            }
        }
        for c in 0..C {
            for j in 0..8 {
                let (a, b) = hsum_halves(acc[c][j]);
                *(out.add(2 * j * 4 + c * os) as *mut f32) = a;
                *(out.add((2 * j + 1) * 4 + c * os) as *mut f32) = b;
            }
        }
    }

    /// `gemv::<C>` for a run-time C in 1..=3.
    ///
    /// # Safety
    /// As `gemv`.
    pub unsafe fn gemv_cols(
        nb: usize,
        g: *const u8,
        y: *const u8,
        ys: usize,
        cols: usize,
        out: *mut u8,
        os: usize,
    ) {
        let f = [gemv::<1>, gemv::<2>, gemv::<3>][cols.clamp(1, 3) - 1];
        f(nb, g, y, ys, out, os)
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::{dot_i8_i8, hsum_f32};
    use std::arch::x86_64::*;

    /// `gemv_ref` for C < 4 columns on AVX2 (no VNNI): per row and column the 8 lanes of
    /// `vec_dot` (its `dot_i8_i8`), the group streamed once.
    ///
    /// # Safety
    /// As `gemv_ref`; the CPU must have AVX2, FMA and F16C.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gemv<const C: usize>(
        nb: usize,
        g: *const u8,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        let flip = _mm256_set1_epi8(-128);
        let mut acc = [[_mm256_setzero_ps(); ROWS]; C];
        for b in 0..nb {
            let gb = g.add(b * GROUP_BLOCK);
            let mut dx = [0f32; ROWS];
            let h = f16x16(gb);
            _mm256_storeu_ps(dx.as_mut_ptr(), h.0);
            _mm256_storeu_ps(dx.as_mut_ptr().add(8), h.1);
            for c in 0..C {
                let by = &*(y.add(c * ys) as *const BlockQ8_0).add(b);
                let yq = _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i);
                let dy = f16_to_f32(by.d);
                for r in 0..ROWS {
                    let u = _mm256_loadu_si256(gb.add(CODES_AT + 32 * r) as *const __m256i);
                    let p = dot_i8_i8(_mm256_xor_si256(u, flip), yq);
                    acc[c][r] = _mm256_fmadd_ps(
                        _mm256_set1_ps(dx[r] * dy),
                        _mm256_cvtepi32_ps(p),
                        acc[c][r],
                    );
                }
            }
        }
        for c in 0..C {
            for r in 0..ROWS {
                *(out.add(r * 4 + c * os) as *mut f32) = hsum_f32(acc[c][r]);
            }
        }
    }

    /// The 16 f16 scales at `p` as two registers of 8 f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16x16(p: *const u8) -> (__m256, __m256) {
        (
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)),
        )
    }

    /// `gemv::<C>` for a run-time C in 1..=3.
    ///
    /// # Safety
    /// As `gemv`.
    pub unsafe fn gemv_cols(
        nb: usize,
        g: *const u8,
        y: *const u8,
        ys: usize,
        cols: usize,
        out: *mut u8,
        os: usize,
    ) {
        let f = [gemv::<1>, gemv::<2>, gemv::<3>][cols.clamp(1, 3) - 1];
        f(nb, g, y, ys, out, os)
    }
}

/// The fastest `gemv_ref` here (AVX-512 VNNI, AVX2, else the reference).
///
/// # Safety
/// As `gemv_ref`, `cols` in 1..=3.
pub unsafe fn gemv_best(
    nb: usize,
    g: *const u8,
    y: *const u8,
    ys: usize,
    cols: usize,
    out: *mut u8,
    os: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if super::panel::available() {
            return avx512::gemv_cols(nb, g, y, ys, cols, out, os);
        }
        if super::use_avx2() {
            return avx2::gemv_cols(nb, g, y, ys, cols, out, os);
        }
    }
    gemv_ref(nb, g, y, ys, cols, out, os)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{
        q8_0,
        testutil::{check_repack_round_trip, data},
    };

    fn rows_of(rows: usize, k: usize, seed: u32) -> Vec<u8> {
        let mut w = vec![0u8; rows * k / 32 * 34];
        unsafe { q8_0::from_f32(&data(rows * k, seed), w.as_mut_ptr()) };
        w
    }

    /// Repacking and back gives the bytes again; whole groups change, the tail rows stay.
    #[test]
    fn repack_round_trips() {
        let shapes = [(16, 32), (37, 64), (5, 96), (48, 1024)];
        check_repack_round_trip(32, 34, ROWS, &shapes, rows_of, repack, unrepack);
    }

    /// The reference and every kernel give the AVX2 `vec_dot`'s bits for each row and column
    /// (one block, odd block counts, 1 to 3 columns), and the reference stays within rounding
    /// of the plain scalar dot (another order) where AVX2 is missing.
    #[test]
    fn kernels_equal_the_avx2_dot() {
        for k in [32, 96, 4096] {
            let nb = k / 32;
            let w = rows_of(ROWS, k, 7);
            let y = rows_of(3, k, 8);
            let mut g = vec![0u8; w.len()];
            unsafe { repack(ROWS, nb, w.as_ptr(), g.as_mut_ptr()) };
            let ys = nb * 34;
            for cols in 1..=3 {
                let mut r = vec![0f32; ROWS * cols];
                unsafe {
                    gemv_ref(
                        nb,
                        g.as_ptr(),
                        y.as_ptr(),
                        ys,
                        cols,
                        r.as_mut_ptr() as _,
                        64,
                    )
                };
                for c in 0..cols {
                    for row in 0..ROWS {
                        let (wr, yc) =
                            unsafe { (w.as_ptr().add(row * ys), y.as_ptr().add(c * ys)) };
                        let plain = unsafe { q8_0::vec_dot_ref(k, wr, yc) };
                        let got = r[c * ROWS + row];
                        assert!((got - plain).abs() <= 1e-4 * plain.abs().max(1.0));
                        #[cfg(target_arch = "x86_64")]
                        if crate::cpu::quants::use_avx2() {
                            let want = unsafe { q8_0::avx2::vec_dot(k, wr, yc) };
                            assert_eq!(got.to_bits(), want.to_bits(), "ref k={k} row {row}");
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                {
                    let mut kinds: Vec<(&str, Gemv)> = vec![];
                    if crate::cpu::quants::use_avx2() {
                        kinds.push(("avx2", avx2::gemv_cols));
                    }
                    if crate::cpu::quants::panel::available() {
                        kinds.push(("avx512", avx512::gemv_cols));
                    }
                    for (name, f) in kinds {
                        let mut v = vec![0f32; ROWS * cols];
                        unsafe {
                            f(
                                nb,
                                g.as_ptr(),
                                y.as_ptr(),
                                ys,
                                cols,
                                v.as_mut_ptr() as _,
                                64,
                            )
                        };
                        let same = r.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{name} k={k} cols={cols}");
                    }
                }
            }
        }
    }
}
