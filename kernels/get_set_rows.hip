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

GET_ROWS_KERNEL(f32, w_f32)
GET_ROWS_KERNEL(f16, w_f16)
GET_ROWS_KERNEL(q4_0, w_q4_0)
GET_ROWS_KERNEL(q4_1, w_q4_1)
GET_ROWS_KERNEL(q5_0, w_q5_0)
GET_ROWS_KERNEL(q5_1, w_q5_1)
GET_ROWS_KERNEL(q8_0, w_q8_0)
GET_ROWS_KERNEL(iq4_nl, w_iq4_nl)
GET_ROWS_KERNEL(q4_k, w_q4_k)
GET_ROWS_KERNEL(q6_k, w_q6_k)
GET_ROWS_KERNEL(bf16, w_bf16)
GET_ROWS_KERNEL(q2_k, w_q2_k)
GET_ROWS_KERNEL(q3_k, w_q3_k)
GET_ROWS_KERNEL(q5_k, w_q5_k)

// dst row ids[i, i02 % ine1, i03 % ine2] of matrix (i02, i03) = src0 row (i, i02, i03).
RF_KERNEL void set_rows(const char* a, const char* ids, char* d, int src_f16, int dst_f16, int ids_i64, i64 ne0,
                        i64 ane1, i64 ane2, i64 ine1, i64 ine2, i64 dne1, i64 nba1, i64 nba2, i64 nba3, i64 nbi0,
                        i64 nbi1, i64 nbi2, i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    const i64 r = blockIdx.x;
    const i64 i = r % ane1, i02 = (r / ane1) % ane2, i03 = r / (ane1 * ane2);
    const char* ip = ids + i * nbi0 + (i02 % ine1) * nbi1 + (i03 % ine2) * nbi2;
    const i64 row = ids_i64 ? *(const i64*)ip : (i64) * (const int*)ip;
    if (row < 0 || row >= dne1) return;
    const char* src = a + i * nba1 + i02 * nba2 + i03 * nba3;
    char* dst = d + row * nbd1 + i02 * nbd2 + i03 * nbd3;
    for (i64 k = threadIdx.x; k < ne0; k += blockDim.x) {
        const float v = src_f16 ? rf_f16_to_f32(((const f16_bits*)src)[k]) : ((const float*)src)[k];
        if (dst_f16) {
            ((f16_bits*)dst)[k] = rf_f32_to_f16(v);
        } else {
            ((float*)dst)[k] = v;
        }
    }
}
