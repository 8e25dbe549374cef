//! DUP, CPY, CONT: copy the elements of src0, in its logical row-major order, into dst, which
//! has as many elements in any shape and layout, converting between F32, F16 and BF16.

use super::Ctx;
use crate::cpu::types::{is_float, load_f32, store_f32, traits};
use crate::tensor::{split_range, Tensor};

pub fn supports(node: &Tensor) -> bool {
    let Some(src) = node.src(0) else { return false };
    let (st, dt) = (src.dtype(), node.dtype());
    src.nelements() == node.nelements() && is_float(st) && is_float(dt)
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let src = node.src(0).unwrap();
    let (st, dt) = (src.dtype(), node.dtype());
    let sne = src.ne();
    let dne = node.ne();

    if st == dt && src.is_contiguous() && node.is_contiguous() {
        // One flat memcpy, split in byte ranges.
        let n = src.nbytes();
        let r = split_range(n, ctx.ith, ctx.nth);
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.data().add(r.start),
                node.data().add(r.start),
                r.len(),
            )
        };
        return;
    }

    let rows = src.nrows();
    let range = split_range(rows, ctx.ith, ctx.nth);
    if range.is_empty() {
        return;
    }
    let same_rows = sne[0] == dne[0] && src.has_dense_rows() && node.has_dense_rows();
    if same_rows {
        // Row r of src is row r of dst (flat order): convert row by row.
        let sz = st.type_size();
        let mut tmp = vec![0f32; sne[0]];
        let (to, from) = (
            traits(st).unwrap().to_f32.unwrap(),
            traits(dt).unwrap().from_f32.unwrap(),
        );
        for r in range {
            let (s1, s2, s3) = unflatten3(r, sne[1], sne[2]);
            let (d1, d2, d3) = unflatten3(r, dne[1], dne[2]);
            unsafe {
                let sp = src.data().add(src.row_offset(s1, s2, s3));
                let dp = node.data().add(node.row_offset(d1, d2, d3));
                if st == dt {
                    std::ptr::copy_nonoverlapping(sp, dp, sne[0] * sz);
                } else {
                    to(sp, &mut tmp);
                    from(&tmp, dp);
                }
            }
        }
        return;
    }

    // General case: walk dst coordinates alongside the flat index of src's elements.
    let first = range.start * sne[0];
    let mut d = [0usize; 4];
    {
        let mut f = first;
        for k in 0..4 {
            d[k] = f % dne[k];
            f /= dne[k];
        }
    }
    for r in range {
        let (s1, s2, s3) = unflatten3(r, sne[1], sne[2]);
        for s0 in 0..sne[0] {
            unsafe {
                let sp = src.data().add(src.offset(s0, s1, s2, s3));
                let dp = node.data().add(node.offset(d[0], d[1], d[2], d[3]));
                if st == dt {
                    std::ptr::copy_nonoverlapping(sp, dp, st.type_size());
                } else {
                    store_f32(dt, dp, load_f32(st, sp));
                }
            }
            d[0] += 1;
            for k in 0..3 {
                if d[k] == dne[k] {
                    d[k] = 0;
                    d[k + 1] += 1;
                }
            }
        }
    }
}

/// Row index -> (i1, i2, i3) for dims of size n1, n2.
#[inline]
pub fn unflatten3(r: usize, n1: usize, n2: usize) -> (usize, usize, usize) {
    (r % n1, (r / n1) % n2, r / (n1 * n2))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    const FLOATS: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

    /// `v` rounded to `ty` and read back as f32.
    fn rounded(ty: GgmlType, v: &[f32]) -> Vec<f32> {
        let mut t = TT::new(ty, [v.len(), 1, 1, 1]);
        t.set(v);
        t.get()
    }

    /// A [ne0, ne1, ne2, 1] tensor whose dims 0 and 1 are swapped in memory (a transposed view).
    fn transposed(ty: GgmlType, ne: [usize; 4]) -> TT {
        let ts = ty.type_size();
        let nb = [
            ts * ne[1],
            ts,
            ts * ne[0] * ne[1],
            ts * ne[0] * ne[1] * ne[2],
        ];
        TT::strided(ty, ne, nb, nb[3] * ne[3])
    }

    #[test]
    fn cpy_converts_between_float_types() {
        let ne = [13, 4, 3, 2];
        let v = rand_vec(ne.iter().product(), 3, -100.0, 100.0);
        for st in FLOATS {
            for dt in FLOATS {
                for nth in [1, 3] {
                    for o in [op::CPY, op::DUP, op::CONT] {
                        let mut s = TT::new(st, ne);
                        s.set(&v);
                        let mut d = TT::new(dt, ne);
                        d.op(o).src(0, &s);
                        run(&d, nth);
                        assert_close(&d.get(), &rounded(dt, &s.get()), 0.0);
                    }
                }
            }
        }
    }

    #[test]
    fn cont_of_transposed_src() {
        let ne = [5, 7, 3, 1];
        let v = rand_vec(5 * 7 * 3, 4, -2.0, 2.0);
        for st in FLOATS {
            for dt in FLOATS {
                for nth in [1, 3] {
                    let mut s = transposed(st, ne);
                    s.set(&v);
                    let mut d = TT::new(dt, ne);
                    d.op(op::CONT).src(0, &s);
                    run(&d, nth);
                    assert_close(&d.get(), &rounded(dt, &s.get()), 0.0);
                }
            }
        }
    }

    #[test]
    fn cpy_into_reshaped_and_padded_dst() {
        let ne = [6, 4, 3, 1];
        let v = rand_vec(72, 5, -2.0, 2.0);
        for st in FLOATS {
            for dt in FLOATS {
                for nth in [1, 3] {
                    // Non-contiguous src into a dst of another shape: flat element order is kept.
                    let mut s = transposed(st, ne);
                    s.set(&v);
                    let mut d = TT::new(dt, [8, 9, 1, 1]);
                    d.op(op::DUP).src(0, &s);
                    run(&d, nth);
                    assert_close(&d.get(), &rounded(dt, &s.get()), 0.0);

                    // Same row length, dst rows padded (row stride larger than the row).
                    let mut s = TT::new(st, ne);
                    s.set(&v);
                    let ts = dt.type_size();
                    let nb = [ts, ts * 10, ts * 10 * 4, ts * 10 * 4 * 3];
                    let mut d = TT::strided(dt, ne, nb, nb[3]);
                    d.op(op::CPY).src(0, &s);
                    run(&d, nth);
                    assert_close(&d.get(), &rounded(dt, &s.get()), 0.0);
                }
            }
        }
    }

    #[test]
    fn cpy_rejects_element_count_mismatch() {
        let s = TT::new(GgmlType::F32, [4, 4, 1, 1]);
        let mut d = TT::new(GgmlType::F32, [5, 3, 1, 1]);
        d.op(op::CPY).src(0, &s);
        assert!(!super::super::supports(&d.tensor()));
    }
}
