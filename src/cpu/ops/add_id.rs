//! ADD_ID: dst[:, i1, i2, i3] = src0[:, i1, i2, i3] + src1[:, ids[i1, i2]] (per-expert bias of MoE
//! models: src0 holds one row per (selected expert, token), ids names the expert). All F32, ids I32,
//! dense rows, as ggml-cpu computes it.

use super::Ctx;
use crate::ggml_types::GgmlType;
use crate::tensor::{split_range, Tensor};

pub fn supports(node: &Tensor) -> bool {
    let (Some(a), Some(b), Some(ids)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let (ne, bne, ine) = (a.ne(), b.ne(), ids.ne());
    a.dtype() == GgmlType::F32
        && b.dtype() == GgmlType::F32
        && ids.dtype() == GgmlType::I32
        && node.dtype() == GgmlType::F32
        && a.same_shape(node)
        && bne[0] == ne[0]
        && ine[0] == ne[1]
        && ine[1] == ne[2]
        && a.has_dense_rows()
        && b.has_dense_rows()
        && node.has_dense_rows()
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let b = node.src(1).unwrap();
    let ids = node.src(2).unwrap();
    let ne = node.ne();
    let n_rows_b = b.ne()[1];
    for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
        unsafe {
            let d = std::slice::from_raw_parts_mut(
                node.data().add(node.row_offset(i1, i2, i3)) as *mut f32,
                ne[0],
            );
            let x = std::slice::from_raw_parts(
                a.data().add(a.row_offset(i1, i2, i3)) as *const f32,
                ne[0],
            );
            let id = *(ids.data().add(i1 * ids.nb()[0] + i2 * ids.nb()[1]) as *const i32);
            // ggml-cpu aborts on an id out of range; here the row passes through without a bias.
            if id < 0 || id as usize >= n_rows_b {
                d.copy_from_slice(x);
                continue;
            }
            let y = std::slice::from_raw_parts(
                b.data().add(id as usize * b.nb()[1]) as *const f32,
                ne[0],
            );
            d.iter_mut()
                .zip(x)
                .zip(y)
                .for_each(|((d, &x), &y)| *d = x + y);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    #[test]
    fn add_id_matches_reference() {
        let (n0, n_used, n_tok, n_exp) = (19, 3, 5, 6);
        for nth in [1, 3] {
            let mut a = TT::new(GgmlType::F32, [n0, n_used, n_tok, 1]);
            a.set(&rand_vec(n0 * n_used * n_tok, 1, -1.0, 1.0));
            let mut b = TT::new(GgmlType::F32, [n0, n_exp, 1, 1]);
            b.set(&rand_vec(n0 * n_exp, 2, -1.0, 1.0));
            let idv: Vec<f32> = (0..n_used * n_tok)
                .map(|k| ((k * 5 + 1) % n_exp) as f32)
                .collect();
            let mut ids = TT::new(GgmlType::I32, [n_used, n_tok, 1, 1]);
            ids.set(&idv);
            let mut d = TT::new(GgmlType::F32, [n0, n_used, n_tok, 1]);
            d.op(op::ADD_ID).src(0, &a).src(1, &b).src(2, &ids);
            run(&d, nth);
            let (av, bv) = (a.get(), b.get());
            let mut want = vec![0f32; av.len()];
            for r in 0..n_used * n_tok {
                let e = idv[r] as usize;
                for i in 0..n0 {
                    want[r * n0 + i] = av[r * n0 + i] + bv[e * n0 + i];
                }
            }
            assert_close(&d.get(), &want, 0.0);
        }
    }

    #[test]
    fn add_id_rejects_other_types() {
        let a = TT::new(GgmlType::F16, [8, 2, 3, 1]);
        let b = TT::new(GgmlType::F32, [8, 4, 1, 1]);
        let ids = TT::new(GgmlType::I32, [2, 3, 1, 1]);
        let mut d = TT::new(GgmlType::F16, [8, 2, 3, 1]);
        d.op(op::ADD_ID).src(0, &a).src(1, &b).src(2, &ids);
        assert!(!super::super::supports(&d.tensor()));
    }
}
