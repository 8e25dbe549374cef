//! SCALE: dst = src * s + b (op params: s, b as f32), F32, contiguous as ggml-cpu requires.

use super::Ctx;
use crate::ggml_types::GgmlType;
use crate::tensor::{split_range, Tensor};

pub fn supports(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    a.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && a.same_shape(node)
        && a.is_contiguous()
        && node.is_contiguous()
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let (s, b) = (node.param_f32(0), node.param_f32(1));
    let ne0 = node.ne()[0];
    for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
        unsafe {
            let x =
                std::slice::from_raw_parts(a.data().add(a.flat_row_offset(r)) as *const f32, ne0);
            let d = std::slice::from_raw_parts_mut(
                node.data().add(node.flat_row_offset(r)) as *mut f32,
                ne0,
            );
            if b == 0.0 {
                d.iter_mut().zip(x).for_each(|(d, &x)| *d = x * s);
            } else {
                d.iter_mut().zip(x).for_each(|(d, &x)| *d = x * s + b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    #[test]
    fn scale_with_and_without_bias() {
        let ne = [17, 5, 3, 2];
        let v = rand_vec(ne.iter().product(), 21, -3.0, 3.0);
        for (s, b) in [(0.125f32, 0.0f32), (-2.5, 0.75)] {
            for nth in [1, 3] {
                let mut a = TT::new(GgmlType::F32, ne);
                a.set(&v);
                let mut d = TT::new(GgmlType::F32, ne);
                d.op(op::SCALE).src(0, &a).pf(0, s).pf(1, b);
                run(&d, nth);
                let want: Vec<f32> = v.iter().map(|&x| x * s + b).collect();
                assert_close(&d.get(), &want, 1e-7);
            }
        }
    }

    #[test]
    fn scale_rejects_non_contiguous_and_f16() {
        let a = TT::strided(GgmlType::F32, [4, 3, 1, 1], [4, 32, 96, 96], 96);
        let mut d = TT::new(GgmlType::F32, [4, 3, 1, 1]);
        d.op(op::SCALE).src(0, &a).pf(0, 2.0);
        assert!(!super::super::supports(&d.tensor()));
        let a = TT::new(GgmlType::F16, [4, 3, 1, 1]);
        let mut d = TT::new(GgmlType::F16, [4, 3, 1, 1]);
        d.op(op::SCALE).src(0, &a).pf(0, 2.0);
        assert!(!super::super::supports(&d.tensor()));
    }
}
