use super::super::amx_tiles::{Emu, Tiles};
use super::*;
use crate::cpu::quants::{panel, q4_0, q8_0, testutil::data};

/// Q8_0 activations of `n` columns of `k` values: as rows, and as the AMX groups.
fn activations(n: usize, k: usize, seed: u32) -> (Vec<u8>, Vec<u32>) {
    let nb = k / 32;
    let mut y = vec![0u8; n * nb * 34];
    unsafe { q8_0::from_f32(&data(n * k, seed), y.as_mut_ptr()) };
    let mut groups = vec![0x5a5a5a5au32; act_bytes(nb, n) / 4];
    let gp = groups.as_mut_ptr() as *mut u8;
    for c in 0..n.next_multiple_of(GROUP) {
        let src = if c < n {
            unsafe { y.as_ptr().add(c * nb * 34) }
        } else {
            std::ptr::null()
        };
        unsafe { act_col(nb, src, gp.add(c / GROUP * nb * ACT_BYTES), c % GROUP) };
    }
    (y, groups)
}

/// The VNNI panels' activation blocks of `n` Q8_0 rows of `nb` blocks at `y`.
fn vnni_acts(y: &[u8], n: usize, nb: usize) -> Vec<panel::ActBlock> {
    let blank = panel::ActBlock {
        corr: 0,
        d: 0.0,
        qs: [0; 32],
    };
    let mut ab = vec![blank; n * nb];
    for c in 0..n {
        unsafe { panel::act_row(nb, y.as_ptr().add(c * nb * 34), ab.as_mut_ptr().add(c * nb)) };
    }
    ab
}

/// Results of up to 32 rows per column (column c at c · 32).
const OS: usize = 2 * ROWS;

/// Packs rows `row0..row0 + rows` (≤ 32) of `w` (rows `ws` bytes apart) with `pack` into one
/// or two panels.
fn pack_unit(pack: PackFn, nb: usize, w: &[u8], ws: usize, row0: usize, rows: usize) -> Vec<u32> {
    let mut out = vec![0x77777777u32; 2 * panel_bytes(nb) / 4];
    for h in 0..rows.div_ceil(ROWS) {
        let hrows = (rows - h * ROWS).min(ROWS);
        unsafe {
            let dst = (out.as_mut_ptr() as *mut u8).add(h * panel_bytes(nb));
            pack(nb, w.as_ptr().add((row0 + h * ROWS) * ws), ws, hrows, dst)
        };
    }
    out
}
type PackFn = unsafe fn(usize, *const u8, usize, usize, *mut u8);

/// The emulated kernel's results for `rows` ≤ 32 rows (rows × n, column c at c · 32).
fn emulated(nb: usize, panel: &[u32], act: &[u32], n: usize, rows: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; OS * n];
    let mut t = Emu::default();
    unsafe {
        t.config(&CONFIG);
        kernel(
            &mut t,
            nb,
            panel.as_ptr() as *const u8,
            act.as_ptr() as *const u8,
            n,
            out.as_mut_ptr() as *mut u8,
            OS * 4,
            rows,
        );
        t.release();
    }
    out
}

fn same_bits(a: &[f32], b: &[f32], rows: usize, what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if i % ROWS < rows {
            assert_eq!(
                x.to_bits(),
                y.to_bits(),
                "{what}: row {} col {}",
                i % ROWS,
                i / ROWS
            );
        }
    }
}

/// Q4_0 on (emulated) AMX gives `panel::kernel_ref`'s bits: 1, 15, 16, 17, 33 and 40 rows
/// (partial panels, one and two panels a unit), every column count 1..=40 and 64 + 6 (partial
/// groups, several passes), k = 32 and 256; k = 4096 + 32 with a few column counts.
#[test]
fn q4_0_equals_the_vnni_panels_reference() {
    let mut cases = vec![];
    for k in [32, 256] {
        for n in 1..=40 {
            cases.push((k, n));
        }
        cases.push((k, 70));
    }
    for n in [1, 16, 17, 40, 70] {
        cases.push((4096 + 32, n));
    }
    for (k, n) in cases {
        let nb = k / 32;
        let (_, act) = activations(n, k, 3 + n as u32);
        // The VNNI panels' activation blocks of the same Q8_0 rows.
        let (y, _) = activations(n, k, 3 + n as u32);
        let ab = vnni_acts(&y, n, nb);
        for m in [1, 15, 16, 17, 33, 40] {
            if k > 256 && m != 17 {
                continue;
            }
            let mut w = vec![0u8; m * nb * 18];
            unsafe { q4_0::from_f32(&data(m * k, 7 + m as u32), w.as_mut_ptr()) };
            // The reference: the VNNI panels of 16 rows, results at the unit's stride.
            let mut want = vec![f32::NAN; m.next_multiple_of(OS) * n];
            for p in 0..m.div_ceil(ROWS) {
                let rows = (m - p * ROWS).min(ROWS);
                let wp = unsafe { w.as_ptr().add(p * ROWS * nb * 18) };
                let mut vp = vec![0u32; panel::panel_bytes(nb) / 4];
                let (u, h) = (p / 2, p % 2);
                unsafe {
                    panel::pack_ref(nb, wp, nb * 18, rows, vp.as_mut_ptr() as *mut u8);
                    panel::kernel_ref(
                        nb,
                        vp.as_ptr() as *const u8,
                        ab.as_ptr(),
                        nb,
                        n,
                        want.as_mut_ptr().add(u * OS * n + h * ROWS) as *mut u8,
                        OS * 4,
                        rows,
                    );
                }
            }
            for u in 0..m.div_ceil(OS) {
                let rows = (m - u * OS).min(OS);
                let ap = pack_unit(pack_q4_0, nb, &w, nb * 18, u * OS, rows);
                let got = emulated(nb, &ap, &act, n, rows);
                let want = &want[u * OS * n..(u + 1) * OS * n];
                same_bits(&got, want, rows, &format!("m={m} n={n} k={k} unit {u}"));
                // Past `rows` nothing is written.
                assert!(got
                    .iter()
                    .enumerate()
                    .all(|(i, v)| i % OS < rows || v.is_nan()));
            }
        }
    }
}

/// Q8_0 on (emulated) AMX: per (row, column) the blocks in order, `acc = fma(Σ qx·qy, dx·dy,
/// acc)`, to the bit, and within rounding of the one-row dot (its other order).
#[test]
fn q8_0_is_the_blockwise_fma_sum() {
    for (m, n, k) in [
        (1, 5, 32),
        (17, 40, 256),
        (15, 23, 4096 + 32),
        (16, 16, 64),
        (50, 33, 64),
    ] {
        let nb = k / 32;
        let (y, act) = activations(n, k, 11);
        let mut w = vec![0u8; m * nb * 34];
        unsafe { q8_0::from_f32(&data(m * k, 13), w.as_mut_ptr()) };
        for u in 0..m.div_ceil(OS) {
            let rows = (m - u * OS).min(OS);
            let wp = unsafe { w.as_ptr().add(u * OS * nb * 34) };
            let ap = pack_unit(pack_q8_0, nb, &w, nb * 34, u * OS, rows);
            let got = emulated(nb, &ap, &act, n, rows);
            for c in 0..n {
                for r in 0..rows {
                    let (wr, yc) = unsafe { (wp.add(r * nb * 34), y.as_ptr().add(c * nb * 34)) };
                    let mut acc = 0f32;
                    for b in 0..nb {
                        let bx = unsafe { &*(wr as *const BlockQ8_0).add(b) };
                        let by = unsafe { &*(yc as *const BlockQ8_0).add(b) };
                        let s: i32 = (0..32).map(|e| bx.qs[e] as i32 * by.qs[e] as i32).sum();
                        acc = (s as f32).mul_add(f16_to_f32(bx.d) * f16_to_f32(by.d), acc);
                    }
                    let g = got[c * OS + r];
                    assert_eq!(g.to_bits(), acc.to_bits(), "m={m} n={n} k={k} ({r}, {c})");
                    let dot = unsafe { q8_0::vec_dot_ref(k, wr, yc) };
                    assert!((g - dot).abs() <= 1e-4 * dot.abs().max(1.0), "{g} vs {dot}");
                }
            }
        }
    }
}

/// The instructions give the emulator's bits (runs where `amx::available()`: Sapphire Rapids
/// and later; elsewhere it says it skipped).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn hardware_equals_the_emulator() {
    use super::super::amx_tiles::Hw;
    if !crate::cpu::amx::available() {
        eprintln!("skipped: no AMX here ({:?})", crate::cpu::amx::detected());
        return;
    }
    for (m, n, k) in [(17, 40, 256), (16, 70, 4096 + 32), (5, 3, 32), (45, 33, 96)] {
        let nb = k / 32;
        let (_, act) = activations(n, k, 21);
        for q8 in [false, true] {
            let bs = if q8 { 34 } else { 18 };
            let mut w = vec![0u8; m * nb * bs];
            unsafe {
                if q8 {
                    q8_0::from_f32(&data(m * k, 23), w.as_mut_ptr())
                } else {
                    q4_0::from_f32(&data(m * k, 23), w.as_mut_ptr())
                }
            };
            for u in 0..m.div_ceil(OS) {
                let rows = (m - u * OS).min(OS);
                let pack: PackFn = if q8 { pack_q8_0 } else { pack_q4_0 };
                let ap = pack_unit(pack, nb, &w, nb * bs, u * OS, rows);
                let pp = ap.as_ptr() as *const u8;
                let want = emulated(nb, &ap, &act, n, rows);
                let mut got = vec![f32::NAN; OS * n];
                unsafe {
                    Hw.config(&CONFIG);
                    kernel_amx(
                        &mut Hw,
                        nb,
                        pp,
                        act.as_ptr() as *const u8,
                        n,
                        got.as_mut_ptr() as *mut u8,
                        OS * 4,
                        rows,
                    );
                    Hw.release();
                }
                same_bits(&got, &want, rows, &format!("q8={q8} m={m} n={n} k={k}"));
            }
        }
    }
}

/// A group repacked at load packs to the bytes of its plain rows' panel, and partial panels
/// get zero scales and codes past their rows.
#[test]
fn packing_a_repacked_group_equals_packing_its_rows() {
    let nb = 5;
    let mut w = vec![0u8; ROWS * nb * 18];
    unsafe { q4_0::from_f32(&data(ROWS * nb * 32, 31), w.as_mut_ptr()) };
    let mut g = vec![0u8; w.len()];
    unsafe { crate::cpu::quants::repack_q4_0::repack(ROWS, nb, w.as_ptr(), g.as_mut_ptr()) };
    let (mut a, mut b) = (
        vec![1u32; panel_bytes(nb) / 4],
        vec![2u32; panel_bytes(nb) / 4],
    );
    unsafe {
        pack_q4_0(nb, w.as_ptr(), nb * 18, ROWS, a.as_mut_ptr() as *mut u8);
        pack_q4_0_group(nb, g.as_ptr(), b.as_mut_ptr() as *mut u8);
    }
    assert!(a == b);
    for rows in [1, 9] {
        let mut p = vec![0x7f7f7f7fu32; panel_bytes(nb) / 4];
        unsafe { pack_q4_0(nb, w.as_ptr(), nb * 18, rows, p.as_mut_ptr() as *mut u8) };
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr() as *const u8, p.len() * 4) };
        for blk in bytes.chunks(BLOCK_BYTES) {
            assert!(blk[rows * 4..ROWS * 4].iter().all(|&v| v == 0));
            assert!(blk[ROWS * 4 + rows * 32..].iter().all(|&v| v == 0));
        }
    }
}

/// Kernel speed, one thread, panels and columns in cache (k = 4096, 64 columns): AMX (two
/// panels, 2 × 2 tiles; one panel, 1 × 4) against the VNNI panel kernel, with the packing's
/// cost: `cargo test --release --lib -- --ignored bench_amx_kernel --nocapture`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
#[ignore]
fn bench_amx_kernel() {
    use super::super::amx_tiles::Hw;
    use std::time::Instant;
    let (k, n, reps) = (4096, 64, 20000);
    let nb = k / 32;
    let (y, act) = activations(n, k, 41);
    let mut w = vec![0u8; 2 * ROWS * nb * 18];
    unsafe { q4_0::from_f32(&data(2 * ROWS * k, 43), w.as_mut_ptr()) };
    let mut out = vec![0f32; OS * n];
    let op = out.as_mut_ptr() as *mut u8;
    let macs = |rows: usize| (rows * n * k * reps) as f64;
    if panel::available() {
        let ab = vnni_acts(&y, n, nb);
        let mut vp = vec![0u32; panel::panel_bytes(nb) / 4];
        let vpp = vp.as_mut_ptr() as *mut u8;
        unsafe { panel::avx512::pack(nb, w.as_ptr(), nb * 18, ROWS, vpp) };
        let t = Instant::now();
        for _ in 0..reps {
            for j in (0..n).step_by(panel::MAX_COLS) {
                unsafe {
                    let a = ab.as_ptr().add(j * nb);
                    panel::avx512::kernel_cols(nb, vpp, a, nb, 8, op.add(j * OS * 4), OS * 4, 16)
                };
            }
        }
        let s = t.elapsed().as_secs_f64();
        eprintln!("VNNI panel kernel: {:.1} GMAC/s", macs(ROWS) / s / 1e9);
    }
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(pack_unit(pack_q4_0, nb, &w, nb * 18, 0, 2 * ROWS));
    }
    let pack = t.elapsed().as_secs_f64() / reps as f64;
    if !crate::cpu::amx::available() {
        eprintln!(
            "AMX n/a ({:?}); packing 32 rows: {:.1} us",
            crate::cpu::amx::detected(),
            pack * 1e6
        );
        return;
    }
    let ap = pack_unit(pack_q4_0, nb, &w, nb * 18, 0, 2 * ROWS);
    for rows in [2 * ROWS, ROWS] {
        let t = Instant::now();
        unsafe {
            Hw.config(&CONFIG);
            for _ in 0..reps {
                let (p, a) = (ap.as_ptr() as *const u8, act.as_ptr() as *const u8);
                kernel_amx(&mut Hw, nb, p, a, n, op, OS * 4, rows);
            }
            Hw.release();
        }
        let s = t.elapsed().as_secs_f64();
        eprintln!(
            "AMX kernel, {rows} rows: {:.1} GMAC/s; packing 32 rows {:.1} us = {:.0}% of one {n}-column pass",
            macs(rows) / s / 1e9,
            pack * 1e6,
            pack / (s / reps as f64) * 100.0
        );
    }
}
