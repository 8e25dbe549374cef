//! Fusions of attention's input: the Q/K/V projections in one kernel (mul_mat_vec_q1_qkv),
//! with the rotation and the KV-cache writes where the graph allows (fused.hip).

use super::args::Args;
use super::fused::{dense_f32, feeds_only_one, same, Uses};
use super::matmul::{
    mv1_shape, mvq_mode, short_tall, supports_mul_mat, uses_mvq, MV1_MAX_THREADS, MV1_UNROLL,
    MV1_WARPS,
};
use super::rope::{rope_consts, supports_rope, ROPE_NEOX, ROPE_NORMAL};
use super::rows::{launch_set_rows, supports_set_rows};
use super::scratch::ensure_q8_norm;
use super::{quant_dst, LaunchCtx};
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::ApiResult;
use crate::gpu::kernels::weight_suffix;
use crate::op_shapes::{hadamard_len, hadamard_scale};
use crate::tensor::Tensor;

/// llama's attention input for one token, as llama builds it: MUL_MAT q, ROPE q [, its
/// Hadamard rotation], the K and V products and ROPE k [, the rotations of roped K and of V]
/// (in either of llama's orders), SET_ROWS k (cache), SET_ROWS v (cache). The rotations come
/// with quantized caches (llama.cpp's attn_inp_k_rot / attn_inp_v_rot).
#[derive(Clone, Copy)]
pub(super) struct QkvNodes<'a> {
    pub(super) mq: Tensor<'a>,
    pub(super) rq: Tensor<'a>,
    pub(super) hq: Option<Tensor<'a>>,
    pub(super) mk: Tensor<'a>,
    pub(super) rk: Tensor<'a>,
    pub(super) hk: Option<Tensor<'a>>,
    pub(super) mv: Tensor<'a>,
    pub(super) hv: Option<Tensor<'a>>,
    pub(super) sk: Tensor<'a>,
    pub(super) sv: Tensor<'a>,
    pub(super) len: usize,
}

/// Whether `n`'s source `i` is a view of `t`'s data (a reshape of it).
pub(super) fn reads(n: &Tensor, i: usize, t: &Tensor) -> bool {
    n.src(i).is_some_and(|a| a.data() == t.data())
}

pub(super) fn qkv_nodes<'a>(nodes: &[Tensor<'a>], i: usize) -> Option<QkvNodes<'a>> {
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
pub(super) fn rotation_len(h: &Tensor, input: &Tensor) -> Option<usize> {
    let n = hadamard_len(h)?;
    let x = h.src(1)?;
    let ok = n % 32 == 0
        && n <= ROT_QKV_MAX
        && dense_f32(h)
        && dense_f32(&x)
        && h.nelements() == input.nelements()
        && input.nelements().is_multiple_of(n);
    ok.then_some(n)
}

/// Longest chunk of rot_qkv (ROT_QKV_MAX in fused.hip).
pub(super) const ROT_QKV_MAX: usize = 256;

/// The attention input of one token (qkv_nodes) in one launch (mul_mat_vec_q1_qkv) that
/// writes ROPE(q) and the two cache rows. Q, K, V and ROPE(k) are not written, so each must
/// feed only the node after it; rope NORMAL, or NEOX over whole heads. A quantized cache row
/// (Q8_0, Q4_0: a block needs 32 values, more than a block of the launch has) is written as F32
/// into the SET_ROWS's source (ROPE(k) / V's product) and quantized into the cache by the
/// SET_ROWS kernel after it. With the rotations of quantized caches, roped Q and K and V go as
/// F32 into the rotations' outputs instead, and one more launch (rot_qkv) transforms them and
/// writes the cache rows: two launches where llama's graph has ten nodes.
/// `check`: only whether it would fuse (nothing launched).
pub(super) fn try_fused_qkv(
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
        if reads_of.iter().flatten().any(|r| w.overlaps(r))
            || writes[n + 1..].iter().any(|o| w.overlaps(o))
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
/// TB/s; one warp for such rows: 8B tg64 312/314 -> 322/318 t/s.
pub(super) fn qkv_warps(t: GgmlType, k: usize) -> usize {
    let parts = k / t.block_size() * mvq_parts_per_block(t);
    let w = parts / (MV1_UNROLL * 32);
    if w == 0 {
        MV1_WARPS
    } else {
        w.min(MV1_WARPS)
    }
}

/// Parts a lane takes per weight block in the integer-dot kernels (NSUB in mmvq.hip).
pub(super) fn mvq_parts_per_block(t: GgmlType) -> usize {
    match t {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q2_0 | GgmlType::NVFP4 => 2,
        GgmlType::Q1_0 => 4,
        GgmlType::Q6_K => 8,
        GgmlType::Q4_K => 16,
        _ => 1,
    }
}

/// A ROPE that fused_rope_kv computes: F32 rows, normal or neox mode, one sequence (ne3 = 1).
pub(super) fn rope_fusable(r: &Tensor) -> bool {
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
pub(super) fn same_rope(a: &Tensor, b: &Tensor) -> bool {
    let pos = |t: &Tensor| t.src(1).map(|p| p.data() as usize);
    let ff = |t: &Tensor| t.src(2).map(|p| p.data() as usize);
    pos(a) == pos(b)
        && ff(a) == ff(b)
        && a.raw().op_params == b.raw().op_params
        && a.ne()[0] == b.ne()[0]
        && a.ne()[2] == b.ne()[2]
}

/// Row ids of a SET_ROWS that fused_rope_kv reads: one per token, dense.
pub(super) fn row_ids_ok(idx: &Tensor, n_tok: usize) -> bool {
    matches!(idx.dtype(), GgmlType::I32 | GgmlType::I64) && idx.ne() == [n_tok, 1, 1, 1]
}

/// A SET_ROWS of `n_tok` dense F32 rows of `n` values into a 2-D F16 / F32 tensor.
pub(super) fn set_rows_plain(s: &Tensor, n: usize, n_tok: usize) -> bool {
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
pub(super) fn set_rows_quant(s: &Tensor, n: usize) -> bool {
    let (Some(a), Some(idx)) = (s.src(0), s.src(1)) else {
        return false;
    };
    s.op() == op::SET_ROWS
        && supports_set_rows(s)
        && matches!(s.dtype(), GgmlType::Q8_0 | GgmlType::Q4_0)
        && s.ne()[0] == n
        && n.is_multiple_of(32)
        && s.ne()[2] == 1
        && s.ne()[3] == 1
        && a.dtype() == GgmlType::F32
        && a.ne() == [n, 1, 1, 1]
        && a.nb()[0] == 4
        && row_ids_ok(&idx, 1)
}

/// A SET_ROWS of `n` F32 values (a dense [1, n] view), each into its own row (of one value)
/// of a 2-D F16 / F32 tensor: ids [n], dense.
pub(super) fn set_rows_per_value(s: &Tensor, n: usize) -> bool {
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
pub(super) fn try_fused_rope_kv(
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
        && !ka.overlaps(&sk);
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
            && !sv.overlaps(&sk)
            && !sv.overlaps(&ka)
            && !va.overlaps(&sk)
            && q.is_none_or(|q| {
                !sv.overlaps(&q) && !sv.overlaps(&q.src(0).unwrap()) && !va.overlaps(&q)
            })
    });
    if let Some(q) = q {
        // q's rows are written while k's and v's are read and the caches written.
        let qa = q.src(0).unwrap();
        if q.overlaps(&ka) || q.overlaps(&sk) || qa.overlaps(&sk) {
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
