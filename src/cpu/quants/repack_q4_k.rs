//! Q4_K weights repacked at load (`cpu/repack.rs`) into groups of 16 rows, as Q4_0's are
//! (`repack_q4_0.rs`), for the AVX-512 VNNI products.
//!
//! A group's super-block b (`GROUP_BLOCK` bytes at b·`GROUP_BLOCK`) holds the 16 rows' d and
//! dmin (f16), the 8 sub-block scales as bytes ([s][r]), the mins as byte pairs ([p][r]:
//! sub-blocks 2p, 2p + 1, widened to the i16 pairs the kernel multiplies), then the codes: for
//! each 32-byte chunk j of the rows' `qs` (sub-blocks 2j and 2j + 1 in its low and high nibbles),
//! dword q of all 16 rows at `CODES_AT` + 64·(8j + q) + 4·r. The scales are kept unpacked, so a
//! group is 64 bytes a super-block larger than the 16 rows (2.8%): `repacked_bytes`. Rows past
//! the last whole group follow the groups in ggml's layout.
//!
//! Products sum as the Q4_K weight panels do (`panel_q4_k.rs`): a one-column product gives the
//! bits of the panel kernel over `panel_q4_k::pack_ref` of the plain rows.

use super::panel::ROWS;
#[cfg(target_arch = "x86_64")]
use super::panel_q4_k::ActBlockK;
use super::panel_q4_k::{self as pk};
use super::q4_k::{pack_scales, unpack_scales, BlockQ4K};
use super::QK_K;

const DMIN_AT: usize = 2 * ROWS;
const SC_AT: usize = 4 * ROWS;
const MN_AT: usize = SC_AT + 8 * ROWS;
const CODES_AT: usize = MN_AT + 8 * ROWS;
/// Bytes of one super-block of a group.
pub const GROUP_BLOCK: usize = CODES_AT + QK_K / 2 * ROWS;
const QB: usize = size_of::<BlockQ4K>();

/// Bytes of one repacked matrix of `rows` rows of `nb` super-blocks.
pub fn repacked_bytes(rows: usize, nb: usize) -> usize {
    rows / ROWS * nb * GROUP_BLOCK + rows % ROWS * nb * QB
}

/// Repacks the `rows` rows (`nb` super-blocks each, contiguous) at `src` into
/// `repacked_bytes(rows, nb)` bytes at `dst`.
///
/// # Safety
/// `src` must span `rows · nb · 144` bytes, `dst` `repacked_bytes(rows, nb)`; no overlap.
pub unsafe fn repack(rows: usize, nb: usize, src: *const u8, dst: *mut u8) {
    let rs = nb * QB;
    let groups = rows / ROWS;
    for g in 0..groups {
        let (s, d) = (src.add(g * ROWS * rs), dst.add(g * nb * GROUP_BLOCK));
        for b in 0..nb {
            let db = d.add(b * GROUP_BLOCK);
            for r in 0..ROWS {
                let bx = &*(s.add(r * rs) as *const BlockQ4K).add(b);
                (db as *mut u16).add(r).write_unaligned(bx.d);
                (db.add(DMIN_AT) as *mut u16)
                    .add(r)
                    .write_unaligned(bx.dmin);
                let (sc, mn) = unpack_scales(&bx.scales);
                for i in 0..8 {
                    *db.add(SC_AT + i * ROWS + r) = sc[i];
                    *db.add(MN_AT + (i / 2) * 2 * ROWS + 2 * r + i % 2) = mn[i];
                }
                for dw in 0..32 {
                    let at = db.add(CODES_AT + 64 * dw + 4 * r);
                    std::ptr::copy_nonoverlapping(bx.qs.as_ptr().add(4 * dw), at, 4);
                }
            }
        }
    }
    let tail = rows % ROWS * rs;
    std::ptr::copy_nonoverlapping(
        src.add(groups * ROWS * rs),
        dst.add(groups * nb * GROUP_BLOCK),
        tail,
    );
}

/// The inverse of `repack`: ggml's layout of the `rows` rows repacked at `src`, to `dst`.
///
/// # Safety
/// As `repack`, with the roles of the two spans swapped.
pub unsafe fn unrepack(rows: usize, nb: usize, src: *const u8, dst: *mut u8) {
    let rs = nb * QB;
    let groups = rows / ROWS;
    for g in 0..groups {
        let (s, d) = (src.add(g * nb * GROUP_BLOCK), dst.add(g * ROWS * rs));
        for b in 0..nb {
            let sb = s.add(b * GROUP_BLOCK);
            for r in 0..ROWS {
                let bx = &mut *(d.add(r * rs) as *mut BlockQ4K).add(b);
                bx.d = (sb as *const u16).add(r).read_unaligned();
                bx.dmin = (sb.add(DMIN_AT) as *const u16).add(r).read_unaligned();
                let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
                for i in 0..8 {
                    sc[i] = *sb.add(SC_AT + i * ROWS + r);
                    mn[i] = *sb.add(MN_AT + (i / 2) * 2 * ROWS + 2 * r + i % 2);
                }
                bx.scales = pack_scales(&sc, &mn);
                for dw in 0..32 {
                    let at = sb.add(CODES_AT + 64 * dw + 4 * r);
                    std::ptr::copy_nonoverlapping(at, bx.qs.as_mut_ptr().add(4 * dw), 4);
                }
            }
        }
    }
    let tail = rows % ROWS * rs;
    std::ptr::copy_nonoverlapping(
        src.add(groups * nb * GROUP_BLOCK),
        dst.add(groups * ROWS * rs),
        tail,
    );
}

/// One repacked group of `nb` super-blocks at `g` as a Q4_K weight panel
/// (`panel_q4_k::pack_ref`'s output for its 16 rows) at `dst`.
///
/// # Safety
/// `g` must hold a repacked group, `dst` `panel_q4_k::panel_bytes(nb)` writable bytes
/// (4-byte aligned).
pub unsafe fn unpack_ref(nb: usize, g: *const u8, dst: *mut u8) {
    for b in 0..nb {
        let (gb, pb) = (g.add(b * GROUP_BLOCK), dst.add(b * pk::BLOCK_BYTES));
        for r in 0..ROWS {
            let h =
                |at: usize| super::f16_to_f32((gb.add(at) as *const u16).add(r).read_unaligned());
            *(pb as *mut f32).add(r) = h(0);
            *(pb.add(pk::DMIN_AT) as *mut f32).add(r) = h(DMIN_AT);
            for s in 0..8 {
                *(pb.add(pk::SC_AT) as *mut i32).add(s * ROWS + r) =
                    *gb.add(SC_AT + s * ROWS + r) as i32;
            }
            for p in 0..4 {
                let m = |i: usize| *gb.add(MN_AT + p * 2 * ROWS + 2 * r + i) as u32;
                *(pb.add(pk::MN_AT) as *mut u32).add(p * ROWS + r) = m(0) | m(1) << 16;
            }
            for j in 0..4 {
                for q in 0..8 {
                    for t in 0..4 {
                        let v = *gb.add(CODES_AT + 64 * (8 * j + q) + 4 * r + t);
                        *pb.add(pk::codes_at(2 * j, q) + r * 4 + t) = v & 0x0f;
                        *pb.add(pk::codes_at(2 * j + 1, q) + r * 4 + t) = v >> 4;
                    }
                }
            }
        }
    }
}

/// Scalar statement of the products over one group: `cols` activation columns (column c's
/// super-blocks at `act + c * acs` bytes), row r of column c to `out + r * 4 + c * os` (bytes).
///
/// # Safety
/// As `unpack_ref` and `panel_q4_k::kernel_ref`.
pub unsafe fn kernel_ref(
    nb: usize,
    g: *const u8,
    act: *const u8,
    acs: usize,
    cols: usize,
    out: *mut u8,
    os: usize,
) {
    let mut p = vec![0u32; pk::panel_bytes(nb) / 4];
    unpack_ref(nb, g, p.as_mut_ptr() as *mut u8);
    pk::kernel_ref(nb, p.as_ptr() as *const u8, act, acs, cols, out, os, ROWS)
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// `unpack_ref` with vector loads (prompts: the panel kernel then runs every column).
    ///
    /// # Safety
    /// As `unpack_ref`; the CPU must have AVX-512 F, BW and VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn unpack(nb: usize, g: *const u8, dst: *mut u8) {
        let lo = _mm512_set1_epi8(0x0f);
        for b in 0..nb {
            let (gb, pb) = (g.add(b * GROUP_BLOCK), dst.add(b * pk::BLOCK_BYTES));
            let h = |at: usize| _mm512_cvtph_ps(_mm256_loadu_si256(gb.add(at) as *const __m256i));
            _mm512_storeu_ps(pb as *mut f32, h(0));
            _mm512_storeu_ps(pb.add(pk::DMIN_AT) as *mut f32, h(DMIN_AT));
            for s in 0..8 {
                let v = _mm_loadu_si128(gb.add(SC_AT + s * ROWS) as *const __m128i);
                let at = pb.add(pk::SC_AT + s * ROWS * 4);
                _mm512_storeu_si512(at as *mut _, _mm512_cvtepu8_epi32(v));
            }
            for p in 0..4 {
                let v = _mm256_loadu_si256(gb.add(MN_AT + p * 2 * ROWS) as *const __m256i);
                let at = pb.add(pk::MN_AT + p * ROWS * 4);
                _mm512_storeu_si512(at as *mut _, _mm512_cvtepu8_epi16(v));
            }
            for j in 0..4 {
                for q in 0..8 {
                    let v = _mm512_loadu_si512(gb.add(CODES_AT + 64 * (8 * j + q)) as *const _);
                    let put = |s: usize, v: __m512i| {
                        _mm512_storeu_si512(pb.add(pk::codes_at(s, q)) as *mut _, v)
                    };
                    put(2 * j, _mm512_and_si512(v, lo));
                    put(2 * j + 1, _mm512_and_si512(_mm512_srli_epi16::<4>(v), lo));
                }
            }
        }
    }

    /// `kernel_ref` for C < 4 columns (generation), the group read in place once: the float
    /// steps of `panel_q4_k::avx512::kernel` in its order.
    ///
    /// # Safety
    /// As `kernel_ref`; the CPU must have AVX-512 F, BW, VL and VNNI.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn gemv<const C: usize>(
        nb: usize,
        g: *const u8,
        act: *const u8,
        acs: usize,
        out: *mut u8,
        os: usize,
    ) {
        let zero = _mm512_setzero_si512();
        let lo = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); C];
        let mut accm = [_mm512_setzero_ps(); C];
        let ahead = crate::cpu::quants::stream::distance();
        for b in 0..nb {
            let gb = g.add(b * GROUP_BLOCK);
            if ahead > 0 {
                crate::cpu::quants::stream::prefetch(gb.wrapping_add(ahead), GROUP_BLOCK);
            }
            let a = |c: usize| &*(act.add(c * acs) as *const ActBlockK).add(b);
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(gb as *const __m256i));
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(gb.add(DMIN_AT) as *const __m256i));
            for p in 0..4 {
                let mut wl = [zero; 8];
                let mut wh = [zero; 8];
                for q in 0..8 {
                    let v = _mm512_loadu_si512(gb.add(CODES_AT + 64 * (8 * p + q)) as *const _);
                    wl[q] = _mm512_and_si512(v, lo);
                    wh[q] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), lo);
                }
                let sc = |s: usize| {
                    let v = _mm_loadu_si128(gb.add(SC_AT + s * ROWS) as *const __m128i);
                    _mm512_cvtepu8_epi32(v)
                };
                let (sc0, sc1) = (sc(2 * p), sc(2 * p + 1));
                let mnv = _mm256_loadu_si256(gb.add(MN_AT + p * 2 * ROWS) as *const __m256i);
                let mn = _mm512_cvtepu8_epi16(mnv);
                for c in 0..C {
                    let q0 = a(c).qs.as_ptr().add(64 * p) as *const i32;
                    let (mut d0, mut d1) = (zero, zero);
                    for q in 0..8 {
                        let y0 = _mm512_set1_epi32(q0.add(q).read_unaligned());
                        let y1 = _mm512_set1_epi32(q0.add(8 + q).read_unaligned());
                        d0 = _mm512_dpbusd_epi32(d0, wl[q], y0);
                        d1 = _mm512_dpbusd_epi32(d1, wh[q], y1);
                    }
                    let t =
                        _mm512_add_epi32(_mm512_mullo_epi32(d0, sc0), _mm512_mullo_epi32(d1, sc1));
                    let dy = _mm512_set1_ps(a(c).d);
                    acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dx, dy), acc[c]);
                    let bs = _mm512_set1_epi32(a(c).bs[p] as i32);
                    let im = _mm512_madd_epi16(mn, bs);
                    accm[c] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dmin, dy), accm[c]);
                }
            }
        }
        for c in 0..C {
            _mm512_storeu_ps(out.add(c * os) as *mut f32, _mm512_sub_ps(acc[c], accm[c]));
        }
    }

    /// `gemv::<C>` for a run-time C in 1..=3.
    ///
    /// # Safety
    /// As `gemv`.
    pub unsafe fn gemv_cols(
        nb: usize,
        g: *const u8,
        act: *const u8,
        acs: usize,
        cols: usize,
        out: *mut u8,
        os: usize,
    ) {
        let f = [gemv::<1>, gemv::<2>, gemv::<3>][cols.clamp(1, 3) - 1];
        f(nb, g, act, acs, out, os)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::cpu::quants::{panel, q8_k};
    use crate::cpu::quants::{q4_k, testutil::data};

    fn weights(rows: usize, k: usize, seed: u32) -> Vec<u8> {
        let mut w = vec![0u8; rows * k / QK_K * QB];
        unsafe { q4_k::from_f32(&data(rows * k, seed), w.as_mut_ptr()) };
        w
    }

    /// Column c's super-blocks at c · nb · 276 bytes.
    #[cfg(target_arch = "x86_64")]
    fn acts(n: usize, k: usize, seed: u32) -> Vec<u32> {
        let nb = k / QK_K;
        let mut y = vec![0u32; n * nb * 292 / 4];
        unsafe { q8_k::from_f32(&data(n * k, seed), y.as_mut_ptr() as *mut u8) };
        let mut a = vec![0u32; n * nb * 276 / 4];
        for c in 0..n {
            unsafe {
                pk::act_row(
                    nb,
                    (y.as_ptr() as *const u8).add(c * nb * 292),
                    (a.as_mut_ptr() as *mut u8).add(c * nb * 276),
                )
            };
        }
        a
    }

    #[test]
    fn repack_round_trips() {
        for (rows, k) in [(16, 256), (37, 512), (5, 256), (33, 1024)] {
            let nb = k / QK_K;
            let w = weights(rows, k, 13);
            let mut p = vec![0u8; repacked_bytes(rows, nb)];
            let mut back = vec![0u8; w.len()];
            unsafe {
                repack(rows, nb, w.as_ptr(), p.as_mut_ptr());
                unrepack(rows, nb, p.as_ptr(), back.as_mut_ptr());
            }
            assert!(back == w, "rows={rows} k={k}");
        }
    }

    /// A repacked group unpacks to `panel_q4_k::pack_ref`'s panel of the plain rows, and the
    /// AVX-512 unpack and one-to-three-column kernels give the panel kernel's bytes and bits.
    #[test]
    fn unpack_and_kernels_equal_the_panel_path() {
        for k in [256, 768, 4096] {
            let nb = k / QK_K;
            let w = weights(ROWS, k, 17);
            let mut g = vec![0u8; repacked_bytes(ROWS, nb)];
            unsafe { repack(ROWS, nb, w.as_ptr(), g.as_mut_ptr()) };
            let mut want = vec![0u32; pk::panel_bytes(nb) / 4];
            let mut got = vec![1u32; pk::panel_bytes(nb) / 4];
            unsafe {
                pk::pack_ref(nb, w.as_ptr(), nb * QB, ROWS, want.as_mut_ptr() as *mut u8);
                unpack_ref(nb, g.as_ptr(), got.as_mut_ptr() as *mut u8);
            }
            assert!(want == got, "unpack_ref k={k}");
            #[cfg(target_arch = "x86_64")]
            if panel::available() {
                let mut fast = vec![2u32; pk::panel_bytes(nb) / 4];
                unsafe { avx512::unpack(nb, g.as_ptr(), fast.as_mut_ptr() as *mut u8) };
                assert!(want == fast, "avx512::unpack k={k}");
                let a = acts(3, k, 18);
                let ap = a.as_ptr() as *const u8;
                for cols in 1..=3 {
                    let mut r = vec![0f32; ROWS * cols];
                    let mut v = vec![0f32; ROWS * cols];
                    let mut pv = vec![0f32; ROWS * cols];
                    let acs = nb * 276;
                    unsafe {
                        kernel_ref(nb, g.as_ptr(), ap, acs, cols, r.as_mut_ptr() as _, 64);
                        avx512::gemv_cols(nb, g.as_ptr(), ap, acs, cols, v.as_mut_ptr() as _, 64);
                        let pp = want.as_ptr() as *const u8;
                        pk::avx512::kernel_cols(
                            nb,
                            pp,
                            ap,
                            acs,
                            cols,
                            pv.as_mut_ptr() as _,
                            64,
                            ROWS,
                        );
                    }
                    let same = |x: &[f32], y: &[f32]| {
                        x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
                    };
                    assert!(same(&r, &v), "gemv vs reference k={k} cols={cols}");
                    assert!(same(&pv, &v), "gemv vs panel kernel k={k} cols={cols}");
                }
            }
        }
    }
}
