// NORM (subtract the mean, divide by the standard deviation) and L2_NORM (divide by the
// L2 norm, at least eps) along dim 0, F32, one block per row; as src/cpu/ops/norm.rs.
#include "prelude.h"

// mode 0 = NORM, 1 = L2_NORM.
RF_KERNEL void norm_f32(int mode, const char* a, char* d, i64 ne0, i64 ne1, i64 ne2, i64 nba1, i64 nba2, i64 nba3,
                        i64 nbd1, i64 nbd2, i64 nbd3, float eps) {
    rf_grid_begin();
    __shared__ float scratch[RF_MAX_WARPS];
    const i64 r = blockIdx.x;
    const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    const float* x = (const float*)(a + i1 * nba1 + i2 * nba2 + i3 * nba3);
    float* y = (float*)(d + i1 * nbd1 + i2 * nbd2 + i3 * nbd3);
    if (mode == 1) {
        float sum = 0.0f;
        for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) sum += x[i] * x[i];
        sum = rf_block_sum(sum, scratch);
        const float s = 1.0f / fmaxf(sqrtf(sum), eps);
        for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = x[i] * s;
        return;
    }
    float sum = 0.0f;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) sum += x[i];
    const float mean = rf_block_sum(sum, scratch) / (float)ne0;
    float var = 0.0f;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float v = x[i] - mean;
        var += v * v;
    }
    var = rf_block_sum(var, scratch) / (float)ne0;
    const float s = 1.0f / sqrtf(var + eps);
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = (x[i] - mean) * s;
}
