// Row-wise F32 ops, one block per row: SOFT_MAX (with ggml's scale, mask, ALiBi and sinks)
// and RMS_NORM.
#include "prelude.h"

#define SOFT_MAX_VALS 8

// dst = softmax(src * scale + slope * mask) along dim 0; mask (F32 or F16, may be NULL) is
// broadcast over dims 2, 3; sinks (may be NULL) holds one extra logit per head (dim 2).
RF_KERNEL void soft_max_f32(const char* a, const char* mask, const float* sinks, char* d, i64 ne0, i64 ne1, i64 ne2,
                            i64 nba1, i64 nba2, i64 nba3, int mask_f16, i64 mne2, i64 mne3, i64 nbm1, i64 nbm2,
                            i64 nbm3, i64 nbd1, i64 nbd2, i64 nbd3, float scale, float max_bias, float m0, float m1,
                            int n_head_log2) {
    rf_grid_begin();
    __shared__ float scratch[RF_MAX_WARPS];
    const i64 r = blockIdx.x;
    const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    const float* x = (const float*)(a + i1 * nba1 + i2 * nba2 + i3 * nba3);
    float* y = (float*)(d + i1 * nbd1 + i2 * nbd2 + i3 * nbd3);
    const float slope = rf_alibi_slope(i2, max_bias, m0, m1, n_head_log2);
    const char* mrow = mask ? mask + i1 * nbm1 + (i2 % mne2) * nbm2 + (i3 % mne3) * nbm3 : 0;

    float mx = rf_neg_inf();
    if (ne0 <= SOFT_MAX_VALS * (i64)blockDim.x) {
        // Rows of up to SOFT_MAX_VALS values a thread (attention's scores of a prompt without
        // flash attention) stay in registers: one read and one write of the row.
        float v[SOFT_MAX_VALS];
#pragma unroll
        for (int j = 0; j < SOFT_MAX_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * blockDim.x;
            v[j] = rf_neg_inf();
            if (i < ne0) {
                v[j] = x[i] * scale;
                if (mrow) v[j] += slope * (mask_f16 ? rf_f16_to_f32(((const f16_bits*)mrow)[i]) : ((const float*)mrow)[i]);
                mx = fmaxf(mx, v[j]);
            }
        }
        mx = rf_block_max(mx, scratch);
        const float sink = sinks ? sinks[i2] : 0.0f;
        if (sinks) mx = fmaxf(mx, sink);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < SOFT_MAX_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * blockDim.x;
            if (i < ne0) {
                v[j] = expf(v[j] - mx);
                sum += v[j];
            }
        }
        sum = rf_block_sum(sum, scratch);
        if (sinks) sum += expf(sink - mx);
        const float inv = 1.0f / sum;
#pragma unroll
        for (int j = 0; j < SOFT_MAX_VALS; j++) {
            const i64 i = threadIdx.x + (i64)j * blockDim.x;
            if (i < ne0) y[i] = v[j] * inv;
        }
        return;
    }
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) {
        float v = x[i] * scale;
        if (mrow) v += slope * (mask_f16 ? rf_f16_to_f32(((const f16_bits*)mrow)[i]) : ((const float*)mrow)[i]);
        y[i] = v;
        mx = fmaxf(mx, v);
    }
    mx = rf_block_max(mx, scratch);
    const float sink = sinks ? sinks[i2] : 0.0f;
    if (sinks) mx = fmaxf(mx, sink);
    float sum = 0.0f;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) {
        const float e = expf(y[i] - mx);
        y[i] = e;
        sum += e;
    }
    sum = rf_block_sum(sum, scratch);
    if (sinks) sum += expf(sink - mx);
    const float inv = 1.0f / sum;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) y[i] *= inv;
}

// dst = src / sqrt(mean(src^2) + eps) along dim 0.
RF_KERNEL __launch_bounds__(1024) void rms_norm_f32(const char* a, char* d, i64 ne0, i64 ne1, i64 ne2, i64 nba1, i64 nba2, i64 nba3, i64 nbd1,
                            i64 nbd2, i64 nbd3, float eps) {
    rf_grid_begin();
    __shared__ float scratch[RF_MAX_WARPS];
    const i64 r = blockIdx.x;
    const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    const float* x = (const float*)(a + i1 * nba1 + i2 * nba2 + i3 * nba3);
    float* y = (float*)(d + i1 * nbd1 + i2 * nbd2 + i3 * nbd3);
    float sum = 0.0f;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) sum += x[i] * x[i];
    sum = rf_block_sum(sum, scratch);
    const float s = 1.0f / sqrtf(sum / (float)ne0 + eps);
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = x[i] * s;
}
