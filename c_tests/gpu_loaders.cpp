// The GPU kernels' weight decoders checked on the host against ggml (no GPU needed): built
// and run by scripts/check-gpu-loaders.sh with kernels/quants.h, quants_iq.h, the generated
// grids and mmvq.hip's integer-dot blocks compiled as plain C++ (gpu_host/prelude.h).
//  - load_w and load_block32 of every quantized weight type give ggml's dequantization to the
//    bit on random raw blocks (every grid index, sign and scale pattern) with a sane scale;
//  - each mq_* block of mmvq.hip, its parts summed over a row, gives ggml-cpu's vec_dot of
//    that row with activations quantized by ggml-cpu to the type's vec_dot_type (up to the
//    order of float additions), MXFP4 rows at every byte offset (17-byte blocks);
//  - dequant.hip's dequant_f16 (the BLAS path's weights), run thread by thread over two
//    matrices of rows, writes ggml's values rounded to f16 at every place.
#include "prelude.h"
#include "iquant_grids.h"
#include "quants.h"
#include "quants_iq.h"
#include "mq_blocks.h"
#include "dequant_body.h"
#include "ggml.h"
#include "ggml-cpu.h"
#include <cstdio>
#include <cstdlib>
#include <vector>

static uint64_t g_state = 88172645463325252ull;
static unsigned rnd() {
    g_state ^= g_state << 13;
    g_state ^= g_state >> 7;
    g_state ^= g_state << 17;
    return (unsigned)(g_state >> 11);
}
static float rnd_unit() { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }

// nb random blocks of t at p, each with a finite scale (where the format keeps it).
static void fill_blocks(ggml_type t, unsigned char* p, int nb) {
    const size_t ts = ggml_type_size(t);
    for (size_t i = 0; i < nb * ts; i++) p[i] = (unsigned char)rnd();
    for (int b = 0; b < nb; b++) {
        unsigned char* blk = p + b * ts;
        const uint16_t h = ggml_fp32_to_fp16(rnd_unit());
        switch (t) {
        case GGML_TYPE_IQ1_M:
            for (int k = 0; k < 4; k++) blk[49 + 2 * k] = (unsigned char)((blk[49 + 2 * k] & 0x0f) | (((h >> (4 * k)) & 0xf) << 4));
            break;
        case GGML_TYPE_TQ2_0: memcpy(blk + 64, &h, 2); break;
        case GGML_TYPE_TQ1_0: memcpy(blk + 52, &h, 2); break;
        case GGML_TYPE_Q6_K: memcpy(blk + 208, &h, 2); break;
        case GGML_TYPE_Q2_K: memcpy(blk + 80, &h, 2); memcpy(blk + 82, &h, 2); break;
        case GGML_TYPE_Q3_K: memcpy(blk + 108, &h, 2); break;
        case GGML_TYPE_MXFP4: blk[0] = (unsigned char)(110 + rnd() % 30); break;
        case GGML_TYPE_NVFP4:
            // UE4M3 scales from their random bytes: mostly subnormal to 2^3, else the NaN code
            // 0x7f or the byte as it is (top bit set too). No further rnd() draws: the other
            // types' blocks stay those the dot tolerance was set on.
            for (int s = 0; s < 4; s++) {
                const unsigned x = blk[s];
                blk[s] = (unsigned char)(x % 16 == 0 ? 0x7f : x % 16 == 1 ? x : (x >> 1) % 0x58);
            }
            break;
        case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
            memcpy(blk, &h, 2);
            memcpy(blk + 2, &h, 2);
            break;
        default: memcpy(blk, &h, 2); break;
        }
    }
}

template <typename W> static int check_loader(ggml_type t) {
    const int K = 2048;
    std::vector<unsigned char> raw(ggml_row_size(t, K));
    fill_blocks(t, raw.data(), K / ggml_blck_size(t));
    std::vector<float> want(K), got(K), got32(K);
    ggml_get_type_traits(t)->to_float(raw.data(), want.data(), K);
    for (int k = 0; k < K; k++) got[k] = load_w<W>((const char*)raw.data(), k);
    for (int b = 0; b < K / 32; b++) load_block32<W>((const char*)raw.data(), b, got32.data() + 32 * b);
    int bad = 0;
    for (int k = 0; k < K; k++) {
        if (memcmp(&want[k], &got[k], 4) == 0 && memcmp(&want[k], &got32[k], 4) == 0) continue;
        if (bad++ < 3)
            printf("  %s value %d: ggml %.9g, load_w %.9g, load_block32 %.9g\n", ggml_type_name(t), k, want[k], got[k],
                   got32[k]);
    }
    printf("%-8s loaders %s\n", ggml_type_name(t), bad ? "FAIL" : "ok (to the bit)");
    return bad != 0;
}

template <typename T> static int check_dot(ggml_type t) {
    const int K = 4096, blk = ggml_blck_size(t), nb = K / blk;
    const size_t ts = ggml_type_size(t);
    int bad = 0;
    for (int off = 0; off < (t == GGML_TYPE_MXFP4 ? 4 : 1); off++) {
        std::vector<unsigned char> store(nb * ts + 8);
        unsigned char* raw = store.data() + off;
        fill_blocks(t, raw, nb);
        std::vector<float> x(K);
        for (float& v : x) v = rnd_unit();
        const ggml_type vt = ggml_get_type_traits_cpu(t)->vec_dot_type;
        std::vector<unsigned char> y(ggml_row_size(vt, K));
        ggml_get_type_traits_cpu(vt)->from_float(x.data(), y.data(), K);
        float want = 0.0f;
        ggml_get_type_traits_cpu(t)->vec_dot(K, &want, 0, raw, 0, y.data(), 0, 1);
        // quantize_q8's layout: the int8 values, then (d, s) per 32 values.
        std::vector<signed char> xq(K);
        std::vector<float2> ds(K / 32);
        for (int b = 0; b < K / 32; b++) {
            if (vt == GGML_TYPE_Q8_K) {
                const unsigned char* q = y.data() + (b / 8) * ggml_type_size(vt);
                float d;
                memcpy(&d, q, 4);
                memcpy(&xq[b * 32], q + 4 + 32 * (b % 8), 32);
                ds[b] = {d, 0.0f};
            } else {
                const unsigned char* q = y.data() + b * ggml_type_size(vt);
                uint16_t d, s = 0;
                memcpy(&d, q, 2);
                if (vt == GGML_TYPE_Q8_1) memcpy(&s, q + 2, 2);
                memcpy(&xq[b * 32], q + (vt == GGML_TYPE_Q8_1 ? 4 : 2), 32);
                ds[b] = {ggml_fp16_to_fp32(d), ggml_fp16_to_fp32(s)};
            }
        }
        float got = 0.0f, mag = 0.0f;
        for (int it = 0; it < nb * T::NSUB; it++) {
            const int b = it / T::NSUB, s = it % T::NSUB;
            const typename T::R r = T::load(raw + b * T::BYTES, s);
            const float part = T::dot(r, s, (const int*)(xq.data() + b * T::QK), ds.data() + b * (T::QK / 32));
            got += part;
            mag += fabsf(part);
        }
        // The parts' float sums meet in another order than ggml-cpu's (which sums a block's
        // integers first): the rounding scales with the parts' magnitudes, not the result's,
        // where they cancel (Q6_K: 255.059 against 255.070 from parts of 2.1e5 in absolute sum).
        const bool ok = fabsf(got - want) <= 2e-5f * (fabsf(want) + 1.0f) + 2e-6f * mag;
        if (!ok) printf("  %s offset %d: vec_dot %.9g, mq %.9g\n", ggml_type_name(t), off, want, got);
        bad += !ok;
    }
    printf("%-8s integer dot %s\n", ggml_type_name(t), bad ? "FAIL" : "ok");
    return bad != 0;
}

template <typename W> static int check_dequant(ggml_type t) {
    const int K = 512, M = 3, NE2 = 2, n_rows = M * NE2;
    const size_t row = ggml_row_size(t, K);
    std::vector<unsigned char> raw(row * n_rows);
    if (ggml_is_quantized(t)) {
        fill_blocks(t, raw.data(), (int)(raw.size() / ggml_type_size(t)));
    } else {
        for (size_t i = 0; i < raw.size() / 2; i++) {
            const uint16_t h = ggml_fp32_to_fp16(rnd_unit());
            if (t == GGML_TYPE_F16) memcpy(&raw[2 * i], &h, 2);
            else { const float f = rnd_unit(); uint32_t u; memcpy(&u, &f, 4); const uint16_t b = u >> 16; memcpy(&raw[2 * i], &b, 2); }
        }
    }
    std::vector<uint16_t> out(K * n_rows, 0xffff);
    gridDim.x = 2;
    blockDim.x = 32;
    for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)
        for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++)
            dequant_f16<W>((const char*)raw.data(), out.data(), K, M, NE2, n_rows, row, row * M, row * M * NE2);
    std::vector<float> want(K);
    int bad = 0;
    for (int r = 0; r < n_rows; r++) {
        ggml_get_type_traits(t)->to_float(raw.data() + r * row, want.data(), K);
        for (int k = 0; k < K; k++) {
            if (out[r * K + k] == ggml_fp32_to_fp16(want[k])) continue;
            if (bad++ < 3) printf("  %s row %d value %d: %#x, want %#x\n", ggml_type_name(t), r, k, out[r * K + k], ggml_fp32_to_fp16(want[k]));
        }
    }
    printf("%-8s dequant_f16 %s\n", ggml_type_name(t), bad ? "FAIL" : "ok");
    return bad != 0;
}

int main() {
    ggml_cpu_init();
    int failed = 0;
    for (int rep = 0; rep < 3; rep++) {
#define LOADER(NAME, TYPE) failed += check_loader<w_##NAME>(GGML_TYPE_##TYPE);
        LOADER(q4_0, Q4_0) LOADER(q4_1, Q4_1) LOADER(q5_0, Q5_0) LOADER(q5_1, Q5_1) LOADER(q8_0, Q8_0)
        LOADER(iq4_nl, IQ4_NL) LOADER(q2_k, Q2_K) LOADER(q3_k, Q3_K) LOADER(q4_k, Q4_K) LOADER(q5_k, Q5_K)
        LOADER(q6_k, Q6_K) LOADER(iq4_xs, IQ4_XS) LOADER(mxfp4, MXFP4) LOADER(tq2_0, TQ2_0) LOADER(tq1_0, TQ1_0)
        LOADER(iq3_s, IQ3_S) LOADER(iq3_xxs, IQ3_XXS) LOADER(iq2_xxs, IQ2_XXS) LOADER(iq2_xs, IQ2_XS)
        LOADER(iq2_s, IQ2_S) LOADER(iq1_s, IQ1_S) LOADER(iq1_m, IQ1_M) LOADER(nvfp4, NVFP4) LOADER(q1_0, Q1_0)
        LOADER(q2_0, Q2_0)
#define DOT(NAME, TYPE) failed += check_dot<mq_##NAME>(GGML_TYPE_##TYPE);
        DOT(q4_0, Q4_0) DOT(q4_1, Q4_1) DOT(q5_0, Q5_0) DOT(q5_1, Q5_1) DOT(q8_0, Q8_0) DOT(iq4_nl, IQ4_NL)
        DOT(q2_k, Q2_K) DOT(q3_k, Q3_K) DOT(q4_k, Q4_K) DOT(q5_k, Q5_K) DOT(q6_k, Q6_K) DOT(iq4_xs, IQ4_XS) DOT(mxfp4, MXFP4) DOT(tq2_0, TQ2_0) DOT(tq1_0, TQ1_0)
        DOT(iq2_xxs, IQ2_XXS) DOT(iq2_xs, IQ2_XS) DOT(iq2_s, IQ2_S) DOT(iq3_xxs, IQ3_XXS) DOT(iq3_s, IQ3_S)
        DOT(iq1_s, IQ1_S) DOT(iq1_m, IQ1_M) DOT(nvfp4, NVFP4) DOT(q1_0, Q1_0) DOT(q2_0, Q2_0)
    }
#define DEQUANT(NAME, TYPE) failed += check_dequant<w_##NAME>(GGML_TYPE_##TYPE);
    DEQUANT(f16, F16) DEQUANT(bf16, BF16) DEQUANT(q4_0, Q4_0) DEQUANT(q5_1, Q5_1) DEQUANT(q8_0, Q8_0)
    DEQUANT(q3_k, Q3_K) DEQUANT(q6_k, Q6_K) DEQUANT(iq4_xs, IQ4_XS) DEQUANT(mxfp4, MXFP4) DEQUANT(tq1_0, TQ1_0)
    DEQUANT(iq2_xxs, IQ2_XXS) DEQUANT(iq3_s, IQ3_S) DEQUANT(iq1_m, IQ1_M) DEQUANT(nvfp4, NVFP4)
    DEQUANT(q1_0, Q1_0) DEQUANT(q2_0, Q2_0)
    printf("gpu_loaders: %d failed\n", failed);
    return failed ? 1 : 0;
}
