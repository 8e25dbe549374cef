//! Node order for graphs with row-split products (`-sm row`), set before ggml allocates the
//! graph (the backend's `graph_optimize`). A split product sends its src1 to the other GPUs
//! and waits for their rows (`backend/split_exec.rs`); products of one src1 (Q, K and V;
//! gate and up) placed one after another share the other GPUs' wait for src1 and the main
//! stream's wait for their rows. libllama puts each of Q, K and V's own nodes (reshape, norm,
//! rope) right after its product, so the products are moved together here.

use crate::ffi::abi::ggml_tensor;
use crate::ggml_types::op;
use crate::tensor::Tensor;

/// The tensor whose memory `t` is (itself where not a view).
fn root(mut t: *const ggml_tensor) -> *const ggml_tensor {
    // SAFETY (of the derefs): ggml's view chains end at a tensor without view_src.
    while let Some(v) = unsafe { t.as_ref() }.map(|r| r.view_src as *const ggml_tensor) {
        if v.is_null() {
            break;
        }
        t = v;
    }
    t
}

/// Moves each split product (a MUL_MAT or MUL_MAT_ID for which `is_split` holds) up to right
/// after an earlier split product of the same src1 (and ids), past the nodes between, unless
/// one of them writes into src1's memory (an in-place op on it). The products read only their
/// weights, src1 and ids, and nothing between can read their output, so the order stays a
/// valid one. Returns how many moved.
///
/// # Safety
/// `nodes` are valid tensors of one graph (their sources and view sources valid too).
pub unsafe fn group_split_products(
    nodes: &mut [*mut ggml_tensor],
    is_split: impl Fn(&Tensor) -> bool,
) -> usize {
    // A split product's src1 and (MUL_MAT_ID's) ids: what it reads besides its weights.
    let split = |p: *mut ggml_tensor| -> Option<(*mut ggml_tensor, *mut ggml_tensor)> {
        // SAFETY: a node of the graph (the caller's promise).
        let t = unsafe { Tensor::from_ptr(p) }?;
        let r = t.raw();
        let ids = if t.op() == op::MUL_MAT_ID {
            r.src[2]
        } else {
            std::ptr::null_mut()
        };
        (matches!(t.op(), op::MUL_MAT | op::MUL_MAT_ID) && is_split(&t) && !r.src[1].is_null())
            .then_some((r.src[1], ids))
    };
    let mut moved = 0;
    let mut i = 0;
    while i < nodes.len() {
        let Some(x) = split(nodes[i]) else {
            i += 1;
            continue;
        };
        let base = root(x.0);
        let mut at = i + 1;
        for j in i + 1..nodes.len() {
            if split(nodes[j]) == Some(x) {
                if j != at {
                    nodes[at..=j].rotate_right(1);
                    moved += 1;
                }
                at += 1;
                continue;
            }
            // SAFETY: a node of the graph.
            let n = unsafe { &*nodes[j] };
            let viewing = matches!(
                n.op,
                op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE
            );
            if !viewing && !n.view_src.is_null() && root(nodes[j]) == base {
                break;
            }
        }
        i = at;
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::testutil::TT;
    use crate::ggml_types::GgmlType;

    fn node(o: i32, srcs: &[&TT]) -> TT {
        let mut t = TT::new(GgmlType::F32, [8, 1, 1, 1]);
        t.t.op = o;
        for (k, s) in srcs.iter().enumerate() {
            t.t.src[k] = &*s.t as *const ggml_tensor as *mut ggml_tensor;
        }
        t
    }

    fn ptr(t: &TT) -> *mut ggml_tensor {
        &*t.t as *const ggml_tensor as *mut ggml_tensor
    }

    /// libllama's attention order: Q's product, reshape, rope, then K's, then V's. The three
    /// products become consecutive, the rest keeps its order.
    #[test]
    fn q_k_v_products_become_consecutive() {
        let x = node(op::RMS_NORM, &[]);
        let (wq, wk, wv, wo) = (
            node(op::NONE, &[]),
            node(op::NONE, &[]),
            node(op::NONE, &[]),
            node(op::NONE, &[]),
        );
        let q = node(op::MUL_MAT, &[&wq, &x]);
        let qr = node(op::RESHAPE, &[&q]);
        let qp = node(op::ROPE, &[&qr]);
        let k = node(op::MUL_MAT, &[&wk, &x]);
        let kp = node(op::ROPE, &[&k]);
        let v = node(op::MUL_MAT, &[&wv, &x]);
        let o = node(op::MUL_MAT, &[&wo, &qp]);
        let mut nodes = [&x, &q, &qr, &qp, &k, &kp, &v, &o].map(ptr);
        let weights = [&wq, &wk, &wv, &wo].map(ptr);
        let is_split = |t: &Tensor| weights.contains(&t.raw().src[0]);
        let moved = unsafe { group_split_products(&mut nodes, is_split) };
        assert_eq!(moved, 2);
        assert_eq!(nodes, [&x, &q, &k, &v, &qr, &qp, &kp, &o].map(ptr));
        // Nothing moves when not split.
        let mut again = [&x, &q, &qr, &qp, &k, &kp, &v, &o].map(ptr);
        assert_eq!(unsafe { group_split_products(&mut again, |_| false) }, 0);
        assert_eq!(again, [&x, &q, &qr, &qp, &k, &kp, &v, &o].map(ptr));
    }

    /// A node writing into src1's memory between two products (an in-place op) keeps the
    /// later product after it.
    #[test]
    fn an_in_place_write_to_src1_is_not_crossed() {
        let x = node(op::RMS_NORM, &[]);
        let (wq, wk) = (node(op::NONE, &[]), node(op::NONE, &[]));
        let q = node(op::MUL_MAT, &[&wq, &x]);
        let mut inplace = node(op::SCALE, &[&x]);
        inplace.t.view_src = ptr(&x);
        let k = node(op::MUL_MAT, &[&wk, &x]);
        let mut nodes = [&x, &q, &inplace, &k].map(ptr);
        let weights = [&wq, &wk].map(ptr);
        let moved =
            unsafe { group_split_products(&mut nodes, |t| weights.contains(&t.raw().src[0])) };
        assert_eq!(moved, 0);
        assert_eq!(nodes, [&x, &q, &inplace, &k].map(ptr));
    }

    /// Gate and up experts of one src1 and ids come together; a MUL_MAT_ID of other ids
    /// does not join them.
    #[test]
    fn mul_mat_id_products_group_by_src1_and_ids() {
        let x = node(op::RMS_NORM, &[]);
        let (ids, other_ids) = (node(op::ARGSORT, &[]), node(op::ARGSORT, &[]));
        let (wg, wu, wo) = (
            node(op::NONE, &[]),
            node(op::NONE, &[]),
            node(op::NONE, &[]),
        );
        let g = node(op::MUL_MAT_ID, &[&wg, &x, &ids]);
        let between = node(op::SCALE, &[&g]);
        let o = node(op::MUL_MAT_ID, &[&wo, &x, &other_ids]);
        let u = node(op::MUL_MAT_ID, &[&wu, &x, &ids]);
        let mut nodes = [&x, &ids, &other_ids, &g, &between, &o, &u].map(ptr);
        let weights = [&wg, &wu, &wo].map(ptr);
        let moved =
            unsafe { group_split_products(&mut nodes, |t| weights.contains(&t.raw().src[0])) };
        assert_eq!(moved, 1);
        assert_eq!(nodes, [&x, &ids, &other_ids, &g, &u, &between, &o].map(ptr));
    }
}
