// Kernels for runs of graph nodes that the backend fuses (src/gpu/ops/fused.rs and fused_qkv.rs, from launch_at): each
// computes what the nodes compute, in the same order of float operations (but for the RMS norm
// that mul_mat_vec_q_add_norm leaves to the next launch: the same up to float rounding), with
// fewer launches and fewer trips through device memory. Token generation is bound by the
// number of kernels per token more than by bytes.
#include "prelude.h"
#include "mmvq.hip"
#include "activation.hip"
#include "rope.hip"
#include "quantize.hip"
#include "hadamard.hip"

// [ADD ->] RMS_NORM [-> MUL by a row vector] [-> quantized for the next matrix-vector
// product], one block per row of contiguous F32 rows of ne0 values:
//   v   = a + b (b may be NULL: v = a); written to `sum` when it is not NULL;
//   out = v / sqrt(mean(v^2) + eps) [* w]   (w may be NULL);
//   qmode >= 0: out also quantized into xq / xds as quantize_q8 would (row-major, ne0 values).
// Rows of up to RMS_VALS * blockDim.x values stay in registers between the passes. Each pass
// issues all its loads before its stores: the outputs may alias the inputs (in-place ADD), so
// the compiler could not reorder them itself, and one latency per value serialized the row.
#define RMS_VALS 8
// Longest chunk of rot_qkv (the host fuses rotations of up to this many values).
#define ROT_QKV_MAX 256

#if RF_UNTYPED
RF_KERNEL __launch_bounds__(1024) void fused_rms_norm(const float* a, const float* b, float* sum, const float* w,
                                                      float* out, signed char* xq, float2* xds, int qmode, i64 ne0,
                                                      float eps) {
    rf_grid_begin();
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
        float v[RMS_VALS], u[RMS_VALS];
#pragma unroll
        for (int j = 0; j < RMS_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * nt;
            v[j] = i < ne0 ? ar[i] : 0.0f;
            u[j] = i < ne0 && br ? br[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < RMS_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * nt;
            if (br) v[j] = v[j] + u[j];
            if (sr && i < ne0) sr[i] = v[j];
            ss += v[j] * v[j];
        }
        ss = rf_block_sum(ss, scratch);
        const float s = 1.0f / sqrtf(ss / (float)ne0 + eps);
#pragma unroll
        for (int j = 0; j < RMS_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * nt;
            u[j] = i < ne0 && w ? w[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < RMS_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * nt;
            if (i < ne0) {
                v[j] = w ? (v[j] * s) * u[j] : v[j] * s;
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
#endif

// Dot products of NM weight rows (r0, and r1 when NM == 2) with one quantized src1 column
// (xq, xds) by one warp; every lane gets them in acc.
template <typename T, int NM>
RF_DEVICE void warp_row_dots(const unsigned char* r0, const unsigned char* r1, const signed char* xq, const float2* xds,
                             i64 K, float acc[NM]) {
    const int lane = threadIdx.x % RF_WARP_SIZE;
    const unsigned char* rows[2] = {r0, r1};
#pragma unroll
    for (int m = 0; m < NM; m++) acc[m] = 0.0f;
    const int nparts = (int)(K / T::QK * T::NSUB);
    // Whole-block types hold few registers per part: more of them in flight; for one row of a
    // small part (Q4_0, IQ4_NL, Q4_1) twice as many (64 registers a thread, no spills).
    enum { UNROLL = (T::NSUB == 1 ? 4 : 2) * (NM == 1 && sizeof(typename T::R) <= 20 ? 2 : 1) };
    for (int base = lane; base < nparts; base += UNROLL * RF_WARP_SIZE) {
        typename T::R r[UNROLL][NM];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int it = base + u * RF_WARP_SIZE;
            if (it < nparts) {
#pragma unroll
                for (int m = 0; m < NM; m++) r[u][m] = T::load(rows[m] + (it / T::NSUB) * T::BYTES, it % T::NSUB);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int it = base + u * RF_WARP_SIZE;
            if (it < nparts) {
                const int blk = it / T::NSUB, s = it % T::NSUB;
                const int* xb = (const int*)(xq + (i64)blk * T::QK);
                const float2* db = xds + (i64)blk * (T::QK / 32);
#pragma unroll
                for (int m = 0; m < NM; m++) acc[m] += T::dot(r[u][m], s, xb, db);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < NM; m++) acc[m] = rf_warp_sum(acc[m]);
}

// The RMS norm that mul_mat_vec_q_add_norm leaves to the kernel after it: a warp's lanes read
// the per-32-value sums of squares ssq[0, K / 32) early (rf_norm_part: the loads are issued
// there and waited for where rf_norm_scale adds them) and get 1 / sqrt(mean + eps). Every warp
// adds in the same order: one value for the whole row. ssq NULL: no norm pending, 1.
struct NormPart {
    float v[4];
};
RF_DEVICE NormPart rf_norm_part(const float* ssq, i64 K) {
    NormPart p;
    const i64 lane = threadIdx.x % RF_WARP_SIZE, n = K / 32;
#pragma unroll
    for (int j = 0; j < 4; j++) p.v[j] = ssq && lane + j * RF_WARP_SIZE < n ? ssq[lane + j * RF_WARP_SIZE] : 0.0f;
    return p;
}
RF_DEVICE float rf_norm_scale(NormPart p, const float* ssq, i64 K, float eps) {
    if (!ssq) return 1.0f;
    float t = (p.v[0] + p.v[1]) + (p.v[2] + p.v[3]);
    for (i64 i = threadIdx.x % RF_WARP_SIZE + 4 * RF_WARP_SIZE; i < K / 32; i += RF_WARP_SIZE) t += ssq[i];
    t = rf_warp_sum(t);
    return 1.0f / sqrtf(t / (float)K + eps);
}

// MUL_MAT(wg, x), MUL_MAT(wu, x), then GLU: act(sc * wg[row] . x) * (sc * wu[row] . x) for a
// single src1 column already quantized (xq, xds), a warp per row; sc is the pending norm's
// factor (1 when none). Here a warp per row, MVQ_ROWS rows per block.
template <typename T>
RF_DEVICE void mul_mat_vec_q_glu(const char* wg, const char* wu, const signed char* xq, const float2* xds, float* out,
                                 signed char* oq, float2* ods, int act_code, i64 K, i64 M, i64 nb01g, i64 nb01u,
                                 const float* ssq, float eps) {
    const i64 row = (i64)blockIdx.x * MVQ_ROWS + threadIdx.x / RF_WARP_SIZE;
    if (row >= M) return;
    const NormPart np = rf_norm_part(ssq, K);
    float a[2];
    warp_row_dots<T, 2>((const unsigned char*)wg + row * nb01g, (const unsigned char*)wu + row * nb01u, xq, xds, K, a);
    const float sc = rf_norm_scale(np, ssq, K, eps);
    const float o = act(act_code, a[0] * sc) * (a[1] * sc);
    if (threadIdx.x % RF_WARP_SIZE == 0) out[row] = o;
}

// 32 rows per block (M % 32 == 0), warps taking rows in turn; the block's 32 outputs are
// then quantized (quantize_q8's mode 0) into oq / ods for the next matrix-vector product.
// A pending norm (ssq) is applied by each warp to its own rows (the factor before act).
template <typename T>
RF_DEVICE void mul_mat_vec_q_glu_q8(const char* wg, const char* wu, const signed char* xq, const float2* xds, float* out,
                                    signed char* oq, float2* ods, int act_code, i64 K, i64 M, i64 nb01g, i64 nb01u,
                                    const float* ssq, float eps) {
    __shared__ float vals[32];
    const int warp = threadIdx.x / RF_WARP_SIZE, nwarps = blockDim.x / RF_WARP_SIZE;
    const NormPart np = rf_norm_part(ssq, K);
    float sc = -1.0f;  // computed before the warp's first row is finished
    for (int rr = warp; rr < 32; rr += nwarps) {
        const i64 row = (i64)blockIdx.x * 32 + rr;
        float a[2];
        warp_row_dots<T, 2>((const unsigned char*)wg + row * nb01g, (const unsigned char*)wu + row * nb01u, xq, xds, K, a);
        if (sc < 0.0f) sc = rf_norm_scale(np, ssq, K, eps);
        const float o = act(act_code, a[0] * sc) * (a[1] * sc);
        if (threadIdx.x % RF_WARP_SIZE == 0) {
            out[row] = o;
            vals[rr] = o;
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) quantize_vals32(vals[threadIdx.x], oq, ods, blockIdx.x, threadIdx.x);
}

// The first pf_rows of mul_mat_vec_q_glu_q8's 32 rows of both matrices, for its prefetch
// (the launcher keeps what all blocks prefetch within part of L2: prefetched lines evicted
// before their use are read twice).
RF_DEVICE void glu_q8_prefetch_l2(const char* wg, const char* wu, i64 nb01g, i64 nb01u, i64 pf_rows) {
    const i64 row0 = (i64)blockIdx.x * 32;
    rf_prefetch_l2(wg + row0 * nb01g, pf_rows * nb01g);
    rf_prefetch_l2(wu + row0 * nb01u, pf_rows * nb01u);
}

#define MVQ_GLU_ARGS                                                                                     \
    const char *wg, const char *wu, const signed char *xq, const float2 *xds, float *out, signed char *oq, \
        float2 *ods, int act_code, i64 K, i64 M, i64 nb01g, i64 nb01u, i64 pf_rows, const float *ssq, float eps
#define MVQ_GLU_PASS wg, wu, xq, xds, out, oq, ods, act_code, K, M, nb01g, nb01u, ssq, eps
#define MVQ_GLU_KERNEL(NAME, W)                                                                               \
    RF_KERNEL void mul_mat_vec_q_glu_##NAME(MVQ_GLU_ARGS) { rf_grid_begin(); mul_mat_vec_q_glu<mq_##NAME>(MVQ_GLU_PASS); } \
    RF_KERNEL __launch_bounds__(1024) void mul_mat_vec_q_glu_q8_##NAME(MVQ_GLU_ARGS) {                       \
        glu_q8_prefetch_l2(wg, wu, nb01g, nb01u, pf_rows);                                                           \
        rf_grid_begin();                                                                                    \
        mul_mat_vec_q_glu_q8<mq_##NAME>(MVQ_GLU_PASS);                                                      \
    }

RF_EACH_MVQ_TYPE(MVQ_GLU_KERNEL)

// MUL_MAT(w, x) -> ADD(res) -> RMS_NORM -> MUL(nw) for one quantized src1 column (xq, xds), with
// the norm's division left to the kernel that reads the result: 32 rows per block (M % 32 ==
// 0), a warp per row, warps taking rows in turn; then for the block's 32 rows
//   sum[row] = w[row] . x + res[row]        (the ADD: the residual stream, written)
//   oq, ods  <- sum[row] * nw[row] quantized in blocks of 32 (quantize_q8's mode 0, f32 scales)
//   ssq[blockIdx.x] = the 32 rows' sum of sum[row]^2
// A block of 32 values quantizes to the same integers whatever positive factor scales them all,
// so the next kernel multiplies its dot products by rf_norm_scale (1 / sqrt(mean + eps) of the
// whole row) and gets those of RMS_NORM's output times nw, up to float rounding: the norm costs
// no launch of its own. sum may alias res (in-place ADD): each value is read before it is
// written, by the same thread.
template <typename T>
RF_DEVICE void mul_mat_vec_q_add_norm(const char* w, const signed char* xq, const float2* xds, const float* res,
                                      float* sum, const float* nw, signed char* oq, float2* ods, float* ssq, i64 K,
                                      i64 nb01) {
    __shared__ float vals[32];
    const int warp = threadIdx.x / RF_WARP_SIZE, nwarps = blockDim.x / RF_WARP_SIZE;
    for (int rr = warp; rr < 32; rr += nwarps) {
        const i64 row = (i64)blockIdx.x * 32 + rr;
        float a[1];
        warp_row_dots<T, 1>((const unsigned char*)w + row * nb01, 0, xq, xds, K, a);
        if (threadIdx.x % RF_WARP_SIZE == 0) vals[rr] = a[0];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const i64 row = (i64)blockIdx.x * 32 + threadIdx.x;
        const float v = vals[threadIdx.x] + res[row];
        sum[row] = v;
        quantize_vals32(v * nw[row], oq, ods, blockIdx.x, threadIdx.x, true);
        const float q = rf_group_sum<32>(v * v);
        if (threadIdx.x == 0) ssq[blockIdx.x] = q;
    }
}
#define MVQ_ADD_NORM_KERNEL(NAME, W)                                                                               \
    RF_KERNEL __launch_bounds__(1024) void mul_mat_vec_q_add_norm_##NAME(                                          \
        const char* w, const signed char* xq, const float2* xds, const float* res, float* sum, const float* nw,    \
        signed char* oq, float2* ods, float* ssq, i64 K, i64 nb01, i64 pf_rows) {                                  \
        rf_prefetch_l2(w + (i64)blockIdx.x * 32 * nb01, pf_rows * nb01);                                           \
        rf_grid_begin();                                                                                            \
        mul_mat_vec_q_add_norm<mq_##NAME>(w, xq, xds, res, sum, nw, oq, ods, ssq, K, nb01);                         \
    }
RF_EACH_MVQ_TYPE(MVQ_ADD_NORM_KERNEL)

// [ROPE(q) ->] ROPE(k) -> SET_ROWS(k cache) [-> SET_ROWS(v cache)] of F32 rows, normal or neox
// rope, one block per row: blocks [0, nq) rope a row of q (nq = q_ne1 * q_ne2, rows (head i1,
// token i2)) into qd; the next nk = k_ne1 * n_tok rope a row of k straight into its cache row
// kidx[token] (head i1 at i1 * ne0 values; F16 or F32 cache); the last nv (0 or n_tok) copy a
// token's nv_vals values of v into its cache row vidx[token]. Rounding as ROPE then SET_ROWS.
RF_DEVICE i64 fused_row_id(const char* idx, int idx64, i64 t, i64 nbi0) {
    const char* p = idx + t * nbi0;
    return idx64 ? *(const i64*)p : (i64) * (const int*)p;
}

#if RF_UNTYPED
RF_KERNEL void fused_rope_kv(const char* qa, char* qd, i64 q_ne1, i64 nq, i64 nbqa1, i64 nbqa2, i64 nbqd1, i64 nbqd2,
                             const char* ka, i64 k_ne1, i64 nbka1, i64 nbka2, char* kc, const char* kidx, int kidx64,
                             i64 nbki0, int kc_f16, i64 nbkc1, i64 kc_rows, const char* va, i64 nv_vals, i64 nbva1,
                             char* vc, const char* vidx, int vidx64, i64 nbvi0, int vc_f16, i64 nbvc1, i64 vc_rows,
                             i64 n_tok, const int* pos, const float* ff, i64 ne0, int n_dims, int neox, int n_offs,
                             float theta_scale, float freq_scale, float ext_factor, float attn_factor, float corr0,
                             float corr1) {
    rf_grid_begin();
    i64 b = blockIdx.x;
    if (b < nq) {
        const i64 i1 = b % q_ne1, i2 = b / q_ne1;
        rope_row<float, float>(qa + i1 * nbqa1 + i2 * nbqa2, qd + i1 * nbqd1 + i2 * nbqd2, pos, ff, i2, ne0, n_tok,
                               n_dims, neox, n_offs, theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1, 0, 0,
                               0, 0, 0);
        return;
    }
    b -= nq;
    const i64 nk = k_ne1 * n_tok;
    if (b < nk) {
        const i64 i1 = b % k_ne1, i2 = b / k_ne1;
        const i64 row = fused_row_id(kidx, kidx64, i2, nbki0);
        if (row < 0 || row >= kc_rows) return;
        const char* src = ka + i1 * nbka1 + i2 * nbka2;
        if (kc_f16) {
            rope_row<float, f16_bits>(src, kc + row * nbkc1 + i1 * ne0 * 2, pos, ff, i2, ne0, n_tok, n_dims, neox,
                                      n_offs, theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1, 0, 0, 0,
                                      0, 0);
        } else {
            rope_row<float, float>(src, kc + row * nbkc1 + i1 * ne0 * 4, pos, ff, i2, ne0, n_tok, n_dims, neox, n_offs,
                                   theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1, 0, 0, 0, 0, 0);
        }
        return;
    }
    const i64 t = b - nk;
    const i64 row = fused_row_id(vidx, vidx64, t, nbvi0);
    if (row < 0 || row >= vc_rows) return;
    const float* src = (const float*)(va + t * nbva1);
    char* dst = vc + row * nbvc1;
    for (i64 k = threadIdx.x; k < nv_vals; k += blockDim.x) {
        if (vc_f16) {
            ((f16_bits*)dst)[k] = rf_f32_to_f16(src[k]);
        } else {
            ((float*)dst)[k] = src[k];
        }
    }
}
#endif

// Q, K and V of one token (attention's input products of one quantized activation) in one
// launch, together with what llama's graph does next with them: ROPE(Q) into ROPE's tensor,
// ROPE(K) into its cache row, V into its cache row (SET_ROWS); Q, K and V themselves are not
// written. Each block computes one rotation pair of rows (normal mode: adjacent rows; neox:
// rows half a head apart), so no rotation needs another block's result. Blocks [0, Mq/2) take
// Q, then Mk/2 blocks K, then V. Rope NORMAL (channels from n_dims on pass through) or NEOX
// over whole heads (n_dims = ne0), no offset channel, position pos[0].
struct QkvBlock {
    int which;  // 0 Q, 1 K, 2 V
    int k;      // rotation pair index within the head
    i64 r0, stride;
};
RF_DEVICE QkvBlock qkv_block(i64 Mq, i64 Mk, i64 ne0, int neox) {
    const i64 bq = Mq / 2, bk = Mk / 2, half = ne0 / 2;
    QkvBlock b;
    i64 p = blockIdx.x;
    b.which = 0;
    if (p >= bq) {
        p -= bq;
        b.which = 1;
        if (p >= bk) {
            p -= bk;
            b.which = 2;
        }
    }
    b.r0 = 2 * p;
    b.stride = 1;
    b.k = (int)((b.r0 % ne0) / 2);
    if (b.which < 2 && neox) {
        b.k = (int)(p % half);
        b.r0 = (p / half) * ne0 + b.k;
        b.stride = half;
    }
    return b;
}

// The block's two weight rows, for its prefetch.
RF_DEVICE void qkv_prefetch_l2(const char* wq, const char* wk, const char* wv, i64 Mq, i64 Mk, i64 nb01q, i64 nb01k,
                               i64 nb01v, i64 ne0, int neox) {
    const QkvBlock b = qkv_block(Mq, Mk, ne0, neox);
    const char* w = b.which == 0 ? wq : b.which == 1 ? wk : wv;
    const i64 nb01 = b.which == 0 ? nb01q : b.which == 1 ? nb01k : nb01v;
    if (b.stride == 1) {
        rf_prefetch_l2(w + b.r0 * nb01, 2 * nb01);
    } else {
        rf_prefetch_l2(w + b.r0 * nb01, nb01);
        rf_prefetch_l2(w + (b.r0 + b.stride) * nb01, nb01);
    }
}

template <typename T>
RF_DEVICE void mul_mat_vec_q1_qkv(const char* wq, const char* wk, const char* wv, const signed char* xq,
                                  const float2* xds, i64 K, i64 Mq, i64 Mk, i64 Mv, i64 nb01q, i64 nb01k, i64 nb01v,
                                  float* qd, char* kc, const char* kidx, int kidx64, int kc_f16, i64 kc_rows,
                                  i64 nbkc1, char* vc, const char* vidx, int vidx64, int vc_f16, i64 vc_rows,
                                  i64 nbvc1, int v_per_value, i64 nbvi0, const int* pos, const float* ff, i64 ne0, int n_dims, int neox,
                                  float theta_scale, float freq_scale, float ext_factor, float attn_factor,
                                  float corr0, float corr1, const float* ssq, float eps) {
    __shared__ float pair[2];
    const QkvBlock b = qkv_block(Mq, Mk, ne0, neox);
    const int which = b.which, k = b.k;
    const i64 r0 = b.r0, stride = b.stride;
    const char* w = which == 0 ? wq : which == 1 ? wk : wv;
    const i64 nb01 = which == 0 ? nb01q : which == 1 ? nb01k : nb01v;
    const i64 M = which == 0 ? Mq : which == 1 ? Mk : Mv;
    const NormPart np = rf_norm_part(threadIdx.x < RF_WARP_SIZE ? ssq : 0, K);
    const float v = mv1_dots<T, 2, MV1_UNROLL_DEF>((const unsigned char*)w, nb01, M, r0, stride, xq, xds, K);
    if (threadIdx.x < 2) pair[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x >= RF_WARP_SIZE) return;
    const float sc = rf_norm_scale(np, ssq, K, eps);  // the pending norm's factor, by the first warp
    if (threadIdx.x != 0) return;
    const float x0 = pair[0] * sc, x1 = pair[1] * sc;
    float y0 = x0, y1 = x1;
    if (which < 2 && (neox || 2 * k < n_dims)) {
        float c, s;
        rope_cs((float)pos[0], ff ? ff[k] : 1.0f, k, theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1,
                &c, &s);
        y0 = x0 * c - x1 * s;
        y1 = x0 * s + x1 * c;
    }
    if (which == 0) {
        qd[r0] = y0;
        qd[r0 + stride] = y1;
        return;
    }
    if (which == 2 && v_per_value) {
        // V cache stored transposed (llama without flash attention): value r into row vidx[r].
        const i64 ra = fused_row_id(vidx, vidx64, r0, nbvi0), rb = fused_row_id(vidx, vidx64, r0 + stride, nbvi0);
        if (ra >= 0 && ra < vc_rows) {
            if (vc_f16) *(f16_bits*)(vc + ra * nbvc1) = rf_f32_to_f16(y0);
            else *(float*)(vc + ra * nbvc1) = y0;
        }
        if (rb >= 0 && rb < vc_rows) {
            if (vc_f16) *(f16_bits*)(vc + rb * nbvc1) = rf_f32_to_f16(y1);
            else *(float*)(vc + rb * nbvc1) = y1;
        }
        return;
    }
    char* cache = which == 1 ? kc : vc;
    const i64 row = which == 1 ? fused_row_id(kidx, kidx64, 0, 0) : fused_row_id(vidx, vidx64, 0, 0);
    if (row < 0 || row >= (which == 1 ? kc_rows : vc_rows)) return;
    char* dst = cache + row * (which == 1 ? nbkc1 : nbvc1);
    if (which == 1 ? kc_f16 : vc_f16) {
        ((f16_bits*)dst)[r0] = rf_f32_to_f16(y0);
        ((f16_bits*)dst)[r0 + stride] = rf_f32_to_f16(y1);
    } else {
        ((float*)dst)[r0] = y0;
        ((float*)dst)[r0 + stride] = y1;
    }
}
#define QKV_KERNEL(NAME, W)                                                                                        \
    RF_KERNEL __launch_bounds__(MV1_MAX_THREADS) void mul_mat_vec_q1_qkv_##NAME(                                   \
        const char* wq, const char* wk, const char* wv, const signed char* xq, const float2* xds, i64 K, i64 Mq,   \
        i64 Mk, i64 Mv, i64 nb01q, i64 nb01k, i64 nb01v, float* qd, char* kc, const char* kidx, int kidx64,        \
        int kc_f16, i64 kc_rows, i64 nbkc1, char* vc, const char* vidx, int vidx64, int vc_f16, i64 vc_rows,       \
        i64 nbvc1, int v_per_value, i64 nbvi0, const int* pos, const float* ff, i64 ne0, int n_dims, int neox,     \
        float theta_scale, float freq_scale, float ext_factor, float attn_factor, float corr0, float corr1,        \
        const float* ssq, float eps) {                                                                              \
        qkv_prefetch_l2(wq, wk, wv, Mq, Mk, nb01q, nb01k, nb01v, ne0, neox);                                       \
        rf_grid_begin();                                                                                            \
        mul_mat_vec_q1_qkv<mq_##NAME>(wq, wk, wv, xq, xds, K, Mq, Mk, Mv, nb01q, nb01k, nb01v, qd, kc, kidx,      \
                                      kidx64, kc_f16, kc_rows, nbkc1, vc, vidx, vidx64, vc_f16, vc_rows, nbvc1,   \
                                      v_per_value, nbvi0, pos, ff, ne0, n_dims, neox, theta_scale, freq_scale,     \
                                      ext_factor,                                                                  \
                                      attn_factor, corr0, corr1, ssq, eps);                                        \
    }
RF_EACH_MVQ_TYPE(QKV_KERNEL)

#if RF_UNTYPED
// Attention's input rotations for quantized KV caches, after mul_mat_vec_q1_qkv: llama.cpp
// multiplies roped Q and roped K by the Hadamard matrix of nk (and V by that of nv) before K and V
// go into the cache. The Q/K/V launch wrote roped Q, roped K and V as F32 rows into the
// rotations' own outputs (q, k, v); here one block per chunk of n values (a row of the
// reshaped product) transforms it as hadamard_rows does: Q's in place, K's and V's straight
// into their cache rows, quantized as SET_ROWS would (quantize_unit, type kdt / vdt). Blocks
// [0, Mq/nk) take Q, then Mk/nk blocks K, then Mv/nv blocks V (Mv = 0: V is not rotated here).
RF_KERNEL void rot_qkv(float* q, i64 Mq, float* k, i64 Mk, i64 nk, float sk, float* v, i64 Mv, i64 nv, float sv,
                       char* kc, const char* kidx, int kidx64, int kdt, i64 kc_rows, i64 nbkc1, char* vc,
                       const char* vidx, int vidx64, int vdt, i64 vc_rows, i64 nbvc1) {
    rf_grid_begin();
    __shared__ float s[ROT_QKV_MAX];
    const i64 bq = Mq / nk, bk = Mk / nk;
    i64 b = blockIdx.x;
    int which = 0;
    if (b >= bq) {
        b -= bq;
        which = 1;
        if (b >= bk) {
            b -= bk;
            which = 2;
        }
    }
    const int n = (int)(which == 2 ? nv : nk);
    float* chunk = (which == 0 ? q : which == 1 ? k : v) + b * n;
    const float scale = which == 2 ? sv : sk;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s[j] = chunk[j] * scale;
    rf_hadamard_shared(s, n);
    if (which == 0) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) chunk[j] = s[j];
        return;
    }
    const i64 row = which == 1 ? fused_row_id(kidx, kidx64, 0, 0) : fused_row_id(vidx, vidx64, 0, 0);
    if (row < 0 || row >= (which == 1 ? kc_rows : vc_rows)) return;
    const int dt = which == 1 ? kdt : vdt;
    char* dst = (which == 1 ? kc + row * nbkc1 : vc + row * nbvc1) + (b * n / 32) * qz_unit_bytes(dt);
    for (int u = threadIdx.x; u < n / 32; u += blockDim.x) quantize_unit((const char*)s, 0, dst, dt, u);
}
#endif
