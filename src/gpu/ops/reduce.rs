//! Reductions: SUM, SUM_ROWS, MEAN, CUMSUM, ARGSORT, TOP_K (reduce.hip).

use super::args::Args;
use super::{flat_blocks, row_block, LaunchCtx};
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::ApiResult;
use crate::gpu::api::DevPtr;
use crate::tensor::Tensor;

pub(super) fn supports_reduce(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    let (ane, dne) = (a.ne(), node.ne());
    if a.dtype() != GgmlType::F32 || !a.has_dense_rows() || a.nrows() > i32::MAX as usize {
        return false;
    }
    match node.op() {
        op::SUM => node.dtype() == GgmlType::F32 && node.nelements() == 1,
        op::SUM_ROWS | op::MEAN => {
            node.dtype() == GgmlType::F32
                && dne == [1, ane[1], ane[2], ane[3]]
                && node.has_dense_rows()
        }
        op::CUMSUM => node.dtype() == GgmlType::F32 && dne == ane && node.has_dense_rows(),
        op::ARGSORT => {
            node.dtype() == GgmlType::I32
                && dne == ane
                && matches!(node.param_i32(0), 0 | 1)
                && ane[0] <= SORT_MAX
                && a.is_contiguous_from(1)
                && node.is_contiguous_from(1)
        }
        op::TOP_K => {
            node.dtype() == GgmlType::I32
                && dne[0] <= ane[0]
                && dne[1..] == ane[1..]
                && ane[0] <= SORT_MAX
                && a.is_contiguous_from(1)
                && node.is_contiguous_from(1)
        }
        _ => false,
    }
}

/// Longest row ARGSORT / TOP_K sort (SORT_MAX in kernels/reduce.hip).
pub(super) const SORT_MAX: usize = 4096;

pub(super) fn launch_reduce(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let (ane, anb, dnb) = (a.ne(), a.nb(), node.nb());
    let rows = a.nrows();
    if rows == 0 && node.op() != op::SUM {
        return Ok(());
    }
    match node.op() {
        op::SUM => {
            let args = Args::default()
                .ptr(a.data())
                .ptr(node.data())
                .i64s(&ane[..3])
                .i64(rows)
                .i64s(&anb[1..]);
            lc.run("sum_f32", [1, 1, 1], 1024, args)
        }
        op::SUM_ROWS | op::MEAN => {
            let args = Args::default()
                .ptr(a.data())
                .ptr(node.data())
                .i32((node.op() == op::MEAN) as i32)
                .i64s(&ane[..3])
                .i64s(&anb[1..])
                .i64s(&dnb[1..]);
            lc.run("sum_rows_f32", [rows, 1, 1], row_block(ane[0]), args)
        }
        op::CUMSUM => {
            let args = Args::default()
                .ptr(a.data())
                .ptr(node.data())
                .i64s(&ane[..3])
                .i64s(&anb[1..])
                .i64s(&dnb[1..]);
            lc.run("cumsum_f32", [rows, 1, 1], lc.warp_size, args)
        }
        _ => {
            // ARGSORT (all ids, param 0: 1 = descending) or TOP_K (first k of the descending order).
            let top_k = node.op() == op::TOP_K;
            let desc = if top_k { 1 } else { node.param_i32(0) };
            let args = Args::default()
                .ptr(a.data())
                .ptr(node.data())
                .i32(desc)
                .i64(ane[0])
                .i64(node.ne()[0])
                .i64(ane[0].next_power_of_two())
                .i64(ane[1])
                .i64(ane[2])
                .i64s(&anb[1..])
                .i64s(&dnb[1..]);
            lc.run("argsort_f32", [rows, 1, 1], 256, args)
        }
    }
}

/// Most GPUs one AllReduce sums over (the kernel's source pointers).
pub const ALLREDUCE_MAX: usize = 8;

/// Queues `dst[i] = srcs[0][i] + srcs[1][i] + ...` for `n` F32 values (`srcs`: 1 to
/// ALLREDUCE_MAX device addresses this device can read).
pub fn launch_allreduce_sum(
    lc: &LaunchCtx,
    dst: DevPtr,
    srcs: &[DevPtr],
    n: usize,
) -> ApiResult<()> {
    assert!((1..=ALLREDUCE_MAX).contains(&srcs.len()));
    let mut args = Args::default().ptr(dst as usize as *const u8);
    for k in 0..ALLREDUCE_MAX {
        let p = srcs.get(k).copied().unwrap_or(0);
        args = args.ptr(p as usize as *const u8);
    }
    let args = args.i32(srcs.len() as i32).i64(n);
    lc.run("allreduce_sum_f32", [flat_blocks(n, 256), 1, 1], 256, args)
}

/// Where one GPU's small AllReduce (`allreduce_small_f32`) writes and reads; index k is GPU k.
pub struct SmallAllreduce<'a> {
    /// GPU k's receive slot for this GPU, and GPU k's flag for this GPU (0 for this GPU).
    pub out: &'a [DevPtr],
    pub out_flag: &'a [DevPtr],
    /// The local receive slot GPU k writes (0 for this GPU), and the local flags.
    pub inp: &'a [DevPtr],
    pub flags: DevPtr,
    pub me: usize,
    pub seq: u32,
    /// This GPU's part was not computed: it counts as 0.
    pub zero_me: bool,
}

/// Queues one GPU's part of a small AllReduce of the `n` F32 values at `t` (in place).
pub fn launch_allreduce_small(
    lc: &LaunchCtx,
    t: DevPtr,
    n: usize,
    s: &SmallAllreduce,
) -> ApiResult<()> {
    let gpus = s.out.len();
    assert!((2..=ALLREDUCE_MAX).contains(&gpus) && s.out_flag.len() == gpus && s.inp.len() == gpus);
    let at = |v: &[DevPtr], k: usize| v.get(k).copied().unwrap_or(0) as usize as *const u8;
    let mut args = Args::default().ptr(t as usize as *const u8);
    for list in [s.out, s.out_flag, s.inp] {
        for k in 0..ALLREDUCE_MAX {
            args = args.ptr(at(list, k));
        }
    }
    let args = args
        .ptr(s.flags as usize as *const u8)
        .i32(gpus as i32)
        .i32(s.me as i32)
        .i32(s.seq as i32)
        .i32(s.zero_me as i32)
        .i64(n);
    lc.run("allreduce_small_f32", [1, 1, 1], 1024, args)
}
