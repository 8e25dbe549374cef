// Writing F32/F16 values into BF16, Q8_0 or Q4_0 rows, rounded exactly as ggml-cpu's
// from_float (src/cpu/types.rs, src/cpu/quants/q8_0.rs, q4_0.rs): SET_ROWS into a quantized
// KV cache and CPY into those types. A thread per unit: one value (BF16) or one block of 32.
#include "prelude.h"
#include "quants.h"

#define QD_BF16 2
#define QD_Q8_0 3
#define QD_Q4_0 4

RF_DEVICE float qz_ld(const char* row, int src_f16, i64 k) {
    return src_f16 ? rf_f16_to_f32(((const f16_bits*)row)[k]) : ((const float*)row)[k];
}

// The block's f16 scale: one 16-bit store (Q8_0 and Q4_0 blocks, 34 and 18 bytes, start at
// even offsets of rows that do). Storing it as two bytes lost the low byte under nvrtc.
RF_DEVICE void qz_st16(unsigned char* p, unsigned short v) { *(unsigned short*)p = v; }

// Bytes of one unit of type dt (QD_Q8_0 / QD_Q4_0 blocks of 32, BF16 values).
RF_DEVICE int qz_unit_bytes(int dt) { return dt == QD_Q8_0 ? 34 : dt == QD_Q4_0 ? 18 : 2; }

// Unit u of a row of `src` into the same unit of `dst` (type dt).
RF_DEVICE void quantize_unit(const char* src, int src_f16, char* dst, int dt, i64 u) {
    if (dt == QD_BF16) {
        ((unsigned short*)dst)[u] = rf_f32_to_bf16(qz_ld(src, src_f16, u));
        return;
    }
    float x[32];
#pragma unroll
    for (int j = 0; j < 32; j++) x[j] = qz_ld(src, src_f16, u * 32 + j);
    if (dt == QD_Q8_0) {
        unsigned char* b = (unsigned char*)dst + u * qz_unit_bytes(dt);
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        qz_st16(b, rf_f32_to_f16(amax / 127.0f));
#pragma unroll
        for (int j = 0; j < 32; j++) b[2 + j] = (unsigned char)(signed char)(int)rintf(x[j] * id);
        return;
    }
    // Q4_0: the value of largest magnitude (the first on ties) maps onto -8.
    unsigned char* b = (unsigned char*)dst + u * qz_unit_bytes(dt);
    float amax = 0.0f, mx = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    }
    // __fmul_rn: the product rounded on its own (no fused add), as on the CPU.
    const float d = mx / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    qz_st16(b, rf_f32_to_f16(d));
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int lo = min(15, max(0, (int)(__fmul_rn(x[j], id) + 8.5f)));
        const int hi = min(15, max(0, (int)(__fmul_rn(x[j + 16], id) + 8.5f)));
        b[2 + j] = (unsigned char)(lo | (hi << 4));
    }
}

#if RF_UNTYPED
// SET_ROWS: dst row ids[i, i02 % ine1, i03 % ine2] of matrix (i02, i03) = src0 row (i, i02,
// i03); `units` per row. Grid-stride over all units of all source rows.
RF_KERNEL void set_rows_q(const char* a, const char* ids, char* d, int src_f16, int dt, int ids_i64, i64 units,
                          i64 ane1, i64 ane2, i64 ine1, i64 ine2, i64 dne1, i64 n, i64 nba1, i64 nba2, i64 nba3,
                          i64 nbi0, i64 nbi1, i64 nbi2, i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (i64)gridDim.x * blockDim.x) {
        const i64 u = t % units, r = t / units;
        const i64 i = r % ane1, i02 = (r / ane1) % ane2, i03 = r / (ane1 * ane2);
        const char* ip = ids + i * nbi0 + (i02 % ine1) * nbi1 + (i03 % ine2) * nbi2;
        const i64 row = ids_i64 ? *(const i64*)ip : (i64) * (const int*)ip;
        if (row < 0 || row >= dne1) continue;
        quantize_unit(a + i * nba1 + i02 * nba2 + i03 * nba3, src_f16, d + row * nbd1 + i02 * nbd2 + i03 * nbd3, dt, u);
    }
}
#endif

#if RF_UNTYPED
// CPY with dense rows of the same length: flat row r of src (shape sne1, sne2) into flat
// row r of dst (shape dne1, dne2).
RF_KERNEL void cpy_rows_q(const char* s, char* d, int src_f16, int dt, i64 units, i64 n, i64 sne1, i64 sne2,
                          i64 snb1, i64 snb2, i64 snb3, i64 dne1, i64 dne2, i64 dnb1, i64 dnb2, i64 dnb3) {
    rf_grid_begin();
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (i64)gridDim.x * blockDim.x) {
        const i64 u = t % units, r = t / units;
        const char* sr = s + (r % sne1) * snb1 + ((r / sne1) % sne2) * snb2 + (r / (sne1 * sne2)) * snb3;
        char* dr = d + (r % dne1) * dnb1 + ((r / dne1) % dne2) * dnb2 + (r / (dne1 * dne2)) * dnb3;
        quantize_unit(sr, src_f16, dr, dt, u);
    }
}
#endif
