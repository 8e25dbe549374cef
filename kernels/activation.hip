// UNARY activations and GLU on F32: dst = act(x) (UNARY) or act(x) * g (GLU, with x and g
// halves of one row, possibly swapped, or rows of two tensors). Computed in f32 (ggml-cpu
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

RF_DEVICE float act(int a, float x) {
    switch (a) {
        case ACT_RELU: return fmaxf(x, 0.0f);
        case ACT_GELU: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
        case ACT_SILU: return x / (1.0f + expf(-x));
        case ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
        case ACT_GELU_QUICK: return x * (1.0f / (1.0f + expf(-1.702f * x)));
        case ACT_TANH: return tanhf(x);
        case ACT_NEG: return -x;
        default: return 1.0f / (1.0f + expf(-x));
    }
}

// n contiguous floats.
RF_KERNEL void unary_f32(int a, const float* x, float* d, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        d[i] = act(a, x[i]);
    }
}

// Row r of dst (nc values, row stride nbd1) = act(x row r) * g row r; x and g start at
// their own byte pointers with their own row strides.
RF_KERNEL void glu_f32(int a, const char* x, const char* g, char* d, i64 nc, i64 nrows, i64 nbx1, i64 nbg1, i64 nbd1) {
    const i64 n = nc * nrows;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / nc, c = i % nc;
        const float xv = ((const float*)(x + r * nbx1))[c];
        const float gv = ((const float*)(g + r * nbg1))[c];
        ((float*)(d + r * nbd1))[c] = act(a, xv) * gv;
    }
}
