//! Fused runs of nodes (token generation).
//!
//! A generated token runs a few hundred tiny kernels; each launch costs about as much as the
//! work. Runs of nodes that ggml's graphs always build the same way are computed by one
//! kernel when the intermediate tensors are needed by nothing else (one use in the graph,
//! not a graph output). The decision depends only on the graph, so a captured graph stays
//! valid for every graph with the same key (backend.rs). `launch_at` (mod.rs) tries each
//! fusion in turn; this file holds the norm, add+norm, gate/up and pair fusions, fused_qkv.rs
//! those of attention's input (Q/K/V projections, rope, KV-cache writes).

use super::args::Args;
use super::elementwise::{act_code_glu, supports_glu};
use super::fused_qkv::try_fused_qkv;
use super::matmul::{
    launch_hadamard, mv1_shape, mvq_mode, short_tall, supports_mul_mat, uses_mvq, MV1_MAX_THREADS,
    MV1_ROWS, MV1_WARPS, MV_ROWS,
};
use super::norm::{norm_block, supports_rms_norm};
use super::scratch::{
    ensure_q8, ensure_q8_norm, q8_ds_offset, q8_out_at, q8_region, q8_ss_offset, PendingNorm, Q8Src,
};
use super::LaunchCtx;
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::ApiResult;
use crate::gpu::kernels::weight_suffix;
use crate::op_shapes::hadamard_len;
use crate::tensor::Tensor;

/// How many nodes use each tensor (as a source, or as the base of a view), by address.
pub struct Uses(pub(super) std::collections::HashMap<usize, u32>);

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

    pub(super) fn count(&self, t: &Tensor) -> u32 {
        self.0.get(&(t.as_ptr() as usize)).copied().unwrap_or(0)
    }
}

/// ggml's GGML_TENSOR_FLAG_OUTPUT: the host reads the tensor after the graph.
pub(super) const FLAG_OUTPUT: i32 = 2;

/// Whether `t`'s values go to exactly one node and nowhere else.
pub(super) fn feeds_only_one(t: &Tensor, uses: &Uses) -> bool {
    t.raw().flags & FLAG_OUTPUT == 0 && uses.count(t) == 1
}

pub(super) fn same(a: &Tensor, b: Option<Tensor>) -> bool {
    b.is_some_and(|b| a.as_ptr() == b.as_ptr())
}

pub(super) fn dense_f32(t: &Tensor) -> bool {
    t.dtype() == GgmlType::F32 && t.is_contiguous()
}

/// A Hadamard-hinted MUL_MAT whose output the next node, an integer-dot product, reads
/// (llama's rotation of attention's output before the output projection, quantized caches):
/// the transform also quantizes its output for that product, so it needs no quantize launch.
pub(super) fn try_fused_hadamard_mv(
    nodes: &[Tensor],
    i: usize,
    lc: &LaunchCtx,
) -> ApiResult<Option<usize>> {
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
pub(super) fn try_fused_norm(
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
pub(super) fn try_fused_mv_add_norm(
    nodes: &[Tensor],
    i: usize,
    uses: &Uses,
    lc: &LaunchCtx,
) -> ApiResult<Option<usize>> {
    if !crate::tuning::get().gpu_add_norm {
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
    let warps = rows32_warps(blocks, lc, crate::tuning::get().gpu_add_norm_warps);
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
pub(super) fn rows32_warps(blocks: usize, lc: &LaunchCtx, forced: Option<usize>) -> usize {
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
pub(super) fn glu_prefetch_rows(m: usize, pair_bytes: usize) -> usize {
    let budget = crate::tuning::get()
        .gpu_glu_pf_mb
        .map_or(GLU_PREFETCH_BYTES, |mb| mb << 20);
    glu_prefetch_rows_within(budget, m, pair_bytes)
}

pub(super) fn glu_prefetch_rows_within(budget: usize, m: usize, pair_bytes: usize) -> usize {
    let per_block = budget / (m / 32).max(1);
    (per_block / pair_bytes.max(1)).min(32)
}

pub(super) const GLU_PREFETCH_BYTES: usize = 24 << 20;

/// MUL_MAT(gate, x), MUL_MAT(up, x), GLU(gate out, up out) for one column x: one kernel
/// that reads both weight rows and writes act(gate) * up. `check`: only whether it would fuse
/// (nothing launched).
pub(super) fn try_fused_glu(
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
        let warps = rows32_warps(blocks, lc, crate::tuning::get().gpu_glu_warps);
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
pub(super) fn try_fused_mv_pair(
    nodes: &[Tensor],
    i: usize,
    lc: &LaunchCtx,
) -> ApiResult<Option<usize>> {
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
        && !a.overlaps(b)
        && !a.overlaps(&x)
        && !b.overlaps(&x);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
