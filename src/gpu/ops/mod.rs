//! GPU ops: what the device claims (`supports`, which must match what the kernels compute
//! exactly and what ggml-cpu also computes) and how each node is launched (`launch`,
//! `launch_at`), each a plain `match` on the op, one file per op family like `src/cpu/ops/`
//! and `kernels/`: matmul (MUL_MAT, MUL_MAT_ID), attention (FLASH_ATTN_EXT), rows (GET_ROWS,
//! SET_ROWS, CPY), norm, rope, elementwise (binary, scale, soft_max, unary, glu, add_id),
//! reduce, layout; fused (runs of nodes one kernel computes), widen (products with F16 / BF16
//! activations), scratch (the layout of the device scratch), args (kernel argument packing).

mod args;
mod attention;
mod elementwise;
mod fused;
mod fused_qkv;
mod layout;
mod matmul;
mod norm;
mod reduce;
mod rope;
mod rows;
mod scratch;
mod widen;

use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::{ApiResult, GpuApi, Stream};
use crate::tensor::Tensor;
use args::Args;
use attention::{launch_flash_attn, supports_flash_attn};
use elementwise::{
    launch_add_id, launch_binary, launch_glu, launch_scale, launch_soft_max, launch_unary,
    supports_add_id, supports_binary, supports_glu, supports_scale, supports_soft_max,
    supports_unary,
};
use fused::{
    try_fused_glu, try_fused_hadamard_mv, try_fused_mv_add_norm, try_fused_mv_pair, try_fused_norm,
};
use fused_qkv::{try_fused_qkv, try_fused_rope_kv};
use layout::{launch_layout, supports_layout};
use matmul::{launch_mul_mat, launch_mul_mat_id, supports_mul_mat, supports_mul_mat_id};
use norm::{launch_norm, launch_rms_norm, supports_rms_norm};
use reduce::{launch_reduce, supports_reduce};
use rope::{launch_rope, supports_rope};
use rows::{
    launch_cpy, launch_get_rows, launch_set_rows, supports_cpy, supports_get_rows,
    supports_set_rows,
};
use scratch::Q8Src;
use std::ffi::c_void;

pub use attention::FA_COUNTERS;
pub use fused::Uses;
pub use reduce::{launch_allreduce_small, launch_allreduce_sum, SmallAllreduce, ALLREDUCE_MAX};
pub use scratch::scratch_bytes;

/// Most blocks in grid dimensions y and z.
const MAX_GRID_YZ: usize = 65535;

/// Blocks of the element-wise kernels (they loop over the rest).
const MAX_FLAT_BLOCKS: usize = 1 << 16;

fn is_f32_or_f16(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16)
}

/// Whether the GPU device computes `node`.
pub fn supports(node: &Tensor) -> bool {
    if !node.types_known() {
        return false;
    }
    match node.op() {
        op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE => true,
        op::DUP | op::CPY | op::CONT => supports_cpy(node),
        op::ADD | op::SUB | op::MUL | op::DIV => supports_binary(node),
        op::SCALE => supports_scale(node),
        op::SOFT_MAX => supports_soft_max(node),
        op::RMS_NORM => supports_rms_norm(node),
        op::MUL_MAT => supports_mul_mat(node),
        op::GET_ROWS => supports_get_rows(node),
        op::SET_ROWS => supports_set_rows(node),
        op::ROPE => supports_rope(node),
        op::UNARY => supports_unary(node),
        op::GLU => supports_glu(node),
        op::FLASH_ATTN_EXT => supports_flash_attn(node),
        op::MUL_MAT_ID => supports_mul_mat_id(node),
        op::ADD_ID => supports_add_id(node),
        op::NORM | op::L2_NORM => supports_rms_norm(node),
        op::SQR | op::SQRT | op::LOG | op::SIN | op::COS | op::CLAMP | op::LEAKY_RELU => {
            supports_unary(node)
        }
        op::SUM | op::SUM_ROWS | op::MEAN | op::CUMSUM | op::ARGSORT | op::TOP_K => {
            supports_reduce(node)
        }
        op::CONCAT | op::REPEAT | op::PAD | op::FILL | op::ARANGE | op::DIAG_MASK_INF => {
            supports_layout(node)
        }
        _ => false,
    }
}

fn is_float(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Type code of the kernels' typed loads/stores: 0 F32, 1 F16, 2 BF16.
fn float_code(t: GgmlType) -> i32 {
    match t {
        GgmlType::F16 => 1,
        GgmlType::BF16 => 2,
        _ => 0,
    }
}

/// Destination code of quantize.hip (BF16 or a quantized KV-cache type) and its unit size.
fn quant_dst(t: GgmlType) -> Option<(i32, usize)> {
    match t {
        GgmlType::BF16 => Some((2, 1)),
        GgmlType::Q8_0 => Some((3, 32)),
        GgmlType::Q4_0 => Some((4, 32)),
        _ => None,
    }
}

/// What launching needs: the runtime, the device, its stream and kernels.
pub struct LaunchCtx<'a> {
    pub api: &'a dyn GpuApi,
    pub ord: usize,
    pub stream: Stream,
    pub kernels: &'a super::kernels::Kernels,
    /// Threads of a warp / wavefront on this device.
    pub warp_size: u32,
    /// Multiprocessors / compute units (0 where the runtime does not say).
    pub compute_units: u32,
    /// Device scratch of at least `scratch_bytes` of every node of the graph.
    pub scratch: super::api::DevPtr,
    /// FA_COUNTERS zeroed u32 for the split-KV attention kernel's one-launch merge (0: none).
    pub fa_counters: super::api::DevPtr,
    /// What the scratch holds from an earlier node of this graph (see `Q8Src`).
    pub q8: std::cell::Cell<Option<Q8Src>>,
    /// What it holds once the node being launched has run, where that node's kernel
    /// quantized its own output (flash attention); `launch` moves it into `q8`.
    pub q8_next: std::cell::Cell<Option<Q8Src>>,
    /// Whether runs of nodes may be fused (`launch_at`); ROCMFORGE_GPU_FUSE=0 turns it off.
    pub fuse: bool,
    /// Bytes of the scratch.
    pub scratch_len: usize,
    /// Whether the device has the tensor-core instructions of flash_attn_mma.hip (NVIDIA sm_80+:
    /// mma.sync m16n8k16, ldmatrix, cp.async).
    pub mma: bool,
    /// A dry run: kernel names are collected here instead of launched (and nothing else is
    /// queued), so the groups a graph needs can be compiled ahead, together.
    pub wants: Option<&'a std::cell::RefCell<Vec<String>>>,
}

impl LaunchCtx<'_> {
    /// A dry run (`wants`): nothing may be queued.
    pub fn dry(&self) -> bool {
        self.wants.is_some()
    }
}

/// Whether a device of this compiler target runs flash_attn_mma.hip's tensor-core kernels.
pub fn arch_has_mma(arch: &str) -> bool {
    arch.strip_prefix("sm_")
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|v| v >= 80)
}

/// Holds the stream for `cycles` GPU clock ticks (the profiler queues a graph behind it).
pub fn launch_spin(lc: &LaunchCtx, cycles: usize) -> ApiResult<()> {
    lc.run("rf_spin", [1, 1, 1], 1, Args::default().i64(cycles))
}

/// ROCMFORGE_GPU_SKIP=prefix[,prefix...] (measuring only: results are wrong): launches of
/// kernels whose names start so are left out, so that a token's time without them shows what
/// they cost inside the replayed graph, where events around a launch would change the timing.
fn skipped(kernel: &str) -> bool {
    let skip = &crate::tuning::get().gpu_skip;
    !skip.is_empty() && skip.iter().any(|p| kernel.starts_with(p.as_str()))
}

impl LaunchCtx<'_> {
    fn run(&self, kernel: &str, grid: [usize; 3], block: u32, args: Args) -> ApiResult<()> {
        if skipped(kernel) {
            return Ok(());
        }
        if let Some(w) = self.wants {
            w.borrow_mut().push(kernel.to_string());
            return Ok(());
        }
        let mut slots = args.0;
        let mut ptrs: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        let g = [grid[0] as u32, grid[1] as u32, grid[2] as u32];
        self.api.launch(
            self.ord,
            self.kernels.get(kernel)?,
            g,
            [block, 1, 1],
            0,
            self.stream,
            &mut ptrs,
        )
    }
}

fn flat_blocks(n: usize, block: usize) -> usize {
    n.div_ceil(block).clamp(1, MAX_FLAT_BLOCKS)
}

/// Queues the kernel(s) computing `node` (accepted by `supports`).
pub fn launch(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let r = launch_one(node, lc);
    lc.note_written(node);
    if let Some(q) = lc.q8_next.take().filter(|_| r.is_ok()) {
        lc.q8.set(Some(q));
    }
    r
}

fn launch_one(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    match node.op() {
        op::DUP | op::CPY | op::CONT => launch_cpy(node, lc),
        op::ADD | op::SUB | op::MUL | op::DIV => launch_binary(node, lc),
        op::SCALE => launch_scale(node, lc),
        op::SOFT_MAX => launch_soft_max(node, lc),
        op::RMS_NORM => launch_rms_norm(node, lc),
        op::MUL_MAT => launch_mul_mat(node, lc),
        op::GET_ROWS => launch_get_rows(node, lc),
        op::SET_ROWS => launch_set_rows(node, lc),
        op::ROPE => launch_rope(node, lc),
        op::UNARY => launch_unary(node, lc),
        op::GLU => launch_glu(node, lc),
        op::FLASH_ATTN_EXT => launch_flash_attn(node, lc),
        op::MUL_MAT_ID => launch_mul_mat_id(node, lc),
        op::ADD_ID => launch_add_id(node, lc),
        op::NORM | op::L2_NORM => launch_norm(node, lc),
        op::SQR | op::SQRT | op::LOG | op::SIN | op::COS | op::CLAMP | op::LEAKY_RELU => {
            launch_unary(node, lc)
        }
        op::SUM | op::SUM_ROWS | op::MEAN | op::CUMSUM | op::ARGSORT | op::TOP_K => {
            launch_reduce(node, lc)
        }
        op::CONCAT | op::REPEAT | op::PAD | op::FILL | op::ARANGE | op::DIAG_MASK_INF => {
            launch_layout(node, lc)
        }
        op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE => Ok(()),
        other => Err(format!("op {other} has no GPU kernel")),
    }
}

/// Threads for a one-block-per-row kernel: 256, or fewer (a multiple of 64, so of any
/// warp size) for short rows.
fn row_block(ne0: usize) -> u32 {
    (ne0.div_ceil(64) * 64).clamp(64, 256) as u32
}

/// Queues node `i` of `nodes`, fused with the nodes after it where that pays; returns how
/// many nodes were computed.
pub fn launch_at(nodes: &[Tensor], i: usize, uses: &Uses, lc: &LaunchCtx) -> ApiResult<usize> {
    if lc.fuse {
        if let Some(n) = try_fused_mv_add_norm(nodes, i, uses, lc)? {
            return Ok(n);
        }
        if let Some(n) = try_fused_norm(nodes, i, uses, lc)? {
            return Ok(n);
        }
        if let Some(n) = try_fused_glu(nodes, i, uses, lc, false)? {
            return Ok(n);
        }
        if let Some(n) = try_fused_rope_kv(nodes, i, None, uses, lc)? {
            return Ok(n);
        }
        if let Some(n) = try_fused_qkv(nodes, i, uses, lc, false)? {
            return Ok(n);
        }
        if let Some(n) = try_fused_mv_pair(nodes, i, lc)? {
            return Ok(n);
        }
        if let Some(n) = try_fused_hadamard_mv(nodes, i, lc)? {
            return Ok(n);
        }
    }
    launch(&nodes[i], lc)?;
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensor-core prompt kernel is taken on NVIDIA sm_80 and later only.
    #[test]
    fn mma_needs_sm80() {
        for (arch, want) in [
            ("sm_90", true),
            ("sm_80", true),
            ("sm_120", true),
            ("sm_75", false),
            ("sm_61", false),
            ("gfx90a:sramecc+:xnack-", false),
            ("gfx1030", false),
        ] {
            assert_eq!(arch_has_mma(arch), want, "{arch}");
        }
    }
}
