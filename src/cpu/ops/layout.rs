//! Ops that place or generate values without arithmetic on them: CONCAT (op param 0: dim),
//! REPEAT (tile src0 to dst's shape), PAD (zeros around src0; params: left/right padding
//! per dim; the circular mode is not claimed), FILL (constant), ARANGE (start + step * i),
//! DIAG_MASK_INF (entries above the diagonal shifted by n_past become -inf).

use super::Ctx;
use crate::ggml_types::op;
use crate::tensor::{split_range, Tensor};

// Which layouts are claimed: crate::op_shapes::layout_op_ok (shared with the GPU device).
pub fn compute(node: &Tensor, ctx: &Ctx) {
    let ne = node.ne();
    let t = node.dtype();
    let sz = t.type_size();
    match node.op() {
        op::CONCAT => {
            let (a, b) = (node.src(0).unwrap(), node.src(1).unwrap());
            let d = node.param_i32(0) as usize;
            let an = a.ne();
            for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
                let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
                let idx = [0, i1, i2, i3];
                let dp = unsafe { node.data().add(node.row_offset(i1, i2, i3)) };
                unsafe {
                    if d == 0 {
                        std::ptr::copy_nonoverlapping(
                            a.data().add(a.row_offset(i1, i2, i3)),
                            dp,
                            an[0] * sz,
                        );
                        std::ptr::copy_nonoverlapping(
                            b.data().add(b.row_offset(i1, i2, i3)),
                            dp.add(an[0] * sz),
                            (ne[0] - an[0]) * sz,
                        );
                    } else if idx[d] < an[d] {
                        std::ptr::copy_nonoverlapping(
                            a.data().add(a.row_offset(i1, i2, i3)),
                            dp,
                            ne[0] * sz,
                        );
                    } else {
                        let mut j = idx;
                        j[d] -= an[d];
                        std::ptr::copy_nonoverlapping(
                            b.data().add(b.row_offset(j[1], j[2], j[3])),
                            dp,
                            ne[0] * sz,
                        );
                    }
                }
            }
        }
        op::REPEAT => {
            let a = node.src(0).unwrap();
            let an = a.ne();
            for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
                let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
                let sp = unsafe {
                    a.data()
                        .add(a.row_offset(i1 % an[1], i2 % an[2], i3 % an[3]))
                };
                let dp = unsafe { node.data().add(node.row_offset(i1, i2, i3)) };
                for i0 in 0..ne[0] {
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            sp.add((i0 % an[0]) * a.nb()[0]),
                            dp.add(i0 * sz),
                            sz,
                        )
                    };
                }
            }
        }
        op::PAD => {
            let a = node.src(0).unwrap();
            let an = a.ne();
            let lp: Vec<usize> = (0..4).map(|i| node.param_i32(2 * i) as usize).collect();
            for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
                let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
                let d = unsafe {
                    std::slice::from_raw_parts_mut(
                        node.data().add(node.row_offset(i1, i2, i3)) as *mut f32,
                        ne[0],
                    )
                };
                let inside = |i: usize, k: usize| i >= lp[k] && i - lp[k] < an[k];
                for (i0, v) in d.iter_mut().enumerate() {
                    *v = if inside(i0, 0) && inside(i1, 1) && inside(i2, 2) && inside(i3, 3) {
                        unsafe {
                            *(a.data()
                                .add(a.offset(i0 - lp[0], i1 - lp[1], i2 - lp[2], i3 - lp[3]))
                                as *const f32)
                        }
                    } else {
                        0.0
                    };
                }
            }
        }
        op::FILL => {
            let c = node.param_f32(0);
            for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
                let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
                let dp = unsafe { node.data().add(node.row_offset(i1, i2, i3)) };
                for i0 in 0..ne[0] {
                    unsafe { crate::cpu::types::store_f32(t, dp.add(i0 * sz), c) };
                }
            }
        }
        op::ARANGE => {
            let (start, step) = (node.param_f32(0), node.param_f32(2));
            for i in split_range(ne[0], ctx.ith, ctx.nth) {
                unsafe { *(node.data() as *mut f32).add(i) = start + step * i as f32 };
            }
        }
        _ => {
            // DIAG_MASK_INF, row by row: copy (unless in place), then mask.
            let a = node.src(0).unwrap();
            let n_past = node.param_i32(0) as usize;
            for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
                let j = r % ne[1];
                unsafe {
                    let sp = a.data().add(a.flat_row_offset(r));
                    let dp = node.data().add(node.flat_row_offset(r));
                    if sp != dp {
                        std::ptr::copy_nonoverlapping(sp, dp, ne[0] * 4);
                    }
                    let d = std::slice::from_raw_parts_mut(dp as *mut f32, ne[0]);
                    for (i, v) in d.iter_mut().enumerate() {
                        if i > n_past + j {
                            *v = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    #[test]
    fn layout_ops_match_reference() {
        for nth in [1, 3] {
            // CONCAT along each dim
            for dim in 0..3 {
                let an = [3, 2, 2, 1];
                let mut bn = an;
                bn[dim] = 1;
                let mut dn = an;
                dn[dim] += 1;
                let mut a = TT::new(GgmlType::F32, an);
                a.set(&(0..12).map(|v| v as f32).collect::<Vec<_>>());
                let nbv: usize = bn.iter().product();
                let mut b = TT::new(GgmlType::F32, bn);
                b.set(&(0..nbv).map(|v| 100.0 + v as f32).collect::<Vec<_>>());
                let mut d = TT::new(GgmlType::F32, dn);
                d.op(op::CONCAT).src(0, &a).src(1, &b).pi(0, dim as i32);
                run(&d, nth);
                let (av, bv) = (a.get(), b.get());
                let mut want = vec![];
                for i3 in 0..dn[3] {
                    for i2 in 0..dn[2] {
                        for i1 in 0..dn[1] {
                            for i0 in 0..dn[0] {
                                let i = [i0, i1, i2, i3];
                                if i[dim] < an[dim] {
                                    want.push(av[((i3 * an[2] + i2) * an[1] + i1) * an[0] + i0]);
                                } else {
                                    let mut j = i;
                                    j[dim] -= an[dim];
                                    want.push(
                                        bv[((j[3] * bn[2] + j[2]) * bn[1] + j[1]) * bn[0] + j[0]],
                                    );
                                }
                            }
                        }
                    }
                }
                assert_eq!(d.get(), want, "dim {dim}");
            }
            // REPEAT
            let mut a = TT::new(GgmlType::F32, [2, 1, 1, 1]);
            a.set(&[1.0, 2.0]);
            let mut d = TT::new(GgmlType::F32, [4, 2, 1, 1]);
            d.op(op::REPEAT).src(0, &a);
            run(&d, nth);
            assert_eq!(d.get(), vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
            // PAD
            let mut a = TT::new(GgmlType::F32, [2, 2, 1, 1]);
            a.set(&[1.0, 2.0, 3.0, 4.0]);
            let mut d = TT::new(GgmlType::F32, [4, 3, 1, 1]);
            d.op(op::PAD).src(0, &a).pi(0, 1).pi(1, 1).pi(2, 0).pi(3, 1);
            run(&d, nth);
            assert_eq!(
                d.get(),
                vec![0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0]
            );
            // ARANGE, FILL
            let mut d = TT::new(GgmlType::F32, [5, 1, 1, 1]);
            d.op(op::ARANGE).pf(0, 1.0).pf(1, 3.5).pf(2, 0.5);
            run(&d, nth);
            assert_eq!(d.get(), vec![1.0, 1.5, 2.0, 2.5, 3.0]);
            let mut d = TT::new(GgmlType::F16, [3, 2, 1, 1]);
            d.op(op::FILL).pf(0, 0.25);
            run(&d, nth);
            assert_eq!(d.get(), vec![0.25; 6]);
            // DIAG_MASK_INF
            let mut a = TT::new(GgmlType::F32, [3, 2, 2, 1]);
            a.set(&[1.0; 12]);
            let mut d = TT::new(GgmlType::F32, [3, 2, 2, 1]);
            d.op(op::DIAG_MASK_INF).src(0, &a).pi(0, 1);
            run(&d, nth);
            let ninf = f32::NEG_INFINITY;
            assert_eq!(
                d.get(),
                vec![1.0, 1.0, ninf, 1.0, 1.0, 1.0, 1.0, 1.0, ninf, 1.0, 1.0, 1.0]
            );
        }
    }
}
