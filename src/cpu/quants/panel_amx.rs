//! Prompt products of Q4_0 and Q8_0 weights on AMX tiles (`amx-int8`), through weight panels of
//! 16 rows as `panel.rs` packs them for VNNI, and in the same float order, so a Q4_0 result is
//! `panel::kernel_ref`'s to the bit: per 32-value block one `tdpbssd` of a 16-row × 32-byte
//! weight tile (signed codes: q − 8 for Q4_0, q for Q8_0) by 16 activation columns (Q8_0 codes
//! in VNNI layout: 8 rows × 64 bytes) into a zeroed 16 × 16 int32 tile, then per (row, column)
//! `acc = fma(float(C), dx·dy, acc)` in block order (the integer sums are exact).
//!
//! Up to 4 column groups share each weight tile load (C tiles tmm0..tmm3, A tmm4, B tmm5..tmm7).
//! The kernels are generic over `amx_tiles::Tiles`: `Emu` runs them anywhere (the tests),
//! `Hw` on Sapphire Rapids and later.

use super::amx_tiles::Tiles;
use super::f16_to_f32;
use super::q4_0::BlockQ4_0;
use super::q8_0::BlockQ8_0;

/// Weight rows per panel (one C tile's rows) and activation columns per group (its columns).
pub const ROWS: usize = 16;
pub const GROUP: usize = 16;
/// Bytes of one panel block: 16 f32 row scales, then each row's 32 signed codes in turn.
pub const BLOCK_BYTES: usize = ROWS * 4 + ROWS * 32;
/// Bytes of one activation block of a group: 16 f32 column scales, then the codes in VNNI
/// layout (row k, column c: values 4k .. 4k + 3 of column c at 64 + 64k + 4c).
pub const ACT_BYTES: usize = GROUP * 4 + 8 * 64;

/// The tile shapes: C tiles 0..3 (16 × 64 bytes), A tiles 4, 5 (16 × 32), B tiles 6, 7 (8 × 64).
pub const CONFIG: [u8; 64] = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        let (rows, colsb) = match t {
            0..=3 => (16, 64),
            4 | 5 => (16, 32),
            _ => (8, 64),
        };
        c[16 + 2 * t] = colsb;
        c[48 + t] = rows;
        t += 1;
    }
    c
};

pub fn panel_bytes(nb: usize) -> usize {
    nb * BLOCK_BYTES
}

/// Bytes of the activations of `n` columns of `nb` blocks (whole groups).
pub fn act_bytes(nb: usize, n: usize) -> usize {
    n.div_ceil(GROUP) * nb * ACT_BYTES
}

/// The 16 f16 scales `h` as the f32 row scales of the panel block at `pb` (one vector
/// conversion where the CPU has one: a conversion call per row cost a fifth of the packing).
///
/// # Safety
/// `pb` must be 64 writable bytes, 4-byte aligned.
#[inline(always)]
unsafe fn put_scales(h: &[u16; ROWS], pb: *mut u8) {
    use half::slice::HalfFloatSliceExt;
    let h: &[half::f16; ROWS] = &*(h as *const [u16; ROWS] as *const [half::f16; ROWS]);
    h.convert_to_f32_slice(std::slice::from_raw_parts_mut(pb as *mut f32, ROWS));
}

/// Row r's 16 Q4_0 code bytes `qs` as 32 signed codes (q − 8) at `dst`, element order: low
/// nibble of byte e for e < 16, else high nibble of byte e − 16.
#[inline(always)]
fn put_q4_0_codes(qs: &[u8; 16], dst: &mut [i8; 32]) {
    for j in 0..16 {
        dst[j] = (qs[j] & 0x0f) as i8 - 8;
        dst[j + 16] = (qs[j] >> 4) as i8 - 8;
    }
}

/// Packs `rows` ≤ 16 Q4_0 rows of `nb` blocks (`w`, `ws` bytes apart) into the panel at `dst`;
/// rows from `rows` to 16 get zero codes and scales.
///
/// # Safety
/// `w` must point to `rows` readable rows of `nb` Q4_0 blocks, `dst` to `panel_bytes(nb)`
/// writable bytes (4-byte aligned).
// r addresses the row, its scale and its codes together.
#[allow(clippy::needless_range_loop)]
pub unsafe fn pack_q4_0(nb: usize, w: *const u8, ws: usize, rows: usize, dst: *mut u8) {
    for b in 0..nb {
        let pb = dst.add(b * BLOCK_BYTES);
        let mut h = [0u16; ROWS];
        for r in 0..ROWS {
            let codes = &mut *(pb.add(ROWS * 4 + r * 32) as *mut [i8; 32]);
            if r >= rows {
                codes.fill(0);
                continue;
            }
            let bx = &*(w.add(r * ws) as *const BlockQ4_0).add(b);
            h[r] = bx.d;
            put_q4_0_codes(&bx.qs, codes);
        }
        put_scales(&h, pb);
    }
}

/// `pack_q4_0` of a group of 16 Q4_0 rows repacked at load (`repack_q4_0`'s layout: per block
/// the 16 f16 scales, then dword q of row r at 32 + 64·q + 4·r), without unpacking it first.
///
/// # Safety
/// `g` must hold a repacked group of `nb` blocks, `dst` `panel_bytes(nb)` writable bytes
/// (4-byte aligned).
pub unsafe fn pack_q4_0_group(nb: usize, g: *const u8, dst: *mut u8) {
    for b in 0..nb {
        let (gb, pb) = (
            g.add(b * super::repack_q4_0::GROUP_BLOCK),
            dst.add(b * BLOCK_BYTES),
        );
        for r in 0..ROWS {
            let mut qs = [0u8; 16];
            for q in 0..4 {
                let at = gb.add(ROWS * 2 + 64 * q + 4 * r);
                std::ptr::copy_nonoverlapping(at, qs.as_mut_ptr().add(4 * q), 4);
            }
            put_q4_0_codes(&qs, &mut *(pb.add(ROWS * 4 + r * 32) as *mut [i8; 32]));
        }
        put_scales(&(gb as *const [u16; ROWS]).read_unaligned(), pb);
    }
}

/// `pack_q4_0` for Q8_0 rows (the codes as they are).
///
/// # Safety
/// As `pack_q4_0`, with Q8_0 rows.
// r addresses the row, its scale and its codes together.
#[allow(clippy::needless_range_loop)]
pub unsafe fn pack_q8_0(nb: usize, w: *const u8, ws: usize, rows: usize, dst: *mut u8) {
    for b in 0..nb {
        let pb = dst.add(b * BLOCK_BYTES);
        let mut h = [0u16; ROWS];
        for r in 0..ROWS {
            let codes = pb.add(ROWS * 4 + r * 32) as *mut i8;
            if r >= rows {
                std::ptr::write_bytes(codes, 0, 32);
                continue;
            }
            let bx = &*(w.add(r * ws) as *const BlockQ8_0).add(b);
            h[r] = bx.d;
            std::ptr::copy_nonoverlapping(bx.qs.as_ptr(), codes, 32);
        }
        put_scales(&h, pb);
    }
}

/// The `nb` Q8_0 blocks of one activation column at `y` into lane `lane` of the group at `dst`
/// (block b at `dst + b · ACT_BYTES`); `y` null: a zero column (padding past the last one).
///
/// # Safety
/// `y` must be null or point to `nb` readable Q8_0 blocks, `dst` to `nb · ACT_BYTES` writable
/// bytes (4-byte aligned); `lane` < 16.
pub unsafe fn act_col(nb: usize, y: *const u8, dst: *mut u8, lane: usize) {
    for b in 0..nb {
        let db = dst.add(b * ACT_BYTES);
        let (d, qs) = if y.is_null() {
            (0.0, [0i8; 32])
        } else {
            let by = &*(y as *const BlockQ8_0).add(b);
            (f16_to_f32(by.d), by.qs)
        };
        *(db as *mut f32).add(lane) = d;
        for k in 0..8 {
            let at = db.add(GROUP * 4 + k * 64 + 4 * lane) as *mut i8;
            std::ptr::copy_nonoverlapping(qs.as_ptr().add(4 * k), at, 4);
        }
    }
}

/// One block's C tiles for `R` panels (A tiles 4, 5 loaded) by `G` column groups: R = 1: up to
/// 4 groups, C tile g, B tiles 6 and 7 in turn; R = 2: up to 2 groups, C tile 2h + g for panel
/// h, B tile 6 + g. Zeroed, multiplied, stored to `cbuf` (C tile i at 256·i i32, row-major
/// 16 × 16).
///
/// # Safety
/// The tiles configured with `CONFIG`, tiles 4 (and 5 for R = 2) holding the block's weights;
/// `act` at the block's first group, groups `gs` bytes apart.
#[inline(always)]
unsafe fn block_tiles<T: Tiles, const R: usize, const G: usize>(
    t: &mut T,
    act: *const u8,
    gs: usize,
    cbuf: *mut i32,
) {
    let b = |g: usize| act.add(g * gs + GROUP * 4);
    let c = |i: usize| cbuf.add(i * 256) as *mut u8;
    if R == 2 {
        t.zero::<0>();
        t.zero::<2>();
        t.load::<6>(b(0), 64);
        t.dpbssd::<0, 4, 6>();
        t.dpbssd::<2, 5, 6>();
        if G > 1 {
            t.zero::<1>();
            t.zero::<3>();
            t.load::<7>(b(1), 64);
            t.dpbssd::<1, 4, 7>();
            t.dpbssd::<3, 5, 7>();
        }
        t.store::<0>(c(0), 64);
        t.store::<2>(c(2), 64);
        if G > 1 {
            t.store::<1>(c(1), 64);
            t.store::<3>(c(3), 64);
        }
        return;
    }
    t.zero::<0>();
    t.load::<6>(b(0), 64);
    t.dpbssd::<0, 4, 6>();
    if G > 1 {
        t.zero::<1>();
        t.load::<7>(b(1), 64);
        t.dpbssd::<1, 4, 7>();
    }
    if G > 2 {
        t.zero::<2>();
        t.load::<6>(b(2), 64);
        t.dpbssd::<2, 4, 6>();
    }
    if G > 3 {
        t.zero::<3>();
        t.load::<7>(b(3), 64);
        t.dpbssd::<3, 4, 7>();
    }
    t.store::<0>(c(0), 64);
    if G > 1 {
        t.store::<1>(c(1), 64);
    }
    if G > 2 {
        t.store::<2>(c(2), 64);
    }
    if G > 3 {
        t.store::<3>(c(3), 64);
    }
}

#[repr(C, align(64))]
struct Aligned<T>(T);

/// The products of `R` panels (the second `nb · BLOCK_BYTES` after the first) with `G` groups
/// of columns: `cols` (≤ 16·G, > 16·(G − 1)) columns, of which row r (of the R·16) of column c
/// goes to `out + r · 4 + c · os` for r < `rows`.
///
/// # Safety
/// The tiles configured with `CONFIG` (AMX usable, for `Hw`); `panel` holds R panels of `nb`
/// packed blocks, `act` `G` groups of `nb` blocks each; `out` writable at every result's place.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
// The indices address the scales, the C tiles and the accumulators together.
#[allow(clippy::needless_range_loop)]
unsafe fn kernel_tiles<T: Tiles, const R: usize, const G: usize>(
    t: &mut T,
    nb: usize,
    panel: *const u8,
    act: *const u8,
    cols: usize,
    out: *mut u8,
    os: usize,
    rows: usize,
) {
    // C tile of panel h and group g: R = 1: g; R = 2: 2h + g.
    let tile = |h: usize, g: usize| if R == 2 { 2 * h + g } else { g };
    // Cache-line aligned: the tile rows stored and the accumulator rows are 64-byte vectors.
    let mut acc = Aligned([[0f32; ROWS * GROUP]; 4]);
    let mut cbuf = Aligned([[0i32; ROWS * GROUP]; 4]);
    let (acc, cbuf) = (&mut acc.0, &mut cbuf.0);
    let gs = nb * ACT_BYTES;
    let ps = nb * BLOCK_BYTES;
    for b in 0..nb {
        let pb = panel.add(b * BLOCK_BYTES);
        t.load::<4>(pb.add(ROWS * 4), 32);
        if R == 2 {
            t.load::<5>(pb.add(ps + ROWS * 4), 32);
        }
        let ab = act.add(b * ACT_BYTES);
        block_tiles::<T, R, G>(t, ab, gs, cbuf.as_mut_ptr() as *mut i32);
        for h in 0..R {
            let dx = &*(pb.add(h * ps) as *const [f32; ROWS]);
            for g in 0..G {
                let dy = &*(ab.add(g * gs) as *const [f32; GROUP]);
                let (acc, cb) = (&mut acc[tile(h, g)], &cbuf[tile(h, g)]);
                for r in 0..ROWS {
                    for c in 0..GROUP {
                        let i = r * GROUP + c;
                        acc[i] = (cb[i] as f32).mul_add(dx[r] * dy[c], acc[i]);
                    }
                }
            }
        }
    }
    for h in 0..R {
        for g in 0..G {
            let acc = &acc[tile(h, g)];
            for c in 0..GROUP.min(cols - g * GROUP) {
                let o = out.add((g * GROUP + c) * os + h * ROWS * 4) as *mut f32;
                for r in 0..ROWS.min(rows - h * ROWS) {
                    *o.add(r) = acc[r * GROUP + c];
                }
            }
        }
    }
}

/// The products of `rows` ≤ 32 weight rows (one panel, or two: the second `nb · BLOCK_BYTES`
/// after the first, from 17 rows) with `n` activation columns (groups `nb · ACT_BYTES` apart
/// from `act`): row r of column c to `out + r · 4 + c · os`. Two panels run 2 × 2 C tiles
/// (32 columns a pass), one panel 1 × 4 (64 columns a pass).
///
/// # Safety
/// As `kernel_tiles`, for every group of the `n` columns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn kernel<T: Tiles>(
    t: &mut T,
    nb: usize,
    panel: *const u8,
    act: *const u8,
    n: usize,
    out: *mut u8,
    os: usize,
    rows: usize,
) {
    let per = if rows > ROWS { 2 * GROUP } else { 4 * GROUP };
    for j in (0..n).step_by(per) {
        let cols = (n - j).min(per);
        let a = act.add(j / GROUP * nb * ACT_BYTES);
        let o = out.add(j * os);
        match (rows > ROWS, cols.div_ceil(GROUP)) {
            (true, 1) => kernel_tiles::<T, 2, 1>(t, nb, panel, a, cols, o, os, rows),
            (true, _) => kernel_tiles::<T, 2, 2>(t, nb, panel, a, cols, o, os, rows),
            (false, 1) => kernel_tiles::<T, 1, 1>(t, nb, panel, a, cols, o, os, rows),
            (false, 2) => kernel_tiles::<T, 1, 2>(t, nb, panel, a, cols, o, os, rows),
            (false, 3) => kernel_tiles::<T, 1, 3>(t, nb, panel, a, cols, o, os, rows),
            (false, _) => kernel_tiles::<T, 1, 4>(t, nb, panel, a, cols, o, os, rows),
        }
    }
}

/// `kernel` on the AMX instructions, its float epilogue on AVX-512 (every AMX CPU has it).
///
/// # Safety
/// As `kernel`; AMX usable (`amx::available`) and the calling thread's tiles configured with
/// `CONFIG` (`amx_tiles::Hw::config`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn kernel_amx(
    t: &mut super::amx_tiles::Hw,
    nb: usize,
    panel: *const u8,
    act: *const u8,
    n: usize,
    out: *mut u8,
    os: usize,
    rows: usize,
) {
    kernel(t, nb, panel, act, n, out, os, rows)
}

#[cfg(test)]
#[path = "panel_amx_tests.rs"]
mod tests;
