pub use crate::cpu::simd::neon::{f16, f16x4, f32_to_f16};
use std::arch::aarch64::*;

/// Adds the 16 products of `a` and `b` into the 4 lanes of `acc`. Which lane gets which
/// products differs between the implementations: callers use only sums over all 4.
pub trait I8Dot {
    /// # Safety
    /// The CPU must have what the implementation uses: NEON for `Widen`; for `Sdot` also
    /// FEAT_DotProd (callers check `has_dotprod()` and call it from `dotprod` code).
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// Base NEON: i8·i8 products fit i16 (even -128·-128), pairwise-added into the i32 lanes.
pub struct Widen;

/// SDOT (FEAT_DotProd): only in functions compiled with the `dotprod` feature.
pub struct Sdot;

impl I8Dot for Widen {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
        vpadalq_s16(acc, vmull_high_s8(a, b))
    }
}

impl I8Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        sdot(acc, a, b)
    }
}

/// `vdotq_s32` is not stable Rust yet, hence the asm.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    std::arch::asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b, options(pure, nomem, nostack, preserves_flags));
    acc
}

/// 16 bits → 16 bytes: 0x10 where bit j is set (the fifth bit of Q5 codes), else 0.
///
/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
#[inline(always)]
pub unsafe fn bit4_bytes(h: u16) -> uint8x16_t {
    let b = vcombine_u8(vdup_n_u8(h as u8), vdup_n_u8((h >> 8) as u8));
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    vandq_u8(vtstq_u8(b, bit), vdupq_n_u8(0x10))
}

/// `f16(a) * f16(b)`.
///
/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
#[inline(always)]
pub unsafe fn f16_mul(a: u16, b: u16) -> f32 {
    let v = f16x4(a as u64 | (b as u64) << 16);
    vgetq_lane_f32::<0>(v) * vgetq_lane_f32::<1>(v)
}

/// The lane sums of the vectors in `p` (one per sub-block), multiplied by the i32 scales
/// in `sc` (4 per vector, sub-block order) and added up.
///
/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
/// Slices are read through `chunks_exact`/`zip` (bounds kept).
#[inline(always)]
pub unsafe fn scaled_sum(p: &[int32x4_t], sc: &[int32x4_t]) -> i32 {
    let mut acc = vdupq_n_s32(0);
    for (g, s) in p.chunks_exact(4).zip(sc) {
        let sums = vpaddq_s32(vpaddq_s32(g[0], g[1]), vpaddq_s32(g[2], g[3]));
        acc = vmlaq_s32(acc, sums, *s);
    }
    vaddvq_s32(acc)
}

/// `block(i, acc)` over blocks 0..nb, even blocks into one accumulator and odd ones into
/// another, so that consecutive FMAs do not wait on each other; returns their sum.
///
/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
#[inline(always)]
pub unsafe fn sum_blocks(
    nb: usize,
    mut block: impl FnMut(usize, float32x4_t) -> float32x4_t,
) -> float32x4_t {
    let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    while i + 2 <= nb {
        a0 = block(i, a0);
        a1 = block(i + 1, a1);
        i += 2;
    }
    if i < nb {
        a0 = block(i, a0);
    }
    vaddq_f32(a0, a1)
}

/// Quantizes 32 floats to i8 as `q8_0::from_f32_ref` does: multiplier 127/amax, round half
/// to even (FCVTNS). Returns the scale amax/127 and the sum of the codes.
///
/// # Safety
/// `x` must be readable for 32 f32 and `qs` writable for 32 bytes (any alignment); NEON
/// is part of every AArch64 CPU.
#[inline(always)]
pub unsafe fn quantize_block_i8(x: *const f32, qs: *mut i8) -> (f32, i32) {
    let v: [float32x4_t; 8] = std::array::from_fn(|k| vld1q_f32(x.add(4 * k)));
    // maxnm, like f32::max, ignores NaN.
    let mut m = vabsq_f32(v[0]);
    for &vk in &v[1..] {
        m = vmaxnmq_f32(m, vabsq_f32(vk));
    }
    let amax = vmaxnmvq_f32(m);
    let id = vdupq_n_f32(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let q: [int32x4_t; 8] = std::array::from_fn(|k| vcvtnq_s32_f32(vmulq_f32(v[k], id)));
    let mut sum = vdupq_n_s32(0);
    for k in 0..4 {
        sum = vaddq_s32(sum, vaddq_s32(q[2 * k], q[2 * k + 1]));
        let q16 = vqmovn_high_s32(vqmovn_s32(q[2 * k]), q[2 * k + 1]);
        vst1_s8(qs.add(8 * k), vqmovn_s16(q16));
    }
    (amax / 127.0, vaddvq_s32(sum))
}
