//! GET_ROWS, SET_ROWS (rows.hip, get_set_rows.hip) and DUP / CPY / CONT (cpy.hip, quantize.hip).

use super::args::Args;
use super::{flat_blocks, is_f32_or_f16, is_float, quant_dst, row_block, LaunchCtx};
use crate::ggml_types::GgmlType;
use crate::gpu::api::ApiResult;
use crate::gpu::kernels::weight_suffix;
use crate::tensor::Tensor;

pub(super) fn supports_cpy(node: &Tensor) -> bool {
    let Some(s) = node.src(0) else { return false };
    if s.nelements() != node.nelements() {
        return false;
    }
    if is_float(s.dtype()) && is_float(node.dtype()) {
        return true;
    }
    // F32 into Q8_0/Q4_0 rows of the same length (whole blocks).
    matches!(node.dtype(), GgmlType::Q8_0 | GgmlType::Q4_0)
        && s.dtype() == GgmlType::F32
        && s.ne()[0] == node.ne()[0]
        && node.ne()[0].is_multiple_of(32)
        && s.has_dense_rows()
        && node.has_dense_rows()
}

pub(super) fn launch_cpy(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let s = node.src(0).unwrap();
    if !is_float(node.dtype()) {
        // F32 rows into quantized rows.
        let (dt, unit) = quant_dst(node.dtype()).unwrap_or((3, 32));
        let (sne, dne, snb, dnb) = (s.ne(), node.ne(), s.nb(), node.nb());
        let units = dne[0] / unit;
        let n = units * node.nrows();
        let args = Args::default()
            .ptr(s.data())
            .ptr(node.data())
            .i32(0)
            .i32(dt)
            .i64(units)
            .i64(n)
            .i64(sne[1])
            .i64(sne[2])
            .i64s(&snb[1..])
            .i64(dne[1])
            .i64(dne[2])
            .i64s(&dnb[1..]);
        if n == 0 {
            return Ok(());
        }
        return lc.run("cpy_rows_q", [flat_blocks(n, 128), 1, 1], 128, args);
    }
    let name = |t: GgmlType| match t {
        GgmlType::F16 => "f16",
        GgmlType::BF16 => "bf16",
        _ => "f32",
    };
    let kernel = format!("cpy_{}_{}", name(s.dtype()), name(node.dtype()));
    let (sne, dne, n) = (s.ne(), node.ne(), node.nelements());
    let args = Args::default()
        .ptr(s.data())
        .ptr(node.data())
        .i64s(&sne[..3])
        .i64s(&s.nb())
        .i64s(&dne[..3])
        .i64s(&node.nb())
        .i64(n);
    lc.run(&kernel, [flat_blocks(n, 256), 1, 1], 256, args)
}

pub(super) fn supports_get_rows(node: &Tensor) -> bool {
    let (Some(a), Some(idx)) = (node.src(0), node.src(1)) else {
        return false;
    };
    weight_suffix(a.dtype()).is_some()
        && a.ne()[0] % a.dtype().block_size() == 0
        && node.dtype() == GgmlType::F32
        && crate::op_shapes::get_rows_layout_ok(node)
        && idx.nelements() <= i32::MAX as usize
}

pub(super) fn launch_get_rows(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (a, idx) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (ane, ine) = (a.ne(), idx.ne());
    let args = Args::default()
        .ptr(a.data())
        .ptr(idx.data())
        .ptr(node.data())
        .i64(ane[0])
        .i64(ane[1])
        .i64(ine[0])
        .i64(ine[1])
        .i64s(&a.nb()[1..])
        .i64s(&idx.nb()[..3])
        .i64s(&node.nb()[1..]);
    let kernel = format!("get_rows_{}", weight_suffix(a.dtype()).unwrap_or("f32"));
    lc.run(&kernel, [idx.nelements(), 1, 1], row_block(ane[0]), args)
}

pub(super) fn supports_set_rows(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    is_f32_or_f16(a.dtype())
        && (is_f32_or_f16(node.dtype()) || quant_dst(node.dtype()).is_some())
        && node.ne()[0].is_multiple_of(node.dtype().block_size())
        && crate::op_shapes::set_rows_layout_ok(node)
        && a.nrows() <= i32::MAX as usize
}

pub(super) fn launch_set_rows(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (a, idx) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (ane, ine) = (a.ne(), idx.ne());
    if let Some((dt, unit)) = quant_dst(node.dtype()) {
        let units = ane[0] / unit;
        let n = units * a.nrows();
        let args = Args::default()
            .ptr(a.data())
            .ptr(idx.data())
            .ptr(node.data())
            .i32((a.dtype() == GgmlType::F16) as i32)
            .i32(dt)
            .i32((idx.dtype() == GgmlType::I64) as i32)
            .i64(units)
            .i64(ane[1])
            .i64(ane[2])
            .i64(ine[1])
            .i64(ine[2])
            .i64(node.ne()[1])
            .i64(n)
            .i64s(&a.nb()[1..])
            .i64s(&idx.nb()[..3])
            .i64s(&node.nb()[1..]);
        if n == 0 {
            return Ok(());
        }
        return lc.run("set_rows_q", [flat_blocks(n, 128), 1, 1], 128, args);
    }
    let args = Args::default()
        .ptr(a.data())
        .ptr(idx.data())
        .ptr(node.data())
        .i32((a.dtype() == GgmlType::F16) as i32)
        .i32((node.dtype() == GgmlType::F16) as i32)
        .i32((idx.dtype() == GgmlType::I64) as i32)
        .i64(ane[0])
        .i64(ane[1])
        .i64(ane[2])
        .i64(ine[1])
        .i64(ine[2])
        .i64(node.ne()[1])
        .i64s(&a.nb()[1..])
        .i64s(&idx.nb()[..3])
        .i64s(&node.nb()[1..]);
    if a.nrows() == 0 {
        return Ok(());
    }
    if ane[0] < lc.warp_size as usize {
        let n = ane[0] * a.nrows();
        return lc.run(
            "set_rows_short",
            [flat_blocks(n, 256), 1, 1],
            256,
            args.i64(n),
        );
    }
    lc.run("set_rows", [a.nrows(), 1, 1], row_block(ane[0]), args)
}
