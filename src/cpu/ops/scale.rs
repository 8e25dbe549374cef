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
            let x = std::slice::from_raw_parts(a.data().add(r * a.nb()[1]) as *const f32, ne0);
            let d = std::slice::from_raw_parts_mut(node.data().add(r * node.nb()[1]) as *mut f32, ne0);
            if b == 0.0 {
                d.iter_mut().zip(x).for_each(|(d, &x)| *d = x * s);
            } else {
                d.iter_mut().zip(x).for_each(|(d, &x)| *d = x * s + b);
            }
        }
    }
}
