// GET_ROWS (any weight type of quants.h -> F32) and SET_ROWS (F32/F16 -> F32/F16, I32 or
// I64 row ids). One block per row moved; byte strides as ggml stores them.
#include "prelude.h"
#include "quants.h"

// dst row (i10, i11, i12) = src0 row ids[i10, i11, i12] of matrix (i11, i12).
template <typename W>
RF_DEVICE void get_rows(const char* a, const char* ids, char* d, i64 ne0, i64 ane1, i64 ine0, i64 ine1, i64 nba1,
                        i64 nba2, i64 nba3, i64 nbi0, i64 nbi1, i64 nbi2, i64 nbd1, i64 nbd2, i64 nbd3) {
    const i64 r = blockIdx.x;
    const i64 i10 = r % ine0, i11 = (r / ine0) % ine1, i12 = r / (ine0 * ine1);
    const i64 row = *(const int*)(ids + i10 * nbi0 + i11 * nbi1 + i12 * nbi2);
    if (row < 0 || row >= ane1) return;  // ggml-cpu aborts; a host never passes such ids
    const char* src = a + row * nba1 + i11 * nba2 + i12 * nba3;
    float* dst = (float*)(d + i10 * nbd1 + i11 * nbd2 + i12 * nbd3);
    for (i64 k = threadIdx.x; k < ne0; k += blockDim.x) dst[k] = load_w<W>(src, k);
}

#define GET_ROWS_ARGS                                                                                          \
    const char *a, const char *ids, char *d, i64 ne0, i64 ane1, i64 ine0, i64 ine1, i64 nba1, i64 nba2, i64 nba3, \
        i64 nbi0, i64 nbi1, i64 nbi2, i64 nbd1, i64 nbd2, i64 nbd3
#define GET_ROWS_PASS a, ids, d, ne0, ane1, ine0, ine1, nba1, nba2, nba3, nbi0, nbi1, nbi2, nbd1, nbd2, nbd3
#define GET_ROWS_KERNEL(NAME, W) \
    RF_KERNEL void get_rows_##NAME(GET_ROWS_ARGS) { rf_grid_begin(); get_rows<W>(GET_ROWS_PASS); }

RF_EACH_WEIGHT_TYPE(GET_ROWS_KERNEL)

// dst row ids[i, i02 % ine1, i03 % ine2] of matrix (i02, i03) = src0 row (i, i02, i03).
#define SET_ROWS_ARGS                                                                                          \
    const char *a, const char *ids, char *d, int src_f16, int dst_f16, int ids_i64, i64 ne0, i64 ane1, i64 ane2, \
        i64 ine1, i64 ine2, i64 dne1, i64 nba1, i64 nba2, i64 nba3, i64 nbi0, i64 nbi1, i64 nbi2, i64 nbd1,      \
        i64 nbd2, i64 nbd3
// The destination of flat source row r (NULL where its id is out of range), and its source.
RF_DEVICE char* set_rows_dst(SET_ROWS_ARGS, i64 r, const char** src) {
    const i64 i = r % ane1, i02 = (r / ane1) % ane2, i03 = r / (ane1 * ane2);
    const char* ip = ids + i * nbi0 + (i02 % ine1) * nbi1 + (i03 % ine2) * nbi2;
    const i64 row = ids_i64 ? *(const i64*)ip : (i64) * (const int*)ip;
    if (row < 0 || row >= dne1) return 0;
    *src = a + i * nba1 + i02 * nba2 + i03 * nba3;
    return d + row * nbd1 + i02 * nbd2 + i03 * nbd3;
}
RF_DEVICE void set_rows_value(const char* src, char* dst, int src_f16, int dst_f16, i64 k) {
    const float v = src_f16 ? rf_f16_to_f32(((const f16_bits*)src)[k]) : ((const float*)src)[k];
    if (dst_f16) {
        ((f16_bits*)dst)[k] = rf_f32_to_f16(v);
    } else {
        ((float*)dst)[k] = v;
    }
}
#define SET_ROWS_PASS a, ids, d, src_f16, dst_f16, ids_i64, ne0, ane1, ane2, ine1, ine2, dne1, nba1, nba2, nba3, nbi0, nbi1, nbi2, nbd1, nbd2, nbd3

#if RF_UNTYPED
// A block per source row.
RF_KERNEL void set_rows(SET_ROWS_ARGS) {
    rf_grid_begin();
    const char* src;
    char* dst = set_rows_dst(SET_ROWS_PASS, blockIdx.x, &src);
    if (!dst) return;
    for (i64 k = threadIdx.x; k < ne0; k += blockDim.x) set_rows_value(src, dst, src_f16, dst_f16, k);
}
#endif

#if RF_UNTYPED
// Rows shorter than a warp (llama's V cache transposed, without flash attention: one value a
// row, a whole prompt's worth of rows): a thread per value (n of them), grid-stride. A block
// per row took 0.63 ms for 512 tokens of an 8B layer on an H100.
RF_KERNEL void set_rows_short(SET_ROWS_ARGS, i64 n) {
    rf_grid_begin();
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (i64)gridDim.x * blockDim.x) {
        const char* src;
        char* dst = set_rows_dst(SET_ROWS_PASS, t / ne0, &src);
        if (dst) set_rows_value(src, dst, src_f16, dst_f16, t % ne0);
    }
}
#endif
