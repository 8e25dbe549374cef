//! Element-wise ops on F32 or F16 rows (dst of the same type and shape): UNARY (op param 0
//! picks the function), SQR, SQRT, LOG, SIN, COS, CLAMP (min, max), LEAKY_RELU (slope).
//! F16 values are computed in f32 and rounded once. GELU and GELU_QUICK go through f16
//! lookup tables exactly as ggml-cpu does (input rounded to f16, result rounded to f16;
//! GELU passes |x| >= 10 through directly for f32).

use super::Ctx;
use crate::ggml_types::{op, unary, GgmlType};
use crate::tensor::{split_range, Tensor};
use once_cell::sync::Lazy;

#[allow(unused_doc_comments)]
/// cbindgen:ignore
// The C library's erff, the function ggml-cpu calls (std has no stable erf).
extern "C" {
    fn erff(x: f32) -> f32;
}

// The f32 values of sqrt(2/pi) and 1/sqrt(2) (the same bits as the longer literals).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const SQRT_2_INV: f32 = std::f32::consts::FRAC_1_SQRT_2;
const GELU_COEF_A: f32 = 0.044715;
const GELU_QUICK_COEF: f32 = -1.702;

pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

pub fn gelu_quick(x: f32) -> f32 {
    x * (1.0 / (1.0 + (GELU_QUICK_COEF * x).exp()))
}

pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + unsafe { erff(x * SQRT_2_INV) })
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn table(f: fn(f32) -> f32) -> Vec<u16> {
    (0..=u16::MAX)
        .map(|h| half::f16::from_f32(f(half::f16::from_bits(h).to_f32())).to_bits())
        .collect()
}

pub static GELU_F16: Lazy<Vec<u16>> = Lazy::new(|| table(gelu));
pub static GELU_QUICK_F16: Lazy<Vec<u16>> = Lazy::new(|| table(gelu_quick));

#[inline]
fn f16_bits(x: f32) -> usize {
    half::f16::from_f32(x).to_bits() as usize
}

#[inline]
fn h2f(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

/// GELU of an f32 value the way ggml-cpu computes it (table of f16 results).
#[inline]
pub fn gelu_f32_table(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        h2f(GELU_F16[f16_bits(x)])
    }
}

#[inline]
pub fn gelu_quick_f32_table(x: f32) -> f32 {
    h2f(GELU_QUICK_F16[f16_bits(x)])
}

fn unary_fn(u: i32) -> Option<fn(f32) -> f32> {
    Some(match u {
        unary::ABS => |x: f32| x.abs(),
        unary::SGN => |x: f32| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        },
        unary::NEG => |x: f32| -x,
        unary::STEP => |x: f32| if x > 0.0 { 1.0 } else { 0.0 },
        unary::TANH => |x: f32| x.tanh(),
        unary::ELU => |x: f32| if x > 0.0 { x } else { x.exp_m1() },
        unary::RELU => |x: f32| if x > 0.0 { x } else { 0.0 },
        unary::SIGMOID => |x: f32| 1.0 / (1.0 + (-x).exp()),
        unary::GELU => gelu_f32_table,
        unary::GELU_QUICK => gelu_quick_f32_table,
        unary::GELU_ERF => gelu_erf,
        unary::SILU => silu,
        unary::HARDSWISH => |x: f32| x * (1.0f32).min((0.0f32).max((x + 3.0) / 6.0)),
        unary::HARDSIGMOID => |x: f32| (1.0f32).min((0.0f32).max((x + 3.0) / 6.0)),
        unary::EXP => |x: f32| x.exp(),
        _ => return None,
    })
}

pub fn supports(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    let t = a.dtype();
    if !matches!(t, GgmlType::F32 | GgmlType::F16) || node.dtype() != t || !a.same_shape(node) {
        return false;
    }
    match node.op() {
        op::UNARY => {
            unary_fn(node.param_i32(0)).is_some() && a.has_dense_rows() && node.has_dense_rows()
        }
        op::SQR | op::SQRT | op::LOG | op::SIN | op::COS => {
            a.has_dense_rows() && node.has_dense_rows()
        }
        // ggml-cpu walks these by flat row index.
        op::CLAMP | op::LEAKY_RELU => a.is_contiguous_from(1) && node.is_contiguous_from(1),
        _ => false,
    }
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let f16 = a.dtype() == GgmlType::F16;
    let (p0, p1) = (node.param_f32(0), node.param_f32(1));
    let o = node.op();
    let u = node.param_i32(0);
    let f: Box<dyn Fn(f32) -> f32> = match o {
        op::UNARY if f16 && u == unary::GELU => Box::new(|x| h2f(GELU_F16[f16_bits(x)])),
        op::UNARY => Box::new(unary_fn(u).unwrap()),
        op::SQR => Box::new(|x| x * x),
        op::SQRT => Box::new(|x: f32| x.sqrt()),
        op::LOG => Box::new(|x: f32| x.ln()),
        op::SIN => Box::new(|x: f32| x.sin()),
        op::COS => Box::new(|x: f32| x.cos()),
        op::CLAMP => Box::new(move |x: f32| x.min(p1).max(p0)),
        _ => Box::new(move |x: f32| {
            (if x > 0.0 { x } else { 0.0 }) + p0 * (if x < 0.0 { x } else { 0.0 })
        }),
    };
    let ne = node.ne();
    for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
        unsafe {
            let sp = a.data().add(a.row_offset(i1, i2, i3));
            let dp = node.data().add(node.row_offset(i1, i2, i3));
            if f16 {
                let s = std::slice::from_raw_parts(sp as *const u16, ne[0]);
                let d = std::slice::from_raw_parts_mut(dp as *mut u16, ne[0]);
                for (d, &s) in d.iter_mut().zip(s) {
                    *d = half::f16::from_f32(f(h2f(s))).to_bits();
                }
            } else {
                let s = std::slice::from_raw_parts(sp as *const f32, ne[0]);
                let d = std::slice::from_raw_parts_mut(dp as *mut f32, ne[0]);
                if o == op::UNARY && u == unary::SILU {
                    // ggml-cpu's exp and order, to agree to the bit.
                    crate::cpu::simd::silu_row(s, None, d);
                    continue;
                }
                for (d, &s) in d.iter_mut().zip(s) {
                    *d = f(s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, unary, GgmlType};

    fn check(o: i32, u: i32, p: (f32, f32), want: fn(f64, f64, f64) -> f64, tol: f32) {
        for ty in [GgmlType::F32, GgmlType::F16] {
            for nth in [1, 3] {
                let ne = [9, 4, 2, 1];
                let lo = if o == op::SQRT || o == op::LOG {
                    0.1
                } else {
                    -6.0
                };
                let x = rand_vec(72, 5, lo, 6.0);
                let mut a = TT::new(ty, ne);
                a.set(&x);
                let xin = a.get();
                let mut d = TT::new(ty, ne);
                d.op(o).src(0, &a).pi(0, u);
                if o != op::UNARY {
                    d.pf(0, p.0).pf(1, p.1);
                }
                run(&d, nth);
                let w: Vec<f32> = xin
                    .iter()
                    .map(|&v| want(v as f64, p.0 as f64, p.1 as f64) as f32)
                    .collect();
                let tol = if ty == GgmlType::F16 {
                    tol.max(4e-3)
                } else {
                    tol
                };
                assert_close(&d.get(), &w, tol);
            }
        }
    }

    #[test]
    fn unary_ops_match_reference() {
        let tanh_gelu = |x: f64, _: f64, _: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        check(op::UNARY, unary::GELU, (0.0, 0.0), tanh_gelu, 4e-3); // f16 table
        check(
            op::UNARY,
            unary::SILU,
            (0.0, 0.0),
            |x, _, _| x / (1.0 + (-x).exp()),
            1e-5,
        );
        check(
            op::UNARY,
            unary::GELU_QUICK,
            (0.0, 0.0),
            |x, _, _| x / (1.0 + (-1.702 * x).exp()),
            4e-3,
        );
        check(
            op::UNARY,
            unary::RELU,
            (0.0, 0.0),
            |x, _, _| x.max(0.0),
            0.0,
        );
        check(op::UNARY, unary::NEG, (0.0, 0.0), |x, _, _| -x, 0.0);
        check(op::UNARY, unary::ABS, (0.0, 0.0), |x, _, _| x.abs(), 0.0);
        check(op::UNARY, unary::TANH, (0.0, 0.0), |x, _, _| x.tanh(), 1e-6);
        check(
            op::UNARY,
            unary::SIGMOID,
            (0.0, 0.0),
            |x, _, _| 1.0 / (1.0 + (-x).exp()),
            1e-6,
        );
        check(op::UNARY, unary::EXP, (0.0, 0.0), |x, _, _| x.exp(), 1e-6);
        check(
            op::UNARY,
            unary::ELU,
            (0.0, 0.0),
            |x, _, _| if x > 0.0 { x } else { x.exp() - 1.0 },
            1e-6,
        );
        check(
            op::UNARY,
            unary::HARDSWISH,
            (0.0, 0.0),
            |x, _, _| x * ((x + 3.0) / 6.0).clamp(0.0, 1.0),
            1e-6,
        );
        check(
            op::UNARY,
            unary::STEP,
            (0.0, 0.0),
            |x, _, _| if x > 0.0 { 1.0 } else { 0.0 },
            0.0,
        );
        check(op::SQR, 0, (0.0, 0.0), |x, _, _| x * x, 1e-6);
        check(op::SQRT, 0, (0.0, 0.0), |x, _, _| x.sqrt(), 1e-6);
        check(op::LOG, 0, (0.0, 0.0), |x, _, _| x.ln(), 1e-6);
        check(op::SIN, 0, (0.0, 0.0), |x, _, _| x.sin(), 1e-6);
        check(op::CLAMP, 0, (-1.5, 2.0), |x, lo, hi| x.clamp(lo, hi), 0.0);
        check(
            op::LEAKY_RELU,
            0,
            (0.1, 0.0),
            |x, s, _| if x > 0.0 { x } else { s * x },
            1e-6,
        );
    }

    #[test]
    fn gelu_erf_matches_reference() {
        // erf via its series for small |x|: compare against f64 integration-free identity at a few points
        for (x, want) in [
            (0.0f32, 0.0f32),
            (1.0, 0.841_344_7),
            (-1.0, -0.158_655_3),
            (2.0, 1.954_5),
        ] {
            assert!((super::gelu_erf(x) - want).abs() < 1e-4, "{x}");
        }
    }
}
