// Kernels for runs of graph nodes that the backend fuses (src/gpu/ops.rs, launch_at): each
// computes what the nodes compute, in the same order of float operations, with fewer
// launches and fewer trips through device memory. Token generation is bound by the number
// of kernels per token more than by bytes.
#include "prelude.h"
#include "mmvq.hip"
#include "activation.hip"

// [ADD ->] RMS_NORM [-> MUL by a row vector] [-> quantized for the next matrix-vector
// product], one block per row of contiguous F32 rows of ne0 values:
//   v   = a + b (b may be NULL: v = a); written to `sum` when it is not NULL;
//   out = v / sqrt(mean(v^2) + eps) [* w]   (w may be NULL);
//   qmode >= 0: out also quantized into xq / xds as quantize_q8 would (row-major, ne0 values).
RF_KERNEL void fused_rms_norm(const float* a, const float* b, float* sum, const float* w, float* out, signed char* xq,
                              float2* xds, int qmode, i64 ne0, float eps) {
    __shared__ float scratch[RF_MAX_WARPS];
    const i64 r = blockIdx.x;
    const float* ar = a + r * ne0;
    const float* br = b ? b + r * ne0 : 0;
    float* sr = sum ? sum + r * ne0 : 0;
    float* y = out + r * ne0;
    float ss = 0.0f;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float v = br ? ar[i] + br[i] : ar[i];
        if (sr) sr[i] = v;
        ss += v * v;
    }
    ss = rf_block_sum(ss, scratch);
    const float s = 1.0f / sqrtf(ss / (float)ne0 + eps);
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float v = br ? ar[i] + br[i] : ar[i];
        y[i] = w ? (v * s) * w[i] : v * s;
    }
    if (qmode < 0) return;
    __syncthreads();  // the row's outputs, written by all threads, are read back below
    const int lane = threadIdx.x % 32, group = threadIdx.x / 32, ngroups = blockDim.x / 32;
    if (qmode == 0) {
        for (i64 bk = group; bk < ne0 / 32; bk += ngroups) quantize_block32(y, xq + r * ne0, xds + r * (ne0 / 32), bk, lane);
    } else {
        for (i64 bk = group; bk < ne0 / 256; bk += ngroups) quantize_block256(y, xq + r * ne0, xds + r * (ne0 / 32), bk, lane);
    }
}

// MUL_MAT(wg, x), MUL_MAT(wu, x), then GLU: out[row] = act(wg[row] . x) * (wu[row] . x) for a
// single src1 column already quantized (xq, xds); a warp per row, as mul_mat_vec_q.
template <typename T>
RF_DEVICE void mul_mat_vec_q_glu(const char* wg, const char* wu, const signed char* xq, const float2* xds, float* out,
                                 int act_code, i64 K, i64 M, i64 nb01g, i64 nb01u) {
    const int lane = threadIdx.x % RF_WARP_SIZE;
    const i64 row = (i64)blockIdx.x * MVQ_ROWS + threadIdx.x / RF_WARP_SIZE;
    if (row >= M) return;
    const unsigned char* gr = (const unsigned char*)wg + row * nb01g;
    const unsigned char* ur = (const unsigned char*)wu + row * nb01u;
    float ag = 0.0f, au = 0.0f;
    const i64 nparts = K / T::QK * T::NSUB;
#pragma unroll 2
    for (i64 it = lane; it < nparts; it += RF_WARP_SIZE) {
        const i64 blk = it / T::NSUB;
        const int s = (int)(it % T::NSUB);
        const typename T::R rg = T::load(gr + blk * T::BYTES, s);
        const typename T::R ru = T::load(ur + blk * T::BYTES, s);
        const int* xb = (const int*)(xq + blk * T::QK);
        const float2* db = xds + blk * (T::QK / 32);
        ag += T::dot(rg, s, xb, db);
        au += T::dot(ru, s, xb, db);
    }
    ag = rf_warp_sum(ag);
    au = rf_warp_sum(au);
    if (lane == 0) out[row] = act(act_code, ag) * au;
}

#define MVQ_GLU_ARGS                                                                                     \
    const char *wg, const char *wu, const signed char *xq, const float2 *xds, float *out, int act_code, i64 K, \
        i64 M, i64 nb01g, i64 nb01u
#define MVQ_GLU_PASS wg, wu, xq, xds, out, act_code, K, M, nb01g, nb01u
#define MVQ_GLU_KERNEL(NAME) \
    RF_KERNEL void mul_mat_vec_q_glu_##NAME(MVQ_GLU_ARGS) { mul_mat_vec_q_glu<mq_##NAME>(MVQ_GLU_PASS); }

MVQ_GLU_KERNEL(q4_0)
MVQ_GLU_KERNEL(q4_1)
MVQ_GLU_KERNEL(q5_0)
MVQ_GLU_KERNEL(q5_1)
MVQ_GLU_KERNEL(q8_0)
MVQ_GLU_KERNEL(iq4_nl)
MVQ_GLU_KERNEL(q4_k)
MVQ_GLU_KERNEL(q6_k)
