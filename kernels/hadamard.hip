// MUL_MAT with ggml's Hadamard hint (llama.cpp rotates Q, K, V and attention's output by the
// normalized Sylvester Hadamard matrix for quantized KV caches), computed as ggml-cpu computes
// it, without reading the matrix: each row of n values times 1/sqrt(n), then log2(n) butterfly
// passes (u + v, u - v) over pairs len = 1, 2, 4, ... apart. The pairs of a pass are
// independent, so the results are ggml-cpu's to the bit.
#include "prelude.h"
#include "quants.h"

#ifndef ROCMFORGE_HADAMARD_HIP
#define ROCMFORGE_HADAMARD_HIP

// Longest row (shared memory of the row kernel); the host claims no longer rows.
#define HADAMARD_MAX 4096

// The unnormalized transform of s[0, n) (shared memory, already scaled) by the whole block.
// Callers write s and then call this; it leaves s ready to read.
RF_DEVICE void rf_hadamard_shared(float* s, int n) {
    for (int len = 1; len < n; len <<= 1) {
        __syncthreads();
        for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
            const int i = (p / len) * 2 * len + p % len;
            const float u = s[i], v = s[i + len];
            s[i] = u + v;
            s[i + len] = u - v;
        }
    }
    __syncthreads();
}

#if RF_UNTYPED
// One block per row (grid-stride): src rows of n F32 or F16 values (dense) at byte strides
// nbx1..3 over ne1 x ne2 x ..., dst rows of F32 at nbd1..3. scale = 1/sqrt(n) as ggml-cpu
// computes it (passed by the host). xq != NULL: dst (contiguous, n a multiple of 32) is also
// quantized as quantize_q8 mode 0 would, for the matrix-vector product that reads it next.
RF_KERNEL void hadamard_rows(const char* x, int x_f16, char* d, i64 n, float scale, i64 ne1, i64 ne2, i64 rows,
                             i64 nbx1, i64 nbx2, i64 nbx3, i64 nbd1, i64 nbd2, i64 nbd3, signed char* xq, float2* xds) {
    rf_grid_begin();
    __shared__ float s[HADAMARD_MAX];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const char* src = x + i1 * nbx1 + i2 * nbx2 + i3 * nbx3;
        __syncthreads();  // the previous row is read out
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const float v = x_f16 ? rf_f16_to_f32(((const f16_bits*)src)[j]) : ((const float*)src)[j];
            s[j] = v * scale;
        }
        rf_hadamard_shared(s, (int)n);
        float* dst = (float*)(d + i1 * nbd1 + i2 * nbd2 + i3 * nbd3);
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            dst[j] = s[j];
            // Whole warps take whole blocks of 32 (blockDim and n are multiples of 32 here).
            if (xq) quantize_vals32(s[j], xq, xds, (r * n + j) / 32, j % 32);
        }
    }
}
#endif

#endif
