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

// The sum of ggml's tensor-parallel AllReduce (src/gpu/backend/allreduce.rs): d = s0 + s1 + ...,
// in that order on every GPU, so that each GPU's copy of the result is the same to the bit. The
// sources are other GPUs' memory, read across (peer access).
RF_KERNEL void allreduce_sum_f32(float* d, const float* s0, const float* s1, const float* s2, const float* s3,
                                 const float* s4, const float* s5, const float* s6, const float* s7, int n_src,
                                 i64 n) {
    rf_grid_begin();
    const float* s[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        float v = s0[i];
        for (int k = 1; k < n_src; ++k) v += s[k][i];
        d[i] = v;
    }
}

// AllReduce of a small tensor in one launch a GPU (NVIDIA, peer access; src/gpu/backend/allreduce.rs).
// One block: it writes this GPU's part t into each other GPU's receive slot for it (remote writes),
// raises its flag there to seq, waits until every other GPU's flag here reached seq, then sums the
// parts in GPU order (this GPU's own from t) into t. zero_me: this GPU's part counts as 0.
// out[k] / out_flag[k]: GPU k's slot and flag for this GPU (unused for k == me); in[k]: the local slot
// GPU k writes; flags: the local flags. A GPU that never comes leaves the wait after 2^26 polls and
// writes NaN (a visible failure, not a hang).
RF_KERNEL void allreduce_small_f32(float* t, float* o0, float* o1, float* o2, float* o3, float* o4, float* o5,
                                   float* o6, float* o7, unsigned* f0, unsigned* f1, unsigned* f2, unsigned* f3,
                                   unsigned* f4, unsigned* f5, unsigned* f6, unsigned* f7, const float* i0,
                                   const float* i1, const float* i2, const float* i3, const float* i4,
                                   const float* i5, const float* i6, const float* i7, const unsigned* flags, int n,
                                   int me, unsigned seq, int zero_me, i64 ne) {
    rf_grid_begin();
    float* out[8] = {o0, o1, o2, o3, o4, o5, o6, o7};
    unsigned* out_flag[8] = {f0, f1, f2, f3, f4, f5, f6, f7};
    const float* in[8] = {i0, i1, i2, i3, i4, i5, i6, i7};
    for (i64 j = threadIdx.x; j < ne; j += blockDim.x) {
        const float v = zero_me ? 0.0f : t[j];
        for (int k = 0; k < n; ++k)
            if (k != me) out[k][j] = v;
    }
    __syncthreads();
    __shared__ int timed_out;
    if (threadIdx.x == 0) {
        __threadfence_system();
        for (int k = 0; k < n; ++k)
            if (k != me) *(volatile unsigned*)out_flag[k] = seq;
        timed_out = 0;
        for (int k = 0; k < n; ++k) {
            if (k == me) continue;
            long polls = 0;
            while ((int)(*(const volatile unsigned*)(flags + k) - seq) < 0 && ++polls < (1l << 26)) {
            }
            if (polls >= (1l << 26)) timed_out = 1;
        }
        __threadfence_system();
    }
    __syncthreads();
    for (i64 j = threadIdx.x; j < ne; j += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < n; ++k) {
            const float x = k == me ? (zero_me ? 0.0f : t[j]) : rf_load_l2(in[k] + j);
            v = k == 0 ? x : v + x;
        }
        t[j] = timed_out ? __int_as_float(0x7fc00000) : v;
    }
}
