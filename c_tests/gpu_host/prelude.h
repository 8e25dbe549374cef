// Host stand-in for kernels/prelude.h, for c_tests/gpu_loaders.cpp: the weight loaders of
// kernels/quants.h and quants_iq.h and the integer-dot blocks of mmvq.hip compiled as plain
// C++ (scripts/check-gpu-loaders.sh puts it beside copies of those headers).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
extern "C" float ggml_fp16_to_fp32(uint16_t);
extern "C" uint16_t ggml_fp32_to_fp16(float);
#define RF_DEVICE static inline
#define RF_DEVICE_SPEC inline
#define __device__
#define __constant__
#define __forceinline__
#define RF_ALL 1
typedef long long i64;
typedef unsigned short f16_bits;
struct float2 {
    float x, y;
};
struct int4 {
    int x, y, z, w;
};
struct int2 {
    int x, y;
};
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline int2 make_int2(int a, int b) { return {a, b}; }
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline float rf_f16_to_f32(f16_bits h) { return ggml_fp16_to_fp32(h); }
static inline f16_bits rf_f32_to_f16(float f) { return ggml_fp32_to_fp16(f); }
// One lane's view of the group reductions (the loaders do not use them).
template <int N> static inline float rf_group_max(float v) { return v; }
template <int N> static inline float rf_group_sum(float v) { return v; }
// One block's coordinates, set by the caller before it calls a kernel body as one thread.
struct rf_dim3 {
    long long x;
};
static rf_dim3 threadIdx, blockIdx, blockDim, gridDim;
// Byte i of (hi << 32 | lo) at the selector in byte i of sel (0..7).
static inline unsigned rf_perm8(unsigned lo, unsigned hi, unsigned sel) {
    const unsigned long long v = ((unsigned long long)hi << 32) | lo;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((sel >> (8 * i)) & 7))) & 255) << (8 * i);
    return r;
}
// dp4a: four signed byte products added to c.
static inline int rf_dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
