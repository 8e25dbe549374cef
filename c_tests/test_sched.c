// test_sched: ggml's scheduler with backends [RFCPU, ggml-cpu]. The graph contains an op that
// RFCPU does not claim, so the scheduler must split it between the two; the result must match
// the same graph run on ggml-cpu alone.
#include "common.h"

#include <stdlib.h>
#include <string.h>

typedef struct ggml_tensor * (*unary_builder)(struct ggml_context *, struct ggml_tensor *);

// Shape-preserving ops that RFCPU is unlikely to claim; the first one it refuses is used.
static const struct { const char * name; unary_builder fn; } candidates[] = {
    { "floor", ggml_floor }, { "trunc", ggml_trunc }, { "sin", ggml_sin }, { "cos", ggml_cos },
    { "sgn", ggml_sgn },     { "step", ggml_step },   { "tanh", ggml_tanh },
};

struct model {
    struct ggml_context * ctx;
    struct ggml_cgraph * gf;
    struct ggml_tensor *w1, *b1, *w2, *x, *mid, *out;
};

static void build(struct model * m, unary_builder unsupported) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 32 + ggml_graph_overhead(), NULL, true };
    m->ctx = ggml_init(ip);
    m->w1 = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F16, 128, 96);
    m->b1 = ggml_new_tensor_1d(m->ctx, GGML_TYPE_F32, 96);
    m->w2 = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F32, 96, 64);
    m->x = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F32, 128, 9);
    ggml_set_input(m->x);
    struct ggml_tensor * h = ggml_add(m->ctx, ggml_mul_mat(m->ctx, m->w1, m->x), m->b1);
    h = ggml_scale(m->ctx, h, 2.0f);
    m->mid = unsupported(m->ctx, h);
    struct ggml_tensor * z = ggml_mul_mat(m->ctx, m->w2, m->mid);
    m->out = ggml_soft_max(m->ctx, ggml_scale(m->ctx, z, 0.1f));
    ggml_set_output(m->out);
    m->gf = ggml_new_graph(m->ctx);
    ggml_build_forward_expand(m->gf, m->out);
}

static void fill(struct model * m) {
    rf_fill_tensor(m->w1, 11, -1, 1);
    rf_fill_tensor(m->b1, 12, -1, 1);
    rf_fill_tensor(m->w2, 13, -1, 1);
    rf_fill_tensor(m->x, 14, -1, 1);
}

int main(void) {
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();
    ggml_backend_dev_t rf_dev = rf_rfcpu_device();
    ggml_backend_t rf = ggml_backend_dev_init(rf_dev, NULL);
    ggml_backend_t cpu = ggml_backend_dev_init(cpu_dev, NULL);
    CHECK(rf && cpu, "backends");
    if (!rf || !cpu) return rf_finish("test_sched");
    rf_set_n_threads(rf, 2);
    rf_set_n_threads(cpu, 2);

    // Pick the unsupported op.
    unary_builder unsupported = NULL;
    const char * uname = NULL;
    for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]) && !unsupported; i++) {
        struct model probe;
        build(&probe, candidates[i].fn);
        if (!ggml_backend_dev_supports_op(rf_dev, probe.mid) && ggml_backend_dev_supports_op(cpu_dev, probe.mid)) {
            unsupported = candidates[i].fn;
            uname = candidates[i].name;
        }
        ggml_free(probe.ctx);
    }
    CHECK(unsupported != NULL, "RFCPU claims every candidate op; extend the candidate list");
    if (!unsupported) return rf_finish("test_sched");
    printf("op RFCPU does not claim: %s\n", uname);

    // Reference: ggml-cpu alone.
    struct model ref;
    build(&ref, unsupported);
    ggml_backend_buffer_t ref_buf = ggml_backend_alloc_ctx_tensors(ref.ctx, cpu);
    fill(&ref);
    CHECK(ggml_backend_graph_compute(cpu, ref.gf) == GGML_STATUS_SUCCESS, "reference compute");
    float * want = rf_tensor_to_float(ref.out);

    // Scheduler: RFCPU first, ggml-cpu last (the scheduler requires a CPU backend last).
    ggml_backend_t backends[2] = { rf, cpu };
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, NULL, 2, GGML_DEFAULT_GRAPH_SIZE, false, false);
    CHECK(sched != NULL, "sched_new");
    struct model m;
    build(&m, unsupported);
    CHECK(ggml_backend_sched_alloc_graph(sched, m.gf), "sched_alloc_graph");
    fill(&m);
    int n_splits = ggml_backend_sched_get_n_splits(sched);
    int on_rf = 0, on_cpu = 0;
    for (int i = 0; i < ggml_graph_n_nodes(m.gf); i++) {
        struct ggml_tensor * node = ggml_graph_node(m.gf, i);
        ggml_backend_t b = ggml_backend_sched_get_tensor_backend(sched, node);
        if (b == rf) on_rf++;
        if (b == cpu) on_cpu++;
        printf("  node %-2d %-10s -> %s\n", i, ggml_op_desc(node), b ? ggml_backend_name(b) : "(none)");
    }
    printf("splits: %d, nodes on RFCPU: %d, on ggml-cpu: %d\n", n_splits, on_rf, on_cpu);
    CHECK(n_splits >= 2, "the graph must be split, got %d split(s)", n_splits);
    CHECK(on_rf > 0 && on_cpu > 0, "both backends get nodes");
    CHECK(ggml_backend_sched_get_tensor_backend(sched, m.mid) == cpu, "the unsupported op runs on ggml-cpu");

    CHECK(ggml_backend_sched_graph_compute(sched, m.gf) == GGML_STATUS_SUCCESS, "sched compute");
    float * got = rf_tensor_to_float(m.out);
    double e = rf_nmse(got, want, (size_t) ggml_nelements(m.out));
    printf("sched [RFCPU, CPU] vs ggml-cpu alone: nmse %.3g\n", e);
    CHECK(e < 5e-4, "nmse %g", e);

    // A second run with new input data reuses the split graph.
    ggml_backend_sched_reset(sched);
    CHECK(ggml_backend_sched_alloc_graph(sched, m.gf), "sched_alloc_graph (2)");
    fill(&m);
    CHECK(ggml_backend_sched_graph_compute(sched, m.gf) == GGML_STATUS_SUCCESS, "sched compute (2)");
    float * got2 = rf_tensor_to_float(m.out);
    e = rf_nmse(got2, want, (size_t) ggml_nelements(m.out));
    CHECK(e < 5e-4, "second run nmse %g", e);

    free(want);
    free(got);
    free(got2);
    ggml_backend_sched_free(sched);
    ggml_free(m.ctx);
    ggml_backend_buffer_free(ref_buf);
    ggml_free(ref.ctx);
    ggml_backend_free(rf);
    ggml_backend_free(cpu);
    return rf_finish("test_sched");
}
