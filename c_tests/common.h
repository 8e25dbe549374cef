// Helpers shared by the C tests: loading the two backends, checks, deterministic data.
#ifndef RF_TEST_COMMON_H
#define RF_TEST_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#ifndef ROCMFORGE_LIB_PATH
#error "ROCMFORGE_LIB_PATH must be defined (path of libggml-rocmforge.so)"
#endif
#ifndef ROCMFORGE_BIN_DIR
#error "ROCMFORGE_BIN_DIR must be defined (directory of ggml's libraries)"
#endif

extern int rf_failures;

// Records a failure (and prints where) when `cond` is false; never aborts.
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            rf_failures++;                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
        }                                                                       \
    } while (0)

// Prints PASS/FAIL with the failure count and returns the process exit status.
int rf_finish(const char * test_name);

// ggml's own CPU device, loaded from bin/libggml-cpu.so (it is a DL backend). Never NULL:
// exits the test when missing.
ggml_backend_dev_t rf_ggml_cpu_device(void);

// rocmforge's registry, loaded with ggml_backend_load like any DL backend (once).
ggml_backend_reg_t rf_rocmforge_reg(void);
// RFCPU, from that registry. Exits when missing.
ggml_backend_dev_t rf_rfcpu_device(void);
// The rocmforge device called `name` (exits when absent).
ggml_backend_dev_t rf_device_by_name(const char * name);

// Sets the thread count through the registry's "ggml_backend_set_n_threads" proc address.
void rf_set_n_threads(ggml_backend_t backend, int n_threads);

// Deterministic pseudo-random numbers (xorshift), so both backends get the same data.
uint64_t rf_rand_u64(uint64_t * state);
float rf_rand_uniform(uint64_t * state, float lo, float hi);

// Fills `t` (allocated, any type; quantized types are quantized from random floats in
// [lo, hi]) with data derived from `seed`.
void rf_fill_tensor(struct ggml_tensor * t, uint64_t seed, float lo, float hi);
// Copies `t` into a new float array (quantized, F16, BF16 dequantized; I32/I64 converted).
// Caller frees. Handles non-contiguous tensors.
float * rf_tensor_to_float(const struct ggml_tensor * t);

// sum((a-b)^2) / sum(b^2); NaN/Inf positions must agree or the result is INFINITY.
double rf_nmse(const float * a, const float * b, size_t n);

// Runs `graph` on `backend` and returns its status.
enum ggml_status rf_compute(ggml_backend_t backend, struct ggml_cgraph * graph);

// Monotonic clock in milliseconds.
double rf_now_ms(void);

// Threads of this process now (entries of /proc/self/task); -1 where that cannot be read.
int rf_thread_count(void);

// The thread count once it is at most `target`, polled for up to `timeout_ms`: a joined
// thread leaves /proc/self/task a moment after pthread_join returns.
int rf_wait_thread_count(int target, int timeout_ms);

// The first RFGPU device of rocmforge's registry, or NULL without a GPU.
ggml_backend_dev_t rf_first_gpu_device(void);

#endif
