// Operands of the vendor-BLAS MUL_MAT path (src/gpu/blas.rs): weights of any supported type
// dequantized to a dense f16 matrix, and src1 (F32, any row strides) rounded to dense f16.
// A tensor-core GEMM with f32 accumulation then computes the product; ggml-cpu rounds src1
// too before its dots (to 8-bit blocks for quantized weights, to f16 for F16 weights), so
// the result agrees with it to the same order.
#include "prelude.h"
#include "quants.h"

// Eight halves: one 16-byte store.
struct __attribute__((aligned(16))) rf_h8 {
    unsigned int v[4];
};

// Whether W is stored in blocks of 32 or more values (every type but the float ones).
template <typename W> RF_DEVICE bool rf_blocks32() { return true; }
template <> RF_DEVICE_SPEC bool rf_blocks32<w_f32>() { return false; }
template <> RF_DEVICE_SPEC bool rf_blocks32<w_f16>() { return false; }
template <> RF_DEVICE_SPEC bool rf_blocks32<w_bf16>() { return false; }

// out[((i3 * ne2 + i2) * M + row) * K + k] = w[row, k] of matrix (i2, i3). Block types: one
// thread per 32 values (load_block32 decodes a block's scales, signs and grid entries once,
// not once per value), four 16-byte stores; float types (K a multiple of 8): one per 8 values.
template <typename W>
RF_DEVICE void dequant_f16(const char* w, f16_bits* out, i64 K, i64 M, i64 ne2, i64 n_rows, i64 nb01, i64 nb02,
                           i64 nb03) {
    const int per = rf_blocks32<W>() ? 32 : 8;
    const i64 per_row = K / per, total = per_row * n_rows;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        const i64 c = i % per_row, r = i / per_row;
        const i64 row = r % M, b = r / M;
        const char* wr = w + row * nb01 + (b % ne2) * nb02 + (b / ne2) * nb03;
        if (rf_blocks32<W>()) {
            float v[32];
            load_block32<W>(wr, c, v);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                rf_h8 h;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    h.v[j] = (unsigned)rf_f32_to_f16(v[8 * q + 2 * j]) | ((unsigned)rf_f32_to_f16(v[8 * q + 2 * j + 1]) << 16);
                *(rf_h8*)(out + r * K + c * 32 + 8 * q) = h;
            }
        } else {
            rf_h8 h;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned int lo = rf_f32_to_f16(load_w<W>(wr, c * 8 + 2 * j));
                const unsigned int hi = rf_f32_to_f16(load_w<W>(wr, c * 8 + 2 * j + 1));
                h.v[j] = lo | (hi << 16);
            }
            *(rf_h8*)(out + r * K + c * 8) = h;
        }
    }
}

#define DEQUANT_ARGS \
    const char *w, f16_bits *out, i64 K, i64 M, i64 ne2, i64 n_rows, i64 nb01, i64 nb02, i64 nb03
#define DEQUANT_KERNEL(NAME, W) \
    RF_KERNEL void dequant_f16_##NAME(DEQUANT_ARGS) { rf_grid_begin(); dequant_f16<W>(w, out, K, M, ne2, n_rows, nb01, nb02, nb03); }

RF_EACH_WEIGHT_TYPE(DEQUANT_KERNEL)

#if RF_UNTYPED
// src1 rows (i1, i2, i3) -> out[((i3 * ne12 + i2) * N + i1) * K + k] as f16, first rounded the
// way ggml-cpu rounds activations for the weight type (round_src1's modes: 0/3 = Q8_0/Q8_1
// blocks of 32, 1 = Q8_K blocks of 256, 4 = bf16, else none), so the BLAS product sees the
// values ggml-cpu's integer dots see, up to the f16 rounding of d * q. One block per row
// (grid-stride over rows), a multiple of 32 threads.
RF_KERNEL void src1_to_f16(const char* x, f16_bits* out, int mode, i64 K, i64 N, i64 ne12, i64 n_rows, i64 nb11,
                           i64 nb12, i64 nb13) {
    rf_grid_begin();
    const int lane = threadIdx.x % 32, group = threadIdx.x / 32, ngroups = blockDim.x / 32;
    for (i64 row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const i64 i1 = row % N, i2 = (row / N) % ne12, i3 = row / (N * ne12);
        const float* xr = (const float*)(x + i1 * nb11 + i2 * nb12 + i3 * nb13);
        f16_bits* o = out + row * K;
        if (mode == 0 || mode == 3) {
            for (i64 b = group; b < K / 32; b += ngroups) {
                float d32, q;
                o[b * 32 + lane] = rf_f32_to_f16(rf_round_q8_32(xr[b * 32 + lane], d32, q));
            }
        } else if (mode == 1) {
            for (i64 b = group; b < K / 256; b += ngroups) {
                float r[8];
                rf_round_q8k_256(xr + b * 256, r);
#pragma unroll
                for (int t = 0; t < 8; t++) o[b * 256 + lane + 32 * t] = rf_f32_to_f16(r[t]);
            }
        } else if (mode == 4) {
            for (i64 k = threadIdx.x; k < K; k += blockDim.x) o[k] = rf_f32_to_f16(rf_round_bf16(xr[k]));
        } else {
            for (i64 k = threadIdx.x; k < K; k += blockDim.x) o[k] = rf_f32_to_f16(xr[k]);
        }
    }
}
#endif
