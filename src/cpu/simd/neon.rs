use std::arch::aarch64::*;

/// Four f16 (the 64-bit word's halves, low first) as f32.
///
/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
#[inline(always)]
pub unsafe fn f16x4(bits: u64) -> float32x4_t {
    vcvt_f32_f16(vreinterpret_f16_u64(vcreate_u64(bits)))
}

/// One f16 as f32 (`half` would detect FEAT_FP16 and call out, spilling the caller's vectors).
///
/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
#[inline(always)]
pub unsafe fn f16(h: u16) -> f32 {
    vgetq_lane_f32::<0>(f16x4(h as u64))
}

/// f32 → f16 bits, rounded to nearest even like `half`.
///
/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
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

/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
/// Slices of different lengths are dotted over the shorter one.
#[target_feature(enable = "neon")]
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot::<F32, F32>(a, b)
}

/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
/// Slices of different lengths are dotted over the shorter one.
#[target_feature(enable = "neon")]
pub unsafe fn dot_f16_f32(a: &[u16], b: &[f32]) -> f32 {
    dot::<F16, F32>(a, b)
}

/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
/// Slices of different lengths are dotted over the shorter one.
#[target_feature(enable = "neon")]
pub unsafe fn dot_f16_f16(a: &[u16], b: &[u16]) -> f32 {
    dot::<F16, F16>(a, b)
}

/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
/// Slices of different lengths are dotted over the shorter one.
#[target_feature(enable = "neon")]
pub unsafe fn dot_bf16_f32(a: &[u16], b: &[f32]) -> f32 {
    dot::<Bf16, F32>(a, b)
}

/// # Safety
/// NEON is part of every AArch64 CPU; the function is `unsafe` only because its body
/// uses NEON intrinsics, so callers need guarantee nothing more.
/// Slices of different lengths are dotted over the shorter one.
#[target_feature(enable = "neon")]
pub unsafe fn dot_bf16_bf16(a: &[u16], b: &[u16]) -> f32 {
    dot::<Bf16, Bf16>(a, b)
}
