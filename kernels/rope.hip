// ROPE, normal (adjacent pairs), neox (pairs n_dims/2 apart) and multi-section (neox pairs,
// each pair's angle from one of four position streams: mrope by contiguous sections, imrope
// interleaved) modes, F32 or F16, with YaRN, frequency factors and an offset of the first
// rotated channel; parameters as ggml's (see src/cpu/ops/rope.rs). One block per row;
// positions are I32, one per row of dim 2 (four streams of ne2 for the multi-section modes).
#include "prelude.h"

template <typename T> RF_DEVICE float rope_ld(const char* p, i64 i);
template <> RF_DEVICE_SPEC float rope_ld<float>(const char* p, i64 i) { return ((const float*)p)[i]; }
template <> RF_DEVICE_SPEC float rope_ld<f16_bits>(const char* p, i64 i) {
    return rf_f16_to_f32(((const f16_bits*)p)[i]);
}
template <typename T> RF_DEVICE void rope_st(char* p, i64 i, float v);
template <> RF_DEVICE_SPEC void rope_st<float>(char* p, i64 i, float v) { ((float*)p)[i] = v; }
template <> RF_DEVICE_SPEC void rope_st<f16_bits>(char* p, i64 i, float v) { ((f16_bits*)p)[i] = rf_f32_to_f16(v); }

// cos and sin (times the YaRN magnitude) of pair k's angle at position p, frequency factor f:
// theta = p * theta_scale^k, by repeated multiplication exactly as ggml-cpu does. Also the
// epilogue of the fused Q/K/V product (fused.hip).
RF_DEVICE void rope_cs(float p, float f, int k, float theta_scale, float freq_scale, float ext_factor,
                       float attn_factor, float corr0, float corr1, float* c, float* s) {
    float theta_base = p;
    for (int i = 0; i < k; i++) theta_base *= theta_scale;
    const float theta_extrap = theta_base / f;
    const float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp, mscale = attn_factor;
    if (ext_factor != 0.0f) {
        const float y = ((float)k - corr0) / fmaxf(0.001f, corr1 - corr0);
        const float ramp_mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext_factor;
        theta = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
    }
    *c = cosf(theta) * mscale;
    *s = sinf(theta) * mscale;
}

// One row of ne0 values from src (type T) into dst (type TD), at position stream index i2
// (of ne2); called by all threads of a block. Also the fused ROPE -> SET_ROWS (fused.hip).
template <typename T, typename TD>
RF_DEVICE void rope_row(const char* src, char* dst, const int* pos, const float* ff, i64 i2, i64 ne0, i64 ne2,
                        int n_dims, int neox, int n_offs, float theta_scale, float freq_scale, float ext_factor,
                        float attn_factor, float corr0, float corr1, int multi, int s0, int s1, int s2, int s3) {
    const int half_dims = n_dims / 2;
    const int sect_dims = max(1, s0 + s1 + s2 + s3);
    for (int k = threadIdx.x; k < half_dims; k += blockDim.x) {
        const float f = ff ? ff[k] : 1.0f;
        int stream = 0;
        if (multi == 1) {  // mrope: sections t, h, w, e one after the other
            const int sector = k % sect_dims;
            stream = sector >= s0 + s1 + s2 ? 3 : sector >= s0 + s1 ? 2 : sector >= s0 ? 1 : 0;
        } else if (multi == 2) {  // imrope: t, h, w interleaved
            const int sector = k % sect_dims;
            if (sector % 3 == 1 && sector < 3 * s1) {
                stream = 1;
            } else if (sector % 3 == 2 && sector < 3 * s2) {
                stream = 2;
            } else if (sector % 3 == 0 && sector < 3 * s0) {
                stream = 0;
            } else {
                stream = 3;
            }
        }
        float c, s;
        rope_cs((float)pos[i2 + stream * ne2], f, k, theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1,
                &c, &s);
        const i64 i0 = neox || multi ? n_offs + k : n_offs + 2 * k;
        const i64 i1x = neox || multi ? i0 + half_dims : i0 + 1;
        const float x0 = rope_ld<T>(src, i0), x1 = rope_ld<T>(src, i1x);
        rope_st<TD>(dst, i0, x0 * c - x1 * s);
        rope_st<TD>(dst, i1x, x0 * s + x1 * c);
    }
    // Channels outside the rotated span pass through.
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) {
        if (i < n_offs || i >= n_offs + n_dims) rope_st<TD>(dst, i, rope_ld<T>(src, i));
    }
}

template <typename T>
RF_DEVICE void rope(const char* a, const int* pos, const float* ff, char* d, i64 ne0, i64 ne1, i64 ne2, i64 nba1,
                    i64 nba2, i64 nba3, i64 nbd1, i64 nbd2, i64 nbd3, int n_dims, int neox, int n_offs,
                    float theta_scale, float freq_scale, float ext_factor, float attn_factor, float corr0,
                    float corr1, int multi, int s0, int s1, int s2, int s3) {
    const i64 r = blockIdx.x;
    const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    rope_row<T, T>(a + i1 * nba1 + i2 * nba2 + i3 * nba3, d + i1 * nbd1 + i2 * nbd2 + i3 * nbd3, pos, ff, i2, ne0,
                   ne2, n_dims, neox, n_offs, theta_scale, freq_scale, ext_factor, attn_factor, corr0, corr1, multi,
                   s0, s1, s2, s3);
}

#define ROPE_ARGS                                                                                               \
    const char *a, const int *pos, const float *ff, char *d, i64 ne0, i64 ne1, i64 ne2, i64 nba1, i64 nba2,     \
        i64 nba3, i64 nbd1, i64 nbd2, i64 nbd3, int n_dims, int neox, int n_offs, float theta_scale,            \
        float freq_scale, float ext_factor, float attn_factor, float corr0, float corr1, int multi, int s0,    \
        int s1, int s2, int s3
#define ROPE_PASS                                                                                              \
    a, pos, ff, d, ne0, ne1, ne2, nba1, nba2, nba3, nbd1, nbd2, nbd3, n_dims, neox, n_offs, theta_scale, freq_scale, \
        ext_factor, attn_factor, corr0, corr1, multi, s0, s1, s2, s3

#if RF_UNTYPED
RF_KERNEL void rope_f32(ROPE_ARGS) { rf_grid_begin(); rope<float>(ROPE_PASS); }
RF_KERNEL void rope_f16(ROPE_ARGS) { rf_grid_begin(); rope<f16_bits>(ROPE_PASS); }
#endif
