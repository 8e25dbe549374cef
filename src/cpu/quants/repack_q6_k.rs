//! Q6_K weights repacked at load (RFCPU's `RFCPU_REPACK` buffer type, `cpu/repack.rs`) into
//! groups of 16 rows that the generation kernels read as one contiguous stream, two rows per
//! 512-bit register.
//!
//! Layout of a matrix of `rows` rows of `nb` super-blocks (row size `rs` = 210·nb, the same
//! bytes as ggml's): group g (rows 16g .. 16g + 16) fills the 16 rows' bytes at 16·g·rs; its
//! super-block b, at 3360·b inside the group, is the 16 rows' f16 scales d (32 bytes), their 16
//! sub-block scales each (row r at 32 + 16·r), then per half h (128 values) and row pair j
//! (rows 2j, 2j + 1) 192 bytes at 288 + 1536·h + 192·j: the pair's ql[64h .. 64h + 32] (row 2j,
//! then 2j + 1), their ql[64h + 32 .. 64h + 64], their qh[32h .. 32h + 32]. So one 64-byte load
//! gives the same 32 bytes of both rows, and the AVX2 kernel's decoding works on both halves.
//! Rows past the last whole group stay as ggml lays them out, at their usual place.
//!
//! Products over the layout keep the plain path's order, ggml-cpu's AVX2 `vec_dot`: per row 8
//! i32 lanes per super-block (lane l: per 32 values 4 products by their sub-block's scale,
//! less 32 · (sc[2l]·bsums[2l] + sc[2l+1]·bsums[2l+1])), one fma by dy·dx per lane, then the
//! AVX2 horizontal sum. So every result equals `q6_k::avx2::vec_dot` to the bit; `row_ref` is
//! the scalar statement of it. Prompts unpack a group back to ggml's rows and run the plain
//! tiles over it.

use super::f16_to_f32;
use super::panel::ROWS;
use super::q6_k::BlockQ6K;
use super::q8_k::BlockQ8K;

/// Bytes of one super-block of a group.
pub const GROUP_BLOCK: usize = ROWS * size_of::<BlockQ6K>();
const SC_AT: usize = ROWS * 2;
const CODES_AT: usize = SC_AT + ROWS * 16;
/// Bytes of one half of the codes (8 row pairs of 192).
const HALF: usize = 8 * 192;
const _: () = assert!(CODES_AT + 2 * HALF == GROUP_BLOCK);

/// Where row r's 32 bytes of `part` of half h sit in a repacked super-block: 0 the half's
/// ql[0..32], 1 its ql[32..64], 2 its qh.
fn at(h: usize, r: usize, part: usize) -> usize {
    CODES_AT + h * HALF + (r / 2) * 192 + part * 64 + (r % 2) * 32
}

/// Repacks (or, with `back`, un-repacks) the whole groups of `rows` rows, then copies the tail.
unsafe fn convert(rows: usize, nb: usize, src: *const u8, dst: *mut u8, back: bool) {
    let rs = nb * size_of::<BlockQ6K>();
    let groups = rows / ROWS;
    for g in 0..groups {
        let (s, d) = (src.add(g * ROWS * rs), dst.add(g * ROWS * rs));
        for b in 0..nb {
            for r in 0..ROWS {
                let (plain, packed) = if back {
                    (d.add(r * rs + b * 210), s.add(b * GROUP_BLOCK) as *mut u8)
                } else {
                    (s.add(r * rs + b * 210) as *mut u8, d.add(b * GROUP_BLOCK))
                };
                let bx = plain as *mut BlockQ6K;
                // (plain offset, packed offset, bytes) of each piece of row r.
                let mut pieces = [
                    (std::mem::offset_of!(BlockQ6K, d), 2 * r, 2),
                    (std::mem::offset_of!(BlockQ6K, scales), SC_AT + 16 * r, 16),
                    (0, 0, 0),
                    (0, 0, 0),
                    (0, 0, 0),
                    (0, 0, 0),
                    (0, 0, 0),
                    (0, 0, 0),
                ];
                for h in 0..2 {
                    pieces[2 + 3 * h] = (64 * h, at(h, r, 0), 32);
                    pieces[3 + 3 * h] = (64 * h + 32, at(h, r, 1), 32);
                    pieces[4 + 3 * h] = (128 + 32 * h, at(h, r, 2), 32);
                }
                for (po, qo, n) in pieces {
                    let (p, q) = ((bx as *mut u8).add(po), packed.add(qo));
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

/// Repacks the `rows` rows (`nb` super-blocks each, contiguous) at `src` into `dst` (same size).
///
/// # Safety
/// `src` and `dst` must each span `rows · nb · 210` bytes and not overlap.
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

/// Scalar statement of the AVX2 `vec_dot`'s order for row `r` of the repacked group at `g`
/// against the `nb` Q8_K blocks at `y`.
///
/// # Safety
/// `g` must hold a repacked group of `nb` super-blocks, `y` `nb` Q8_K blocks.
pub unsafe fn row_ref(nb: usize, g: *const u8, r: usize, y: *const u8) -> f32 {
    let y = y as *const BlockQ8K;
    let mut acc = [0f32; 8];
    for b in 0..nb {
        let gb = g.add(b * GROUP_BLOCK);
        let by = &*y.add(b);
        let dx = f16_to_f32((gb as *const u16).add(r).read_unaligned());
        let sc = |i: usize| *(gb.add(SC_AT + 16 * r + i) as *const i8) as i32;
        let mut sumi = [0i32; 8];
        for h in 0..2 {
            for k in 0..4 {
                for (l, s) in sumi.iter_mut().enumerate() {
                    let mut p = 0;
                    for t in 4 * l..4 * l + 4 {
                        let lo = *gb.add(at(h, r, k & 1) + t);
                        let lo = if k < 2 { lo & 15 } else { lo >> 4 };
                        let hi = (*gb.add(at(h, r, 2) + t) >> (2 * k)) & 3;
                        let q = (lo | hi << 4) as i32;
                        p += q * by.qs[128 * h + 32 * k + t] as i32;
                    }
                    *s += sc(8 * h + 2 * k + l / 4) * p;
                }
            }
        }
        let d = by.d * dx;
        for (l, a) in acc.iter_mut().enumerate() {
            let m = sc(2 * l) * by.bsums[2 * l] as i32 + sc(2 * l + 1) * by.bsums[2 * l + 1] as i32;
            *a = d.mul_add((sumi[l] - 32 * m) as f32, *a);
        }
    }
    let s: [f32; 4] = std::array::from_fn(|i| acc[i] + acc[i + 4]);
    let (s0, s1) = (s[0] + s[2], s[1] + s[3]);
    s0 + s1
}

/// The products of one group with `cols` Q8_K activation columns (column c's blocks at
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

    /// i16 lane t of the pair's 32 scales (row 2j's 16, then 2j + 1's) that chunk k of half h
    /// multiplies: 2k of the half's 8 over each row's low 128 bits, 2k + 1 over the high.
    static SCALE_IDX: [[u16; 32]; 8] = {
        let mut t = [[0u16; 32]; 8];
        let mut hk = 0;
        while hk < 8 {
            let (h, k) = (hk / 4, hk % 4);
            let mut i = 0;
            while i < 32 {
                t[hk][i] = (16 * (i / 16) + 8 * h + 2 * k + (i % 16) / 8) as u16;
                i += 1;
            }
            hk += 1;
        }
        t
    };

    /// `gemv_ref` for C < 4 columns: the group streamed once, two rows per register through
    /// the AVX2 kernel's decoding and `vpmaddubsw` / `vpmaddwd` (its i32 lanes in each half).
    ///
    /// # Safety
    /// As `gemv_ref`; the CPU must have AVX-512 F, BW and VL.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn gemv<const C: usize>(
        nb: usize,
        g: *const u8,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        let m4 = _mm512_set1_epi8(0x0f);
        let m30 = _mm512_set1_epi8(0x30);
        let idx: [__m512i; 8] =
            std::array::from_fn(|i| _mm512_loadu_si512(SCALE_IDX[i].as_ptr() as *const _));
        let mut acc = [[_mm512_setzero_ps(); 8]; C];
        for b in 0..nb {
            let gb = g.add(b * GROUP_BLOCK);
            let by = |c: usize| &*(y.add(c * ys) as *const BlockQ8K).add(b);
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(gb as *const __m256i));
            let mut dyx = [_mm512_setzero_ps(); C];
            let mut bs = [_mm512_setzero_si512(); C];
            for c in 0..C {
                // dy·dx per row: the product vec_dot forms.
                dyx[c] = _mm512_mul_ps(dx, _mm512_set1_ps(by(c).d));
                bs[c] = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    by(c).bsums.as_ptr() as *const __m256i
                ));
            }
            for j in 0..8 {
                // Without this the loads wait on L2 and memory (one thread, 8B-shaped: 3.6
                // against 11.9 GB/s): fetch the next super-block's 3360 bytes meanwhile.
                let next = gb.add(GROUP_BLOCK + 448 * j);
                for o in (0..448).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(next.add(o) as *const i8);
                }
                let sc = _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                    gb.add(SC_AT + 32 * j) as *const __m256i
                ));
                let mut sumi = [_mm512_setzero_si512(); C];
                for h in 0..2 {
                    let base = gb.add(CODES_AT + h * HALF + 192 * j);
                    let ql0 = _mm512_loadu_si512(base as *const _);
                    let ql1 = _mm512_loadu_si512(base.add(64) as *const _);
                    let qh = _mm512_loadu_si512(base.add(128) as *const _);
                    // As vec_dot: 16-bit shifts leak bits across bytes; the 0x30 mask drops them.
                    let q = [
                        _mm512_or_si512(
                            _mm512_and_si512(ql0, m4),
                            _mm512_and_si512(_mm512_slli_epi16::<4>(qh), m30),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(ql1, m4),
                            _mm512_and_si512(_mm512_slli_epi16::<2>(qh), m30),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql0), m4),
                            _mm512_and_si512(qh, m30),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql1), m4),
                            _mm512_and_si512(_mm512_srli_epi16::<2>(qh), m30),
                        ),
                    ];
                    for k in 0..4 {
                        let s = _mm512_permutexvar_epi16(idx[4 * h + k], sc);
                        for c in 0..C {
                            let yk = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                by(c).qs.as_ptr().add(128 * h + 32 * k) as *const __m256i,
                            ));
                            sumi[c] = _mm512_add_epi32(
                                sumi[c],
                                _mm512_madd_epi16(_mm512_maddubs_epi16(q[k], yk), s),
                            );
                        }
                    }
                }
                for c in 0..C {
                    // The -32 of the codes, in integers before the conversion, as vec_dot.
                    let m = _mm512_slli_epi32::<5>(_mm512_madd_epi16(sc, bs[c]));
                    let si = _mm512_sub_epi32(sumi[c], m);
                    acc[c][j] = _mm512_fmadd_ps(
                        lane_pair(dyx[c], 2 * j, 2 * j + 1),
                        _mm512_cvtepi32_ps(si),
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

/// The fastest `gemv_ref` here (AVX-512, else the reference).
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
    if super::use_avx512() {
        return avx512::gemv_cols(nb, g, y, ys, cols, out, os);
    }
    gemv_ref(nb, g, y, ys, cols, out, os)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{
        q6_k, q8_k,
        testutil::{check_repack_round_trip, data},
    };

    fn rows_of(rows: usize, k: usize, seed: u32) -> Vec<u8> {
        let mut w = vec![0u8; rows * k / 256 * 210];
        unsafe { q6_k::from_f32(&data(rows * k, seed), w.as_mut_ptr()) };
        w
    }

    /// Repacking and back gives the bytes again; whole groups change, the tail rows stay.
    #[test]
    fn repack_round_trips() {
        let shapes = [(16, 256), (37, 512), (5, 256), (48, 1024)];
        check_repack_round_trip(256, 210, ROWS, &shapes, rows_of, repack, unrepack);
    }

    /// The reference and the AVX-512 kernel give the AVX2 `vec_dot`'s bits for each row and
    /// column (one super-block, odd counts, 1 to 3 columns); the reference stays within
    /// rounding of the plain scalar dot (another order).
    #[test]
    fn kernels_equal_the_avx2_dot() {
        for k in [256, 768, 4096] {
            let nb = k / 256;
            let w = rows_of(ROWS, k, 7);
            let mut y = vec![0u32; 3 * nb * 292 / 4];
            let yp = y.as_mut_ptr() as *mut u8;
            unsafe { q8_k::from_f32(&data(3 * k, 8), yp) };
            let mut g = vec![0u8; w.len()];
            unsafe { repack(ROWS, nb, w.as_ptr(), g.as_mut_ptr()) };
            let ys = nb * 292;
            for cols in 1..=3 {
                let mut r = vec![0f32; ROWS * cols];
                unsafe { gemv_ref(nb, g.as_ptr(), yp, ys, cols, r.as_mut_ptr() as _, 64) };
                for c in 0..cols {
                    for row in 0..ROWS {
                        let (wr, yc) = unsafe { (w.as_ptr().add(row * nb * 210), yp.add(c * ys)) };
                        let plain = unsafe { q6_k::vec_dot_ref(k, wr, yc) };
                        let got = r[c * ROWS + row];
                        assert!((got - plain).abs() <= 1e-4 * plain.abs().max(1.0));
                        #[cfg(target_arch = "x86_64")]
                        if crate::cpu::quants::use_avx2() {
                            let want = unsafe { q6_k::avx2::vec_dot(k, wr, yc) };
                            assert_eq!(got.to_bits(), want.to_bits(), "ref k={k} row {row}");
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                if crate::cpu::quants::use_avx512() {
                    let mut v = vec![0f32; ROWS * cols];
                    unsafe {
                        avx512::gemv_cols(nb, g.as_ptr(), yp, ys, cols, v.as_mut_ptr() as _, 64)
                    };
                    let same = r.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "avx512 k={k} cols={cols}");
                }
            }
        }
    }
}
