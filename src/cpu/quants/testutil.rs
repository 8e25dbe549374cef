use crate::cpu::types::{FromF32, Tile, ToF32, VecDot};
use crate::ggml_types::GgmlType;

/// xorshift32 from state `s` (non-zero): the test data's one random source.
pub fn xorshift(mut s: u32) -> impl FnMut() -> u32 {
    move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    }
}

/// Deterministic data with a spread of magnitudes between blocks and a few outliers.
pub fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut next = xorshift(seed.wrapping_mul(2654435761).wrapping_add(12345).max(1));
    (0..n)
        .map(|i| {
            let scale = 0.05 + ((i / 32) % 7) as f32 * 0.4;
            let v = (next() % 20001) as f32 / 10000.0 - 1.0;
            if next().is_multiple_of(97) {
                v * scale * 4.0
            } else {
                v * scale
            }
        })
        .collect()
}

pub fn quantize(t: GgmlType, from: FromF32, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; t.row_size(x.len())];
    unsafe { from(x, q.as_mut_ptr()) };
    q
}

pub fn dequantize(to: ToF32, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    unsafe { to(q.as_ptr(), &mut y) };
    y
}

/// Round trip error, relative to the data's RMS, stays below `tol`.
pub fn check_round_trip(t: GgmlType, from: FromF32, to: ToF32, tol: f32) {
    let bs = t.block_size();
    for nb in [1, 2, 5, 16] {
        let n = nb * bs;
        let x = data(n, nb as u32 + 7);
        let y = dequantize(to, &quantize(t, from, &x), n);
        let err = (x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / n as f32).sqrt();
        let rms = (x.iter().map(|a| a * a).sum::<f32>() / n as f32).sqrt();
        assert!(
            err <= tol * rms,
            "{t:?} n={n}: rms error {err} vs data rms {rms}"
        );
    }
    // All zeros survive exactly (no NaN from a zero scale).
    let z = vec![0f32; bs];
    assert!(
        dequantize(to, &quantize(t, from, &z), bs)
            .iter()
            .all(|&v| v == 0.0),
        "{t:?} zeros"
    );
}

/// Formats with a NEON dot (every format with a dot; one without runs its scalar
/// reference on aarch64).
const NEON_DOTS: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// Every format has an AVX2 dot, some a NEON one: where it may run it must be what is
/// dispatched, or the checks below compare the reference with itself.
fn assert_simd_dispatched(t: GgmlType, dot: VecDot, dot_ref: VecDot) {
    let simd = if super::use_avx2() {
        "AVX2"
    } else if super::use_neon() && NEON_DOTS.contains(&t) {
        "NEON"
    } else {
        return;
    };
    assert!(
        dot as usize != dot_ref as usize,
        "{t:?}: the scalar reference is dispatched on a {simd} machine"
    );
}

/// The tiles the traits of `t` register (none without AVX2).
pub fn tiles(t: GgmlType) -> [Option<Tile>; 2] {
    let tr = crate::cpu::types::traits(t).unwrap();
    [tr.gemm, tr.gemv]
}

/// Runs `tile` on `rows` rows `qx` of `t` and `cols` columns `qy` of `yt` (output column
/// stride `os` bytes) and asserts each result equals `dot` of its row and column to the bit.
#[allow(clippy::too_many_arguments)]
fn assert_tile_is_dot(
    t: GgmlType,
    what: &str,
    tile: &Tile,
    n: usize,
    qx: &[u8],
    qy: &[u8],
    yt: GgmlType,
    dot: VecDot,
    os: usize,
) {
    let (xs, ys) = (t.row_size(n), yt.row_size(n));
    let mut out = vec![0u8; os * tile.cols];
    unsafe { (tile.dot)(n, qx.as_ptr(), xs, qy.as_ptr(), ys, out.as_mut_ptr(), os) };
    for r in 0..tile.rows {
        for c in 0..tile.cols {
            let want = unsafe { dot(n, qx.as_ptr().add(r * xs), qy.as_ptr().add(c * ys)) };
            let got = f32::from_le_bytes(out[r * 4 + c * os..][..4].try_into().unwrap());
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{t:?} {what}{}x{} n={n} ({r},{c}): {got} vs {want}",
                tile.rows,
                tile.cols
            );
        }
    }
}

/// Every tile result equals `vec_dot` of its row and column to the bit.
pub fn check_tiles(
    t: GgmlType,
    from: FromF32,
    yt: GgmlType,
    yfrom: FromF32,
    dot: VecDot,
    tiles: &[Option<Tile>],
) {
    #[cfg(target_arch = "x86_64")]
    assert!(
        !super::use_avx2() || tiles.iter().all(Option::is_some),
        "{t:?}: AVX2 machine without tiles"
    );
    for tile in tiles.iter().flatten() {
        for nb in [1, 3, 18] {
            let n = nb * t.block_size();
            let os = 4 * tile.rows + 12;
            let mut qx = vec![];
            for r in 0..tile.rows {
                qx.extend(quantize(t, from, &data(n, 7 + r as u32)));
            }
            let mut qy = vec![];
            for c in 0..tile.cols {
                qy.extend(quantize(yt, yfrom, &data(n, 50 + c as u32)));
            }
            assert_tile_is_dot(t, "", tile, n, &qx, &qy, yt, dot, os);
        }
    }
}

/// Random raw blocks (every code pattern; the f16 fields at byte offsets `f16_at` of each
/// block finite) for `rows` rows of `n` elements.
pub fn raw_rows(t: GgmlType, f16_at: &[usize], n: usize, rows: usize, seed: u32) -> Vec<u8> {
    let mut next = xorshift(seed.wrapping_mul(0x9e37_79b9).max(1));
    let mut q: Vec<u8> = (0..t.row_size(n) * rows).map(|_| next() as u8).collect();
    for block in q.chunks_exact_mut(t.type_size()) {
        for &o in f16_at {
            let h = super::f32_to_f16((next() % 2001) as f32 / 1000.0 - 1.0);
            block[o..o + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    q
}

#[cfg(target_arch = "x86_64")]
/// Every result of each tile equals `dot` of its row and column to the bit, on raw random
/// weight blocks against full-scale activations (codes ±127: where integer sums come
/// closest to overflowing).
pub fn check_tiles_raw(
    t: GgmlType,
    f16_at: &[usize],
    yt: GgmlType,
    yfrom: FromF32,
    dot: VecDot,
    tiles: &[Tile],
) {
    for tile in tiles {
        for nb in [1, 3, 7, 33] {
            let n = nb * t.block_size();
            let os = 4 * tile.rows + 8;
            let qx = raw_rows(t, f16_at, n, tile.rows, nb as u32);
            let mut qy = vec![];
            for c in 0..tile.cols {
                let mut next = xorshift(77u32 + c as u32 * 31 + nb as u32);
                let v: Vec<f32> = (0..n)
                    .map(|_| {
                        if next() & 1 != 0 || c % 2 == 1 {
                            1.0
                        } else {
                            -1.0
                        }
                    })
                    .collect();
                qy.extend(quantize(yt, yfrom, &v));
            }
            assert_tile_is_dot(t, "raw ", tile, n, &qx, &qy, yt, dot, os);
        }
    }
}

/// Two dots of one format (an AVX-512 one and the AVX2 one) agree to the bit, on quantized
/// data and on raw random blocks against full-scale activations. Runs where the CPU has
/// AVX-512, whatever `ROCMFORGE_SIMD` forces; says when it skipped.
#[cfg(target_arch = "x86_64")]
pub fn check_same_dot(
    t: GgmlType,
    from: FromF32,
    f16_at: &[usize],
    yt: GgmlType,
    yfrom: FromF32,
    dot: VecDot,
    avx2_dot: VecDot,
) {
    use crate::cpu::simd;
    if !simd::has_avx512() {
        println!("{t:?} AVX-512 dot: SKIPPED, this CPU has no AVX-512");
        return;
    }
    for nb in [1, 2, 3, 8, 17] {
        let n = nb * t.block_size();
        for (k, qx) in [
            quantize(t, from, &data(n, nb as u32)),
            raw_rows(t, f16_at, n, 1, nb as u32),
        ]
        .iter()
        .enumerate()
        {
            let yv: Vec<f32> = if k == 0 {
                data(n, nb as u32 + 100)
            } else {
                (0..n)
                    .map(|i| if (i * 7919) % 3 == 0 { -1.0 } else { 1.0 })
                    .collect()
            };
            let qy = quantize(yt, yfrom, &yv);
            let (a, b) = unsafe {
                (
                    dot(n, qx.as_ptr(), qy.as_ptr()),
                    avx2_dot(n, qx.as_ptr(), qy.as_ptr()),
                )
            };
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{t:?} n={n} {}: {a} vs AVX2 {b}",
                ["quantized", "raw"][k]
            );
        }
    }
    if super::use_avx512() {
        assert_eq!(
            crate::cpu::types::traits(t).unwrap().vec_dot.unwrap() as usize,
            dot as usize,
            "{t:?}: AVX-512 dot not dispatched"
        );
    }
    println!("{t:?} AVX-512 dot: ran (level {:?})", simd::level());
}

/// A format's tiles beyond AVX2 (512-bit with VNNI and without, 256-bit VNNI in EVEX and
/// VEX form) against its AVX2 `vec_dot`, bit for bit, on quantized and on raw blocks. Each
/// runs where the CPU has it, whatever `ROCMFORGE_SIMD` forces, and says so on stdout;
/// where it has not, says that it skipped.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub fn check_avx512_tiles(
    t: GgmlType,
    from: FromF32,
    f16_at: &[usize],
    yt: GgmlType,
    yfrom: FromF32,
    avx2_dot: VecDot,
    vnni: &[Tile],
    bw: &[Tile],
    vnni256: &[Tile],
    avxvnni: &[Tile],
) {
    use crate::cpu::simd;
    let (mut ran, mut sets) = (vec![], vec![]);
    if is_x86_feature_detected!("avxvnni") && simd::level() >= simd::Level::Avx2 {
        ran.push("AVX-VNNI 256");
        sets.push(avxvnni);
    } else {
        println!("{t:?} AVX-VNNI (256-bit) tiles: SKIPPED, this CPU has no AVX-VNNI");
    }
    if simd::has_avx512() {
        ran.push("AVX-512BW");
        sets.push(bw);
    } else {
        println!("{t:?} AVX-512 tiles: SKIPPED, this CPU has no AVX-512");
    }
    if simd::has_avx512_vnni_cpu() {
        ran.extend(["AVX-512 VNNI", "AVX-512 VNNI 256"]);
        sets.extend([vnni, vnni256]);
    } else {
        println!("{t:?} AVX-512 VNNI tiles: SKIPPED, this CPU has no AVX-512 VNNI");
    }
    for tiles in sets {
        let some: Vec<Option<Tile>> = tiles.iter().map(|&t| Some(t)).collect();
        check_tiles(t, from, yt, yfrom, avx2_dot, &some);
        check_tiles_raw(t, f16_at, yt, yfrom, avx2_dot, tiles);
    }
    if super::tile_isa(false) == Some(super::TileIsa::Avx512Vnni)
        || super::tile_isa(false) == Some(super::TileIsa::Avx512)
    {
        let gemm = self::tiles(t)[0].unwrap();
        let want = if simd::has_avx512_vnni() { vnni } else { bw };
        assert!(
            want.iter().any(|w| w.dot as usize == gemm.dot as usize),
            "{t:?}: not the expected AVX-512 gemm tile"
        );
    }
    println!(
        "{t:?} tiles beyond AVX2: ran {} (level {:?}, gemm {:?}, gemv {:?})",
        ran.join(", "),
        simd::level(),
        super::tile_isa(false),
        super::tile_isa(true)
    );
}

/// Each of `dots` approximates the product of the dequantized values (within 1e-5 of the sum
/// of the products' magnitudes) for the raw weight bytes `qx` of `n` elements against the
/// activations `acts`, quantized to `yt`, and a random and a ±1 activation of its own (codes
/// ±127, where integer sums come closest to overflowing).
#[allow(clippy::too_many_arguments)]
pub fn check_dots_dequantized(
    qx: &[u8],
    n: usize,
    to: ToF32,
    yt: GgmlType,
    yfrom: FromF32,
    yto: ToF32,
    dots: &[VecDot],
    acts: &[Vec<f32>],
    seed: u32,
) {
    let mut next = xorshift(seed + 7);
    let full: Vec<f32> = (0..n)
        .map(|_| if next() & 1 != 0 { 1.0 } else { -1.0 })
        .collect();
    let dx = dequantize(to, qx, n);
    for yv in [data(n, seed + 100), full].iter().chain(acts) {
        let qy = quantize(yt, yfrom, yv);
        let dy = dequantize(yto, &qy, n);
        let exact: f64 = dx.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum();
        let mag: f64 = dx
            .iter()
            .zip(&dy)
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum();
        assert!(mag > 0.0);
        for dot in dots {
            let got = unsafe { dot(n, qx.as_ptr(), qy.as_ptr()) };
            assert!(
                (got as f64 - exact).abs() <= 1e-5 * mag + 1e-6,
                "n={n}: {got} vs {exact}"
            );
        }
    }
}

/// The dispatched dot equals the scalar reference (tightly) and approximates the dot of the
/// dequantized values (loosely: the activation side is quantized too).
#[allow(clippy::too_many_arguments)]
pub fn check_vec_dot(
    t: GgmlType,
    from: FromF32,
    to: ToF32,
    yt: GgmlType,
    yfrom: FromF32,
    yto: ToF32,
    dot: VecDot,
    dot_ref: VecDot,
) {
    assert_simd_dispatched(t, dot, dot_ref);
    let bs = t.block_size();
    for nb in [1, 2, 3, 8, 17, 40] {
        let n = nb * bs;
        let x = data(n, nb as u32);
        let yv = data(n, nb as u32 + 100);
        let qx = quantize(t, from, &x);
        let qy = quantize(yt, yfrom, &yv);
        let fast = unsafe { dot(n, qx.as_ptr(), qy.as_ptr()) };
        let slow = unsafe { dot_ref(n, qx.as_ptr(), qy.as_ptr()) };
        let dx = dequantize(to, &qx, n);
        let dy = dequantize(yto, &qy, n);
        let exact: f64 = dx.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum();
        let mag: f64 = dx
            .iter()
            .zip(&dy)
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum();
        assert!(
            ((fast - slow) as f64).abs() <= 1e-5 * mag + 1e-6,
            "{t:?} n={n}: simd {fast} vs scalar {slow}"
        );
        assert!(
            (slow as f64 - exact).abs() <= 2e-3 * mag + 1e-5,
            "{t:?} n={n}: dot {slow} vs dequantized {exact}"
        );
    }
}

/// The dispatched dot equals the scalar reference on raw random weight bytes (every code,
/// sub-block scale and high-bit pattern, not only what the quantizer produces; the f16
/// fields at byte offsets `f16_at` of each block get finite values) against activations at
/// full scale (codes ±127, where i16 intermediate sums come closest to saturating), over
/// odd block counts.
#[allow(clippy::too_many_arguments)]
pub fn check_vec_dot_extremes(
    t: GgmlType,
    to: ToF32,
    f16_at: &[usize],
    yt: GgmlType,
    yfrom: FromF32,
    yto: ToF32,
    dot: VecDot,
    dot_ref: VecDot,
) {
    assert_simd_dispatched(t, dot, dot_ref);
    let (bs, ts) = (t.block_size(), t.type_size());
    let mut next = xorshift(0x9e37_79b9);
    for nb in [1, 3, 7, 33] {
        let n = nb * bs;
        let mut qx: Vec<u8> = (0..t.row_size(n)).map(|_| next() as u8).collect();
        for block in qx.chunks_exact_mut(ts) {
            for &o in f16_at {
                let h = super::f32_to_f16((next() % 2001) as f32 / 1000.0 - 1.0);
                block[o..o + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        // Random signs of one magnitude, and a last block of one sign.
        let mut yv: Vec<f32> = (0..n)
            .map(|_| if next() & 1 != 0 { 1.0 } else { -1.0 })
            .collect();
        yv[n - bs..].fill(1.0);
        let qy = quantize(yt, yfrom, &yv);
        let fast = unsafe { dot(n, qx.as_ptr(), qy.as_ptr()) };
        let slow = unsafe { dot_ref(n, qx.as_ptr(), qy.as_ptr()) };
        let (dx, dy) = (dequantize(to, &qx, n), dequantize(yto, &qy, n));
        let mag: f64 = dx
            .iter()
            .zip(&dy)
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum();
        assert!(
            mag > 0.0 && mag.is_finite(),
            "{t:?} n={n}: degenerate test data"
        );
        assert!(
            ((fast - slow) as f64).abs() <= 1e-5 * mag + 1e-6,
            "{t:?} n={n}: simd {fast} vs scalar {slow}"
        );
    }
}

/// The repacked layouts' round trip (repack_*.rs): for each (rows, values per row), rows from
/// `rows_of` (blocks of `block_values` values in `block_bytes` bytes) repacked and back give the
/// bytes again; the whole groups of `group_rows` rows change and the tail rows stay as they are.
pub fn check_repack_round_trip(
    block_values: usize,
    block_bytes: usize,
    group_rows: usize,
    shapes: &[(usize, usize)],
    rows_of: impl Fn(usize, usize, u32) -> Vec<u8>,
    repack: unsafe fn(usize, usize, *const u8, *mut u8),
    unrepack: unsafe fn(usize, usize, *const u8, *mut u8),
) {
    for &(rows, k) in shapes {
        let nb = k / block_values;
        let w = rows_of(rows, k, 3);
        let mut p = vec![0u8; w.len()];
        let mut back = vec![0u8; w.len()];
        unsafe {
            repack(rows, nb, w.as_ptr(), p.as_mut_ptr());
            unrepack(rows, nb, p.as_ptr(), back.as_mut_ptr());
        }
        assert!(back == w, "rows={rows} k={k}");
        let whole = rows / group_rows * group_rows * nb * block_bytes;
        assert_eq!(p[whole..], w[whole..]);
        if whole > 0 {
            assert!(
                p[..whole] != w[..whole],
                "rows={rows} k={k}: nothing repacked"
            );
        }
    }
}
