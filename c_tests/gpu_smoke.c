// GPU smoke test: loads libggml-rocmforge.so through ggml's loader, and for every RFGPU
// device compares each GPU op with ggml-cpu on random data (ggml's NMSE measure), then times
// a few matrix products. Without a GPU it prints "skipped: no GPU" and exits 0 (CI).
//
// usage: gpu_smoke path/to/libggml-rocmforge.so path/to/libggml-cpu.so
// build: cc -O2 -I$GGML/include c_tests/gpu_smoke.c -L$GGML_BUILD/bin -lggml -lggml-base -lm -o gpu_smoke
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state;
static float rnd(void) {  // uniform in [-1, 1)
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct ggml_tensor* (*build_fn)(struct ggml_context*);

// ---- cases -------------------------------------------------------------------------------

// Products per graph: 1 for checks; timing chains several square products in one graph so
// the per-graph overhead (launch queue, final synchronize) is spread over them.
static int g_repeat = 1;

static struct ggml_tensor* mm(struct ggml_context* c, enum ggml_type wt, int K, int M, int N, int w2, int w3, int x2,
                              int x3) {
    struct ggml_tensor* w = ggml_new_tensor_4d(c, wt, K, M, w2, w3);
    struct ggml_tensor* x = ggml_new_tensor_4d(c, GGML_TYPE_F32, K, N, x2, x3);
    struct ggml_tensor* y = ggml_mul_mat(c, w, x);
    for (int r = 1; r < g_repeat && K == M; r++) y = ggml_mul_mat(c, w, y);
    return y;
}
static struct ggml_tensor* mm_f32_vec(struct ggml_context* c) { return mm(c, GGML_TYPE_F32, 67, 33, 3, 2, 1, 4, 3); }
static struct ggml_tensor* mm_f32_tiled(struct ggml_context* c) { return mm(c, GGML_TYPE_F32, 67, 70, 77, 2, 1, 4, 3); }
static struct ggml_tensor* mm_f16_vec(struct ggml_context* c) { return mm(c, GGML_TYPE_F16, 256, 129, 1, 1, 1, 1, 1); }
static struct ggml_tensor* mm_f16_tiled(struct ggml_context* c) { return mm(c, GGML_TYPE_F16, 200, 130, 65, 3, 2, 3, 2); }
static struct ggml_tensor* mm_f32_permuted_x(struct ggml_context* c) {
    struct ggml_tensor* w = ggml_new_tensor_4d(c, GGML_TYPE_F32, 64, 48, 5, 1);
    struct ggml_tensor* x = ggml_new_tensor_4d(c, GGML_TYPE_F32, 64, 5, 20, 1);
    return ggml_mul_mat(c, w, ggml_permute(c, x, 0, 2, 1, 3));  // x: [64, 20, 5]
}
static struct ggml_tensor* mm_big_f16_1(struct ggml_context* c) { return mm(c, GGML_TYPE_F16, 4096, 4096, 1, 1, 1, 1, 1); }
static struct ggml_tensor* mm_big_f16_512(struct ggml_context* c) { return mm(c, GGML_TYPE_F16, 4096, 4096, 512, 1, 1, 1, 1); }
static struct ggml_tensor* mm_big_q4_1_1(struct ggml_context* c) { return mm(c, GGML_TYPE_Q4_1, 4096, 4096, 1, 1, 1, 1, 1); }
static struct ggml_tensor* mm_big_q4_1_512(struct ggml_context* c) { return mm(c, GGML_TYPE_Q4_1, 4096, 4096, 512, 1, 1, 1, 1); }
static struct ggml_tensor* mm_big_f32_512(struct ggml_context* c) { return mm(c, GGML_TYPE_F32, 4096, 4096, 512, 1, 1, 1, 1); }

static struct ggml_tensor* bin(struct ggml_context* c, int op, int b0, int b1, int b2, int b3) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F32, 37, 9, 4, 2);
    struct ggml_tensor* b = ggml_new_tensor_4d(c, GGML_TYPE_F32, b0, b1, b2, b3);
    switch (op) {
        case 0: return ggml_add(c, a, b);
        case 1: return ggml_sub(c, a, b);
        case 2: return ggml_mul(c, a, b);
        default: return ggml_div(c, a, b);
    }
}
static struct ggml_tensor* add_bcast(struct ggml_context* c) { return bin(c, 0, 37, 1, 4, 1); }
static struct ggml_tensor* add_same(struct ggml_context* c) { return bin(c, 0, 37, 9, 4, 2); }
static struct ggml_tensor* sub_bcast(struct ggml_context* c) { return bin(c, 1, 37, 9, 1, 2); }
static struct ggml_tensor* mul_bcast(struct ggml_context* c) { return bin(c, 2, 37, 1, 1, 1); }
static struct ggml_tensor* mul_bcast0(struct ggml_context* c) { return bin(c, 2, 1, 9, 4, 1); }
static struct ggml_tensor* div_bcast(struct ggml_context* c) { return bin(c, 3, 37, 3, 2, 2); }
static struct ggml_tensor* add_permuted(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F32, 16, 6, 5, 1);
    struct ggml_tensor* b = ggml_new_tensor_4d(c, GGML_TYPE_F32, 16, 1, 6, 1);
    return ggml_add(c, ggml_permute(c, a, 0, 2, 1, 3), b);
}
static struct ggml_tensor* scale(struct ggml_context* c) {
    return ggml_scale(c, ggml_new_tensor_4d(c, GGML_TYPE_F32, 129, 7, 3, 1), 0.7f);
}
static struct ggml_tensor* scale_bias(struct ggml_context* c) {
    return ggml_scale_bias(c, ggml_new_tensor_4d(c, GGML_TYPE_F32, 1000, 3, 1, 1), -1.5f, 0.25f);
}
static struct ggml_tensor* soft_max_plain(struct ggml_context* c) {
    return ggml_soft_max(c, ggml_new_tensor_4d(c, GGML_TYPE_F32, 1000, 5, 3, 1));
}
static struct ggml_tensor* soft_max_mask(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F32, 77, 6, 4, 2);
    struct ggml_tensor* m = ggml_new_tensor_4d(c, GGML_TYPE_F32, 77, 8, 1, 1);
    return ggml_soft_max_ext(c, a, m, 0.125f, 0.0f);
}
static struct ggml_tensor* soft_max_alibi_f16(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F32, 300, 4, 6, 1);
    struct ggml_tensor* m = ggml_new_tensor_4d(c, GGML_TYPE_F16, 300, 4, 1, 1);
    return ggml_soft_max_ext(c, a, m, 0.5f, 8.0f);
}
static struct ggml_tensor* soft_max_sinks(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F32, 64, 4, 5, 1);
    struct ggml_tensor* m = ggml_new_tensor_4d(c, GGML_TYPE_F32, 64, 4, 1, 1);
    struct ggml_tensor* s = ggml_new_tensor_1d(c, GGML_TYPE_F32, 5);
    struct ggml_tensor* r = ggml_soft_max_ext(c, a, m, 1.0f, 0.0f);
    ggml_soft_max_add_sinks(r, s);
    return r;
}
static struct ggml_tensor* rms_norm(struct ggml_context* c) {
    return ggml_rms_norm(c, ggml_new_tensor_4d(c, GGML_TYPE_F32, 4096, 5, 3, 1), 1e-6f);
}
static struct ggml_tensor* rms_norm_permuted(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F32, 33, 4, 7, 1);
    return ggml_rms_norm(c, ggml_permute(c, a, 0, 2, 1, 3), 1e-5f);
}
static struct ggml_tensor* cpy_f32_f16_transposed(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F32, 31, 17, 3, 1);
    struct ggml_tensor* d = ggml_new_tensor_4d(c, GGML_TYPE_F16, 17, 31, 3, 1);
    return ggml_cpy(c, ggml_transpose(c, a), d);
}
static struct ggml_tensor* cpy_f16_f32(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F16, 40, 6, 2, 2);
    struct ggml_tensor* d = ggml_new_tensor_4d(c, GGML_TYPE_F32, 240, 2, 2, 1);
    return ggml_cpy(c, a, d);
}
static struct ggml_tensor* cont_permuted(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_4d(c, GGML_TYPE_F32, 8, 5, 6, 3);
    return ggml_cont(c, ggml_permute(c, a, 2, 0, 3, 1));
}
static struct ggml_tensor* chain(struct ggml_context* c) {  // a tiny transformer-ish chain
    struct ggml_tensor* x = ggml_new_tensor_2d(c, GGML_TYPE_F32, 128, 9);
    struct ggml_tensor* g = ggml_new_tensor_1d(c, GGML_TYPE_F32, 128);
    struct ggml_tensor* w = ggml_new_tensor_2d(c, GGML_TYPE_F16, 128, 64);
    struct ggml_tensor* h = ggml_mul(c, ggml_rms_norm(c, x, 1e-5f), g);
    struct ggml_tensor* y = ggml_mul_mat(c, w, h);
    return ggml_soft_max_ext(c, ggml_scale(c, y, 0.3f), NULL, 1.0f, 0.0f);
}

// ---- quantized weights and the other ops of llama graphs -------------------------------
// Leaf tensors named "ids:N" get random ids in [0, N), "perm:N" distinct ids (i*7+3) % N,
// "causal" an F16 causal mask (0 / -inf); quantized leaves get quantized random values.

static struct ggml_tensor* ids(struct ggml_context* c, enum ggml_type t, const char* name, int n0, int n1, int n2) {
    struct ggml_tensor* r = ggml_new_tensor_3d(c, t, n0, n1, n2);
    ggml_set_name(r, name);
    return r;
}
static struct ggml_tensor* mm_q(struct ggml_context* c, enum ggml_type t, int N) { return mm(c, t, 512, 67, N, 2, 1, 2, 1); }
#define MMQ(NAME, T)                                                                             \
    static struct ggml_tensor* mm_##NAME##_1(struct ggml_context* c) { return mm_q(c, T, 1); }   \
    static struct ggml_tensor* mm_##NAME##_3(struct ggml_context* c) { return mm_q(c, T, 3); }   \
    static struct ggml_tensor* mm_##NAME##_70(struct ggml_context* c) { return mm_q(c, T, 70); }
MMQ(q4_0, GGML_TYPE_Q4_0)
MMQ(q4_1, GGML_TYPE_Q4_1)
MMQ(q5_0, GGML_TYPE_Q5_0)
MMQ(q5_1, GGML_TYPE_Q5_1)
MMQ(q8_0, GGML_TYPE_Q8_0)
MMQ(iq4_nl, GGML_TYPE_IQ4_NL)
MMQ(q4_k, GGML_TYPE_Q4_K)
MMQ(q6_k, GGML_TYPE_Q6_K)

// Two one-column products of one activation, adjacent in the graph (attention's V and K):
// the GPU runs them as one launch (mul_mat_vec_q1_pair); rows of different counts.
static struct ggml_tensor* mm_pair(struct ggml_context* c, enum ggml_type t) {
    struct ggml_tensor* x = ggml_new_tensor_2d(c, GGML_TYPE_F32, 576, 1);
    struct ggml_tensor* a = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, 576, 192), x);
    struct ggml_tensor* b = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, 576, 203), x);
    return ggml_concat(c, a, b, 0);
}
static struct ggml_tensor* mm_pair_q4_1(struct ggml_context* c) { return mm_pair(c, GGML_TYPE_Q4_1); }

// Tensors a case wants in the graph before its output, in this order (llama expands Q, V, K and
// the cache writes one by one, and the GPU fuses runs of nodes in that order).
static struct ggml_tensor* g_pre[8];
static int g_npre;

// Attention's input for one token as llama builds it: MUL_MAT q, ROPE q, MUL_MAT v, MUL_MAT k,
// ROPE k, SET_ROWS k, SET_ROWS v (4 heads of q, 2 of k/v, 64 values each); the GPU runs them
// as one launch (mul_mat_vec_q1_qkv). The output holds ROPE(q) and both caches. vtrans: the V
// cache transposed as llama stores it without flash attention (one row per value).
// rot: with llama's rotations for quantized caches (roped Q and K, and V, times the Hadamard
// matrix of 64 by MUL_MATs with ggml's hint, before the cache writes; the matrices hold random
// values, which the hint says to ignore): the GPU runs them as a second launch (rot_qkv).
static struct ggml_tensor* hadamard64(struct ggml_context* c, struct ggml_tensor* a) {
    struct ggml_tensor* r = ggml_mul_mat(c, ggml_new_tensor_2d(c, GGML_TYPE_F32, 64, 64), ggml_reshape_2d(c, a, 64, ggml_nelements(a) / 64));
    ggml_mul_mat_set_hint(r, GGML_HINT_SRC0_IS_HADAMARD);
    return r;
}
static struct ggml_tensor* attn_in_xr(struct ggml_context* c, enum ggml_type t, int mode, enum ggml_type ct, int vtrans,
                                      struct ggml_tensor* x, int rot) {
    const int K = (int)x->ne[0];
    struct ggml_tensor* pos = ids(c, GGML_TYPE_I32, "ids:4000", 1, 1, 1);
    struct ggml_tensor* idx = ids(c, GGML_TYPE_I64, "perm:30", 1, 1, 1);
    struct ggml_tensor* q = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, K, 256), x);
    struct ggml_tensor* rq = ggml_rope_ext(c, ggml_reshape_3d(c, q, 64, 4, 1), pos, NULL, mode == 0 ? 48 : 64, mode, 4096,
                                           10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    struct ggml_tensor* v = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, K, 128), x);
    struct ggml_tensor* k = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, K, 128), x);
    struct ggml_tensor* rk = ggml_rope_ext(c, ggml_reshape_3d(c, k, 64, 2, 1), pos, NULL, mode == 0 ? 48 : 64, mode, 4096,
                                           10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    if (rot) {
        rq = hadamard64(c, rq);
        v = hadamard64(c, v);
        rk = hadamard64(c, rk);
    }
    struct ggml_tensor* sk = ggml_set_rows(c, ggml_new_tensor_2d(c, ct, 128, 30), ggml_reshape_2d(c, rk, 128, 1), idx);
    struct ggml_tensor* sv = vtrans ? ggml_set_rows(c, ggml_new_tensor_2d(c, ct, 1, 128 * 30), ggml_reshape_2d(c, v, 1, 128),
                                                    ids(c, GGML_TYPE_I64, "perm:3840", 128, 1, 1))
                                    : ggml_set_rows(c, ggml_new_tensor_2d(c, ct, 128, 30), ggml_reshape_2d(c, v, 128, 1), idx);
    g_npre = 0;
    g_pre[g_npre++] = rq;
    g_pre[g_npre++] = v;
    g_pre[g_npre++] = rk;
    g_pre[g_npre++] = sk;
    g_pre[g_npre++] = sv;
    // The caches as F32: quantized rows through GET_ROWS (every row: a permutation of the 30).
    const int quant = ct == GGML_TYPE_Q8_0 || ct == GGML_TYPE_Q4_0;
    struct ggml_tensor* kf = ggml_reshape_1d(c, ct == GGML_TYPE_F32 ? sk
                                                : quant ? ggml_get_rows(c, sk, ids(c, GGML_TYPE_I32, "perm:30", 30, 1, 1))
                                                        : ggml_cast(c, sk, GGML_TYPE_F32),
                                             128 * 30);
    struct ggml_tensor* vf = ggml_reshape_1d(c, ct == GGML_TYPE_F32 ? sv
                                                : quant ? ggml_get_rows(c, sv, ids(c, GGML_TYPE_I32, "perm:30", 30, 1, 1))
                                                        : ggml_cast(c, sv, GGML_TYPE_F32),
                                             128 * 30);
    return ggml_concat(c, ggml_concat(c, ggml_reshape_1d(c, rq, 256), kf, 0), vf, 0);
}
static struct ggml_tensor* attn_in_x(struct ggml_context* c, enum ggml_type t, int mode, enum ggml_type ct, int vtrans,
                                     struct ggml_tensor* x) {
    return attn_in_xr(c, t, mode, ct, vtrans, x, 0);
}
static struct ggml_tensor* attn_in_k(struct ggml_context* c, enum ggml_type t, int mode, enum ggml_type ct, int vtrans,
                                     int K) {
    return attn_in_x(c, t, mode, ct, vtrans, ggml_new_tensor_2d(c, GGML_TYPE_F32, K, 1));
}
static struct ggml_tensor* attn_in(struct ggml_context* c, enum ggml_type t, int mode, enum ggml_type ct, int vtrans) {
    return attn_in_k(c, t, mode, ct, vtrans, 256);
}
// Rows long enough for blocks of one warp (8B-class: 4096 values).
static struct ggml_tensor* attn_in_q4_0_k4096(struct ggml_context* c) { return attn_in_k(c, GGML_TYPE_Q4_0, 0, GGML_TYPE_F16, 0, 4096); }
static struct ggml_tensor* attn_in_q4_1_normal(struct ggml_context* c) { return attn_in(c, GGML_TYPE_Q4_1, 0, GGML_TYPE_F16, 0); }
static struct ggml_tensor* attn_in_q8_0_neox(struct ggml_context* c) { return attn_in(c, GGML_TYPE_Q8_0, 2, GGML_TYPE_F16, 0); }
static struct ggml_tensor* attn_in_q4_0_normal_f32(struct ggml_context* c) { return attn_in(c, GGML_TYPE_Q4_0, 0, GGML_TYPE_F32, 0); }
static struct ggml_tensor* attn_in_q4_1_vtrans(struct ggml_context* c) { return attn_in(c, GGML_TYPE_Q4_1, 0, GGML_TYPE_F16, 1); }
static struct ggml_tensor* attn_in_q8_0_neox_vtrans_f32(struct ggml_context* c) { return attn_in(c, GGML_TYPE_Q8_0, 2, GGML_TYPE_F32, 1); }
// Q8_0 caches (llama's --cache-type-k/v q8_0): the cache rows go through their F32 sources.
static struct ggml_tensor* attn_in_q4_0_q8_0_cache(struct ggml_context* c) { return attn_in(c, GGML_TYPE_Q4_0, 0, GGML_TYPE_Q8_0, 0); }
static struct ggml_tensor* attn_in_q8_0_neox_q8_0_cache(struct ggml_context* c) { return attn_in(c, GGML_TYPE_Q8_0, 2, GGML_TYPE_Q8_0, 0); }
static struct ggml_tensor* mm_pair_q8_0(struct ggml_context* c) { return mm_pair(c, GGML_TYPE_Q8_0); }
static struct ggml_tensor* attn_in_rot_q4_0_q8_0_cache(struct ggml_context* c) {
    return attn_in_xr(c, GGML_TYPE_Q4_0, 0, GGML_TYPE_Q8_0, 0, ggml_new_tensor_2d(c, GGML_TYPE_F32, 256, 1), 1);
}
static struct ggml_tensor* attn_in_rot_q8_0_neox_q4_0_cache(struct ggml_context* c) {
    return attn_in_xr(c, GGML_TYPE_Q8_0, 2, GGML_TYPE_Q4_0, 0, ggml_new_tensor_2d(c, GGML_TYPE_F32, 256, 1), 1);
}
// Attention's output rotated before its projection (llama, quantized caches): the transform
// also quantizes its output for the product after it.
static struct ggml_tensor* rot_out_proj(struct ggml_context* c) {
    struct ggml_tensor* o = ggml_new_tensor_2d(c, GGML_TYPE_F32, 256, 1);
    return ggml_mul_mat(c, ggml_new_tensor_2d(c, GGML_TYPE_Q4_0, 256, 192), ggml_reshape_2d(c, hadamard64(c, o), 256, 1));
}

// A feed-forward block for one token as llama builds it: MUL_MAT gate, MUL_MAT up, SWIGLU, then
// MUL_MAT down of the result: the GPU runs the first three as one launch that also quantizes
// for the down product (mul_mat_vec_q_glu_q8; warps per block depend on M's block count).
static struct ggml_tensor* ffn_x(struct ggml_context* c, enum ggml_type t, struct ggml_tensor* x, int M) {
    const int K = (int)x->ne[0];
    struct ggml_tensor* g = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, K, M), x);
    struct ggml_tensor* u = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, K, M), x);
    return ggml_mul_mat(c, ggml_new_tensor_2d(c, t, M, K), ggml_swiglu_split(c, g, u));
}
static struct ggml_tensor* ffn(struct ggml_context* c, enum ggml_type t, int K, int M) {
    return ffn_x(c, t, ggml_new_tensor_2d(c, GGML_TYPE_F32, K, 1), M);
}
static struct ggml_tensor* ffn_q4_0_m1536(struct ggml_context* c) { return ffn(c, GGML_TYPE_Q4_0, 256, 1536); }
static struct ggml_tensor* ffn_q4_0_m14336(struct ggml_context* c) { return ffn(c, GGML_TYPE_Q4_0, 256, 14336); }
static struct ggml_tensor* ffn_q4_1_m1536(struct ggml_context* c) { return ffn(c, GGML_TYPE_Q4_1, 576, 1536); }

// A llama layer's joints for one token: the attention's output projection + residual ADD ->
// RMS_NORM -> MUL -> the feed-forward block above -> its down projection + residual ADD ->
// RMS_NORM -> MUL -> the attention input above. The GPU computes each projection with its ADD,
// norm and MUL in one launch (mul_mat_vec_q_add_norm) and leaves the norm's division to the
// gate/up and Q/K/V launches. Output: both residual sums and the attention input's results.
static struct ggml_tensor* layer(struct ggml_context* c, enum ggml_type t, int K, int F, int mode) {
    struct ggml_tensor* h = ggml_new_tensor_2d(c, GGML_TYPE_F32, K, 1);
    struct ggml_tensor* res = ggml_new_tensor_2d(c, GGML_TYPE_F32, K, 1);
    struct ggml_tensor* s1 = ggml_add(c, ggml_mul_mat(c, ggml_new_tensor_2d(c, t, K, K), h), res);
    struct ggml_tensor* n1 = ggml_mul(c, ggml_rms_norm(c, s1, 1e-5f), ggml_new_tensor_1d(c, GGML_TYPE_F32, K));
    struct ggml_tensor* s2 = ggml_add(c, ffn_x(c, t, n1, F), s1);
    struct ggml_tensor* n2 = ggml_mul(c, ggml_rms_norm(c, s2, 1e-6f), ggml_new_tensor_1d(c, GGML_TYPE_F32, K));
    struct ggml_tensor* a = attn_in_x(c, t, mode, GGML_TYPE_F16, 0, n2);
    return ggml_concat(c, ggml_concat(c, ggml_reshape_1d(c, s1, K), ggml_reshape_1d(c, s2, K), 0), a, 0);
}
static struct ggml_tensor* layer_q4_0_k4096(struct ggml_context* c) { return layer(c, GGML_TYPE_Q4_0, 4096, 2048, 0); }
static struct ggml_tensor* layer_q4_1_k576(struct ggml_context* c) { return layer(c, GGML_TYPE_Q4_1, 576, 1536, 0); }
static struct ggml_tensor* layer_q8_0_k256_neox(struct ggml_context* c) { return layer(c, GGML_TYPE_Q8_0, 256, 768, 2); }

static struct ggml_tensor* get_rows_t(struct ggml_context* c, enum ggml_type t) {
    struct ggml_tensor* a = ggml_new_tensor_3d(c, t, 256, 20, 2);
    return ggml_get_rows(c, a, ids(c, GGML_TYPE_I32, "ids:20", 7, 2, 1));
}
static struct ggml_tensor* get_rows_f32(struct ggml_context* c) { return get_rows_t(c, GGML_TYPE_F32); }
static struct ggml_tensor* get_rows_f16(struct ggml_context* c) { return get_rows_t(c, GGML_TYPE_F16); }
static struct ggml_tensor* get_rows_q4_1(struct ggml_context* c) { return get_rows_t(c, GGML_TYPE_Q4_1); }
static struct ggml_tensor* get_rows_q8_0(struct ggml_context* c) { return get_rows_t(c, GGML_TYPE_Q8_0); }
static struct ggml_tensor* get_rows_q6_k(struct ggml_context* c) { return get_rows_t(c, GGML_TYPE_Q6_K); }
static struct ggml_tensor* get_rows_q4_k(struct ggml_context* c) { return get_rows_t(c, GGML_TYPE_Q4_K); }

static struct ggml_tensor* set_rows_t(struct ggml_context* c, enum ggml_type dt, enum ggml_type it) {
    struct ggml_tensor* d = ggml_new_tensor_3d(c, dt, 96, 30, 2);
    struct ggml_tensor* src = ggml_new_tensor_3d(c, GGML_TYPE_F32, 96, 9, 2);
    return ggml_set_rows(c, d, src, ids(c, it, "perm:30", 9, 1, 1));
}
static struct ggml_tensor* set_rows_f16_i64(struct ggml_context* c) { return set_rows_t(c, GGML_TYPE_F16, GGML_TYPE_I64); }
static struct ggml_tensor* set_rows_f32_i32(struct ggml_context* c) { return set_rows_t(c, GGML_TYPE_F32, GGML_TYPE_I32); }

static struct ggml_tensor* rope_t(struct ggml_context* c, enum ggml_type t, int mode, int n_dims, int with_ff, float ext) {
    struct ggml_tensor* a = ggml_new_tensor_3d(c, t, 64, 5, 11);  // [head_dim, n_head, n_tokens]
    struct ggml_tensor* pos = ids(c, GGML_TYPE_I32, "ids:4000", 11, 1, 1);
    struct ggml_tensor* ff = with_ff ? ggml_new_tensor_1d(c, GGML_TYPE_F32, n_dims / 2) : NULL;
    if (ff) ggml_set_name(ff, "positive");
    return ggml_rope_ext(c, a, pos, ff, n_dims, mode, 4096, 10000.0f, 0.5f, ext, 1.0f, 32.0f, 1.0f);
}
static struct ggml_tensor* rope_normal(struct ggml_context* c) { return rope_t(c, GGML_TYPE_F32, 0, 64, 0, 0.0f); }
static struct ggml_tensor* rope_neox(struct ggml_context* c) { return rope_t(c, GGML_TYPE_F32, 2, 64, 0, 0.0f); }
static struct ggml_tensor* rope_neox_partial_ff(struct ggml_context* c) { return rope_t(c, GGML_TYPE_F32, 2, 32, 1, 0.0f); }
static struct ggml_tensor* rope_normal_yarn(struct ggml_context* c) { return rope_t(c, GGML_TYPE_F32, 0, 48, 0, 1.0f); }
static struct ggml_tensor* rope_f16(struct ggml_context* c) { return rope_t(c, GGML_TYPE_F16, 0, 64, 0, 0.0f); }

static struct ggml_tensor* un(struct ggml_context* c, enum ggml_unary_op op) {
    return ggml_unary(c, ggml_scale(c, ggml_new_tensor_3d(c, GGML_TYPE_F32, 300, 7, 2), 4.0f), op);
}
static struct ggml_tensor* silu(struct ggml_context* c) { return un(c, GGML_UNARY_OP_SILU); }
static struct ggml_tensor* gelu(struct ggml_context* c) { return un(c, GGML_UNARY_OP_GELU); }
static struct ggml_tensor* relu(struct ggml_context* c) { return un(c, GGML_UNARY_OP_RELU); }
static struct ggml_tensor* swiglu_fused(struct ggml_context* c) {
    return ggml_swiglu(c, ggml_new_tensor_3d(c, GGML_TYPE_F32, 256, 9, 2));
}
static struct ggml_tensor* swiglu_split(struct ggml_context* c) {
    struct ggml_tensor* a = ggml_new_tensor_2d(c, GGML_TYPE_F32, 1536, 9);
    struct ggml_tensor* b = ggml_new_tensor_2d(c, GGML_TYPE_F32, 1536, 9);
    return ggml_swiglu_split(c, a, b);
}
static struct ggml_tensor* geglu_swapped(struct ggml_context* c) {
    return ggml_geglu_swapped(c, ggml_new_tensor_2d(c, GGML_TYPE_F32, 200, 5));
}

// Attention like llama's: q [D, n_q, n_head] permuted from [D, n_head, n_q], K/V F16 with
// GQA, an F16 causal mask, scale; optionally softcap and sinks.
static struct ggml_tensor* fa(struct ggml_context* c, int D, int n_q, int n_kv, int nh, int nh_kv, float softcap,
                              int sinks) {
    struct ggml_tensor* q = ggml_new_tensor_3d(c, GGML_TYPE_F32, D, nh, n_q);
    struct ggml_tensor* k = ggml_new_tensor_3d(c, GGML_TYPE_F16, D, n_kv, nh_kv);
    struct ggml_tensor* v = ggml_new_tensor_3d(c, GGML_TYPE_F16, D, n_kv, nh_kv);
    struct ggml_tensor* m = ggml_new_tensor_2d(c, GGML_TYPE_F16, n_kv, n_q);
    ggml_set_name(m, "causal");
    struct ggml_tensor* r = ggml_flash_attn_ext(c, ggml_permute(c, q, 0, 2, 1, 3), k, v, m, 1.0f / sqrtf((float)D), 0.0f, softcap);
    if (sinks) ggml_flash_attn_ext_add_sinks(r, ggml_new_tensor_1d(c, GGML_TYPE_F32, nh));
    return r;
}
static struct ggml_tensor* fa_prompt(struct ggml_context* c) { return fa(c, 64, 13, 40, 9, 3, 0.0f, 0); }
static struct ggml_tensor* fa_prompt_tiled(struct ggml_context* c) { return fa(c, 64, 100, 128, 9, 3, 0.0f, 0); }
static struct ggml_tensor* fa_decode(struct ggml_context* c) { return fa(c, 64, 1, 300, 9, 3, 0.0f, 0); }
static struct ggml_tensor* fa_softcap_sinks(struct ggml_context* c) { return fa(c, 128, 5, 37, 4, 4, 20.0f, 1); }

struct tcase {
    const char* name;
    build_fn build;
    double max_nmse;
    int timed;        // time on the GPU
    double flops;     // per run, for timed cases
    double bytes;     // per run, for timed cases
};

static const struct tcase CASES[] = {
    {"mul_mat f32 vec bcast", mm_f32_vec, 5e-4, 0, 0, 0},
    {"mul_mat f32 tiled bcast", mm_f32_tiled, 5e-4, 0, 0, 0},
    {"mul_mat f16 vec", mm_f16_vec, 5e-4, 0, 0, 0},
    {"mul_mat f16 tiled bcast", mm_f16_tiled, 5e-4, 0, 0, 0},
    {"mul_mat f32 permuted src1", mm_f32_permuted_x, 5e-4, 0, 0, 0},
    {"add bcast", add_bcast, 1e-7, 0, 0, 0},
    {"add same", add_same, 1e-7, 0, 0, 0},
    {"sub bcast", sub_bcast, 1e-7, 0, 0, 0},
    {"mul bcast", mul_bcast, 1e-7, 0, 0, 0},
    {"mul bcast dim0", mul_bcast0, 1e-7, 0, 0, 0},
    {"div bcast", div_bcast, 1e-7, 0, 0, 0},
    {"add permuted src0", add_permuted, 1e-7, 0, 0, 0},
    {"scale", scale, 1e-7, 0, 0, 0},
    {"scale_bias", scale_bias, 1e-7, 0, 0, 0},
    {"soft_max", soft_max_plain, 1e-7, 0, 0, 0},
    {"soft_max mask f32", soft_max_mask, 1e-7, 0, 0, 0},
    {"soft_max alibi mask f16", soft_max_alibi_f16, 1e-7, 0, 0, 0},
    {"soft_max sinks", soft_max_sinks, 1e-7, 0, 0, 0},
    {"rms_norm", rms_norm, 1e-7, 0, 0, 0},
    {"rms_norm permuted", rms_norm_permuted, 1e-7, 0, 0, 0},
    {"cpy f32->f16 transposed", cpy_f32_f16_transposed, 1e-7, 0, 0, 0},
    {"cpy f16->f32", cpy_f16_f32, 1e-7, 0, 0, 0},
    {"cont permuted", cont_permuted, 1e-7, 0, 0, 0},
    {"chain rms_norm*g -> mul_mat f16 -> scale -> soft_max", chain, 5e-4, 0, 0, 0},
    {"mul_mat q4_0 x1", mm_q4_0_1, 5e-4, 0, 0, 0},
    {"mul_mat q4_0 x3", mm_q4_0_3, 5e-4, 0, 0, 0},
    {"mul_mat q4_0 x70 (tiled)", mm_q4_0_70, 5e-4, 0, 0, 0},
    {"mul_mat q4_1 x1", mm_q4_1_1, 5e-4, 0, 0, 0},
    {"mul_mat q4_1 x3", mm_q4_1_3, 5e-4, 0, 0, 0},
    {"mul_mat q4_1 x70 (tiled)", mm_q4_1_70, 5e-4, 0, 0, 0},
    {"mul_mat q5_0 x1", mm_q5_0_1, 5e-4, 0, 0, 0},
    {"mul_mat q5_0 x3", mm_q5_0_3, 5e-4, 0, 0, 0},
    {"mul_mat q5_0 x70 (tiled)", mm_q5_0_70, 5e-4, 0, 0, 0},
    {"mul_mat q5_1 x1", mm_q5_1_1, 5e-4, 0, 0, 0},
    {"mul_mat q5_1 x3", mm_q5_1_3, 5e-4, 0, 0, 0},
    {"mul_mat q5_1 x70 (tiled)", mm_q5_1_70, 5e-4, 0, 0, 0},
    {"mul_mat q8_0 x1", mm_q8_0_1, 5e-4, 0, 0, 0},
    {"mul_mat q8_0 x3", mm_q8_0_3, 5e-4, 0, 0, 0},
    {"mul_mat q8_0 x70 (tiled)", mm_q8_0_70, 5e-4, 0, 0, 0},
    {"mul_mat iq4_nl x1", mm_iq4_nl_1, 5e-4, 0, 0, 0},
    {"mul_mat iq4_nl x3", mm_iq4_nl_3, 5e-4, 0, 0, 0},
    {"mul_mat iq4_nl x70 (tiled)", mm_iq4_nl_70, 5e-4, 0, 0, 0},
    {"mul_mat q4_k x1", mm_q4_k_1, 5e-4, 0, 0, 0},
    {"mul_mat q4_k x3", mm_q4_k_3, 5e-4, 0, 0, 0},
    {"mul_mat q4_k x70 (tiled)", mm_q4_k_70, 5e-4, 0, 0, 0},
    {"mul_mat q6_k x1", mm_q6_k_1, 5e-4, 0, 0, 0},
    {"mul_mat q6_k x3", mm_q6_k_3, 5e-4, 0, 0, 0},
    {"mul_mat q6_k x70 (tiled)", mm_q6_k_70, 5e-4, 0, 0, 0},
    {"mul_mat pair q4_1 x1 (one launch)", mm_pair_q4_1, 5e-4, 0, 0, 0},
    {"mul_mat pair q8_0 x1 (one launch)", mm_pair_q8_0, 5e-4, 0, 0, 0},
    {"attention input q4_1 rope normal (48 of 64 dims), f16 caches (one launch)", attn_in_q4_1_normal, 5e-4, 0, 0, 0},
    {"attention input q8_0 rope neox, f16 caches (one launch)", attn_in_q8_0_neox, 5e-4, 0, 0, 0},
    {"attention input q4_0 rope normal (48 of 64 dims), f32 caches (one launch)", attn_in_q4_0_normal_f32, 5e-4, 0, 0, 0},
    {"attention input q4_1, f16 caches, V transposed (no flash attention; one launch)", attn_in_q4_1_vtrans, 5e-4, 0, 0, 0},
    {"attention input q4_0, rows of 4096 (one-warp blocks; one launch)", attn_in_q4_0_k4096, 5e-4, 0, 0, 0},
    {"ffn q4_0 256 -> 1536 (gate/up/swiglu one launch, 32-warp blocks)", ffn_q4_0_m1536, 5e-4, 0, 0, 0},
    {"ffn q4_0 256 -> 14336 (gate/up/swiglu one launch, 8-warp blocks on 132 SMs)", ffn_q4_0_m14336, 5e-4, 0, 0, 0},
    {"ffn q4_1 576 -> 1536 (gate/up/swiglu one launch)", ffn_q4_1_m1536, 5e-4, 0, 0, 0},
    {"attention input q8_0 neox, f32 caches, V transposed (one launch)", attn_in_q8_0_neox_vtrans_f32, 5e-4, 0, 0, 0},
    {"attention input q4_0, q8_0 caches (one launch, then the two rows quantized)", attn_in_q4_0_q8_0_cache, 5e-4, 0, 0, 0},
    {"attention input q8_0 neox, q8_0 caches (one launch, then the two rows quantized)", attn_in_q8_0_neox_q8_0_cache, 5e-4, 0, 0, 0},
    {"attention input q4_0 with rotations, q8_0 caches (two launches)", attn_in_rot_q4_0_q8_0_cache, 5e-4, 0, 0, 0},
    {"attention input q8_0 neox with rotations, q4_0 caches (two launches)", attn_in_rot_q8_0_neox_q4_0_cache, 5e-4, 0, 0, 0},
    {"rotated attention output -> projection (the transform quantizes)", rot_out_proj, 5e-4, 0, 0, 0},
    {"layer joints q4_0 4096/2048 (projection+add+norm in one launch, norm applied by gate/up and q/k/v)", layer_q4_0_k4096, 5e-4, 0, 0, 0},
    {"layer joints q4_1 576/1536 (projection+add+norm in one launch)", layer_q4_1_k576, 5e-4, 0, 0, 0},
    {"layer joints q8_0 256/768 rope neox (projection+add+norm in one launch)", layer_q8_0_k256_neox, 5e-4, 0, 0, 0},
    {"get_rows f32", get_rows_f32, 1e-7, 0, 0, 0},
    {"get_rows f16", get_rows_f16, 1e-7, 0, 0, 0},
    {"get_rows q4_1", get_rows_q4_1, 1e-7, 0, 0, 0},
    {"get_rows q8_0", get_rows_q8_0, 1e-7, 0, 0, 0},
    {"get_rows q4_k", get_rows_q4_k, 1e-7, 0, 0, 0},
    {"get_rows q6_k", get_rows_q6_k, 1e-7, 0, 0, 0},
    {"set_rows f32->f16 i64", set_rows_f16_i64, 1e-7, 0, 0, 0},
    {"set_rows f32->f32 i32", set_rows_f32_i32, 1e-7, 0, 0, 0},
    {"rope normal", rope_normal, 1e-6, 0, 0, 0},
    {"rope neox", rope_neox, 1e-6, 0, 0, 0},
    {"rope neox partial + freq factors", rope_neox_partial_ff, 1e-6, 0, 0, 0},
    {"rope normal yarn", rope_normal_yarn, 1e-6, 0, 0, 0},
    {"rope f16", rope_f16, 1e-6, 0, 0, 0},
    {"unary silu", silu, 1e-7, 0, 0, 0},
    {"unary gelu", gelu, 1e-6, 0, 0, 0},
    {"unary relu", relu, 1e-7, 0, 0, 0},
    {"glu swiglu fused", swiglu_fused, 1e-7, 0, 0, 0},
    {"glu swiglu split", swiglu_split, 1e-7, 0, 0, 0},
    {"glu geglu swapped", geglu_swapped, 1e-6, 0, 0, 0},
    {"flash_attn_ext prompt gqa causal", fa_prompt, 5e-4, 0, 0, 0},
    {"flash_attn_ext prompt 100 rows gqa causal (tiled)", fa_prompt_tiled, 5e-4, 0, 0, 0},
    {"flash_attn_ext decode gqa", fa_decode, 5e-4, 0, 0, 0},
    {"flash_attn_ext softcap sinks d128", fa_softcap_sinks, 5e-4, 0, 0, 0},
    {"mul_mat f16 4096x4096 x 1", mm_big_f16_1, 5e-4, 1, 2.0 * 4096 * 4096, 4096.0 * 4096 * 2},
    {"mul_mat f16 4096x4096 x 512", mm_big_f16_512, 5e-4, 1, 2.0 * 4096 * 4096 * 512, 4096.0 * 4096 * 2},
    {"mul_mat f32 4096x4096 x 512", mm_big_f32_512, 5e-4, 1, 2.0 * 4096 * 4096 * 512, 4096.0 * 4096 * 4},
    {"mul_mat q4_1 4096x4096 x 1", mm_big_q4_1_1, 5e-4, 1, 2.0 * 4096 * 4096, 4096.0 * 4096 * 20 / 32},
    {"mul_mat q4_1 4096x4096 x 512", mm_big_q4_1_512, 5e-4, 1, 2.0 * 4096 * 4096 * 512, 4096.0 * 4096 * 20 / 32},
};

// ---- running -----------------------------------------------------------------------------

struct run {
    struct ggml_context* ctx;
    struct ggml_cgraph* graph;
    struct ggml_tensor* out;
    ggml_backend_buffer_t buf;
};

static int setup(struct run* r, const struct tcase* tc, ggml_backend_t be, ggml_backend_dev_t dev, int seed) {
    struct ggml_init_params p = {512 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
    r->ctx = ggml_init(p);
    r->out = tc->build(r->ctx);
    r->graph = ggml_new_graph(r->ctx);
    for (int i = 0; i < g_npre; i++) ggml_build_forward_expand(r->graph, g_pre[i]);
    g_npre = 0;
    ggml_build_forward_expand(r->graph, r->out);
    for (int i = 0; i < ggml_graph_n_nodes(r->graph); i++) {
        struct ggml_tensor* n = ggml_graph_node(r->graph, i);
        if (!ggml_backend_dev_supports_op(dev, n)) {
            printf("  %s: node %d (%s) not supported by %s\n", tc->name, i, ggml_op_desc(n), ggml_backend_dev_name(dev));
            return 0;
        }
    }
    r->buf = ggml_backend_alloc_ctx_tensors(r->ctx, be);
    if (!r->buf) return 0;
    rng_state = 0x9e3779b97f4a7c15ULL ^ (uint64_t)seed;
    for (struct ggml_tensor* t = ggml_get_first_tensor(r->ctx); t; t = ggml_get_next_tensor(r->ctx, t)) {
        if (t->op != GGML_OP_NONE || t->view_src) continue;
        int64_t n = ggml_nelements(t);
        float* v = malloc(n * sizeof(float));
        for (int64_t i = 0; i < n; i++) v[i] = rnd();
        int lim = 0;
        if (sscanf(t->name, "ids:%d", &lim) == 1 || sscanf(t->name, "perm:%d", &lim) == 1) {
            int perm = t->name[0] == 'p';
            for (int64_t i = 0; i < n; i++) {
                int64_t id = perm ? (i * 7 + 3) % lim : (int64_t)((v[i] + 1.0f) * 0.5f * lim) % lim;
                v[i] = (float)id;
            }
            if (t->type == GGML_TYPE_I64) {
                int64_t* w = malloc(n * sizeof(int64_t));
                for (int64_t i = 0; i < n; i++) w[i] = (int64_t)v[i];
                ggml_backend_tensor_set(t, w, 0, n * sizeof(int64_t));
                free(w);
            } else {
                int32_t* w = malloc(n * sizeof(int32_t));
                for (int64_t i = 0; i < n; i++) w[i] = (int32_t)v[i];
                ggml_backend_tensor_set(t, w, 0, n * sizeof(int32_t));
                free(w);
            }
            free(v);
            continue;
        }
        if (!strcmp(t->name, "positive")) {
            for (int64_t i = 0; i < n; i++) v[i] = 1.5f + v[i];
        }
        if (!strcmp(t->name, "causal")) {  // [n_kv, n_q]: query j sees keys up to n_kv - n_q + j
            int64_t nkv = t->ne[0], nq = t->ne[1];
            for (int64_t j = 0; j < nq; j++)
                for (int64_t i = 0; i < nkv; i++) v[j * nkv + i] = i <= nkv - nq + j ? 0.0f : -INFINITY;
        }
        if (ggml_is_quantized(t->type)) {
            size_t sz = ggml_nbytes(t);
            void* q = malloc(sz);
            ggml_quantize_chunk(t->type, v, q, 0, n / t->ne[0], t->ne[0], NULL);
            ggml_backend_tensor_set(t, q, 0, sz);
            free(q);
        } else if (t->type == GGML_TYPE_F16) {
            ggml_fp16_t* h = malloc(n * sizeof(ggml_fp16_t));
            ggml_fp32_to_fp16_row(v, h, n);
            ggml_backend_tensor_set(t, h, 0, n * sizeof(ggml_fp16_t));
            free(h);
        } else {
            ggml_backend_tensor_set(t, v, 0, n * sizeof(float));
        }
        free(v);
    }
    return 1;
}

static float* result(struct run* r) {
    int64_t n = ggml_nelements(r->out);
    float* v = malloc(n * sizeof(float));
    if (r->out->type == GGML_TYPE_F16) {
        ggml_fp16_t* h = malloc(n * sizeof(ggml_fp16_t));
        ggml_backend_tensor_get(r->out, h, 0, n * sizeof(ggml_fp16_t));
        ggml_fp16_to_fp32_row(h, v, n);
        free(h);
    } else {
        ggml_backend_tensor_get(r->out, v, 0, n * sizeof(float));
    }
    return v;
}

static void teardown(struct run* r) {
    if (r->buf) ggml_backend_buffer_free(r->buf);
    ggml_free(r->ctx);
}

// Buffer round trip, clear and device-to-device tensor copy.
static int buffer_checks(ggml_backend_t gpu) {
    struct ggml_init_params p = {8 * ggml_tensor_overhead(), NULL, true};
    struct ggml_context* c = ggml_init(p);
    struct ggml_tensor* a = ggml_new_tensor_1d(c, GGML_TYPE_F32, 1000);
    struct ggml_tensor* b = ggml_new_tensor_1d(c, GGML_TYPE_F32, 1000);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(c, gpu);
    float x[1000], y[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)i * 0.5f;
    ggml_backend_tensor_set(a, x, 0, sizeof x);
    ggml_backend_tensor_copy(a, b);
    memset(y, 0, sizeof y);
    ggml_backend_tensor_get(b, y, 0, sizeof y);
    int ok = memcmp(x, y, sizeof x) == 0;
    ggml_backend_tensor_get(a, y, 400, 40);  // partial read at an offset
    ok = ok && memcmp(y, x + 100, 40) == 0;
    ggml_backend_buffer_clear(buf, 0);
    ggml_backend_tensor_get(a, y, 0, sizeof y);
    for (int i = 0; i < 1000; i++) ok = ok && y[i] == 0.0f;
    ggml_backend_buffer_free(buf);
    ggml_free(c);
    printf("  %-55s %s\n", "buffers: set/get/copy/clear", ok ? "ok" : "FAIL");
    return ok;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s libggml-rocmforge.so libggml-cpu.so\n", argv[0]);
        return 2;
    }
    ggml_backend_reg_t rf = ggml_backend_load(argv[1]);
    ggml_backend_reg_t cpu_reg = ggml_backend_load(argv[2]);
    if (!rf || !cpu_reg) {
        fprintf(stderr, "cannot load %s or %s\n", argv[1], argv[2]);
        return 1;
    }
    ggml_backend_dev_t cpu_dev = ggml_backend_reg_dev_get(cpu_reg, 0);
    ggml_backend_t cpu = ggml_backend_dev_init(cpu_dev, NULL);
    int n_gpu = 0, failures = 0;
    for (size_t d = 0; d < ggml_backend_reg_dev_count(rf); d++) {
        ggml_backend_dev_t dev = ggml_backend_reg_dev_get(rf, d);
        size_t free_mem, total_mem;
        ggml_backend_dev_memory(dev, &free_mem, &total_mem);
        printf("device %zu: %s (%s), %zu/%zu MiB free\n", d, ggml_backend_dev_name(dev), ggml_backend_dev_description(dev),
               free_mem >> 20, total_mem >> 20);
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_GPU) continue;
        // RFHYBRID has its own tests (test_hybrid, test_ops --device RFHYBRID).
        if (strncmp(ggml_backend_dev_name(dev), "RFGPU", 5) != 0) continue;
        n_gpu++;
        ggml_backend_t gpu = ggml_backend_dev_init(dev, NULL);
        if (!gpu) {
            printf("  cannot init backend\n");
            failures++;
            continue;
        }
        if (!buffer_checks(gpu)) failures++;
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
            const struct tcase* tc = &CASES[i];
            if (tc->timed && getenv("SMOKE_SMALL")) continue;  // e.g. under compute-sanitizer
            struct run g = {0}, c = {0};
            double t0 = now_s();
            int ok = setup(&g, tc, gpu, dev, (int)i) && setup(&c, tc, cpu, cpu_dev, (int)i);
            if (!ok) {
                printf("  %-55s FAIL (setup)\n", tc->name);
                failures++;
                teardown(&g);
                teardown(&c);
                continue;
            }
            enum ggml_status sg = ggml_backend_graph_compute(gpu, g.graph);
            double t_first = now_s() - t0;
            enum ggml_status sc = ggml_backend_graph_compute(cpu, c.graph);
            float *vg = result(&g), *vc = result(&c);
            int64_t n = ggml_nelements(g.out);
            double err = 0, ref = 0;
            int bad = sg != GGML_STATUS_SUCCESS || sc != GGML_STATUS_SUCCESS;
            for (int64_t k = 0; k < n; k++) {
                if (isnan(vg[k]) != isnan(vc[k])) bad = 1;
                double e = (double)vg[k] - vc[k];
                err += e * e;
                ref += (double)vc[k] * vc[k];
            }
            double nmse = ref > 0 ? err / ref : err;
            if (nmse > tc->max_nmse || isnan(nmse)) bad = 1;
            // Graph replay: the second identical graph is captured, later ones replay it. The
            // output is poisoned (all bits set: NaN) before each run, so a replay that skipped
            // or misaddressed a kernel shows. Skipped where the output shares memory with an
            // input (poisoning would change the inputs).
            int shares = g.out->view_src != NULL;
            for (int k = 0; k < GGML_MAX_SRC; k++) shares |= g.out->src[k] && g.out->src[k]->data == g.out->data;
            if (!bad && !shares) {
                size_t nb = ggml_nbytes(g.out);
                unsigned char* poison = malloc(nb);
                memset(poison, 0xff, nb);
                double worst = 0;
                for (int rep = 0; rep < 3 && !bad; rep++) {
                    ggml_backend_tensor_set(g.out, poison, 0, nb);
                    if (ggml_backend_graph_compute(gpu, g.graph) != GGML_STATUS_SUCCESS) bad = 1;
                    float* vr = result(&g);
                    double e2 = 0;
                    for (int64_t k = 0; k < n; k++) {
                        if (isnan(vr[k]) != isnan(vc[k])) bad = 1;
                        double e = (double)vr[k] - vc[k];
                        e2 += e * e;
                    }
                    double nr = ref > 0 ? e2 / ref : e2;
                    if (nr > tc->max_nmse || isnan(nr)) bad = 1;
                    if (nr > worst) worst = nr;
                    free(vr);
                }
                free(poison);
                if (bad) printf("  %-55s FAIL on graph replay (worst nmse %.2e)\n", tc->name, worst);
            }
            printf("  %-55s %s  nmse=%.2e", tc->name, bad ? "FAIL" : "ok  ", nmse);
            if (i == 0) printf("  (first graph incl. kernel load: %.2f s)", t_first);
            if (tc->timed && !bad) {
                for (int w = 0; w < 3; w++) ggml_backend_graph_compute(gpu, g.graph);
                int reps = 20;
                double t1 = now_s();
                for (int w = 0; w < reps; w++) ggml_backend_graph_compute(gpu, g.graph);
                double dt = (now_s() - t1) / reps;
                printf("  %.3f ms  %.1f GFLOP/s  %.1f GB/s (weights)", dt * 1e3, tc->flops / dt * 1e-9, tc->bytes / dt * 1e-9);
                // The same product 10 times in one graph: closer to the kernel's own time.
                struct run h = {0};
                g_repeat = 10;
                if (setup(&h, tc, gpu, dev, (int)i)) {
                    ggml_backend_graph_compute(gpu, h.graph);
                    double t2 = now_s();
                    for (int w = 0; w < reps; w++) ggml_backend_graph_compute(gpu, h.graph);
                    double dt2 = (now_s() - t2) / reps / g_repeat;
                    printf(" | x10 in one graph: %.3f ms each  %.1f GFLOP/s  %.1f GB/s", dt2 * 1e3, tc->flops / dt2 * 1e-9,
                           tc->bytes / dt2 * 1e-9);
                }
                g_repeat = 1;
                teardown(&h);
            }
            printf("\n");
            failures += bad;
            free(vg);
            free(vc);
            teardown(&g);
            teardown(&c);
        }
        ggml_backend_free(gpu);
    }
    ggml_backend_free(cpu);
    if (n_gpu == 0) {
        printf("skipped: no GPU\n");
        return 0;
    }
    printf("%d GPU device(s), %d failure(s)\n", n_gpu, failures);
    return failures ? 1 : 0;
}
