// FLASH_ATTN_EXT: out = softmax(scale * q.K^T [softcapped] + slope * mask) . V per query
// row, one pass over the keys with an online softmax (f32 accumulators), as
// src/cpu/ops/flash_attn.rs. q F32; K and V F16, Q8_0 or F32 (heads broadcast for GQA); mask F16
// (may be NULL) broadcast over heads/sequences; sinks F32 per head (may be NULL).
// Output F32 [DV, n_head, n_q, n_seq]. One block per query row: its warps take every
// FA_WARPS-th key each (lanes across the head dimension, D <= 32 * FA_MAX_PER_LANE), then
// their partial softmax sums are merged; a single query row (generation) thus still keeps
// FA_WARPS warps busy per head. Where ggml-cpu takes its row-by-row algorithm with F16 V
// (f16_acc: few queries and a short cache, see src/cpu/ops/flash_attn.rs) the block is one
// warp taking the keys in order with ggml's f16 accumulator, so generation agrees with
// ggml-cpu's. q is rounded as ggml-cpu rounds it for its K type (round_q:
// 1 = to f16 for F16 K, 2 = to Q8_0 blocks for Q8_0 K). With `part` set, blocks (row, split)
// each take a range of keys and write partial results (split-KV, see flash_attn_split.hip);
// with `counters` set too, the last block of a row to finish merges the row's partials
// itself (fa_merge_row: what flash_attn_split_combine does, quantizing into xq/xds when given),
// so generation's attention is one launch.
#include "prelude.h"
#include "quants.h"

#define FA_MAX_PER_LANE 8
#define FA_WARPS 8

// The end of a merged row (running maximum m, sum of weights s, NJ unnormalized outputs per
// lane), by one warp: the sink (one more logit per head, with no value row) added, the row
// normalized into dst [DV, n_head, n_q, n_seq] and, when xq is set, quantized as quantize_q8
// mode 0 for the output projection (DV % 32 == 0). Also flash_attn_split_combine's end.
template <int NJ>
RF_DEVICE void fa_finish_row(float m, float s, float* acc, i64 r, const float* sinks, char* d, i64 DV, i64 n_q,
                             i64 n_head, i64 nbd1, signed char* xq, float2* xds) {
    const int lane = threadIdx.x % RF_WARP_SIZE;
    const i64 iq1 = r % n_q, iq2 = (r / n_q) % n_head, iq3 = r / (n_q * n_head);
    float total = s;
    if (sinks) {
        const float sink = sinks[iq2];
        const float m_all = fmaxf(m, sink);
        const float f = m == rf_neg_inf() ? 0.0f : expf(m - m_all);
        total = total * f + expf(sink - m_all);
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[j] *= f;
    }
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;
    const i64 orow = (iq3 * n_q + iq1) * n_head + iq2;
    float* out = (float*)(d + orow * nbd1);
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const i64 c = lane + (i64)j * RF_WARP_SIZE;
        if (c < DV) out[c] = acc[j] * inv;
    }
    if (xq) {
        // Lanes of a group of 32 hold one block (c = lane + j * warp): all in or all out.
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const i64 c = lane + (i64)j * RF_WARP_SIZE;
            if (c - lane % 32 < DV) quantize_vals32(acc[j] * inv, xq + orow * DV, xds + orow * (DV / 32), c / 32, lane % 32);
        }
    }
}

// One warp merges the n_split partials of row r (stride DV + 2: outputs, maximum, sum) and
// finishes the row (fa_finish_row); lane c holds outputs c + j * warp. The partials were
// written by other blocks of this launch: read from L2 (rf_load_l2), past any stale L1 line.
// Lane i reads split i's maximum and sum, and the outputs of the first UB splits are read with
// them: up to UB splits take one trip to memory. No load waits on a loaded value.
template <int NJ>
RF_DEVICE void fa_merge_row(const float* part, i64 r, i64 n_split, const float* sinks, char* d, i64 DV, i64 n_q,
                            i64 n_head, i64 nbd1, signed char* xq, float2* xds) {
    constexpr int UB = NJ >= 8 ? 4 : 8;  // splits whose outputs are loaded at once
    const int lane = threadIdx.x % RF_WARP_SIZE;
    const float* base = part + r * n_split * (DV + 2);
    float x[UB][NJ];
    auto load_outputs = [&](i64 first, int n) {
#pragma unroll
        for (int u = 0; u < UB; u++) {
            const float* pr = base + (first + u) * (DV + 2);
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const i64 c = lane + (i64)j * RF_WARP_SIZE;
                x[u][j] = u < n && c < DV ? rf_load_l2(pr + c) : 0.0f;
            }
        }
    };
    float pm = rf_neg_inf(), ps = 0.0f;
    if (lane < n_split) {
        pm = rf_load_l2(base + lane * (DV + 2) + DV);
        ps = rf_load_l2(base + lane * (DV + 2) + DV + 1);
    }
    load_outputs(0, n_split < UB ? (int)n_split : UB);
    float m = pm;
    for (i64 sp = lane + RF_WARP_SIZE; sp < n_split; sp += RF_WARP_SIZE) m = fmaxf(m, rf_load_l2(base + sp * (DV + 2) + DV));
    m = rf_warp_max(m);
    float s = 0.0f, acc[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[j] = 0.0f;
    for (i64 s0 = 0; s0 < n_split; s0 += RF_WARP_SIZE) {
        if (s0 > 0) {
            pm = rf_neg_inf();
            ps = 0.0f;
            if (s0 + lane < n_split) {
                pm = rf_load_l2(base + (s0 + lane) * (DV + 2) + DV);
                ps = rf_load_l2(base + (s0 + lane) * (DV + 2) + DV + 1);
            }
        }
        const float f = pm == rf_neg_inf() ? 0.0f : expf(pm - m);  // a split that saw no visible key weighs 0
        s += f * ps;
        const int n = n_split - s0 < RF_WARP_SIZE ? (int)(n_split - s0) : RF_WARP_SIZE;
        for (int u0 = 0; u0 < n; u0 += UB) {
            if (s0 > 0 || u0 > 0) load_outputs(s0 + u0, n - u0);
#pragma unroll
            for (int u = 0; u < UB; u++) {
                const float fu = rf_shfl(f, u0 + u);  // 0 past the last split
#pragma unroll
                for (int j = 0; j < NJ; j++) acc[j] += fu * x[u][j];
            }
        }
    }
    fa_finish_row<NJ>(m, rf_warp_sum(s), acc, r, sinks, d, DV, n_q, n_head, nbd1, xq, xds);
}

// Keys [ic0, ic1) of block (row, blockIdx.y): all of them, or with `part` (split-KV) the
// block's range of split_keys.
RF_DEVICE void fa_key_range(const float* part, i64 split_keys, i64 n_kv, i64* ic0, i64* ic1) {
    *ic0 = part ? (i64)blockIdx.y * split_keys : 0;
    *ic1 = part && *ic0 + split_keys < n_kv ? *ic0 + split_keys : n_kv;
}

template <typename KT, typename VT>
RF_DEVICE void flash_attn(const char* q, const char* k, const char* v, const char* mask, const float* sinks, char* d,
                          i64 DK, i64 DV, i64 n_q, i64 n_head, i64 n_seq, i64 n_kv, i64 rk2, i64 rv2, i64 nbq1,
                          i64 nbq2, i64 nbq3, i64 nbk1, i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2, i64 nbv3, i64 mne2,
                          i64 mne3, i64 nbm1, i64 nbm2, i64 nbm3, i64 nbd1, float scale, float softcap,
                          float max_bias, float m0, float m1, int n_head_log2, int round_q, int f16_acc,
                          float* part, i64 split_keys, unsigned* counters, signed char* xq, float2* xds) {
    __shared__ float part_m[FA_WARPS], part_s[FA_WARPS];
    __shared__ float part_acc[FA_WARPS][RF_WARP_SIZE * FA_MAX_PER_LANE];
    const int lane = threadIdx.x % RF_WARP_SIZE, warp = threadIdx.x / RF_WARP_SIZE;
    const int nwarps = blockDim.x / RF_WARP_SIZE;
    const i64 r = blockIdx.x;
    const i64 iq1 = r % n_q, iq2 = (r / n_q) % n_head, iq3 = r / (n_q * n_head);
    const float slope = rf_alibi_slope(iq2, max_bias, m0, m1, n_head_log2);
    const float* qr = (const float*)(q + iq1 * nbq1 + iq2 * nbq2 + iq3 * nbq3);
    float qv[FA_MAX_PER_LANE], acc[FA_MAX_PER_LANE];
#pragma unroll
    for (int j = 0; j < FA_MAX_PER_LANE; j++) {
        const i64 c = lane + (i64)j * RF_WARP_SIZE;
        float x = c < DK ? qr[c] : 0.0f;
        if (round_q == 1) x = rf_f16_to_f32(rf_f32_to_f16(x));
        if (round_q == 2) {
            // Q8_0 blocks: 32 consecutive channels are one aligned group of 32 lanes (DK % 32 == 0).
            float d32, qi;
            x = rf_round_q8_32(x, d32, qi);
        }
        qv[j] = x;
        acc[j] = 0.0f;
    }
    const char* kb = k + (iq2 / rk2) * nbk2 + iq3 * nbk3;
    const char* vb = v + (iq2 / rv2) * nbv2 + iq3 * nbv3;
    const f16_bits* mrow = mask ? (const f16_bits*)(mask + iq1 * nbm1 + (iq2 % mne2) * nbm2 + (iq3 % mne3) * nbm3) : 0;
    // Split-KV (part != 0): block y takes keys [y * split_keys, (y + 1) * split_keys) and
    // writes a partial result for flash_attn_split_combine (flash_attn_split.hip).
    i64 ic0, ic1;
    fa_key_range(part, split_keys, n_kv, &ic0, &ic1);
    float m_max = rf_neg_inf(), s_sum = 0.0f;
    for (i64 ic = ic0 + warp; ic < ic1; ic += nwarps) {
        const float mv = mrow ? slope * rf_f16_to_f32(mrow[ic]) : 0.0f;
        if (mv == rf_neg_inf()) continue;
        const char* kr = kb + ic * nbk1;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < FA_MAX_PER_LANE; j++) {
            const i64 c = lane + (i64)j * RF_WARP_SIZE;
            if (c < DK) s += qv[j] * load_w<KT>(kr, c);
        }
        s = rf_warp_sum(s) * scale;
        if (softcap != 0.0f) s = softcap * tanhf(s);
        s += mv;
        float ms = 1.0f, vs = 1.0f;
        if (s > m_max) {
            ms = expf(m_max - s);
            m_max = s;
        } else {
            vs = expf(s - m_max);
        }
        const char* vr = vb + ic * nbv1;
        if (f16_acc) {
            // ggml-cpu's row-by-row F16 V accumulator: scaled on a new maximum, then a fused
            // multiply-add, each rounded to f16 (one warp per row, keys in order).
#pragma unroll
            for (int j = 0; j < FA_MAX_PER_LANE; j++) {
                const i64 c = lane + (i64)j * RF_WARP_SIZE;
                if (c < DV) {
                    float a = acc[j];
                    if (ms != 1.0f) a = rf_f16_to_f32(rf_f32_to_f16(a * ms));
                    acc[j] = rf_f16_to_f32(rf_f32_to_f16(fmaf(load_w<VT>(vr, c), vs, a)));
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < FA_MAX_PER_LANE; j++) {
                const i64 c = lane + (i64)j * RF_WARP_SIZE;
                if (c < DV) acc[j] = acc[j] * ms + load_w<VT>(vr, c) * vs;
            }
        }
        s_sum = s_sum * ms + vs;
    }
    // Merge the warps' partial results (running max, sum of weights, weighted V).
    if (lane == 0) {
        part_m[warp] = m_max;
        part_s[warp] = s_sum;
    }
#pragma unroll
    for (int j = 0; j < FA_MAX_PER_LANE; j++) part_acc[warp][lane + j * RF_WARP_SIZE] = acc[j];
    __syncthreads();
    if (warp != 0) return;
    float m_all = rf_neg_inf();
    for (int w = 0; w < nwarps; w++) m_all = fmaxf(m_all, part_m[w]);
    if (part) {
        // Partial result: unnormalized outputs, maximum, sum of weights (the sink is added
        // when the partials are merged).
        float* pr = part + ((i64)blockIdx.x * gridDim.y + blockIdx.y) * (DV + 2);
        float total = 0.0f;
        float out_acc[FA_MAX_PER_LANE];
#pragma unroll
        for (int j = 0; j < FA_MAX_PER_LANE; j++) out_acc[j] = 0.0f;
        for (int w = 0; w < nwarps; w++) {
            if (part_m[w] == rf_neg_inf()) continue;
            const float f = expf(part_m[w] - m_all);
            total += part_s[w] * f;
#pragma unroll
            for (int j = 0; j < FA_MAX_PER_LANE; j++) out_acc[j] += part_acc[w][lane + j * RF_WARP_SIZE] * f;
        }
#pragma unroll
        for (int j = 0; j < FA_MAX_PER_LANE; j++) {
            const i64 c = lane + (i64)j * RF_WARP_SIZE;
            if (c < DV) pr[c] = out_acc[j];
        }
        if (lane == 0) {
            pr[DV] = m_all;
            pr[DV + 1] = total;
        }
        if (counters) {
            // Publish the partial, then count it; the row's last block merges them all and
            // sets the counter back to 0 for the next launch (or replay).
            __threadfence();
            float last = 0.0f;
            if (lane == 0) last = atomicAdd(counters + r, 1u) == gridDim.y - 1 ? 1.0f : 0.0f;
            if (rf_warp_sum(last) == 0.0f) return;
            __threadfence();
            if (lane == 0) counters[r] = 0;
            fa_merge_row<FA_MAX_PER_LANE>(part, r, gridDim.y, sinks, d, DV, n_q, n_head, nbd1, xq, xds);
        }
        return;
    }
    // Attention sinks: one more logit per head with no value row.
    const float sink = sinks ? sinks[iq2] : rf_neg_inf();
    m_all = fmaxf(m_all, sink);
    float total = sinks && m_all != rf_neg_inf() ? expf(sink - m_all) : 0.0f;
    float out_acc[FA_MAX_PER_LANE];
#pragma unroll
    for (int j = 0; j < FA_MAX_PER_LANE; j++) out_acc[j] = 0.0f;
    for (int w = 0; w < nwarps; w++) {
        if (part_m[w] == rf_neg_inf()) continue;  // this warp saw no visible key
        const float f = expf(part_m[w] - m_all);
        total += part_s[w] * f;
#pragma unroll
        for (int j = 0; j < FA_MAX_PER_LANE; j++) out_acc[j] += part_acc[w][lane + j * RF_WARP_SIZE] * f;
    }
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;
    float* out = (float*)(d + ((iq3 * n_q + iq1) * n_head + iq2) * nbd1);
#pragma unroll
    for (int j = 0; j < FA_MAX_PER_LANE; j++) {
        const i64 c = lane + (i64)j * RF_WARP_SIZE;
        if (c < DV) out[c] = out_acc[j] * inv;
    }
}

// Keys [ic0, ic1) of sequence iq3 into L2: the whole K and V rows (each holds every KV head),
// from the first key's to the last value of the last head in the last key's row, and the
// mask row of query 0 and head 0. k32 / v32: bytes of 32 values of K / V.
RF_DEVICE void fa_rows_prefetch_l2(const char* k, const char* v, const char* mask, i64 iq3, i64 ic0, i64 ic1, i64 DK,
                                   i64 DV, i64 k_heads, i64 v_heads, i64 nbk1, i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2,
                                   i64 nbv3, i64 mne3, i64 nbm3, i64 k32, i64 v32) {
    if (ic1 <= ic0) return;
    rf_prefetch_l2(k + iq3 * nbk3 + ic0 * nbk1, (ic1 - 1 - ic0) * nbk1 + (k_heads - 1) * nbk2 + (DK + 31) / 32 * k32);
    rf_prefetch_l2(v + iq3 * nbv3 + ic0 * nbv1, (ic1 - 1 - ic0) * nbv1 + (v_heads - 1) * nbv2 + (DV + 31) / 32 * v32);
    if (mask) rf_prefetch_l2(mask + (iq3 % mne3) * nbm3 + ic0 * 2, (ic1 - ic0) * 2);
}

// What block (row, split) reads, into L2 before its rf_grid_begin() (arithmetic on the
// arguments only). The rows of one query share the K/V rows: only the blocks of query 0 and
// head 0 ask, for the whole rows of their keys.
RF_DEVICE void fa_prefetch_l2(const char* k, const char* v, const char* mask, i64 DK, i64 DV, i64 n_q, i64 n_head,
                              i64 n_kv, i64 rk2, i64 rv2, i64 nbk1, i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2, i64 nbv3,
                              i64 mne2, i64 mne3, i64 nbm2, i64 nbm3, const float* part, i64 split_keys, i64 k32,
                              i64 v32) {
    const i64 r = blockIdx.x;
    const i64 iq1 = r % n_q, iq2 = (r / n_q) % n_head, iq3 = r / (n_q * n_head);
    if (iq1 != 0 || iq2 != 0) return;
    i64 ic0, ic1;
    fa_key_range(part, split_keys, n_kv, &ic0, &ic1);
    fa_rows_prefetch_l2(k, v, mask, iq3, ic0, ic1, DK, DV, n_head / rk2, n_head / rv2, nbk1, nbk2, nbk3, nbv1, nbv2, nbv3,
                        mne3, nbm3, k32, v32);
}
#define FA_PREFETCH(K32, V32)                                                                                   \
    k, v, mask, DK, DV, n_q, n_head, n_kv, rk2, rv2, nbk1, nbk2, nbk3, nbv1, nbv2, nbv3, mne2, mne3, nbm2, nbm3, \
        part, split_keys, K32, V32
#define FA_ARGS                                                                                                  \
    const char *q, const char *k, const char *v, const char *mask, const float *sinks, char *d, i64 DK, i64 DV,  \
        i64 n_q, i64 n_head, i64 n_seq, i64 n_kv, i64 rk2, i64 rv2, i64 nbq1, i64 nbq2, i64 nbq3, i64 nbk1,      \
        i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2, i64 nbv3, i64 mne2, i64 mne3, i64 nbm1, i64 nbm2, i64 nbm3,      \
        i64 nbd1, float scale, float softcap, float max_bias, float m0, float m1, int n_head_log2, int round_q, \
        int f16_acc, float *part, i64 split_keys, unsigned *counters, signed char *xq, float2 *xds
#define FA_PASS                                                                                                \
    q, k, v, mask, sinks, d, DK, DV, n_q, n_head, n_seq, n_kv, rk2, rv2, nbq1, nbq2, nbq3, nbk1, nbk2, nbk3, nbv1, \
        nbv2, nbv3, mne2, mne3, nbm1, nbm2, nbm3, nbd1, scale, softcap, max_bias, m0, m1, n_head_log2, round_q, \
        f16_acc, part, split_keys, counters, xq, xds

#if RF_ALL || RF_T_f16
RF_KERNEL void flash_attn_f16_f16(FA_ARGS) {
    fa_prefetch_l2(FA_PREFETCH(64, 64));
    rf_grid_begin();
    flash_attn<w_f16, w_f16>(FA_PASS);
}
#endif
#if RF_ALL || RF_T_f32
RF_KERNEL void flash_attn_f32_f32(FA_ARGS) {
    fa_prefetch_l2(FA_PREFETCH(128, 128));
    rf_grid_begin();
    flash_attn<w_f32, w_f32>(FA_PASS);
}
#endif
#if RF_ALL || RF_T_q8_0
RF_KERNEL void flash_attn_q8_0_q8_0(FA_ARGS) {
    fa_prefetch_l2(FA_PREFETCH(34, 34));
    rf_grid_begin();
    flash_attn<w_q8_0, w_q8_0>(FA_PASS);
}
#endif
