//! Shape and layout rules that ggml's ops impose whatever device computes them. Each device's
//! `supports_op` adds its own type checks on top of these.

use crate::ggml_types::{op, GgmlType};
use crate::tensor::Tensor;

/// GET_ROWS: I32 ids [n, b2, b3], output [ne0, n, b2, b3] taking rows of src0 batch (b2, b3).
pub fn get_rows_layout_ok(node: &Tensor) -> bool {
    let (Some(a), Some(idx)) = (node.src(0), node.src(1)) else {
        return false;
    };
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
    let (Some(a), Some(idx)) = (node.src(0), node.src(1)) else {
        return false;
    };
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

/// CONCAT, REPEAT, PAD, FILL, ARANGE, DIAG_MASK_INF: the layouts and types both devices compute
/// (no arithmetic on the values, so the type lists are the same on every device).
pub fn layout_op_ok(node: &Tensor) -> bool {
    let t = node.dtype();
    let ne = node.ne();
    match node.op() {
        op::CONCAT => {
            let (Some(a), Some(b)) = (node.src(0), node.src(1)) else {
                return false;
            };
            let d = node.param_i32(0);
            if !(0..4).contains(&d)
                || !matches!(
                    t,
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::I32
                )
            {
                return false;
            }
            let (an, bn) = (a.ne(), b.ne());
            a.dtype() == t
                && b.dtype() == t
                && a.has_dense_rows()
                && b.has_dense_rows()
                && (0..4).all(|i| {
                    if i == d as usize {
                        ne[i] == an[i] + bn[i]
                    } else {
                        ne[i] == an[i] && ne[i] == bn[i]
                    }
                })
        }
        op::REPEAT => {
            let Some(a) = node.src(0) else { return false };
            matches!(t, GgmlType::F32 | GgmlType::F16)
                && a.dtype() == t
                && node.can_repeat_from(&a)
                && node.is_contiguous()
        }
        op::PAD => {
            let Some(a) = node.src(0) else { return false };
            let an = a.ne();
            let p: Vec<i32> = (0..8).map(|i| node.param_i32(i)).collect();
            t == GgmlType::F32
                && a.dtype() == t
                && node.param_i32(8) == 0
                && node.is_contiguous()
                && p.iter().all(|&v| v >= 0)
                && (0..4).all(|i| ne[i] == an[i] + p[2 * i] as usize + p[2 * i + 1] as usize)
        }
        op::FILL => matches!(t, GgmlType::F32 | GgmlType::F16) && node.has_dense_rows(),
        op::ARANGE => {
            let (start, stop, step) = (node.param_f32(0), node.param_f32(1), node.param_f32(2));
            let steps = ((stop - start) / step).ceil();
            t == GgmlType::F32
                && node.has_dense_rows()
                && steps.is_finite()
                && steps as i64 == node.nelements() as i64
                && ne[1] * ne[2] * ne[3] == 1
        }
        op::DIAG_MASK_INF => {
            let Some(a) = node.src(0) else { return false };
            t == GgmlType::F32
                && a.dtype() == t
                && a.same_shape(node)
                && a.is_contiguous()
                && node.is_contiguous()
                && node.param_i32(0) >= 0
        }
        _ => false,
    }
}

/// ggml's GGML_HINT_SRC0_IS_HADAMARD (op_params[1] of a MUL_MAT): src0 is the normalized
/// Sylvester Hadamard matrix, and ggml-cpu computes the product as a fast Walsh-Hadamard
/// transform of each src1 row without reading src0 (llama.cpp's rotations of Q, K, V and the
/// attention output for quantized KV caches).
pub const HINT_SRC0_IS_HADAMARD: i32 = 1;

/// Longest transformed row either device claims (HADAMARD_MAX in kernels/hadamard.hip: the
/// GPU's row kernel holds a row in shared memory).
pub const HADAMARD_MAX: usize = 4096;

/// The row length n of a MUL_MAT that ggml-cpu computes as a Walsh-Hadamard transform (the
/// hint, F32 src0 [n, n] of any content, F32 or F16 src1 rows of n dense values, F32 dst of the
/// same rows), for n a power of two up to HADAMARD_MAX; None for any other node.
pub fn hadamard_len(node: &Tensor) -> Option<usize> {
    let (w, x) = (node.src(0)?, node.src(1)?);
    if node.op() != op::MUL_MAT || node.param_i32(1) != HINT_SRC0_IS_HADAMARD {
        return None;
    }
    let (wne, xne, dne, dnb) = (w.ne(), x.ne(), node.ne(), node.nb());
    let n = xne[0];
    let ok = w.dtype() == GgmlType::F32
        && matches!(x.dtype(), GgmlType::F32 | GgmlType::F16)
        && node.dtype() == GgmlType::F32
        && n.is_power_of_two()
        && n <= HADAMARD_MAX
        && wne[0] == n
        && wne[1] == n
        && dne == [n, xne[1], xne[2], xne[3]]
        && x.has_dense_rows()
        && dnb[0] == 4
        && dnb[0] <= dnb[1]
        && dnb[1] <= dnb[2]
        && dnb[2] <= dnb[3];
    ok.then_some(n)
}

/// 1 / sqrt(n) as ggml-cpu's transform computes it (in f32), the factor applied before the
/// butterflies.
pub fn hadamard_scale(n: usize) -> f32 {
    1.0f32 / (n as f32).sqrt()
}
