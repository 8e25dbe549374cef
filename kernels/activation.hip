// UNARY activations (and SQR, SQRT, LOG, SIN, COS, CLAMP, LEAKY_RELU) and GLU on F32 or F16:
// dst = act(x) (UNARY) or act(x) * g (GLU, with x and g halves of one row, possibly swapped,
// or rows of two tensors). Computed in f32 (ggml-cpu
// looks GELU up in an f16 table; the difference is far inside its tolerance).
#include "prelude.h"

#define ACT_RELU 0
#define ACT_GELU 1
#define ACT_SILU 2
#define ACT_GELU_ERF 3
#define ACT_GELU_QUICK 4
#define ACT_TANH 5
#define ACT_NEG 6
#define ACT_SIGMOID 7
#define ACT_ABS 8
#define ACT_SGN 9
#define ACT_STEP 10
#define ACT_ELU 11
#define ACT_HARDSWISH 12
#define ACT_HARDSIGMOID 13
#define ACT_EXP 14
#define ACT_SQR 15
#define ACT_SQRT 16
#define ACT_LOG 17
#define ACT_SIN 18
#define ACT_COS 19
#define ACT_CLAMP 20
#define ACT_LEAKY_RELU 21

RF_DEVICE float act(int a, float x) {
    switch (a) {
        case ACT_RELU: return fmaxf(x, 0.0f);
        case ACT_GELU: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
        case ACT_SILU: return x / (1.0f + expf(-x));
        case ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
        case ACT_GELU_QUICK: return x * (1.0f / (1.0f + expf(-1.702f * x)));
        case ACT_TANH: return tanhf(x);
        case ACT_NEG: return -x;
        case ACT_ABS: return fabsf(x);
        case ACT_SGN: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
        case ACT_STEP: return x > 0.0f ? 1.0f : 0.0f;
        case ACT_ELU: return x > 0.0f ? x : expm1f(x);
        case ACT_HARDSWISH: return x * fminf(1.0f, fmaxf(0.0f, (x + 3.0f) / 6.0f));
        case ACT_HARDSIGMOID: return fminf(1.0f, fmaxf(0.0f, (x + 3.0f) / 6.0f));
        case ACT_EXP: return expf(x);
        case ACT_SQR: return x * x;
        case ACT_SQRT: return sqrtf(x);
        case ACT_LOG: return logf(x);
        case ACT_SIN: return sinf(x);
        case ACT_COS: return cosf(x);
        default: return 1.0f / (1.0f + expf(-x));
    }
}

// act with the two parameters of CLAMP (min, max) and LEAKY_RELU (slope).
RF_DEVICE float act_p(int a, float x, float p0, float p1) {
    if (a == ACT_CLAMP) return fmaxf(fminf(x, p1), p0);
    if (a == ACT_LEAKY_RELU) return fmaxf(x, 0.0f) + p0 * fminf(x, 0.0f);
    return act(a, x);
}

template <typename T> RF_DEVICE float act_ld(const char* p, i64 i);
template <> RF_DEVICE_SPEC float act_ld<float>(const char* p, i64 i) { return ((const float*)p)[i]; }
template <> RF_DEVICE_SPEC float act_ld<f16_bits>(const char* p, i64 i) { return rf_f16_to_f32(((const f16_bits*)p)[i]); }
template <typename T> RF_DEVICE void act_st(char* p, i64 i, float v);
template <> RF_DEVICE_SPEC void act_st<float>(char* p, i64 i, float v) { ((float*)p)[i] = v; }
template <> RF_DEVICE_SPEC void act_st<f16_bits>(char* p, i64 i, float v) { ((f16_bits*)p)[i] = rf_f32_to_f16(v); }

// Element-wise on rows of ne0 dense values (F32 or F16, dst of the same type), any row
// strides: row r = (i1, i2, i3) of shape (ne1, ne2, ne3).
template <typename T>
RF_DEVICE void unary_rows(int a, const char* x, char* d, i64 ne0, i64 ne1, i64 ne2, i64 n, i64 nbx1, i64 nbx2,
                          i64 nbx3, i64 nbd1, i64 nbd2, i64 nbd3, float p0, float p1) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 i0 = i % ne0, r = i / ne0;
        const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float v = act_ld<T>(x + i1 * nbx1 + i2 * nbx2 + i3 * nbx3, i0);
        act_st<T>(d + i1 * nbd1 + i2 * nbd2 + i3 * nbd3, i0, act_p(a, v, p0, p1));
    }
}

#define UNARY_ROWS_ARGS                                                                                      \
    int a, const char *x, char *d, i64 ne0, i64 ne1, i64 ne2, i64 n, i64 nbx1, i64 nbx2, i64 nbx3, i64 nbd1, \
        i64 nbd2, i64 nbd3, float p0, float p1
#define UNARY_ROWS_PASS a, x, d, ne0, ne1, ne2, n, nbx1, nbx2, nbx3, nbd1, nbd2, nbd3, p0, p1
#if RF_UNTYPED
RF_KERNEL void unary_rows_f32(UNARY_ROWS_ARGS) { rf_grid_begin(); unary_rows<float>(UNARY_ROWS_PASS); }
RF_KERNEL void unary_rows_f16(UNARY_ROWS_ARGS) { rf_grid_begin(); unary_rows<f16_bits>(UNARY_ROWS_PASS); }
#endif

#if RF_UNTYPED
// n contiguous floats.
RF_KERNEL void unary_f32(int a, const float* x, float* d, i64 n) {
    rf_grid_begin();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        d[i] = act(a, x[i]);
    }
}
#endif

// Row r of dst (nc values, row stride nbd1) = act(x row r) * g row r; x and g start at
// their own byte pointers with their own row strides. F16 is computed in f32, rounded once.
template <typename T>
RF_DEVICE void glu(int a, const char* x, const char* g, char* d, i64 nc, i64 nrows, i64 nbx1, i64 nbg1, i64 nbd1) {
    const i64 n = nc * nrows;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / nc, c = i % nc;
        const float xv = act_ld<T>(x + r * nbx1, c);
        const float gv = act_ld<T>(g + r * nbg1, c);
        act_st<T>(d + r * nbd1, c, act(a, xv) * gv);
    }
}

#if RF_UNTYPED
RF_KERNEL void glu_f32(int a, const char* x, const char* g, char* d, i64 nc, i64 nrows, i64 nbx1, i64 nbg1, i64 nbd1) {
    rf_grid_begin();
    glu<float>(a, x, g, d, nc, nrows, nbx1, nbg1, nbd1);
}
RF_KERNEL void glu_f16(int a, const char* x, const char* g, char* d, i64 nc, i64 nrows, i64 nbx1, i64 nbg1, i64 nbd1) {
    rf_grid_begin();
    glu<f16_bits>(a, x, g, d, nc, nrows, nbx1, nbg1, nbd1);
}
#endif
