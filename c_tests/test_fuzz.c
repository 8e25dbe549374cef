// test_fuzz: a seeded random generator of malformed tensors and graphs, fed through the C entry
// points of every rocmforge device (RFCPU; RFGPU<n> where a GPU exists): bogus types, shapes,
// strides and op ids, overlapping views, NULL and stray data pointers inside our buffers,
// offsets and sizes past a buffer's end in set/get/memset/cpy. Tensors are built by hand, as a
// host could: ggml_new_tensor in a no_alloc context, then fields written directly.
//
// Every input must get false / NULL / a failed status, with a log line when it fails; a
// geometry the harness knows to lie outside its buffer must never compute; nothing may write
// outside our buffers (guard bytes around RFCPU's host-pointer buffer); the process never
// crashes. Runs on stable C in CI (no cargo-fuzz):
//   test_fuzz [--iters N] [--seed S] [--cpu-only] [--verbose]   (default 20000 iterations, seed 1)
#include "common.h"
// The buffer vtable: set/get/memset/cpy with arguments ggml's wrappers would assert on.
#include "ggml-backend-impl.h"

#include <stdlib.h>
#include <string.h>

#define BUF_SIZE (256 * 1024)
#define GUARD 4096
#define MAX_DEVS 8

static uint64_t g_rng;
static int g_verbose = 0;
static long g_log_lines = 0;  // rocmforge lines seen (any level but debug)
static char g_last_log[512];

static void log_cb(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level == GGML_LOG_LEVEL_DEBUG || !strstr(text, "rocmforge")) {
        return;
    }
    g_log_lines++;
    snprintf(g_last_log, sizeof g_last_log, "%s", text);
    if (g_verbose) fputs(text, stderr);
}

static uint64_t rnd(void) { return rf_rand_u64(&g_rng); }
static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }
static bool chance(int percent) { return (int) rnd_below(100) < percent; }

// One device under test: a backend and the buffers tensors are placed in.
struct dev_under_test {
    const char * name;
    ggml_backend_dev_t dev;
    ggml_backend_t be;
    ggml_backend_buffer_t buf[2];
    uint8_t * host_region;  // RFCPU: GUARD | buffer 0 (wrapped host memory) | GUARD
};

static struct dev_under_test g_devs[MAX_DEVS];
static int g_ndevs = 0;
static uint8_t * g_host;  // host side of set/get (2 * BUF_SIZE + slack: never read past)
static long g_iter = 0;
static long g_computed_ok = 0, g_refused = 0, g_transfers_bad = 0;

static void fail_at(const char * what) {
    fprintf(stderr, "FAIL at iteration %ld (seed above): %s; last log: %s", g_iter, what, g_last_log);
    rf_failures++;
}

static bool guards_intact(const struct dev_under_test * d) {
    if (!d->host_region) return true;
    for (size_t i = 0; i < GUARD; i++) {
        if (d->host_region[i] != 0xA5 || d->host_region[GUARD + BUF_SIZE + i] != 0xA5) return false;
    }
    return true;
}

static const enum ggml_type k_types[] = {
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K,
    GGML_TYPE_Q6_K, GGML_TYPE_I32, GGML_TYPE_I64, GGML_TYPE_IQ4_NL, GGML_TYPE_TQ2_0,
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

// ---- the harness's own view of a tensor's extent (the library's must not be looser) ----

// Whether `t`'s elements lie inside its buffer, computed here from ne/nb with overflow checks.
// Conservative the same way: a known type, ne >= 0, whole blocks, elements fit in its buffer.
static bool span_inside(const struct ggml_tensor * t) {
    if (t->type < 0 || t->type >= GGML_TYPE_COUNT || ggml_type_size(t->type) == 0) return false;
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] < 0) return false;
        if (t->ne[i] == 0) return true;  // empty: touches nothing
    }
    int64_t blck = ggml_blck_size(t->type);
    if (t->ne[0] % blck != 0) return false;
    __uint128_t len = ggml_type_size(t->type);
    for (int i = 0; i < 4; i++) {
        __uint128_t n = (__uint128_t) (i == 0 ? t->ne[0] / blck : t->ne[i]);
        __uint128_t stride = t->nb[i];
        if (i == 0 && stride < ggml_type_size(t->type)) stride = ggml_type_size(t->type);
        len += (n - 1) * stride;
        if (len > ((__uint128_t) 1 << 100)) return false;
    }
    const struct ggml_tensor * owner = t->view_src ? t->view_src : t;
    ggml_backend_buffer_t b = owner->buffer;
    if (!b || !t->data) return false;
    uintptr_t base = (uintptr_t) ggml_backend_buffer_get_base(b);
    uintptr_t at = (uintptr_t) t->data;
    return at >= base && (__uint128_t) (at - base) + len <= ggml_backend_buffer_get_size(b);
}

// ---- graph generation ----

struct placement {
    ggml_backend_buffer_t buf;
    size_t used;
};

// Gives `t` (and views of it) memory in `p`'s buffer, 64-byte aligned, as an allocator would.
static bool place(struct placement * p, struct ggml_tensor * t) {
    if (t->view_src) {
        if (!t->view_src->data) return false;
        t->data = (char *) t->view_src->data + t->view_offs;
        t->buffer = t->view_src->buffer;
        return true;
    }
    size_t n = ggml_nbytes(t);
    size_t at = (p->used + 63) & ~(size_t) 63;
    if (at + n > ggml_backend_buffer_get_size(p->buf)) return false;
    t->data = (char *) ggml_backend_buffer_get_base(p->buf) + at;
    t->buffer = p->buf;
    p->used = at + n;
    return true;
}

// Random contents through the buffer's own set_tensor: floats in [-2, 2] (converted), small
// row indices (sometimes out of range) for integer types.
static void fill(struct ggml_tensor * t, int64_t rows) {
    size_t n = ggml_nbytes(t);
    if (n == 0 || n > 2 * BUF_SIZE) return;
    if (t->type == GGML_TYPE_I32 || t->type == GGML_TYPE_I64) {
        for (int64_t i = 0; i < ggml_nelements(t); i++) {
            int64_t v = (int64_t) rnd_below((uint64_t) rows + 1);
            if (chance(3)) v = chance(50) ? -1 : rows + (int64_t) rnd_below(1000);
            if (t->type == GGML_TYPE_I32) ((int32_t *) g_host)[i] = (int32_t) v;
            else ((int64_t *) g_host)[i] = v;
        }
        ggml_backend_tensor_set(t, g_host, 0, n);
        return;
    }
    rf_fill_tensor(t, rnd(), -2, 2);
}

static int64_t pick_dim(void) {
    static const int64_t dims[] = { 1, 2, 3, 4, 7, 8, 16, 32, 64 };
    return dims[rnd_below(sizeof dims / sizeof dims[0])];
}

// Builds one node of a random op over fresh leaves (shapes valid for ggml's constructors).
static struct ggml_tensor * build_node(struct ggml_context * ctx, int64_t * rows_out) {
    int64_t a0 = pick_dim() * (chance(30) ? 32 : 1), a1 = pick_dim(), a2 = chance(70) ? 1 : pick_dim();
    *rows_out = a1;
    struct ggml_tensor * a = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, a0, a1, a2);
    switch (rnd_below(16)) {
        case 0: return ggml_scale(ctx, a, 0.5f);
        case 1: return ggml_rms_norm(ctx, a, 1e-5f);
        case 2: return ggml_soft_max(ctx, a);
        case 3: return ggml_silu(ctx, a);
        case 4: return ggml_add(ctx, a, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, a0, chance(50) ? 1 : a1, a2));
        case 5: return ggml_mul(ctx, a, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, a0, a1, a2));
        case 6: {
            enum ggml_type wt = chance(50) ? GGML_TYPE_F32 : (chance(50) ? GGML_TYPE_F16 : GGML_TYPE_Q8_0);
            int64_t k = wt == GGML_TYPE_Q8_0 ? 32 * pick_dim() : a0;
            struct ggml_tensor * w = ggml_new_tensor_2d(ctx, wt, k, pick_dim());
            return ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, a1));
        }
        case 7: {
            struct ggml_tensor * w = ggml_new_tensor_2d(ctx, chance(50) ? GGML_TYPE_F32 : GGML_TYPE_Q4_0, 32 * pick_dim(), a1);
            return ggml_get_rows(ctx, w, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, pick_dim()));
        }
        case 8: {
            enum ggml_type dt = chance(50) ? GGML_TYPE_F32 : (chance(50) ? GGML_TYPE_F16 : GGML_TYPE_Q8_0);
            int64_t k = 32 * pick_dim();
            struct ggml_tensor * dst = ggml_new_tensor_2d(ctx, dt, k, a1);
            struct ggml_tensor * src = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, pick_dim());
            return ggml_set_rows(ctx, dst, src, ggml_new_tensor_1d(ctx, GGML_TYPE_I64, src->ne[1]));
        }
        case 9: return ggml_cpy(ctx, a, ggml_new_tensor_3d(ctx, chance(50) ? GGML_TYPE_F16 : GGML_TYPE_F32, a0, a1, a2));
        case 10: return ggml_cont(ctx, ggml_transpose(ctx, a));
        case 11: {
            struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 2 * pick_dim(), a1, a2);
            return ggml_rope(ctx, x, ggml_new_tensor_1d(ctx, GGML_TYPE_I32, a2), (int) x->ne[0], 0);
        }
        case 12: return ggml_concat(ctx, a, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, pick_dim(), a1, a2), 0);
        case 13: return ggml_sum_rows(ctx, a);
        case 14: {
            struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2 * a0, a1);
            return ggml_swiglu(ctx, x);
        }
        default: {
            int64_t d = 32 * (1 + (int64_t) rnd_below(2)), nkv = 32 * (1 + (int64_t) rnd_below(2));
            struct ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, a1, 2);
            struct ggml_tensor * k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, nkv, 2);
            struct ggml_tensor * v = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, d, nkv, 2);
            return ggml_flash_attn_ext(ctx, q, k, v, NULL, 0.125f, 0.0f, 0.0f);
        }
    }
}

// The tensors one mutation may hit: the node and its sources.
static int operands(struct ggml_tensor * node, struct ggml_tensor ** out) {
    int n = 0;
    out[n++] = node;
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        if (node->src[i]) out[n++] = node->src[i];
    }
    return n;
}

static const int64_t k_bad_ne[] = { 0, 1, -1, 3, 33, 1 << 20, (int64_t) 1 << 31, (int64_t) 1 << 40, INT64_MAX, INT64_MIN };
static const uint64_t k_bad_nb[] = { 0, 1, 2, 3, 4, 64, 4096, 1u << 20, (uint64_t) 1 << 63, UINT64_MAX, UINT64_MAX / 3 };

// Applies one random corruption to the graph around `node`; `others` holds tensors of another
// context (to point sources at). Returns a short description.
static const char * mutate(struct ggml_tensor * node, struct ggml_tensor ** others, int n_others,
                           struct dev_under_test * d) {
    struct ggml_tensor * ops[GGML_MAX_SRC + 1];
    int n = operands(node, ops);
    struct ggml_tensor * t = ops[rnd_below(n)];
    ggml_backend_buffer_t b = d->buf[rnd_below(2)];
    uintptr_t base = (uintptr_t) ggml_backend_buffer_get_base(b);
    size_t size = ggml_backend_buffer_get_size(b);
    switch (rnd_below(12)) {
        case 0:
            t->type = chance(70) ? k_types[rnd_below(N_TYPES)] : (enum ggml_type) (chance(50) ? 9999 : -1 - (int) rnd_below(5));
            return "type";
        case 1:
            t->ne[rnd_below(4)] = chance(60) ? k_bad_ne[rnd_below(sizeof k_bad_ne / sizeof k_bad_ne[0])] : (int64_t) rnd_below(300);
            return "ne";
        case 2:
            t->nb[rnd_below(4)] = chance(60) ? k_bad_nb[rnd_below(sizeof k_bad_nb / sizeof k_bad_nb[0])] : rnd_below(1 << 14);
            return "nb";
        case 3:  // a stray pointer inside (or just past) one of our buffers
            t->buffer = b;
            t->view_src = NULL;
            t->data = (void *) (base + (chance(50) ? (rnd_below(size + 256) & ~(uintptr_t) 3) : rnd_below(size + 256)));
            return "data";
        case 4:
            t->data = chance(50) ? NULL : (void *) (base + size);
            return "data at end / NULL";
        case 5:
            t->buffer = chance(50) ? NULL : b;
            t->view_src = NULL;
            return "buffer";
        case 6: {
            int i = (int) rnd_below(4);
            node->src[i] = chance(30) ? NULL : (chance(50) && n_others ? others[rnd_below(n_others)] : ops[rnd_below(n)]);
            return "src";
        }
        case 7:
            node->op = (enum ggml_op) (chance(80) ? (int) rnd_below(GGML_OP_COUNT + 3) : 9999);
            return "op";
        case 8:
            node->op_params[rnd_below(8)] = (int32_t) rnd();
            return "op_params";
        case 9:  // output overlapping a source
            if (node->src[0]) node->data = (char *) node->src[0]->data + 4 * rnd_below(8);
            return "overlap";
        case 10:
            t->ne[rnd_below(4)] *= 2;
            return "ne doubled";
        default:
            t->view_src = n_others ? others[rnd_below(n_others)] : NULL;
            t->buffer = NULL;
            return "view_src";
    }
}

static void fuzz_graph(struct dev_under_test * d) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 48 + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    int64_t rows = 1;
    struct ggml_tensor * node = build_node(ctx, &rows);
    struct ggml_tensor * others[2] = { ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64), ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 4, 4) };
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, node);
    struct placement p = { d->buf[rnd_below(2)], 0 };
    // Every tensor of the context in creation order (a view after what it views).
    bool placed = true;
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t && placed; t = ggml_get_next_tensor(ctx, t)) {
        placed = place(&p, t);
    }
    if (!placed) {
        ggml_free(ctx);
        return;
    }
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op == GGML_OP_NONE) fill(t, rows);
    }
    const char * what[3] = { "none", "", "" };
    int n_mut = (int) rnd_below(4);
    for (int m = 0; m < n_mut; m++) what[m] = mutate(node, others, 2, d);
    // Every node of the graph must lie in its buffer for a compute to be allowed.
    bool inside = true;
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        struct ggml_tensor * ops[GGML_MAX_SRC + 1];
        struct ggml_tensor * nd = ggml_graph_node(gf, i);
        bool computed = !(nd->op == GGML_OP_NONE || nd->op == GGML_OP_VIEW || nd->op == GGML_OP_RESHAPE ||
                          nd->op == GGML_OP_PERMUTE || nd->op == GGML_OP_TRANSPOSE) &&
                        nd->ne[0] > 0 && nd->ne[1] > 0 && nd->ne[2] > 0 && nd->ne[3] > 0;
        if (!computed) continue;
        int k = operands(nd, ops);
        for (int j = 0; j < k; j++) {
            if (ops[j]->ne[0] != 0 && !span_inside(ops[j])) inside = false;
        }
    }
    bool supported = ggml_backend_dev_supports_op(d->dev, node);
    (void) supported;
    long lines = g_log_lines;
    enum ggml_status st = ggml_backend_graph_compute(d->be, gf);
    if (st == GGML_STATUS_SUCCESS) {
        g_computed_ok++;
        if (!inside) fail_at("a graph with a tensor outside its buffer computed");
    } else {
        g_refused++;
        if (g_log_lines == lines) fail_at("a failed graph_compute without a log line");
    }
    if (!guards_intact(d)) {
        fail_at("bytes around RFCPU's buffer were overwritten");
        memset(d->host_region, 0xA5, GUARD);
        memset(d->host_region + GUARD + BUF_SIZE, 0xA5, GUARD);
    }
    if (rf_failures && g_verbose) {
        fprintf(stderr, "  mutations: %s, %s, %s; op %d\n", what[0], what[1], what[2], node->op);
    }
    ggml_free(ctx);
}

// set/get/memset/cpy straight through the buffer's vtable with random ranges.
static void fuzz_transfer(struct dev_under_test * d) {
    ggml_backend_buffer_t b = d->buf[rnd_below(2)];
    uintptr_t base = (uintptr_t) ggml_backend_buffer_get_base(b);
    size_t size = ggml_backend_buffer_get_size(b);
    struct ggml_tensor t;
    memset(&t, 0, sizeof t);
    t.type = GGML_TYPE_F32;
    t.ne[0] = 16;
    t.ne[1] = t.ne[2] = t.ne[3] = 1;
    t.nb[0] = 4;
    t.nb[1] = t.nb[2] = t.nb[3] = 64;
    t.buffer = b;
    size_t at = chance(80) ? rnd_below(size) : (chance(50) ? size + rnd_below(64) : (size_t) 0 - rnd_below(64));
    t.data = chance(3) ? NULL : (void *) (base + at);
    size_t off = chance(70) ? rnd_below(size / 4) : (chance(50) ? rnd_below(2 * size) : SIZE_MAX - rnd_below(64));
    size_t len = chance(70) ? rnd_below(size / 4) : (chance(50) ? rnd_below(2 * size) : SIZE_MAX - rnd_below(64));
    bool valid = t.data && (uintptr_t) t.data >= base && (__uint128_t) ((uintptr_t) t.data - base) + off + len <= size;
    if (len == 0) valid = true;
    long lines = g_log_lines;
    int kind = (int) rnd_below(4);
    if (kind == 0) {
        if (len <= 2 * BUF_SIZE || !valid) b->iface.set_tensor(b, &t, chance(2) ? NULL : g_host, off, len);
    } else if (kind == 1) {
        if (len <= 2 * BUF_SIZE || !valid) b->iface.get_tensor(b, &t, g_host, off, len);
    } else if (kind == 2) {
        b->iface.memset_tensor(b, &t, (uint8_t) rnd(), off, len);
    } else {
        // cpy: a source of random extent somewhere in the other buffer (or past it).
        ggml_backend_buffer_t sb = d->buf[rnd_below(2)];
        struct ggml_tensor s = t;
        s.buffer = sb;
        s.ne[0] = (int64_t) (rnd_below(size / 4) & ~(size_t) 3) / 4 + 1;
        s.nb[1] = s.nb[2] = s.nb[3] = (size_t) s.ne[0] * 4;
        s.data = (void *) ((uintptr_t) ggml_backend_buffer_get_base(sb) + (rnd_below(size + 64) & ~(size_t) 3));
        t.ne[0] = chance(50) ? s.ne[0] : (int64_t) rnd_below(size / 4) + 1;
        t.nb[1] = t.nb[2] = t.nb[3] = (size_t) t.ne[0] * 4;
        valid = t.ne[0] == s.ne[0] && span_inside(&s) && t.data && span_inside(&t);
        if (b->iface.cpy_tensor) {
            bool ok = b->iface.cpy_tensor(b, &s, &t);
            if (ok && !valid) fail_at("cpy_tensor accepted a bad copy");
        }
    }
    if (!valid) {
        g_transfers_bad++;
        if (kind != 3 && g_log_lines == lines) fail_at("a bad set/get/memset without a log line");
        // The error is kept for the next graph_compute using the buffer: clear it that way.
        struct ggml_init_params ip = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), NULL, true };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 16);
        struct ggml_tensor * y = ggml_scale(ctx, x, 2.0f);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, y);
        struct placement p = { b, 0 };
        place(&p, x);
        place(&p, y);
        enum ggml_status st = ggml_backend_graph_compute(d->be, gf);
        if (kind != 3 && st == GGML_STATUS_SUCCESS) fail_at("graph_compute after a failed transfer succeeded");
        ggml_free(ctx);
    }
    if (!guards_intact(d)) fail_at("bytes around RFCPU's buffer were overwritten by a transfer");
}

static void fuzz_alloc(struct dev_under_test * d) {
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(d->dev);
    long lines = g_log_lines;
    size_t sizes[] = { SIZE_MAX, SIZE_MAX / 2, (size_t) 1 << 62, (size_t) 1 << 52 };
    ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(buft, sizes[rnd_below(4)]);
    if (b) {
        fail_at("an absurd allocation succeeded");
        ggml_backend_buffer_free(b);
    } else if (g_log_lines == lines) {
        fail_at("a refused allocation without a log line");
    }
}

int main(int argc, char ** argv) {
    long iters = 20000;
    uint64_t seed = 1;
    bool cpu_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--verbose")) g_verbose = 1;
        else if (!strcmp(argv[i], "--cpu-only")) cpu_only = true;
        else {
            fprintf(stderr, "usage: %s [--iters N] [--seed S] [--cpu-only] [--verbose]\n", argv[0]);
            return 2;
        }
    }
    g_rng = seed * 0x9E3779B97F4A7C15ull + 1;
    ggml_log_set(log_cb, NULL);
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    g_host = calloc(1, 2 * BUF_SIZE + 65536);
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg) && g_ndevs < MAX_DEVS; i++) {
        ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
        const char * name = ggml_backend_dev_name(dev);
        // RFHYBRID is host memory like RFCPU: fuzzed always (without a GPU it runs on RFCPU).
        bool host_dev = strcmp(name, "RFCPU") == 0 || strcmp(name, "RFHYBRID") == 0;
        if (!host_dev && (cpu_only || strncmp(name, "RFGPU", 5) != 0)) continue;
        struct dev_under_test * d = &g_devs[g_ndevs];
        d->name = name;
        d->dev = dev;
        d->be = ggml_backend_dev_init(dev, NULL);
        if (!d->be) continue;
        if (host_dev) {
            rf_set_n_threads(d->be, 2);
            // Buffer 0 wraps host memory between guard bytes: any write past it shows.
            d->host_region = malloc(BUF_SIZE + 2 * GUARD);
            memset(d->host_region, 0xA5, BUF_SIZE + 2 * GUARD);
            d->buf[0] = ggml_backend_dev_buffer_from_host_ptr(dev, d->host_region + GUARD, BUF_SIZE, BUF_SIZE);
        } else {
            d->buf[0] = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), BUF_SIZE);
        }
        d->buf[1] = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), BUF_SIZE / 2);
        if (!d->buf[0] || !d->buf[1]) {
            fprintf(stderr, "%s: cannot allocate the fuzz buffers\n", name);
            return 2;
        }
        g_ndevs++;
    }
    printf("test_fuzz: seed %llu, %ld iterations over %d device(s)\n", (unsigned long long) seed, iters, g_ndevs);
    double t0 = rf_now_ms();
    for (g_iter = 0; g_iter < iters && rf_failures < 20; g_iter++) {
        struct dev_under_test * d = &g_devs[rnd_below(g_ndevs)];
        int r = (int) rnd_below(100);
        if (r < 70) fuzz_graph(d);
        else if (r < 99) fuzz_transfer(d);
        else fuzz_alloc(d);
    }
    double ms = rf_now_ms() - t0;
    printf("test_fuzz: %ld iterations in %.1f s: %ld graphs computed, %ld refused, %ld bad transfers, %ld log lines\n",
           g_iter, ms / 1e3, g_computed_ok, g_refused, g_transfers_bad, g_log_lines);
    for (int i = 0; i < g_ndevs; i++) {
        ggml_backend_buffer_free(g_devs[i].buf[0]);
        ggml_backend_buffer_free(g_devs[i].buf[1]);
        ggml_backend_free(g_devs[i].be);
        free(g_devs[i].host_region);
    }
    free(g_host);
    ggml_log_set(NULL, NULL);
    return rf_finish("test_fuzz");
}
