// MUL_MAT for a batch of columns (prompts) with integer dots on tensor cores (NVIDIA sm_80+):
// src1 quantized once as ggml-cpu quantizes it (quantize_q8: Q8_0 blocks, or Q8_K for IQ4_XS),
// weights decoded to signed bytes (mt_* in mmvq.hip), and mma.sync m16n8k32 gives each
// 32-value block's integer sum, scaled by the weight block's and the activation block's scale
// and added in f32. ggml-cpu forms the same integer sums, so results differ from its only in the
// order of float additions, where the vendor BLAS path (f16 operands) rounds every activation.
//
// A block of MMA_WARPS warps computes MMA_BM weight rows x MMA_BN columns, staging MMA_KB
// blocks of 32 values of both operands in shared memory per step; warp w takes rows
// 32 (w % 4) .. +31 and columns 32 (w / 4) .. +31 (2 x 4 mma tiles). The next step's bytes are
// loaded into registers before the current step's products (T::fetch: loads only), so their
// latency hides behind the tensor cores; a first version that loaded each step after the last
// one's products ran at a quarter of cuBLAS's speed on an H100. Shared rows are MMA_LD bytes
// (16 of padding), so the fragment loads of a warp (lanes 4 g + q reading word q of rows g)
// hit 32 different banks. Fragments (PTX ISA, lane = 4 g + q):
//   A 16x32 (weights): a0 row g values 4q..4q+3, a1 row g + 8 the same, a2 / a3 values 16 + 4q..;
//   B 32x8 (columns):  b0 column g values 4q..4q+3, b1 values 16 + 4q..;
//   C 16x8:            c0 / c1 row g columns 2q, 2q + 1; c2 / c3 row g + 8.
// Arguments: weights w (row stride nb01, K values a row; matrix (i2 / r2, i3 / r3) at
// nb02 / nb03), quantized src1 xq / xds (rows of K values in (i1, i2, i3) order, N of them per
// (i2, i3)), dst F32 (row (i1, i2, i3) at i1 nb1 + i2 nb2 + i3 nb3). Block z takes the ncols
// quantized rows from z ncols on, all against weight matrix (i2, i3) = (z % ne12, z / ne12): a
// 2-D weight takes every src1 row in one z (ncols = N ne12 ne13), a batched one a z per (i2, i3).
// Grid (M / MMA_BM, ncols / MMA_BN, batches).
#include "prelude.h"
#include "quants.h"

#define MMA_BM 128
#define MMA_BN 64
#ifndef MMA_KB
#define MMA_KB 2
#endif
// Blocks per SM the registers are budgeted for (__launch_bounds__).
#ifndef MMA_MIN_BLOCKS
#define MMA_MIN_BLOCKS 2
#endif
#define MMA_WARPS 8
#define MMA_LD (MMA_KB * 32 + 16)
#define MMA_THREADS (MMA_WARPS * 32)
// Per thread and step: weight words (row, block, word pair) and 16-byte pieces of activations.
#define MMA_W_UNITS (MMA_BM * MMA_KB * 4 / MMA_THREADS)
#define MMA_X_UNITS (MMA_BN * MMA_KB * 2 / MMA_THREADS)
// Rows between a thread's weight units.
#define MMA_W_STEP (MMA_THREADS / (4 * MMA_KB))

// A block's integer sum as a float: exact for |c| < 2^22 (32 products of 8-bit values are
// below 2^19) with an integer add and a float subtract, where the conversion instruction has
// an eighth of their rate (16 a clock per SM) and was what bounded the kernel.
RF_DEVICE float mma_i2f(int c) { return __int_as_float(c + 0x4B400000) - 12582912.0f; }
// Place of weight row r in a block's scales: rows g and g + 8 of each 16 side by side.
RF_DEVICE int mma_pair_row(int r) { return (r & ~15) + 2 * (r & 7) + ((r >> 3) & 1); }

template <typename T>
RF_DEVICE void mul_mat_mma(const char* w, const signed char* xq, const float2* xds, char* d, i64 K, i64 M, i64 N,
                           i64 ne12, i64 ncols, i64 r2, i64 r3, i64 nb01, i64 nb02, i64 nb03, i64 nb1, i64 nb2,
                           i64 nb3) {
#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ __align__(16) signed char as[MMA_BM * MMA_LD];
    __shared__ __align__(16) signed char bs[MMA_BN * MMA_LD];
    // Scales by block, rows g and g + 8 of each 16 side by side (ad), columns 2q and 2q + 1
    // side by side (bd, columns in order): one 8-byte load for the two of an mma's fragment.
    __shared__ __align__(8) float ad[MMA_KB * MMA_BM];
    __shared__ __align__(8) float bd[MMA_KB * MMA_BN];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q = lane % 4;
    const i64 row0 = (i64)blockIdx.x * MMA_BM, col0 = (i64)blockIdx.y * MMA_BN, z = blockIdx.z;
    const int wr = (warp % 4) * 32, wc = (warp / 4) * 32;
    const i64 nb = K / 32;
    const unsigned char* wz = (const unsigned char*)w + ((z % ne12) / r2) * nb02 + ((z / ne12) / r3) * nb03;
    // This thread's share of each step: weight word pair wq of block kk of rows wrow + MMA_W_STEP u
    // (rows past M repeat the last one: never stored); activation pieces xp + MMA_THREADS u
    // of columns (past ncols: the last one); the scale of (column tid / MMA_KB, block tid % MMA_KB).
    const int wq = tid % 4, wk = (tid / 4) % MMA_KB, wrow = tid / (4 * MMA_KB);
    // Rows past M read the last row (their sums are not stored).
    const i64 wlast = M - 1 - row0 - wrow;
    const unsigned char* wrow0 = wz + (row0 + wrow) * nb01;
    const i64 xbase = z * ncols;
    const signed char* xp[MMA_X_UNITS];
#pragma unroll
    for (int u = 0; u < MMA_X_UNITS; u++) {
        const int e = tid + MMA_THREADS * u, c = e / (MMA_KB * 2);
        xp[u] = xq + (xbase + (col0 + c < ncols ? col0 + c : ncols - 1)) * K + (e % (MMA_KB * 2)) * 16;
    }
    // (MMA_BN * MMA_KB <= MMA_THREADS: threads past it load no scale.)
    const bool scaler = tid < MMA_BN * MMA_KB;
    const int sc = scaler ? tid / MMA_KB : 0, sk = tid % MMA_KB;
    const float2* sp = xds + (xbase + (col0 + sc < ncols ? col0 + sc : ncols - 1)) * nb + sk;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    mt_raw raw[MMA_W_UNITS];
    int4 xv[MMA_X_UNITS];
    float xs = 0.0f;
    // Loads of step kb0 into registers (zeros past K).
    auto fetch = [&](i64 kb0) {
        const i64 kb = kb0 + wk;
#pragma unroll
        for (int u = 0; u < MMA_W_UNITS; u++) {
            const i64 r = MMA_W_STEP * u < wlast ? MMA_W_STEP * u : wlast;
            raw[u] = kb < nb ? T::fetch(wrow0 + r * nb01, kb, wq) : mt_raw{0, 0, 0, 0, 0};
        }
#pragma unroll
        for (int u = 0; u < MMA_X_UNITS; u++) {
            const int e = tid + MMA_THREADS * u;
            xv[u] = kb0 + (e % (MMA_KB * 2)) / 2 < nb ? *(const int4*)(xp[u] + kb0 * 32) : make_int4(0, 0, 0, 0);
        }
        xs = scaler && kb0 + sk < nb ? sp[kb0].x : 0.0f;
    };
    fetch(0);
    for (i64 kb0 = 0; kb0 < nb; kb0 += MMA_KB) {
#pragma unroll
        for (int u = 0; u < MMA_W_UNITS; u++) {
            int lo, hi;
            float s;
            T::unpack(raw[u], kb0 + wk, &lo, &hi, &s);
            signed char* p = as + (wrow + MMA_W_STEP * u) * MMA_LD + wk * 32 + 4 * wq;
            *(int*)p = lo;
            *(int*)(p + 16) = hi;
            if (wq == 0) ad[wk * MMA_BM + mma_pair_row(wrow + MMA_W_STEP * u)] = s;
        }
#pragma unroll
        for (int u = 0; u < MMA_X_UNITS; u++) {
            const int e = tid + MMA_THREADS * u;
            *(int4*)(bs + (e / (MMA_KB * 2)) * MMA_LD + (e % (MMA_KB * 2)) * 16) = xv[u];
        }
        if (scaler) bd[sk * MMA_BN + sc] = xs;
        __syncthreads();
        if (kb0 + MMA_KB < nb) fetch(kb0 + MMA_KB);
#pragma unroll
        for (int kk = 0; kk < MMA_KB; kk++) {
            int a[2][4];
            float2 da[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int r = wr + 16 * i + g;
                const signed char* p = as + r * MMA_LD + kk * 32 + 4 * q;
                a[i][0] = *(const int*)p;
                a[i][1] = *(const int*)(p + 8 * MMA_LD);
                a[i][2] = *(const int*)(p + 16);
                a[i][3] = *(const int*)(p + 8 * MMA_LD + 16);
                da[i] = *(const float2*)(ad + kk * MMA_BM + mma_pair_row(r));
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const signed char* p = bs + (wc + 8 * j + g) * MMA_LD + kk * 32 + 4 * q;
                const int b0 = *(const int*)p, b1 = *(const int*)(p + 16);
                const float2 db = *(const float2*)(bd + kk * MMA_BN + wc + 8 * j + 2 * q);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    int c[4] = {0, 0, 0, 0};
                    asm volatile(
                        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                        "{%0, %1, %2, %3};"
                        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                        : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b0), "r"(b1));
                    acc[i][j][0] = fmaf(da[i].x * db.x, mma_i2f(c[0]), acc[i][j][0]);
                    acc[i][j][1] = fmaf(da[i].x * db.y, mma_i2f(c[1]), acc[i][j][1]);
                    acc[i][j][2] = fmaf(da[i].y * db.x, mma_i2f(c[2]), acc[i][j][2]);
                    acc[i][j][3] = fmaf(da[i].y * db.y, mma_i2f(c[3]), acc[i][j][3]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const i64 row = row0 + wr + 16 * i + g + (e >= 2 ? 8 : 0);
                const i64 col = col0 + wc + 8 * j + 2 * q + (e & 1);
                if (row < M && col < ncols) {
                    const i64 qr = xbase + col, i1 = qr % N, i2 = (qr / N) % ne12, i3 = qr / (N * ne12);
                    *(float*)(d + i1 * nb1 + i2 * nb2 + i3 * nb3 + row * 4) = acc[i][j][e];
                }
            }
        }
    }
#else
    (void)w, (void)xq, (void)xds, (void)d, (void)K, (void)M, (void)N, (void)ne12, (void)ncols, (void)r2, (void)r3;
    (void)nb01, (void)nb02, (void)nb03, (void)nb1, (void)nb2, (void)nb3;
#endif
}

#define MUL_MAT_MMA_ARGS                                                                                         \
    const char *w, const signed char *xq, const float2 *xds, char *d, i64 K, i64 M, i64 N, i64 ne12, i64 ncols, \
        i64 r2, i64 r3, i64 nb01, i64 nb02, i64 nb03, i64 nb1, i64 nb2, i64 nb3
#define MUL_MAT_MMA_PASS w, xq, xds, d, K, M, N, ne12, ncols, r2, r3, nb01, nb02, nb03, nb1, nb2, nb3
#if RF_ALL || RF_T_q4_0
RF_KERNEL __launch_bounds__(MMA_THREADS, MMA_MIN_BLOCKS) void mul_mat_mma_q4_0(MUL_MAT_MMA_ARGS) {
    rf_grid_begin();
    mul_mat_mma<mt_q4_0>(MUL_MAT_MMA_PASS);
}
#endif
#if RF_ALL || RF_T_q8_0
RF_KERNEL __launch_bounds__(MMA_THREADS, MMA_MIN_BLOCKS) void mul_mat_mma_q8_0(MUL_MAT_MMA_ARGS) {
    rf_grid_begin();
    mul_mat_mma<mt_q8_0>(MUL_MAT_MMA_PASS);
}
#endif
#if RF_ALL || RF_T_iq4_nl
RF_KERNEL __launch_bounds__(MMA_THREADS, MMA_MIN_BLOCKS) void mul_mat_mma_iq4_nl(MUL_MAT_MMA_ARGS) {
    rf_grid_begin();
    mul_mat_mma<mt_iq4_nl>(MUL_MAT_MMA_PASS);
}
#endif
#if RF_ALL || RF_T_iq4_xs
RF_KERNEL __launch_bounds__(MMA_THREADS, MMA_MIN_BLOCKS) void mul_mat_mma_iq4_xs(MUL_MAT_MMA_ARGS) {
    rf_grid_begin();
    mul_mat_mma<mt_iq4_xs>(MUL_MAT_MMA_PASS);
}
#endif
