// Element-wise F32 ops: ADD/SUB/MUL/DIV with src1 repeated to src0's shape, and SCALE.
#include "prelude.h"
#include "quants.h"

#define BIN_ADD 0
#define BIN_SUB 1
#define BIN_MUL 2
#define BIN_DIV 3

// One thread per element of dst (grid-stride); any byte strides for the three tensors.
RF_KERNEL void binary_f32(int op, const char* a, const char* b, char* d, i64 ne0, i64 ne1, i64 ne2, i64 ne3,
                          i64 bne0, i64 bne1, i64 bne2, i64 bne3, i64 nba0, i64 nba1, i64 nba2, i64 nba3, i64 nbb0,
                          i64 nbb1, i64 nbb2, i64 nbb3, i64 nbd0, i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    const i64 n = ne0 * ne1 * ne2 * ne3;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 i0 = i % ne0, i1 = (i / ne0) % ne1, i2 = (i / (ne0 * ne1)) % ne2, i3 = i / (ne0 * ne1 * ne2);
        const float x = *(const float*)(a + i0 * nba0 + i1 * nba1 + i2 * nba2 + i3 * nba3);
        const float y = *(const float*)(b + (i0 % bne0) * nbb0 + (i1 % bne1) * nbb1 + (i2 % bne2) * nbb2 + (i3 % bne3) * nbb3);
        float r;
        switch (op) {
            case BIN_ADD: r = x + y; break;
            case BIN_SUB: r = x - y; break;
            case BIN_MUL: r = x * y; break;
            default: r = x / y; break;
        }
        *(float*)(d + i0 * nbd0 + i1 * nbd1 + i2 * nbd2 + i3 * nbd3) = r;
    }
}

// dst = src * s + b over n contiguous floats.
RF_KERNEL void scale_f32(const float* a, float* d, i64 n, float s, float b) {
    rf_grid_begin();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        d[i] = b == 0.0f ? a[i] * s : a[i] * s + b;
    }
}

// Value of a 0 = F32, 1 = F16, 2 = BF16 element, and storing one.
RF_DEVICE float ew_ld(const char* p, int t) {
    if (t == 1) return rf_f16_to_f32(*(const f16_bits*)p);
    if (t == 2) return __uint_as_float((unsigned)*(const unsigned short*)p << 16);
    return *(const float*)p;
}
RF_DEVICE void ew_st(char* p, int t, float v) {
    if (t == 1) {
        *(f16_bits*)p = rf_f32_to_f16(v);
    } else if (t == 2) {
        *(unsigned short*)p = rf_f32_to_bf16(v);
    } else {
        *(float*)p = v;
    }
}

// binary_f32 for F16/BF16 operands and results (computed in f32, rounded once).
RF_KERNEL void binary_typed(int op, int ta, int tb, int td, const char* a, const char* b, char* d, i64 ne0, i64 ne1,
                            i64 ne2, i64 ne3, i64 bne0, i64 bne1, i64 bne2, i64 bne3, i64 nba0, i64 nba1, i64 nba2,
                            i64 nba3, i64 nbb0, i64 nbb1, i64 nbb2, i64 nbb3, i64 nbd0, i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    const i64 n = ne0 * ne1 * ne2 * ne3;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 i0 = i % ne0, i1 = (i / ne0) % ne1, i2 = (i / (ne0 * ne1)) % ne2, i3 = i / (ne0 * ne1 * ne2);
        const float x = ew_ld(a + i0 * nba0 + i1 * nba1 + i2 * nba2 + i3 * nba3, ta);
        const float y = ew_ld(b + (i0 % bne0) * nbb0 + (i1 % bne1) * nbb1 + (i2 % bne2) * nbb2 + (i3 % bne3) * nbb3, tb);
        float r;
        switch (op) {
            case BIN_ADD: r = x + y; break;
            case BIN_SUB: r = x - y; break;
            case BIN_MUL: r = x * y; break;
            default: r = x / y; break;
        }
        ew_st(d + i0 * nbd0 + i1 * nbd1 + i2 * nbd2 + i3 * nbd3, td, r);
    }
}

// Holds the stream for `cycles` clock ticks (ROCMFORGE_GPU_PROFILE: the host queues a whole
// graph with timed events behind it, so the kernels then run back to back as they would
// without the profiler, and each event pair times one kernel).
RF_KERNEL void rf_spin(i64 cycles) {
    rf_grid_begin();
    const i64 t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
