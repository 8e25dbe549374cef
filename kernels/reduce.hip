// Row reductions and sorting on F32 rows (dense, any row strides; row r = (i1, i2, i3)):
// SUM_ROWS / MEAN (one value per row), SUM (one value in all), CUMSUM, ARGSORT (I32 ids,
// ascending or descending) and TOP_K (the ids of the k largest, largest first). As
// src/cpu/ops/reduce.rs.
#include "prelude.h"

RF_DEVICE const float* red_row(const char* a, i64 r, i64 ne1, i64 ne2, i64 nb1, i64 nb2, i64 nb3) {
    const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    return (const float*)(a + i1 * nb1 + i2 * nb2 + i3 * nb3);
}

// One block per row; mean = 1 divides by ne0.
RF_KERNEL void sum_rows_f32(const char* a, char* d, int mean, i64 ne0, i64 ne1, i64 ne2, i64 nba1, i64 nba2,
                            i64 nba3, i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    __shared__ float scratch[RF_MAX_WARPS];
    const i64 r = blockIdx.x;
    const float* x = red_row(a, r, ne1, ne2, nba1, nba2, nba3);
    float s = 0.0f;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) s += x[i];
    s = rf_block_sum(s, scratch);
    if (threadIdx.x == 0) *(float*)((char*)red_row(d, r, ne1, ne2, nbd1, nbd2, nbd3)) = mean ? s / (float)ne0 : s;
}

// One block for the whole tensor.
RF_KERNEL void sum_f32(const char* a, float* d, i64 ne0, i64 ne1, i64 ne2, i64 nrows, i64 nba1, i64 nba2, i64 nba3) {
    rf_grid_begin();
    __shared__ float scratch[RF_MAX_WARPS];
    float s = 0.0f;
    for (i64 i = threadIdx.x; i < ne0 * nrows; i += blockDim.x) {
        s += red_row(a, i / ne0, ne1, ne2, nba1, nba2, nba3)[i % ne0];
    }
    s = rf_block_sum(s, scratch);
    if (threadIdx.x == 0) *d = s;
}

// One warp per row: the row in chunks of RF_WARP_SIZE, each chunk an in-warp scan plus the
// running total of the chunks before.
RF_KERNEL void cumsum_f32(const char* a, char* d, i64 ne0, i64 ne1, i64 ne2, i64 nba1, i64 nba2, i64 nba3,
                          i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    const i64 r = blockIdx.x;
    const int lane = threadIdx.x;
    const float* x = red_row(a, r, ne1, ne2, nba1, nba2, nba3);
    float* y = (float*)red_row(d, r, ne1, ne2, nbd1, nbd2, nbd3);
    float carry = 0.0f;
    for (i64 c0 = 0; c0 < ne0; c0 += RF_WARP_SIZE) {
        const i64 i = c0 + lane;
        float v = i < ne0 ? x[i] : 0.0f;
#pragma unroll
        for (int o = 1; o < RF_WARP_SIZE; o <<= 1) {
#if defined(RF_NVIDIA)
            const float t = __shfl_up_sync(0xffffffffu, v, o);
#else
            const float t = __shfl_up(v, o);
#endif
            if (lane >= o) v += t;
        }
        if (i < ne0) y[i] = carry + v;
#if defined(RF_NVIDIA)
        carry += __shfl_sync(0xffffffffu, v, RF_WARP_SIZE - 1);
#else
        carry += __shfl(v, RF_WARP_SIZE - 1);
#endif
    }
}

// Most values per row the sort holds in shared memory.
#define SORT_MAX 4096

// Bitonic sort of one row per block (padded to a power of two n with values that sort last),
// ids out: all ne0 (ARGSORT) or the first k (TOP_K, descending).
RF_KERNEL void argsort_f32(const char* a, char* d, int desc, i64 ne0, i64 k, i64 n, i64 ne1, i64 ne2, i64 nba1,
                           i64 nba2, i64 nba3, i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    __shared__ float val[SORT_MAX];
    __shared__ int idx[SORT_MAX];
    const i64 r = blockIdx.x;
    const float* x = red_row(a, r, ne1, ne2, nba1, nba2, nba3);
    int* y = (int*)red_row(d, r, ne1, ne2, nbd1, nbd2, nbd3);
    // Sorted ascending by key; descending uses the negated value. Padding sorts last.
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        val[i] = i < ne0 ? (desc ? -x[i] : x[i]) : __int_as_float(0x7f800000);
        idx[i] = i < ne0 ? i : 0x7fffffff;
    }
    __syncthreads();
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool up = (i & size) == 0;
                    const float vi = val[i], vj = val[j];
                    const int ii = idx[i], ij = idx[j];
                    // i before j when (vi, ii) < (vj, ij): ties keep index order.
                    const bool gt = vi > vj || (vi == vj && ii > ij);
                    if (gt == up) {
                        val[i] = vj;
                        val[j] = vi;
                        idx[i] = ij;
                        idx[j] = ii;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < k; i += blockDim.x) y[i] = idx[i];
}
