// FLASH_ATTN_EXT for generation, one block per (KV head, sequence, split of the keys): the
// block takes every query row that reads its KV head (n_q queries x the G heads of the GQA
// group, R = n_q * G rows, R * D <= 1024), so each K and V row is read once for all of them.
// F16 K and V, or Q8_0 K and V, of one head size D (64, 128 or 256), q rounded as ggml-cpu
// rounds it for that K (to f16; to Q8_0 values), f32 accumulators; masks broadcast over heads/sequences, ALiBi, softcap and sinks as
// flash_attn.hip.
//
// Generation's attention is latency-bound (a few hundred blocks, each a short chain of
// dependent steps), so a block of 128 threads takes a chunk of 32 keys at a time and spreads
// every step over all of its threads: four threads score a key against the R rows (16-byte K
// loads, q rows in shared memory), the chunk's maximum per row is one block reduction, then
// each thread accumulates one pair of V values of its set of keys for every row. The chunk's
// loads (K, V, mask) are all issued before any is used. All threads share the running
// maximum, so the key sets are merged by a plain sum at the end. With one split the block
// writes dst itself; with more, each block writes a partial result per row (DV outputs,
// maximum, sum of weights: flash_attn.hip's layout) and the last block of the group to finish
// merges them (fa_merge_row) and writes dst, quantized for the output projection when xq is
// set. A masked key's K and V are never used (they may hold anything).
#include "prelude.h"
#include "quants.h"
#include "flash_attn.hip"  // fa_finish_row, fa_merge_row, fa_key_range

// 16-byte loads (no vendor vector types: the run-time compilers get no headers).
struct __attribute__((aligned(16))) fav_u4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(16))) fav_f4 {
    float x, y, z, w;
};

RF_DEVICE float fav_lo(unsigned u) { return rf_f16_to_f32((f16_bits)(u & 0xffff)); }
RF_DEVICE float fav_hi(unsigned u) { return rf_f16_to_f32((f16_bits)(u >> 16)); }

#define FAV_THREADS 128
#define FAV_CHUNK 32

// A piece of 8 K values (piece p of a row: values 8p .. 8p + 7) as loaded: F16, the 16 bytes;
// Q8_0 (34-byte blocks, 2-byte aligned), the 8 int8 in x, y and the block's f16 scale in z.
template <bool Q8> RF_DEVICE fav_u4 fav_load_k(const char* row, int p) {
    if (Q8) {
        const unsigned short* b = (const unsigned short*)(row + (p / 4) * 34);
        const int o = 1 + (p % 4) * 4;
        fav_u4 w;
        w.x = b[o] | ((unsigned)b[o + 1] << 16);
        w.y = b[o + 2] | ((unsigned)b[o + 3] << 16);
        w.z = b[0];
        w.w = 0u;
        return w;
    }
    return ((const fav_u4*)row)[p];
}
template <bool Q8> RF_DEVICE void fav_k_values(fav_u4 w, float* kf) {
    if (Q8) {
        const float d = rf_f16_to_f32((f16_bits)w.z);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            kf[j] = d * (float)(signed char)(w.x >> (8 * j));
            kf[4 + j] = d * (float)(signed char)(w.y >> (8 * j));
        }
    } else {
        kf[0] = fav_lo(w.x), kf[1] = fav_hi(w.x), kf[2] = fav_lo(w.y), kf[3] = fav_hi(w.y);
        kf[4] = fav_lo(w.z), kf[5] = fav_hi(w.z), kf[6] = fav_lo(w.w), kf[7] = fav_hi(w.w);
    }
}
// The V pair dg (values 2 dg, 2 dg + 1) of a row: F16, its 4 bytes; Q8_0, the two int8 in the
// low half and the block's f16 scale in the high half.
template <bool Q8> RF_DEVICE unsigned fav_load_v(const char* row, int dg) {
    if (Q8) {
        const unsigned short* b = (const unsigned short*)(row + (dg / 16) * 34);
        return b[1 + dg % 16] | ((unsigned)b[0] << 16);
    }
    return *(const unsigned*)(row + dg * 4);
}
template <bool Q8> RF_DEVICE void fav_v_values(unsigned u, float* v0, float* v1) {
    if (Q8) {
        const float d = rf_f16_to_f32((f16_bits)(u >> 16));
        *v0 = d * (float)(signed char)(u & 0xff);
        *v1 = d * (float)(signed char)((u >> 8) & 0xff);
    } else {
        *v0 = fav_lo(u);
        *v1 = fav_hi(u);
    }
}

// The row kernel's arguments (FA_ARGS): DK == DV == D, K and V with as many heads (rk2 == rv2
// == G, the heads of a group), q rounded for K (round_q 1 or 2), no f16 accumulator.
template <int D, int RM, bool Q8>
RF_DEVICE void flash_attn_vec(const char* q, const char* k, const char* v, const char* mask, const float* sinks,
                              char* d, i64 DK, i64 DV, i64 n_q, i64 n_head, i64 n_seq, i64 n_kv, i64 G, i64 rv2,
                              i64 nbq1, i64 nbq2, i64 nbq3, i64 nbk1, i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2,
                              i64 nbv3, i64 mne2, i64 mne3, i64 nbm1, i64 nbm2, i64 nbm3, i64 nbd1, float scale,
                              float softcap, float max_bias, float m0, float m1, int n_head_log2, int round_q,
                              int f16_acc, float* part, i64 split_keys, unsigned* counters, signed char* xq,
                              float2* xds) {
    constexpr int WS = RF_WARP_SIZE;
    constexpr int NWARP = FAV_THREADS / WS;
    constexpr int TPK = FAV_THREADS / FAV_CHUNK;  // threads scoring one key (4)
    constexpr int KP = D / 8 / TPK;            // 16-byte pieces of a K row per thread
    constexpr int DG = D / 2;                  // value pairs of a V row: one per thread
    constexpr int KS = FAV_THREADS / DG;       // key sets of the V step (4, 2 or 1)
    constexpr int KPS = FAV_CHUNK / KS;        // keys per set
    constexpr int NJ = D / WS;                 // outputs per lane when a warp finishes a row
    __shared__ __attribute__((aligned(16))) float q_s[RM * D];
    __shared__ __attribute__((aligned(16))) float p_s[RM * FAV_CHUNK];
    __shared__ __attribute__((aligned(16))) float red_s[KS * RM * D];
    __shared__ float wmax_s[2][NWARP][RM];
    __shared__ float lsum_s[KS][RM];
    __shared__ float slope_s[RM], m_s[RM];
    // Per chunk parity, as wmax_s: a warp that runs ahead writes the next chunk's flags while
    // others still read this chunk's (with one buffer that was a race, racecheck found it).
    __shared__ float live_s[2][FAV_CHUNK];
    __shared__ i64 qoff_s[RM], moff_s[RM], row_s[RM];
    __shared__ int last_s;
    const int t = threadIdx.x, lane = t % WS, warp = t / WS;
    const i64 n_head_kv = n_head / G;
    const i64 ikv = blockIdx.x % n_head_kv, iq3 = blockIdx.x / n_head_kv;
    const int nq = (int)n_q, R = (int)(n_q * G);

    // Per row (query iq1, head iq2 of the group): where its q and mask rows are, its ALiBi
    // slope and the row index fa_finish_row decodes; then the q rows, rounded as ggml-cpu
    // rounds them for K: to f16, or (Q8_0) to Q8_0 values as flash_attn.hip's round_q 2 (32
    // consecutive values are 32 consecutive lanes: R * D is a multiple of 32).
    if (t < R) {
        const i64 iq1 = t % nq, iq2 = ikv * G + t / nq;
        qoff_s[t] = iq1 * nbq1 + iq2 * nbq2 + iq3 * nbq3;
        moff_s[t] = iq1 * nbm1 + (iq2 % mne2) * nbm2 + (iq3 % mne3) * nbm3;
        row_s[t] = (iq3 * n_head + iq2) * n_q + iq1;
        slope_s[t] = rf_alibi_slope(iq2, max_bias, m0, m1, n_head_log2);
    }
    __syncthreads();
    for (int i = t; i < R * D; i += FAV_THREADS) {
        float x = ((const float*)(q + qoff_s[i / D]))[i % D];
        if (Q8) {
            float d32, qi;
            x = rf_round_q8_32(x, d32, qi);
        } else {
            x = rf_f16_to_f32(rf_f32_to_f16(x));
        }
        q_s[i] = x;
    }
    __syncthreads();

    i64 ic0, ic1;
    fa_key_range(part, split_keys, n_kv, &ic0, &ic1);
    const char* kb = k + ikv * nbk2 + iq3 * nbk3;
    const char* vb = v + ikv * nbv2 + iq3 * nbv3;
    // Scores: thread t takes key t / TPK of the chunk, its 16-byte pieces pq, pq + TPK, ...
    // (the TPK threads of a key read 16 * TPK consecutive bytes at a time; their q reads
    // fall in different banks). Values: thread t takes the pair dg of the keys of set ks.
    const int kk = t / TPK, pq = t % TPK, dg = t % DG, ks = t / DG;
    float M[RM], L[RM], acc[RM][2];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        M[r] = rf_neg_inf();
        L[r] = 0.0f;
        acc[r][0] = acc[r][1] = 0.0f;
    }
    int par = 0;
    for (i64 kc = ic0; kc < ic1; kc += FAV_CHUNK, par ^= 1) {
        const i64 key = kc + kk;
        const bool valid = key < ic1;
        // Every load of the chunk first: K pieces, this thread's V pairs, mask values.
        const char* krow = kb + (valid ? key : kc) * nbk1;
        fav_u4 w[KP];
#pragma unroll
        for (int i = 0; i < KP; i++) w[i] = fav_load_k<Q8>(krow, pq + TPK * i);
        unsigned vr[KPS];
#pragma unroll
        for (int u = 0; u < KPS; u++) {
            const i64 vk = kc + ks * KPS + u;
            vr[u] = vk < ic1 ? fav_load_v<Q8>(vb + vk * nbv1, dg) : 0u;
        }
        float mv[RM];
#pragma unroll
        for (int r = 0; r < RM; r++) {
            mv[r] = r < R && mask && valid ? rf_f16_to_f32(((const f16_bits*)(mask + moff_s[r]))[key]) : 0.0f;
        }
        float s[RM];
#pragma unroll
        for (int r = 0; r < RM; r++) s[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < KP; i++) {
            float kf[8];
            fav_k_values<Q8>(w[i], kf);
#pragma unroll
            for (int r = 0; r < RM; r++) {
                if (r < R) {
                    const fav_f4* qr = (const fav_f4*)(q_s + r * D + (pq + TPK * i) * 8);
                    const fav_f4 qa = qr[0], qb = qr[1];
                    s[r] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                            qb.z * kf[6] + qb.w * kf[7];
                }
            }
        }
        bool live = false;
#pragma unroll
        for (int r = 0; r < RM; r++) {
            if (r < R) {
                float x = s[r];
#pragma unroll
                for (int m = 1; m < TPK; m <<= 1) x += rf_shfl_xor(x, m);
                x *= scale;
                if (softcap != 0.0f) x = softcap * tanhf(x);
                // A masked key's K (and V) is never used: it may be anything.
                x = valid && mv[r] != rf_neg_inf() ? x + slope_s[r] * mv[r] : rf_neg_inf();
                live |= x != rf_neg_inf();
                s[r] = x;
                float wm = x;
#pragma unroll
                for (int m = TPK; m < WS; m <<= 1) wm = fmaxf(wm, rf_shfl_xor(wm, m));
                if (lane == 0) wmax_s[par][warp][r] = wm;
            }
        }
        if (pq == 0) live_s[par][kk] = live ? 1.0f : 0.0f;
        __syncthreads();
        // The chunk's maximum per row; this key's weights; old sums rescaled.
#pragma unroll
        for (int r = 0; r < RM; r++) {
            if (r < R) {
                float cm = rf_neg_inf();
#pragma unroll
                for (int w2 = 0; w2 < NWARP; w2++) cm = fmaxf(cm, wmax_s[par][w2][r]);
                const float mn = fmaxf(M[r], cm);
                const float alpha = M[r] == rf_neg_inf() ? 0.0f : expf(M[r] - mn);
                if (pq == 0) p_s[r * FAV_CHUNK + kk] = s[r] == rf_neg_inf() ? 0.0f : expf(s[r] - mn);
                M[r] = mn;
                L[r] *= alpha;
                acc[r][0] *= alpha;
                acc[r][1] *= alpha;
            }
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < KPS; u++) {
            const int c = ks * KPS + u;
            const bool use = live_s[par][c] != 0.0f;
            float v0, v1;
            fav_v_values<Q8>(vr[u], &v0, &v1);
            if (!use) v0 = v1 = 0.0f;
#pragma unroll
            for (int r = 0; r < RM; r++) {
                if (r < R) {
                    const float p = p_s[r * FAV_CHUNK + c];
                    L[r] += p;
                    acc[r][0] += p * v0;
                    acc[r][1] += p * v1;
                }
            }
        }
    }

    // The key sets' sums (one running maximum for all of them), then a warp per row.
#pragma unroll
    for (int r = 0; r < RM; r++) {
        if (r < R) {
            red_s[(ks * RM + r) * D + 2 * dg] = acc[r][0];
            red_s[(ks * RM + r) * D + 2 * dg + 1] = acc[r][1];
            if (dg == 0) lsum_s[ks][r] = L[r];
            if (t == 0) m_s[r] = M[r];
        }
    }
    __syncthreads();
    const i64 n_split = gridDim.y;
    for (int r = warp; r < R; r += NWARP) {
        float o[NJ], l = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            o[j] = 0.0f;
#pragma unroll
            for (int s2 = 0; s2 < KS; s2++) o[j] += red_s[(s2 * RM + r) * D + lane + j * WS];
        }
#pragma unroll
        for (int s2 = 0; s2 < KS; s2++) l += lsum_s[s2][r];
        if (n_split == 1) {
            fa_finish_row<NJ>(m_s[r], l, o, row_s[r], sinks, d, D, n_q, n_head, nbd1, xq, xds);
        } else {
            float* pr = part + (row_s[r] * n_split + blockIdx.y) * (D + 2);
#pragma unroll
            for (int j = 0; j < NJ; j++) pr[lane + j * WS] = o[j];
            if (lane == 0) {
                pr[D] = m_s[r];
                pr[D + 1] = l;
            }
        }
    }
    if (n_split == 1) return;
    // Publish the partials, then count them; the group's last block merges every row and sets
    // the counter back to 0 for the next launch (or replay).
    __threadfence();
    __syncthreads();
    if (t == 0) last_s = atomicAdd(counters + blockIdx.x, 1u) == n_split - 1;
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    if (t == 0) counters[blockIdx.x] = 0;

    for (int r = warp; r < R; r += NWARP) {
        fa_merge_row<NJ>(part, row_s[r], n_split, sinks, d, D, n_q, n_head, nbd1, xq, xds);
    }
}

// What block (KV head, split) reads, into L2 before its rf_grid_begin(): asked once per key
// range, by the blocks of the first KV head (fa_rows_prefetch_l2: the whole rows).
RF_DEVICE void fav_prefetch_l2(const char* k, const char* v, const char* mask, i64 DK, i64 DV, i64 n_q, i64 n_head,
                               i64 n_kv, i64 rk2, i64 rv2, i64 nbk1, i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2, i64 nbv3,
                               i64 mne2, i64 mne3, i64 nbm2, i64 nbm3, const float* part, i64 split_keys, i64 k32,
                               i64 v32) {
    const i64 n_head_kv = n_head / rk2;
    if (blockIdx.x % n_head_kv != 0) return;
    i64 ic0, ic1;
    fa_key_range(part, split_keys, n_kv, &ic0, &ic1);
    fa_rows_prefetch_l2(k, v, mask, blockIdx.x / n_head_kv, ic0, ic1, DK, DV, n_head_kv, n_head_kv, nbk1, nbk2, nbk3,
                        nbv1, nbv2, nbv3, mne3, nbm3, k32, v32);
}

// _{f16,q8_0}_dD_rN: K/V type, head size D, at most N rows a block (code for exactly those
// rows: the loops over rows are unrolled, and rows past R still cost issue slots). The
// prefetch takes the bytes of 32 values: 64 (F16), 34 (Q8_0).
#define FAV_KERNEL(KV, Q8, B32, D, RM)                               \
    RF_KERNEL void flash_attn_vec_##KV##_d##D##_r##RM(FA_ARGS) {     \
        fav_prefetch_l2(FA_PREFETCH(B32, B32));                      \
        rf_grid_begin();                                             \
        flash_attn_vec<D, RM, Q8>(FA_PASS);                          \
    }
#if RF_ALL || RF_T_f16_d64
FAV_KERNEL(f16, false, 64, 64, 4)
FAV_KERNEL(f16, false, 64, 64, 16)
#endif
#if RF_ALL || RF_T_f16_d128
FAV_KERNEL(f16, false, 64, 128, 4)
FAV_KERNEL(f16, false, 64, 128, 8)
#endif
#if RF_ALL || RF_T_f16_d256
FAV_KERNEL(f16, false, 64, 256, 4)
#endif
#if RF_ALL || RF_T_q8_0_d64
FAV_KERNEL(q8_0, true, 34, 64, 4)
FAV_KERNEL(q8_0, true, 34, 64, 16)
#endif
#if RF_ALL || RF_T_q8_0_d128
FAV_KERNEL(q8_0, true, 34, 128, 4)
FAV_KERNEL(q8_0, true, 34, 128, 8)
#endif
#if RF_ALL || RF_T_q8_0_d256
FAV_KERNEL(q8_0, true, 34, 256, 4)
#endif
