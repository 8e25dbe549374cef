//! GPU ops: what the device claims (`supports`, which must match what the kernels compute
//! exactly and what ggml-cpu also computes) and how each node is launched (`launch`).

use super::api::{ApiResult, GpuApi, Stream};
use crate::ggml_types::{op, GgmlType};
use crate::tensor::Tensor;
use std::ffi::c_void;

/// Most blocks in grid dimensions y and z.
const MAX_GRID_YZ: usize = 65535;
/// Blocks of the element-wise kernels (they loop over the rest).
const MAX_FLAT_BLOCKS: usize = 1 << 16;
/// Below this many src1 columns MUL_MAT uses the matrix-vector kernel.
const MUL_MAT_VEC_MAX_COLS: usize = 8;

fn is_f32_or_f16(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16)
}

/// Whether the GPU device computes `node`.
pub fn supports(node: &Tensor) -> bool {
    if node.ty().is_none() {
        return false;
    }
    for i in 0..crate::ffi::abi::GGML_MAX_SRC {
        if let Some(s) = node.src(i) {
            if s.ty().is_none() {
                return false;
            }
        }
    }
    match node.op() {
        op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE => true,
        op::DUP | op::CPY | op::CONT => supports_cpy(node),
        op::ADD | op::SUB | op::MUL | op::DIV => supports_binary(node),
        op::SCALE => supports_scale(node),
        op::SOFT_MAX => supports_soft_max(node),
        op::RMS_NORM => supports_rms_norm(node),
        op::MUL_MAT => supports_mul_mat(node),
        _ => false,
    }
}

fn supports_cpy(node: &Tensor) -> bool {
    let Some(s) = node.src(0) else { return false };
    is_f32_or_f16(s.dtype()) && is_f32_or_f16(node.dtype()) && s.nelements() == node.nelements()
}

fn supports_binary(node: &Tensor) -> bool {
    let (Some(a), Some(b)) = (node.src(0), node.src(1)) else { return false };
    [a.dtype(), b.dtype(), node.dtype()].iter().all(|&t| t == GgmlType::F32)
        && a.same_shape(node)
        && a.can_repeat_from(&b)
        && a.has_dense_rows()
        && node.has_dense_rows()
}

fn supports_scale(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    a.dtype() == GgmlType::F32 && node.dtype() == GgmlType::F32 && a.same_shape(node) && a.is_contiguous() && node.is_contiguous()
}

fn supports_soft_max(node: &Tensor) -> bool {
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
        if mne[0] != nea[0] || mne[1] < nea[1] || mne[2] == 0 || mne[3] == 0 || nea[2] % mne[2] != 0 || nea[3] % mne[3] != 0 {
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

fn supports_rms_norm(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    a.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && a.same_shape(node)
        && a.has_dense_rows()
        && node.has_dense_rows()
        && node.param_f32(0) >= 0.0
        && node.nrows() <= i32::MAX as usize
}

fn supports_mul_mat(node: &Tensor) -> bool {
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else { return false };
    let (wne, xne, dne, dnb) = (w.ne(), x.ne(), node.ne(), node.nb());
    is_f32_or_f16(w.dtype())
        && x.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && wne[0] == xne[0]
        && dne[0] == wne[1]
        && dne[1] == xne[1]
        && dne[2] == xne[2]
        && dne[3] == xne[3]
        && wne[2] > 0
        && wne[3] > 0
        && xne[2] % wne[2] == 0
        && xne[3] % wne[3] == 0
        && w.has_dense_rows()
        && x.has_dense_rows()
        && dnb[0] == 4
        && dnb[0] <= dnb[1]
        && dnb[1] <= dnb[2]
        && dnb[2] <= dnb[3]
        && xne[2] * xne[3] <= MAX_GRID_YZ
        && wne[1] <= i32::MAX as usize
        && xne[1].div_ceil(64) <= MAX_GRID_YZ
}

/// What launching needs: the runtime, the device, its stream and kernels.
pub struct LaunchCtx<'a> {
    pub api: &'a dyn GpuApi,
    pub ord: usize,
    pub stream: Stream,
    pub kernels: &'a super::kernels::Kernels,
}

/// Kernel arguments, each in an 8-byte slot (the runtime reads as many bytes as the
/// parameter's size; little-endian, so 4-byte values sit at the slot's start).
#[derive(Default)]
struct Args(Vec<u64>);

impl Args {
    fn ptr(mut self, p: *const u8) -> Self {
        self.0.push(p as usize as u64);
        self
    }
    fn opt_ptr(self, t: Option<Tensor>) -> Self {
        self.ptr(t.map(|t| t.data() as *const u8).unwrap_or(std::ptr::null()))
    }
    fn i64(mut self, v: usize) -> Self {
        self.0.push(v as u64);
        self
    }
    fn i64s(mut self, v: &[usize]) -> Self {
        self.0.extend(v.iter().map(|&x| x as u64));
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.push(v as u32 as u64);
        self
    }
    fn f32(mut self, v: f32) -> Self {
        self.0.push(v.to_bits() as u64);
        self
    }
}

impl LaunchCtx<'_> {
    fn run(&self, kernel: &str, grid: [usize; 3], block: u32, args: Args) -> ApiResult<()> {
        let mut slots = args.0;
        let mut ptrs: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        let g = [grid[0] as u32, grid[1] as u32, grid[2] as u32];
        self.api.launch(self.ord, self.kernels.get(kernel), g, [block, 1, 1], 0, self.stream, &mut ptrs)
    }
}

fn flat_blocks(n: usize, block: usize) -> usize {
    n.div_ceil(block).clamp(1, MAX_FLAT_BLOCKS)
}

/// Queues the kernel(s) computing `node` (accepted by `supports`).
pub fn launch(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    match node.op() {
        op::DUP | op::CPY | op::CONT => launch_cpy(node, lc),
        op::ADD | op::SUB | op::MUL | op::DIV => launch_binary(node, lc),
        op::SCALE => launch_scale(node, lc),
        op::SOFT_MAX => launch_soft_max(node, lc),
        op::RMS_NORM => launch_rms_norm(node, lc),
        op::MUL_MAT => launch_mul_mat(node, lc),
        op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE => Ok(()),
        other => Err(format!("op {other} has no GPU kernel")),
    }
}

fn launch_cpy(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let s = node.src(0).unwrap();
    let kernel = match (s.dtype(), node.dtype()) {
        (GgmlType::F32, GgmlType::F32) => "cpy_f32_f32",
        (GgmlType::F32, GgmlType::F16) => "cpy_f32_f16",
        (GgmlType::F16, GgmlType::F32) => "cpy_f16_f32",
        _ => "cpy_f16_f16",
    };
    let (sne, dne, n) = (s.ne(), node.ne(), node.nelements());
    let args = Args::default()
        .ptr(s.data())
        .ptr(node.data())
        .i64s(&sne[..3])
        .i64s(&s.nb())
        .i64s(&dne[..3])
        .i64s(&node.nb())
        .i64(n);
    lc.run(kernel, [flat_blocks(n, 256), 1, 1], 256, args)
}

fn launch_binary(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (a, b) = (node.src(0).unwrap(), node.src(1).unwrap());
    let code = match node.op() {
        op::ADD => 0,
        op::SUB => 1,
        op::MUL => 2,
        _ => 3,
    };
    let args = Args::default()
        .i32(code)
        .ptr(a.data())
        .ptr(b.data())
        .ptr(node.data())
        .i64s(&node.ne())
        .i64s(&b.ne())
        .i64s(&a.nb())
        .i64s(&b.nb())
        .i64s(&node.nb());
    lc.run("binary_f32", [flat_blocks(node.nelements(), 256), 1, 1], 256, args)
}

fn launch_scale(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let n = node.nelements();
    let args = Args::default().ptr(a.data()).ptr(node.data()).i64(n).f32(node.param_f32(0)).f32(node.param_f32(1));
    lc.run("scale_f32", [flat_blocks(n, 256), 1, 1], 256, args)
}

/// Threads for a one-block-per-row kernel: 256, or fewer (a multiple of 64, so of any
/// warp size) for short rows.
fn row_block(ne0: usize) -> u32 {
    (ne0.div_ceil(64) * 64).clamp(64, 256) as u32
}

fn launch_soft_max(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let (mask, sinks) = (node.src(1), node.src(2));
    let (ne, nba, nbd) = (node.ne(), a.nb(), node.nb());
    let (scale, max_bias) = (node.param_f32(0), node.param_f32(1));
    // ALiBi constants as ggml defines them (n_head = ne[2]).
    let n_head = ne[2] as u32;
    let n_head_log2 = if n_head == 0 { 0 } else { 1u32 << (31 - n_head.leading_zeros()) };
    let (m0, m1) = if n_head_log2 > 0 {
        (2f32.powf(-max_bias / n_head_log2 as f32), 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32))
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

fn launch_rms_norm(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let a = node.src(0).unwrap();
    let ne = node.ne();
    let args = Args::default()
        .ptr(a.data())
        .ptr(node.data())
        .i64s(&ne[..3])
        .i64s(&a.nb()[1..])
        .i64s(&node.nb()[1..])
        .f32(node.param_f32(0));
    lc.run("rms_norm_f32", [node.nrows(), 1, 1], row_block(ne[0]), args)
}

fn launch_mul_mat(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (wne, xne) = (w.ne(), x.ne());
    let (wnb, xnb, dnb) = (w.nb(), x.nb(), node.nb());
    let (k, m, n) = (wne[0], wne[1], xne[1]);
    let batches = xne[2] * xne[3];
    let f16 = w.dtype() == GgmlType::F16;
    let args = Args::default()
        .ptr(w.data())
        .ptr(x.data())
        .ptr(node.data())
        .i64(k)
        .i64(m)
        .i64(n)
        .i64(xne[2])
        .i64(xne[2] / wne[2])
        .i64(xne[3] / wne[3])
        .i64s(&wnb[1..])
        .i64s(&xnb[1..])
        .i64s(&dnb[1..]);
    if n < MUL_MAT_VEC_MAX_COLS {
        let kernel = if f16 { "mul_mat_vec_f16" } else { "mul_mat_vec_f32" };
        lc.run(kernel, [m, n.div_ceil(4), batches], 256, args)
    } else {
        let kernel = if f16 { "mul_mat_tiled_f16" } else { "mul_mat_tiled_f32" };
        lc.run(kernel, [m.div_ceil(64), n.div_ceil(64), batches], 256, args)
    }
}

