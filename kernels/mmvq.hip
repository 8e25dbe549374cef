// Matrix-vector MUL_MAT with integer dot products (token generation): src1 is quantized
// once to 8-bit blocks (quantize_q8, into device scratch), then each weight format's 4-bit,
// 5-bit, 6-bit or 8-bit values (the i-quants' and ternary formats' decoded to signed bytes)
// meet the 8-bit activations in dp4a instructions (rf_dp4a),
// with one float multiply per block and sub-block scale. ggml-cpu computes the same integer
// sums (it also quantizes src1 to Q8_0 / Q8_1 / Q8_K first), so results agree with it up to
// the order of float additions.
//
// Activations, per src1 row (rows in (i1, i2, i3) order, K values each):
//   xq  int8 [K]           the quantized values;
//   xds float2 [K / 32]    per 32 values (d, s): mode 0 (Q8_0 / Q8_1 as ggml-cpu makes them):
//                          d = f16-rounded scale, s = f16-rounded d * sum(q); mode 1 (Q8_K):
//                          d = the f32 scale of the 256-value block (same for its 8 parts).
// Weight layouts: see quants.h. Each warp computes one output row for up to MVQ_COLS src1
// columns; a lane takes 1/NSUB of a weight block at a time (consecutive lanes, consecutive
// parts: the warp reads the row contiguously), so every weight byte is read once.
#include "prelude.h"
#include "quants.h"

#define MVQ_ROWS 4
#define MVQ_COLS 4
#define MVQ_UNROLL 4

// 4 bytes from memory that is only 2-byte aligned (blocks of 18, 22, 34 and 210 bytes).
RF_DEVICE int ld_i32_a2(const unsigned char* p) {
    const unsigned short* h = (const unsigned short*)p;
    return (int)((unsigned)h[0] | ((unsigned)h[1] << 16));
}
RF_DEVICE int ld_i32_a4(const unsigned char* p) { return *(const int*)p; }
RF_DEVICE float ld_f16_a2(const unsigned char* p) { return rf_f16_to_f32(*(const f16_bits*)p); }

#define NIB_LO(v) ((v) & 0x0f0f0f0f)
#define NIB_HI(v) (((v) >> 4) & 0x0f0f0f0f)
// Bytes of v (each in 0 .. 2*off - 1) minus off, as signed bytes: adding 128 - off never
// carries into the next byte, and flipping the top bit subtracts 128 modulo 256.
#define BYTES_MINUS(v, off) (((v) + (0x01010101 * (128 - (off)))) ^ (int)0x80808080)

// Bit i (i < 4) of `bits` moved to bit 4 of byte i (the fifth bit of Q5 values).
RF_DEVICE int spread4(int bits) {
    return ((bits & 1) << 4) | ((bits & 2) << 11) | ((bits & 4) << 18) | ((bits & 8) << 25);
}

#define MQ_MEMBER __device__ __forceinline__ static

// NW words of a 2-byte aligned block's bytes 2 .. 2 + 4 NW (after its f16 scale d, returned in
// *d) through NW + 1 aligned 4-byte loads and funnel shifts, instead of 2 NW + 1 2-byte loads.
// The loads cover the block's bytes [-2, 4 NW + 2) or [0, 4 NW + 4): never more than the
// aligned words holding the block, so they never leave its buffer.
template <int NW>
RF_DEVICE void ld_block_words(const unsigned char* p, int* out, float* d) {
    const unsigned off = (unsigned)(unsigned long long)p & 2;  // 0 or 2
    const unsigned* a = (const unsigned*)(p - off);
    unsigned w[NW + 1];
#pragma unroll
    for (int i = 0; i <= NW; i++) w[i] = a[i];
    const unsigned sh = 16 + 8 * off;
    *d = rf_f16_to_f32((f16_bits)((w[0] >> (8 * off)) & 0xffff));
#pragma unroll
    for (int i = 0; i < NW; i++) out[i] = (int)(unsigned)((((unsigned long long)w[i + 1] << 32) | w[i]) >> sh);
}

// Q4_0, a whole block per lane: values j (low nibble) and 16 + j (high nibble) in byte j.
struct mq_q4_0 {
    enum { QK = 32, BYTES = 18, NSUB = 1 };
    struct R {
        float d;
        int v[4];
    };
    MQ_MEMBER R load(const unsigned char* b, int) {
        R r;
        ld_block_words<4>(b, r.v, &r.d);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int, const int* x, const float2* ds) {
        const int4 xl = ((const int4*)x)[0], xh = ((const int4*)x)[1];
        int sumi = rf_dp4a(BYTES_MINUS(NIB_LO(r.v[0]), 8), xl.x, 0);
        sumi = rf_dp4a(BYTES_MINUS(NIB_LO(r.v[1]), 8), xl.y, sumi);
        sumi = rf_dp4a(BYTES_MINUS(NIB_LO(r.v[2]), 8), xl.z, sumi);
        sumi = rf_dp4a(BYTES_MINUS(NIB_LO(r.v[3]), 8), xl.w, sumi);
        sumi = rf_dp4a(BYTES_MINUS(NIB_HI(r.v[0]), 8), xh.x, sumi);
        sumi = rf_dp4a(BYTES_MINUS(NIB_HI(r.v[1]), 8), xh.y, sumi);
        sumi = rf_dp4a(BYTES_MINUS(NIB_HI(r.v[2]), 8), xh.z, sumi);
        sumi = rf_dp4a(BYTES_MINUS(NIB_HI(r.v[3]), 8), xh.w, sumi);
        return r.d * ds[0].x * (float)sumi;
    }
};

// Q4_1: as Q4_0 with unsigned nibbles and a min m (times the activations' block sum s,
// added once per block).
struct mq_q4_1 {
    enum { QK = 32, BYTES = 20, NSUB = 2 };
    struct R {
        float d, m;
        int v0, v1;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.m = ld_f16_a2(b + 2);
        r.v0 = ld_i32_a4(b + 4 + 8 * s);
        r.v1 = ld_i32_a4(b + 8 + 8 * s);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int2 xl = ((const int2*)x)[s], xh = ((const int2*)x)[2 + s];
        int sumi = rf_dp4a(NIB_LO(r.v0), xl.x, 0);
        sumi = rf_dp4a(NIB_LO(r.v1), xl.y, sumi);
        sumi = rf_dp4a(NIB_HI(r.v0), xh.x, sumi);
        sumi = rf_dp4a(NIB_HI(r.v1), xh.y, sumi);
        const float2 a = ds[0];
        return r.d * a.x * (float)sumi + (s == 0 ? r.m * a.y : 0.0f);
    }
};

// Q5_0, a whole block per lane: Q4_0's nibbles plus a fifth bit per value from qh (bit j for
// value j), minus 16.
struct mq_q5_0 {
    enum { QK = 32, BYTES = 22, NSUB = 1 };
    struct R {
        float d;
        int v[5];  // qh, then the 16 nibble bytes
    };
    MQ_MEMBER R load(const unsigned char* b, int) {
        R r;
        ld_block_words<5>(b, r.v, &r.d);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int, const int* x, const float2* ds) {
        const int4 xl = ((const int4*)x)[0], xh = ((const int4*)x)[1];
        const int xs[8] = {xl.x, xl.y, xl.z, xl.w, xh.x, xh.y, xh.z, xh.w};
        const int qh = r.v[0];
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sumi = rf_dp4a(BYTES_MINUS(NIB_LO(r.v[1 + i]) | spread4(qh >> (4 * i)), 16), xs[i], sumi);
            sumi = rf_dp4a(BYTES_MINUS(NIB_HI(r.v[1 + i]) | spread4(qh >> (16 + 4 * i)), 16), xs[4 + i], sumi);
        }
        return r.d * ds[0].x * (float)sumi;
    }
};

// Q5_1: Q4_1 with the fifth bit.
struct mq_q5_1 {
    enum { QK = 32, BYTES = 24, NSUB = 2 };
    struct R {
        float d, m;
        int v0, v1, qh;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.m = ld_f16_a2(b + 2);
        r.qh = ld_i32_a4(b + 4);
        r.v0 = ld_i32_a4(b + 8 + 8 * s);
        r.v1 = ld_i32_a4(b + 12 + 8 * s);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int h = r.qh >> (8 * s);
        const int2 xl = ((const int2*)x)[s], xh = ((const int2*)x)[2 + s];
        int sumi = rf_dp4a(NIB_LO(r.v0) | spread4(h), xl.x, 0);
        sumi = rf_dp4a(NIB_LO(r.v1) | spread4(h >> 4), xl.y, sumi);
        sumi = rf_dp4a(NIB_HI(r.v0) | spread4(h >> 16), xh.x, sumi);
        sumi = rf_dp4a(NIB_HI(r.v1) | spread4(h >> 20), xh.y, sumi);
        const float2 a = ds[0];
        return r.d * a.x * (float)sumi + (s == 0 ? r.m * a.y : 0.0f);
    }
};

// Q8_0, a whole block per lane.
struct mq_q8_0 {
    enum { QK = 32, BYTES = 34, NSUB = 1 };
    struct R {
        float d;
        int v[8];
    };
    MQ_MEMBER R load(const unsigned char* b, int) {
        R r;
        ld_block_words<8>(b, r.v, &r.d);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int, const int* x, const float2* ds) {
        const int4 xl = ((const int4*)x)[0], xh = ((const int4*)x)[1];
        int sumi = rf_dp4a(r.v[0], xl.x, 0);
        sumi = rf_dp4a(r.v[1], xl.y, sumi);
        sumi = rf_dp4a(r.v[2], xl.z, sumi);
        sumi = rf_dp4a(r.v[3], xl.w, sumi);
        sumi = rf_dp4a(r.v[4], xh.x, sumi);
        sumi = rf_dp4a(r.v[5], xh.y, sumi);
        sumi = rf_dp4a(r.v[6], xh.z, sumi);
        sumi = rf_dp4a(r.v[7], xh.w, sumi);
        return r.d * ds[0].x * (float)sumi;
    }
};

// Four 16-entry byte-table lookups (the table 4 entries to an int, little-endian), indices in
// the low nibbles of nibs' bytes: two 8-entry byte permutes, then bit 3 of each index picks one.
// Registers only (a table in constant memory serializes a warp's different indices).
RF_DEVICE int rf_lut16(int nibs, unsigned t0, unsigned t1, unsigned t2, unsigned t3) {
    const unsigned n = (unsigned)nibs, sel = n & 0x07070707u;
    const unsigned lo = rf_perm8(t0, t1, sel), hi = rf_perm8(t2, t3, sel);
    const unsigned m = ((n >> 3) & 0x01010101u) * 0xffu;
    return (int)((hi & m) | (lo & ~m));
}
// A table of 16 bytes looked up by all eight nibbles of w: .x byte j is the entry of byte j's
// low nibble, .y of its high nibble (NIB_LO / NIB_HI through rf_lut16). On NVIDIA prmt takes
// nibble selectors, so four nibbles go through both table halves at once and a third permute
// picks each byte's half by the nibble's bit 3; two more put low and high nibbles apart:
// 12 instructions for 8 values against 26 for two rf_lut16 (its byte selectors must first be
// packed into nibbles), which made IQ4_XS generation 0.7x ggml-cuda's on an H100.
RF_DEVICE int2 rf_lut16_nibs(int w, unsigned t0, unsigned t1, unsigned t2, unsigned t3) {
#if defined(RF_NVIDIA)
    const unsigned u = (unsigned)w, half = 0x32103210u | ((u & 0x88888888u) >> 1);
    const unsigned a = __byte_perm(__byte_perm(t0, t1, u), __byte_perm(t2, t3, u), half);  // nibbles 0..3
    const unsigned b = __byte_perm(__byte_perm(t0, t1, u >> 16), __byte_perm(t2, t3, u >> 16), half >> 16);
    return make_int2((int)__byte_perm(a, b, 0x6420), (int)__byte_perm(a, b, 0x7531));
#else
    return make_int2(rf_lut16(NIB_LO(w), t0, t1, t2, t3), rf_lut16(NIB_HI(w), t0, t1, t2, t3));
#endif
}
// IQ4_NL's 16 levels.
RF_DEVICE int2 iq4nl_nibs(int w) { return rf_lut16_nibs(w, 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u); }

// IQ4_NL: Q4_0's layout, nibbles index 16 non-linear levels.
struct mq_iq4_nl {
    enum { QK = 32, BYTES = 18, NSUB = 1 };
    typedef mq_q4_0::R R;
    MQ_MEMBER R load(const unsigned char* b, int s) { return mq_q4_0::load(b, s); }
    MQ_MEMBER float dot(const R& r, int, const int* x, const float2* ds) {
        const int4 xl = ((const int4*)x)[0], xh = ((const int4*)x)[1];
        const int2 v0 = iq4nl_nibs(r.v[0]), v1 = iq4nl_nibs(r.v[1]), v2 = iq4nl_nibs(r.v[2]), v3 = iq4nl_nibs(r.v[3]);
        int sumi = rf_dp4a(v0.x, xl.x, 0);
        sumi = rf_dp4a(v1.x, xl.y, sumi);
        sumi = rf_dp4a(v2.x, xl.z, sumi);
        sumi = rf_dp4a(v3.x, xl.w, sumi);
        sumi = rf_dp4a(v0.y, xh.x, sumi);
        sumi = rf_dp4a(v1.y, xh.y, sumi);
        sumi = rf_dp4a(v2.y, xh.z, sumi);
        sumi = rf_dp4a(v3.y, xh.w, sumi);
        return r.d * ds[0].x * (float)sumi;
    }
};

// IQ4_XS: IQ4_NL's levels in 256-value blocks with a 6-bit scale (minus 32) per 32 values;
// 8 parts per block, part ib is sub-block ib: quant bytes 16 ib .. +15, low nibbles its values
// 0..15, high nibbles 16..31. Three 8-byte loads a part (the block's header: d, scales_h and
// scales_l; then the 16 quant bytes; blocks are 8-byte aligned), where 16 parts of 8 quant
// bytes with the scale bytes loaded one by one gave 0.78x ggml-cuda's 8B-shaped generation.
#if RF_ALL || RF_T_iq4_xs
struct mq_iq4_xs {
    enum { QK = 256, BYTES = 136, NSUB = 8 };
    struct R {
        int2 h;  // d | scales_h << 16, scales_l[4]
        int2 v0, v1;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.h = *(const int2*)b;
        r.v0 = *(const int2*)(b + 8 + 16 * s);
        r.v1 = *(const int2*)(b + 16 + 16 * s);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int ib, const int* x, const float2* ds) {
        const int* xl = x + 8 * ib;
        const int v[4] = {r.v0.x, r.v0.y, r.v1.x, r.v1.y};
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int2 t = iq4nl_nibs(v[i]);
            sumi = rf_dp4a(t.x, xl[i], sumi);
            sumi = rf_dp4a(t.y, xl[4 + i], sumi);
        }
        const int ls = (((unsigned)r.h.y >> (4 * ib)) & 15) | ((((unsigned)r.h.x >> (16 + 2 * ib)) & 3) << 4);
        // The block's activation scale is the same in all its ds entries (Q8_K).
        return rf_f16_to_f32((f16_bits)(r.h.x & 0xffff)) * ds[0].x * (float)((ls - 32) * sumi);
    }
};
#endif

// MXFP4: IQ4_NL's layout behind a one-byte E8M0 scale (17-byte blocks: byte alignment only),
// nibbles index the doubled E2M1 levels; the scale 2^(e - 128) carries the halving.
#if RF_ALL || RF_T_mxfp4 || RF_T_nvfp4
// MXFP4's (and NVFP4's) doubled E2M1 levels {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12} for
// all eight nibbles of a word.
RF_DEVICE int2 mxfp4_nibs(int w) { return rf_lut16_nibs(w, 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu); }
#endif
#if RF_ALL || RF_T_mxfp4
struct mq_mxfp4 {
    enum { QK = 32, BYTES = 17, NSUB = 1 };
    struct R {
        float d;
        int v[4];
    };
    // The block through the 5 aligned words holding it (never past the word of its last byte).
    MQ_MEMBER R load(const unsigned char* b, int) {
        R r;
        const unsigned off = (unsigned)(unsigned long long)b & 3;
        const unsigned* a = (const unsigned*)(b - off);
        unsigned w[5];
#pragma unroll
        for (int i = 0; i < 5; i++) w[i] = a[i];
        r.d = rf_e8m0_half((int)((w[0] >> (8 * off)) & 255));
        const unsigned sh = 8 * (off + 1);
#pragma unroll
        for (int i = 0; i < 4; i++) r.v[i] = (int)(unsigned)((((unsigned long long)w[i + 1] << 32) | w[i]) >> sh);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int, const int* x, const float2* ds) {
        const int4 xl = ((const int4*)x)[0], xh = ((const int4*)x)[1];
        const int2 v0 = mxfp4_nibs(r.v[0]), v1 = mxfp4_nibs(r.v[1]), v2 = mxfp4_nibs(r.v[2]), v3 = mxfp4_nibs(r.v[3]);
        int sumi = rf_dp4a(v0.x, xl.x, 0);
        sumi = rf_dp4a(v1.x, xl.y, sumi);
        sumi = rf_dp4a(v2.x, xl.z, sumi);
        sumi = rf_dp4a(v3.x, xl.w, sumi);
        sumi = rf_dp4a(v0.y, xh.x, sumi);
        sumi = rf_dp4a(v1.y, xh.y, sumi);
        sumi = rf_dp4a(v2.y, xh.z, sumi);
        sumi = rf_dp4a(v3.y, xh.w, sumi);
        return r.d * ds[0].x * (float)sumi;
    }
};
#endif

// TQ2_0: 2-bit codes minus 1; 16 parts a block, part s takes quant bytes 4s .. 4s + 3, which
// hold values 128 (s / 8) + 32 l + 4 (s % 8) .. +3 in their bit pairs l = 0..3. The minus one
// is the activations' sum taken away.
#if RF_ALL || RF_T_tq2_0
struct mq_tq2_0 {
    enum { QK = 256, BYTES = 66, NSUB = 16 };
    struct R {
        float d;
        int v;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b + 64);
        r.v = ld_i32_a2(b + 4 * s);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 32 * (s >> 3) + (s & 7);
        int sumi = 0, sumx = 0;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            sumi = rf_dp4a((r.v >> (2 * l)) & 0x03030303, xs[8 * l], sumi);
            sumx = rf_dp4a(0x01010101, xs[8 * l], sumx);
        }
        return r.d * ds[0].x * (float)(sumi - sumx);
    }
};
#endif

// TQ1_0: trits minus 1, 5 to a byte of qs, 4 to a byte of qh; 13 parts a block of 4 bytes each:
// parts 0..7 bytes 4s.. of qs[0..32) (trit n: values 32n + 4s..), parts 8..11 bytes of
// qs[32..48) (values 160 + 16n + 4(s - 8)..), part 12 qh (values 240 + 4n..).
#if RF_ALL || RF_T_tq1_0
struct mq_tq1_0 {
    enum { QK = 256, BYTES = 54, NSUB = 13 };
    struct R {
        float d;
        int v;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b + 52);
        r.v = ld_i32_a2(b + 4 * s);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        int sumi = 0, sumx = 0;
#pragma unroll
        for (int n = 0; n < 5; n++) {
            if (s == 12 && n == 4) break;
            const int xi = s < 8 ? 8 * n + s : s < 12 ? 40 + 4 * n + (s - 8) : 60 + n;
            int q = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) q |= rf_trit((r.v >> (8 * i)) & 255, n) << (8 * i);
            sumi = rf_dp4a(q, x[xi], sumi);
            sumx = rf_dp4a(0x01010101, x[xi], sumx);
        }
        return r.d * ds[0].x * (float)(sumi - sumx);
    }
};
#endif

// The grid i-quants: a part is a sub-block of 32 values (4 groups of 8), each group a grid
// entry of 8 unsigned magnitudes (or two of 4) and 8 sign bits, multiplied by the activations'
// 8 bytes in two dp4a; then the sub-block's integer scale(s) and, as ggml-cpu, the format's
// constant factor on the float result.
// 0xff in byte i where bit i (i < 4) of `bits` is set, else 0.
RF_DEVICE int rf_sign_mask(int bits) { return (int)((((unsigned)bits * 0x00204081u) & 0x01010101u) * 0xffu); }
// The 4 magnitude bytes of g negated where m has 0xff: (g ^ 0xff) + 1 per byte, which never
// carries as no grid magnitude is 0.
RF_DEVICE int rf_signed4(int g, int m) { return (g ^ m) + (m & 0x01010101); }
// One group of 8: magnitudes lo (values 0..3) and hi (4..7), sign byte sb, activations xs[0..1].
RF_DEVICE int rf_grid_dot8(int lo, int hi, int sb, const int* xs, int acc) {
    acc = rf_dp4a(rf_signed4(lo, rf_sign_mask(sb & 15)), xs[0], acc);
    return rf_dp4a(rf_signed4(hi, rf_sign_mask(sb >> 4)), xs[1], acc);
}

#if RF_ALL || RF_T_iq2_xxs
struct mq_iq2_xxs {
    enum { QK = 256, BYTES = 66, NSUB = 8 };
    struct R {
        float d;
        unsigned idx, aux;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.idx = (unsigned)ld_i32_a2(b + 2 + 8 * s);
        r.aux = (unsigned)ld_i32_a2(b + 6 + 8 * s);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        int sumi = 0;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const unsigned long long g = rf_iq2xxs_grid[(r.idx >> (8 * l)) & 255];
            sumi = rf_grid_dot8((int)(unsigned)g, (int)(unsigned)(g >> 32), rf_ksigns((r.aux >> (7 * l)) & 127), xs + 2 * l, sumi);
        }
        return r.d * ds[0].x * (float)((2 * (int)(r.aux >> 28) + 1) * sumi) * 0.125f;
    }
};
#endif

#if RF_ALL || RF_T_iq2_xs
struct mq_iq2_xs {
    enum { QK = 256, BYTES = 74, NSUB = 8 };
    struct R {
        float d;
        int w0, w1, sc;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.w0 = ld_i32_a2(b + 2 + 8 * s);
        r.w1 = ld_i32_a2(b + 6 + 8 * s);
        r.sc = b[66 + s];
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        int sum[2] = {0, 0};
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const int q = ((l < 2 ? r.w0 : r.w1) >> (16 * (l % 2))) & 0xffff;
            const unsigned long long g = rf_iq2xs_grid[q & 511];
            sum[l / 2] = rf_grid_dot8((int)(unsigned)g, (int)(unsigned)(g >> 32), rf_ksigns(q >> 9), xs + 2 * l, sum[l / 2]);
        }
        const int isum = (2 * (r.sc & 15) + 1) * sum[0] + (2 * (r.sc >> 4) + 1) * sum[1];
        return r.d * ds[0].x * (float)isum * 0.125f;
    }
};
#endif

#if RF_ALL || RF_T_iq2_s
struct mq_iq2_s {
    enum { QK = 256, BYTES = 82, NSUB = 8 };
    struct R {
        float d;
        int qs, signs, qh, sc;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.qs = ld_i32_a2(b + 2 + 4 * s);
        r.signs = ld_i32_a2(b + 34 + 4 * s);
        r.qh = b[66 + s];
        r.sc = b[74 + s];
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        int sum[2] = {0, 0};
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const int idx = ((r.qs >> (8 * l)) & 255) | ((r.qh << (8 - 2 * l)) & 0x300);
            const unsigned long long g = rf_iq2s_grid[idx];
            sum[l / 2] = rf_grid_dot8((int)(unsigned)g, (int)(unsigned)(g >> 32), (r.signs >> (8 * l)) & 255, xs + 2 * l, sum[l / 2]);
        }
        const int isum = (2 * (r.sc & 15) + 1) * sum[0] + (2 * (r.sc >> 4) + 1) * sum[1];
        return r.d * ds[0].x * (float)isum * 0.125f;
    }
};
#endif

#if RF_ALL || RF_T_iq3_xxs
struct mq_iq3_xxs {
    enum { QK = 256, BYTES = 98, NSUB = 8 };
    struct R {
        float d;
        int q0, q1;
        unsigned aux;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.q0 = ld_i32_a2(b + 2 + 8 * s);
        r.q1 = ld_i32_a2(b + 6 + 8 * s);
        r.aux = (unsigned)ld_i32_a2(b + 66 + 4 * s);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        int sumi = 0;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const int q = l < 2 ? r.q0 : r.q1;
            const int lo = (int)rf_iq3xxs_grid[(q >> (16 * (l % 2))) & 255];
            const int hi = (int)rf_iq3xxs_grid[(q >> (16 * (l % 2) + 8)) & 255];
            sumi = rf_grid_dot8(lo, hi, rf_ksigns((r.aux >> (7 * l)) & 127), xs + 2 * l, sumi);
        }
        return r.d * ds[0].x * (float)((2 * (int)(r.aux >> 28) + 1) * sumi) * 0.25f;
    }
};
#endif

#if RF_ALL || RF_T_iq3_s
struct mq_iq3_s {
    enum { QK = 256, BYTES = 110, NSUB = 8 };
    struct R {
        float d;
        int q0, q1, signs, qh, sc;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.q0 = ld_i32_a2(b + 2 + 8 * s);
        r.q1 = ld_i32_a2(b + 6 + 8 * s);
        r.qh = b[66 + s];
        r.signs = ld_i32_a2(b + 74 + 4 * s);
        r.sc = (b[106 + s / 2] >> (4 * (s % 2))) & 15;
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        int sumi = 0;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const int q = l < 2 ? r.q0 : r.q1;
            const int i0 = ((q >> (16 * (l % 2))) & 255) | ((r.qh << (8 - 2 * l)) & 256);
            const int i1 = ((q >> (16 * (l % 2) + 8)) & 255) | ((r.qh << (7 - 2 * l)) & 256);
            sumi = rf_grid_dot8((int)rf_iq3s_grid[i0], (int)rf_iq3s_grid[i1], (r.signs >> (8 * l)) & 255, xs + 2 * l, sumi);
        }
        return r.d * ds[0].x * (float)((2 * r.sc + 1) * sumi);
    }
};
#endif

// IQ1_S / IQ1_M: grid entries of 8 values in {-1, 0, 1} (signed bytes, used as they are),
// plus a shift of +-1/8 per sub-block (IQ1_S) or group (IQ1_M) times the activations' sum.
#if RF_ALL || RF_T_iq1_s
struct mq_iq1_s {
    enum { QK = 256, BYTES = 50, NSUB = 8 };
    struct R {
        float d;
        int qs, qh;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.qs = ld_i32_a2(b + 2 + 4 * s);
        r.qh = b[34 + 2 * s] | (b[35 + 2 * s] << 8);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        int sumi = 0, sumx = 0;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const unsigned long long g = rf_iq1s_grid[((r.qs >> (8 * l)) & 255) | (((r.qh >> (3 * l)) & 7) << 8)];
            sumi = rf_dp4a((int)(unsigned)g, xs[2 * l], sumi);
            sumi = rf_dp4a((int)(unsigned)(g >> 32), xs[2 * l + 1], sumi);
            sumx = rf_dp4a(0x01010101, xs[2 * l], rf_dp4a(0x01010101, xs[2 * l + 1], sumx));
        }
        const int ls = 2 * ((r.qh >> 12) & 7) + 1, delta = r.qh & 0x8000 ? -1 : 1;
        return r.d * ds[0].x * ((float)(ls * sumi) + RF_IQ1_DELTA * (float)(ls * delta * sumx));
    }
};
#endif

#if RF_ALL || RF_T_iq1_m
struct mq_iq1_m {
    enum { QK = 256, BYTES = 56, NSUB = 8 };
    struct R {
        float d;
        int qs, qh, sc;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = rf_iq1m_d(b);
        r.qs = ld_i32_a2(b + 4 * s);
        r.qh = b[32 + 2 * s] | (b[33 + 2 * s] << 8);
        r.sc = b[48 + 2 * (s / 2)] | (b[49 + 2 * (s / 2)] << 8);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        int sum1[2] = {0, 0}, sum2[2] = {0, 0};
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const int qh = (r.qh >> (8 * (l / 2))) & 255;
            const unsigned long long g = rf_iq1s_grid[((r.qs >> (8 * l)) & 255) | ((qh << (8 - 4 * (l % 2))) & 0x700)];
            sum1[l / 2] = rf_dp4a((int)(unsigned)g, xs[2 * l], sum1[l / 2]);
            sum1[l / 2] = rf_dp4a((int)(unsigned)(g >> 32), xs[2 * l + 1], sum1[l / 2]);
            const int sx = rf_dp4a(0x01010101, xs[2 * l], rf_dp4a(0x01010101, xs[2 * l + 1], 0));
            sum2[l / 2] += qh & (0x08 << (4 * (l % 2))) ? -sx : sx;
        }
        const int ls1 = 2 * ((r.sc >> (6 * (s % 2))) & 7) + 1, ls2 = 2 * ((r.sc >> (6 * (s % 2) + 3)) & 7) + 1;
        return r.d * ds[0].x *
               ((float)(sum1[0] * ls1 + sum1[1] * ls2) + RF_IQ1_DELTA * (float)(sum2[0] * ls1 + sum2[1] * ls2));
    }
};
#endif

// Q4_K: 16 parts per 256-value block; part s = 4c + p takes quant bytes 32c + 8p .. +7:
// low nibbles are values 64c + 8p.. of sub-block 2c, high nibbles values 64c + 32 + 8p.. of
// sub-block 2c + 1. Each sub-block has a 6-bit scale and min (12 packed bytes).
struct mq_q4_k {
    enum { QK = 256, BYTES = 144, NSUB = 16 };
    struct R {
        float d, dmin;
        int sc_lo, m_lo, sc_hi, m_hi;
        int v0, v1;
    };
    // Scale and min of sub-block j from the 12 packed bytes, held as three words (a run-time
    // index into a byte array would put it in local memory).
    MQ_MEMBER void scale_min(int w0, int w1, int w2, int j, int& s, int& m) {
        const int k = 8 * (j & 3);
        const int b0 = (w0 >> k) & 255, b1 = (w1 >> k) & 255, b2 = (w2 >> k) & 255;
        if (j < 4) {
            s = b0 & 63;
            m = b1 & 63;
        } else {
            s = (b2 & 15) | ((b0 >> 6) << 4);
            m = (b2 >> 4) | ((b1 >> 6) << 4);
        }
    }
    // d, dmin and the scales and mins of part s's two sub-blocks (Q5_K's are laid out alike).
    MQ_MEMBER void load_scales(const unsigned char* b, int s, R& r) {
        const int c = s >> 2;
        r.d = ld_f16_a2(b);
        r.dmin = ld_f16_a2(b + 2);
        const int w0 = ld_i32_a4(b + 4), w1 = ld_i32_a4(b + 8), w2 = ld_i32_a4(b + 12);
        scale_min(w0, w1, w2, 2 * c, r.sc_lo, r.m_lo);
        scale_min(w0, w1, w2, 2 * c + 1, r.sc_hi, r.m_hi);
    }
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        const int c = s >> 2, p = s & 3;
        load_scales(b, s, r);
        r.v0 = ld_i32_a4(b + 16 + 32 * c + 8 * p);
        r.v1 = ld_i32_a4(b + 20 + 32 * c + 8 * p);
        return r;
    }
    // Part s's dot from its values as bytes: l0, l1 of sub-block 2c, h0, h1 of 2c + 1 (Q5_K
    // passes its 5-bit values).
    MQ_MEMBER float dot_values(const R& r, int l0, int l1, int h0, int h1, int s, const int* x, const float2* ds) {
        const int c = s >> 2, p = s & 3;
        const int2 xl = ((const int2*)x)[8 * c + p], xh = ((const int2*)x)[8 * c + 4 + p];
        const int ones = 0x01010101;
        const int sl = rf_dp4a(l1, xl.y, rf_dp4a(l0, xl.x, 0));
        const int sh = rf_dp4a(h1, xh.y, rf_dp4a(h0, xh.x, 0));
        const int xl_sum = rf_dp4a(ones, xl.y, rf_dp4a(ones, xl.x, 0));
        const int xh_sum = rf_dp4a(ones, xh.y, rf_dp4a(ones, xh.x, 0));
        const float dl = ds[2 * c].x, dh = ds[2 * c + 1].x;
        return r.d * (dl * (float)(r.sc_lo * sl) + dh * (float)(r.sc_hi * sh)) -
               r.dmin * (dl * (float)(r.m_lo * xl_sum) + dh * (float)(r.m_hi * xh_sum));
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        return dot_values(r, NIB_LO(r.v0), NIB_LO(r.v1), NIB_HI(r.v0), NIB_HI(r.v1), s, x, ds);
    }
};

// Q5_K: Q4_K's parts, scales and mins with a fifth bit per value from qh[32]: bit 2c of qh[l]
// for value 64c + l, bit 2c + 1 for value 64c + 32 + l, so part s = 4c + p takes qh bytes
// 8p .. +7 beside its quant bytes (at 48 + 32c + 8p). Values 0..31, d * sc * q - dmin * m.
// (Before it Q5_K went through the float matrix-vector kernel: an 8B-shaped IQ4_XS mix's Q5_K
// ffn_down took 290 us a token on an H100 against 26 us for its IQ4_XS ones.)
#if RF_ALL || RF_T_q5_k
struct mq_q5_k {
    enum { QK = 256, BYTES = 176, NSUB = 16 };
    struct R {
        mq_q4_k::R k;  // scales, mins and the low 4 bits (v0, v1)
        int h0, h1;    // qh bytes 8p .. +7
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        const int c = s >> 2, p = s & 3;
        mq_q4_k::load_scales(b, s, r.k);
        r.h0 = ld_i32_a4(b + 16 + 8 * p);
        r.h1 = ld_i32_a4(b + 20 + 8 * p);
        r.k.v0 = ld_i32_a4(b + 48 + 32 * c + 8 * p);
        r.k.v1 = ld_i32_a4(b + 52 + 32 * c + 8 * p);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int c = s >> 2;
        // The fifth bits of the low (sub-block 2c) and high (2c + 1) values, moved to bit 4.
        const int l0 = NIB_LO(r.k.v0) | ((((unsigned)r.h0 >> (2 * c)) & 0x01010101u) << 4);
        const int l1 = NIB_LO(r.k.v1) | ((((unsigned)r.h1 >> (2 * c)) & 0x01010101u) << 4);
        const int h0 = NIB_HI(r.k.v0) | ((((unsigned)r.h0 >> (2 * c + 1)) & 0x01010101u) << 4);
        const int h1 = NIB_HI(r.k.v1) | ((((unsigned)r.h1 >> (2 * c + 1)) & 0x01010101u) << 4);
        return mq_q4_k::dot_values(r.k, l0, l1, h0, h1, s, x, ds);
    }
};
#endif

// Q2_K and Q3_K: 16 parts per 256-value block: part s takes, in half n = s / 8
// (128 values), bytes l0 = 4 (s % 8) .. +3 of the half's 32 quant bytes, whose 2-bit fields j
// = 0..3 are values 128n + 32j + l0 ..; each 16 values have a scale (sub-block 8n + 2j +
// l0 / 16). Integer sums times the scales are summed as integers, then scaled once, as
// ggml-cpu does. (Both went through the float matrix-vector kernel before.)
// Q2_K (84 bytes): scales[16] (4-bit scale, 4-bit min), qs[64], d, dmin; d sc q - dmin m.
#if RF_ALL || RF_T_q2_k
struct mq_q2_k {
    enum { QK = 256, BYTES = 84, NSUB = 16 };
    struct R {
        float d, dmin;
        int q;
        int sc[4];
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        const int n = s >> 3, l0 = 4 * (s & 7);
        r.q = ld_i32_a4(b + 16 + 32 * n + l0);
#pragma unroll
        for (int j = 0; j < 4; j++) r.sc[j] = b[8 * n + 2 * j + (l0 >> 4)];
        r.d = ld_f16_a2(b + 80);
        r.dmin = ld_f16_a2(b + 82);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int n = s >> 3, l0 = 4 * (s & 7);
        int isum = 0, msum = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int xj = x[32 * n + 8 * j + (l0 >> 2)];
            isum += (r.sc[j] & 15) * rf_dp4a(((unsigned)r.q >> (2 * j)) & 0x03030303u, xj, 0);
            msum += (r.sc[j] >> 4) * rf_dp4a(0x01010101, xj, 0);
        }
        return ds[0].x * (r.d * (float)isum - r.dmin * (float)msum);
    }
};
#endif
// Q3_K (110 bytes, 2-byte aligned): hmask[32] (bit 4n + j of byte l: the third bit of value
// 128n + 32j + l, set = no minus 4), qs[64], scales[12] (16 6-bit scales minus 32: low 4 bits
// in bytes 0..7, low then high nibbles; high 2 bits in bytes 8..11), d.
#if RF_ALL || RF_T_q3_k
struct mq_q3_k {
    enum { QK = 256, BYTES = 110, NSUB = 16 };
    struct R {
        float d;
        int q, h;
        int sc[4];
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        const int n = s >> 3, l0 = 4 * (s & 7);
        r.h = ld_i32_a2(b + l0);
        r.q = ld_i32_a2(b + 32 + 32 * n + l0);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int t = 8 * n + 2 * j + (l0 >> 4);
            r.sc[j] = ((b[96 + (t & 7)] >> (4 * (t >> 3))) & 15) | (((b[104 + (t & 3)] >> (2 * (t >> 2))) & 3) << 4);
        }
        r.d = ld_f16_a2(b + 108);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int n = s >> 3, l0 = 4 * (s & 7);
        int isum = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned v = (((unsigned)r.q >> (2 * j)) & 0x03030303u) |
                               ((((unsigned)r.h >> (4 * n + j)) & 0x01010101u) << 2);
            isum += (r.sc[j] - 32) * rf_dp4a(BYTES_MINUS((int)v, 4), x[32 * n + 8 * j + (l0 >> 2)], 0);
        }
        return ds[0].x * r.d * (float)isum;
    }
};
#endif

// 8 bytes from a 2-byte aligned p as two words: aligned 4-byte loads and funnel shifts (two
// loads where p is 4-byte aligned, so no byte past p + 8 is read), instead of four 2-byte loads.
RF_DEVICE int2 ld_i64_a2(const unsigned char* p) {
    const unsigned off = (unsigned)(unsigned long long)p & 2;  // 0 or 2
    const unsigned* a = (const unsigned*)(p - off);
    const unsigned w0 = a[0], w1 = a[1], w2 = off ? a[2] : 0u;
    const unsigned sh = 8 * off;
    int2 r;
    r.x = (int)(unsigned)((((unsigned long long)w1 << 32) | w0) >> sh);
    r.y = (int)(unsigned)((((unsigned long long)w2 << 32) | w1) >> sh);
    return r;
}

// Q6_K: 8 parts per block; part s = 4n + t takes, in half n (128 values), the eight values
// l = 8t..8t+7 of each quarter q (value 128n + 32q + l): low 4 bits from ql (quarters 0, 2 in
// the low / high nibbles of bytes 64n + l, quarters 1, 3 of bytes 64n + 32 + l), high 2 bits
// from qh byte 32n + l (bits 2q, 2q + 1); one int8 scale for a quarter's eight (16-value group
// 8n + 2q + t / 2); values minus 32. Each field is 8 bytes at the block's own alignment, read
// as aligned words. (16 parts of four values a quarter, each field through 2-byte loads, read
// an 8B-shaped model's 165 MB Q6_K output head at 1.3 TB/s on an H100, its Q4_0 one at 2.5.)
struct mq_q6_k {
    enum { QK = 256, BYTES = 210, NSUB = 8 };
    struct R {
        float d;
        int2 a, b, h;
        int sc[4];
    };
    MQ_MEMBER R load(const unsigned char* bl, int s) {
        R r;
        const int n = s >> 2, l0 = 8 * (s & 3);
        r.a = ld_i64_a2(bl + 64 * n + l0);
        r.b = ld_i64_a2(bl + 64 * n + 32 + l0);
        r.h = ld_i64_a2(bl + 128 + 32 * n + l0);
        // Scales 8n .. 8n + 7; quarter q's is byte 2q + t / 2.
        const int2 sc = ld_i64_a2(bl + 192 + 8 * n);
        const int sh = 8 * ((s & 3) >> 1);
        r.sc[0] = (signed char)(sc.x >> sh);
        r.sc[1] = (signed char)(sc.x >> (16 + sh));
        r.sc[2] = (signed char)(sc.y >> sh);
        r.sc[3] = (signed char)(sc.y >> (16 + sh));
        r.d = ld_f16_a2(bl + 208);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        // As ggml-cpu: integer sums times the int8 scales, summed as integers, then one
        // multiply by (activation scale * weight scale); the 256-value block's activation
        // scale is the same in all its ds entries.
        const int n = s >> 2, l0 = 8 * (s & 3);
        int isum = 0;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int2 v = q & 1 ? r.b : r.a;
            const int sl = 4 * (q >> 1);
            const int v0 = ((v.x >> sl) & 0x0f0f0f0f) | (((r.h.x >> (2 * q)) & 0x03030303) << 4);
            const int v1 = ((v.y >> sl) & 0x0f0f0f0f) | (((r.h.y >> (2 * q)) & 0x03030303) << 4);
            const int2 xv = *(const int2*)(x + 32 * n + 8 * q + (l0 >> 2));
            isum += r.sc[q] * rf_dp4a(BYTES_MINUS(v1, 32), xv.y, rf_dp4a(BYTES_MINUS(v0, 32), xv.x, 0));
        }
        return ds[0].x * r.d * (float)isum;
    }
};

// NVFP4: 2 parts a block, part s is sub-blocks 2s and 2s + 1 (32 values, UE4M3 scale bytes 2s
// and 2s + 1) against Q8_0 block s: bytes 4 + 16s .. +15, each sub-block's 8 bytes holding its
// values 0..7 in the low nibbles and 8..15 in the high ones. (A part per 16-value sub-block
// gave 0.88x ggml-cuda's 8B tg64 on an H100: twice the parts, each with little work.)
#if RF_ALL || RF_T_nvfp4
struct mq_nvfp4 {
    enum { QK = 64, BYTES = 36, NSUB = 2 };
    struct R {
        float d0, d1;
        int v[4];
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d0 = rf_ue4m3_half(b[2 * s]);
        r.d1 = rf_ue4m3_half(b[2 * s + 1]);
#pragma unroll
        for (int i = 0; i < 4; i++) r.v[i] = ld_i32_a4(b + 4 + 16 * s + 4 * i);
        return r;
    }
    MQ_MEMBER int dot16(int v0, int v1, const int* xs) {
        const int2 a = mxfp4_nibs(v0), b = mxfp4_nibs(v1);
        int sumi = rf_dp4a(a.x, xs[0], 0);
        sumi = rf_dp4a(b.x, xs[1], sumi);
        sumi = rf_dp4a(a.y, xs[2], sumi);
        return rf_dp4a(b.y, xs[3], sumi);
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        const int s0 = dot16(r.v[0], r.v[1], xs), s1 = dot16(r.v[2], r.v[3], xs + 4);
        return ds[s].x * (r.d0 * (float)s0 + r.d1 * (float)s1);
    }
};
#endif

// Q1_0: 4 parts a block, part s takes the 32 sign bits of bytes 2 + 4s .. +3 against Q8_0
// block s; 4 bits become 4 bytes of +1 / -1 (0x01 / 0xff).
#if RF_ALL || RF_T_q1_0
struct mq_q1_0 {
    enum { QK = 128, BYTES = 18, NSUB = 4 };
    struct R {
        float d;
        unsigned bits;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.bits = (unsigned)ld_i32_a2(b + 2 + 4 * s);
        return r;
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            // Bit i of the nibble to bit 0 of byte i (no carries: the shifted copies never overlap).
            const unsigned b01 = (((r.bits >> (4 * i)) & 15u) * 0x00204081u) & 0x01010101u;
            sumi = rf_dp4a((int)~(b01 * 0xfeu), xs[i], sumi);
        }
        return r.d * ds[s].x * (float)sumi;
    }
};
#endif

// Q2_0: 2 parts a block, part s takes bytes 2 + 8s .. +7 against Q8_0 block s. Byte b holds
// values 4b .. 4b + 3 in its bit pairs: the pairs are spread to bytes (codes 0..3) and put in
// value order by a 4x4 byte transpose (byte permutes), then the codes minus 1.
#if RF_ALL || RF_T_q2_0
struct mq_q2_0 {
    enum { QK = 64, BYTES = 18, NSUB = 2 };
    struct R {
        float d;
        int v0, v1;
    };
    MQ_MEMBER R load(const unsigned char* b, int s) {
        R r;
        r.d = ld_f16_a2(b);
        r.v0 = ld_i32_a2(b + 2 + 8 * s);
        r.v1 = ld_i32_a2(b + 6 + 8 * s);
        return r;
    }
    // Values 16 h .. 16 h + 15 of the part (the 4 bytes v) against xs[0..3].
    MQ_MEMBER int dot16(int v, const int* xs, int acc) {
        const unsigned t0 = v & 0x03030303, t1 = (v >> 2) & 0x03030303;
        const unsigned t2 = (v >> 4) & 0x03030303, t3 = (v >> 6) & 0x03030303;
        const unsigned a = rf_perm8(t0, t1, 0x05010400u), b = rf_perm8(t0, t1, 0x07030602u);
        const unsigned c = rf_perm8(t2, t3, 0x05010400u), d = rf_perm8(t2, t3, 0x07030602u);
        acc = rf_dp4a(BYTES_MINUS((int)rf_perm8(a, c, 0x05040100u), 1), xs[0], acc);
        acc = rf_dp4a(BYTES_MINUS((int)rf_perm8(a, c, 0x07060302u), 1), xs[1], acc);
        acc = rf_dp4a(BYTES_MINUS((int)rf_perm8(b, d, 0x05040100u), 1), xs[2], acc);
        return rf_dp4a(BYTES_MINUS((int)rf_perm8(b, d, 0x07060302u), 1), xs[3], acc);
    }
    MQ_MEMBER float dot(const R& r, int s, const int* x, const float2* ds) {
        const int* xs = x + 8 * s;
        const int sumi = dot16(r.v1, xs + 4, dot16(r.v0, xs, 0));
        return r.d * ds[s].x * (float)sumi;
    }
};
#endif

// A lane's share of the dots of weight row wr with COLS quantized columns (xr, dr), the first
// ncols of them used: the lane takes whole parts of the row, MVQ_UNROLL of them loaded before any is
// used (bytes in flight), so the warp reads the row once for all columns. Not yet summed over the warp.
template <typename T, int COLS>
RF_DEVICE void mvq_row_dots(const unsigned char* wr, const signed char* const* xr, const float2* const* dr, int ncols,
                            i64 K, int lane, float* acc) {
    const i64 nparts = K / T::QK * T::NSUB;
    for (i64 base = lane; base < nparts; base += MVQ_UNROLL * RF_WARP_SIZE) {
        typename T::R r[MVQ_UNROLL];
#pragma unroll
        for (int u = 0; u < MVQ_UNROLL; u++) {
            const i64 it = base + u * RF_WARP_SIZE;
            if (it < nparts) r[u] = T::load(wr + it / T::NSUB * T::BYTES, (int)(it % T::NSUB));
        }
#pragma unroll
        for (int u = 0; u < MVQ_UNROLL; u++) {
            const i64 it = base + u * RF_WARP_SIZE;
            if (it >= nparts) break;
            const i64 blk = it / T::NSUB;
            const int s = (int)(it % T::NSUB);
#pragma unroll
            for (int c = 0; c < COLS; c++) {
                if (c < ncols) acc[c] += T::dot(r[u], s, (const int*)(xr[c] + blk * T::QK), dr[c] + blk * (T::QK / 32));
            }
        }
    }
}

template <typename T>
RF_DEVICE void mul_mat_vec_q(const char* w, const signed char* xq, const float2* xds, char* d, i64 K, i64 M, i64 N,
                             i64 ne12, i64 r2, i64 r3, i64 nb01, i64 nb02, i64 nb03, i64 nb1, i64 nb2, i64 nb3) {
    const int lane = threadIdx.x % RF_WARP_SIZE;
    const i64 row = (i64)blockIdx.x * MVQ_ROWS + threadIdx.x / RF_WARP_SIZE;
    if (row >= M) return;  // whole warp leaves together
    const i64 col0 = (i64)blockIdx.y * MVQ_COLS;
    const i64 b = blockIdx.z, i2 = b % ne12, i3 = b / ne12;
    const unsigned char* wr = (const unsigned char*)w + row * nb01 + (i2 / r2) * nb02 + (i3 / r3) * nb03;
    const int ncols = (int)(N - col0 < MVQ_COLS ? N - col0 : MVQ_COLS);
    const signed char* xr[MVQ_COLS];
    const float2* dr[MVQ_COLS];
#pragma unroll
    for (int c = 0; c < MVQ_COLS; c++) {
        const i64 xrow = col0 + (c < ncols ? c : 0) + N * b;
        xr[c] = xq + xrow * K;
        dr[c] = xds + xrow * (K / 32);
    }
    float acc[MVQ_COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
    mvq_row_dots<T, MVQ_COLS>(wr, xr, dr, ncols, K, lane, acc);
    char* db = d + i2 * nb2 + i3 * nb3 + row * 4;
#pragma unroll
    for (int c = 0; c < MVQ_COLS; c++) {
        const float s = rf_warp_sum(acc[c]);
        if (lane == 0 && c < ncols) *(float*)(db + (col0 + c) * nb1) = s;
    }
}

// One src1 column (token generation): a block of MV1_WARPS warps computes MV1_ROWS rows,
// its threads splitting the row's parts between them (short rows still give every SM many
// warps) and sharing each activation load between the rows; MV1_UNROLL parts per thread
// and row are loaded before any is used (bytes in flight). The warps' sums meet in shared
// memory. Grid: (rows / MV1_ROWS, 1, batches).
// (The launcher picks the warps per block: MV1_WARPS of src/gpu/ops/matmul.rs, at most MV1_MAX_THREADS threads.)
// mul_mat_vec_q1s_*: the same with 8 rows per block and one warp, for short rows of tall
// matrices (a vocabulary projection of 576-value rows: 18 blocks a row leave most threads of
// a wider block idle, and the grid is many waves deep). On 576 x 576 it is slower (9.0 against
// 5.6 µs in the stream on an H100): too few blocks.
#define MV1_MAX_THREADS 256
#define MV1_ROWS_DEF 2
#define MV1_UNROLL_DEF 4
#define MV1S_ROWS 8
// Rows row0 + r * rstride (r < MV1_ROWS) of the weight rows at wb (stride nb01, M rows) times
// one quantized column (xr, dr); called by all threads of the block. Thread r < MV1_ROWS
// returns row r's dot (others 0).
template <typename T, int MV1_ROWS, int MV1_UNROLL>
RF_DEVICE float mv1_dots(const unsigned char* wb, i64 nb01, i64 M, i64 row0, i64 rstride, const signed char* xr,
                         const float2* dr, i64 K) {
    __shared__ float part[RF_MAX_WARPS][MV1_ROWS];
    const int lane = threadIdx.x % RF_WARP_SIZE, warp = threadIdx.x / RF_WARP_SIZE;
    const int nwarps = blockDim.x / RF_WARP_SIZE;
    const unsigned char* wr[MV1_ROWS];
#pragma unroll
    for (int r = 0; r < MV1_ROWS; r++) wr[r] = wb + (row0 + r * rstride < M ? row0 + r * rstride : M - 1) * nb01;
    float acc[MV1_ROWS];
#pragma unroll
    for (int r = 0; r < MV1_ROWS; r++) acc[r] = 0.0f;
    const int nparts = (int)(K / T::QK * T::NSUB);
    const int nthreads = blockDim.x;
    for (int base = threadIdx.x; base < nparts; base += MV1_UNROLL * nthreads) {
        typename T::R q[MV1_UNROLL][MV1_ROWS];
#pragma unroll
        for (int u = 0; u < MV1_UNROLL; u++) {
            const int it = base + u * nthreads;
            if (it < nparts) {
#pragma unroll
                for (int r = 0; r < MV1_ROWS; r++) q[u][r] = T::load(wr[r] + (it / T::NSUB) * T::BYTES, it % T::NSUB);
            }
        }
#pragma unroll
        for (int u = 0; u < MV1_UNROLL; u++) {
            const int it = base + u * nthreads;
            if (it < nparts) {
                const int blk = it / T::NSUB, s = it % T::NSUB;
                const int* xb = (const int*)(xr + (i64)blk * T::QK);
                const float2* db = dr + (i64)blk * (T::QK / 32);
#pragma unroll
                for (int r = 0; r < MV1_ROWS; r++) acc[r] += T::dot(q[u][r], s, xb, db);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MV1_ROWS; r++) {
        const float v = rf_warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = v;
    }
    __syncthreads();
    float v = 0.0f;
    if (threadIdx.x < MV1_ROWS) {
        for (int k = 0; k < nwarps; k++) v += part[k][threadIdx.x];
    }
    return v;
}

// The weight rows block blockIdx of the one-column kernel reads (rows blockIdx.x * ROWS on, of
// batch blockIdx.z), into L2 before its rf_grid_begin(): arithmetic on the arguments only.
RF_DEVICE void mv1_prefetch_l2(const char* w, i64 M, i64 rows_per_block, i64 ne12, i64 r2, i64 r3, i64 nb01, i64 nb02,
                               i64 nb03) {
    const i64 b = blockIdx.z, i2 = b % ne12, i3 = b / ne12, row0 = (i64)blockIdx.x * rows_per_block;
    const i64 rows = M - row0 < rows_per_block ? M - row0 : rows_per_block;
    rf_prefetch_l2(w + (i2 / r2) * nb02 + (i3 / r3) * nb03 + row0 * nb01, rows * nb01);
}

// MV1_ROWS rows from row0 into out[row].
template <typename T, int MV1_ROWS, int MV1_UNROLL>
RF_DEVICE void mv1_rows(const unsigned char* wb, i64 nb01, i64 M, i64 row0, const signed char* xr, const float2* dr,
                        i64 K, float* out) {
    const float v = mv1_dots<T, MV1_ROWS, MV1_UNROLL>(wb, nb01, M, row0, 1, xr, dr, K);
    if (threadIdx.x < MV1_ROWS && row0 + threadIdx.x < M) out[row0 + threadIdx.x] = v;
}

template <typename T, int MV1_ROWS = MV1_ROWS_DEF, int MV1_UNROLL = MV1_UNROLL_DEF>
RF_DEVICE void mul_mat_vec_q1(const char* w, const signed char* xq, const float2* xds, char* d, i64 K, i64 M, i64 N,
                              i64 ne12, i64 r2, i64 r3, i64 nb01, i64 nb02, i64 nb03, i64 nb1, i64 nb2, i64 nb3) {
    const i64 b = blockIdx.z, i2 = b % ne12, i3 = b / ne12;
    const unsigned char* wb = (const unsigned char*)w + (i2 / r2) * nb02 + (i3 / r3) * nb03;
    mv1_rows<T, MV1_ROWS, MV1_UNROLL>(wb, nb01, M, (i64)blockIdx.x * MV1_ROWS, xq + (N * b) * K, xds + (N * b) * (K / 32), K,
                (float*)(d + i2 * nb2 + i3 * nb3));
}

// MUL_MAT_ID with integer dots (mixture-of-experts generation and prompts alike):
//   dst[:, u, t] = experts[ids[u, t]] . x[:, u % ne11, t]
// x quantized by quantize_q8 as ne11 columns of n_tok batches (row u % ne11 + ne11 t); ids I32
// [n_used, n_tok]; dst F32 [M, n_used, n_tok]. Grid (M / MV1_ROWS, n_used, n_tok).
template <typename T>
RF_DEVICE void mul_mat_id_q(const char* w, const signed char* xq, const float2* xds, const char* ids, char* d, i64 K,
                            i64 M, i64 n_as, i64 ne11, i64 nb01, i64 nb02, i64 nbi0, i64 nbi1, i64 nb1, i64 nb2) {
    enum { MV1_ROWS = MV1_ROWS_DEF };
    const i64 u = blockIdx.y, t = blockIdx.z, row0 = (i64)blockIdx.x * MV1_ROWS;
    const int e = *(const int*)(ids + u * nbi0 + t * nbi1);
    float* out = (float*)(d + u * nb1 + t * nb2);
    if (e < 0 || e >= n_as) {  // ggml-cpu aborts; a host never passes such ids
        if (threadIdx.x < MV1_ROWS && row0 + threadIdx.x < M) out[row0 + threadIdx.x] = 0.0f;
        return;  // the whole block leaves
    }
    const i64 xrow = u % ne11 + ne11 * t;
    mv1_rows<T, MV1_ROWS_DEF, MV1_UNROLL_DEF>((const unsigned char*)w + e * nb02, nb01, M, row0, xq + xrow * K, xds + xrow * (K / 32), K, out);
}

// MUL_MAT_ID for a batch of tokens (prompts): the same products as mul_mat_id_q, with the
// (slot, token) pairs grouped by expert first (mmid_sort below), so a warp takes one weight row
// of an expert for up to MMQS_COLS of that expert's pairs and reads the row once for all of
// them, where mul_mat_id_q reads it once per pair. The same integer dots per block as
// mul_mat_id_q; only the order of the float additions differs (a warp per row, as
// mul_mat_vec_q, against mul_mat_id_q's rows split over a block's warps).
// sorted (mmid_sort's output): [0] tiles; [1, 2 + n_as) start of each expert's pairs, then
// their end; [2 + n_as, + n_pairs) pair indices (u + n_used t) by expert; then per tile
// (expert, first of its pairs). Grid (M / MVQ_ROWS, most tiles there can be).
#define MMQS_COLS 8
template <typename T>
RF_DEVICE void mul_mat_id_q_sorted(const char* w, const signed char* xq, const float2* xds, const int* sorted, char* d,
                                   i64 K, i64 M, i64 n_as, i64 n_used, i64 n_pairs, i64 ne11, i64 nb01, i64 nb02, i64 nb1,
                                   i64 nb2) {
    const int lane = threadIdx.x % RF_WARP_SIZE;
    const i64 row = (i64)blockIdx.x * MVQ_ROWS + threadIdx.x / RF_WARP_SIZE;
    const int tile = blockIdx.y;
    if (row >= M || tile >= sorted[0]) return;  // whole warps leave together
    const int* table = sorted + 2 + n_as + n_pairs;
    const int e = table[2 * tile], c0 = table[2 * tile + 1];
    const int* pairs = sorted + 2 + n_as + sorted[1 + e] + c0;
    const int left = sorted[2 + e] - sorted[1 + e] - c0;
    const int ncols = left < MMQS_COLS ? left : MMQS_COLS;
    const unsigned char* wr = (const unsigned char*)w + e * nb02 + row * nb01;
    const signed char* xr[MMQS_COLS];
    const float2* dr[MMQS_COLS];
#pragma unroll
    for (int c = 0; c < MMQS_COLS; c++) {
        const int p = pairs[c < ncols ? c : 0];
        const i64 u = p % n_used, t = p / n_used, xrow = u % ne11 + ne11 * t;
        xr[c] = xq + xrow * K;
        dr[c] = xds + xrow * (K / 32);
    }
    float acc[MMQS_COLS];
#pragma unroll
    for (int c = 0; c < MMQS_COLS; c++) acc[c] = 0.0f;
    mvq_row_dots<T, MMQS_COLS>(wr, xr, dr, ncols, K, lane, acc);
#pragma unroll
    for (int c = 0; c < MMQS_COLS; c++) {
        const float s = rf_warp_sum(acc[c]);
        if (lane == 0 && c < ncols) {
            const int p = pairs[c];
            *(float*)(d + (p % n_used) * nb1 + (p / n_used) * nb2 + row * 4) = s;
        }
    }
}

// The same products on tensor cores (NVIDIA sm_80+; Q4_0, Q8_0, IQ4_NL and IQ4_XS weights): mma.sync m16n8k32
// with 8-bit inputs and 32-bit sums takes one weight block (32 values) of 16 rows against the
// same block of 8 pairs' quantized activations, giving the very integer sums the dp4a kernels
// form; each is scaled by the weight block's d and the activation block's d and added in f32,
// as ggml-cpu does. A warp takes 16 rows of an expert and MMQT_COLS pairs (mmid_sort's tiles
// of that width), a block MMQT_WARPS warps of consecutive rows. Grid (M / (16 MMQT_WARPS),
// most tiles there can be). Fragments (PTX ISA, lane = 4 g + q):
//   A 16x32 (weights): a0 row g values 4q..4q+3, a1 row g + 8 the same, a2 / a3 values 16 + 4q..;
//   B 32x8 (pairs):    b0 pair g values 4q..4q+3, b1 values 16 + 4q..;
//   C 16x8:            c0 / c1 row g pairs 2q, 2q + 1; c2 / c3 row g + 8.
#define MMQT_COLS 32
#define MMQT_WARPS 4
// Weight block words for the tensor-core kernels (mul_mat_id_mma here, mul_mat_mma in
// mul_mat_mma.hip), in two halves so that a kernel can have loads in flight while it computes:
// T::fetch(row, kb, q) only loads (no arithmetic on what it loads: a warp would wait there),
// T::unpack(raw, kb, &lo, &hi, &d) gives block kb (32 values) of the weight row as signed
// bytes, values 4q..4q+3 in lo and 16 + 4q.. in hi, and the block's float scale d (for IQ4_XS
// the super-block's d times the sub-block's 6-bit scale). T::words does both. Only formats
// whose values are symmetric (no min, no activation sum) and whose activations are Q8_0 / Q8_K.
struct mt_raw {
    int a0, a1, b0, b1, s;
};
// 2-byte aligned blocks of 32 values (Q4_0 / IQ4_NL: 18 bytes; Q8_0: 34): the f16 scale, then
// the two 16-bit halves of the word of bytes 2 + 4q.. (and of 18 + 4q.. for Q8_0).
template <int BYTES>
RF_DEVICE mt_raw mt_fetch32(const unsigned char* row, i64 kb, int q) {
    const unsigned short* h = (const unsigned short*)(row + kb * BYTES);
    mt_raw r;
    r.s = h[0];
    r.a0 = h[1 + 2 * q];
    r.a1 = h[2 + 2 * q];
    r.b0 = BYTES == 34 ? h[9 + 2 * q] : 0;
    r.b1 = BYTES == 34 ? h[10 + 2 * q] : 0;
    return r;
}
#define MT_WORDS                                                                                        \
    MQ_MEMBER void words(const unsigned char* row, i64 kb, int q, int* lo, int* hi, float* d) {         \
        unpack(fetch(row, kb, q), kb, lo, hi, d);                                                       \
    }
struct mt_q4_0 {
    MQ_MEMBER mt_raw fetch(const unsigned char* row, i64 kb, int q) { return mt_fetch32<18>(row, kb, q); }
    MQ_MEMBER void unpack(const mt_raw& r, i64, int* lo, int* hi, float* d) {
        const int w = (int)((unsigned)r.a0 | ((unsigned)r.a1 << 16));  // byte j: value j (low nibble), 16 + j (high)
        *lo = BYTES_MINUS(NIB_LO(w), 8);
        *hi = BYTES_MINUS(NIB_HI(w), 8);
        *d = rf_f16_to_f32((f16_bits)r.s);
    }
    MT_WORDS
};
struct mt_q8_0 {
    MQ_MEMBER mt_raw fetch(const unsigned char* row, i64 kb, int q) { return mt_fetch32<34>(row, kb, q); }
    MQ_MEMBER void unpack(const mt_raw& r, i64, int* lo, int* hi, float* d) {
        *lo = (int)((unsigned)r.a0 | ((unsigned)r.a1 << 16));
        *hi = (int)((unsigned)r.b0 | ((unsigned)r.b1 << 16));
        *d = rf_f16_to_f32((f16_bits)r.s);
    }
    MT_WORDS
};
struct mt_iq4_nl {
    MQ_MEMBER mt_raw fetch(const unsigned char* row, i64 kb, int q) { return mt_fetch32<18>(row, kb, q); }
    MQ_MEMBER void unpack(const mt_raw& r, i64, int* lo, int* hi, float* d) {
        const int w = (int)((unsigned)r.a0 | ((unsigned)r.a1 << 16));
        const int2 v = iq4nl_nibs(w);
        *lo = v.x;
        *hi = v.y;
        *d = rf_f16_to_f32((f16_bits)r.s);
    }
    MT_WORDS
};
// IQ4_XS: sub-block ib = kb % 8 of super-block kb / 8 (136 bytes, 4-byte aligned: d and
// scales_h in its first word, scales_l[4], then 16 quant bytes per sub-block, low nibbles its
// values 0..15, high nibbles 16..31).
struct mt_iq4_xs {
    MQ_MEMBER mt_raw fetch(const unsigned char* row, i64 kb, int q) {
        const unsigned char* b = row + (kb / 8) * 136;
        const int ib = (int)(kb % 8);
        mt_raw r;
        r.s = ld_i32_a4(b);
        r.b0 = b[4 + ib / 2];
        r.a0 = ld_i32_a4(b + 8 + 16 * ib + 4 * q);
        r.a1 = r.b1 = 0;
        return r;
    }
    MQ_MEMBER void unpack(const mt_raw& r, i64 kb, int* lo, int* hi, float* d) {
        const int ib = (int)(kb % 8);
        const int2 v = iq4nl_nibs(r.a0);
        *lo = v.x;
        *hi = v.y;
        const int ls = ((r.b0 >> (4 * (ib % 2))) & 15) | ((((unsigned)r.s >> (16 + 2 * ib)) & 3) << 4);
        *d = rf_f16_to_f32((f16_bits)(r.s & 0xffff)) * (float)(ls - 32);
    }
    MT_WORDS
};
template <typename T>
RF_DEVICE void mul_mat_id_mma(const char* w, const signed char* xq, const float2* xds, const int* sorted, char* d,
                              i64 K, i64 M, i64 n_as, i64 n_used, i64 n_pairs, i64 ne11, i64 nb01, i64 nb02, i64 nb1,
                              i64 nb2) {
#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    enum { NT = MMQT_COLS / 8 };
    const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const i64 row0 = ((i64)blockIdx.x * MMQT_WARPS + threadIdx.x / 32) * 16;
    const int tile = blockIdx.y;
    if (row0 >= M || tile >= sorted[0]) return;  // whole warps leave together
    const int* table = sorted + 2 + n_as + n_pairs;
    const int e = table[2 * tile], c0 = table[2 * tile + 1];
    const int* pairs = sorted + 2 + n_as + sorted[1 + e] + c0;
    const int left = sorted[2 + e] - sorted[1 + e] - c0;
    const int ncols = left < MMQT_COLS ? left : MMQT_COLS;
    // Rows past M read the last row (their sums are not stored).
    const i64 ra = row0 + g < M ? row0 + g : M - 1, rb = row0 + g + 8 < M ? row0 + g + 8 : M - 1;
    const unsigned char* wa = (const unsigned char*)w + e * nb02 + ra * nb01;
    const unsigned char* wb = (const unsigned char*)w + e * nb02 + rb * nb01;
    // Quantized rows of this lane's B pairs (g of each n-tile) and C pairs (2q, 2q + 1).
    const int nb = (int)(K / 32);
    const signed char* xb[NT];
    const float2* xd[NT][2];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int cb = j * 8 + g, cc = j * 8 + 2 * q;
        const int pb = pairs[cb < ncols ? cb : 0];
        xb[j] = xq + (pb % n_used % ne11 + ne11 * (pb / n_used)) * K;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int p = pairs[cc + h < ncols ? cc + h : 0];
            xd[j][h] = xds + (p % n_used % ne11 + ne11 * (p / n_used)) * (i64)nb;
        }
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int kb = 0; kb < nb; kb++) {
        int a[4];
        float da, db;
        T::words(wa, kb, q, &a[0], &a[2], &da);
        T::words(wb, kb, q, &a[1], &a[3], &db);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int b0 = *(const int*)(xb[j] + kb * 32 + 4 * q), b1 = *(const int*)(xb[j] + kb * 32 + 16 + 4 * q);
            int c[4] = {0, 0, 0, 0};
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                         : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
            const float x0 = xd[j][0][kb].x, x1 = xd[j][1][kb].x;
            acc[j][0] += da * x0 * (float)c[0];
            acc[j][1] += da * x1 * (float)c[1];
            acc[j][2] += db * x0 * (float)c[2];
            acc[j][3] += db * x1 * (float)c[3];
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int col = j * 8 + 2 * q + (i & 1);
            const i64 row = row0 + g + (i >= 2 ? 8 : 0);
            if (col < ncols && row < M) {
                const int p = pairs[col];
                *(float*)(d + (p % n_used) * nb1 + (p / n_used) * nb2 + row * 4) = acc[j][i];
            }
        }
    }
#else
    (void)w, (void)xq, (void)xds, (void)sorted, (void)d, (void)K, (void)M, (void)n_as, (void)n_used, (void)n_pairs;
    (void)ne11, (void)nb01, (void)nb02, (void)nb1, (void)nb2;
#endif
}
#define MMID_MMA_ARGS                                                                                         \
    const char *w, const signed char *xq, const float2 *xds, const int *sorted, char *d, i64 K, i64 M, i64 n_as, \
        i64 n_used, i64 n_pairs, i64 ne11, i64 nb01, i64 nb02, i64 nb1, i64 nb2
#define MMID_MMA_PASS w, xq, xds, sorted, d, K, M, n_as, n_used, n_pairs, ne11, nb01, nb02, nb1, nb2
#if RF_ALL || RF_T_q4_0
RF_KERNEL void mul_mat_id_mma_q4_0(MMID_MMA_ARGS) { rf_grid_begin(); mul_mat_id_mma<mt_q4_0>(MMID_MMA_PASS); }
#endif
#if RF_ALL || RF_T_q8_0
RF_KERNEL void mul_mat_id_mma_q8_0(MMID_MMA_ARGS) { rf_grid_begin(); mul_mat_id_mma<mt_q8_0>(MMID_MMA_PASS); }
#endif
#if RF_ALL || RF_T_iq4_nl
RF_KERNEL void mul_mat_id_mma_iq4_nl(MMID_MMA_ARGS) { rf_grid_begin(); mul_mat_id_mma<mt_iq4_nl>(MMID_MMA_PASS); }
#endif
#if RF_ALL || RF_T_iq4_xs
RF_KERNEL void mul_mat_id_mma_iq4_xs(MMID_MMA_ARGS) { rf_grid_begin(); mul_mat_id_mma<mt_iq4_xs>(MMID_MMA_PASS); }
#endif

// Two one-column products sharing their quantized activation (attention's V and K, adjacent
// in the graph) in one launch of the one-column kernel's default shape: blocks below blocks_a
// take matrix a, the others matrix b. Weights of one type, K values per row, single batch;
// outputs dense F32.
// Which matrix block blockIdx takes (true: a) and its first row.
RF_DEVICE bool mv1_pair_block(i64 Ma, i64* row0) {
    const i64 blocks_a = (Ma + MV1_ROWS_DEF - 1) / MV1_ROWS_DEF;
    const bool a = (i64)blockIdx.x < blocks_a;
    *row0 = ((i64)blockIdx.x - (a ? 0 : blocks_a)) * MV1_ROWS_DEF;
    return a;
}

template <typename T>
RF_DEVICE void mul_mat_vec_q1_pair(const char* wa, const char* wb, const signed char* xq, const float2* xds, char* da,
                                   char* db, i64 K, i64 Ma, i64 Mb, i64 nb01a, i64 nb01b) {
    i64 row0;
    const bool a = mv1_pair_block(Ma, &row0);
    mv1_rows<T, MV1_ROWS_DEF, MV1_UNROLL_DEF>((const unsigned char*)(a ? wa : wb), a ? nb01a : nb01b, a ? Ma : Mb, row0,
                                              xq, xds, K, (float*)(a ? da : db));
}
// The weight rows of mul_mat_vec_q1_pair's block, for its prefetch.
RF_DEVICE void mv1_pair_prefetch_l2(const char* wa, const char* wb, i64 Ma, i64 Mb, i64 nb01a, i64 nb01b) {
    i64 row0;
    const bool a = mv1_pair_block(Ma, &row0);
    const i64 M = a ? Ma : Mb, nb01 = a ? nb01a : nb01b;
    const i64 rows = M - row0 < MV1_ROWS_DEF ? M - row0 : MV1_ROWS_DEF;
    rf_prefetch_l2((a ? wa : wb) + row0 * nb01, rows * nb01);
}
#define MVQ_PAIR_ARGS                                                                                            \
    const char *wa, const char *wb, const signed char *xq, const float2 *xds, char *da, char *db, i64 K, i64 Ma, \
        i64 Mb, i64 nb01a, i64 nb01b
#define MVQ_PAIR_PASS wa, wb, xq, xds, da, db, K, Ma, Mb, nb01a, nb01b
#define MVQ_ARGS                                                                                           \
    const char *w, const signed char *xq, const float2 *xds, char *d, i64 K, i64 M, i64 N, i64 ne12, i64 r2, \
        i64 r3, i64 nb01, i64 nb02, i64 nb03, i64 nb1, i64 nb2, i64 nb3
#define MVQ_PASS w, xq, xds, d, K, M, N, ne12, r2, r3, nb01, nb02, nb03, nb1, nb2, nb3
#define MVQ_PREFETCH(ROWS) w, M, ROWS, ne12, r2, r3, nb01, nb02, nb03
#define MVQ_KERNEL(NAME, W)                                                                  \
    RF_KERNEL void mul_mat_vec_q_##NAME(MVQ_ARGS) { rf_grid_begin(); mul_mat_vec_q<mq_##NAME>(MVQ_PASS); } \
    RF_KERNEL __launch_bounds__(MV1_MAX_THREADS) void mul_mat_vec_q1_##NAME(MVQ_ARGS) {                  \
        mv1_prefetch_l2(MVQ_PREFETCH(MV1_ROWS_DEF));                                        \
        rf_grid_begin();                                                                    \
        mul_mat_vec_q1<mq_##NAME>(MVQ_PASS);                                                \
    }                                                                                       \
    RF_KERNEL __launch_bounds__(MV1_MAX_THREADS) void mul_mat_vec_q1s_##NAME(MVQ_ARGS) {                 \
        mv1_prefetch_l2(MVQ_PREFETCH(MV1S_ROWS));                                           \
        rf_grid_begin();                                                                    \
        mul_mat_vec_q1<mq_##NAME, MV1S_ROWS, 1>(MVQ_PASS);                                  \
    }                                                                                       \
    RF_KERNEL __launch_bounds__(MV1_MAX_THREADS) void mul_mat_vec_q1_pair_##NAME(MVQ_PAIR_ARGS) { \
        mv1_pair_prefetch_l2(wa, wb, Ma, Mb, nb01a, nb01b);                                 \
        rf_grid_begin();                                                                    \
        mul_mat_vec_q1_pair<mq_##NAME>(MVQ_PAIR_PASS);                                      \
    }                                                                                       \
    RF_KERNEL __launch_bounds__(MV1_MAX_THREADS) void mul_mat_id_q_##NAME(         \
        const char* w, const signed char* xq, const float2* xds, const char* ids, char* d, i64 K, i64 M,  \
        i64 n_as, i64 ne11, i64 nb01, i64 nb02, i64 nbi0, i64 nbi1, i64 nb1, i64 nb2) { rf_grid_begin(); \
        mul_mat_id_q<mq_##NAME>(w, xq, xds, ids, d, K, M, n_as, ne11, nb01, nb02, nbi0, nbi1, nb1, nb2); \
    } \
    RF_KERNEL void mul_mat_id_q_sorted_##NAME(const char* w, const signed char* xq, const float2* xds,        \
                                              const int* sorted, char* d, i64 K, i64 M, i64 n_as, i64 n_used, \
                                              i64 n_pairs, i64 ne11, i64 nb01, i64 nb02, i64 nb1, i64 nb2) {  \
        rf_grid_begin();                                                                                 \
        mul_mat_id_q_sorted<mq_##NAME>(w, xq, xds, sorted, d, K, M, n_as, n_used, n_pairs, ne11, nb01, nb02, nb1, nb2); \
    }

RF_EACH_MVQ_TYPE(MVQ_KERNEL)
#if RF_ALL || RF_T_q4_0
// Other shapes of the one-column kernel for Q4_0, for measuring (ROCMFORGE_GPU_MV1=rows,unroll,warps).
#define MV1X_KERNEL(R, U)                                                                                     \
    RF_KERNEL __launch_bounds__(MV1_MAX_THREADS) void mul_mat_vec_q1x_q4_0_r##R##_u##U(MVQ_ARGS) {                 \
        mv1_prefetch_l2(MVQ_PREFETCH(R));                                                                      \
        rf_grid_begin();                                                                                       \
        mul_mat_vec_q1<mq_q4_0, R, U>(MVQ_PASS);                                                               \
    }
MV1X_KERNEL(1, 4)
MV1X_KERNEL(1, 8)
MV1X_KERNEL(2, 2)
MV1X_KERNEL(2, 8)
MV1X_KERNEL(4, 2)
MV1X_KERNEL(4, 4)
#endif

// One block of 32 values of row xr (quantize_vals32 in quants.h).
RF_DEVICE void quantize_block32(const float* xr, signed char* q, float2* ds, i64 b, int lane) {
    quantize_vals32(xr[b * 32 + lane], q, ds, b, lane);
}

// One block of 256 values as ggml-cpu's Q8_K (f32 scale from the value of largest magnitude,
// the first one on ties) by a group of 32 threads.
RF_DEVICE void quantize_block256(const float* xr, signed char* q, float2* ds, i64 b, int lane) {
    const float* xb = xr + b * 256;
    float best_a = -1.0f, best_i = 0.0f, best_x = 0.0f;
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
    const float iscale = amax != 0.0f ? -127.0f / mx : 0.0f;
#pragma unroll
    for (int t = 0; t < 8; t++) q[b * 256 + lane + 32 * t] = (signed char)(int)fminf(rintf(iscale * xb[lane + 32 * t]), 127.0f);
    if (lane < 8) ds[b * 8 + lane] = make_float2(amax != 0.0f ? 1.0f / iscale : 0.0f, 0.0f);
}

#if RF_UNTYPED
// The (slot u, token t) pairs of a MUL_MAT_ID grouped by expert, for mul_mat_id_q_sorted and
// mul_mat_id_mma (the layout above them). One block: counts by atomics, a prefix sum and the tiles of `cols` pairs by
// its first thread, then each pair placed (in no particular order within its expert: each
// pair's result is computed alone). A pair whose id is out of range gets zeros in dst, as
// mul_mat_id_q gives it.
RF_KERNEL void mmid_sort(const char* ids, int* sorted, char* d, i64 M, i64 n_as, i64 n_used, i64 n_tok, i64 nbi0,
                         i64 nbi1, i64 nb1, i64 nb2, int cols) {
    rf_grid_begin();
    const i64 n_pairs = n_used * n_tok;
    int* start = sorted + 1;       // n_as + 1 entries: counts, then starts (and the end)
    int* list = sorted + 2 + n_as;
    int* table = list + n_pairs;
    for (i64 i = threadIdx.x; i <= n_as; i += blockDim.x) start[i] = 0;
    __syncthreads();
    for (i64 p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const int e = *(const int*)(ids + (p % n_used) * nbi0 + (p / n_used) * nbi1);
        if (e >= 0 && e < n_as) atomicAdd(&start[e + 1], 1);
    }
    __syncthreads();
    __shared__ int total;
    if (threadIdx.x == 0) {
        int tiles = 0;
        for (i64 e = 0; e < n_as; e++) {
            const int n = start[e + 1];
            start[e + 1] = start[e] + n;
            for (int c0 = 0; c0 < n; c0 += cols) {
                table[2 * tiles] = (int)e;
                table[2 * tiles + 1] = c0;
                tiles++;
            }
        }
        sorted[0] = tiles;
        total = start[n_as];
    }
    __syncthreads();
    // start[e + 1] is expert e's end; placing pairs counts it back down to its start.
    for (i64 p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const i64 u = p % n_used, t = p / n_used;
        const int e = *(const int*)(ids + u * nbi0 + t * nbi1);
        if (e >= 0 && e < n_as) {
            list[atomicSub(&start[e + 1], 1) - 1] = (int)p;
        } else {
            float* out = (float*)(d + u * nb1 + t * nb2);
            for (i64 r = 0; r < M; r++) out[r] = 0.0f;
        }
    }
    __syncthreads();
    // start[e + 1] is now expert e's start: shift the starts into place, the end after them.
    if (threadIdx.x == 0) {
        for (i64 e = 0; e < n_as; e++) start[e] = start[e + 1];
        start[n_as] = total;
    }
}
#endif

#if RF_UNTYPED
// src1 rows quantized for the kernels above, as ggml-cpu quantizes them (mode 0: blocks of
// 32, mode 1: blocks of 256). Grid: (src1 rows, value chunks); blocks of 256 threads, a
// group of 32 threads per block of values.
RF_KERNEL void quantize_q8(const char* x, signed char* xq, float2* xds, int mode, i64 K, i64 N, i64 ne12, i64 nb11,
                           i64 nb12, i64 nb13) {
    rf_grid_begin();
    const i64 row = blockIdx.x;
    const i64 i1 = row % N, i2 = (row / N) % ne12, i3 = row / (N * ne12);
    const float* xr = (const float*)(x + i1 * nb11 + i2 * nb12 + i3 * nb13);
    const int lane = threadIdx.x % 32, group = threadIdx.x / 32, ngroups = blockDim.x / 32;
    const i64 b = (i64)blockIdx.y * ngroups + group;
    if (b >= K / (mode == 0 ? 32 : 256)) return;  // the whole group leaves
    if (mode == 0) {
        quantize_block32(xr, xq + row * K, xds + row * (K / 32), b, lane);
    } else {
        quantize_block256(xr, xq + row * K, xds + row * (K / 32), b, lane);
    }
}
#endif
