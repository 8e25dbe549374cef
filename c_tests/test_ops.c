// test_ops: every op/type RFCPU claims is computed on RFCPU and on ggml's own CPU backend and
// the results are compared.
//
// A catalog of constructors builds cases (graphs in a no_alloc context) for every op and type
// that the CPU device may claim now or later. For each case:
//   - if RFCPU does not claim every node of the graph: "not claimed", skipped;
//   - if RFCPU claims it but ggml-cpu does not: noted and skipped (and reported, see below);
//   - otherwise the case is built twice identically, allocated on each backend, filled with the
//     same deterministic data, computed, and the outputs compared with the normalized mean
//     squared error sum((a-b)^2)/sum(b^2) against the case's threshold (integer outputs exactly,
//     TOP_K as sets; NaN/Inf disagreements fail).
// The test fails when a claimed case fails, or when RFCPU claims an (op, types) combination for
// which no case could run. Cases are kept inside what ggml-cpu accepts (it aborts otherwise:
// e.g. it asserts dense rows for binary ops and mul_mat operands).
//
// Usage: test_ops [--selfcheck] [substring]
//   substring    runs only cases whose label contains it;
//   --selfcheck  runs every case of the catalog on ggml-cpu against ggml-cpu (RFCPU unused):
//                proves that no constructor builds a case ggml-cpu aborts on, before RFCPU
//                claims it (registered as the ctest test_ops_selfcheck).
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------
// Case parameters: one generic record, each builder reads the fields it needs.
// ---------------------------------------------------------------------------------------------
struct params {
    enum ggml_type t0, t1, t2;  // types of the operands (meaning per builder)
    int64_t a[4];               // main shape
    int64_t b[4];               // second shape
    int i[8];                   // integer parameters
    float f[8];                 // float parameters
};

typedef struct ggml_tensor * (*build_fn)(struct ggml_context * ctx, const struct params * p);

// True while the graph for ggml-cpu is built: a builder may then give it an equivalent form
// of the op that ggml-cpu computes (see b_mul_mat's i[2]). With --selfcheck both sides are
// ggml-cpu and get that form.
static bool g_building_ref, g_selfcheck;

enum cmp_mode { CMP_NMSE, CMP_EXACT, CMP_SETS };

// Input tensors are named after the data they need (see fill_inputs).
static struct ggml_tensor * in_t(struct ggml_context * ctx, enum ggml_type t, const int64_t ne[4]) {
    struct ggml_tensor * x = ggml_new_tensor_4d(ctx, t, ne[0], ne[1], ne[2], ne[3]);
    ggml_set_name(x, "in");
    return x;
}
static struct ggml_tensor * in4(struct ggml_context * ctx, enum ggml_type t, int64_t n0, int64_t n1, int64_t n2,
                                int64_t n3) {
    const int64_t ne[4] = { n0, n1, n2, n3 };
    return in_t(ctx, t, ne);
}
// Values in [lo, hi] given by the name: "range:lo:hi".
static struct ggml_tensor * in_range(struct ggml_context * ctx, enum ggml_type t, const int64_t ne[4], float lo,
                                     float hi) {
    struct ggml_tensor * x = in_t(ctx, t, ne);
    ggml_format_name(x, "range:%g:%g", lo, hi);
    return x;
}
// Integer indices in [0, max): "idx:max". Distinct along dim 0 with "perm:max".
static struct ggml_tensor * in_idx(struct ggml_context * ctx, enum ggml_type t, int64_t n0, int64_t n1, int64_t n2,
                                   int max, bool distinct) {
    struct ggml_tensor * x = ggml_new_tensor_4d(ctx, t, n0, n1, n2, 1);
    ggml_format_name(x, "%s:%d", distinct ? "perm" : "idx", max);
    return x;
}
// Distinct values (for sorting): "distinct".
static struct ggml_tensor * in_distinct(struct ggml_context * ctx, const int64_t ne[4]) {
    struct ggml_tensor * x = in_t(ctx, GGML_TYPE_F32, ne);
    ggml_set_name(x, "distinct");
    return x;
}
// Attention-style mask: values in [-1, 1] with some -INF, never a whole row: "mask".
static struct ggml_tensor * in_mask(struct ggml_context * ctx, enum ggml_type t, int64_t n0, int64_t n1, int64_t n2,
                                    int64_t n3) {
    struct ggml_tensor * x = in4(ctx, t, n0, n1, n2, n3);
    ggml_set_name(x, "mask");
    return x;
}

// Gives an op result another output type (for the mixed-type binary ops ggml-cpu computes,
// e.g. F16 + F32 -> F32, which ggml's constructors cannot express).
static struct ggml_tensor * retype(struct ggml_tensor * t, enum ggml_type type) {
    t->type = type;
    t->nb[0] = ggml_type_size(type);
    t->nb[1] = t->nb[0] * (size_t) (t->ne[0] / ggml_blck_size(type));
    t->nb[2] = t->nb[1] * (size_t) t->ne[1];
    t->nb[3] = t->nb[2] * (size_t) t->ne[2];
    return t;
}

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

// i[0]: input layout: 0 contiguous, 1 permuted dims 1<->2, 2 transposed (2D), 3 strided view,
//       4 reshaped; i[1]: 0 ggml_cpy into a new t1 tensor, 1 ggml_cont, 2 ggml_dup,
//       3 ggml_cpy into a row-strided view of a larger t1 tensor.
static struct ggml_tensor * b_cpy(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * src;
    if (p->i[0] == 3) {
        struct ggml_tensor * big = in4(ctx, p->t0, p->a[0] + 8, p->a[1], p->a[2], p->a[3]);
        src = ggml_view_4d(ctx, big, p->a[0], p->a[1], p->a[2], p->a[3], big->nb[1], big->nb[2], big->nb[3], 0);
    } else {
        src = in_t(ctx, p->t0, p->a);
        if (p->i[0] == 1) src = ggml_permute(ctx, src, 0, 2, 1, 3);
        if (p->i[0] == 2) src = ggml_transpose(ctx, src);
        if (p->i[0] == 4) src = ggml_reshape_2d(ctx, src, p->a[0] * p->a[1], p->a[2] * p->a[3]);
    }
    switch (p->i[1]) {
        case 1: return ggml_cont(ctx, src);
        case 2: return ggml_dup(ctx, src);
        case 3: {
            struct ggml_tensor * dst = in4(ctx, p->t1, src->ne[0] + 32, src->ne[1], src->ne[2], src->ne[3]);
            struct ggml_tensor * v = ggml_view_4d(ctx, dst, src->ne[0], src->ne[1], src->ne[2], src->ne[3], dst->nb[1],
                                                  dst->nb[2], dst->nb[3], 0);
            return ggml_cpy(ctx, src, v);
        }
        default: {
            struct ggml_tensor * dst = in4(ctx, p->t1, src->ne[0], src->ne[1], src->ne[2], src->ne[3]);
            return ggml_cpy(ctx, src, dst);
        }
    }
}

// i[0]: op (0 add, 1 sub, 2 mul, 3 div); t0/t1 operand types, t2 output type;
// a: src0 shape, b: src1 shape (broadcast); i[1]: layout 0 contiguous, 1 src0 and src1
// permuted (dims 1<->2), 2 src0 a row-strided view.
static struct ggml_tensor * b_binary(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor *x, *y;
    // DIV gets divisors in [0.5, 2], away from zero.
    const bool div = p->i[0] == 3;
    if (p->i[1] == 1) {
        x = ggml_permute(ctx, in4(ctx, p->t0, p->a[0], p->a[2], p->a[1], p->a[3]), 0, 2, 1, 3);
        const int64_t ne[4] = { p->b[0], p->b[2], p->b[1], p->b[3] };
        y = div ? in_range(ctx, p->t1, ne, 0.5f, 2.0f) : in_t(ctx, p->t1, ne);
        y = ggml_permute(ctx, y, 0, 2, 1, 3);
    } else {
        if (p->i[1] == 2) {
            struct ggml_tensor * big = in4(ctx, p->t0, p->a[0] + 3, p->a[1], p->a[2], p->a[3]);
            x = ggml_view_4d(ctx, big, p->a[0], p->a[1], p->a[2], p->a[3], big->nb[1], big->nb[2], big->nb[3], 0);
        } else {
            x = in_t(ctx, p->t0, p->a);
        }
        y = div ? in_range(ctx, p->t1, p->b, 0.5f, 2.0f) : in_t(ctx, p->t1, p->b);
    }
    struct ggml_tensor * r;
    switch (p->i[0]) {
        case 0: r = ggml_add(ctx, x, y); break;
        case 1: r = ggml_sub(ctx, x, y); break;
        case 2: r = ggml_mul(ctx, x, y); break;
        default: r = ggml_div(ctx, x, y); break;
    }
    if (p->t2 != r->type) retype(r, p->t2);
    return r;
}

// f[0] scale, f[1] bias (i[0] = 1: ggml_scale_bias).
static struct ggml_tensor * b_scale(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * x = in_t(ctx, GGML_TYPE_F32, p->a);
    return p->i[0] ? ggml_scale_bias(ctx, x, p->f[0], p->f[1]) : ggml_scale(ctx, x, p->f[0]);
}

// a: input shape; t1 mask type (GGML_TYPE_COUNT: none); b: mask shape; f[0] scale,
// f[1] max_bias; i[0] sinks.
static struct ggml_tensor * b_soft_max(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * x = in_range(ctx, GGML_TYPE_F32, p->a, -3, 3);
    struct ggml_tensor * mask = NULL;
    if (p->t1 != GGML_TYPE_COUNT) {
        mask = in_mask(ctx, p->t1, p->b[0], p->b[1], p->b[2], p->b[3]);
    }
    struct ggml_tensor * r = ggml_soft_max_ext(ctx, x, mask, p->f[0], p->f[1]);
    if (p->i[0]) {
        ggml_soft_max_add_sinks(r, in4(ctx, GGML_TYPE_F32, p->a[2], 1, 1, 1));
    }
    return r;
}

// Weight t0 [K, M, b2, b3] (a), activations t1 [K, N, B2, B3] (b).
// i[0]: 1 = activations given permuted (dims 1<->2, dense rows), 2 = weight a row-strided view.
// i[1]: 1 = ggml's Hadamard hint (ggml-cpu then computes a Walsh-Hadamard transform of each
// activation row and never reads the weight).
// i[2]: 1 = ggml-cpu gets the activations widened to F32 by a CPY: it does not take F16/BF16
// activations with most weight types, and the widening is exact, so the products must agree.
static struct ggml_tensor * b_mul_mat(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * w;
    if (p->i[0] == 2) {
        const int64_t pad = ggml_blck_size(p->t0);
        struct ggml_tensor * big = in4(ctx, p->t0, p->a[0] + pad, p->a[1], p->a[2], p->a[3]);
        w = ggml_view_4d(ctx, big, p->a[0], p->a[1], p->a[2], p->a[3], big->nb[1], big->nb[2], big->nb[3], 0);
    } else {
        w = in_t(ctx, p->t0, p->a);
    }
    struct ggml_tensor * x;
    if (p->i[0] == 1) {
        x = ggml_permute(ctx, in4(ctx, p->t1, p->b[0], p->b[2], p->b[1], p->b[3]), 0, 2, 1, 3);
    } else {
        x = in_t(ctx, p->t1, p->b);
    }
    if (p->i[2] && g_building_ref) x = ggml_cast(ctx, x, GGML_TYPE_F32);
    if (p->i[3] == 1) ggml_set_name(w, "raw");
    struct ggml_tensor * r = ggml_mul_mat(ctx, w, x);
    if (p->i[1] == 1) ggml_mul_mat_set_hint(r, GGML_HINT_SRC0_IS_HADAMARD);
    return r;
}

// Experts t0 [K, M, n_as] ; activations t1 (F32 when unset) [K, b1, n_tok] ; ids [n_used, n_tok].
// i[0] n_as, i[1] n_used, i[2] n_tok, i[3] b1 (1 or n_used); i[4]: 1 = ggml-cpu gets the
// activations widened to F32 (as b_mul_mat's i[2]; ggml-cpu aborts on F16 ones it must convert).
static struct ggml_tensor * b_mul_mat_id(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * as = in4(ctx, p->t0, p->a[0], p->a[1], p->i[0], 1);
    struct ggml_tensor * x = in4(ctx, p->t1, p->a[0], p->i[3], p->i[2], 1);
    struct ggml_tensor * ids = in_idx(ctx, GGML_TYPE_I32, p->i[1], p->i[2], 1, p->i[0], true);
    if (p->i[4] && g_building_ref) x = ggml_cast(ctx, x, GGML_TYPE_F32);
    return ggml_mul_mat_id(ctx, as, x, ids);
}

// i[0]: 0 rms_norm, 1 norm, 2 l2_norm; f[0] eps; i[1] permuted input.
static struct ggml_tensor * b_norm(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * x = in_t(ctx, GGML_TYPE_F32, p->a);
    if (p->i[1]) x = ggml_permute(ctx, in4(ctx, GGML_TYPE_F32, p->a[0], p->a[2], p->a[1], p->a[3]), 0, 2, 1, 3);
    switch (p->i[0]) {
        case 0: return ggml_rms_norm(ctx, x, p->f[0]);
        case 1: return ggml_norm(ctx, x, p->f[0]);
        default: return ggml_l2_norm(ctx, x, p->f[0]);
    }
}

// x t0 [head_dim, n_head, n_tok, 1]; i[0] mode, i[1] n_dims, i[2] freq factors,
// f[0] freq_base, f[1] freq_scale, f[2] ext_factor, f[3] attn_factor, f[4] beta_fast, f[5] beta_slow.
static struct ggml_tensor * b_rope(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * x = in_t(ctx, p->t0, p->a);
    const int mode = p->i[0];
    const bool multi = (mode & GGML_ROPE_TYPE_MROPE) != 0;
    struct ggml_tensor * pos = in_idx(ctx, GGML_TYPE_I32, p->a[2] * (multi ? 4 : 1), 1, 1, 1000, false);
    struct ggml_tensor * ff = p->i[2] ? in_range(ctx, GGML_TYPE_F32, (int64_t[4]) { p->i[1] / 2, 1, 1, 1 }, 0.5f, 2.0f)
                                      : NULL;
    if (multi) {
        int sections[GGML_MROPE_SECTIONS] = { p->i[1] / 2 - 2 * (p->i[1] / 8), p->i[1] / 8, p->i[1] / 8, 0 };
        return ggml_rope_multi(ctx, x, pos, ff, p->i[1], sections, mode, 4096, p->f[0], p->f[1], p->f[2], p->f[3],
                               p->f[4], p->f[5]);
    }
    return ggml_rope_ext(ctx, x, pos, ff, p->i[1], mode, 4096, p->f[0], p->f[1], p->f[2], p->f[3], p->f[4], p->f[5]);
}

// i[0] glu op, i[1]: 0 fused, 1 fused swapped, 2 split; t0 type; a: shape of one half.
static struct ggml_tensor * b_glu(struct ggml_context * ctx, const struct params * p) {
    if (p->i[1] == 2) {
        struct ggml_tensor * x = in_t(ctx, p->t0, p->a);
        struct ggml_tensor * g = in_t(ctx, p->t0, p->a);
        return ggml_glu_split(ctx, x, g, (enum ggml_glu_op) p->i[0]);
    }
    struct ggml_tensor * x = in4(ctx, p->t0, 2 * p->a[0], p->a[1], p->a[2], p->a[3]);
    return ggml_glu(ctx, x, (enum ggml_glu_op) p->i[0], p->i[1] == 1);
}

// i[0] unary op; t0 type; f[0]/f[1] input range.
static struct ggml_tensor * b_unary(struct ggml_context * ctx, const struct params * p) {
    return ggml_unary(ctx, in_range(ctx, p->t0, p->a, p->f[0], p->f[1]), (enum ggml_unary_op) p->i[0]);
}

// Simple one-input ops. i[0]: which; f[...] parameters.
enum { S_SQR, S_SQRT, S_LOG, S_SIN, S_COS, S_CLAMP, S_LEAKY, S_SUM_ROWS, S_SUM, S_MEAN, S_CUMSUM, S_FILL,
       S_DIAG_MASK_INF, S_PAD, S_PAD_EXT, S_ARGSORT_ASC, S_ARGSORT_DESC, S_TOP_K };
static struct ggml_tensor * b_simple(struct ggml_context * ctx, const struct params * p) {
    const int which = p->i[0];
    struct ggml_tensor * x;
    if (which == S_SQRT || which == S_LOG) {
        x = in_range(ctx, p->t0, p->a, 0.1f, 3.0f);
    } else if (which == S_ARGSORT_ASC || which == S_ARGSORT_DESC || which == S_TOP_K) {
        x = in_distinct(ctx, p->a);
    } else {
        x = in_range(ctx, p->t0, p->a, -2.0f, 2.0f);
    }
    switch (which) {
        case S_SQR: return ggml_sqr(ctx, x);
        case S_SQRT: return ggml_sqrt(ctx, x);
        case S_LOG: return ggml_log(ctx, x);
        case S_SIN: return ggml_sin(ctx, x);
        case S_COS: return ggml_cos(ctx, x);
        case S_CLAMP: return ggml_clamp(ctx, x, p->f[0], p->f[1]);
        case S_LEAKY: return ggml_leaky_relu(ctx, x, p->f[0], false);
        case S_SUM_ROWS: return ggml_sum_rows(ctx, x);
        case S_SUM: return ggml_sum(ctx, x);
        case S_MEAN: return ggml_mean(ctx, x);
        case S_CUMSUM: return ggml_cumsum(ctx, x);
        case S_FILL: return ggml_fill(ctx, x, p->f[0]);
        case S_DIAG_MASK_INF: return ggml_diag_mask_inf(ctx, x, p->i[1]);
        case S_PAD: return ggml_pad(ctx, x, p->i[1], p->i[2], p->i[3], p->i[4]);
        case S_PAD_EXT:
            return ggml_pad_ext(ctx, x, p->i[1], p->i[2], p->i[3], p->i[4], p->i[5], p->i[6], 0, p->i[7]);
        case S_ARGSORT_ASC: return ggml_argsort(ctx, x, GGML_SORT_ORDER_ASC);
        case S_ARGSORT_DESC: return ggml_argsort(ctx, x, GGML_SORT_ORDER_DESC);
        default: return ggml_top_k(ctx, x, p->i[1]);
    }
}

// Data t0 [ne0, n_rows, ne2, ne3] (a); i[0] number of indices; indices I32 [n_idx, ne2, ne3];
// i[1] = 1: raw random blocks (fill_raw) instead of quantized values.
static struct ggml_tensor * b_get_rows(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * d = in_t(ctx, p->t0, p->a);
    if (p->i[1] == 1) ggml_set_name(d, "raw");
    struct ggml_tensor * idx = in_idx(ctx, GGML_TYPE_I32, p->i[0], p->a[2], p->a[3], (int) p->a[1], false);
    return ggml_get_rows(ctx, d, idx);
}

// Destination t0 [ne0, n_rows, ne2, ne3] (a); source t2 (F32 or F16; 0 is F32)
// [ne0, i[0], ne2, ne3]; indices t1 (I64/I32) [i[0], ne2 / i[1], ne3], distinct per row.
static struct ggml_tensor * b_set_rows(struct ggml_context * ctx, const struct params * p) {
    struct ggml_tensor * dst = in_t(ctx, p->t0, p->a);
    struct ggml_tensor * src = in4(ctx, p->t2, p->a[0], p->i[0], p->a[2], p->a[3]);
    struct ggml_tensor * idx = in_idx(ctx, p->t1, p->i[0], p->a[2] / p->i[1], p->a[3], (int) p->a[1], true);
    return ggml_set_rows(ctx, dst, src, idx);
}

// q F32 [D, n_q, n_head, 1]; k/v t0 [D, n_kv, n_head_kv, 1]; i[0] D, i[1] n_q, i[2] n_head,
// i[3] n_head_kv, i[4] n_kv, i[5] mask (1 random, 2 causal, 3 a third filled), i[6] sinks;
// f[0] scale, f[1] max_bias, f[2] softcap.
static struct ggml_tensor * b_flash_attn(struct ggml_context * ctx, const struct params * p) {
    const int D = p->i[0], nq = p->i[1], nh = p->i[2], nhkv = p->i[3], nkv = p->i[4];
    struct ggml_tensor * q = in4(ctx, GGML_TYPE_F32, D, nq, nh, 1);
    struct ggml_tensor * k = in4(ctx, p->t0, D, nkv, nhkv, 1);
    struct ggml_tensor * v = in4(ctx, p->t0, D, nkv, nhkv, 1);
    struct ggml_tensor * m = p->i[5] ? in_mask(ctx, GGML_TYPE_F16, nkv, nq, 1, 1) : NULL;
    if (p->i[5] == 2) ggml_set_name(m, "mask_causal");
    if (p->i[5] == 3) ggml_set_name(m, "mask_pad");
    struct ggml_tensor * r = ggml_flash_attn_ext(ctx, q, k, v, m, p->f[0], p->f[1], p->f[2]);
    if (p->i[6]) ggml_flash_attn_ext_add_sinks(r, in4(ctx, GGML_TYPE_F32, nh, 1, 1, 1));
    return r;
}

// Two-input shape ops. i[0]: 0 concat (dim i[1]), 1 repeat (a -> b), 2 add_id.
static struct ggml_tensor * b_shape2(struct ggml_context * ctx, const struct params * p) {
    switch (p->i[0]) {
        case 0: {
            struct ggml_tensor * x = in_t(ctx, p->t0, p->a);
            int64_t ne[4] = { p->a[0], p->a[1], p->a[2], p->a[3] };
            ne[p->i[1]] += 3;
            return ggml_concat(ctx, x, in_t(ctx, p->t0, ne), p->i[1]);
        }
        case 1: return ggml_repeat(ctx, in_t(ctx, p->t0, p->a), in_t(ctx, p->t0, p->b));
        default: {
            // a: [ne0, n_used, n_tok]; b rows: n_as
            struct ggml_tensor * x = in4(ctx, GGML_TYPE_F32, p->a[0], p->a[1], p->a[2], 1);
            struct ggml_tensor * bias = in4(ctx, GGML_TYPE_F32, p->a[0], p->i[1], 1, 1);
            struct ggml_tensor * ids = in_idx(ctx, GGML_TYPE_I32, p->a[1], p->a[2], 1, p->i[1], false);
            return ggml_add_id(ctx, x, bias, ids);
        }
    }
}

static struct ggml_tensor * b_arange(struct ggml_context * ctx, const struct params * p) {
    return ggml_arange(ctx, p->f[0], p->f[1], p->f[2]);
}

// ---------------------------------------------------------------------------------------------
// Bookkeeping: per (op, types) key and per op.
// ---------------------------------------------------------------------------------------------
struct stat {
    char key[96];
    char op[32];
    int claimed, run, passed, failed, cpu_refused, not_claimed;
};
#define MAX_STATS 1024
static struct stat stats[MAX_STATS];
static int n_stats = 0;
static int n_cases = 0;
static int view_nodes_run[GGML_OP_COUNT];
static const char * filter = NULL;
static double compute_ms[2];  // time spent in graph_compute: [0] RFCPU, [1] ggml-cpu

static struct stat * stat_for(const char * op, const char * key) {
    for (int i = 0; i < n_stats; i++) {
        if (strcmp(stats[i].key, key) == 0) return &stats[i];
    }
    if (n_stats == MAX_STATS) {
        fprintf(stderr, "too many stat keys\n");
        exit(2);
    }
    struct stat * s = &stats[n_stats++];
    memset(s, 0, sizeof(*s));
    snprintf(s->key, sizeof(s->key), "%s", key);
    snprintf(s->op, sizeof(s->op), "%s", op);
    return s;
}

// "OP(src0,src1,...->dst)" from the output node.
static void key_of(const struct ggml_tensor * out, char * op, size_t nop, char * key, size_t nkey) {
    snprintf(op, nop, "%s", ggml_op_desc(out));
    int len = snprintf(key, nkey, "%s(", op);
    for (int i = 0; i < GGML_MAX_SRC && out->src[i]; i++) {
        len += snprintf(key + len, nkey - (size_t) len, "%s%s", i ? "," : "", ggml_type_name(out->src[i]->type));
    }
    snprintf(key + len, nkey - (size_t) len, "->%s)", ggml_type_name(out->type));
}

static ggml_backend_dev_t g_rf_dev, g_cpu_dev;
static ggml_backend_t g_rf, g_cpu;

struct built {
    struct ggml_context * ctx;
    struct ggml_cgraph * gf;
    struct ggml_tensor * out;
};

static struct built build_case(build_fn fn, const struct params * p) {
    struct built b;
    struct ggml_init_params ip = { ggml_tensor_overhead() * 64 + ggml_graph_overhead_custom(64, false), NULL, true };
    b.ctx = ggml_init(ip);
    b.out = fn(b.ctx, p);
    b.gf = ggml_new_graph_custom(b.ctx, 64, false);
    ggml_build_forward_expand(b.gf, b.out);
    return b;
}

static bool dev_claims_graph(ggml_backend_dev_t dev, struct ggml_cgraph * gf) {
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        if (!ggml_backend_dev_supports_op(dev, ggml_graph_node(gf, i))) return false;
    }
    return true;
}

// Random bytes for the i-quants' blocks (every grid index, sign and scale pattern, not only
// what ggml's quantizer picks), with a finite f16 scale in each: at byte 0, or for IQ1_M in the
// top nibbles of its 4 scale words.
static void fill_raw(struct ggml_tensor * t, uint64_t seed) {
    const size_t nb = ggml_nbytes(t), ts = ggml_type_size(t->type);
    uint8_t * raw = malloc(nb);
    uint64_t s = seed * 7919 + 3;
    for (size_t i = 0; i < nb; i++) raw[i] = (uint8_t) rf_rand_u64(&s);
    for (size_t b = 0; b < nb / ts; b++) {
        const ggml_fp16_t h = ggml_fp32_to_fp16(rf_rand_uniform(&s, -1, 1));
        uint8_t * blk = raw + b * ts;
        if (t->type == GGML_TYPE_IQ1_M) {
            for (int k = 0; k < 4; k++) blk[49 + 2 * k] = (uint8_t) ((blk[49 + 2 * k] & 0x0f) | (((h >> (4 * k)) & 0xf) << 4));
        } else {
            memcpy(blk, &h, sizeof(h));
        }
    }
    ggml_backend_tensor_set(t, raw, 0, nb);
    free(raw);
}

static void fill_inputs(struct ggml_context * ctx, uint64_t case_seed) {
    uint64_t k = 0;
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t), k++) {
        if (t->op != GGML_OP_NONE || t->view_src != NULL || t->data == NULL) continue;
        const uint64_t seed = case_seed * 131 + k;
        const char * name = ggml_get_name(t);
        const int64_t n = ggml_nelements(t);
        if (strncmp(name, "idx:", 4) == 0 || strncmp(name, "perm:", 5) == 0) {
            const int max = atoi(strchr(name, ':') + 1);
            const bool perm = name[0] == 'p';
            const int64_t n0 = t->ne[0];
            int64_t * v = malloc(sizeof(int64_t) * (size_t) n);
            uint64_t s = seed + 77;
            for (int64_t r = 0; r < n / n0; r++) {
                if (perm) {
                    // distinct values in [0, max): a partial Fisher-Yates shuffle of 0..max-1
                    int64_t * pool = malloc(sizeof(int64_t) * (size_t) max);
                    for (int i = 0; i < max; i++) pool[i] = i;
                    for (int64_t i = 0; i < n0; i++) {
                        int64_t j = i + (int64_t) (rf_rand_u64(&s) % (uint64_t) (max - i));
                        int64_t tmp = pool[i];
                        pool[i] = pool[j];
                        pool[j] = tmp;
                        v[r * n0 + i] = pool[i];
                    }
                    free(pool);
                } else {
                    for (int64_t i = 0; i < n0; i++) v[r * n0 + i] = (int64_t) (rf_rand_u64(&s) % (uint64_t) max);
                }
            }
            if (t->type == GGML_TYPE_I64) {
                ggml_backend_tensor_set(t, v, 0, ggml_nbytes(t));
            } else {
                int32_t * v32 = malloc(sizeof(int32_t) * (size_t) n);
                for (int64_t i = 0; i < n; i++) v32[i] = (int32_t) v[i];
                ggml_backend_tensor_set(t, v32, 0, ggml_nbytes(t));
                free(v32);
            }
            free(v);
        } else if (strcmp(name, "distinct") == 0) {
            float * v = malloc(sizeof(float) * (size_t) n);
            uint64_t s = seed + 99;
            for (int64_t i = 0; i < n; i++) v[i] = (float) i * 0.25f - (float) n * 0.125f;
            for (int64_t i = n - 1; i > 0; i--) {
                int64_t j = (int64_t) (rf_rand_u64(&s) % (uint64_t) (i + 1));
                float tmp = v[i];
                v[i] = v[j];
                v[j] = tmp;
            }
            ggml_backend_tensor_set(t, v, 0, ggml_nbytes(t));
            free(v);
        } else if (strcmp(name, "mask") == 0 || strcmp(name, "mask_causal") == 0 || strcmp(name, "mask_pad") == 0) {
            // mask_causal: query row i (of ne[1]) sees keys 0 .. i + ne[0] - ne[1], as a prompt does.
            // mask_pad: row i sees keys 0 .. i + ne[0] / 3, as a cache filled to a third.
            const int causal = strcmp(name, "mask_causal") == 0, pad = strcmp(name, "mask_pad") == 0;
            float * v = malloc(sizeof(float) * (size_t) n);
            uint64_t s = seed + 5;
            for (int64_t i = 0; i < n; i++) {
                v[i] = rf_rand_uniform(&s, -1, 1);
                const int64_t col = i % t->ne[0], row = (i / t->ne[0]) % t->ne[1];
                if (pad ? col > row + t->ne[0] / 3
                        : causal ? col > row + t->ne[0] - t->ne[1] : col != 0 && rf_rand_u64(&s) % 5 == 0) {
                    v[i] = -INFINITY;
                }
            }
            if (t->type == GGML_TYPE_F16) {
                ggml_fp16_t * h = malloc(sizeof(ggml_fp16_t) * (size_t) n);
                ggml_fp32_to_fp16_row(v, h, n);
                ggml_backend_tensor_set(t, h, 0, ggml_nbytes(t));
                free(h);
            } else {
                ggml_backend_tensor_set(t, v, 0, ggml_nbytes(t));
            }
            free(v);
        } else if (strcmp(name, "raw") == 0) {
            fill_raw(t, seed);
        } else if (strncmp(name, "range:", 6) == 0) {
            float lo = -1, hi = 1;
            sscanf(name, "range:%f:%f", &lo, &hi);
            rf_fill_tensor(t, seed, lo, hi);
        } else {
            rf_fill_tensor(t, seed, -1, 1);
        }
    }
}

static int cmp_i32(const void * a, const void * b) {
    const float x = *(const float *) a, y = *(const float *) b;
    return (x > y) - (x < y);
}

// Runs one case; returns false on failure.
static void run_case(const char * label, build_fn fn, const struct params * p, double thr, enum cmp_mode cmp) {
    if (filter && !strstr(label, filter)) return;
    n_cases++;
    g_building_ref = g_selfcheck;
    struct built probe = build_case(fn, p);
    char op[32], key[96];
    key_of(probe.out, op, sizeof(op), key, sizeof(key));
    struct stat * st = stat_for(op, key);
    const bool rf_claims = dev_claims_graph(g_rf_dev, probe.gf);
    ggml_free(probe.ctx);
    g_building_ref = true;
    struct built probe_ref = build_case(fn, p);
    g_building_ref = false;
    const bool cpu_claims = dev_claims_graph(g_cpu_dev, probe_ref.gf);
    ggml_free(probe_ref.ctx);
    if (!rf_claims) {
        st->not_claimed++;
        return;
    }
    st->claimed++;
    if (!cpu_claims) {
        st->cpu_refused++;
        printf("  note: RFCPU claims %s but ggml-cpu does not: %s (skipped)\n", key, label);
        return;
    }

    struct built bk[2];
    g_building_ref = g_selfcheck;
    bk[0] = build_case(fn, p);
    g_building_ref = true;
    bk[1] = build_case(fn, p);
    g_building_ref = false;
    ggml_backend_t be[2] = { g_rf, g_cpu };
    ggml_backend_buffer_t buf[2] = { NULL, NULL };
    float * res[2] = { NULL, NULL };
    bool ok = true;
    const uint64_t case_seed = (uint64_t) n_cases;
    for (int k = 0; k < 2; k++) {
        buf[k] = ggml_backend_alloc_ctx_tensors(bk[k].ctx, be[k]);
        if (!buf[k]) {
            printf("  FAIL %s: allocation on %s failed\n", label, ggml_backend_name(be[k]));
            ok = false;
            break;
        }
        // Different garbage on each side (NaN bytes on RFCPU's): an output element RFCPU never
        // writes cannot match by chance.
        ggml_backend_buffer_clear(buf[k], k == 0 ? 0xFF : 0x00);
        fill_inputs(bk[k].ctx, case_seed);
        const double tc = rf_now_ms();
        enum ggml_status s = ggml_backend_graph_compute(be[k], bk[k].gf);
        compute_ms[k] += rf_now_ms() - tc;
        if (s != GGML_STATUS_SUCCESS) {
            printf("  FAIL %s: compute on %s returned %s\n", label, ggml_backend_name(be[k]), ggml_status_to_string(s));
            ok = false;
            break;
        }
        res[k] = rf_tensor_to_float(bk[k].out);
    }
    if (ok) {
        for (int i = 0; i < ggml_graph_n_nodes(bk[0].gf); i++) {
            const enum ggml_op o = ggml_graph_node(bk[0].gf, i)->op;
            if (o == GGML_OP_VIEW || o == GGML_OP_RESHAPE || o == GGML_OP_PERMUTE || o == GGML_OP_TRANSPOSE) {
                view_nodes_run[o]++;
            }
        }
        const struct ggml_tensor * out = bk[0].out;
        const int64_t n = ggml_nelements(out);
        if (cmp == CMP_NMSE) {
            const double e = rf_nmse(res[0], res[1], (size_t) n);
            if (!(e <= thr)) {
                printf("  FAIL %s [%s]: nmse %.3g > %.1g (RFCPU[0]=%g ggml-cpu[0]=%g)\n", label, key, e, thr,
                       res[0][0], res[1][0]);
                ok = false;
            }
        } else {
            const int64_t row = out->ne[0];
            if (cmp == CMP_SETS) {
                for (int64_t r = 0; r < n / row; r++) {
                    qsort(res[0] + r * row, (size_t) row, sizeof(float), cmp_i32);
                    qsort(res[1] + r * row, (size_t) row, sizeof(float), cmp_i32);
                }
            }
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) bad += res[0][i] != res[1][i];
            if (bad) {
                printf("  FAIL %s [%s]: %lld of %lld outputs differ (exact comparison)\n", label, key, (long long) bad,
                       (long long) n);
                ok = false;
            }
        }
        st->run++;
    }
    if (ok) {
        st->passed++;
    } else {
        st->failed++;
        rf_failures++;
    }
    for (int k = 0; k < 2; k++) {
        free(res[k]);
        if (buf[k]) ggml_backend_buffer_free(buf[k]);
        ggml_free(bk[k].ctx);
    }
}

#define LABEL(...) (snprintf(label, sizeof(label), __VA_ARGS__), label)
#define SHAPE(x0, x1, x2, x3) { x0, x1, x2, x3 }

static const enum ggml_type float_types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16 };
static const enum ggml_type weight_types[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
    GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
    GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
    GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S, GGML_TYPE_IQ2_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M, GGML_TYPE_NVFP4,
    GGML_TYPE_Q1_0, GGML_TYPE_Q2_0,
};
#define N_FLOAT (sizeof(float_types) / sizeof(float_types[0]))
#define N_WEIGHT (sizeof(weight_types) / sizeof(weight_types[0]))

static bool is_quant(enum ggml_type t) {
    return ggml_is_quantized(t);
}

// A row length the cases use for `t`: 64 values, or one block where blocks are longer
// (128 for Q1_0, 256 for the K- and i-quants).
static int64_t unit_k(enum ggml_type t) {
    const int64_t blk = ggml_blck_size(t);
    return blk > 64 ? blk : 64;
}

// ---------------------------------------------------------------------------------------------
// Catalog
// ---------------------------------------------------------------------------------------------

static void cases_cpy(void) {
    char label[160];
    static const char * layouts[] = { "contig", "permuted", "transposed", "strided", "reshaped" };
    static const char * kinds[] = { "cpy", "cont", "dup", "cpy-into-view" };
    for (size_t a = 0; a < N_FLOAT; a++) {
        for (size_t b = 0; b < N_FLOAT; b++) {
            for (int layout = 0; layout < 5; layout++) {
                struct params p = { .t0 = float_types[a], .t1 = float_types[b], .a = SHAPE(33, 7, 3, 2) };
                if (layout == 2) { p.a[2] = 1; p.a[3] = 1; }
                p.i[0] = layout;
                p.i[1] = 0;
                run_case(LABEL("CPY %s->%s %s", ggml_type_name(p.t0), ggml_type_name(p.t1), layouts[layout]), b_cpy,
                         &p, 1e-7, CMP_NMSE);
            }
            struct params p = { .t0 = float_types[a], .t1 = float_types[b], .a = SHAPE(40, 6, 2, 1), .i = { 1, 3 } };
            run_case(LABEL("CPY %s->%s permuted into strided view", ggml_type_name(p.t0), ggml_type_name(p.t1)), b_cpy,
                     &p, 1e-7, CMP_NMSE);
        }
        for (int layout = 0; layout < 5; layout++) {
            for (int kind = 1; kind <= 2; kind++) {
                struct params p = { .t0 = float_types[a], .t1 = float_types[a], .a = SHAPE(17, 5, 4, 3) };
                if (layout == 2) { p.a[2] = 1; p.a[3] = 1; }
                p.i[0] = layout;
                p.i[1] = kind;
                run_case(LABEL("%s %s %s", kinds[kind], ggml_type_name(p.t0), layouts[layout]), b_cpy, &p, 1e-7,
                         CMP_NMSE);
            }
        }
    }
    // F32 -> quantized, and same-type quantized copies.
    static const enum ggml_type qt[] = { GGML_TYPE_Q8_0, GGML_TYPE_Q4_0 };
    for (size_t q = 0; q < 2; q++) {
        struct params p = { .t0 = GGML_TYPE_F32, .t1 = qt[q], .a = SHAPE(64, 5, 3, 1) };
        run_case(LABEL("CPY f32->%s", ggml_type_name(qt[q])), b_cpy, &p, 1e-6, CMP_NMSE);
        struct params p2 = { .t0 = qt[q], .t1 = qt[q], .a = SHAPE(64, 5, 3, 1) };
        run_case(LABEL("CPY %s->%s", ggml_type_name(qt[q]), ggml_type_name(qt[q])), b_cpy, &p2, 1e-7, CMP_NMSE);
        // Edge: one block a row, and three blocks over an odd row count.
        for (int64_t nb = 1; nb <= 3; nb += 2) {
            struct params pe = { .t0 = GGML_TYPE_F32, .t1 = qt[q], .a = SHAPE(32 * nb, nb == 1 ? 1 : 7, 1, 1) };
            run_case(LABEL("CPY f32->%s edge [%lld,%lld]", ggml_type_name(qt[q]), (long long) pe.a[0],
                           (long long) pe.a[1]),
                     b_cpy, &pe, 1e-6, CMP_NMSE);
        }
    }
}

static void cases_binary(void) {
    char label[160];
    static const char * names[] = { "ADD", "SUB", "MUL", "DIV" };
    static const enum ggml_type combos[][3] = {
        { GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_F32 },    { GGML_TYPE_F16, GGML_TYPE_F16, GGML_TYPE_F16 },
        { GGML_TYPE_BF16, GGML_TYPE_BF16, GGML_TYPE_BF16 }, { GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_F16 },
        { GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_F32 },    { GGML_TYPE_BF16, GGML_TYPE_F32, GGML_TYPE_BF16 },
        { GGML_TYPE_BF16, GGML_TYPE_F32, GGML_TYPE_F32 },
    };
    // src1 shapes broadcast over src0 [10, 5, 4, 3] in every dim.
    static const int64_t bshapes[][4] = {
        { 10, 5, 4, 3 }, { 10, 1, 1, 1 }, { 10, 5, 1, 1 }, { 10, 1, 4, 1 }, { 10, 5, 4, 1 },
        { 10, 1, 1, 3 }, { 1, 1, 1, 1 },  { 1, 5, 4, 3 },  { 5, 5, 2, 3 },
    };
    for (int op = 0; op < 4; op++) {
        for (size_t c = 0; c < sizeof(combos) / sizeof(combos[0]); c++) {
            for (size_t s = 0; s < sizeof(bshapes) / sizeof(bshapes[0]); s++) {
                struct params p = { .t0 = combos[c][0], .t1 = combos[c][1], .t2 = combos[c][2],
                                    .a = SHAPE(10, 5, 4, 3) };
                memcpy(p.b, bshapes[s], sizeof(p.b));
                p.i[0] = op;
                p.i[1] = 0;
                // full broadcast matrix for F32, a representative subset for the other combos
                if (c != 0 && s != 0 && s != 1 && s != 3 && s != 8) continue;
                run_case(LABEL("%s %s,%s->%s b=[%lld,%lld,%lld,%lld]", names[op], ggml_type_name(p.t0),
                               ggml_type_name(p.t1), ggml_type_name(p.t2), (long long) p.b[0], (long long) p.b[1],
                               (long long) p.b[2], (long long) p.b[3]),
                         b_binary, &p, 1e-7, CMP_NMSE);
            }
            for (int layout = 1; layout <= 2; layout++) {
                struct params p = { .t0 = combos[c][0], .t1 = combos[c][1], .t2 = combos[c][2],
                                    .a = SHAPE(16, 6, 3, 2), .b = SHAPE(16, 6, 3, 2) };
                if (layout == 2) { p.b[1] = 1; }
                p.i[0] = op;
                p.i[1] = layout;
                run_case(LABEL("%s %s,%s->%s %s", names[op], ggml_type_name(p.t0), ggml_type_name(p.t1),
                               ggml_type_name(p.t2), layout == 1 ? "permuted" : "strided src0"),
                         b_binary, &p, 1e-7, CMP_NMSE);
            }
        }
    }
    // A large one, so threads split work.
    struct params p = { .t0 = GGML_TYPE_F32, .t1 = GGML_TYPE_F32, .t2 = GGML_TYPE_F32, .a = SHAPE(4096, 33, 1, 1),
                        .b = SHAPE(4096, 1, 1, 1) };
    run_case("ADD f32 large", b_binary, &p, 1e-7, CMP_NMSE);
}

static void cases_scale(void) {
    char label[160];
    static const int64_t shapes[][4] = { { 10, 5, 4, 3 }, { 1, 1, 1, 1 }, { 4096, 7, 1, 1 } };
    for (size_t s = 0; s < 3; s++) {
        for (int bias = 0; bias < 2; bias++) {
            struct params p = { .i = { bias }, .f = { 0.37f, bias ? -1.5f : 0.0f } };
            memcpy(p.a, shapes[s], sizeof(p.a));
            run_case(LABEL("SCALE%s [%lld,%lld]", bias ? "+bias" : "", (long long) p.a[0], (long long) p.a[1]),
                     b_scale, &p, 1e-7, CMP_NMSE);
        }
    }
}

static void cases_soft_max(void) {
    char label[160];
    struct {
        int64_t a[4];
        enum ggml_type mt;
        int64_t m[4];
        float scale, max_bias;
        int sinks;
    } cs[] = {
        { { 16, 4, 1, 1 }, GGML_TYPE_COUNT, { 0 }, 1.0f, 0.0f, 0 },
        { { 1000, 3, 2, 1 }, GGML_TYPE_COUNT, { 0 }, 0.5f, 0.0f, 0 },
        { { 32, 7, 4, 2 }, GGML_TYPE_F32, { 32, 7, 1, 1 }, 0.125f, 0.0f, 0 },
        { { 32, 7, 4, 2 }, GGML_TYPE_F16, { 32, 7, 1, 1 }, 0.125f, 0.0f, 0 },
        { { 32, 7, 4, 2 }, GGML_TYPE_F16, { 32, 8, 4, 1 }, 1.0f, 0.0f, 0 },
        { { 32, 7, 4, 2 }, GGML_TYPE_F32, { 32, 7, 4, 2 }, 1.0f, 0.0f, 0 },
        { { 32, 7, 4, 2 }, GGML_TYPE_F32, { 32, 7, 1, 2 }, 1.0f, 0.0f, 0 },
        { { 64, 5, 8, 1 }, GGML_TYPE_F16, { 64, 5, 1, 1 }, 0.2f, 8.0f, 0 },
        { { 64, 5, 6, 1 }, GGML_TYPE_F32, { 64, 5, 1, 1 }, 1.0f, 8.0f, 0 },
        { { 32, 7, 4, 1 }, GGML_TYPE_F16, { 32, 7, 1, 1 }, 0.125f, 0.0f, 1 },
        { { 32, 7, 4, 1 }, GGML_TYPE_COUNT, { 0 }, 1.0f, 0.0f, 1 },
        { { 48, 3, 4, 1 }, GGML_TYPE_F32, { 48, 3, 1, 1 }, 1.0f, 4.0f, 1 },
    };
    for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
        struct params p = { .t1 = cs[i].mt, .f = { cs[i].scale, cs[i].max_bias }, .i = { cs[i].sinks } };
        memcpy(p.a, cs[i].a, sizeof(p.a));
        memcpy(p.b, cs[i].m, sizeof(p.b));
        run_case(LABEL("SOFT_MAX [%lld,%lld,%lld,%lld] mask=%s [%lld,%lld,%lld,%lld] scale=%g max_bias=%g sinks=%d",
                       (long long) p.a[0], (long long) p.a[1], (long long) p.a[2], (long long) p.a[3],
                       cs[i].mt == GGML_TYPE_COUNT ? "none" : ggml_type_name(cs[i].mt), (long long) p.b[0],
                       (long long) p.b[1], (long long) p.b[2], (long long) p.b[3], cs[i].scale, cs[i].max_bias,
                       cs[i].sinks),
                 b_soft_max, &p, 1e-6, CMP_NMSE);
    }
}

// Edge shapes (issue 20: a kernel that assumed whole 32-value chunks gave inf on k = 16):
// inner dim k of 1, 3, 16, 63, 65 for float weights, one and three blocks for quantized ones
// (whole blocks only); rows m and columns n of 1 and odd sizes, on both sides of the GPU's
// 32-column BLAS switch.
static const int64_t edge_k[] = { 1, 3, 16, 63, 65 };
#define N_EDGE_K (sizeof(edge_k) / sizeof(edge_k[0]))

static void cases_mul_mat_edges(void) {
    char label[160];
    static const int64_t mn[][2] = { { 1, 1 }, { 7, 1 }, { 1, 7 }, { 13, 9 }, { 5, 37 } };
    for (size_t w = 0; w < N_WEIGHT; w++) {
        const enum ggml_type t = weight_types[w];
        const int64_t blk = ggml_blck_size(t);
        const int64_t ks[] = { 1, 3, 16, 63, 65, blk, 3 * blk };
        // Float weights: every edge k; quantized: one and three blocks.
        for (size_t ki = blk == 1 ? 0 : N_EDGE_K; ki < (blk == 1 ? N_EDGE_K : N_EDGE_K + 2); ki++) {
            for (size_t s = 0; s < sizeof(mn) / sizeof(mn[0]); s++) {
                // Quantized: the single-row and single-column corners and one odd block each.
                if (blk > 1 && s == 3) continue;
                const int64_t K = ks[ki];
                struct params p = { .t0 = t, .t1 = GGML_TYPE_F32, .a = SHAPE(K, mn[s][0], 1, 1),
                                    .b = SHAPE(K, mn[s][1], 1, 1) };
                run_case(LABEL("MUL_MAT %s edge k=%lld m=%lld n=%lld", ggml_type_name(t), (long long) K,
                               (long long) mn[s][0], (long long) mn[s][1]),
                         b_mul_mat, &p, 5e-4, CMP_NMSE);
            }
        }
    }
    // Activations of the weight's own type (F16 x F16, BF16 x BF16) at odd k.
    static const enum ggml_type same[] = { GGML_TYPE_F16, GGML_TYPE_BF16 };
    for (size_t t = 0; t < 2; t++) {
        for (size_t ki = 0; ki < N_EDGE_K; ki += 2) {
            struct params p = { .t0 = same[t], .t1 = same[t], .a = SHAPE(edge_k[ki], 7, 1, 1),
                                .b = SHAPE(edge_k[ki], 5, 1, 1) };
            run_case(LABEL("MUL_MAT %s x %s edge k=%lld m=7 n=5", ggml_type_name(same[t]), ggml_type_name(same[t]),
                           (long long) edge_k[ki]),
                     b_mul_mat, &p, 5e-4, CMP_NMSE);
        }
    }
}

// F16 (and BF16) activations with every weight type (issue 25): ggml-cpu takes them natively
// with F16 weights (F16 x F16) and BF16 ones with F32 and BF16 weights; for the rest it gets
// the activations widened to F32 (b_mul_mat's i[2]). k of one to three 32-blocks (256-blocks
// for k-quants), one and odd column counts, batched and permuted activations.
static void cases_mul_mat_half_activations(void) {
    char label[160];
    static const int64_t ns[] = { 1, 5, 37 };
    for (int bf = 0; bf < 2; bf++) {
        const enum ggml_type t1 = bf ? GGML_TYPE_BF16 : GGML_TYPE_F16;
        for (size_t w = 0; w < N_WEIGHT; w++) {
            const enum ggml_type t = weight_types[w];
            const int64_t blk = ggml_blck_size(t);
            // ggml-cpu's own F16/BF16 activation paths: the weight's dot type, or BF16 with F32.
            const int native = (t == GGML_TYPE_F16 && !bf) || (t == GGML_TYPE_BF16 && bf) ||
                               (t == GGML_TYPE_F32 && bf);
            // BF16 activations: a few weight types only (same code path as F16's).
            if (bf && t != GGML_TYPE_F32 && t != GGML_TYPE_BF16 && t != GGML_TYPE_Q4_0 && t != GGML_TYPE_Q4_K) continue;
            const int64_t u = blk > 32 ? blk : 32;
            const int64_t ks[] = { u, 2 * u, 3 * u };
            for (size_t ki = 0; ki < 3; ki++) {
                for (size_t ni = 0; ni < 3; ni++) {
                    struct params q = { .t0 = t, .t1 = t1, .a = SHAPE(ks[ki], 13, 1, 1), .b = SHAPE(ks[ki], ns[ni], 1, 1),
                                        .i = { 0, 0, !native } };
                    run_case(LABEL("MUL_MAT %s x %s k=%lld m=13 n=%lld", ggml_type_name(t), ggml_type_name(t1),
                                   (long long) ks[ki], (long long) ns[ni]),
                             b_mul_mat, &q, 5e-4, CMP_NMSE);
                }
            }
            // Batched with broadcast over dims 2 and 3, and permuted activations.
            const int64_t K = ks[1];
            struct params q = { .t0 = t, .t1 = t1, .a = SHAPE(K, 9, 1, 2), .b = SHAPE(K, 3, 2, 4), .i = { 0, 0, !native } };
            run_case(LABEL("MUL_MAT %s x %s w=[%lld,9,1,2] x=[%lld,3,2,4]", ggml_type_name(t), ggml_type_name(t1),
                           (long long) K, (long long) K),
                     b_mul_mat, &q, 5e-4, CMP_NMSE);
            struct params r = { .t0 = t, .t1 = t1, .a = SHAPE(K, 12, 3, 1), .b = SHAPE(K, 7, 3, 1), .i = { 1, 0, !native } };
            run_case(LABEL("MUL_MAT %s x %s w=[%lld,12,3,1] x=[%lld,7,3,1] x permuted", ggml_type_name(t),
                           ggml_type_name(t1), (long long) K, (long long) K),
                     b_mul_mat, &r, 5e-4, CMP_NMSE);
        }
    }
}

static void cases_mul_mat(void) {
    char label[160];
    for (size_t w = 0; w < N_WEIGHT; w++) {
        const enum ggml_type t = weight_types[w];
        const int64_t blk = ggml_blck_size(t);
        const int64_t K = unit_k(t);
        struct {
            int64_t a[4], b[4];
            int layout;
        } cs[] = {
            { { K, 17, 1, 1 }, { K, 1, 1, 1 }, 0 },
            { { K, 17, 1, 1 }, { K, 7, 1, 1 }, 0 },
            { { 4 * K, 33, 1, 1 }, { 4 * K, 9, 1, 1 }, 0 },
            { { K, 16, 2, 1 }, { K, 5, 4, 1 }, 0 },   // broadcast over dim 2
            { { K, 9, 2, 1 }, { K, 3, 2, 3 }, 0 },    // broadcast over dim 3
            { { K, 9, 1, 2 }, { K, 3, 2, 4 }, 0 },    // broadcast over dims 2 and 3
            { { K, 12, 3, 1 }, { K, 5, 3, 1 }, 1 },   // permuted activations
            { { K, 11, 1, 1 }, { K, 4, 1, 1 }, 2 },   // row-strided weight view
            // 32+ columns: the GPU's BLAS path (prompts), same layouts.
            { { 4 * K, 70, 1, 1 }, { 4 * K, 40, 1, 1 }, 0 },
            { { K, 16, 2, 1 }, { K, 33, 4, 2 }, 0 },  // broadcast over dims 2 and 3
            { { K, 12, 3, 1 }, { K, 36, 3, 1 }, 1 },  // permuted activations
            { { K, 11, 1, 1 }, { K, 34, 1, 1 }, 2 },  // row-strided weight view
            // The GPU's tensor-core prompt kernel (128 rows x 64 columns a block, 4 blocks of
            // 32 values a step): several row and column tiles, partial ones, a partial step;
            // columns over dims 2 and 3 of one weight matrix, permuted; exactly 8 columns.
            { { 3 * K, 300, 1, 1 }, { 3 * K, 130, 1, 1 }, 0 },
            { { K, 129, 1, 1 }, { K, 9, 3, 2 }, 0 },
            { { K, 40, 1, 1 }, { K, 11, 3, 1 }, 1 },
            { { K, 40, 1, 1 }, { K, 8, 1, 1 }, 0 },
        };
        for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
            struct params p = { .t0 = t, .t1 = GGML_TYPE_F32, .i = { cs[i].layout } };
            memcpy(p.a, cs[i].a, sizeof(p.a));
            memcpy(p.b, cs[i].b, sizeof(p.b));
            run_case(LABEL("MUL_MAT %s w=[%lld,%lld,%lld,%lld] x=[%lld,%lld,%lld,%lld]%s", ggml_type_name(t),
                           (long long) p.a[0], (long long) p.a[1], (long long) p.a[2], (long long) p.a[3],
                           (long long) p.b[0], (long long) p.b[1], (long long) p.b[2], (long long) p.b[3],
                           cs[i].layout == 1 ? " x permuted" : cs[i].layout == 2 ? " w strided" : ""),
                     b_mul_mat, &p, 5e-4, CMP_NMSE);
        }
        // Short rows of a tall matrix with one column (a vocabulary projection: the GPU's
        // 8-rows-per-warp kernel), a row count that is not a multiple of 8, two batches.
        if (blk == 32) {
            struct params p = { .t0 = t, .t1 = GGML_TYPE_F32, .a = SHAPE(576, 8197, 2, 1), .b = SHAPE(576, 1, 2, 1) };
            run_case(LABEL("MUL_MAT %s tall w=[576,8197,2,1] x=[576,1,2,1]", ggml_type_name(t)), b_mul_mat, &p, 5e-4, CMP_NMSE);
        }
        // K-quant rows of a vocabulary projection (the GPU's 8-rows-per-warp kernel too); Q6_K's
        // rows long enough for several parts a lane (the others are slow to quantize).
        if (t == GGML_TYPE_Q2_K || t == GGML_TYPE_Q3_K || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K ||
            t == GGML_TYPE_Q6_K) {
            const int64_t k = t == GGML_TYPE_Q6_K ? 1024 : 256;
            struct params p = { .t0 = t, .t1 = GGML_TYPE_F32, .a = SHAPE(k, 32771, 1, 1), .b = SHAPE(k, 1, 1, 1) };
            run_case(LABEL("MUL_MAT %s tall w=[%lld,32771,1,1] x=[%lld,1,1,1]", ggml_type_name(t), (long long) k, (long long) k),
                     b_mul_mat, &p, 5e-4, CMP_NMSE);
        }
        // Rows that are not a multiple of 32 (float weights only): the last K % 32 values count too.
        for (int64_t n = 1; blk == 1 && n <= 40; n += 39) {
            struct params p = { .t0 = t, .t1 = GGML_TYPE_F32, .a = SHAPE(67, 19, 1, 1), .b = SHAPE(67, n, 1, 1) };
            run_case(LABEL("MUL_MAT %s K=67 n=%lld", ggml_type_name(t), (long long) n), b_mul_mat, &p, 5e-4, CMP_NMSE);
        }
    }
    // F16 activations with F16 weights (ggml-cpu computes them too).
    struct params p = { .t0 = GGML_TYPE_F16, .t1 = GGML_TYPE_F16, .a = SHAPE(64, 13, 1, 1), .b = SHAPE(64, 5, 1, 1) };
    run_case("MUL_MAT f16 x f16", b_mul_mat, &p, 5e-4, CMP_NMSE);
    cases_mul_mat_half_activations();
    cases_mul_mat_edges();
    // The Hadamard hint (llama.cpp's rotations for quantized KV caches): the weight holds
    // random values, which ggml-cpu ignores, so a device must compute the transform too; its
    // butterflies are exact additions in a fixed order: the same bits.
    const struct { int64_t n, b1, b2, b3; enum ggml_type t1; int layout; } hs[] = {
        { 64, 7, 3, 1, GGML_TYPE_F32, 0 },   { 128, 40, 2, 1, GGML_TYPE_F32, 0 }, { 128, 1, 1, 1, GGML_TYPE_F32, 0 },
        { 128, 5, 1, 2, GGML_TYPE_F16, 0 },  { 256, 3, 4, 1, GGML_TYPE_F32, 1 },  { 4, 9, 1, 1, GGML_TYPE_F32, 0 },
        { 2048, 2, 1, 1, GGML_TYPE_F32, 0 },
    };
    for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++) {
        struct params ph = { .t0 = GGML_TYPE_F32, .t1 = hs[i].t1, .a = SHAPE(hs[i].n, hs[i].n, 1, 1),
                             .b = SHAPE(hs[i].n, hs[i].b1, hs[i].b2, hs[i].b3), .i = { hs[i].layout, 1 } };
        run_case(LABEL("MUL_MAT hadamard n=%lld x %s [%lld,%lld,%lld]%s", (long long) hs[i].n, ggml_type_name(hs[i].t1),
                       (long long) hs[i].b1, (long long) hs[i].b2, (long long) hs[i].b3, hs[i].layout ? " permuted" : ""),
                 b_mul_mat, &ph, 0, CMP_EXACT);
    }
}

static void cases_mul_mat_id(void) {
    char label[160];
    for (size_t w = 0; w < N_WEIGHT; w++) {
        const enum ggml_type t = weight_types[w];
        const int64_t K = unit_k(t);
        const int cs[][4] = { { 4, 2, 3, 2 }, { 4, 2, 5, 1 }, { 8, 3, 1, 3 } };  // n_as, n_used, n_tok, b1
        for (size_t i = 0; i < 3; i++) {
            struct params p = { .t0 = t, .a = SHAPE(K, 17, 1, 1), .i = { cs[i][0], cs[i][1], cs[i][2], cs[i][3] } };
            run_case(LABEL("MUL_MAT_ID %s n_as=%d n_used=%d n_tok=%d b1=%d", ggml_type_name(t), cs[i][0], cs[i][1],
                           cs[i][2], cs[i][3]),
                     b_mul_mat_id, &p, 5e-4, CMP_NMSE);
        }
    }
    // Edge shapes. First the ones of issue 20 (RFGPU gave inf or errors up to 1.25 with float
    // experts): 16 experts all used, m=32, 1024 tokens, k=16; one expert, m=8, 16 tokens,
    // k = 1, 63, 65; 4 experts, 2 used, m=64, 16 tokens, k=3. Each with activations
    // broadcast over the used experts (b1 = 1) and one row per used expert.
    const struct { int64_t k, m; int n_as, n_used, n_tok; } issue[] = {
        { 16, 32, 16, 16, 1024 }, { 1, 8, 1, 1, 16 }, { 63, 8, 1, 1, 16 }, { 65, 8, 1, 1, 16 }, { 3, 64, 4, 2, 16 },
    };
    for (size_t w = 0; w < N_FLOAT; w++) {
        const enum ggml_type t = float_types[w];
        for (size_t i = 0; i < sizeof(issue) / sizeof(issue[0]); i++) {
            for (int per_expert = 0; per_expert < 2; per_expert++) {
                const int b1 = per_expert ? issue[i].n_used : 1;
                if (per_expert && issue[i].n_used == 1) continue;
                struct params p = { .t0 = t, .a = SHAPE(issue[i].k, issue[i].m, 1, 1),
                                    .i = { issue[i].n_as, issue[i].n_used, issue[i].n_tok, b1 } };
                run_case(LABEL("MUL_MAT_ID %s edge k=%lld m=%lld n_as=%d n_used=%d n_tok=%d b1=%d", ggml_type_name(t),
                               (long long) issue[i].k, (long long) issue[i].m, issue[i].n_as, issue[i].n_used,
                               issue[i].n_tok, b1),
                         b_mul_mat_id, &p, 5e-4, CMP_NMSE);
            }
        }
    }
    // Then every edge k (float experts) or one and three blocks (quantized), with m and the
    // token count 1 or odd.
    const struct { int64_t m; int n_tok, b1; } mn[] = { { 1, 1, 1 }, { 7, 5, 2 }, { 33, 3, 1 } };
    for (size_t w = 0; w < N_WEIGHT; w++) {
        const enum ggml_type t = weight_types[w];
        const int64_t blk = ggml_blck_size(t);
        const int64_t ks[] = { 1, 3, 16, 63, 65, blk, 3 * blk };
        for (size_t ki = blk == 1 ? 0 : N_EDGE_K; ki < (blk == 1 ? N_EDGE_K : N_EDGE_K + 2); ki++) {
            for (size_t s = 0; s < sizeof(mn) / sizeof(mn[0]); s++) {
                struct params p = { .t0 = t, .a = SHAPE(ks[ki], mn[s].m, 1, 1), .i = { 4, 2, mn[s].n_tok, mn[s].b1 } };
                run_case(LABEL("MUL_MAT_ID %s edge k=%lld m=%lld n_as=4 n_used=2 n_tok=%d b1=%d", ggml_type_name(t),
                               (long long) ks[ki], (long long) mn[s].m, mn[s].n_tok, mn[s].b1),
                         b_mul_mat_id, &p, 5e-4, CMP_NMSE);
            }
        }
    }
    // Prompt batches: from 8 tokens RFGPU groups the pairs by expert first (mmid_sort), in
    // tiles of 8 pairs of an expert (32 on tensor cores): counts across a tile's end, experts
    // no token uses, every expert used by every token, 40 pairs an expert, 17 rows (not a
    // multiple of a block's rows).
    const int batch[][4] = { { 8, 2, 64, 1 }, { 16, 4, 33, 4 }, { 4, 4, 8, 1 }, { 128, 8, 40, 1 }, { 4, 2, 80, 2 } };
    for (size_t w = 0; w < N_WEIGHT; w++) {
        const enum ggml_type t = weight_types[w];
        for (size_t i = 0; i < sizeof(batch) / sizeof(batch[0]); i++) {
            struct params p = { .t0 = t, .a = SHAPE(unit_k(t), 17, 1, 1),
                                .i = { batch[i][0], batch[i][1], batch[i][2], batch[i][3] } };
            run_case(LABEL("MUL_MAT_ID %s batch n_as=%d n_used=%d n_tok=%d b1=%d", ggml_type_name(t), batch[i][0],
                           batch[i][1], batch[i][2], batch[i][3]),
                     b_mul_mat_id, &p, 5e-4, CMP_NMSE);
        }
    }
    // F16 activations (issue 25); ggml-cpu gets them widened to F32 (b_mul_mat_id's i[4]).
    for (size_t w = 0; w < N_WEIGHT; w++) {
        const enum ggml_type t = weight_types[w];
        const int64_t blk = ggml_blck_size(t);
        const int64_t K = blk == 256 ? 256 : 3 * (blk > 32 ? blk : 32);
        const int cs[][4] = { { 4, 2, 3, 2 }, { 4, 2, 5, 1 }, { 8, 3, 1, 3 } };  // n_as, n_used, n_tok, b1
        for (size_t i = 0; i < 3; i++) {
            struct params p = { .t0 = t, .t1 = GGML_TYPE_F16, .a = SHAPE(K, 17, 1, 1),
                                .i = { cs[i][0], cs[i][1], cs[i][2], cs[i][3], 1 } };
            run_case(LABEL("MUL_MAT_ID %s x f16 k=%lld n_as=%d n_used=%d n_tok=%d b1=%d", ggml_type_name(t),
                           (long long) K, cs[i][0], cs[i][1], cs[i][2], cs[i][3]),
                     b_mul_mat_id, &p, 5e-4, CMP_NMSE);
        }
    }
}

static void cases_norm(void) {
    char label[160];
    static const char * names[] = { "RMS_NORM", "NORM", "L2_NORM" };
    static const int64_t shapes[][4] = { { 64, 5, 3, 2 }, { 4096, 3, 1, 1 }, { 7, 1, 1, 1 } };
    for (int op = 0; op < 3; op++) {
        for (size_t s = 0; s < 3; s++) {
            for (int perm = 0; perm < 2; perm++) {
                struct params p = { .i = { op, perm }, .f = { 1e-6f } };
                memcpy(p.a, shapes[s], sizeof(p.a));
                run_case(LABEL("%s [%lld,%lld,%lld,%lld]%s", names[op], (long long) p.a[0], (long long) p.a[1],
                               (long long) p.a[2], (long long) p.a[3], perm ? " permuted" : ""),
                         b_norm, &p, 1e-6, CMP_NMSE);
            }
        }
    }
#if defined(__x86_64__)
    // NORM (LayerNorm) to the bit against the AVX2 ggml-cpu this tree builds by default: RFCPU sums
    // the centred squares in its lane order (8-lane groups, a tail, rows shorter than a group). A
    // GPU's reduction has its own order: there the same shapes are held to a tight NMSE.
    const bool cpu = strcmp(ggml_backend_dev_name(g_rf_dev), "RFCPU") == 0;
    static const int64_t exact[][4] = { { 64, 5, 3, 2 }, { 4096, 3, 1, 1 }, { 13, 4, 1, 1 }, { 7, 2, 1, 1 } };
    for (size_t s = 0; s < 4; s++) {
        struct params p = { .i = { 1, 0 }, .f = { 1e-12f } };
        memcpy(p.a, exact[s], sizeof(p.a));
        run_case(LABEL("NORM exact [%lld,%lld,%lld,%lld]", (long long) p.a[0], (long long) p.a[1], (long long) p.a[2],
                       (long long) p.a[3]),
                 b_norm, &p, cpu ? 0 : 1e-10, cpu ? CMP_EXACT : CMP_NMSE);
    }
#endif
}

static void cases_rope(void) {
    char label[160];
    static const int modes[] = { GGML_ROPE_TYPE_NORMAL, GGML_ROPE_TYPE_NEOX, GGML_ROPE_TYPE_MROPE,
                                 GGML_ROPE_TYPE_IMROPE };
    static const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16 };
    for (size_t m = 0; m < 4; m++) {
        for (size_t t = 0; t < 2; t++) {
            for (int ff = 0; ff < 2; ff++) {
                for (int ext = 0; ext < 2; ext++) {
                    for (int partial = 0; partial < 2; partial++) {
                        const int hd = 64;
                        struct params p = { .t0 = types[t], .a = SHAPE(hd, 4, 5, 1) };
                        p.i[0] = modes[m];
                        p.i[1] = partial ? hd / 2 : hd;
                        p.i[2] = ff;
                        p.f[0] = 10000.0f;
                        p.f[1] = ext ? 0.25f : 1.0f;
                        p.f[2] = ext ? 1.0f : 0.0f;
                        p.f[3] = 1.0f;
                        p.f[4] = 32.0f;
                        p.f[5] = 1.0f;
                        run_case(LABEL("ROPE mode=%d %s n_dims=%d ff=%d ext=%d", modes[m], ggml_type_name(types[t]),
                                       p.i[1], ff, ext),
                                 b_rope, &p, 1e-6, CMP_NMSE);
                    }
                }
            }
        }
    }
}

static void cases_glu(void) {
    char label[160];
    static const enum ggml_glu_op ops[] = { GGML_GLU_OP_REGLU, GGML_GLU_OP_GEGLU, GGML_GLU_OP_SWIGLU,
                                            GGML_GLU_OP_GEGLU_ERF, GGML_GLU_OP_GEGLU_QUICK };
    static const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16 };
    static const char * forms[] = { "fused", "fused-swapped", "split" };
    for (size_t o = 0; o < 5; o++) {
        for (size_t t = 0; t < 2; t++) {
            for (int form = 0; form < 3; form++) {
                struct params p = { .t0 = types[t], .a = SHAPE(128, 7, 2, 1), .i = { (int) ops[o], form } };
                run_case(LABEL("GLU %s %s %s", ggml_glu_op_name(ops[o]), ggml_type_name(types[t]), forms[form]), b_glu,
                         &p, 1e-5, CMP_NMSE);
            }
        }
    }
}

// SWIGLU_OAI (gpt-oss): i[1] 0 fused, 2 split; f[0] alpha, f[1] limit; a: shape of one half.
static struct ggml_tensor * b_glu_oai(struct ggml_context * ctx, const struct params * p) {
    if (p->i[1] == 2) {
        struct ggml_tensor * x = in_t(ctx, GGML_TYPE_F32, p->a);
        struct ggml_tensor * g = in_t(ctx, GGML_TYPE_F32, p->a);
        return ggml_swiglu_oai(ctx, x, g, p->f[0], p->f[1]);
    }
    struct ggml_tensor * x = in4(ctx, GGML_TYPE_F32, 2 * p->a[0], p->a[1], p->a[2], p->a[3]);
    return ggml_swiglu_oai(ctx, x, NULL, p->f[0], p->f[1]);
}

// To the bit: the same f32 operations and libm's expf as ggml-cpu. A limit inside the inputs'
// range clamps both halves; gpt-oss's 7 does not.
static void cases_glu_oai(void) {
    char label[160];
    static const int64_t shapes[][4] = { { 128, 7, 2, 1 }, { 13, 3, 1, 1 } };
    static const float limits[] = { 0.5f, 7.0f };
    for (size_t s = 0; s < 2; s++) {
        for (size_t l = 0; l < 2; l++) {
            for (int form = 0; form <= 2; form += 2) {
                struct params p = { .i = { 0, form }, .f = { 1.702f, limits[l] } };
                memcpy(p.a, shapes[s], sizeof(p.a));
                run_case(LABEL("GLU swiglu_oai f32 %s [%lld,%lld,%lld] limit %.1f", form ? "split" : "fused",
                               (long long) p.a[0], (long long) p.a[1], (long long) p.a[2], limits[l]),
                         b_glu_oai, &p, 0, CMP_EXACT);
            }
        }
    }
}

static void cases_unary(void) {
    char label[160];
    static const struct { enum ggml_unary_op op; float lo, hi; } ops[] = {
        { GGML_UNARY_OP_SILU, -4, 4 },      { GGML_UNARY_OP_GELU, -4, 4 },   { GGML_UNARY_OP_GELU_ERF, -4, 4 },
        { GGML_UNARY_OP_GELU_QUICK, -4, 4 }, { GGML_UNARY_OP_RELU, -2, 2 },   { GGML_UNARY_OP_TANH, -3, 3 },
        { GGML_UNARY_OP_SIGMOID, -4, 4 },   { GGML_UNARY_OP_EXP, -3, 3 },    { GGML_UNARY_OP_NEG, -2, 2 },
        { GGML_UNARY_OP_ABS, -2, 2 },       { GGML_UNARY_OP_SGN, -2, 2 },    { GGML_UNARY_OP_STEP, -2, 2 },
        { GGML_UNARY_OP_HARDSWISH, -5, 5 }, { GGML_UNARY_OP_HARDSIGMOID, -5, 5 }, { GGML_UNARY_OP_ELU, -3, 3 },
    };
    static const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16 };
    static const int64_t shapes[][4] = { { 128, 5, 3, 1 }, { 4099, 2, 1, 1 } };
    for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
        for (size_t t = 0; t < 2; t++) {
            for (size_t s = 0; s < 2; s++) {
                struct params p = { .t0 = types[t], .i = { (int) ops[o].op }, .f = { ops[o].lo, ops[o].hi } };
                memcpy(p.a, shapes[s], sizeof(p.a));
                run_case(LABEL("UNARY %s %s [%lld,%lld]", ggml_unary_op_name(ops[o].op), ggml_type_name(types[t]),
                               (long long) p.a[0], (long long) p.a[1]),
                         b_unary, &p, 1e-5, CMP_NMSE);
            }
        }
    }
}

static void cases_simple(void) {
    char label[160];
    static const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16 };
    struct { int which; const char * name; int n_types; double thr; } ops[] = {
        { S_SQR, "SQR", 2, 1e-7 },     { S_SQRT, "SQRT", 2, 1e-7 },  { S_LOG, "LOG", 2, 1e-6 },
        { S_SIN, "SIN", 2, 1e-6 },     { S_COS, "COS", 2, 1e-6 },    { S_CLAMP, "CLAMP", 2, 1e-7 },
        { S_LEAKY, "LEAKY_RELU", 2, 1e-7 }, { S_SUM_ROWS, "SUM_ROWS", 1, 1e-7 }, { S_SUM, "SUM", 1, 1e-7 },
        { S_MEAN, "MEAN", 1, 1e-7 },   { S_CUMSUM, "CUMSUM", 1, 1e-7 }, { S_FILL, "FILL", 2, 1e-7 },
    };
    static const int64_t shapes[][4] = { { 33, 5, 3, 2 }, { 1024, 4, 1, 1 } };
    for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
        for (int t = 0; t < ops[o].n_types; t++) {
            for (size_t s = 0; s < 2; s++) {
                struct params p = { .t0 = types[t], .i = { ops[o].which }, .f = { -0.5f, 0.75f } };
                if (ops[o].which == S_LEAKY) p.f[0] = 0.1f;
                if (ops[o].which == S_FILL) p.f[0] = 2.5f;
                memcpy(p.a, shapes[s], sizeof(p.a));
                run_case(LABEL("%s %s [%lld,%lld,%lld,%lld]", ops[o].name, ggml_type_name(types[t]), (long long) p.a[0],
                               (long long) p.a[1], (long long) p.a[2], (long long) p.a[3]),
                         b_simple, &p, ops[o].thr, CMP_NMSE);
            }
        }
    }
    // DIAG_MASK_INF
    for (int n_past = 0; n_past <= 2; n_past += 2) {
        struct params p = { .t0 = GGML_TYPE_F32, .a = SHAPE(9, 7, 3, 1), .i = { S_DIAG_MASK_INF, n_past } };
        run_case(LABEL("DIAG_MASK_INF n_past=%d", n_past), b_simple, &p, 1e-7, CMP_NMSE);
    }
    // PAD
    {
        struct params p = { .t0 = GGML_TYPE_F32, .a = SHAPE(10, 5, 3, 2), .i = { S_PAD, 3, 2, 1, 1 } };
        run_case("PAD f32 right", b_simple, &p, 1e-7, CMP_NMSE);
        struct params q = { .t0 = GGML_TYPE_F32, .a = SHAPE(10, 5, 3, 2), .i = { S_PAD_EXT, 2, 3, 1, 2, 1, 0, 1 } };
        run_case("PAD f32 left+right", b_simple, &q, 1e-7, CMP_NMSE);
    }
    // ARGSORT / TOP_K
    static const int64_t sshapes[][4] = { { 16, 10, 1, 1 }, { 1000, 3, 2, 1 }, { 7, 1, 1, 1 } };
    for (size_t s = 0; s < 3; s++) {
        for (int desc = 0; desc < 2; desc++) {
            struct params p = { .t0 = GGML_TYPE_F32, .i = { desc ? S_ARGSORT_DESC : S_ARGSORT_ASC } };
            memcpy(p.a, sshapes[s], sizeof(p.a));
            run_case(LABEL("ARGSORT %s [%lld,%lld]", desc ? "desc" : "asc", (long long) p.a[0], (long long) p.a[1]),
                     b_simple, &p, 0, CMP_EXACT);
        }
        struct params p = { .t0 = GGML_TYPE_F32, .i = { S_TOP_K, (int) (sshapes[s][0] < 5 ? sshapes[s][0] : 5) } };
        memcpy(p.a, sshapes[s], sizeof(p.a));
        run_case(LABEL("TOP_K k=%d [%lld,%lld]", p.i[1], (long long) p.a[0], (long long) p.a[1]), b_simple, &p, 0,
                 CMP_SETS);
    }
}

static void cases_rows(void) {
    char label[160];
    for (size_t w = 0; w < N_WEIGHT; w++) {
        const enum ggml_type t = weight_types[w];
        static const int64_t shapes[][4] = { { 256, 10, 1, 1 }, { 256, 6, 3, 1 }, { 256, 5, 2, 2 } };
        for (size_t s = 0; s < 3; s++) {
            struct params p = { .t0 = t, .i = { 4 } };
            memcpy(p.a, shapes[s], sizeof(p.a));
            run_case(LABEL("GET_ROWS %s [%lld,%lld,%lld,%lld]", ggml_type_name(t), (long long) p.a[0],
                           (long long) p.a[1], (long long) p.a[2], (long long) p.a[3]),
                     b_get_rows, &p, 1e-7, CMP_NMSE);
        }
    }
    {
        struct params p = { .t0 = GGML_TYPE_I32, .a = SHAPE(8, 10, 1, 1), .i = { 5 } };
        run_case("GET_ROWS i32", b_get_rows, &p, 1e-7, CMP_NMSE);
    }
    // The i-quants on raw random blocks: ggml's quantizer reaches every grid point over many
    // blocks, raw bytes reach every index, sign and scale pattern in a few (a wrong grid entry
    // or sign table fails here). GET_ROWS (dequantization) and a 3-column MUL_MAT.
    static const enum ggml_type iq[] = { GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS,
                                         GGML_TYPE_IQ3_S,   GGML_TYPE_IQ1_S,  GGML_TYPE_IQ1_M };
    for (size_t q = 0; q < sizeof(iq) / sizeof(iq[0]); q++) {
        struct params p = { .t0 = iq[q], .a = SHAPE(512, 40, 1, 1), .i = { 40, 1 } };
        run_case(LABEL("GET_ROWS %s raw blocks", ggml_type_name(iq[q])), b_get_rows, &p, 1e-7, CMP_NMSE);
        struct params pm = { .t0 = iq[q], .t1 = GGML_TYPE_F32, .a = SHAPE(1024, 64, 1, 1), .b = SHAPE(1024, 3, 1, 1),
                             .i = { 0, 0, 0, 1 } };
        run_case(LABEL("MUL_MAT %s raw blocks", ggml_type_name(iq[q])), b_mul_mat, &pm, 1e-7, CMP_NMSE);
    }
    // ggml 0.26's newer formats: ggml-cpu runs every product of theirs through its one dot (no
    // tiled, llamafile or repacked path in a plain buffer), and RFCPU mirrors its arithmetic, so
    // every output must be ggml-cpu's to the bit. Quantized values and raw blocks; MUL_MAT with
    // 1 and 9 columns, MUL_MAT_ID, GET_ROWS, and SET_ROWS (ggml's quantizer). x86-64 only, and
    // not with RFCPU forced to its scalar code (ggml's portable order, not its AVX2 build's).
    // A GPU sums the products in its own order (held to a tight NMSE there, "bits" for RFCPU
    // only) but dequantizes to the bit (GET_ROWS exact on every device), on every host.
    static const enum ggml_type nf[] = { GGML_TYPE_NVFP4, GGML_TYPE_Q1_0, GGML_TYPE_Q2_0 };
    const bool on_cpu = strcmp(ggml_backend_dev_name(g_rf_dev), "RFCPU") == 0;
#if defined(__x86_64__)
    const char * simd = getenv("ROCMFORGE_SIMD");
    const size_t n_nf = on_cpu && simd && strcmp(simd, "scalar") == 0 ? 0 : sizeof(nf) / sizeof(nf[0]);
#else
    const size_t n_nf = on_cpu ? 0 : sizeof(nf) / sizeof(nf[0]);
#endif
    const char * dot_kind = on_cpu ? "bits" : "nmse";
    const double dot_tol = on_cpu ? 0 : 1e-7;
    const enum cmp_mode dot_cmp = on_cpu ? CMP_EXACT : CMP_NMSE;
    for (size_t q = 0; q < n_nf; q++) {
        const char * tn = ggml_type_name(nf[q]);
        const int64_t K = 8 * ggml_blck_size(nf[q]);
        for (int raw = 0; raw < 2; raw++) {
            for (int64_t n = 1; n <= 9; n += 8) {
                struct params pm = { .t0 = nf[q], .t1 = GGML_TYPE_F32, .a = SHAPE(K, 33, 1, 1), .b = SHAPE(K, n, 1, 1),
                                     .i = { 0, 0, 0, raw } };
                run_case(LABEL("MUL_MAT %s%s n=%lld %s", tn, raw ? " raw blocks" : "", (long long) n, dot_kind), b_mul_mat,
                         &pm, dot_tol, dot_cmp);
            }
            struct params pg = { .t0 = nf[q], .a = SHAPE(K, 40, 1, 1), .i = { 40, raw } };
            run_case(LABEL("GET_ROWS %s%s bits", tn, raw ? " raw blocks" : ""), b_get_rows, &pg, 0, CMP_EXACT);
        }
        struct params pi = { .t0 = nf[q], .a = SHAPE(K, 17, 1, 1), .i = { 4, 2, 3, 2 } };
        run_case(LABEL("MUL_MAT_ID %s %s", tn, dot_kind), b_mul_mat_id, &pi, dot_tol, dot_cmp);
        struct params ps = { .t0 = nf[q], .t1 = GGML_TYPE_I64, .a = SHAPE(K, 12, 2, 1), .i = { 5, 1 } };
        run_case(LABEL("SET_ROWS f32->%s bits", tn), b_set_rows, &ps, 0, CMP_EXACT);
    }
    static const enum ggml_type dst_types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                                GGML_TYPE_Q4_0 };
    static const enum ggml_type idx_types[] = { GGML_TYPE_I64, GGML_TYPE_I32 };
    for (size_t d = 0; d < 5; d++) {
        for (size_t x = 0; x < 2; x++) {
            for (int bc = 1; bc <= 2; bc++) {
                struct params p = { .t0 = dst_types[d], .t1 = idx_types[x], .a = SHAPE(64, 12, 2, 1), .i = { 5, bc } };
                run_case(LABEL("SET_ROWS f32->%s idx=%s%s", ggml_type_name(p.t0), ggml_type_name(p.t1),
                               bc == 2 ? " idx broadcast" : ""),
                         b_set_rows, &p, is_quant(p.t0) ? 1e-6 : 1e-7, CMP_NMSE);
            }
        }
    }
    // Every destination type a device may claim (the KV-cache types llama.cpp offers), from F32
    // and F16 sources, with both index types. Quantized destinations are compared after
    // ggml's dequantization: a quantizer that is not ggml's (issue 20: RFCPU's K-quants and
    // IQ4_NL differed by an NMSE of 2e-5..9e-5) fails.
    static const enum ggml_type src_types[] = { GGML_TYPE_F32, GGML_TYPE_F16 };
    for (size_t d = 0; d < N_WEIGHT; d++) {
        const enum ggml_type t = weight_types[d];
        const int64_t blk = ggml_blck_size(t);
        for (size_t st = 0; st < 2; st++) {
            for (size_t x = 0; x < 2; x++) {
                // One block a row for the K-quants, two for the others; I32 ids broadcast.
                struct params p = { .t0 = t, .t1 = idx_types[x], .t2 = src_types[st],
                                    .a = SHAPE(unit_k(t), 12, 2, 1), .i = { 5, x ? 2 : 1 } };
                run_case(LABEL("SET_ROWS %s->%s idx=%s%s", ggml_type_name(p.t2), ggml_type_name(t),
                               ggml_type_name(p.t1), x ? " idx broadcast" : ""),
                         b_set_rows, &p, is_quant(t) ? 1e-6 : 1e-7, CMP_NMSE);
            }
            // Edge rows: float destinations with 1, 3, 63, 65 values a row, quantized ones
            // three blocks a row (an odd block count); odd row and index counts.
            for (size_t ki = 0; ki < (blk == 1 ? N_EDGE_K : 1); ki++) {
                if (blk == 1 && edge_k[ki] == 16) continue;
                const int64_t ne0 = blk == 1 ? edge_k[ki] : 3 * blk;
                struct params p = { .t0 = t, .t1 = GGML_TYPE_I64, .t2 = src_types[st], .a = SHAPE(ne0, 9, 3, 1),
                                    .i = { 3, 1 } };
                run_case(LABEL("SET_ROWS %s->%s edge ne0=%lld", ggml_type_name(p.t2), ggml_type_name(t),
                               (long long) ne0),
                         b_set_rows, &p, is_quant(t) ? 1e-6 : 1e-7, CMP_NMSE);
            }
        }
    }
    // Rows shorter than a warp: llama's V cache transposed (one value a row, a prompt's worth
    // of rows; the GPU takes a thread per value), and 5-value rows with broadcast ids.
    for (int t = 0; t < 2; t++) {
        const enum ggml_type dt = t ? GGML_TYPE_F16 : GGML_TYPE_F32;
        struct params p1 = { .t0 = dt, .t1 = GGML_TYPE_I64, .a = SHAPE(1, 3000, 1, 1), .i = { 700, 1 } };
        run_case(LABEL("SET_ROWS f32->%s one value a row, 700 rows", ggml_type_name(dt)), b_set_rows, &p1, 1e-7, CMP_NMSE);
        struct params p5 = { .t0 = dt, .t1 = GGML_TYPE_I32, .a = SHAPE(5, 40, 2, 1), .i = { 17, 2 } };
        run_case(LABEL("SET_ROWS f32->%s 5 values a row, idx broadcast", ggml_type_name(dt)), b_set_rows, &p5, 1e-7, CMP_NMSE);
    }
}

static void cases_flash_attn(void) {
    char label[160];
    static const enum ggml_type kv_types[] = { GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_F32 };
    struct { int D, nq, nh, nhkv, nkv, mask, sinks; float scale, max_bias, softcap; } cs[] = {
        { 64, 1, 4, 4, 32, 1, 0, 0.125f, 0.0f, 0.0f },
        { 64, 7, 4, 2, 64, 1, 0, 0.125f, 0.0f, 0.0f },   // GQA
        { 128, 3, 4, 1, 48, 1, 0, 0.09f, 0.0f, 0.0f },   // MQA
        { 64, 5, 4, 4, 32, 0, 0, 0.125f, 0.0f, 0.0f },   // no mask
        { 64, 4, 8, 8, 32, 1, 0, 0.125f, 8.0f, 0.0f },   // ALiBi
        { 64, 4, 4, 2, 32, 1, 0, 0.02f, 0.0f, 30.0f },   // logit softcap
        { 64, 4, 4, 2, 32, 1, 1, 0.125f, 0.0f, 0.0f },   // sinks
        // Prompt-sized (32+ query rows: the GPU's tiled kernel), mask 2 = causal.
        { 64, 70, 4, 2, 96, 2, 0, 0.125f, 0.0f, 0.0f },  // GQA, 3 query tiles, skipped key tiles
        { 64, 40, 4, 4, 200, 1, 0, 0.125f, 0.0f, 0.0f }, // random mask, key count not a tile multiple
        { 128, 33, 4, 1, 64, 2, 1, 0.09f, 0.0f, 0.0f },  // MQA, sinks
        { 80, 35, 2, 2, 50, 0, 0, 0.1f, 0.0f, 0.0f },    // head size 80, no mask
        { 64, 36, 8, 8, 40, 2, 0, 0.125f, 8.0f, 0.0f },  // ALiBi
        { 64, 32, 4, 2, 48, 2, 0, 0.02f, 0.0f, 30.0f },  // logit softcap
        { 256, 32, 2, 2, 40, 2, 0, 0.06f, 0.0f, 0.0f },  // head size over the tiled kernel's
        // The GPU's tensor-core prompt kernel (F16, head size 64 / 128): 16 rows a warp, 64-key tiles.
        { 128, 130, 8, 2, 300, 2, 1, 0.088f, 0.0f, 0.0f }, // partial query and key tiles, GQA, causal, sinks
        { 64, 64, 4, 4, 129, 1, 0, 0.125f, 8.0f, 20.0f },  // random mask, ALiBi, softcap
        { 64, 320, 32, 8, 100, 2, 0, 0.125f, 0.0f, 0.0f }, // 4-warp blocks (a grid that fills an H100)
        { 128, 48, 4, 4, 70, 0, 0, 0.09f, 0.0f, 0.0f },    // no mask
        // ... split over the keys where its blocks would not fill the GPU (merged by the combine kernel).
        { 64, 96, 4, 2, 2100, 2, 1, 0.125f, 0.0f, 0.0f },  // 4 splits of 576 keys, causal, sinks
        { 128, 40, 4, 4, 1300, 1, 0, 0.09f, 8.0f, 0.0f },  // 2 splits, random mask, ALiBi, partial last tile
        { 64, 64, 4, 2, 1024, 3, 1, 0.125f, 0.0f, 20.0f }, // splits wholly masked, sinks, softcap
        // Generation (1..few query rows: the GPU's split-KV kernel), SmolLM2-like 9/3 heads.
        { 64, 1, 9, 3, 1, 1, 1, 0.125f, 0.0f, 0.0f },    // a single key
        { 64, 1, 9, 3, 7, 1, 0, 0.125f, 0.0f, 0.0f },
        { 64, 1, 9, 3, 256, 1, 1, 0.125f, 0.0f, 0.0f },
        { 64, 1, 9, 3, 700, 1, 0, 0.02f, 0.0f, 30.0f },  // logit softcap, partial last chunk
        { 64, 1, 9, 3, 4096, 1, 1, 0.125f, 0.0f, 0.0f }, // long cache, many splits
        { 64, 2, 9, 3, 4096, 2, 0, 0.125f, 0.0f, 0.0f }, // causal mask, two rows
        { 64, 1, 9, 3, 4096, 3, 1, 0.125f, 0.0f, 0.0f }, // cache a third filled: whole splits masked
        { 128, 3, 8, 2, 1000, 1, 1, 0.09f, 8.0f, 0.0f }, // ALiBi, sinks
        { 80, 1, 4, 4, 333, 0, 0, 0.1f, 0.0f, 0.0f },    // head size 80 (narrow loads), no mask
        { 256, 1, 2, 1, 600, 1, 0, 0.06f, 0.0f, 0.0f },  // largest head size
        // The GPU's KV-head-grouped kernel: every row of a KV head in one block (rows * D <= 1024).
        { 128, 1, 32, 8, 577, 1, 0, 0.088f, 0.0f, 0.0f }, // 8B-like, partial last chunk
        { 128, 1, 8, 2, 1000, 1, 1, 0.09f, 8.0f, 0.0f },  // ALiBi, sinks
        { 256, 1, 4, 1, 300, 3, 1, 0.06f, 0.0f, 0.0f },   // 4 rows of 256, whole splits masked
        { 64, 4, 8, 2, 50, 2, 0, 0.125f, 0.0f, 20.0f },   // 16 rows of 64, causal, softcap
        // ... over llama's 256-key cache view early in a generation (up to 4 rows a KV head).
        { 128, 1, 32, 8, 256, 3, 1, 0.088f, 0.0f, 0.0f }, // 8B-like, the view a third filled, sinks
        { 128, 1, 8, 2, 100, 1, 0, 0.09f, 8.0f, 30.0f },  // ALiBi, softcap
        { 64, 2, 4, 2, 130, 2, 0, 0.125f, 0.0f, 0.0f },   // two query rows, causal
    };
    for (size_t k = 0; k < 3; k++) {
        for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
            // A quantized K/V row holds whole blocks: a head size of 80 is no Q8_0 row (the
            // tensor would be shorter than the values written into it).
            if (cs[i].D % ggml_blck_size(kv_types[k]) != 0) continue;
            struct params p = { .t0 = kv_types[k],
                                .i = { cs[i].D, cs[i].nq, cs[i].nh, cs[i].nhkv, cs[i].nkv, cs[i].mask, cs[i].sinks },
                                .f = { cs[i].scale, cs[i].max_bias, cs[i].softcap } };
            run_case(LABEL("FLASH_ATTN_EXT kv=%s D=%d nq=%d heads=%d/%d nkv=%d mask=%d sinks=%d max_bias=%g softcap=%g",
                           ggml_type_name(kv_types[k]), cs[i].D, cs[i].nq, cs[i].nh, cs[i].nhkv, cs[i].nkv, cs[i].mask,
                           cs[i].sinks, cs[i].max_bias, cs[i].softcap),
                     b_flash_attn, &p, 5e-4, CMP_NMSE);
        }
    }
}

static void cases_shape2(void) {
    char label[160];
    static const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16 };
    for (size_t t = 0; t < 2; t++) {
        for (int dim = 0; dim < 4; dim++) {
            struct params p = { .t0 = types[t], .a = SHAPE(10, 5, 3, 2), .i = { 0, dim } };
            run_case(LABEL("CONCAT %s dim=%d", ggml_type_name(types[t]), dim), b_shape2, &p, 1e-7, CMP_NMSE);
        }
        static const int64_t reps[][2][4] = {
            { { 10, 1, 1, 1 }, { 10, 5, 3, 2 } },
            { { 5, 2, 1, 1 }, { 10, 4, 3, 1 } },
            { { 1, 1, 1, 1 }, { 7, 3, 1, 1 } },
        };
        for (size_t r = 0; r < 3; r++) {
            struct params p = { .t0 = types[t], .i = { 1 } };
            memcpy(p.a, reps[r][0], sizeof(p.a));
            memcpy(p.b, reps[r][1], sizeof(p.b));
            run_case(LABEL("REPEAT %s [%lld,%lld,%lld,%lld]->[%lld,%lld,%lld,%lld]", ggml_type_name(types[t]),
                           (long long) p.a[0], (long long) p.a[1], (long long) p.a[2], (long long) p.a[3],
                           (long long) p.b[0], (long long) p.b[1], (long long) p.b[2], (long long) p.b[3]),
                     b_shape2, &p, 1e-7, CMP_NMSE);
        }
    }
    // CONCAT also takes BF16 and I32 (a copy of elements).
    static const enum ggml_type ctypes[] = { GGML_TYPE_BF16, GGML_TYPE_I32 };
    for (size_t t = 0; t < 2; t++) {
        for (int dim = 0; dim < 4; dim += 3) {
            struct params p = { .t0 = ctypes[t], .a = SHAPE(10, 5, 3, 2), .i = { 0, dim } };
            run_case(LABEL("CONCAT %s dim=%d", ggml_type_name(ctypes[t]), dim), b_shape2, &p, 1e-7, CMP_NMSE);
        }
    }
    struct params p = { .a = SHAPE(64, 2, 5, 1), .i = { 2, 4 } };
    run_case("ADD_ID f32 n_as=4", b_shape2, &p, 1e-7, CMP_NMSE);
    struct params q = { .f = { 0.0f, 10.0f, 1.0f } };
    run_case("ARANGE 0..10", b_arange, &q, 1e-7, CMP_NMSE);
    struct params r = { .f = { -3.0f, 500.0f, 0.5f } };
    run_case("ARANGE -3..500 step 0.5", b_arange, &r, 1e-7, CMP_NMSE);
}

// Edge row lengths for the row-wise ops (issue 20: our own catalog had none of them): ne0 of
// 1, 3, 63, 65 (vector tails, a lone element, one past a 64-wide chunk) over 7 x 3 rows, and
// ne0 1 and 65 as a single row.
static void cases_edges(void) {
    char label[160];
    int64_t shapes[6][4];
    int n_shapes = 0;
    for (size_t ki = 0; ki < N_EDGE_K; ki++) {
        if (edge_k[ki] == 16) continue;
        const int64_t sh[4] = { edge_k[ki], 7, 3, 1 };
        memcpy(shapes[n_shapes++], sh, sizeof(sh));
    }
    memcpy(shapes[n_shapes++], (int64_t[4]) { 1, 1, 1, 1 }, sizeof(shapes[0]));
    memcpy(shapes[n_shapes++], (int64_t[4]) { 65, 1, 1, 1 }, sizeof(shapes[0]));
#define EDGE_SHAPE(x) (long long) (x)[0], (long long) (x)[1], (long long) (x)[2]
    static const char * bin_names[] = { "ADD", "SUB", "MUL", "DIV" };
    for (int s = 0; s < n_shapes; s++) {
        const int64_t * a = shapes[s];
        const bool many = a[1] > 1;  // the multi-row shapes get the wider sweeps
        // Binary: src1 one row broadcast over every row (a single-row shape: the same shape).
        for (size_t t = 0; t < N_FLOAT; t++) {
            for (int op = 0; op < 4; op++) {
                if (t > 0 && (op == 1 || op == 3)) continue;  // F16/BF16: ADD and MUL
                const enum ggml_type ty = float_types[t];
                struct params p = { .t0 = ty, .t1 = ty, .t2 = ty, .a = SHAPE(a[0], a[1], a[2], a[3]),
                                    .b = SHAPE(a[0], 1, 1, 1), .i = { op, 0 } };
                run_case(LABEL("%s %s edge [%lld,%lld,%lld]", bin_names[op], ggml_type_name(ty), EDGE_SHAPE(a)),
                         b_binary, &p, 1e-7, CMP_NMSE);
            }
        }
        {
            struct params p = { .i = { 1 }, .f = { 0.37f, -1.5f }, .a = SHAPE(a[0], a[1], a[2], a[3]) };
            run_case(LABEL("SCALE+bias edge [%lld,%lld,%lld]", EDGE_SHAPE(a)), b_scale, &p, 1e-7, CMP_NMSE);
        }
        for (int masked = 0; masked < 2; masked++) {
            struct params p = { .t1 = masked ? GGML_TYPE_F16 : GGML_TYPE_COUNT, .a = SHAPE(a[0], a[1], a[2], a[3]),
                                .b = SHAPE(a[0], a[1], 1, 1), .f = { 0.5f, 0.0f } };
            run_case(LABEL("SOFT_MAX edge [%lld,%lld,%lld] mask=%s", EDGE_SHAPE(a), masked ? "f16" : "none"),
                     b_soft_max, &p, 1e-6, CMP_NMSE);
        }
        static const char * norm_names[] = { "RMS_NORM", "NORM", "L2_NORM" };
        for (int op = 0; op < 3; op++) {
            struct params p = { .i = { op, 0 }, .f = { 1e-6f }, .a = SHAPE(a[0], a[1], a[2], a[3]) };
            run_case(LABEL("%s edge [%lld,%lld,%lld]", norm_names[op], EDGE_SHAPE(a)), b_norm, &p, 1e-6, CMP_NMSE);
        }
        if (!many) continue;
        static const struct { enum ggml_unary_op op; float lo, hi; } un[] = {
            { GGML_UNARY_OP_SILU, -4, 4 }, { GGML_UNARY_OP_GELU, -4, 4 }, { GGML_UNARY_OP_EXP, -3, 3 },
            { GGML_UNARY_OP_TANH, -3, 3 },
        };
        static const enum ggml_type ut[] = { GGML_TYPE_F32, GGML_TYPE_F16 };
        for (size_t o = 0; o < sizeof(un) / sizeof(un[0]); o++) {
            for (size_t t = 0; t < 2; t++) {
                struct params p = { .t0 = ut[t], .i = { (int) un[o].op }, .f = { un[o].lo, un[o].hi },
                                    .a = SHAPE(a[0], a[1], a[2], a[3]) };
                run_case(LABEL("UNARY %s %s edge [%lld,%lld,%lld]", ggml_unary_op_name(un[o].op),
                               ggml_type_name(ut[t]), EDGE_SHAPE(a)),
                         b_unary, &p, 1e-5, CMP_NMSE);
            }
        }
        for (size_t t = 0; t < 2; t++) {
            struct params p1 = { .t0 = ut[t], .a = SHAPE(a[0], a[1], a[2], a[3]), .i = { GGML_GLU_OP_SWIGLU, 0 } };
            run_case(LABEL("GLU swiglu %s fused edge [%lld,%lld,%lld]", ggml_type_name(ut[t]), EDGE_SHAPE(a)), b_glu,
                     &p1, 1e-5, CMP_NMSE);
            struct params p2 = { .t0 = ut[t], .a = SHAPE(a[0], a[1], a[2], a[3]), .i = { GGML_GLU_OP_GEGLU, 2 } };
            run_case(LABEL("GLU geglu %s split edge [%lld,%lld,%lld]", ggml_type_name(ut[t]), EDGE_SHAPE(a)), b_glu,
                     &p2, 1e-5, CMP_NMSE);
        }
        for (size_t t = 0; t < N_FLOAT; t++) {
            struct params p = { .t0 = float_types[t], .a = SHAPE(a[0], a[1], a[2], a[3]), .i = { 5 } };
            run_case(LABEL("GET_ROWS %s edge [%lld,%lld,%lld]", ggml_type_name(float_types[t]), EDGE_SHAPE(a)),
                     b_get_rows, &p, 1e-7, CMP_NMSE);
        }
        static const enum ggml_type cp[][2] = {
            { GGML_TYPE_F32, GGML_TYPE_F16 },  { GGML_TYPE_F16, GGML_TYPE_F32 }, { GGML_TYPE_F32, GGML_TYPE_BF16 },
            { GGML_TYPE_BF16, GGML_TYPE_F32 }, { GGML_TYPE_F16, GGML_TYPE_F16 },
        };
        for (size_t c = 0; c < sizeof(cp) / sizeof(cp[0]); c++) {
            // Contiguous, and (F32 -> F16) permuted.
            for (int layout = 0; layout < (c == 0 ? 2 : 1); layout++) {
                struct params p = { .t0 = cp[c][0], .t1 = cp[c][1], .a = SHAPE(a[0], a[1], a[2], a[3]),
                                    .i = { layout } };
                run_case(LABEL("CPY %s->%s edge [%lld,%lld,%lld]%s", ggml_type_name(cp[c][0]), ggml_type_name(cp[c][1]),
                               EDGE_SHAPE(a), layout ? " permuted" : ""),
                         b_cpy, &p, 1e-7, CMP_NMSE);
            }
        }
        static const struct { int which; const char * name; enum cmp_mode cmp; } simple[] = {
            { S_SQR, "SQR", CMP_NMSE },   { S_SUM_ROWS, "SUM_ROWS", CMP_NMSE }, { S_MEAN, "MEAN", CMP_NMSE },
            { S_CUMSUM, "CUMSUM", CMP_NMSE }, { S_ARGSORT_ASC, "ARGSORT asc", CMP_EXACT },
        };
        for (size_t o = 0; o < sizeof(simple) / sizeof(simple[0]); o++) {
            struct params p = { .t0 = GGML_TYPE_F32, .i = { simple[o].which }, .a = SHAPE(a[0], a[1], a[2], a[3]) };
            run_case(LABEL("%s f32 edge [%lld,%lld,%lld]", simple[o].name, EDGE_SHAPE(a)), b_simple, &p,
                     simple[o].cmp == CMP_EXACT ? 0 : 1e-7, simple[o].cmp);
        }
    }
#undef EDGE_SHAPE
    // Attention over 1, 3 and 65 keys, one and 7 query rows.
    static const int nkv[] = { 1, 3, 65 };
    for (size_t k = 0; k < 3; k++) {
        for (int nq = 1; nq <= 7; nq += 6) {
            struct params p = { .t0 = GGML_TYPE_F16, .i = { 64, nq, 4, 2, nkv[k], 1, 0 }, .f = { 0.125f, 0.0f, 0.0f } };
            run_case(LABEL("FLASH_ATTN_EXT kv=f16 edge D=64 nq=%d heads=4/2 nkv=%d", nq, nkv[k]), b_flash_attn, &p,
                     5e-4, CMP_NMSE);
        }
    }
}

// ---------------------------------------------------------------------------------------------

// --gpus: the whole catalog once per rocmforge GPU device (RFGPU0..N), each in its own process;
// with no GPU present this prints "skipped: no GPU" and succeeds, which is what CI sees.
static int run_on_every_gpu(const char * self) {
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    int n_gpu = 0, failed = 0;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        const char * name = ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, i));
        if (strncmp(name, "RFGPU", 5) != 0) continue;
        n_gpu++;
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "'%s' --device %s", self, name);
        printf("=== test_ops on %s\n", name);
        fflush(stdout);
        if (system(cmd) != 0) failed++;
    }
    if (n_gpu == 0) {
        printf("skipped: no GPU (no RFGPU device in the rocmforge registry)\n");
        return 0;
    }
    printf("test_ops on %d GPU device(s): %d failed\n", n_gpu, failed);
    return failed ? 1 : 0;
}

int main(int argc, char ** argv) {
    bool selfcheck = false;
    const char * device = "RFCPU";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--selfcheck") == 0) {
            selfcheck = true;
        } else if (strcmp(argv[i], "--gpus") == 0) {
            return run_on_every_gpu(argv[0]);
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            device = argv[++i];
        } else {
            filter = argv[i];
        }
    }
    // Every case on every thread: small graphs would otherwise run on one thread (see
    // threads_for in src/cpu/backend.rs) and leave the kernels' work split untested.
    setenv("ROCMFORGE_CPU_SMALL_GRAPH", "0", 0);
    g_cpu_dev = rf_ggml_cpu_device();
    g_selfcheck = selfcheck;
    g_rf_dev = selfcheck ? g_cpu_dev : rf_device_by_name(device);
    if (!selfcheck) printf("device under test: %s (%s)\n", device, ggml_backend_dev_description(g_rf_dev));
    g_rf = ggml_backend_dev_init(g_rf_dev, NULL);
    if (selfcheck) printf("self-check: the catalog on ggml-cpu vs ggml-cpu (\"RFCPU\" below is ggml-cpu)\n");
    g_cpu = ggml_backend_dev_init(g_cpu_dev, NULL);
    if (!g_rf || !g_cpu) {
        fprintf(stderr, "backend init failed\n");
        return 2;
    }
    const int n_threads = getenv("RF_TEST_THREADS") ? atoi(getenv("RF_TEST_THREADS")) : 2;
    rf_set_n_threads(g_rf, n_threads);
    rf_set_n_threads(g_cpu, n_threads);

    const double t0 = rf_now_ms();
    cases_cpy();
    cases_binary();
    cases_scale();
    cases_soft_max();
    cases_mul_mat();
    cases_mul_mat_id();
    cases_norm();
    cases_rope();
    cases_glu();
    cases_glu_oai();
    cases_unary();
    cases_simple();
    cases_rows();
    cases_flash_attn();
    cases_shape2();
    cases_edges();
    const double elapsed = rf_now_ms() - t0;

    // Per (op, types): claimed ones in full; the rest summed per op.
    printf("\n%-44s %8s %6s %7s %7s %10s %12s\n", "op(types) claimed by RFCPU", "claimed", "run", "passed", "failed",
           "cpu-refused", "not-claimed");
    int uncovered = 0;
    int tot_claimed = 0, tot_run = 0, tot_passed = 0, tot_failed = 0, tot_not = 0;
    for (int i = 0; i < n_stats; i++) {
        struct stat * s = &stats[i];
        tot_claimed += s->claimed;
        tot_run += s->run;
        tot_passed += s->passed;
        tot_failed += s->failed;
        tot_not += s->not_claimed;
        if (s->claimed == 0) continue;
        const bool bad = s->run == 0;
        uncovered += bad;
        printf("%-44s %8d %6d %7d %7d %10d %12d%s\n", s->key, s->claimed, s->run, s->passed, s->failed, s->cpu_refused,
               s->not_claimed, bad ? "   <-- claimed but never run" : s->failed ? "   <-- FAILED" : "");
    }
    for (int op = 0; op < GGML_OP_COUNT; op++) {
        if (view_nodes_run[op]) {
            printf("%-44s %8s %6d %7s (as inputs of the cases above)\n", ggml_op_name((enum ggml_op) op), "-",
                   view_nodes_run[op], "-");
        }
    }
    printf("\nnot claimed by RFCPU (cases per op):");
    int col = 0;
    for (int i = 0; i < n_stats; i++) {
        if (stats[i].not_claimed == 0) continue;
        // print each op once, with the total over its keys
        bool first = true;
        for (int j = 0; j < i; j++) {
            if (strcmp(stats[j].op, stats[i].op) == 0 && stats[j].not_claimed) first = false;
        }
        if (!first) continue;
        int sum = 0;
        for (int j = i; j < n_stats; j++) {
            if (strcmp(stats[j].op, stats[i].op) == 0) sum += stats[j].not_claimed;
        }
        printf("%s%s %d", col % 6 == 0 ? "\n  " : ", ", stats[i].op, sum);
        col++;
    }
    printf("\n\ncases: %d, claimed %d, run %d, passed %d, failed %d, not claimed %d; %.1f s with %d thread(s)\n",
           n_cases, tot_claimed, tot_run, tot_passed, tot_failed, tot_not, elapsed / 1000.0, n_threads);
    printf("graph_compute time over the cases run: RFCPU %.1f ms, ggml-cpu %.1f ms\n", compute_ms[0], compute_ms[1]);
    if (uncovered) {
        printf("%d claimed (op, types) combination(s) never ran (ggml-cpu refused every case)\n", uncovered);
        rf_failures += uncovered;
    }
    ggml_backend_free(g_rf);
    ggml_backend_free(g_cpu);
    return rf_finish(selfcheck ? "test_ops --selfcheck" : "test_ops");
}
