//! GPU ops: what the device claims (`supports`, which must match what the kernels compute
//! exactly and what ggml-cpu also computes) and how each node is launched (`launch`).

use super::api::{ApiResult, GpuApi, Stream};
use super::kernels::weight_suffix;
use crate::ggml_types::{glu, op, unary, GgmlType};
use crate::op_shapes::{hadamard_len, hadamard_scale};
use crate::tensor::Tensor;
use std::ffi::c_void;

/// Most blocks in grid dimensions y and z.
const MAX_GRID_YZ: usize = 65535;
/// Blocks of the element-wise kernels (they loop over the rest).
const MAX_FLAT_BLOCKS: usize = 1 << 16;
/// Rows (one warp each) per block of the matrix-vector kernels (MV_ROWS in mul_mat.hip,
/// MVQ_ROWS in mmvq.hip).
const MV_ROWS: usize = 4;
/// src1 columns per block of the matrix-vector kernels (MV_COLS, MVQ_COLS).
const MV_COLS: usize = 4;
/// Warps per block and rows per block of the one-column matrix-vector kernels
/// (MV1_ROWS_DEF, MV1_UNROLL_DEF in mmvq.hip: mul_mat_vec_q1, mul_mat_id_q; the warps are the launcher's choice).
const MV1_WARPS: usize = 4;
const MV1_ROWS: usize = 2;
const MV1_UNROLL: usize = 4;
/// Rows per one-warp block of the short-row kernel mul_mat_vec_q1s_* (MV1S_ROWS in mmvq.hip).
const MV1S_ROWS: usize = 8;
/// Most threads per block of the one-column kernels (their __launch_bounds__).
const MV1_MAX_THREADS: usize = 256;

/// (rows, unroll, warps) of the one-column kernel that ROCMFORGE_GPU_MV1=rows,unroll,warps
/// asks for, if it names a measuring variant (super::kernels::MV1X_SHAPES; Q4_0 weights only, others keep
/// MV1_ROWS / MV1_UNROLL with those warps).
fn mv1_shape() -> Option<(usize, usize, usize)> {
    static V: once_cell::sync::OnceCell<Option<(usize, usize, usize)>> =
        once_cell::sync::OnceCell::new();
    *V.get_or_init(|| {
        let v = std::env::var("ROCMFORGE_GPU_MV1").ok()?;
        let p: Vec<usize> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        match p[..] {
            [r, u, w]
                if (1..=8).contains(&w)
                    && ((r, u) == (MV1_ROWS, MV1_UNROLL)
                        || super::kernels::MV1X_SHAPES.contains(&(r, u))) =>
            {
                Some((r, u, w))
            }
            _ => None,
        }
    })
}
/// A measuring override: the variable's value if it is a number in 1..=max.
fn env_count(name: &str, max: usize) -> Option<usize> {
    std::env::var(name)
        .ok()?
        .parse()
        .ok()
        .filter(|n| (1..=max).contains(n))
}

/// ROCMFORGE_GPU_MV1_WARPS=N (1..8): warps per block of the one-column kernel's default shape
/// (the fused kernels unchanged), for measuring.
fn mv1_warps() -> Option<usize> {
    static V: once_cell::sync::OnceCell<Option<usize>> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| env_count("ROCMFORGE_GPU_MV1_WARPS", 8))
}
/// Whether a one-column product takes the 8-rows-per-warp kernel (mul_mat_vec_q1s_*): rows of
/// at most 32 blocks of 32 (most lanes of a wider block would be idle) in a matrix tall enough
/// to fill the GPU with such blocks. On an H100: SmolLM2's 49152 x 576 Q8_0 output projection
/// 75 µs with 2 rows per 4-warp block (0.4 TB/s), 17.5 µs this way; its 576 x 576 products
/// 5.6 µs the default way, 9.0 µs this way (72 one-warp blocks). ROCMFORGE_GPU_MV1 turns it off.
fn short_tall(wt: GgmlType, k: usize, m: usize) -> bool {
    let whole_blocks = matches!(
        wt,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
    );
    whole_blocks && k <= 32 * 32 && m >= 8192 && mv1_shape().is_none()
}
/// Below this many src1 columns MUL_MAT uses the matrix-vector kernel.
const MUL_MAT_VEC_MAX_COLS: usize = 8;

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

fn supports_cpy(node: &Tensor) -> bool {
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
        && node.ne()[0] % 32 == 0
        && s.has_dense_rows()
        && node.has_dense_rows()
}

fn supports_binary(node: &Tensor) -> bool {
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

fn supports_scale(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    a.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && a.same_shape(node)
        && a.is_contiguous()
        && node.is_contiguous()
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

fn supports_mul_mat_id(node: &Tensor) -> bool {
    let (Some(w), Some(x), Some(ids)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let (wne, xne, ine, dne) = (w.ne(), x.ne(), ids.ne(), node.ne());
    weight_suffix(w.dtype()).is_some()
        && x.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && ids.dtype() == GgmlType::I32
        && wne[3] == 1
        && xne[3] == 1
        && wne[0] == xne[0]
        && wne[0] % w.dtype().block_size() == 0
        && wne[0] <= i32::MAX as usize
        && ine[2] == 1
        && ine[1] == xne[2]
        && xne[1] > 0
        && ine[0] % xne[1] == 0
        && dne == [wne[1], ine[0], ine[1], 1]
        && w.has_dense_rows()
        && x.has_dense_rows()
        && node.has_dense_rows()
        && ine[0] <= MAX_GRID_YZ
        && ine[1] <= MAX_GRID_YZ
}

fn supports_add_id(node: &Tensor) -> bool {
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

fn supports_reduce(node: &Tensor) -> bool {
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

fn supports_layout(node: &Tensor) -> bool {
    // The kernel of ARANGE writes one dense row.
    crate::op_shapes::layout_op_ok(node) && (node.op() != op::ARANGE || node.is_contiguous())
}

fn supports_mul_mat(node: &Tensor) -> bool {
    if hadamard_len(node).is_some() {
        return node.src(1).is_some_and(|x| x.nrows() <= i32::MAX as usize);
    }
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else {
        return false;
    };
    let (wne, xne, dne, dnb) = (w.ne(), x.ne(), node.ne(), node.nb());
    weight_suffix(w.dtype()).is_some()
        && wne[0] % w.dtype().block_size() == 0
        && x.dtype() == GgmlType::F32
        && node.dtype() == GgmlType::F32
        && wne[0] == xne[0]
        && wne[0] <= i32::MAX as usize
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

/// The src1 whose quantized form (quantize_q8) the scratch holds: matrix-vector products that
/// share an activation (attention's Q/K/V, the FFN's gate/up) quantize it once. Described by
/// its data and rows of K values, so a reshaped view of the same contiguous tensor matches
/// (attention's output is quantized by flash attention itself and read through a reshape).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Q8Src {
    /// Byte offset of the quantized values in the scratch (their scales follow, q8_ds_offset).
    at: usize,
    data: usize,
    k: usize,
    rows: usize,
    mode: i32,
    /// Some: the values are an RMS norm's input times its weight, not yet divided by the norm
    /// (mul_mat_vec_q_add_norm); the F32 tensor `data` was never written. Only kernels that
    /// take the pending norm (ensure_q8_norm) may read them.
    norm: Option<PendingNorm>,
}

/// Where mul_mat_vec_q_add_norm left its sums of squares (one per 32 values, q8_ss_offset
/// after the values) and the norm's epsilon (bits of the f32).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PendingNorm {
    ssq_at: usize,
    eps_bits: u32,
}

/// A quantized src1 in the scratch, as the integer-dot kernels take it: addresses of the
/// values, of their scales, of the pending norm's sums of squares (0: none) and its epsilon.
struct Q8Operand {
    xq: usize,
    xds: usize,
    ssq: usize,
    eps: f32,
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
}

/// Whether a device of this compiler target runs flash_attn_mma.hip's tensor-core kernels.
pub fn arch_has_mma(arch: &str) -> bool {
    arch.strip_prefix("sm_")
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|v| v >= 80)
}

/// How ggml-cpu rounds src1 before its dot products with weights of type `t` (the mode of
/// round_src1), or None where it uses src1 as it is (F32 weights).
fn src1_rounding(t: GgmlType) -> Option<i32> {
    match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => Some(0),
        GgmlType::Q4_1 | GgmlType::Q5_1 => Some(3),
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            Some(1)
        }
        GgmlType::F16 => Some(2),
        GgmlType::BF16 => Some(4),
        _ => None,
    }
}

/// quantize_q8's mode for the integer-dot matrix-vector kernels (mmvq.hip) of weight type
/// `t`: 0 = blocks of 32 (ggml-cpu's Q8_0 / Q8_1), 1 = blocks of 256 (Q8_K); None: no kernel.
fn mvq_mode(t: GgmlType) -> Option<i32> {
    match t {
        GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q8_0
        | GgmlType::IQ4_NL => Some(0),
        GgmlType::Q4_K | GgmlType::Q6_K => Some(1),
        _ => None,
    }
}

/// Whether a MUL_MAT node runs on the integer-dot matrix-vector kernels.
fn uses_mvq(node: &Tensor) -> bool {
    match (node.src(0), node.src(1)) {
        (Some(w), Some(x)) => {
            node.op() == op::MUL_MAT
                && x.ne()[1] < MUL_MAT_VEC_MAX_COLS
                && mvq_mode(w.dtype()).is_some()
        }
        _ => false,
    }
}

/// Whether a MUL_MAT_ID node runs on the integer-dot kernel (mul_mat_id_q, mmvq.hip).
fn uses_mmid_q(node: &Tensor) -> bool {
    match (node.src(0), node.src(1)) {
        (Some(w), Some(x)) => {
            node.op() == op::MUL_MAT_ID && mvq_mode(w.dtype()).is_some() && x.ne()[3] == 1
        }
        _ => false,
    }
}

/// Byte offset of the per-block scales in the quantized-activation scratch of `n` values.
fn q8_ds_offset(n: usize) -> usize {
    n.next_multiple_of(256)
}

/// Addresses of the quantized values and of their scales for `node`'s output quantized at
/// scratch offset `at` (0, 0 where it is not).
fn q8_out_ptrs(node: &Tensor, at: Option<usize>, lc: &LaunchCtx) -> (usize, usize) {
    at.map_or((0, 0), |at| {
        (
            lc.scratch as usize + at,
            lc.scratch as usize + at + q8_ds_offset(node.nelements()),
        )
    })
}

/// Byte offset of the sums of squares (one f32 per 32 values) that mul_mat_vec_q_add_norm
/// writes after the scales.
fn q8_ss_offset(n: usize) -> usize {
    (q8_ds_offset(n) + n.div_ceil(32) * 8).next_multiple_of(256)
}

/// Bytes of scratch one quantized src1 of `n` values takes (values, scales, sums of squares,
/// alignment).
fn q8_region(n: usize) -> usize {
    // 256-byte multiple: the kernels read the values of a region that follows as 16-byte words.
    (q8_ss_offset(n) + n.div_ceil(32) * 4).next_multiple_of(256) + 256
}

/// Where a kernel that reads a quantized src1 of `k_in` values at `in_at` writes its own
/// quantized output of `m` values: before the input where it fits, else after it.
fn q8_out_at(in_at: usize, k_in: usize, m: usize) -> usize {
    if q8_region(m) <= in_at {
        0
    } else {
        in_at + q8_region(k_in)
    }
}

/// Device scratch a node needs while it runs: its quantized src1 (integer-dot kernels), its
/// rounded src1, or for the BLAS path the library's workspace and the f16 operands (whichever
/// is larger: the BLAS may be missing).
pub fn scratch_bytes(node: &Tensor) -> usize {
    if node.op() == op::FLASH_ATTN_EXT {
        return match fa_q8_at(node) {
            Some(at) => at + q8_region(node.nelements()),
            None => fa_split_max_parts(node).map_or(0, |parts| parts * fa_part_floats(node) * 4),
        }
        .max(match fm_split_max(node) {
            // The tensor-core prompt kernel's partials (fm_split_plan).
            1 => 0,
            n => n * node.src(0).map_or(0, |q| q.nrows()) * fa_part_floats(node) * 4,
        });
    }
    if node.op() != op::MUL_MAT && node.op() != op::MUL_MAT_ID {
        return 0;
    }
    if hadamard_len(node).is_some() {
        // Its output quantized for the product after it (try_fused_hadamard_mv).
        return q8_region(node.nelements());
    }
    if uses_mmid_q(node) {
        return q8_region(node.src(1).map_or(0, |x| x.nelements()));
    }
    if uses_mvq(node) {
        // Room for two: a fused kernel may read one quantized src1 while writing the next.
        return 2 * q8_region(node.src(1).map_or(0, |x| x.nelements()));
    }
    let rounded = match (node.src(0), node.src(1)) {
        // Rounded values, then (mode 3) one correction per block of 32.
        (Some(w), Some(x)) if src1_rounding(w.dtype()).is_some() => {
            x.nelements() * 4 + x.nelements().div_ceil(32) * 4 + 256
        }
        _ => 0,
    };
    let blas = blas_operands(node).map_or(0, |o| {
        super::blas::WORKSPACE_BYTES + o.x16_bytes.next_multiple_of(256) + o.w16_bytes
    });
    rounded.max(blas)
}

/// From this many src1 columns on, MUL_MAT goes through the vendor BLAS where there is one
/// (`ROCMFORGE_GPU_BLAS_MIN_COLS` overrides). Measured on an H100 (SmolLM2 shapes, pp16):
/// BLAS 3.3x faster than the tiled kernel, so it takes everything the matrix-vector kernel
/// does not; the tiled kernel remains for machines without a BLAS.
fn blas_min_cols() -> usize {
    static V: once_cell::sync::OnceCell<usize> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| {
        std::env::var("ROCMFORGE_GPU_BLAS_MIN_COLS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MUL_MAT_VEC_MAX_COLS)
            .max(1)
    })
}

/// The f16 operands the BLAS path stages in scratch for a MUL_MAT node: src1 always (it is
/// F32; rounding it to f16 is what ggml-cpu does for F16 weights, and finer than the 8-bit
/// blocks it uses for quantized ones), the weight unless it is F16 and usable in place.
struct BlasOperands {
    x16_bytes: usize,
    w16_bytes: usize,
    w_in_place: bool,
}

/// None where the BLAS path does not take the node: few columns, F32 weights (ggml-cpu
/// multiplies those in f32; the tiled kernel does too), or strides the library cannot express.
fn blas_operands(node: &Tensor) -> Option<BlasOperands> {
    let (w, x) = (node.src(0)?, node.src(1)?);
    let (wne, wnb, xne, dnb) = (w.ne(), w.nb(), x.ne(), node.nb());
    let (k, m, n) = (wne[0], wne[1], xne[1]);
    if n < blas_min_cols() || w.dtype() == GgmlType::F32 || weight_suffix(w.dtype()).is_none() {
        return None;
    }
    if dnb[1..].iter().any(|&s| s % 4 != 0) || dnb[1] < m * 4 || node.data() as usize % 4 != 0 {
        return None;
    }
    let w_in_place = w.dtype() == GgmlType::F16
        && w.data() as usize % 2 == 0
        && wnb[1..].iter().all(|&s| s % 2 == 0);
    if !w_in_place && k % 8 != 0 {
        return None; // the dequantizing kernel writes 8 values at a time
    }
    let x16_bytes = k * n * xne[2] * xne[3] * 2;
    let w16_bytes = if w_in_place {
        0
    } else {
        k * m * wne[2] * wne[3] * 2
    };
    Some(BlasOperands {
        x16_bytes,
        w16_bytes,
        w_in_place,
    })
}

/// MUL_MAT through the vendor BLAS: src1 (and the weight unless it is F16) converted to f16
/// in scratch, then f16 x f16 products accumulated in f32 straight into dst, batched over
/// dim 2 where ggml broadcasts the weight. Err only where nothing was queued yet or the
/// library refused (the caller then runs the kernels, which overwrite every output).
fn launch_mul_mat_blas(
    node: &Tensor,
    lc: &LaunchCtx,
    blas: &super::blas::Blas,
    ops: &BlasOperands,
) -> ApiResult<()> {
    use super::blas::{Elem, Gemm, WORKSPACE_BYTES};
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (wne, wnb, xne, xnb, dnb) = (w.ne(), w.nb(), x.ne(), x.nb(), node.nb());
    let (k, m, n) = (wne[0], wne[1], xne[1]);
    let (ne12, ne13) = (xne[2], xne[3]);
    let (r2, r3) = (ne12 / wne[2], ne13 / wne[3]);
    let workspace = lc.scratch;
    let x16 = workspace + WORKSPACE_BYTES as u64;
    let w16 = x16 + ops.x16_bytes.next_multiple_of(256) as u64;
    // These launches also make the device current on this thread, which the library needs.
    let rows = n * ne12 * ne13;
    let args = Args::default()
        .ptr(x.data())
        .ptr(x16 as usize as *const u8)
        .i32(src1_rounding(w.dtype()).unwrap_or(-1))
        .i64(k)
        .i64(n)
        .i64(ne12)
        .i64(rows)
        .i64s(&xnb[1..]);
    lc.run(
        "src1_to_f16",
        [rows.min(MAX_FLAT_BLOCKS), 1, 1],
        row_block(k),
        args,
    )?;
    // Weight matrices as element offsets into what the GEMM reads (f16 elements).
    let (a_base, lda, a_s2, a_s3) = if ops.w_in_place {
        (w.data() as usize as u64, wnb[1] / 2, wnb[2] / 2, wnb[3] / 2)
    } else {
        let n_rows = m * wne[2] * wne[3];
        let args = Args::default()
            .ptr(w.data())
            .ptr(w16 as usize as *const u8)
            .i64(k)
            .i64(m)
            .i64(wne[2])
            .i64(n_rows)
            .i64s(&wnb[1..]);
        let kernel = format!("dequant_f16_{}", weight_suffix(w.dtype()).unwrap_or("f32"));
        lc.run(
            &kernel,
            [flat_blocks(n_rows * (k / 8), 256), 1, 1],
            256,
            args,
        )?;
        (w16, k, m * k, wne[2] * m * k)
    };
    let (b_s2, b_s3) = (n * k, ne12 * n * k);
    // (columns, weight offset and batch stride, src1 offset and batch stride, dst byte offset
    // and batch stride in floats, batch)
    let gemm = |cols: usize,
                a_off: usize,
                stride_a: usize,
                b_off: usize,
                stride_b: usize,
                c_off: usize,
                stride_c: usize,
                batch: usize| {
        let g = Gemm {
            m,
            n: cols,
            k,
            a: a_base + a_off as u64 * 2,
            a_type: Elem::F16,
            lda,
            stride_a,
            b: x16 + b_off as u64 * 2,
            b_type: Elem::F16,
            ldb: k,
            stride_b,
            c: node.data() as usize as u64 + c_off as u64,
            ldc: dnb[1] / 4,
            stride_c,
            batch,
        };
        blas.gemm(lc.ord, lc.stream, workspace, &g)
    };
    // Where dst's matrices follow each other (dim 2 right after dim 1's columns), the r2 src1
    // matrices that share a weight matrix are one matrix of r2 * n columns: one batched call
    // over the weight matrices (attention's KQ and KQV with grouped heads and no flash
    // attention: one call per KV head took ~5.5 µs each, 8 a product, for an 8B-class pp512 on
    // an H100).
    let heads_dense = dnb[2] == n * dnb[1];
    for i3 in 0..ne13 {
        let a3 = (i3 / r3) * a_s3;
        if r2 == 1 {
            // A weight matrix per src1 matrix: one batch over dim 2.
            gemm(n, a3, a_s2, i3 * b_s3, b_s2, i3 * dnb[3], dnb[2] / 4, ne12)?;
        } else if heads_dense {
            gemm(
                r2 * n,
                a3,
                a_s2,
                i3 * b_s3,
                r2 * b_s2,
                i3 * dnb[3],
                r2 * dnb[2] / 4,
                wne[2],
            )?;
        } else {
            // Weight i2w serves src1 matrices i2w*r2 .. (i2w+1)*r2: a batch with stride 0.
            for i2w in 0..wne[2] {
                gemm(
                    n,
                    a3 + i2w * a_s2,
                    0,
                    i3 * b_s3 + i2w * r2 * b_s2,
                    b_s2,
                    i3 * dnb[3] + i2w * r2 * dnb[2],
                    dnb[2] / 4,
                    r2,
                )?;
            }
        }
    }
    Ok(())
}

/// Holds the stream for `cycles` GPU clock ticks (the profiler queues a graph behind it).
pub fn launch_spin(lc: &LaunchCtx, cycles: usize) -> ApiResult<()> {
    lc.run("rf_spin", [1, 1, 1], 1, Args::default().i64(cycles))
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
    /// The cache that SET_ROWS `set` writes, as mul_mat_vec_q1_qkv takes its K and V caches:
    /// cache, row ids `idx`, ids are I64, cache is F16, cache rows, row stride. A quantized
    /// cache is written by a later launch (`set` itself, or rot_qkv): the kernel writes `set`'s
    /// F32 source instead (one row, whatever the id: row stride 0).
    fn qkv_cache(self, set: &Tensor, idx: &Tensor) -> Self {
        let staged = quant_dst(set.dtype()).is_some();
        let data = if staged {
            set.src(0).map_or(std::ptr::null(), |a| a.data())
        } else {
            set.data()
        };
        self.ptr(data)
            .ptr(idx.data())
            .i32((idx.dtype() == GgmlType::I64) as i32)
            .i32((set.dtype() == GgmlType::F16) as i32)
            .i64(set.ne()[1])
            .i64(if staged { 0 } else { set.nb()[1] })
    }
}

/// ROCMFORGE_GPU_SKIP=prefix[,prefix...] (measuring only: results are wrong): launches of
/// kernels whose names start so are left out, so that a token's time without them shows what
/// they cost inside the replayed graph, where events around a launch would change the timing.
fn skipped(kernel: &str) -> bool {
    static SKIP: once_cell::sync::Lazy<Vec<String>> = once_cell::sync::Lazy::new(|| {
        std::env::var("ROCMFORGE_GPU_SKIP")
            .map(|v| {
                v.split(',')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    });
    !SKIP.is_empty() && SKIP.iter().any(|p| kernel.starts_with(p.as_str()))
}

impl LaunchCtx<'_> {
    fn run(&self, kernel: &str, grid: [usize; 3], block: u32, args: Args) -> ApiResult<()> {
        if skipped(kernel) {
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

impl Q8Src {
    /// Contiguous F32 rows only (the quantized layout is then the same for every view of them).
    fn of(at: usize, x: &Tensor, mode: i32) -> Option<Q8Src> {
        let k = x.ne()[0];
        (x.is_contiguous() && x.dtype() == GgmlType::F32 && k > 0)
            .then(|| Q8Src::rows(at, x.data() as usize, k, x.nelements() / k, mode))
    }
    fn rows(at: usize, data: usize, k: usize, rows: usize, mode: i32) -> Q8Src {
        Q8Src {
            at,
            data,
            k,
            rows,
            mode,
            norm: None,
        }
    }
    /// Bytes of the F32 source.
    fn bytes(&self) -> usize {
        self.k * self.rows * 4
    }
    fn same_src(&self, x: &Tensor, mode: i32) -> bool {
        Q8Src::of(self.at, x, mode)
            == Some(Q8Src {
                norm: None,
                ..*self
            })
    }
}

impl LaunchCtx<'_> {
    /// Forgets the quantized src1 in the scratch once a node overwrote that src1 or used the
    /// scratch for something else.
    fn note_written(&self, node: &Tensor) {
        let Some(c) = self.q8.get() else { return };
        if matches!(
            node.op(),
            op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE
        ) {
            return;
        }
        let (a, e) = (node.data() as usize, node.data() as usize + node.nbytes());
        let other_scratch = scratch_bytes(node) > 0 && !uses_mvq(node) && !uses_mmid_q(node);
        if other_scratch || (a < c.data + c.bytes() && c.data < e) {
            self.q8.set(None);
        }
    }
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

fn launch_cpy(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

fn launch_binary(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

fn launch_scale(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

/// Threads for a one-block-per-row kernel: 256, or fewer (a multiple of 64, so of any
/// warp size) for short rows.
fn row_block(ne0: usize) -> u32 {
    (ne0.div_ceil(64) * 64).clamp(64, 256) as u32
}

/// Threads of an RMS_NORM block (one row each): about four values per thread, up to 1024.
/// A row of a generation step is the whole grid, so its latency is the kernel's: 4096 values
/// on 256 threads took 20 µs on an H100, on 1024 threads a fraction of that. The plain and
/// the fused kernel take the same count, so they add in the same order.
fn norm_block(ne0: usize) -> u32 {
    (ne0.div_ceil(4).div_ceil(64) * 64).clamp(64, 1024) as u32
}

fn launch_soft_max(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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
    lc.run(
        "rms_norm_f32",
        [node.nrows(), 1, 1],
        norm_block(ne[0]),
        args,
    )
}

/// Quantizes src1 `x` into the scratch for the integer-dot kernels, unless it is there already;
/// returns the addresses of the values and of the scales. For kernels that do not take a
/// pending norm: an error where the scratch holds one for `x` (a fusion planned wrong).
fn ensure_q8(x: &Tensor, mode: i32, lc: &LaunchCtx) -> ApiResult<(usize, usize)> {
    let o = ensure_q8_norm(x, mode, lc)?;
    if o.ssq != 0 {
        return Err(
            "internal: a fused norm's output was read by a kernel that does not apply the norm"
                .into(),
        );
    }
    Ok((o.xq, o.xds))
}

/// ensure_q8 for the kernels that apply a pending norm (mul_mat_vec_q1_qkv, mul_mat_vec_q_glu*).
fn ensure_q8_norm(x: &Tensor, mode: i32, lc: &LaunchCtx) -> ApiResult<Q8Operand> {
    let xne = x.ne();
    let (k, n, batches) = (xne[0], xne[1], xne[2] * xne[3]);
    if let Some(c) = lc.q8.get().filter(|c| c.same_src(x, mode)) {
        let xq = lc.scratch as usize + c.at;
        let (ssq, eps) = c.norm.map_or((0, 0.0), |p| {
            (lc.scratch as usize + p.ssq_at, f32::from_bits(p.eps_bits))
        });
        return Ok(Q8Operand {
            xq,
            xds: xq + q8_ds_offset(x.nelements()),
            ssq,
            eps,
        });
    }
    let xq = lc.scratch as usize;
    let xds = xq + q8_ds_offset(x.nelements());
    let groups = if mode == 0 { k / 32 } else { k / 256 };
    let args = Args::default()
        .ptr(x.data())
        .ptr(xq as *const u8)
        .ptr(xds as *const u8)
        .i32(mode)
        .i64(k)
        .i64(n)
        .i64(xne[2])
        .i64s(&x.nb()[1..]);
    lc.run(
        "quantize_q8",
        [n * batches, groups.div_ceil(8), 1],
        256,
        args,
    )?;
    lc.q8.set(Q8Src::of(0, x, mode));
    Ok(Q8Operand {
        xq,
        xds,
        ssq: 0,
        eps: 0.0,
    })
}

/// Matrix-vector product with integer dots: src1 quantized into the scratch (unless it is
/// there already), then one warp per weight row.
fn launch_mul_mat_vec_q(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (wne, xne) = (w.ne(), x.ne());
    let (k, m, n) = (wne[0], wne[1], xne[1]);
    let batches = xne[2] * xne[3];
    let suffix = weight_suffix(w.dtype()).unwrap_or("q4_0");
    let (xq, xds) = ensure_q8(&x, mvq_mode(w.dtype()).unwrap_or(0), lc)?;
    let args = Args::default()
        .ptr(w.data())
        .ptr(xq as *const u8)
        .ptr(xds as *const u8)
        .ptr(node.data())
        .i64(k)
        .i64(m)
        .i64(n)
        .i64(xne[2])
        .i64(xne[2] / wne[2])
        .i64(xne[3] / wne[3])
        .i64s(&w.nb()[1..])
        .i64s(&node.nb()[1..]);
    if n == 1 {
        let (rows, unroll, warps) = match mv1_shape() {
            // Measured best for Q4_0 on an H100 (8B shapes, ncu: 82.7 against 86.0 us of
            // mat-vec kernels per layer): 4 rows per block, 2 warps.
            None if suffix == "q4_0" => (4, 4, mv1_warps().unwrap_or(2)),
            None => (MV1_ROWS, MV1_UNROLL, mv1_warps().unwrap_or(MV1_WARPS)),
            Some(s) => s,
        };
        let threads = (warps * lc.warp_size as usize).min(MV1_MAX_THREADS);
        let grid = [m.div_ceil(rows), 1, batches];
        if (rows, unroll) != (MV1_ROWS, MV1_UNROLL) && suffix == "q4_0" {
            return lc.run(
                &format!("mul_mat_vec_q1x_q4_0_r{rows}_u{unroll}"),
                grid,
                threads as u32,
                args,
            );
        }
        if short_tall(w.dtype(), k, m) {
            return lc.run(
                &format!("mul_mat_vec_q1s_{suffix}"),
                [m.div_ceil(MV1S_ROWS), 1, batches],
                lc.warp_size,
                args,
            );
        }
        let grid = [m.div_ceil(MV1_ROWS), 1, batches];
        return lc.run(
            &format!("mul_mat_vec_q1_{suffix}"),
            grid,
            threads as u32,
            args,
        );
    }
    let grid = [m.div_ceil(MV_ROWS), n.div_ceil(MV_COLS), batches];
    lc.run(
        &format!("mul_mat_vec_q_{suffix}"),
        grid,
        (MV_ROWS * lc.warp_size as usize) as u32,
        args,
    )
}

/// src1 rounded into the scratch the way ggml-cpu rounds it for weights of type `wt`
/// (round_src1, dense rows of ne0 floats in (i1, i2, i3) order), with Q8_1's per-block
/// corrections after the values where the mode has them (else NULL): (values, corrections).
/// None where src1 is used as it is (no rounding for `wt`, or no scratch).
fn round_src1_to_scratch(
    x: &Tensor,
    wt: GgmlType,
    lc: &LaunchCtx,
) -> ApiResult<Option<(*const u8, *const u8)>> {
    let Some(mode) = src1_rounding(wt).filter(|_| lc.scratch != 0) else {
        return Ok(None);
    };
    let xne = x.ne();
    // Corrections after the values, 256-byte aligned.
    let corr_at = (lc.scratch as usize + x.nelements() * 4).next_multiple_of(256);
    let args = Args::default()
        .ptr(x.data())
        .ptr(lc.scratch as usize as *const u8)
        .ptr(corr_at as *const u8)
        .i32(mode)
        .i64(xne[0])
        .i64(xne[1])
        .i64(xne[2])
        .i64s(&x.nb()[1..]);
    lc.run("round_src1", [xne[1] * xne[2] * xne[3], 1, 1], 256, args)?;
    let corr = if mode == 3 {
        corr_at as *const u8
    } else {
        std::ptr::null()
    };
    Ok(Some((lc.scratch as usize as *const u8, corr)))
}

/// MUL_MAT with ggml's Hadamard hint: the transform of each src1 row (hadamard.hip), as
/// ggml-cpu computes it. `q8_at`: dst also quantized (quantize_q8 mode 0) at that scratch offset.
fn launch_hadamard(node: &Tensor, n: usize, q8_at: Option<usize>, lc: &LaunchCtx) -> ApiResult<()> {
    let x = node.src(1).unwrap();
    let (xne, xnb, dnb) = (x.ne(), x.nb(), node.nb());
    let rows = x.nrows();
    let (xq, xds) = q8_out_ptrs(node, q8_at, lc);
    let args = Args::default()
        .ptr(x.data())
        .i32((x.dtype() == GgmlType::F16) as i32)
        .ptr(node.data())
        .i64(n)
        .f32(hadamard_scale(n))
        .i64(xne[1])
        .i64(xne[2])
        .i64(rows)
        .i64s(&xnb[1..])
        .i64s(&dnb[1..])
        .ptr(xq as *const u8)
        .ptr(xds as *const u8);
    if rows == 0 {
        return Ok(());
    }
    // Half a row of pairs per pass, at least a warp (the quantized output takes whole warps).
    let threads = (n / 2).clamp(lc.warp_size as usize, 256);
    lc.run(
        "hadamard_rows",
        [rows.min(MAX_FLAT_BLOCKS), 1, 1],
        threads as u32,
        args,
    )
}

fn launch_mul_mat(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    if let Some(n) = hadamard_len(node) {
        return launch_hadamard(node, n, None, lc);
    }
    if uses_mvq(node) && lc.scratch != 0 {
        return launch_mul_mat_vec_q(node, lc);
    }
    if let (Some(ops), Some(blas)) = (
        blas_operands(node),
        super::blas::for_vendor(lc.api.vendor()),
    ) {
        if lc.scratch != 0 {
            match launch_mul_mat_blas(node, lc, blas, &ops) {
                Ok(()) => return Ok(()),
                Err(e) => crate::log_warn!(
                    "MUL_MAT '{}' through {}: {e}; using rocmforge's kernel",
                    node.name(),
                    blas.name
                ),
            }
        }
    }
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (wne, xne) = (w.ne(), x.ne());
    let (wnb, dnb) = (w.nb(), node.nb());
    let (k, m, n) = (wne[0], wne[1], xne[1]);
    let batches = xne[2] * xne[3];
    let suffix = weight_suffix(w.dtype()).unwrap_or("f32");
    // src1 as ggml-cpu sees it: rounded into the scratch (dense) or used in place; the vector
    // kernel rounds to f16 / bf16 itself (one launch less per product: attention's KQ and
    // KQV with an F16 cache in generation).
    let vec = n < MUL_MAT_VEC_MAX_COLS;
    let xround = src1_rounding(w.dtype()).filter(|m| vec && (*m == 2 || *m == 4));
    let rounded = if xround.is_some() {
        None
    } else {
        round_src1_to_scratch(&x, w.dtype(), lc)?
    };
    let (xp, xnb, corr) = match rounded {
        Some((xp, corr)) => (xp, [4, k * 4, k * 4 * n, k * 4 * n * xne[2]], corr),
        None => (x.data() as *const u8, x.nb(), std::ptr::null()),
    };
    let args = Args::default()
        .ptr(w.data())
        .ptr(xp)
        .ptr(node.data())
        .i64(k)
        .i64(m)
        .i64(n)
        .i64(xne[2])
        .i64(xne[2] / wne[2])
        .i64(xne[3] / wne[3])
        .i64s(&wnb[1..])
        .i64s(&xnb[1..])
        .i64s(&dnb[1..])
        .ptr(corr)
        .i32(xround.unwrap_or(-1));
    if vec {
        lc.run(
            &format!("mul_mat_vec_{suffix}"),
            [m.div_ceil(MV_ROWS), n.div_ceil(MV_COLS), batches],
            (MV_ROWS * lc.warp_size as usize) as u32,
            args,
        )
    } else {
        lc.run(
            &format!("mul_mat_tiled_{suffix}"),
            [m.div_ceil(64), n.div_ceil(64), batches],
            256,
            args,
        )
    }
}

// ---- ops of transformer graphs: rows, rope, activations, attention --------------------

fn supports_get_rows(node: &Tensor) -> bool {
    let (Some(a), Some(idx)) = (node.src(0), node.src(1)) else {
        return false;
    };
    weight_suffix(a.dtype()).is_some()
        && a.ne()[0] % a.dtype().block_size() == 0
        && node.dtype() == GgmlType::F32
        && crate::op_shapes::get_rows_layout_ok(node)
        && idx.nelements() <= i32::MAX as usize
}

fn launch_get_rows(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

fn supports_set_rows(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    is_f32_or_f16(a.dtype())
        && (is_f32_or_f16(node.dtype()) || quant_dst(node.dtype()).is_some())
        && node.ne()[0] % node.dtype().block_size() == 0
        && crate::op_shapes::set_rows_layout_ok(node)
        && a.nrows() <= i32::MAX as usize
}

fn launch_set_rows(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

const ROPE_NORMAL: i32 = 0;
const ROPE_NEOX: i32 = 2;
const ROPE_MROPE: i32 = 8;
const ROPE_IMROPE: i32 = 40;

fn supports_rope(node: &Tensor) -> bool {
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
fn rope_consts(node: &Tensor) -> (f32, f32, f32) {
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

fn launch_rope(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

/// Activation codes of activation.hip.
fn act_code_unary(u: i32) -> Option<i32> {
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

fn act_code_glu(g: i32) -> Option<i32> {
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
fn act_code(node: &Tensor) -> Option<i32> {
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

fn supports_unary(node: &Tensor) -> bool {
    let Some(a) = node.src(0) else { return false };
    let t = a.dtype();
    if act_code(node).is_none() || !is_f32_or_f16(t) || node.dtype() != t || !a.same_shape(node) {
        return false;
    }
    let layout_ok = match node.op() {
        // ggml-cpu walks these by flat row index.
        op::CLAMP | op::LEAKY_RELU => a.is_contiguous_from(1) && node.is_contiguous_from(1),
        _ => a.has_dense_rows() && node.has_dense_rows(),
    };
    layout_ok
}

fn launch_unary(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

fn supports_glu(node: &Tensor) -> bool {
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

fn launch_glu(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

/// Largest head size the attention kernel holds (32 lanes x 8 values).
const FA_MAX_HEAD: usize = 256;
/// Warps per query row in flash attention (FA_WARPS in kernels/flash_attn.hip): they split the keys.
const FA_WARPS: usize = 8;
/// Largest head size of the prompt attention kernel (kernels/flash_attn_tiled.hip), and from
/// how many query rows on it is used.
const FA_TILE_MAX_HEAD: usize = 128;
const FA_TILE_MIN_Q: usize = 32;

/// Query rows per block of the prompt attention kernel: 32 (256 threads) or 16 (128 threads,
/// twice the blocks); `ROCMFORGE_GPU_FA_TILE_ROWS=16` picks the latter (A/B runs). On an H100
/// (SmolLM2 pp512, ncu) a 32-row launch took 86 us, a 16-row one 114 us.
fn fa_tile_rows() -> usize {
    static V: once_cell::sync::OnceCell<usize> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| {
        if std::env::var("ROCMFORGE_GPU_FA_TILE_ROWS").as_deref() == Ok("16") {
            16
        } else {
            32
        }
    })
}

/// `ROCMFORGE_GPU_FA_TILED=0` sends prompts through the row-per-block kernel too (A/B runs).
fn fa_tiled_enabled() -> bool {
    static V: once_cell::sync::OnceCell<bool> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| std::env::var("ROCMFORGE_GPU_FA_TILED").map_or(true, |v| v != "0"))
}

fn supports_flash_attn(node: &Tensor) -> bool {
    let (Some(q), Some(k), Some(v)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let (qne, kne, vne, dne) = (q.ne(), k.ne(), v.ne(), node.ne());
    if q.dtype() != GgmlType::F32 || node.dtype() != GgmlType::F32 || !node.is_contiguous() {
        return false;
    }
    if !matches!(node.param_i32(3), 0 | 10) {
        return false;
    }
    let kv_ok = match (k.dtype(), v.dtype()) {
        (GgmlType::F16, GgmlType::F16) | (GgmlType::F32, GgmlType::F32) => true,
        // Whole Q8_0 blocks: q is rounded to them one group of 32 lanes per block.
        (GgmlType::Q8_0, GgmlType::Q8_0) => qne[0] % 32 == 0 && vne[0] % 32 == 0,
        _ => false,
    };
    if !kv_ok || !q.has_dense_rows() || !k.has_dense_rows() || !v.has_dense_rows() {
        return false;
    }
    if qne[0] != kne[0] || kne[1] != vne[1] || dne != [vne[0], qne[2], qne[1], qne[3]] {
        return false;
    }
    if qne[0] > FA_MAX_HEAD || vne[0] > FA_MAX_HEAD {
        return false;
    }
    if kne[2] == 0
        || vne[2] == 0
        || qne[2] % kne[2] != 0
        || qne[2] % vne[2] != 0
        || qne[3] != kne[3]
        || qne[3] != vne[3]
    {
        return false;
    }
    if let Some(m) = node.src(3) {
        let mne = m.ne();
        if m.dtype() != GgmlType::F16 || !m.has_dense_rows() || mne[0] < kne[1] || mne[1] < qne[1] {
            return false;
        }
        if mne[2] == 0 || mne[3] == 0 || qne[2] % mne[2] != 0 || qne[3] % mne[3] != 0 {
            return false;
        }
    }
    if let Some(s) = node.src(4) {
        if s.dtype() != GgmlType::F32 || !s.is_contiguous() || s.nelements() < qne[2] {
            return false;
        }
    }
    qne[1] * qne[2] * qne[3] <= i32::MAX as usize
}

/// ROCMFORGE_GPU_FA_F16_ACC=1: flash attention accumulates F16 V in f16 where ggml-cpu does.
fn fa_f16_acc_enabled() -> bool {
    static V: once_cell::sync::OnceCell<bool> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| std::env::var("ROCMFORGE_GPU_FA_F16_ACC").is_ok_and(|v| v == "1"))
}

/// Split-KV for few query rows: 1 (default) the row kernel (flash_attn.hip) with each row's
/// keys split over blocks, 2 the key-per-lane kernel (flash_attn_split.hip), 0 no split
/// (`ROCMFORGE_GPU_FA_SPLIT`, for A/B runs).
fn fa_split_mode() -> u8 {
    static V: once_cell::sync::OnceCell<u8> = once_cell::sync::OnceCell::new();
    *V.get_or_init(
        || match std::env::var("ROCMFORGE_GPU_FA_SPLIT").as_deref() {
            Ok("0") => 0,
            Ok("2") => 2,
            _ => 1,
        },
    )
}

/// Whether this node takes ggml-cpu's f16 V accumulator (opt-in, see launch_flash_attn):
/// ggml-cpu's row-by-row algorithm with F16 V, i.e. neither its single-query split over
/// 512+ keys nor its tiling of 64+ queries (as src/cpu/ops/flash_attn.rs decides).
fn fa_f16_acc(node: &Tensor) -> bool {
    let (Some(q), Some(k), Some(v)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let (qne, kne) = (q.ne(), k.ne());
    let kv_plain = matches!(k.dtype(), GgmlType::F16 | GgmlType::F32) && k.dtype() == v.dtype();
    let ggml_split_kv = qne[1] == 1 && qne[3] == 1 && kv_plain && kne[1] >= 512;
    let ggml_tiled = kv_plain && qne[1] >= 64;
    fa_f16_acc_enabled() && v.dtype() == GgmlType::F16 && !ggml_split_kv && !ggml_tiled
}

/// Whether the node is a prompt for the tile kernels (32+ query rows, head size up to 128):
/// F16 / F32 K and V (flash_attn_mma.hip on tensor cores for F16, else flash_attn_tiled.hip)
/// or Q8_0 K and V (flash_attn_mma.hip; without tensor cores the row kernel, unsplit).
fn fa_prompt(node: &Tensor) -> bool {
    let (Some(q), Some(k), Some(v)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let qne = q.ne();
    let kv_ok = matches!(k.dtype(), GgmlType::F16 | GgmlType::F32 | GgmlType::Q8_0)
        && k.dtype() == v.dtype();
    let head = qne[0].max(v.ne()[0]);
    kv_ok
        && qne[1] >= FA_TILE_MIN_Q
        && fa_tiled_enabled()
        && !fa_f16_acc(node)
        && head <= FA_TILE_MAX_HEAD
        && qne[2] <= MAX_GRID_YZ
        && qne[3] <= MAX_GRID_YZ
}

/// Whether the node goes to the scalar tiled prompt kernel (kernels/flash_attn_tiled.hip) when
/// the tensor-core one does not take it: F16 or F32 K and V.
fn fa_tiled(node: &Tensor) -> bool {
    fa_prompt(node)
        && node
            .src(1)
            .is_some_and(|k| matches!(k.dtype(), GgmlType::F16 | GgmlType::F32))
}

/// `ROCMFORGE_GPU_FA_MMA=0` keeps prompts on flash_attn_tiled.hip where the tensor-core
/// kernel could take them (A/B runs, and the scalar kernel's tests on NVIDIA).
fn fa_mma_enabled() -> bool {
    static V: once_cell::sync::OnceCell<bool> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| std::env::var("ROCMFORGE_GPU_FA_MMA").map_or(true, |v| v != "0"))
}

/// The K/V kind of the tile kernels (flash_attn_mma.hip, flash_attn_vec.hip) in their names:
/// F16 K and V with 16-byte aligned rows (16-byte loads, cp.async) or Q8_0 K and V (2-byte
/// aligned blocks); None for anything else.
fn fa_kv_kind(k: &Tensor, v: &Tensor) -> Option<&'static str> {
    let aligned =
        |t: &Tensor, a: usize| t.data() as usize % a == 0 && t.nb()[1..].iter().all(|n| n % a == 0);
    match (k.dtype(), v.dtype()) {
        (GgmlType::F16, GgmlType::F16) if aligned(k, 16) && aligned(v, 16) => Some("f16"),
        (GgmlType::Q8_0, GgmlType::Q8_0) if aligned(k, 2) && aligned(v, 2) => Some("q8_0"),
        _ => None,
    }
}

/// The tensor-core prompt kernel (flash_attn_mma.hip) for a prompt node, as (K/V kind, head
/// size, warps a block): a device with the instructions, F16 K and V of one head size 64 or
/// 128 with 16-byte aligned rows (cp.async), or Q8_0 K and V (2-byte aligned blocks). Four
/// warps (64 query rows) a block, or two where four would leave compute units idle.
fn fa_mma_shape(node: &Tensor, lc: &LaunchCtx) -> Option<(&'static str, usize, usize)> {
    let (q, k, v) = (node.src(0)?, node.src(1)?, node.src(2)?);
    let (qne, d) = (q.ne(), q.ne()[0]);
    if !lc.mma || !fa_mma_enabled() || !fa_prompt(node) || v.ne()[0] != d || !matches!(d, 64 | 128)
    {
        return None;
    }
    let kv = fa_kv_kind(&k, &v)?;
    let blocks4 = qne[1].div_ceil(64) * qne[2] * qne[3];
    let warps = if blocks4 < lc.compute_units.max(1) as usize {
        2
    } else {
        4
    };
    super::kernels::FM_SHAPES
        .contains(&(d, warps))
        .then_some((kv, d, warps))
}

/// The tensor-core prompt kernel split over the keys: at most FM_SPLIT_MAX splits of at least
/// FM_SPLIT_MIN_KEYS keys, their partials within FM_SPLIT_BYTES of scratch. H100, SmolLM2
/// pp512 (one call, two rounds): after 2048 tokens 45.3k / 52.5k t/s split 4 ways against
/// 35.1k / 38.7k unsplit (Q8_0 caches 39.0k / 42.3k against 30.6k / 28.1k); without context
/// (512 keys, 2 splits of 256) 56.8k / 74.7k against 67.5k / 68.7k, no gain: 512 keys a split
/// at least.
const FM_SPLIT_MAX: usize = 8;
const FM_SPLIT_MIN_KEYS: usize = 512;
const FM_SPLIT_BYTES: usize = 16 << 20;
/// Keys per tile of flash_attn_mma.hip (FM_BK): a split takes whole tiles.
const FM_BK: usize = 64;

/// `ROCMFORGE_GPU_FA_MMA_SPLIT=0`: prompts on tensor cores never split over the keys (A/B runs).
fn fm_split_enabled() -> bool {
    static V: once_cell::sync::OnceCell<bool> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| std::env::var("ROCMFORGE_GPU_FA_MMA_SPLIT").map_or(true, |v| v != "0"))
}

/// Most splits of the prompt node's keys: by key count and scratch bytes (the plan's bound,
/// whatever the device; 1 where the node would not split).
fn fm_split_max(node: &Tensor) -> usize {
    let (Some(q), Some(k)) = (node.src(0), node.src(1)) else {
        return 1;
    };
    if !fm_split_enabled() || !fa_prompt(node) {
        return 1;
    }
    let qne = q.ne();
    let part = qne[1] * qne[2] * qne[3] * fa_part_floats(node) * 4;
    let by_bytes = FM_SPLIT_BYTES / part.max(1);
    // Grid z is sequences x splits.
    let by_grid = MAX_GRID_YZ / qne[3].max(1);
    (k.ne()[1] / FM_SPLIT_MIN_KEYS)
        .min(by_bytes)
        .min(by_grid)
        .min(FM_SPLIT_MAX)
        .max(1)
}

/// How flash_attn_mma splits a prompt's keys: (splits, keys per split, a multiple of FM_BK).
/// Enough splits that `blocks` (query tiles x heads x sequences) times the splits fill what
/// the GPU holds at once: about 8 warps a compute unit (the kernel's ~250 registers a thread
/// allow two 4-warp blocks an SM). H100, SmolLM2 (9 heads, 32-row blocks) pp512 after 2048
/// tokens: 144 blocks walked 40 key tiles each, one after another.
fn fm_split_plan(
    node: &Tensor,
    blocks: usize,
    warps: usize,
    compute_units: usize,
) -> (usize, usize) {
    let n_kv = node.src(1).map_or(0, |k| k.ne()[1]);
    let resident = compute_units * (8 / warps.max(1)).max(1);
    let splits = resident
        .div_ceil(blocks.max(1))
        .min(fm_split_max(node))
        .max(1);
    if splits == 1 {
        return (1, n_kv);
    }
    let split_keys = n_kv.div_ceil(splits).next_multiple_of(FM_BK);
    (n_kv.div_ceil(split_keys), split_keys)
}

/// Most splits of one row's keys in the split-KV kernel, most partial results in all, and
/// most query rows it takes (at least two splits each).
const FA_MAX_SPLITS: usize = 64;
const FA_SPLIT_MAX_PARTS: usize = 2048;
/// Per-row counters of the split-KV row kernel's one-launch merge (rows are at most
/// FA_SPLIT_MAX_PARTS / 2).
pub const FA_COUNTERS: usize = FA_SPLIT_MAX_PARTS / 2;
/// Most warps per block of the split-KV kernel (FAS_MAX_WARPS in flash_attn_split.hip is 8).
const FA_SPLIT_WARPS: usize = 4;

/// Where in the scratch the split path's combine kernel puts dst quantized (quantize_q8 mode
/// 0, as the matrix-vector product reading it next wants it): after the partial results.
/// None where dst is not contiguous F32 rows of whole blocks.
fn fa_q8_at(node: &Tensor) -> Option<usize> {
    let dv = node.src(2)?.ne()[0];
    let parts = fa_split_max_parts(node)?;
    (dv % 32 == 0 && node.dtype() == GgmlType::F32 && node.is_contiguous())
        .then(|| (parts * fa_part_floats(node) * 4).next_multiple_of(256))
}

/// Floats of one partial result of the split-KV kernel: DV outputs, maximum, sum.
fn fa_part_floats(node: &Tensor) -> usize {
    node.src(2).map_or(0, |v| v.ne()[0]) + 2
}

/// The most partial results the split-KV path (kernels/flash_attn_split.hip) may write for
/// this node, or None where it does not take the node: the prompt tiles, the f16
/// accumulator, or too many query rows (they fill the GPU as they are).
fn fa_split_max_parts(node: &Tensor) -> Option<usize> {
    let q = node.src(0)?;
    let rows = q.ne()[1] * q.ne()[2] * q.ne()[3];
    if fa_split_mode() == 0
        || fa_prompt(node)
        || fa_f16_acc(node)
        || rows == 0
        || rows * 2 > FA_SPLIT_MAX_PARTS
    {
        return None;
    }
    Some((rows * FA_MAX_SPLITS).min(FA_SPLIT_MAX_PARTS))
}

/// How the row kernel splits `n_kv` keys of each of `rows` rows (split-KV mode 1): (splits,
/// keys per split). About two blocks per compute unit, at least 64 keys (8 per warp) a split.
fn fa_row_split_plan(
    rows: usize,
    n_kv: usize,
    compute_units: usize,
    max_parts: usize,
) -> (usize, usize) {
    let max_splits = FA_MAX_SPLITS.min(max_parts / rows).max(1);
    let splits = (2 * compute_units.max(1))
        .div_ceil(rows)
        .min(n_kv.div_ceil(64))
        .clamp(1, max_splits);
    let split_keys = n_kv.div_ceil(splits).max(1);
    (n_kv.div_ceil(split_keys).max(1), split_keys)
}

/// How the split-KV kernel divides `n_kv` keys of each of `rows` rows: (splits, keys per
/// split, warps per block). Warps take chunks of one key per lane; the chunks are spread
/// over about 8 warps per compute unit, at most FA_SPLIT_WARPS warps per block.
fn fa_split_plan(
    rows: usize,
    n_kv: usize,
    warp: usize,
    compute_units: usize,
    max_parts: usize,
) -> (usize, usize, usize) {
    let chunks = n_kv.div_ceil(warp).max(1);
    let target_warps = 8 * compute_units.max(1);
    let chunks_per_warp = (rows * chunks).div_ceil(target_warps).max(1);
    let row_warps = chunks.div_ceil(chunks_per_warp);
    let max_splits = FA_MAX_SPLITS.min(max_parts / rows).max(1);
    let splits = row_warps.div_ceil(FA_SPLIT_WARPS).clamp(1, max_splits);
    let split_keys = chunks.div_ceil(splits) * warp;
    let splits = n_kv.div_ceil(split_keys).max(1);
    let warps = split_keys
        .div_ceil(warp * chunks_per_warp)
        .clamp(1, FA_SPLIT_WARPS);
    (splits, split_keys, warps)
}

/// Threads per block and keys per chunk of the generation kernel (FAV_THREADS, FAV_CHUNK in
/// flash_attn_vec.hip).
const FA_VEC_THREADS: usize = 128;
const FA_VEC_CHUNK: usize = 32;

/// Blocks per compute unit the generation kernel (flash_attn_vec.hip) aims at:
/// `ROCMFORGE_GPU_FA_VEC`, default 8 (H100, 8B-class at a 2048-token context: 2 gave 226/222
/// t/s, 8 230/230: 36 splits of 64 keys instead of 24 of 96; FA_SPLIT_MAX_PARTS caps them);
/// 0 sends generation back to the row kernel (A/B runs).
fn fa_vec_blocks_per_cu() -> usize {
    static V: once_cell::sync::OnceCell<usize> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| {
        std::env::var("ROCMFORGE_GPU_FA_VEC")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8)
    })
}

/// Fewest keys a split of the generation kernel takes (ROCMFORGE_GPU_FA_VEC_KEYS, for measuring).
fn fa_vec_split_min_keys() -> usize {
    static V: once_cell::sync::OnceCell<usize> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| env_count("ROCMFORGE_GPU_FA_VEC_KEYS", usize::MAX).unwrap_or(FA_VEC_CHUNK))
}

/// A launch of the generation kernel: grid (groups = KV heads x sequences, splits), each
/// split `split_keys` keys (whole chunks).
struct FaVecPlan {
    groups: usize,
    splits: usize,
    split_keys: usize,
    /// The kernel's row count (`_r{most_rows}`).
    most_rows: usize,
    /// The K/V kind of the kernel name: f16 or q8_0.
    kv: &'static str,
}

/// Whether the split-KV path takes the generation kernel (kernels/flash_attn_vec.hip) for
/// this node, and its launch: F16 K and V (16-byte aligned rows) or Q8_0 K and V (2-byte
/// aligned blocks) of one head size (64, 128 or 256), as many K as V heads, the rows reading
/// one KV head (queries x heads of the group) at most those of a kernel for D (FAV_SHAPES:
/// 1024 / D); several splits need the merge counters.
fn fa_vec_plan(
    node: &Tensor,
    lc: &LaunchCtx,
    rows: usize,
    compute_units: usize,
    max_parts: usize,
) -> Option<FaVecPlan> {
    let per_cu = fa_vec_blocks_per_cu();
    let (q, k, v) = (node.src(0)?, node.src(1)?, node.src(2)?);
    let (qne, kne, vne) = (q.ne(), k.ne(), v.ne());
    let (d, warp) = (qne[0], lc.warp_size as usize);
    let kv = fa_kv_kind(&k, &v)?;
    if per_cu == 0 || fa_split_mode() != 1 {
        return None;
    }
    if vne[0] != d
        || !matches!(d, 64 | 128 | 256)
        || warp == 0
        || d % warp != 0
        || FA_VEC_THREADS % warp != 0
        || kne[2] != vne[2]
    {
        return None;
    }
    let rows_per_block = qne[1] * (qne[2] / kne[2]);
    let (_, most_rows) = *super::kernels::FAV_SHAPES
        .iter()
        .find(|(sd, r)| *sd == d && rows_per_block <= *r)?;
    let groups = kne[2] * qne[3];
    if groups == 0 || groups > FA_COUNTERS {
        return None;
    }
    let max_splits = (max_parts / rows.max(1)).min(kne[1].div_ceil(fa_vec_split_min_keys()).max(1));
    let (splits, split_keys) = fa_vec_splits(kne[1], groups, per_cu * compute_units, max_splits);
    if splits > 1 && lc.fa_counters == 0 {
        return None;
    }
    Some(FaVecPlan {
        groups,
        splits,
        split_keys,
        most_rows,
        kv,
    })
}

/// How the generation kernel splits `n_kv` keys of each of `groups` (KV head, sequence)
/// groups: (splits, keys per split), splits of whole chunks, about `target_blocks` blocks in
/// all, at most `max_splits` splits.
fn fa_vec_splits(
    n_kv: usize,
    groups: usize,
    target_blocks: usize,
    max_splits: usize,
) -> (usize, usize) {
    let chunks = n_kv.div_ceil(FA_VEC_CHUNK).max(1);
    let splits = target_blocks
        .div_ceil(groups.max(1))
        .min(chunks)
        .min(max_splits)
        .max(1);
    let split_keys = chunks.div_ceil(splits) * FA_VEC_CHUNK;
    (n_kv.div_ceil(split_keys).max(1), split_keys)
}

/// flash_attn_split_combine: a block per row of `node` merges the row's `splits` partials at
/// `part` into dst (and quantizes it at `xq`, `xds` where those are not 0).
fn launch_fa_combine(
    node: &Tensor,
    part: *const u8,
    splits: usize,
    (xq, xds): (usize, usize),
    lc: &LaunchCtx,
) -> ApiResult<()> {
    let (q, v) = (node.src(0).unwrap(), node.src(2).unwrap());
    let args = Args::default()
        .ptr(part)
        .opt_ptr(node.src(4))
        .ptr(node.data())
        .i64(v.ne()[0])
        .i64(q.ne()[1])
        .i64(q.ne()[2])
        .i64(splits)
        .i64(node.nb()[1])
        .ptr(xq as *const u8)
        .ptr(xds as *const u8);
    let cwarps = splits.clamp(1, FA_SPLIT_WARPS);
    lc.run(
        "flash_attn_split_combine",
        [q.nrows(), 1, 1],
        (cwarps * lc.warp_size as usize) as u32,
        args,
    )
}

/// The row kernel's last arguments where its blocks do not merge the row themselves:
/// no counters, no quantized output.
fn no_merge(args: Args) -> Args {
    args.ptr(std::ptr::null())
        .ptr(std::ptr::null())
        .ptr(std::ptr::null())
}

fn launch_flash_attn(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (q, k, v) = (
        node.src(0).unwrap(),
        node.src(1).unwrap(),
        node.src(2).unwrap(),
    );
    let (mask, sinks) = (node.src(3), node.src(4));
    let (qne, kne, vne) = (q.ne(), k.ne(), v.ne());
    let mut scale = node.param_f32(0);
    let max_bias = node.param_f32(1);
    let softcap = node.param_f32(2);
    if softcap != 0.0 {
        scale /= softcap;
    }
    let n_head = qne[2];
    let n_head_log2 = if n_head == 0 {
        0
    } else {
        1usize << (usize::BITS - 1 - n_head.leading_zeros())
    };
    let (m0, m1) = if max_bias > 0.0 && n_head_log2 > 0 {
        (
            2f32.powf(-max_bias / n_head_log2 as f32),
            2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32),
        )
    } else {
        (1.0, 1.0)
    };
    let (mne, nbm) = match mask {
        Some(m) => (m.ne(), m.nb()),
        None => ([1; 4], [0; 4]),
    };
    // ggml-cpu's algorithm for this node (as src/cpu/ops/flash_attn.rs decides): with F16 or
    // F32 K and V of one type it tiles 64 queries or more and splits a single query's cache
    // of 512 keys or more; elsewhere it goes row by row, accumulating F16 V in f16.
    // Mirroring that f16 accumulator means one warp walking the keys in order: several times
    // slower for generation, so it is opt-in (ROCMFORGE_GPU_FA_F16_ACC=1, for agreement
    // studies); by default the GPU accumulates in f32 (as ggml-cuda does).
    let f16_acc = fa_f16_acc(node);
    let (kernel, round_q) = match k.dtype() {
        GgmlType::F16 => ("flash_attn_f16_f16", 1),
        GgmlType::Q8_0 => ("flash_attn_q8_0_q8_0", 2),
        _ => ("flash_attn_f32_f32", 0),
    };
    let args = Args::default()
        .ptr(q.data())
        .ptr(k.data())
        .ptr(v.data())
        .opt_ptr(mask)
        .opt_ptr(sinks)
        .ptr(node.data())
        .i64(qne[0])
        .i64(vne[0])
        .i64(qne[1])
        .i64(n_head)
        .i64(qne[3])
        .i64(kne[1])
        .i64(n_head / kne[2])
        .i64(n_head / vne[2])
        .i64s(&q.nb()[1..])
        .i64s(&k.nb()[1..])
        .i64s(&v.nb()[1..])
        .i64(mne[2])
        .i64(mne[3])
        .i64s(&nbm[1..])
        .i64(node.nb()[1])
        .f32(scale)
        .f32(softcap)
        .f32(max_bias)
        .f32(m0)
        .f32(m1)
        .i32(n_head_log2 as i32)
        .i32(round_q);
    let rows = qne[1] * qne[2] * qne[3];
    let cu = if lc.compute_units == 0 {
        64
    } else {
        lc.compute_units as usize
    };
    if let Some(max_parts) = fa_split_max_parts(node).filter(|_| lc.scratch != 0) {
        // Few query rows (generation): each row's keys split over several blocks writing
        // partial softmaxes into the scratch, then merged into dst.
        let warp = lc.warp_size as usize;
        let part = lc.scratch as usize as *const u8;
        // The merge (combine kernel or the row kernel's last block) also quantizes dst for the
        // output projection that follows (fa_q8_at); q8_next then says so.
        let q8 = fa_q8_at(node).filter(|_| lc.fuse);
        let (xq, xds) = q8_out_ptrs(node, q8, lc);
        let note_q8 = || {
            // dst seen as rows of DV * n_head values (the projection's reshape of it).
            let k = vne[0] * n_head;
            lc.q8_next.set(
                q8.map(|at| Q8Src::rows(at, node.data() as usize, k, node.nelements() / k, 0)),
            );
        };
        let combine = |splits: usize| {
            launch_fa_combine(node, part, splits, (xq, xds), lc)?;
            note_q8();
            Ok(())
        };
        if let Some(plan) = fa_vec_plan(node, lc, rows, cu, max_parts) {
            // F16 / Q8_0 caches: one block per KV head and split takes every row that reads it
            // (the row kernel's arguments; merged by the group's last block where split).
            let (part, counters) = if plan.splits > 1 {
                (part, lc.fa_counters as usize as *const u8)
            } else {
                (std::ptr::null(), std::ptr::null())
            };
            let args = args
                .i32(0)
                .ptr(part)
                .i64(plan.split_keys)
                .ptr(counters)
                .ptr(xq as *const u8)
                .ptr(xds as *const u8);
            let kernel = format!("flash_attn_vec_{}_d{}_r{}", plan.kv, qne[0], plan.most_rows);
            lc.run(
                &kernel,
                [plan.groups, plan.splits, 1],
                FA_VEC_THREADS as u32,
                args,
            )?;
            note_q8();
            return Ok(());
        }
        if fa_split_mode() == 1 {
            let (splits, split_keys) = fa_row_split_plan(rows, kne[1], cu, max_parts);
            if splits > 1 && lc.fa_counters != 0 && rows <= FA_COUNTERS && lc.fuse {
                // The last block of each row to finish merges the row's partials (and
                // quantizes it, as the combine kernel would): one launch instead of two.
                let args = args
                    .i32(0)
                    .ptr(part)
                    .i64(split_keys)
                    .ptr(lc.fa_counters as usize as *const u8)
                    .ptr(xq as *const u8)
                    .ptr(xds as *const u8);
                lc.run(kernel, [rows, splits, 1], (FA_WARPS * warp) as u32, args)?;
                note_q8();
                return Ok(());
            }
            if splits > 1 {
                let args = no_merge(args.i32(0).ptr(part).i64(split_keys));
                lc.run(kernel, [rows, splits, 1], (FA_WARPS * warp) as u32, args)?;
                return combine(splits);
            }
            let args = no_merge(args.i32(0).ptr(std::ptr::null()).i64(kne[1]));
            return lc.run(kernel, [rows, 1, 1], (FA_WARPS * warp) as u32, args);
        }
        let (splits, split_keys, warps) = fa_split_plan(rows, kne[1], warp, cu, max_parts);
        let head = qne[0].max(vne[0]);
        let bucket = if head <= 64 {
            64
        } else if head <= 128 {
            128
        } else {
            256
        };
        let kernel = format!(
            "flash_attn_split_{}_d{bucket}",
            &kernel["flash_attn_".len()..]
        );
        let args = Args::default()
            .ptr(q.data())
            .ptr(k.data())
            .ptr(v.data())
            .opt_ptr(mask)
            .ptr(part)
            .i64(qne[0])
            .i64(vne[0])
            .i64(qne[1])
            .i64(n_head)
            .i64(kne[1])
            .i64(split_keys)
            .i64(n_head / kne[2])
            .i64(n_head / vne[2])
            .i64s(&q.nb()[1..])
            .i64s(&k.nb()[1..])
            .i64s(&v.nb()[1..])
            .i64(mne[2])
            .i64(mne[3])
            .i64s(&nbm[1..])
            .f32(scale)
            .f32(softcap)
            .f32(max_bias)
            .f32(m0)
            .f32(m1)
            .i32(n_head_log2 as i32)
            .i32(round_q);
        lc.run(&kernel, [rows, splits, 1], (warps * warp) as u32, args)?;
        return combine(splits);
    }
    let head = qne[0].max(vne[0]);
    if let Some((kv, d, warps)) = fa_mma_shape(node, lc) {
        // Prompts on tensor cores: 16 query rows a warp, K/V tiles of 64 keys; split over the
        // keys (partials in the scratch, merged by the combine kernel) where the blocks alone
        // would leave the GPU mostly idle.
        let kernel = format!("flash_attn_mma_{kv}_d{d}_w{warps}");
        let q_tiles = qne[1].div_ceil(16 * warps);
        let (splits, split_keys) = fm_split_plan(node, q_tiles * qne[2] * qne[3], warps, cu);
        let part_bytes = splits * rows * fa_part_floats(node) * 4;
        if splits > 1 && lc.scratch != 0 && part_bytes <= lc.scratch_len {
            let part = lc.scratch as usize as *const u8;
            let args = args.ptr(part).i64(split_keys);
            lc.run(
                &kernel,
                [q_tiles, qne[2], qne[3] * splits],
                (32 * warps) as u32,
                args,
            )?;
            return launch_fa_combine(node, part, splits, (0, 0), lc);
        }
        let args = args.ptr(std::ptr::null()).i64(kne[1]);
        return lc.run(
            &kernel,
            [q_tiles, qne[2], qne[3]],
            (32 * warps) as u32,
            args,
        );
    }
    if fa_tiled(node) {
        // Prompts: blocks of FA_TILE_Q query rows of one head share each K/V tile; tiles laid
        // out for head size 64 or 128.
        let rows = fa_tile_rows();
        let kv = if k.dtype() == GgmlType::F16 {
            "f16_f16"
        } else {
            "f32_f32"
        };
        let kernel = format!(
            "flash_attn_tiled_{kv}_d{}_q{rows}",
            if head <= 64 { 64 } else { 128 }
        );
        return lc.run(
            &kernel,
            [qne[1].div_ceil(rows), qne[2], qne[3]],
            (rows * 8) as u32,
            args,
        );
    }
    let args = no_merge(args.i32(f16_acc as i32).ptr(std::ptr::null()).i64(kne[1]));
    let warp = lc.warp_size as usize;
    let warps = if f16_acc { 1 } else { FA_WARPS };
    lc.run(kernel, [rows, 1, 1], (warps * warp) as u32, args)
}

// ---- mixture of experts, norms, reductions, layout --------------------------------------

/// Rows (one warp each) per block of the MUL_MAT_ID kernel (MMID_ROWS in mul_mat_id.hip).
const MMID_ROWS: usize = 4;
/// Longest row ARGSORT / TOP_K sort (SORT_MAX in kernels/reduce.hip).
const SORT_MAX: usize = 4096;

fn launch_mul_mat_id(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (w, x, ids) = (
        node.src(0).unwrap(),
        node.src(1).unwrap(),
        node.src(2).unwrap(),
    );
    let (wne, xne, ine) = (w.ne(), x.ne(), ids.ne());
    let (k, m) = (wne[0], wne[1]);
    let suffix = weight_suffix(w.dtype()).unwrap_or("f32");
    if uses_mmid_q(node) && lc.scratch != 0 {
        return launch_mul_mat_id_q(node, lc);
    }
    // src1 rounded as ggml-cpu rounds it (round_src1 of mul_mat.hip), dense rows (i1, token).
    let (xp, xnb1, xnb2, corr) = match round_src1_to_scratch(&x, w.dtype(), lc)? {
        Some((xp, corr)) => (xp, k * 4, k * 4 * xne[1], corr),
        None => (
            x.data() as *const u8,
            x.nb()[1],
            x.nb()[2],
            std::ptr::null(),
        ),
    };
    let args = Args::default()
        .ptr(w.data())
        .ptr(xp)
        .ptr(ids.data())
        .ptr(node.data())
        .i64(k)
        .i64(m)
        .i64(wne[2])
        .i64(xne[1])
        .i64(w.nb()[1])
        .i64(w.nb()[2])
        .i64(xnb1)
        .i64(xnb2)
        .i64(ids.nb()[0])
        .i64(ids.nb()[1])
        .i64(node.nb()[1])
        .i64(node.nb()[2])
        .ptr(corr);
    if m == 0 || ine[0] == 0 || ine[1] == 0 {
        return Ok(());
    }
    lc.run(
        &format!("mul_mat_id_{suffix}"),
        [m.div_ceil(MMID_ROWS), ine[0], ine[1]],
        (MMID_ROWS * lc.warp_size as usize) as u32,
        args,
    )
}

/// MUL_MAT_ID with integer dots: src1 quantized as ggml-cpu quantizes it (ne11 columns of
/// n_tok batches, once for the gate and up experts that share it), then a block per
/// MV1_ROWS rows of each (slot, token)'s expert.
fn launch_mul_mat_id_q(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (w, x, ids) = (
        node.src(0).unwrap(),
        node.src(1).unwrap(),
        node.src(2).unwrap(),
    );
    let (wne, xne, ine) = (w.ne(), x.ne(), ids.ne());
    let (k, m) = (wne[0], wne[1]);
    let suffix = weight_suffix(w.dtype()).unwrap_or("q4_0");
    let (xq, xds) = ensure_q8(&x, mvq_mode(w.dtype()).unwrap_or(0), lc)?;
    if m == 0 || ine[0] == 0 || ine[1] == 0 {
        return Ok(());
    }
    let args = Args::default()
        .ptr(w.data())
        .ptr(xq as *const u8)
        .ptr(xds as *const u8)
        .ptr(ids.data())
        .ptr(node.data())
        .i64(k)
        .i64(m)
        .i64(wne[2])
        .i64(xne[1])
        .i64(w.nb()[1])
        .i64(w.nb()[2])
        .i64(ids.nb()[0])
        .i64(ids.nb()[1])
        .i64(node.nb()[1])
        .i64(node.nb()[2]);
    lc.run(
        &format!("mul_mat_id_q_{suffix}"),
        [m.div_ceil(MV1_ROWS), ine[0], ine[1]],
        (MV1_WARPS * lc.warp_size as usize) as u32,
        args,
    )
}

fn launch_add_id(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

fn launch_norm(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

fn launch_reduce(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

fn launch_layout(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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

// ---- fused runs of nodes (token generation) --------------------------------------------
//
// A generated token runs a few hundred tiny kernels; each launch costs about as much as the
// work. Runs of nodes that ggml's graphs always build the same way are computed by one
// kernel when the intermediate tensors are needed by nothing else (one use in the graph,
// not a graph output). The decision depends only on the graph, so a captured graph stays
// valid for every graph with the same key (backend.rs).

/// How many nodes use each tensor (as a source, or as the base of a view), by address.
pub struct Uses(std::collections::HashMap<usize, u32>);

impl Uses {
    pub fn of(nodes: &[Tensor]) -> Uses {
        let mut m = std::collections::HashMap::with_capacity(nodes.len() * 2);
        for n in nodes {
            // A source counts as a use of itself and of every tensor it is a view of: the
            // backend's node list holds no view nodes, so a consumer of a view is seen here only.
            let mut count = |t: *const crate::ffi::abi::ggml_tensor| {
                let mut t = t;
                while !t.is_null() {
                    *m.entry(t as usize).or_insert(0) += 1;
                    t = unsafe { (*t).view_src };
                }
            };
            for i in 0..crate::ffi::abi::GGML_MAX_SRC {
                if let Some(s) = n.src(i) {
                    count(s.as_ptr());
                }
            }
            count(n.raw().view_src);
        }
        Uses(m)
    }

    fn count(&self, t: &Tensor) -> u32 {
        self.0.get(&(t.as_ptr() as usize)).copied().unwrap_or(0)
    }
}

/// ggml's GGML_TENSOR_FLAG_OUTPUT: the host reads the tensor after the graph.
const FLAG_OUTPUT: i32 = 2;

/// Whether `t`'s values go to exactly one node and nowhere else.
fn feeds_only_one(t: &Tensor, uses: &Uses) -> bool {
    t.raw().flags & FLAG_OUTPUT == 0 && uses.count(t) == 1
}

fn same(a: &Tensor, b: Option<Tensor>) -> bool {
    b.is_some_and(|b| a.as_ptr() == b.as_ptr())
}

fn dense_f32(t: &Tensor) -> bool {
    t.dtype() == GgmlType::F32 && t.is_contiguous()
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

/// A Hadamard-hinted MUL_MAT whose output the next node, an integer-dot product, reads
/// (llama's rotation of attention's output before the output projection, quantized caches):
/// the transform also quantizes its output for that product, so it needs no quantize launch.
fn try_fused_hadamard_mv(nodes: &[Tensor], i: usize, lc: &LaunchCtx) -> ApiResult<Option<usize>> {
    let (Some(h), Some(mm)) = (nodes.get(i), nodes.get(i + 1)) else {
        return Ok(None);
    };
    let Some(n) = hadamard_len(h) else {
        return Ok(None);
    };
    let Some(x) = mm.src(1) else { return Ok(None) };
    let nel = h.nelements();
    let reads_h = mm.op() == op::MUL_MAT
        && uses_mvq(mm)
        && supports_mul_mat(mm)
        && x.data() == h.data()
        && x.nelements() == nel;
    let mode0 = mm.src(0).and_then(|w| mvq_mode(w.dtype())) == Some(0);
    if lc.scratch == 0
        || !reads_h
        || !mode0
        || !dense_f32(h)
        || !dense_f32(&x)
        || n % 32 != 0
        || q8_region(nel) > lc.scratch_len
    {
        return Ok(None);
    }
    launch_hadamard(h, n, Some(0), lc)?;
    lc.note_written(h);
    let k = x.ne()[0];
    lc.q8
        .set(Some(Q8Src::rows(0, h.data() as usize, k, nel / k, 0)));
    Ok(Some(1))
}

/// [ADD ->] RMS_NORM [-> MUL by a weight row] [-> quantized for the next node, a matrix-vector
/// product of it]: one kernel (fused_rms_norm). The ADD's sum is still written (the residual
/// stream needs it); the norm's output only when no MUL follows.
fn try_fused_norm(
    nodes: &[Tensor],
    i: usize,
    uses: &Uses,
    lc: &LaunchCtx,
) -> ApiResult<Option<usize>> {
    let mut j = i;
    let add = (nodes[i].op() == op::ADD).then_some(nodes[i]);
    if add.is_some() {
        j += 1;
    }
    let Some(norm) = nodes.get(j).copied() else {
        return Ok(None);
    };
    if norm.op() != op::RMS_NORM || !supports_rms_norm(&norm) || !dense_f32(&norm) {
        return Ok(None);
    }
    let x = norm.src(0).unwrap();
    if !dense_f32(&x) {
        return Ok(None);
    }
    let mut b: Option<Tensor> = None;
    if let Some(a) = add {
        let (Some(a0), Some(a1)) = (a.src(0), a.src(1)) else {
            return Ok(None);
        };
        let ok = same(&a, Some(x))
            && dense_f32(&a0)
            && dense_f32(&a1)
            && a0.same_shape(&a)
            && a1.same_shape(&a);
        if !ok {
            return Ok(None);
        }
        b = Some(a1);
    }
    j += 1;
    let ne0 = norm.ne()[0];
    let mut out = norm;
    let mut w: Option<Tensor> = None;
    if let Some(m) = nodes.get(j).copied() {
        let wt = m.src(1);
        let w_ok = wt.is_some_and(|t| dense_f32(&t) && t.ne() == [ne0, 1, 1, 1]);
        if m.op() == op::MUL
            && same(&norm, m.src(0))
            && w_ok
            && dense_f32(&m)
            && m.same_shape(&norm)
            && feeds_only_one(&norm, uses)
        {
            w = wt;
            out = m;
            j += 1;
        }
    }
    let mut qmode = -1;
    if let Some(mm) = nodes.get(j) {
        if lc.scratch != 0 && uses_mvq(mm) && same(&out, mm.src(1)) {
            qmode = mvq_mode(mm.src(0).unwrap().dtype()).unwrap_or(-1);
        }
    }
    if add.is_none() && w.is_none() && qmode < 0 {
        return Ok(None); // a lone RMS_NORM: nothing to gain
    }
    let a_in = match add {
        Some(a) => a.src(0).unwrap(),
        None => x,
    };
    let xq = lc.scratch as usize;
    let xds = xq + q8_ds_offset(out.nelements());
    let args = Args::default()
        .ptr(a_in.data())
        .opt_ptr(b)
        .opt_ptr(add)
        .opt_ptr(w)
        .ptr(out.data())
        .ptr(xq as *const u8)
        .ptr(xds as *const u8)
        .i32(qmode)
        .i64(ne0)
        .f32(norm.param_f32(0));
    let rows = norm.nrows();
    if rows > 0 {
        // As many threads as rms_norm_f32 takes: the same order of additions.
        lc.run("fused_rms_norm", [rows, 1, 1], norm_block(ne0), args)?;
    }
    for n in &nodes[i..j] {
        lc.note_written(n);
    }
    if qmode >= 0 {
        lc.q8.set(Q8Src::of(0, &out, qmode));
    }
    Ok(Some(j - i))
}

/// MUL_MAT(w, x) -> ADD(residual) -> RMS_NORM -> MUL(weight) for one column, when what reads the
/// MUL's output is one fused kernel that applies a pending norm (the Q/K/V launch or the gate/up
/// launch right after): one kernel (mul_mat_vec_q_add_norm) writes the ADD's sum and quantizes
/// sum * weight for that kernel, which divides by the norm itself. llama's graph has this run
/// twice a layer (output projection -> FFN norm, down projection -> next layer's attention
/// norm), so the norm costs no launch there. The product, the norm and the MUL's output are not
/// written: each must feed only the node after it (the MUL: only that kernel's products).
/// ROCMFORGE_GPU_ADD_NORM=0 turns this fusion off, for measuring.
fn try_fused_mv_add_norm(
    nodes: &[Tensor],
    i: usize,
    uses: &Uses,
    lc: &LaunchCtx,
) -> ApiResult<Option<usize>> {
    static ON: once_cell::sync::OnceCell<bool> = once_cell::sync::OnceCell::new();
    if !*ON.get_or_init(|| std::env::var("ROCMFORGE_GPU_ADD_NORM").map_or(true, |v| v != "0")) {
        return Ok(None);
    }
    let Some(&[mm, add, norm, mul]) = nodes
        .get(i..i + 4)
        .map(|s| <[Tensor; 4]>::try_from(s).unwrap())
        .as_ref()
    else {
        return Ok(None);
    };
    if lc.scratch == 0
        || mm.op() != op::MUL_MAT
        || add.op() != op::ADD
        || norm.op() != op::RMS_NORM
        || mul.op() != op::MUL
    {
        return Ok(None);
    }
    let (w, x) = (mm.src(0).unwrap(), mm.src(1).unwrap());
    let m = w.ne()[1];
    let col = [m, 1, 1, 1];
    let mm_ok = uses_mvq(&mm)
        && supports_mul_mat(&mm)
        && dense_f32(&mm)
        && mm.ne() == col
        && w.ne()[2] == 1
        && w.ne()[3] == 1;
    if !mm_ok || m % 32 != 0 || !feeds_only_one(&mm, uses) {
        return Ok(None);
    }
    // The residual: the ADD's other operand (either order: float addition commutes).
    let res = match (add.src(0), add.src(1)) {
        (Some(a), Some(b)) if same(&mm, Some(a)) => b,
        (Some(a), Some(b)) if same(&mm, Some(b)) => a,
        _ => return Ok(None),
    };
    let col_f32 = |t: &Tensor| dense_f32(t) && t.ne() == col;
    if !col_f32(&add)
        || !col_f32(&res)
        || !same(&add, norm.src(0))
        || !supports_rms_norm(&norm)
        || !col_f32(&norm)
    {
        return Ok(None);
    }
    let Some(nw) = mul.src(1) else {
        return Ok(None);
    };
    if !same(&norm, mul.src(0)) || !col_f32(&nw) || !col_f32(&mul) || !feeds_only_one(&norm, uses) {
        return Ok(None);
    }
    // What reads the MUL's output: exactly one fused kernel's products, of 32-value blocks.
    let j = i + 4;
    let reader_mode = |k: usize| {
        nodes
            .get(k)
            .and_then(|n| n.src(0))
            .and_then(|w| mvq_mode(w.dtype()))
    };
    let (products, taken) = if let Some(n) = try_fused_qkv(nodes, j, uses, lc, true)? {
        (3, n)
    } else if let Some(n) = try_fused_glu(nodes, j, uses, lc, true)? {
        (2, n)
    } else {
        return Ok(None);
    };
    let reads_mul = nodes[j..j + taken]
        .iter()
        .filter(|n| n.op() == op::MUL_MAT && same(&mul, n.src(1)))
        .count();
    if reader_mode(j) != Some(0)
        || reads_mul != products
        || mul.raw().flags & FLAG_OUTPUT != 0
        || uses.count(&mul) != products as u32
    {
        return Ok(None);
    }
    // Scratch: the product's own quantized input where ensure_q8 has it, the output beside it
    // (where it does not fit, the product runs unfused on the same quantized input).
    let k = w.ne()[0];
    let (xq, xds) = ensure_q8(&x, mvq_mode(w.dtype()).unwrap_or(0), lc)?;
    let out_at = q8_out_at(xq - lc.scratch as usize, k, m);
    if out_at + q8_region(m) > lc.scratch_len {
        return Ok(None);
    }
    let oq = lc.scratch as usize + out_at;
    let blocks = m / 32;
    let args = Args::default()
        .ptr(w.data())
        .ptr(xq as *const u8)
        .ptr(xds as *const u8)
        .ptr(res.data())
        .ptr(add.data())
        .ptr(nw.data())
        .ptr(oq as *const u8)
        .ptr((oq + q8_ds_offset(m)) as *const u8)
        .ptr((oq + q8_ss_offset(m)) as *const u8)
        .i64(k)
        .i64(w.nb()[1])
        .i64(glu_prefetch_rows(m, w.nb()[1]));
    let suffix = weight_suffix(w.dtype()).unwrap_or("q4_0");
    static FORCED: once_cell::sync::OnceCell<Option<usize>> = once_cell::sync::OnceCell::new();
    let warps = rows32_warps(
        blocks,
        lc,
        *FORCED.get_or_init(|| env_count("ROCMFORGE_GPU_ADD_NORM_WARPS", 32)),
    );
    lc.run(
        &format!("mul_mat_vec_q_add_norm_{suffix}"),
        [blocks, 1, 1],
        (warps * lc.warp_size as usize) as u32,
        args,
    )?;
    for n in &nodes[i..j] {
        lc.note_written(n);
    }
    let pending = PendingNorm {
        ssq_at: out_at + q8_ss_offset(m),
        eps_bits: norm.param_f32(0).to_bits(),
    };
    lc.q8.set(Some(Q8Src {
        norm: Some(pending),
        ..Q8Src::rows(out_at, mul.data() as usize, m, 1, 0)
    }));
    Ok(Some(4))
}

/// Warps per block of the 32-rows-a-block kernels (mul_mat_vec_q_glu_q8,
/// mul_mat_vec_q_add_norm; the warps take rows in turn). Their 64 registers a thread leave room
/// for 1024 threads on a compute unit: all the blocks are made to fit at once (no last partial
/// wave) while each warp still has a row. On an H100, 8B-class gate/up (448 blocks): one
/// 1024-thread block per SM ran 3.4 waves at 53% of DRAM bandwidth, each block's loads idle
/// while it reduced and quantized. `forced`: the launch's measuring override
/// (ROCMFORGE_GPU_GLU_WARPS, ROCMFORGE_GPU_ADD_NORM_WARPS).
fn rows32_warps(blocks: usize, lc: &LaunchCtx, forced: Option<usize>) -> usize {
    let max = (1024 / lc.warp_size as usize).clamp(1, 32);
    if let Some(w) = forced {
        return w.min(max);
    }
    let per_cu = blocks.div_ceil(lc.compute_units.max(1) as usize).max(1);
    (max / per_cu).clamp(4.min(max), max)
}

/// Rows of its 32 (of both matrices, `pair_bytes` a row of the two) that each gate/up block
/// prefetches into L2 before it waits: all of them while the whole launch's prefetch stays
/// within GLU_PREFETCH_BYTES, fewer beyond. The add+norm launch (one matrix, 32 rows a block)
/// takes the same budget. On an H100 the 8B-class gate/up (66 MB, all 32
/// rows prefetched into its 50 MB L2) read 83 MB from memory, 66 MB with this budget (ncu: 38.7
/// → 33 µs; tg64 within noise to +3%). ROCMFORGE_GPU_GLU_PF_MB=N overrides the budget, for measuring.
fn glu_prefetch_rows(m: usize, pair_bytes: usize) -> usize {
    static V: once_cell::sync::OnceCell<Option<usize>> = once_cell::sync::OnceCell::new();
    let budget = V
        .get_or_init(|| {
            std::env::var("ROCMFORGE_GPU_GLU_PF_MB")
                .ok()?
                .parse::<usize>()
                .ok()
        })
        .map_or(GLU_PREFETCH_BYTES, |mb| mb << 20);
    glu_prefetch_rows_within(budget, m, pair_bytes)
}
fn glu_prefetch_rows_within(budget: usize, m: usize, pair_bytes: usize) -> usize {
    let per_block = budget / (m / 32).max(1);
    (per_block / pair_bytes.max(1)).min(32)
}
const GLU_PREFETCH_BYTES: usize = 24 << 20;

/// MUL_MAT(gate, x), MUL_MAT(up, x), GLU(gate out, up out) for one column x: one kernel
/// that reads both weight rows and writes act(gate) * up. `check`: only whether it would fuse
/// (nothing launched).
fn try_fused_glu(
    nodes: &[Tensor],
    i: usize,
    uses: &Uses,
    lc: &LaunchCtx,
    check: bool,
) -> ApiResult<Option<usize>> {
    let (Some(g), Some(u), Some(glu)) = (nodes.get(i), nodes.get(i + 1), nodes.get(i + 2)) else {
        return Ok(None);
    };
    if g.op() != op::MUL_MAT || u.op() != op::MUL_MAT || glu.op() != op::GLU || lc.scratch == 0 {
        return Ok(None);
    }
    if !uses_mvq(g)
        || !uses_mvq(u)
        || !supports_mul_mat(g)
        || !supports_mul_mat(u)
        || !supports_glu(glu)
    {
        return Ok(None);
    }
    let (wg, x, wu) = (g.src(0).unwrap(), g.src(1).unwrap(), u.src(0).unwrap());
    let Some(code) = act_code_glu(glu.param_i32(0)) else {
        return Ok(None);
    };
    let shapes_ok = same(&x, u.src(1))
        && wg.dtype() == wu.dtype()
        && wg.ne() == wu.ne()
        && wg.ne()[2] == 1
        && wg.ne()[3] == 1
        && x.ne()[1..] == [1, 1, 1]
        && dense_f32(glu)
        && glu.ne() == [wg.ne()[1], 1, 1, 1];
    let wiring_ok = same(g, glu.src(0)) && same(u, glu.src(1)) && glu.param_i32(1) == 0;
    if !shapes_ok || !wiring_ok || !feeds_only_one(g, uses) || !feeds_only_one(u, uses) {
        return Ok(None);
    }
    if check {
        return Ok(Some(3));
    }
    let xo = ensure_q8_norm(&x, mvq_mode(wg.dtype()).unwrap_or(0), lc)?;
    let (k, m) = (wg.ne()[0], wg.ne()[1]);
    // When the next node is a matrix-vector product of the GLU's output with 32-value blocks,
    // the kernel quantizes its output too (32 rows per block), in scratch the input leaves free.
    let in_at = xo.xq - lc.scratch as usize;
    let out_at = q8_out_at(in_at, k, m);
    let next_q8 = nodes.get(i + 3).is_some_and(|mm| {
        uses_mvq(mm)
            && same(glu, mm.src(1))
            && mvq_mode(mm.src(0).unwrap().dtype()) == Some(0)
            && m % 32 == 0
    }) && out_at + q8_region(m) <= lc.scratch_len;
    let oq = lc.scratch as usize + out_at;
    let ods = oq + q8_ds_offset(m);
    let args = Args::default()
        .ptr(wg.data())
        .ptr(wu.data())
        .ptr(xo.xq as *const u8)
        .ptr(xo.xds as *const u8)
        .ptr(glu.data())
        .ptr(if next_q8 {
            oq as *const u8
        } else {
            std::ptr::null()
        })
        .ptr(if next_q8 {
            ods as *const u8
        } else {
            std::ptr::null()
        })
        .i32(code)
        .i64(k)
        .i64(m)
        .i64(wg.nb()[1])
        .i64(wu.nb()[1])
        .i64(glu_prefetch_rows(m, wg.nb()[1] + wu.nb()[1]))
        .ptr(xo.ssq as *const u8)
        .f32(xo.eps);
    let suffix = weight_suffix(wg.dtype()).unwrap_or("q4_0");
    if next_q8 {
        let blocks = m / 32;
        static FORCED: once_cell::sync::OnceCell<Option<usize>> = once_cell::sync::OnceCell::new();
        let warps = rows32_warps(
            blocks,
            lc,
            *FORCED.get_or_init(|| env_count("ROCMFORGE_GPU_GLU_WARPS", 32)),
        );
        lc.run(
            &format!("mul_mat_vec_q_glu_q8_{suffix}"),
            [blocks, 1, 1],
            (warps * lc.warp_size as usize) as u32,
            args,
        )?;
    } else {
        lc.run(
            &format!("mul_mat_vec_q_glu_{suffix}"),
            [m.div_ceil(MV_ROWS), 1, 1],
            (MV_ROWS * lc.warp_size as usize) as u32,
            args,
        )?;
    }
    for n in &nodes[i..i + 3] {
        lc.note_written(n);
    }
    if next_q8 {
        lc.q8.set(Q8Src::of(out_at, glu, 0));
    }
    Ok(Some(3))
}

/// Two adjacent one-column products of one activation with weights of one type (attention's V
/// and K): one launch (mul_mat_vec_q1_pair, the one-column kernel's default shape), one kernel
/// less per layer. Not taken under ROCMFORGE_GPU_MV1 (shape sweeps) or for the tall shapes.
fn try_fused_mv_pair(nodes: &[Tensor], i: usize, lc: &LaunchCtx) -> ApiResult<Option<usize>> {
    let (Some(a), Some(b)) = (nodes.get(i), nodes.get(i + 1)) else {
        return Ok(None);
    };
    if a.op() != op::MUL_MAT
        || b.op() != op::MUL_MAT
        || lc.scratch == 0
        || !uses_mvq(a)
        || !uses_mvq(b)
    {
        return Ok(None);
    }
    if !supports_mul_mat(a) || !supports_mul_mat(b) {
        return Ok(None);
    }
    let (wa, x, wb) = (a.src(0).unwrap(), a.src(1).unwrap(), b.src(0).unwrap());
    let single = |w: &Tensor| w.ne()[2] == 1 && w.ne()[3] == 1;
    let ok = same(&x, b.src(1))
        && wa.dtype() == wb.dtype()
        && wa.ne()[0] == wb.ne()[0]
        && mv1_shape().is_none()
        && !short_tall(wa.dtype(), wa.ne()[0], wa.ne()[1])
        && !short_tall(wb.dtype(), wb.ne()[0], wb.ne()[1])
        && single(&wa)
        && single(&wb)
        && x.ne()[1..] == [1, 1, 1]
        && dense_f32(a)
        && dense_f32(b)
        && !overlap(a, b)
        && !overlap(a, &x)
        && !overlap(b, &x);
    if !ok {
        return Ok(None);
    }
    let (xq, xds) = ensure_q8(&x, mvq_mode(wa.dtype()).unwrap_or(0), lc)?;
    let (ma, mb) = (wa.ne()[1], wb.ne()[1]);
    let args = Args::default()
        .ptr(wa.data())
        .ptr(wb.data())
        .ptr(xq as *const u8)
        .ptr(xds as *const u8)
        .ptr(a.data())
        .ptr(b.data())
        .i64(wa.ne()[0])
        .i64(ma)
        .i64(mb)
        .i64(wa.nb()[1])
        .i64(wb.nb()[1]);
    let suffix = weight_suffix(wa.dtype()).unwrap_or("q4_0");
    let threads = (MV1_WARPS * lc.warp_size as usize).min(MV1_MAX_THREADS) as u32;
    lc.run(
        &format!("mul_mat_vec_q1_pair_{suffix}"),
        [ma.div_ceil(MV1_ROWS) + mb.div_ceil(MV1_ROWS), 1, 1],
        threads,
        args,
    )?;
    lc.note_written(a);
    lc.note_written(b);
    Ok(Some(2))
}

/// llama's attention input for one token, as llama builds it: MUL_MAT q, ROPE q [, its
/// Hadamard rotation], the K and V products and ROPE k [, the rotations of roped K and of V]
/// (in either of llama's orders), SET_ROWS k (cache), SET_ROWS v (cache). The rotations come
/// with quantized caches (llama.cpp's attn_inp_k_rot / attn_inp_v_rot).
#[derive(Clone, Copy)]
struct QkvNodes<'a> {
    mq: Tensor<'a>,
    rq: Tensor<'a>,
    hq: Option<Tensor<'a>>,
    mk: Tensor<'a>,
    rk: Tensor<'a>,
    hk: Option<Tensor<'a>>,
    mv: Tensor<'a>,
    hv: Option<Tensor<'a>>,
    sk: Tensor<'a>,
    sv: Tensor<'a>,
    len: usize,
}

/// Whether `n`'s source `i` is a view of `t`'s data (a reshape of it).
fn reads(n: &Tensor, i: usize, t: &Tensor) -> bool {
    n.src(i).is_some_and(|a| a.data() == t.data())
}

fn qkv_nodes<'a>(nodes: &[Tensor<'a>], i: usize) -> Option<QkvNodes<'a>> {
    let (mq, rq) = (*nodes.get(i)?, *nodes.get(i + 1)?);
    if mq.op() != op::MUL_MAT || rq.op() != op::ROPE {
        return None;
    }
    let mut j = i + 2;
    let hq = nodes
        .get(j)
        .copied()
        .filter(|h| hadamard_len(h).is_some() && reads(h, 1, &rq));
    j += hq.is_some() as usize;
    // Up to the cache writes: two products, ROPE k, and at most two rotations.
    let (mut prods, mut rots, mut rk) = (Vec::new(), Vec::new(), None);
    while let Some(n) = nodes.get(j).copied() {
        match n.op() {
            op::SET_ROWS => break,
            op::MUL_MAT if hadamard_len(&n).is_some() => rots.push(n),
            op::MUL_MAT => prods.push(n),
            op::ROPE if rk.is_none() => rk = Some(n),
            _ => return None,
        }
        j += 1;
        if prods.len() > 2 || rots.len() > 2 {
            return None;
        }
    }
    let (sk, sv) = (*nodes.get(j)?, *nodes.get(j + 1)?);
    let rk = rk?;
    if prods.len() != 2 || sk.op() != op::SET_ROWS || sv.op() != op::SET_ROWS {
        return None;
    }
    // K is the product ROPE(k) reads.
    let (mk, mv) = if reads(&rk, 0, &prods[1]) {
        (prods[1], prods[0])
    } else {
        (prods[0], prods[1])
    };
    let hk = rots.iter().copied().find(|h| reads(h, 1, &rk));
    let hv = rots.iter().copied().find(|h| reads(h, 1, &mv));
    if rots.len() != hk.is_some() as usize + hv.is_some() as usize || hq.is_some() != hk.is_some() {
        return None;
    }
    Some(QkvNodes {
        mq,
        rq,
        hq,
        mk,
        rk,
        hk,
        mv,
        hv,
        sk,
        sv,
        len: j + 2 - i,
    })
}

/// A rotation that rot_qkv takes: the transform of `input`'s values (F32, dense) in chunks
/// of n (a multiple of 32, at most ROT_QKV_MAX) into a dense F32 tensor; returns n.
fn rotation_len(h: &Tensor, input: &Tensor) -> Option<usize> {
    let n = hadamard_len(h)?;
    let x = h.src(1)?;
    let ok = n % 32 == 0
        && n <= ROT_QKV_MAX
        && dense_f32(h)
        && dense_f32(&x)
        && h.nelements() == input.nelements()
        && input.nelements() % n == 0;
    ok.then_some(n)
}

/// Longest chunk of rot_qkv (ROT_QKV_MAX in fused.hip).
const ROT_QKV_MAX: usize = 256;

/// The attention input of one token (qkv_nodes) in one launch (mul_mat_vec_q1_qkv) that
/// writes ROPE(q) and the two cache rows. Q, K, V and ROPE(k) are not written, so each must
/// feed only the node after it; rope NORMAL, or NEOX over whole heads. A quantized cache row
/// (Q8_0, Q4_0: a block needs 32 values, more than a block of the launch has) is written as F32
/// into the SET_ROWS's source (ROPE(k) / V's product) and quantized into the cache by the
/// SET_ROWS kernel after it. With the rotations of quantized caches, roped Q and K and V go as
/// F32 into the rotations' outputs instead, and one more launch (rot_qkv) transforms them and
/// writes the cache rows: two launches where llama's graph has ten nodes.
/// `check`: only whether it would fuse (nothing launched).
fn try_fused_qkv(
    nodes: &[Tensor],
    i: usize,
    uses: &Uses,
    lc: &LaunchCtx,
    check: bool,
) -> ApiResult<Option<usize>> {
    if lc.scratch == 0 || mv1_shape().is_some() {
        return Ok(None);
    }
    let Some(QkvNodes {
        mq,
        rq,
        hq,
        mk,
        rk,
        hk,
        mv,
        hv,
        sk,
        sv,
        len,
    }) = qkv_nodes(nodes, i)
    else {
        return Ok(None);
    };
    let mm_ok =
        |m: &Tensor| m.op() == op::MUL_MAT && uses_mvq(m) && supports_mul_mat(m) && dense_f32(m);
    if !mm_ok(&mq) || !mm_ok(&mk) || !mm_ok(&mv) {
        return Ok(None);
    }
    let (wq, wk, wv, x) = (
        mq.src(0).unwrap(),
        mk.src(0).unwrap(),
        mv.src(0).unwrap(),
        mq.src(1).unwrap(),
    );
    let single = |w: &Tensor| {
        w.ne()[2] == 1 && w.ne()[3] == 1 && w.dtype() == wq.dtype() && w.ne()[0] == wq.ne()[0]
    };
    if !single(&wq)
        || !single(&wk)
        || !single(&wv)
        || x.ne()[1..] != [1, 1, 1]
        || !same(&x, mk.src(1))
        || !same(&x, mv.src(1))
    {
        return Ok(None);
    }
    let (mq_rows, mk_rows, mv_rows) = (wq.ne()[1], wk.ne()[1], wv.ne()[1]);
    if short_tall(wq.dtype(), wq.ne()[0], mq_rows)
        || mq_rows % 2 != 0
        || mk_rows % 2 != 0
        || mv_rows % 2 != 0
    {
        return Ok(None);
    }
    // The ROPEs: of q's and k's products, one token, same positions and parameters.
    let ne0 = rq.ne()[0];
    let n_dims = rq.param_i32(1) as usize;
    let neox = rq.param_i32(2) == ROPE_NEOX;
    let rope_ok = |r: &Tensor, m: &Tensor| {
        rope_fusable(r)
            && r.src(0)
                .is_some_and(|a| a.data() == m.data() && a.is_contiguous())
            && r.ne()[2] == 1
            && r.nelements() == m.nelements()
            && r.param_i32(15) == 0
    };
    if !rope_ok(&rq, &mq)
        || !rope_ok(&rk, &mk)
        || !same_rope(&rq, &rk)
        || ne0 % 2 != 0
        || (neox && n_dims != ne0)
    {
        return Ok(None);
    }
    // The rotations: Q's and K's of one length (llama's K matrix), V's of its own.
    let nk = match (hq, hk) {
        (Some(hq), Some(hk)) => match (rotation_len(&hq, &rq), rotation_len(&hk, &rk)) {
            (Some(a), Some(b)) if a == b => Some(a),
            _ => return Ok(None),
        },
        _ => None,
    };
    let nv = match hv {
        Some(hv) => match rotation_len(&hv, &mv) {
            Some(n) => Some(n),
            None => return Ok(None),
        },
        None => None,
    };
    // The cache rows: k's roped (rotated) rows and v's (rotated) rows, one token each, dense
    // rows; V's row, or (llama without flash attention: the V cache transposed) one row per value.
    let k_src = hk.unwrap_or(rk);
    let v_src = hv.unwrap_or(mv);
    let k_ok = if hk.is_some() {
        set_rows_quant(&sk, mk_rows)
    } else {
        set_rows_plain(&sk, mk_rows, 1) || set_rows_quant(&sk, mk_rows)
    };
    let v_per_value = hv.is_none() && set_rows_per_value(&sv, mv_rows);
    let v_ok = if hv.is_some() {
        set_rows_quant(&sv, mv_rows)
    } else {
        set_rows_plain(&sv, mv_rows, 1) || v_per_value || set_rows_quant(&sv, mv_rows)
    };
    if !k_ok || !v_ok || !reads(&sk, 0, &k_src) || !reads(&sv, 0, &v_src) {
        return Ok(None);
    }
    // Nothing else reads what is not written.
    let mut unwritten = vec![mq, mk, mv, rk];
    unwritten.extend(hk);
    unwritten.extend(hv);
    if hq.is_some() {
        unwritten.push(rq);
    }
    if unwritten.iter().any(|t| !feeds_only_one(t, uses)) {
        return Ok(None);
    }
    // What is written (ROPE(q) or its rotation, the two cache rows, the F32 rows staged for a
    // later launch) overlaps nothing that is read, nor each other.
    let pos = rq.src(1).unwrap();
    let reads_of = [Some(pos), rq.src(2), sk.src(1), sv.src(1)];
    let (k_staged, v_staged) = (
        quant_dst(sk.dtype()).is_some(),
        quant_dst(sv.dtype()).is_some(),
    );
    let mut writes = vec![hq.unwrap_or(rq), sk, sv];
    writes.extend(k_staged.then_some(k_src));
    writes.extend(v_staged.then_some(v_src));
    for (n, w) in writes.iter().enumerate() {
        if reads_of.iter().flatten().any(|r| overlap(w, r))
            || writes[n + 1..].iter().any(|o| overlap(w, o))
        {
            return Ok(None);
        }
    }
    if check {
        return Ok(Some(len));
    }
    let xo = ensure_q8_norm(&x, mvq_mode(wq.dtype()).unwrap_or(0), lc)?;
    let (theta_scale, corr0, corr1) = rope_consts(&rq);
    let (ki, vi) = (sk.src(1).unwrap(), sv.src(1).unwrap());
    let args = Args::default()
        .ptr(wq.data())
        .ptr(wk.data())
        .ptr(wv.data())
        .ptr(xo.xq as *const u8)
        .ptr(xo.xds as *const u8)
        .i64(wq.ne()[0])
        .i64(mq_rows)
        .i64(mk_rows)
        .i64(mv_rows)
        .i64(wq.nb()[1])
        .i64(wk.nb()[1])
        .i64(wv.nb()[1])
        .ptr(hq.unwrap_or(rq).data())
        .qkv_cache(&sk, &ki)
        .qkv_cache(&sv, &vi)
        .i32(v_per_value as i32)
        .i64(vi.nb()[0])
        .ptr(pos.data())
        .opt_ptr(rq.src(2))
        .i64(ne0)
        .i32(n_dims as i32)
        .i32(neox as i32)
        .f32(theta_scale)
        .f32(rq.param_f32(6))
        .f32(rq.param_f32(7))
        .f32(rq.param_f32(8))
        .f32(corr0)
        .f32(corr1)
        .ptr(xo.ssq as *const u8)
        .f32(xo.eps);
    let suffix = weight_suffix(wq.dtype()).unwrap_or("q4_0");
    let threads =
        (qkv_warps(wq.dtype(), wq.ne()[0]) * lc.warp_size as usize).min(MV1_MAX_THREADS) as u32;
    lc.run(
        &format!("mul_mat_vec_q1_qkv_{suffix}"),
        [(mq_rows + mk_rows + mv_rows) / 2, 1, 1],
        threads,
        args,
    )?;
    if nk.is_some() || nv.is_some() {
        // Row counts of what is rotated (0: that part is not); a length for each all the same.
        let (rq_rows, rk_rows, rv_rows) = (
            nk.map_or(0, |_| mq_rows),
            nk.map_or(0, |_| mk_rows),
            nv.map_or(0, |_| mv_rows),
        );
        let (nk_, nv_) = (nk.unwrap_or(32), nv.unwrap_or(32));
        let cache = |a: Args, set: &Tensor, idx: &Tensor| {
            a.ptr(set.data())
                .ptr(idx.data())
                .i32((idx.dtype() == GgmlType::I64) as i32)
                .i32(quant_dst(set.dtype()).map_or(0, |(dt, _)| dt))
                .i64(set.ne()[1])
                .i64(set.nb()[1])
        };
        let args = Args::default()
            .opt_ptr(hq)
            .i64(rq_rows)
            .opt_ptr(hk)
            .i64(rk_rows)
            .i64(nk_)
            .f32(hadamard_scale(nk_))
            .opt_ptr(hv)
            .i64(rv_rows)
            .i64(nv_)
            .f32(hadamard_scale(nv_));
        let args = cache(cache(args, &sk, &ki), &sv, &vi);
        let threads = (nk_.max(nv_) / 2).clamp(lc.warp_size as usize, 128);
        lc.run(
            "rot_qkv",
            [(rq_rows + rk_rows) / nk_ + rv_rows / nv_, 1, 1],
            threads as u32,
            args,
        )?;
    }
    for (staged, rotated, set) in [(k_staged, nk.is_some(), &sk), (v_staged, nv.is_some(), &sv)] {
        if staged && !rotated {
            launch_set_rows(set, lc)?;
        }
    }
    for n in &nodes[i..i + len] {
        lc.note_written(n);
    }
    Ok(Some(len))
}

/// Warps per block of mul_mat_vec_q1_qkv (two rows a block): MV1_WARPS, or fewer where rows
/// are long enough to give every lane 4 parts (the unroll) with fewer warps. On an H100,
/// 8B-class Q/K/V (K = 4096, 3072 blocks of 4 warps, one Q4_0 block a lane): 12.8 µs, 1.1
/// TB/s. ROCMFORGE_GPU_QKV_WARPS=N (1..8) overrides, for measuring.
fn qkv_warps(t: GgmlType, k: usize) -> usize {
    static FORCED: once_cell::sync::OnceCell<Option<usize>> = once_cell::sync::OnceCell::new();
    if let Some(w) = *FORCED.get_or_init(|| env_count("ROCMFORGE_GPU_QKV_WARPS", 8)) {
        return w;
    }
    let parts = k / t.block_size() * mvq_parts_per_block(t);
    let w = parts / (MV1_UNROLL * 32);
    if w == 0 {
        MV1_WARPS
    } else {
        w.min(MV1_WARPS)
    }
}

/// Parts a lane takes per weight block in the integer-dot kernels (NSUB in mmvq.hip).
fn mvq_parts_per_block(t: GgmlType) -> usize {
    match t {
        GgmlType::Q4_1 | GgmlType::Q5_1 => 2,
        GgmlType::Q4_K | GgmlType::Q6_K => 16,
        _ => 1,
    }
}

fn overlap(a: &Tensor, b: &Tensor) -> bool {
    let (a0, b0) = (a.data() as usize, b.data() as usize);
    a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes()
}

/// A ROPE that fused_rope_kv computes: F32 rows, normal or neox mode, one sequence (ne3 = 1).
fn rope_fusable(r: &Tensor) -> bool {
    let Some(a) = r.src(0) else { return false };
    r.op() == op::ROPE
        && supports_rope(r)
        && r.dtype() == GgmlType::F32
        && a.dtype() == GgmlType::F32
        && matches!(r.param_i32(2), ROPE_NORMAL | ROPE_NEOX)
        && r.ne()[3] == 1
        && r.is_contiguous()
}

/// Two ROPEs with the same positions, factors and parameters (Q and K of one layer).
fn same_rope(a: &Tensor, b: &Tensor) -> bool {
    let pos = |t: &Tensor| t.src(1).map(|p| p.data() as usize);
    let ff = |t: &Tensor| t.src(2).map(|p| p.data() as usize);
    pos(a) == pos(b)
        && ff(a) == ff(b)
        && a.raw().op_params == b.raw().op_params
        && a.ne()[0] == b.ne()[0]
        && a.ne()[2] == b.ne()[2]
}

/// Row ids of a SET_ROWS that fused_rope_kv reads: one per token, dense.
fn row_ids_ok(idx: &Tensor, n_tok: usize) -> bool {
    matches!(idx.dtype(), GgmlType::I32 | GgmlType::I64) && idx.ne() == [n_tok, 1, 1, 1]
}

/// A SET_ROWS of `n_tok` dense F32 rows of `n` values into a 2-D F16 / F32 tensor.
fn set_rows_plain(s: &Tensor, n: usize, n_tok: usize) -> bool {
    let (Some(a), Some(idx)) = (s.src(0), s.src(1)) else {
        return false;
    };
    s.op() == op::SET_ROWS
        && supports_set_rows(s)
        && matches!(s.dtype(), GgmlType::F16 | GgmlType::F32)
        && s.ne()[0] == n
        && s.ne()[2] == 1
        && s.ne()[3] == 1
        && s.nb()[0] == s.dtype().type_size()
        && a.dtype() == GgmlType::F32
        && a.ne() == [n, n_tok, 1, 1]
        && a.nb()[0] == 4
        && row_ids_ok(&idx, n_tok)
}

/// A SET_ROWS of one dense F32 row of `n` values (whole blocks) into a 2-D Q8_0 or Q4_0 tensor.
fn set_rows_quant(s: &Tensor, n: usize) -> bool {
    let (Some(a), Some(idx)) = (s.src(0), s.src(1)) else {
        return false;
    };
    s.op() == op::SET_ROWS
        && supports_set_rows(s)
        && matches!(s.dtype(), GgmlType::Q8_0 | GgmlType::Q4_0)
        && s.ne()[0] == n
        && n % 32 == 0
        && s.ne()[2] == 1
        && s.ne()[3] == 1
        && a.dtype() == GgmlType::F32
        && a.ne() == [n, 1, 1, 1]
        && a.nb()[0] == 4
        && row_ids_ok(&idx, 1)
}

/// A SET_ROWS of `n` F32 values (a dense [1, n] view), each into its own row (of one value)
/// of a 2-D F16 / F32 tensor: ids [n], dense.
fn set_rows_per_value(s: &Tensor, n: usize) -> bool {
    let (Some(a), Some(idx)) = (s.src(0), s.src(1)) else {
        return false;
    };
    s.op() == op::SET_ROWS
        && supports_set_rows(s)
        && matches!(s.dtype(), GgmlType::F16 | GgmlType::F32)
        && s.ne()[0] == 1
        && s.ne()[2] == 1
        && s.ne()[3] == 1
        && a.dtype() == GgmlType::F32
        && a.ne() == [1, n, 1, 1]
        && a.nb()[1] == 4
        && row_ids_ok(&idx, n)
        && idx.nb()[0] == idx.dtype().type_size()
}

/// [ROPE(q), given when a caller moved it here (none does yet: llama.cpp's allocator may put
/// the V/K products over ROPE(q)'s input),] ROPE(k) at `i`, SET_ROWS of k's rows into
/// the cache [, SET_ROWS of v's rows]: one kernel (fused_rope_kv). The roped k goes straight
/// into the cache: its own tensor is written only where something else reads it (not fused).
fn try_fused_rope_kv(
    nodes: &[Tensor],
    i: usize,
    q: Option<Tensor>,
    uses: &Uses,
    lc: &LaunchCtx,
) -> ApiResult<Option<usize>> {
    let (Some(rk), Some(sk)) = (nodes.get(i).copied(), nodes.get(i + 1).copied()) else {
        return Ok(None);
    };
    if !rope_fusable(&rk) || !feeds_only_one(&rk, uses) {
        return Ok(None);
    }
    let (ne0, ne1, n_tok) = (rk.ne()[0], rk.ne()[1], rk.ne()[2]);
    let ka = rk.src(0).unwrap();
    let k_ok = set_rows_plain(&sk, ne0 * ne1, n_tok)
        && sk
            .src(0)
            .is_some_and(|a| a.data() == rk.data() && a.nb()[1] == rk.nb()[2])
        && !overlap(&ka, &sk);
    if !k_ok {
        return Ok(None);
    }
    if let Some(q) = q {
        if !rope_fusable(&q) || !same_rope(&q, &rk) {
            return Ok(None);
        }
    }
    // The V rows next to it, when they touch nothing the other parts read or write.
    let sv = nodes.get(i + 2).copied().filter(|sv| {
        let Some(va) = sv.src(0) else { return false };
        let n = sv.ne()[0];
        set_rows_plain(sv, n, n_tok)
            && !overlap(sv, &sk)
            && !overlap(sv, &ka)
            && !overlap(&va, &sk)
            && q.is_none_or(|q| {
                !overlap(sv, &q) && !overlap(sv, &q.src(0).unwrap()) && !overlap(&va, &q)
            })
    });
    if let Some(q) = q {
        // q's rows are written while k's and v's are read and the caches written.
        let qa = q.src(0).unwrap();
        if overlap(&q, &ka) || overlap(&q, &sk) || overlap(&qa, &sk) {
            return Ok(None);
        }
    }
    let (theta_scale, corr0, corr1) = rope_consts(&rk);
    let idx_i64 = |t: &Tensor| (t.src(1).unwrap().dtype() == GgmlType::I64) as i32;
    let idx_nb0 = |t: &Tensor| t.src(1).unwrap().nb()[0];
    let mut args = Args::default();
    args = match q {
        Some(q) => {
            let qa = q.src(0).unwrap();
            args.ptr(qa.data())
                .ptr(q.data())
                .i64(q.ne()[1])
                .i64(q.ne()[1] * q.ne()[2])
                .i64(qa.nb()[1])
                .i64(qa.nb()[2])
                .i64(q.nb()[1])
                .i64(q.nb()[2])
        }
        None => args
            .ptr(std::ptr::null())
            .ptr(std::ptr::null())
            .i64(1)
            .i64(0)
            .i64(0)
            .i64(0)
            .i64(0)
            .i64(0),
    };
    args = args
        .ptr(ka.data())
        .i64(ne1)
        .i64(ka.nb()[1])
        .i64(ka.nb()[2])
        .ptr(sk.data())
        .ptr(sk.src(1).unwrap().data())
        .i32(idx_i64(&sk))
        .i64(idx_nb0(&sk))
        .i32((sk.dtype() == GgmlType::F16) as i32)
        .i64(sk.nb()[1])
        .i64(sk.ne()[1]);
    args = match sv {
        Some(sv) => {
            let va = sv.src(0).unwrap();
            args.ptr(va.data())
                .i64(sv.ne()[0])
                .i64(va.nb()[1])
                .ptr(sv.data())
                .ptr(sv.src(1).unwrap().data())
                .i32(idx_i64(&sv))
                .i64(idx_nb0(&sv))
                .i32((sv.dtype() == GgmlType::F16) as i32)
                .i64(sv.nb()[1])
                .i64(sv.ne()[1])
        }
        None => args
            .ptr(std::ptr::null())
            .i64(0)
            .i64(0)
            .ptr(std::ptr::null())
            .ptr(std::ptr::null())
            .i32(0)
            .i64(0)
            .i32(0)
            .i64(0)
            .i64(0),
    };
    args = args
        .i64(n_tok)
        .ptr(rk.src(1).unwrap().data())
        .opt_ptr(rk.src(2))
        .i64(ne0)
        .i32(rk.param_i32(1))
        .i32((rk.param_i32(2) == ROPE_NEOX) as i32)
        .i32(rk.param_i32(15))
        .f32(theta_scale)
        .f32(rk.param_f32(6))
        .f32(rk.param_f32(7))
        .f32(rk.param_f32(8))
        .f32(corr0)
        .f32(corr1);
    let nq = q.map_or(0, |q| q.ne()[1] * q.ne()[2]);
    let blocks = nq + ne1 * n_tok + if sv.is_some() { n_tok } else { 0 };
    if blocks > 0 {
        lc.run("fused_rope_kv", [blocks, 1, 1], 64, args)?;
    }
    let n = if sv.is_some() { 3 } else { 2 };
    if let Some(q) = q {
        lc.note_written(&q);
    }
    for t in &nodes[i..i + n] {
        lc.note_written(t);
    }
    Ok(Some(n))
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

    /// The generation attention's splits cover every key once, in whole chunks, within the
    /// limits: 8B-class (8 KV heads) at 256 and 2304 keys, SmolLM2 (3), odd key counts.
    #[test]
    fn fa_vec_splits_cover_every_key() {
        for (n_kv, groups, target, max_splits) in [
            (256, 8, 1056, 64),
            (2304, 8, 1056, 64),
            (256, 3, 1056, 64),
            (4096, 3, 1056, 64),
            (1, 3, 1056, 64),
            (577, 8, 264, 4),
            (100, 1, 1, 1),
        ] {
            let (splits, split_keys) = fa_vec_splits(n_kv, groups, target, max_splits);
            assert!(
                split_keys % FA_VEC_CHUNK == 0 && split_keys > 0,
                "{n_kv} {groups}"
            );
            assert!(
                splits * split_keys >= n_kv && (splits - 1) * split_keys < n_kv,
                "{n_kv} {groups}: {splits} x {split_keys}"
            );
            assert!(
                splits <= max_splits && splits >= 1,
                "{n_kv} {groups}: {splits}"
            );
        }
        assert_eq!(fa_vec_splits(256, 8, 1056, 64), (8, 32));
        assert_eq!(fa_vec_splits(2304, 8, 1056, 64), (36, 64));
    }

    /// The tensor-core prompt kernel's key splits: whole tiles covering every key once, within
    /// the scratch reserved for them; SmolLM2 after 2048 tokens splits 4 ways, the 8B-class
    /// (partials over FM_SPLIT_BYTES) and short caches not at all.
    #[test]
    fn fm_splits_cover_every_key_within_the_scratch() {
        use crate::cpu::ops::testutil::TT;
        let fa = |d: usize, nq: usize, heads: usize, kv_heads: usize, n_kv: usize| {
            let q = TT::new(GgmlType::F32, [d, nq, heads, 1]);
            let k = TT::new(GgmlType::F16, [d, n_kv, kv_heads, 1]);
            let v = TT::new(GgmlType::F16, [d, n_kv, kv_heads, 1]);
            let mut n = TT::new(GgmlType::F32, [d, heads, nq, 1]);
            n.op(op::FLASH_ATTN_EXT)
                .pf(0, 0.125)
                .src(0, &q)
                .src(1, &k)
                .src(2, &v);
            (q, k, v, n)
        };
        let (_q, _k, _v, smol) = fa(64, 512, 9, 3, 2560);
        assert_eq!(fm_split_plan(&smol.tensor(), 16 * 9, 2, 132), (4, 640));
        let (_q2, _k2, _v2, big) = fa(128, 512, 32, 8, 2560);
        assert_eq!(fm_split_plan(&big.tensor(), 8 * 32, 4, 132), (1, 2560));
        let (_q3, _k3, _v3, short) = fa(64, 64, 4, 4, 1000);
        assert_eq!(fm_split_plan(&short.tensor(), 8, 2, 132), (1, 1000));
        let (_q4, _k4, _v4, two) = fa(64, 96, 4, 2, 2100);
        assert_eq!(fm_split_plan(&two.tensor(), 12, 2, 132), (4, 576));
        for (nq, n_kv, blocks, cu) in [
            (512, 512, 144, 132),
            (96, 2100, 12, 132),
            (40, 1300, 8, 132),
            (64, 1024, 8, 4),
            (512, 8192, 144, 132),
        ] {
            let (_a, _b, _c, n) = fa(64, nq, 4, 2, n_kv);
            let (splits, split_keys) = fm_split_plan(&n.tensor(), blocks, 2, cu);
            assert!(split_keys % FM_BK == 0 || splits == 1, "{nq} {n_kv}");
            assert!(
                splits * split_keys >= n_kv && (splits - 1) * split_keys < n_kv,
                "{nq} {n_kv}: {splits} x {split_keys}"
            );
            assert!(
                splits <= FM_SPLIT_MAX
                    && splits * nq * 4 * (64 + 2) * 4
                        <= scratch_bytes(&n.tensor()).max(nq * 4 * 66 * 4),
                "{nq} {n_kv}"
            );
        }
    }

    /// The gate/up prefetch stays within its budget: 8B-class (14336 rows, 4096-value Q4_0 rows
    /// of 2304 bytes in each matrix) prefetches 12 of each block's 32 rows, 21 MB in all;
    /// SmolLM2 (1536 rows of 360 bytes) all 32.
    #[test]
    fn glu_prefetch_rows_stay_within_budget() {
        let rows = glu_prefetch_rows_within(GLU_PREFETCH_BYTES, 14336, 2 * 2304);
        assert_eq!(rows, 12);
        assert!(14336 / 32 * rows * 2 * 2304 <= GLU_PREFETCH_BYTES);
        assert_eq!(
            glu_prefetch_rows_within(GLU_PREFETCH_BYTES, 1536, 2 * 360),
            32
        );
        assert_eq!(glu_prefetch_rows_within(0, 1536, 2 * 360), 0);
    }

    /// A kernel's quantized output never overlaps its quantized input (which it reads while it
    /// writes), and the sums of squares sit inside the region: llama's shapes (8B-class: 4096 /
    /// 14336, SmolLM2: 576 / 1536) and flash attention's input offsets.
    #[test]
    fn q8_output_regions_leave_the_input_alone() {
        for (k, m) in [
            (4096, 4096),
            (14336, 4096),
            (4096, 14336),
            (576, 576),
            (1536, 576),
            (576, 1536),
            (256, 768),
        ] {
            for in_at in [0, 256, q8_region(4096), q8_region(576), 1 << 20] {
                let out = q8_out_at(in_at, k, m);
                assert!(
                    out + q8_region(m) <= in_at || in_at + q8_region(k) <= out,
                    "k {k} m {m} in_at {in_at} out {out}"
                );
            }
            assert!(q8_ss_offset(m) + m / 32 * 4 <= q8_region(m));
            assert!(q8_ds_offset(m) + m / 32 * 8 <= q8_ss_offset(m));
        }
        // Gate/up after a norm-fusing projection of 4096 rows (out at 0): its output after the
        // input, as before the pending norm existed.
        assert_eq!(q8_out_at(0, 4096, 14336), q8_region(4096));
    }
}
