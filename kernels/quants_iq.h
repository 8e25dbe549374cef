// Loaders of the i-quants, the ternary formats, MXFP4, NVFP4, Q1_0 and Q2_0 (layouts in
// quants.h's head comment; the RFCPU decoders are src/cpu/quants/<format>.rs): load_w (element
// k of a row) and
// load_block32 (32 values of a row at once: a 256-value block's sub-block decodes its scale,
// signs and grid indices once). The values are ggml's dequantization, float operations in
// ggml's order, so GET_ROWS and the dequantized products agree with ggml-cpu to the bit.
#ifndef ROCMFORGE_QUANTS_IQ_H
#define ROCMFORGE_QUANTS_IQ_H
#include "prelude.h"
#include "quants.h"

RF_DEVICE unsigned rf_ld_u16(const unsigned char* p) { return (unsigned)p[0] | ((unsigned)p[1] << 8); }
RF_DEVICE unsigned rf_ld_u32(const unsigned char* p) { return rf_ld_u16(p) | (rf_ld_u16(p + 2) << 16); }

// ggml's ksigns_iq2xs entry i: its 7 stored sign bits, the 8th set where they hold an odd count.
RF_DEVICE int rf_ksigns(int i) { return i | ((__popc(i) & 1) << 7); }

// MXFP4's 16 E2M1 levels, doubled (ggml's kvalues_mxfp4), 4 to an int.
RF_DEVICE int rf_mxfp4_level(int q) {
    const int packed[4] = {0x03020100, 0x0C080604, (int)0xFDFEFF00u, (int)0xF4F8FAFCu};
    return (signed char)((packed[q >> 2] >> ((q & 3) * 8)) & 0xff);
}
// Half the E8M0 scale, 2^(e - 128) (the levels are doubled), from its bits: e = 0, 1 are subnormal.
RF_DEVICE float rf_e8m0_half(int e) { return __uint_as_float(e < 2 ? 0x00200000u << e : (unsigned)(e - 1) << 23); }

// TQ1_0's trit n (0..4) of a packed byte: the byte times 3^n, its top "digit" in base 3.
RF_DEVICE int rf_trit(int byte, int n) {
    const int pow3 = n == 0 ? 1 : n == 1 ? 3 : n == 2 ? 9 : n == 3 ? 27 : 81;
    return (((byte * pow3) & 0xff) * 3) >> 8;
}
// TQ1_0's code (0..2) of value e (0..255) of a block.
RF_DEVICE int rf_tq1_code(const unsigned char* b, int e) {
    if (e < 160) return rf_trit(b[e % 32], e / 32);
    if (e < 240) return rf_trit(b[32 + (e - 160) % 16], (e - 160) / 16);
    return rf_trit(b[48 + (e - 240) % 4], (e - 240) / 4);
}

// IQ4_XS sub-block ib's scale ls - 32.
RF_DEVICE int rf_iq4xs_scale(const unsigned char* b, int ib) {
    const int lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
    const int hi = (rf_ld_u16(b + 2) >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

// IQ1_M's f16 scale, from the top nibbles of its 4 scale words.
RF_DEVICE float rf_iq1m_d(const unsigned char* b) {
    const unsigned s0 = rf_ld_u16(b + 48), s1 = rf_ld_u16(b + 50), s2 = rf_ld_u16(b + 52), s3 = rf_ld_u16(b + 54);
    return rf_f16_to_f32((f16_bits)((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000)));
}

// Sub-block decoders: 32 values of sub-block ib of the 256-value block b.
template <typename W> RF_DEVICE void rf_sub32(const unsigned char* b, int ib, float* out);

#if RF_ALL || RF_T_iq4_xs
template <> RF_DEVICE_SPEC void rf_sub32<w_iq4_xs>(const unsigned char* b, int ib, float* out) {
    const float dl = rf_ld_f16(b) * (float)rf_iq4xs_scale(b, ib);
    const unsigned char* q = b + 8 + 16 * ib;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        out[j] = dl * (float)rf_iq4nl_level(q[j] & 15);
        out[j + 16] = dl * (float)rf_iq4nl_level(q[j] >> 4);
    }
}
template <> RF_DEVICE_SPEC float load_w<w_iq4_xs>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 136;
    const int e = (int)(k % 256), ib = e / 32, j = e % 32;
    const int q = (b[8 + 16 * ib + (j & 15)] >> (4 * (j >> 4))) & 15;
    return rf_ld_f16(b) * (float)rf_iq4xs_scale(b, ib) * (float)rf_iq4nl_level(q);
}
#endif

#if RF_ALL || RF_T_mxfp4
template <> RF_DEVICE_SPEC float load_w<w_mxfp4>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 32) * 17;
    const int j = (int)(k % 32);
    const int q = (b[1 + (j & 15)] >> (4 * (j >> 4))) & 15;
    return rf_e8m0_half(b[0]) * (float)rf_mxfp4_level(q);
}
template <> RF_DEVICE_SPEC void load_block32<w_mxfp4>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + blk * 17;
    const float d = rf_e8m0_half(b[0]);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        out[j] = d * (float)rf_mxfp4_level(b[1 + j] & 15);
        out[j + 16] = d * (float)rf_mxfp4_level(b[1 + j] >> 4);
    }
}
#endif

#if RF_ALL || RF_T_tq2_0
template <> RF_DEVICE_SPEC void rf_sub32<w_tq2_0>(const unsigned char* b, int ib, float* out) {
    const float d = rf_ld_f16(b + 64);
    const unsigned char* q = b + 32 * (ib / 4);
    const int sh = 2 * (ib % 4);
#pragma unroll
    for (int j = 0; j < 32; j++) out[j] = (float)(((q[j] >> sh) & 3) - 1) * d;
}
template <> RF_DEVICE_SPEC float load_w<w_tq2_0>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 66;
    const int e = (int)(k % 256);
    const int q = (b[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    return (float)(q - 1) * rf_ld_f16(b + 64);
}
#endif

#if RF_ALL || RF_T_tq1_0
template <> RF_DEVICE_SPEC void rf_sub32<w_tq1_0>(const unsigned char* b, int ib, float* out) {
    const float d = rf_ld_f16(b + 52);
#pragma unroll
    for (int j = 0; j < 32; j++) out[j] = (float)(rf_tq1_code(b, 32 * ib + j) - 1) * d;
}
template <> RF_DEVICE_SPEC float load_w<w_tq1_0>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 54;
    return (float)(rf_tq1_code(b, (int)(k % 256)) - 1) * rf_ld_f16(b + 52);
}
#endif

// The grid-and-sign i-quants: value j (0..31) of sub-block ib is db(half j / 16) * magnitude *
// sign, the magnitude a byte of a grid entry. Each format's decoder gives, per group of 8
// values, the grid entry (8 magnitudes, or two 4-magnitude entries), the 8 sign bits, and the
// two half-sub-block scales.
#if RF_ALL || RF_T_iq2_xxs
template <> RF_DEVICE_SPEC void rf_sub32<w_iq2_xxs>(const unsigned char* b, int ib, float* out) {
    const unsigned idx = rf_ld_u32(b + 2 + 8 * ib), aux = rf_ld_u32(b + 6 + 8 * ib);
    const float db = rf_ld_f16(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const unsigned long long g = rf_iq2xxs_grid[(idx >> (8 * l)) & 255];
        const int signs = rf_ksigns((aux >> (7 * l)) & 127);
#pragma unroll
        for (int j = 0; j < 8; j++)
            out[8 * l + j] = db * (float)((g >> (8 * j)) & 255) * ((signs >> j) & 1 ? -1.f : 1.f);
    }
}
template <> RF_DEVICE_SPEC float load_w<w_iq2_xxs>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 66;
    const int e = (int)(k % 256), ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const unsigned aux = rf_ld_u32(b + 6 + 8 * ib);
    const float db = rf_ld_f16(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
    const unsigned long long g = rf_iq2xxs_grid[b[2 + 8 * ib + l]];
    const int signs = rf_ksigns((aux >> (7 * l)) & 127);
    return db * (float)((g >> (8 * j)) & 255) * ((signs >> j) & 1 ? -1.f : 1.f);
}
#endif

#if RF_ALL || RF_T_iq2_xs
template <> RF_DEVICE_SPEC void rf_sub32<w_iq2_xs>(const unsigned char* b, int ib, float* out) {
    const float d = rf_ld_f16(b);
    const int sc = b[66 + ib];
    const float db[2] = {d * (0.5f + (float)(sc & 15)) * 0.25f, d * (0.5f + (float)(sc >> 4)) * 0.25f};
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const unsigned q = rf_ld_u16(b + 2 + 8 * ib + 2 * l);
        const unsigned long long g = rf_iq2xs_grid[q & 511];
        const int signs = rf_ksigns(q >> 9);
#pragma unroll
        for (int j = 0; j < 8; j++)
            out[8 * l + j] = db[l / 2] * (float)((g >> (8 * j)) & 255) * ((signs >> j) & 1 ? -1.f : 1.f);
    }
}
template <> RF_DEVICE_SPEC float load_w<w_iq2_xs>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 74;
    const int e = (int)(k % 256), ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const int s = (b[66 + ib] >> (4 * (l / 2))) & 15;
    const float db = rf_ld_f16(b) * (0.5f + (float)s) * 0.25f;
    const unsigned q = rf_ld_u16(b + 2 + 8 * ib + 2 * l);
    const unsigned long long g = rf_iq2xs_grid[q & 511];
    return db * (float)((g >> (8 * j)) & 255) * ((rf_ksigns(q >> 9) >> j) & 1 ? -1.f : 1.f);
}
#endif

#if RF_ALL || RF_T_iq2_s
template <> RF_DEVICE_SPEC void rf_sub32<w_iq2_s>(const unsigned char* b, int ib, float* out) {
    const float d = rf_ld_f16(b);
    const int sc = b[74 + ib], qh = b[66 + ib];
    const float db[2] = {d * (0.5f + (float)(sc & 15)) * 0.25f, d * (0.5f + (float)(sc >> 4)) * 0.25f};
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const unsigned long long g = rf_iq2s_grid[b[2 + 4 * ib + l] | ((qh << (8 - 2 * l)) & 0x300)];
        const int signs = b[34 + 4 * ib + l];
#pragma unroll
        for (int j = 0; j < 8; j++)
            out[8 * l + j] = db[l / 2] * (float)((g >> (8 * j)) & 255) * ((signs >> j) & 1 ? -1.f : 1.f);
    }
}
template <> RF_DEVICE_SPEC float load_w<w_iq2_s>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 82;
    const int e = (int)(k % 256), ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const int s = (b[74 + ib] >> (4 * (l / 2))) & 15;
    const float db = rf_ld_f16(b) * (0.5f + (float)s) * 0.25f;
    const unsigned long long g = rf_iq2s_grid[b[2 + 4 * ib + l] | ((b[66 + ib] << (8 - 2 * l)) & 0x300)];
    return db * (float)((g >> (8 * j)) & 255) * ((b[34 + 4 * ib + l] >> j) & 1 ? -1.f : 1.f);
}
#endif

#if RF_ALL || RF_T_iq3_xxs
template <> RF_DEVICE_SPEC void rf_sub32<w_iq3_xxs>(const unsigned char* b, int ib, float* out) {
    const unsigned aux = rf_ld_u32(b + 66 + 4 * ib);
    const float db = rf_ld_f16(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    const unsigned char* q = b + 2 + 8 * ib;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const unsigned g0 = rf_iq3xxs_grid[q[2 * l]], g1 = rf_iq3xxs_grid[q[2 * l + 1]];
        const int signs = rf_ksigns((aux >> (7 * l)) & 127);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const unsigned g = j < 4 ? g0 : g1;
            out[8 * l + j] = db * (float)((g >> (8 * (j % 4))) & 255) * ((signs >> j) & 1 ? -1.f : 1.f);
        }
    }
}
template <> RF_DEVICE_SPEC float load_w<w_iq3_xxs>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 98;
    const int e = (int)(k % 256), ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const unsigned aux = rf_ld_u32(b + 66 + 4 * ib);
    const float db = rf_ld_f16(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    const unsigned g = rf_iq3xxs_grid[b[2 + 8 * ib + 2 * l + j / 4]];
    const int signs = rf_ksigns((aux >> (7 * l)) & 127);
    return db * (float)((g >> (8 * (j % 4))) & 255) * ((signs >> j) & 1 ? -1.f : 1.f);
}
#endif

#if RF_ALL || RF_T_iq3_s
template <> RF_DEVICE_SPEC void rf_sub32<w_iq3_s>(const unsigned char* b, int ib, float* out) {
    const float db = rf_ld_f16(b) * (float)(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15));
    const int qh = b[66 + ib];
    const unsigned char* q = b + 2 + 8 * ib;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const unsigned g0 = rf_iq3s_grid[q[2 * l] | ((qh << (8 - 2 * l)) & 256)];
        const unsigned g1 = rf_iq3s_grid[q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
        const int signs = b[74 + 4 * ib + l];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const unsigned g = j < 4 ? g0 : g1;
            out[8 * l + j] = db * (float)((g >> (8 * (j % 4))) & 255) * ((signs >> j) & 1 ? -1.f : 1.f);
        }
    }
}
template <> RF_DEVICE_SPEC float load_w<w_iq3_s>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 110;
    const int e = (int)(k % 256), ib = e / 32, l = (e % 32) / 8, j = e % 8, t = 2 * l + j / 4;
    const float db = rf_ld_f16(b) * (float)(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15));
    const unsigned g = rf_iq3s_grid[b[2 + 8 * ib + t] | ((b[66 + ib] << (8 - t)) & 256)];
    return db * (float)((g >> (8 * (j % 4))) & 255) * ((b[74 + 4 * ib + l] >> j) & 1 ? -1.f : 1.f);
}
#endif

// IQ1_S / IQ1_M: grid entries of 8 values in {-1, 0, 1} (signed bytes), shifted by +-1/8.
#define RF_IQ1_DELTA 0.125f
#if RF_ALL || RF_T_iq1_s
template <> RF_DEVICE_SPEC void rf_sub32<w_iq1_s>(const unsigned char* b, int ib, float* out) {
    const unsigned qh = rf_ld_u16(b + 34 + 2 * ib);
    const float dl = rf_ld_f16(b) * (float)(2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -RF_IQ1_DELTA : RF_IQ1_DELTA;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const unsigned long long g = rf_iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
#pragma unroll
        for (int j = 0; j < 8; j++) out[8 * l + j] = dl * ((float)(signed char)((g >> (8 * j)) & 255) + delta);
    }
}
template <> RF_DEVICE_SPEC float load_w<w_iq1_s>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 50;
    const int e = (int)(k % 256), ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const unsigned qh = rf_ld_u16(b + 34 + 2 * ib);
    const float dl = rf_ld_f16(b) * (float)(2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -RF_IQ1_DELTA : RF_IQ1_DELTA;
    const unsigned long long g = rf_iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
    return dl * ((float)(signed char)((g >> (8 * j)) & 255) + delta);
}
#endif

#if RF_ALL || RF_T_iq1_m
template <> RF_DEVICE_SPEC void rf_sub32<w_iq1_m>(const unsigned char* b, int ib, float* out) {
    const float d = rf_iq1m_d(b);
    const unsigned sc = rf_ld_u16(b + 48 + 2 * (ib / 2));
    const float dl[2] = {d * (float)(2 * ((sc >> (6 * (ib % 2))) & 7) + 1),
                         d * (float)(2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1)};
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const int qh = b[32 + 2 * ib + l / 2];
        const unsigned long long g = rf_iq1s_grid[b[4 * ib + l] | ((qh << (8 - 4 * (l % 2))) & 0x700)];
        const float delta = qh & (0x08 << (4 * (l % 2))) ? -RF_IQ1_DELTA : RF_IQ1_DELTA;
#pragma unroll
        for (int j = 0; j < 8; j++) out[8 * l + j] = dl[l / 2] * ((float)(signed char)((g >> (8 * j)) & 255) + delta);
    }
}
template <> RF_DEVICE_SPEC float load_w<w_iq1_m>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 56;
    const int e = (int)(k % 256), ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const unsigned sc = rf_ld_u16(b + 48 + 2 * (ib / 2));
    const float dl = rf_iq1m_d(b) * (float)(2 * ((sc >> (6 * (ib % 2) + 3 * (l / 2))) & 7) + 1);
    const int qh = b[32 + 2 * ib + l / 2];
    const unsigned long long g = rf_iq1s_grid[b[4 * ib + l] | ((qh << (8 - 4 * (l % 2))) & 0x700)];
    const float delta = qh & (0x08 << (4 * (l % 2))) ? -RF_IQ1_DELTA : RF_IQ1_DELTA;
    return dl * ((float)(signed char)((g >> (8 * j)) & 255) + delta);
}
#endif

// load_block32 of the 256-value formats: sub-block blk % 8 of super-block blk / 8.
#define RF_SUB32_BLOCK(NAME, BYTES)                                                                   \
    template <> RF_DEVICE_SPEC void load_block32<w_##NAME>(const char* row, i64 blk, float* out) {    \
        rf_sub32<w_##NAME>((const unsigned char*)row + (blk / 8) * BYTES, (int)(blk % 8), out);       \
    }
#if RF_ALL || RF_T_iq4_xs
RF_SUB32_BLOCK(iq4_xs, 136)
#endif
#if RF_ALL || RF_T_tq2_0
RF_SUB32_BLOCK(tq2_0, 66)
#endif
#if RF_ALL || RF_T_tq1_0
RF_SUB32_BLOCK(tq1_0, 54)
#endif
#if RF_ALL || RF_T_iq2_xxs
RF_SUB32_BLOCK(iq2_xxs, 66)
#endif
#if RF_ALL || RF_T_iq2_xs
RF_SUB32_BLOCK(iq2_xs, 74)
#endif
#if RF_ALL || RF_T_iq2_s
RF_SUB32_BLOCK(iq2_s, 82)
#endif
#if RF_ALL || RF_T_iq3_xxs
RF_SUB32_BLOCK(iq3_xxs, 98)
#endif
#if RF_ALL || RF_T_iq3_s
RF_SUB32_BLOCK(iq3_s, 110)
#endif
#if RF_ALL || RF_T_iq1_s
RF_SUB32_BLOCK(iq1_s, 50)
#endif
#if RF_ALL || RF_T_iq1_m
RF_SUB32_BLOCK(iq1_m, 56)
#endif

// Half the UE4M3 scale byte x (NVFP4's levels are doubled), as ggml decodes it: the top bit
// ignored, 0x7f (NaN) is 0, exponent 0 subnormal (m * 2^-9); else (1 + m/8) 2^(e - 7).
RF_DEVICE float rf_ue4m3_half(int x) {
    const int e = (x >> 3) & 15, m = x & 7;
    if (x == 0x7f) return 0.0f;
    if (e == 0) return (float)m * (1.0f / 1024.0f);
    return __uint_as_float(((unsigned)(e + 119) << 23) | ((unsigned)m << 20));
}

#if RF_ALL || RF_T_nvfp4
template <> RF_DEVICE_SPEC float load_w<w_nvfp4>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 64) * 36;
    const int e = (int)(k % 64), s = e / 16, j = e % 16;
    const int q = (b[4 + 8 * s + (j & 7)] >> (4 * (j >> 3))) & 15;
    return (float)rf_mxfp4_level(q) * rf_ue4m3_half(b[s]);
}
// Sub-blocks 2 (blk % 2) and 2 (blk % 2) + 1 of block blk / 2.
template <> RF_DEVICE_SPEC void load_block32<w_nvfp4>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + (blk / 2) * 36;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int s = 2 * (int)(blk % 2) + h;
        const float d = rf_ue4m3_half(b[s]);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int q = b[4 + 8 * s + j];
            out[16 * h + j] = (float)rf_mxfp4_level(q & 15) * d;
            out[16 * h + 8 + j] = (float)rf_mxfp4_level(q >> 4) * d;
        }
    }
}
#endif

#if RF_ALL || RF_T_q1_0
template <> RF_DEVICE_SPEC float load_w<w_q1_0>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 128) * 18;
    const int j = (int)(k % 128);
    const float d = rf_ld_f16(b);
    return (b[2 + j / 8] >> (j % 8)) & 1 ? d : -d;
}
// Quarter blk % 4 of block blk / 4.
template <> RF_DEVICE_SPEC void load_block32<w_q1_0>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + (blk / 4) * 18;
    const unsigned bits = rf_ld_u32(b + 2 + 4 * (blk % 4));
    const float d = rf_ld_f16(b);
#pragma unroll
    for (int j = 0; j < 32; j++) out[j] = (bits >> j) & 1 ? d : -d;
}
#endif

#if RF_ALL || RF_T_q2_0
template <> RF_DEVICE_SPEC float load_w<w_q2_0>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 64) * 18;
    const int j = (int)(k % 64);
    return (float)(((b[2 + j / 4] >> (2 * (j % 4))) & 3) - 1) * rf_ld_f16(b);
}
// Half blk % 2 of block blk / 2.
template <> RF_DEVICE_SPEC void load_block32<w_q2_0>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + (blk / 2) * 18;
    const unsigned char* q = b + 2 + 8 * (blk % 2);
    const float d = rf_ld_f16(b);
#pragma unroll
    for (int j = 0; j < 32; j++) out[j] = (float)(((q[j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
}
#endif

#endif
