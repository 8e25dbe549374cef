//! FLASH_ATTN_EXT: which kernel a node takes (row-per-block, tiled prompt, tensor-core prompt,
//! generation vector kernel, split over keys) and how its launch is planned (flash_attn*.hip).

use super::args::Args;
use super::scratch::{q8_out_ptrs, Q8Src};
use super::{LaunchCtx, MAX_GRID_YZ};
use crate::ggml_types::GgmlType;
use crate::gpu::api::ApiResult;
use crate::tensor::Tensor;

/// Largest head size the attention kernel holds (32 lanes x 8 values).
pub(super) const FA_MAX_HEAD: usize = 256;

/// Warps per query row in flash attention (FA_WARPS in kernels/flash_attn.hip): they split the keys.
pub(super) const FA_WARPS: usize = 8;

/// Largest head size of the prompt attention kernel (kernels/flash_attn_tiled.hip), and from
/// how many query rows on it is used.
pub(super) const FA_TILE_MAX_HEAD: usize = 128;

pub(super) const FA_TILE_MIN_Q: usize = 32;

/// Query rows per block of the prompt attention kernel (256 threads). On an H100 (SmolLM2
/// pp512, ncu) a 32-row launch took 86 us, a 16-row one (128 threads, twice the blocks) 114 us.
pub(super) const FA_TILE_ROWS: usize = 32;

/// `ROCMFORGE_GPU_FA_TILED=0` sends prompts through the row-per-block kernel too (A/B runs).
pub(super) fn fa_tiled_enabled() -> bool {
    crate::tuning::get().gpu_fa_tiled
}

pub(super) fn supports_flash_attn(node: &Tensor) -> bool {
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
pub(super) fn fa_f16_acc_enabled() -> bool {
    crate::tuning::get().gpu_fa_f16_acc
}

/// Split-KV for few query rows: 1 (default) the row kernel (flash_attn.hip) with each row's
/// keys split over blocks, 2 the key-per-lane kernel (flash_attn_split.hip), 0 no split
/// (`ROCMFORGE_GPU_FA_SPLIT`, for A/B runs).
pub(super) fn fa_split_mode() -> u8 {
    crate::tuning::get().gpu_fa_split
}

/// Whether this node takes ggml-cpu's f16 V accumulator (opt-in, see launch_flash_attn):
/// ggml-cpu's row-by-row algorithm with F16 V, i.e. neither its single-query split over
/// 512+ keys nor its tiling of 64+ queries (as src/cpu/ops/flash_attn.rs decides).
pub(super) fn fa_f16_acc(node: &Tensor) -> bool {
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
pub(super) fn fa_prompt(node: &Tensor) -> bool {
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
pub(super) fn fa_tiled(node: &Tensor) -> bool {
    fa_prompt(node)
        && node
            .src(1)
            .is_some_and(|k| matches!(k.dtype(), GgmlType::F16 | GgmlType::F32))
}

/// `ROCMFORGE_GPU_FA_MMA=0` keeps prompts on flash_attn_tiled.hip where the tensor-core
/// kernel could take them (A/B runs, and the scalar kernel's tests on NVIDIA).
pub(super) fn fa_mma_enabled() -> bool {
    crate::tuning::get().gpu_fa_mma
}

/// The K/V kind of the tile kernels (flash_attn_mma.hip, flash_attn_vec.hip) in their names:
/// F16 K and V with 16-byte aligned rows (16-byte loads, cp.async) or Q8_0 K and V (2-byte
/// aligned blocks); None for anything else.
pub(super) fn fa_kv_kind(k: &Tensor, v: &Tensor) -> Option<&'static str> {
    let aligned = |t: &Tensor, a: usize| {
        (t.data() as usize).is_multiple_of(a) && t.nb()[1..].iter().all(|n| n.is_multiple_of(a))
    };
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
pub(super) fn fa_mma_shape(node: &Tensor, lc: &LaunchCtx) -> Option<(&'static str, usize, usize)> {
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
    crate::gpu::kernels::FM_SHAPES
        .contains(&(d, warps))
        .then_some((kv, d, warps))
}

/// The tensor-core prompt kernel split over the keys: at most FM_SPLIT_MAX splits of at least
/// FM_SPLIT_MIN_KEYS keys, their partials within FM_SPLIT_BYTES of scratch. H100, SmolLM2
/// pp512 (one call, two rounds): after 2048 tokens 45.3k / 52.5k t/s split 4 ways against
/// 35.1k / 38.7k unsplit (Q8_0 caches 39.0k / 42.3k against 30.6k / 28.1k); without context
/// (512 keys, 2 splits of 256) 56.8k / 74.7k against 67.5k / 68.7k, no gain: 512 keys a split
/// at least.
pub(super) const FM_SPLIT_MAX: usize = 8;

pub(super) const FM_SPLIT_MIN_KEYS: usize = 512;

pub(super) const FM_SPLIT_BYTES: usize = 16 << 20;

/// Keys per tile of flash_attn_mma.hip (FM_BK): a split takes whole tiles.
pub(super) const FM_BK: usize = 64;

/// `ROCMFORGE_GPU_FA_MMA_SPLIT=0`: prompts on tensor cores never split over the keys (A/B runs).
pub(super) fn fm_split_enabled() -> bool {
    crate::tuning::get().gpu_fa_mma_split
}

/// Most splits of the prompt node's keys: by key count and scratch bytes (the plan's bound,
/// whatever the device; 1 where the node would not split).
pub(super) fn fm_split_max(node: &Tensor) -> usize {
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
        .clamp(1, FM_SPLIT_MAX)
}

/// How flash_attn_mma splits a prompt's keys: (splits, keys per split, a multiple of FM_BK).
/// Enough splits that `blocks` (query tiles x heads x sequences) times the splits fill what
/// the GPU holds at once: about 8 warps a compute unit (the kernel's ~250 registers a thread
/// allow two 4-warp blocks an SM). H100, SmolLM2 (9 heads, 32-row blocks) pp512 after 2048
/// tokens: 144 blocks walked 40 key tiles each, one after another.
pub(super) fn fm_split_plan(
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
pub(super) const FA_MAX_SPLITS: usize = 64;

pub(super) const FA_SPLIT_MAX_PARTS: usize = 2048;

/// Per-row counters of the split-KV row kernel's one-launch merge (rows are at most
/// FA_SPLIT_MAX_PARTS / 2).
pub const FA_COUNTERS: usize = FA_SPLIT_MAX_PARTS / 2;

/// Most warps per block of the split-KV kernel (FAS_MAX_WARPS in flash_attn_split.hip is 8).
pub(super) const FA_SPLIT_WARPS: usize = 4;

/// Where in the scratch the split path's combine kernel puts dst quantized (quantize_q8 mode
/// 0, as the matrix-vector product reading it next wants it): after the partial results.
/// None where dst is not contiguous F32 rows of whole blocks.
pub(super) fn fa_q8_at(node: &Tensor) -> Option<usize> {
    let dv = node.src(2)?.ne()[0];
    let parts = fa_split_max_parts(node)?;
    (dv % 32 == 0 && node.dtype() == GgmlType::F32 && node.is_contiguous())
        .then(|| (parts * fa_part_floats(node) * 4).next_multiple_of(256))
}

/// Floats of one partial result of the split-KV kernel: DV outputs, maximum, sum.
pub(super) fn fa_part_floats(node: &Tensor) -> usize {
    node.src(2).map_or(0, |v| v.ne()[0]) + 2
}

/// The most partial results the split-KV path (kernels/flash_attn_split.hip) may write for
/// this node, or None where it does not take the node: the prompt tiles, the f16
/// accumulator, or too many query rows (they fill the GPU as they are).
pub(super) fn fa_split_max_parts(node: &Tensor) -> Option<usize> {
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
pub(super) fn fa_row_split_plan(
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
pub(super) fn fa_split_plan(
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
pub(super) const FA_VEC_THREADS: usize = 128;

pub(super) const FA_VEC_CHUNK: usize = 32;

/// Blocks per compute unit the generation kernel (flash_attn_vec.hip) aims at:
/// `ROCMFORGE_GPU_FA_VEC`, default 8 (H100, 8B-class at a 2048-token context: 2 gave 226/222
/// t/s, 8 230/230: 36 splits of 64 keys instead of 24 of 96; FA_SPLIT_MAX_PARTS caps them);
/// 0 sends generation back to the row kernel (A/B runs).
pub(super) fn fa_vec_blocks_per_cu() -> usize {
    crate::tuning::get().gpu_fa_vec
}

/// A launch of the generation kernel: grid (groups = KV heads x sequences, splits), each
/// split `split_keys` keys (whole chunks).
pub(super) struct FaVecPlan {
    pub(super) groups: usize,
    pub(super) splits: usize,
    pub(super) split_keys: usize,
    /// The kernel's row count (`_r{most_rows}`).
    pub(super) most_rows: usize,
    /// The K/V kind of the kernel name: f16 or q8_0.
    pub(super) kv: &'static str,
}

/// Whether the split-KV path takes the generation kernel (kernels/flash_attn_vec.hip) for
/// this node, and its launch: F16 K and V (16-byte aligned rows) or Q8_0 K and V (2-byte
/// aligned blocks) of one head size (64, 128 or 256), as many K as V heads, the rows reading
/// one KV head (queries x heads of the group) at most those of a kernel for D (FAV_SHAPES:
/// 1024 / D); several splits need the merge counters.
pub(super) fn fa_vec_plan(
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
        || !d.is_multiple_of(warp)
        || !FA_VEC_THREADS.is_multiple_of(warp)
        || kne[2] != vne[2]
    {
        return None;
    }
    let rows_per_block = qne[1] * (qne[2] / kne[2]);
    let (_, most_rows) = *crate::gpu::kernels::FAV_SHAPES
        .iter()
        .find(|(sd, r)| *sd == d && rows_per_block <= *r)?;
    let groups = kne[2] * qne[3];
    if groups == 0 || groups > FA_COUNTERS {
        return None;
    }
    let max_splits = (max_parts / rows.max(1)).min(kne[1].div_ceil(FA_VEC_CHUNK).max(1));
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
pub(super) fn fa_vec_splits(
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
pub(super) fn launch_fa_combine(
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
pub(super) fn no_merge(args: Args) -> Args {
    args.ptr(std::ptr::null())
        .ptr(std::ptr::null())
        .ptr(std::ptr::null())
}

pub(super) fn launch_flash_attn(node: &Tensor, lc: &LaunchCtx) -> ApiResult<()> {
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
        let rows = FA_TILE_ROWS;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml_types::op;
    use crate::gpu::ops::scratch_bytes;

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
}
