// test_hybrid: the RFHYBRID device as a host uses it. A small graph whose nodes cross between
// the CPU and the GPU (with ROCMFORGE_HYBRID_FAKE_GPU=1 the "GPU" is a second RFCPU device that
// declines GET_ROWS and SOFT_MAX, so placement, copies and residency run without a GPU) is
// computed under every strategy and GPU budget and compared with ggml-cpu. Residency: a
// persistent tensor (like a KV cache) written on the GPU is read on the CPU in the same graph
// and in the next one, read by the host, partly overwritten by the host and read on the GPU
// again. Also the exported calls: strategy, budget, telemetry JSON, capabilities JSON.
//   test_hybrid [--need-gpu]     (--need-gpu: skip unless RFHYBRID has a GPU)
#include "common.h"

#include <stdlib.h>
#include <string.h>

enum { K = 256, M = 64, N = 8, ROWS = 8 };

typedef bool (*set_strategy_fn)(ggml_backend_dev_t, const char *);
typedef bool (*set_budget_fn)(ggml_backend_dev_t, size_t);
typedef bool (*set_telemetry_fn)(ggml_backend_dev_t, bool);
typedef size_t (*json_dev_fn)(ggml_backend_dev_t, char *, size_t);
typedef size_t (*json_fn)(char *, size_t);

static set_strategy_fn set_strategy;
static set_budget_fn set_budget;
static set_telemetry_fn set_telemetry;
static json_dev_fn telemetry_json;
static json_fn capabilities_json;

// Weights (a WEIGHTS buffer) and a persistent cache (a plain buffer) on one device.
struct state {
    struct ggml_context *ctx, *cctx;
    ggml_backend_buffer_t wbuf, cbuf;
    struct ggml_tensor *w, *cache;
};

static void state_make(struct state * s, ggml_backend_buffer_type_t buft, enum ggml_type wt) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 4, NULL, true };
    struct ggml_context * wctx = ggml_init(ip);
    struct ggml_context * cctx = ggml_init(ip);
    s->w = ggml_new_tensor_2d(wctx, wt, K, M);
    s->cache = ggml_new_tensor_2d(cctx, GGML_TYPE_F32, M, ROWS);
    s->wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    ggml_backend_buffer_set_usage(s->wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    s->cbuf = ggml_backend_alloc_ctx_tensors_from_buft(cctx, buft);
    rf_fill_tensor(s->w, 11, -1, 1);
    rf_fill_tensor(s->cache, 12, -1, 1);
    s->ctx = wctx;
    s->cctx = cctx;
}

struct graph {
    struct ggml_context * ctx;
    struct ggml_cgraph * gf;
    struct ggml_tensor *x, *idx, *z, *out;
    ggml_gallocr_t alloc;
};

// x -> y = W x (GPU) -> s = soft_max(y) (CPU on the stand-in) -> z = s + y -> cache row `row`
// = column 0 of z (a view write) -> r = get_rows(cache, idx) (CPU) -> out = 2 r. Without
// `read_back`, out = 2 z instead: nothing in the graph reads the cache, only the host does.
// `all_gpu`: scale instead of soft_max and no get_rows, so that a GPU takes every node (the graph
// is then replayed without a walk over its nodes when computed again).
static void graph_make(struct graph * g, struct state * s, ggml_backend_buffer_type_t buft, int row,
                       bool read_back, bool all_gpu) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 32 + ggml_graph_overhead(), NULL, true };
    g->ctx = ggml_init(ip);
    g->x = ggml_new_tensor_2d(g->ctx, GGML_TYPE_F32, K, N);
    ggml_set_input(g->x);
    g->idx = ggml_new_tensor_1d(g->ctx, GGML_TYPE_I32, 3);
    ggml_set_input(g->idx);
    struct ggml_tensor * y = ggml_mul_mat(g->ctx, s->w, g->x);
    struct ggml_tensor * sm = all_gpu ? ggml_scale(g->ctx, y, 0.5f) : ggml_soft_max(g->ctx, y);
    g->z = ggml_add(g->ctx, sm, y);
    ggml_set_output(g->z);
    struct ggml_tensor * col = ggml_view_1d(g->ctx, g->z, M, 0);
    struct ggml_tensor * dst = ggml_view_1d(g->ctx, s->cache, M, (size_t) row * s->cache->nb[1]);
    struct ggml_tensor * cp = ggml_cpy(g->ctx, col, dst);
    struct ggml_tensor * r = read_back ? ggml_get_rows(g->ctx, s->cache, g->idx) : ggml_view_2d(g->ctx, g->z, M, 3, g->z->nb[1], 0);
    g->out = ggml_scale(g->ctx, r, 2.0f);
    ggml_set_output(g->out);
    g->gf = ggml_new_graph(g->ctx);
    ggml_build_forward_expand(g->gf, cp);
    ggml_build_forward_expand(g->gf, g->out);
    g->alloc = ggml_gallocr_new(buft);
    ggml_gallocr_alloc_graph(g->alloc, g->gf);
}

static void graph_free(struct graph * g) {
    ggml_gallocr_free(g->alloc);
    ggml_free(g->ctx);
}

static void graph_inputs(struct graph * g, uint64_t seed) {
    rf_fill_tensor(g->x, seed, -1, 1);
    int32_t idx[3] = { 0, 5, 7 };
    if (g->idx->buffer) ggml_backend_tensor_set(g->idx, idx, 0, sizeof idx);
}

// One run of three graphs on `dev` and on ggml-cpu; every output compared.
static void run_compare(ggml_backend_dev_t dev, enum ggml_type wt, const char * label) {
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL), ref = ggml_backend_dev_init(cpu_dev, NULL);
    CHECK(be && ref, "%s: backends", label);
    if (!be || !ref) return;
    rf_set_n_threads(be, 2);
    struct state s[2];
    state_make(&s[0], ggml_backend_dev_buffer_type(dev), wt);
    state_make(&s[1], ggml_backend_dev_buffer_type(cpu_dev), wt);
    ggml_backend_t bes[2] = { be, ref };
    // Steps 0-2: a new graph each; 3-5: one all-GPU graph computed three times (new inputs).
    struct graph keep[2];
    for (int step = 0; step < 6; step++) {
        float * res[2][3] = { { 0 } };
        for (int k = 0; k < 2; k++) {
            struct graph g;
            if (step < 3) {
                graph_make(&g, &s[k], ggml_backend_get_default_buffer_type(bes[k]), step + 1, step != 1, false);
            } else {
                if (step == 3) graph_make(&keep[k], &s[k], ggml_backend_get_default_buffer_type(bes[k]), 4, false, true);
                g = keep[k];
            }
            graph_inputs(&g, 100 + step);
            // The host rewrites the weights between two runs of the same graph: the GPU's copy
            // (resident in VRAM) is stale.
            if (step == 4) rf_fill_tensor(s[k].w, 77, -1, 1);
            if (step == 2) {
                // The host overwrites row 5 of the cache between graphs: the GPU's copy is stale.
                float v[M];
                for (int i = 0; i < M; i++) v[i] = 0.25f * (float) i;
                ggml_backend_tensor_set(s[k].cache, v, 5 * s[k].cache->nb[1], sizeof v);
            }
            CHECK(rf_compute(bes[k], g.gf) == GGML_STATUS_SUCCESS, "%s: graph %d on %s", label, step,
                  ggml_backend_name(bes[k]));
            res[k][0] = rf_tensor_to_float(g.z);
            res[k][1] = rf_tensor_to_float(g.out);
            // The cache as the host reads it (rows the GPU wrote come back first).
            res[k][2] = rf_tensor_to_float(s[k].cache);
            if (step < 3 || step == 5) graph_free(&g);
        }
        static const char * what[3] = { "z", "out (cache rows read on the CPU)", "cache read by the host" };
        static const size_t n[3] = { (size_t) M * N, (size_t) M * 3, (size_t) M * ROWS };
        for (int o = 0; o < 3; o++) {
            double e = rf_nmse(res[0][o], res[1][o], n[o]);
            CHECK(e <= 1e-6, "%s: graph %d: %s: nmse %.3g", label, step, what[o], e);
            free(res[0][o]);
            free(res[1][o]);
        }
    }
    for (int k = 0; k < 2; k++) {
        ggml_backend_buffer_free(s[k].wbuf);
        ggml_backend_buffer_free(s[k].cbuf);
        ggml_free(s[k].ctx);
        ggml_free(s[k].cctx);
    }
    ggml_backend_free(be);
    ggml_backend_free(ref);
}

// Six weights of 64 KiB summed over one input, on the GPU, with budgets from 64 KiB to 1 MiB:
// at some budgets the first weights are resident and the rest stream through the two halves of
// the arena (several launches per graph, the halves reused), at others everything fits.
static void run_streaming(ggml_backend_dev_t dev) {
    enum { NW = 6 };
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();
    ggml_backend_dev_t devs[2] = { dev, cpu_dev };
    CHECK(set_strategy(dev, "gpu"), "strategy");
    for (size_t budget = 64 << 10; budget <= (1 << 20); budget += 48 << 10) {
        CHECK(set_budget(dev, budget), "budget");
        float * res[2] = { NULL, NULL };
        for (int k = 0; k < 2; k++) {
            ggml_backend_t be = ggml_backend_dev_init(devs[k], NULL);
            struct ggml_init_params ip = { ggml_tensor_overhead() * 32 + ggml_graph_overhead(), NULL, true };
            struct ggml_context * wctx = ggml_init(ip);
            struct ggml_tensor * w[NW];
            for (int i = 0; i < NW; i++) w[i] = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, K, M);
            ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, ggml_backend_dev_buffer_type(devs[k]));
            ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            for (int i = 0; i < NW; i++) rf_fill_tensor(w[i], 300 + i, -1, 1);
            struct ggml_context * ctx = ggml_init(ip);
            struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
            ggml_set_input(x);
            struct ggml_tensor * sum = ggml_mul_mat(ctx, w[0], x);
            for (int i = 1; i < NW; i++) sum = ggml_add(ctx, sum, ggml_mul_mat(ctx, w[i], x));
            ggml_set_output(sum);
            struct ggml_cgraph * gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, sum);
            ggml_gallocr_t alloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
            ggml_gallocr_alloc_graph(alloc, gf);
            // Twice: the second run finds the weights placed and the arena in use.
            for (int r = 0; r < 2; r++) {
                rf_fill_tensor(x, 400 + r, -1, 1);
                CHECK(rf_compute(be, gf) == GGML_STATUS_SUCCESS, "streaming, budget %zu, run %d", budget, r);
            }
            res[k] = rf_tensor_to_float(sum);
            ggml_gallocr_free(alloc);
            ggml_free(ctx);
            ggml_backend_buffer_free(wbuf);
            ggml_free(wctx);
            ggml_backend_free(be);
        }
        double e = rf_nmse(res[0], res[1], (size_t) M * N);
        CHECK(e <= 1e-6, "streaming, budget %zu: nmse %.3g", budget, e);
        free(res[0]);
        free(res[1]);
    }
}

// Three steps of s = soft_max(cur) (CPU on the stand-in), cur = W_2i s + W_2i+1 s (GPU), the
// weights 64 KiB each, with budgets from 128 KiB to 1 MiB: where the weights stream, each GPU
// segment's weights are copied in while the CPU segment before it runs (a prefetch, into one or
// both halves of the arena). Five runs per budget (with telemetry on, the first three are timed
// node by node, without prefetches); compared with ggml-cpu.
static void run_prefetch(ggml_backend_dev_t dev) {
    enum { NW = 6, KP = 128 };
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();
    ggml_backend_dev_t devs[2] = { dev, cpu_dev };
    CHECK(set_strategy(dev, "gpu"), "strategy");
    for (size_t budget = 128 << 10; budget <= (1 << 20); budget += 64 << 10) {
        CHECK(set_budget(dev, budget), "budget");
        float * res[2] = { NULL, NULL };
        for (int k = 0; k < 2; k++) {
            ggml_backend_t be = ggml_backend_dev_init(devs[k], NULL);
            struct ggml_init_params ip = { ggml_tensor_overhead() * 40 + ggml_graph_overhead(), NULL, true };
            struct ggml_context * wctx = ggml_init(ip);
            struct ggml_tensor * w[NW];
            for (int i = 0; i < NW; i++) w[i] = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, KP, KP);
            ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, ggml_backend_dev_buffer_type(devs[k]));
            ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            for (int i = 0; i < NW; i++) rf_fill_tensor(w[i], 500 + i, -1, 1);
            struct ggml_context * ctx = ggml_init(ip);
            struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, KP, N);
            ggml_set_input(x);
            struct ggml_tensor * cur = x;
            for (int i = 0; i < NW; i += 2) {
                struct ggml_tensor * s = ggml_soft_max(ctx, cur);
                cur = ggml_add(ctx, ggml_mul_mat(ctx, w[i], s), ggml_mul_mat(ctx, w[i + 1], s));
            }
            ggml_set_output(cur);
            struct ggml_cgraph * gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, cur);
            ggml_gallocr_t alloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
            ggml_gallocr_alloc_graph(alloc, gf);
            for (int r = 0; r < 5; r++) {
                rf_fill_tensor(x, 600 + r, -1, 1);
                CHECK(rf_compute(be, gf) == GGML_STATUS_SUCCESS, "prefetch, budget %zu, run %d", budget, r);
            }
            res[k] = rf_tensor_to_float(cur);
            ggml_gallocr_free(alloc);
            ggml_free(ctx);
            ggml_backend_buffer_free(wbuf);
            ggml_free(wctx);
            ggml_backend_free(be);
        }
        double e = rf_nmse(res[0], res[1], (size_t) KP * N);
        CHECK(e <= 1e-6, "prefetch, budget %zu: nmse %.3g", budget, e);
        free(res[0]);
        free(res[1]);
    }
}

// Two all-GPU graphs A and B computed in turn on one backend, as a prompt's and a token's are:
// each comes back to its kept plan and replay. The host writes A's input (and, once, the
// weights) before B runs, so B takes the record of those writes: A's replay must learn from the
// residency map, not from that record, what to copy in. Telemetry is off (no graph is timed
// node by node but the first). Compared with ggml-cpu every round.
static void run_alternate(ggml_backend_dev_t dev) {
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();
    ggml_backend_dev_t devs[2] = { dev, cpu_dev };
    CHECK(set_strategy(dev, "gpu"), "strategy");
    CHECK(set_telemetry(dev, false), "telemetry off");
    CHECK(set_budget(dev, (size_t) 1 << 30), "budget");
    ggml_backend_t bes[2];
    struct state s[2];
    struct graph a[2], b[2];
    for (int k = 0; k < 2; k++) {
        bes[k] = ggml_backend_dev_init(devs[k], NULL);
        rf_set_n_threads(bes[k], 2);
        state_make(&s[k], ggml_backend_dev_buffer_type(devs[k]), GGML_TYPE_Q4_0);
        graph_make(&a[k], &s[k], ggml_backend_get_default_buffer_type(bes[k]), 2, false, true);
        graph_make(&b[k], &s[k], ggml_backend_get_default_buffer_type(bes[k]), 6, false, true);
    }
    for (int round = 0; round < 5; round++) {
        float * res[2][4] = { { 0 } };
        for (int k = 0; k < 2; k++) {
            graph_inputs(&a[k], 700 + round);
            if (round == 3) rf_fill_tensor(s[k].w, 800, -1, 1);
            graph_inputs(&b[k], 900 + round);
            CHECK(rf_compute(bes[k], b[k].gf) == GGML_STATUS_SUCCESS, "alternate: B, round %d", round);
            res[k][0] = rf_tensor_to_float(b[k].z);
            CHECK(rf_compute(bes[k], a[k].gf) == GGML_STATUS_SUCCESS, "alternate: A, round %d", round);
            res[k][1] = rf_tensor_to_float(a[k].z);
            res[k][2] = rf_tensor_to_float(a[k].out);
            res[k][3] = rf_tensor_to_float(s[k].cache);
        }
        static const char * what[4] = { "B's z", "A's z", "A's out", "cache" };
        static const size_t n[4] = { (size_t) M * N, (size_t) M * N, (size_t) M * 3, (size_t) M * ROWS };
        for (int o = 0; o < 4; o++) {
            double e = rf_nmse(res[0][o], res[1][o], n[o]);
            CHECK(e <= 1e-6, "alternate, round %d: %s: nmse %.3g", round, what[o], e);
            free(res[0][o]);
            free(res[1][o]);
        }
    }
    for (int k = 0; k < 2; k++) {
        graph_free(&a[k]);
        graph_free(&b[k]);
        ggml_backend_buffer_free(s[k].wbuf);
        ggml_backend_buffer_free(s[k].cbuf);
        ggml_free(s[k].ctx);
        ggml_free(s[k].cctx);
        ggml_backend_free(bes[k]);
    }
    CHECK(set_telemetry(dev, true), "telemetry on");
}

static char * dev_json(json_dev_fn f, ggml_backend_dev_t dev) {
    size_t n = f(dev, NULL, 0);
    char * buf = malloc(n + 1);
    f(dev, buf, n + 1);
    return buf;
}

int main(int argc, char ** argv) {
    bool need_gpu = argc > 1 && strcmp(argv[1], "--need-gpu") == 0;
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    ggml_backend_dev_t dev = rf_device_by_name("RFHYBRID");
    const char * desc = ggml_backend_dev_description(dev);
    bool has_gpu = strstr(desc, "(no GPU)") == NULL;
    printf("RFHYBRID: %s\n", desc);
    if (need_gpu && !has_gpu) {
        printf("skipped: no GPU\n");
        return 0;
    }
    CHECK(ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU, "type");
    set_strategy = (set_strategy_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rocmforge_hybrid_set_strategy");
    set_budget = (set_budget_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rocmforge_hybrid_set_vram_budget");
    set_telemetry = (set_telemetry_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rocmforge_hybrid_set_telemetry");
    telemetry_json = (json_dev_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rocmforge_hybrid_telemetry_json");
    capabilities_json = (json_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rocmforge_capabilities_json");
    CHECK(set_strategy && set_budget && set_telemetry && telemetry_json && capabilities_json, "proc addresses");
    if (!set_strategy || !set_budget || !set_telemetry || !telemetry_json || !capabilities_json) {
        return rf_finish("test_hybrid");
    }

    // Bad input is refused, not fatal.
    CHECK(!set_strategy(dev, "fastest"), "unknown strategy accepted");
    CHECK(!set_strategy(dev, NULL), "NULL strategy accepted");
    CHECK(!set_strategy(rf_rfcpu_device(), "auto"), "strategy on RFCPU accepted");
    CHECK(!set_budget(NULL, 1), "budget on NULL accepted");
    CHECK(telemetry_json(rf_rfcpu_device(), NULL, 0) == 0, "telemetry of RFCPU");

    // Capabilities: every device, MUL_MAT among RFHYBRID's ops.
    size_t n = capabilities_json(NULL, 0);
    char * caps = malloc(n + 1);
    CHECK(capabilities_json(caps, n + 1) == n && strlen(caps) == n, "capabilities length");
    CHECK(strstr(caps, "\"RFCPU\"") && strstr(caps, "\"RFHYBRID\"") && strstr(caps, "\"MUL_MAT\""),
          "capabilities JSON: %.200s", caps);
    char small[8];
    CHECK(capabilities_json(small, sizeof small) == n && strlen(small) == 7, "cut to the buffer");
    free(caps);

    static const char * strategies[] = { "auto", "gpu", "cpu", "gpu-only", "cpu-only" };
    static const enum ggml_type wtypes[] = { GGML_TYPE_Q4_0, GGML_TYPE_F32 };
    static const size_t budgets[] = { (size_t) 1 << 30, 0, 2048, 40000 };
    char label[128];
    CHECK(set_telemetry(dev, true), "telemetry on");
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        CHECK(set_budget(dev, budgets[b]), "budget");
        for (size_t s = 0; s < sizeof strategies / sizeof strategies[0]; s++) {
            CHECK(set_strategy(dev, strategies[s]), "strategy %s", strategies[s]);
            for (size_t t = 0; t < 2; t++) {
                snprintf(label, sizeof label, "budget %zu, %s, %s weights", budgets[b], strategies[s],
                         ggml_type_name(wtypes[t]));
                run_compare(dev, wtypes[t], label);
            }
        }
    }
    run_streaming(dev);
    run_prefetch(dev);
    run_alternate(dev);
    // Telemetry saw both devices (with a GPU) and the reasons.
    char * json = dev_json(telemetry_json, dev);
    CHECK(strstr(json, "\"events\"") && strstr(json, "\"stats\""), "telemetry JSON: %.200s", json);
    CHECK(strstr(json, "\"device\":\"CPU\""), "no CPU event");
    // The first graphs' nodes timed alone, later ones as shares of their segments.
    CHECK(strstr(json, "\"timed\":true") && strstr(json, "\"timed\":false"), "events not marked timed / untimed");
    if (has_gpu) {
        CHECK(strstr(json, "\"device\":\"GPU\""), "no GPU event");
        CHECK(strstr(json, "\"kind\":\"transfer\""), "no transfer event");
        CHECK(strstr(json, "user-preference") && strstr(json, "memory-constraint"), "reasons missing");
        // The stand-in declines SOFT_MAX: run_prefetch's GPU segments follow CPU segments.
        const char * fake = getenv("ROCMFORGE_HYBRID_FAKE_GPU");
        if (fake && strcmp(fake, "1") == 0) {
            CHECK(strstr(json, "\"to-GPU-prefetch\""), "no prefetch");
        }
    } else {
        CHECK(strstr(json, "gpu-unavailable"), "reason gpu-unavailable missing");
    }
    printf("telemetry JSON: %zu bytes\n", strlen(json));
    free(json);
    set_strategy(dev, "auto");
    set_budget(dev, (size_t) 1 << 30);
    return rf_finish("test_hybrid");
}
