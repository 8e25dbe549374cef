// FLASH_ATTN_EXT for prompts (many query rows): the same function as flash_attn.hip (online
// softmax over the keys, f32 accumulators, q rounded to f16 for F16 K as ggml-cpu does), but
// a block takes BQ query rows of one head and walks the keys in tiles of FT_BK staged in
// shared memory, so each K/V row is read once per BQ queries instead of once per query, and
// the softmax bookkeeping is done once per tile instead of once per key.
//
// 16 x NTY threads (BQ = 2 * NTY; the launch bound gives the registers of that many threads,
// not of 1024): thread (ty, tx) owns query rows ty and ty + NTY; for the scores it takes keys
// tx and tx + 16 of the tile, for the output the 4-wide value chunks at tx * 4 + 64 * i. A
// row's 16 threads are 16 consecutive lanes, so row max/sum are 16-lane shuffles. Tiles whose
// every score is masked out (the causal upper triangle) are skipped whole.
// Head sizes up to 128 (tiles laid out for 64 or 128); the launcher uses flash_attn.hip beyond.
#include "prelude.h"
#include "quants.h"

// Four floats: one 16-byte shared-memory load.
struct __attribute__((aligned(16))) rf_f4 {
    float x, y, z, w;
};

#define FT_BK 32
#define FT_PS (FT_BK + 4)  // row stride of the P tile (16-byte aligned rows)

// DP: head size the tiles are laid out for (64 or 128; smaller heads are zero-padded), so
// every loop bound is a constant. Rows are DP + 4 floats: 16-byte aligned for 4-wide loads,
// and 8 consecutive rows start on 8 different 4-bank groups. K and V get separate buffers
// where they fit the 48 KiB of static shared memory (DP 64: both tiles load at once); at DP
// 128 they share one.
template <typename KT, typename VT, int DP, int NTY>
RF_DEVICE void flash_attn_tile(const char* q, const char* k, const char* v, const char* mask, const float* sinks,
                               char* d, i64 DK, i64 DV, i64 n_q, i64 n_head, i64 n_seq, i64 n_kv, i64 rk2, i64 rv2,
                               i64 nbq1, i64 nbq2, i64 nbq3, i64 nbk1, i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2,
                               i64 nbv3, i64 mne2, i64 mne3, i64 nbm1, i64 nbm2, i64 nbm3, i64 nbd1, float scale,
                               float softcap, float max_bias, float m0, float m1, int n_head_log2, int round_q) {
    constexpr int BQ = 2 * NTY, NT = 16 * NTY;  // query rows, threads
    constexpr int RS = DP + 4;
    constexpr bool SPLIT_KV = DP <= 64;
    constexpr int NV = DP / 64;  // 4-wide value chunks per thread and row
    __shared__ __attribute__((aligned(16))) float Qs[BQ * RS];
    __shared__ __attribute__((aligned(16))) float Ks[FT_BK * RS];
    __shared__ __attribute__((aligned(16))) float Vbuf[SPLIT_KV ? FT_BK * RS : 4];
    __shared__ __attribute__((aligned(16))) float Ps[BQ * FT_PS];
    float* Vs = SPLIT_KV ? Vbuf : Ks;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const i64 q0 = (i64)blockIdx.x * BQ, iq2 = blockIdx.y, iq3 = blockIdx.z;
    const float slope = rf_alibi_slope(iq2, max_bias, m0, m1, n_head_log2);
    for (int j = 0; j < BQ * DP / NT; j++) {
        const int e = tid + NT * j, r = e / DP, c = e % DP;
        float x = 0.0f;
        if (q0 + r < n_q && c < DK) {
            x = ((const float*)(q + (q0 + r) * nbq1 + iq2 * nbq2 + iq3 * nbq3))[c];
            if (round_q) x = rf_f16_to_f32(rf_f32_to_f16(x));
        }
        Qs[r * RS + c] = x;
    }
    const char* kb = k + (iq2 / rk2) * nbk2 + iq3 * nbk3;
    const char* vb = v + (iq2 / rv2) * nbv2 + iq3 * nbv3;
    const f16_bits* mrow[2];
#pragma unroll
    for (int a = 0; a < 2; a++) {
        const i64 qi = q0 + ty + NTY * a;
        mrow[a] = mask && qi < n_q ? (const f16_bits*)(mask + qi * nbm1 + (iq2 % mne2) * nbm2 + (iq3 % mne3) * nbm3) : 0;
    }
    const float NEG_INF = rf_neg_inf();
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f};
    float acc[2][NV * 4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int i = 0; i < NV * 4; i++) acc[a][i] = 0.0f;

    for (i64 k0 = 0; k0 < n_kv; k0 += FT_BK) {
        // Mask (times the ALiBi slope) of this thread's 2 x 2 scores; -inf = not visible.
        float mv[2][2];
        int any = 0;
#pragma unroll
        for (int a = 0; a < 2; a++) {
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const i64 qi = q0 + ty + NTY * a, kj = k0 + tx + 16 * b;
                float x = NEG_INF;
                if (qi < n_q && kj < n_kv) x = mrow[a] ? slope * rf_f16_to_f32(mrow[a][kj]) : 0.0f;
                mv[a][b] = x;
                any |= x != NEG_INF;
            }
        }
        // Also the barrier after the previous tile's reads of the K/V tiles and P.
        if (!__syncthreads_or(any)) continue;
#pragma unroll
        for (int j = 0; j < FT_BK * DP / NT; j++) {
            const int e = tid + NT * j, r = e / DP, c = e % DP;
            const bool row_ok = k0 + r < n_kv;
            Ks[r * RS + c] = row_ok && c < DK ? load_w<KT>(kb + (k0 + r) * nbk1, c) : 0.0f;
            if (SPLIT_KV) Vs[r * RS + c] = row_ok && c < DV ? load_w<VT>(vb + (k0 + r) * nbv1, c) : 0.0f;
        }
        __syncthreads();
        float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll 4
        for (int c = 0; c < DP; c += 4) {
            const rf_f4 qa = *(const rf_f4*)&Qs[ty * RS + c], qb = *(const rf_f4*)&Qs[(ty + NTY) * RS + c];
            const rf_f4 ka = *(const rf_f4*)&Ks[tx * RS + c], kc = *(const rf_f4*)&Ks[(tx + 16) * RS + c];
            s[0][0] += qa.x * ka.x + qa.y * ka.y + qa.z * ka.z + qa.w * ka.w;
            s[0][1] += qa.x * kc.x + qa.y * kc.y + qa.z * kc.z + qa.w * kc.w;
            s[1][0] += qb.x * ka.x + qb.y * ka.y + qb.z * ka.z + qb.w * ka.w;
            s[1][1] += qb.x * kc.x + qb.y * kc.y + qb.z * kc.z + qb.w * kc.w;
        }
#pragma unroll
        for (int a = 0; a < 2; a++) {
#pragma unroll
            for (int b = 0; b < 2; b++) {
                float x = s[a][b] * scale;
                if (softcap != 0.0f) x = softcap * tanhf(x);
                s[a][b] = mv[a][b] == NEG_INF ? NEG_INF : x + mv[a][b];
            }
            const float m_new = fmaxf(m_run[a], rf_group_max<16>(fmaxf(s[a][0], s[a][1])));
            float p0 = 0.0f, p1 = 0.0f, ms = 1.0f;
            if (m_new != NEG_INF) {
                ms = expf(m_run[a] - m_new);  // 0 while nothing was visible yet
                p0 = expf(s[a][0] - m_new);
                p1 = expf(s[a][1] - m_new);
            }
            l_run[a] = l_run[a] * ms + rf_group_sum<16>(p0 + p1);
            m_run[a] = m_new;
#pragma unroll
            for (int i = 0; i < NV * 4; i++) acc[a][i] *= ms;
            Ps[(ty + NTY * a) * FT_PS + tx] = p0;
            Ps[(ty + NTY * a) * FT_PS + tx + 16] = p1;
        }
        __syncthreads();  // P complete (and, sharing one buffer, the scores done with K)
        if (!SPLIT_KV) {
#pragma unroll
            for (int j = 0; j < FT_BK * DP / NT; j++) {
                const int e = tid + NT * j, r = e / DP, c = e % DP;
                Vs[r * RS + c] = k0 + r < n_kv && c < DV ? load_w<VT>(vb + (k0 + r) * nbv1, c) : 0.0f;
            }
            __syncthreads();
        }
#pragma unroll 2
        for (int kk = 0; kk < FT_BK; kk += 4) {
            const rf_f4 pa = *(const rf_f4*)&Ps[ty * FT_PS + kk], pb = *(const rf_f4*)&Ps[(ty + NTY) * FT_PS + kk];
            const float pav[4] = {pa.x, pa.y, pa.z, pa.w}, pbv[4] = {pb.x, pb.y, pb.z, pb.w};
#pragma unroll
            for (int u = 0; u < 4; u++) {
#pragma unroll
                for (int i = 0; i < NV; i++) {
                    const rf_f4 vv = *(const rf_f4*)&Vs[(kk + u) * RS + tx * 4 + 64 * i];
                    acc[0][4 * i + 0] += pav[u] * vv.x;
                    acc[0][4 * i + 1] += pav[u] * vv.y;
                    acc[0][4 * i + 2] += pav[u] * vv.z;
                    acc[0][4 * i + 3] += pav[u] * vv.w;
                    acc[1][4 * i + 0] += pbv[u] * vv.x;
                    acc[1][4 * i + 1] += pbv[u] * vv.y;
                    acc[1][4 * i + 2] += pbv[u] * vv.z;
                    acc[1][4 * i + 3] += pbv[u] * vv.w;
                }
            }
        }
    }
    // Attention sinks: one more logit per head with no value row.
    const float sink = sinks ? sinks[iq2] : NEG_INF;
#pragma unroll
    for (int a = 0; a < 2; a++) {
        const i64 qi = q0 + ty + NTY * a;
        if (qi >= n_q) continue;
        const float m_all = fmaxf(m_run[a], sink);
        const float f = m_run[a] == NEG_INF ? 0.0f : expf(m_run[a] - m_all);
        const float total = l_run[a] * f + (sinks && m_all != NEG_INF ? expf(sink - m_all) : 0.0f);
        const float inv = total == 0.0f ? 0.0f : f / total;
        float* out = (float*)(d + ((iq3 * n_q + qi) * n_head + iq2) * nbd1);
#pragma unroll
        for (int i = 0; i < NV; i++) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = tx * 4 + 64 * i + j;
                if (c < DV) out[c] = acc[a][4 * i + j] * inv;
            }
        }
    }
}

#define FT_ARGS                                                                                                  \
    const char *q, const char *k, const char *v, const char *mask, const float *sinks, char *d, i64 DK, i64 DV,  \
        i64 n_q, i64 n_head, i64 n_seq, i64 n_kv, i64 rk2, i64 rv2, i64 nbq1, i64 nbq2, i64 nbq3, i64 nbk1,      \
        i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2, i64 nbv3, i64 mne2, i64 mne3, i64 nbm1, i64 nbm2, i64 nbm3,      \
        i64 nbd1, float scale, float softcap, float max_bias, float m0, float m1, int n_head_log2, int round_q
#define FT_PASS                                                                                                \
    q, k, v, mask, sinks, d, DK, DV, n_q, n_head, n_seq, n_kv, rk2, rv2, nbq1, nbq2, nbq3, nbk1, nbk2, nbk3, nbv1, \
        nbv2, nbv3, mne2, mne3, nbm1, nbm2, nbm3, nbd1, scale, softcap, max_bias, m0, m1, n_head_log2, round_q

// flash_attn_tiled_{K}_{V}_d{DP}_q{BQ}: BQ = 16 (128 threads) or 32 (256 threads).
#if RF_ALL || RF_T_pp_f16_d64
RF_KERNEL __launch_bounds__(128) void flash_attn_tiled_f16_f16_d64_q16(FT_ARGS) {
    rf_grid_begin();
    flash_attn_tile<w_f16, w_f16, 64, 8>(FT_PASS);
}
RF_KERNEL __launch_bounds__(256) void flash_attn_tiled_f16_f16_d64_q32(FT_ARGS) {
    rf_grid_begin();
    flash_attn_tile<w_f16, w_f16, 64, 16>(FT_PASS);
}
#endif
#if RF_ALL || RF_T_pp_f16_d128
RF_KERNEL __launch_bounds__(128) void flash_attn_tiled_f16_f16_d128_q16(FT_ARGS) {
    rf_grid_begin();
    flash_attn_tile<w_f16, w_f16, 128, 8>(FT_PASS);
}
RF_KERNEL __launch_bounds__(256) void flash_attn_tiled_f16_f16_d128_q32(FT_ARGS) {
    rf_grid_begin();
    flash_attn_tile<w_f16, w_f16, 128, 16>(FT_PASS);
}
#endif
#if RF_ALL || RF_T_pp_f32_d64
RF_KERNEL __launch_bounds__(128) void flash_attn_tiled_f32_f32_d64_q16(FT_ARGS) {
    rf_grid_begin();
    flash_attn_tile<w_f32, w_f32, 64, 8>(FT_PASS);
}
RF_KERNEL __launch_bounds__(256) void flash_attn_tiled_f32_f32_d64_q32(FT_ARGS) {
    rf_grid_begin();
    flash_attn_tile<w_f32, w_f32, 64, 16>(FT_PASS);
}
#endif
#if RF_ALL || RF_T_pp_f32_d128
RF_KERNEL __launch_bounds__(128) void flash_attn_tiled_f32_f32_d128_q16(FT_ARGS) {
    rf_grid_begin();
    flash_attn_tile<w_f32, w_f32, 128, 8>(FT_PASS);
}
RF_KERNEL __launch_bounds__(256) void flash_attn_tiled_f32_f32_d128_q32(FT_ARGS) {
    rf_grid_begin();
    flash_attn_tile<w_f32, w_f32, 128, 16>(FT_PASS);
}
#endif
