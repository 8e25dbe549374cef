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

/// While alive, the calling thread's float unit flushes subnormal results to zero and reads
/// subnormal inputs as zero (x86: MXCSR's FTZ and DAZ bits); dropping it restores the mode the
/// thread had (the host's, on the calling thread). For kernels whose subnormals are far below
/// what their results can show: on Intel cores every operation that makes or reads one takes a
/// microcode assist of ~150 cycles, and a prompt's attention over a random model's scores makes
/// them by the million (softmax weights of 1e-39 in front of weights of 1). Elsewhere a no-op.
pub struct FlushSubnormals {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

impl FlushSubnormals {
    #[allow(clippy::new_without_default)]
    pub fn new() -> FlushSubnormals {
        #[cfg(target_arch = "x86_64")]
        {
            const FTZ: u32 = 1 << 15;
            const DAZ: u32 = 1 << 6;
            let mut saved = 0u32;
            // SAFETY: stmxcsr / ldmxcsr read and write the thread's SSE control register
            // through a u32 on the stack; every x86-64 CPU has them.
            unsafe {
                std::arch::asm!("stmxcsr [{}]", in(reg) &mut saved, options(nostack));
                let flushed = saved | FTZ | DAZ;
                std::arch::asm!("ldmxcsr [{}]", in(reg) &flushed, options(nostack));
            }
            FlushSubnormals { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        FlushSubnormals {}
    }
}

impl Drop for FlushSubnormals {
    fn drop(&mut self) {
        // SAFETY: as in `new`, restoring the value read there.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("ldmxcsr [{}]", in(reg) &self.saved, options(nostack));
        }
    }
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
    // NaN takes the plain path, as in the vector kernel (its `big` mask is false for NaN).
    if absn.is_nan() || absn <= 126.0 {
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
pub mod x86;

/// NEON float dots: one kernel over pairs of element kinds, 16 elements a step into four
/// accumulators. f16 → f32 is FCVTL, part of base AArch64 SIMD (FEAT_FP16 adds only f16
/// arithmetic), so no run-time check is needed for it.
#[cfg(target_arch = "aarch64")]
pub mod neon;

#[cfg(test)]
mod tests;
