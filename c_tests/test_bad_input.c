// test_bad_input: the host survives bad requests and gets ggml's documented answer:
// supports_op false, a failed ggml_status, a NULL buffer; every refusal is explained through
// ggml's log callback with a message that names rocmforge.
#include "common.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

static char g_log[1 << 16];
static size_t g_log_len = 0;

static void log_cb(enum ggml_log_level level, const char * text, void * ud) {
    (void) level;
    (void) ud;
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

int main(void) {
    ggml_log_set(log_cb, NULL);
    ggml_backend_dev_t cpu_dev = rf_ggml_cpu_device();
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
        struct ggml_tensor * tq = ggml_new_tensor_2d(ctx, GGML_TYPE_TQ2_0, 256, 4);
        struct ggml_tensor * act = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 2);
        struct ggml_tensor * tqmm = ggml_mul_mat(ctx, tq, act);
        CHECK(!ggml_backend_dev_supports_op(dev, pool), "POOL_2D must not be claimed");
        CHECK(!ggml_backend_dev_supports_op(dev, conv), "CONV_2D must not be claimed");
        CHECK(!ggml_backend_dev_supports_op(dev, iadd), "ADD on I32 must not be claimed");
        CHECK(!ggml_backend_dev_supports_op(dev, tqmm), "MUL_MAT with TQ2_0 weights must not be claimed");
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
