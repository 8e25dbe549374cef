// test_link: a host that links libggml-rocmforge.so directly and uses ggml-rocmforge.h.
#include "common.h"

#include <stdlib.h>
#include <string.h>

#include "ggml-rocmforge.h"

int main(void) {
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();

    ggml_backend_reg_t reg = ggml_backend_rocmforge_reg();
    CHECK(reg != NULL, "ggml_backend_rocmforge_reg");
    CHECK(reg == ggml_backend_rocmforge_reg(), "same registry on each call");
    CHECK(strcmp(ggml_backend_reg_name(reg), "rocmforge") == 0, "reg name");

    // Device queries through the header's functions, checked against the registry's devices.
    int n = ggml_backend_rocmforge_get_device_count();
    CHECK(n >= 1 && (size_t) n == ggml_backend_reg_dev_count(reg), "device count %d", n);
    for (int i = 0; i < n; i++) {
        char desc[256];
        ggml_backend_rocmforge_get_device_description(i, desc, sizeof(desc));
        ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, (size_t) i);
        CHECK(strcmp(desc, ggml_backend_dev_description(d)) == 0, "device %d description '%s'", i, desc);
        size_t f = 0, t = 0;
        ggml_backend_rocmforge_get_device_memory(i, &f, &t);
        CHECK(t > 0 && f <= t, "device %d memory %zu/%zu", i, f, t);
        printf("device %d: %s - %s (%zu MiB)\n", i, ggml_backend_dev_name(d), desc, t >> 20);
    }
    char small[4] = "xyz";
    ggml_backend_rocmforge_get_device_description(0, small, sizeof(small));
    CHECK(strlen(small) <= 3, "description cut to the buffer");
    char unk[32] = "junk";
    ggml_backend_rocmforge_get_device_description(n + 5, unk, sizeof(unk));
    CHECK(unk[0] == '\0', "unknown device description is empty, got '%s'", unk);
    ggml_backend_rocmforge_get_device_description(-1, unk, sizeof(unk));
    CHECK(unk[0] == '\0', "negative device description is empty");
    size_t f = 7, t = 7;
    ggml_backend_rocmforge_get_device_memory(n + 5, &f, &t);
    CHECK(f == 0 && t == 0, "unknown device memory %zu/%zu", f, t);
    ggml_backend_rocmforge_get_device_memory(0, NULL, NULL);  // must not crash

    ggml_backend_buffer_type_t buft = ggml_backend_rocmforge_cpu_buffer_type();
    CHECK(buft != NULL && ggml_backend_buft_is_host(buft), "cpu buffer type is host");
    CHECK(buft == ggml_backend_dev_buffer_type(ggml_backend_reg_dev_get(reg, 0)), "same as RFCPU's buffer type");

    ggml_backend_t rf = ggml_backend_rocmforge_cpu_init();
    ggml_backend_t cpu = ggml_backend_dev_init(cpu_dev, NULL);
    CHECK(rf != NULL, "cpu_init");
    CHECK(ggml_backend_is_rocmforge(rf), "is_rocmforge(ours)");
    CHECK(!ggml_backend_is_rocmforge(cpu), "is_rocmforge(ggml-cpu)");
    CHECK(!ggml_backend_is_rocmforge(NULL), "is_rocmforge(NULL)");
    ggml_backend_rocmforge_set_n_threads(rf, 2);
    ggml_backend_rocmforge_set_n_threads(rf, 0);   // treated as 1
    ggml_backend_rocmforge_set_n_threads(cpu, 3);  // not ours: ignored, no crash
    ggml_backend_rocmforge_set_n_threads(NULL, 3); // no crash
    ggml_backend_rocmforge_set_n_threads(rf, 2);
    rf_set_n_threads(cpu, 2);

    // y = (A x) * s + r, with A F32 [64 x 33], on both backends.
    float * res[2] = { NULL, NULL };
    ggml_backend_t bes[2] = { rf, cpu };
    int64_t ne = 0;
    for (int k = 0; k < 2 && rf && cpu; k++) {
        struct ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 33);
        struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 5);
        struct ggml_tensor * r = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 33, 5);
        struct ggml_tensor * y = ggml_add(ctx, ggml_scale(ctx, ggml_mul_mat(ctx, a, x), 0.25f), r);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, y);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, bes[k]);
        CHECK(buf != NULL, "alloc");
        if (buf) {
            rf_fill_tensor(a, 1, -1, 1);
            rf_fill_tensor(x, 2, -1, 1);
            rf_fill_tensor(r, 3, -1, 1);
            CHECK(ggml_backend_graph_compute(bes[k], gf) == GGML_STATUS_SUCCESS, "compute on %s",
                  ggml_backend_name(bes[k]));
            res[k] = rf_tensor_to_float(y);
            ne = ggml_nelements(y);
            ggml_backend_buffer_free(buf);
        }
        ggml_free(ctx);
    }
    if (res[0] && res[1]) {
        double e = rf_nmse(res[0], res[1], (size_t) ne);
        printf("mul_mat+scale+add: nmse RFCPU vs ggml-cpu = %.3g\n", e);
        CHECK(e < 5e-4, "nmse %g", e);
    }
    free(res[0]);
    free(res[1]);

    // A buffer allocated directly from the header's buffer type.
    ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(buft, 1 << 20);
    CHECK(b != NULL && ggml_backend_buffer_get_size(b) >= (1 << 20), "1 MiB buffer");
    CHECK(b && ggml_backend_buffer_is_host(b), "buffer is host");
    if (b) ggml_backend_buffer_free(b);

    if (rf) ggml_backend_free(rf);
    if (cpu) ggml_backend_free(cpu);
    return rf_finish("test_link");
}
