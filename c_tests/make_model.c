// make_model: writes a small synthetic GGUF model of a real architecture (real tensor names, shapes and
// metadata keys, random weights) that libllama loads and runs like a downloaded one.
//
//   make_model --arch llama|qwen2|qwen3|gemma3|qwen3moe|phi3|gemma2|bert|gpt-oss|deepseek2 --type f32|f16|bf16|q8_0|q4_0|q4_1|q4_k|q6_k|mxfp4|nvfp4|q1_0|q2_0|q2_k|q3_k|q5_k|q4_k_m|iq4_xs|iq3_m
//              --tokenizer SRC.gguf -o OUT.gguf [--layers N] [--seed S] [--threads N]
//   make_model --preset 8b|1b|70b --tokenizer SRC.gguf -o OUT.gguf [--type q4_0]
//       Llama-3-8B shapes (4096 wide, 32 layers, 32/8 heads, ffn 14336), for benchmarks only (~4.5 GB);
//       1b: Llama-3.2-1B shapes (2048 wide, 16 layers, 32/8 heads, ffn 8192, tied output head);
//       70b: Llama-3-70B shapes (8192 wide, 80 layers, 64/8 heads, ffn 28672; with --layers N fewer).
//   make_model --preset smollm2 --tokenizer SRC.gguf -o OUT.gguf [--type q4_1]
//       SmolLM2-135M shapes and types (576 wide, 30 layers, 9/3 heads, ffn 1536, tied Q8_0 embeddings): the speed of the
//       real model, for benchmarks on machines the 98 MB download cannot reach.
//   make_model --tokenizer-only --tokenizer SRC.gguf -o OUT.gguf
//       Only SRC's tokenizer keys (no tensors): a small tokenizer source to carry instead of a whole model.
//
// The tokenizer (every `tokenizer.*` key) is copied from SRC.gguf, so the vocabulary size is that of SRC
// (49152 for SmolLM2). Weights are uniform random with a small standard deviation (0.02; 0.1 for the
// attention Q/K projections so that attention is not uniform); norm weights are 1 and biases small.
// 2-D weights take --type; 1-D tensors and the MoE router stay F32, as in converted models (gpt-oss with
// --type mxfp4: MXFP4 experts, the other matrices F16, as it ships).
// q4_k_m, iq4_xs and iq3_m are llama.cpp's mixes of those names (see mix_type), as llama-quantize writes
// them without an importance matrix.
// Tensor data is generated and written one chunk of rows at a time, so the 8B preset needs little memory.
// --threads N (default 1) draws, converts and writes the chunks on N threads, for the big presets (70b is
// ~38 GB). With N > 1 each chunk has its own generator, seeded from the seed, the tensor and the chunk:
// the values differ from one thread's (same distribution), and are the same for every N > 1.

#include "ggml.h"
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct shape {
    const char * arch;
    int n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx_train;
    int n_expert, n_expert_used, n_ff_exp;
    float rope_base, rms_eps;
    int tied; // output projection shares token_embd (no output.weight)
    enum ggml_type embd_type; // token_embd's type where it differs from the matrices' (0 = the same)
};

// xorshift64*: deterministic across platforms. `s` is the generator's state (never 0).
static inline float rnd(uint64_t * s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    const uint64_t r = x * 0x2545F4914F6CDD1DULL;
    // The top 24 bits times 2^-23, less 1: [-1, 1). Every step is exact in float (as the division in
    // double it replaces, so --threads 1 writes the same bytes).
    return (float) (r >> 40) * 0x1p-23f - 1.0f;
}

// splitmix64's finalizer: spreads a chunk's (seed, tensor, chunk) over a whole 64-bit state.
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void die(const char * msg) {
    fprintf(stderr, "make_model: %s\n", msg);
    exit(1);
}

static void usage(void) {
    fprintf(stderr,
            "usage: make_model --arch llama|qwen2|qwen3|gemma3|qwen3moe|phi3|gemma2|bert|gpt-oss|deepseek2 --type f32|f16|bf16|q8_0|q4_0|q4_1|q4_k|q6_k|mxfp4|nvfp4|q1_0|q2_0|q2_k|q3_k|q5_k|q4_k_m|iq4_xs|iq3_m\n"
            "                  --tokenizer SRC.gguf -o OUT.gguf [--layers N] [--seed S] [--threads N]\n"
            "       make_model --preset 8b|1b|70b|moe|smollm2 --tokenizer SRC.gguf -o OUT.gguf [--type q4_0] [--threads N]\n"
            "       make_model --tokenizer-only --tokenizer SRC.gguf -o OUT.gguf\n"
            "  --threads N: draw, convert and write with N threads (default 1; N > 1 gives other random values\n"
            "               than 1, the same for every N > 1)\n");
    exit(2);
}

// llama.cpp's type mixes (llama_tensor_get_type_impl in src/llama-quant.cpp, no importance matrix):
// a base type for the matrices and more bits where the recipe puts them (see mix_type).
enum mix { MIX_NONE, MIX_Q4_K_M, MIX_IQ4_XS, MIX_IQ3_M };

// The weight type of --type; a mix's name gives its base type and sets *mix.
static enum ggml_type parse_type(const char * s, enum mix * mix) {
    static const struct { const char * name; enum ggml_type t; enum mix mix; } types[] = {
        {"f32", GGML_TYPE_F32, MIX_NONE}, {"f16", GGML_TYPE_F16, MIX_NONE}, {"bf16", GGML_TYPE_BF16, MIX_NONE},
        {"q8_0", GGML_TYPE_Q8_0, MIX_NONE}, {"q4_0", GGML_TYPE_Q4_0, MIX_NONE}, {"q4_1", GGML_TYPE_Q4_1, MIX_NONE},
        {"q4_k", GGML_TYPE_Q4_K, MIX_NONE}, {"q6_k", GGML_TYPE_Q6_K, MIX_NONE}, {"mxfp4", GGML_TYPE_MXFP4, MIX_NONE},
        {"q4_k_m", GGML_TYPE_Q4_K, MIX_Q4_K_M}, {"iq4_xs", GGML_TYPE_IQ4_XS, MIX_IQ4_XS},
        {"iq3_m", GGML_TYPE_IQ3_S, MIX_IQ3_M}, {"nvfp4", GGML_TYPE_NVFP4, MIX_NONE}, {"q1_0", GGML_TYPE_Q1_0, MIX_NONE},
        {"q2_0", GGML_TYPE_Q2_0, MIX_NONE}, {"q2_k", GGML_TYPE_Q2_K, MIX_NONE}, {"q3_k", GGML_TYPE_Q3_K, MIX_NONE},
        {"q5_k", GGML_TYPE_Q5_K, MIX_NONE},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (!strcmp(s, types[i].name)) {
            *mix = types[i].mix;
            return types[i].t;
        }
    }
    usage();
    return GGML_TYPE_F32;
}

// One tensor to write: its metadata lives in a no_alloc ggml context, its values come from `std` (random
// uniform with that standard deviation) or `constant` (when std == 0).
struct spec {
    struct ggml_tensor * t;
    float std, constant;
};

struct model {
    struct ggml_context * meta;
    struct spec specs[1024];
    int n;
    enum mix mix;
    int n_layer, n_gqa, n_expert, tied;
};

static void add(struct model * m, const char * name, enum ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                float std, float constant) {
    if (m->n == (int) (sizeof m->specs / sizeof m->specs[0])) die("too many tensors");
    struct ggml_tensor * t;
    if (ne2 > 1) t = ggml_new_tensor_3d(m->meta, type, ne0, ne1, ne2);
    else if (ne1 > 1) t = ggml_new_tensor_2d(m->meta, type, ne0, ne1);
    else t = ggml_new_tensor_1d(m->meta, type, ne0);
    ggml_set_name(t, name);
    m->specs[m->n].t = t;
    m->specs[m->n].std = std;
    m->specs[m->n].constant = constant;
    m->n++;
}

// Matrix weights: `wtype` unless its block size does not divide the row.
static enum ggml_type matrix_type(enum ggml_type wtype, int64_t ne0) {
    return ne0 % ggml_blck_size(wtype) == 0 ? wtype : GGML_TYPE_F16;
}

// The type llama-quantize gives matrix `name` in the model's mix (`base` without one), following
// llama_tensor_get_type_impl for the tensors these models have, without an importance matrix.
// Simplified: no per-architecture exceptions (Falcon, 70B), layers counted from the names.
static enum ggml_type mix_type(const struct model * m, enum ggml_type base, const char * name) {
    if (m->mix == MIX_NONE) return base;
    int il = 0;
    sscanf(name, "blk.%d.", &il);
    const int n = m->n_layer;
    // llama-quant's use_more_bits: the first and last eighth of the layers and every third between.
    const int more_bits = il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
    const int x8 = m->n_expert == 8;
    const enum mix mix = m->mix;
    // The output head (and a tied embedding, which is the head): Q6_K in all three mixes.
    if (!strcmp(name, "output.weight") || (m->tied && !strcmp(name, "token_embd.weight"))) return GGML_TYPE_Q6_K;
    if (strstr(name, "attn_v.weight")) {
        if (x8) return GGML_TYPE_Q8_0;
        if (mix == MIX_IQ3_M) return GGML_TYPE_Q4_K;
        if (mix == MIX_IQ4_XS && m->n_gqa >= 4) return GGML_TYPE_Q5_K;
        if (mix == MIX_Q4_K_M && more_bits) return GGML_TYPE_Q6_K;
        return base;
    }
    if (strstr(name, "attn_k.weight")) return x8 ? GGML_TYPE_Q8_0 : base;
    if (strstr(name, "attn_qkv.weight")) {
        return mix == MIX_Q4_K_M ? GGML_TYPE_Q5_K : mix == MIX_IQ3_M ? GGML_TYPE_Q4_K : base;
    }
    if (strstr(name, "attn_output.weight")) {
        if (x8) return GGML_TYPE_Q5_K;
        return mix == MIX_IQ3_M ? GGML_TYPE_Q4_K : base;
    }
    if (strstr(name, "ffn_down")) {
        if (mix == MIX_Q4_K_M && more_bits) return GGML_TYPE_Q6_K;
        if (mix == MIX_IQ4_XS && il < n / 8) return GGML_TYPE_Q5_K;
        if (mix == MIX_IQ3_M && (il < n / 8 || (x8 && more_bits))) return GGML_TYPE_Q4_K;
    }
    return base;
}

static void add_w(struct model * m, enum ggml_type wtype, const char * name, int64_t ne0, int64_t ne1, int64_t ne2, float std) {
    add(m, name, matrix_type(mix_type(m, wtype, name), ne0), ne0, ne1, ne2, std, 0.0f);
}

static void add_norm(struct model * m, const char * name, int64_t n) {
    add(m, name, GGML_TYPE_F32, n, 1, 1, 0.0f, 1.0f);
}

static void add_bias(struct model * m, const char * name, int64_t n) {
    add(m, name, GGML_TYPE_F32, n, 1, 1, 0.05f, 0.0f);
}

// BERT (an encoder for embeddings): learned positions and token types, LayerNorms with biases after
// attention and after the GELU feed-forward, biases on every projection; no output head.
static void build_bert(struct model * m, const struct shape * s, enum ggml_type wtype, int n_vocab) {
    const int64_t E = s->n_embd, F = s->n_ff;
    const float w = 0.02f, wqk = 0.1f;
    char name[128];
    add_w(m, wtype, "token_embd.weight", E, n_vocab, 1, w);
    add(m, "token_types.weight", GGML_TYPE_F32, E, 2, 1, w, 0.0f);
    add_w(m, wtype, "position_embd.weight", E, s->n_ctx_train, 1, w);
    add_norm(m, "token_embd_norm.weight", E);
    add_bias(m, "token_embd_norm.bias", E);
    for (int il = 0; il < s->n_layer; il++) {
#define NAME(fmt) (snprintf(name, sizeof name, "blk.%d." fmt, il), name)
        add_w(m, wtype, NAME("attn_q.weight"), E, E, 1, wqk);
        add_bias(m, NAME("attn_q.bias"), E);
        add_w(m, wtype, NAME("attn_k.weight"), E, E, 1, wqk);
        add_bias(m, NAME("attn_k.bias"), E);
        add_w(m, wtype, NAME("attn_v.weight"), E, E, 1, w);
        add_bias(m, NAME("attn_v.bias"), E);
        add_w(m, wtype, NAME("attn_output.weight"), E, E, 1, w);
        add_bias(m, NAME("attn_output.bias"), E);
        add_norm(m, NAME("attn_output_norm.weight"), E);
        add_bias(m, NAME("attn_output_norm.bias"), E);
        add_w(m, wtype, NAME("ffn_up.weight"), E, F, 1, w);
        add_bias(m, NAME("ffn_up.bias"), F);
        add_w(m, wtype, NAME("ffn_down.weight"), F, E, 1, w);
        add_bias(m, NAME("ffn_down.bias"), E);
        add_norm(m, NAME("layer_output_norm.weight"), E);
        add_bias(m, NAME("layer_output_norm.bias"), E);
#undef NAME
    }
}

// gpt-oss: experts in `wtype` (MXFP4 as shipped), the other matrices F16 then; biases on Q/K/V, the
// attention output, the router and every expert (ADD_ID), one attention sink per head, the pre- and
// post-attention RMS norms and no FFN norm, an untied output head.
static void build_gpt_oss(struct model * m, const struct shape * s, enum ggml_type wtype, int n_vocab) {
    const int64_t E = s->n_embd, Q = (int64_t) s->head_dim * s->n_head, KV = (int64_t) s->head_dim * s->n_head_kv;
    const int64_t FE = s->n_ff_exp, X = s->n_expert;
    const enum ggml_type dtype = wtype == GGML_TYPE_MXFP4 ? GGML_TYPE_F16 : wtype;
    const float w = 0.02f, wqk = 0.1f;
    char name[128];
    add_w(m, dtype, "token_embd.weight", E, n_vocab, 1, w);
    add_norm(m, "output_norm.weight", E);
    add_w(m, dtype, "output.weight", E, n_vocab, 1, w);
    for (int il = 0; il < s->n_layer; il++) {
#define NAME(fmt) (snprintf(name, sizeof name, "blk.%d." fmt, il), name)
        add_norm(m, NAME("attn_norm.weight"), E);
        add_norm(m, NAME("post_attention_norm.weight"), E);
        add_w(m, dtype, NAME("attn_q.weight"), E, Q, 1, wqk);
        add_bias(m, NAME("attn_q.bias"), Q);
        add_w(m, dtype, NAME("attn_k.weight"), E, KV, 1, wqk);
        add_bias(m, NAME("attn_k.bias"), KV);
        add_w(m, dtype, NAME("attn_v.weight"), E, KV, 1, w);
        add_bias(m, NAME("attn_v.bias"), KV);
        add_w(m, dtype, NAME("attn_output.weight"), Q, E, 1, w);
        add_bias(m, NAME("attn_output.bias"), E);
        // Sinks of the order of the attention logits, so that they take a real share.
        add(m, NAME("attn_sinks.weight"), GGML_TYPE_F32, s->n_head, 1, 1, 1.0f, 0.0f);
        add(m, NAME("ffn_gate_inp.weight"), GGML_TYPE_F32, E, X, 1, 0.1f, 0.0f);
        add_bias(m, NAME("ffn_gate_inp.bias"), X);
        add_w(m, wtype, NAME("ffn_gate_exps.weight"), E, FE, X, w);
        add(m, NAME("ffn_gate_exps.bias"), GGML_TYPE_F32, FE, X, 1, 0.05f, 0.0f);
        add_w(m, wtype, NAME("ffn_up_exps.weight"), E, FE, X, w);
        add(m, NAME("ffn_up_exps.bias"), GGML_TYPE_F32, FE, X, 1, 0.05f, 0.0f);
        add_w(m, wtype, NAME("ffn_down_exps.weight"), FE, E, X, w);
        add(m, NAME("ffn_down_exps.bias"), GGML_TYPE_F32, E, X, 1, 0.05f, 0.0f);
#undef NAME
    }
}

// DeepSeek-V2-Lite's multi-head latent attention, scaled down: K and V compressed to a 64-wide latent
// (plus a 16-wide shared RoPE part), per-head 32 + 16 query/key and 32 value dims; the cache holds
// the latent (key_length 80, value_length 64, one KV head), as converted MLA models declare.
enum { DS_KV_LORA = 64, DS_ROPE = 16, DS_NOPE = 32, DS_V = 32 };

// deepseek2 with MLA (q_lora_rank 0 as V2-Lite: one Q projection): layer 0 a dense FFN (leading dense
// block), the others MoE with one shared expert; untied output head.
static void build_deepseek2(struct model * m, const struct shape * s, enum ggml_type wtype, int n_vocab) {
    const int64_t E = s->n_embd, H = s->n_head, F = s->n_ff, FE = s->n_ff_exp, X = s->n_expert;
    const float w = 0.02f, wqk = 0.1f;
    char name[128];
    add_w(m, wtype, "token_embd.weight", E, n_vocab, 1, w);
    add_norm(m, "output_norm.weight", E);
    add_w(m, wtype, "output.weight", E, n_vocab, 1, w);
    for (int il = 0; il < s->n_layer; il++) {
#define NAME(fmt) (snprintf(name, sizeof name, "blk.%d." fmt, il), name)
        add_norm(m, NAME("attn_norm.weight"), E);
        add_norm(m, NAME("attn_kv_a_norm.weight"), DS_KV_LORA);
        add_w(m, wtype, NAME("attn_q.weight"), E, H * (DS_NOPE + DS_ROPE), 1, wqk);
        add_w(m, wtype, NAME("attn_kv_a_mqa.weight"), E, DS_KV_LORA + DS_ROPE, 1, wqk);
        add_w(m, wtype, NAME("attn_k_b.weight"), DS_NOPE, DS_KV_LORA, H, wqk);
        add_w(m, wtype, NAME("attn_v_b.weight"), DS_KV_LORA, DS_V, H, 0.1f);
        add_w(m, wtype, NAME("attn_output.weight"), H * DS_V, E, 1, w);
        add_norm(m, NAME("ffn_norm.weight"), E);
        if (il == 0) {
            add_w(m, wtype, NAME("ffn_gate.weight"), E, F, 1, w);
            add_w(m, wtype, NAME("ffn_up.weight"), E, F, 1, w);
            add_w(m, wtype, NAME("ffn_down.weight"), F, E, 1, w);
        } else {
            add(m, NAME("ffn_gate_inp.weight"), GGML_TYPE_F32, E, X, 1, 0.1f, 0.0f);
            add_w(m, wtype, NAME("ffn_gate_exps.weight"), E, FE, X, w);
            add_w(m, wtype, NAME("ffn_up_exps.weight"), E, FE, X, w);
            add_w(m, wtype, NAME("ffn_down_exps.weight"), FE, E, X, w);
            add_w(m, wtype, NAME("ffn_gate_shexp.weight"), E, FE, 1, w);
            add_w(m, wtype, NAME("ffn_up_shexp.weight"), E, FE, 1, w);
            add_w(m, wtype, NAME("ffn_down_shexp.weight"), FE, E, 1, w);
        }
#undef NAME
    }
}

static void build(struct model * m, const struct shape * s, enum ggml_type wtype, int n_vocab) {
    const char * a = s->arch;
    if (!strcmp(a, "deepseek2")) {
        build_deepseek2(m, s, wtype, n_vocab);
        return;
    }
    if (!strcmp(a, "bert")) {
        build_bert(m, s, wtype, n_vocab);
        return;
    }
    if (!strcmp(a, "gpt-oss")) {
        build_gpt_oss(m, s, wtype, n_vocab);
        return;
    }
    const int64_t E = s->n_embd, D = s->head_dim, Q = (int64_t) s->head_dim * s->n_head;
    const int64_t KV = (int64_t) s->head_dim * s->n_head_kv, F = s->n_ff;
    const float w = 0.02f, wqk = 0.1f;
    char name[128];
    const int tied = s->tied || !strcmp(a, "qwen2") || !strcmp(a, "gemma3") || !strcmp(a, "gemma2");

    add_w(m, s->embd_type != GGML_TYPE_F32 ? s->embd_type : wtype, "token_embd.weight", E, n_vocab, 1, w);
    add_norm(m, "output_norm.weight", E);
    if (!tied) add_w(m, wtype, "output.weight", E, n_vocab, 1, w);

    for (int il = 0; il < s->n_layer; il++) {
#define NAME(fmt) (snprintf(name, sizeof name, "blk.%d." fmt, il), name)
        add_norm(m, NAME("attn_norm.weight"), E);
        if (!strcmp(a, "phi3")) {
            // One fused Q|K|V projection (rows Q, then K, then V), as Phi-3 ships.
            add_w(m, wtype, NAME("attn_qkv.weight"), E, Q + 2 * KV, 1, wqk);
        } else {
            add_w(m, wtype, NAME("attn_q.weight"), E, Q, 1, wqk);
            add_w(m, wtype, NAME("attn_k.weight"), E, KV, 1, wqk);
            add_w(m, wtype, NAME("attn_v.weight"), E, KV, 1, w);
        }
        add_w(m, wtype, NAME("attn_output.weight"), Q, E, 1, w);
        if (!strcmp(a, "qwen2")) {
            add(m, NAME("attn_q.bias"), GGML_TYPE_F32, Q, 1, 1, 0.05f, 0.0f);
            add(m, NAME("attn_k.bias"), GGML_TYPE_F32, KV, 1, 1, 0.05f, 0.0f);
            add(m, NAME("attn_v.bias"), GGML_TYPE_F32, KV, 1, 1, 0.05f, 0.0f);
        }
        if (!strcmp(a, "qwen3") || !strcmp(a, "qwen3moe") || !strcmp(a, "gemma3")) {
            add_norm(m, NAME("attn_q_norm.weight"), D);
            add_norm(m, NAME("attn_k_norm.weight"), D);
        }
        if (!strcmp(a, "gemma3") || !strcmp(a, "gemma2")) add_norm(m, NAME("post_attention_norm.weight"), E);
        add_norm(m, NAME("ffn_norm.weight"), E);
        if (s->n_expert > 0) {
            const int64_t FE = s->n_ff_exp, X = s->n_expert;
            add(m, NAME("ffn_gate_inp.weight"), GGML_TYPE_F32, E, X, 1, 0.1f, 0.0f);
            add_w(m, wtype, NAME("ffn_gate_exps.weight"), E, FE, X, w);
            add_w(m, wtype, NAME("ffn_up_exps.weight"), E, FE, X, w);
            add_w(m, wtype, NAME("ffn_down_exps.weight"), FE, E, X, w);
        } else if (!strcmp(a, "phi3")) {
            // No ffn_gate: ffn_up is twice as wide and the graph splits it into gate and up halves.
            add_w(m, wtype, NAME("ffn_up.weight"), E, 2 * F, 1, w);
            add_w(m, wtype, NAME("ffn_down.weight"), F, E, 1, w);
        } else {
            add_w(m, wtype, NAME("ffn_gate.weight"), E, F, 1, w);
            add_w(m, wtype, NAME("ffn_up.weight"), E, F, 1, w);
            add_w(m, wtype, NAME("ffn_down.weight"), F, E, 1, w);
        }
        if (!strcmp(a, "gemma3") || !strcmp(a, "gemma2")) add_norm(m, NAME("post_ffw_norm.weight"), E);
#undef NAME
    }
}

static void set_hparams(struct gguf_context * g, const struct shape * s, int n_vocab) {
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
    gguf_set_val_str(g, "general.architecture", s->arch);
    gguf_set_val_str(g, "general.name", "rocmforge synthetic");
    gguf_set_val_u32(g, KEY("vocab_size"), (uint32_t) n_vocab);
    gguf_set_val_u32(g, KEY("context_length"), (uint32_t) s->n_ctx_train);
    gguf_set_val_u32(g, KEY("embedding_length"), (uint32_t) s->n_embd);
    gguf_set_val_u32(g, KEY("block_count"), (uint32_t) s->n_layer);
    gguf_set_val_u32(g, KEY("feed_forward_length"), (uint32_t) s->n_ff);
    gguf_set_val_u32(g, KEY("attention.head_count"), (uint32_t) s->n_head);
    gguf_set_val_u32(g, KEY("attention.head_count_kv"), (uint32_t) s->n_head_kv);
    gguf_set_val_u32(g, KEY("attention.key_length"), (uint32_t) s->head_dim);
    gguf_set_val_u32(g, KEY("attention.value_length"), (uint32_t) s->head_dim);
    gguf_set_val_u32(g, KEY("rope.dimension_count"), (uint32_t) s->head_dim);
    gguf_set_val_f32(g, KEY("rope.freq_base"), s->rope_base);
    gguf_set_val_f32(g, KEY("attention.layer_norm_rms_epsilon"), s->rms_eps);
    if (s->n_expert > 0) {
        gguf_set_val_u32(g, KEY("expert_count"), (uint32_t) s->n_expert);
        gguf_set_val_u32(g, KEY("expert_used_count"), (uint32_t) s->n_expert_used);
        gguf_set_val_u32(g, KEY("expert_feed_forward_length"), (uint32_t) s->n_ff_exp);
    }
    if (!strcmp(s->arch, "gemma3")) {
        // Every other layer uses a 16-token sliding window, so 64 positions exercise the SWA mask.
        gguf_set_val_u32(g, KEY("attention.sliding_window"), 16);
        gguf_set_val_u32(g, KEY("attention.sliding_window_pattern"), 2);
        gguf_set_val_f32(g, KEY("rope.freq_base_swa"), 10000.0f);
    }
    if (!strcmp(s->arch, "bert")) {
        // Non-causal, mean pooling (llama_get_embeddings_seq), two token types as BERT checkpoints have.
        gguf_set_val_f32(g, KEY("attention.layer_norm_epsilon"), 1e-12f);
        gguf_set_val_bool(g, KEY("attention.causal"), false);
        gguf_set_val_u32(g, KEY("pooling_type"), 1);
        gguf_set_val_u32(g, "tokenizer.ggml.token_type_count", 2);
    }
    if (!strcmp(s->arch, "deepseek2")) {
        gguf_set_val_u32(g, KEY("rope.dimension_count"), DS_ROPE);
        gguf_set_val_u32(g, KEY("attention.key_length"), DS_KV_LORA + DS_ROPE);
        gguf_set_val_u32(g, KEY("attention.value_length"), DS_KV_LORA);
        gguf_set_val_u32(g, KEY("attention.key_length_mla"), DS_NOPE + DS_ROPE);
        gguf_set_val_u32(g, KEY("attention.value_length_mla"), DS_V);
        gguf_set_val_u32(g, KEY("attention.q_lora_rank"), 0);
        gguf_set_val_u32(g, KEY("attention.kv_lora_rank"), DS_KV_LORA);
        gguf_set_val_u32(g, KEY("leading_dense_block_count"), 1);
        gguf_set_val_u32(g, KEY("expert_shared_count"), 1);
        gguf_set_val_f32(g, KEY("expert_weights_scale"), 1.0f);
        gguf_set_val_bool(g, KEY("expert_weights_norm"), false);
    }
    if (!strcmp(s->arch, "gpt-oss")) {
        // Every other layer a 16-token sliding window (the default pattern of 2), as gpt-oss's 128.
        gguf_set_val_u32(g, KEY("attention.sliding_window"), 16);
    }
    if (!strcmp(s->arch, "gemma2")) {
        // Gemma 2's caps (50 on attention logits, 30 on the output's) are far above what random weights
        // reach; small caps put the tanh in its curved range. SWA on every other layer, 16 tokens wide.
        gguf_set_val_u32(g, KEY("attention.sliding_window"), 16);
        gguf_set_val_f32(g, KEY("attn_logit_softcapping"), 2.0f);
        gguf_set_val_f32(g, KEY("final_logit_softcapping"), 1.0f);
    }
#undef KEY
}

// Copies every tokenizer.* key of `src`; returns the vocabulary size.
static int copy_tokenizer(struct gguf_context * dst, const char * src_path) {
    struct gguf_init_params p = { /*no_alloc*/ true, /*ctx*/ NULL };
    struct gguf_context * src = gguf_init_from_file(src_path, p);
    if (!src) die("cannot read the tokenizer source GGUF");
    const int64_t id = gguf_find_key(src, "tokenizer.ggml.tokens");
    if (id < 0) die("tokenizer source has no tokenizer.ggml.tokens");
    const int n_vocab = (int) gguf_get_arr_n(src, id);
    // gguf_set_kv copies all keys; drop the ones that are not the tokenizer's.
    struct gguf_context * tmp = gguf_init_empty();
    gguf_set_kv(tmp, src);
    for (int64_t i = gguf_get_n_kv(tmp) - 1; i >= 0; i--) {
        const char * k = gguf_get_key(tmp, i);
        if (strncmp(k, "tokenizer.", 10) != 0) gguf_remove_key(tmp, k);
    }
    gguf_set_kv(dst, tmp);
    gguf_free(tmp);
    gguf_free(src);
    return n_vocab;
}

// Tensor data is made in chunks of CHUNK_ROWS rows (the unit of work a thread takes), each drawn and
// converted BATCH_VALUES values at a time so that the floats stay in cache.
enum { CHUNK_ROWS = 256, BATCH_VALUES = 16 * 1024, LANES = 4 };
_Static_assert(LANES == 4, "draw unrolls four lanes");

// The work of writing every tensor: chunks taken in order under `lock`.
struct writer {
    const struct model * m;
    const size_t * offs; // each tensor's offset in the file
    int fd;
    // One thread: one generator (`rng`) runs through every chunk in order, the values make_model wrote
    // before --threads (the end-to-end tests' models). Several: each chunk its own LANES generators
    // (value j of the chunk from lane j % LANES: independent chains run ~2.5x faster than one), seeded
    // from (seed, tensor, chunk), so the file does not depend on the thread count or on which thread
    // takes which chunk.
    int per_chunk;
    uint64_t seed, rng;
    size_t src_floats, dst_bytes; // per-thread buffer sizes
    pthread_mutex_t lock;
    int next_t;      // the next chunk to take: tensor index ...
    int64_t next_r0; // ... and first row
};

static void pwrite_all(int fd, const void * buf, size_t n, size_t off) {
    const char * p = buf;
    while (n > 0) {
        const ssize_t w = pwrite(fd, p, n, (off_t) off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("write failed");
        p += w;
        n -= (size_t) w;
        off += (size_t) w;
    }
}

// n values uniform in [-amp, amp): from rng[0] alone (lanes 1), or value `pos + i` of the chunk from
// rng[(pos + i) % LANES].
static void draw(float * dst, int64_t n, float amp, uint64_t * rng, int lanes, int64_t pos) {
    int64_t i = 0;
    if (lanes == 1) {
        for (; i < n; i++) dst[i] = amp * rnd(rng);
        return;
    }
    for (; i < n && (pos + i) % LANES; i++) dst[i] = amp * rnd(&rng[(pos + i) % LANES]);
    uint64_t a = rng[0], b = rng[1], c = rng[2], d = rng[3];
    for (; i + LANES <= n; i += LANES) {
        dst[i] = amp * rnd(&a);
        dst[i + 1] = amp * rnd(&b);
        dst[i + 2] = amp * rnd(&c);
        dst[i + 3] = amp * rnd(&d);
    }
    rng[0] = a;
    rng[1] = b;
    rng[2] = c;
    rng[3] = d;
    for (; i < n; i++) dst[i] = amp * rnd(&rng[(pos + i) % LANES]);
}

// `nr` rows of tensor `sp` drawn from generators `rng` (see draw) into `dst` in the tensor's type
// (src: scratch floats); returns the bytes made.
static size_t fill_chunk(const struct spec * sp, int64_t nr, uint64_t * rng, int lanes, float * src, size_t src_floats,
                         char * dst) {
    const struct ggml_tensor * t = sp->t;
    const int64_t n_per_row = t->ne[0];
    const size_t row_bytes = ggml_row_size(t->type, n_per_row);
    const float amp = sp->std * sqrtf(3.0f); // uniform in [-amp, amp) has standard deviation std
    int64_t batch = (int64_t) src_floats / n_per_row;
    if (batch < 1) batch = 1;
    size_t bytes = 0;
    for (int64_t b0 = 0; b0 < nr; b0 += batch) {
        const int64_t nb = nr - b0 < batch ? nr - b0 : batch;
        const int64_t n = nb * n_per_row;
        if (sp->std > 0) {
            draw(src, n, amp, rng, lanes, b0 * n_per_row);
        } else {
            for (int64_t i = 0; i < n; i++) src[i] = sp->constant;
        }
        char * out = dst + b0 * row_bytes;
        switch (t->type) {
            case GGML_TYPE_F32: memcpy(out, src, n * sizeof(float)); break;
            case GGML_TYPE_F16: ggml_fp32_to_fp16_row(src, (ggml_fp16_t *) out, n); break;
            case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(src, (ggml_bf16_t *) out, n); break;
            default: ggml_quantize_chunk(t->type, src, out, 0, nb, n_per_row, NULL); break;
        }
        bytes += nb * row_bytes;
    }
    return bytes;
}

// Takes chunks until none is left: draws, converts and writes each at its place in the file.
static void * write_worker(void * arg) {
    struct writer * w = arg;
    float * src = malloc(sizeof(float) * w->src_floats);
    char * dst = malloc(w->dst_bytes);
    if (!src || !dst) die("out of memory");
    for (;;) {
        pthread_mutex_lock(&w->lock);
        while (w->next_t < w->m->n && w->next_r0 >= ggml_nrows(w->m->specs[w->next_t].t)) {
            w->next_t++;
            w->next_r0 = 0;
        }
        const int ti = w->next_t;
        const int64_t r0 = w->next_r0;
        w->next_r0 += CHUNK_ROWS;
        pthread_mutex_unlock(&w->lock);
        if (ti >= w->m->n) break;
        const struct spec * sp = &w->m->specs[ti];
        const int64_t n_rows = ggml_nrows(sp->t);
        const int64_t nr = n_rows - r0 < CHUNK_ROWS ? n_rows - r0 : CHUNK_ROWS;
        const uint64_t key = mix64(w->seed ^ mix64(((uint64_t) ti << 32) + (uint64_t) (r0 / CHUNK_ROWS)));
        uint64_t local[LANES];
        for (int k = 0; k < LANES; k++) {
            local[k] = mix64(key + (uint64_t) k);
            if (local[k] == 0) local[k] = 1; // xorshift's one fixed point
        }
        const size_t bytes = w->per_chunk ? fill_chunk(sp, nr, local, LANES, src, w->src_floats, dst)
                                          : fill_chunk(sp, nr, &w->rng, 1, src, w->src_floats, dst);
        pwrite_all(w->fd, dst, bytes, w->offs[ti] + (size_t) r0 * ggml_row_size(sp->t->type, sp->t->ne[0]));
    }
    free(src);
    free(dst);
    return NULL;
}

// Writes every tensor's data with `n_threads` threads into `fd` at `offs`.
static void write_tensors(const struct model * m, const size_t * offs, int fd, uint64_t seed, int n_threads) {
    struct writer w = { m, offs, fd, n_threads > 1, seed, seed * 0x9E3779B97F4A7C15ULL + 1, BATCH_VALUES, 0,
                        PTHREAD_MUTEX_INITIALIZER, 0, 0 };
    for (int i = 0; i < m->n; i++) {
        const struct ggml_tensor * t = m->specs[i].t;
        if ((size_t) t->ne[0] > w.src_floats) w.src_floats = (size_t) t->ne[0];
        const size_t chunk_bytes = ggml_row_size(t->type, t->ne[0]) * CHUNK_ROWS;
        if (chunk_bytes > w.dst_bytes) w.dst_bytes = chunk_bytes;
        // Tables some quantizers need, made once here rather than under ggml's lock in every thread.
        ggml_quantize_init(t->type);
    }
    if (n_threads <= 1) {
        write_worker(&w);
        return;
    }
    pthread_t * th = malloc(sizeof(pthread_t) * n_threads);
    if (!th) die("out of memory");
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&th[i], NULL, write_worker, &w) != 0) die("cannot start a thread");
    }
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
    free(th);
}

int main(int argc, char ** argv) {
    const char * arch = NULL, * preset = NULL, * type_s = NULL, * out = NULL, * tok = NULL;
    int layers = 0, tokenizer_only = 0, n_threads = 1;
    uint64_t seed = 42;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer-only")) { tokenizer_only = 1; continue; }
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        if (!strcmp(argv[i], "--arch")) arch = v;
        else if (!strcmp(argv[i], "--preset")) preset = v;
        else if (!strcmp(argv[i], "--type")) type_s = v;
        else if (!strcmp(argv[i], "-o")) out = v;
        else if (!strcmp(argv[i], "--tokenizer")) tok = v;
        else if (!strcmp(argv[i], "--layers")) layers = atoi(v);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(argv[i], "--threads")) n_threads = atoi(v);
        else usage();
        i++;
    }
    if (tokenizer_only && out && tok) {
        struct gguf_context * g = gguf_init_empty();
        const int n_vocab = copy_tokenizer(g, tok);
        if (!gguf_write_to_file(g, out, /*only_meta*/ false)) die("cannot write the output");
        fprintf(stderr, "make_model: wrote %s (tokenizer only, vocab %d)\n", out, n_vocab);
        gguf_free(g);
        return 0;
    }
    if (!out || !tok || (!arch && !preset) || n_threads < 1) usage();

    struct shape s;
    enum ggml_type wtype;
    enum mix mix = MIX_NONE;
    if (preset) {
        if (!strcmp(preset, "8b")) {
            s = (struct shape) { "llama", 4096, 32, 32, 8, 128, 14336, 8192, 0, 0, 0, 500000.0f, 1e-5f, 0 };
            wtype = parse_type(type_s ? type_s : "q4_0", &mix);
        } else if (!strcmp(preset, "70b")) {
            // Llama-3-70B's shapes (8192 wide, 80 layers, 64/8 heads, ffn 28672): ~38 GB at Q4_0, so
            // benchmarks take --layers N for a model of the same matrices that fits their time.
            s = (struct shape) { "llama", 8192, 80, 64, 8, 128, 28672, 8192, 0, 0, 0, 500000.0f, 1e-5f, 0 };
            wtype = parse_type(type_s ? type_s : "q4_0", &mix);
        } else if (!strcmp(preset, "moe")) {
            // Qwen3-30B-A3B's shapes: 128 experts of FFN 768, 8 used, 48 layers, GQA 32:4.
            s = (struct shape) { "qwen3moe", 2048, 48, 32, 4, 128, 6144, 8192, 128, 8, 768, 1000000.0f, 1e-6f, 0 };
            wtype = parse_type(type_s ? type_s : "q4_0", &mix);
        } else if (!strcmp(preset, "1b")) {
            // Llama-3.2-1B's shapes (tied output head).
            s = (struct shape) { "llama", 2048, 16, 32, 8, 64, 8192, 8192, 0, 0, 0, 500000.0f, 1e-5f, 1 };
            wtype = parse_type(type_s ? type_s : "q4_0", &mix);
        } else if (!strcmp(preset, "smollm2")) {
            s = (struct shape) { "llama", 576, 30, 9, 3, 64, 1536, 8192, 0, 0, 0, 100000.0f, 1e-5f, 1, GGML_TYPE_Q8_0 };
            wtype = parse_type(type_s ? type_s : "q4_1", &mix);
        } else usage();
    } else {
        wtype = parse_type(type_s ? type_s : "f16", &mix);
        // K-quants and i-quants need rows of 256 values: double the widths for them.
        const int k = ggml_blck_size(wtype) == 256 ? 2 : 1;
        s = (struct shape) { arch, 128 * k, 2, 4, 2, 32 * k, 256 * k, 2048, 0, 0, 0, 10000.0f, 1e-6f };
        if (!strcmp(arch, "llama")) { s.rope_base = 500000.0f; s.rms_eps = 1e-5f; }
        else if (!strcmp(arch, "qwen2") || !strcmp(arch, "qwen3")) { s.rope_base = 1000000.0f; }
        else if (!strcmp(arch, "gemma3")) { s.n_layer = 4; s.rope_base = 1000000.0f; }
        else if (!strcmp(arch, "gemma2")) { s.rope_base = 10000.0f; }
        else if (!strcmp(arch, "phi3")) { s.rms_eps = 1e-5f; }
        else if (!strcmp(arch, "gpt-oss")) {
            // Q wider than the embedding (8 heads of 32 on 128) as gpt-oss's 64 x 64 on 2880; 8 experts, 2 used.
            s.n_head = 8; s.n_expert = 8; s.n_expert_used = 2; s.n_ff_exp = 128 * k; s.rope_base = 150000.0f;
            s.rms_eps = 1e-5f;
        }
        else if (!strcmp(arch, "deepseek2")) {
            s.n_head_kv = 1; s.n_expert = 8; s.n_expert_used = 2; s.n_ff_exp = 64 * k;
        }
        else if (!strcmp(arch, "bert")) { s.n_head_kv = s.n_head; s.n_ctx_train = 512; }
        else if (!strcmp(arch, "qwen3moe")) {
            s.n_expert = 8; s.n_expert_used = 2; s.n_ff_exp = 128 * k; s.rope_base = 1000000.0f;
        } else usage();
    }
    if (layers > 0) s.n_layer = layers;

    struct gguf_context * g = gguf_init_empty();
    const int n_vocab = copy_tokenizer(g, tok);
    set_hparams(g, &s, n_vocab);

    struct ggml_init_params ip = { /*mem_size*/ 1024 * ggml_tensor_overhead(), /*mem_buffer*/ NULL, /*no_alloc*/ true };
    const int tied = s.tied || !strcmp(s.arch, "qwen2") || !strcmp(s.arch, "gemma3") || !strcmp(s.arch, "gemma2");
    struct model m = { ggml_init(ip), {{0}}, 0, mix, s.n_layer, s.n_head / s.n_head_kv, s.n_expert, tied };
    build(&m, &s, wtype, n_vocab);
    for (int i = 0; i < m.n; i++) gguf_add_tensor(g, m.specs[i].t);

    // Header first (tensor infos included), then each tensor's data at its offset in the data section.
    if (!gguf_write_to_file(g, out, /*only_meta*/ true)) die("cannot write the header");
    const int fd = open(out, O_WRONLY);
    if (fd < 0) die("cannot reopen the output");
    const size_t data0 = gguf_get_meta_size(g);
    size_t * offs = malloc(sizeof(size_t) * (m.n > 0 ? m.n : 1));
    if (!offs) die("out of memory");
    size_t end = data0;
    for (int i = 0; i < m.n; i++) {
        offs[i] = data0 + gguf_get_tensor_offset(g, i);
        if (offs[i] + ggml_nbytes(m.specs[i].t) > end) end = offs[i] + ggml_nbytes(m.specs[i].t);
    }
    // The file's final size, padded to the alignment as gguf writers do (the gaps read as zeros).
    const size_t align = gguf_get_alignment(g);
    end = (end + align - 1) / align * align;
    if (ftruncate(fd, (off_t) end) != 0) die("cannot size the output");
    write_tensors(&m, offs, fd, seed, n_threads);
    if (close(fd) != 0) die("close failed");
    free(offs);
    fprintf(stderr, "make_model: wrote %s (%s, %d layers, %d tensors, vocab %d, %s%s)\n", out, s.arch, s.n_layer, m.n,
            n_vocab, ggml_type_name(wtype), mix != MIX_NONE ? " mix" : "");
    // Tensors per type, so a mix's make-up shows in the test log.
    int count[GGML_TYPE_COUNT] = { 0 };
    for (int i = 0; i < m.n; i++) count[m.specs[i].t->type]++;
    fprintf(stderr, "make_model: tensors by type:");
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        if (count[t]) fprintf(stderr, " %s %d", ggml_type_name((enum ggml_type) t), count[t]);
    }
    fprintf(stderr, "\n");
    ggml_free(m.meta);
    gguf_free(g);
    return 0;
}
