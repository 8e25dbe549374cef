// test_multi_gpu: every GPU device (RFGPU0..N) together, through ggml's public API.
//   1. memory: each RFGPUn reports its own free/total (an allocation on one GPU lowers that
//      GPU's free memory only);
//   2. copies between every pair of RFGPU backends (ggml_backend_tensor_copy_async, then the
//      destination synchronized; and ggml_backend_tensor_copy), bytes checked;
//   3. the row split: the registry's "ggml_backend_split_buffer_type" (llama.cpp's -sm row) over
//      all GPUs, every GPU in turn the main device, several tensor_split choices (equal, free
//      memory, everything on one GPU, a GPU given nothing); MUL_MAT with its weights in a split
//      buffer for several weight types and edge shapes (odd rows, fewer rows than the rounding,
//      one column and many), MUL_MAT_ID with split experts (each expert's rows divided), and
//      blocks of products (Q, K and V of one x, a product of a product), against ggml-cpu, each graph three times (launched, captured, replayed;
//      few columns read and write across devices directly where peer access is on, many columns
//      copy both ways); the weights read back gather the rows set; other
//      ops and other devices decline split weights. With one GPU this is the single-GPU run of
//      the row-split path.
//   4. the AllReduce of ggml's meta device (-sm tensor): the registry's "ggml_backend_comm_init",
//      "_allreduce_tensor" and "_free" over a backend of every GPU, and over two backends of
//      RFGPU0 (so one GPU runs it too); F32 partial sums of odd and growing sizes, each GPU's
//      result equal to the bits of the partials summed in order; a part without the compute flag
//      adds nothing; other types, mismatched sizes and foreign handles declined.
// Without a GPU it prints "skipped: no GPU" and exits 0; part 2 needs two.
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS 16

static ggml_backend_dev_t g_gpus[MAX_GPUS];
static int g_reg_index[MAX_GPUS];  // each GPU's index in the rocmforge registry
static int g_n;
static ggml_backend_dev_t g_cpu;

static struct ggml_context * new_ctx(int n_tensors) {
    struct ggml_init_params ip = { ggml_tensor_overhead() * (size_t) n_tensors + ggml_graph_overhead(), NULL, true };
    return ggml_init(ip);
}

// ---- 1. memory --------------------------------------------------------------------------------

static void test_memory(void) {
    size_t free0[MAX_GPUS], total[MAX_GPUS];
    for (int i = 0; i < g_n; i++) {
        ggml_backend_dev_memory(g_gpus[i], &free0[i], &total[i]);
        printf("%s: %zu MiB free of %zu MiB\n", ggml_backend_dev_name(g_gpus[i]), free0[i] >> 20, total[i] >> 20);
        CHECK(total[i] > 0 && free0[i] <= total[i], "%s memory", ggml_backend_dev_name(g_gpus[i]));
    }
    const size_t big = (size_t) 512 << 20;
    for (int i = 0; i < g_n; i++) {
        if (free0[i] < 2 * big) continue;
        ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(g_gpus[i]), big);
        CHECK(b != NULL, "512 MiB on %s", ggml_backend_dev_name(g_gpus[i]));
        if (!b) continue;
        for (int j = 0; j < g_n; j++) {
            size_t f, t;
            ggml_backend_dev_memory(g_gpus[j], &f, &t);
            long long drop = ((long long) free0[j] - (long long) f) >> 20;
            if (j == i) CHECK(drop >= 400, "%s: free memory fell by %lld MiB after 512 MiB there", ggml_backend_dev_name(g_gpus[j]), drop);
            else CHECK(drop < 256, "%s: free memory fell by %lld MiB after 512 MiB on %s", ggml_backend_dev_name(g_gpus[j]), drop, ggml_backend_dev_name(g_gpus[i]));
        }
        ggml_backend_buffer_free(b);
    }
}

// ---- 2. copies between every pair -------------------------------------------------------------

static void test_pair_copies(void) {
    if (g_n < 2) {
        printf("copies between GPUs: skipped (one GPU)\n");
        return;
    }
    const int64_t n = 262147;  // 1 MiB and some: not a multiple of any copy granularity
    ggml_backend_t be[MAX_GPUS];
    for (int i = 0; i < g_n; i++) be[i] = ggml_backend_dev_init(g_gpus[i], NULL);
    for (int i = 0; i < g_n; i++) {
        for (int j = 0; j < g_n; j++) {
            if (i == j || !be[i] || !be[j]) continue;
            struct ggml_context * ci = new_ctx(2), * cj = new_ctx(2);
            struct ggml_tensor * a = ggml_new_tensor_1d(ci, GGML_TYPE_F32, n);
            struct ggml_tensor * b = ggml_new_tensor_1d(cj, GGML_TYPE_F32, n);
            struct ggml_tensor * c = ggml_new_tensor_1d(cj, GGML_TYPE_F32, n);
            ggml_backend_buffer_t bi = ggml_backend_alloc_ctx_tensors_from_buft(ci, ggml_backend_dev_buffer_type(g_gpus[i]));
            ggml_backend_buffer_t bj = ggml_backend_alloc_ctx_tensors_from_buft(cj, ggml_backend_dev_buffer_type(g_gpus[j]));
            CHECK(bi && bj, "buffers");
            if (bi && bj) {
                rf_fill_tensor(a, 100 + i * 16 + j, -5, 5);
                float * want = malloc(n * sizeof(float)), * got = malloc(n * sizeof(float));
                ggml_backend_tensor_get(a, want, 0, n * sizeof(float));
                ggml_backend_tensor_copy_async(be[i], be[j], a, b);
                ggml_backend_synchronize(be[j]);
                ggml_backend_tensor_get(b, got, 0, n * sizeof(float));
                CHECK(memcmp(want, got, n * sizeof(float)) == 0, "copy_async %s -> %s", ggml_backend_dev_name(g_gpus[i]), ggml_backend_dev_name(g_gpus[j]));
                ggml_backend_tensor_copy(a, c);
                ggml_backend_tensor_get(c, got, 0, n * sizeof(float));
                CHECK(memcmp(want, got, n * sizeof(float)) == 0, "tensor_copy %s -> %s", ggml_backend_dev_name(g_gpus[i]), ggml_backend_dev_name(g_gpus[j]));
                free(want);
                free(got);
            }
            if (bi) ggml_backend_buffer_free(bi);
            if (bj) ggml_backend_buffer_free(bj);
            ggml_free(ci);
            ggml_free(cj);
        }
    }
    for (int i = 0; i < g_n; i++) if (be[i]) ggml_backend_free(be[i]);
    printf("copies between %d GPUs checked\n", g_n);
}

// ---- 3. the row split -------------------------------------------------------------------------

static ggml_backend_split_buffer_type_t g_split_fn;

struct mm_case { enum ggml_type t; int64_t k, m, n; };

// y = w x with w in `split`, x and y on the main GPU, against ggml-cpu.
static void run_split_mm(int main, ggml_backend_buffer_type_t split, const char * ts_label, struct mm_case c) {
    char label[256];
    snprintf(label, sizeof label, "main %s ts %s MUL_MAT %s k=%lld m=%lld n=%lld", ggml_backend_dev_name(g_gpus[main]), ts_label,
             ggml_type_name(c.t), (long long) c.k, (long long) c.m, (long long) c.n);
    // Reference on ggml-cpu.
    struct ggml_context * cc = new_ctx(4);
    struct ggml_tensor * cw = ggml_new_tensor_2d(cc, c.t, c.k, c.m);
    struct ggml_tensor * cx = ggml_new_tensor_2d(cc, GGML_TYPE_F32, c.k, c.n);
    struct ggml_tensor * cy = ggml_mul_mat(cc, cw, cx);
    struct ggml_cgraph * cg = ggml_new_graph(cc);
    ggml_build_forward_expand(cg, cy);
    ggml_backend_t cpu = ggml_backend_dev_init(g_cpu, NULL);
    ggml_backend_buffer_t cb = ggml_backend_alloc_ctx_tensors(cc, cpu);
    rf_fill_tensor(cw, 7 + c.m, -1, 1);
    rf_fill_tensor(cx, 11 + c.n, -1, 1);
    CHECK(rf_compute(cpu, cg) == GGML_STATUS_SUCCESS, "%s: ggml-cpu", label);
    float * ref = rf_tensor_to_float(cy);

    // The weights in the split buffer, the activations on the main GPU.
    struct ggml_context * wc = new_ctx(1), * ac = new_ctx(4);
    struct ggml_tensor * w = ggml_new_tensor_2d(wc, c.t, c.k, c.m);
    struct ggml_tensor * x = ggml_new_tensor_2d(ac, GGML_TYPE_F32, c.k, c.n);
    struct ggml_tensor * y = ggml_mul_mat(ac, w, x);
    struct ggml_cgraph * g = ggml_new_graph(ac);
    ggml_build_forward_expand(g, y);
    ggml_backend_buffer_t wb = ggml_backend_alloc_ctx_tensors_from_buft(wc, split);
    ggml_backend_buffer_t ab = ggml_backend_alloc_ctx_tensors_from_buft(ac, ggml_backend_dev_buffer_type(g_gpus[main]));
    ggml_backend_t be = ggml_backend_dev_init(g_gpus[main], NULL);
    CHECK(wb && ab && be, "%s: split buffer, activations, backend", label);
    if (wb && ab && be) {
        size_t wn = ggml_nbytes(cw);
        uint8_t * wbytes = malloc(wn), * back = malloc(wn);
        ggml_backend_tensor_get(cw, wbytes, 0, wn);
        ggml_backend_tensor_set(w, wbytes, 0, wn);
        memset(back, 0xAB, wn);
        ggml_backend_tensor_get(w, back, 0, wn);
        CHECK(memcmp(back, wbytes, wn) == 0, "%s: the split weights read back as set", label);
        // A part from the middle, across devices' rows.
        if (wn > 64) {
            memset(back, 0, wn);
            ggml_backend_tensor_get(w, back, wn / 3, wn / 3 + 7);
            CHECK(memcmp(back, wbytes + wn / 3, wn / 3 + 7) == 0, "%s: part of the split weights read back", label);
        }
        size_t xn = ggml_nbytes(cx);
        float * xv = malloc(xn);
        ggml_backend_tensor_get(cx, xv, 0, xn);
        ggml_backend_tensor_set(x, xv, 0, xn);
        CHECK(ggml_backend_dev_supports_op(g_gpus[main], y), "%s: the main GPU claims the split MUL_MAT", label);
        for (int o = 0; o < g_n; o++)
            if (o != main) CHECK(!ggml_backend_dev_supports_op(g_gpus[o], y), "%s: %s declines it", label, ggml_backend_dev_name(g_gpus[o]));
        // Run 0 launches directly, run 1 (the same graph) is captured, run 2 replays it.
        for (int rep = 0; rep < 3; rep++) {
            float * zeros = calloc(1, ggml_nbytes(y));
            ggml_backend_tensor_set(y, zeros, 0, ggml_nbytes(y));
            free(zeros);
            CHECK(rf_compute(be, g) == GGML_STATUS_SUCCESS, "%s: compute", label);
            float * got = rf_tensor_to_float(y);
            double e = rf_nmse(got, ref, (size_t) ggml_nelements(cy));
            double thr = c.t == GGML_TYPE_F32 ? 1e-6 : 1e-4;
            CHECK(e <= thr, "%s (run %d): nmse %.3g > %.1g (got[0]=%g ref[0]=%g, got[last]=%g ref[last]=%g)", label, rep, e, thr,
                  got[0], ref[0], got[ggml_nelements(cy) - 1], ref[ggml_nelements(cy) - 1]);
            free(got);
        }
        free(xv);
        free(wbytes);
        free(back);
    }
    if (be) ggml_backend_free(be);
    if (wb) ggml_backend_buffer_free(wb);
    if (ab) ggml_backend_buffer_free(ab);
    ggml_backend_buffer_free(cb);
    ggml_backend_free(cpu);
    free(ref);
    ggml_free(cc);
    ggml_free(wc);
    ggml_free(ac);
}

// Three split products of one x (Q, K and V: the other GPUs wait for x once and the main GPU
// for their rows once), a split product reading Q's rows right away (z = w2 q), then
// s = (q + k) + v, against ggml-cpu, launched, captured and replayed.
static void run_split_block(int main, ggml_backend_buffer_type_t split, const char * ts_label, enum ggml_type t, int64_t k, int64_t n) {
    char label[256];
    snprintf(label, sizeof label, "main %s ts %s Q/K/V block %s k=%lld n=%lld", ggml_backend_dev_name(g_gpus[main]), ts_label,
             ggml_type_name(t), (long long) k, (long long) n);
    struct ggml_tensor *cw[4], *w[4], *cout[2], *out[2];
    struct ggml_context * cc = new_ctx(16), * wc = new_ctx(4), * ac = new_ctx(16);
    struct ggml_tensor *cx = ggml_new_tensor_2d(cc, GGML_TYPE_F32, k, n), *x = ggml_new_tensor_2d(ac, GGML_TYPE_F32, k, n);
    for (int i = 0; i < 4; i++) {
        cw[i] = ggml_new_tensor_2d(cc, t, k, i == 3 ? 64 : k);
        w[i] = ggml_new_tensor_2d(wc, t, k, i == 3 ? 64 : k);
    }
    struct ggml_cgraph * gs[2];
    for (int side = 0; side < 2; side++) {
        struct ggml_context * c = side ? ac : cc;
        struct ggml_tensor ** ws = side ? w : cw;
        struct ggml_tensor * xx = side ? x : cx;
        struct ggml_tensor * q = ggml_mul_mat(c, ws[0], xx), * kk = ggml_mul_mat(c, ws[1], xx), * v = ggml_mul_mat(c, ws[2], xx);
        struct ggml_tensor * z = ggml_mul_mat(c, ws[3], q);
        struct ggml_tensor * s = ggml_add(c, ggml_add(c, q, kk), v);
        struct ggml_cgraph * g = ggml_new_graph(c);
        ggml_build_forward_expand(g, q);
        ggml_build_forward_expand(g, kk);
        ggml_build_forward_expand(g, v);
        ggml_build_forward_expand(g, z);
        ggml_build_forward_expand(g, s);
        gs[side] = g;
        (side ? out : cout)[0] = z;
        (side ? out : cout)[1] = s;
    }
    ggml_backend_t cpu = ggml_backend_dev_init(g_cpu, NULL);
    ggml_backend_buffer_t cb = ggml_backend_alloc_ctx_tensors(cc, cpu);
    for (int i = 0; i < 4; i++) rf_fill_tensor(cw[i], 21 + i, -1, 1);
    rf_fill_tensor(cx, 5, -1, 1);
    CHECK(rf_compute(cpu, gs[0]) == GGML_STATUS_SUCCESS, "%s: ggml-cpu", label);
    float * ref[2] = { rf_tensor_to_float(cout[0]), rf_tensor_to_float(cout[1]) };
    ggml_backend_buffer_t wb = ggml_backend_alloc_ctx_tensors_from_buft(wc, split);
    ggml_backend_buffer_t ab = ggml_backend_alloc_ctx_tensors_from_buft(ac, ggml_backend_dev_buffer_type(g_gpus[main]));
    ggml_backend_t be = ggml_backend_dev_init(g_gpus[main], NULL);
    CHECK(wb && ab && be, "%s: split buffer, activations, backend", label);
    if (wb && ab && be) {
        for (int i = 0; i < 5; i++) {
            struct ggml_tensor * from = i < 4 ? cw[i] : cx, * to = i < 4 ? w[i] : x;
            size_t nb = ggml_nbytes(from);
            void * b = malloc(nb);
            ggml_backend_tensor_get(from, b, 0, nb);
            ggml_backend_tensor_set(to, b, 0, nb);
            free(b);
        }
        for (int rep = 0; rep < 3; rep++) {
            CHECK(rf_compute(be, gs[1]) == GGML_STATUS_SUCCESS, "%s: compute", label);
            for (int o = 0; o < 2; o++) {
                float * got = rf_tensor_to_float(out[o]);
                double e = rf_nmse(got, ref[o], (size_t) ggml_nelements(out[o]));
                double thr = t == GGML_TYPE_F32 ? 1e-6 : 1e-4;
                CHECK(e <= thr, "%s (run %d) %s: nmse %.3g > %.1g", label, rep, o ? "(q+k)+v" : "w2 q", e, thr);
                free(got);
            }
        }
    }
    if (be) ggml_backend_free(be);
    if (wb) ggml_backend_buffer_free(wb);
    if (ab) ggml_backend_buffer_free(ab);
    ggml_backend_buffer_free(cb);
    ggml_backend_free(cpu);
    free(ref[0]);
    free(ref[1]);
    ggml_free(cc);
    ggml_free(wc);
    ggml_free(ac);
}

// y = MUL_MAT_ID(experts, x, ids) with the experts (k x m x n_exp) in `split`: each expert's
// rows over the devices. x is k x xs x n_tok (xs 1: one row per token for every chosen expert,
// as gate and up; xs n_used: a row per chosen expert, as down). Against ggml-cpu, launched,
// captured and replayed.
static void run_split_mmid(int main, ggml_backend_buffer_type_t split, const char * ts_label, enum ggml_type t, int64_t k, int64_t m,
                           int64_t n_exp, int64_t n_used, int64_t xs, int64_t n_tok) {
    char label[256];
    snprintf(label, sizeof label, "main %s ts %s MUL_MAT_ID %s k=%lld m=%lld experts=%lld used=%lld x rows=%lld tokens=%lld",
             ggml_backend_dev_name(g_gpus[main]), ts_label, ggml_type_name(t), (long long) k, (long long) m, (long long) n_exp,
             (long long) n_used, (long long) xs, (long long) n_tok);
    struct ggml_context * cc = new_ctx(8), * wc = new_ctx(2), * ac = new_ctx(8);
    struct ggml_tensor * cw = ggml_new_tensor_3d(cc, t, k, m, n_exp), * w = ggml_new_tensor_3d(wc, t, k, m, n_exp);
    struct ggml_tensor * cx = ggml_new_tensor_3d(cc, GGML_TYPE_F32, k, xs, n_tok), * x = ggml_new_tensor_3d(ac, GGML_TYPE_F32, k, xs, n_tok);
    struct ggml_tensor * cids = ggml_new_tensor_2d(cc, GGML_TYPE_I32, n_used, n_tok), * ids = ggml_new_tensor_2d(ac, GGML_TYPE_I32, n_used, n_tok);
    struct ggml_tensor * cy = ggml_mul_mat_id(cc, cw, cx, cids), * y = ggml_mul_mat_id(ac, w, x, ids);
    struct ggml_cgraph * cg = ggml_new_graph(cc), * g = ggml_new_graph(ac);
    ggml_build_forward_expand(cg, cy);
    ggml_build_forward_expand(g, y);
    ggml_backend_t cpu = ggml_backend_dev_init(g_cpu, NULL);
    ggml_backend_buffer_t cb = ggml_backend_alloc_ctx_tensors(cc, cpu);
    rf_fill_tensor(cw, 31 + m, -1, 1);
    rf_fill_tensor(cx, 37 + n_tok, -1, 1);
    int32_t * iv = malloc(ggml_nbytes(cids));
    for (int64_t j = 0; j < n_tok; j++)
        for (int64_t u = 0; u < n_used; u++) iv[j * n_used + u] = (int32_t) ((j * 5 + u * 3 + 1) % n_exp);
    ggml_backend_tensor_set(cids, iv, 0, ggml_nbytes(cids));
    CHECK(rf_compute(cpu, cg) == GGML_STATUS_SUCCESS, "%s: ggml-cpu", label);
    float * ref = rf_tensor_to_float(cy);
    ggml_backend_buffer_t wb = ggml_backend_alloc_ctx_tensors_from_buft(wc, split);
    ggml_backend_buffer_t ab = ggml_backend_alloc_ctx_tensors_from_buft(ac, ggml_backend_dev_buffer_type(g_gpus[main]));
    ggml_backend_t be = ggml_backend_dev_init(g_gpus[main], NULL);
    CHECK(wb && ab && be, "%s: split buffer, activations, backend", label);
    if (wb && ab && be) {
        size_t wn = ggml_nbytes(cw), xn = ggml_nbytes(cx);
        uint8_t * wbytes = malloc(wn), * back = malloc(wn);
        ggml_backend_tensor_get(cw, wbytes, 0, wn);
        ggml_backend_tensor_set(w, wbytes, 0, wn);
        memset(back, 0xAB, wn);
        ggml_backend_tensor_get(w, back, 0, wn);
        CHECK(memcmp(back, wbytes, wn) == 0, "%s: the split experts read back as set", label);
        memset(back, 0, wn);
        ggml_backend_tensor_get(w, back, wn / 3, wn / 2);
        CHECK(memcmp(back, wbytes + wn / 3, wn / 2) == 0, "%s: part of the split experts (across experts) read back", label);
        void * xv = malloc(xn);
        ggml_backend_tensor_get(cx, xv, 0, xn);
        ggml_backend_tensor_set(x, xv, 0, xn);
        ggml_backend_tensor_set(ids, iv, 0, ggml_nbytes(ids));
        CHECK(ggml_backend_dev_supports_op(g_gpus[main], y), "%s: the main GPU claims the split MUL_MAT_ID", label);
        for (int o = 0; o < g_n; o++)
            if (o != main) CHECK(!ggml_backend_dev_supports_op(g_gpus[o], y), "%s: %s declines it", label, ggml_backend_dev_name(g_gpus[o]));
        for (int rep = 0; rep < 3; rep++) {
            float * zeros = calloc(1, ggml_nbytes(y));
            ggml_backend_tensor_set(y, zeros, 0, ggml_nbytes(y));
            free(zeros);
            CHECK(rf_compute(be, g) == GGML_STATUS_SUCCESS, "%s: compute", label);
            float * got = rf_tensor_to_float(y);
            double e = rf_nmse(got, ref, (size_t) ggml_nelements(cy));
            CHECK(e <= 1e-4, "%s (run %d): nmse %.3g (got[0]=%g ref[0]=%g)", label, rep, e, got[0], ref[0]);
            free(got);
        }
        free(xv);
        free(wbytes);
        free(back);
    }
    if (be) ggml_backend_free(be);
    if (wb) ggml_backend_buffer_free(wb);
    if (ab) ggml_backend_buffer_free(ab);
    ggml_backend_buffer_free(cb);
    ggml_backend_free(cpu);
    free(iv);
    free(ref);
    ggml_free(cc);
    ggml_free(wc);
    ggml_free(ac);
}

// Ops other than MUL_MAT and MUL_MAT_ID (and those with a split tensor as src1, or a MUL_MAT of
// 3-D split weights) decline split weights.
static void check_declines(int main, ggml_backend_buffer_type_t split) {
    struct ggml_context * c = new_ctx(8);
    struct ggml_tensor * w = ggml_new_tensor_2d(c, GGML_TYPE_F32, 64, 32);
    struct ggml_tensor * e = ggml_new_tensor_3d(c, GGML_TYPE_F32, 64, 32, 4);  // experts
    struct ggml_context * ac = new_ctx(16);
    struct ggml_tensor * ids = ggml_new_tensor_1d(ac, GGML_TYPE_I32, 4);
    struct ggml_tensor * x = ggml_new_tensor_2d(ac, GGML_TYPE_F32, 64, 32);
    struct ggml_tensor * v = ggml_new_tensor_2d(ac, GGML_TYPE_F32, 64, 16);
    struct ggml_tensor * gr = ggml_get_rows(ac, w, ids);
    struct ggml_tensor * add = ggml_add(ac, w, x);
    struct ggml_tensor * mm1 = ggml_mul_mat(ac, v, w);
    struct ggml_tensor * xid = ggml_new_tensor_3d(ac, GGML_TYPE_F32, 64, 1, 4);
    struct ggml_tensor * ids2 = ggml_new_tensor_2d(ac, GGML_TYPE_I32, 2, 4);
    struct ggml_tensor * mmid = ggml_mul_mat_id(ac, e, xid, ids2);
    struct ggml_tensor * xb = ggml_new_tensor_3d(ac, GGML_TYPE_F32, 64, 5, 4);
    struct ggml_tensor * mm3 = ggml_mul_mat(ac, e, xb);
    ggml_backend_buffer_t wb = ggml_backend_alloc_ctx_tensors_from_buft(c, split);
    ggml_backend_buffer_t ab = ggml_backend_alloc_ctx_tensors_from_buft(ac, ggml_backend_dev_buffer_type(g_gpus[main]));
    CHECK(wb && ab, "buffers");
    if (wb && ab) {
        CHECK(!ggml_backend_dev_supports_op(g_gpus[main], gr), "GET_ROWS of split weights declined");
        CHECK(!ggml_backend_dev_supports_op(g_gpus[main], add), "ADD of split weights declined");
        CHECK(!ggml_backend_dev_supports_op(g_gpus[main], mm1), "MUL_MAT with split src1 declined");
        CHECK(ggml_backend_dev_supports_op(g_gpus[main], mmid), "MUL_MAT_ID of split experts claimed");
        CHECK(!ggml_backend_dev_supports_op(g_gpus[main], mm3), "MUL_MAT of a 3-D split tensor declined");
        for (int o = 0; o < g_n; o++)
            if (o != main) CHECK(!ggml_backend_dev_supports_op(g_gpus[o], mmid), "%s declines the split MUL_MAT_ID", ggml_backend_dev_name(g_gpus[o]));
        CHECK(ggml_backend_dev_supports_buft(g_gpus[main], split), "the main GPU takes its split buffer type");
        // The weight itself (a leaf the scheduler places by asking who runs it): the main GPU only.
        CHECK(ggml_backend_dev_supports_op(g_gpus[main], w), "the main GPU holds the split weight (op NONE)");
        struct ggml_tensor * wv = ggml_view_1d(ac, w, 64, 0);
        CHECK(!ggml_backend_dev_supports_op(g_gpus[main], wv), "a view of a split weight declined");
        for (int o = 0; o < g_n; o++)
            if (o != main) CHECK(!ggml_backend_dev_supports_op(g_gpus[o], w), "%s does not hold it", ggml_backend_dev_name(g_gpus[o]));
        for (int o = 0; o < g_n; o++)
            if (o != main) CHECK(!ggml_backend_dev_supports_buft(g_gpus[o], split), "%s does not", ggml_backend_dev_name(g_gpus[o]));
        CHECK(!ggml_backend_dev_supports_buft(g_cpu, split), "ggml-cpu does not");
        CHECK(!ggml_backend_buft_is_host(split), "not host memory");
        CHECK(ggml_backend_buft_get_device(split) == g_gpus[main], "the buffer type's device is the main GPU");
    }
    if (wb) ggml_backend_buffer_free(wb);
    if (ab) ggml_backend_buffer_free(ab);
    ggml_free(c);
    ggml_free(ac);
}

static void test_row_split(void) {
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    g_split_fn = (ggml_backend_split_buffer_type_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_split_buffer_type");
    CHECK(g_split_fn != NULL, "the registry offers ggml_backend_split_buffer_type");
    if (!g_split_fn) return;
    CHECK(g_split_fn(0, NULL) == NULL, "RFCPU (registry index 0) is no main device for a split");
    const struct mm_case cases[] = {
        { GGML_TYPE_Q4_0, 256, 1000, 1 },  // odd rows (not a multiple of the rounding), one column
        { GGML_TYPE_Q4_0, 512, 4096, 7 },
        { GGML_TYPE_Q8_0, 256, 333, 3 },
        { GGML_TYPE_Q4_K, 256, 96, 9 },
        { GGML_TYPE_Q6_K, 256, 64, 1 },
        { GGML_TYPE_F16, 128, 77, 5 },
        { GGML_TYPE_F32, 64, 3, 2 },       // fewer rows than the rounding or the devices
        { GGML_TYPE_Q4_0, 256, 160, 64 },  // a prompt-sized batch
    };
    for (int main = 0; main < g_n; main++) {
        // tensor_split choices: NULL (free memory), equal, all on the main GPU, all on another,
        // and the main GPU given nothing.
        float ts[4][MAX_GPUS];
        const char * names[4] = { "equal", "main only", "last only", "main none" };
        int n_ts = 0;
        for (int k = 0; k < 4; k++) {
            for (int i = 0; i < MAX_GPUS; i++) ts[k][i] = 0;
        }
        for (int i = 0; i < g_n; i++) ts[0][i] = 1;
        ts[1][main] = 1;
        ts[2][g_n - 1] = 1;
        for (int i = 0; i < g_n; i++) ts[3][i] = i == main ? 0 : 1;
        n_ts = g_n > 1 ? 4 : 2;
        ggml_backend_buffer_type_t free_split = g_split_fn(g_reg_index[main], NULL);
        CHECK(free_split != NULL, "split buffer type over free memory");
        float zero[MAX_GPUS] = { 0 };
        CHECK(g_split_fn(g_reg_index[main], zero) == free_split, "all-zero tensor_split is the free-memory split");
        if (free_split) {
            printf("%s\n", ggml_backend_buft_name(free_split));
            check_declines(main, free_split);
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_split_mm(main, free_split, "NULL", cases[c]);
        }
        for (int k = 0; k < n_ts; k++) {
            ggml_backend_buffer_type_t s = g_split_fn(g_reg_index[main], ts[k]);
            CHECK(s != NULL, "split %s", names[k]);
            if (!s) continue;
            CHECK(g_split_fn(g_reg_index[main], ts[k]) == s, "the same split gives the same buffer type");
            printf("%s\n", ggml_backend_buft_name(s));
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_split_mm(main, s, names[k], cases[c]);
            run_split_block(main, s, names[k], GGML_TYPE_Q4_0, 256, 1);
            run_split_block(main, s, names[k], GGML_TYPE_Q8_0, 256, 20);
            run_split_mmid(main, s, names[k], GGML_TYPE_Q4_0, 256, 200, 8, 2, 1, 1);   // a token's gate/up
            run_split_mmid(main, s, names[k], GGML_TYPE_Q4_K, 256, 96, 4, 2, 2, 1);    // a token's down
            run_split_mmid(main, s, names[k], GGML_TYPE_Q8_0, 512, 128, 6, 3, 1, 24);  // a prompt's
            run_split_mmid(main, s, names[k], GGML_TYPE_F16, 64, 33, 3, 2, 2, 5);      // odd rows
        }
    }
}

// ---- 4. the meta device's AllReduce ------------------------------------------------------------

typedef void * (*comm_init_fn)(ggml_backend_t *, size_t);
typedef void (*comm_free_fn)(void *);
typedef bool (*comm_allreduce_fn)(void *, struct ggml_tensor **);

static void allreduce_over(ggml_backend_dev_t * devs, int n, const char * label) {
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    comm_init_fn init = (comm_init_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_comm_init");
    comm_free_fn cfree = (comm_free_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_comm_free");
    comm_allreduce_fn ar = (comm_allreduce_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_comm_allreduce_tensor");
    CHECK(init && cfree && ar, "comm proc addresses");
    if (!init || !cfree || !ar) return;
    ggml_backend_t be[MAX_GPUS];
    for (int i = 0; i < n; i++) be[i] = ggml_backend_dev_init(devs[i], NULL);
    void * comm = init(be, (size_t) n);
    CHECK(comm != NULL, "comm_init over %s", label);
    if (comm) {
        // Growing and shrinking sizes: the send buffers grow, and alternate calls use the other one.
        const int64_t sizes[] = { 1, 7, 4096, 300001, 5, 4096, 131072 };
        const int n_sizes = (int) (sizeof(sizes) / sizeof(sizes[0]));
        struct ggml_context * ctx[MAX_GPUS];
        struct ggml_tensor * t[MAX_GPUS][8];
        ggml_backend_buffer_t buf[MAX_GPUS];
        for (int i = 0; i < n; i++) {
            ctx[i] = new_ctx(n_sizes + 1);
            for (int k = 0; k < n_sizes; k++) t[i][k] = ggml_new_tensor_1d(ctx[i], GGML_TYPE_F32, sizes[k]);
            t[i][n_sizes] = ggml_new_tensor_1d(ctx[i], GGML_TYPE_F16, 64);
            buf[i] = ggml_backend_alloc_ctx_tensors_from_buft(ctx[i], ggml_backend_dev_buffer_type(devs[i]));
            CHECK(buf[i] != NULL, "buffer on %s", ggml_backend_dev_name(devs[i]));
        }
        for (int rep = 0; rep < 2; rep++) {
            for (int k = 0; k < n_sizes; k++) {
                const int64_t ne = sizes[k];
                // Round 2: the last backend's part was not computed (a zero-sized slice).
                const int skip = rep == 1 ? n - 1 : -1;
                float * part[MAX_GPUS];
                struct ggml_tensor * ts[MAX_GPUS];
                for (int i = 0; i < n; i++) {
                    ts[i] = t[i][k];
                    rf_fill_tensor(ts[i], 1000 + 97 * k + 13 * i + rep, -3, 3);
                    ts[i]->flags = i == skip ? 0 : GGML_TENSOR_FLAG_COMPUTE;
                    part[i] = malloc(ne * sizeof(float));
                    ggml_backend_tensor_get(ts[i], part[i], 0, ne * sizeof(float));
                }
                CHECK(ar(comm, ts), "allreduce %s, %lld values", label, (long long) ne);
                float * want = malloc(ne * sizeof(float)), * got = malloc(ne * sizeof(float));
                for (int64_t j = 0; j < ne; j++) {
                    float v = skip == 0 ? 0.0f : part[0][j];
                    for (int i = 1; i < n; i++) v += i == skip ? 0.0f : part[i][j];
                    want[j] = v;
                }
                for (int i = 0; i < n; i++) {
                    ggml_backend_synchronize(be[i]);
                    ggml_backend_tensor_get(ts[i], got, 0, ne * sizeof(float));
                    CHECK(memcmp(want, got, ne * sizeof(float)) == 0, "allreduce %s, %lld values%s: result on backend %d",
                          label, (long long) ne, skip >= 0 ? ", one part not computed" : "", i);
                }
                for (int i = 0; i < n; i++) free(part[i]);
                free(want);
                free(got);
            }
        }
        // Declined, nothing written: F16, sizes that differ.
        struct ggml_tensor * f16[MAX_GPUS], * mixed[MAX_GPUS];
        for (int i = 0; i < n; i++) {
            f16[i] = t[i][n_sizes];
            mixed[i] = t[i][i == 0 ? 0 : 1];
        }
        CHECK(!ar(comm, f16), "allreduce of F16 declined");
        CHECK(!ar(comm, mixed), "allreduce of different sizes declined");
        cfree(comm);
        for (int i = 0; i < n; i++) {
            if (buf[i]) ggml_backend_buffer_free(buf[i]);
            ggml_free(ctx[i]);
        }
    }
    for (int i = 0; i < n; i++) if (be[i]) ggml_backend_free(be[i]);
    printf("AllReduce over %s checked\n", label);
}

static void test_allreduce(void) {
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    comm_init_fn init = (comm_init_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_comm_init");
    // A foreign backend (ggml-cpu's) is declined: the meta device then uses its own AllReduce.
    if (init) {
        ggml_backend_t b[2] = { ggml_backend_dev_init(g_cpu, NULL), ggml_backend_dev_init(g_gpus[0], NULL) };
        CHECK(init(b, 2) == NULL, "comm_init with a ggml-cpu backend declined");
        CHECK(init(b + 1, 1) == NULL, "comm_init over one backend declined");
        for (int i = 0; i < 2; i++) if (b[i]) ggml_backend_free(b[i]);
    }
    ggml_backend_dev_t twice[2] = { g_gpus[0], g_gpus[0] };
    allreduce_over(twice, 2, "two backends of RFGPU0");
    if (g_n >= 2) {
        int n = g_n < 8 ? g_n : 8;
        allreduce_over(g_gpus, n, "every GPU");
    } else {
        printf("AllReduce between GPUs: skipped (one GPU)\n");
    }
}

int main(int argc, char ** argv) {
    (void) argc;
    (void) argv;
    g_cpu = rf_ggml_cpu_device();
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg) && g_n < MAX_GPUS; i++) {
        ggml_backend_dev_t d = ggml_backend_reg_dev_get(reg, i);
        if (strncmp(ggml_backend_dev_name(d), "RFGPU", 5) == 0) {
            g_reg_index[g_n] = (int) i;
            g_gpus[g_n++] = d;
        }
    }
    if (g_n == 0) {
        printf("skipped: no GPU\n");
        return 0;
    }
    printf("%d GPU(s)\n", g_n);
    test_memory();
    test_pair_copies();
    test_row_split();
    test_allreduce();
    return rf_finish("test_multi_gpu");
}
