// test_offload: a model split between RFGPU0 and RFCPU (llama's -ngl N), as ggml's scheduler
// runs it. Weights live in an RFCPU buffer marked as weights; a product over a large batch
// (a prompt) must run on RFGPU0 (offload_op: the scheduler copies the weights over), one over
// a small batch (a token) on RFCPU where the weights are. Every result against ggml-cpu.
// The weights also come from RFCPU buffers over host memory the caller owns
// (buffer_from_host_ptr over malloc'd memory and over a read-only file mapping, as libllama's
// mmap'd weights): the library page-locks those for the GPU, and the copies must still be right.
// Without a GPU it prints "skipped: no GPU" and exits 0.
#include "common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct net {
    struct ggml_context * ctx;
    struct ggml_cgraph * gf;
    struct ggml_tensor *x, *mm, *out;
};

struct weights {
    struct ggml_context * ctx;
    ggml_backend_buffer_t buf;
    struct ggml_tensor *w, *norm;
    void * mem;       // malloc'd memory under buf (host-pointer weights), else NULL
    void * map;       // read-only file mapping under buf, else NULL
    size_t map_size;
};

// Where the weights' memory comes from.
enum source { FROM_BUFT, FROM_MALLOC, FROM_MMAP };
static const char * const source_names[] = { "RFCPU buffer", "host pointer (malloc)", "host pointer (mmap, read-only)" };

enum { K = 256, M = 192 };

static void weights_tensors(struct weights * w, enum ggml_type t) {
    memset(w, 0, sizeof(*w));
    struct ggml_init_params ip = { ggml_tensor_overhead() * 4, NULL, true };
    w->ctx = ggml_init(ip);
    w->w = ggml_new_tensor_2d(w->ctx, t, K, M);
    w->norm = ggml_new_tensor_1d(w->ctx, GGML_TYPE_F32, M);
}

static void weights_make(struct weights * w, ggml_backend_buffer_type_t buft, enum ggml_type t) {
    weights_tensors(w, t);
    w->buf = ggml_backend_alloc_ctx_tensors_from_buft(w->ctx, buft);
    ggml_backend_buffer_set_usage(w->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    rf_fill_tensor(w->w, 21, -1, 1);
    rf_fill_tensor(w->norm, 22, 0.5f, 1.5f);
}

// The weight tensor at offset 0, the norm at `norm_at` of an RFCPU buffer over `mem`.
static bool weights_over(struct weights * w, void * mem, size_t size, size_t norm_at) {
    w->buf = ggml_backend_dev_buffer_from_host_ptr(rf_rfcpu_device(), mem, size, size);
    CHECK(w->buf != NULL, "buffer_from_host_ptr (%zu bytes)", size);
    if (!w->buf) return false;
    ggml_backend_buffer_set_usage(w->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    CHECK(ggml_backend_tensor_alloc(w->buf, w->w, mem) == GGML_STATUS_SUCCESS, "tensor_alloc w");
    CHECK(ggml_backend_tensor_alloc(w->buf, w->norm, (char *) mem + norm_at) == GGML_STATUS_SUCCESS,
          "tensor_alloc norm");
    return true;
}

static void weights_free(struct weights * w) {
    if (w->buf) ggml_backend_buffer_free(w->buf);
    ggml_free(w->ctx);
    free(w->mem);
    if (w->map) munmap(w->map, w->map_size);
}

// Weights in host memory the caller owns: malloc'd (filled through the buffer), or a file
// of the same bytes mapped read-only. 3 MiB of memory with the tensors in its middle, so the
// pages registered stretch past them.
static bool weights_from_host(struct weights * w, enum ggml_type t, enum source src) {
    weights_tensors(w, t);
    size_t norm_at = (ggml_nbytes(w->w) + 63) & ~(size_t) 63;
    size_t size = norm_at + ggml_nbytes(w->norm);
    size_t pad = 1 << 20, total = size + 2 * pad;
    char * mem = malloc(total);
    CHECK(mem != NULL, "malloc");
    if (!mem) return false;
    w->mem = mem;
    // 64-aligned start inside the allocation, deliberately not page-aligned.
    char * at = (char *) (((uintptr_t) mem + pad + 63) & ~(uintptr_t) 63) + 64;
    if (!weights_over(w, at, size, norm_at)) return false;
    rf_fill_tensor(w->w, 21, -1, 1);
    rf_fill_tensor(w->norm, 22, 0.5f, 1.5f);
    if (src == FROM_MALLOC) return true;
    char path[] = "/tmp/rf_offload_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return false;
    unlink(path);
    size_t skip = (size_t) (at - mem);
    bool wrote = write(fd, mem, total) == (ssize_t) total;
    CHECK(wrote, "write weights file");
    void * map = wrote ? mmap(NULL, total, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    CHECK(map != MAP_FAILED, "mmap");
    // Fresh tensors (those above still name the malloc'd buffer) over the mapping.
    weights_free(w);
    weights_tensors(w, t);
    if (map == MAP_FAILED) return false;
    w->map = map;
    w->map_size = total;
    return weights_over(w, (char *) map + skip, size, norm_at);
}

static void net_build(struct net * m, const struct weights * w, int n) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true };
    m->ctx = ggml_init(ip);
    m->x = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F32, K, n);
    ggml_set_input(m->x);
    m->mm = ggml_mul_mat(m->ctx, w->w, m->x);
    m->out = ggml_mul(m->ctx, ggml_rms_norm(m->ctx, m->mm, 1e-5f), w->norm);
    ggml_set_output(m->out);
    m->gf = ggml_new_graph(m->ctx);
    ggml_build_forward_expand(m->gf, m->out);
}

// The same graph on ggml-cpu alone.
static float * reference(ggml_backend_t cpu, enum ggml_type t, int n) {
    struct weights w;
    weights_make(&w, ggml_backend_get_default_buffer_type(cpu), t);
    struct net m;
    net_build(&m, &w, n);
    ggml_backend_buffer_t b = ggml_backend_alloc_ctx_tensors(m.ctx, cpu);
    rf_fill_tensor(m.x, 23 + n, -1, 1);
    CHECK(ggml_backend_graph_compute(cpu, m.gf) == GGML_STATUS_SUCCESS, "reference compute");
    float * out = rf_tensor_to_float(m.out);
    ggml_backend_buffer_free(b);
    ggml_free(m.ctx);
    ggml_backend_buffer_free(w.buf);
    ggml_free(w.ctx);
    return out;
}

static void run_case(ggml_backend_t gpu, ggml_backend_t rf, ggml_backend_t cpu, enum ggml_type t, int n,
                     bool want_on_gpu, enum source src) {
    float * want = reference(cpu, t, n);
    struct weights w;
    if (src == FROM_BUFT) {
        weights_make(&w, ggml_backend_get_default_buffer_type(rf), t);
    } else if (!weights_from_host(&w, t, src)) {
        weights_free(&w);
        free(want);
        return;
    }
    printf("weights: %s\n", source_names[src]);
    ggml_backend_t backends[2] = { gpu, rf };
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, NULL, 2, GGML_DEFAULT_GRAPH_SIZE, false, true);
    CHECK(sched != NULL, "sched_new");
    for (int run = 0; run < 2; run++) {
        struct net m;
        net_build(&m, &w, n);
        CHECK(ggml_backend_sched_alloc_graph(sched, m.gf), "sched_alloc_graph");
        rf_fill_tensor(m.x, 23 + n, -1, 1);
        CHECK(ggml_backend_sched_graph_compute(sched, m.gf) == GGML_STATUS_SUCCESS, "sched compute");
        ggml_backend_t where = ggml_backend_sched_get_tensor_backend(sched, m.mm);
        float * got = rf_tensor_to_float(m.out);
        double e = rf_nmse(got, want, (size_t) ggml_nelements(m.out));
        printf("%s n=%-3d run %d: product on %s, %d split(s), nmse vs ggml-cpu %.3g\n", ggml_type_name(t), n, run,
               where ? ggml_backend_name(where) : "(none)", ggml_backend_sched_get_n_splits(sched), e);
        CHECK(where == (want_on_gpu ? gpu : rf), "%s n=%d: product on %s, want %s", ggml_type_name(t), n,
              where ? ggml_backend_name(where) : "(none)", want_on_gpu ? "the GPU" : "RFCPU");
        CHECK(e < 5e-4, "%s n=%d nmse %g", ggml_type_name(t), n, e);
        free(got);
        ggml_backend_sched_reset(sched);
        ggml_free(m.ctx);
    }
    ggml_backend_sched_free(sched);
    weights_free(&w);
    free(want);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    ggml_backend_dev_t gpu_dev = rf_first_gpu_device();
    if (!gpu_dev) {
        printf("skipped: no GPU (no RFGPU device in the rocmforge registry)\n");
        return 0;
    }
    ggml_backend_t gpu = ggml_backend_dev_init(gpu_dev, NULL);
    ggml_backend_t rf = ggml_backend_dev_init(rf_rfcpu_device(), NULL);
    ggml_backend_t cpu = ggml_backend_dev_init(rf_ggml_cpu_device(), NULL);
    CHECK(gpu && rf && cpu, "backends");
    if (!gpu || !rf || !cpu) return rf_finish("test_offload");
    rf_set_n_threads(rf, 4);
    rf_set_n_threads(cpu, 4);

    const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        run_case(gpu, rf, cpu, types[i], 64, true, FROM_BUFT);   // a prompt's batch: copied to the GPU
        run_case(gpu, rf, cpu, types[i], 512, true, FROM_BUFT);
        run_case(gpu, rf, cpu, types[i], 8, false, FROM_BUFT);   // a few tokens: stays with its weights
        run_case(gpu, rf, cpu, types[i], 1, false, FROM_BUFT);
    }
    // Host-pointer weights (pinned for the GPU where the driver allows).
    const enum ggml_type host_types[] = { GGML_TYPE_F32, GGML_TYPE_Q4_0 };
    for (size_t i = 0; i < sizeof(host_types) / sizeof(host_types[0]); i++) {
        for (int src = FROM_MALLOC; src <= FROM_MMAP; src++) {
            run_case(gpu, rf, cpu, host_types[i], 512, true, (enum source) src);
            run_case(gpu, rf, cpu, host_types[i], 1, false, (enum source) src);
        }
    }
    ggml_backend_free(gpu);
    ggml_backend_free(rf);
    ggml_backend_free(cpu);
    return rf_finish("test_offload");
}
