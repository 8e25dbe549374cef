//! ADD, SUB, MUL, DIV: dst = src0 (op) src1, src1 repeated along every dimension to src0's
//! shape. Types as ggml-cpu: all F32, all F16, all BF16, or F16/BF16 src0 with F32 src1.

use super::Ctx;
use crate::cpu::types::{load_f32, store_f32, traits};
use crate::ggml_types::{op, GgmlType};
use crate::tensor::{split_range, Tensor};

pub fn supports(node: &Tensor) -> bool {
    let (Some(a), Some(b)) = (node.src(0), node.src(1)) else {
        return false;
    };
    let (ta, tb, td) = (a.dtype(), b.dtype(), node.dtype());
    use GgmlType::*;
    let types_ok = matches!(
        (ta, tb, td),
        (F32, F32, F32)
            | (F16, F16, F16)
            | (BF16, BF16, BF16)
            | (BF16, F32, BF16)
            | (BF16, F32, F32)
            | (F16, F32, F16)
            | (F16, F32, F32)
    );
    types_ok
        && a.same_shape(node)
        && a.can_repeat_from(&b)
        && a.has_dense_rows()
        && node.has_dense_rows()
}

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    // Per thread: src0 row, src1 row and result row as f32 (only for non-f32 types).
    if node.src(0).map(|a| a.dtype()) == Some(GgmlType::F32) && node.dtype() == GgmlType::F32 {
        return 0;
    }
    3 * node.ne()[0] * 4 * nth + 64
}

#[inline(always)]
fn apply(op: i32, x: f32, y: f32) -> f32 {
    match op {
        op::ADD => x + y,
        op::SUB => x - y,
        op::MUL => x * y,
        _ => x / y,
    }
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let b = node.src(1).unwrap();
    let ne = node.ne();
    let bne = b.ne();
    let (ta, tb, td) = (a.dtype(), b.dtype(), node.dtype());
    let o = node.op();
    let all_f32 = ta == GgmlType::F32 && tb == GgmlType::F32 && td == GgmlType::F32;
    let b_dense = b.has_dense_rows();

    let (tmp_a, tmp_b, tmp_d) = if all_f32 {
        (&mut [][..], &mut [][..], &mut [][..])
    } else {
        let per = 3 * ne[0];
        let base = unsafe { (ctx.wdata as *mut f32).add(per * ctx.ith) };
        let s = unsafe { std::slice::from_raw_parts_mut(base, per) };
        let (x, rest) = s.split_at_mut(ne[0]);
        let (y, z) = rest.split_at_mut(ne[0]);
        (x, y, z)
    };

    for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
        unsafe {
            let dp = node.data().add(node.row_offset(i1, i2, i3));
            let ap = a.data().add(a.row_offset(i1, i2, i3));
            let bp = b
                .data()
                .add(b.row_offset(i1 % bne[1], i2 % bne[2], i3 % bne[3]));
            if all_f32 && b_dense {
                let d = std::slice::from_raw_parts_mut(dp as *mut f32, ne[0]);
                let x = std::slice::from_raw_parts(ap as *const f32, ne[0]);
                let y = std::slice::from_raw_parts(bp as *const f32, bne[0]);
                for (dc, xc) in d.chunks_mut(bne[0]).zip(x.chunks(bne[0])) {
                    match o {
                        op::ADD => dc
                            .iter_mut()
                            .zip(xc)
                            .zip(y)
                            .for_each(|((d, &x), &y)| *d = x + y),
                        op::SUB => dc
                            .iter_mut()
                            .zip(xc)
                            .zip(y)
                            .for_each(|((d, &x), &y)| *d = x - y),
                        op::MUL => dc
                            .iter_mut()
                            .zip(xc)
                            .zip(y)
                            .for_each(|((d, &x), &y)| *d = x * y),
                        _ => dc
                            .iter_mut()
                            .zip(xc)
                            .zip(y)
                            .for_each(|((d, &x), &y)| *d = x / y),
                    }
                }
            } else if all_f32 {
                let nb0 = b.nb()[0];
                for i0 in 0..ne[0] {
                    let y = *(bp.add((i0 % bne[0]) * nb0) as *const f32);
                    let x = *(ap as *const f32).add(i0);
                    *(dp as *mut f32).add(i0) = apply(o, x, y);
                }
            } else {
                (traits(ta).unwrap().to_f32.unwrap())(ap, tmp_a);
                let nb0 = b.nb()[0];
                for (i, v) in tmp_b[..bne[0]].iter_mut().enumerate() {
                    *v = load_f32(tb, bp.add(i * nb0));
                }
                for (i0, d) in tmp_d[..ne[0]].iter_mut().enumerate() {
                    *d = apply(o, tmp_a[i0], tmp_b[i0 % bne[0]]);
                }
                if td == GgmlType::F32 {
                    std::ptr::copy_nonoverlapping(tmp_d.as_ptr(), dp as *mut f32, ne[0]);
                } else {
                    for (i0, &v) in tmp_d[..ne[0]].iter().enumerate() {
                        store_f32(td, dp.add(i0 * td.type_size()), v);
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

    fn reference(o: i32, a: &TT, b: &TT) -> Vec<f32> {
        let (ne, bne) = (a.ne(), b.ne());
        let (av, bv) = (a.get(), b.get());
        let mut out = Vec::with_capacity(av.len());
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        let x = av[((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0];
                        let (j0, j1, j2, j3) = (i0 % bne[0], i1 % bne[1], i2 % bne[2], i3 % bne[3]);
                        let y = bv[((j3 * bne[2] + j2) * bne[1] + j1) * bne[0] + j0];
                        out.push(match o {
                            op::ADD => x + y,
                            op::SUB => x - y,
                            op::MUL => x * y,
                            _ => x / y,
                        });
                    }
                }
            }
        }
        out
    }

    fn rounded(ty: GgmlType, v: &[f32]) -> Vec<f32> {
        let mut t = TT::new(ty, [v.len(), 1, 1, 1]);
        t.set(v);
        t.get()
    }

    #[test]
    fn binary_broadcasts_in_every_dim() {
        use GgmlType::*;
        let ne = [8, 3, 2, 2];
        let shapes = [
            [8, 3, 2, 2],
            [1, 3, 2, 2],
            [4, 3, 2, 2],
            [8, 1, 2, 2],
            [8, 3, 1, 2],
            [8, 3, 2, 1],
            [1, 1, 1, 1],
            [2, 1, 2, 1],
        ];
        let types = [
            (F32, F32, F32),
            (F16, F16, F16),
            (BF16, BF16, BF16),
            (F16, F32, F16),
            (F16, F32, F32),
            (BF16, F32, BF16),
            (BF16, F32, F32),
        ];
        for (ta, tb, td) in types {
            for bne in shapes {
                for o in [op::ADD, op::SUB, op::MUL, op::DIV] {
                    for nth in [1, 3] {
                        let mut a = TT::new(ta, ne);
                        a.set(&rand_vec(ne.iter().product(), 7, -2.0, 2.0));
                        let mut b = TT::new(tb, bne);
                        b.set(&rand_vec(bne.iter().product(), 8, 0.5, 2.0));
                        let mut d = TT::new(td, ne);
                        d.op(o).src(0, &a).src(1, &b);
                        run(&d, nth);
                        assert_close(&d.get(), &rounded(td, &reference(o, &a, &b)), 1e-6);
                    }
                }
            }
        }
    }

    #[test]
    fn binary_with_strided_src1() {
        use GgmlType::*;
        let ne = [6, 4, 3, 1];
        for (ta, tb, td) in [(F32, F32, F32), (F16, F32, F16), (BF16, BF16, BF16)] {
            for nth in [1, 3] {
                let mut a = TT::new(ta, ne);
                a.set(&rand_vec(72, 11, -2.0, 2.0));
                // src1: every other element of a wider buffer, rows further apart than dense.
                let ts = tb.type_size();
                let nb = [
                    2 * ts,
                    2 * ts * 6 + 4 * ts,
                    (2 * ts * 6 + 4 * ts) * 4,
                    (2 * ts * 6 + 4 * ts) * 12,
                ];
                let mut b = TT::strided(tb, ne, nb, nb[3]);
                b.set(&rand_vec(72, 12, 0.5, 2.0));
                for o in [op::ADD, op::MUL, op::DIV] {
                    let mut d = TT::new(td, ne);
                    d.op(o).src(0, &a).src(1, &b);
                    run(&d, nth);
                    assert_close(&d.get(), &rounded(td, &reference(o, &a, &b)), 1e-6);
                }
            }
        }
    }

    #[test]
    fn binary_rejects_mixed_types_ggml_cpu_lacks() {
        use GgmlType::*;
        for (ta, tb, td) in [(F32, F16, F32), (F32, F32, F16), (F16, BF16, F16)] {
            let a = TT::new(ta, [4, 2, 1, 1]);
            let b = TT::new(tb, [4, 2, 1, 1]);
            let mut d = TT::new(td, [4, 2, 1, 1]);
            d.op(op::ADD).src(0, &a).src(1, &b);
            assert!(!super::super::supports(&d.tensor()));
        }
    }
}
