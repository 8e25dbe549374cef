// MUL_MAT: dst[i, j] = dot(src0 row i, src1 row j) per batch, src0 broadcast over dims 2, 3.
// src0 (weights) F32, F16 or a quantized type (quants.h) with dense rows, src1 F32 with
// dense rows, dst F32. Byte strides throughout, as ggml stores them. Weights are
// dequantized in registers, products accumulated in f32.
#include "prelude.h"
#include "quants.h"

// Matrix-vector form for few src1 columns (token generation): a warp per output row and
// up to MV_COLS columns, so each weight row is read once for all of them; MV_ROWS rows
// (warps) per block. Each lane takes whole blocks of 32 weights (consecutive lanes,
// consecutive blocks: the warp reads the row contiguously), so all of a block's loads are
// in flight together; the warp sums with shuffles, no block-wide barrier.
#define MV_COLS 4
#define MV_ROWS 4

// x rounded as round_src1's float modes round it (2 = f16, 4 = bf16, else as is): the vector
// kernel does it in place of a round_src1 launch.
RF_DEVICE float mv_round_x(float v, int xround) {
    return xround == 2 ? rf_f16_to_f32(rf_f32_to_f16(v)) : xround == 4 ? rf_round_bf16(v) : v;
}

// A warp's output row of the matrix-vector forms: its weight row, its up to MV_COLS src1 rows
// (ncols of them real; the others repeat the first so loads stay in bounds) and where its
// sums go. mv_row is false for a warp past the last row (the whole warp leaves together).
struct MvRow {
    const char* wr;
    const char* xr[MV_COLS];
    int ncols;
    i64 col0, b;
    char* db;
};
RF_DEVICE bool mv_row(MvRow& m, const char* w, const char* x, char* d, i64 M, i64 N, i64 ne12, i64 r2, i64 r3,
                      i64 nb01, i64 nb02, i64 nb03, i64 nb11, i64 nb12, i64 nb13, i64 nb2, i64 nb3) {
    const i64 row = (i64)blockIdx.x * MV_ROWS + threadIdx.x / RF_WARP_SIZE;
    if (row >= M) return false;
    m.col0 = (i64)blockIdx.y * MV_COLS;
    m.b = blockIdx.z;
    const i64 i2 = m.b % ne12, i3 = m.b / ne12;
    m.wr = w + row * nb01 + (i2 / r2) * nb02 + (i3 / r3) * nb03;
    const char* xb = x + i2 * nb12 + i3 * nb13;
    m.ncols = (int)(N - m.col0 < MV_COLS ? N - m.col0 : MV_COLS);
#pragma unroll
    for (int c = 0; c < MV_COLS; c++) m.xr[c] = xb + (m.col0 + (c < m.ncols ? c : 0)) * nb11;
    m.db = d + i2 * nb2 + i3 * nb3 + row * 4;
    return true;
}
// The lanes' partial sums summed over the warp, written by lane 0.
RF_DEVICE void mv_store(const MvRow& m, const float* acc, i64 nb1) {
#pragma unroll
    for (int c = 0; c < MV_COLS; c++) {
        const float s = rf_warp_sum(acc[c]);
        if (threadIdx.x % RF_WARP_SIZE == 0 && c < m.ncols) *(float*)(m.db + (m.col0 + c) * nb1) = s;
    }
}

template <typename W>
RF_DEVICE void mul_mat_vec(const char* w, const char* x, char* d, i64 K, i64 M, i64 N, i64 ne12, i64 r2, i64 r3,
                           i64 nb01, i64 nb02, i64 nb03, i64 nb11, i64 nb12, i64 nb13, i64 nb1, i64 nb2, i64 nb3,
                           const float* corr, int xround) {
    const int lane = threadIdx.x % RF_WARP_SIZE;
    MvRow m;
    if (!mv_row(m, w, x, d, M, N, ne12, r2, r3, nb01, nb02, nb03, nb11, nb12, nb13, nb2, nb3)) return;
    const char* wr = m.wr;
    const int ncols = m.ncols;
    const i64 col0 = m.col0, b = m.b;
    const float* xr[MV_COLS];
#pragma unroll
    for (int c = 0; c < MV_COLS; c++) xr[c] = (const float*)m.xr[c];
    float acc[MV_COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
    // Whole blocks of 32 (every quantized K is a multiple of 32) ...
    for (i64 blk = lane; blk < K / 32; blk += RF_WARP_SIZE) {
        float wv[32];
        load_block32<W>(wr, blk, wv);
#pragma unroll
        for (int c = 0; c < MV_COLS; c++) {
            if (c < ncols) {
                const float* xv = xr[c] + blk * 32;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 32; j++) s += wv[j] * mv_round_x(xv[j], xround);
                acc[c] += s;
            }
        }
        if (corr) {
            const float mw = load_w_min<W>(wr, blk);
#pragma unroll
            for (int c = 0; c < MV_COLS; c++) {
                if (c < ncols) acc[c] += mw * corr[(col0 + c + N * b) * (K / 32) + blk];
            }
        }
    }
    // ... then, for F32/F16 rows of any length, the last K % 32 values one per lane.
    for (i64 k = (K / 32) * 32 + lane; k < K; k += RF_WARP_SIZE) {
        const float wk = load_w<W>(wr, k);
#pragma unroll
        for (int c = 0; c < MV_COLS; c++) {
            if (c < ncols) acc[c] += wk * mv_round_x(xr[c][k], xround);
        }
    }
    mv_store(m, acc, nb1);
}

// Tiled form: 64x64 output tiles, 16-deep slices of K staged in shared memory,
// 256 threads each computing a 4x4 patch (rows tx + 16*i, columns ty + 16*j).
#define MM_BM 64
#define MM_BN 64
#define MM_BK 16

template <typename W>
RF_DEVICE void mul_mat_tiled(const char* w, const char* x, char* d, i64 K, i64 M, i64 N, i64 ne12, i64 r2, i64 r3,
                             i64 nb01, i64 nb02, i64 nb03, i64 nb11, i64 nb12, i64 nb13, i64 nb1, i64 nb2, i64 nb3,
                             const float* corr, int xround) {
    (void)xround;  // src1 comes rounded (round_src1)
    __shared__ float As[MM_BK][MM_BM + 1];
    __shared__ float Bs[MM_BK][MM_BN + 1];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const i64 row0 = (i64)blockIdx.x * MM_BM, col0 = (i64)blockIdx.y * MM_BN;
    const i64 b = blockIdx.z, i2 = b % ne12, i3 = b / ne12;
    const char* wb = w + (i2 / r2) * nb02 + (i3 / r3) * nb03;
    const char* xb = x + i2 * nb12 + i3 * nb13;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;

    for (i64 k0 = 0; k0 < K; k0 += MM_BK) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int e = tid + q * 256, r = e / MM_BK, kk = e % MM_BK;
            const i64 gk = k0 + kk, gr = row0 + r, gc = col0 + r;
            As[kk][r] = (gr < M && gk < K) ? load_w<W>(wb + gr * nb01, gk) : 0.0f;
            Bs[kk][r] = (gc < N && gk < K) ? ((const float*)(xb + gc * nb11))[gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_BK; kk++) {
            float a[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = As[kk][tx + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) bv[j] = Bs[kk][ty + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * bv[j];
        }
        __syncthreads();
        if (corr && k0 % 32 == 0) {  // min x (f16 block sum - exact block sum) per block
            const i64 blk = k0 / 32;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const i64 r = row0 + tx + 16 * i;
                const float mw = r < M ? load_w_min<W>(wb + r * nb01, blk) : 0.0f;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const i64 c = col0 + ty + 16 * j;
                    if (c < N) acc[i][j] += mw * corr[(c + N * b) * (K / 32) + blk];
                }
            }
        }
    }
    char* db = d + i2 * nb2 + i3 * nb3;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const i64 c = col0 + ty + 16 * j;
        if (c >= N) continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const i64 r = row0 + tx + 16 * i;
            if (r < M) *(float*)(db + c * nb1 + r * 4) = acc[i][j];
        }
    }
}

#define MUL_MAT_ARGS                                                                                          \
    const char *w, const char *x, char *d, i64 K, i64 M, i64 N, i64 ne12, i64 r2, i64 r3, i64 nb01, i64 nb02, \
        i64 nb03, i64 nb11, i64 nb12, i64 nb13, i64 nb1, i64 nb2, i64 nb3, const float *corr, int xround
#define MUL_MAT_PASS w, x, d, K, M, N, ne12, r2, r3, nb01, nb02, nb03, nb11, nb12, nb13, nb1, nb2, nb3, corr, xround

#define MUL_MAT_KERNELS(NAME, W)                                                          \
    RF_KERNEL void mul_mat_vec_##NAME(MUL_MAT_ARGS) { rf_grid_begin(); mul_mat_vec<W>(MUL_MAT_PASS); } \
    RF_KERNEL void mul_mat_tiled_##NAME(MUL_MAT_ARGS) { rf_grid_begin(); mul_mat_tiled<W>(MUL_MAT_PASS); }

RF_EACH_WEIGHT_TYPE(MUL_MAT_KERNELS)

// Matrix-vector form for float weights (F32, F16, BF16): the lanes take segments of 8 values
// (one or two 16-byte loads; consecutive lanes, consecutive segments), where mul_mat_vec gives
// each lane a block of 32. Attention's KQ (K = 128 head values, an F16 cache) kept 4 lanes of
// 32 busy, and a router's few long F32 rows (128 x 2048) were read 4 bytes a load, strided by
// a block. Weight rows and src1 rows 16-byte aligned, K % 8 == 0 (matmul.rs checks); no min
// correction (float weights have none).
template <typename W> RF_DEVICE void load_seg8(const char* row, i64 s, float* out);
template <> RF_DEVICE_SPEC void load_seg8<w_f32>(const char* row, i64 s, float* out) {
    const int4 a = ((const int4*)(row + s * 32))[0], b = ((const int4*)(row + s * 32))[1];
    out[0] = __int_as_float(a.x), out[1] = __int_as_float(a.y), out[2] = __int_as_float(a.z), out[3] = __int_as_float(a.w);
    out[4] = __int_as_float(b.x), out[5] = __int_as_float(b.y), out[6] = __int_as_float(b.z), out[7] = __int_as_float(b.w);
}
template <> RF_DEVICE_SPEC void load_seg8<w_f16>(const char* row, i64 s, float* out) {
    const int4 a = *(const int4*)(row + s * 16);
    const unsigned u[4] = {(unsigned)a.x, (unsigned)a.y, (unsigned)a.z, (unsigned)a.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        out[2 * j] = rf_f16_to_f32((f16_bits)(u[j] & 0xffffu));
        out[2 * j + 1] = rf_f16_to_f32((f16_bits)(u[j] >> 16));
    }
}
template <> RF_DEVICE_SPEC void load_seg8<w_bf16>(const char* row, i64 s, float* out) {
    const int4 a = *(const int4*)(row + s * 16);
    const unsigned u[4] = {(unsigned)a.x, (unsigned)a.y, (unsigned)a.z, (unsigned)a.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        out[2 * j] = __uint_as_float(u[j] << 16);
        out[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
    }
}

template <typename W>
RF_DEVICE void mul_mat_vec8(MUL_MAT_ARGS) {
    MvRow m;
    if (!mv_row(m, w, x, d, M, N, ne12, r2, r3, nb01, nb02, nb03, nb11, nb12, nb13, nb2, nb3)) return;
    float acc[MV_COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (i64 s = threadIdx.x % RF_WARP_SIZE; s < K / 8; s += RF_WARP_SIZE) {
        float wv[8];
        load_seg8<W>(m.wr, s, wv);
#pragma unroll
        for (int c = 0; c < MV_COLS; c++) {
            if (c < m.ncols) {
                float xv[8];
                load_seg8<w_f32>(m.xr[c], s, xv);
                float t = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) t += wv[j] * mv_round_x(xv[j], xround);
                acc[c] += t;
            }
        }
    }
    mv_store(m, acc, nb1);
}

#define MUL_MAT_VEC8_KERNELS(NAME, W) \
    RF_KERNEL void mul_mat_vec8_##NAME(MUL_MAT_ARGS) { rf_grid_begin(); mul_mat_vec8<W>(MUL_MAT_PASS); }

RF_EACH_FLOAT_TYPE(MUL_MAT_VEC8_KERNELS)

#if RF_UNTYPED
// src1 rounded the way ggml-cpu feeds it to its dot products, written densely to `out`
// (K floats per row, rows in (i1, i2, i3) order): mode 0 = quantized to 8-bit blocks of 32
// with an f16 scale (Q8_0 / Q8_1, for Q4_0/Q4_1/Q5_x/Q8_0/IQ4_NL weights), mode 1 = 8-bit
// blocks of 256 with an f32 scale (Q8_K, for K-quant weights), mode 2 = rounded to f16 (F16
// weights), mode 4 = rounded to bf16 (BF16 weights), mode 3 = as mode 0 plus, per block, f16(d * sum q) - f16(d) * sum q (Q8_1's
// rounded block sum `s`, for Q4_1/Q5_1 mins) into corr[row * K/32 + block]. Products with
// the rounded values then equal ggml-cpu's integer dots up to the
// order of f32 additions, so the GPU agrees with ggml-cpu as closely as its CPU device does.
// One group of 32 threads per block of 32 (or 256) values: the block's max and sums are
// group reductions, so the block's loads are issued together instead of one thread walking
// the block one load at a time.
RF_KERNEL void round_src1(const char* x, float* out, float* corr, int mode, i64 K, i64 N, i64 ne12, i64 nb11, i64 nb12,
                          i64 nb13) {
    rf_grid_begin();
    const i64 row = blockIdx.x;
    const i64 i1 = row % N, i2 = (row / N) % ne12, i3 = row / (N * ne12);
    const float* xr = (const float*)(x + i1 * nb11 + i2 * nb12 + i3 * nb13);
    float* o = out + row * K;
    if (mode == 2) {
        for (i64 k = threadIdx.x; k < K; k += blockDim.x) o[k] = rf_f16_to_f32(rf_f32_to_f16(xr[k]));
        return;
    }
    if (mode == 4) {
        for (i64 k = threadIdx.x; k < K; k += blockDim.x) o[k] = rf_round_bf16(xr[k]);
        return;
    }
    const int lane = threadIdx.x % 32, group = threadIdx.x / 32, ngroups = blockDim.x / 32;
    if (mode != 1) {
        for (i64 b = group; b < K / 32; b += ngroups) {
            float d32, q;
            o[b * 32 + lane] = rf_round_q8_32(xr[b * 32 + lane], d32, q);
            if (mode == 3) {
                const float d = rf_f16_to_f32(rf_f32_to_f16(d32));
                const float sum = rf_group_sum<32>(q);  // |sum| <= 32 * 127: exact in f32
                if (lane == 0) corr[row * (K / 32) + b] = rf_f16_to_f32(rf_f32_to_f16(d32 * sum)) - d * sum;
            }
        }
        return;
    }
    for (i64 b = group; b < K / 256; b += ngroups) {
        float r[8];
        rf_round_q8k_256(xr + b * 256, r);
#pragma unroll
        for (int t = 0; t < 8; t++) o[b * 256 + lane + 32 * t] = r[t];
    }
}
#endif
