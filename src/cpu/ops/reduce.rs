//! Row reductions and orderings over F32 rows: SUM (whole tensor to a scalar), SUM_ROWS,
//! MEAN, CUMSUM (inclusive prefix sums), ARGSORT (op param 0: 0 ascending, 1 descending;
//! I32 indices, stable for equal values), TOP_K (I32 indices of the ne0 largest values,
//! largest first except that, like ggml-cpu, the first two are swapped: the order is not
//! part of the op's contract).

use super::Ctx;
use crate::ggml_types::{op, GgmlType};
use crate::tensor::{split_range, Tensor};

pub fn supports(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    let (ane, dne) = (a.ne(), node.ne());
    if a.dtype() != GgmlType::F32 || !a.has_dense_rows() {
        return false;
    }
    match node.op() {
        op::SUM => node.dtype() == GgmlType::F32 && node.nelements() == 1,
        op::SUM_ROWS | op::MEAN => {
            node.dtype() == GgmlType::F32
                && dne == [1, ane[1], ane[2], ane[3]]
                && node.has_dense_rows()
        }
        op::CUMSUM => node.dtype() == GgmlType::F32 && dne == ane && node.has_dense_rows(),
        op::ARGSORT => {
            node.dtype() == GgmlType::I32
                && dne == ane
                && matches!(node.param_i32(0), 0 | 1)
                && a.is_contiguous_from(1)
                && node.is_contiguous_from(1)
        }
        op::TOP_K => {
            node.dtype() == GgmlType::I32
                && dne[0] <= ane[0]
                && dne[1..] == ane[1..]
                && a.is_contiguous_from(1)
                && node.is_contiguous_from(1)
        }
        _ => false,
    }
}

fn row<'a>(t: &Tensor, r: usize) -> &'a [f32] {
    let ne = t.ne();
    let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
    unsafe {
        std::slice::from_raw_parts(t.data().add(t.row_offset(i1, i2, i3)) as *const f32, ne[0])
    }
}

fn row_mut<'a, T>(t: &Tensor, r: usize) -> &'a mut [T] {
    let ne = t.ne();
    let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
    unsafe {
        std::slice::from_raw_parts_mut(t.data().add(t.row_offset(i1, i2, i3)) as *mut T, ne[0])
    }
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let nr = a.nrows();
    match node.op() {
        op::SUM => {
            if ctx.ith == 0 {
                let s: f64 = (0..nr)
                    .map(|r| row(&a, r).iter().map(|&v| v as f64).sum::<f64>())
                    .sum();
                unsafe { *(node.data() as *mut f32) = s as f32 };
            }
        }
        op::SUM_ROWS | op::MEAN => {
            let n = a.ne()[0];
            for r in split_range(nr, ctx.ith, ctx.nth) {
                let s = row(&a, r).iter().map(|&v| v as f64).sum::<f64>() as f32;
                row_mut::<f32>(node, r)[0] = if node.op() == op::MEAN {
                    s / n as f32
                } else {
                    s
                };
            }
        }
        op::CUMSUM => {
            for r in split_range(nr, ctx.ith, ctx.nth) {
                let (x, y) = (row(&a, r), row_mut::<f32>(node, r));
                let mut acc = 0f32;
                for (i, (y, &x)) in y.iter_mut().zip(x).enumerate() {
                    acc = if i == 0 { x } else { acc + x };
                    *y = acc;
                }
            }
        }
        op::ARGSORT => {
            let desc = node.param_i32(0) == 1;
            let mut keys = Vec::new();
            for r in split_range(nr, ctx.ith, ctx.nth) {
                let (x, y) = (row(&a, r), row_mut::<i32>(node, r));
                if argsort_by_keys(x, y, desc, &mut keys) {
                    continue;
                }
                y.iter_mut().enumerate().for_each(|(i, v)| *v = i as i32);
                if desc {
                    y.sort_by(|&p, &q| {
                        x[q as usize]
                            .partial_cmp(&x[p as usize])
                            .unwrap_or(std::cmp::Ordering::Equal)
                    });
                } else {
                    y.sort_by(|&p, &q| {
                        x[p as usize]
                            .partial_cmp(&x[q as usize])
                            .unwrap_or(std::cmp::Ordering::Equal)
                    });
                }
            }
        }
        _ => {
            // TOP_K
            let k = node.ne()[0];
            let mut idx: Vec<i32> = Vec::new();
            for r in split_range(nr, ctx.ith, ctx.nth) {
                let (x, y) = (row(&a, r), row_mut::<i32>(node, r));
                idx.clear();
                idx.extend(0..x.len() as i32);
                let by = |p: &i32, q: &i32| {
                    x[*q as usize]
                        .partial_cmp(&x[*p as usize])
                        .unwrap_or(std::cmp::Ordering::Equal)
                };
                if k < idx.len() && k > 0 {
                    idx.select_nth_unstable_by(k - 1, by);
                }
                idx[..k].sort_by(by);
                y.copy_from_slice(&idx[..k]);
                if k > 1 {
                    y.swap(0, 1);
                }
            }
        }
    }
}

/// ARGSORT of a row without NaN as one unstable sort of (value, index) keys: the order of the
/// stable sort by value (ties by index), 2x faster on a router's 128 logits (a comparison
/// sort of indices read the values through them). -0.0 counts as 0.0, as `partial_cmp` has
/// it. false (nothing written) when the row holds a NaN or is longer than 2^32.
fn argsort_by_keys(x: &[f32], y: &mut [i32], desc: bool, keys: &mut Vec<u64>) -> bool {
    if x.len() > u32::MAX as usize || x.iter().any(|v| v.is_nan()) {
        return false;
    }
    keys.clear();
    keys.extend(x.iter().enumerate().map(|(i, &v)| {
        let bits = if v == 0.0 { 0 } else { v.to_bits() };
        // Ordered as unsigned integers in the floats' order.
        let ord = if bits >> 31 == 1 {
            !bits
        } else {
            bits | 1 << 31
        };
        let ord = if desc { !ord } else { ord };
        (u64::from(ord) << 32) | i as u64
    }));
    keys.sort_unstable();
    for (y, &k) in y.iter_mut().zip(keys.iter()) {
        *y = k as u32 as i32;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    #[test]
    fn reductions_match_reference() {
        let ne = [7, 3, 2, 1];
        let x = rand_vec(42, 4, -2.0, 2.0);
        for nth in [1, 3] {
            let mut a = TT::new(GgmlType::F32, ne);
            a.set(&x);
            let rows: Vec<&[f32]> = x.chunks(7).collect();

            let mut d = TT::new(GgmlType::F32, [1, 3, 2, 1]);
            d.op(op::SUM_ROWS).src(0, &a);
            run(&d, nth);
            assert_close(
                &d.get(),
                &rows.iter().map(|r| r.iter().sum()).collect::<Vec<f32>>(),
                1e-6,
            );

            let mut d = TT::new(GgmlType::F32, [1, 3, 2, 1]);
            d.op(op::MEAN).src(0, &a);
            run(&d, nth);
            assert_close(
                &d.get(),
                &rows
                    .iter()
                    .map(|r| r.iter().sum::<f32>() / 7.0)
                    .collect::<Vec<f32>>(),
                1e-6,
            );

            let mut d = TT::new(GgmlType::F32, [1, 1, 1, 1]);
            d.op(op::SUM).src(0, &a);
            run(&d, nth);
            assert_close(&d.get(), &[x.iter().sum()], 1e-5);

            let mut d = TT::new(GgmlType::F32, ne);
            d.op(op::CUMSUM).src(0, &a);
            run(&d, nth);
            let mut want = vec![];
            for r in &rows {
                let mut s = 0.0;
                for &v in r.iter() {
                    s += v;
                    want.push(s);
                }
            }
            assert_close(&d.get(), &want, 1e-6);

            for desc in [0, 1] {
                let mut d = TT::new(GgmlType::I32, ne);
                d.op(op::ARGSORT).src(0, &a).pi(0, desc);
                run(&d, nth);
                let got = d.get();
                for (ri, r) in rows.iter().enumerate() {
                    let mut idx: Vec<usize> = (0..7).collect();
                    idx.sort_by(|&p, &q| r[p].partial_cmp(&r[q]).unwrap());
                    if desc == 1 {
                        idx.reverse();
                    }
                    assert_eq!(
                        &got[ri * 7..ri * 7 + 7],
                        &idx.iter().map(|&v| v as f32).collect::<Vec<_>>()[..]
                    );
                }
            }

            let mut d = TT::new(GgmlType::I32, [3, 3, 2, 1]);
            d.op(op::TOP_K).src(0, &a);
            run(&d, nth);
            let got = d.get();
            for (ri, r) in rows.iter().enumerate() {
                let mut idx: Vec<usize> = (0..7).collect();
                idx.sort_by(|&p, &q| r[q].partial_cmp(&r[p]).unwrap());
                let mut g: Vec<usize> = got[ri * 3..ri * 3 + 3]
                    .iter()
                    .map(|&v| v as usize)
                    .collect();
                g.sort();
                let mut w = idx[..3].to_vec();
                w.sort();
                assert_eq!(g, w);
            }
        }
    }

    /// The keyed ARGSORT orders as the stable sort by `partial_cmp`, ties (0.0 and -0.0 too)
    /// by index, both directions; a row with a NaN is left to the stable sort.
    #[test]
    fn argsort_by_keys_equals_stable_sort() {
        let mut keys = Vec::new();
        for seed in 0..20u32 {
            let mut x = rand_vec(131, seed, -3.0, 3.0);
            // Ties, signed zeros, infinities, subnormals.
            for (i, v) in [
                (3, 0.0),
                (7, -0.0),
                (9, 0.0),
                (11, f32::INFINITY),
                (12, f32::NEG_INFINITY),
                (20, 1e-40),
                (21, -1e-40),
            ] {
                x[i] = v;
            }
            x[40] = x[41];
            x[50] = x[41];
            for desc in [false, true] {
                let mut want: Vec<i32> = (0..x.len() as i32).collect();
                want.sort_by(|&p, &q| {
                    let (p, q) = (x[p as usize], x[q as usize]);
                    let o = if desc {
                        q.partial_cmp(&p)
                    } else {
                        p.partial_cmp(&q)
                    };
                    o.unwrap()
                });
                let mut got = vec![0i32; x.len()];
                assert!(super::argsort_by_keys(&x, &mut got, desc, &mut keys));
                assert_eq!(got, want, "seed {seed} desc {desc}");
            }
        }
        let mut got = vec![0i32; 3];
        assert!(!super::argsort_by_keys(
            &[1.0, f32::NAN, 0.0],
            &mut got,
            false,
            &mut keys
        ));
    }
}
