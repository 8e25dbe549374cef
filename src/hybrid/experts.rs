//! A batch's MUL_MAT_ID reads only the experts its ids name. RFHYBRID streams just those into
//! the arena (each at its own offset, so the kernels index the tensor as they would), after
//! reading the ids back, as ggml's scheduler copies only the used experts of an offloaded
//! MUL_MAT_ID.

use crate::ggml_types::{op, GgmlType};
use crate::tensor::Tensor;

/// The experts tensor and the ids of `n` where its experts may be streamed by the ids: a
/// MUL_MAT_ID of two or more tokens over a 3-D tensor of whole experts and I32 ids.
pub fn batch_experts<'a>(n: &Tensor<'a>) -> Option<(Tensor<'a>, Tensor<'a>)> {
    let (w, ids) = (n.src(0)?, n.src(2)?);
    let (wne, ine) = (w.ne(), ids.ne());
    (n.op() == op::MUL_MAT_ID
        && crate::tuning::get().hybrid_used_experts
        && ids.dtype() == GgmlType::I32
        && ine[1] >= 2
        && ine[2] == 1
        && ine[3] == 1
        && wne[2] > 1
        && wne[3] == 1
        && w.nb()[2] * wne[2] == w.nbytes())
    .then_some((w, ids))
}

/// The ids of a [n_used, n_tok] I32 tensor, read from its data.
///
/// # Safety
/// `ids`' data is host memory that holds its current values.
pub unsafe fn read_ids(ids: &Tensor) -> Vec<i32> {
    let (ne, nb) = (ids.ne(), ids.nb());
    let mut out = Vec::with_capacity(ne[0] * ne[1]);
    for t in 0..ne[1] {
        for u in 0..ne[0] {
            out.push(std::ptr::read_unaligned(
                ids.data().add(u * nb[0] + t * nb[1]) as *const i32,
            ));
        }
    }
    out
}

/// Byte ranges (offset, length) within the experts tensor of the runs of consecutive experts
/// that `ids` name; None where an id is outside 0..n_as (the whole tensor is copied then).
pub fn used_expert_ranges(
    ids: &[i32],
    n_as: usize,
    expert_bytes: usize,
) -> Option<Vec<(usize, usize)>> {
    let mut used = vec![false; n_as];
    for &id in ids {
        *used.get_mut(usize::try_from(id).ok()?)? = true;
    }
    let mut out = Vec::new();
    let mut e = 0;
    while e < n_as {
        if !used[e] {
            e += 1;
            continue;
        }
        let first = e;
        while e < n_as && used[e] {
            e += 1;
        }
        out.push((first * expert_bytes, (e - first) * expert_bytes));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_used_experts_become_ranges() {
        // Experts 1, 2, 3 and 6 of 8, named in any order and more than once.
        let r = used_expert_ranges(&[3, 1, 6, 2, 1, 3], 8, 100).unwrap();
        assert_eq!(r, vec![(100, 300), (600, 100)]);
        // All used: one range; none: nothing.
        assert_eq!(used_expert_ranges(&[1, 0], 2, 7).unwrap(), vec![(0, 14)]);
        assert!(used_expert_ranges(&[], 4, 7).unwrap().is_empty());
        // The last expert alone.
        assert_eq!(used_expert_ranges(&[4], 5, 10).unwrap(), vec![(40, 10)]);
    }

    #[test]
    fn an_id_out_of_range_means_every_expert() {
        assert!(used_expert_ranges(&[0, 8], 8, 1).is_none());
        assert!(used_expert_ranges(&[-1], 8, 1).is_none());
    }
}
