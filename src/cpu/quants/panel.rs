//! Prompt products of Q4_0 weights on AVX-512 VNNI through weight panels: each thread packs
//! 16 weight rows at a time into a panel (per block: the 16 row scales as f32, then the codes
//! with one 32-bit lane per row) and runs every activation column over it, so one `vpdpbusd`
//! takes 4 codes of 16 rows at once against 4 activation bytes broadcast from memory.
//!
//! Float order: per (row, column) the blocks are summed in order, one fma each:
//! `acc = fma(float(Σ (q − 8)·y), dx·dy, acc)` from 0 (the integer sum and dx·dy are exact). That
//! is the order of ggml-cpu's repacked Q4_0 kernels (which llama.cpp runs on x86 for Q4_0
//! weights), not the one of ggml's AVX2 `vec_dot` (8 lanes, then a horizontal sum): results
//! differ from RFCPU's one-row dot by rounding noise. `kernel_ref` is the scalar statement of it.

use super::f16_to_f32;
use super::q4_0::BlockQ4_0;
use super::q8_0::BlockQ8_0;

/// Weight rows per panel (one per i32 lane of a 512-bit register).
pub const ROWS: usize = 16;
/// Bytes of one block of a panel: 16 f32 scales, then 8 groups × 16 rows × 4 codes.
pub const BLOCK_BYTES: usize = ROWS * 4 + 8 * ROWS * 4;
/// Most activation columns one kernel call runs (its f32 accumulators).
pub const MAX_COLS: usize = 8;

/// One block of an activation column as the kernel reads it: `corr` = −8·Σy (the codes' offset,
/// folded into the integer sum's start), the scale as f32, the 32 values in element order.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ActBlock {
    pub corr: i32,
    pub d: f32,
    pub qs: [i8; 32],
}
const _: () = assert!(size_of::<ActBlock>() == 40);

/// Bytes one panel of `nb` blocks takes.
pub fn panel_bytes(nb: usize) -> usize {
    nb * BLOCK_BYTES
}

/// The `nb` Q8_0 blocks at `y` as `ActBlock`s at `dst`.
///
/// # Safety
/// `y` must point to `nb` readable Q8_0 blocks (2-byte aligned), `dst` to room for `nb`
/// `ActBlock`s (4-byte aligned).
pub unsafe fn act_row(nb: usize, y: *const u8, dst: *mut ActBlock) {
    let y = y as *const BlockQ8_0;
    for b in 0..nb {
        let by = &*y.add(b);
        let sum: i32 = by.qs.iter().map(|&v| v as i32).sum();
        *dst.add(b) = ActBlock {
            corr: -8 * sum,
            d: f16_to_f32(by.d),
            qs: by.qs,
        };
    }
}

/// Packs `rows` ≤ 16 Q4_0 rows of `nb` blocks (`w`, `ws` bytes apart) into the panel at `dst`;
/// rows from `rows` to 16 get zero codes and scales. Plain version of `avx512::pack`.
///
/// # Safety
/// `w` must point to `rows` readable rows of `nb` Q4_0 blocks, `dst` to `panel_bytes(nb)`
/// writable bytes (4-byte aligned).
pub unsafe fn pack_ref(nb: usize, w: *const u8, ws: usize, rows: usize, dst: *mut u8) {
    for b in 0..nb {
        let pb = dst.add(b * BLOCK_BYTES);
        for r in 0..ROWS {
            let bx = (r < rows).then(|| &*(w.add(r * ws) as *const BlockQ4_0).add(b));
            *(pb as *mut f32).add(r) = bx.map_or(0.0, |bx| f16_to_f32(bx.d));
            for e in 0..32 {
                // Element e: low nibble of byte e (e < 16), else high nibble of byte e − 16.
                let code = bx.map_or(0, |bx| {
                    if e < 16 {
                        bx.qs[e] & 0x0f
                    } else {
                        bx.qs[e - 16] >> 4
                    }
                });
                *pb.add(ROWS * 4 + (e / 4) * ROWS * 4 + r * 4 + e % 4) = code;
            }
        }
    }
}

/// Results of a panel times `cols` activation columns (column c's blocks at `act + c * acs`):
/// row r of column c to `out + r * 4 + c * os` (bytes), for r < `rows`.
///
/// # Safety
/// `panel` must hold `nb` packed blocks, each column `nb` `ActBlock`s, `out` must be writable
/// at every result's place (4-byte aligned).
#[allow(clippy::too_many_arguments)]
pub unsafe fn kernel_ref(
    nb: usize,
    panel: *const u8,
    act: *const ActBlock,
    acs: usize,
    cols: usize,
    out: *mut u8,
    os: usize,
    rows: usize,
) {
    for c in 0..cols {
        for r in 0..rows {
            let mut acc = 0f32;
            for b in 0..nb {
                let pb = panel.add(b * BLOCK_BYTES);
                let a = &*act.add(c * acs + b);
                let mut s = a.corr;
                for e in 0..32 {
                    let u = *pb.add(ROWS * 4 + (e / 4) * ROWS * 4 + r * 4 + e % 4);
                    s += u as i32 * a.qs[e] as i32;
                }
                let dx = *(pb as *const f32).add(r);
                acc = (s as f32).mul_add(dx * a.d, acc);
            }
            *(out.add(r * 4 + c * os) as *mut f32) = acc;
        }
    }
}

/// Whether the AVX-512 VNNI panel kernels can run here.
#[cfg(target_arch = "x86_64")]
pub fn available() -> bool {
    super::use_avx512() && crate::cpu::simd::has_avx512_vnni()
}

#[cfg(not(target_arch = "x86_64"))]
pub fn available() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// Dword g of the 16 bytes at `base + r * ws` in lane r of out[g], for rows r < 16: 16 row
    /// loads and a 4 × 4 transpose of dwords within each 128-bit lane (gathers, one per g,
    /// made generation 3 times slower on Zen 4).
    ///
    /// # Safety
    /// The 16 bytes at `base + r * ws` must be readable for each r < 16; the CPU must have
    /// AVX-512 F, BW and VL.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn transpose16x4(base: *const u8, ws: usize) -> [__m512i; 4] {
        let row = |r: usize| _mm_loadu_si128(base.add(r * ws) as *const __m128i);
        let a = |k: usize| {
            let v = _mm512_castsi128_si512(row(k));
            let v = _mm512_inserti32x4::<1>(v, row(4 + k));
            let v = _mm512_inserti32x4::<2>(v, row(8 + k));
            _mm512_inserti32x4::<3>(v, row(12 + k))
        };
        // a(k): 128-bit lane j = row 4j + k; the unpacks leave lane 4j + i = row 4j + i.
        let (a0, a1, a2, a3) = (a(0), a(1), a(2), a(3));
        let t0 = _mm512_unpacklo_epi32(a0, a1);
        let t1 = _mm512_unpackhi_epi32(a0, a1);
        let t2 = _mm512_unpacklo_epi32(a2, a3);
        let t3 = _mm512_unpackhi_epi32(a2, a3);
        [
            _mm512_unpacklo_epi64(t0, t2),
            _mm512_unpackhi_epi64(t0, t2),
            _mm512_unpacklo_epi64(t1, t3),
            _mm512_unpackhi_epi64(t1, t3),
        ]
    }

    /// The f16 at `base + r * ws` as f32 in lane r, for rows r < 16.
    ///
    /// # Safety
    /// The 2 bytes at `base + r * ws` must be readable for each r < 16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn f16_lanes(base: *const u8, ws: usize) -> __m512 {
        let mut h = [0u16; ROWS];
        for (l, v) in h.iter_mut().enumerate() {
            *v = (base.add(l * ws) as *const u16).read_unaligned();
        }
        _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i))
    }

    /// `pack_ref` for a full panel with 16-byte row loads; partial panels take `pack_ref`.
    ///
    /// # Safety
    /// As `pack_ref`; the CPU must have AVX-512 F, BW and VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn pack(nb: usize, w: *const u8, ws: usize, rows: usize, dst: *mut u8) {
        if rows < ROWS {
            return pack_ref(nb, w, ws, rows, dst);
        }
        let lo = _mm512_set1_epi8(0x0f);
        for b in 0..nb {
            let base = w.add(b * size_of::<BlockQ4_0>());
            let pb = dst.add(b * BLOCK_BYTES);
            _mm512_storeu_ps(pb as *mut f32, f16_lanes(base, ws));
            let q = transpose16x4(base.add(2), ws);
            let codes = pb.add(ROWS * 4);
            for (g, q) in q.into_iter().enumerate() {
                _mm512_storeu_si512(codes.add(g * 64) as *mut _, _mm512_and_si512(q, lo));
                _mm512_storeu_si512(
                    codes.add((g + 4) * 64) as *mut _,
                    _mm512_and_si512(_mm512_srli_epi16::<4>(q), lo),
                );
            }
        }
    }

    /// `kernel_ref` for C ≤ `MAX_COLS` columns: per block 8 `vpdpbusd` per column (the
    /// column's 4 bytes of each group broadcast), then one conversion and fma for 16 rows.
    ///
    /// # Safety
    /// As `kernel_ref`; the CPU must have AVX-512 F, BW, VL and VNNI.
    // The loop indices address the accumulators and the columns together.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel<const C: usize>(
        nb: usize,
        panel: *const u8,
        act: *const ActBlock,
        acs: usize,
        out: *mut u8,
        os: usize,
        rows: usize,
    ) {
        let mut acc = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let pb = panel.add(b * BLOCK_BYTES);
            let dx = _mm512_loadu_ps(pb as *const f32);
            let mut w = [_mm512_setzero_si512(); 8];
            for g in 0..8 {
                w[g] = _mm512_loadu_si512(pb.add(ROWS * 4 + g * 64) as *const _);
            }
            for c in 0..C {
                let a = act.add(c * acs + b);
                let q = (*a).qs.as_ptr() as *const i32;
                let mut s = _mm512_set1_epi32((*a).corr);
                for g in 0..8 {
                    s = _mm512_dpbusd_epi32(s, w[g], _mm512_set1_epi32(q.add(g).read_unaligned()));
                }
                let scale = _mm512_mul_ps(dx, _mm512_set1_ps((*a).d));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[c]);
            }
        }
        let live: __mmask16 = if rows >= ROWS {
            0xffff
        } else {
            (1u16 << rows) - 1
        };
        for c in 0..C {
            _mm512_mask_storeu_ps(out.add(c * os) as *mut f32, live, acc[c]);
        }
    }

    /// `kernel_ref` for C < 4 columns of a full panel straight from the Q4_0 rows (`w`, `ws`
    /// bytes apart): each block's codes transposed as `pack` does and used at once
    /// (generation, where packing would cost more than the product).
    ///
    /// # Safety
    /// As `pack` (16 rows) and `kernel_ref`; the CPU must have AVX-512 F, BW, VL and VNNI.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn direct<const C: usize>(
        nb: usize,
        w: *const u8,
        ws: usize,
        act: *const ActBlock,
        acs: usize,
        out: *mut u8,
        os: usize,
    ) {
        let lo = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let base = w.add(b * size_of::<BlockQ4_0>());
            // 16 row streams lose the hardware prefetcher: fetch 4 rows 256 bytes ahead per
            // block, each row every 4 blocks (72 bytes).
            for r in 4 * (b % 4)..4 * (b % 4) + 4 {
                _mm_prefetch::<_MM_HINT_T0>(base.add(r * ws + 256) as *const i8);
            }
            let dx = f16_lanes(base, ws);
            let q = transpose16x4(base.add(2), ws);
            let mut wv = [_mm512_setzero_si512(); 8];
            for g in 0..4 {
                wv[g] = _mm512_and_si512(q[g], lo);
                wv[g + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(q[g]), lo);
            }
            for c in 0..C {
                let a = act.add(c * acs + b);
                let q = (*a).qs.as_ptr() as *const i32;
                let mut s = _mm512_set1_epi32((*a).corr);
                for g in 0..8 {
                    s = _mm512_dpbusd_epi32(s, wv[g], _mm512_set1_epi32(q.add(g).read_unaligned()));
                }
                let scale = _mm512_mul_ps(dx, _mm512_set1_ps((*a).d));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[c]);
            }
        }
        for c in 0..C {
            _mm512_storeu_ps(out.add(c * os) as *mut f32, acc[c]);
        }
    }

    /// `kernel::<C>` for a run-time C in 1..=`MAX_COLS`.
    ///
    /// # Safety
    /// As `kernel`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel_cols(
        nb: usize,
        panel: *const u8,
        act: *const ActBlock,
        acs: usize,
        cols: usize,
        out: *mut u8,
        os: usize,
        rows: usize,
    ) {
        let f = kernel_for_cols!(kernel, cols, [1, 2, 3, 4, 5, 6, 7], 8);
        f(nb, panel, act, acs, out, os, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q4_0, q8_0, testutil::data};

    /// (weights as Q4_0 rows, activations as ActBlock columns) for m rows, n columns, k values.
    fn operands(m: usize, n: usize, k: usize, seed: u32) -> (Vec<u8>, Vec<u8>, Vec<ActBlock>) {
        let nb = k / 32;
        let mut w = vec![0u8; m * nb * 18];
        unsafe { q4_0::from_f32(&data(m * k, seed), w.as_mut_ptr()) };
        let mut y = vec![0u8; n * nb * 34];
        unsafe { q8_0::from_f32(&data(n * k, seed + 1), y.as_mut_ptr()) };
        let mut act = vec![
            ActBlock {
                corr: 0,
                d: 0.0,
                qs: [0; 32]
            };
            n * nb
        ];
        for c in 0..n {
            unsafe {
                act_row(
                    nb,
                    y.as_ptr().add(c * nb * 34),
                    act.as_mut_ptr().add(c * nb),
                )
            };
        }
        (w, y, act)
    }

    /// The panel order is the blocks in order, one fma each: the reference agrees with the
    /// one-row dot (another order) within rounding, and with a sum of the blocks written out.
    #[test]
    fn kernel_ref_is_the_blockwise_fma_sum() {
        let (m, n, k) = (19, 3, 256);
        let nb = k / 32;
        let (w, y, act) = operands(m, n, k, 5);
        let mut panel = vec![0u8; panel_bytes(nb)];
        for p in 0..m.div_ceil(ROWS) {
            let rows = (m - p * ROWS).min(ROWS);
            let mut out = vec![f32::NAN; ROWS * n];
            unsafe {
                pack_ref(
                    nb,
                    w.as_ptr().add(p * ROWS * nb * 18),
                    nb * 18,
                    rows,
                    panel.as_mut_ptr(),
                );
                kernel_ref(
                    nb,
                    panel.as_ptr(),
                    act.as_ptr(),
                    nb,
                    n,
                    out.as_mut_ptr() as *mut u8,
                    ROWS * 4,
                    rows,
                );
            }
            for c in 0..n {
                for r in 0..rows {
                    let (wr, yc) = (
                        unsafe { w.as_ptr().add((p * ROWS + r) * nb * 18) },
                        unsafe { y.as_ptr().add(c * nb * 34) },
                    );
                    let mut want = 0f32;
                    for b in 0..nb {
                        let (bx, by) = unsafe {
                            (
                                &*(wr as *const BlockQ4_0).add(b),
                                &*(yc as *const BlockQ8_0).add(b),
                            )
                        };
                        let s: i32 = (0..16)
                            .map(|j| {
                                ((bx.qs[j] & 15) as i32 - 8) * by.qs[j] as i32
                                    + ((bx.qs[j] >> 4) as i32 - 8) * by.qs[j + 16] as i32
                            })
                            .sum();
                        want = (s as f32).mul_add(f16_to_f32(bx.d) * f16_to_f32(by.d), want);
                    }
                    let got = out[c * ROWS + r];
                    assert_eq!(got.to_bits(), want.to_bits(), "row {r} col {c}");
                    let dot = unsafe { q4_0::vec_dot_ref(k, wr, yc) };
                    assert!(
                        (got - dot).abs() <= 1e-4 * dot.abs().max(1.0),
                        "{got} vs {dot}"
                    );
                }
            }
        }
    }

    /// The gathered panel equals the plain one byte for byte, and the VNNI kernel gives the
    /// reference's bits, for full and partial panels and every column count.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_equals_reference() {
        if !available() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        for (m, k) in [(16, 32), (21, 96), (7, 1024)] {
            let n = 11;
            let nb = k / 32;
            let (w, _, act) = operands(m, n, k, 9);
            for p in 0..m.div_ceil(ROWS) {
                let rows = (m - p * ROWS).min(ROWS);
                let wp = unsafe { w.as_ptr().add(p * ROWS * nb * 18) };
                let (mut a, mut b) = (vec![1u8; panel_bytes(nb)], vec![2u8; panel_bytes(nb)]);
                unsafe {
                    pack_ref(nb, wp, nb * 18, rows, a.as_mut_ptr());
                    avx512::pack(nb, wp, nb * 18, rows, b.as_mut_ptr());
                }
                assert!(a == b, "m={m} k={k} panel {p}");
                for cols in 1..=MAX_COLS {
                    let mut want = vec![0f32; ROWS * cols];
                    let mut got = vec![0f32; ROWS * cols];
                    unsafe {
                        kernel_ref(
                            nb,
                            a.as_ptr(),
                            act.as_ptr().add(nb),
                            nb,
                            cols,
                            want.as_mut_ptr() as *mut u8,
                            ROWS * 4,
                            rows,
                        );
                        avx512::kernel_cols(
                            nb,
                            a.as_ptr(),
                            act.as_ptr().add(nb),
                            nb,
                            cols,
                            got.as_mut_ptr() as *mut u8,
                            ROWS * 4,
                            rows,
                        );
                    }
                    let same = want
                        .iter()
                        .zip(&got)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "m={m} k={k} cols={cols}");
                }
            }
        }
    }

    /// Kernel speed, one thread, panel and columns in cache (k = 4096, 8 columns):
    /// `cargo test --release -- --ignored bench_panel --nocapture`. Prints int8 multiply-adds
    /// per second (×2 for ops) of the Q4_0 and Q4_K kernels and the packing's share.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn bench_panel() {
        use crate::cpu::quants::panel_q4_k as pk;
        use std::time::Instant;
        if !available() {
            return;
        }
        let (k, n, reps) = (4096, 8, 40000);
        let nb = k / 32;
        let (w, _, act) = operands(16, n, k, 1);
        let mut panel = vec![0u8; panel_bytes(nb)];
        let mut out = vec![0f32; ROWS * n];
        let op = out.as_mut_ptr() as *mut u8;
        let t = Instant::now();
        for _ in 0..reps {
            unsafe { avx512::pack(nb, w.as_ptr(), nb * 18, ROWS, panel.as_mut_ptr()) };
        }
        let pack = t.elapsed().as_secs_f64() / reps as f64;
        let t = Instant::now();
        for _ in 0..reps {
            unsafe {
                avx512::kernel_cols(nb, panel.as_ptr(), act.as_ptr(), nb, n, op, ROWS * 4, ROWS)
            };
        }
        let kern = t.elapsed().as_secs_f64() / reps as f64;
        let macs = (ROWS * n * k) as f64;
        eprintln!(
            "Q4_0 panel kernel: {:.1} GMAC/s; pack {:.2} us = {:.0}% of one 8-column pass",
            macs / kern / 1e9,
            pack * 1e6,
            pack / kern * 100.0
        );
        let nbk = k / 256;
        let mut wk = vec![0u8; 16 * nbk * 144];
        unsafe { crate::cpu::quants::q4_k::from_f32(&data(16 * k, 3), wk.as_mut_ptr()) };
        let mut yk = vec![0u32; n * nbk * 292 / 4];
        unsafe { crate::cpu::quants::q8_k::from_f32(&data(n * k, 4), yk.as_mut_ptr() as *mut u8) };
        let mut ak = vec![0u32; n * nbk * 276 / 4];
        for c in 0..n {
            unsafe {
                pk::act_row(
                    nbk,
                    (yk.as_ptr() as *const u8).add(c * nbk * 292),
                    (ak.as_mut_ptr() as *mut u8).add(c * nbk * 276),
                )
            };
        }
        let mut pkp = vec![0u32; pk::panel_bytes(nbk) / 4];
        let pp = pkp.as_mut_ptr() as *mut u8;
        unsafe { pk::avx512::pack(nbk, wk.as_ptr(), nbk * 144, ROWS, pp) };
        let t = Instant::now();
        for _ in 0..reps {
            for j in (0..n).step_by(pk::MAX_COLS) {
                unsafe {
                    let a = (ak.as_ptr() as *const u8).add(j * nbk * 276);
                    pk::avx512::kernel_cols(nbk, pp, a, nbk * 276, pk::MAX_COLS, op, ROWS * 4, ROWS)
                };
            }
        }
        let kern = t.elapsed().as_secs_f64() / reps as f64;
        eprintln!("Q4_K panel kernel: {:.1} GMAC/s", macs / kern / 1e9);
    }
}
