//! Layout of the device scratch: the quantized src1 (values, scales, sums of squares) that
//! matrix-vector products share, where each kernel writes its quantized output, and how much
//! scratch every node needs (`scratch_bytes`).

use super::args::Args;
use super::attention::{fa_part_floats, fa_q8_at, fa_split_max_parts, fm_split_max};
use super::matmul::{blas_operands, src1_rounding, uses_mma, uses_mmid_q, uses_mvq};
use super::LaunchCtx;
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::ApiResult;
use crate::op_shapes::hadamard_len;
use crate::tensor::Tensor;

/// The src1 whose quantized form (quantize_q8) the scratch holds: matrix-vector products that
/// share an activation (attention's Q/K/V, the FFN's gate/up) quantize it once. Described by
/// its data and rows of K values, so a reshaped view of the same contiguous tensor matches
/// (attention's output is quantized by flash attention itself and read through a reshape).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Q8Src {
    /// Byte offset of the quantized values in the scratch (their scales follow, q8_ds_offset).
    pub(super) at: usize,
    pub(super) data: usize,
    pub(super) k: usize,
    pub(super) rows: usize,
    pub(super) mode: i32,
    /// Some: the values are an RMS norm's input times its weight, not yet divided by the norm
    /// (mul_mat_vec_q_add_norm); the F32 tensor `data` was never written. Only kernels that
    /// take the pending norm (ensure_q8_norm) may read them.
    pub(super) norm: Option<PendingNorm>,
}

/// Where mul_mat_vec_q_add_norm left its sums of squares (one per 32 values, q8_ss_offset
/// after the values) and the norm's epsilon (bits of the f32).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PendingNorm {
    pub(super) ssq_at: usize,
    pub(super) eps_bits: u32,
}

/// A quantized src1 in the scratch, as the integer-dot kernels take it: addresses of the
/// values, of their scales, of the pending norm's sums of squares (0: none) and its epsilon.
pub(super) struct Q8Operand {
    pub(super) xq: usize,
    pub(super) xds: usize,
    pub(super) ssq: usize,
    pub(super) eps: f32,
}

/// Byte offset of the per-block scales in the quantized-activation scratch of `n` values.
pub(super) fn q8_ds_offset(n: usize) -> usize {
    n.next_multiple_of(256)
}

/// Addresses of the quantized values and of their scales for `node`'s output quantized at
/// scratch offset `at` (0, 0 where it is not).
pub(super) fn q8_out_ptrs(node: &Tensor, at: Option<usize>, lc: &LaunchCtx) -> (usize, usize) {
    at.map_or((0, 0), |at| {
        (
            lc.scratch as usize + at,
            lc.scratch as usize + at + q8_ds_offset(node.nelements()),
        )
    })
}

/// Byte offset of the sums of squares (one f32 per 32 values) that mul_mat_vec_q_add_norm
/// writes after the scales.
pub(super) fn q8_ss_offset(n: usize) -> usize {
    (q8_ds_offset(n) + n.div_ceil(32) * 8).next_multiple_of(256)
}

/// Bytes of scratch one quantized src1 of `n` values takes (values, scales, sums of squares,
/// alignment).
pub(super) fn q8_region(n: usize) -> usize {
    // 256-byte multiple: the kernels read the values of a region that follows as 16-byte words.
    (q8_ss_offset(n) + n.div_ceil(32) * 4).next_multiple_of(256) + 256
}

/// Where a kernel that reads a quantized src1 of `k_in` values at `in_at` writes its own
/// quantized output of `m` values: before the input where it fits, else after it.
pub(super) fn q8_out_at(in_at: usize, k_in: usize, m: usize) -> usize {
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
    if super::widen::half_src1(node) {
        return super::widen::widened_scratch_bytes(node);
    }
    if hadamard_len(node).is_some() {
        // Its output quantized for the product after it (try_fused_hadamard_mv).
        return q8_region(node.nelements());
    }
    if uses_mmid_q(node) {
        // mmid_sort's output after the quantized src1 (256-byte aligned).
        return q8_region(node.src(1).map_or(0, |x| x.nelements()))
            + super::matmul::mmid_sorted_bytes(node).map_or(0, |b| b + 256);
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
        crate::gpu::blas::WORKSPACE_BYTES + o.x16_bytes.next_multiple_of(256) + o.w16_bytes
    });
    // The tensor-core kernel's quantized src1 (where the device has none: one of the above).
    let mma = if uses_mma(node) {
        q8_region(node.src(1).map_or(0, |x| x.nelements()))
    } else {
        0
    };
    rounded.max(blas).max(mma)
}

impl Q8Src {
    /// Contiguous F32 rows only (the quantized layout is then the same for every view of them).
    pub(super) fn of(at: usize, x: &Tensor, mode: i32) -> Option<Q8Src> {
        let k = x.ne()[0];
        (x.is_contiguous() && x.dtype() == GgmlType::F32 && k > 0)
            .then(|| Q8Src::rows(at, x.data() as usize, k, x.nelements() / k, mode))
    }
    pub(super) fn rows(at: usize, data: usize, k: usize, rows: usize, mode: i32) -> Q8Src {
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
    pub(super) fn bytes(&self) -> usize {
        self.k * self.rows * 4
    }
    pub(super) fn same_src(&self, x: &Tensor, mode: i32) -> bool {
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
    pub(super) fn note_written(&self, node: &Tensor) {
        let Some(c) = self.q8.get() else { return };
        if matches!(
            node.op(),
            op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE
        ) {
            return;
        }
        let (a, e) = (node.data() as usize, node.data() as usize + node.nbytes());
        let q8_kernel = uses_mvq(node) || uses_mmid_q(node) || (self.mma && uses_mma(node));
        let other_scratch = scratch_bytes(node) > 0 && !q8_kernel;
        if other_scratch || (a < c.data + c.bytes() && c.data < e) {
            self.q8.set(None);
        }
    }
}

/// Quantizes src1 `x` into the scratch for the integer-dot kernels, unless it is there already;
/// returns the addresses of the values and of the scales. For kernels that do not take a
/// pending norm: an error where the scratch holds one for `x` (a fusion planned wrong).
pub(super) fn ensure_q8(x: &Tensor, mode: i32, lc: &LaunchCtx) -> ApiResult<(usize, usize)> {
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
pub(super) fn ensure_q8_norm(x: &Tensor, mode: i32, lc: &LaunchCtx) -> ApiResult<Q8Operand> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
