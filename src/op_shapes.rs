//! Shape and layout rules that ggml's ops impose whatever device computes them. Each device's
//! `supports_op` adds its own type checks on top of these.

use crate::ggml_types::GgmlType;
use crate::tensor::Tensor;

/// GET_ROWS: I32 ids [n, b2, b3], output [ne0, n, b2, b3] taking rows of src0 batch (b2, b3).
pub fn get_rows_layout_ok(node: &Tensor) -> bool {
    let (Some(a), Some(idx)) = (node.src(0), node.src(1)) else { return false };
    let (ane, ine, dne) = (a.ne(), idx.ne(), node.ne());
    idx.dtype() == GgmlType::I32
        && ine[3] == 1
        && dne == [ane[0], ine[0], ine[1], ine[2]]
        && ane[2] == ine[1]
        && ane[3] == ine[2]
        && a.has_dense_rows()
        && node.has_dense_rows()
}

/// SET_ROWS: I32/I64 ids [n_rows of src, c2, c3] broadcast over src's dims 2 and 3.
pub fn set_rows_layout_ok(node: &Tensor) -> bool {
    let (Some(a), Some(idx)) = (node.src(0), node.src(1)) else { return false };
    let (ane, ine, dne) = (a.ne(), idx.ne(), node.ne());
    matches!(idx.dtype(), GgmlType::I32 | GgmlType::I64)
        && dne[0] == ane[0]
        && dne[2] == ane[2]
        && dne[3] == ane[3]
        && ine[0] == ane[1]
        && ine[1] > 0
        && ine[2] > 0
        && ane[2] % ine[1] == 0
        && ane[3] % ine[2] == 0
        && ine[3] == 1
        && a.has_dense_rows()
        && node.has_dense_rows()
}
