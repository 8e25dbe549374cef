// test_repack: RFCPU's load-time repack buffer type (RFCPU_REPACK) as a host meets it through
// ggml_backend_dev_get_extra_bufts: not host memory; a repacked Q4_0, Q4_K, Q6_K, Q8_0 or IQ4_NL weight is
// read only by the products the repacked kernels run (supports_op false for GET_ROWS, CPY, a view of it, an op of
// another device), and their results agree with the same weights in RFCPU's plain buffer and with
// ggml-cpu; get_tensor gives the bytes set; a partial write is refused with a log line and the next
// compute on the buffer fails instead of reading half-repacked weights.
#include "common.h"

#include <stdlib.h>
#include <string.h>

static char g_log[1 << 16];
static size_t g_log_len = 0;

static void log_cb(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level == GGML_LOG_LEVEL_DEBUG) return;
    size_t n = strlen(text);
    if (g_log_len + n + 1 < sizeof(g_log)) {
        memcpy(g_log + g_log_len, text, n + 1);
        g_log_len += n;
    }
    fputs(text, stderr);
}

typedef ggml_backend_buffer_type_t * (*extra_bufts_fn)(ggml_backend_dev_t);

static struct ggml_context * new_ctx(void) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * 32 + ggml_graph_overhead(), NULL, true };
    return ggml_init(ip);
}

// Rows of random values in type T.
static void * quant_rows(enum ggml_type t, int64_t k, int64_t rows, uint64_t seed) {
    float * f = malloc(sizeof(float) * k * rows);
    for (int64_t i = 0; i < k * rows; i++) f[i] = rf_rand_uniform(&seed, -1, 1);
    void * q = malloc(ggml_row_size(t, k) * rows);
    ggml_quantize_chunk(t, f, q, 0, rows, k, NULL);
    free(f);
    return q;
}

// The products of a repacked weight of TYPE (37 rows: not whole 16-row groups) and what else may
// touch it; with PARTIAL, a partial write at the end.
static void check_type(ggml_backend_dev_t dev, ggml_backend_buffer_type_t rb, ggml_backend_t rf, ggml_backend_t cpu,
                       enum ggml_type type, bool partial) {
    ggml_backend_dev_t gpu = rf_first_gpu_device();
    const int64_t k = 256, m = 37, n = 3;  // rows not a multiple of the 16-row groups
    void * wq = quant_rows(type, k, m, 5);
    size_t wbytes = ggml_row_size(type, k) * m;

    struct ggml_context * wctx = new_ctx();
    struct ggml_tensor * w = ggml_new_tensor_2d(wctx, type, k, m);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, rb);
    CHECK(wbuf != NULL, "alloc in RFCPU_REPACK");
    if (!wbuf) return;
    ggml_backend_tensor_set(w, wq, 0, wbytes);
    {
        void * back = malloc(wbytes);
        ggml_backend_tensor_get(w, back, 0, wbytes);
        CHECK(memcmp(back, wq, wbytes) == 0, "get_tensor does not give the bytes set");
        free(back);
    }

    struct ggml_context * ctx = new_ctx();
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    struct ggml_tensor * wp = ggml_new_tensor_2d(ctx, type, k, m);  // the same weights, plain
    struct ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 2);
    struct ggml_tensor * other = ggml_new_tensor_2d(ctx, type, k, m);
    struct ggml_tensor * mm = ggml_mul_mat(ctx, w, x);
    struct ggml_tensor * mp = ggml_mul_mat(ctx, wp, x);
    struct ggml_tensor * x1 = ggml_view_2d(ctx, x, k, 1, x->nb[1], 0);
    struct ggml_tensor * mv = ggml_mul_mat(ctx, w, ggml_cont(ctx, x1));  // one column: generation
    struct ggml_tensor * gr = ggml_get_rows(ctx, w, idx);
    struct ggml_tensor * cp = ggml_cpy(ctx, w, other);
    struct ggml_tensor * vw = ggml_view_2d(ctx, w, k, 16, w->nb[1], w->nb[1] * 16);
    struct ggml_tensor * mvw = ggml_mul_mat(ctx, vw, x);
    struct ggml_tensor * xw = ggml_mul_mat(ctx, x, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, mm);
    ggml_build_forward_expand(gf, mp);
    ggml_build_forward_expand(gf, mv);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, rf);
    CHECK(buf != NULL, "alloc");
    if (!buf) return;
    ggml_backend_tensor_set(wp, wq, 0, wbytes);
    rf_fill_tensor(x, 7, -1, 1);
    int32_t rows[2] = { 3, 20 };
    ggml_backend_tensor_set(idx, rows, 0, sizeof rows);

    CHECK(ggml_backend_dev_supports_op(dev, mm), "MUL_MAT of a repacked weight must be supported");
    CHECK(ggml_backend_dev_supports_op(dev, mv), "MUL_MAT of a repacked weight by one column");
    CHECK(!ggml_backend_dev_supports_op(dev, gr), "GET_ROWS of a repacked weight must be declined");
    CHECK(!ggml_backend_dev_supports_op(dev, cp), "CPY of a repacked weight must be declined");
    CHECK(!ggml_backend_dev_supports_op(dev, mvw), "MUL_MAT of a view of a repacked weight must be declined");
    CHECK(ggml_backend_dev_supports_op(dev, xw), "an unrelated MUL_MAT is still supported");
    if (gpu) CHECK(!ggml_backend_dev_supports_op(gpu, mm), "a GPU must not claim a repacked weight's product");

    CHECK(ggml_backend_graph_compute(rf, gf) == GGML_STATUS_SUCCESS, "compute");
    float * got = rf_tensor_to_float(mm), * plain = rf_tensor_to_float(mp), * one = rf_tensor_to_float(mv);
    double e = rf_nmse(got, plain, m * n), e1 = rf_nmse(one, plain, m);
    printf("%s: NMSE repacked vs plain: %.3g (3 columns), %.3g (1 column)\n", ggml_type_name(type), e, e1);
    CHECK(e < 1e-10 && e1 < 1e-10, "%s: repacked vs plain NMSE %g / %g", ggml_type_name(type), e, e1);
    if (type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q6_K || type == GGML_TYPE_IQ4_NL) {
        // Their repacked kernels keep the plain path's order: the same bits, 3 columns and 1.
        CHECK(memcmp(got, plain, sizeof(float) * m * n) == 0, "%s: repacked differs from plain (3 columns)",
              ggml_type_name(type));
        CHECK(memcmp(one, plain, sizeof(float) * m) == 0, "%s: repacked differs from plain (1 column)",
              ggml_type_name(type));
    }

    // ggml-cpu on the plain weights.
    {
        struct ggml_context * c2 = new_ctx();
        struct ggml_tensor * w2 = ggml_new_tensor_2d(c2, type, k, m);
        struct ggml_tensor * x2 = ggml_new_tensor_2d(c2, GGML_TYPE_F32, k, n);
        struct ggml_tensor * m2 = ggml_mul_mat(c2, w2, x2);
        struct ggml_cgraph * g2 = ggml_new_graph(c2);
        ggml_build_forward_expand(g2, m2);
        ggml_backend_buffer_t b2 = ggml_backend_alloc_ctx_tensors(c2, cpu);
        ggml_backend_tensor_set(w2, wq, 0, wbytes);
        rf_fill_tensor(x2, 7, -1, 1);
        CHECK(ggml_backend_graph_compute(cpu, g2) == GGML_STATUS_SUCCESS, "ggml-cpu compute");
        float * ref = rf_tensor_to_float(m2);
        double er = rf_nmse(got, ref, m * n);
        printf("%s: NMSE repacked vs ggml-cpu: %.3g\n", ggml_type_name(type), er);
        CHECK(er < 1e-10, "repacked vs ggml-cpu NMSE %g", er);
        free(ref);
        ggml_backend_buffer_free(b2);
        ggml_free(c2);
    }

    if (partial) {
        // A partial write cannot be repacked: refused with a log line, and the next compute reading
        // the buffer fails rather than use half-written weights.
        g_log_len = 0;
        g_log[0] = 0;
        ggml_backend_tensor_set(w, wq, 18, 18);
        CHECK(strstr(g_log, "rocmforge") && strstr(g_log, "repacked"), "partial write: no rocmforge log line");
        CHECK(ggml_backend_graph_compute(rf, gf) != GGML_STATUS_SUCCESS, "compute after a refused write must fail");
        CHECK(ggml_backend_graph_compute(rf, gf) == GGML_STATUS_SUCCESS, "the error is reported once");
    }
    free(got);
    free(plain);
    free(one);
    free(wq);
    ggml_backend_buffer_free(buf);
    ggml_backend_buffer_free(wbuf);
    ggml_free(ctx);
    ggml_free(wctx);
}

int main(void) {
    ggml_log_set(log_cb, NULL);
    ggml_backend_dev_t dev = rf_rfcpu_device();
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    extra_bufts_fn fn = (extra_bufts_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    CHECK(fn != NULL, "ggml_backend_dev_get_extra_bufts not offered");
    if (!fn) return rf_finish("test_repack");
    ggml_backend_buffer_type_t * list = fn(dev);
    CHECK(list != NULL, "extra buffer type list is NULL");
    // A device other than RFCPU has none.
    ggml_backend_dev_t gpu = rf_first_gpu_device();
    if (gpu) CHECK(fn(gpu) && fn(gpu)[0] == NULL, "a GPU device offers an extra buffer type");
    if (!list || !list[0]) {
        CHECK(strstr(g_log, "RFCPU_REPACK disabled") != NULL, "no buffer type and no log line saying why");
        printf("skipped: RFCPU offers no repack buffer type here\n");
        return rf_finish("test_repack");
    }
    ggml_backend_buffer_type_t rb = list[0];
    CHECK(list[1] == NULL, "list not NULL-terminated after one type");
    CHECK(strcmp(ggml_backend_buft_name(rb), "RFCPU_REPACK") == 0, "name %s", ggml_backend_buft_name(rb));
    CHECK(!ggml_backend_buft_is_host(rb), "a repack buffer must not be host memory");
    CHECK(ggml_backend_dev_supports_buft(dev, rb), "RFCPU must take its own repack buffers");
    if (gpu) CHECK(!ggml_backend_dev_supports_buft(gpu, rb), "a GPU must not take RFCPU_REPACK buffers");

    ggml_backend_t rf = ggml_backend_dev_init(dev, NULL);
    ggml_backend_t cpu = ggml_backend_dev_init(rf_ggml_cpu_device(), NULL);
    rf_set_n_threads(rf, 2);
    check_type(dev, rb, rf, cpu, GGML_TYPE_Q4_0, true);
    check_type(dev, rb, rf, cpu, GGML_TYPE_Q4_K, false);
    check_type(dev, rb, rf, cpu, GGML_TYPE_Q8_0, true);
    check_type(dev, rb, rf, cpu, GGML_TYPE_Q6_K, false);
    check_type(dev, rb, rf, cpu, GGML_TYPE_IQ4_NL, false);
    ggml_backend_free(rf);
    ggml_backend_free(cpu);
    ggml_log_set(NULL, NULL);
    return rf_finish("test_repack");
}
