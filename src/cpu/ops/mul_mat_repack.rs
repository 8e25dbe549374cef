//! MUL_MAT of Q4_0 weights repacked at load (`cpu/repack.rs`, layout in
//! `quants/repack_q4_0.rs`) on AVX-512 VNNI. The activations are quantized once (Q8_0, as
//! ggml-cpu does) into the panel kernels' layout; threads split the 16-row groups evenly, each
//! streaming its groups' bytes once:
//! - fewer than 4 columns (generation): `repack_q4_0::avx512::gemv` reads the group in place;
//! - more: the group is unpacked into the thread's panel and `panel::avx512::kernel_cols` runs
//!   every column over it (what `mul_mat_panel` does after packing plain rows).
//!
//! The rows past the last whole group are in ggml's layout and go through the panel packing of
//! plain rows, so every row is summed in the same (panel) order.

use super::Ctx;
use crate::cpu::quants::panel::{self, ActBlock, ROWS};
use crate::cpu::quants::repack_q4_0 as rq;
use crate::ggml_types::GgmlType;
use crate::tensor::{split_range, Tensor};

/// Fewest columns the unpacked panel pays off at (as `mul_mat_panel::MIN_COLS`).
const MIN_COLS: usize = 4;

fn act_bytes(node: &Tensor) -> usize {
    let x = node.src(1).unwrap();
    x.nrows() * (x.ne()[0] / 32) * size_of::<ActBlock>()
}

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    let nb = node.src(0).unwrap().ne()[0] / 32;
    act_bytes(node) + 64 + nth * (panel::panel_bytes(nb) + 64)
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (wne, xne, dne) = (w.ne(), x.ne(), node.ne());
    let k = wne[0];
    let nb = k / 32;
    let align = |p: *mut u8| p.wrapping_add(p.align_offset(64));
    let act = align(ctx.wdata);
    let panel_at = align(unsafe { ctx.wdata.add(act_bytes(node) + 64) });
    let my_panel = unsafe { panel_at.add(ctx.ith * (panel::panel_bytes(nb) + 64)) };
    let acs = nb * size_of::<ActBlock>();

    let mut tmp = Vec::new();
    let mut q = vec![0u32; GgmlType::Q8_0.row_size(k).div_ceil(4)];
    for r in split_range(x.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, xne[1], xne[2]);
        unsafe {
            let src = x.data().add(x.row_offset(i1, i2, i3));
            let qp = q.as_mut_ptr() as *mut u8;
            super::mul_mat::convert_row(x.dtype(), src, k, GgmlType::Q8_0, qp, &mut tmp);
            panel::act_row(nb, qp, act.add(r * acs) as *mut ActBlock);
        }
    }
    if !ctx.sync() {
        return;
    }

    let (r2, r3) = (xne[2] / wne[2], xne[3] / wne[3]);
    let units_per = dne[0].div_ceil(ROWS);
    let whole = dne[0] / ROWS;
    let (wnb, dnb) = (w.nb(), node.nb());
    let n = dne[1];
    for u in split_range(units_per * dne[2] * dne[3], ctx.ith, ctx.nth) {
        let p = u % units_per;
        let batch = u / units_per;
        let (i2, i3) = (batch % dne[2], batch / dne[2]);
        let row0 = p * ROWS;
        let rows = (dne[0] - row0).min(ROWS);
        unsafe {
            let wp = w
                .data()
                .add((i2 / r2) * wnb[2] + (i3 / r3) * wnb[3] + row0 * wnb[1]);
            let acol = act.add((i3 * xne[2] + i2) * xne[1] * acs) as *const ActBlock;
            let db = node.data().add(i2 * dnb[2] + i3 * dnb[3] + row0 * 4);
            if p < whole && n < MIN_COLS {
                #[cfg(target_arch = "x86_64")]
                rq::avx512::gemv_cols(nb, wp, acol, nb, n, db, dnb[1]);
                #[cfg(not(target_arch = "x86_64"))]
                rq::kernel_ref(nb, wp, acol, nb, n, db, dnb[1]);
                continue;
            }
            if p < whole {
                #[cfg(target_arch = "x86_64")]
                rq::avx512::unpack(nb, wp, my_panel);
                #[cfg(not(target_arch = "x86_64"))]
                rq::unpack_ref(nb, wp, my_panel);
            } else {
                panel::pack_ref(nb, wp, wnb[1], rows, my_panel);
            }
            for j in (0..n).step_by(panel::MAX_COLS) {
                let cols = (n - j).min(panel::MAX_COLS);
                #[cfg(target_arch = "x86_64")]
                panel::avx512::kernel_cols(
                    nb,
                    my_panel,
                    acol.add(j * nb),
                    nb,
                    cols,
                    db.add(j * dnb[1]),
                    dnb[1],
                    rows,
                );
                #[cfg(not(target_arch = "x86_64"))]
                panel::kernel_ref(
                    nb,
                    my_panel,
                    acol.add(j * nb),
                    nb,
                    cols,
                    db.add(j * dnb[1]),
                    dnb[1],
                    rows,
                );
            }
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
}
