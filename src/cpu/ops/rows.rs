//! GET_ROWS: dst row (i10, i11, i12) = src0 row src1[i10, i11, i12] of matrix (i11, i12),
//! converted to f32 (I32 rows are copied as I32).
//! SET_ROWS: dst row src1[i, i02 % ne11, i03 % ne12] of matrix (i02, i03) = src0 row
//! (i, i02, i03), converted to dst's type. Indices are I32 (GET) or I32/I64 (SET).
//! Indices out of range are skipped (ggml-cpu aborts on them; a host must never pass any).

use super::Ctx;
use crate::cpu::types::traits;
use crate::ggml_types::GgmlType;
use crate::tensor::{split_range, Tensor};

pub fn supports_get(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    let ane = a.ne();
    let types_ok = if a.dtype() == GgmlType::I32 {
        node.dtype() == GgmlType::I32
    } else {
        node.dtype() == GgmlType::F32
            && traits(a.dtype()).and_then(|t| t.to_f32).is_some()
            && ane[0] % a.dtype().block_size() == 0
    };
    types_ok && crate::op_shapes::get_rows_layout_ok(node)
}

pub fn compute_get(node: &Tensor, ctx: &Ctx) {
    let (a, idx) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (ane, ine) = (a.ne(), idx.ne());
    let nc = ane[0];
    let to = if a.dtype() == GgmlType::I32 {
        None
    } else {
        traits(a.dtype()).unwrap().to_f32
    };
    for i in split_range(idx.nelements(), ctx.ith, ctx.nth) {
        let (i10, i11, i12) = super::cpy::unflatten3(i, ine[0], ine[1]);
        unsafe {
            let row = *(idx.data().add(idx.offset(i10, i11, i12, 0)) as *const i32);
            let dp = node.data().add(node.row_offset(i10, i11, i12));
            if row < 0 || row as usize >= ane[1] {
                continue;
            }
            let sp = a.data().add(a.row_offset(row as usize, i11, i12));
            match to {
                Some(f) => f(sp, std::slice::from_raw_parts_mut(dp as *mut f32, nc)),
                None => std::ptr::copy_nonoverlapping(sp, dp, nc * 4),
            }
        }
    }
}

pub fn supports_set(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    let dt = node.dtype();
    // A destination needs a quantizer and a dequantizer: Q8_1 / Q8_K (activation formats, with
    // only a quantizer) are declined; ggml-cpu quantizes them with its SIMD code, which ours does
    // not mirror, and no host can read such a cache back.
    matches!(a.dtype(), GgmlType::F32 | GgmlType::F16)
        && traits(dt).is_some_and(|t| t.from_f32.is_some() && t.to_f32.is_some())
        && node.ne()[0].is_multiple_of(dt.block_size())
        && crate::op_shapes::set_rows_layout_ok(node)
}

pub fn work_size_set(node: &Tensor, nth: usize) -> usize {
    (node.ne()[0] + 16) * 4 * nth
}

pub fn compute_set(node: &Tensor, ctx: &Ctx) {
    let (a, idx) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (ane, ine, dne) = (a.ne(), idx.ne(), node.ne());
    let nc = ane[0];
    let (st, dt) = (a.dtype(), node.dtype());
    let from = traits(dt).unwrap().from_f32.unwrap();
    let tmp = unsafe {
        std::slice::from_raw_parts_mut((ctx.wdata as *mut f32).add((nc + 16) * ctx.ith), nc)
    };
    let i64_idx = idx.dtype() == GgmlType::I64;
    // Threads split the rows of each matrix, as ggml-cpu does.
    let rows = split_range(ane[1], ctx.ith, ctx.nth);
    for i03 in 0..ane[3] {
        for i02 in 0..ane[2] {
            for i in rows.clone() {
                unsafe {
                    let ip = idx.data().add(idx.offset(i, i02 % ine[1], i03 % ine[2], 0));
                    let row = if i64_idx {
                        *(ip as *const i64)
                    } else {
                        *(ip as *const i32) as i64
                    };
                    if row < 0 || row as usize >= dne[1] {
                        continue;
                    }
                    let sp = a.data().add(a.row_offset(i, i02, i03));
                    let dp = node.data().add(node.row_offset(row as usize, i02, i03));
                    if st == GgmlType::F32 {
                        from(std::slice::from_raw_parts(sp as *const f32, nc), dp);
                    } else if dt == GgmlType::F16 {
                        std::ptr::copy_nonoverlapping(sp, dp, nc * 2);
                    } else {
                        (traits(GgmlType::F16).unwrap().to_f32.unwrap())(sp, tmp);
                        from(tmp, dp);
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
    fn get_rows_matches_reference() {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::I32] {
            for nth in [1, 3] {
                let (nc, nr, b) = (6, 5, 2);
                let vals: Vec<f32> = (0..nc * nr * b).map(|i| i as f32).collect();
                let mut a = TT::new(ty, [nc, nr, b, 1]);
                a.set(&vals);
                let ids = [4.0, 0.0, 2.0, 1.0, 1.0, 3.0];
                let mut idx = TT::new(GgmlType::I32, [3, b, 1, 1]);
                idx.set(&ids);
                let dty = if ty == GgmlType::I32 {
                    GgmlType::I32
                } else {
                    GgmlType::F32
                };
                let mut d = TT::new(dty, [nc, 3, b, 1]);
                d.op(op::GET_ROWS).src(0, &a).src(1, &idx);
                run(&d, nth);
                let mut want = vec![];
                for m in 0..b {
                    for j in 0..3 {
                        let r = ids[m * 3 + j] as usize;
                        want.extend_from_slice(&vals[(m * nr + r) * nc..(m * nr + r + 1) * nc]);
                    }
                }
                assert_eq!(d.get(), want, "{ty:?}");
            }
        }
    }

    #[test]
    fn set_rows_declines_activation_only_destinations() {
        for (dty, claimed) in [
            (GgmlType::Q8_0, true),
            (GgmlType::Q6_K, true),
            (GgmlType::Q8_1, false),
            (GgmlType::Q8_K, false),
        ] {
            let a = TT::new(GgmlType::F32, [256, 2, 1, 1]);
            let idx = TT::new(GgmlType::I64, [2, 1, 1, 1]);
            let mut d = TT::new(dty, [256, 4, 1, 1]);
            d.op(op::SET_ROWS).src(0, &a).src(1, &idx);
            assert_eq!(super::super::supports(&d.tensor()), claimed, "{dty:?}");
        }
    }

    #[test]
    fn set_rows_matches_reference() {
        for (sty, dty, ity) in [
            (GgmlType::F32, GgmlType::F16, GgmlType::I64),
            (GgmlType::F32, GgmlType::F32, GgmlType::I32),
            (GgmlType::F16, GgmlType::F16, GgmlType::I64),
            (GgmlType::F16, GgmlType::BF16, GgmlType::I32),
        ] {
            for nth in [1, 3] {
                let (nc, n, nd, b) = (8, 3, 7, 4);
                let vals = rand_vec(nc * n * b, 3, -4.0, 4.0)
                    .iter()
                    .map(|v| (v * 4.0).round() / 4.0)
                    .collect::<Vec<_>>();
                let mut a = TT::new(sty, [nc, n, b, 1]);
                a.set(&vals);
                // indices broadcast over dim 2: 2 index rows for 4 matrices
                let ids = [6.0, 0.0, 3.0, 2.0, 5.0, 1.0];
                let mut idx = TT::new(ity, [n, 2, 1, 1]);
                idx.set(&ids);
                let mut d = TT::new(dty, [nc, nd, b, 1]);
                d.op(op::SET_ROWS).src(0, &a).src(1, &idx);
                run(&d, nth);
                let mut want = vec![0f32; nc * nd * b];
                for m in 0..b {
                    for i in 0..n {
                        let r = ids[(m % 2) * n + i] as usize;
                        for c in 0..nc {
                            want[(m * nd + r) * nc + c] = vals[(m * n + i) * nc + c];
                        }
                    }
                }
                assert_eq!(d.get(), want);
            }
        }
    }
}
