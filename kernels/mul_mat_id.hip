// MUL_MAT_ID (mixture-of-experts matmul) and ADD_ID (per-expert bias), F32 activations.
//   MUL_MAT_ID: dst[:, u, t] = experts[ids[u, t]] . x[:, u % ne11, t]
// experts: any weight type of quants.h [K, M, n_as] with dense rows; x: F32 [K, ne11, n_tok]
// with dense rows (byte strides nb11, nb12), usually as round_src1 (mul_mat.hip) rounded it;
// corr (may be NULL) per block of row (i1 + ne11 * t), as mul_mat's; ids: I32 [n_used, n_tok];
// dst F32 [M, n_used, n_tok]. One warp per output row, MMID_ROWS rows per block, grid
// (rows / MMID_ROWS, n_used, n_tok): every (slot, token) is a matrix-vector product with its
// expert, each lane taking whole blocks of 32 weights as mul_mat_vec does, then single
// weights for the tail of a float row whose length is not a multiple of 32.
#include "prelude.h"
#include "quants.h"

#define MMID_ROWS 4

template <typename W>
RF_DEVICE void mul_mat_id(const char* w, const char* x, const char* ids, char* d, i64 K, i64 M, i64 n_as, i64 ne11,
                          i64 nb01, i64 nb02, i64 nb11, i64 nb12, i64 nbi0, i64 nbi1, i64 nb1, i64 nb2,
                          const float* corr) {
    const int lane = threadIdx.x % RF_WARP_SIZE;
    const i64 row = (i64)blockIdx.x * MMID_ROWS + threadIdx.x / RF_WARP_SIZE;
    if (row >= M) return;  // whole warp leaves together
    const i64 u = blockIdx.y, t = blockIdx.z;
    const int e = *(const int*)(ids + u * nbi0 + t * nbi1);
    float* out = (float*)(d + u * nb1 + t * nb2) + row;
    if (e < 0 || e >= n_as) {  // ggml-cpu aborts; a host never passes such ids
        if (lane == 0) *out = 0.0f;
        return;
    }
    const char* wr = w + e * nb02 + row * nb01;
    const i64 xrow = u % ne11 + ne11 * t;
    const float* xv = (const float*)(x + (u % ne11) * nb11 + t * nb12);
    float acc = 0.0f;
    for (i64 blk = lane; blk < K / 32; blk += RF_WARP_SIZE) {
        float wv[32];
        load_block32<W>(wr, blk, wv);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) s += wv[j] * xv[blk * 32 + j];
        if (corr) s += load_w_min<W>(wr, blk) * corr[xrow * (K / 32) + blk];
        acc += s;
    }
    // The last K % 32 weights (float experts only: a quantized row is whole blocks). Without
    // this, K below 32 or not a multiple of it dropped the tail of every dot product.
    for (i64 k = K / 32 * 32 + lane; k < K; k += RF_WARP_SIZE) acc += load_w<W>(wr, k) * xv[k];
    acc = rf_warp_sum(acc);
    if (lane == 0) *out = acc;
}

#define MMID_ARGS                                                                                          \
    const char *w, const char *x, const char *ids, char *d, i64 K, i64 M, i64 n_as, i64 ne11, i64 nb01, \
        i64 nb02, i64 nb11, i64 nb12, i64 nbi0, i64 nbi1, i64 nb1, i64 nb2, const float *corr
#define MMID_PASS w, x, ids, d, K, M, n_as, ne11, nb01, nb02, nb11, nb12, nbi0, nbi1, nb1, nb2, corr
#define MUL_MAT_ID_KERNEL(NAME, W) \
    RF_KERNEL void mul_mat_id_##NAME(MMID_ARGS) { rf_grid_begin(); mul_mat_id<W>(MMID_PASS); }

RF_EACH_WEIGHT_TYPE(MUL_MAT_ID_KERNEL)

#if RF_UNTYPED
// ADD_ID: dst row (i1, i2) = a row (i1, i2) + b row ids[i1, i2]; all F32, one block per row.
RF_KERNEL void add_id_f32(const char* a, const char* b, const char* ids, char* d, i64 ne0, i64 ne1, i64 ne2,
                          i64 nb_rows, i64 nba1, i64 nba2, i64 nba3, i64 nbb1, i64 nbi0, i64 nbi1, i64 nbd1,
                          i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    const i64 r = blockIdx.x;
    const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    const float* x = (const float*)(a + i1 * nba1 + i2 * nba2 + i3 * nba3);
    float* y = (float*)(d + i1 * nbd1 + i2 * nbd2 + i3 * nbd3);
    const int id = *(const int*)(ids + i1 * nbi0 + i2 * nbi1);
    const float* bias = id >= 0 && id < nb_rows ? (const float*)(b + id * nbb1) : 0;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = bias ? x[i] + bias[i] : x[i];
}
#endif
