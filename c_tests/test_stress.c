// test_stress: several backends of one device used at once from parallel threads.
//
// N worker threads (default 8) each create their own backend on the device under test and
// their own ggml-cpu backend, then compute a stream of small random graphs (mul_mat of
// float and quantized weights, add, rms_norm * weight, soft_max, rope, get_rows, cpy to F16,
// a two-layer silu MLP), each on both, and compare the outputs. Each graph is computed one
// to three times in a row with new input data (on a GPU the second run captures the graph
// and the third replays it, while other threads capture, allocate, free, read and write).
// Two more threads share one weights buffer of the device and compute with it, each with
// its own backend. A graph's buffers are allocated and freed with it.
//
// Reported: graphs computed, mismatches (normalized squared error over the case's limit, or
// NaN/Inf where ggml-cpu has none), driver errors (a failed compute or allocation, or a
// warning/error line in the log). The test fails unless both counts are 0.
//
// Usage: test_stress [--device NAME] [--threads N] [--graphs N] [--seed S]
//   --device  RFCPU, RFGPU0, RFHYBRID, ... or "all" (default: RFCPU, RFGPU0, RFHYBRID; the GPU part prints
//             "skipped: no GPU" where there is none)
//   --graphs  graph computations per device in all, spread over the threads (default 5000)
//   --limit   one error limit for every case instead of each case's own (--limit 0 shows that
//             differences are seen: quantized cases then mismatch)
#include "common.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static int g_threads = 8;
static long g_graphs = 5000;
static double g_limit = -1.0;  // --limit: one limit for every case (checks that a mismatch is seen)
static uint64_t g_seed = 1;

static atomic_long g_next;        // graph computations handed out so far
static atomic_long g_done;        // graph computations compared
static atomic_long g_mismatch;
static atomic_long g_errors;
static atomic_long g_skipped;     // graphs the device does not claim
static atomic_long g_log_bad;

static void on_log(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        // Declines and notes are INFO/DEBUG; a warning or error here is a failure of the run.
        if (atomic_fetch_add(&g_log_bad, 1) < 20) {
            fprintf(stderr, "log: %s", text);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random graphs. Inputs are the leaves; "idx:max" names integer inputs in [0, max).
// ---------------------------------------------------------------------------------------------
struct gcase {
    int kind;
    enum ggml_type t;
    int64_t k, m, n;
    int i0;
    float f0;
};

static const enum ggml_type mm_types[] = { GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0,
                                           GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q5_1 };
#define N_KINDS 8

static int64_t pick(uint64_t * s, int64_t lo, int64_t hi) {
    return lo + (int64_t) (rf_rand_u64(s) % (uint64_t) (hi - lo + 1));
}

static struct gcase random_case(uint64_t * s) {
    struct gcase c = { 0 };
    c.kind = (int) pick(s, 0, N_KINDS - 1);
    c.t = mm_types[pick(s, 0, sizeof mm_types / sizeof mm_types[0] - 1)];
    const int64_t blk = ggml_blck_size(c.t);
    c.k = blk * pick(s, 1, blk >= 256 ? 2 : 8);
    c.m = pick(s, 1, 70);
    c.n = pick(s, 1, 12);
    c.i0 = (int) pick(s, 0, 1);
    c.f0 = rf_rand_uniform(s, 0.05f, 1.0f);
    return c;
}

static struct ggml_tensor * leaf(struct ggml_context * ctx, enum ggml_type t, int64_t n0, int64_t n1, int64_t n2) {
    return ggml_new_tensor_3d(ctx, t, n0, n1, n2);
}

// The case's output (the graph's last node), built in `ctx`.
static struct ggml_tensor * build(struct ggml_context * ctx, const struct gcase * c) {
    switch (c->kind) {
        case 0: {  // mul_mat, weights of any type
            struct ggml_tensor * w = leaf(ctx, c->t, c->k, c->m, 1);
            struct ggml_tensor * x = leaf(ctx, GGML_TYPE_F32, c->k, c->n, 1);
            return ggml_mul_mat(ctx, w, x);
        }
        case 1: {  // add (with broadcast of a row when i0)
            struct ggml_tensor * a = leaf(ctx, GGML_TYPE_F32, c->k, c->m, 1);
            struct ggml_tensor * b = leaf(ctx, GGML_TYPE_F32, c->k, c->i0 ? 1 : c->m, 1);
            return ggml_add(ctx, a, b);
        }
        case 2: {  // rms_norm * weight (fused on the GPU)
            struct ggml_tensor * a = leaf(ctx, GGML_TYPE_F32, c->k, c->m, 1);
            struct ggml_tensor * w = leaf(ctx, GGML_TYPE_F32, c->k, 1, 1);
            return ggml_mul(ctx, ggml_rms_norm(ctx, a, 1e-5f), w);
        }
        case 3: {  // soft_max with a scale
            struct ggml_tensor * a = leaf(ctx, GGML_TYPE_F32, c->k, c->m, 1);
            return ggml_soft_max_ext(ctx, a, NULL, c->f0, 0.0f);
        }
        case 4: {  // rope (normal or neox) of [head dim, heads, tokens]
            const int64_t hd = 2 * pick(&(uint64_t){ (uint64_t) c->k * 31 + (uint64_t) c->m }, 2, 32);
            struct ggml_tensor * a = leaf(ctx, GGML_TYPE_F32, hd, c->m % 8 + 1, c->n);
            struct ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c->n);
            ggml_set_name(pos, "idx:512");
            return ggml_rope_ext(ctx, a, pos, NULL, (int) hd, c->i0 ? GGML_ROPE_TYPE_NEOX : 0, 0, 10000.0f, 1.0f,
                                 0.0f, 1.0f, 32.0f, 1.0f);
        }
        case 5: {  // get_rows of F32, F16 or quantized rows
            const enum ggml_type t = c->i0 ? GGML_TYPE_F16 : (ggml_blck_size(c->t) == 32 ? c->t : GGML_TYPE_F32);
            const int64_t k = ggml_blck_size(t) * ((c->k + 31) / 32);
            struct ggml_tensor * a = leaf(ctx, t, k, c->m, 1);
            struct ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c->n);
            ggml_format_name(idx, "idx:%lld", (long long) c->m);
            return ggml_get_rows(ctx, a, idx);
        }
        case 6: {  // cpy F32 -> F16
            struct ggml_tensor * a = leaf(ctx, GGML_TYPE_F32, c->k, c->m, 1);
            return ggml_cpy(ctx, a, leaf(ctx, GGML_TYPE_F16, c->k, c->m, 1));
        }
        default: {  // two-layer MLP: w2 * silu(w1 * x) + scale
            struct ggml_tensor * w1 = leaf(ctx, c->t, c->k, c->m, 1);
            struct ggml_tensor * w2 = leaf(ctx, GGML_TYPE_F32, c->m, 24, 1);
            struct ggml_tensor * x = leaf(ctx, GGML_TYPE_F32, c->k, c->n, 1);
            struct ggml_tensor * h = ggml_silu(ctx, ggml_mul_mat(ctx, w1, x));
            return ggml_scale(ctx, ggml_mul_mat(ctx, w2, h), 0.5f);
        }
    }
}

static double limit_of(const struct gcase * c) {
    if (g_limit >= 0.0) return g_limit;
    // Quantized weights: both sides quantize x their own way (vec_dot types).
    const bool q = ggml_is_quantized(c->t) && (c->kind == 0 || c->kind == 7);
    return q ? 5e-3 : 5e-4;
}

// Fills every leaf of `ctx` from `seed` (the same on both sides).
static void fill_leaves(struct ggml_context * ctx, uint64_t seed) {
    int i = 0;
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t), i++) {
        if (t->op != GGML_OP_NONE || !t->buffer) {
            continue;
        }
        int max = 0;
        if (sscanf(t->name, "idx:%d", &max) == 1) {
            rf_fill_tensor(t, seed * 131 + (uint64_t) i, 0.0f, (float) max - 0.01f);
        } else {
            rf_fill_tensor(t, seed * 131 + (uint64_t) i, -1.0f, 1.0f);
        }
    }
}

struct side {
    struct ggml_context * ctx;
    struct ggml_cgraph * gf;
    struct ggml_tensor * out;
    ggml_backend_buffer_t buf;
};

static bool side_make(struct side * sd, const struct gcase * c, ggml_backend_t be) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 32 + ggml_graph_overhead(), NULL, true };
    sd->ctx = ggml_init(ip);
    sd->out = build(sd->ctx, c);
    sd->gf = ggml_new_graph(sd->ctx);
    ggml_build_forward_expand(sd->gf, sd->out);
    sd->buf = ggml_backend_alloc_ctx_tensors(sd->ctx, be);
    return sd->buf != NULL;
}

static void side_free(struct side * sd) {
    if (sd->buf) ggml_backend_buffer_free(sd->buf);
    ggml_free(sd->ctx);
    memset(sd, 0, sizeof *sd);
}

static bool graph_claimed(ggml_backend_t be, struct ggml_cgraph * gf) {
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        if (!ggml_backend_supports_op(be, ggml_graph_node(gf, i))) return false;
    }
    return true;
}

// Compares the two outputs; true when they agree.
static bool compare(const struct side * a, const struct side * b, double limit, double * err) {
    const size_t n = (size_t) ggml_nelements(b->out);
    float * x = rf_tensor_to_float(a->out);
    float * y = rf_tensor_to_float(b->out);
    *err = rf_nmse(x, y, n);
    free(x);
    free(y);
    return *err <= limit;
}

struct worker {
    ggml_backend_dev_t dev, cpu_dev;
    int id;
};

static void report_mismatch(const struct gcase * c, int rep, double err, const char * dev) {
    if (atomic_fetch_add(&g_mismatch, 1) < 20) {
        fprintf(stderr, "MISMATCH %s kind %d %s k=%lld m=%lld n=%lld i0=%d run %d: nmse %g\n", dev, c->kind,
                ggml_type_name(c->t), (long long) c->k, (long long) c->m, (long long) c->n, c->i0, rep, err);
    }
}

static void * worker_main(void * arg) {
    const struct worker * w = arg;
    ggml_backend_t be = ggml_backend_dev_init(w->dev, NULL);
    ggml_backend_t cpu = ggml_backend_dev_init(w->cpu_dev, NULL);
    if (!be || !cpu) {
        atomic_fetch_add(&g_errors, 1);
        fprintf(stderr, "thread %d: backend init failed\n", w->id);
        if (be) ggml_backend_free(be);
        if (cpu) ggml_backend_free(cpu);
        return NULL;
    }
    rf_set_n_threads(be, 1);
    rf_set_n_threads(cpu, 1);
    uint64_t s = g_seed * 7919 + (uint64_t) w->id * 104729 + 1;
    for (;;) {
        const struct gcase c = random_case(&s);
        const int reps = (int) pick(&s, 1, 3);
        const long first = atomic_fetch_add(&g_next, reps);
        if (first >= g_graphs) break;
        struct side a = { 0 }, b = { 0 };
        const bool made = side_make(&a, &c, be) && side_make(&b, &c, cpu);
        if (!made) {
            atomic_fetch_add(&g_errors, 1);
            fprintf(stderr, "thread %d: buffer allocation failed\n", w->id);
        } else if (!graph_claimed(be, a.gf)) {
            atomic_fetch_add(&g_skipped, reps);
        } else {
            for (int r = 0; r < reps; r++) {
                const uint64_t seed = rf_rand_u64(&s);
                fill_leaves(a.ctx, seed);
                fill_leaves(b.ctx, seed);
                const enum ggml_status sa = ggml_backend_graph_compute(be, a.gf);
                const enum ggml_status sb = ggml_backend_graph_compute(cpu, b.gf);
                atomic_fetch_add(&g_done, 1);
                if (sa != GGML_STATUS_SUCCESS || sb != GGML_STATUS_SUCCESS) {
                    atomic_fetch_add(&g_errors, 1);
                    fprintf(stderr, "thread %d: compute failed (%d, %d)\n", w->id, (int) sa, (int) sb);
                    continue;
                }
                double err = 0.0;
                if (!compare(&a, &b, limit_of(&c), &err)) {
                    report_mismatch(&c, r, err, ggml_backend_name(be));
                }
            }
        }
        side_free(&a);
        side_free(&b);
    }
    ggml_backend_free(be);
    ggml_backend_free(cpu);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// Two threads, one weights buffer of the device (as two contexts of one model).
// ---------------------------------------------------------------------------------------------
struct shared_weights {
    struct ggml_context * ctx;
    ggml_backend_buffer_t buf;
    struct ggml_tensor *w1, *w2;
};

static bool weights_make(struct shared_weights * sw, ggml_backend_buffer_type_t buft) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 4, NULL, true };
    sw->ctx = ggml_init(ip);
    sw->w1 = ggml_new_tensor_2d(sw->ctx, GGML_TYPE_Q8_0, 256, 96);
    sw->w2 = ggml_new_tensor_2d(sw->ctx, GGML_TYPE_F16, 96, 256);
    sw->buf = ggml_backend_alloc_ctx_tensors_from_buft(sw->ctx, buft);
    if (!sw->buf) return false;
    ggml_backend_buffer_set_usage(sw->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    rf_fill_tensor(sw->w1, 11, -1.0f, 1.0f);
    rf_fill_tensor(sw->w2, 12, -1.0f, 1.0f);
    return true;
}

struct sharer {
    ggml_backend_dev_t dev, cpu_dev;
    const struct shared_weights *dw, *cw;  // on the device, and the same values in CPU memory
    int id, graphs;
};

static struct ggml_tensor * mlp(struct ggml_context * ctx, const struct shared_weights * sw, int n) {
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, n);
    struct ggml_tensor * h = ggml_gelu(ctx, ggml_mul_mat(ctx, sw->w1, x));
    return ggml_mul_mat(ctx, sw->w2, h);
}

static void * sharer_main(void * arg) {
    const struct sharer * sh = arg;
    ggml_backend_t be = ggml_backend_dev_init(sh->dev, NULL);
    ggml_backend_t cpu = ggml_backend_dev_init(sh->cpu_dev, NULL);
    if (!be || !cpu) {
        atomic_fetch_add(&g_errors, 1);
        if (be) ggml_backend_free(be);
        if (cpu) ggml_backend_free(cpu);
        return NULL;
    }
    rf_set_n_threads(be, 1);
    rf_set_n_threads(cpu, 1);
    uint64_t s = g_seed * 31 + (uint64_t) sh->id;
    for (int g = 0; g < sh->graphs; g++) {
        const int n = 1 + (int) (rf_rand_u64(&s) % 9);
        struct side sd[2] = { 0 };
        const struct shared_weights * ws[2] = { sh->dw, sh->cw };
        ggml_backend_t bes[2] = { be, cpu };
        bool ok = true;
        for (int k = 0; k < 2; k++) {
            struct ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true };
            sd[k].ctx = ggml_init(ip);
            sd[k].out = mlp(sd[k].ctx, ws[k], n);
            sd[k].gf = ggml_new_graph(sd[k].ctx);
            ggml_build_forward_expand(sd[k].gf, sd[k].out);
            sd[k].buf = ggml_backend_alloc_ctx_tensors(sd[k].ctx, bes[k]);
            ok = ok && sd[k].buf;
        }
        if (!ok) {
            atomic_fetch_add(&g_errors, 1);
        } else if (graph_claimed(be, sd[0].gf)) {
            const uint64_t seed = rf_rand_u64(&s);
            fill_leaves(sd[0].ctx, seed);
            fill_leaves(sd[1].ctx, seed);
            const enum ggml_status sa = ggml_backend_graph_compute(be, sd[0].gf);
            const enum ggml_status sb = ggml_backend_graph_compute(cpu, sd[1].gf);
            atomic_fetch_add(&g_done, 1);
            double err = 0.0;
            if (sa != GGML_STATUS_SUCCESS || sb != GGML_STATUS_SUCCESS) {
                atomic_fetch_add(&g_errors, 1);
            } else if (!compare(&sd[0], &sd[1], g_limit >= 0.0 ? g_limit : 5e-3, &err)) {
                const struct gcase c = { 7, GGML_TYPE_Q8_0, 256, 96, n, 0, 0.0f };
                report_mismatch(&c, g, err, "shared weights");
            }
        } else {
            atomic_fetch_add(&g_skipped, 1);
        }
        side_free(&sd[0]);
        side_free(&sd[1]);
    }
    ggml_backend_free(be);
    ggml_backend_free(cpu);
    return NULL;
}

static void weights_free(struct shared_weights * sw) {
    if (sw->buf) ggml_backend_buffer_free(sw->buf);
    if (sw->ctx) ggml_free(sw->ctx);
}

// Runs the whole test on `dev`; returns false on any mismatch or error.
static bool stress(ggml_backend_dev_t dev, ggml_backend_dev_t cpu_dev) {
    atomic_store(&g_next, 0);
    atomic_store(&g_done, 0);
    atomic_store(&g_mismatch, 0);
    atomic_store(&g_errors, 0);
    atomic_store(&g_skipped, 0);
    atomic_store(&g_log_bad, 0);
    const double t0 = rf_now_ms();

    struct shared_weights dw = { 0 }, cw = { 0 };
    const bool have_w = weights_make(&dw, ggml_backend_dev_buffer_type(dev)) &&
                        weights_make(&cw, ggml_backend_dev_buffer_type(cpu_dev));
    if (!have_w) atomic_fetch_add(&g_errors, 1);

    const int nt = g_threads;
    pthread_t * th = calloc((size_t) nt + 2, sizeof(pthread_t));
    struct worker * ws = calloc((size_t) nt, sizeof(struct worker));
    struct sharer sh[2];
    int started = 0;
    for (int i = 0; i < nt; i++) {
        ws[i] = (struct worker){ dev, cpu_dev, i };
        if (pthread_create(&th[started], NULL, worker_main, &ws[i]) == 0) started++;
    }
    const int share_graphs = (int) (g_graphs / 20 > 4 ? g_graphs / 20 : 4);
    for (int i = 0; i < 2 && have_w; i++) {
        sh[i] = (struct sharer){ dev, cpu_dev, &dw, &cw, 100 + i, share_graphs };
        if (pthread_create(&th[started], NULL, sharer_main, &sh[i]) == 0) started++;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    weights_free(&dw);
    weights_free(&cw);
    free(th);
    free(ws);

    const long errors = atomic_load(&g_errors) + atomic_load(&g_log_bad);
    printf("%s: %d threads (+2 sharing weights): %ld graphs compared, %ld not claimed, %ld mismatches, %ld driver "
           "errors, %.1f s\n",
           ggml_backend_dev_name(dev), nt, atomic_load(&g_done), atomic_load(&g_skipped), atomic_load(&g_mismatch),
           errors, (rf_now_ms() - t0) / 1e3);
    return atomic_load(&g_mismatch) == 0 && errors == 0 && atomic_load(&g_done) > 0;
}

static ggml_backend_dev_t find_device(const char * name) {
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, i);
        if (d && strcmp(ggml_backend_dev_name(d), name) == 0) return d;
    }
    return NULL;
}

int main(int argc, char ** argv) {
    const char * device = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            device = argv[++i];
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            g_threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--graphs") && i + 1 < argc) {
            g_graphs = atol(argv[++i]);
        } else if (!strcmp(argv[i], "--limit") && i + 1 < argc) {
            g_limit = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            g_seed = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: %s [--device NAME|all] [--threads N] [--graphs N] [--seed S] [--limit L]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IONBF, 0);  // every line survives a crash
    if (g_threads < 1) g_threads = 1;
    if (g_threads > 256) g_threads = 256;
    ggml_log_set(on_log, NULL);
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();
    (void) rf_rocmforge_reg();
    const char * names[3] = { "RFCPU", "RFGPU0", "RFHYBRID" };
    int n_names = 3;
    if (device && strcmp(device, "all") != 0) {
        names[0] = device;
        n_names = 1;
    }
    for (int i = 0; i < n_names; i++) {
        ggml_backend_dev_t dev = find_device(names[i]);
        if (!dev) {
            if (!strncmp(names[i], "RFGPU", 5)) {
                printf("%s: skipped: no GPU\n", names[i]);
                continue;
            }
            CHECK(false, "device %s not found", names[i]);
            continue;
        }
        CHECK(stress(dev, cpu_dev), "%s: mismatches or driver errors", names[i]);
    }
    return rf_finish("test_stress");
}
