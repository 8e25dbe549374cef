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
// Rows of up to RMS_VALS * blockDim.x values stay in registers between the passes.
#define RMS_VALS 16

RF_KERNEL void fused_rms_norm(const float* a, const float* b, float* sum, const float* w, float* out, signed char* xq,
                              float2* xds, int qmode, i64 ne0, float eps) {
    __shared__ float scratch[RF_MAX_WARPS];
    const i64 r = blockIdx.x;
    const int nt = blockDim.x;
    const float* ar = a + r * ne0;
    const float* br = b ? b + r * ne0 : 0;
    float* sr = sum ? sum + r * ne0 : 0;
    float* y = out + r * ne0;
    const int lane = threadIdx.x % 32, group = threadIdx.x / 32, ngroups = nt / 32;
    float ss = 0.0f;
    if (ne0 <= (i64)RMS_VALS * nt) {
        // Thread t holds values t + j * nt; for each j the 32 threads of a group hold one
        // block of 32 (nt is a multiple of 64), so the quantization needs no second read.
        float v[RMS_VALS];
#pragma unroll
        for (int j = 0; j < RMS_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * nt;
            float x = 0.0f;
            if (i < ne0) {
                x = br ? ar[i] + br[i] : ar[i];
                if (sr) sr[i] = x;
            }
            v[j] = x;
            ss += x * x;
        }
        ss = rf_block_sum(ss, scratch);
        const float s = 1.0f / sqrtf(ss / (float)ne0 + eps);
#pragma unroll
        for (int j = 0; j < RMS_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * nt;
            if (i < ne0) {
                v[j] = w ? (v[j] * s) * w[i] : v[j] * s;
                y[i] = v[j];
            }
        }
        if (qmode == 0) {
#pragma unroll
            for (int j = 0; j < RMS_VALS; j++) {
                const i64 i0 = (i64)j * nt + 32 * group;  // ne0 % 32 == 0: whole groups in or out
                if (i0 < ne0) quantize_vals32(v[j], xq + r * ne0, xds + r * (ne0 / 32), i0 / 32, lane);
            }
            return;
        }
    } else {
        for (i64 i = threadIdx.x; i < ne0; i += nt) {
            const float v = br ? ar[i] + br[i] : ar[i];
            if (sr) sr[i] = v;
            ss += v * v;
        }
        ss = rf_block_sum(ss, scratch);
        const float s = 1.0f / sqrtf(ss / (float)ne0 + eps);
        for (i64 i = threadIdx.x; i < ne0; i += nt) {
            const float v = br ? ar[i] + br[i] : ar[i];
            y[i] = w ? (v * s) * w[i] : v * s;
        }
    }
    if (qmode < 0) return;
    __syncthreads();  // the row's outputs, written by all threads, are read back below
    if (qmode == 0) {
        for (i64 bk = group; bk < ne0 / 32; bk += ngroups) quantize_block32(y, xq + r * ne0, xds + r * (ne0 / 32), bk, lane);
    } else {
        for (i64 bk = group; bk < ne0 / 256; bk += ngroups) quantize_block256(y, xq + r * ne0, xds + r * (ne0 / 32), bk, lane);
    }
}

// MUL_MAT(wg, x), MUL_MAT(wu, x), then GLU: act(wg[row] . x) * (wu[row] . x) for a single
// src1 column already quantized (xq, xds), by one warp (every lane gets the result).
template <typename T>
RF_DEVICE float glu_row(const unsigned char* gr, const unsigned char* ur, const signed char* xq, const float2* xds,
                        int act_code, i64 K) {
    const int lane = threadIdx.x % RF_WARP_SIZE;
    float ag = 0.0f, au = 0.0f;
    const int nparts = (int)(K / T::QK * T::NSUB);
    // Whole-block types hold few registers per part: more of them in flight.
    enum { UNROLL = T::NSUB == 1 ? 4 : 2 };
    for (int base = lane; base < nparts; base += UNROLL * RF_WARP_SIZE) {
        typename T::R rg[UNROLL], ru[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int it = base + u * RF_WARP_SIZE;
            if (it < nparts) {
                rg[u] = T::load(gr + (it / T::NSUB) * T::BYTES, it % T::NSUB);
                ru[u] = T::load(ur + (it / T::NSUB) * T::BYTES, it % T::NSUB);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int it = base + u * RF_WARP_SIZE;
            if (it < nparts) {
                const int blk = it / T::NSUB, s = it % T::NSUB;
                const int* xb = (const int*)(xq + (i64)blk * T::QK);
                const float2* db = xds + (i64)blk * (T::QK / 32);
                ag += T::dot(rg[u], s, xb, db);
                au += T::dot(ru[u], s, xb, db);
            }
        }
    }
    ag = rf_warp_sum(ag);
    au = rf_warp_sum(au);
    return act(act_code, ag) * au;
}

// A warp per row, MVQ_ROWS rows per block.
template <typename T>
RF_DEVICE void mul_mat_vec_q_glu(const char* wg, const char* wu, const signed char* xq, const float2* xds, float* out,
                                 signed char* oq, float2* ods, int act_code, i64 K, i64 M, i64 nb01g, i64 nb01u) {
    const i64 row = (i64)blockIdx.x * MVQ_ROWS + threadIdx.x / RF_WARP_SIZE;
    if (row >= M) return;
    const float o = glu_row<T>((const unsigned char*)wg + row * nb01g, (const unsigned char*)wu + row * nb01u, xq, xds,
                               act_code, K);
    if (threadIdx.x % RF_WARP_SIZE == 0) out[row] = o;
}

// 32 rows per block (M % 32 == 0), warps taking rows in turn; the block's 32 outputs are
// then quantized (quantize_q8's mode 0) into oq / ods for the next matrix-vector product.
template <typename T>
RF_DEVICE void mul_mat_vec_q_glu_q8(const char* wg, const char* wu, const signed char* xq, const float2* xds, float* out,
                                    signed char* oq, float2* ods, int act_code, i64 K, i64 M, i64 nb01g, i64 nb01u) {
    __shared__ float vals[32];
    const int warp = threadIdx.x / RF_WARP_SIZE, nwarps = blockDim.x / RF_WARP_SIZE;
    for (int rr = warp; rr < 32; rr += nwarps) {
        const i64 row = (i64)blockIdx.x * 32 + rr;
        const float o = glu_row<T>((const unsigned char*)wg + row * nb01g, (const unsigned char*)wu + row * nb01u, xq,
                                   xds, act_code, K);
        if (threadIdx.x % RF_WARP_SIZE == 0) {
            out[row] = o;
            vals[rr] = o;
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) quantize_vals32(vals[threadIdx.x], oq, ods, blockIdx.x, threadIdx.x);
}

#define MVQ_GLU_ARGS                                                                                     \
    const char *wg, const char *wu, const signed char *xq, const float2 *xds, float *out, signed char *oq, \
        float2 *ods, int act_code, i64 K, i64 M, i64 nb01g, i64 nb01u
#define MVQ_GLU_PASS wg, wu, xq, xds, out, oq, ods, act_code, K, M, nb01g, nb01u
#define MVQ_GLU_KERNEL(NAME)                                                                                  \
    RF_KERNEL void mul_mat_vec_q_glu_##NAME(MVQ_GLU_ARGS) { mul_mat_vec_q_glu<mq_##NAME>(MVQ_GLU_PASS); }       \
    RF_KERNEL __launch_bounds__(1024) void mul_mat_vec_q_glu_q8_##NAME(MVQ_GLU_ARGS) {                       \
        mul_mat_vec_q_glu_q8<mq_##NAME>(MVQ_GLU_PASS);                                                      \
    }

MVQ_GLU_KERNEL(q4_0)
MVQ_GLU_KERNEL(q4_1)
MVQ_GLU_KERNEL(q5_0)
MVQ_GLU_KERNEL(q5_1)
MVQ_GLU_KERNEL(q8_0)
MVQ_GLU_KERNEL(iq4_nl)
MVQ_GLU_KERNEL(q4_k)
MVQ_GLU_KERNEL(q6_k)
