use super::super::testutil::*;
use super::super::Ctx;
use crate::cpu::pool::{ThreadPool, Worker};
use crate::cpu::quants::amx_tiles::Emu;
use crate::cpu::quants::panel_amx as pa;
use crate::cpu::quants::q8_0::BlockQ8_0;
use crate::ggml_types::{op, GgmlType};
use std::sync::atomic::AtomicUsize;

/// The node through `compute_on` on `nth` threads with the emulated tiles (any machine).
fn run_emulated(d: &TT, nth: usize) {
    let node = d.tensor();
    assert!(super::shape_applies(&node));
    let ws = super::work_size(&node, nth);
    let mut wdata = vec![0u8; ws + 64];
    let wp = wdata.as_mut_ptr() as usize;
    let next = AtomicUsize::new(0);
    let mut pool = ThreadPool::new(nth).unwrap();
    pool.run(nth, &|w: &Worker| {
        let ctx = Ctx {
            ith: w.ith,
            nth: w.nth,
            worker: w,
            wdata: wp as *mut u8,
            wsize: ws,
            next: &next,
        };
        super::compute_on(&node, &ctx, &mut Emu::default(), pa::kernel);
    })
    .unwrap();
}

/// dst[i, j] for Q8_0 weights in the panels' order: x rounded to Q8_0, then per block in order
/// `acc = fma(Σ qx·qy, dx·dy, acc)`.
fn blockwise_q8_0(w: &TT, x: &TT) -> Vec<f32> {
    super::super::mul_mat_panel::tests::blockwise_by(w, x, |bx: &BlockQ8_0, by| {
        let s: i32 = (0..32).map(|e| bx.qs[e] as i32 * by.qs[e] as i32).sum();
        (s, bx.d)
    })
}

/// A copy of `w` repacked at load as `cpu/repack.rs` would (and marked so).
fn repacked(w: &TT) -> TT {
    let (k, m) = (w.ne()[0], w.ne()[1] * w.ne()[2]);
    let wr = TT::new(w.ty(), w.ne());
    unsafe {
        let (src, dst) = (w.tensor().data(), wr.tensor().data());
        if w.ty() == GgmlType::Q8_0 {
            crate::cpu::quants::repack_q8_0::repack(m, k / 32, src, dst);
        } else {
            crate::cpu::quants::repack_q4_0::repack(m, k / 32, src, dst);
        }
        crate::cpu::repack::set_mark(wr.tensor().as_ptr());
    }
    wr
}

/// The whole op on emulated tiles gives the panels' order to the bit (Q4_0: the VNNI panels'
/// bits, `mul_mat_panel::tests::blockwise`): plain and repacked weights, partial panels (1, 17,
/// 37 rows), column counts 16..70 (partial groups, two passes), broadcast batches, F32 and F16
/// activations, 1 and 3 threads.
#[test]
fn emulated_op_gives_the_blockwise_sum() {
    for (m, n, k, b2, xt) in [
        (37, 16, 64, 1, GgmlType::F32),
        (17, 17, 256, 2, GgmlType::F16),
        (1, 40, 32, 1, GgmlType::F32),
        (32, 70, 96, 2, GgmlType::F32),
        (48, 23, 4096 + 32, 1, GgmlType::F16),
    ] {
        for wt in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let mut w = TT::new(wt, [k, m, 1, 1]);
            w.set(&rand_vec(k * m, 91, -1.0, 1.0));
            let mut x = TT::new(xt, [k, n, b2, 1]);
            x.set(&rand_vec(k * n * b2, 92, -1.0, 1.0));
            let want = if wt == GgmlType::Q8_0 {
                blockwise_q8_0(&w, &x)
            } else {
                super::super::mul_mat_panel::tests::blockwise(&w, &x)
            };
            let wr = repacked(&w);
            for (ws, nth) in [(&w, 1), (&w, 3), (&wr, 3)] {
                let mut d = TT::new(GgmlType::F32, [m, n, b2, 1]);
                d.op(op::MUL_MAT).src(0, ws).src(1, &x);
                run_emulated(&d, nth);
                let got = d.get();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                let rp = crate::cpu::repack::is_repacked(&ws.tensor());
                assert!(
                    same,
                    "{wt:?} m={m} n={n} k={k} b2={b2} nth={nth} repacked={rp}"
                );
            }
        }
    }
}

/// Through the backend (where `cpu::amx::used`, else the VNNI paths): Q4_0 gives the panels'
/// bits either way; Q8_0 the blockwise sum on AMX, within rounding of it elsewhere.
#[test]
fn backend_takes_amx_where_usable() {
    let (m, n, k) = (33, 24, 256);
    for wt in [GgmlType::Q4_0, GgmlType::Q8_0] {
        let mut w = TT::new(wt, [k, m, 1, 1]);
        w.set(&rand_vec(k * m, 93, -1.0, 1.0));
        let mut x = TT::new(GgmlType::F32, [k, n, 1, 1]);
        x.set(&rand_vec(k * n, 94, -1.0, 1.0));
        let mut d = TT::new(GgmlType::F32, [m, n, 1, 1]);
        d.op(op::MUL_MAT).src(0, &w).src(1, &x);
        let amx = super::applies(&d.tensor());
        // Unless a knob lowers the instruction set, AMX runs wherever it is usable and asked for
        // (ROCMFORGE_CPU_AMX=1).
        let knobs = ["ROCMFORGE_GEMM", "ROCMFORGE_SIMD"].map(|k| std::env::var_os(k).is_some());
        if knobs == [false, false] {
            assert_eq!(amx, crate::cpu::amx::used());
        }
        assert!(!amx || crate::cpu::amx::used());
        run(&d, 3);
        let got = d.get();
        let want = if wt == GgmlType::Q8_0 {
            blockwise_q8_0(&w, &x)
        } else {
            super::super::mul_mat_panel::tests::blockwise(&w, &x)
        };
        if amx || (wt == GgmlType::Q4_0 && crate::cpu::quants::panel::available()) {
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{wt:?} amx={amx}");
        } else {
            assert_close(&got, &want, 1e-4);
        }
    }
}

/// AMX against the VNNI paths for 8B-shaped products (4096 × 14336 × 512 columns, both ways
/// round), Q4_0 (plain and repacked at load) and Q8_0 weights, 1 and 16 threads (`THREADS=1,16`
/// to choose):
/// `ROCMFORGE_CPU_AMX=1 cargo test --release --lib -- --ignored bench_amx --nocapture`.
#[test]
#[ignore]
fn bench_amx() {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Instant;
    eprintln!("AMX: {:?}", crate::cpu::amx::detected());
    let threads: Vec<usize> = std::env::var("THREADS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.parse().ok()).collect())
        .unwrap_or(vec![1, 16]);
    let n = 512;
    for (k, m) in [(4096, 14336), (14336, 4096)] {
        let mut x = TT::new(GgmlType::F32, [k, n, 1, 1]);
        x.set(&rand_vec(k * n, 95, -1.0, 1.0));
        for wt in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let mut w = TT::new(wt, [k, m, 1, 1]);
            w.set(&rand_vec(k * m, 96, -1.0, 1.0));
            // Q4_0 also as libllama places it on AVX-512 VNNI machines (RFCPU_REPACK).
            let wr = (wt == GgmlType::Q4_0).then(|| repacked(&w));
            for (ws, nth) in threads
                .iter()
                .flat_map(|&t| [(&w, t)].into_iter().chain(wr.as_ref().map(|r| (r, t))))
            {
                let mut d = TT::new(GgmlType::F32, [m, n, 1, 1]);
                d.op(op::MUL_MAT).src(0, ws).src(1, &x);
                let rp = if std::ptr::eq(ws, &w) {
                    ""
                } else {
                    " repacked"
                };
                let mut line = format!("{wt:?}{rp} k={k} m={m} n={n} threads={nth}:");
                let mut outs = vec![];
                for off in [true, false] {
                    super::OFF.store(off, Relaxed);
                    if !off && !super::applies(&d.tensor()) {
                        line += " AMX n/a";
                        continue;
                    }
                    let mut be = crate::cpu::backend::CpuBackend::new(nth).unwrap();
                    let t = d.tensor();
                    use crate::device::Backend;
                    be.compute(&[t]).unwrap();
                    let reps = 3;
                    let start = Instant::now();
                    for _ in 0..reps {
                        be.compute(&[d.tensor()]).unwrap();
                    }
                    let s = start.elapsed().as_secs_f64() / reps as f64;
                    let name = if off { "VNNI" } else { "AMX" };
                    let gmac = (k * m * n) as f64 / s / 1e9;
                    line += &format!(" {name} {:.1} ms ({gmac:.0} GMAC/s)", s * 1e3);
                    outs.push(d.get());
                }
                super::OFF.store(false, Relaxed);
                if outs.len() == 2 {
                    let same = outs[0]
                        .iter()
                        .zip(&outs[1])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    line += if same { ", same bits" } else { ", bits differ" };
                }
                eprintln!("{line}");
            }
        }
    }
}
