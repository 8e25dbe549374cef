//! Q6_K weight panels for prompt products on AVX-512 VNNI (the Q4_0 ones: `panel.rs`, Q4_K:
//! `panel_q4_k.rs`). Per super-block a panel holds the 16 rows' d as f32, the 16 sub-block
//! scales of the 16 rows as bytes (sub-block s: 16 bytes, one per row, widened to i32 lanes by
//! the load) and the 256 codes (0..63, unsigned) with one 32-bit lane per row, so one
//! `vpdpbusd` multiplies 4 codes of 16 rows by 4 activation bytes.
//!
//! The activations are Q8_K (as ggml-cpu quantizes them for Q6_K) with −32·Σy per sub-block of
//! 16 as the start of that sub-block's integer sum: Q6_K values are q − 32, so
//! Σ(q − 32)·y = Σq·y − 32·Σy.
//!
//! Float order, per (row, column) and super-block: the exact integer
//! `S = Σ_s sc[s]·(Σ q·y − 32·Σy)`, then `acc = fma(S·dx, dy, acc)` from 0: the structure of
//! ggml-cpu's tiled K-quant kernels (`d0·S` per super-block, then an fma with the activation's
//! d into the running sum). `kernel_ref` is the scalar statement of it.

use super::q6_k::{codes, BlockQ6K};
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, QK_K};

pub use super::panel::ROWS;

/// Most activation columns one kernel call runs.
pub const MAX_COLS: usize = 4;

pub(crate) const SC_AT: usize = ROWS * 4;
const CODES_AT: usize = SC_AT + 16 * ROWS;
/// Bytes of one super-block of a panel (a multiple of 64: the code groups stay aligned).
pub const BLOCK_BYTES: usize = CODES_AT + QK_K * ROWS;
const _: () = assert!(BLOCK_BYTES.is_multiple_of(64));

/// One super-block of an activation column: the scale, −32 times each sub-block's sum (the
/// start of its integer sum), the 256 values.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ActBlock6 {
    pub d: f32,
    pub off: [i32; 16],
    pub qs: [i8; QK_K],
}
const _: () = assert!(size_of::<ActBlock6>() == 324);

pub fn panel_bytes(nb: usize) -> usize {
    nb * BLOCK_BYTES
}

/// Offset of code group g (values 4g .. 4g + 3 of the super-block) in a panel super-block.
pub(crate) const fn codes_at(g: usize) -> usize {
    CODES_AT + g * ROWS * 4
}

/// The `nb` Q8_K blocks at `y` as `ActBlock6`s at `dst`.
///
/// # Safety
/// `y` must point to `nb` readable Q8_K blocks (4-byte aligned), `dst` to room for `nb`
/// `ActBlock6`s (4-byte aligned).
pub unsafe fn act_row(nb: usize, y: *const u8, dst: *mut u8) {
    let (y, dst) = (y as *const BlockQ8K, dst as *mut ActBlock6);
    for b in 0..nb {
        let by = &*y.add(b);
        *dst.add(b) = ActBlock6 {
            d: by.d,
            off: by.bsums.map(|s| -32 * s as i32),
            qs: by.qs,
        };
    }
}

/// d and the scales of `rows` rows of super-block b (zeros past `rows`).
unsafe fn pack_scales(b: usize, w: *const u8, ws: usize, rows: usize, pb: *mut u8) {
    for r in 0..ROWS {
        let bx = (r < rows).then(|| &*(w.add(r * ws) as *const BlockQ6K).add(b));
        *(pb as *mut f32).add(r) = bx.map_or(0.0, |bx| f16_to_f32(bx.d));
        for s in 0..16 {
            *(pb.add(SC_AT + 16 * s + r) as *mut i8) = bx.map_or(0, |bx| bx.scales[s]);
        }
    }
}

/// Packs `rows` ≤ 16 Q6_K rows of `nb` super-blocks (`w`, `ws` bytes apart) into the panel at
/// `dst`; rows past `rows` get zeros. Plain version of `avx512::pack`.
///
/// # Safety
/// `w` must point to `rows` readable rows of `nb` Q6_K blocks (2-byte aligned), `dst` to
/// `panel_bytes(nb)` writable bytes (4-byte aligned).
pub unsafe fn pack_ref(nb: usize, w: *const u8, ws: usize, rows: usize, dst: *mut u8) {
    for b in 0..nb {
        let pb = dst.add(b * BLOCK_BYTES);
        pack_scales(b, w, ws, rows, pb);
        for r in 0..ROWS {
            let q = if r < rows {
                codes(&*(w.add(r * ws) as *const BlockQ6K).add(b))
            } else {
                [0; QK_K]
            };
            for (e, &v) in q.iter().enumerate() {
                *pb.add(codes_at(e / 4) + r * 4 + e % 4) = v;
            }
        }
    }
}

/// Results of a panel times `cols` columns (column c's super-blocks at `act + c * acs` bytes):
/// row r of column c to `out + r * 4 + c * os` (bytes), for r < `rows`.
///
/// # Safety
/// `panel` must hold `nb` packed super-blocks, each column `nb` `ActBlock6`s (4-byte
/// aligned), `out` must be writable at every result's place (4-byte aligned).
#[allow(clippy::too_many_arguments)]
pub unsafe fn kernel_ref(
    nb: usize,
    panel: *const u8,
    act: *const u8,
    acs: usize,
    cols: usize,
    out: *mut u8,
    os: usize,
    rows: usize,
) {
    for c in 0..cols {
        let ya = act.add(c * acs) as *const ActBlock6;
        for r in 0..rows {
            let mut acc = 0f32;
            for b in 0..nb {
                let pb = panel.add(b * BLOCK_BYTES);
                let a = &*ya.add(b);
                let mut sumi = 0i32;
                for s in 0..16 {
                    let mut dot = a.off[s];
                    for e in 16 * s..16 * s + 16 {
                        let u = *pb.add(codes_at(e / 4) + r * 4 + e % 4);
                        dot += u as i32 * a.qs[e] as i32;
                    }
                    sumi += *(pb.add(SC_AT + 16 * s + r) as *const i8) as i32 * dot;
                }
                let dx = *(pb as *const f32).add(r);
                acc = (sumi as f32 * dx).mul_add(a.d, acc);
            }
            *(out.add(r * 4 + c * os) as *mut f32) = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::*;
    use crate::cpu::quants::panel::avx512::{f16_lanes, transpose16x4};
    use std::arch::x86_64::*;

    /// `pack_ref` for a full panel: ql and qh transposed as dwords of the 16 rows
    /// (`transpose16x4`), then each code group built from its ql nibble and qh bit pair on all
    /// 16 rows at once; partial panels take `pack_ref`.
    ///
    /// # Safety
    /// As `pack_ref`; the CPU must have AVX-512 F, BW and VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn pack(nb: usize, w: *const u8, ws: usize, rows: usize, dst: *mut u8) {
        if rows < ROWS {
            return pack_ref(nb, w, ws, rows, dst);
        }
        let lo = _mm512_set1_epi8(0x0f);
        let hi = _mm512_set1_epi8(0x30);
        for b in 0..nb {
            let base = w.add(b * size_of::<BlockQ6K>());
            let pb = dst.add(b * BLOCK_BYTES);
            pack_scales(b, w, ws, rows, pb);
            _mm512_storeu_ps(pb as *mut f32, f16_lanes(base.add(208), ws));
            let put = |g: usize, v: __m512i| _mm512_storeu_si512(pb.add(codes_at(g)) as *mut _, v);
            for n in 0..2 {
                // Dword j (values l = 4j .. 4j + 3) of the half's 32 qh bytes.
                let [h0, h1] = [0, 1].map(|h| transpose16x4(base.add(128 + 32 * n + 16 * h), ws));
                for a in 0..2 {
                    let [l0, l1] =
                        [0, 1].map(|h| transpose16x4(base.add(64 * n + 32 * a + 16 * h), ws));
                    for j in 0..8 {
                        let (ql, qh) = if j < 4 {
                            (l0[j], h0[j])
                        } else {
                            (l1[j - 4], h1[j - 4])
                        };
                        // Value 128n + 32k + l: k = a from the low nibble and qh bits 2a,
                        // k = a + 2 from the high nibble and bits 2a + 4 (16-bit shifts leak
                        // bits across bytes; the masks drop exactly those).
                        let (top_lo, top_hi) = if a == 0 {
                            (_mm512_slli_epi16::<4>(qh), qh)
                        } else {
                            (_mm512_slli_epi16::<2>(qh), _mm512_srli_epi16::<2>(qh))
                        };
                        put(
                            32 * n + 8 * a + j,
                            _mm512_or_si512(_mm512_and_si512(ql, lo), _mm512_and_si512(top_lo, hi)),
                        );
                        put(
                            32 * n + 8 * (a + 2) + j,
                            _mm512_or_si512(
                                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), lo),
                                _mm512_and_si512(top_hi, hi),
                            ),
                        );
                    }
                }
            }
        }
    }

    /// `kernel_ref` for C ≤ `MAX_COLS` columns: per sub-block 4 `vpdpbusd` per column from
    /// −32·Σy, a `vpmulld` by the 16 rows' scales; per super-block one conversion, one
    /// multiply by d and one fma per 16 results.
    ///
    /// # Safety
    /// As `kernel_ref`; the CPU must have AVX-512 F, BW, VL and VNNI.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel<const C: usize>(
        nb: usize,
        panel: *const u8,
        act: *const u8,
        acs: usize,
        out: *mut u8,
        os: usize,
        rows: usize,
    ) {
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let pb = panel.add(b * BLOCK_BYTES);
            let a = |c: usize| &*(act.add(c * acs) as *const ActBlock6).add(b);
            let mut t = [zero; C];
            for s in 0..16 {
                let mut w = [zero; 4];
                for g in 0..4 {
                    w[g] = _mm512_loadu_si512(pb.add(codes_at(4 * s + g)) as *const _);
                }
                let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(pb.add(SC_AT + 16 * s) as *const _));
                for c in 0..C {
                    let q = a(c).qs.as_ptr().add(16 * s) as *const i32;
                    let mut dot = _mm512_set1_epi32(a(c).off[s]);
                    for g in 0..4 {
                        let y = _mm512_set1_epi32(q.add(g).read_unaligned());
                        dot = _mm512_dpbusd_epi32(dot, w[g], y);
                    }
                    t[c] = _mm512_add_epi32(t[c], _mm512_mullo_epi32(dot, sc));
                }
            }
            let dx = _mm512_loadu_ps(pb as *const f32);
            for c in 0..C {
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(t[c]), dx);
                acc[c] = _mm512_fmadd_ps(v, _mm512_set1_ps(a(c).d), acc[c]);
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

    /// `kernel::<C>` for a run-time C in 1..=`MAX_COLS`.
    ///
    /// # Safety
    /// As `kernel`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel_cols(
        nb: usize,
        panel: *const u8,
        act: *const u8,
        acs: usize,
        cols: usize,
        out: *mut u8,
        os: usize,
        rows: usize,
    ) {
        let f = kernel_for_cols!(kernel, cols, [1, 2, 3], 4);
        f(nb, panel, act, acs, out, os, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q6_k, q8_k, testutil::data};

    const QK: usize = size_of::<BlockQ6K>();
    const YK: usize = size_of::<BlockQ8K>();
    const AK: usize = size_of::<ActBlock6>();

    /// m rows of Q6_K weights, n columns of Q8_K activations and the same as `ActBlock6`s.
    fn operands(m: usize, n: usize, k: usize, seed: u32) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let nb = k / QK_K;
        let mut w = vec![0u16; m * nb * QK / 2];
        unsafe { q6_k::from_f32(&data(m * k, seed), w.as_mut_ptr() as *mut u8) };
        let mut y = vec![0u32; n * nb * YK / 4];
        unsafe { q8_k::from_f32(&data(n * k, seed + 1), y.as_mut_ptr() as *mut u8) };
        let mut act = vec![0u32; n * nb * AK / 4];
        for c in 0..n {
            unsafe {
                act_row(
                    nb,
                    (y.as_ptr() as *const u8).add(c * nb * YK),
                    (act.as_mut_ptr() as *mut u8).add(c * nb * AK),
                )
            };
        }
        let bytes =
            |p: *const u8, len: usize| unsafe { std::slice::from_raw_parts(p, len) }.to_vec();
        (
            bytes(w.as_ptr() as *const u8, w.len() * 2),
            bytes(y.as_ptr() as *const u8, y.len() * 4),
            bytes(act.as_ptr() as *const u8, act.len() * 4),
        )
    }

    /// The same as 4-byte aligned storage (the blocks are read in place).
    fn aligned(v: &[u8]) -> Vec<u32> {
        let mut a = vec![0u32; v.len().div_ceil(4)];
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), a.as_mut_ptr() as *mut u8, v.len()) };
        a
    }

    /// The reference is the blockwise sum written out from the Q6_K and Q8_K blocks, and
    /// within rounding of the one-row dot (`q6_k::vec_dot_ref`).
    #[test]
    fn kernel_ref_is_the_blockwise_sum() {
        let (m, n, k) = (21, 3, 768);
        let nb = k / QK_K;
        let (w, y, act) = operands(m, n, k, 3);
        let (w, y, act) = (aligned(&w), aligned(&y), aligned(&act));
        let (wp, yp, ap) = (
            w.as_ptr() as *const u8,
            y.as_ptr() as *const u8,
            act.as_ptr() as *const u8,
        );
        let mut panel = vec![0u32; panel_bytes(nb) / 4];
        let pp = panel.as_mut_ptr() as *mut u8;
        for p in 0..m.div_ceil(ROWS) {
            let rows = (m - p * ROWS).min(ROWS);
            let mut out = vec![f32::NAN; ROWS * n];
            unsafe {
                pack_ref(nb, wp.add(p * ROWS * nb * QK), nb * QK, rows, pp);
                kernel_ref(
                    nb,
                    pp,
                    ap,
                    nb * AK,
                    n,
                    out.as_mut_ptr() as *mut u8,
                    ROWS * 4,
                    rows,
                );
            }
            for c in 0..n {
                for r in 0..rows {
                    let wr = unsafe { wp.add((p * ROWS + r) * nb * QK) };
                    let yc = unsafe { yp.add(c * nb * YK) };
                    let mut acc = 0f32;
                    for b in 0..nb {
                        let bx = unsafe { &*(wr as *const BlockQ6K).add(b) };
                        let by = unsafe { &*(yc as *const BlockQ8K).add(b) };
                        let q = codes(bx);
                        let sumi: i32 = (0..16)
                            .map(|s| {
                                let dot: i32 = (16 * s..16 * s + 16)
                                    .map(|e| (q[e] as i32 - 32) * by.qs[e] as i32)
                                    .sum();
                                bx.scales[s] as i32 * dot
                            })
                            .sum();
                        acc = (sumi as f32 * f16_to_f32(bx.d)).mul_add(by.d, acc);
                    }
                    let got = out[c * ROWS + r];
                    assert_eq!(got.to_bits(), acc.to_bits(), "row {r} col {c}");
                    let dot = unsafe { q6_k::vec_dot_ref(k, wr, yc) };
                    assert!(
                        (got - dot).abs() <= 1e-5 * dot.abs().max(1.0),
                        "{got} vs {dot}"
                    );
                }
            }
        }
    }

    /// The AVX-512 pack equals the plain one, the VNNI kernel gives the reference's bits: rows
    /// not a multiple of 16, 1 to `MAX_COLS` columns, one super-block and more than 4096 values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_equals_reference() {
        if !crate::cpu::quants::panel::available() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        for (m, k) in [(16, 256), (21, 256), (35, 4352)] {
            let n = MAX_COLS + 1;
            let nb = k / QK_K;
            let (w, _, act) = operands(m, n, k, 7);
            let (w, act) = (aligned(&w), aligned(&act));
            let acs = nb * AK;
            for p in 0..m.div_ceil(ROWS) {
                let rows = (m - p * ROWS).min(ROWS);
                let wp = unsafe { (w.as_ptr() as *const u8).add(p * ROWS * nb * QK) };
                let mut a = vec![1u32; panel_bytes(nb) / 4];
                let mut b = vec![2u32; panel_bytes(nb) / 4];
                let (ap, bp) = (a.as_mut_ptr() as *mut u8, b.as_mut_ptr() as *mut u8);
                unsafe {
                    pack_ref(nb, wp, nb * QK, rows, ap);
                    avx512::pack(nb, wp, nb * QK, rows, bp);
                }
                assert!(a == b, "m={m} k={k} panel {p}");
                for cols in 1..=MAX_COLS {
                    let mut want = vec![0f32; ROWS * cols];
                    let mut got = vec![0f32; ROWS * cols];
                    unsafe {
                        let y = (act.as_ptr() as *const u8).add(acs);
                        let (wo, go) = (want.as_mut_ptr() as *mut u8, got.as_mut_ptr() as *mut u8);
                        kernel_ref(nb, ap, y, acs, cols, wo, ROWS * 4, rows);
                        avx512::kernel_cols(nb, ap, y, acs, cols, go, ROWS * 4, rows);
                    }
                    let same = want
                        .iter()
                        .zip(&got)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "m={m} k={k} panel {p} cols={cols}");
                }
            }
        }
    }
}
