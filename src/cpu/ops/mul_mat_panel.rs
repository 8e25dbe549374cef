//! MUL_MAT of Q4_0, Q4_K and Q6_K weights by many activation columns on AVX-512 VNNI, through
//! weight panels (`quants/panel.rs`, `panel_q4_k.rs`, `panel_q6_k.rs`): the activations are quantized once
//! (Q8_0 / Q8_K, as ggml-cpu quantizes them) and laid out as the kernel reads them, then each
//! thread packs 16 weight rows at a time into its own panel (L2-resident: 258 KiB for Q4_0 at
//! k = 14336) and runs every column over it. Threads split the panels, so 2 and 16 threads get
//! equal shares of the 256 panels of a 4096-row matrix.

use super::Ctx;
use crate::cpu::quants::panel;
#[cfg(target_arch = "x86_64")]
use crate::cpu::quants::{panel_q4_k, panel_q6_k};
use crate::cpu::types::traits;
use crate::ggml_types::GgmlType;
use crate::op_shapes::hadamard_len;
use crate::tensor::{split_range, Tensor};

/// Fewest columns the panels pay off at: packing a panel costs about what 2 columns of the
/// kernel cost; below this the register tiles run.
const MIN_COLS: usize = 4;
/// Q6_K's: ggml-cpu runs Q6_K products of 8 or more columns through its tiled K-quant path,
/// whose order the Q6_K panels take, and fewer through `vec_dot`, whose order the register
/// tiles keep; so every Q6_K product equals ggml-cpu's to the bit.
const Q6_K_MIN_COLS: usize = 8;

pub(super) type Pack = unsafe fn(nb: usize, w: *const u8, ws: usize, rows: usize, dst: *mut u8);
pub(super) type Kernel = unsafe fn(
    nb: usize,
    panel: *const u8,
    act: *const u8,
    acs: usize,
    cols: usize,
    out: *mut u8,
    os: usize,
    rows: usize,
);

/// The panel's `rows` products with each of `n` activation columns (`acs` bytes apart), at most
/// `max_cols` a kernel call; results to `db`, columns `ds` bytes apart.
///
/// # Safety
/// The pointers hold what `kernel` reads and writes for those rows and columns.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panel_columns(
    kernel: Kernel,
    max_cols: usize,
    nb: usize,
    panel: *const u8,
    acol: *const u8,
    acs: usize,
    n: usize,
    db: *mut u8,
    ds: usize,
    rows: usize,
) {
    for j in (0..n).step_by(max_cols) {
        let cols = (n - j).min(max_cols);
        kernel(
            nb,
            panel,
            acol.add(j * acs),
            acs,
            cols,
            db.add(j * ds),
            ds,
            rows,
        );
    }
}

/// What differs between the formats' panels.
struct Format {
    /// Values per block (and per activation block).
    blk: usize,
    /// Bytes of one activation block in the kernel's layout.
    act_block: usize,
    /// Bytes of one panel block.
    panel_block: usize,
    max_cols: usize,
    /// Converts `nb` blocks of the activation type into the kernel's layout.
    act_row: unsafe fn(nb: usize, y: *const u8, dst: *mut u8),
    pack: Pack,
    kernel: Kernel,
}

#[cfg(target_arch = "x86_64")]
fn format(t: GgmlType) -> Option<Format> {
    unsafe fn q4_0_act(nb: usize, y: *const u8, dst: *mut u8) {
        panel::act_row(nb, y, dst as *mut panel::ActBlock)
    }
    #[allow(clippy::too_many_arguments)]
    unsafe fn q4_0_kernel(
        nb: usize,
        p: *const u8,
        act: *const u8,
        acs: usize,
        cols: usize,
        out: *mut u8,
        os: usize,
        rows: usize,
    ) {
        let blocks = acs / size_of::<panel::ActBlock>();
        panel::avx512::kernel_cols(nb, p, act as *const _, blocks, cols, out, os, rows)
    }
    match t {
        GgmlType::Q4_0 => Some(Format {
            blk: 32,
            act_block: size_of::<panel::ActBlock>(),
            panel_block: panel::BLOCK_BYTES,
            max_cols: panel::MAX_COLS,
            act_row: q4_0_act,
            pack: panel::avx512::pack,
            kernel: q4_0_kernel,
        }),
        GgmlType::Q4_K => Some(Format {
            blk: 256,
            act_block: size_of::<panel_q4_k::ActBlockK>(),
            panel_block: panel_q4_k::BLOCK_BYTES,
            max_cols: panel_q4_k::MAX_COLS,
            act_row: panel_q4_k::act_row,
            pack: panel_q4_k::avx512::pack,
            kernel: panel_q4_k::avx512::kernel_cols,
        }),
        GgmlType::Q6_K => Some(Format {
            blk: 256,
            act_block: size_of::<panel_q6_k::ActBlock6>(),
            panel_block: panel_q6_k::BLOCK_BYTES,
            max_cols: panel_q6_k::MAX_COLS,
            act_row: panel_q6_k::act_row,
            pack: panel_q6_k::avx512::pack,
            kernel: panel_q6_k::avx512::kernel_cols,
        }),
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn format(_: GgmlType) -> Option<Format> {
    None
}

/// Whether the panel path computes `node` (MUL_MAT's `supports` already holds).
pub fn applies(node: &Tensor) -> bool {
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else {
        return false;
    };
    // Prompts follow ROCMFORGE_GEMM (`tiles` or a lower instruction set keeps the register
    // tiles). Generation takes the in-place panel product only with ROCMFORGE_GEMV=panel: it
    // gives ggml-cpu's repacked bits but streams 16 rows slower than the tiles' 8 (1B-shaped
    // Q4_0, one thread: tg32 15.8-16.6 against 19.8 t/s; 8B-shaped: 21.6-22.0 against 22.2).
    let gemv = node.ne()[1] < MIN_COLS;
    let tuning = crate::tuning::get();
    if gemv && tuning.gemv.as_deref() != Some("panel") {
        return false;
    }
    let knob = if gemv { &tuning.gemv } else { &tuning.gemm };
    #[cfg(target_arch = "x86_64")]
    let best_isa =
        crate::cpu::quants::tile_isa(gemv) == Some(crate::cpu::quants::TileIsa::Avx512Vnni);
    #[cfg(not(target_arch = "x86_64"))]
    let best_isa = false;
    format(w.dtype()).is_some()
        && (w.dtype() != GgmlType::Q6_K || node.ne()[1] >= Q6_K_MIN_COLS)
        && matches!(x.dtype(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        && (!gemv || direct(&w))
        && hadamard_len(node).is_none()
        && panel::available()
        && best_isa
        && knob.as_deref() != Some("tiles")
}

/// Whether fewer than `MIN_COLS` columns read the weights in place (`panel::avx512::direct`):
/// Q4_0 with whole panels.
fn direct(w: &Tensor) -> bool {
    w.dtype() == GgmlType::Q4_0 && w.ne()[1].is_multiple_of(panel::ROWS)
}

/// Bytes of the converted activations (then 64 for alignment).
fn act_bytes(node: &Tensor, f: &Format) -> usize {
    let x = node.src(1).unwrap();
    x.nrows() * (x.ne()[0] / f.blk) * f.act_block
}

/// Unpacks whole 16-row groups of weights repacked at load back to ggml's rows: rows, blocks
/// per row, from, to (`repack_q6_k::unrepack`).
pub(super) type Unrepack = unsafe fn(usize, usize, *const u8, *mut u8);

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    let f = format(node.src(0).unwrap().dtype()).unwrap();
    let nb = node.src(0).unwrap().ne()[0] / f.blk;
    act_bytes(node, &f) + 64 + nth * (nb * f.panel_block + 64)
}

/// `work_size` plus each thread's scratch for a group's unpacked rows.
pub(super) fn work_size_repacked(node: &Tensor, nth: usize) -> usize {
    work_size(node, nth) + nth * (panel::ROWS * node.src(0).unwrap().nb()[1] + 64)
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    compute_from(node, ctx, None)
}

/// `compute` over weights repacked at load (Q6_K, whose plain path takes these panels): each
/// whole group is unpacked to ggml's rows in the thread's scratch, then packed as plain rows,
/// so the results equal the plain path's to the bit; the rows past the last whole group are in
/// ggml's layout already.
pub(super) fn compute_repacked(node: &Tensor, ctx: &Ctx, unrepack: Unrepack) {
    compute_from(node, ctx, Some(unrepack))
}

fn compute_from(node: &Tensor, ctx: &Ctx, unrepack: Option<Unrepack>) {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let f = format(w.dtype()).unwrap();
    let (wne, xne, dne) = (w.ne(), x.ne(), node.ne());
    let k = wne[0];
    let nb = k / f.blk;
    let align = |p: *mut u8| p.wrapping_add(p.align_offset(64));
    let act = align(ctx.wdata);
    let panel_at = align(unsafe { ctx.wdata.add(act_bytes(node, &f) + 64) });
    let my_panel = unsafe { panel_at.add(ctx.ith * (nb * f.panel_block + 64)) };
    let rs = w.nb()[1];
    let scratch_at = align(unsafe { panel_at.add(ctx.nth * (nb * f.panel_block + 64)) });
    let my_scratch = unsafe { scratch_at.add(ctx.ith * (panel::ROWS * rs + 64)) };
    let acs = nb * f.act_block;

    // Activations: quantized as ggml-cpu quantizes them, then in the kernel's layout.
    let vdt = traits(w.dtype()).unwrap().vec_dot_type;
    let mut tmp = Vec::new();
    let mut q = vec![0u32; vdt.row_size(k).div_ceil(4)];
    for r in split_range(x.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, xne[1], xne[2]);
        unsafe {
            let src = x.data().add(x.row_offset(i1, i2, i3));
            let qp = q.as_mut_ptr() as *mut u8;
            super::mul_mat::convert_row(x.dtype(), src, k, vdt, qp, &mut tmp);
            (f.act_row)(nb, qp, act.add(r * acs));
        }
    }
    if !ctx.sync() {
        return;
    }

    let (r2, r3) = (xne[2] / wne[2], xne[3] / wne[3]);
    let panels = dne[0].div_ceil(panel::ROWS);
    let units = panels * dne[2] * dne[3];
    let (wnb, dnb) = (w.nb(), node.nb());
    let n = dne[1];
    for u in ctx.chunks(units) {
        let p = u % panels;
        let batch = u / panels;
        let (i2, i3) = (batch % dne[2], batch / dne[2]);
        let row0 = p * panel::ROWS;
        let rows = (dne[0] - row0).min(panel::ROWS);
        unsafe {
            let wp = w
                .data()
                .add((i2 / r2) * wnb[2] + (i3 / r3) * wnb[3] + row0 * wnb[1]);
            let acol = act.add((i3 * xne[2] + i2) * xne[1] * acs);
            let db = node.data().add(i2 * dnb[2] + i3 * dnb[3] + row0 * 4);
            #[cfg(target_arch = "x86_64")]
            if n < MIN_COLS {
                let f = [
                    panel::avx512::direct::<1>,
                    panel::avx512::direct::<2>,
                    panel::avx512::direct::<3>,
                ][n - 1];
                f(nb, wp, wnb[1], acol as *const _, nb, db, dnb[1]);
                continue;
            }
            let rows_at = match unrepack {
                Some(unrepack) if rows == panel::ROWS => {
                    unrepack(panel::ROWS, nb, wp, my_scratch);
                    my_scratch as *const u8
                }
                _ => wp,
            };
            (f.pack)(nb, rows_at, rs, rows, my_panel);
            panel_columns(
                f.kernel, f.max_cols, nb, my_panel, acol, acs, n, db, dnb[1], rows,
            );
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::testutil::*;
    use crate::cpu::quants::{f16_to_f32, q4_0::BlockQ4_0, q8_0, q8_0::BlockQ8_0};
    use crate::ggml_types::{op, GgmlType};

    /// dst[i, j] as ggml-cpu's repacked Q4_0 kernels sum it: x rounded to Q8_0, then per block
    /// in order `acc = fma(Σ (q − 8)·y, dx·dy, acc)`.
    pub(in crate::cpu::ops) fn blockwise(w: &TT, x: &TT) -> Vec<f32> {
        blockwise_by(w, x, |bx: &BlockQ4_0, by| {
            let s: i32 = (0..16)
                .map(|t| {
                    ((bx.qs[t] & 15) as i32 - 8) * by.qs[t] as i32
                        + ((bx.qs[t] >> 4) as i32 - 8) * by.qs[t + 16] as i32
                })
                .sum();
            (s, bx.d)
        })
    }

    /// The blockwise sum for weight blocks `B` of 32 values: x rounded to Q8_0, then per block
    /// in order `acc = fma(dot, dx·dy, acc)`, `block_dot` giving the block's integer dot and
    /// its f16 scale.
    pub(in crate::cpu::ops) fn blockwise_by<B>(
        w: &TT,
        x: &TT,
        block_dot: impl Fn(&B, &BlockQ8_0) -> (i32, u16),
    ) -> Vec<f32> {
        let (wne, xne) = (w.ne(), x.ne());
        let nb = wne[0] / 32;
        let wd = w.tensor().data() as *const B;
        let mut y = vec![0u8; xne[1] * xne[2] * nb * 34];
        unsafe { q8_0::from_f32(&x.get(), y.as_mut_ptr()) };
        let y = y.as_ptr() as *const BlockQ8_0;
        let r2 = xne[2] / wne[2];
        let mut out = vec![];
        for i2 in 0..xne[2] {
            for j in 0..xne[1] {
                for i in 0..wne[1] {
                    let mut acc = 0f32;
                    for b in 0..nb {
                        let bx = unsafe { &*wd.add(((i2 / r2) * wne[1] + i) * nb + b) };
                        let by = unsafe { &*y.add((i2 * xne[1] + j) * nb + b) };
                        let (s, dx) = block_dot(bx, by);
                        acc = (s as f32).mul_add(f16_to_f32(dx) * f16_to_f32(by.d), acc);
                    }
                    out.push(acc);
                }
            }
        }
        out
    }

    /// The panel path gives the blockwise sum to the bit: partial panels (37 rows), column
    /// counts over and under the kernel's 8, broadcast batches, F32 and F16 activations, 1 and 3
    /// threads.
    #[test]
    fn panels_give_the_blockwise_sum() {
        for (m, n, k, b2, xt) in [
            (37, 4, 64, 1, GgmlType::F32),
            (32, 1, 64, 2, GgmlType::F32),
            (48, 3, 128, 1, GgmlType::F16),
            (16, 13, 256, 2, GgmlType::F32),
            (40, 9, 96, 1, GgmlType::F16),
        ] {
            for nth in [1, 3] {
                let mut w = TT::new(GgmlType::Q4_0, [k, m, 1, 1]);
                w.set(&rand_vec(k * m, 61, -1.0, 1.0));
                let mut x = TT::new(xt, [k, n, b2, 1]);
                x.set(&rand_vec(k * n * b2, 62, -1.0, 1.0));
                let mut d = TT::new(GgmlType::F32, [m, n, b2, 1]);
                d.op(op::MUL_MAT).src(0, &w).src(1, &x);
                if !super::applies(&d.tensor()) {
                    // No AVX-512 VNNI here, or generation without ROCMFORGE_GEMV=panel (its
                    // kernel: `panel::tests::avx512_equals_reference`).
                    assert!(n < super::MIN_COLS || !crate::cpu::quants::panel::available());
                    continue;
                }
                run(&d, nth);
                let (got, want) = (d.get(), blockwise(&w, &x));
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "m={m} n={n} k={k} b2={b2} nth={nth}");
            }
        }
    }

    /// Q4_K through the panels: within rounding of the one-row dot, the same bits on 1 and 3
    /// threads, partial panels, column counts over and under the kernel's 4.
    #[test]
    fn q4_k_panels_agree_with_the_dot() {
        let (m, n, k) = (37, 11, 512);
        let mut w = TT::new(GgmlType::Q4_K, [k, m, 1, 1]);
        w.set(&rand_vec(k * m, 71, -1.0, 1.0));
        let mut x = TT::new(GgmlType::F32, [k, n, 1, 1]);
        x.set(&rand_vec(k * n, 72, -1.0, 1.0));
        let mut outs = vec![];
        for nth in [1, 3] {
            let mut d = TT::new(GgmlType::F32, [m, n, 1, 1]);
            d.op(op::MUL_MAT).src(0, &w).src(1, &x);
            if !super::applies(&d.tensor()) {
                eprintln!("skipped: no AVX-512 VNNI panels here");
                return;
            }
            run(&d, nth);
            outs.push(d.get());
        }
        let same = outs[0]
            .iter()
            .zip(&outs[1])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "1 and 3 threads differ");
        let nb = k / 256;
        let mut y = vec![0u32; n * nb * 292 / 4];
        let yp = y.as_mut_ptr() as *mut u8;
        unsafe { crate::cpu::quants::q8_k::from_f32(&x.get(), yp) };
        let wd = w.tensor().data();
        for j in 0..n {
            for i in 0..m {
                let want = unsafe {
                    crate::cpu::quants::q4_k::vec_dot_ref(
                        k,
                        wd.add(i * nb * 144),
                        yp.add(j * nb * 292),
                    )
                };
                let got = outs[0][j * m + i];
                assert!(
                    (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "({i}, {j}): {got} vs {want}"
                );
            }
        }
    }

    /// Q6_K through the panels: each result is the super-block sum in the panels' order
    /// (`panel_q6_k`: exact integer sum, then `acc = fma(S·dx, dy, acc)`) to the bit, and within
    /// rounding of the one-row dot; the same on 1 and 3 threads; partial panels (37 rows),
    /// column counts over and under the kernel's 4, a broadcast batch, F16 activations; 7
    /// columns keep the register tiles (ggml-cpu's `vec_dot` order below 8 columns).
    #[test]
    fn q6_k_panels_give_the_super_block_sum() {
        use crate::cpu::quants::{f16_to_f32, q6_k, q8_k, q8_k::BlockQ8K};
        for (m, n, nb, b2, xt) in [
            (37, 11, 2, 1, GgmlType::F32),
            (16, 8, 1, 2, GgmlType::F16),
            (21, 9, 17, 1, GgmlType::F32),
            (16, 7, 1, 1, GgmlType::F32),
        ] {
            let k = nb * 256;
            let mut w = TT::new(GgmlType::Q6_K, [k, m, 1, 1]);
            w.set(&rand_vec(k * m, 73, -1.0, 1.0));
            let mut x = TT::new(xt, [k, n, b2, 1]);
            x.set(&rand_vec(k * n * b2, 74, -1.0, 1.0));
            let mut outs = vec![];
            for nth in [1, 3] {
                let mut d = TT::new(GgmlType::F32, [m, n, b2, 1]);
                d.op(op::MUL_MAT).src(0, &w).src(1, &x);
                if !super::applies(&d.tensor()) {
                    // No AVX-512 VNNI here, or fewer columns than ggml-cpu's tiled path takes.
                    assert!(n < super::Q6_K_MIN_COLS || !crate::cpu::quants::panel::available());
                    break;
                }
                run(&d, nth);
                outs.push(d.get());
            }
            if outs.is_empty() {
                continue;
            }
            let same = outs[0]
                .iter()
                .zip(&outs[1])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "m={m} n={n}: 1 and 3 threads differ");
            let mut y = vec![0u32; b2 * n * nb * 292 / 4];
            let yp = y.as_mut_ptr() as *mut u8;
            unsafe { q8_k::from_f32(&x.get(), yp) };
            let wd = w.tensor().data();
            for j in 0..n * b2 {
                for i in 0..m {
                    let (wr, yc) = unsafe { (wd.add(i * nb * 210), yp.add(j * nb * 292)) };
                    let mut acc = 0f32;
                    for b in 0..nb {
                        let bx = unsafe { &*(wr as *const q6_k::BlockQ6K).add(b) };
                        let by = unsafe { &*(yc as *const BlockQ8K).add(b) };
                        let q = q6_k::codes(bx);
                        let sumi: i32 = (0..256)
                            .map(|e| {
                                bx.scales[e / 16] as i32 * (q[e] as i32 - 32) * by.qs[e] as i32
                            })
                            .sum();
                        acc = (sumi as f32 * f16_to_f32(bx.d)).mul_add(by.d, acc);
                    }
                    let got = outs[0][j * m + i];
                    assert_eq!(got.to_bits(), acc.to_bits(), "m={m} n={n} ({i}, {j})");
                    let dot = unsafe { q6_k::vec_dot_ref(k, wr, yc) };
                    assert!(
                        (got - dot).abs() <= 1e-5 * dot.abs().max(1.0),
                        "({i}, {j}): {got} vs {dot}"
                    );
                }
            }
        }
    }
}
