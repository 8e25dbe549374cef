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
        unsafe { std::ptr::copy_nonoverlapping(src.data().add(r.start), node.data().add(r.start), r.len()) };
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
        let (to, from) = (traits(st).unwrap().to_f32.unwrap(), traits(dt).unwrap().from_f32.unwrap());
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
