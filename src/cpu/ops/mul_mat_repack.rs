//! MUL_MAT of Q4_0 and Q4_K weights repacked at load (`cpu/repack.rs`, layouts in
//! `quants/repack_q4_0.rs`, `repack_q4_k.rs`) on AVX-512 VNNI. The activations are quantized
//! once (Q8_0 / Q8_K, as ggml-cpu does) into the panel kernels' layout; threads split the 16-row groups evenly, each
//! streaming its groups' bytes once:
//! - fewer than 4 columns (generation): `repack_q4_0::avx512::gemv` reads the group in place;
//! - more: the group is unpacked into the thread's panel and the panel kernel runs every column
//!   over it (what `mul_mat_panel` does after packing plain rows).
//!
//! The rows past the last whole group are in ggml's layout and go through the panel packing of
//! plain rows, so every row is summed in the same (panel) order.
//!
//! Q8_0, Q6_K and IQ4_NL keep the plain path's order instead: `mul_mat_repack_rows`.

use super::mul_mat_panel::{panel_columns, Kernel, Pack};
use super::Ctx;
use crate::cpu::quants::panel::{self, ROWS};
use crate::cpu::quants::{panel_q4_k as pk, repack_q4_0 as r0, repack_q4_k as rk};
use crate::ggml_types::GgmlType;
use crate::tensor::{split_range, Tensor};

/// Fewest columns the unpacked panel pays off at (as `mul_mat_panel::MIN_COLS`).
const MIN_COLS: usize = 4;

type Gemv = unsafe fn(usize, *const u8, *const u8, usize, usize, *mut u8, usize);
type Unpack = unsafe fn(usize, *const u8, *mut u8);

/// What differs between the repacked formats.
struct Format {
    /// Values per block, the activations' type and the bytes of one of their blocks as the
    /// kernels read them (`act_row` converts a row).
    blk: usize,
    act_type: GgmlType,
    act_block: usize,
    act_row: unsafe fn(usize, *const u8, *mut u8),
    /// Bytes of one block of a repacked group, of a panel.
    group_block: usize,
    panel_block: usize,
    max_cols: usize,
    gemv: Gemv,
    unpack: Unpack,
    /// Panels of the plain rows past the last group.
    pack: Pack,
    kernel: Kernel,
}

fn format(t: GgmlType) -> Format {
    unsafe fn q4_0_act(nb: usize, y: *const u8, dst: *mut u8) {
        panel::act_row(nb, y, dst as *mut panel::ActBlock)
    }
    unsafe fn q4_0_gemv(
        nb: usize,
        g: *const u8,
        a: *const u8,
        acs: usize,
        n: usize,
        o: *mut u8,
        os: usize,
    ) {
        let blocks = acs / size_of::<panel::ActBlock>();
        #[cfg(target_arch = "x86_64")]
        r0::avx512::gemv_cols(nb, g, a as *const _, blocks, n, o, os);
        #[cfg(not(target_arch = "x86_64"))]
        r0::kernel_ref(nb, g, a as *const _, blocks, n, o, os);
    }
    #[allow(clippy::too_many_arguments)]
    unsafe fn q4_0_kernel(
        nb: usize,
        p: *const u8,
        a: *const u8,
        acs: usize,
        n: usize,
        o: *mut u8,
        os: usize,
        rows: usize,
    ) {
        let blocks = acs / size_of::<panel::ActBlock>();
        #[cfg(target_arch = "x86_64")]
        panel::avx512::kernel_cols(nb, p, a as *const _, blocks, n, o, os, rows);
        #[cfg(not(target_arch = "x86_64"))]
        panel::kernel_ref(nb, p, a as *const _, blocks, n, o, os, rows);
    }
    #[cfg(target_arch = "x86_64")]
    let (u0, uk, gk, kk): (Unpack, Unpack, Gemv, Kernel) = (
        r0::avx512::unpack,
        rk::avx512::unpack,
        rk::avx512::gemv_cols,
        pk::avx512::kernel_cols,
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (u0, uk, gk, kk): (Unpack, Unpack, Gemv, Kernel) = (
        r0::unpack_ref,
        rk::unpack_ref,
        rk::kernel_ref,
        pk::kernel_ref,
    );
    match t {
        GgmlType::Q4_K => Format {
            blk: 256,
            act_type: GgmlType::Q8_K,
            act_block: size_of::<pk::ActBlockK>(),
            act_row: pk::act_row,
            group_block: rk::GROUP_BLOCK,
            panel_block: pk::BLOCK_BYTES,
            max_cols: pk::MAX_COLS,
            gemv: gk,
            unpack: uk,
            pack: pk::pack_ref,
            kernel: kk,
        },
        _ => Format {
            blk: 32,
            act_type: GgmlType::Q8_0,
            act_block: size_of::<panel::ActBlock>(),
            act_row: q4_0_act,
            group_block: r0::GROUP_BLOCK,
            panel_block: panel::BLOCK_BYTES,
            max_cols: panel::MAX_COLS,
            gemv: q4_0_gemv,
            unpack: u0,
            pack: panel::pack_ref,
            kernel: q4_0_kernel,
        },
    }
}

fn act_bytes(node: &Tensor, f: &Format) -> usize {
    let x = node.src(1).unwrap();
    x.nrows() * (x.ne()[0] / f.blk) * f.act_block
}

/// Whether `t`'s repacked kernels keep the plain path's order (`mul_mat_repack_rows`) rather
/// than the weight panels'.
fn plain_order(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q8_0 | GgmlType::Q6_K | GgmlType::IQ4_NL)
}

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    let w = node.src(0).unwrap();
    if plain_order(w.dtype()) {
        return super::mul_mat_repack_rows::work_size(node, nth);
    }
    let f = format(w.dtype());
    let nb = w.ne()[0] / f.blk;
    act_bytes(node, &f) + 64 + nth * (nb * f.panel_block + 64)
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    if plain_order(w.dtype()) {
        return super::mul_mat_repack_rows::compute(node, ctx);
    }
    let f = format(w.dtype());
    let (wne, xne, dne) = (w.ne(), x.ne(), node.ne());
    let k = wne[0];
    let nb = k / f.blk;
    let align = |p: *mut u8| p.wrapping_add(p.align_offset(64));
    let act = align(ctx.wdata);
    let panel_at = align(unsafe { ctx.wdata.add(act_bytes(node, &f) + 64) });
    let my_panel = unsafe { panel_at.add(ctx.ith * (nb * f.panel_block + 64)) };
    let acs = nb * f.act_block;

    // Activations: quantized as ggml-cpu quantizes them, then in the kernels' layout.
    let mut tmp = Vec::new();
    let mut q = vec![0u32; f.act_type.row_size(k).div_ceil(4)];
    for r in split_range(x.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, xne[1], xne[2]);
        unsafe {
            let src = x.data().add(x.row_offset(i1, i2, i3));
            let qp = q.as_mut_ptr() as *mut u8;
            super::mul_mat::convert_row(x.dtype(), src, k, f.act_type, qp, &mut tmp);
            (f.act_row)(nb, qp, act.add(r * acs));
        }
    }
    if !ctx.sync() {
        return;
    }

    let (r2, r3) = (xne[2] / wne[2], xne[3] / wne[3]);
    let units_per = dne[0].div_ceil(ROWS);
    let whole = dne[0] / ROWS;
    let (rs, mb) = (w.nb()[1], crate::cpu::repack::matrix_bytes(&w));
    let dnb = node.nb();
    let n = dne[1];
    for u in ctx.chunks(units_per * dne[2] * dne[3]) {
        let p = u % units_per;
        let batch = u / units_per;
        let (i2, i3) = (batch % dne[2], batch / dne[2]);
        let row0 = p * ROWS;
        let rows = (dne[0] - row0).min(ROWS);
        unsafe {
            // Groups first, then the plain rows past them.
            let mat = w.data().add((i2 / r2 + (i3 / r3) * wne[2]) * mb);
            let wp = if p < whole {
                mat.add(p * nb * f.group_block)
            } else {
                mat.add(whole * nb * f.group_block)
            };
            let acol = act.add((i3 * xne[2] + i2) * xne[1] * acs);
            let db = node.data().add(i2 * dnb[2] + i3 * dnb[3] + row0 * 4);
            if p < whole && n < MIN_COLS {
                (f.gemv)(nb, wp, acol, acs, n, db, dnb[1]);
                continue;
            }
            if p < whole {
                (f.unpack)(nb, wp, my_panel);
            } else {
                (f.pack)(nb, wp, rs, rows, my_panel);
            }
            panel_columns(
                f.kernel, f.max_cols, nb, my_panel, acol, acs, n, db, dnb[1], rows,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::cpu::quants::panel;
    use crate::ggml_types::{op, GgmlType};

    /// The product over a repacked copy of the weights gives the bits of the product over the
    /// plain ones in the panels' order (`ROCMFORGE_GEMV=panel`'s and the prompt panels'): rows
    /// not a multiple of 16, one block, odd column counts, broadcast batches, 1 and 3 threads.
    #[test]
    fn repacked_equals_the_plain_panel_order() {
        if !panel::available() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        for (m, n, k, b2) in [
            (16, 1, 32, 1),
            (37, 1, 64, 2),
            (32, 3, 96, 1),
            (19, 2, 32, 1),
            (48, 5, 256, 2),
            (7, 1, 128, 1),
            (40, 9, 64, 1),
        ] {
            let mut w = TT::new(GgmlType::Q4_0, [k, m, 1, 1]);
            w.set(&rand_vec(k * m, 81, -1.0, 1.0));
            let mut x = TT::new(GgmlType::F32, [k, n, b2, 1]);
            x.set(&rand_vec(k * n * b2, 82, -1.0, 1.0));
            // The plain reference: the blockwise panel order, written out.
            let want = super::super::mul_mat_panel::tests::blockwise(&w, &x);

            let wr = TT::new(GgmlType::Q4_0, [k, m, 1, 1]);
            unsafe {
                crate::cpu::quants::repack_q4_0::repack(
                    m,
                    k / 32,
                    w.tensor().data(),
                    wr.tensor().data(),
                );
                crate::cpu::repack::set_mark(wr.tensor().as_ptr());
            }
            for nth in [1, 3] {
                let mut d = TT::new(GgmlType::F32, [m, n, b2, 1]);
                d.op(op::MUL_MAT).src(0, &wr).src(1, &x);
                run(&d, nth);
                let got = d.get();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "m={m} n={n} k={k} b2={b2} nth={nth}");
            }
        }
    }
    /// Q4_K: the product over a repacked copy gives the bits of the Q4_K panels over the plain
    /// rows (`panel_q4_k::pack_ref` + `kernel_ref`, the order the prompt panels sum in), for
    /// rows not a multiple of 16, one super-block, 1 to 5 columns, 1 and 3 threads.
    #[test]
    fn repacked_q4_k_equals_the_panel_order() {
        use crate::cpu::quants::{panel_q4_k as pk, q8_k, repack_q4_k as rk};
        if !panel::available() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        for (m, n, k) in [
            (16, 1, 256),
            (37, 1, 512),
            (21, 3, 256),
            (48, 2, 768),
            (19, 5, 512),
        ] {
            let nb = k / 256;
            let mut w = TT::new(GgmlType::Q4_K, [k, m, 1, 1]);
            w.set(&rand_vec(k * m, 91, -1.0, 1.0));
            let mut x = TT::new(GgmlType::F32, [k, n, 1, 1]);
            x.set(&rand_vec(k * n, 92, -1.0, 1.0));
            // The reference: activations as Q8_K, each 16-row panel packed from the plain rows.
            let mut y = vec![0u32; n * nb * 292 / 4];
            unsafe { q8_k::from_f32(&x.get(), y.as_mut_ptr() as *mut u8) };
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
            let mut want = vec![0f32; m * n];
            let mut pnl = vec![0u32; pk::panel_bytes(nb) / 4];
            for p in 0..m.div_ceil(16) {
                let rows = (m - 16 * p).min(16);
                unsafe {
                    let wp = w.tensor().data().add(16 * p * nb * 144);
                    pk::pack_ref(nb, wp, nb * 144, rows, pnl.as_mut_ptr() as *mut u8);
                    pk::kernel_ref(
                        nb,
                        pnl.as_ptr() as *const u8,
                        a.as_ptr() as *const u8,
                        nb * 276,
                        n,
                        want.as_mut_ptr().add(16 * p) as *mut u8,
                        m * 4,
                        rows,
                    );
                }
            }
            // Room for the repacked layout (larger than ggml's: unpacked scales).
            let wr = TT::strided(
                GgmlType::Q4_K,
                [k, m, 1, 1],
                [144, nb * 144, m * nb * 144, m * nb * 144],
                rk::repacked_bytes(m, nb),
            );
            unsafe {
                rk::repack(m, nb, w.tensor().data(), wr.tensor().data());
                crate::cpu::repack::set_mark(wr.tensor().as_ptr());
            }
            for nth in [1, 3] {
                let mut d = TT::new(GgmlType::F32, [m, n, 1, 1]);
                d.op(op::MUL_MAT).src(0, &wr).src(1, &x);
                run(&d, nth);
                let got = d.get();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "m={m} n={n} k={k} nth={nth}");
            }
        }
    }
    /// One-column product speed, plain weights (the register tiles) against repacked ones, on
    /// 8B-class shapes (4096 × 14336, 33 MB of Q4_0, Q4_K or IQ4_NL, 62 MB of Q8_0, 48 MB of
    /// Q6_K, read from memory each time: 4 such matrices in turn), best of 15 interleaved rounds,
    /// 1 and 2 threads:
    /// `cargo test --release -- --ignored bench_repack_gemv --nocapture`. Prints GB/s of weights.
    #[test]
    #[ignore]
    fn bench_repack_gemv() {
        use crate::cpu::backend::CpuBackend;
        use crate::device::Backend;
        use std::time::Instant;
        if !panel::available() {
            return;
        }
        let (k, m, mats) = (4096, 14336, 4);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q8_0,
            GgmlType::Q6_K,
            GgmlType::IQ4_NL,
        ] {
            let mut x = TT::new(GgmlType::F32, [k, 1, 1, 1]);
            x.set(&rand_vec(k, 3, -1.0, 1.0));
            let (mut plain, mut packed) = (vec![], vec![]);
            for i in 0..mats {
                let mut w = TT::new(ty, [k, m, 1, 1]);
                w.set(&rand_vec(k * m, 10 + i as u32, -1.0, 1.0));
                let nb = k / ty.block_size();
                let bytes =
                    crate::cpu::quants::repack_q4_k::repacked_bytes(m, nb).max(w.tensor().nbytes());
                let rs = ty.row_size(k);
                let wr = TT::strided(
                    ty,
                    [k, m, 1, 1],
                    [ty.type_size(), rs, m * rs, m * rs],
                    bytes,
                );
                unsafe {
                    let (s, d) = (w.tensor().data(), wr.tensor().data());
                    if ty == GgmlType::Q4_K {
                        crate::cpu::quants::repack_q4_k::repack(m, nb, s, d);
                    } else if ty == GgmlType::Q8_0 {
                        crate::cpu::quants::repack_q8_0::repack(m, nb, s, d);
                    } else if ty == GgmlType::Q6_K {
                        crate::cpu::quants::repack_q6_k::repack(m, nb, s, d);
                    } else if ty == GgmlType::IQ4_NL {
                        crate::cpu::quants::repack_iq4_nl::repack(m, nb, s, d);
                    } else {
                        crate::cpu::quants::repack_q4_0::repack(m, nb, s, d);
                    }
                    crate::cpu::repack::set_mark(wr.tensor().as_ptr());
                }
                plain.push(w);
                packed.push(wr);
            }
            for nth in [1, 2] {
                let mut be = CpuBackend::new(nth).unwrap();
                let mut best = [f64::MAX; 2];
                for _ in 0..15 {
                    for (v, ws) in [&plain, &packed].into_iter().enumerate() {
                        let nodes: Vec<TT> = ws
                            .iter()
                            .map(|w| {
                                let mut d = TT::new(GgmlType::F32, [m, 1, 1, 1]);
                                d.op(op::MUL_MAT).src(0, w).src(1, &x);
                                d
                            })
                            .collect();
                        let t = Instant::now();
                        for d in &nodes {
                            be.compute(&[d.tensor()]).unwrap();
                        }
                        best[v] = best[v].min(t.elapsed().as_secs_f64());
                    }
                }
                let gb = (mats * m * ty.row_size(k)) as f64 / 1e9;
                eprintln!(
                    "{ty:?} {nth} thread(s): plain {:.1} GB/s, repacked {:.1} GB/s ({:.2}x)",
                    gb / best[0],
                    gb / best[1],
                    best[0] / best[1]
                );
            }
        }
    }
}
