//! MUL_MAT of Q4_0 and Q8_0 weights by many activation columns on AMX tiles (`quants/
//! panel_amx.rs`), where `cpu::amx` found them usable. The activations are quantized once to
//! Q8_0 (as ggml-cpu quantizes them) into groups of 16 columns in the tiles' VNNI layout, shared
//! by the threads; each thread packs 32 weight rows at a time into two panels of its own (from
//! plain rows, or from groups repacked at load) and runs every column over them,
//! its tiles configured before its share and released after.
//!
//! Float order: the VNNI panels' (`panel::kernel_ref`), so Q4_0 results are the panels' bits
//! (and ggml-cpu's repacked Q4_0's); Q8_0 results then sum per block in order instead of in
//! `vec_dot`'s 8 lanes (rounding differs, as ggml's own AMX Q8_0 kernels differ from its
//! `vec_dot`).

use super::Ctx;
use crate::cpu::quants::amx_tiles::Tiles;
use crate::cpu::quants::panel_amx::{self as pa, ROWS};
use crate::cpu::quants::repack_q8_0;
use crate::ggml_types::GgmlType;
use crate::op_shapes::hadamard_len;
use crate::tensor::{split_range, Tensor};

/// Fewest columns the tiles run: one C tile's 16 columns (fewer leave the tile's work partly
/// wasted while packing still costs the same; the VNNI panels and register tiles take them).
const MIN_COLS: usize = 16;

/// Tests and the bench: the VNNI paths instead even where AMX is usable.
#[cfg(test)]
pub(super) static OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the AMX path computes `node` (MUL_MAT's `supports` already holds).
pub fn applies(node: &Tensor) -> bool {
    #[cfg(test)]
    if OFF.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    // Where the VNNI panels would run: ROCMFORGE_GEMM=tiles or a lower instruction set (or
    // ROCMFORGE_SIMD) keeps AMX off too (its epilogue is AVX-512).
    #[cfg(target_arch = "x86_64")]
    let best_isa =
        crate::cpu::quants::tile_isa(false) == Some(crate::cpu::quants::TileIsa::Avx512Vnni);
    #[cfg(not(target_arch = "x86_64"))]
    let best_isa = false;
    shape_applies(node)
        && best_isa
        && crate::tuning::get().gemm.as_deref() != Some("tiles")
        && crate::cpu::amx::used()
}

/// The weight, activation and column conditions of `applies` (what the kernels handle).
fn shape_applies(node: &Tensor) -> bool {
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else {
        return false;
    };
    matches!(w.dtype(), GgmlType::Q4_0 | GgmlType::Q8_0)
        && matches!(x.dtype(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        && node.ne()[1] >= MIN_COLS
        && hadamard_len(node).is_none()
}

/// Bytes of the activation groups of every batch (then 64 for alignment).
fn act_bytes(node: &Tensor) -> usize {
    let x = node.src(1).unwrap();
    let xne = x.ne();
    xne[2] * xne[3] * pa::act_bytes(xne[0] / 32, xne[1])
}

/// Activation groups, then per thread two panels and a scratch for one unpacked repacked group.
pub fn work_size(node: &Tensor, nth: usize) -> usize {
    let w = node.src(0).unwrap();
    let nb = w.ne()[0] / 32;
    let per_thread = 2 * pa::panel_bytes(nb) + 64 + ROWS * w.nb()[1] + 64;
    act_bytes(node) + 64 + nth * per_thread
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    compute_on(
        node,
        ctx,
        &mut crate::cpu::quants::amx_tiles::Hw,
        pa::kernel_amx,
    );
    // `applies` is false there (no AMX): the emulator keeps this total.
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    compute_on(
        node,
        ctx,
        &mut crate::cpu::quants::amx_tiles::Emu::default(),
        pa::kernel,
    );
}

/// A panel's products with `n` columns (`panel_amx::kernel`'s arguments).
type Kernel<T> = unsafe fn(&mut T, usize, *const u8, *const u8, usize, *mut u8, usize, usize);

fn compute_on<T: Tiles>(node: &Tensor, ctx: &Ctx, tiles: &mut T, kernel: Kernel<T>) {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (wne, xne, dne) = (w.ne(), x.ne(), node.ne());
    let k = wne[0];
    let nb = k / 32;
    let rs = w.nb()[1];
    let align = |p: *mut u8| p.wrapping_add(p.align_offset(64));
    let act = align(ctx.wdata);
    let panel_at = align(unsafe { ctx.wdata.add(act_bytes(node) + 64) });
    let my_panel = unsafe { panel_at.add(ctx.ith * (2 * pa::panel_bytes(nb) + 64)) };
    let scratch_at = align(unsafe { panel_at.add(ctx.nth * (2 * pa::panel_bytes(nb) + 64)) });
    let my_scratch = unsafe { scratch_at.add(ctx.ith * (ROWS * rs + 64)) };
    let batch_act = pa::act_bytes(nb, xne[1]);
    let group_bytes = nb * pa::ACT_BYTES;

    // Activations: Q8_0 as ggml-cpu quantizes them (both types' dot type), each column into its
    // lane of its group; the last column of a batch also zeroes the lanes past it.
    let mut tmp = Vec::new();
    let mut q = vec![0u32; GgmlType::Q8_0.row_size(k).div_ceil(4)];
    for r in split_range(x.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, xne[1], xne[2]);
        unsafe {
            let src = x.data().add(x.row_offset(i1, i2, i3));
            let qp = q.as_mut_ptr() as *mut u8;
            super::mul_mat::convert_row(x.dtype(), src, k, GgmlType::Q8_0, qp, &mut tmp);
            let group = act
                .add((i3 * xne[2] + i2) * batch_act)
                .add(i1 / pa::GROUP * group_bytes);
            pa::act_col(nb, qp, group, i1 % pa::GROUP);
            if i1 + 1 == xne[1] {
                for lane in i1 % pa::GROUP + 1..pa::GROUP {
                    pa::act_col(nb, std::ptr::null(), group, lane);
                }
            }
        }
    }
    if !ctx.sync() {
        return;
    }

    let repacked = crate::cpu::repack::is_repacked(&w);
    let (pack, pack_group): (PackFn, GroupFn) = match w.dtype() {
        GgmlType::Q8_0 => (pa::pack_q8_0, pack_group_q8_0),
        _ => (pa::pack_q4_0, pack_group_q4_0),
    };
    let (r2, r3) = (xne[2] / wne[2], xne[3] / wne[3]);
    // Units of two panels (the kernel's 2 × 2 tiles); the last may hold one.
    let units_per = dne[0].div_ceil(2 * ROWS);
    let whole = dne[0] / ROWS;
    let (wnb, dnb) = (w.nb(), node.nb());
    let mb = if repacked {
        crate::cpu::repack::matrix_bytes(&w)
    } else {
        0
    };
    let n = dne[1];
    // SAFETY: `applies` found AMX usable (or `T` is the emulator); the config is the kernel's.
    unsafe { tiles.config(&pa::CONFIG) };
    for u in ctx.chunks(units_per * dne[2] * dne[3]) {
        let p = u % units_per;
        let batch = u / units_per;
        let (i2, i3) = (batch % dne[2], batch / dne[2]);
        let row0 = p * 2 * ROWS;
        let rows = (dne[0] - row0).min(2 * ROWS);
        unsafe {
            // Repacked: a group fills its rows' bytes, so a row's offset · rs is a group's
            // start and the plain tail's.
            let mat = if repacked {
                w.data().add((i2 / r2 + (i3 / r3) * wne[2]) * mb)
            } else {
                w.data().add((i2 / r2) * wnb[2] + (i3 / r3) * wnb[3])
            };
            for h in 0..rows.div_ceil(ROWS) {
                let wp = mat.add((row0 + h * ROWS) * rs);
                let dst = my_panel.add(h * pa::panel_bytes(nb));
                if repacked && 2 * p + h < whole {
                    pack_group(nb, wp, my_scratch, dst);
                } else {
                    pack(nb, wp, rs, (rows - h * ROWS).min(ROWS), dst);
                }
            }
            let acol = act.add((i3 * xne[2] + i2) * batch_act);
            let db = node.data().add(i2 * dnb[2] + i3 * dnb[3] + row0 * 4);
            kernel(tiles, nb, my_panel, acol, n, db, dnb[1], rows);
        }
    }
    unsafe { tiles.release() };
}

/// `panel_amx::pack_q4_0`'s type: blocks, rows, row size, row count, panel.
type PackFn = unsafe fn(usize, *const u8, usize, usize, *mut u8);
/// Packs a group of 16 rows repacked at load: blocks, group, scratch for 16 plain rows, panel.
type GroupFn = unsafe fn(usize, *const u8, *mut u8, *mut u8);

unsafe fn pack_group_q4_0(nb: usize, g: *const u8, _: *mut u8, dst: *mut u8) {
    pa::pack_q4_0_group(nb, g, dst)
}

/// Q8_0 (repacked only with ROCMFORGE_CPU_REPACK=all): back to plain rows, then packed.
unsafe fn pack_group_q8_0(nb: usize, g: *const u8, scratch: *mut u8, dst: *mut u8) {
    repack_q8_0::unrepack(ROWS, nb, g, scratch);
    pa::pack_q8_0(nb, scratch, nb * 34, ROWS, dst)
}

#[cfg(test)]
#[path = "mul_mat_amx_tests.rs"]
mod tests;
