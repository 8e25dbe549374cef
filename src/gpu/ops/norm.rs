//! RMS_NORM, NORM, L2_NORM (norm.hip).

use super::args::Args;
use super::{row_block, LaunchCtx};
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::ApiResult;
use crate::tensor::Tensor;

pub(super) fn supports_rms_norm(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    a.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && a.same_shape(node)
        && a.has_dense_rows()
        && node.has_dense_rows()
        && node.param_f32(0) >= 0.0
        && node.nrows() <= i32::MAX as usize
}

/// Threads of an RMS_NORM block (one row each): about four values per thread, up to 1024.
/// A row of a generation step is the whole grid, so its latency is the kernel's: 4096 values
/// on 256 threads took 20 µs on an H100, on 1024 threads a fraction of that. The plain and
/// the fused kernel take the same count, so they add in the same order.
pub(super) fn norm_block(ne0: usize) -> u32 {
    (ne0.div_ceil(4).div_ceil(64) * 64).clamp(64, 1024) as u32
}

pub(super) fn launch_rms_norm(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let ne = node.ne();
    let args = Args::default()
        .ptr(a.data())
        .ptr(node.data())
        .i64s(&ne[..3])
        .i64s(&a.nb()[1..])
        .i64s(&node.nb()[1..])
        .f32(node.param_f32(0));
    lc.run(
        "rms_norm_f32",
        [node.nrows(), 1, 1],
        norm_block(ne[0]),
        args,
    )
}

pub(super) fn launch_norm(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let ne = node.ne();
    let args = Args::default()
        .i32((node.op() == op::L2_NORM) as i32)
        .ptr(a.data())
        .ptr(node.data())
        .i64s(&ne[..3])
        .i64s(&a.nb()[1..])
        .i64s(&node.nb()[1..])
        .f32(node.param_f32(0));
    if node.nrows() == 0 {
        return Ok(());
    }
    lc.run("norm_f32", [node.nrows(), 1, 1], row_block(ne[0]), args)
}
