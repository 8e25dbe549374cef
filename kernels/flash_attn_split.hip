// FLASH_ATTN_EXT for few query rows (generation): the keys of each row are split over
// several blocks ("flash decoding") so that a handful of rows still fills the GPU, then a
// second kernel merges the partial softmaxes. Same semantics as flash_attn.hip (masks
// broadcast over heads/sequences, ALiBi, softcap, sinks, GQA, F16/F32/Q8_0 K and V, q
// rounded as ggml-cpu rounds it for its K type), f32 accumulators.
//
// flash_attn_split_*: grid (row, split). Split `s` takes keys [s*split_keys, (s+1)*split_keys);
// its warps take chunks of RF_WARP_SIZE keys in turn. Within a chunk each lane scores one key
// (the q row sits in shared memory, K rows are read with wide loads), so a chunk needs one
// max and one sum across the warp rather than a reduction per key; then the lanes, one per
// output channel, accumulate the chunk's V rows weighted by the broadcast probabilities.
// The block's warps are merged and written as one partial: DV unnormalized outputs, the
// running maximum and the sum of weights (stride DV + 2 floats, partial r * n_split + s).
// flash_attn_split_combine: one block per row merges the row's partials, adds the sink and
// writes the normalized row into dst.
#include "prelude.h"
#include "quants.h"
#include "flash_attn.hip"  // fa_finish_row

#define FAS_MAX_D 256
#define FAS_PER_LANE (FAS_MAX_D / RF_WARP_SIZE)
#define FAS_MAX_WARPS 8

// 16-byte loads (no vendor vector types: the run-time compilers get no headers).
struct __attribute__((aligned(16))) fas_u4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(16))) fas_f4 {
    float x, y, z, w;
};

// q . k for one key row, q in shared memory (16-byte aligned, DK values).
template <typename KT> RF_DEVICE float fas_dot(const float* qs, const char* kr, int DK) {
    float s = 0.0f;
    for (int c = 0; c < DK; c++) s += qs[c] * load_w<KT>(kr, c);
    return s;
}
// Eight f16 key values (one 16-byte load) against eight q values.
RF_DEVICE float fas_dot8_f16(const float* qs, const fas_u4* k4, int b) {
    const fas_u4 w = k4[b];
    const fas_f4 qa = ((const fas_f4*)qs)[2 * b], qb = ((const fas_f4*)qs)[2 * b + 1];
    float s = qa.x * rf_f16_to_f32((f16_bits)(w.x & 0xffff)) + qa.y * rf_f16_to_f32((f16_bits)(w.x >> 16));
    s += qa.z * rf_f16_to_f32((f16_bits)(w.y & 0xffff)) + qa.w * rf_f16_to_f32((f16_bits)(w.y >> 16));
    s += qb.x * rf_f16_to_f32((f16_bits)(w.z & 0xffff)) + qb.y * rf_f16_to_f32((f16_bits)(w.z >> 16));
    s += qb.z * rf_f16_to_f32((f16_bits)(w.w & 0xffff)) + qb.w * rf_f16_to_f32((f16_bits)(w.w >> 16));
    return s;
}
template <> RF_DEVICE_SPEC float fas_dot<w_f16>(const float* qs, const char* kr, int DK) {
    float s = 0.0f;
    if (DK % 8 == 0 && ((unsigned long long)kr & 15) == 0) {
        const fas_u4* k4 = (const fas_u4*)kr;
        if (DK == 64) {
            // The common head size: every load in flight at once.
#pragma unroll
            for (int b = 0; b < 8; b++) s += fas_dot8_f16(qs, k4, b);
            return s;
        }
#pragma unroll 4
        for (int b = 0; b < DK / 8; b++) s += fas_dot8_f16(qs, k4, b);
        return s;
    }
    for (int c = 0; c < DK; c++) s += qs[c] * load_w<w_f16>(kr, c);
    return s;
}
template <> RF_DEVICE_SPEC float fas_dot<w_f32>(const float* qs, const char* kr, int DK) {
    float s = 0.0f;
    if (DK % 4 == 0 && ((unsigned long long)kr & 15) == 0) {
        const fas_f4* k4 = (const fas_f4*)kr;
#pragma unroll 4
        for (int b = 0; b < DK / 4; b++) {
            const fas_f4 w = k4[b], qa = ((const fas_f4*)qs)[b];
            s += qa.x * w.x + qa.y * w.y + qa.z * w.z + qa.w * w.w;
        }
        return s;
    }
    for (int c = 0; c < DK; c++) s += qs[c] * load_w<w_f32>(kr, c);
    return s;
}
template <> RF_DEVICE_SPEC float fas_dot<w_q8_0>(const float* qs, const char* kr, int DK) {
    // Whole blocks of 32 (DK % 32 == 0: the launcher checks).
    float s = 0.0f;
    for (int b = 0; b < DK / 32; b++) {
        float kv[32];
        load_block32<w_q8_0>(kr, b, kv);
        float t = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) t += qs[b * 32 + j] * kv[j];
        s += t;
    }
    return s;
}

// Merges the block's warps' (max, sum, acc) in shared memory. Warp 0 returns the merged
// values in m, s and acc (other warps' results are meaningless).
template <int NJ>
RF_DEVICE void fas_merge_warps(float& m, float& s, float* acc, float* sm, float* ss, float (*sacc)[FAS_MAX_D]) {
    const int lane = threadIdx.x % RF_WARP_SIZE, warp = threadIdx.x / RF_WARP_SIZE;
    const int nwarps = blockDim.x / RF_WARP_SIZE;
    if (nwarps == 1) return;
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
#pragma unroll
    for (int j = 0; j < NJ; j++) sacc[warp][lane + j * RF_WARP_SIZE] = acc[j];
    __syncthreads();
    if (warp != 0) return;
    float m_all = rf_neg_inf();
    for (int w = 0; w < nwarps; w++) m_all = fmaxf(m_all, sm[w]);
    float total = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[j] = 0.0f;
    for (int w = 0; w < nwarps; w++) {
        if (sm[w] == rf_neg_inf()) continue;  // this warp saw no visible key
        const float f = expf(sm[w] - m_all);
        total += ss[w] * f;
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[j] += sacc[w][lane + j * RF_WARP_SIZE] * f;
    }
    m = m_all;
    s = total;
}

template <typename KT, typename VT, int NJ>
RF_DEVICE void flash_attn_split(const char* q, const char* k, const char* v, const char* mask, float* part, i64 DK,
                                i64 DV, i64 n_q, i64 n_head, i64 n_kv, i64 split_keys, i64 rk2, i64 rv2, i64 nbq1,
                                i64 nbq2, i64 nbq3, i64 nbk1, i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2, i64 nbv3,
                                i64 mne2, i64 mne3, i64 nbm1, i64 nbm2, i64 nbm3, float scale, float softcap,
                                float max_bias, float m0, float m1, int n_head_log2, int round_q) {
    __shared__ fas_f4 qs4[FAS_MAX_D / 4];
    float* qs = (float*)qs4;
    __shared__ float sm[FAS_MAX_WARPS], ss[FAS_MAX_WARPS];
    __shared__ float sacc[FAS_MAX_WARPS][FAS_MAX_D];
    const int lane = threadIdx.x % RF_WARP_SIZE, warp = threadIdx.x / RF_WARP_SIZE;
    const int nwarps = blockDim.x / RF_WARP_SIZE;
    const i64 r = blockIdx.x, split = blockIdx.y, n_split = gridDim.y;
    const i64 iq1 = r % n_q, iq2 = (r / n_q) % n_head, iq3 = r / (n_q * n_head);
    const float slope = rf_alibi_slope(iq2, max_bias, m0, m1, n_head_log2);
    // The q row, rounded as ggml-cpu rounds it, into shared memory (warp 0).
    if (warp == 0) {
        const float* qr = (const float*)(q + iq1 * nbq1 + iq2 * nbq2 + iq3 * nbq3);
#pragma unroll
        for (int j = 0; j < FAS_PER_LANE; j++) {
            const i64 c = lane + (i64)j * RF_WARP_SIZE;
            float x = c < DK ? qr[c] : 0.0f;
            if (round_q == 1) x = rf_f16_to_f32(rf_f32_to_f16(x));
            if (round_q == 2) {
                // Q8_0 blocks: 32 consecutive channels are one aligned group of 32 lanes (DK % 32 == 0).
                float d32, qi;
                x = rf_round_q8_32(x, d32, qi);
            }
            qs[c] = x;
        }
    }
    __syncthreads();
    const char* kb = k + (iq2 / rk2) * nbk2 + iq3 * nbk3;
    const char* vb = v + (iq2 / rv2) * nbv2 + iq3 * nbv3;
    const f16_bits* mrow = mask ? (const f16_bits*)(mask + iq1 * nbm1 + (iq2 % mne2) * nbm2 + (iq3 % mne3) * nbm3) : 0;
    const i64 ic0 = split * split_keys;
    const i64 ic1 = ic0 + split_keys < n_kv ? ic0 + split_keys : n_kv;
    float m_max = rf_neg_inf(), s_sum = 0.0f, acc[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[j] = 0.0f;
    for (i64 base = ic0 + (i64)warp * RF_WARP_SIZE; base < ic1; base += (i64)nwarps * RF_WARP_SIZE) {
        // Scores: one key per lane.
        const i64 ic = base + lane;
        float s = rf_neg_inf();
        if (ic < ic1) {
            const float mv = mrow ? slope * rf_f16_to_f32(mrow[ic]) : 0.0f;
            if (mv != rf_neg_inf()) {
                s = fas_dot<KT>(qs, kb + ic * nbk1, (int)DK) * scale;
                if (softcap != 0.0f) s = softcap * tanhf(s);
                s += mv;
            }
        }
        const float cmax = rf_warp_max(s);
        if (cmax == rf_neg_inf()) continue;  // every key of the chunk is masked
        const float m_new = fmaxf(m_max, cmax);
        const float ms = expf(m_max - m_new);
        const float p = expf(s - m_new);
        m_max = m_new;
        s_sum = s_sum * ms + rf_warp_sum(p);
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[j] *= ms;
        // Values: lanes across the channels, the chunk's keys in turn. Loads are never
        // skipped (so they can all be in flight): keys past the end are read at the last key
        // and channels past DV at the last channel, and like masked keys add nothing.
        const int nk = (int)(ic1 - base < RF_WARP_SIZE ? ic1 - base : RF_WARP_SIZE);
#pragma unroll
        for (int kk = 0; kk < RF_WARP_SIZE; kk++) {
            const float pk = rf_shfl(p, kk);
            const char* vr = vb + (base + (kk < nk ? kk : nk - 1)) * nbv1;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int c = lane + j * RF_WARP_SIZE;
                const float x = load_w<VT>(vr, c < DV ? c : (int)DV - 1);
                acc[j] = pk != 0.0f ? fmaf(pk, x, acc[j]) : acc[j];
            }
        }
    }
    fas_merge_warps<NJ>(m_max, s_sum, acc, sm, ss, sacc);
    if (warp != 0) return;
    float* out = part + (r * n_split + split) * (DV + 2);
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const i64 c = lane + (i64)j * RF_WARP_SIZE;
        if (c < DV) out[c] = acc[j];
    }
    if (lane == 0) {
        out[DV] = m_max;
        out[DV + 1] = s_sum;
    }
}

#define FAS_ARGS                                                                                                    \
    const char *q, const char *k, const char *v, const char *mask, float *part, i64 DK, i64 DV, i64 n_q,            \
        i64 n_head, i64 n_kv, i64 split_keys, i64 rk2, i64 rv2, i64 nbq1, i64 nbq2, i64 nbq3, i64 nbk1, i64 nbk2,   \
        i64 nbk3, i64 nbv1, i64 nbv2, i64 nbv3, i64 mne2, i64 mne3, i64 nbm1, i64 nbm2, i64 nbm3, float scale,      \
        float softcap, float max_bias, float m0, float m1, int n_head_log2, int round_q
#define FAS_PASS                                                                                                   \
    q, k, v, mask, part, DK, DV, n_q, n_head, n_kv, split_keys, rk2, rv2, nbq1, nbq2, nbq3, nbk1, nbk2, nbk3, nbv1, \
        nbv2, nbv3, mne2, mne3, nbm1, nbm2, nbm3, scale, softcap, max_bias, m0, m1, n_head_log2, round_q

// _dN: head sizes up to N (values per lane fixed at compile time).
#define FAS_NJ(N) ((N) / RF_WARP_SIZE > 0 ? (N) / RF_WARP_SIZE : 1)
#if RF_ALL || RF_T_f16_d64
RF_KERNEL void flash_attn_split_f16_f16_d64(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_f16, w_f16, FAS_NJ(64)>(FAS_PASS); }
#endif
#if RF_ALL || RF_T_f16_d128
RF_KERNEL void flash_attn_split_f16_f16_d128(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_f16, w_f16, FAS_NJ(128)>(FAS_PASS); }
#endif
#if RF_ALL || RF_T_f16_d256
RF_KERNEL void flash_attn_split_f16_f16_d256(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_f16, w_f16, FAS_NJ(256)>(FAS_PASS); }
#endif
#if RF_ALL || RF_T_f32_d64
RF_KERNEL void flash_attn_split_f32_f32_d64(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_f32, w_f32, FAS_NJ(64)>(FAS_PASS); }
#endif
#if RF_ALL || RF_T_f32_d128
RF_KERNEL void flash_attn_split_f32_f32_d128(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_f32, w_f32, FAS_NJ(128)>(FAS_PASS); }
#endif
#if RF_ALL || RF_T_f32_d256
RF_KERNEL void flash_attn_split_f32_f32_d256(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_f32, w_f32, FAS_NJ(256)>(FAS_PASS); }
#endif
#if RF_ALL || RF_T_q8_0_d64
RF_KERNEL void flash_attn_split_q8_0_q8_0_d64(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_q8_0, w_q8_0, FAS_NJ(64)>(FAS_PASS); }
#endif
#if RF_ALL || RF_T_q8_0_d128
RF_KERNEL void flash_attn_split_q8_0_q8_0_d128(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_q8_0, w_q8_0, FAS_NJ(128)>(FAS_PASS); }
#endif
#if RF_ALL || RF_T_q8_0_d256
RF_KERNEL void flash_attn_split_q8_0_q8_0_d256(FAS_ARGS) { rf_grid_begin(); flash_attn_split<w_q8_0, w_q8_0, FAS_NJ(256)>(FAS_PASS); }
#endif

#if RF_UNTYPED
// One block per row: its warps take the row's partials in turn (online merge), then the
// warps are merged, the sink (one more logit per head, with no value row) added and the
// row normalized into dst [DV, n_head, n_q, n_seq]. xq != NULL (dst contiguous, DV % 32 == 0):
// the row is also quantized as quantize_q8 mode 0 quantizes dst seen as rows of DV * n_head
// values (blocks of 32 never cross a head), for the output projection that reads it next.
RF_KERNEL void flash_attn_split_combine(const float* part, const float* sinks, char* d, i64 DV, i64 n_q, i64 n_head,
                                        i64 n_split, i64 nbd1, signed char* xq, float2* xds) {
    rf_grid_begin();
    __shared__ float sm[FAS_MAX_WARPS], ss[FAS_MAX_WARPS];
    __shared__ float sacc[FAS_MAX_WARPS][FAS_MAX_D];
    const int lane = threadIdx.x % RF_WARP_SIZE, warp = threadIdx.x / RF_WARP_SIZE;
    const int nwarps = blockDim.x / RF_WARP_SIZE;
    const i64 r = blockIdx.x;
    float m = rf_neg_inf(), s = 0.0f, acc[FAS_PER_LANE];
#pragma unroll
    for (int j = 0; j < FAS_PER_LANE; j++) acc[j] = 0.0f;
    for (i64 sp = warp; sp < n_split; sp += nwarps) {
        const float* pr = part + (r * n_split + sp) * (DV + 2);
        const float pm = pr[DV];
        if (pm == rf_neg_inf()) continue;  // this split saw no visible key
        const float m_new = fmaxf(m, pm);
        const float fo = expf(m - m_new), fn = expf(pm - m_new);
        s = s * fo + pr[DV + 1] * fn;
#pragma unroll
        for (int j = 0; j < FAS_PER_LANE; j++) {
            const i64 c = lane + (i64)j * RF_WARP_SIZE;
            acc[j] = acc[j] * fo + (c < DV ? pr[c] : 0.0f) * fn;
        }
        m = m_new;
    }
    fas_merge_warps<FAS_PER_LANE>(m, s, acc, sm, ss, sacc);
    if (warp != 0) return;
    fa_finish_row<FAS_PER_LANE>(m, s, acc, r, sinks, d, DV, n_q, n_head, nbd1, xq, xds);
}
#endif
