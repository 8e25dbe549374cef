//! Element-wise ops: binary (ADD, SUB, MUL, DIV), SCALE, SOFT_MAX, ADD_ID (elementwise.hip) and
//! the activations of UNARY, the math ops and GLU (activation.hip).

use super::args::Args;
use super::{flat_blocks, float_code, is_f32_or_f16, row_block, LaunchCtx};
use crate::ggml_types::{glu, op, unary, GgmlType};
use crate::gpu::api::ApiResult;
use crate::tensor::Tensor;

pub(super) fn supports_binary(node: &Tensor) -> bool {
    let (Some(a), Some(b)) = (node.src(0), node.src(1)) else {
        return false;
    };
    use GgmlType::*;
    let types_ok = matches!(
        (a.dtype(), b.dtype(), node.dtype()),
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

pub(super) fn supports_scale(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    a.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && a.same_shape(node)
        && a.is_contiguous()
        && node.is_contiguous()
}

pub(super) fn supports_soft_max(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    if a.dtype() != GgmlType::F32 || node.dtype() != GgmlType::F32 {
        return false;
    }
    if !a.same_shape(node) || !a.has_dense_rows() || !node.is_contiguous() {
        return false;
    }
    let (ne, nea) = (node.ne(), a.ne());
    if let Some(m) = node.src(1) {
        let mne = m.ne();
        if !is_f32_or_f16(m.dtype()) || !m.has_dense_rows() {
            return false;
        }
        if mne[0] != nea[0]
            || mne[1] < nea[1]
            || mne[2] == 0
            || mne[3] == 0
            || nea[2] % mne[2] != 0
            || nea[3] % mne[3] != 0
        {
            return false;
        }
    }
    if let Some(s) = node.src(2) {
        if s.dtype() != GgmlType::F32 || s.nelements() < ne[2] || !s.is_contiguous() {
            return false;
        }
    }
    node.nrows() <= i32::MAX as usize
}

pub(super) fn supports_add_id(node: &Tensor) -> bool {
    let (Some(a), Some(b), Some(ids)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let (ne, bne, ine) = (a.ne(), b.ne(), ids.ne());
    [a.dtype(), b.dtype(), node.dtype()]
        .iter()
        .all(|&t| t == GgmlType::F32)
        && ids.dtype() == GgmlType::I32
        && a.same_shape(node)
        && bne[0] == ne[0]
        && ine[0] == ne[1]
        && ine[1] == ne[2]
        && a.has_dense_rows()
        && b.has_dense_rows()
        && node.has_dense_rows()
        && node.nrows() <= i32::MAX as usize
}

pub(super) fn launch_binary(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (a, b) = (node.src(0).unwrap(), node.src(1).unwrap());
    let code = match node.op() {
        op::ADD => 0,
        op::SUB => 1,
        op::MUL => 2,
        _ => 3,
    };
    let all_f32 = [a.dtype(), b.dtype(), node.dtype()]
        .iter()
        .all(|&t| t == GgmlType::F32);
    let mut args = Args::default().i32(code);
    if !all_f32 {
        args = args
            .i32(float_code(a.dtype()))
            .i32(float_code(b.dtype()))
            .i32(float_code(node.dtype()));
    }
    let args = args
        .ptr(a.data())
        .ptr(b.data())
        .ptr(node.data())
        .i64s(&node.ne())
        .i64s(&b.ne())
        .i64s(&a.nb())
        .i64s(&b.nb())
        .i64s(&node.nb());
    let kernel = if all_f32 {
        "binary_f32"
    } else {
        "binary_typed"
    };
    lc.run(
        kernel,
        [flat_blocks(node.nelements(), 256), 1, 1],
        256,
        args,
    )
}

pub(super) fn launch_scale(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let n = node.nelements();
    let args = Args::default()
        .ptr(a.data())
        .ptr(node.data())
        .i64(n)
        .f32(node.param_f32(0))
        .f32(node.param_f32(1));
    lc.run("scale_f32", [flat_blocks(n, 256), 1, 1], 256, args)
}

pub(super) fn launch_soft_max(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let (mask, sinks) = (node.src(1), node.src(2));
    let (ne, nba, nbd) = (node.ne(), a.nb(), node.nb());
    let (scale, max_bias) = (node.param_f32(0), node.param_f32(1));
    // ALiBi constants as ggml defines them (n_head = ne[2]).
    let n_head = ne[2] as u32;
    let n_head_log2 = if n_head == 0 {
        0
    } else {
        1u32 << (31 - n_head.leading_zeros())
    };
    let (m0, m1) = if n_head_log2 > 0 {
        (
            2f32.powf(-max_bias / n_head_log2 as f32),
            2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32),
        )
    } else {
        (1.0, 1.0)
    };
    let (mne, nbm, mask_f16) = match mask {
        Some(m) => (m.ne(), m.nb(), (m.dtype() == GgmlType::F16) as i32),
        None => ([1; 4], [0; 4], 0),
    };
    let args = Args::default()
        .ptr(a.data())
        .opt_ptr(mask)
        .opt_ptr(sinks)
        .ptr(node.data())
        .i64s(&ne[..3])
        .i64s(&nba[1..])
        .i32(mask_f16)
        .i64(mne[2])
        .i64(mne[3])
        .i64s(&nbm[1..])
        .i64s(&nbd[1..])
        .f32(scale)
        .f32(max_bias)
        .f32(m0)
        .f32(m1)
        .i32(n_head_log2 as i32);
    lc.run("soft_max_f32", [node.nrows(), 1, 1], row_block(ne[0]), args)
}

/// Activation codes of activation.hip.
pub(super) fn act_code_unary(u: i32) -> Option<i32> {
    Some(match u {
        unary::RELU => 0,
        unary::GELU => 1,
        unary::SILU => 2,
        unary::GELU_ERF => 3,
        unary::GELU_QUICK => 4,
        unary::TANH => 5,
        unary::NEG => 6,
        unary::SIGMOID => 7,
        unary::ABS => 8,
        unary::SGN => 9,
        unary::STEP => 10,
        unary::ELU => 11,
        unary::HARDSWISH => 12,
        unary::HARDSIGMOID => 13,
        unary::EXP => 14,
        _ => return None,
    })
}

pub(super) fn act_code_glu(g: i32) -> Option<i32> {
    Some(match g {
        glu::REGLU => 0,
        glu::GEGLU => 1,
        glu::SWIGLU => 2,
        glu::GEGLU_ERF => 3,
        glu::GEGLU_QUICK => 4,
        _ => return None,
    })
}

/// Activation code of an UNARY node or of the element-wise ops activation.hip computes.
pub(super) fn act_code(node: &Tensor) -> Option<i32> {
    Some(match node.op() {
        op::UNARY => return act_code_unary(node.param_i32(0)),
        op::SQR => 15,
        op::SQRT => 16,
        op::LOG => 17,
        op::SIN => 18,
        op::COS => 19,
        op::CLAMP => 20,
        op::LEAKY_RELU => 21,
        _ => return None,
    })
}

pub(super) fn supports_unary(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    let t = a.dtype();
    if act_code(node).is_none() || !is_f32_or_f16(t) || node.dtype() != t || !a.same_shape(node) {
        return false;
    }
    match node.op() {
        // ggml-cpu walks these by flat row index.
        op::CLAMP | op::LEAKY_RELU => a.is_contiguous_from(1) && node.is_contiguous_from(1),
        _ => a.has_dense_rows() && node.has_dense_rows(),
    }
}

pub(super) fn launch_unary(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let n = node.nelements();
    let code = act_code(node).unwrap_or(0);
    if node.op() == op::UNARY
        && a.dtype() == GgmlType::F32
        && a.is_contiguous()
        && node.is_contiguous()
    {
        let args = Args::default()
            .i32(code)
            .ptr(a.data())
            .ptr(node.data())
            .i64(n);
        return lc.run("unary_f32", [flat_blocks(n, 256), 1, 1], 256, args);
    }
    let (p0, p1) = match node.op() {
        op::CLAMP | op::LEAKY_RELU => (node.param_f32(0), node.param_f32(1)),
        _ => (0.0, 0.0),
    };
    let ne = node.ne();
    let args = Args::default()
        .i32(code)
        .ptr(a.data())
        .ptr(node.data())
        .i64s(&ne[..3])
        .i64(n)
        .i64s(&a.nb()[1..])
        .i64s(&node.nb()[1..])
        .f32(p0)
        .f32(p1);
    let kernel = if a.dtype() == GgmlType::F16 {
        "unary_rows_f16"
    } else {
        "unary_rows_f32"
    };
    lc.run(kernel, [flat_blocks(n, 256), 1, 1], 256, args)
}

pub(super) fn supports_glu(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    if act_code_glu(node.param_i32(0)).is_none()
        || !is_f32_or_f16(a.dtype())
        || node.dtype() != a.dtype()
    {
        return false;
    }
    if !a.is_contiguous_from(1)
        || !node.is_contiguous_from(1)
        || node.nrows() != a.nrows()
        || !a.has_dense_rows()
        || !node.has_dense_rows()
    {
        return false;
    }
    let nc = match node.src(1) {
        Some(b) => {
            if b.dtype() != a.dtype()
                || !b.is_contiguous_from(1)
                || !b.has_dense_rows()
                || !b.same_shape(&a)
            {
                return false;
            }
            a.ne()[0]
        }
        None => a.ne()[0] / 2,
    };
    node.ne()[0] == nc
}

pub(super) fn launch_glu(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let nc = node.ne()[0];
    let swapped = node.param_i32(1) != 0;
    let (x, g, nbg1) = match node.src(1) {
        Some(b) => (a.data() as *const u8, b.data() as *const u8, b.nb()[1]),
        None => {
            let half = unsafe { a.data().add(nc * a.dtype().type_size()) } as *const u8;
            if swapped {
                (half, a.data() as *const u8, a.nb()[1])
            } else {
                (a.data() as *const u8, half, a.nb()[1])
            }
        }
    };
    let n = node.nelements();
    let args = Args::default()
        .i32(act_code_glu(node.param_i32(0)).unwrap_or(2))
        .ptr(x)
        .ptr(g)
        .ptr(node.data())
        .i64(nc)
        .i64(node.nrows())
        .i64(a.nb()[1])
        .i64(nbg1)
        .i64(node.nb()[1]);
    let kernel = if a.dtype() == GgmlType::F16 {
        "glu_f16"
    } else {
        "glu_f32"
    };
    lc.run(kernel, [flat_blocks(n, 256), 1, 1], 256, args)
}

pub(super) fn launch_add_id(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (a, b, ids) = (
        node.src(0).unwrap(),
        node.src(1).unwrap(),
        node.src(2).unwrap(),
    );
    let ne = node.ne();
    let args = Args::default()
        .ptr(a.data())
        .ptr(b.data())
        .ptr(ids.data())
        .ptr(node.data())
        .i64s(&ne[..3])
        .i64(b.ne()[1])
        .i64s(&a.nb()[1..])
        .i64(b.nb()[1])
        .i64(ids.nb()[0])
        .i64(ids.nb()[1])
        .i64s(&node.nb()[1..]);
    if node.nrows() == 0 {
        return Ok(());
    }
    lc.run("add_id_f32", [node.nrows(), 1, 1], row_block(ne[0]), args)
}
