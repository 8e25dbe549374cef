// simple_graph: a 2-layer MLP on 1024-wide data, run on RFCPU (loaded with ggml_backend_load,
// like any ggml backend) and on ggml's own CPU backend; prints both results, their difference
// and the time per run.
//
//   y = soft_max(W2 (W1 x + b1) + b2)    W1, W2: F16 [1024 x 1024], x: F32 [1024 x 8]
//
// Usage: simple_graph [path/to/libggml-rocmforge.so] [n_threads] [runs]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#define WIDTH 1024
#define BATCH 8

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

static float frand(unsigned * s) {
    *s = *s * 1664525u + 1013904223u;
    return (float) ((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static void set_random(struct ggml_tensor * t, unsigned seed, float scale) {
    const int64_t n = ggml_nelements(t);
    float * f = malloc(sizeof(float) * (size_t) n);
    for (int64_t i = 0; i < n; i++) f[i] = frand(&seed) * scale;
    if (t->type == GGML_TYPE_F16) {
        ggml_fp16_t * h = malloc(sizeof(ggml_fp16_t) * (size_t) n);
        ggml_fp32_to_fp16_row(f, h, n);
        ggml_backend_tensor_set(t, h, 0, ggml_nbytes(t));
        free(h);
    } else {
        ggml_backend_tensor_set(t, f, 0, ggml_nbytes(t));
    }
    free(f);
}

struct result {
    float * out;
    double ms;
    int ok;
};

static struct result run(ggml_backend_t backend, int n_threads, int runs) {
    struct result r = { NULL, 0.0, 0 };
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_set_n_threads_t set_threads =
        (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (set_threads) set_threads(backend, n_threads);

    struct ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * w1 = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, WIDTH, WIDTH);
    struct ggml_tensor * b1 = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, WIDTH);
    struct ggml_tensor * w2 = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, WIDTH, WIDTH);
    struct ggml_tensor * b2 = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, WIDTH);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, WIDTH, BATCH);
    struct ggml_tensor * h = ggml_add(ctx, ggml_mul_mat(ctx, w1, x), b1);
    struct ggml_tensor * y = ggml_soft_max(ctx, ggml_add(ctx, ggml_mul_mat(ctx, w2, h), b2));
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);

    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) {
        fprintf(stderr, "%s: allocation failed\n", ggml_backend_name(backend));
        ggml_free(ctx);
        return r;
    }
    set_random(w1, 1, 0.05f);
    set_random(b1, 2, 0.1f);
    set_random(w2, 3, 0.05f);
    set_random(b2, 4, 0.1f);
    set_random(x, 5, 1.0f);

    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {  // warm-up
        fprintf(stderr, "%s: compute failed\n", ggml_backend_name(backend));
    } else {
        const double t0 = now_ms();
        int okruns = 0;
        for (int i = 0; i < runs; i++) okruns += ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
        r.ms = (now_ms() - t0) / runs;
        r.ok = okruns == runs;
        r.out = malloc(ggml_nbytes(y));
        ggml_backend_tensor_get(y, r.out, 0, ggml_nbytes(y));
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

int main(int argc, char ** argv) {
    const char * lib = argc > 1 ? argv[1] : ROCMFORGE_LIB_PATH;
    const int n_threads = argc > 2 ? atoi(argv[2]) : 2;
    const int runs = argc > 3 ? atoi(argv[3]) : 20;

    // ggml's CPU backend is a dynamically loaded module too (libggml-cpu*.so next to us).
    if (!ggml_backend_load(ROCMFORGE_BIN_DIR "/libggml-cpu.so")) {
        ggml_backend_load_all_from_path(ROCMFORGE_BIN_DIR);
    }
    if (!ggml_backend_load(lib)) {
        fprintf(stderr, "cannot load %s\n", lib);
        return 1;
    }
    ggml_backend_t rf = ggml_backend_init_by_name("RFCPU", NULL);
    ggml_backend_t cpu = ggml_backend_init_by_name("CPU", NULL);
    if (!rf || !cpu) {
        fprintf(stderr, "cannot create the RFCPU or CPU backend\n");
        return 1;
    }
    printf("graph: soft_max(W2 (W1 x + b1) + b2), W F16 %dx%d, x F32 %dx%d; %d thread(s), %d runs\n", WIDTH, WIDTH,
           WIDTH, BATCH, n_threads, runs);
    printf("RFCPU: %s\n", ggml_backend_dev_description(ggml_backend_get_device(rf)));

    struct result a = run(rf, n_threads, runs);
    struct result b = run(cpu, n_threads, runs);
    if (!a.ok || !b.ok) {
        fprintf(stderr, "a run failed\n");
        return 1;
    }
    double max_diff = 0.0;
    for (int i = 0; i < WIDTH * BATCH; i++) {
        const double d = fabs((double) a.out[i] - (double) b.out[i]);
        if (d > max_diff || isnan(d)) max_diff = d;
    }
    printf("%-10s first values: %.6e %.6e %.6e %.6e   %8.3f ms/run\n", "RFCPU", a.out[0], a.out[1], a.out[2],
           a.out[3], a.ms);
    printf("%-10s first values: %.6e %.6e %.6e %.6e   %8.3f ms/run\n", "ggml-cpu", b.out[0], b.out[1], b.out[2],
           b.out[3], b.ms);
    printf("max abs diff: %.3e  (values ~%.1e)   RFCPU/ggml-cpu time: %.2fx\n", max_diff, 1.0 / WIDTH, a.ms / b.ms);
    free(a.out);
    free(b.out);
    ggml_backend_free(rf);
    ggml_backend_free(cpu);
    return max_diff < 1e-5 ? 0 : 2;
}
