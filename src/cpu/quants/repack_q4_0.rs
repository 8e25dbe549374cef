//! Q4_0 weights repacked at load (RFCPU's `RFCPU_REPACK` buffer type, `cpu/repack.rs`) into
//! groups of 16 rows that the AVX-512 VNNI products read as one contiguous stream.
//!
//! Layout of a matrix of `rows` rows of `nb` blocks (row size `rs` = 18·nb, the same bytes as
//! ggml's): group g (rows 16g .. 16g + 16) fills the 16 rows' bytes at 16·g·rs; its block b, at
//! 288·b inside the group, is the 16 rows' f16 scales (32 bytes), then the 16 code bytes of each
//! row as 4 dwords, dword q of row r at 32 + 64·q + 4·r (the `panel::avx512::transpose16x4`
//! order, so one 64-byte load gives dword q of all 16 rows). Rows past the last whole group stay
//! as ggml lays them out, at their usual place.
//!
//! Products over the layout sum in the weight panels' order (`panel.rs`: per block
//! `acc = fma(Σ (q − 8)·y, dx·dy, acc)`), ggml-cpu's repacked order: a one-column product gives
//! the bits of `panel::avx512::direct`, many columns those of the panel path.

use super::panel::{self, ActBlock, ROWS};
use super::q4_0::BlockQ4_0;

/// Bytes of one block of a group: 16 scales and 16 × 16 code bytes.
pub const GROUP_BLOCK: usize = ROWS * size_of::<BlockQ4_0>();
const CODES_AT: usize = ROWS * 2;

/// Repacks the `rows` rows (`nb` blocks each, contiguous) at `src` into `dst` (same size).
///
/// # Safety
/// `src` and `dst` must each span `rows · nb · 18` bytes and not overlap.
pub unsafe fn repack(rows: usize, nb: usize, src: *const u8, dst: *mut u8) {
    let rs = nb * size_of::<BlockQ4_0>();
    let groups = rows / ROWS;
    for g in 0..groups {
        let (s, d) = (src.add(g * ROWS * rs), dst.add(g * ROWS * rs));
        for b in 0..nb {
            let db = d.add(b * GROUP_BLOCK);
            for r in 0..ROWS {
                let bx = &*(s.add(r * rs) as *const BlockQ4_0).add(b);
                (db as *mut u16).add(r).write_unaligned(bx.d);
                for q in 0..4 {
                    let at = db.add(CODES_AT + 64 * q + 4 * r);
                    std::ptr::copy_nonoverlapping(bx.qs.as_ptr().add(4 * q), at, 4);
                }
            }
        }
    }
    let done = groups * ROWS * rs;
    std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), (rows - groups * ROWS) * rs);
}

/// The inverse of `repack`: ggml's layout of the `rows` rows repacked at `src`, to `dst`.
///
/// # Safety
/// As `repack`.
pub unsafe fn unrepack(rows: usize, nb: usize, src: *const u8, dst: *mut u8) {
    let rs = nb * size_of::<BlockQ4_0>();
    let groups = rows / ROWS;
    for g in 0..groups {
        let (s, d) = (src.add(g * ROWS * rs), dst.add(g * ROWS * rs));
        for b in 0..nb {
            let sb = s.add(b * GROUP_BLOCK);
            for r in 0..ROWS {
                let bx = &mut *(d.add(r * rs) as *mut BlockQ4_0).add(b);
                bx.d = (sb as *const u16).add(r).read_unaligned();
                for q in 0..4 {
                    let at = sb.add(CODES_AT + 64 * q + 4 * r);
                    std::ptr::copy_nonoverlapping(at, bx.qs.as_mut_ptr().add(4 * q), 4);
                }
            }
        }
    }
    let done = groups * ROWS * rs;
    std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), (rows - groups * ROWS) * rs);
}

/// One repacked group of `nb` blocks at `g` as a weight panel (`panel::pack_ref`'s output for
/// its 16 rows) at `dst`.
///
/// # Safety
/// `g` must hold a repacked group of `nb` blocks, `dst` `panel::panel_bytes(nb)` writable bytes
/// (4-byte aligned).
pub unsafe fn unpack_ref(nb: usize, g: *const u8, dst: *mut u8) {
    for b in 0..nb {
        let (gb, pb) = (g.add(b * GROUP_BLOCK), dst.add(b * panel::BLOCK_BYTES));
        for r in 0..ROWS {
            let d = (gb as *const u16).add(r).read_unaligned();
            *(pb as *mut f32).add(r) = super::f16_to_f32(d);
            for e in 0..32 {
                // Element e: low nibble of code byte e (e < 16), else high nibble of e − 16.
                let byte = e % 16;
                let v = *gb.add(CODES_AT + 64 * (byte / 4) + 4 * r + byte % 4);
                let code = if e < 16 { v & 0x0f } else { v >> 4 };
                *pb.add(ROWS * 4 + (e / 4) * ROWS * 4 + r * 4 + e % 4) = code;
            }
        }
    }
}

/// Scalar statement of the products over one group: `cols` activation columns (column c's
/// blocks at `act + c * acs`), row r of column c to `out + r * 4 + c * os` (bytes).
///
/// # Safety
/// As `unpack_ref` and `panel::kernel_ref`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn kernel_ref(
    nb: usize,
    g: *const u8,
    act: *const ActBlock,
    acs: usize,
    cols: usize,
    out: *mut u8,
    os: usize,
) {
    let mut p = vec![0u32; panel::panel_bytes(nb) / 4];
    unpack_ref(nb, g, p.as_mut_ptr() as *mut u8);
    panel::kernel_ref(nb, p.as_ptr() as *const u8, act, acs, cols, out, os, ROWS)
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// `unpack_ref` with 64-byte loads (prompts: the panel kernel then runs every column).
    ///
    /// # Safety
    /// As `unpack_ref`; the CPU must have AVX-512 F, BW and VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn unpack(nb: usize, g: *const u8, dst: *mut u8) {
        let lo = _mm512_set1_epi8(0x0f);
        for b in 0..nb {
            let (gb, pb) = (g.add(b * GROUP_BLOCK), dst.add(b * panel::BLOCK_BYTES));
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(gb as *const __m256i));
            _mm512_storeu_ps(pb as *mut f32, d);
            let codes = pb.add(ROWS * 4);
            for q in 0..4 {
                let v = _mm512_loadu_si512(gb.add(CODES_AT + 64 * q) as *const _);
                _mm512_storeu_si512(codes.add(q * 64) as *mut _, _mm512_and_si512(v, lo));
                _mm512_storeu_si512(
                    codes.add((q + 4) * 64) as *mut _,
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v), lo),
                );
            }
        }
    }

    /// `kernel_ref` for C < 4 columns (generation): the group streamed once, 288 bytes a block.
    ///
    /// # Safety
    /// As `kernel_ref`; the CPU must have AVX-512 F, BW, VL and VNNI.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn gemv<const C: usize>(
        nb: usize,
        g: *const u8,
        act: *const ActBlock,
        acs: usize,
        out: *mut u8,
        os: usize,
    ) {
        let lo = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); C];
        let ahead = crate::cpu::quants::stream::distance();
        for b in 0..nb {
            let gb = g.add(b * GROUP_BLOCK);
            if ahead > 0 {
                crate::cpu::quants::stream::prefetch(gb.wrapping_add(ahead), GROUP_BLOCK);
            }
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(gb as *const __m256i));
            let mut wv = [_mm512_setzero_si512(); 8];
            for q in 0..4 {
                let v = _mm512_loadu_si512(gb.add(CODES_AT + 64 * q) as *const _);
                wv[q] = _mm512_and_si512(v, lo);
                wv[q + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), lo);
            }
            for c in 0..C {
                let a = act.add(c * acs + b);
                let q = (*a).qs.as_ptr() as *const i32;
                let mut s = _mm512_set1_epi32((*a).corr);
                for k in 0..8 {
                    s = _mm512_dpbusd_epi32(s, wv[k], _mm512_set1_epi32(q.add(k).read_unaligned()));
                }
                let scale = _mm512_mul_ps(dx, _mm512_set1_ps((*a).d));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[c]);
            }
        }
        for c in 0..C {
            _mm512_storeu_ps(out.add(c * os) as *mut f32, acc[c]);
        }
    }

    /// `gemv::<C>` for a run-time C in 1..=3.
    ///
    /// # Safety
    /// As `gemv`.
    pub unsafe fn gemv_cols(
        nb: usize,
        g: *const u8,
        act: *const ActBlock,
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
    use crate::cpu::quants::q8_0;
    use crate::cpu::quants::{
        q4_0,
        testutil::{check_repack_round_trip, data},
    };

    fn weights(rows: usize, k: usize, seed: u32) -> Vec<u8> {
        let mut w = vec![0u8; rows * k / 32 * 18];
        unsafe { q4_0::from_f32(&data(rows * k, seed), w.as_mut_ptr()) };
        w
    }

    #[cfg(target_arch = "x86_64")]
    fn acts(n: usize, k: usize, seed: u32) -> Vec<ActBlock> {
        let nb = k / 32;
        let mut y = vec![0u8; n * nb * 34];
        unsafe { q8_0::from_f32(&data(n * k, seed), y.as_mut_ptr()) };
        let mut a = vec![
            ActBlock {
                corr: 0,
                d: 0.0,
                qs: [0; 32]
            };
            n * nb
        ];
        for c in 0..n {
            unsafe { panel::act_row(nb, y.as_ptr().add(c * nb * 34), a.as_mut_ptr().add(c * nb)) };
        }
        a
    }

    /// Repacking and back gives the bytes again; whole groups change, the tail rows stay.
    #[test]
    fn repack_round_trips() {
        let shapes = [(16, 32), (37, 64), (5, 96), (48, 1024)];
        check_repack_round_trip(32, 18, ROWS, &shapes, weights, repack, unrepack);
    }

    /// A repacked group unpacks to the panel `panel::pack_ref` makes from the plain rows, and
    /// the AVX-512 unpack and one-column kernels give the reference's bytes and bits.
    #[test]
    fn unpack_and_kernels_equal_the_panel_path() {
        for k in [32, 96, 4096] {
            let nb = k / 32;
            let w = weights(ROWS, k, 7);
            let mut g = vec![0u8; w.len()];
            unsafe { repack(ROWS, nb, w.as_ptr(), g.as_mut_ptr()) };
            let mut want = vec![1u8; panel::panel_bytes(nb)];
            let mut got = vec![2u8; panel::panel_bytes(nb)];
            unsafe {
                panel::pack_ref(nb, w.as_ptr(), nb * 18, ROWS, want.as_mut_ptr());
                unpack_ref(nb, g.as_ptr(), got.as_mut_ptr());
            }
            assert!(want == got, "unpack_ref k={k}");
            #[cfg(target_arch = "x86_64")]
            if panel::available() {
                let mut fast = vec![3u8; panel::panel_bytes(nb)];
                unsafe { avx512::unpack(nb, g.as_ptr(), fast.as_mut_ptr()) };
                assert!(want == fast, "avx512::unpack k={k}");
                let a = acts(3, k, 8);
                for cols in 1..=3 {
                    let mut r = vec![0f32; ROWS * cols];
                    let mut v = vec![0f32; ROWS * cols];
                    unsafe {
                        kernel_ref(
                            nb,
                            g.as_ptr(),
                            a.as_ptr(),
                            nb,
                            cols,
                            r.as_mut_ptr() as _,
                            64,
                        );
                        avx512::gemv_cols(
                            nb,
                            g.as_ptr(),
                            a.as_ptr(),
                            nb,
                            cols,
                            v.as_mut_ptr() as _,
                            64,
                        );
                    }
                    let same = r.iter().zip(&v).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "gemv k={k} cols={cols}");
                    // The in-place panel product of the plain rows: the same bits.
                    let mut d = vec![0f32; ROWS * cols];
                    let f = [
                        panel::avx512::direct::<1>,
                        panel::avx512::direct::<2>,
                        panel::avx512::direct::<3>,
                    ][cols - 1];
                    unsafe {
                        f(
                            nb,
                            w.as_ptr(),
                            nb * 18,
                            a.as_ptr(),
                            nb,
                            d.as_mut_ptr() as _,
                            64,
                        )
                    };
                    let same = d.iter().zip(&v).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "direct k={k} cols={cols}");
                }
            }
        }
    }
}
