// bench_mul_mat: one MUL_MAT of a given weight type on RFCPU and on ggml-cpu, timed back to back
// (the two backends alternate every repetition, so a busy machine slows both alike); prints the
// best and median time of each and the weight bytes per second of the best.
//
//   bench_mul_mat TYPE [THREADS [REPS [N [K M]]]]
//       TYPE a ggml type name (q4_0, nvfp4, q1_0, ...); two 8B-shaped layer products: Llama-3-8B's
//       ffn_up/gate (4096 -> 14336) and ffn_down (14336 -> 4096), or the one K -> M product given,
//       N activation columns (default 1: generation). THREADS default 2, REPS default 30.
// ggml-cpu comes from RF_TEST_BIN_DIR (libggml-cpu.so, or the best libggml-cpu-<variant>.so there).
// REPACK=1: the weight in each device's first extra buffer type (RFCPU_REPACK, ggml's CPU_REPACK),
// where libllama puts a model's weights; a device without one keeps its default buffer.
// BENCH_ONLY=RFCPU|ggml-cpu: time that one alone (ggml-cpu's OpenMP threads spin a while after
// each product and slow the next one's threads on a small machine); BENCH_ALL=1: every time.

#include "common.h"

#include <stdlib.h>
#include <string.h>

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

struct side {
    ggml_backend_t be;
    struct ggml_context * ctx, * wctx;
    ggml_backend_buffer_t buf, wbuf;
    struct ggml_cgraph * gf;
    double * ms;
};

static struct side make_side(ggml_backend_dev_t dev, int threads, enum ggml_type t, int64_t k, int64_t m, int64_t n,
                             int reps) {
    struct side s = { 0 };
    s.be = ggml_backend_dev_init(dev, NULL);
    if (!s.be) {
        fprintf(stderr, "cannot start %s\n", ggml_backend_dev_name(dev));
        exit(2);
    }
    rf_set_n_threads(s.be, threads);
    struct ggml_init_params ip = { 8 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    s.ctx = ggml_init(ip);
    s.wctx = ggml_init(ip);
    struct ggml_tensor * w = ggml_new_tensor_2d(s.wctx, t, k, m);
    struct ggml_tensor * x = ggml_new_tensor_2d(s.ctx, GGML_TYPE_F32, k, n);
    struct ggml_tensor * y = ggml_mul_mat(s.ctx, w, x);
    s.gf = ggml_new_graph(s.ctx);
    ggml_build_forward_expand(s.gf, y);
    ggml_backend_buffer_type_t wbt = ggml_backend_get_default_buffer_type(s.be);
    const char * repack = getenv("REPACK");
    if (repack && atoi(repack)) {
        typedef ggml_backend_buffer_type_t * (*extra_fn)(ggml_backend_dev_t);
        extra_fn extra = (extra_fn) ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev),
                                                                       "ggml_backend_dev_get_extra_bufts");
        ggml_backend_buffer_type_t * bts = extra ? extra(dev) : NULL;
        if (bts && bts[0]) wbt = bts[0];
    }
    s.buf = ggml_backend_alloc_ctx_tensors(s.ctx, s.be);
    s.wbuf = ggml_backend_alloc_ctx_tensors_from_buft(s.wctx, wbt);
    // As libllama: an extra buffer type only where the device takes the product from it.
    if (s.wbuf && wbt != ggml_backend_get_default_buffer_type(s.be) && !ggml_backend_supports_op(s.be, y)) {
        ggml_backend_buffer_free(s.wbuf);
        w->buffer = NULL;
        w->data = NULL;
        w->extra = NULL;
        wbt = ggml_backend_get_default_buffer_type(s.be);
        s.wbuf = ggml_backend_alloc_ctx_tensors_from_buft(s.wctx, wbt);
    }
    if (repack) fprintf(stderr, "%s: weight in %s\n", ggml_backend_dev_name(dev), ggml_backend_buft_name(wbt));
    if (!s.buf || !s.wbuf) {
        fprintf(stderr, "allocation on %s failed\n", ggml_backend_dev_name(dev));
        exit(2);
    }
    rf_fill_tensor(w, 1, -1, 1);
    rf_fill_tensor(x, 2, -1, 1);
    s.ms = calloc((size_t) reps, sizeof(double));
    return s;
}

static void free_side(struct side * s) {
    free(s->ms);
    ggml_backend_buffer_free(s->buf);
    ggml_backend_buffer_free(s->wbuf);
    ggml_free(s->ctx);
    ggml_free(s->wctx);
    ggml_backend_free(s->be);
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: [REPACK=1] bench_mul_mat TYPE [THREADS [REPS [N [K M]]]]\n");
        return 2;
    }
    enum ggml_type t = GGML_TYPE_COUNT;
    for (int i = 0; i < GGML_TYPE_COUNT; i++) {
        const char * name = ggml_type_name((enum ggml_type) i);
        if (name && ggml_type_size((enum ggml_type) i) && !strcmp(name, argv[1])) t = (enum ggml_type) i;
    }
    if (t == GGML_TYPE_COUNT) {
        fprintf(stderr, "unknown type %s\n", argv[1]);
        return 2;
    }
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    const int reps = argc > 3 ? atoi(argv[3]) : 30;
    const int64_t n = argc > 4 ? atoll(argv[4]) : 1;
    if (threads < 1 || reps < 1 || n < 1) {
        fprintf(stderr, "THREADS, REPS and N must be positive\n");
        return 2;
    }
    ggml_backend_dev_t devs[2] = { rf_rfcpu_device(), rf_ggml_cpu_device() };
    const char * names[2] = { "RFCPU", "ggml-cpu" };
    int64_t shapes[][2] = { { 4096, 14336 }, { 14336, 4096 } };
    int n_shapes = 2;
    if (argc > 6) {
        shapes[0][0] = atoll(argv[5]);
        shapes[0][1] = atoll(argv[6]);
        n_shapes = 1;
        if (shapes[0][0] < 1 || shapes[0][1] < 1) {
            fprintf(stderr, "K and M must be positive\n");
            return 2;
        }
    }
    for (int s = 0; s < n_shapes; s++) {
        const int64_t k = shapes[s][0], m = shapes[s][1];
        struct side sd[2];
        for (int b = 0; b < 2; b++) sd[b] = make_side(devs[b], threads, t, k, m, n, reps);
        for (int b = 0; b < 2; b++) {
            if (!ggml_backend_supports_op(sd[b].be, ggml_graph_node(sd[b].gf, -1))) {
                printf("%s %lldx%lld: %s does not take it\n", argv[1], (long long) k, (long long) m, names[b]);
                return 1;
            }
            rf_compute(sd[b].be, sd[b].gf);  // warm-up: pages touched, threads started
        }
        const char * only = getenv("BENCH_ONLY");
        for (int r = 0; r < reps; r++) {
            for (int b = 0; b < 2; b++) {
                if (only && strcmp(only, names[b])) continue;
                const double t0 = rf_now_ms();
                if (rf_compute(sd[b].be, sd[b].gf) != GGML_STATUS_SUCCESS) {
                    printf("%s: compute failed\n", names[b]);
                    return 1;
                }
                sd[b].ms[r] = rf_now_ms() - t0;
            }
        }
        const double bytes = (double) ggml_row_size(t, k) * (double) m;
        double best[2];
        for (int b = 0; b < 2; b++) {
            if (getenv("BENCH_ALL")) {
                printf("%s:", names[b]);
                for (int r = 0; r < reps; r++) printf(" %.2f", sd[b].ms[r]);
                printf("\n");
            }
            qsort(sd[b].ms, (size_t) reps, sizeof(double), cmp_double);
            best[b] = sd[b].ms[0];
            printf("%s %lldx%lld n=%lld %-8s threads=%d best %.3f ms (%.2f GB/s) median %.3f ms\n", argv[1], (long long) k,
                   (long long) m, (long long) n, names[b], threads, best[b], bytes / best[b] / 1e6, sd[b].ms[reps / 2]);
        }
        printf("%s %lldx%lld n=%lld RFCPU/ggml-cpu speed %.2fx (best times)\n", argv[1], (long long) k, (long long) m,
               (long long) n, best[1] / best[0]);
        for (int b = 0; b < 2; b++) free_side(&sd[b]);
    }
    return 0;
}
