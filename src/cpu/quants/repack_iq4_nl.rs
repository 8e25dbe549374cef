//! IQ4_NL weights repacked at load (RFCPU's `RFCPU_REPACK` buffer type, `cpu/repack.rs`) into
//! groups of 16 rows that the generation kernels read as one contiguous stream.
//!
//! Layout of a matrix of `rows` rows of `nb` blocks (row size `rs` = 18·nb, the same bytes as
//! ggml's): group g (rows 16g .. 16g + 16) fills the 16 rows' bytes at 16·g·rs; its block b, at
//! 288·b inside the group, is the 16 rows' f16 scales (32 bytes), then the 16 index bytes of
//! each row in turn (row r at 32 + 16·r), so one 64-byte load holds a block of 4 rows. Rows past
//! the last whole group stay as ggml lays them out, at their usual place.
//!
//! Products over the layout keep the plain path's order, ggml-cpu's AVX2 `vec_dot` for IQ4_NL:
//! per row 8 lanes of 4 products, even and odd blocks in two accumulators (one fma per block and
//! lane) added before the AVX2 horizontal sum, an odd last block's integer sum added after it
//! by one scalar fma. So every result equals `iq4_nl::avx2::vec_dot` (and the register tiles)
//! to the bit; `row_ref` is the scalar statement of it. Prompts unpack a group back to ggml's
//! rows and run the plain tiles over it.

use super::f16_to_f32;
use super::iq4_nl::{BlockIq4Nl, TABLE};
use super::panel::ROWS;
use super::q8_0::BlockQ8_0;

/// Bytes of one block of a group: 16 scales and 16 × 16 index bytes.
pub const GROUP_BLOCK: usize = ROWS * size_of::<BlockIq4Nl>();
const CODES_AT: usize = ROWS * 2;

/// Repacks (or, with `back`, un-repacks) the whole groups of `rows` rows, then copies the tail.
unsafe fn convert(rows: usize, nb: usize, src: *const u8, dst: *mut u8, back: bool) {
    let rs = nb * size_of::<BlockIq4Nl>();
    let groups = rows / ROWS;
    for g in 0..groups {
        let (s, d) = (src.add(g * ROWS * rs), dst.add(g * ROWS * rs));
        for b in 0..nb {
            for r in 0..ROWS {
                let (plain, packed) = if back {
                    (d.add(r * rs + b * 18), s.add(b * GROUP_BLOCK) as *mut u8)
                } else {
                    (s.add(r * rs + b * 18) as *mut u8, d.add(b * GROUP_BLOCK))
                };
                for (po, qo, n) in [(0, 2 * r, 2), (2, CODES_AT + 16 * r, 16)] {
                    let (p, q) = (plain.add(po), packed.add(qo));
                    if back {
                        std::ptr::copy_nonoverlapping(q, p, n);
                    } else {
                        std::ptr::copy_nonoverlapping(p, q, n);
                    }
                }
            }
        }
    }
    let done = groups * ROWS * rs;
    std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), (rows - groups * ROWS) * rs);
}

/// Repacks the `rows` rows (`nb` blocks each, contiguous) at `src` into `dst` (same size).
///
/// # Safety
/// `src` and `dst` must each span `rows · nb · 18` bytes and not overlap.
pub unsafe fn repack(rows: usize, nb: usize, src: *const u8, dst: *mut u8) {
    convert(rows, nb, src, dst, false)
}

/// The inverse of `repack` (with `rows` = 16, one group back to plain rows).
///
/// # Safety
/// As `repack`.
pub unsafe fn unrepack(rows: usize, nb: usize, src: *const u8, dst: *mut u8) {
    convert(rows, nb, src, dst, true)
}

/// Row r's level of element e in the repacked block at `gb` (e < 16: low nibble of byte e,
/// else high nibble of byte e − 16).
unsafe fn level(gb: *const u8, r: usize, e: usize) -> i32 {
    let v = *gb.add(CODES_AT + 16 * r + e % 16);
    TABLE[(if e < 16 { v & 15 } else { v >> 4 }) as usize] as i32
}

/// Scalar statement of the AVX2 `vec_dot`'s order for row `r` of the repacked group at `g`
/// against the `nb` Q8_0 blocks at `y`.
///
/// # Safety
/// `g` must hold a repacked group of `nb` blocks, `y` `nb` Q8_0 blocks.
pub unsafe fn row_ref(nb: usize, g: *const u8, r: usize, y: *const u8) -> f32 {
    let y = y as *const BlockQ8_0;
    let mut acc = [[0f32; 8]; 2];
    let scale = |b: usize| {
        let dx = f16_to_f32(
            (g.add(b * GROUP_BLOCK) as *const u16)
                .add(r)
                .read_unaligned(),
        );
        f16_to_f32((*y.add(b)).d) * dx
    };
    for b in 0..nb & !1 {
        let (gb, by) = (g.add(b * GROUP_BLOCK), &*y.add(b));
        for (l, a) in acc[b & 1].iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4)
                .map(|e| level(gb, r, e) * by.qs[e] as i32)
                .sum();
            *a = scale(b).mul_add(p as f32, *a);
        }
    }
    let v: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let s: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
    let sum = (s[0] + s[2]) + (s[1] + s[3]);
    if nb & 1 == 0 {
        return sum;
    }
    let (gb, by) = (g.add((nb - 1) * GROUP_BLOCK), &*y.add(nb - 1));
    let sumi: i32 = (0..32).map(|e| level(gb, r, e) * by.qs[e] as i32).sum();
    (sumi as f32).mul_add(scale(nb - 1), sum)
}

/// The products of one group with `cols` Q8_0 activation columns (column c's blocks at
/// `y + c * ys`), row r of column c to `out + r * 4 + c * os` (bytes): `row_ref` for each.
///
/// # Safety
/// As `row_ref` for every column; `out` writable at every result's place (4-byte aligned).
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

    /// The levels plus 128, as unsigned bytes (what `vpdpbusd` takes).
    static TABLE_U8: [u8; 16] = {
        let mut t = [0u8; 16];
        let mut k = 0;
        while k < 16 {
            t[k] = (TABLE[k] as i16 + 128) as u8;
            k += 1;
        }
        t
    };

    /// The unsigned codes (level + 128) of rows 2j and 2j + 1 of the repacked block at `gb`:
    /// each 256-bit half one row's 32 elements in order.
    #[inline(always)]
    unsafe fn pair_codes(gb: *const u8, j: usize, table: __m512i) -> __m512i {
        let m4 = _mm512_set1_epi8(0x0f);
        // Rows 4(j/2) .. 4(j/2) + 4; this pair is 128-bit lanes 0, 1 or 2, 3 of each.
        let z = _mm512_loadu_si512(gb.add(CODES_AT + 64 * (j / 2)) as *const _);
        let lo = _mm512_and_si512(z, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4);
        let (a, b) = (4 * (j % 2) as i64, 4 * (j % 2) as i64 + 2);
        // Qwords: row A's low nibbles, its high ones, row B's low, its high.
        let idx = _mm512_set_epi64(b + 9, b + 8, b + 1, b, a + 9, a + 8, a + 1, a);
        _mm512_shuffle_epi8(table, _mm512_permutex2var_epi64(lo, idx, hi))
    }

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
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(TABLE_U8.as_ptr() as *const __m128i));
        let by = |c: usize, b: usize| &*(y.add(c * ys) as *const BlockQ8_0).add(b);
        let mut acc = [[[_mm512_setzero_ps(); 8]; C]; 2];
        for b in 0..nb & !1 {
            let gb = g.add(b * GROUP_BLOCK);
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(gb as *const __m256i));
            for c in 0..C {
                let yb = by(c, b);
                let yv =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(yb.qs.as_ptr() as *const __m256i));
                let nc = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off, yv));
                // dx·dy per row: the product vec_dot forms.
                let s = _mm512_mul_ps(dx, _mm512_set1_ps(f16_to_f32(yb.d)));
                for j in 0..8 {
                    let p = _mm512_dpbusd_epi32(nc, pair_codes(gb, j, table), yv);
                    acc[b & 1][c][j] = _mm512_fmadd_ps(
                        lane_pair(s, 2 * j, 2 * j + 1),
                        _mm512_cvtepi32_ps(p),
                        acc[b & 1][c][j],
                    );
                }
            }
        }
        // An odd last block: its integer sums, added after the horizontal sum.
        let mut tail = [[0i32; ROWS]; C];
        if nb & 1 == 1 {
            let gb = g.add((nb - 1) * GROUP_BLOCK);
            for c in 0..C {
                let yv = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    by(c, nb - 1).qs.as_ptr() as *const __m256i
                ));
                let nc = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off, yv));
                for j in 0..8 {
                    let p = _mm512_dpbusd_epi32(nc, pair_codes(gb, j, table), yv);
                    tail[c][2 * j] = _mm512_mask_reduce_add_epi32(0x00ff, p);
                    tail[c][2 * j + 1] = _mm512_mask_reduce_add_epi32(0xff00, p);
                }
            }
        }
        for c in 0..C {
            for j in 0..8 {
                let (a, b) = hsum_halves(_mm512_add_ps(acc[0][c][j], acc[1][c][j]));
                for (r, mut v) in [(2 * j, a), (2 * j + 1, b)] {
                    if nb & 1 == 1 {
                        let gb = g.add((nb - 1) * GROUP_BLOCK);
                        let dx = f16_to_f32((gb as *const u16).add(r).read_unaligned());
                        v = (tail[c][r] as f32).mul_add(f16_to_f32(by(c, nb - 1).d) * dx, v);
                    }
                    *(out.add(r * 4 + c * os) as *mut f32) = v;
                }
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

/// The fastest `gemv_ref` here (AVX-512 VNNI, else the reference).
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
    if super::panel::available() {
        return avx512::gemv_cols(nb, g, y, ys, cols, out, os);
    }
    gemv_ref(nb, g, y, ys, cols, out, os)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{
        iq4_nl, q8_0,
        testutil::{check_repack_round_trip, data},
    };

    fn rows_of(rows: usize, k: usize, seed: u32) -> Vec<u8> {
        let mut w = vec![0u8; rows * k / 32 * 18];
        unsafe { iq4_nl::from_f32(&data(rows * k, seed), w.as_mut_ptr()) };
        w
    }

    /// Repacking and back gives the bytes again; whole groups change, the tail rows stay.
    #[test]
    fn repack_round_trips() {
        let shapes = [(16, 32), (37, 64), (5, 96), (48, 1024)];
        check_repack_round_trip(32, 18, ROWS, &shapes, rows_of, repack, unrepack);
    }

    /// The reference and the AVX-512 kernel give the AVX2 `vec_dot`'s bits for each row and
    /// column (one block, odd and even block counts, 1 to 3 columns); the reference stays
    /// within rounding of the plain scalar dot (another order).
    #[test]
    fn kernels_equal_the_avx2_dot() {
        for k in [32, 64, 96, 4096] {
            let nb = k / 32;
            let w = rows_of(ROWS, k, 7);
            let mut y = vec![0u8; 3 * nb * 34];
            unsafe { q8_0::from_f32(&data(3 * k, 8), y.as_mut_ptr()) };
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
                            unsafe { (w.as_ptr().add(row * nb * 18), y.as_ptr().add(c * ys)) };
                        let plain = unsafe { iq4_nl::vec_dot_ref(k, wr, yc) };
                        let got = r[c * ROWS + row];
                        assert!((got - plain).abs() <= 1e-4 * plain.abs().max(1.0));
                        #[cfg(target_arch = "x86_64")]
                        if crate::cpu::quants::use_avx2() {
                            let want = unsafe { iq4_nl::avx2::vec_dot(k, wr, yc) };
                            assert_eq!(got.to_bits(), want.to_bits(), "ref k={k} row {row}");
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                if crate::cpu::quants::panel::available() {
                    let mut v = vec![0f32; ROWS * cols];
                    unsafe {
                        avx512::gemv_cols(
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
                    assert!(same, "avx512 k={k} cols={cols}");
                }
            }
        }
    }
}
