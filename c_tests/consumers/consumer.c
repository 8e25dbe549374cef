// A program built against an installed rocmforge (by consumers/cmake with find_package and by
// consumers/pkgconfig with pkg-config): registers the backend with ggml, lists its devices and
// computes y = A x + x on RFCPU, checked against the same sums done here.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-rocmforge.h"
#include "ggml.h"

#define FAIL(...) do { fprintf(stderr, "consumer: " __VA_ARGS__); fprintf(stderr, "\n"); return 1; } while (0)

int main(void) {
    printf("rocmforge %s, built for ggml %s (backend API %d); this ggml is %s\n", GGML_ROCMFORGE_VERSION,
           GGML_ROCMFORGE_GGML_VERSION, GGML_ROCMFORGE_BACKEND_API, ggml_version());
    ggml_backend_reg_t reg = ggml_backend_rocmforge_reg();
    if (!reg) FAIL("ggml_backend_rocmforge_reg() returned NULL");
    ggml_backend_register(reg);

    ggml_backend_dev_t rfcpu = NULL;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, i);
        printf("device %zu: %s - %s\n", i, ggml_backend_dev_name(d), ggml_backend_dev_description(d));
        if (strcmp(ggml_backend_dev_name(d), "RFCPU") == 0) rfcpu = d;
    }
    if (!rfcpu || ggml_backend_dev_by_name("RFCPU") != rfcpu) FAIL("RFCPU not registered with ggml");

    ggml_backend_t be = ggml_backend_dev_init(rfcpu, NULL);
    if (!be) FAIL("RFCPU backend init failed");
    enum { K = 8, M = 5, N = 3 };
    struct ggml_init_params ip = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);  // M rows of K
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
    struct ggml_tensor * s = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, M, N);
    struct ggml_tensor * y = ggml_add(ctx, ggml_mul_mat(ctx, a, x), s);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    if (!buf) FAIL("allocation on RFCPU failed");

    float av[M * K], xv[N * K], sv[N * M], yv[N * M];
    for (int i = 0; i < M * K; i++) av[i] = (float) ((i * 7) % 11) - 5.0f;
    for (int i = 0; i < N * K; i++) xv[i] = (float) ((i * 3) % 5) * 0.5f;
    for (int i = 0; i < N * M; i++) sv[i] = (float) i;
    ggml_backend_tensor_set(a, av, 0, sizeof(av));
    ggml_backend_tensor_set(x, xv, 0, sizeof(xv));
    ggml_backend_tensor_set(s, sv, 0, sizeof(sv));
    if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) FAIL("compute on RFCPU failed");
    ggml_backend_tensor_get(y, yv, 0, sizeof(yv));
    for (int n = 0; n < N; n++) {
        for (int m = 0; m < M; m++) {
            float want = sv[n * M + m];
            for (int k = 0; k < K; k++) want += av[m * K + k] * xv[n * K + k];
            if (fabsf(yv[n * M + m] - want) > 1e-3f) FAIL("y[%d,%d] = %g, want %g", n, m, yv[n * M + m], want);
        }
    }
    printf("y = A x + s on RFCPU: %d values as expected\n", N * M);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(be);
    return 0;
}
