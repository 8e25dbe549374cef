// test_gpu_io: the GPU device's buffers and asynchronous paths, through ggml's public API.
//   1. device caps and the pinned host buffer type (RFGPU0_Host): host memory that ggml-cpu and
//      RFCPU compute on directly;
//   2. buffer_from_host_ptr: host memory (read-write, and a read-only file mapping as mmap'd
//      weights are) wrapped without a copy, read back and read by a GPU matrix product; a NULL
//      is accepted where the driver cannot use host pointers (printed);
//   3. set_tensor_async / get_tensor_async round trips (pageable and pinned host memory);
//   4. cpy_tensor_async between two RFGPU0 backends (and within one), ordered after a long
//      computation on the source backend;
//   5. events: a backend waiting for another's event reads the finished result, and
//      event_synchronize makes an asynchronous read-back visible on the host;
//   6. ggml_backend_sched over [RFGPU0, ggml-cpu] (with and without pipeline copies) against
//      ggml-cpu alone.
//   7. with a second GPU device: cpy_tensor_async and tensor_copy between the two, both ways
//      (skipped with one).
//   8. a graph computed again and again (launched, captured, replayed) follows new inputs and
//      a changed op parameter, and a repeated graph whose node became unsupported is refused
//      (the per-node checks are skipped only for a graph equal to the last one).
//   9. small synchronous writes (staged: the call returns before the copy runs) are seen by
//      every reader in order: read-backs, writes larger than the staging size over them and
//      under them, a memset, a buffer-to-buffer copy, a graph; many of them cycle the staging
//      memory, the caller's memory is reused at once, and a buffer freed right after one.
// Without a GPU it prints "skipped: no GPU" and exits 0, like test_ops --gpus and gpu_smoke.
#include "common.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static ggml_backend_dev_t g_gpu;
static ggml_backend_dev_t g_cpu_dev;

static struct ggml_context * new_ctx(int n_tensors) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * (size_t) n_tensors + ggml_graph_overhead() * 4, NULL, true };
    return ggml_init(ip);
}

static int count_diff(const float * a, const float * b, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != b[i];
    return bad;
}

// ---- 1. caps and the pinned host buffer type -----------------------------------------------

static void test_host_buffer(void) {
    struct ggml_backend_dev_props p;
    ggml_backend_dev_get_props(g_gpu, &p);
    printf("caps: async %d host_buffer %d buffer_from_host_ptr %d events %d mmap %d\n", p.caps.async,
           p.caps.host_buffer, p.caps.buffer_from_host_ptr, p.caps.events, p.caps.mmap_support);
    CHECK(p.caps.async && p.caps.host_buffer && p.caps.events && p.caps.mmap_support, "GPU caps");
    CHECK(!p.caps.buffer_from_host_ptr, "buffer_from_host_ptr is not advertised (libllama would keep GPU weights in host memory)");

    ggml_backend_buffer_type_t hbt = ggml_backend_dev_host_buffer_type(g_gpu);
    CHECK(hbt != NULL, "host buffer type");
    if (!hbt) return;
    char want_name[64];
    snprintf(want_name, sizeof want_name, "%s_Host", ggml_backend_dev_name(g_gpu));
    printf("host buffer type: %s\n", ggml_backend_buft_name(hbt));
    CHECK(strcmp(ggml_backend_buft_name(hbt), want_name) == 0, "name %s", ggml_backend_buft_name(hbt));
    CHECK(ggml_backend_buft_is_host(hbt), "is_host");
    CHECK(ggml_backend_buft_get_device(hbt) == g_gpu, "device of the host buffer type");
    CHECK(!ggml_backend_dev_supports_buft(g_gpu, hbt), "the GPU computes on device memory only");

    ggml_backend_dev_t rfcpu = rf_rfcpu_device();
    ggml_backend_dev_t cpus[2] = { g_cpu_dev, rfcpu };
    for (int c = 0; c < 2; c++) {
        const char * cname = ggml_backend_dev_name(cpus[c]);
        CHECK(ggml_backend_dev_supports_buft(cpus[c], hbt), "%s accepts the pinned host buffer type", cname);
        // a*b + a on the CPU backend, every tensor (inputs, nodes) in pinned memory.
        struct ggml_context * ctx = new_ctx(8);
        struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 333, 7);
        struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 333, 7);
        struct ggml_tensor * y = ggml_add(ctx, ggml_mul(ctx, a, b), a);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, y);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, hbt);
        CHECK(buf != NULL && ggml_backend_buffer_is_host(buf), "pinned buffer");
        if (!buf) { ggml_free(ctx); continue; }
        CHECK((uintptr_t) a->data % ggml_backend_buft_get_alignment(hbt) == 0, "alignment");
        rf_fill_tensor(a, 1, -1, 1);
        // Host memory: written through the pointer as well as through ggml.
        float * bd = (float *) b->data;
        for (int i = 0; i < 333 * 7; i++) bd[i] = (float) (i % 13) - 6.0f;
        float * av = rf_tensor_to_float(a);
        CHECK(memcmp(av, a->data, ggml_nbytes(a)) == 0, "tensor_get equals the memory itself");
        ggml_backend_t be = ggml_backend_dev_init(cpus[c], NULL);
        CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS, "%s compute on pinned memory", cname);
        int bad = 0;
        for (int i = 0; i < 333 * 7; i++) bad += ((float *) y->data)[i] != av[i] * bd[i] + av[i];
        printf("%s on %s: %d mismatches\n", cname, ggml_backend_buft_name(hbt), bad);
        CHECK(bad == 0, "%s result on pinned memory", cname);
        free(av);
        ggml_backend_free(be);
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }
}

// ---- 2. buffer_from_host_ptr -----------------------------------------------------------------

enum { HK = 64, HM = 32, HN = 8 };

// y = W x on the GPU with W in the wrapped host memory at `wptr`; compared with a plain loop.
static void gpu_reads_host_memory(ggml_backend_t be, void * wptr, size_t wsize, const char * what) {
    ggml_backend_buffer_t hb = ggml_backend_dev_buffer_from_host_ptr(g_gpu, wptr, wsize, wsize);
    if (!hb) {
        printf("buffer_from_host_ptr (%s): NULL; this driver/device cannot use the host pointer itself (allowed)\n", what);
        return;
    }
    CHECK(ggml_backend_buffer_get_base(hb) == wptr, "base is the host pointer");
    CHECK(ggml_backend_buffer_get_size(hb) == wsize, "size");
    struct ggml_context * wctx = new_ctx(2);
    struct ggml_tensor * w = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, HK, HM);
    CHECK(ggml_backend_tensor_alloc(hb, w, wptr) == GGML_STATUS_SUCCESS, "tensor in the wrapped memory");
    float * wv = rf_tensor_to_float(w);
    CHECK(memcmp(wv, wptr, ggml_nbytes(w)) == 0, "%s: tensor_get reads the host data", what);

    struct ggml_context * ctx = new_ctx(4);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, HK, HN);
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t db = ggml_backend_alloc_ctx_tensors(ctx, be);
    rf_fill_tensor(x, 7, -1, 1);
    float * xv = rf_tensor_to_float(x);
    CHECK(ggml_backend_dev_supports_op(g_gpu, y), "GPU claims the F32 mul_mat");
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS, "%s: GPU compute reading host memory", what);
    float * yv = rf_tensor_to_float(y);
    float want[HM * HN];
    for (int j = 0; j < HN; j++)
        for (int i = 0; i < HM; i++) {
            double s = 0;
            for (int k = 0; k < HK; k++) s += (double) wv[i * HK + k] * xv[j * HK + k];
            want[j * HM + i] = (float) s;
        }
    double e = rf_nmse(yv, want, HM * HN);
    printf("buffer_from_host_ptr (%s): GPU mul_mat reading it: nmse %.3g\n", what, e);
    CHECK(e < 1e-6, "%s: nmse %g", what, e);
    free(wv);
    free(xv);
    free(yv);
    ggml_backend_buffer_free(db);
    ggml_free(ctx);
    ggml_backend_buffer_free(hb);
    ggml_free(wctx);
}

static void test_buffer_from_host_ptr(ggml_backend_t be) {
    const size_t wsize = sizeof(float) * HK * HM;
    uint64_t s = 99;
    float * w = NULL;
    CHECK(posix_memalign((void **) &w, 4096, wsize) == 0, "posix_memalign");
    for (int i = 0; i < HK * HM; i++) w[i] = rf_rand_uniform(&s, -1, 1);
    gpu_reads_host_memory(be, w, wsize, "malloc'd, read-write");

    // A read-only file mapping, like libllama's mmap of a model (data at an offset inside it).
    char path[] = "/tmp/rf_gpu_io_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) { free(w); return; }
    const size_t off = 4096 + 256;
    char * zeros = calloc(1, off);
    CHECK(write(fd, zeros, off) == (ssize_t) off && write(fd, w, wsize) == (ssize_t) wsize, "write");
    void * map = mmap(NULL, off + wsize, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(map != MAP_FAILED, "mmap");
    if (map != MAP_FAILED) {
        gpu_reads_host_memory(be, (char *) map + off, wsize, "read-only file mapping");
        munmap(map, off + wsize);
    }
    close(fd);
    unlink(path);
    free(zeros);
    free(w);
}

// ---- 3. asynchronous set/get -------------------------------------------------------------

static void test_async_set_get(ggml_backend_t be) {
    const int n = 1 << 20;
    struct ggml_context * ctx = new_ctx(2);
    struct ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    ggml_backend_buffer_t db = ggml_backend_alloc_ctx_tensors(ctx, be);
    ggml_backend_buffer_type_t hbt = ggml_backend_dev_host_buffer_type(g_gpu);
    ggml_backend_buffer_t pin = hbt ? ggml_backend_buft_alloc_buffer(hbt, 2 * sizeof(float) * n) : NULL;
    CHECK(pin != NULL, "pinned staging buffer");
    float * heap_src = malloc(sizeof(float) * n), * heap_dst = malloc(sizeof(float) * n);
    for (int round = 0; round < 2 && pin; round++) {
        // round 0: pageable host memory; round 1: pinned (truly asynchronous DMA).
        float * src = round ? (float *) ggml_backend_buffer_get_base(pin) : heap_src;
        float * dst = round ? src + n : heap_dst;
        for (int i = 0; i < n; i++) src[i] = (float) (i ^ (round * 0x5555));
        memset(dst, 0, sizeof(float) * n);
        // Whole tensor, then an overlapping part at an offset, then everything back.
        ggml_backend_tensor_set_async(be, t, src, 0, sizeof(float) * n);
        ggml_backend_tensor_set_async(be, t, src + 1000, sizeof(float) * 500, sizeof(float) * 3000);
        ggml_backend_tensor_get_async(be, t, dst, 0, sizeof(float) * n);
        ggml_backend_synchronize(be);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const float want = (i >= 500 && i < 3500) ? src[1000 + i - 500] : src[i];
            bad += dst[i] != want;
        }
        printf("async set/get round trip (%s): %d mismatches\n", round ? "pinned" : "pageable", bad);
        CHECK(bad == 0, "async round trip %d", round);
    }
    free(heap_src);
    free(heap_dst);
    if (pin) ggml_backend_buffer_free(pin);
    ggml_backend_buffer_free(db);
    ggml_free(ctx);
}

// ---- 4 and 5. copies and events between two backends ----------------------------------------

enum { PK = 1024, PN = 1024, CHAIN = 40 };

struct chain {
    struct ggml_context *ctx, *ctx2;
    struct ggml_tensor *w, *x, *a, *a_alias, *b, *b2, *c, *d;
    struct ggml_cgraph *g_long, *g_c, *g_d;
    ggml_backend_buffer_t buf, buf2;
    int perm[PK];
    float * want_a;
};

// a = P^CHAIN x (P a permutation matrix: exact in any precision for small integers); the
// consumers c = 2a and d = 2b are graphs of their own (a_alias: a leaf on a's memory, so
// g_c does not recompute the chain). Every tensor has its own memory.
static void chain_build(struct chain * m, ggml_backend_t be) {
    m->ctx = new_ctx(CHAIN + 16);
    m->w = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F32, PK, PK);
    m->x = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F32, PK, PN);
    struct ggml_tensor * y = m->x;
    for (int i = 0; i < CHAIN; i++) y = ggml_mul_mat(m->ctx, m->w, y);
    m->a = y;
    m->b = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F32, PK, PN);
    m->b2 = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F32, PK, PN);
    m->g_long = ggml_new_graph(m->ctx);
    ggml_build_forward_expand(m->g_long, m->a);
    m->buf = ggml_backend_alloc_ctx_tensors(m->ctx, be);

    m->ctx2 = new_ctx(8);
    m->a_alias = ggml_new_tensor_2d(m->ctx2, GGML_TYPE_F32, PK, PN);
    ggml_backend_tensor_alloc(m->buf, m->a_alias, m->a->data);
    m->c = ggml_scale(m->ctx2, m->a_alias, 2.0f);
    m->d = ggml_scale(m->ctx2, m->b, 2.0f);
    m->g_c = ggml_new_graph(m->ctx2);
    ggml_build_forward_expand(m->g_c, m->c);
    m->g_d = ggml_new_graph(m->ctx2);
    ggml_build_forward_expand(m->g_d, m->d);
    m->buf2 = ggml_backend_alloc_ctx_tensors(m->ctx2, be);

    uint64_t s = 5;
    for (int i = 0; i < PK; i++) m->perm[i] = i;
    for (int i = PK - 1; i > 0; i--) {
        int j = (int) (rf_rand_u64(&s) % (uint64_t) (i + 1)), t = m->perm[i];
        m->perm[i] = m->perm[j];
        m->perm[j] = t;
    }
    float * w = calloc((size_t) PK * PK, sizeof(float));
    for (int i = 0; i < PK; i++) w[(size_t) i * PK + m->perm[i]] = 1.0f;  // row i picks x[perm[i]]
    ggml_backend_tensor_set(m->w, w, 0, ggml_nbytes(m->w));
    free(w);
    float * x = malloc(sizeof(float) * PK * PN);
    for (size_t i = 0; i < (size_t) PK * PN; i++) x[i] = (float) ((int) (rf_rand_u64(&s) % 17) - 8);
    ggml_backend_tensor_set(m->x, x, 0, ggml_nbytes(m->x));
    // want_a[j][i] = x[j][perm^CHAIN(i)]
    m->want_a = malloc(sizeof(float) * PK * PN);
    for (int i = 0; i < PK; i++) {
        int k = i;
        for (int r = 0; r < CHAIN; r++) k = m->perm[k];
        for (int j = 0; j < PN; j++) m->want_a[(size_t) j * PK + i] = x[(size_t) j * PK + k];
    }
    free(x);
}

static void chain_free(struct chain * m) {
    free(m->want_a);
    ggml_backend_buffer_free(m->buf2);
    ggml_free(m->ctx2);
    ggml_backend_buffer_free(m->buf);
    ggml_free(m->ctx);
}

// Mismatches of `t` against 2 * want_a.
static int check_double(struct ggml_tensor * t, const float * want_a) {
    float * v = rf_tensor_to_float(t);
    int bad = 0;
    for (size_t i = 0; i < (size_t) PK * PN; i++) bad += v[i] != 2.0f * want_a[i];
    free(v);
    return bad;
}

static void test_copies_and_events(ggml_backend_t be1, ggml_backend_t be2) {
    struct chain m;
    chain_build(&m, be1);
    CHECK(ggml_backend_supports_op(be1, m.a) && ggml_backend_supports_op(be1, m.c), "GPU claims mul_mat and scale");

    // Reference timing: how long the chain takes, so the checks below are known to race.
    double t0 = rf_now_ms();
    CHECK(ggml_backend_graph_compute(be1, m.g_long) == GGML_STATUS_SUCCESS, "chain");
    double t1 = rf_now_ms();
    float * a = rf_tensor_to_float(m.a);
    int bad = count_diff(a, m.want_a, (size_t) PK * PN);
    free(a);
    printf("chain of %d products on %s: %.2f ms, %d mismatches\n", CHAIN, ggml_backend_name(be1), t1 - t0, bad);
    CHECK(bad == 0, "chain result");

    // cpy_tensor_async be1 -> be2: the copy waits for be1's chain, be2's scale waits for the copy.
    ggml_backend_tensor_memset(m.a, 0, 0, ggml_nbytes(m.a));
    ggml_backend_tensor_memset(m.b, 0, 0, ggml_nbytes(m.b));
    t0 = rf_now_ms();
    CHECK(ggml_backend_graph_compute_async(be1, m.g_long) == GGML_STATUS_SUCCESS, "chain (async)");
    double t_queue = rf_now_ms() - t0;
    ggml_backend_tensor_copy_async(be1, be2, m.a, m.b);
    CHECK(ggml_backend_graph_compute_async(be2, m.g_d) == GGML_STATUS_SUCCESS, "d = 2b on be2");
    ggml_backend_synchronize(be2);
    bad = check_double(m.d, m.want_a);
    printf("graph_compute returned after %.3f ms (async); cpy_tensor_async be1->be2 then 2b on be2: %d mismatches\n", t_queue, bad);
    CHECK(bad == 0, "cpy_tensor_async between two backends");
    ggml_backend_synchronize(be1);

    // Within one backend.
    ggml_backend_tensor_memset(m.b2, 0, 0, ggml_nbytes(m.b2));
    ggml_backend_tensor_copy_async(be1, be1, m.a, m.b2);
    ggml_backend_synchronize(be1);
    float * b2 = rf_tensor_to_float(m.b2);
    bad = count_diff(b2, m.want_a, (size_t) PK * PN);
    free(b2);
    CHECK(bad == 0, "cpy_tensor_async within one backend: %d mismatches", bad);

    // Events: be2 waits for be1's event, then reads a directly.
    ggml_backend_event_t ev = ggml_backend_event_new(g_gpu);
    CHECK(ev != NULL, "event_new");
    if (ev) {
        ggml_backend_tensor_memset(m.a, 0, 0, ggml_nbytes(m.a));
        CHECK(ggml_backend_graph_compute_async(be1, m.g_long) == GGML_STATUS_SUCCESS, "chain (async)");
        ggml_backend_event_record(ev, be1);
        ggml_backend_event_wait(be2, ev);
        CHECK(ggml_backend_graph_compute_async(be2, m.g_c) == GGML_STATUS_SUCCESS, "c = 2a on be2");
        ggml_backend_synchronize(be2);
        bad = check_double(m.c, m.want_a);
        printf("event record on be1, wait on be2, 2a on be2: %d mismatches\n", bad);
        CHECK(bad == 0, "event wait orders be2 after be1");
        ggml_backend_synchronize(be1);

        // Control (informative only): the same without the wait shows the race is real.
        ggml_backend_tensor_memset(m.a, 0, 0, ggml_nbytes(m.a));
        ggml_backend_tensor_memset(m.c, 0, 0, ggml_nbytes(m.c));
        ggml_backend_graph_compute_async(be1, m.g_long);
        ggml_backend_graph_compute_async(be2, m.g_c);
        ggml_backend_synchronize(be2);
        ggml_backend_synchronize(be1);
        printf("  control without the wait: %d mismatches (expected many when the race is real)\n", check_double(m.c, m.want_a));

        // event_synchronize: an asynchronous read-back into pinned memory is complete after it.
        ggml_backend_buffer_type_t hbt = ggml_backend_dev_host_buffer_type(g_gpu);
        ggml_backend_buffer_t pin = ggml_backend_buft_alloc_buffer(hbt, ggml_nbytes(m.a));
        float * host = (float *) ggml_backend_buffer_get_base(pin);
        memset(host, 0, ggml_nbytes(m.a));
        ggml_backend_tensor_memset(m.a, 0, 0, ggml_nbytes(m.a));
        ggml_backend_graph_compute_async(be1, m.g_long);
        ggml_backend_tensor_get_async(be1, m.a, host, 0, ggml_nbytes(m.a));
        ggml_backend_event_record(ev, be1);
        ggml_backend_event_synchronize(ev);
        bad = count_diff(host, m.want_a, (size_t) PK * PN);
        printf("get_tensor_async + event_synchronize: %d mismatches\n", bad);
        CHECK(bad == 0, "event_synchronize waits for the read-back");
        ggml_backend_buffer_free(pin);
        ggml_backend_event_free(ev);
    }
    ggml_backend_synchronize(be1);
    ggml_backend_synchronize(be2);
    chain_free(&m);
}

// ---- 4b. copies between two GPU devices (peer copies) ----------------------------------------

// a computed on `src`'s device, copied to a tensor in `dst`'s device memory while the chain may
// still run (cpy_tensor_async orders it), then 2b on `dst`; and the same through the
// synchronous ggml_backend_tensor_copy.
static void test_peer_copies(ggml_backend_t src, ggml_backend_t dst) {
    struct chain m;
    chain_build(&m, src);
    struct ggml_context * ctx = new_ctx(4);
    struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, PK, PN);
    struct ggml_tensor * d = ggml_scale(ctx, b, 2.0f);
    struct ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, d);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, dst);
    CHECK(buf != NULL, "buffer on %s", ggml_backend_name(dst));
    if (buf) {
        ggml_backend_tensor_memset(m.a, 0, 0, ggml_nbytes(m.a));
        ggml_backend_tensor_memset(b, 0, 0, ggml_nbytes(b));
        CHECK(ggml_backend_graph_compute_async(src, m.g_long) == GGML_STATUS_SUCCESS, "chain on %s", ggml_backend_name(src));
        ggml_backend_tensor_copy_async(src, dst, m.a, b);
        CHECK(ggml_backend_graph_compute_async(dst, g) == GGML_STATUS_SUCCESS, "2b on %s", ggml_backend_name(dst));
        ggml_backend_synchronize(dst);
        int bad = check_double(d, m.want_a);
        printf("peer: chain on %s, cpy_tensor_async to %s, 2b there: %d mismatches\n", ggml_backend_name(src),
               ggml_backend_name(dst), bad);
        CHECK(bad == 0, "cpy_tensor_async between two GPU devices");
        ggml_backend_synchronize(src);

        ggml_backend_tensor_memset(b, 0, 0, ggml_nbytes(b));
        ggml_backend_tensor_copy(m.a, b);
        float * v = rf_tensor_to_float(b);
        bad = count_diff(v, m.want_a, (size_t) PK * PN);
        free(v);
        printf("peer: ggml_backend_tensor_copy %s -> %s: %d mismatches\n", ggml_backend_name(src), ggml_backend_name(dst), bad);
        CHECK(bad == 0, "tensor_copy between two GPU devices");
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
    chain_free(&m);
}

// ---- 6. the scheduler over [RFGPU0, ggml-cpu] ----------------------------------------------

typedef struct ggml_tensor * (*unary_fn)(struct ggml_context *, struct ggml_tensor *);

struct weights {
    struct ggml_context * ctx;
    ggml_backend_buffer_t buf;
    struct ggml_tensor *w1, *b1, *w2;
};

// A model's weights, in `be`'s memory (NULL: not allocated); w2 of type `t2`.
static void weights_make(struct weights * w, ggml_backend_t be, enum ggml_type t2) {
    w->ctx = new_ctx(4);
    w->w1 = ggml_new_tensor_2d(w->ctx, GGML_TYPE_F16, 256, 192);
    w->b1 = ggml_new_tensor_1d(w->ctx, GGML_TYPE_F32, 192);
    w->w2 = ggml_new_tensor_2d(w->ctx, t2, 192, 128);
    w->buf = be ? ggml_backend_alloc_ctx_tensors(w->ctx, be) : NULL;
    if (be) {
        rf_fill_tensor(w->w1, 21, -1, 1);
        rf_fill_tensor(w->b1, 22, -1, 1);
        rf_fill_tensor(w->w2, 23, -1, 1);
    }
}

static void weights_free(struct weights * w) {
    if (w->buf) ggml_backend_buffer_free(w->buf);
    ggml_free(w->ctx);
}

// One forward graph (built anew for every evaluation, as libllama does: the scheduler rewrites
// the sources of the nodes it splits). h and mid are outputs too, to locate a difference.
struct net {
    struct ggml_context * ctx;
    struct ggml_cgraph * gf;
    struct ggml_tensor *x, *h, *mid, *out;
};

static void net_build(struct net * m, const struct weights * w, unary_fn cpu_only) {
    m->ctx = new_ctx(32);
    m->x = ggml_new_tensor_2d(m->ctx, GGML_TYPE_F32, 256, 17);
    ggml_set_input(m->x);
    m->h = ggml_scale(m->ctx, ggml_add(m->ctx, ggml_mul_mat(m->ctx, w->w1, m->x), w->b1), 0.5f);
    m->mid = cpu_only(m->ctx, m->h);
    struct ggml_tensor * z = ggml_mul_mat(m->ctx, w->w2, m->mid);
    m->out = ggml_soft_max(m->ctx, ggml_scale(m->ctx, z, 0.25f));
    ggml_set_output(m->h);
    ggml_set_output(m->mid);
    ggml_set_output(m->out);
    m->gf = ggml_new_graph(m->ctx);
    ggml_build_forward_expand(m->gf, m->out);
}

static double nmse_of(struct ggml_tensor * got, struct ggml_tensor * want) {
    float * g = rf_tensor_to_float(got), * w = rf_tensor_to_float(want);
    double e = rf_nmse(g, w, (size_t) ggml_nelements(want));
    free(g);
    free(w);
    return e;
}

// nmse of one GPU mul_mat (weights of type t, [k, m] x [k, n]) against ggml-cpu.
static double gpu_mul_mat_nmse(ggml_backend_t gpu, ggml_backend_t cpu, enum ggml_type t, int k, int m, int n) {
    double e = INFINITY;
    float * r[2] = { NULL, NULL };
    ggml_backend_t bes[2] = { gpu, cpu };
    for (int i = 0; i < 2; i++) {
        struct ggml_context * ctx = new_ctx(4);
        struct ggml_tensor * w = ggml_new_tensor_2d(ctx, t, k, m), * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
        struct ggml_tensor * y = ggml_mul_mat(ctx, w, x);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, y);
        ggml_backend_buffer_t b = ggml_backend_alloc_ctx_tensors(ctx, bes[i]);
        rf_fill_tensor(w, 31, -1, 1);
        rf_fill_tensor(x, 32, -1, 1);
        ggml_backend_graph_compute(bes[i], gf);
        r[i] = rf_tensor_to_float(y);
        ggml_backend_buffer_free(b);
        ggml_free(ctx);
    }
    e = rf_nmse(r[0], r[1], (size_t) m * n);
    free(r[0]);
    free(r[1]);
    return e;
}

static void test_sched(ggml_backend_t gpu, ggml_backend_t cpu) {
    static const struct { const char * name; unary_fn fn; } candidates[] = {
        { "floor", ggml_floor }, { "trunc", ggml_trunc }, { "sin", ggml_sin }, { "cos", ggml_cos },
        { "sgn", ggml_sgn },     { "step", ggml_step },   { "tanh", ggml_tanh }, { "abs", ggml_abs },
    };
    unary_fn cpu_only = NULL;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !cpu_only; i++) {
        struct weights wp;
        struct net probe;
        weights_make(&wp, NULL, GGML_TYPE_F16);
        net_build(&probe, &wp, candidates[i].fn);
        if (!ggml_backend_dev_supports_op(g_gpu, probe.mid) && ggml_backend_dev_supports_op(g_cpu_dev, probe.mid)) {
            cpu_only = candidates[i].fn;
            printf("sched: op the GPU does not claim: %s\n", candidates[i].name);
        }
        ggml_free(probe.ctx);
        weights_free(&wp);
    }
    CHECK(cpu_only != NULL, "the GPU claims every candidate op; extend the list");

    // w2 F16 (as in models), then F32; the F32 case is required to agree only where the GPU's
    // F32 mul_mat of that shape agrees on its own (a kernel matter, not the scheduler's).
    const double direct_f32 = gpu_mul_mat_nmse(gpu, cpu, GGML_TYPE_F32, 192, 128, 17);
    printf("direct GPU mul_mat f32 [192,128] x [192,17] vs ggml-cpu: nmse %.3g\n", direct_f32);
    const enum ggml_type w2_types[2] = { GGML_TYPE_F16, GGML_TYPE_F32 };
    for (int ti = 0; ti < 2 && cpu_only; ti++) {
        const bool must = ti == 0 || direct_f32 < 1e-6;
        struct weights wg, wc;
        weights_make(&wg, gpu, w2_types[ti]);
        weights_make(&wc, cpu, w2_types[ti]);
        for (int parallel = 0; parallel < 2; parallel++) {
            ggml_backend_t backends[2] = { gpu, cpu };
            ggml_backend_sched_t sched = ggml_backend_sched_new(backends, NULL, 2, GGML_DEFAULT_GRAPH_SIZE, parallel, false);
            CHECK(sched != NULL, "sched_new");
            for (int run = 0; run < 3; run++) {
                struct net ref, m;
                net_build(&ref, &wc, cpu_only);
                ggml_backend_buffer_t rb = ggml_backend_alloc_ctx_tensors(ref.ctx, cpu);
                rf_fill_tensor(ref.x, 100 + run, -1, 1);
                ggml_backend_graph_compute(cpu, ref.gf);

                net_build(&m, &wg, cpu_only);
                ggml_backend_sched_reset(sched);
                CHECK(ggml_backend_sched_alloc_graph(sched, m.gf), "sched_alloc_graph");
                rf_fill_tensor(m.x, 100 + run, -1, 1);
                CHECK(ggml_backend_sched_graph_compute_async(sched, m.gf) == GGML_STATUS_SUCCESS, "sched compute");
                ggml_backend_sched_synchronize(sched);
                int on_gpu = 0, on_cpu = 0;
                for (int i = 0; i < ggml_graph_n_nodes(m.gf); i++) {
                    ggml_backend_t b = ggml_backend_sched_get_tensor_backend(sched, ggml_graph_node(m.gf, i));
                    on_gpu += b == gpu;
                    on_cpu += b == cpu;
                }
                const double eh = nmse_of(m.h, ref.h), em = nmse_of(m.mid, ref.mid), e = nmse_of(m.out, ref.out);
                printf("sched [%s, CPU] w2 %s parallel=%d run %d: %d splits, %d nodes on the GPU, %d on the CPU; nmse vs ggml-cpu: h %.3g, mid %.3g, out %.3g\n",
                       ggml_backend_name(gpu), ggml_type_name(w2_types[ti]), parallel, run, ggml_backend_sched_get_n_splits(sched), on_gpu,
                       on_cpu, eh, em, e);
                CHECK(ggml_backend_sched_get_n_splits(sched) >= 2 && on_gpu > 0 && on_cpu > 0, "graph split over both");
                CHECK(!must || (e < 1e-4 && eh < 1e-4), "sched vs ggml-cpu nmse %g (h %g)", e, eh);
                ggml_backend_buffer_free(rb);
                ggml_free(ref.ctx);
                ggml_free(m.ctx);
            }
            ggml_backend_sched_free(sched);
        }
        weights_free(&wg);
        weights_free(&wc);
    }
}

// ---- 8. repeated graphs ----------------------------------------------------------------------

static void test_repeated_graph(ggml_backend_t gpu) {
    struct ggml_context * ctx = new_ctx(8);
    struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 8);
    struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 8);
    struct ggml_tensor * sum = ggml_add(ctx, a, b);
    struct ggml_tensor * out = ggml_scale(ctx, sum, 0.5f);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, gpu);
    CHECK(buf != NULL, "repeated graph: buffer");
    if (!buf) {
        ggml_free(ctx);
        return;
    }
    float scale = 0.5f;
    for (int round = 0; round < 6; round++) {
        if (round == 4) {
            // A changed parameter: a new graph key, so checked, launched and captured again.
            scale = -3.0f;
            memcpy(out->op_params, &scale, sizeof(float));
        }
        rf_fill_tensor(a, 100 + round, -1, 1);
        rf_fill_tensor(b, 200 + round, -1, 1);
        enum ggml_status st = ggml_backend_graph_compute(gpu, gf);
        CHECK(st == GGML_STATUS_SUCCESS, "repeated graph round %d: status %d", round, st);
        float * fa = rf_tensor_to_float(a);
        float * fb = rf_tensor_to_float(b);
        float * fo = rf_tensor_to_float(out);
        int bad = 0;
        for (int i = 0; i < 64 * 8; i++) bad += fo[i] != (fa[i] + fb[i]) * scale;
        CHECK(bad == 0, "repeated graph round %d: %d of 512 values wrong", round, bad);
        free(fa);
        free(fb);
        free(fo);
    }
    // The same nodes, one now of a type the device does not take: refused, not run.
    sum->type = GGML_TYPE_I32;
    enum ggml_status st = ggml_backend_graph_compute(gpu, gf);
    CHECK(st != GGML_STATUS_SUCCESS, "repeated graph with an I32 ADD: status %d", st);
    sum->type = GGML_TYPE_F32;
    st = ggml_backend_graph_compute(gpu, gf);
    CHECK(st == GGML_STATUS_SUCCESS, "repeated graph restored: status %d", st);
    printf("repeated graph: 6 rounds (launched, captured, replayed, a new parameter), unsupported node refused\n");
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
}

// ---- 9. small synchronous writes -------------------------------------------------------------

enum { SMALL_N = 15000, SMALL_T = 48, BIG_N = 1 << 18 };

static void fill_pattern(float * v, int n, int seed) {
    for (int i = 0; i < n; i++) v[i] = (float) ((i * 7 + seed * 131) % 10007) - 5000.0f;
}

static void test_small_writes(ggml_backend_t be) {
    struct ggml_context * ctx = new_ctx(SMALL_T + 8);
    struct ggml_tensor * small[SMALL_T];
    for (int i = 0; i < SMALL_T; i++) small[i] = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, SMALL_N);  // 60 KB each
    struct ggml_tensor * big = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, BIG_N);                        // 1 MB
    struct ggml_tensor * dst = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, SMALL_N);
    struct ggml_tensor * out = ggml_scale(ctx, small[0], 2.0f);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    CHECK(buf != NULL, "small writes: buffer");
    if (!buf) {
        ggml_free(ctx);
        return;
    }
    float * src = malloc(sizeof(float) * BIG_N), * want = malloc(sizeof(float) * BIG_N), * got = malloc(sizeof(float) * BIG_N);
    // 48 writes of 60 KB (2.9 MB: the staging memory goes round several times); the source is
    // scribbled over right after each call, as a caller may.
    for (int i = 0; i < SMALL_T; i++) {
        fill_pattern(src, SMALL_N, i);
        ggml_backend_tensor_set(small[i], src, 0, sizeof(float) * SMALL_N);
        memset(src, 0xff, sizeof(float) * SMALL_N);
    }
    int bad = 0;
    for (int i = 0; i < SMALL_T; i++) {
        fill_pattern(want, SMALL_N, i);
        ggml_backend_tensor_get(small[i], got, 0, sizeof(float) * SMALL_N);
        bad += count_diff(got, want, SMALL_N);
    }
    CHECK(bad == 0, "small writes read back: %d values wrong", bad);
    // Big (synchronous) write, a small one inside it, a big one over that, a small one again.
    fill_pattern(want, BIG_N, 1000);
    ggml_backend_tensor_set(big, want, 0, sizeof(float) * BIG_N);
    fill_pattern(src, 4000, 1001);
    ggml_backend_tensor_set(big, src, sizeof(float) * 5000, sizeof(float) * 4000);
    memcpy(want + 5000, src, sizeof(float) * 4000);
    ggml_backend_tensor_get(big, got, 0, sizeof(float) * BIG_N);
    int bad1 = count_diff(got, want, BIG_N);
    fill_pattern(src, 4000, 1002);
    ggml_backend_tensor_set(big, src, sizeof(float) * 100000, sizeof(float) * 4000);
    fill_pattern(want, BIG_N, 1003);
    ggml_backend_tensor_set(big, want, 0, sizeof(float) * BIG_N);
    fill_pattern(src, 3000, 1004);
    ggml_backend_tensor_set(big, src, sizeof(float) * 200000, sizeof(float) * 3000);
    memcpy(want + 200000, src, sizeof(float) * 3000);
    // A memset over part of the last small write, then the values in order.
    ggml_backend_tensor_memset(big, 0, sizeof(float) * 201000, sizeof(float) * 500);
    memset(want + 201000, 0, sizeof(float) * 500);
    ggml_backend_tensor_get(big, got, 0, sizeof(float) * BIG_N);
    int bad2 = count_diff(got, want, BIG_N);
    CHECK(bad1 == 0 && bad2 == 0, "small and large writes in order: %d, %d values wrong", bad1, bad2);
    // A small write, then at once a copy to another tensor and a graph reading it.
    fill_pattern(src, SMALL_N, 2000);
    ggml_backend_tensor_set(small[0], src, 0, sizeof(float) * SMALL_N);
    ggml_backend_tensor_copy(small[0], dst);
    enum ggml_status st = ggml_backend_graph_compute(be, gf);
    CHECK(st == GGML_STATUS_SUCCESS, "small writes: graph status %d", st);
    ggml_backend_synchronize(be);
    ggml_backend_synchronize(be);  // nothing queued: returns at once
    ggml_backend_tensor_get(dst, got, 0, sizeof(float) * SMALL_N);
    int bad3 = count_diff(got, src, SMALL_N);
    ggml_backend_tensor_get(out, got, 0, sizeof(float) * SMALL_N);
    for (int i = 0; i < SMALL_N; i++) want[i] = src[i] * 2.0f;
    int bad4 = count_diff(got, want, SMALL_N);
    CHECK(bad3 == 0 && bad4 == 0, "small write then copy / graph: %d, %d values wrong", bad3, bad4);
    printf("small writes: %d staged-size writes read back, in order with large writes, memset, copy and a graph\n", SMALL_T);
    // A buffer freed right after a small write into it, then a new one.
    for (int round = 0; round < 3; round++) {
        ggml_backend_tensor_set(small[1], src, 0, sizeof(float) * SMALL_N);
        ggml_backend_buffer_free(buf);
        for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
            t->data = NULL;
            t->buffer = NULL;
        }
        buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        CHECK(buf != NULL, "small writes: buffer again");
        if (!buf) break;
    }
    if (buf) {
        fill_pattern(src, SMALL_N, 3000);
        ggml_backend_tensor_set(small[1], src, 0, sizeof(float) * SMALL_N);
        ggml_backend_tensor_get(small[1], got, 0, sizeof(float) * SMALL_N);
        CHECK(count_diff(got, src, SMALL_N) == 0, "small write into a new buffer");
        ggml_backend_buffer_free(buf);
    }
    free(src);
    free(want);
    free(got);
    ggml_free(ctx);
}

// More than the device has: NULL and a log line, never an abort; then the device still works.
static void test_out_of_memory(ggml_backend_t be) {
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(be);
    size_t free_b = 0, total_b = 0;
    ggml_backend_dev_memory(g_gpu, &free_b, &total_b);
    printf("out of memory: device reports %zu MiB free of %zu MiB\n", free_b >> 20, total_b >> 20);
    ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(buft, total_b + ((size_t) 1 << 30));
    CHECK(b == NULL, "more than the card's total memory: NULL");
    if (b) ggml_backend_buffer_free(b);
    // Below the total (so past the max_size check) but above what is free: the driver refuses.
    if (free_b + ((size_t) 256 << 20) < total_b) {
        b = ggml_backend_buft_alloc_buffer(buft, free_b + ((size_t) 256 << 20));
        CHECK(b == NULL, "more than the free memory: NULL");
        if (b) ggml_backend_buffer_free(b);
    }
    // The device is still usable.
    const float want[4] = { 1, 2, 3, 4 };
    float got[4] = { 0 };
    struct ggml_context * ctx = new_ctx(4);
    struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4);
    struct ggml_tensor * y = ggml_scale(ctx, x, 2.0f);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t ok = ggml_backend_alloc_ctx_tensors(ctx, be);
    CHECK(ok != NULL, "an allocation after the failed ones");
    if (ok) {
        ggml_backend_tensor_set(x, want, 0, sizeof want);
        CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS, "compute after out of memory");
        ggml_backend_tensor_get(y, got, 0, sizeof got);
        CHECK(got[0] == 2 && got[3] == 8, "result after out of memory");
        ggml_backend_buffer_free(ok);
    }
    ggml_free(ctx);
}

// MUL_MAT_ID with float experts at inner sizes that are not whole blocks of 32 (k of 1, 3, 16,
// 63, 65): the kernel once dropped each row's tail. n_as experts [k, m], n_used per token.
static void test_mul_mat_id_edges(ggml_backend_t gpu, ggml_backend_t cpu) {
    static const struct { int n_as, n_used, m, n_tok, k; } cs[] = {
        { 16, 16, 32, 1024, 16 }, { 1, 1, 8, 16, 1 }, { 1, 1, 8, 16, 63 }, { 1, 1, 8, 16, 65 },
        { 4, 2, 64, 16, 3 },      { 4, 2, 7, 5, 33 },  { 2, 1, 1, 1, 31 },
    };
    static const enum ggml_type ts[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16 };
    int bad = 0, run = 0;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        for (size_t ti = 0; ti < 3; ti++) {
            float * r[2] = { NULL, NULL };
            ggml_backend_t bes[2] = { gpu, cpu };
            bool claimed = true;
            for (int i = 0; i < 2; i++) {
                struct ggml_context * ctx = new_ctx(8);
                struct ggml_tensor * as = ggml_new_tensor_3d(ctx, ts[ti], cs[c].k, cs[c].m, cs[c].n_as);
                struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, cs[c].k, 1, cs[c].n_tok);
                struct ggml_tensor * ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, cs[c].n_used, cs[c].n_tok);
                struct ggml_tensor * y = ggml_mul_mat_id(ctx, as, x, ids);
                struct ggml_cgraph * gf = ggml_new_graph(ctx);
                ggml_build_forward_expand(gf, y);
                if (i == 0 && !ggml_backend_supports_op(gpu, y)) {
                    claimed = false;
                    ggml_free(ctx);
                    break;
                }
                ggml_backend_buffer_t b = ggml_backend_alloc_ctx_tensors(ctx, bes[i]);
                rf_fill_tensor(as, 41, -1, 1);
                rf_fill_tensor(x, 42, -1, 1);
                // Distinct experts per token: slot u of token t takes (u + t) % n_as.
                int32_t * idv = malloc(sizeof(int32_t) * (size_t) cs[c].n_used * (size_t) cs[c].n_tok);
                for (int t = 0; t < cs[c].n_tok; t++)
                    for (int u = 0; u < cs[c].n_used; u++) idv[t * cs[c].n_used + u] = (u + t) % cs[c].n_as;
                ggml_backend_tensor_set(ids, idv, 0, ggml_nbytes(ids));
                free(idv);
                CHECK(ggml_backend_graph_compute(bes[i], gf) == GGML_STATUS_SUCCESS, "mul_mat_id compute");
                r[i] = rf_tensor_to_float(y);
                ggml_backend_buffer_free(b);
                ggml_free(ctx);
            }
            if (!claimed) continue;
            run++;
            const size_t n = (size_t) cs[c].m * (size_t) cs[c].n_used * (size_t) cs[c].n_tok;
            const double e = rf_nmse(r[0], r[1], n);
            if (!(e <= 5e-4)) {
                bad++;
                printf("MUL_MAT_ID %s n_as=%d n_used=%d m=%d n=%d k=%d: nmse %g\n", ggml_type_name(ts[ti]), cs[c].n_as,
                       cs[c].n_used, cs[c].m, cs[c].n_tok, cs[c].k, e);
            }
            free(r[0]);
            free(r[1]);
        }
    }
    printf("MUL_MAT_ID float experts, k not a multiple of 32: %d cases, %d over 5e-4\n", run, bad);
    CHECK(bad == 0, "MUL_MAT_ID edge shapes");
}

// The first RFGPU device of the registry other than `skip` (NULL: none).
static ggml_backend_dev_t find_gpu(ggml_backend_reg_t reg, ggml_backend_dev_t skip) {
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) {
        ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, i);
        if (d != skip && strncmp(ggml_backend_dev_name(d), "RFGPU", 5) == 0) return d;
    }
    return NULL;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);  // every line survives a crash
    g_cpu_dev = rf_ggml_cpu_device();
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    g_gpu = find_gpu(reg, NULL);
    if (!g_gpu) {
        printf("skipped: no GPU (no RFGPU device in the rocmforge registry)\n");
        return 0;
    }
    printf("device under test: %s (%s)\n", ggml_backend_dev_name(g_gpu), ggml_backend_dev_description(g_gpu));
    ggml_backend_t be1 = ggml_backend_dev_init(g_gpu, NULL);
    ggml_backend_t be2 = ggml_backend_dev_init(g_gpu, NULL);
    ggml_backend_t cpu = ggml_backend_dev_init(g_cpu_dev, NULL);
    CHECK(be1 && be2 && cpu, "backends");
    if (!be1 || !be2 || !cpu) return rf_finish("test_gpu_io");
    rf_set_n_threads(cpu, 4);

    test_host_buffer();
    test_buffer_from_host_ptr(be1);
    test_async_set_get(be1);
    test_copies_and_events(be1, be2);
    test_sched(be1, cpu);
    test_repeated_graph(be1);
    test_small_writes(be1);
    test_mul_mat_id_edges(be1, cpu);
    test_out_of_memory(be1);

    // A second GPU device: copies between the two, both ways.
    ggml_backend_dev_t g_gpu2 = find_gpu(reg, g_gpu);
    if (g_gpu2) {
        printf("second GPU device: %s (%s)\n", ggml_backend_dev_name(g_gpu2), ggml_backend_dev_description(g_gpu2));
        ggml_backend_t other = ggml_backend_dev_init(g_gpu2, NULL);
        CHECK(other != NULL, "backend of the second GPU");
        if (other) {
            test_peer_copies(be1, other);
            test_peer_copies(other, be1);
            ggml_backend_free(other);
        }
    } else {
        printf("peer copies: skipped (one GPU device)\n");
    }

    ggml_backend_free(cpu);
    ggml_backend_free(be2);
    ggml_backend_free(be1);
    return rf_finish("test_gpu_io");
}
