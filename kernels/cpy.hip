// CPY/DUP/CONT between F32, F16 and BF16: element i of src in logical row-major order goes to
// element i of dst, each with its own shape and byte strides.
#include "prelude.h"
#include "quants.h"

struct cpy_bf16 {};

template <typename T> RF_DEVICE float load_f(const char* p);
template <> RF_DEVICE_SPEC float load_f<float>(const char* p) { return *(const float*)p; }
template <> RF_DEVICE_SPEC float load_f<f16_bits>(const char* p) { return rf_f16_to_f32(*(const f16_bits*)p); }
template <> RF_DEVICE_SPEC float load_f<cpy_bf16>(const char* p) {
    return __uint_as_float((unsigned)*(const unsigned short*)p << 16);
}
template <typename T> RF_DEVICE void store_f(char* p, float v);
template <> RF_DEVICE_SPEC void store_f<cpy_bf16>(char* p, float v) { *(unsigned short*)p = rf_f32_to_bf16(v); }
template <> RF_DEVICE_SPEC void store_f<float>(char* p, float v) { *(float*)p = v; }
template <> RF_DEVICE_SPEC void store_f<f16_bits>(char* p, float v) { *(f16_bits*)p = rf_f32_to_f16(v); }

template <typename S, typename D>
RF_DEVICE void cpy(const char* s, char* d, i64 sne0, i64 sne1, i64 sne2, i64 snb0, i64 snb1, i64 snb2, i64 snb3,
                   i64 dne0, i64 dne1, i64 dne2, i64 dnb0, i64 dnb1, i64 dnb2, i64 dnb3, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 s0 = i % sne0, s1 = (i / sne0) % sne1, s2 = (i / (sne0 * sne1)) % sne2, s3 = i / (sne0 * sne1 * sne2);
        const i64 d0 = i % dne0, d1 = (i / dne0) % dne1, d2 = (i / (dne0 * dne1)) % dne2, d3 = i / (dne0 * dne1 * dne2);
        const char* sp = s + s0 * snb0 + s1 * snb1 + s2 * snb2 + s3 * snb3;
        char* dp = d + d0 * dnb0 + d1 * dnb1 + d2 * dnb2 + d3 * dnb3;
        store_f<D>(dp, load_f<S>(sp));
    }
}

#define CPY_ARGS                                                                                             \
    const char *s, char *d, i64 sne0, i64 sne1, i64 sne2, i64 snb0, i64 snb1, i64 snb2, i64 snb3, i64 dne0, \
        i64 dne1, i64 dne2, i64 dnb0, i64 dnb1, i64 dnb2, i64 dnb3, i64 n
#define CPY_PASS s, d, sne0, sne1, sne2, snb0, snb1, snb2, snb3, dne0, dne1, dne2, dnb0, dnb1, dnb2, dnb3, n

RF_KERNEL void cpy_f32_f32(CPY_ARGS) { rf_grid_begin(); cpy<float, float>(CPY_PASS); }
RF_KERNEL void cpy_f32_f16(CPY_ARGS) { rf_grid_begin(); cpy<float, f16_bits>(CPY_PASS); }
RF_KERNEL void cpy_f16_f32(CPY_ARGS) { rf_grid_begin(); cpy<f16_bits, float>(CPY_PASS); }
RF_KERNEL void cpy_f16_f16(CPY_ARGS) { rf_grid_begin(); cpy<f16_bits, f16_bits>(CPY_PASS); }
RF_KERNEL void cpy_f32_bf16(CPY_ARGS) { rf_grid_begin(); cpy<float, cpy_bf16>(CPY_PASS); }
RF_KERNEL void cpy_f16_bf16(CPY_ARGS) { rf_grid_begin(); cpy<f16_bits, cpy_bf16>(CPY_PASS); }
RF_KERNEL void cpy_bf16_f32(CPY_ARGS) { rf_grid_begin(); cpy<cpy_bf16, float>(CPY_PASS); }
RF_KERNEL void cpy_bf16_f16(CPY_ARGS) { rf_grid_begin(); cpy<cpy_bf16, f16_bits>(CPY_PASS); }
RF_KERNEL void cpy_bf16_bf16(CPY_ARGS) { rf_grid_begin(); cpy<cpy_bf16, cpy_bf16>(CPY_PASS); }
