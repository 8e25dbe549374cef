//! MUL_MAT and MUL_MAT_ID: the matrix-vector kernels (integer dots on quantized src1 in
//! mmvq.hip, float ones in mul_mat.hip), the tiled kernel, the vendor BLAS path, Hadamard-
//! hinted products (hadamard.hip) and the expert products (mul_mat_id.hip).

use super::args::Args;
use super::scratch::{ensure_q8, q8_out_ptrs};
use super::widen::{half_src1, launch_widened};
use super::{flat_blocks, row_block, LaunchCtx, MAX_FLAT_BLOCKS, MAX_GRID_YZ};
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::ApiResult;
use crate::gpu::kernels::{weight_suffix, MMA_TYPES};
use crate::op_shapes::{hadamard_len, hadamard_scale};
use crate::tensor::Tensor;

/// Rows (one warp each) per block of the matrix-vector kernels (MV_ROWS in mul_mat.hip,
/// MVQ_ROWS in mmvq.hip).
pub(super) const MV_ROWS: usize = 4;

/// src1 columns per block of the matrix-vector kernels (MV_COLS, MVQ_COLS).
pub(super) const MV_COLS: usize = 4;

/// Warps per block and rows per block of the one-column matrix-vector kernels
/// (MV1_ROWS_DEF, MV1_UNROLL_DEF in mmvq.hip: mul_mat_vec_q1, mul_mat_id_q; the warps are the launcher's choice).
pub(super) const MV1_WARPS: usize = 4;

pub(super) const MV1_ROWS: usize = 2;

pub(super) const MV1_UNROLL: usize = 4;

/// Rows per one-warp block of the short-row kernel mul_mat_vec_q1s_* (MV1S_ROWS in mmvq.hip).
pub(super) const MV1S_ROWS: usize = 8;

/// Most threads per block of the one-column kernels (their __launch_bounds__).
pub(super) const MV1_MAX_THREADS: usize = 256;

/// (rows, unroll, warps) of the one-column kernel that ROCMFORGE_GPU_MV1=rows,unroll,warps
/// asks for, if it names a measuring variant (crate::gpu::kernels::MV1X_SHAPES; Q4_0 weights only, others keep
/// MV1_ROWS / MV1_UNROLL with those warps).
pub(super) fn mv1_shape() -> Option<(usize, usize, usize)> {
    static V: once_cell::sync::OnceCell<Option<(usize, usize, usize)>> =
        once_cell::sync::OnceCell::new();
    *V.get_or_init(|| {
        crate::tuning::get().gpu_mv1.filter(|&(r, u, _)| {
            (r, u) == (MV1_ROWS, MV1_UNROLL) || crate::gpu::kernels::MV1X_SHAPES.contains(&(r, u))
        })
    })
}

/// Whether a one-column product takes the 8-rows-per-warp kernel (mul_mat_vec_q1s_*): rows of
/// at most 32 blocks of 32 (most lanes of a wider block would be idle) in a matrix tall enough
/// to fill the GPU with such blocks. On an H100: SmolLM2's 49152 x 576 Q8_0 output projection
/// 75 µs with 2 rows per 4-warp block (0.4 TB/s), 17.5 µs this way; its 576 x 576 products
/// 5.6 µs the default way, 9.0 µs this way (72 one-warp blocks). Also a K-quant vocabulary
/// projection (32768 rows or more) of rows of up to 4096 values (128 or 256 parts: one or two
/// a thread in the default kernel, whose registers for four parts a row then hold one or two).
/// An 8B-shaped model's 49152 x 4096 output head on an H200, the default kernel against this
/// one: Q6_K 111 against 74 µs, Q5_K 116 against 75, Q4_K 96 against 59. Not for FFN products
/// (14336 rows), which would lose the fused gate / up kernel. ROCMFORGE_GPU_MV1 turns it off.
pub(super) fn short_tall(wt: GgmlType, k: usize, m: usize) -> bool {
    let whole_blocks = matches!(
        wt,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
    );
    let short = (whole_blocks && k <= 32 * 32 && m >= 8192)
        || (matches!(
            wt,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K
        ) && k <= 4096
            && m >= 32768);
    short && mv1_shape().is_none()
}

/// Below this many src1 columns MUL_MAT uses the matrix-vector kernel.
pub(super) const MUL_MAT_VEC_MAX_COLS: usize = 8;

/// Activation types of MUL_MAT and MUL_MAT_ID: F32, and F16 / BF16 widened to it (widen.rs).
fn is_src1_type(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

pub(super) fn supports_mul_mat_id(node: &Tensor) -> bool {
    let (Some(w), Some(x), Some(ids)) = (node.src(0), node.src(1), node.src(2)) else {
        return false;
    };
    let (wne, xne, ine, dne) = (w.ne(), x.ne(), ids.ne(), node.ne());
    weight_suffix(w.dtype()).is_some()
        && is_src1_type(x.dtype())
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

pub(super) fn supports_mul_mat(node: &Tensor) -> bool {
    if hadamard_len(node).is_some() {
        return node.src(1).is_some_and(|x| x.nrows() <= i32::MAX as usize);
    }
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else {
        return false;
    };
    let (wne, xne, dne, dnb) = (w.ne(), x.ne(), node.ne(), node.nb());
    weight_suffix(w.dtype()).is_some()
        && wne[0] % w.dtype().block_size() == 0
        && is_src1_type(x.dtype())
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

/// How ggml-cpu rounds src1 before its dot products with weights of type `t` (the mode of
/// round_src1), or None where it uses src1 as it is (F32 weights).
pub(super) fn src1_rounding(t: GgmlType) -> Option<i32> {
    match t {
        GgmlType::Q4_0
        | GgmlType::Q5_0
        | GgmlType::Q8_0
        | GgmlType::IQ4_NL
        | GgmlType::MXFP4
        | GgmlType::NVFP4
        | GgmlType::Q1_0
        | GgmlType::Q2_0 => Some(0),
        GgmlType::Q4_1 | GgmlType::Q5_1 => Some(3),
        // Every 256-value format's vec_dot_type is Q8_K.
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_XS
        | GgmlType::TQ2_0
        | GgmlType::TQ1_0
        | GgmlType::IQ3_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ1_S
        | GgmlType::IQ1_M => Some(1),
        GgmlType::F16 => Some(2),
        GgmlType::BF16 => Some(4),
        _ => None,
    }
}

/// quantize_q8's mode for the integer-dot matrix-vector kernels (mmvq.hip) of weight type
/// `t`: 0 = blocks of 32 (ggml-cpu's Q8_0 / Q8_1), 1 = blocks of 256 (Q8_K); None: no kernel.
pub(super) fn mvq_mode(t: GgmlType) -> Option<i32> {
    match t {
        GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q8_0
        | GgmlType::IQ4_NL
        | GgmlType::MXFP4
        | GgmlType::NVFP4
        | GgmlType::Q1_0
        | GgmlType::Q2_0 => Some(0),
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::IQ4_XS
        | GgmlType::TQ2_0
        | GgmlType::TQ1_0
        | GgmlType::IQ3_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ1_S
        | GgmlType::IQ1_M => Some(1),
        _ => None,
    }
}

/// Whether a MUL_MAT node runs on the integer-dot matrix-vector kernels.
pub(super) fn uses_mvq(node: &Tensor) -> bool {
    match (node.src(0), node.src(1)) {
        (Some(w), Some(x)) => {
            node.op() == op::MUL_MAT
                && x.dtype() == GgmlType::F32
                && x.ne()[1] < MUL_MAT_VEC_MAX_COLS
                && mvq_mode(w.dtype()).is_some()
        }
        _ => false,
    }
}

/// Whether a MUL_MAT_ID node runs on the integer-dot kernel (mul_mat_id_q, mmvq.hip).
pub(super) fn uses_mmid_q(node: &Tensor) -> bool {
    match (node.src(0), node.src(1)) {
        (Some(w), Some(x)) => {
            node.op() == op::MUL_MAT_ID
                && x.dtype() == GgmlType::F32
                && mvq_mode(w.dtype()).is_some()
                && x.ne()[3] == 1
        }
        _ => false,
    }
}

/// From this many src1 columns on, MUL_MAT goes through the vendor BLAS where there is one
/// (`ROCMFORGE_GPU_BLAS_MIN_COLS` overrides). Measured on an H100 (SmolLM2 shapes, pp16):
/// BLAS 3.3x faster than the tiled kernel, so it takes everything the matrix-vector kernel
/// does not; the tiled kernel remains for machines without a BLAS.
pub(super) fn blas_min_cols() -> usize {
    static V: once_cell::sync::OnceCell<usize> = once_cell::sync::OnceCell::new();
    *V.get_or_init(|| {
        crate::tuning::get()
            .gpu_blas_min_cols
            .unwrap_or(MUL_MAT_VEC_MAX_COLS)
            .max(1)
    })
}

/// The f16 operands the BLAS path stages in scratch for a MUL_MAT node: src1 always (it is
/// F32; rounding it to f16 is what ggml-cpu does for F16 weights, and finer than the 8-bit
/// blocks it uses for quantized ones), the weight unless it is F16 and usable in place.
pub(super) struct BlasOperands {
    pub(super) x16_bytes: usize,
    pub(super) w16_bytes: usize,
    pub(super) w_in_place: bool,
}

/// None where the BLAS path does not take the node: few columns, F32 weights (ggml-cpu
/// multiplies those in f32; the tiled kernel does too), or strides the library cannot express.
pub(super) fn blas_operands(node: &Tensor) -> Option<BlasOperands> {
    let (w, x) = (node.src(0)?, node.src(1)?);
    let (wne, wnb, xne, dnb) = (w.ne(), w.nb(), x.ne(), node.nb());
    let (k, m, n) = (wne[0], wne[1], xne[1]);
    if n < blas_min_cols() || w.dtype() == GgmlType::F32 || weight_suffix(w.dtype()).is_none() {
        return None;
    }
    if dnb[1..].iter().any(|&s| !s.is_multiple_of(4))
        || dnb[1] < m * 4
        || !(node.data() as usize).is_multiple_of(4)
    {
        return None;
    }
    let w_in_place = w.dtype() == GgmlType::F16
        && (w.data() as usize).is_multiple_of(2)
        && wnb[1..].iter().all(|&s| s.is_multiple_of(2));
    if !w_in_place && !k.is_multiple_of(8) {
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
pub(super) fn launch_mul_mat_blas(
    node: &Tensor,
    lc: &LaunchCtx,
    blas: &crate::gpu::blas::Blas,
    ops: &BlasOperands,
) -> ApiResult<()> {
    use crate::gpu::blas::{Elem, Gemm, WORKSPACE_BYTES};
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
        // A thread per block of 32 values (8 for float weights), as dequant.hip splits them.
        let per = if w.dtype().block_size() >= 32 { 32 } else { 8 };
        lc.run(
            &kernel,
            [flat_blocks(n_rows * (k / per), 256), 1, 1],
            256,
            args,
        )?;
        (w16, k, m * k, wne[2] * m * k)
    };
    if lc.dry() {
        return Ok(()); // the library's own kernels need no compiling
    }
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

/// Matrix-vector product with integer dots: src1 quantized into the scratch (unless it is
/// there already), then one warp per weight row.
pub(super) fn launch_mul_mat_vec_q(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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
            None if suffix == "q4_0" => (4, 4, 2),
            None => (MV1_ROWS, MV1_UNROLL, MV1_WARPS),
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
pub(super) fn round_src1_to_scratch(
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
pub(super) fn launch_hadamard(
    node: &Tensor,
    n: usize,
    q8_at: Option<usize>,
    lc: &LaunchCtx,
) -> ApiResult<()> {
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

pub(super) fn launch_mul_mat(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    if let Some(n) = hadamard_len(node) {
        return launch_hadamard(node, n, None, lc);
    }
    if half_src1(node) {
        return launch_widened(node, lc, launch_mul_mat);
    }
    if uses_mvq(node) && lc.scratch != 0 {
        return launch_mul_mat_vec_q(node, lc);
    }
    if lc.mma && lc.scratch != 0 && uses_mma(node) {
        return launch_mul_mat_mma(node, lc);
    }
    if let (Some(ops), Some(blas)) = (
        blas_operands(node),
        crate::gpu::blas::for_vendor(lc.api.vendor()),
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
        // Float weights in 8-value segments (mul_mat_vec8): 16-byte aligned rows, K % 8 == 0.
        let aligned = |p: usize, nb: &[usize]| {
            p.is_multiple_of(16) && nb.iter().all(|b| b.is_multiple_of(16))
        };
        let seg8 = matches!(w.dtype(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
            && corr.is_null()
            && k.is_multiple_of(8)
            && aligned(w.data() as usize, &wnb[1..])
            && aligned(xp as usize, &xnb[1..]);
        let kernel = if seg8 { "mul_mat_vec8" } else { "mul_mat_vec" };
        lc.run(
            &format!("{kernel}_{suffix}"),
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

/// Weight rows and src1 columns per block of mul_mat_mma (MMA_BM, MMA_BN, MMA_WARPS in mul_mat_mma.hip).
const MMA_BM: usize = 128;
const MMA_BN: usize = 64;
const MMA_THREADS: u32 = 256;

/// Whether a weight type has the tensor-core integer kernels (MMA_TYPES).
fn has_mma_kernel(t: GgmlType) -> bool {
    weight_suffix(t).is_some_and(|s| MMA_TYPES.contains(&s))
}

/// Whether a MUL_MAT node of a batch of columns takes the tensor-core integer kernel
/// (mul_mat_mma.hip) on a device that has one (LaunchCtx::mma): weights of MMA_TYPES, F32
/// src1, dst rows of dense floats; which of them by `ROCMFORGE_GPU_MMQ` (tuning.rs).
pub(super) fn uses_mma(node: &Tensor) -> bool {
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else {
        return false;
    };
    // Asked of every node a graph launches (scratch sizes, the quantized src1's reuse).
    if node.op() != op::MUL_MAT {
        return false;
    }
    let (wne, xne, dnb) = (w.ne(), x.ne(), node.nb());
    let (ncols, batches) = mma_columns(wne, xne);
    let wanted = match crate::tuning::get().gpu_mmq {
        Some(all) => all,
        // cuBLAS on f16 operands is 1.6x faster for 2-D Q4_0 / Q8_0 weights (8B-shaped pp512
        // on an H100); IQ4_NL / IQ4_XS are near parity and batched weights are small products.
        None => matches!(w.dtype(), GgmlType::IQ4_NL | GgmlType::IQ4_XS) || wne[2] * wne[3] > 1,
    };
    wanted
        && x.dtype() == GgmlType::F32
        && xne[1] >= MUL_MAT_VEC_MAX_COLS
        && has_mma_kernel(w.dtype())
        && wne[0].is_multiple_of(w.dtype().block_size())
        && dnb[0] == 4
        && dnb[1..].iter().all(|s| s.is_multiple_of(4))
        && (node.data() as usize).is_multiple_of(4)
        && ncols.div_ceil(MMA_BN) <= MAX_GRID_YZ
        && batches <= MAX_GRID_YZ
}

/// (columns per launch z, z count) of mul_mat_mma: a 2-D weight takes every src1 row in one
/// z (more columns per tile), a batched weight a z per src1 matrix.
fn mma_columns(wne: [usize; 4], xne: [usize; 4]) -> (usize, usize) {
    if wne[2] == 1 && wne[3] == 1 {
        (xne[1] * xne[2] * xne[3], 1)
    } else {
        (xne[1], xne[2] * xne[3])
    }
}

/// MUL_MAT on tensor cores: src1 quantized as ggml-cpu quantizes it (unless it is in the
/// scratch already: the Q, K and V products of a prompt share one), then mul_mat_mma.
fn launch_mul_mat_mma(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    let (w, x) = (node.src(0).unwrap(), node.src(1).unwrap());
    let (wne, wnb, xne, dnb) = (w.ne(), w.nb(), x.ne(), node.nb());
    let (k, m) = (wne[0], wne[1]);
    let (ncols, batches) = mma_columns(wne, xne);
    let suffix = weight_suffix(w.dtype()).unwrap_or("q4_0");
    let (xq, xds) = ensure_q8(&x, mvq_mode(w.dtype()).unwrap_or(0), lc)?;
    if m == 0 || ncols == 0 || batches == 0 {
        return Ok(());
    }
    let args = Args::default()
        .ptr(w.data())
        .ptr(xq as *const u8)
        .ptr(xds as *const u8)
        .ptr(node.data())
        .i64(k)
        .i64(m)
        .i64(xne[1])
        .i64(xne[2])
        .i64(ncols)
        .i64(xne[2] / wne[2])
        .i64(xne[3] / wne[3])
        .i64s(&wnb[1..])
        .i64s(&dnb[1..]);
    lc.run(
        &format!("mul_mat_mma_{suffix}"),
        [m.div_ceil(MMA_BM), ncols.div_ceil(MMA_BN), batches],
        MMA_THREADS,
        args,
    )
}

/// Rows (one warp each) per block of the MUL_MAT_ID kernel (MMID_ROWS in mul_mat_id.hip).
pub(super) const MMID_ROWS: usize = 4;

pub(super) fn launch_mul_mat_id(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
    if half_src1(node) {
        return launch_widened(node, lc, launch_mul_mat_id);
    }
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

/// Pairs of one expert per warp of the sorted MUL_MAT_ID kernel (MMQS_COLS in mmvq.hip).
pub(super) const MMQS_COLS: usize = 8;

/// Pairs per warp and warps per block of its tensor-core form (MMQT_COLS, MMQT_WARPS).
const MMQT_COLS: usize = 32;
const MMQT_WARPS: usize = 4;

/// Bytes of mmid_sort's output for a MUL_MAT_ID on the integer-dot kernels (layout in
/// mmvq.hip), where it takes the sorted kernel: a batch of at least
/// `ROCMFORGE_GPU_MMID_SORTED_MIN` tokens. None: the pair-by-pair kernel.
pub(super) fn mmid_sorted_bytes(node: &Tensor) -> Option<usize> {
    let min = crate::tuning::get().gpu_mmid_sorted_min;
    let (w, ids) = (node.src(0)?, node.src(2)?);
    let (n_as, ine) = (w.ne()[2], ids.ne());
    let n_pairs = ine[0] * ine[1];
    let max_tiles = n_pairs.div_ceil(MMQS_COLS) + n_as;
    (uses_mmid_q(node)
        && min > 0
        && ine[1] >= min
        && max_tiles <= MAX_GRID_YZ
        && n_pairs < i32::MAX as usize)
        .then_some(4 * (2 + n_as + n_pairs + 2 * max_tiles))
}

/// MUL_MAT_ID with integer dots: src1 quantized as ggml-cpu quantizes it (ne11 columns of
/// n_tok batches, once for the gate and up experts that share it), then a block per
/// MV1_ROWS rows of each (slot, token)'s expert.
pub(super) fn launch_mul_mat_id_q(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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
    // The pairs grouped by expert after the quantized src1, where the scratch has the room.
    let sorted_at = (xq + super::scratch::q8_region(x.nelements())).next_multiple_of(256);
    if mmid_sorted_bytes(node)
        .is_some_and(|b| sorted_at + b <= lc.scratch as usize + lc.scratch_len)
    {
        let (n_pairs, n_as) = (ine[0] * ine[1], wne[2]);
        // Tensor cores where the device and the weight type have them (wider tiles of pairs).
        let mma = lc.mma && crate::tuning::get().gpu_mmid_mma && has_mma_kernel(w.dtype());
        let cols = if mma { MMQT_COLS } else { MMQS_COLS };
        let sort = Args::default()
            .ptr(ids.data())
            .ptr(sorted_at as *const u8)
            .ptr(node.data())
            .i64(m)
            .i64(n_as)
            .i64(ine[0])
            .i64(ine[1])
            .i64(ids.nb()[0])
            .i64(ids.nb()[1])
            .i64(node.nb()[1])
            .i64(node.nb()[2])
            .i32(cols as i32);
        lc.run("mmid_sort", [1, 1, 1], 1024, sort)?;
        let args = Args::default()
            .ptr(w.data())
            .ptr(xq as *const u8)
            .ptr(xds as *const u8)
            .ptr(sorted_at as *const u8)
            .ptr(node.data())
            .i64(k)
            .i64(m)
            .i64(n_as)
            .i64(ine[0])
            .i64(n_pairs)
            .i64(xne[1])
            .i64(w.nb()[1])
            .i64(w.nb()[2])
            .i64(node.nb()[1])
            .i64(node.nb()[2]);
        let max_tiles = n_pairs.div_ceil(cols) + n_as;
        if mma {
            return lc.run(
                &format!("mul_mat_id_mma_{suffix}"),
                [m.div_ceil(16 * MMQT_WARPS), max_tiles, 1],
                (MMQT_WARPS * 32) as u32,
                args,
            );
        }
        return lc.run(
            &format!("mul_mat_id_q_sorted_{suffix}"),
            [m.div_ceil(MV_ROWS), max_tiles, 1],
            (MV_ROWS * lc.warp_size as usize) as u32,
            args,
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::testutil::TT;
    use crate::gpu::ops::widen::tests::launched_on;

    /// (dst, weight, src1): the node points at the other two.
    fn mul_mat(wt: GgmlType, w: [usize; 4], x: [usize; 4]) -> (TT, TT, TT) {
        let wt = TT::new(wt, w);
        let xt = TT::new(GgmlType::F32, x);
        let mut d = TT::new(GgmlType::F32, [w[1], x[1], x[2], x[3]]);
        d.op(op::MUL_MAT).src(0, &wt).src(1, &xt);
        (d, wt, xt)
    }

    /// ROCMFORGE_GPU_MMQ's default: the tensor-core integer kernel takes IQ4_XS / IQ4_NL
    /// weights and batched (3-D) weights of its types on a device with tensor cores, after one
    /// quantization of src1; 2-D Q4_0 / Q8_0 stay with the BLAS path (here, without a library,
    /// the tiled kernel), and so does everything on a device without tensor cores or with
    /// fewer columns than a batch.
    #[test]
    fn integer_prompt_kernel_takes_what_auto_names() {
        let k = 512;
        let cases = [
            (GgmlType::IQ4_XS, [k, 300, 1, 1], [k, 40, 1, 1], true),
            (GgmlType::IQ4_NL, [k, 300, 1, 1], [k, 9, 3, 2], true),
            (GgmlType::Q4_0, [k, 300, 1, 1], [k, 40, 1, 1], false),
            (GgmlType::Q8_0, [k, 300, 1, 1], [k, 40, 1, 1], false),
            (GgmlType::Q8_0, [k, 64, 4, 1], [k, 40, 8, 1], true),
            (GgmlType::Q4_0, [k, 64, 2, 1], [k, 33, 4, 2], true),
            (GgmlType::Q4_K, [k, 64, 2, 1], [k, 33, 4, 2], false),
            (GgmlType::IQ4_XS, [k, 300, 1, 1], [k, 7, 1, 1], false),
        ];
        for (wt, w, x, want) in cases {
            let (d, _w, _x) = mul_mat(wt, w, x);
            let node = d.tensor();
            let suffix = weight_suffix(wt).unwrap();
            let mma = format!("mul_mat_mma_{suffix}");
            let names = launched_on(&node, true);
            assert_eq!(
                names.contains(&mma),
                want,
                "{wt:?} {w:?} x {x:?}: {names:?}"
            );
            if want {
                assert_eq!(names, ["quantize_q8", mma.as_str()], "{wt:?}");
                assert!(super::super::scratch::scratch_bytes(&node) >= x.iter().product::<usize>());
            }
            assert!(
                !launched_on(&node, false).contains(&mma),
                "{wt:?} without tensor cores"
            );
        }
    }

    /// A 2-D weight takes every src1 row in one launch z; a batched one a z per src1 matrix.
    #[test]
    fn mma_columns_flatten_only_one_weight_matrix() {
        assert_eq!(mma_columns([64, 9, 1, 1], [64, 5, 3, 2]), (30, 1));
        assert_eq!(mma_columns([64, 9, 3, 1], [64, 5, 3, 2]), (5, 6));
        assert_eq!(mma_columns([64, 9, 1, 2], [64, 5, 3, 2]), (5, 6));
    }
}
