//! Run-time choice of SIMD code. Kernels are compiled for several instruction sets
//! (`#[target_feature]`) and the best one the machine has is picked once at start-up,
//! so one binary runs well everywhere.

use once_cell::sync::Lazy;

/// Instruction-set level, ordered from plain scalar code up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Scalar = 0,
    Neon = 1,
    Avx2 = 2,
    Avx512 = 3,
}

static LEVEL: Lazy<Level> = Lazy::new(detect);

/// `ROCMFORGE_SIMD`, which forces a lower level than the machine has: `scalar`, `avx2` (no
/// VNNI either), `avx512-novnni` (the AVX-512 kernels without VNNI), for A/B runs and tests.
fn forced() -> Option<String> {
    crate::tuning::get().simd.clone()
}

fn detect() -> Level {
    match forced().as_deref() {
        Some("scalar") => return Level::Scalar,
        Some("avx2") if has_avx2() => return Level::Avx2,
        _ => {}
    }
    if has_avx512() {
        return Level::Avx512;
    }
    if has_avx2() {
        return Level::Avx2;
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Level::Neon;
        }
    }
    Level::Scalar
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// What the AVX-512 kernels are compiled for (`#[target_feature(enable = "avx512f,avx512bw,
/// avx512vl,...")]`), whatever level is forced: tests use it to run those kernels directly.
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-512 VNNI (`vpdpbusd`), whatever level is forced.
pub fn has_avx512_vnni_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx512() && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

pub fn level() -> Level {
    *LEVEL
}

static VNNI: Lazy<bool> = Lazy::new(|| {
    level() >= Level::Avx512
        && has_avx512_vnni_cpu()
        && forced().as_deref() != Some("avx512-novnni")
});

/// Whether the int8 dot products use AVX-512 VNNI (`vpdpbusd`).
pub fn has_avx512_vnni() -> bool {
    *VNNI
}

static AVX_VNNI: Lazy<bool> = Lazy::new(|| {
    #[cfg(target_arch = "x86_64")]
    {
        level() >= Level::Avx2
            && !matches!(forced().as_deref(), Some("avx2" | "avx512-novnni"))
            && is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
});

/// Whether the int8 dot products may use AVX-VNNI (the VEX-encoded 256-bit `vpdpbusd` of
/// Alder Lake and later, Zen 5).
pub fn has_avx_vnni() -> bool {
    *AVX_VNNI
}

/// Whether SDOT (FEAT_DotProd) is present, for the int8 dot products on aarch64.
pub fn has_dotprod() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        level() == Level::Neon && std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// Name/value pairs for `ggml_backend_get_features`.
pub fn features() -> Vec<(String, String)> {
    let l = level();
    let mut v = vec![("SIMD".to_string(), format!("{l:?}"))];
    if l >= Level::Avx2 {
        v.push(("AVX2".into(), "1".into()));
        v.push(("FMA".into(), "1".into()));
        v.push(("F16C".into(), "1".into()));
    }
    if l >= Level::Avx512 {
        v.push(("AVX512".into(), "1".into()));
    }
    if has_avx512_vnni() {
        v.push(("AVX512_VNNI".into(), "1".into()));
    }
    if has_avx_vnni() {
        v.push(("AVX_VNNI".into(), "1".into()));
    }
    if l == Level::Neon {
        v.push(("NEON".into(), "1".into()));
    }
    if has_dotprod() {
        v.push(("DOTPROD".into(), "1".into()));
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Float dot products: f32·f32, f16·f32, bf16·f32.
// ---------------------------------------------------------------------------------------------

pub fn dot_f32_ref(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 8];
    let n8 = a.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        for k in 0..8 {
            s[k] += a[i + k] * b[i + k];
        }
    }
    let mut t: f32 = s.iter().sum();
    for i in n8..a.len() {
        t += a[i] * b[i];
    }
    t
}

pub fn dot_f16_f32_ref(a: &[u16], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| half::f16::from_bits(x).to_f32() * y)
        .sum()
}

pub fn dot_bf16_f32_ref(a: &[u16], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f32::from_bits((x as u32) << 16) * y)
        .sum()
}

pub fn dot_f16_f16_ref(a: &[u16], b: &[u16]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| half::f16::from_bits(x).to_f32() * half::f16::from_bits(y).to_f32())
        .sum()
}

pub fn dot_bf16_bf16_ref(a: &[u16], b: &[u16]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f32::from_bits((x as u32) << 16) * f32::from_bits((y as u32) << 16))
        .sum()
}

pub fn dot_f16_f16(a: &[u16], b: &[u16]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx2 {
        return unsafe { x86::dot_f16_f16_avx2(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    if level() == Level::Neon {
        return unsafe { neon::dot_f16_f16(a, b) };
    }
    dot_f16_f16_ref(a, b)
}

/// f16·f16 in the order of ggml-cpu's row-by-vector kernel (four accumulators over steps of 32,
/// pairwise reduction, remainder in f64): what ggml uses when the activation has one column.
/// NEON has one f16·f16 kernel for both (no ggml order is matched there).
pub fn dot_f16_f16_single_column(a: &[u16], b: &[u16]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx512 {
        return unsafe { x86::dot_f16_f16_4acc_avx512(a, b) };
    }
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx2 {
        return unsafe { x86::dot_f16_f16_4acc_avx2(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    if level() == Level::Neon {
        return unsafe { neon::dot_f16_f16(a, b) };
    }
    dot_f16_f16_ref(a, b)
}

pub fn dot_bf16_bf16(a: &[u16], b: &[u16]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx512 {
        return unsafe { x86::dot_bf16_bf16_avx512(a, b) };
    }
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx2 {
        return unsafe { x86::dot_bf16_bf16_avx2(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    if level() == Level::Neon {
        return unsafe { neon::dot_bf16_bf16(a, b) };
    }
    dot_bf16_bf16_ref(a, b)
}

pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx512 {
        return unsafe { x86::dot_f32_avx512(a, b) };
    }
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx2 {
        return unsafe { x86::dot_f32_avx2(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    if level() == Level::Neon {
        return unsafe { neon::dot_f32(a, b) };
    }
    dot_f32_ref(a, b)
}

pub fn dot_f16_f32(a: &[u16], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx512 {
        return unsafe { x86::dot_f16_f32_avx512(a, b) };
    }
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx2 {
        return unsafe { x86::dot_f16_f32_avx2(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    if level() == Level::Neon {
        return unsafe { neon::dot_f16_f32(a, b) };
    }
    dot_f16_f32_ref(a, b)
}

pub fn dot_bf16_f32(a: &[u16], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx512 {
        return unsafe { x86::dot_bf16_f32_avx512(a, b) };
    }
    #[cfg(target_arch = "x86_64")]
    if level() >= Level::Avx2 {
        return unsafe { x86::dot_bf16_f32_avx2(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    if level() == Level::Neon {
        return unsafe { neon::dot_bf16_f32(a, b) };
    }
    dot_bf16_f32_ref(a, b)
}

/// Constants of Arm's vector expf (Arm optimized-routines, `v_expf`, MIT OR Apache-2.0 WITH
/// LLVM-exception): x = n·ln2 + r, e^r ≈ 1 + r·poly(r) with a degree-4 minimax poly. ggml-cpu's
/// SOFT_MAX, SILU, SWIGLU and tiled flash attention use this algorithm, so using it too makes
/// those ops agree with ggml's to the bit (libllama's results hinge on near-tied logits).
pub mod exp_arm_consts {
    pub const SHIFT: f32 = 12582912.0; // 0x1.8p23: adding it rounds to an integer
    pub const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
    pub const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
    pub const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
    pub const C: [f32; 5] = [
        f32::from_bits(0x3c07_2010), // 0x1.0e4020p-7
        f32::from_bits(0x3d2b_9f17), // 0x1.573e2ep-5
        f32::from_bits(0x3e2a_af33), // 0x1.555e66p-3
        f32::from_bits(0x3eff_fedb), // 0x1.fffdb6p-2
        f32::from_bits(0x3f7f_fff6), // 0x1.ffffecp-1
    ];
}

/// e^x by Arm's vector expf algorithm, one lane: the plain reference of `x86::exp_ps` (every
/// step is one IEEE operation, so both give the same bits) and the code on other machines.
pub fn exp_arm(x: f32) -> f32 {
    use exp_arm_consts as c;
    let z = x.mul_add(c::INV_LN2, c::SHIFT);
    let n = z - c::SHIFT;
    let r = (-n).mul_add(c::LN2_HI, x);
    let r = (-n).mul_add(c::LN2_LO, r);
    let e = z.to_bits() << 23;
    let scale = f32::from_bits(e.wrapping_add(0x3f80_0000));
    let r2 = r * r;
    let p = c::C[0].mul_add(r, c::C[1]);
    let q = c::C[2].mul_add(r, c::C[3]);
    let q = p.mul_add(r2, q);
    let poly = q.mul_add(r2, c::C[4] * r);
    let absn = n.abs();
    if !(absn > 126.0) {
        return poly.mul_add(scale, scale);
    }
    let b = if n <= 0.0 { 0x8200_0000u32 } else { 0 };
    let s1 = f32::from_bits(b.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(b));
    if absn > 192.0 {
        s1 * s1
    } else {
        poly.mul_add(s2, s2) * s1
    }
}

/// Sum of 8 lanes in the order of `x86::hsum` (and of ggml-cpu's AVX2 reductions).
pub fn hsum8(v: &[f32; 8]) -> f32 {
    ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
}

/// y = e^(x - max) and the sum of y, in ggml-cpu's order: whole groups of 8 by [`exp_arm`],
/// each group summed as 8 lanes and added to an f64; the rest by libm's expf.
pub fn softmax_exp_row(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    let n = x.len();
    let whole = n / 8 * 8;
    #[cfg(target_arch = "x86_64")]
    let mut sum = if level() >= Level::Avx2 {
        unsafe { x86::softmax_exp_groups(&x[..whole], max, &mut y[..whole]) }
    } else {
        softmax_exp_groups_ref(&x[..whole], max, &mut y[..whole])
    };
    #[cfg(not(target_arch = "x86_64"))]
    let mut sum = softmax_exp_groups_ref(&x[..whole], max, &mut y[..whole]);
    for i in whole..n {
        let v = (x[i] - max).exp();
        y[i] = v;
        sum += v as f64;
    }
    sum
}

fn softmax_exp_groups_ref(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    let mut sum = 0f64;
    for (xs, ys) in x.chunks_exact(8).zip(y.chunks_exact_mut(8)) {
        let mut v = [0f32; 8];
        for i in 0..8 {
            v[i] = exp_arm(xs[i] - max);
        }
        ys.copy_from_slice(&v);
        sum += hsum8(&v) as f64;
    }
    sum
}

/// SiLU x / (1 + e^-x), times `g` when given, as ggml-cpu computes it: groups of 8 with
/// [`exp_arm`], the rest with libm's expf.
pub fn silu_row(x: &[f32], g: Option<&[f32]>, y: &mut [f32]) {
    let n = x.len();
    let whole = n / 8 * 8;
    #[cfg(target_arch = "x86_64")]
    let done = if level() >= Level::Avx2 {
        unsafe { x86::silu_groups(&x[..whole], g.map(|g| &g[..whole]), &mut y[..whole]) };
        whole
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for i in done..n {
        let e = if i < whole {
            exp_arm(-x[i])
        } else {
            (-x[i]).exp()
        };
        let s = x[i] / (1.0 + e);
        y[i] = match g {
            Some(g) => s * g[i],
            None => s,
        };
    }
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// e^x for 8 lanes by Arm's vector expf algorithm (see [`super::exp_arm`], which is the
    /// same arithmetic one lane at a time): within 1.5 ulp + 0.5; below about -104 (-inf
    /// included) 0, above about 88.4 +inf.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_ps(x: __m256) -> __m256 {
        use super::exp_arm_consts as c;
        let shift = _mm256_set1_ps(c::SHIFT);
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(c::INV_LN2), shift);
        let n = _mm256_sub_ps(z, shift);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::LN2_LO), r);
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let scale = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f80_0000)));
        let absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let big = _mm256_cmp_ps::<_CMP_GT_OQ>(absn, _mm256_set1_ps(126.0));
        let r2 = _mm256_mul_ps(r, r);
        let p = _mm256_fmadd_ps(_mm256_set1_ps(c::C[0]), r, _mm256_set1_ps(c::C[1]));
        let q = _mm256_fmadd_ps(_mm256_set1_ps(c::C[2]), r, _mm256_set1_ps(c::C[3]));
        let q = _mm256_fmadd_ps(p, r2, q);
        let poly = _mm256_fmadd_ps(q, r2, _mm256_mul_ps(_mm256_set1_ps(c::C[4]), r));
        let plain = _mm256_fmadd_ps(poly, scale, scale);
        if _mm256_movemask_ps(big) == 0 {
            return plain;
        }
        // 2^n out of the exponent's range: scale in two factors s1·s2.
        let b = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
            _mm256_set1_epi32(0x8200_0000u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(b, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, b));
        let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(absn, _mm256_set1_ps(192.0));
        let split = _mm256_mul_ps(_mm256_fmadd_ps(poly, s2, s2), s1);
        let v = _mm256_blendv_ps(plain, split, big);
        _mm256_blendv_ps(v, _mm256_mul_ps(s1, s1), huge)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax_exp_groups(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
        let mut sum = 0f64;
        let m = _mm256_set1_ps(max);
        for i in (0..x.len()).step_by(8) {
            let v = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
            sum += hsum(v) as f64;
        }
        sum
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_groups(x: &[f32], g: Option<&[f32]>, y: &mut [f32]) {
        let one = _mm256_set1_ps(1.0);
        for i in (0..x.len()).step_by(8) {
            let xv = _mm256_loadu_ps(x.as_ptr().add(i));
            let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), xv));
            let mut s = _mm256_div_ps(xv, _mm256_add_ps(one, e));
            if let Some(g) = g {
                s = _mm256_mul_ps(s, _mm256_loadu_ps(g.as_ptr().add(i)));
            }
            _mm256_storeu_ps(y.as_mut_ptr().add(i), s);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..4 {
                acc[k] = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i + 8 * k)),
                    _mm256_loadu_ps(pb.add(i + 8 * k)),
                    acc[k],
                );
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i)),
                _mm256_loadu_ps(pb.add(i)),
                acc[0],
            );
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_f32_avx2(a: &[u16], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..4 {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i + 8 * k) as *const __m128i));
                acc[k] = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i + 8 * k)), acc[k]);
            }
            i += 32;
        }
        while i + 8 <= n {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
            acc[0] = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i)), acc[0]);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += half::f16::from_bits(a[i]).to_f32() * b[i];
            i += 1;
        }
        s
    }

    /// One accumulator over chunks of 8, then a horizontal sum: the order of ggml-cpu's
    /// tinyBLAS F16 kernel (used for every F16 MUL_MAT whose length is a multiple of 8), so
    /// attention scores agree with ggml's to the bit.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_f16_avx2(a: &[u16], b: &[u16]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
            let y = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i) as *const __m128i));
            acc = _mm256_fmadd_ps(x, y, acc);
            i += 8;
        }
        let mut s = hsum(acc);
        while i < n {
            s += half::f16::from_bits(a[i]).to_f32() * half::f16::from_bits(b[i]).to_f32();
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_f16_4acc_avx2(a: &[u16], b: &[u16]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..4 {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i + 8 * k) as *const __m128i));
                let y = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i + 8 * k) as *const __m128i));
                acc[k] = _mm256_fmadd_ps(x, y, acc[k]);
            }
            i += 32;
        }
        let a02 = _mm256_add_ps(acc[0], acc[2]);
        let a13 = _mm256_add_ps(acc[1], acc[3]);
        let v = _mm256_add_ps(a02, a13);
        let t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        let mut s = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
        while i < n {
            s += (half::f16::from_bits(a[i]).to_f32() * half::f16::from_bits(b[i]).to_f32()) as f64;
            i += 1;
        }
        s as f32
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_bf16_bf16_avx2(a: &[u16], b: &[u16]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        while i + 16 <= n {
            for k in 0..2 {
                let h = _mm_loadu_si128(pa.add(i + 8 * k) as *const __m128i);
                let x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
                let g = _mm_loadu_si128(pb.add(i + 8 * k) as *const __m128i);
                let y = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(g), 16));
                acc[k] = _mm256_fmadd_ps(x, y, acc[k]);
            }
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
        while i < n {
            s += f32::from_bits((a[i] as u32) << 16) * f32::from_bits((b[i] as u32) << 16);
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_bf16_f32_avx2(a: &[u16], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        while i + 16 <= n {
            for k in 0..2 {
                let h = _mm_loadu_si128(pa.add(i + 8 * k) as *const __m128i);
                let x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
                acc[k] = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i + 8 * k)), acc[k]);
            }
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
        while i < n {
            s += f32::from_bits((a[i] as u32) << 16) * b[i];
            i += 1;
        }
        s
    }

    // AVX-512 versions: one 512-bit register holds two of the AVX2 kernel's 256-bit
    // accumulators (the same lanes over the same elements), and the final reduction combines
    // them in the AVX2 kernel's order, so the results are the same to the bit.

    /// The two 256-bit halves of `v`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn halves(v: __m512) -> (__m256, __m256) {
        (
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        )
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn dot_f32_avx512(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // [acc0 | acc1], [acc2 | acc3] of dot_f32_avx2.
        let mut z = [_mm512_setzero_ps(); 2];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..2 {
                z[k] = _mm512_fmadd_ps(
                    _mm512_loadu_ps(pa.add(i + 16 * k)),
                    _mm512_loadu_ps(pb.add(i + 16 * k)),
                    z[k],
                );
            }
            i += 32;
        }
        let ((mut a0, a1), (a2, a3)) = (halves(z[0]), halves(z[1]));
        while i + 8 <= n {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), a0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn dot_f16_f32_avx512(a: &[u16], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut z = [_mm512_setzero_ps(); 2];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..2 {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(pa.add(i + 16 * k) as *const __m256i));
                z[k] = _mm512_fmadd_ps(x, _mm512_loadu_ps(pb.add(i + 16 * k)), z[k]);
            }
            i += 32;
        }
        let ((mut a0, a1), (a2, a3)) = (halves(z[0]), halves(z[1]));
        while i + 8 <= n {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
            a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i)), a0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        while i < n {
            s += half::f16::from_bits(a[i]).to_f32() * b[i];
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn dot_f16_f16_4acc_avx512(a: &[u16], b: &[u16]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut z = [_mm512_setzero_ps(); 2];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..2 {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(pa.add(i + 16 * k) as *const __m256i));
                let y = _mm512_cvtph_ps(_mm256_loadu_si256(pb.add(i + 16 * k) as *const __m256i));
                z[k] = _mm512_fmadd_ps(x, y, z[k]);
            }
            i += 32;
        }
        // [acc0 + acc2 | acc1 + acc3], then their sum: the AVX2 kernel's a02 + a13.
        let (a02, a13) = halves(_mm512_add_ps(z[0], z[1]));
        let v = _mm256_add_ps(a02, a13);
        let t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        let mut s = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
        while i < n {
            s += (half::f16::from_bits(a[i]).to_f32() * half::f16::from_bits(b[i]).to_f32()) as f64;
            i += 1;
        }
        s as f32
    }

    /// 16 bf16 as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn bf16x16(p: *const u16) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256(p as *const __m256i),
        )))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn dot_bf16_bf16_avx512(a: &[u16], b: &[u16]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // [acc0 | acc1] of dot_bf16_bf16_avx2.
        let mut z = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            z = _mm512_fmadd_ps(bf16x16(pa.add(i)), bf16x16(pb.add(i)), z);
            i += 16;
        }
        let (a0, a1) = halves(z);
        let mut s = hsum(_mm256_add_ps(a0, a1));
        while i < n {
            s += f32::from_bits((a[i] as u32) << 16) * f32::from_bits((b[i] as u32) << 16);
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn dot_bf16_f32_avx512(a: &[u16], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut z = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            z = _mm512_fmadd_ps(bf16x16(pa.add(i)), _mm512_loadu_ps(pb.add(i)), z);
            i += 16;
        }
        let (a0, a1) = halves(z);
        let mut s = hsum(_mm256_add_ps(a0, a1));
        while i < n {
            s += f32::from_bits((a[i] as u32) << 16) * b[i];
            i += 1;
        }
        s
    }
}

/// NEON float dots: one kernel over pairs of element kinds, 16 elements a step into four
/// accumulators. f16 → f32 is FCVTL, part of base AArch64 SIMD (FEAT_FP16 adds only f16
/// arithmetic), so no run-time check is needed for it.
#[cfg(target_arch = "aarch64")]
pub mod neon {
    use std::arch::aarch64::*;

    /// Four f16 (the 64-bit word's halves, low first) as f32.
    #[inline(always)]
    pub unsafe fn f16x4(bits: u64) -> float32x4_t {
        vcvt_f32_f16(vreinterpret_f16_u64(vcreate_u64(bits)))
    }

    /// One f16 as f32 (`half` would detect FEAT_FP16 and call out, spilling the caller's vectors).
    #[inline(always)]
    pub unsafe fn f16(h: u16) -> f32 {
        vgetq_lane_f32::<0>(f16x4(h as u64))
    }

    /// f32 → f16 bits, rounded to nearest even like `half`.
    #[inline(always)]
    pub unsafe fn f32_to_f16(v: f32) -> u16 {
        vget_lane_u16::<0>(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(v))))
    }

    /// An element type as the dots read it: 8 at a time into two f32 vectors, or one alone.
    trait Kind {
        type T: Copy;
        unsafe fn load8(p: *const Self::T) -> [float32x4_t; 2];
        fn get(x: Self::T) -> f32;
    }

    struct F32;
    struct F16;
    struct Bf16;

    impl Kind for F32 {
        type T = f32;
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> [float32x4_t; 2] {
            [vld1q_f32(p), vld1q_f32(p.add(4))]
        }
        fn get(x: f32) -> f32 {
            x
        }
    }

    impl Kind for F16 {
        type T = u16;
        #[inline(always)]
        unsafe fn load8(p: *const u16) -> [float32x4_t; 2] {
            let h = vld1q_u16(p);
            [
                vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h))),
                vcvt_high_f32_f16(vreinterpretq_f16_u16(h)),
            ]
        }
        fn get(x: u16) -> f32 {
            unsafe { f16(x) }
        }
    }

    impl Kind for Bf16 {
        type T = u16;
        #[inline(always)]
        unsafe fn load8(p: *const u16) -> [float32x4_t; 2] {
            // bf16 is the top half of an f32: widen with a shift by 16.
            let h = vld1q_u16(p);
            [
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
            ]
        }
        fn get(x: u16) -> f32 {
            f32::from_bits((x as u32) << 16)
        }
    }

    #[inline(always)]
    unsafe fn dot<A: Kind, B: Kind>(a: &[A::T], b: &[B::T]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for h in 0..2 {
                let (x, y) = (A::load8(pa.add(i + 8 * h)), B::load8(pb.add(i + 8 * h)));
                acc[2 * h] = vfmaq_f32(acc[2 * h], x[0], y[0]);
                acc[2 * h + 1] = vfmaq_f32(acc[2 * h + 1], x[1], y[1]);
            }
            i += 16;
        }
        if i + 8 <= n {
            let (x, y) = (A::load8(pa.add(i)), B::load8(pb.add(i)));
            acc[0] = vfmaq_f32(acc[0], x[0], y[0]);
            acc[1] = vfmaq_f32(acc[1], x[1], y[1]);
            i += 8;
        }
        let mut s = vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ));
        while i < n {
            s += A::get(a[i]) * B::get(b[i]);
            i += 1;
        }
        s
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        dot::<F32, F32>(a, b)
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn dot_f16_f32(a: &[u16], b: &[f32]) -> f32 {
        dot::<F16, F32>(a, b)
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn dot_f16_f16(a: &[u16], b: &[u16]) -> f32 {
        dot::<F16, F16>(a, b)
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn dot_bf16_f32(a: &[u16], b: &[f32]) -> f32 {
        dot::<Bf16, F32>(a, b)
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn dot_bf16_bf16(a: &[u16], b: &[u16]) -> f32 {
        dot::<Bf16, Bf16>(a, b)
    }
}

#[cfg(test)]
mod tests {
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
        while xs.len() % 8 != 0 {
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
            assert!(
                (dot_f16_f16_single_column(&a16, &b16) - dot_f16_f16_ref(&a16, &b16)).abs() < 1e-3
            );
            assert!((dot_bf16_bf16(&ab, &bb) - dot_bf16_bf16_ref(&ab, &bb)).abs() < 1e-3);
            #[cfg(target_arch = "aarch64")]
            {
                // The NEON kernels against the references, and the dispatched dots must be them
                // (to the bit), or the checks above compared the references with themselves.
                assert!(
                    level() == Level::Neon || forced().is_some_and(|v| v == "scalar"),
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
}
