// test_load: rocmforge used by an unmodified ggml host. The library is only ever reached
// through ggml's public API: ggml_backend_load(path), and GGML_BACKEND_PATH +
// ggml_backend_load_all() in a child process.
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ggml-rocmforge.h"  // the version macros only: no function of it is called here

// Builds out = soft_max(W x + b) in a no_alloc context, allocates it on `backend`, fills the
// inputs deterministically, computes and returns the output as floats (caller frees).
static float * run_small_graph(ggml_backend_t backend, int64_t * n_out) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * w = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 96, 40);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 96, 7);
    struct ggml_tensor * b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 40);
    struct ggml_tensor * y = ggml_soft_max(ctx, ggml_add(ctx, ggml_mul_mat(ctx, w, x), b));
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    CHECK(buf != NULL, "alloc on %s", ggml_backend_name(backend));
    float * out = NULL;
    if (buf) {
        rf_fill_tensor(w, 1, -1, 1);
        rf_fill_tensor(x, 2, -1, 1);
        rf_fill_tensor(b, 3, -1, 1);
        enum ggml_status st = ggml_backend_graph_compute(backend, gf);
        CHECK(st == GGML_STATUS_SUCCESS, "compute on %s: status %d", ggml_backend_name(backend), st);
        out = rf_tensor_to_float(y);
        *n_out = ggml_nelements(y);
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    return out;
}

// Child mode: GGML_BACKEND_PATH points at libggml-rocmforge.so; ggml_backend_load_all() must
// register it and RFCPU must be reachable by name.
static int child_main(void) {
    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_name("RFCPU");
    if (!dev) {
        fprintf(stderr, "child: RFCPU not found after ggml_backend_load_all with GGML_BACKEND_PATH=%s\n",
                getenv("GGML_BACKEND_PATH"));
        return 3;
    }
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
    if (!be) {
        return 4;
    }
    int64_t n = 0;
    float * out = run_small_graph(be, &n);
    double sum = 0;
    for (int64_t i = 0; out && i < n; i++) sum += out[i];
    free(out);
    ggml_backend_free(be);
    // Each of the 7 softmax rows sums to 1.
    if (fabs(sum - 7.0) > 1e-3 || rf_failures) {
        fprintf(stderr, "child: softmax rows sum to %f, expected 7\n", sum);
        return 5;
    }
    printf("child: GGML_BACKEND_PATH route OK (RFCPU found by ggml_backend_load_all)\n");
    return 0;
}

int main(int argc, char ** argv) {
    if (argc > 1 && strcmp(argv[1], "--child") == 0) {
        return child_main();
    }

    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();

    // --- ggml_backend_load(path) ---
    ggml_backend_reg_t reg = ggml_backend_load(ROCMFORGE_LIB_PATH);
    CHECK(reg != NULL, "ggml_backend_load(%s)", ROCMFORGE_LIB_PATH);
    if (!reg) {
        return rf_finish("test_load");
    }
    CHECK(strcmp(ggml_backend_reg_name(reg), "rocmforge") == 0, "reg name '%s'", ggml_backend_reg_name(reg));
    CHECK(ggml_backend_reg_dev_count(reg) >= 1, "device count %zu", ggml_backend_reg_dev_count(reg));
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    CHECK(dev != NULL, "device 0");
    CHECK(strcmp(ggml_backend_dev_name(dev), "RFCPU") == 0, "device 0 name '%s'", ggml_backend_dev_name(dev));
    CHECK(ggml_backend_dev_by_name("RFCPU") == dev, "ggml_backend_dev_by_name(RFCPU) finds the loaded device");
    CHECK(ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU, "type %d", ggml_backend_dev_type(dev));
    CHECK(ggml_backend_dev_backend_reg(dev) == reg, "device's registry");
    const char * desc = ggml_backend_dev_description(dev);
    CHECK(desc != NULL && desc[0] != '\0', "description");
    size_t mfree = 0, mtotal = 0;
    ggml_backend_dev_memory(dev, &mfree, &mtotal);
    CHECK(mtotal > 0 && mfree <= mtotal, "memory free %zu total %zu", mfree, mtotal);
    struct ggml_backend_dev_props props;
    memset(&props, 0x55, sizeof(props));
    ggml_backend_dev_get_props(dev, &props);
    CHECK(props.name && strcmp(props.name, "RFCPU") == 0, "props.name");
    CHECK(props.description && strcmp(props.description, desc) == 0, "props.description");
    CHECK(props.type == GGML_BACKEND_DEVICE_TYPE_CPU, "props.type");
    CHECK(props.memory_total == mtotal, "props.memory_total %zu vs %zu", props.memory_total, mtotal);
    printf("device RFCPU: '%s', memory %zu/%zu MiB, caps async=%d host_buffer=%d from_host_ptr=%d events=%d\n",
           desc, mfree >> 20, mtotal >> 20, props.caps.async, props.caps.host_buffer,
           props.caps.buffer_from_host_ptr, props.caps.events);
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    CHECK(buft != NULL && ggml_backend_buft_is_host(buft), "RFCPU buffer type is host memory");
    CHECK(ggml_backend_dev_supports_buft(dev, buft), "supports its own buffer type");

    // --- proc addresses ---
    ggml_backend_set_n_threads_t set_n_threads =
        (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    ggml_backend_get_features_t get_features =
        (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
    CHECK(set_n_threads != NULL, "ggml_backend_set_n_threads proc address");
    CHECK(get_features != NULL, "ggml_backend_get_features proc address");
    CHECK(ggml_backend_reg_get_proc_address(reg, "no_such_function") == NULL, "unknown proc address is NULL");
    if (get_features) {
        struct ggml_backend_feature * f = get_features(reg);
        CHECK(f != NULL, "features list");
        printf("features:");
        // The versions built for, as the header states them.
        const char * want[3][2] = { { "ROCMFORGE_VERSION", GGML_ROCMFORGE_VERSION },
                                    { "GGML_VERSION", GGML_ROCMFORGE_GGML_VERSION },
                                    { "BACKEND_API", "3" } };
        int seen[3] = { 0, 0, 0 };
        for (int i = 0; f && f[i].name; i++) {
            CHECK(f[i].value != NULL, "feature %s has a value", f[i].name);
            printf(" %s=%s", f[i].name, f[i].value ? f[i].value : "?");
            for (int k = 0; k < 3 && f[i].value; k++) {
                if (strcmp(f[i].name, want[k][0]) == 0) {
                    seen[k]++;
                    CHECK(strcmp(f[i].value, want[k][1]) == 0, "feature %s=%s, header says %s", want[k][0],
                          f[i].value, want[k][1]);
                }
            }
        }
        printf("\n");
        for (int k = 0; k < 3; k++) CHECK(seen[k] == 1, "feature %s listed once (%d)", want[k][0], seen[k]);
        CHECK(GGML_ROCMFORGE_BACKEND_API == 3, "header's backend API %d", GGML_ROCMFORGE_BACKEND_API);
        CHECK(strcmp(ggml_version(), GGML_ROCMFORGE_GGML_VERSION) == 0, "host ggml %s, built for %s",
              ggml_version(), GGML_ROCMFORGE_GGML_VERSION);
    }

    // --- compute on RFCPU vs ggml-cpu ---
    ggml_backend_t rf = ggml_backend_dev_init(dev, NULL);
    ggml_backend_t cpu = ggml_backend_dev_init(cpu_dev, NULL);
    CHECK(rf != NULL && cpu != NULL, "backend init");
    if (rf && cpu) {
        CHECK(ggml_backend_get_device(rf) == dev, "backend's device");
        CHECK(ggml_backend_name(rf) != NULL, "backend name");
        if (set_n_threads) set_n_threads(rf, 2);
        rf_set_n_threads(cpu, 2);
        int64_t n_rf = 0, n_cpu = 0;
        float * a = run_small_graph(rf, &n_rf);
        float * b = run_small_graph(cpu, &n_cpu);
        CHECK(a && b && n_rf == n_cpu, "both computed");
        if (a && b && n_rf == n_cpu) {
            double e = rf_nmse(a, b, (size_t) n_rf);
            printf("mul_mat+add+soft_max: nmse RFCPU vs ggml-cpu = %.3g\n", e);
            CHECK(e < 5e-4, "nmse %g", e);
        }
        // Thread count 1 must give the same result.
        if (set_n_threads) set_n_threads(rf, 1);
        float * c = run_small_graph(rf, &n_rf);
        if (a && c) {
            double e = rf_nmse(c, a, (size_t) n_rf);
            CHECK(e < 1e-10, "1 thread vs 2 threads nmse %g", e);
        }
        free(a);
        free(b);
        free(c);
    }
    if (rf) ggml_backend_free(rf);
    if (cpu) ggml_backend_free(cpu);

    // --- unload ---
    ggml_backend_unload(reg);
    CHECK(ggml_backend_dev_by_name("RFCPU") == NULL, "RFCPU gone after ggml_backend_unload");

    // --- GGML_BACKEND_PATH route, in a fresh process ---
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("GGML_BACKEND_PATH", ROCMFORGE_LIB_PATH, 1);
        execl("/proc/self/exe", argv[0], "--child", (char *) NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork/wait");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exit status %d (signal %d)",
          WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);

    return rf_finish("test_load");
}
