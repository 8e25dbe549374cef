//! Layout ops: CONCAT, REPEAT, PAD, FILL, ARANGE, DIAG_MASK_INF (layout.hip).

use super::args::Args;
use super::{flat_blocks, LaunchCtx};
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::ApiResult;
use crate::tensor::Tensor;

pub(super) fn supports_layout(node: &Tensor) -> bool {
    // The kernel of ARANGE writes one dense row.
    crate::op_shapes::layout_op_ok(node) && (node.op() != op::ARANGE || node.is_contiguous())
}

pub(super) fn launch_layout(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (ne, nb) = (node.ne(), node.nb());
    let n = node.nelements();
    if n == 0 {
        return Ok(());
    }
    let grid = [flat_blocks(n, 256), 1, 1];
    let size = node.dtype().type_size() as i32;
    match node.op() {
        op::CONCAT => {
            let (a, b) = (node.src(0).unwrap(), node.src(1).unwrap());
            let args = Args::default()
                .ptr(a.data())
                .ptr(b.data())
                .ptr(node.data())
                .i32(size)
                .i32(node.param_i32(0))
                .i64s(&ne[..3])
                .i64(n)
                .i64s(&a.ne())
                .i64s(&a.nb())
                .i64s(&b.nb())
                .i64s(&nb);
            lc.run("concat", grid, 256, args)
        }
        op::REPEAT => {
            let a = node.src(0).unwrap();
            let args = Args::default()
                .ptr(a.data())
                .ptr(node.data())
                .i32(size)
                .i64s(&ne[..3])
                .i64(n)
                .i64s(&a.ne())
                .i64s(&a.nb())
                .i64s(&nb);
            lc.run("repeat", grid, 256, args)
        }
        op::PAD => {
            let a = node.src(0).unwrap();
            let lp: Vec<usize> = (0..4).map(|i| node.param_i32(2 * i) as usize).collect();
            let args = Args::default()
                .ptr(a.data())
                .ptr(node.data())
                .i64s(&ne[..3])
                .i64(n)
                .i64s(&a.ne())
                .i64s(&lp)
                .i64s(&a.nb())
                .i64s(&nb);
            lc.run("pad_f32", grid, 256, args)
        }
        op::FILL => {
            let args = Args::default()
                .ptr(node.data())
                .i32((node.dtype() == GgmlType::F16) as i32)
                .f32(node.param_f32(0))
                .i64s(&ne[..3])
                .i64(n)
                .i64s(&nb);
            lc.run("fill", grid, 256, args)
        }
        op::ARANGE => {
            let args = Args::default()
                .ptr(node.data())
                .f32(node.param_f32(0))
                .f32(node.param_f32(2))
                .i64(n);
            lc.run("arange_f32", grid, 256, args)
        }
        _ => {
            // DIAG_MASK_INF
            let a = node.src(0).unwrap();
            let args = Args::default()
                .ptr(a.data())
                .ptr(node.data())
                .i64(ne[0])
                .i64(ne[1])
                .i64(n)
                .i32(node.param_i32(0));
            lc.run("diag_mask_inf_f32", grid, 256, args)
        }
    }
}
