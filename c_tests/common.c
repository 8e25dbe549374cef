// Helpers shared by the C tests (see common.h).
#include "common.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int rf_failures = 0;

int rf_finish(const char * test_name) {
    if (rf_failures == 0) {
        printf("%s: PASS\n", test_name);
        return 0;
    }
    printf("%s: FAIL (%d check(s) failed)\n", test_name, rf_failures);
    return 1;
}

static ggml_backend_reg_t g_cpu_reg = NULL;
static ggml_backend_reg_t g_rf_reg  = NULL;

// The build's paths, or RF_TEST_BIN_DIR / RF_TEST_LIB where the binaries were moved (the GPU machine).
static const char * bin_dir(void) {
    const char * d = getenv("RF_TEST_BIN_DIR");
    return d ? d : ROCMFORGE_BIN_DIR;
}

static const char * rf_lib(void) {
    const char * l = getenv("RF_TEST_LIB");
    return l ? l : ROCMFORGE_LIB_PATH;
}

ggml_backend_dev_t rf_ggml_cpu_device(void) {
    static bool loaded = false;
    if (!loaded) {
        loaded = true;
        char path[4096];
        snprintf(path, sizeof path, "%s/libggml-cpu.so", bin_dir());
        g_cpu_reg = ggml_backend_load(path);
        if (!g_cpu_reg) {
            // GGML_CPU_ALL_VARIANTS builds name them libggml-cpu-<variant>.so: let ggml pick.
            ggml_backend_load_all_from_path(bin_dir());
        }
    }
    ggml_backend_dev_t dev = ggml_backend_dev_by_name("CPU");
    if (!dev) {
        fprintf(stderr, "ggml's CPU backend not found in %s\n", bin_dir());
        exit(2);
    }
    return dev;
}

ggml_backend_reg_t rf_rocmforge_reg(void) {
    if (!g_rf_reg) {
        g_rf_reg = ggml_backend_load(rf_lib());
        if (!g_rf_reg) {
            fprintf(stderr, "ggml_backend_load(%s) failed\n", rf_lib());
            exit(2);
        }
    }
    return g_rf_reg;
}

ggml_backend_dev_t rf_device_by_name(const char * name) {
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
        if (dev && strcmp(ggml_backend_dev_name(dev), name) == 0) {
            return dev;
        }
    }
    fprintf(stderr, "device %s not found in the rocmforge registry\n", name);
    exit(2);
}

ggml_backend_dev_t rf_rfcpu_device(void) {
    return rf_device_by_name("RFCPU");
}

void rf_set_n_threads(ggml_backend_t backend, int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : NULL;
    if (!reg) {
        return;
    }
    ggml_backend_set_n_threads_t fn =
        (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (fn) {
        fn(backend, n_threads);
    }
}

uint64_t rf_rand_u64(uint64_t * s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float rf_rand_uniform(uint64_t * s, float lo, float hi) {
    double u = (double) (rf_rand_u64(s) >> 11) / (double) (1ull << 53);
    return (float) (lo + (hi - lo) * u);
}

void rf_fill_tensor(struct ggml_tensor * t, uint64_t seed, float lo, float hi) {
    const int64_t n = ggml_nelements(t);
    const size_t nbytes = ggml_nbytes(t);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
    float * f = malloc(sizeof(float) * (size_t) (n > 0 ? n : 1));
    void * buf = malloc(nbytes > 0 ? nbytes : 1);
    for (int64_t i = 0; i < n; i++) {
        f[i] = rf_rand_uniform(&s, lo, hi);
    }
    switch (t->type) {
        case GGML_TYPE_F32: memcpy(buf, f, nbytes); break;
        case GGML_TYPE_F16: ggml_fp32_to_fp16_row(f, buf, n); break;
        case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(f, buf, n); break;
        case GGML_TYPE_I32:
            for (int64_t i = 0; i < n; i++) ((int32_t *) buf)[i] = (int32_t) floorf(f[i]);
            break;
        case GGML_TYPE_I64:
            for (int64_t i = 0; i < n; i++) ((int64_t *) buf)[i] = (int64_t) floorf(f[i]);
            break;
        default: {
            // IQ2_XXS, IQ2_XS and IQ1_S quantize only with an importance matrix: a flat one.
            float * imatrix = NULL;
            if (ggml_quantize_requires_imatrix(t->type)) {
                imatrix = malloc(sizeof(float) * (size_t) t->ne[0]);
                for (int64_t i = 0; i < t->ne[0]; i++) imatrix[i] = 1.0f;
            }
            ggml_quantize_chunk(t->type, f, buf, 0, ggml_nrows(t), t->ne[0], imatrix);
            free(imatrix);
            break;
        }
    }
    ggml_backend_tensor_set(t, buf, 0, nbytes);
    free(buf);
    free(f);
}

static void row_to_float(enum ggml_type type, const void * src, float * dst, int64_t n) {
    switch (type) {
        case GGML_TYPE_F32: memcpy(dst, src, sizeof(float) * (size_t) n); break;
        case GGML_TYPE_F16: ggml_fp16_to_fp32_row(src, dst, n); break;
        case GGML_TYPE_BF16: ggml_bf16_to_fp32_row(src, dst, n); break;
        case GGML_TYPE_I32:
            for (int64_t i = 0; i < n; i++) dst[i] = (float) ((const int32_t *) src)[i];
            break;
        case GGML_TYPE_I64:
            for (int64_t i = 0; i < n; i++) dst[i] = (float) ((const int64_t *) src)[i];
            break;
        default: ggml_get_type_traits(type)->to_float(src, dst, n); break;
    }
}

float * rf_tensor_to_float(const struct ggml_tensor * t) {
    const size_t nbytes = ggml_nbytes(t);
    uint8_t * raw = malloc(nbytes > 0 ? nbytes : 1);
    ggml_backend_tensor_get(t, raw, 0, nbytes);
    const int64_t n = ggml_nelements(t);
    float * out = malloc(sizeof(float) * (size_t) (n > 0 ? n : 1));
    const int64_t ne0 = t->ne[0];
    const bool dense_rows = t->nb[0] == ggml_type_size(t->type) || ggml_blck_size(t->type) > 1;
    float * tmp = malloc(sizeof(float) * (size_t) (ne0 > 0 ? ne0 : 1));
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                const uint8_t * row = raw + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                if (dense_rows) {
                    row_to_float(t->type, row, out + k, ne0);
                } else {
                    for (int64_t i0 = 0; i0 < ne0; i0++) {
                        row_to_float(t->type, row + i0 * t->nb[0], tmp + i0, 1);
                        out[k + i0] = tmp[i0];
                    }
                }
                k += ne0;
            }
        }
    }
    free(tmp);
    free(raw);
    return out;
}

double rf_nmse(const float * a, const float * b, size_t n) {
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        const bool fa = isfinite(a[i]), fb = isfinite(b[i]);
        if (!fa || !fb) {
            // Both infinite with the same sign is agreement; any NaN or a lone Inf is not.
            if (isinf(a[i]) && isinf(b[i]) && (a[i] > 0) == (b[i] > 0)) {
                continue;
            }
            return INFINITY;
        }
        const double d = (double) a[i] - (double) b[i];
        err += d * d;
        ref += (double) b[i] * (double) b[i];
    }
    if (ref == 0.0) {
        return err == 0.0 ? 0.0 : err;
    }
    return err / ref;
}

enum ggml_status rf_compute(ggml_backend_t backend, struct ggml_cgraph * graph) {
    return ggml_backend_graph_compute(backend, graph);
}

double rf_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

int rf_thread_count(void) {
    DIR * d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    struct dirent * e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.') n++;
    }
    closedir(d);
    return n;
}

int rf_wait_thread_count(int target, int timeout_ms) {
    double end = rf_now_ms() + timeout_ms;
    int n = rf_thread_count();
    while (n > target && rf_now_ms() < end) {
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
        n = rf_thread_count();
    }
    return n;
}

ggml_backend_dev_t rf_first_gpu_device(void) {
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, i);
        if (strncmp(ggml_backend_dev_name(d), "RFGPU", 5) == 0) return d;
    }
    return NULL;
}
