// test_bad_input: the host survives bad requests and gets ggml's documented answer:
// supports_op false, a failed ggml_status, a NULL buffer; every refusal is explained through
// ggml's log callback with a message that names rocmforge.
#include "common.h"
// The buffer vtable, to reach set/get/memset/cpy with arguments ggml's wrappers would assert on.
#include "ggml-backend-impl.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_log[1 << 16];
static size_t g_log_len = 0;

// Set while the library is first loaded: the callback then calls back into it, as a host's
// logger might, while the registry is being built (it must get NULL, not deadlock).
static bool g_reenter = false;
static int g_reentered = 0;
static void * g_reenter_result = (void *) 1;

static const char * rf_lib_path(void) {
    const char * l = getenv("RF_TEST_LIB");
    return l ? l : ROCMFORGE_LIB_PATH;
}

static void log_cb(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (g_reenter && strstr(text, "rocmforge") && g_reentered == 0) {
        g_reentered = 1;
        void * lib = dlopen(rf_lib_path(), RTLD_NOW | RTLD_NOLOAD);
        void * (*reg)(void) = lib ? (void * (*)(void)) dlsym(lib, "ggml_backend_rocmforge_reg") : NULL;
        if (reg) {
            g_reenter_result = reg();
        }
        if (lib) dlclose(lib);
    }
    if (level == GGML_LOG_LEVEL_DEBUG) {
        return;
    }
    size_t n = strlen(text);
    if (g_log_len + n + 1 < sizeof(g_log)) {
        memcpy(g_log + g_log_len, text, n + 1);
        g_log_len += n;
    }
    fputs(text, stderr);
}

static void log_reset(void) {
    g_log_len = 0;
    g_log[0] = '\0';
}

static bool log_has_rocmforge(void) {
    return strstr(g_log, "rocmforge") != NULL;
}

static struct ggml_context * new_ctx(void) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 32 + ggml_graph_overhead(), NULL, true };
    return ggml_init(ip);
}

static struct ggml_context * new_ctx_n(int n) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * n + ggml_graph_overhead(), NULL, true };
    return ggml_init(ip);
}

// Recomputes nb[1..3] of `t` densely from ne and nb[0] (after a test changed ne).
static void dense_strides(struct ggml_tensor * t) {
    t->nb[1] = t->nb[0] * (t->ne[0] / ggml_blck_size(t->type));
    t->nb[2] = t->nb[1] * t->ne[1];
    t->nb[3] = t->nb[2] * t->ne[2];
}

// Threads of this process (entries of /proc/self/task).

// A SCALE node over `a`, both in one RFCPU buffer, for the geometry tests: `mutate` breaks the
// geometry of the node (which 0), its source (1) or both alike (2: the shapes still agree, so
// only the memory checks can refuse it); compute must fail with a log line and
// supports_op must agree where the shape alone is bad.
typedef void (*mutate_fn)(struct ggml_tensor * t, ggml_backend_buffer_t buf);

static void expect_rejected(ggml_backend_t rf, ggml_backend_dev_t dev, const char * what, int which,
                            mutate_fn mutate, bool shape_alone) {
    log_reset();
    struct ggml_context * ctx = new_ctx_n(8);
    struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 4);
    struct ggml_tensor * c = ggml_scale(ctx, a, 2.0f);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, c);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, rf);
    CHECK(buf != NULL, "%s: alloc", what);
    if (buf) {
        rf_fill_tensor(a, 1, -1, 1);
        CHECK(ggml_backend_dev_supports_op(dev, c), "%s: the intact node is supported", what);
        if (which != 1) mutate(c, buf);
        if (which != 0) mutate(a, buf);
        if (shape_alone) {
            CHECK(!ggml_backend_dev_supports_op(dev, c), "%s: supports_op must be false", what);
        }
        enum ggml_status st = ggml_backend_graph_compute(rf, gf);
        CHECK(st != GGML_STATUS_SUCCESS, "%s: compute status %d", what, st);
        CHECK(log_has_rocmforge(), "%s: no rocmforge log line", what);
        ggml_backend_buffer_free(buf);
    }
    ggml_free(ctx);
}

static void mut_rows_past_end(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    (void) buf;
    t->ne[1] = 1 << 20;  // 256 MiB of rows in a buffer of 2 KiB
    dense_strides(t);
}
static void mut_wrapping_stride(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    (void) buf;
    t->nb[3] = (size_t) 1 << 63;  // (3-1) * 2^63 wraps to 0 in unchecked arithmetic
    t->ne[3] = 3;
}
static void mut_negative_ne(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    (void) buf;
    t->ne[2] = -2;
}
static void mut_offset_past_end(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    t->data = (char *) ggml_backend_buffer_get_base(buf) + ggml_backend_buffer_get_size(buf) - 64;
}
static void mut_before_base(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    t->data = (char *) ggml_backend_buffer_get_base(buf) - 4096;
}
static void mut_misaligned(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    (void) buf;
    t->data = (char *) t->data + 1;
}
static void mut_no_buffer(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    (void) buf;
    t->buffer = NULL;
}
static void mut_overlap(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    (void) buf;
    if (t->src[0]) t->data = (char *) t->src[0]->data + 4;  // the output one float into its source
}
static void mut_huge_elements(struct ggml_tensor * t, ggml_backend_buffer_t buf) {
    (void) buf;
    t->ne[1] = (int64_t) 1 << 40;  // zero strides: a tiny span, but 2^46 elements
    t->ne[2] = 1 << 10;
    t->nb[1] = t->nb[2] = t->nb[3] = 0;
}

int main(void) {
    ggml_log_set(log_cb, NULL);
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();

    // --- a log callback calling into the library while its registry is being built ---
    {
        setenv("ROCMFORGE_DEBUG", "1", 1);  // the build's debug line reaches the callback
        alarm(120);                          // a deadlock fails the test instead of hanging it
        g_reenter = true;
        ggml_backend_reg_t reg = rf_rocmforge_reg();
        g_reenter = false;
        alarm(0);
        CHECK(reg != NULL, "registry");
        CHECK(g_reentered == 1, "the callback was called during the build");
        CHECK(g_reenter_result == NULL, "re-entrant ggml_backend_rocmforge_reg must return NULL, got %p",
              g_reenter_result);
    }

    ggml_backend_dev_t dev = rf_rfcpu_device();
    ggml_backend_t rf = ggml_backend_dev_init(dev, "this is not a valid parameter string");
    CHECK(rf != NULL, "init with odd params");
    if (!rf) return rf_finish("test_bad_input");

    // --- supports_op refusals ---
    {
        struct ggml_context * ctx = new_ctx();
        struct ggml_tensor * img = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 16, 16, 3, 1);
        struct ggml_tensor * pool = ggml_pool_2d(ctx, img, GGML_OP_POOL_AVG, 2, 2, 2, 2, 0, 0);
        struct ggml_tensor * ker = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 3, 3, 3, 4);
        struct ggml_tensor * conv = ggml_conv_2d_direct(ctx, ker, img, 1, 1, 1, 1, 1, 1);
        struct ggml_tensor * ia = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 8);
        struct ggml_tensor * iadd = ggml_add(ctx, ia, ia);
        // Q8_1 is an activation format: a quantizer, no dot (in ggml-cpu either).
        struct ggml_tensor * tq = ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_1, 256, 4);
        struct ggml_tensor * act = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 2);
        struct ggml_tensor * tqmm = ggml_mul_mat(ctx, tq, act);
        CHECK(!ggml_backend_dev_supports_op(dev, pool), "POOL_2D must not be claimed");
        CHECK(!ggml_backend_dev_supports_op(dev, conv), "CONV_2D must not be claimed");
        CHECK(!ggml_backend_dev_supports_op(dev, iadd), "ADD on I32 must not be claimed");
        CHECK(!ggml_backend_dev_supports_op(dev, tqmm), "MUL_MAT with Q8_1 weights must not be claimed");
        CHECK(!ggml_backend_dev_supports_op(dev, NULL), "NULL op must not be claimed");
        // A tensor with a type id out of range.
        struct ggml_tensor * bad = ggml_add(ctx, act, act);
        enum ggml_type saved = bad->type;
        bad->type = (enum ggml_type) 9999;
        CHECK(!ggml_backend_dev_supports_op(dev, bad), "unknown type id must not be claimed");
        bad->type = saved;
        bad->op = (enum ggml_op) 9999;
        CHECK(!ggml_backend_dev_supports_op(dev, bad), "unknown op id must not be claimed");
        ggml_free(ctx);
    }

    // --- compute of a graph with an unsupported node: failed status, no abort ---
    {
        log_reset();
        struct ggml_context * ctx = new_ctx();
        struct ggml_tensor * img = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 16, 16, 3, 1);
        struct ggml_tensor * pool = ggml_pool_2d(ctx, img, GGML_OP_POOL_AVG, 2, 2, 2, 2, 0, 0);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, pool);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, rf);
        CHECK(buf != NULL, "alloc");
        if (buf) {
            rf_fill_tensor(img, 1, -1, 1);
            enum ggml_status st = ggml_backend_graph_compute(rf, gf);
            CHECK(st != GGML_STATUS_SUCCESS, "unsupported node: status %d (%s)", st, ggml_status_to_string(st));
            CHECK(log_has_rocmforge(), "unsupported node: no rocmforge log message");
            ggml_backend_buffer_free(buf);
        }
        ggml_free(ctx);
    }

    // --- compute of a graph whose tensors have no memory ---
    {
        log_reset();
        struct ggml_context * ctx = new_ctx();
        struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 4);
        struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 4);
        struct ggml_tensor * c = ggml_add(ctx, a, b);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, c);
        enum ggml_status st = ggml_backend_graph_compute(rf, gf);
        CHECK(st != GGML_STATUS_SUCCESS, "unallocated graph: status %d", st);
        CHECK(log_has_rocmforge(), "unallocated graph: no rocmforge log message");
        ggml_free(ctx);
    }

    // --- an empty graph is fine ---
    {
        log_reset();
        struct ggml_context * ctx = new_ctx();
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        enum ggml_status st = ggml_backend_graph_compute(rf, gf);
        CHECK(st == GGML_STATUS_SUCCESS, "empty graph: status %d", st);
        ggml_free(ctx);
    }

    // --- absurd allocation: NULL, not abort ---
    {
        log_reset();
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
        ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(buft, (size_t) 1 << 62);
        CHECK(b == NULL, "1<<62 byte buffer must fail");
        if (b) ggml_backend_buffer_free(b);
        CHECK(log_has_rocmforge(), "huge allocation: no rocmforge log message");
        CHECK(ggml_backend_buft_get_max_size(buft) > 0, "max size");
        CHECK(ggml_backend_buft_get_alignment(buft) >= 32, "alignment %zu", ggml_backend_buft_get_alignment(buft));
        // A zero-byte request is ggml's own dummy buffer and must be usable/freeable.
        ggml_backend_buffer_t z = ggml_backend_buft_alloc_buffer(buft, 0);
        if (z) ggml_backend_buffer_free(z);
    }

    // --- device queries with the real device and the exported helpers ---
    {
        struct ggml_backend_dev_props props;
        memset(&props, 0, sizeof(props));
        ggml_backend_dev_get_props(dev, &props);
        CHECK(props.name && strcmp(props.name, "RFCPU") == 0, "props.name");
        CHECK(props.description && props.description[0], "props.description");
        CHECK(strcmp(ggml_backend_dev_description(dev), props.description) == 0, "description");
        void * lib = dlopen(ROCMFORGE_LIB_PATH, RTLD_NOW | RTLD_NOLOAD);
        typedef void (*desc_fn)(int, char *, size_t);
        desc_fn get_desc = lib ? (desc_fn) dlsym(lib, "ggml_backend_rocmforge_get_device_description") : NULL;
        CHECK(get_desc != NULL, "ggml_backend_rocmforge_get_device_description exported");
        if (get_desc) {
            char buf[64] = "junk";
            get_desc(99, buf, sizeof(buf));
            CHECK(buf[0] == '\0', "device 99 description '%s'", buf);
            get_desc(0, NULL, 0);  // no crash
            char one[1] = { 'x' };
            get_desc(0, one, 1);
            CHECK(one[0] == '\0', "1-byte buffer holds only the NUL");
        }
        if (lib) dlclose(lib);
    }

    // --- tensors whose geometry does not fit their buffer (RFCPU must check, not trust) ---
    for (int which = 0; which < 3; which++) {
        const char * w = which == 0 ? "node" : which == 1 ? "source" : "node and source";
        char what[128];
        snprintf(what, sizeof what, "%s rows past the buffer end", w);
        expect_rejected(rf, dev, what, which, mut_rows_past_end, false);
        snprintf(what, sizeof what, "%s nb[3]=1<<63 ne[3]=3", w);
        expect_rejected(rf, dev, what, which, mut_wrapping_stride, true);
        if (which == 1) {  // a node with a negative (empty) extent is skipped
            snprintf(what, sizeof what, "%s negative ne", w);
            expect_rejected(rf, dev, what, which, mut_negative_ne, true);
        }
        snprintf(what, sizeof what, "%s data near the buffer end", w);
        expect_rejected(rf, dev, what, which, mut_offset_past_end, false);
        snprintf(what, sizeof what, "%s data before the buffer", w);
        expect_rejected(rf, dev, what, which, mut_before_base, false);
        snprintf(what, sizeof what, "%s misaligned data", w);
        expect_rejected(rf, dev, what, which, mut_misaligned, false);
        snprintf(what, sizeof what, "%s without a buffer", w);
        expect_rejected(rf, dev, what, which, mut_no_buffer, false);
        if (which == 0) {
            snprintf(what, sizeof what, "%s partly overlapping its source", w);
            expect_rejected(rf, dev, what, which, mut_overlap, false);
        }
        snprintf(what, sizeof what, "%s with 2^52 elements", w);
        expect_rejected(rf, dev, what, which, mut_huge_elements, true);
    }

    // --- a contiguous tensor whose size-1 dimension has an odd stride (ggml allows any):
    // row-wise kernels must not step rows by nb[1] (test_fuzz found SCALE and GLU doing so) ---
    {
        struct ggml_context * ctx = new_ctx_n(8);
        struct ggml_tensor * a = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 1, 4);
        struct ggml_tensor * c = ggml_scale(ctx, a, 2.0f);
        struct ggml_tensor * m = ggml_diag_mask_inf(ctx, c, 0);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, m);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, rf);
        CHECK(buf != NULL, "odd stride: alloc");
        if (buf) {
            rf_fill_tensor(a, 5, -1, 1);
            float * in = rf_tensor_to_float(a);
            a->nb[1] = c->nb[1] = m->nb[1] = (size_t) 1 << 40;
            CHECK(ggml_backend_graph_compute(rf, gf) == GGML_STATUS_SUCCESS, "odd stride: compute");
            float * out = rf_tensor_to_float(c);
            for (int i = 0; i < 256; i++) in[i] *= 2.0f;
            CHECK(rf_nmse(out, in, 256) == 0.0, "odd stride: SCALE result");
            free(in);
            free(out);
            ggml_backend_buffer_free(buf);
        }
        ggml_free(ctx);
    }

    // --- buffer_cpy_tensor: sizes must match and both tensors lie inside their buffers ---
    {
        log_reset();
        struct ggml_context * ctx = new_ctx_n(8);
        struct ggml_tensor * src = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64);
        struct ggml_tensor * dst = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 16);
        struct ggml_tensor * pad = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 256);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, rf);
        CHECK(buf != NULL, "cpy: alloc");
        if (buf) {
            CHECK(buf->iface.cpy_tensor != NULL, "cpy_tensor entry");
            rf_fill_tensor(src, 3, -1, 1);
            rf_fill_tensor(pad, 4, -1, 1);
            bool ok = buf->iface.cpy_tensor(buf, src, dst);
            CHECK(!ok, "cpy of 256 bytes into a 64-byte tensor must be refused");
            CHECK(log_has_rocmforge(), "cpy size mismatch: no log line");
            log_reset();
            // A source pointing past its own buffer's end.
            struct ggml_tensor fake = *src;
            fake.ne[0] = 16;
            fake.nb[1] = fake.nb[2] = fake.nb[3] = 64;
            fake.data = (char *) ggml_backend_buffer_get_base(buf) + ggml_backend_buffer_get_size(buf) - 16;
            ok = buf->iface.cpy_tensor(buf, &fake, dst);
            CHECK(!ok, "cpy from a source outside its buffer must be refused");
            CHECK(log_has_rocmforge(), "cpy bad source: no log line");
            // Overlapping source and destination in one buffer: refused (the copy would alias).
            log_reset();
            struct ggml_tensor over = *src;
            over.data = (char *) src->data + 64;
            ok = buf->iface.cpy_tensor(buf, src, &over);
            CHECK(!ok, "cpy between overlapping tensors must be refused");
            CHECK(log_has_rocmforge(), "overlapping cpy: no log line");
            buf->iface.set_tensor(buf, &over, src->data, 0, 256);
            CHECK(strstr(g_log, "overlaps") != NULL, "set_tensor from overlapping memory must be refused");
            struct ggml_init_params ip2 = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), NULL, true };
            struct ggml_context * c2 = ggml_init(ip2);
            struct ggml_tensor * y = ggml_scale(c2, src, 1.0f);
            struct ggml_cgraph * g2 = ggml_new_graph(c2);
            ggml_build_forward_expand(g2, y);
            y->data = pad->data;
            y->buffer = buf;
            CHECK(ggml_backend_graph_compute(rf, g2) != GGML_STATUS_SUCCESS, "compute after the refused set_tensor");
            ggml_free(c2);
            // A matching copy still works.
            CHECK(buf->iface.cpy_tensor(buf, src, ggml_view_1d(ctx, pad, 64, 0)), "a matching copy");
            ggml_backend_buffer_free(buf);
        }
        ggml_free(ctx);
    }

    // --- a failed set_tensor fails the next graph_compute using the buffer, and only that ---
    {
        log_reset();
        struct ggml_context * ctx = new_ctx_n(8);
        struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 4);
        struct ggml_tensor * c = ggml_scale(ctx, a, 2.0f);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, c);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, rf);
        CHECK(buf != NULL, "set error: alloc");
        if (buf) {
            rf_fill_tensor(a, 1, -1, 1);
            CHECK(ggml_backend_graph_compute(rf, gf) == GGML_STATUS_SUCCESS, "set error: first compute");
            float junk[16] = { 0 };
            size_t size = ggml_backend_buffer_get_size(buf);
            buf->iface.set_tensor(buf, a, junk, size, sizeof junk);  // past the end
            CHECK(log_has_rocmforge(), "failed set_tensor: no log line");
            CHECK(strstr(g_log, "graph_compute") != NULL, "the log says the next graph_compute fails");
            log_reset();
            CHECK(ggml_backend_graph_compute(rf, gf) != GGML_STATUS_SUCCESS,
                  "graph_compute after a failed set_tensor must fail");
            CHECK(log_has_rocmforge(), "no log line for the failed compute");
            CHECK(ggml_backend_graph_compute(rf, gf) == GGML_STATUS_SUCCESS, "reported once, then computes");
            // get and memset errors too.
            buf->iface.get_tensor(buf, a, junk, (size_t) -8, sizeof junk);
            CHECK(ggml_backend_graph_compute(rf, gf) != GGML_STATUS_SUCCESS, "after a failed get_tensor");
            buf->iface.memset_tensor(buf, a, 0, 8, size);
            CHECK(ggml_backend_graph_compute(rf, gf) != GGML_STATUS_SUCCESS, "after a failed memset_tensor");
            CHECK(ggml_backend_graph_compute(rf, gf) == GGML_STATUS_SUCCESS, "and then computes again");
            ggml_backend_buffer_free(buf);
        }
        ggml_free(ctx);
    }

    // --- thread counts: capped (with a log line), and the backend keeps working ---
    {
        log_reset();
        int before = rf_thread_count();
        rf_set_n_threads(rf, 1000000);
        int during = rf_thread_count();
        CHECK(during > 0 && during <= before + 512, "threads after asking for 10^6: %d (before %d)", during, before);
        CHECK(strstr(g_log, "cap") != NULL, "no log line about the cap");
        rf_set_n_threads(rf, 2);
    }

    // --- the backend still works after all of this ---
    {
        ggml_backend_t cpu = ggml_backend_dev_init(cpu_dev, NULL);
        float * res[2] = { NULL, NULL };
        ggml_backend_t bes[2] = { rf, cpu };
        for (int k = 0; k < 2; k++) {
            struct ggml_context * ctx = new_ctx();
            struct ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 4);
            struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 4);
            struct ggml_tensor * c = ggml_mul(ctx, a, b);
            struct ggml_cgraph * gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, c);
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, bes[k]);
            rf_fill_tensor(a, 1, -1, 1);
            rf_fill_tensor(b, 2, -1, 1);
            CHECK(ggml_backend_graph_compute(bes[k], gf) == GGML_STATUS_SUCCESS, "compute after errors");
            res[k] = rf_tensor_to_float(c);
            ggml_backend_buffer_free(buf);
            ggml_free(ctx);
        }
        CHECK(rf_nmse(res[0], res[1], 128) < 1e-12, "result after errors");
        free(res[0]);
        free(res[1]);
        ggml_backend_free(cpu);
    }

    ggml_backend_free(rf);
    ggml_log_set(NULL, NULL);
    return rf_finish("test_bad_input");
}
