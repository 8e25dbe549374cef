use super::*;
use crate::cpu::types::traits as all_traits;

/// Rows × columns of `tl` over a rows × cols block, reps times; returns G MAC/s. (Only the
/// x86 tile benches use it.)
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn time(
    tl: crate::cpu::types::Tile,
    n: usize,
    qx: &[u8],
    xs: usize,
    rows: usize,
    qy: &[u8],
    ys: usize,
    cols: usize,
    reps: usize,
) -> f64 {
    let mut out = vec![0f32; rows * cols];
    let start = std::time::Instant::now();
    for _ in 0..reps {
        for j in (0..cols).step_by(tl.cols) {
            for i in (0..rows).step_by(tl.rows) {
                unsafe {
                    (tl.dot)(
                        n,
                        qx.as_ptr().add(i * xs),
                        xs,
                        qy.as_ptr().add(j * ys),
                        ys,
                        out.as_mut_ptr().add(i + j * rows) as *mut u8,
                        rows * 4,
                    )
                };
            }
        }
    }
    std::hint::black_box(&out);
    (n * rows * cols * reps) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// One column against a matrix larger than the caches (generation's case): rows one
/// `vec_dot` at a time vs the gemv tile.
#[test]
#[ignore]
fn bench_gemv_streaming() {
    #[allow(non_snake_case)]
    let N: usize = std::env::var("K")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(576);
    let rows_env = std::env::var("ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1usize << 16);
    #[allow(non_snake_case)]
    let ROWS = rows_env;
    let reps = (10usize << 16) / ROWS;
    use GgmlType::*;
    for t in [Q4_0, Q4_1, Q8_0, IQ4_NL] {
        let tr = all_traits(t).unwrap();
        let x = testutil::data(N * ROWS, 1);
        let y = testutil::data(N, 2);
        let qx = testutil::quantize(t, tr.from_f32.unwrap(), &x);
        let qy = testutil::quantize(
            tr.vec_dot_type,
            all_traits(tr.vec_dot_type).unwrap().from_f32.unwrap(),
            &y,
        );
        let row = t.row_size(N);
        let mut out = vec![0f32; ROWS];
        for pass in 0..2 {
            let start = std::time::Instant::now();
            for _ in 0..reps {
                match (pass, tr.gemv) {
                    (1, Some(tl)) => {
                        for r in (0..ROWS).step_by(tl.rows) {
                            unsafe {
                                (tl.dot)(
                                    N,
                                    qx.as_ptr().add(r * row),
                                    row,
                                    qy.as_ptr(),
                                    0,
                                    out.as_mut_ptr().add(r) as *mut u8,
                                    0,
                                )
                            };
                        }
                    }
                    _ => {
                        for (r, o) in out.iter_mut().enumerate() {
                            *o = unsafe {
                                (tr.vec_dot.unwrap())(N, qx.as_ptr().add(r * row), qy.as_ptr())
                            };
                        }
                    }
                }
            }
            let gbs = (row * ROWS * reps) as f64 / start.elapsed().as_secs_f64() / 1e9;
            eprintln!(
                "gemv {t:?} {}: {gbs:6.2} GB/s ({})",
                ["vec_dot", "tile"][pass],
                out[7]
            );
        }
    }
}

/// The tiles of each instruction set side by side, one thread: AVX2, 256-bit VNNI (VEX,
/// EVEX), AVX-512BW and AVX-512 VNNI (where the CPU has them) on a weight matrix that stays in L2 (64 rows ×
/// 4096) against 16 columns (prompts) and 1 column (generation), and streaming a matrix
/// larger than the caches against 1 column. Prints G multiply-adds/s.
/// `cargo test --release -- --ignored bench_tiles --nocapture`
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_tiles() {
    use crate::cpu::simd;
    use crate::cpu::types::{DotTile, Tile};
    use GgmlType::*;
    let tile = |rows, cols, dot: DotTile| Tile { rows, cols, dot };
    macro_rules! set {
        ($f:ident) => {
            [
                (
                    "avx2",
                    tile(2, 4, $f::avx2::tile::<2, 4>),
                    tile(4, 1, $f::avx2::tile::<4, 1>),
                ),
                (
                    "avxvnni256",
                    tile(2, 4, $f::avx512::tile_avxvnni::<2, 4>),
                    tile(4, 1, $f::avx512::tile_avxvnni::<4, 1>),
                ),
                (
                    "vnni256",
                    tile(2, 4, $f::avx512::tile_vnni256::<2, 4>),
                    tile(4, 1, $f::avx512::tile_vnni256::<4, 1>),
                ),
                (
                    "avx512bw",
                    tile(4, 4, $f::avx512::tile_bw::<4, 4>),
                    tile(8, 1, $f::avx512::tile_bw::<8, 1>),
                ),
                (
                    "avx512vnni",
                    tile(4, 4, $f::avx512::tile_vnni::<4, 4>),
                    tile(8, 1, $f::avx512::tile_vnni::<8, 1>),
                ),
            ]
        };
    }
    let sets = [
        (Q4_0, set!(q4_0)),
        (Q4_1, set!(q4_1)),
        (Q8_0, set!(q8_0)),
        (IQ4_NL, set!(iq4_nl)),
    ];
    let runs = |name: &str| match name {
        "avx2" => simd::level() >= simd::Level::Avx2,
        "avxvnni256" => is_x86_feature_detected!("avxvnni"),
        "avx512bw" => simd::has_avx512(),
        _ => simd::has_avx512_vnni_cpu(),
    };
    for (t, set) in sets {
        let tr = all_traits(t).unwrap();
        let yt = tr.vec_dot_type;
        let yfrom = all_traits(yt).unwrap().from_f32.unwrap();
        let (n, rows) = (4096, 64);
        let qx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(n * rows, 1));
        let qy = testutil::quantize(yt, yfrom, &testutil::data(n * 16, 2));
        let (xs, ys) = (t.row_size(n), yt.row_size(n));
        let (sn, srows) = (576, 1 << 16);
        let sqx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(sn * srows, 3));
        let sqy = testutil::quantize(yt, yfrom, &testutil::data(sn, 4));
        for (name, gemm, gemv) in set {
            if !runs(name) {
                println!("bench_tiles {t:?} {name}: SKIPPED (not on this CPU)");
                continue;
            }
            let a = time(gemm, n, &qx, xs, rows, &qy, ys, 16, 100);
            let b = time(gemv, n, &qx, xs, rows, &qy, ys, 1, 1000);
            let c = time(gemv, sn, &sqx, t.row_size(sn), srows, &sqy, 0, 1, 10);
            println!("bench_tiles {t:?} {name:10}: gemm {}x{} {a:6.2} | gemv {}x1 in L2 {b:6.2} | gemv streaming {c:6.2} G MAC/s", gemm.rows, gemm.cols, gemv.rows);
        }
    }
}

/// The K-quant tiles (AVX2) against their one-row dot, one thread: 64 rows × 4096 in L2
/// against 16 columns (prompts) and 1 column (generation), and a matrix larger than the
/// caches against 1 column. Prints G multiply-adds/s.
/// `cargo test --release -- --ignored bench_kquant_tiles --nocapture`
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_kquant_tiles() {
    use crate::cpu::types::Tile;
    use GgmlType::*;
    if !use_avx2() {
        println!("bench_kquant_tiles: SKIPPED, no AVX2");
        return;
    }
    // The one-row dot as a 1 × 1 "tile", so both run through the same loop.
    fn one_row<const T: u8>(
        n: usize,
        x: *const u8,
        _: usize,
        y: *const u8,
        _: usize,
        out: *mut u8,
        _: usize,
    ) {
        let t = if T == 4 { Q4_K } else { Q6_K };
        unsafe { *(out as *mut f32) = (all_traits(t).unwrap().vec_dot.unwrap())(n, x, y) };
    }
    let sets: [(GgmlType, Tile); 2] = [
        (
            Q4_K,
            Tile {
                rows: 1,
                cols: 1,
                dot: one_row::<4>,
            },
        ),
        (
            Q6_K,
            Tile {
                rows: 1,
                cols: 1,
                dot: one_row::<6>,
            },
        ),
    ];
    for (t, single) in sets {
        let tr = all_traits(t).unwrap();
        let yfrom = all_traits(Q8_K).unwrap().from_f32.unwrap();
        let (n, rows) = (4096, 64);
        let qx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(n * rows, 1));
        let qy = testutil::quantize(Q8_K, yfrom, &testutil::data(n * 16, 2));
        let (xs, ys) = (t.row_size(n), Q8_K.row_size(n));
        let (sn, srows) = (1024, 1 << 14);
        let sqx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(sn * srows, 3));
        let sqy = testutil::quantize(Q8_K, yfrom, &testutil::data(sn, 4));
        let (gemm, gemv) = (tr.gemm.unwrap_or(single), tr.gemv.unwrap_or(single));
        for (name, gemm, gemv) in [("vec_dot", single, single), ("tiles", gemm, gemv)] {
            let a = time(gemm, n, &qx, xs, rows, &qy, ys, 16, 30);
            let b = time(gemv, n, &qx, xs, rows, &qy, ys, 1, 300);
            let c = time(gemv, sn, &sqx, t.row_size(sn), srows, &sqy, 0, 1, 10);
            println!("bench_kquant_tiles {t:?} {name:7}: gemm {}x{} {a:6.2} | gemv {}x1 in L2 {b:6.2} | gemv streaming {c:6.2} G MAC/s", gemm.rows, gemm.cols, gemv.rows);
        }
        if std::env::var("SWEEP").is_ok() {
            macro_rules! shapes {
                ($f:ident) => {
                    [
                        Tile {
                            rows: 1,
                            cols: 1,
                            dot: $f::avx2::tile::<1, 1>,
                        },
                        Tile {
                            rows: 2,
                            cols: 1,
                            dot: $f::avx2::tile::<2, 1>,
                        },
                        Tile {
                            rows: 3,
                            cols: 1,
                            dot: $f::avx2::tile::<3, 1>,
                        },
                        Tile {
                            rows: 1,
                            cols: 4,
                            dot: $f::avx2::tile::<1, 4>,
                        },
                        Tile {
                            rows: 2,
                            cols: 2,
                            dot: $f::avx2::tile::<2, 2>,
                        },
                        Tile {
                            rows: 4,
                            cols: 2,
                            dot: $f::avx2::tile::<4, 2>,
                        },
                        Tile {
                            rows: 3,
                            cols: 4,
                            dot: $f::avx2::tile::<3, 4>,
                        },
                        Tile {
                            rows: 2,
                            cols: 3,
                            dot: $f::avx2::tile::<2, 3>,
                        },
                    ]
                };
            }
            let shapes = if t == Q4_K {
                shapes!(q4_k)
            } else {
                shapes!(q6_k)
            };
            for tl in shapes {
                let a = time(
                    tl,
                    n,
                    &qx,
                    xs,
                    rows - rows % tl.rows,
                    &qy,
                    ys,
                    16 - 16 % tl.cols,
                    30,
                );
                let b = if tl.cols == 1 {
                    time(tl, n, &qx, xs, rows - rows % tl.rows, &qy, ys, 1, 300)
                } else {
                    0.0
                };
                let c = if tl.cols == 1 {
                    time(
                        tl,
                        sn,
                        &sqx,
                        t.row_size(sn),
                        srows - srows % tl.rows,
                        &sqy,
                        0,
                        1,
                        10,
                    )
                } else {
                    0.0
                };
                println!("sweep {t:?} {}x{}: 16 columns {a:6.2} | 1 column in L2 {b:6.2} | streaming {c:6.2}", tl.rows, tl.cols);
            }
        }
    }
}

/// The K-quant dots, AVX2 against AVX-512, one thread, 64 rows × 4096 in L2.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_kquant_dots() {
    use crate::cpu::types::VecDot;
    use GgmlType::*;
    if !crate::cpu::simd::has_avx512() {
        println!("bench_kquant_dots: SKIPPED, no AVX-512");
        return;
    }
    let dots: [(GgmlType, VecDot, VecDot); 2] = [
        (Q4_K, q4_k::avx2::vec_dot, q4_k::avx512::vec_dot),
        (Q6_K, q6_k::avx2::vec_dot, q6_k::avx512::vec_dot),
    ];
    for (t, a2, a5) in dots {
        let (n, rows) = (4096, 64);
        let tr = all_traits(t).unwrap();
        let qx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(n * rows, 1));
        let qy = testutil::quantize(
            Q8_K,
            all_traits(Q8_K).unwrap().from_f32.unwrap(),
            &testutil::data(n, 2),
        );
        for (name, dot) in [("avx2", a2), ("avx512", a5)] {
            let start = std::time::Instant::now();
            let mut s = 0f32;
            for _ in 0..200 {
                for r in 0..rows {
                    s += unsafe { dot(n, qx.as_ptr().add(r * t.row_size(n)), qy.as_ptr()) };
                }
            }
            println!(
                "bench_kquant_dots {t:?} {name:6}: {:6.2} G MAC/s ({s})",
                (n * rows * 200) as f64 / start.elapsed().as_secs_f64() / 1e9
            );
        }
    }
}

/// The float dots, AVX2 against AVX-512, one thread, 4096 elements in L1/L2.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_float_dots() {
    use crate::cpu::simd::{self, x86};
    if !simd::has_avx512() {
        println!("bench_float_dots: SKIPPED, no AVX-512");
        return;
    }
    let n = 4096;
    let a = testutil::data(n, 1);
    let b = testutil::data(n, 2);
    let a16: Vec<u16> = a.iter().map(|&v| f32_to_f16(v)).collect();
    let b16: Vec<u16> = b.iter().map(|&v| f32_to_f16(v)).collect();
    let reps = 200_000;
    let go = |name: &str, f: &dyn Fn() -> f32| {
        let start = std::time::Instant::now();
        let mut s = 0f32;
        for _ in 0..reps {
            s += std::hint::black_box(f());
        }
        println!(
            "bench_float_dots {name:22}: {:6.2} G elements/s ({s})",
            (n * reps) as f64 / start.elapsed().as_secs_f64() / 1e9
        );
    };
    unsafe {
        go("f32 avx2", &|| x86::dot_f32_avx2(&a, &b));
        go("f32 avx512", &|| x86::dot_f32_avx512(&a, &b));
        go("f16·f32 avx2", &|| x86::dot_f16_f32_avx2(&a16, &b));
        go("f16·f32 avx512", &|| x86::dot_f16_f32_avx512(&a16, &b));
        go("f16·f16 4acc avx2", &|| {
            x86::dot_f16_f16_4acc_avx2(&a16, &b16)
        });
        go("f16·f16 4acc avx512", &|| {
            x86::dot_f16_f16_4acc_avx512(&a16, &b16)
        });
    }
}

#[test]
#[ignore]
fn bench_vec_dot() {
    const N: usize = 4096;
    const ROWS: usize = 64;
    use GgmlType::*;
    for t in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, NVFP4, Q1_0, Q2_0,
    ] {
        let tr = all_traits(t).unwrap();
        let x = testutil::data(N * ROWS, 1);
        let y = testutil::data(N, 2);
        let qx = testutil::quantize(t, tr.from_f32.unwrap(), &x);
        let qy = testutil::quantize(
            tr.vec_dot_type,
            all_traits(tr.vec_dot_type).unwrap().from_f32.unwrap(),
            &y,
        );
        let dot = tr.vec_dot.unwrap();
        let row = t.row_size(N);
        let mut sink = 0f32;
        let reps = 200;
        let start = std::time::Instant::now();
        for _ in 0..reps {
            for r in 0..ROWS {
                sink += unsafe { dot(N, qx.as_ptr().add(r * row), qy.as_ptr()) };
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let gbs = (row * ROWS * reps) as f64 / secs / 1e9;
        let gelems = (N * ROWS * reps) as f64 / secs / 1e9;
        eprintln!("bench {t:?}: {gbs:6.2} GB/s weights, {gelems:6.2} G elements/s ({sink:.1})");
    }
}

/// The K-quant weight panels (AVX-512 VNNI) against the register tiles, one thread: 64 rows ×
/// 4096 in L2 against 64 columns (a prompt's product); the panels with their packing (as
/// `mul_mat_panel` runs them, each panel packed once for all columns) and the kernel alone.
/// Prints G multiply-adds/s.
/// `cargo test --release -- --ignored bench_panel --nocapture`
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn bench_panel() {
    use GgmlType::*;
    if !panel::available() {
        println!("bench_panel: SKIPPED, no AVX-512 VNNI");
        return;
    }
    type Pack = unsafe fn(usize, *const u8, usize, usize, *mut u8);
    type Kernel = unsafe fn(usize, *const u8, *const u8, usize, usize, *mut u8, usize, usize);
    type Act = unsafe fn(usize, *const u8, *mut u8);
    let sets: [(GgmlType, usize, usize, usize, Act, Pack, Kernel); 2] = [
        (
            Q4_K,
            panel_q4_k::MAX_COLS,
            panel_q4_k::BLOCK_BYTES,
            size_of::<panel_q4_k::ActBlockK>(),
            panel_q4_k::act_row,
            panel_q4_k::avx512::pack,
            panel_q4_k::avx512::kernel_cols,
        ),
        (
            Q6_K,
            panel_q6_k::MAX_COLS,
            panel_q6_k::BLOCK_BYTES,
            size_of::<panel_q6_k::ActBlock6>(),
            panel_q6_k::act_row,
            panel_q6_k::avx512::pack,
            panel_q6_k::avx512::kernel_cols,
        ),
    ];
    let (n, rows, cols, reps) = (4096, 64, 64, 10);
    let nb = n / QK_K;
    for (t, mc, pbytes, abytes, act_row, pack, kernel) in sets {
        let tr = all_traits(t).unwrap();
        let yfrom = all_traits(Q8_K).unwrap().from_f32.unwrap();
        let qx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(n * rows, 1));
        let qy = testutil::quantize(Q8_K, yfrom, &testutil::data(n * cols, 2));
        let (xs, ys) = (t.row_size(n), Q8_K.row_size(n));
        let tiles = time(tr.gemm.unwrap(), n, &qx, xs, rows, &qy, ys, cols, reps);
        let mut act = vec![0u32; cols * nb * abytes / 4];
        let ap = act.as_mut_ptr() as *mut u8;
        for c in 0..cols {
            unsafe { act_row(nb, qy.as_ptr().add(c * ys), ap.add(c * nb * abytes)) };
        }
        let mut pnl = vec![0u32; nb * pbytes / 4];
        let pp = pnl.as_mut_ptr() as *mut u8;
        let mut out = vec![0f32; rows * cols];
        let op = out.as_mut_ptr() as *mut u8;
        let run = |packing: bool| {
            let start = std::time::Instant::now();
            for _ in 0..reps {
                for p in 0..rows / 16 {
                    unsafe {
                        if packing || p == 0 {
                            pack(nb, qx.as_ptr().add(p * 16 * xs), xs, 16, pp);
                        }
                        for j in (0..cols).step_by(mc) {
                            let o = op.add(p * 64 + j * rows * 4);
                            kernel(
                                nb,
                                pp,
                                ap.add(j * nb * abytes),
                                nb * abytes,
                                mc,
                                o,
                                rows * 4,
                                16,
                            );
                        }
                    }
                }
            }
            (n * rows * cols * reps) as f64 / start.elapsed().as_secs_f64() / 1e9
        };
        let (with_pack, kernel_only) = (run(true), run(false));
        let pack_only = {
            let start = std::time::Instant::now();
            for _ in 0..reps * 10 {
                for p in 0..rows / 16 {
                    unsafe { pack(nb, qx.as_ptr().add(p * 16 * xs), xs, 16, pp) };
                }
            }
            start.elapsed().as_secs_f64() / (reps * 10 * rows / 16) as f64 * 1e6
        };
        std::hint::black_box(&out);
        println!(
            "bench_panel {t:?}: tiles {tiles:6.2} | panels {with_pack:6.2} | kernel alone {kernel_only:6.2} G MAC/s ({rows} rows x {n} x {cols} columns); pack {pack_only:6.1} us per 16 rows"
        );
    }
}
