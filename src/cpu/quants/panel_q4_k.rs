//! Q4_K weight panels for prompt products on AVX-512 VNNI (the Q4_0 ones: `panel.rs`). Per
//! super-block a panel holds the 16 rows' d and dmin as f32, the 8 sub-block scales as i32
//! lanes, the mins as i16 pairs (sub-blocks 2p, 2p + 1) and the 256 codes with one 32-bit lane
//! per row.
//!
//! Float order, per (row, column) and super-block, for each sub-block pair p in order:
//! `acc = fma(sc[2p]·P[2p] + sc[2p+1]·P[2p+1], dx·dy, acc)` and
//! `accm = fma(m[2p]·bs[2p] + m[2p+1]·bs[2p+1], dmin·dy, accm)` (P: the sub-block's integer dot,
//! bs: its activation sum; both integer sums exact), the result `acc − accm`: the structure of
//! ggml-cpu's repacked Q4_K kernels. `kernel_ref` is the scalar statement of it.

use super::q4_k::{unpack_scales, BlockQ4K};
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, QK_K};

pub use super::panel::ROWS;

/// Most activation columns one kernel call runs.
pub const MAX_COLS: usize = 4;

pub(crate) const DMIN_AT: usize = ROWS * 4;
pub(crate) const SC_AT: usize = 2 * ROWS * 4;
pub(crate) const MN_AT: usize = SC_AT + 8 * ROWS * 4;
const CODES_AT: usize = MN_AT + 4 * ROWS * 4;
/// Bytes of one super-block of a panel.
pub const BLOCK_BYTES: usize = CODES_AT + QK_K * ROWS;

/// One super-block of an activation column: the scale, the sums of the 8 sub-blocks as i16
/// pairs (sub-blocks 2p, 2p + 1 in dword p), the 256 values.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ActBlockK {
    pub d: f32,
    pub bs: [u32; 4],
    pub qs: [i8; QK_K],
}
const _: () = assert!(size_of::<ActBlockK>() == 276);

pub fn panel_bytes(nb: usize) -> usize {
    nb * BLOCK_BYTES
}

/// Offset of code group g (4 values) of sub-block s in a panel super-block.
pub(crate) const fn codes_at(s: usize, g: usize) -> usize {
    CODES_AT + (s * 8 + g) * ROWS * 4
}

/// The `nb` Q8_K blocks at `y` as `ActBlockK`s at `dst`.
///
/// # Safety
/// `y` must point to `nb` readable Q8_K blocks (4-byte aligned), `dst` to room for `nb`
/// `ActBlockK`s (4-byte aligned).
pub unsafe fn act_row(nb: usize, y: *const u8, dst: *mut u8) {
    let (y, dst) = (y as *const BlockQ8K, dst as *mut ActBlockK);
    for b in 0..nb {
        let by = &*y.add(b);
        let sum = |s: usize| (by.bsums[2 * s] as i32 + by.bsums[2 * s + 1] as i32) as i16 as u16;
        let pair = |p: usize| sum(2 * p) as u32 | (sum(2 * p + 1) as u32) << 16;
        *dst.add(b) = ActBlockK {
            d: by.d,
            bs: [pair(0), pair(1), pair(2), pair(3)],
            qs: by.qs,
        };
    }
}

/// Code of element e (0..256) of a Q4_K super-block.
fn code(bx: &BlockQ4K, e: usize) -> u8 {
    let (j, l) = (e / 64, e % 64);
    if l < 32 {
        bx.qs[32 * j + l] & 0x0f
    } else {
        bx.qs[32 * j + l - 32] >> 4
    }
}

/// Scales, mins, d and dmin of `rows` rows of super-block b (zeros past `rows`).
unsafe fn pack_scales(b: usize, w: *const u8, ws: usize, rows: usize, pb: *mut u8) {
    for r in 0..ROWS {
        let bx = (r < rows).then(|| &*(w.add(r * ws) as *const BlockQ4K).add(b));
        let (sc, mn) = bx.map_or(([0; 8], [0; 8]), |bx| unpack_scales(&bx.scales));
        *(pb as *mut f32).add(r) = bx.map_or(0.0, |bx| f16_to_f32(bx.d));
        *(pb.add(DMIN_AT) as *mut f32).add(r) = bx.map_or(0.0, |bx| f16_to_f32(bx.dmin));
        for (s, &v) in sc.iter().enumerate() {
            *(pb.add(SC_AT) as *mut i32).add(s * ROWS + r) = v as i32;
        }
        for p in 0..4 {
            *(pb.add(MN_AT) as *mut u32).add(p * ROWS + r) =
                mn[2 * p] as u32 | (mn[2 * p + 1] as u32) << 16;
        }
    }
}

/// Packs `rows` ≤ 16 Q4_K rows of `nb` super-blocks (`w`, `ws` bytes apart) into the panel at
/// `dst`; rows past `rows` get zeros. Plain version of `avx512::pack`.
///
/// # Safety
/// `w` must point to `rows` readable rows of `nb` Q4_K blocks, `dst` to `panel_bytes(nb)`
/// writable bytes (4-byte aligned).
pub unsafe fn pack_ref(nb: usize, w: *const u8, ws: usize, rows: usize, dst: *mut u8) {
    for b in 0..nb {
        let pb = dst.add(b * BLOCK_BYTES);
        pack_scales(b, w, ws, rows, pb);
        for r in 0..ROWS {
            let bx = (r < rows).then(|| &*(w.add(r * ws) as *const BlockQ4K).add(b));
            for e in 0..QK_K {
                let (s, g, t) = (e / 32, (e % 32) / 4, e % 4);
                *pb.add(codes_at(s, g) + r * 4 + t) = bx.map_or(0, |bx| code(bx, e));
            }
        }
    }
}

/// Results of a panel times `cols` columns (column c's super-blocks at `act + c * acs` bytes):
/// row r of column c to `out + r * 4 + c * os` (bytes), for r < `rows`.
///
/// # Safety
/// `panel` must hold `nb` packed super-blocks, each column `nb` `ActBlockK`s (4-byte
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
        let ya = act.add(c * acs) as *const ActBlockK;
        for r in 0..rows {
            let (mut acc, mut accm) = (0f32, 0f32);
            for b in 0..nb {
                let pb = panel.add(b * BLOCK_BYTES);
                let a = &*ya.add(b);
                let lane = |at: usize| *(pb.add(at) as *const i32).add(r);
                for p in 0..4 {
                    let mut t = 0i32;
                    for s in [2 * p, 2 * p + 1] {
                        let mut dot = 0i32;
                        for e in 0..32 {
                            let u = *pb.add(codes_at(s, e / 4) + r * 4 + e % 4);
                            dot += u as i32 * a.qs[32 * s + e] as i32;
                        }
                        t += lane(SC_AT + s * ROWS * 4) * dot;
                    }
                    let dx = f32::from_bits(lane(0) as u32);
                    acc = (t as f32).mul_add(dx * a.d, acc);
                    let (m, bs) = (lane(MN_AT + p * ROWS * 4) as u32, a.bs[p]);
                    let im = (m & 0xffff) as i32 * (bs as u16 as i16) as i32
                        + (m >> 16) as i32 * ((bs >> 16) as u16 as i16) as i32;
                    let dmin = f32::from_bits(lane(DMIN_AT) as u32);
                    accm = (im as f32).mul_add(dmin * a.d, accm);
                }
            }
            *(out.add(r * 4 + c * os) as *mut f32) = acc - accm;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::*;
    use crate::cpu::quants::panel::avx512::{f16_lanes, transpose16x4};
    use std::arch::x86_64::*;

    /// `pack_ref` for a full panel, the codes through `transpose16x4` (each 16-byte half of a
    /// 32-byte chunk gives 4 code groups of two sub-blocks); partial panels take `pack_ref`.
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
            let base = w.add(b * size_of::<BlockQ4K>());
            let pb = dst.add(b * BLOCK_BYTES);
            pack_scales(b, w, ws, rows, pb);
            _mm512_storeu_ps(pb as *mut f32, f16_lanes(base, ws));
            _mm512_storeu_ps(pb.add(DMIN_AT) as *mut f32, f16_lanes(base.add(2), ws));
            for j in 0..4 {
                for h in 0..2 {
                    let q = transpose16x4(base.add(16 + 32 * j + 16 * h), ws);
                    for (i, q) in q.into_iter().enumerate() {
                        let g = 4 * h + i;
                        let put = |s: usize, v: __m512i| {
                            _mm512_storeu_si512(pb.add(codes_at(s, g)) as *mut _, v)
                        };
                        put(2 * j, _mm512_and_si512(q, lo));
                        put(2 * j + 1, _mm512_and_si512(_mm512_srli_epi16::<4>(q), lo));
                    }
                }
            }
        }
    }

    /// `kernel_ref` for C ≤ `MAX_COLS` columns.
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
        let mut accm = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let pb = panel.add(b * BLOCK_BYTES);
            let a = |c: usize| &*(act.add(c * acs) as *const ActBlockK).add(b);
            for p in 0..4 {
                let mut t = [zero; C];
                for s in [2 * p, 2 * p + 1] {
                    let mut w = [zero; 8];
                    for g in 0..8 {
                        w[g] = _mm512_loadu_si512(pb.add(codes_at(s, g)) as *const _);
                    }
                    let sc = _mm512_loadu_si512(pb.add(SC_AT + s * ROWS * 4) as *const _);
                    for c in 0..C {
                        let q = a(c).qs.as_ptr().add(32 * s) as *const i32;
                        let mut dot = zero;
                        for g in 0..8 {
                            let y = _mm512_set1_epi32(q.add(g).read_unaligned());
                            dot = _mm512_dpbusd_epi32(dot, w[g], y);
                        }
                        t[c] = _mm512_add_epi32(t[c], _mm512_mullo_epi32(dot, sc));
                    }
                }
                let dx = _mm512_loadu_ps(pb as *const f32);
                let dmin = _mm512_loadu_ps(pb.add(DMIN_AT) as *const f32);
                let mn = _mm512_loadu_si512(pb.add(MN_AT + p * ROWS * 4) as *const _);
                for c in 0..C {
                    let dy = _mm512_set1_ps(a(c).d);
                    acc[c] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[c]), _mm512_mul_ps(dx, dy), acc[c]);
                    let bs = _mm512_set1_epi32(a(c).bs[p] as i32);
                    let im = _mm512_madd_epi16(mn, bs);
                    accm[c] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dmin, dy), accm[c]);
                }
            }
        }
        let live: __mmask16 = if rows >= ROWS {
            0xffff
        } else {
            (1u16 << rows) - 1
        };
        for c in 0..C {
            _mm512_mask_storeu_ps(
                out.add(c * os) as *mut f32,
                live,
                _mm512_sub_ps(acc[c], accm[c]),
            );
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
    use crate::cpu::quants::{q4_k, q8_k, testutil::data};

    const QK: usize = size_of::<BlockQ4K>();
    const YK: usize = size_of::<BlockQ8K>();

    fn operands(m: usize, n: usize, k: usize, seed: u32) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let nb = k / QK_K;
        let mut w = vec![0u8; m * nb * QK];
        unsafe { q4_k::from_f32(&data(m * k, seed), w.as_mut_ptr()) };
        let mut y = vec![0u32; n * nb * YK / 4];
        unsafe { q8_k::from_f32(&data(n * k, seed + 1), y.as_mut_ptr() as *mut u8) };
        let mut act = vec![0u32; n * nb * size_of::<ActBlockK>() / 4];
        for c in 0..n {
            unsafe {
                act_row(
                    nb,
                    (y.as_ptr() as *const u8).add(c * nb * YK),
                    (act.as_mut_ptr() as *mut u8).add(c * nb * size_of::<ActBlockK>()),
                )
            };
        }
        let y8 =
            unsafe { std::slice::from_raw_parts(y.as_ptr() as *const u8, y.len() * 4) }.to_vec();
        let a8 = unsafe { std::slice::from_raw_parts(act.as_ptr() as *const u8, act.len() * 4) }
            .to_vec();
        (w, y8, a8)
    }

    /// The reference is the pairwise fma sum written out from the blocks, and within rounding
    /// of the one-row dot.
    #[test]
    fn kernel_ref_is_the_pairwise_sum() {
        let (m, n, k) = (18, 2, 512);
        let nb = k / QK_K;
        let (w, y, act) = operands(m, n, k, 3);
        let mut panel = vec![0u32; panel_bytes(nb) / 4];
        let pp = panel.as_mut_ptr() as *mut u8;
        for p in 0..m.div_ceil(ROWS) {
            let rows = (m - p * ROWS).min(ROWS);
            let mut out = vec![f32::NAN; ROWS * n];
            unsafe {
                pack_ref(nb, w.as_ptr().add(p * ROWS * nb * QK), nb * QK, rows, pp);
                let acs = nb * size_of::<ActBlockK>();
                kernel_ref(
                    nb,
                    pp,
                    act.as_ptr(),
                    acs,
                    n,
                    out.as_mut_ptr() as *mut u8,
                    ROWS * 4,
                    rows,
                );
            }
            for c in 0..n {
                for r in 0..rows {
                    let wr = unsafe { w.as_ptr().add((p * ROWS + r) * nb * QK) };
                    let yc = unsafe { y.as_ptr().add(c * nb * YK) };
                    let (mut acc, mut accm) = (0f32, 0f32);
                    for b in 0..nb {
                        let bx = unsafe { &*(wr as *const BlockQ4K).add(b) };
                        let by = unsafe { &*(yc as *const BlockQ8K).add(b) };
                        let (sc, mn) = unpack_scales(&bx.scales);
                        for p in 0..4 {
                            let (mut t, mut im) = (0i32, 0i32);
                            for s in [2 * p, 2 * p + 1] {
                                let dot: i32 = (0..32)
                                    .map(|e| code(bx, 32 * s + e) as i32 * by.qs[32 * s + e] as i32)
                                    .sum();
                                t += sc[s] as i32 * dot;
                                im += mn[s] as i32
                                    * (by.bsums[2 * s] as i32 + by.bsums[2 * s + 1] as i32);
                            }
                            acc = (t as f32).mul_add(f16_to_f32(bx.d) * by.d, acc);
                            accm = (im as f32).mul_add(f16_to_f32(bx.dmin) * by.d, accm);
                        }
                    }
                    let (got, want) = (out[c * ROWS + r], acc - accm);
                    assert_eq!(got.to_bits(), want.to_bits(), "row {r} col {c}");
                    let dot = unsafe { q4_k::vec_dot_ref(k, wr, yc) };
                    assert!(
                        (got - dot).abs() <= 1e-3 * dot.abs().max(1.0),
                        "{got} vs {dot}"
                    );
                }
            }
        }
    }

    /// The AVX-512 pack equals the plain one, the VNNI kernel gives the reference's bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_equals_reference() {
        if !crate::cpu::quants::panel::available() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        for (m, k) in [(16, 256), (20, 768)] {
            let n = 5;
            let nb = k / QK_K;
            let (w, _, act) = operands(m, n, k, 7);
            let acs = nb * size_of::<ActBlockK>();
            for p in 0..m.div_ceil(ROWS) {
                let rows = (m - p * ROWS).min(ROWS);
                let wp = unsafe { w.as_ptr().add(p * ROWS * nb * QK) };
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
                        let y = act.as_ptr().add(acs);
                        kernel_ref(
                            nb,
                            ap,
                            y,
                            acs,
                            cols,
                            want.as_mut_ptr() as *mut u8,
                            ROWS * 4,
                            rows,
                        );
                        avx512::kernel_cols(
                            nb,
                            ap,
                            y,
                            acs,
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
}
