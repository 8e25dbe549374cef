// Weight element loaders: element k of a row of any supported ggml type, as f32. Block
// layouts as ggml stores them (d/m are IEEE f16; see src/cpu/quants/*.rs):
//   Q4_0   18 B / 32: d, qs[16]            x = d * (nibble - 8); byte j holds x[j] | x[j+16]
//   Q4_1   20 B / 32: d, m, qs[16]         x = d * nibble + m
//   Q5_0   22 B / 32: d, qh[4], qs[16]     x = d * ((nibble | bit k of qh << 4) - 16)
//   Q5_1   24 B / 32: d, m, qh[4], qs[16]  x = d * (nibble | bit << 4) + m
//   Q8_0   34 B / 32: d, qs[32] (i8)       x = d * q
//   IQ4_NL 18 B / 32: d, qs[16]            x = d * table[nibble]
//   Q4_K  144 B / 256: d, dmin, scales[12] (6-bit scale/min per 32), qs[128]
//   Q6_K  210 B / 256: ql[128], qh[64], scales[16] (i8 per 16), d
//   BF16    2 B / 1:   the top half of an f32
//   Q2_K   84 B / 256: scales[16] (4-bit scale | 4-bit min << 4, per 16), qs[64], d, dmin
//   Q3_K  110 B / 256: hmask[32], qs[64], scales[12] (6-bit, +32 biased, per 16), d
//   Q5_K  176 B / 256: d, dmin, scales[12] (as Q4_K), qh[32], qs[128]
//   IQ4_XS  136 B / 256: d, scales_h (u16: 2 high bits per 32), scales_l[4] (4 low bits per 32),
//                      qs[128] (IQ4_NL's nibbles per 32); x = d * (ls - 32) * table[nibble]
//   MXFP4    17 B / 32:  e (E8M0 scale), qs[16] (E2M1 nibbles as IQ4_NL's); x = 2^(e-128) * kv[nibble]
//   TQ2_0    66 B / 256: qs[64] (2-bit codes), d; x = d * (code - 1)
//   TQ1_0    54 B / 256: qs[48] (5 trits a byte), qh[4] (4 trits a byte), d; x = d * (trit - 1)
//   IQ2_XXS  66 B / 256: d, per 32: 4 grid bytes + a word of 4x7 sign bits and a 4-bit scale
//   IQ2_XS   74 B / 256: d, qs u16[32] (9-bit grid index, 7 sign bits), scales[8] (4 bits per 16)
//   IQ2_S    82 B / 256: d, qs[32] (grid low bytes), signs[32], qh[8] (2 high bits each), scales[8]
//   IQ3_XXS  98 B / 256: d, qs[64] (grid of 4 values), per 32 a word of 4x7 sign bits + scale
//   IQ3_S   110 B / 256: d, qs[64] (grid low bytes), qh[8] (9th bits), signs[32], scales[4]
//   IQ1_S    50 B / 256: d, qs[32] (grid low bytes), qh u16[8] (3 high bits x4, scale, delta sign)
//   IQ1_M    56 B / 256: qs[32], qh[16] (3 high bits + delta sign per 8), scales[8] (3 bits per
//                      16, d's f16 bits in the top nibbles of the 4 words)
//   NVFP4    36 B / 64:  d[4] (UE4M3 scale per 16), qs[32]: byte 8s + j holds values 16s + j
//                      (low nibble) and 16s + 8 + j (high), E2M1 as MXFP4's; x = ue4m3(d[s]) * kv
//   Q1_0     18 B / 128: d, qs[16] (bit j of byte b is value 8b + j); x = set ? d : -d
//   Q2_0     18 B / 64:  d, qs[16] (bit pair l of byte b is value 4b + l); x = d * (code - 1)
// The i-quants' grids are rf_<name>_grid of iquant_grids.h (generated from the pinned ggml).
// Loaders read bytes only (blocks are 2-byte aligned at best). The loaders of the formats from
// IQ4_XS on are in quants_iq.h.
#ifndef ROCMFORGE_QUANTS_H
#define ROCMFORGE_QUANTS_H
#include "prelude.h"

struct w_f32 {};
struct w_f16 {};
struct w_q4_0 {};
struct w_q4_1 {};
struct w_q5_0 {};
struct w_q5_1 {};
struct w_q8_0 {};
struct w_iq4_nl {};
struct w_q4_k {};
struct w_q6_k {};
struct w_bf16 {};
struct w_q2_k {};
struct w_q3_k {};
struct w_q5_k {};
struct w_iq4_xs {};
struct w_mxfp4 {};
struct w_tq2_0 {};
struct w_tq1_0 {};
struct w_iq3_s {};
struct w_iq3_xxs {};
struct w_iq2_xxs {};
struct w_iq2_xs {};
struct w_iq2_s {};
struct w_iq1_s {};
struct w_iq1_m {};
struct w_nvfp4 {};
struct w_q1_0 {};
struct w_q2_0 {};

// The weight types a program stamps out per-type kernels for, as X(suffix, loader): every type,
// or only a kernel group's own (RF_T_<suffix>, see prelude.h).
#if RF_ALL || RF_T_f32
#define RF_X_f32(X) X(f32, w_f32)
#else
#define RF_X_f32(X)
#endif
#if RF_ALL || RF_T_f16
#define RF_X_f16(X) X(f16, w_f16)
#else
#define RF_X_f16(X)
#endif
#if RF_ALL || RF_T_q4_0
#define RF_X_q4_0(X) X(q4_0, w_q4_0)
#else
#define RF_X_q4_0(X)
#endif
#if RF_ALL || RF_T_q4_1
#define RF_X_q4_1(X) X(q4_1, w_q4_1)
#else
#define RF_X_q4_1(X)
#endif
#if RF_ALL || RF_T_q5_0
#define RF_X_q5_0(X) X(q5_0, w_q5_0)
#else
#define RF_X_q5_0(X)
#endif
#if RF_ALL || RF_T_q5_1
#define RF_X_q5_1(X) X(q5_1, w_q5_1)
#else
#define RF_X_q5_1(X)
#endif
#if RF_ALL || RF_T_q8_0
#define RF_X_q8_0(X) X(q8_0, w_q8_0)
#else
#define RF_X_q8_0(X)
#endif
#if RF_ALL || RF_T_iq4_nl
#define RF_X_iq4_nl(X) X(iq4_nl, w_iq4_nl)
#else
#define RF_X_iq4_nl(X)
#endif
#if RF_ALL || RF_T_q4_k
#define RF_X_q4_k(X) X(q4_k, w_q4_k)
#else
#define RF_X_q4_k(X)
#endif
#if RF_ALL || RF_T_q6_k
#define RF_X_q6_k(X) X(q6_k, w_q6_k)
#else
#define RF_X_q6_k(X)
#endif
#if RF_ALL || RF_T_bf16
#define RF_X_bf16(X) X(bf16, w_bf16)
#else
#define RF_X_bf16(X)
#endif
#if RF_ALL || RF_T_q2_k
#define RF_X_q2_k(X) X(q2_k, w_q2_k)
#else
#define RF_X_q2_k(X)
#endif
#if RF_ALL || RF_T_q3_k
#define RF_X_q3_k(X) X(q3_k, w_q3_k)
#else
#define RF_X_q3_k(X)
#endif
#if RF_ALL || RF_T_q5_k
#define RF_X_q5_k(X) X(q5_k, w_q5_k)
#else
#define RF_X_q5_k(X)
#endif
#if RF_ALL || RF_T_iq4_xs
#define RF_X_iq4_xs(X) X(iq4_xs, w_iq4_xs)
#else
#define RF_X_iq4_xs(X)
#endif
#if RF_ALL || RF_T_mxfp4
#define RF_X_mxfp4(X) X(mxfp4, w_mxfp4)
#else
#define RF_X_mxfp4(X)
#endif
#if RF_ALL || RF_T_tq2_0
#define RF_X_tq2_0(X) X(tq2_0, w_tq2_0)
#else
#define RF_X_tq2_0(X)
#endif
#if RF_ALL || RF_T_tq1_0
#define RF_X_tq1_0(X) X(tq1_0, w_tq1_0)
#else
#define RF_X_tq1_0(X)
#endif
#if RF_ALL || RF_T_iq3_s
#define RF_X_iq3_s(X) X(iq3_s, w_iq3_s)
#else
#define RF_X_iq3_s(X)
#endif
#if RF_ALL || RF_T_iq3_xxs
#define RF_X_iq3_xxs(X) X(iq3_xxs, w_iq3_xxs)
#else
#define RF_X_iq3_xxs(X)
#endif
#if RF_ALL || RF_T_iq2_xxs
#define RF_X_iq2_xxs(X) X(iq2_xxs, w_iq2_xxs)
#else
#define RF_X_iq2_xxs(X)
#endif
#if RF_ALL || RF_T_iq2_xs
#define RF_X_iq2_xs(X) X(iq2_xs, w_iq2_xs)
#else
#define RF_X_iq2_xs(X)
#endif
#if RF_ALL || RF_T_iq2_s
#define RF_X_iq2_s(X) X(iq2_s, w_iq2_s)
#else
#define RF_X_iq2_s(X)
#endif
#if RF_ALL || RF_T_iq1_s
#define RF_X_iq1_s(X) X(iq1_s, w_iq1_s)
#else
#define RF_X_iq1_s(X)
#endif
#if RF_ALL || RF_T_iq1_m
#define RF_X_iq1_m(X) X(iq1_m, w_iq1_m)
#else
#define RF_X_iq1_m(X)
#endif
#if RF_ALL || RF_T_nvfp4
#define RF_X_nvfp4(X) X(nvfp4, w_nvfp4)
#else
#define RF_X_nvfp4(X)
#endif
#if RF_ALL || RF_T_q1_0
#define RF_X_q1_0(X) X(q1_0, w_q1_0)
#else
#define RF_X_q1_0(X)
#endif
#if RF_ALL || RF_T_q2_0
#define RF_X_q2_0(X) X(q2_0, w_q2_0)
#else
#define RF_X_q2_0(X)
#endif
#define RF_EACH_WEIGHT_TYPE(X) RF_X_f32(X) RF_X_f16(X) RF_X_q4_0(X) RF_X_q4_1(X) RF_X_q5_0(X) RF_X_q5_1(X) RF_X_q8_0(X) RF_X_iq4_nl(X) RF_X_q4_k(X) RF_X_q6_k(X) RF_X_bf16(X) RF_X_q2_k(X) RF_X_q3_k(X) RF_X_q5_k(X) RF_X_iq4_xs(X) RF_X_mxfp4(X) RF_X_tq2_0(X) RF_X_tq1_0(X) RF_X_iq3_s(X) RF_X_iq3_xxs(X) RF_X_iq2_xxs(X) RF_X_iq2_xs(X) RF_X_iq2_s(X) RF_X_iq1_s(X) RF_X_iq1_m(X) RF_X_nvfp4(X) RF_X_q1_0(X) RF_X_q2_0(X)
// Float weight types (mul_mat.hip's 8-value segment loaders).
#define RF_EACH_FLOAT_TYPE(X) RF_X_f32(X) RF_X_f16(X) RF_X_bf16(X)
// Types with an integer-dot matrix-vector kernel (mmvq.hip's mq_* loaders).
#define RF_EACH_MVQ_TYPE(X) RF_X_q4_0(X) RF_X_q4_1(X) RF_X_q5_0(X) RF_X_q5_1(X) RF_X_q8_0(X) RF_X_iq4_nl(X) RF_X_q4_k(X) RF_X_q5_k(X) RF_X_q6_k(X) RF_X_q2_k(X) RF_X_q3_k(X) RF_X_iq4_xs(X) RF_X_mxfp4(X) RF_X_tq2_0(X) RF_X_tq1_0(X) RF_X_iq3_s(X) RF_X_iq3_xxs(X) RF_X_iq2_xxs(X) RF_X_iq2_xs(X) RF_X_iq2_s(X) RF_X_iq1_s(X) RF_X_iq1_m(X) RF_X_nvfp4(X) RF_X_q1_0(X) RF_X_q2_0(X)

// f32 -> bf16 bits as ggml rounds (nearest even; NaN stays a quiet NaN), and the value back.
RF_DEVICE unsigned short rf_f32_to_bf16(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 64);
    return (unsigned short)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}
RF_DEVICE float rf_round_bf16(float f) { return __uint_as_float((unsigned)rf_f32_to_bf16(f) << 16); }

RF_DEVICE float rf_ld_f16(const unsigned char* p) { return rf_f16_to_f32((f16_bits)(p[0] | (p[1] << 8))); }

template <typename W> RF_DEVICE float load_w(const char* row, i64 k);

template <> RF_DEVICE_SPEC float load_w<w_f32>(const char* row, i64 k) { return ((const float*)row)[k]; }
template <> RF_DEVICE_SPEC float load_w<w_f16>(const char* row, i64 k) {
    return rf_f16_to_f32(((const f16_bits*)row)[k]);
}
template <> RF_DEVICE_SPEC float load_w<w_q4_0>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 32) * 18;
    const int j = (int)(k % 32);
    const int q = (b[2 + (j & 15)] >> ((j >> 4) * 4)) & 15;
    return rf_ld_f16(b) * (float)(q - 8);
}
template <> RF_DEVICE_SPEC float load_w<w_q4_1>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 32) * 20;
    const int j = (int)(k % 32);
    const int q = (b[4 + (j & 15)] >> ((j >> 4) * 4)) & 15;
    return rf_ld_f16(b) * (float)q + rf_ld_f16(b + 2);
}
template <> RF_DEVICE_SPEC float load_w<w_q5_0>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 32) * 22;
    const int j = (int)(k % 32);
    const int h = (b[2 + j / 8] >> (j % 8)) & 1;
    const int q = ((b[6 + (j & 15)] >> ((j >> 4) * 4)) & 15) | (h << 4);
    return rf_ld_f16(b) * (float)(q - 16);
}
template <> RF_DEVICE_SPEC float load_w<w_q5_1>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 32) * 24;
    const int j = (int)(k % 32);
    const int h = (b[4 + j / 8] >> (j % 8)) & 1;
    const int q = ((b[8 + (j & 15)] >> ((j >> 4) * 4)) & 15) | (h << 4);
    return rf_ld_f16(b) * (float)q + rf_ld_f16(b + 2);
}
template <> RF_DEVICE_SPEC float load_w<w_q8_0>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 32) * 34;
    return rf_ld_f16(b) * (float)(signed char)b[2 + k % 32];
}
// IQ4_NL's (and IQ4_XS's) 16 non-linear levels, 4 to an int (little-endian signed bytes).
RF_DEVICE int rf_iq4nl_level(int q) {
    const int packed[4] = {(int)0xBFAD9881u, (int)0xF6EADDCFu, (int)0x26190D01u, (int)0x71594535u};
    return (signed char)((packed[q >> 2] >> ((q & 3) * 8)) & 0xff);
}
template <> RF_DEVICE_SPEC float load_w<w_iq4_nl>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 32) * 18;
    const int j = (int)(k % 32);
    const int q = (b[2 + (j & 15)] >> ((j >> 4) * 4)) & 15;
    return rf_ld_f16(b) * (float)rf_iq4nl_level(q);
}
template <> RF_DEVICE_SPEC float load_w<w_q4_k>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 144;
    const int e = (int)(k % 256), s = e / 32, c = e / 64, l = e % 32;
    const unsigned char* sc = b + 4;
    int scale, mn;
    if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    const int q = (b[16 + 32 * c + l] >> ((s & 1) * 4)) & 15;
    return rf_ld_f16(b) * (float)scale * (float)q - rf_ld_f16(b + 2) * (float)mn;
}
template <> RF_DEVICE_SPEC float load_w<w_q6_k>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 210;
    const int e = (int)(k % 256), n = e / 128, quarter = (e % 128) / 32, l = e % 32;
    const int lo = (b[64 * n + l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 15;
    const int hi = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
    const float scale = (float)(signed char)b[192 + e / 16];
    return rf_ld_f16(b + 208) * scale * (float)((lo | (hi << 4)) - 32);
}

template <> RF_DEVICE_SPEC float load_w<w_bf16>(const char* row, i64 k) {
    return __uint_as_float((unsigned)((const unsigned short*)row)[k] << 16);
}
template <> RF_DEVICE_SPEC float load_w<w_q2_k>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 84;
    const int e = (int)(k % 256), n = e / 128, j = (e % 128) / 32, l = e % 32;
    const int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
    const int sc = b[e / 16];
    return rf_ld_f16(b + 80) * (float)(sc & 15) * (float)q - rf_ld_f16(b + 82) * (float)(sc >> 4);
}
template <> RF_DEVICE_SPEC float load_w<w_q3_k>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 110;
    const int e = (int)(k % 256), n = e / 128, j = (e % 128) / 32, l = e % 32, s = e / 16;
    const int lo = (b[32 + 32 * n + l] >> (2 * j)) & 3;
    const int hi = (b[l] >> (4 * n + j)) & 1;
    const unsigned char* sc = b + 96;
    const int low = s < 8 ? (sc[s] & 15) : (sc[s - 8] >> 4);
    const int high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    const int scale = (low | (high << 4)) - 32;
    return rf_ld_f16(b + 108) * (float)scale * (float)((lo | (hi << 2)) - 4);
}
template <> RF_DEVICE_SPEC float load_w<w_q5_k>(const char* row, i64 k) {
    const unsigned char* b = (const unsigned char*)row + (k / 256) * 176;
    const int e = (int)(k % 256), s = e / 32, c = e / 64, l = e % 32;
    const unsigned char* sc = b + 4;
    int scale, mn;
    if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    const int lo = (b[48 + 32 * c + l] >> ((s & 1) * 4)) & 15;
    const int hi = (b[16 + l] >> s) & 1;
    return rf_ld_f16(b) * (float)scale * (float)(lo | (hi << 4)) - rf_ld_f16(b + 2) * (float)mn;
}

// Elements 32*blk .. 32*blk+31 of a row as f32, for kernels where one thread takes a whole
// block: its loads are independent, so they are all in flight at once. The quantized types
// most used by real models read their scale once; the rest go through load_w.
template <typename W> RF_DEVICE void load_block32(const char* row, i64 blk, float* out) {
#pragma unroll
    for (int j = 0; j < 32; j++) out[j] = load_w<W>(row, blk * 32 + j);
}
template <> RF_DEVICE_SPEC void load_block32<w_q4_0>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + blk * 18;
    const float d = rf_ld_f16(b);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        out[j] = d * (float)((b[2 + j] & 15) - 8);
        out[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}
template <> RF_DEVICE_SPEC void load_block32<w_q4_1>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + blk * 20;
    const float d = rf_ld_f16(b), m = rf_ld_f16(b + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        out[j] = d * (float)(b[4 + j] & 15) + m;
        out[j + 16] = d * (float)(b[4 + j] >> 4) + m;
    }
}
template <> RF_DEVICE_SPEC void load_block32<w_q8_0>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + blk * 34;
    const float d = rf_ld_f16(b);
#pragma unroll
    for (int j = 0; j < 32; j++) out[j] = d * (float)(signed char)b[2 + j];
}

// K-quants: a block of 32 lies inside one super-block, so its scales (one per 32, or two
// per 16) are decoded once, not once per value as load_w does.
template <> RF_DEVICE_SPEC void load_block32<w_q4_k>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + (blk / 8) * 144;
    const int s = (int)(blk % 8);
    const unsigned char* sc = b + 4;
    int scale, mn;
    if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    const float d = rf_ld_f16(b) * (float)scale, m = rf_ld_f16(b + 2) * (float)mn;
    const unsigned char* q = b + 16 + 32 * (s / 2);
    const int sh = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) out[l] = d * (float)((q[l] >> sh) & 15) - m;
}
template <> RF_DEVICE_SPEC void load_block32<w_q5_k>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + (blk / 8) * 176;
    const int s = (int)(blk % 8);
    const unsigned char* sc = b + 4;
    int scale, mn;
    if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    const float d = rf_ld_f16(b) * (float)scale, m = rf_ld_f16(b + 2) * (float)mn;
    const unsigned char* q = b + 48 + 32 * (s / 2);
    const unsigned char* qh = b + 16;
    const int sh = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) out[l] = d * (float)(((q[l] >> sh) & 15) | (((qh[l] >> s) & 1) << 4)) - m;
}
template <> RF_DEVICE_SPEC void load_block32<w_q6_k>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + (blk / 8) * 210;
    const int s = (int)(blk % 8), n = s / 4, quarter = s % 4;
    const float d = rf_ld_f16(b + 208);
    const float d0 = d * (float)(signed char)b[192 + 2 * s], d1 = d * (float)(signed char)b[192 + 2 * s + 1];
    const unsigned char* ql = b + 64 * n + 32 * (quarter & 1);
    const unsigned char* qh = b + 128 + 32 * n;
    const int sl = 4 * (quarter >> 1), shh = 2 * quarter;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int q = ((ql[l] >> sl) & 15) | (((qh[l] >> shh) & 3) << 4);
        out[l] = (l < 16 ? d0 : d1) * (float)(q - 32);
    }
}
template <> RF_DEVICE_SPEC void load_block32<w_q2_k>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + (blk / 8) * 84;
    const int s = (int)(blk % 8), n = s / 4, j = s % 4;
    const float d = rf_ld_f16(b + 80), dmin = rf_ld_f16(b + 82);
    const int sc0 = b[2 * s], sc1 = b[2 * s + 1];
    const float d0 = d * (float)(sc0 & 15), m0 = dmin * (float)(sc0 >> 4);
    const float d1 = d * (float)(sc1 & 15), m1 = dmin * (float)(sc1 >> 4);
    const unsigned char* q = b + 16 + 32 * n;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const float v = (float)((q[l] >> (2 * j)) & 3);
        out[l] = l < 16 ? d0 * v - m0 : d1 * v - m1;
    }
}
template <> RF_DEVICE_SPEC void load_block32<w_q3_k>(const char* row, i64 blk, float* out) {
    const unsigned char* b = (const unsigned char*)row + (blk / 8) * 110;
    const int s = (int)(blk % 8), n = s / 4, j = s % 4;
    const unsigned char* sc = b + 96;
    float dd[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int t = 2 * s + h;
        const int low = t < 8 ? (sc[t] & 15) : (sc[t - 8] >> 4);
        const int high = (sc[8 + t % 4] >> (2 * (t / 4))) & 3;
        dd[h] = rf_ld_f16(b + 108) * (float)((low | (high << 4)) - 32);
    }
    const unsigned char* q = b + 32 + 32 * n;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int v = (((q[l] >> (2 * j)) & 3) | (((b[l] >> (4 * n + j)) & 1) << 2)) - 4;
        out[l] = (l < 16 ? dd[0] : dd[1]) * (float)v;
    }
}

// The min `m` of the block holding element k, for types whose blocks have one (Q4_1, Q5_1),
// else 0: ggml-cpu adds m times an f16-rounded sum of the activations' block (Q8_1's `s`),
// which the mat-mul kernels reproduce with a per-block correction.
template <typename W> RF_DEVICE float load_w_min(const char* row, i64 blk) { return 0.0f; }
template <> RF_DEVICE_SPEC float load_w_min<w_q4_1>(const char* row, i64 blk) {
    return rf_ld_f16((const unsigned char*)row + blk * 20 + 2);
}
template <> RF_DEVICE_SPEC float load_w_min<w_q5_1>(const char* row, i64 blk) {
    return rf_ld_f16((const unsigned char*)row + blk * 24 + 2);
}

// ggml-cpu's activation rounding before its integer dots (its AVX2 quantize_row_q8_0: v * 127
// / amax to nearest even), for a value v of a Q8_0 / Q8_1 block of 32 whose largest |value| is
// amax: the value d * q the dot effectively uses; d32 is the unrounded scale and q the integer
// (Q8_1's block sum needs them).
RF_DEVICE float rf_q8_value(float v, float amax, float& d32, float& q) {
    d32 = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    q = rintf(v * id);
    return rf_f16_to_f32(rf_f32_to_f16(d32)) * q;
}
// The same for one group of 32 lanes holding a block (lane = element).
RF_DEVICE float rf_round_q8_32(float v, float& d32, float& q) {
    return rf_q8_value(v, rf_group_max<32>(fabsf(v)), d32, q);
}
// One block of 32 values quantized as ggml-cpu's Q8_0 / Q8_1 (quantize_q8 mode 0) by a group
// of 32 lanes, each holding value `lane` of block b in v: the integers into q[b * 32 + lane],
// (f16 scale, f16 scale * sum of the integers) into ds[b]. f32_scales: the two kept in f32 (values
// that a later factor scales, mul_mat_vec_q_add_norm: f16 could overflow before it applies).
RF_DEVICE void quantize_vals32(float v, signed char* q, float2* ds, i64 b, int lane, bool f32_scales = false) {
    float d32, qv;
    rf_round_q8_32(v, d32, qv);
    q[b * 32 + lane] = (signed char)(int)qv;
    const float sum = rf_group_sum<32>(qv);  // |sum| <= 32 * 127: exact in f32
    if (lane == 0) {
        ds[b] = f32_scales ? make_float2(d32, d32 * sum)
                           : make_float2(rf_f16_to_f32(rf_f32_to_f16(d32)), rf_f16_to_f32(rf_f32_to_f16(d32 * sum)));
    }
}
// Q8_K blocks of 256: element lane + 32 * t of xb rounded into r[t]; the scale comes from the
// value of largest magnitude, the first one on ties.
RF_DEVICE void rf_round_q8k_256(const float* xb, float r[8]) {
    float best_a = -1.0f, best_i = 0.0f, best_x = 0.0f;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        const float v = xb[lane + 32 * t], a = fabsf(v);
        if (a > best_a) {
            best_a = a;
            best_i = (float)(lane + 32 * t);
            best_x = v;
        }
    }
    const float amax = rf_group_max<32>(best_a);
    const float first = -rf_group_max<32>(best_a == amax ? -best_i : -1e9f);
    const float mx = rf_group_sum<32>(best_a == amax && best_i == first ? best_x : 0.0f);
#pragma unroll
    for (int t = 0; t < 8; t++) {
        r[t] = 0.0f;
        if (amax != 0.0f) {
            const float iscale = -127.0f / mx;
            r[t] = (1.0f / iscale) * fminf(rintf(iscale * xb[lane + 32 * t]), 127.0f);
        }
    }
}

#endif
