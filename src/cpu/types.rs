//! Per-type CPU kernels: row conversion to and from f32 and the dot product used by MUL_MAT.
//! Quantized formats live one per file in `cpu/quants/` and register here.

use super::simd;
use crate::ggml_types::GgmlType;

/// Converts `dst.len()` elements starting at `src` to f32.
pub type ToF32 = unsafe fn(src: *const u8, dst: &mut [f32]);
/// Converts `src` to the type, writing `row_size(src.len())` bytes at `dst`.
pub type FromF32 = unsafe fn(src: &[f32], dst: *mut u8);
/// Dot product of `n` elements: `x` in the weight type, `y` in its `vec_dot_type`.
pub type VecDot = unsafe fn(n: usize, x: *const u8, y: *const u8) -> f32;

/// Dots of `rows` consecutive weight rows (`x`, `xs` bytes apart) with `cols` activation
/// columns (`y`, `ys` bytes apart): result (r, c) goes to `out + r * 4 + c * os` (bytes).
/// Each result equals `vec_dot` of that row and column to the bit: tiling only shares loads.
pub type DotTile =
    unsafe fn(n: usize, x: *const u8, xs: usize, y: *const u8, ys: usize, out: *mut u8, os: usize);

#[derive(Clone, Copy)]
pub struct Tile {
    pub rows: usize,
    pub cols: usize,
    pub dot: DotTile,
}

#[derive(Clone, Copy)]
pub struct TypeTraits {
    pub to_f32: Option<ToF32>,
    pub from_f32: Option<FromF32>,
    /// The type MUL_MAT converts activations to before calling `vec_dot`.
    pub vec_dot_type: GgmlType,
    pub vec_dot: Option<VecDot>,
    /// Register-blocked `vec_dot` for many columns (prompts) and for one column (generation).
    pub gemm: Option<Tile>,
    pub gemv: Option<Tile>,
}

pub fn traits(t: GgmlType) -> Option<TypeTraits> {
    match t {
        GgmlType::F32 => Some(TypeTraits {
            to_f32: Some(f32_to_f32),
            from_f32: Some(f32_from_f32),
            vec_dot_type: GgmlType::F32,
            vec_dot: Some(vec_dot_f32),
            gemm: None,
            gemv: None,
        }),
        // Activations are rounded to the weight's own type before the dot, as ggml-cpu does:
        // results then agree with ggml's to the last bits, not only within tolerance.
        GgmlType::F16 => Some(TypeTraits {
            to_f32: Some(f16_to_f32),
            from_f32: Some(f16_from_f32),
            vec_dot_type: GgmlType::F16,
            vec_dot: Some(vec_dot_f16),
            gemm: None,
            gemv: None,
        }),
        GgmlType::BF16 => Some(TypeTraits {
            to_f32: Some(bf16_to_f32),
            from_f32: Some(bf16_from_f32),
            vec_dot_type: GgmlType::BF16,
            vec_dot: Some(vec_dot_bf16),
            gemm: None,
            gemv: None,
        }),
        _ => super::quants::traits(t),
    }
}

unsafe fn f32_to_f32(src: *const u8, dst: &mut [f32]) {
    std::ptr::copy_nonoverlapping(src as *const f32, dst.as_mut_ptr(), dst.len());
}

unsafe fn f32_from_f32(src: &[f32], dst: *mut u8) {
    std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut f32, src.len());
}

unsafe fn f16_to_f32(src: *const u8, dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let s = std::slice::from_raw_parts(src as *const half::f16, dst.len());
    s.convert_to_f32_slice(dst);
}

unsafe fn f16_from_f32(src: &[f32], dst: *mut u8) {
    use half::slice::HalfFloatSliceExt;
    let d = std::slice::from_raw_parts_mut(dst as *mut half::f16, src.len());
    d.convert_from_f32_slice(src);
}

unsafe fn bf16_to_f32(src: *const u8, dst: &mut [f32]) {
    let s = std::slice::from_raw_parts(src as *const u16, dst.len());
    for (d, &v) in dst.iter_mut().zip(s) {
        *d = f32::from_bits((v as u32) << 16);
    }
}

/// Round-to-nearest-even, NaN kept quiet: the same rounding as ggml_fp32_to_bf16.
pub fn f32_to_bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

unsafe fn bf16_from_f32(src: &[f32], dst: *mut u8) {
    let d = std::slice::from_raw_parts_mut(dst as *mut u16, src.len());
    for (o, &v) in d.iter_mut().zip(src) {
        *o = f32_to_bf16_bits(v);
    }
}

unsafe fn vec_dot_f32(n: usize, x: *const u8, y: *const u8) -> f32 {
    simd::dot_f32(
        std::slice::from_raw_parts(x as *const f32, n),
        std::slice::from_raw_parts(y as *const f32, n),
    )
}

unsafe fn vec_dot_f16(n: usize, x: *const u8, y: *const u8) -> f32 {
    simd::dot_f16_f16(
        std::slice::from_raw_parts(x as *const u16, n),
        std::slice::from_raw_parts(y as *const u16, n),
    )
}

unsafe fn vec_dot_bf16(n: usize, x: *const u8, y: *const u8) -> f32 {
    simd::dot_bf16_bf16(
        std::slice::from_raw_parts(x as *const u16, n),
        std::slice::from_raw_parts(y as *const u16, n),
    )
}

/// Reads element `i` of a row of a plain float type as f32.
///
/// # Safety
/// `t` must be F32, F16 or BF16 (others panic) and `p` readable for one element of `t`
/// (4 or 2 bytes), aligned to its size.
#[inline]
pub unsafe fn load_f32(t: GgmlType, p: *const u8) -> f32 {
    match t {
        GgmlType::F32 => *(p as *const f32),
        GgmlType::F16 => half::f16::from_bits(*(p as *const u16)).to_f32(),
        GgmlType::BF16 => f32::from_bits((*(p as *const u16) as u32) << 16),
        _ => unreachable!("load_f32 on {t:?}"),
    }
}

/// Writes one f32 as a plain float type.
///
/// # Safety
/// `t` must be F32, F16 or BF16 (others panic) and `p` writable for one element of `t`
/// (4 or 2 bytes), aligned to its size.
#[inline]
pub unsafe fn store_f32(t: GgmlType, p: *mut u8, v: f32) {
    match t {
        GgmlType::F32 => *(p as *mut f32) = v,
        GgmlType::F16 => *(p as *mut u16) = half::f16::from_f32(v).to_bits(),
        GgmlType::BF16 => *(p as *mut u16) = f32_to_bf16_bits(v),
        _ => unreachable!("store_f32 on {t:?}"),
    }
}

pub fn is_float(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half_crate() {
        for &v in &[
            0.0f32,
            1.0,
            -1.5,
            std::f32::consts::PI,
            1e-30,
            65504.0,
            -7.77e20,
        ] {
            assert_eq!(f32_to_bf16_bits(v), half::bf16::from_f32(v).to_bits());
        }
        assert!(f32::from_bits((f32_to_bf16_bits(f32::NAN) as u32) << 16).is_nan());
    }

    #[test]
    fn float_rows_round_trip() {
        let src: Vec<f32> = (0..37).map(|i| i as f32 * 0.25 - 3.0).collect();
        for t in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let tr = traits(t).unwrap();
            let mut buf = vec![0u8; t.row_size(src.len())];
            let mut back = vec![0f32; src.len()];
            unsafe {
                (tr.from_f32.unwrap())(&src, buf.as_mut_ptr());
                (tr.to_f32.unwrap())(buf.as_ptr(), &mut back);
            }
            assert_eq!(src, back, "{t:?}"); // these values are exact in every float type
        }
    }
}
