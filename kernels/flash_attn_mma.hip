// FLASH_ATTN_EXT for prompts on tensor cores (NVIDIA sm_80+): the function of
// flash_attn_tiled.hip (online softmax over the keys, f32 accumulators, q rounded to f16 as
// ggml-cpu rounds it for F16 K), with both products on mma.sync m16n8k16 (f16 inputs, f32
// sums). A block of NW warps takes 16 * NW query rows of one head; each warp owns 16 rows
// and walks the keys in tiles of FM_BK, which the block stages in shared memory (cp.async,
// K and V in separate groups so the scores start while V still arrives):
//   S = Q K^T   Q's fragments stay in registers for the whole launch (loaded once), K's come
//               from the tile by ldmatrix (a K row is the column of B the mma wants);
//   softmax     on the S fragments in registers: a row's values sit in the 4 lanes of a quad;
//   O += P V    P's f32 fragments become the f16 A fragments of the next mma as they are
//               (the m16n8 accumulator layout is the m16n8k16 A layout, two tiles side by
//               side); V's come from the tile by ldmatrix.trans.
// Tiles whose every score of the block is masked out (the causal upper triangle) are skipped.
// Split over the keys (part != NULL, grid z = n_seq x splits): block split sp takes keys
// [sp * split_keys, (sp + 1) * split_keys) (split_keys a multiple of FM_BK) and writes each
// row's unnormalized outputs, running maximum and sum of weights to part (flash_attn.hip's
// layout, row * splits + sp), merged by flash_attn_split_combine (which adds the sinks): where
// the query tiles and heads alone leave most of the GPU idle (a small model's prompt over a
// long context: each block would walk thousands of keys one tile after another).
// F16 K and V, or Q8_0 K and V (the tile holds their values as f16, and q is rounded as
// ggml-cpu quantizes it for Q8_0 K: to Q8_0 values), of one head size D (64 or 128).
// Elsewhere (AMD, older NVIDIA) the kernels are empty and the launcher takes
// flash_attn_tiled.hip (F16) or flash_attn.hip (Q8_0).
#include "prelude.h"
#include "quants.h"
#include "flash_attn_tiled.hip"  // FT_ARGS, FT_PASS

#define FM_BK 64  // keys per tile

#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FM_TENSOR_CORES 1

// Shared-memory address of p (a 32-bit window offset, as ldmatrix and cp.async take it).
RF_DEVICE unsigned fm_smem(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

// 16 bytes global -> shared without registers; `ok` false writes zeros (rows past the keys).
RF_DEVICE void fm_cp16(unsigned dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
RF_DEVICE void fm_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> RF_DEVICE void fm_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Four 8x8 f16 matrices from shared memory (lane i gives the row address of matrix i / 8).
RF_DEVICE void fm_ldmatrix(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
RF_DEVICE void fm_ldmatrix_trans(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a (16x16, row) * b (16x8, col), f16 in, f32 sums.
RF_DEVICE void fm_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as f16x2, lo in the low half (the element of the lower column).
RF_DEVICE unsigned fm_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// One tile of FM_BK rows of D values into shared memory (row stride RH halves) from rows k0..
// of src; rows past n_kv are zeros. F16: cp.async, one commit group (the caller waits). Q8_0:
// each 34-byte block (f16 scale, 32 int8; 2-byte aligned) as 32 f16 values d * q.
template <int D, int NT, bool Q8>
RF_DEVICE void fm_load_tile(unsigned base, const char* src, i64 nb1, i64 k0, i64 n_kv) {
    constexpr int RH = D + 8;
    if (!Q8) {
        // Thread t copies piece c = t % (D / 8) of rows t / (D / 8), + NT / (D / 8), ...
        constexpr int RSTEP = NT / (D / 8);
        const int c = threadIdx.x % (D / 8), r0 = threadIdx.x / (D / 8);
        const char* p = src + (k0 + r0) * nb1 + c * 16;
#pragma unroll
        for (int r = r0; r < FM_BK; r += RSTEP, p += RSTEP * nb1) {
            const bool ok = k0 + r < n_kv;
            fm_cp16(base + (r * RH + c * 8) * 2, ok ? p : src, ok);
        }
        fm_commit();
    } else {
#pragma unroll
        for (int i = threadIdx.x; i < FM_BK * D / 32; i += NT) {
            const int r = i / (D / 32), b = i % (D / 32);
            unsigned h[16];
            if (k0 + r < n_kv) {
                const unsigned short* blk = (const unsigned short*)(src + (k0 + r) * nb1 + b * 34);
                const float dq = rf_f16_to_f32(blk[0]);
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const unsigned w = blk[1 + j];
                    h[j] = fm_pack(dq * (float)(signed char)(w & 0xff), dq * (float)(signed char)(w >> 8));
                }
            } else {
#pragma unroll
                for (int j = 0; j < 16; j++) h[j] = 0u;
            }
            const unsigned dst = base + (unsigned)(r * RH + b * 32) * 2;
#pragma unroll
            for (int j = 0; j < 16; j += 4) {
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst + j * 4), "r"(h[j]), "r"(h[j + 1]),
                             "r"(h[j + 2]), "r"(h[j + 3])
                             : "memory");
            }
        }
    }
}

// Q rounded as ggml-cpu rounds it for Q8_0 K (rf_q8_value): the 32 values of a Q8_0 block sit
// in the lane's 8 values of steps 2b and 2b + 1 and the 4 lanes of its quad, so amax is the
// quad's maximum of the lanes' own.
RF_DEVICE float fm_q8_amax(float amax) {
    amax = fmaxf(amax, rf_shfl_xor(amax, 1));
    return fmaxf(amax, rf_shfl_xor(amax, 2));
}
#endif

// D: head size (DK == DV); NW: warps, 16 query rows each. Lane (g = lane / 4, t4 = lane % 4)
// holds rows g and g + 8 of its warp's 16 and, of every 8-column piece, columns 2 t4, 2 t4 + 1.
template <int D, int NW, bool Q8>
RF_DEVICE void flash_attn_mma(const char* q, const char* k, const char* v, const char* mask, const float* sinks,
                              char* d, i64 DK, i64 DV, i64 n_q, i64 n_head, i64 n_seq, i64 n_kv, i64 rk2, i64 rv2,
                              i64 nbq1, i64 nbq2, i64 nbq3, i64 nbk1, i64 nbk2, i64 nbk3, i64 nbv1, i64 nbv2,
                              i64 nbv3, i64 mne2, i64 mne3, i64 nbm1, i64 nbm2, i64 nbm3, i64 nbd1, float scale,
                              float softcap, float max_bias, float m0, float m1, int n_head_log2, int round_q,
                              float* part, i64 split_keys) {
#if defined(FM_TENSOR_CORES)
    constexpr int NT = 32 * NW;
    constexpr int RH = D + 8;  // halves per tile row: 16-byte rows, 8 rows on distinct banks
    constexpr int NS = FM_BK / 8, NO = D / 8, KQ = D / 16;
    __shared__ __attribute__((aligned(16))) f16_bits Ks[FM_BK * RH];
    __shared__ __attribute__((aligned(16))) f16_bits Vs[FM_BK * RH];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;
    const i64 iq2 = blockIdx.y, iq3 = blockIdx.z % n_seq, sp = blockIdx.z / n_seq;
    const i64 n_split = part ? gridDim.z / n_seq : 1;
    const i64 kbeg = part ? sp * split_keys : 0;
    const i64 kend = part && kbeg + split_keys < n_kv ? kbeg + split_keys : n_kv;
    const i64 r0 = (i64)blockIdx.x * (16 * NW) + warp * 16 + g, r1 = r0 + 8;
    const float slope = rf_alibi_slope(iq2, max_bias, m0, m1, n_head_log2);
    const float NEG_INF = rf_neg_inf();

    // Q's A fragments, rounded as ggml-cpu rounds q for this K (Q8_0: rf_q8_value) and to f16
    // for the mma; rows past n_q are zeros.
    unsigned qa[KQ][4];
    {
        const float* q0p = r0 < n_q ? (const float*)(q + r0 * nbq1 + iq2 * nbq2 + iq3 * nbq3) : 0;
        const float* q1p = r1 < n_q ? (const float*)(q + r1 * nbq1 + iq2 * nbq2 + iq3 * nbq3) : 0;
#pragma unroll
        for (int b = 0; b < KQ / 2; b++) {
            // x[h][s][e]: row h (r0, r1), step 2b + s, element e (columns 2 t4, +1, +8, +9).
            float x[2][2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float* p = h == 0 ? q0p : q1p;
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    const int c = (2 * b + s) * 16 + 2 * t4;
                    x[h][s][0] = p ? p[c] : 0.0f;
                    x[h][s][1] = p ? p[c + 1] : 0.0f;
                    x[h][s][2] = p ? p[c + 8] : 0.0f;
                    x[h][s][3] = p ? p[c + 9] : 0.0f;
                }
                if (Q8) {
                    float amax = 0.0f;
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int e = 0; e < 4; e++) amax = fmaxf(amax, fabsf(x[h][s][e]));
                    amax = fm_q8_amax(amax);
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float d32, qi;
                            x[h][s][e] = rf_q8_value(x[h][s][e], amax, d32, qi);
                        }
                }
            }
#pragma unroll
            for (int s = 0; s < 2; s++) {
                qa[2 * b + s][0] = fm_pack(x[0][s][0], x[0][s][1]);
                qa[2 * b + s][1] = fm_pack(x[1][s][0], x[1][s][1]);
                qa[2 * b + s][2] = fm_pack(x[0][s][2], x[0][s][3]);
                qa[2 * b + s][3] = fm_pack(x[1][s][2], x[1][s][3]);
            }
        }
    }
    const char* kb = k + (iq2 / rk2) * nbk2 + iq3 * nbk3;
    const char* vb = v + (iq2 / rv2) * nbv2 + iq3 * nbv3;
    const f16_bits* mr0 = mask && r0 < n_q ? (const f16_bits*)(mask + r0 * nbm1 + (iq2 % mne2) * nbm2 + (iq3 % mne3) * nbm3) : 0;
    const f16_bits* mr1 = mask && r1 < n_q ? (const f16_bits*)(mask + r1 * nbm1 + (iq2 % mne2) * nbm2 + (iq3 % mne3) * nbm3) : 0;
    const unsigned ks_base = fm_smem(Ks), vs_base = fm_smem(Vs);

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f};

    for (i64 k0 = kbeg; k0 < kend; k0 += FM_BK) {
        // This lane's mask values (times the ALiBi slope), -inf where not visible: S layout
        // (piece j, element e: row e < 2 ? r0 : r1, key k0 + 8 j + 2 t4 + e % 2).
        float mv[NS][4];
        int any = 0;
#pragma unroll
        for (int j = 0; j < NS; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const i64 kj = k0 + 8 * j + 2 * t4 + (e & 1);
                const bool row_ok = e < 2 ? r0 < n_q : r1 < n_q;
                const f16_bits* mr = e < 2 ? mr0 : mr1;
                float x = NEG_INF;
                if (row_ok && kj < n_kv) x = mr ? slope * rf_f16_to_f32(mr[kj]) : 0.0f;
                mv[j][e] = x;
                any |= x != NEG_INF;
            }
        }
        // Also the barrier after the previous tile's reads of Ks and Vs.
        if (!__syncthreads_or(any)) continue;
        fm_load_tile<D, NT, Q8>(ks_base, kb, nbk1, k0, n_kv);
        fm_load_tile<D, NT, Q8>(vs_base, vb, nbv1, k0, n_kv);
        fm_wait<1>();  // K is in (F16; Q8_0 tiles were stored by this thread already)
        __syncthreads();

        // S = Q K^T: piece j (keys 8 j ..), two 16-wide steps of D per ldmatrix.
        float s[NS][4];
#pragma unroll
        for (int j = 0; j < NS; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int st = 0; st < KQ; st += 2) {
                unsigned b[4];
                fm_ldmatrix(b, ks_base + ((8 * j + (lane & 7)) * RH + st * 16 + (lane >> 3) * 8) * 2);
                fm_mma(s[j], qa[st], b[0], b[1]);
                fm_mma(s[j], qa[st + 1], b[2], b[3]);
            }
        }
        // Online softmax per row (the 4 lanes of a quad hold a row's 16 values of the tile).
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int j = 0; j < NS; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[j][e] * scale;
                if (softcap != 0.0f) x = softcap * tanhf(x);
                x = mv[j][e] == NEG_INF ? NEG_INF : x + mv[j][e];
                s[j][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        }
        float alpha[2], mn[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], rf_shfl_xor(mx[h], 1));
            mx[h] = fmaxf(mx[h], rf_shfl_xor(mx[h], 2));
            mn[h] = fmaxf(m_run[h], mx[h]);
            // Nothing visible yet: the sums stay 0 (alpha 0 on zeros), no exp of -inf - -inf.
            alpha[h] = m_run[h] == NEG_INF ? 0.0f : expf(m_run[h] - mn[h]);
            m_run[h] = mn[h];
            l_run[h] *= alpha[h];
        }
#pragma unroll
        for (int n = 0; n < NO; n++) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        unsigned pa[FM_BK / 16][4];
#pragma unroll
        for (int j = 0; j < NS; j++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = s[j][e] == NEG_INF ? 0.0f : expf(s[j][e] - mn[e / 2]);
                l_run[e / 2] += p[e];
            }
            pa[j / 2][(j & 1) * 2 + 0] = fm_pack(p[0], p[1]);
            pa[j / 2][(j & 1) * 2 + 1] = fm_pack(p[2], p[3]);
        }
        fm_wait<0>();  // V is in
        __syncthreads();
        // O += P V: keys 16 kt .. of the tile, two 8-column pieces of V per ldmatrix.trans.
#pragma unroll
        for (int kt = 0; kt < FM_BK / 16; kt++) {
#pragma unroll
            for (int n = 0; n < NO; n += 2) {
                unsigned b[4];
                const int row = 16 * kt + (lane & 7) + ((lane >> 3) & 1) * 8, col = n * 8 + (lane >> 4) * 8;
                fm_ldmatrix_trans(b, vs_base + (row * RH + col) * 2);
                fm_mma(o[n], pa[kt], b[0], b[1]);
                fm_mma(o[n + 1], pa[kt], b[2], b[3]);
            }
        }
    }

    // The row's sum over its quad, the sink (one more logit per head with no value row),
    // then dst [DV, n_head, n_q, n_seq]; split, the partial instead (no sink: the merge adds it).
    const float sink = sinks ? sinks[iq2] : NEG_INF;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = l_run[h];
        l += rf_shfl_xor(l, 1);
        l += rf_shfl_xor(l, 2);
        const i64 qi = h == 0 ? r0 : r1;
        if (qi >= n_q) continue;
        if (part) {
            float* pr = part + (((iq3 * n_head + iq2) * n_q + qi) * n_split + sp) * (D + 2);
#pragma unroll
            for (int n = 0; n < NO; n++) {
                pr[n * 8 + 2 * t4] = o[n][2 * h];
                pr[n * 8 + 2 * t4 + 1] = o[n][2 * h + 1];
            }
            if (t4 == 0) {
                pr[D] = m_run[h];
                pr[D + 1] = l;
            }
            continue;
        }
        const float m_all = fmaxf(m_run[h], sink);
        const float f = m_run[h] == NEG_INF ? 0.0f : expf(m_run[h] - m_all);
        const float total = l * f + (sinks && m_all != NEG_INF ? expf(sink - m_all) : 0.0f);
        const float inv = total == 0.0f ? 0.0f : f / total;
        float* out = (float*)(d + ((iq3 * n_q + qi) * n_head + iq2) * nbd1);
#pragma unroll
        for (int n = 0; n < NO; n++) {
            out[n * 8 + 2 * t4] = o[n][2 * h] * inv;
            out[n * 8 + 2 * t4 + 1] = o[n][2 * h + 1] * inv;
        }
    }
#endif
}

// flash_attn_mma_{f16,q8_0}_d{D}_w{NW}: 16 * NW query rows a block (NW = 4: 64 rows, 2: 32 rows
// for grids that would not fill the GPU otherwise).
// FM_MIN_BLOCKS: blocks per SM the registers must allow (a -D for measuring builds).
#ifndef FM_MIN_BLOCKS
#define FM_MIN_BLOCKS 1
#endif
#define FM_KERNEL(KV, Q8, D, NW)                                                                          \
    RF_KERNEL __launch_bounds__(32 * NW, FM_MIN_BLOCKS) void flash_attn_mma_##KV##_d##D##_w##NW(          \
        FT_ARGS, float* part, i64 split_keys) {                                                           \
        rf_grid_begin();                                                                                  \
        flash_attn_mma<D, NW, Q8>(FT_PASS, part, split_keys);                                             \
    }
#if RF_ALL || RF_T_pp_f16_d64
FM_KERNEL(f16, false, 64, 2)
FM_KERNEL(f16, false, 64, 4)
#endif
#if RF_ALL || RF_T_pp_f16_d128
FM_KERNEL(f16, false, 128, 2)
FM_KERNEL(f16, false, 128, 4)
#endif
#if RF_ALL || RF_T_pp_q8_0_d64
FM_KERNEL(q8_0, true, 64, 2)
FM_KERNEL(q8_0, true, 64, 4)
#endif
#if RF_ALL || RF_T_pp_q8_0_d128
FM_KERNEL(q8_0, true, 128, 2)
FM_KERNEL(q8_0, true, 128, 4)
#endif
