// test_load_cycles: the library loaded and unloaded many times (ggml_backend_load /
// ggml_backend_unload, as a host that probes backends does), with an RFCPU backend created,
// used for a small graph and freed each time. Afterwards no thread of ours is left running
// and the resident memory has not grown (within 1 MiB after the first cycles). Run under
// LeakSanitizer by scripts/sanitize.sh.
//   test_load_cycles [cycles]      (default 100)
#include "common.h"

#include <stdlib.h>
#include <string.h>


// Resident set in KiB (VmRSS of /proc/self/status).
static long rss_kib(void) {
    FILE * f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    }
    fclose(f);
    return kib;
}

static const char * lib_path(void) {
    const char * l = getenv("RF_TEST_LIB");
    return l ? l : ROCMFORGE_LIB_PATH;
}

// One load / backend / graph / free / unload cycle. False on any failure.
static bool cycle(void) {
    ggml_backend_reg_t reg = ggml_backend_load(lib_path());
    if (!reg) return false;
    ggml_backend_dev_t dev = NULL;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, i);
        if (strcmp(ggml_backend_dev_name(d), "RFCPU") == 0) dev = d;
    }
    bool ok = dev != NULL;
    ggml_backend_t be = dev ? ggml_backend_dev_init(dev, NULL) : NULL;
    ok = ok && be != NULL;
    if (be) {
        rf_set_n_threads(be, 3);
        struct ggml_init_params ip = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 64);
        struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 64);
        struct ggml_tensor * c = ggml_mul_mat(ctx, a, b);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, c);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        ok = ok && buf != NULL;
        if (buf) {
            rf_fill_tensor(a, 1, -1, 1);
            rf_fill_tensor(b, 2, -1, 1);
            ok = ok && ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS;
            ggml_backend_buffer_free(buf);
        }
        ggml_free(ctx);
        ggml_backend_free(be);
    }
    ggml_backend_unload(reg);
    return ok;
}

int main(int argc, char ** argv) {
    int cycles = argc > 1 ? atoi(argv[1]) : 100;
    int threads0 = rf_thread_count();
    CHECK(cycle(), "first cycle");
    // The first cycles settle what stays for the process (the dynamic loader's and libc's
    // caches, ggml's registry); from then on nothing may grow.
    for (int i = 0; i < 4; i++) CHECK(cycle(), "warm-up cycle %d", i);
    long rss0 = rss_kib();
    int threads1 = rf_wait_thread_count(threads0, 2000);
    double t0 = rf_now_ms();
    for (int i = 0; i < cycles; i++) {
        if (!cycle()) {
            CHECK(false, "cycle %d failed", i);
            break;
        }
        int now = rf_wait_thread_count(threads1, 2000);
        CHECK(now == threads1, "cycle %d: %d threads, %d before", i, now, threads1);
    }
    long rss1 = rss_kib();
    // Whether the dynamic loader really unmapped the library (informational: glibc keeps a
    // library that registered thread-local destructors).
    bool mapped = false;
    FILE * maps = fopen("/proc/self/maps", "r");
    char line[512];
    while (maps && fgets(line, sizeof line, maps)) {
        if (strstr(line, "libggml-rocmforge")) mapped = true;
    }
    if (maps) fclose(maps);
    printf("test_load_cycles: the library is %s after the last unload\n", mapped ? "still mapped" : "unmapped");
    printf("test_load_cycles: %d cycles in %.1f s; threads %d at start, %d after; RSS %ld -> %ld KiB\n",
           cycles, (rf_now_ms() - t0) / 1e3, threads0, rf_thread_count(), rss0, rss1);
    int left = rf_wait_thread_count(threads0, 2000);
    CHECK(left == threads0, "threads left running: %d, %d at start", left, threads0);
    CHECK(rss1 - rss0 <= 1024, "RSS grew by %ld KiB over %d cycles", rss1 - rss0, cycles);
    return rf_finish("test_load_cycles");
}
