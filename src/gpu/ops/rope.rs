//! ROPE: normal, NeoX, multi-section (rope.hip).

use super::args::Args;
use super::{is_f32_or_f16, LaunchCtx};
use crate::ggml_types::GgmlType;
use crate::gpu::api::ApiResult;
use crate::tensor::Tensor;

pub(super) const ROPE_NORMAL: i32 = 0;

pub(super) const ROPE_NEOX: i32 = 2;

pub(super) const ROPE_MROPE: i32 = 8;

pub(super) const ROPE_IMROPE: i32 = 40;

pub(super) fn supports_rope(node: &Tensor) -> bool {
    let (Some(a), Some(pos)) = (node.src(0), node.src(1)) else {
        return false;
    };
    let t = a.dtype();
    if !is_f32_or_f16(t)
        || node.dtype() != t
        || !a.same_shape(node)
        || !a.has_dense_rows()
        || !node.has_dense_rows()
    {
        return false;
    }
    let ne = node.ne();
    let (n_dims, mode, n_offs) = (node.param_i32(1), node.param_i32(2), node.param_i32(15));
    if !matches!(mode, ROPE_NORMAL | ROPE_NEOX | ROPE_MROPE | ROPE_IMROPE)
        || n_dims < 0
        || n_offs < 0
        || n_dims % 2 != 0
        || n_offs % 2 != 0
    {
        return false;
    }
    let multi = matches!(mode, ROPE_MROPE | ROPE_IMROPE);
    let n_pos = if multi { 4 * ne[2] } else { ne[2] };
    if (n_dims + n_offs) as usize > ne[0]
        || pos.dtype() != GgmlType::I32
        || !pos.is_contiguous()
        || pos.nelements() < n_pos
    {
        return false;
    }
    if multi {
        let s: Vec<i32> = (11..15).map(|i| node.param_i32(i)).collect();
        if s.iter().any(|&v| v < 0)
            || (s[0] <= 0 && s[1] <= 0 && s[2] <= 0)
            || s.iter().map(|&v| v as usize).sum::<usize>() > ne[0]
        {
            return false;
        }
    }
    if let Some(ff) = node.src(2) {
        if ff.dtype() != GgmlType::F32
            || !ff.is_contiguous()
            || ff.nelements() < n_dims as usize / 2
        {
            return false;
        }
    }
    // In place (src == dst) is fine: each thread reads its pair before writing it.
    node.nrows() <= i32::MAX as usize
}

/// (theta_scale, corr0, corr1) of a ROPE node: the YaRN correction range in rotated
/// dimensions, as ggml computes it.
pub(super) fn rope_consts(node: &Tensor) -> (f32, f32, f32) {
    let n_dims = node.param_i32(1);
    let (n_ctx_orig, freq_base) = (node.param_i32(4), node.param_f32(5));
    let (beta_fast, beta_slow) = (node.param_f32(9), node.param_f32(10));
    let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
    let dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * freq_base.ln())
    };
    let corr0 = dim(beta_fast).floor().max(0.0);
    let corr1 = dim(beta_slow).ceil().min(n_dims as f32 - 1.0);
    (theta_scale, corr0, corr1)
}

pub(super) fn launch_rope(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (a, pos) = (node.src(0).unwrap(), node.src(1).unwrap());
    let ne = node.ne();
    let n_dims = node.param_i32(1);
    let freq_scale = node.param_f32(6);
    let (ext_factor, attn_factor) = (node.param_f32(7), node.param_f32(8));
    let (theta_scale, corr0, corr1) = rope_consts(node);
    let args = Args::default()
        .ptr(a.data())
        .ptr(pos.data())
        .opt_ptr(node.src(2))
        .ptr(node.data())
        .i64s(&ne[..3])
        .i64s(&a.nb()[1..])
        .i64s(&node.nb()[1..])
        .i32(n_dims)
        .i32((node.param_i32(2) == ROPE_NEOX) as i32)
        .i32(node.param_i32(15))
        .f32(theta_scale)
        .f32(freq_scale)
        .f32(ext_factor)
        .f32(attn_factor)
        .f32(corr0)
        .f32(corr1)
        .i32(match node.param_i32(2) {
            ROPE_MROPE => 1,
            ROPE_IMROPE => 2,
            _ => 0,
        })
        .i32(node.param_i32(11))
        .i32(node.param_i32(12))
        .i32(node.param_i32(13))
        .i32(node.param_i32(14));
    let kernel = if node.dtype() == GgmlType::F16 {
        "rope_f16"
    } else {
        "rope_f32"
    };
    lc.run(kernel, [node.nrows(), 1, 1], 64, args)
}
