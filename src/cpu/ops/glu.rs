//! GLU: dst = act(x) * g, F32 or F16. Either one tensor whose rows hold [x | g] (halves
//! swapped when op param 1 is set) or two tensors x (src0) and g (src1). Op param 0 picks
//! act: REGLU, GEGLU (f16 table like ggml-cpu), SWIGLU, GEGLU_ERF, GEGLU_QUICK (f16 table), and
//! SWIGLU_OAI (gpt-oss; F32 only, as in ggml-cpu): x clamped above and g to [-limit, limit],
//! x * sigmoid(alpha x) * (g + 1), alpha and limit in op params 2 and 3.

use super::unary::{gelu_erf, gelu_f32_table, gelu_quick_f32_table, GELU_F16, GELU_QUICK_F16};
use super::Ctx;
use crate::ggml_types::{glu, GgmlType};
use crate::tensor::{split_range, Tensor};

pub fn supports(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    let t = a.dtype();
    if !matches!(t, GgmlType::F32 | GgmlType::F16) || node.dtype() != t {
        return false;
    }
    if !matches!(
        node.param_i32(0),
        glu::REGLU | glu::GEGLU | glu::SWIGLU | glu::GEGLU_ERF | glu::GEGLU_QUICK | glu::SWIGLU_OAI
    ) {
        return false;
    }
    if node.param_i32(0) == glu::SWIGLU_OAI && t != GgmlType::F32 {
        return false;
    }
    if !a.is_contiguous_from(1) || !node.is_contiguous_from(1) || node.nrows() != a.nrows() {
        return false;
    }
    let nc = match node.src(1) {
        Some(b) => {
            if b.dtype() != t || !b.is_contiguous_from(1) || !b.same_shape(&a) {
                return false;
            }
            a.ne()[0]
        }
        None => a.ne()[0] / 2,
    };
    node.ne()[0] == nc
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let b = node.src(1);
    let nc = node.ne()[0];
    let swapped = node.param_i32(1) != 0;
    let g = node.param_i32(0);
    let f16 = a.dtype() == GgmlType::F16;
    let esz = a.dtype().type_size();
    let gate = b.unwrap_or(a);
    for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
        unsafe {
            let mut xp = a.data().add(a.flat_row_offset(r));
            let mut gp = gate.data().add(gate.flat_row_offset(r));
            if b.is_none() {
                if swapped {
                    xp = xp.add(nc * esz);
                } else {
                    gp = gp.add(nc * esz);
                }
            }
            let dp = node.data().add(node.flat_row_offset(r));
            if f16 {
                let x = std::slice::from_raw_parts(xp as *const u16, nc);
                let gv = std::slice::from_raw_parts(gp as *const u16, nc);
                let d = std::slice::from_raw_parts_mut(dp as *mut u16, nc);
                for i in 0..nc {
                    let (xv, gg) = (h2f(x[i]), h2f(gv[i]));
                    let act = match g {
                        glu::REGLU => {
                            if xv > 0.0 {
                                xv
                            } else {
                                0.0
                            }
                        }
                        glu::GEGLU => h2f(GELU_F16[x[i] as usize]),
                        glu::SWIGLU => xv / (1.0 + (-xv).exp()),
                        glu::GEGLU_ERF => gelu_erf(xv),
                        _ => h2f(GELU_QUICK_F16[x[i] as usize]),
                    };
                    let v = if g == glu::REGLU && xv <= 0.0 {
                        0.0
                    } else {
                        act * gg
                    };
                    d[i] = half::f16::from_f32(v).to_bits();
                }
            } else {
                let x = std::slice::from_raw_parts(xp as *const f32, nc);
                let gv = std::slice::from_raw_parts(gp as *const f32, nc);
                let d = std::slice::from_raw_parts_mut(dp as *mut f32, nc);
                match g {
                    glu::REGLU => {
                        (0..nc).for_each(|i| d[i] = if x[i] > 0.0 { x[i] * gv[i] } else { 0.0 })
                    }
                    glu::GEGLU => (0..nc).for_each(|i| {
                        d[i] = if x[i] <= -10.0 {
                            0.0
                        } else {
                            gelu_f32_table(x[i]) * gv[i]
                        }
                    }),
                    // ggml-cpu's exp and order (see simd::silu_row), to agree to the bit.
                    glu::SWIGLU => crate::cpu::simd::silu_row(x, Some(gv), d),
                    glu::GEGLU_ERF => (0..nc).for_each(|i| d[i] = gelu_erf(x[i]) * gv[i]),
                    glu::SWIGLU_OAI => {
                        swiglu_oai_row(x, gv, d, node.param_f32(2), node.param_f32(3))
                    }
                    _ => (0..nc).for_each(|i| d[i] = gelu_quick_f32_table(x[i]) * gv[i]),
                }
            }
        }
    }
}

/// gpt-oss's gated activation in ggml-cpu's operations: min(x, limit) (x when limit is NaN),
/// clamp(g, -limit, limit), then x / (1 + e^(alpha * -x)) * (g + 1) with libm's expf.
fn swiglu_oai_row(x: &[f32], g: &[f32], d: &mut [f32], alpha: f32, limit: f32) {
    for ((d, &x), &g) in d.iter_mut().zip(x).zip(g) {
        let x = if limit < x { limit } else { x };
        let g = if g < -limit {
            -limit
        } else if limit < g {
            limit
        } else {
            g
        };
        *d = x / (1.0 + (alpha * -x).exp()) * (g + 1.0);
    }
}

#[inline]
fn h2f(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{glu, op, GgmlType};

    #[test]
    fn glu_forms_match_reference() {
        let silu = |x: f32| x / (1.0 + (-x).exp());
        for ty in [GgmlType::F32, GgmlType::F16] {
            for (g, act, tol) in [
                (glu::SWIGLU, silu as fn(f32) -> f32, 1e-5f32),
                (glu::REGLU, (|x: f32| x.max(0.0)) as fn(f32) -> f32, 0.0),
                (
                    glu::GEGLU,
                    (|x: f32| 0.5 * x * (1.0 + libm_erf(x / 2f32.sqrt()))) as fn(f32) -> f32,
                    5e-3,
                ),
                (
                    glu::GEGLU_ERF,
                    (|x: f32| 0.5 * x * (1.0 + libm_erf(x / 2f32.sqrt()))) as fn(f32) -> f32,
                    1e-5,
                ),
            ] {
                for nth in [1, 3] {
                    let (nc, nr) = (7, 5);
                    let v = rand_vec(2 * nc * nr, 9, -3.0, 3.0);
                    // fused, both halves orders
                    for swapped in [0, 1] {
                        let mut a = TT::new(ty, [2 * nc, nr, 1, 1]);
                        a.set(&v);
                        let vin = a.get();
                        let mut d = TT::new(ty, [nc, nr, 1, 1]);
                        d.op(op::GLU).src(0, &a).pi(0, g).pi(1, swapped);
                        run(&d, nth);
                        let mut want = vec![];
                        for r in 0..nr {
                            for i in 0..nc {
                                let (x, gg) = (vin[r * 2 * nc + i], vin[r * 2 * nc + nc + i]);
                                let (x, gg) = if swapped == 1 { (gg, x) } else { (x, gg) };
                                want.push(act(x) * gg);
                            }
                        }
                        let t = if ty == GgmlType::F16 {
                            tol.max(5e-3)
                        } else {
                            tol
                        };
                        assert_close(&d.get(), &want, t);
                    }
                    // split form
                    let mut a = TT::new(ty, [nc, nr, 1, 1]);
                    a.set(&v[..nc * nr]);
                    let mut b = TT::new(ty, [nc, nr, 1, 1]);
                    b.set(&v[nc * nr..]);
                    let (ai, bi) = (a.get(), b.get());
                    let mut d = TT::new(ty, [nc, nr, 1, 1]);
                    d.op(op::GLU).src(0, &a).src(1, &b).pi(0, g);
                    run(&d, nth);
                    let want: Vec<f32> = ai.iter().zip(&bi).map(|(&x, &y)| act(x) * y).collect();
                    let t = if ty == GgmlType::F16 {
                        tol.max(5e-3)
                    } else {
                        tol
                    };
                    assert_close(&d.get(), &want, t);
                }
            }
        }
    }

    #[test]
    fn swiglu_oai_clamps_and_gates() {
        let (alpha, limit) = (1.702f32, 7.0f32);
        let want_of = |x: f32, g: f32| {
            let (x, g) = (x.min(limit), g.clamp(-limit, limit));
            x / (1.0 + (-alpha * x).exp()) * (g + 1.0)
        };
        // Values beyond the limit on both sides, so the clamps matter.
        let (nc, nr) = (9, 4);
        let v = rand_vec(2 * nc * nr, 31, -12.0, 12.0);
        for nth in [1, 3] {
            for swapped in [0, 1] {
                let mut a = TT::new(GgmlType::F32, [2 * nc, nr, 1, 1]);
                a.set(&v);
                let mut d = TT::new(GgmlType::F32, [nc, nr, 1, 1]);
                d.op(op::GLU)
                    .src(0, &a)
                    .pi(0, glu::SWIGLU_OAI)
                    .pi(1, swapped);
                d.pf(2, alpha).pf(3, limit);
                run(&d, nth);
                let mut want = vec![];
                for r in 0..nr {
                    for i in 0..nc {
                        let (x, g) = (v[r * 2 * nc + i], v[r * 2 * nc + nc + i]);
                        let (x, g) = if swapped == 1 { (g, x) } else { (x, g) };
                        want.push(want_of(x, g));
                    }
                }
                assert_close(&d.get(), &want, 1e-6);
            }
            let mut a = TT::new(GgmlType::F32, [nc, nr, 1, 1]);
            a.set(&v[..nc * nr]);
            let mut b = TT::new(GgmlType::F32, [nc, nr, 1, 1]);
            b.set(&v[nc * nr..]);
            let mut d = TT::new(GgmlType::F32, [nc, nr, 1, 1]);
            d.op(op::GLU).src(0, &a).src(1, &b).pi(0, glu::SWIGLU_OAI);
            d.pf(2, alpha).pf(3, limit);
            run(&d, nth);
            let want: Vec<f32> = v[..nc * nr]
                .iter()
                .zip(&v[nc * nr..])
                .map(|(&x, &g)| want_of(x, g))
                .collect();
            assert_close(&d.get(), &want, 1e-6);
        }
        // F16 is not taken (ggml-cpu has no F16 form).
        let a = TT::new(GgmlType::F16, [2 * nc, nr, 1, 1]);
        let mut d = TT::new(GgmlType::F16, [nc, nr, 1, 1]);
        d.op(op::GLU).src(0, &a).pi(0, glu::SWIGLU_OAI);
        assert!(!super::supports(&d.tensor()));
    }

    /// erf by Abramowitz-Stegun 7.1.26 refined with a few Newton-free terms: good to ~1e-7.
    fn libm_erf(x: f32) -> f32 {
        // integrate exp(-t^2) with Simpson's rule in f64
        let n = 2000;
        let h = x as f64 / n as f64;
        let f = |t: f64| (-t * t).exp();
        let mut s = f(0.0) + f(x as f64);
        for i in 1..n {
            s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        (s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()) as f32
    }
}
