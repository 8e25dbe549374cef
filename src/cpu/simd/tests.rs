use super::*;

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn exp_ps_matches_libm() {
    if level() < Level::Avx2 {
        return;
    }
    use std::arch::x86_64::*;
    let mut worst = 0f64;
    let mut xs: Vec<f32> = (0..200_000)
        .map(|i| -87.0 + 175.0 * i as f32 / 200_000.0)
        .collect();
    xs.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, -87.3, 0.5, -0.5]);
    for c in xs.chunks_exact(8) {
        let mut out = [0f32; 8];
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), x86::exp_ps(_mm256_loadu_ps(c.as_ptr()))) };
        for (&x, &y) in c.iter().zip(&out) {
            let want = (x as f64).exp();
            if want > f32::MIN_POSITIVE as f64 {
                worst = worst.max(((y as f64 - want) / want).abs());
            }
        }
    }
    assert!(worst < 2.5e-7, "relative error {worst}");
    let mut out = [1f32; 8];
    let edge = [
        f32::NEG_INFINITY,
        -1e30,
        -110.0,
        -104.5,
        f32::INFINITY,
        1e30,
        100.0,
        0.0,
    ];
    unsafe {
        _mm256_storeu_ps(
            out.as_mut_ptr(),
            x86::exp_ps(_mm256_loadu_ps(edge.as_ptr())),
        )
    };
    assert_eq!(&out[..4], &[0.0; 4]);
    assert!(out[4..7].iter().all(|v| *v == f32::INFINITY));
    assert_eq!(out[7], 1.0);
}

/// The 8-lane exp and its one-lane reference give the same bits everywhere, special
/// ranges (subnormal results, overflow, infinities) included.
#[cfg(target_arch = "x86_64")]
#[test]
fn exp_ps_equals_exp_arm() {
    if level() < Level::Avx2 {
        return;
    }
    use std::arch::x86_64::*;
    let mut xs: Vec<f32> = (0..400_000)
        .map(|i| -200.0 + 400.0 * i as f32 / 400_000.0)
        .collect();
    xs.extend([
        f32::NEG_INFINITY,
        f32::INFINITY,
        -0.0,
        0.0,
        88.3,
        88.4,
        88.8,
        -87.5,
        -103.9,
        -104.1,
        -150.0,
        1e-40,
        -1e-40,
        1e30,
        -1e30,
        0.5,
    ]);
    xs.extend(data(4096, 11).iter().map(|v| v * 30.0));
    while !xs.len().is_multiple_of(8) {
        xs.push(1.0);
    }
    for c in xs.chunks_exact(8) {
        let mut out = [0f32; 8];
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), x86::exp_ps(_mm256_loadu_ps(c.as_ptr()))) };
        for (&x, &y) in c.iter().zip(&out) {
            assert_eq!(
                y.to_bits(),
                exp_arm(x).to_bits(),
                "x={x}: 8 lanes {y} vs one lane {}",
                exp_arm(x)
            );
        }
    }
    // The softmax and SiLU rows: AVX2 and the one-lane path agree to the bit.
    for n in [0, 5, 8, 13, 64, 100] {
        let x = data(n, 7).iter().map(|v| v * 8.0).collect::<Vec<f32>>();
        let g = data(n, 8);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let (mut y, mut yr) = (vec![0f32; n], vec![0f32; n]);
        let s = softmax_exp_row(&x, max, &mut y);
        let whole = n / 8 * 8;
        let mut sr = softmax_exp_groups_ref(&x[..whole], max, &mut yr[..whole]);
        for i in whole..n {
            yr[i] = (x[i] - max).exp();
            sr += yr[i] as f64;
        }
        assert_eq!(s.to_bits(), sr.to_bits());
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            yr.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        silu_row(&x, Some(&g), &mut y);
        for i in 0..n {
            let e = if i < whole {
                exp_arm(-x[i])
            } else {
                (-x[i]).exp()
            };
            assert_eq!(
                y[i].to_bits(),
                (x[i] / (1.0 + e) * g[i]).to_bits(),
                "silu n={n} i={i}"
            );
        }
    }
}

/// The AVX-512 float dots give the AVX2 kernels' results to the bit (same lanes, same
/// reduction order). Runs where the CPU has AVX-512, whatever `ROCMFORGE_SIMD` forces.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_float_dots_equal_avx2() {
    if !has_avx512() {
        println!("avx512_float_dots_equal_avx2: SKIPPED, this CPU has no AVX-512");
        return;
    }
    for n in [
        0,
        1,
        7,
        8,
        15,
        16,
        17,
        31,
        32,
        33,
        40,
        47,
        63,
        64,
        100,
        257,
        4096 + 24,
    ] {
        let a = data(n, 3);
        let b = data(n, 4);
        let a16: Vec<u16> = a
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        let b16: Vec<u16> = b
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        let ab: Vec<u16> = a
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        let bb: Vec<u16> = b
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        let same = |x: f32, y: f32, what: &str| {
            assert_eq!(
                x.to_bits(),
                y.to_bits(),
                "{what} n={n}: avx512 {x} vs avx2 {y}"
            )
        };
        unsafe {
            same(
                x86::dot_f32_avx512(&a, &b),
                x86::dot_f32_avx2(&a, &b),
                "f32",
            );
            same(
                x86::dot_f16_f32_avx512(&a16, &b),
                x86::dot_f16_f32_avx2(&a16, &b),
                "f16·f32",
            );
            same(
                x86::dot_f16_f16_4acc_avx512(&a16, &b16),
                x86::dot_f16_f16_4acc_avx2(&a16, &b16),
                "f16·f16 4acc",
            );
            same(
                x86::dot_bf16_bf16_avx512(&ab, &bb),
                x86::dot_bf16_bf16_avx2(&ab, &bb),
                "bf16·bf16",
            );
            same(
                x86::dot_bf16_f32_avx512(&ab, &b),
                x86::dot_bf16_f32_avx2(&ab, &b),
                "bf16·f32",
            );
        }
        if level() == Level::Avx512 {
            same(
                dot_f32(&a, &b),
                unsafe { x86::dot_f32_avx512(&a, &b) },
                "dispatched f32",
            );
        }
    }
    println!(
        "avx512_float_dots_equal_avx2: ran on AVX-512 (level {:?})",
        level()
    );
}

/// The NEON f16 conversions against `half`: every f16, and f32s spread over all exponents.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_f16_conversions_match_half() {
    for h in 0..=u16::MAX {
        let (got, want) = (unsafe { neon::f16(h) }, half::f16::from_bits(h).to_f32());
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{h:#06x}: {got} vs {want}"
        );
    }
    for bits in (0..=u32::MAX).step_by(997) {
        let v = f32::from_bits(bits);
        let (got, want) = (unsafe { neon::f32_to_f16(v) }, half::f16::from_f32(v));
        assert!(
            got == want.to_bits() || (want.is_nan() && half::f16::from_bits(got).is_nan()),
            "{v:e}: {got:#06x} vs {:#06x}",
            want.to_bits()
        );
    }
}

#[test]
fn simd_dots_match_reference() {
    for n in [0, 1, 7, 8, 31, 32, 33, 100, 257] {
        let a = data(n, 1);
        let b = data(n, 2);
        let a16: Vec<u16> = a
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        let ab: Vec<u16> = a
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        assert!((dot_f32(&a, &b) - dot_f32_ref(&a, &b)).abs() < 1e-3);
        assert!((dot_f16_f32(&a16, &b) - dot_f16_f32_ref(&a16, &b)).abs() < 1e-3);
        assert!((dot_bf16_f32(&ab, &b) - dot_bf16_f32_ref(&ab, &b)).abs() < 1e-3);
        let b16: Vec<u16> = b
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        let bb: Vec<u16> = b
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        assert!((dot_f16_f16(&a16, &b16) - dot_f16_f16_ref(&a16, &b16)).abs() < 1e-3);
        assert!((dot_f16_f16_single_column(&a16, &b16) - dot_f16_f16_ref(&a16, &b16)).abs() < 1e-3);
        assert!((dot_bf16_bf16(&ab, &bb) - dot_bf16_bf16_ref(&ab, &bb)).abs() < 1e-3);
        #[cfg(target_arch = "aarch64")]
        {
            // The NEON kernels against the references, and the dispatched dots must be them
            // (to the bit), or the checks above compared the references with themselves.
            assert!(
                level() == Level::Neon || super::forced().is_some_and(|v| v == "scalar"),
                "NEON not detected"
            );
            let same = |fast: f32, slow: f32, dispatched: f32, what: &str| {
                assert!(
                    (fast - slow).abs() < 1e-3,
                    "{what} n={n}: neon {fast} vs scalar {slow}"
                );
                if level() == Level::Neon {
                    assert_eq!(
                        dispatched.to_bits(),
                        fast.to_bits(),
                        "{what} n={n}: NEON is not what is dispatched"
                    );
                }
            };
            unsafe {
                same(
                    neon::dot_f32(&a, &b),
                    dot_f32_ref(&a, &b),
                    dot_f32(&a, &b),
                    "f32",
                );
                same(
                    neon::dot_f16_f32(&a16, &b),
                    dot_f16_f32_ref(&a16, &b),
                    dot_f16_f32(&a16, &b),
                    "f16·f32",
                );
                same(
                    neon::dot_bf16_f32(&ab, &b),
                    dot_bf16_f32_ref(&ab, &b),
                    dot_bf16_f32(&ab, &b),
                    "bf16·f32",
                );
                same(
                    neon::dot_f16_f16(&a16, &b16),
                    dot_f16_f16_ref(&a16, &b16),
                    dot_f16_f16(&a16, &b16),
                    "f16·f16",
                );
                same(
                    neon::dot_f16_f16(&a16, &b16),
                    dot_f16_f16_ref(&a16, &b16),
                    dot_f16_f16_single_column(&a16, &b16),
                    "f16·f16 single column",
                );
                same(
                    neon::dot_bf16_bf16(&ab, &bb),
                    dot_bf16_bf16_ref(&ab, &bb),
                    dot_bf16_bf16(&ab, &bb),
                    "bf16·bf16",
                );
            }
        }
    }
}

/// FlushSubnormals flushes while alive and gives the thread its mode back when dropped.
#[cfg(target_arch = "x86_64")]
#[test]
fn flush_subnormals_is_scoped() {
    let tiny = std::hint::black_box(f32::MIN_POSITIVE);
    let half = std::hint::black_box(0.5f32);
    assert!((tiny * half).is_subnormal());
    {
        let _f = FlushSubnormals::new();
        assert_eq!(std::hint::black_box(tiny * half), 0.0);
        // Subnormal inputs read as zero.
        let sub = std::hint::black_box(f32::from_bits(1));
        assert_eq!(std::hint::black_box(sub * 2.0), 0.0);
    }
    assert!(std::hint::black_box(tiny * half).is_subnormal());
}
