// Layout ops, one thread per dst element (grid-stride), byte strides throughout; as
// src/cpu/ops/layout.rs: CONCAT (any 2- or 4-byte type), REPEAT (F32/F16), PAD (F32, zeros
// before and after), FILL (F32/F16), ARANGE (F32), DIAG_MASK_INF (F32).
#include "prelude.h"

// Element i of a dst of shape ne0..ne2 (dim 3 the rest) as four indices.
#define LAYOUT_INDEX(i, ne0, ne1, ne2)                                                                  \
    const i64 i0 = (i) % (ne0), i1 = ((i) / (ne0)) % (ne1), i2 = ((i) / ((ne0) * (ne1))) % (ne2), \
              i3 = (i) / ((ne0) * (ne1) * (ne2))
#define FOR_EACH(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

RF_DEVICE void copy_elem(const char* s, char* d, int size) {
    if (size == 4) {
        *(unsigned*)d = *(const unsigned*)s;
    } else {
        *(unsigned short*)d = *(const unsigned short*)s;
    }
}

// dst = a and b joined along dim `dim` (a first).
RF_KERNEL void concat(const char* a, const char* b, char* d, int size, int dim, i64 ne0, i64 ne1, i64 ne2, i64 n,
                      i64 ane0, i64 ane1, i64 ane2, i64 ane3, i64 nba0, i64 nba1, i64 nba2, i64 nba3, i64 nbb0,
                      i64 nbb1, i64 nbb2, i64 nbb3, i64 nbd0, i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    FOR_EACH(i, n) {
        LAYOUT_INDEX(i, ne0, ne1, ne2);
        i64 j[4] = {i0, i1, i2, i3};
        const i64 an[4] = {ane0, ane1, ane2, ane3};
        const char* s;
        if (j[dim] < an[dim]) {
            s = a + j[0] * nba0 + j[1] * nba1 + j[2] * nba2 + j[3] * nba3;
        } else {
            j[dim] -= an[dim];
            s = b + j[0] * nbb0 + j[1] * nbb1 + j[2] * nbb2 + j[3] * nbb3;
        }
        copy_elem(s, d + i0 * nbd0 + i1 * nbd1 + i2 * nbd2 + i3 * nbd3, size);
    }
}

// dst element (i0..i3) = a element (i0 % ane0, ...).
RF_KERNEL void repeat(const char* a, char* d, int size, i64 ne0, i64 ne1, i64 ne2, i64 n, i64 ane0, i64 ane1,
                      i64 ane2, i64 ane3, i64 nba0, i64 nba1, i64 nba2, i64 nba3, i64 nbd0, i64 nbd1, i64 nbd2,
                      i64 nbd3) {
    rf_grid_begin();
    FOR_EACH(i, n) {
        LAYOUT_INDEX(i, ne0, ne1, ne2);
        const char* s = a + (i0 % ane0) * nba0 + (i1 % ane1) * nba1 + (i2 % ane2) * nba2 + (i3 % ane3) * nba3;
        copy_elem(s, d + i0 * nbd0 + i1 * nbd1 + i2 * nbd2 + i3 * nbd3, size);
    }
}

// dst element = a element (i - lp) where that lies inside a, else 0. F32.
RF_KERNEL void pad_f32(const char* a, char* d, i64 ne0, i64 ne1, i64 ne2, i64 n, i64 ane0, i64 ane1, i64 ane2,
                       i64 ane3, i64 lp0, i64 lp1, i64 lp2, i64 lp3, i64 nba0, i64 nba1, i64 nba2, i64 nba3,
                       i64 nbd0, i64 nbd1, i64 nbd2, i64 nbd3) {
    rf_grid_begin();
    FOR_EACH(i, n) {
        LAYOUT_INDEX(i, ne0, ne1, ne2);
        const i64 j0 = i0 - lp0, j1 = i1 - lp1, j2 = i2 - lp2, j3 = i3 - lp3;
        const bool inside = j0 >= 0 && j0 < ane0 && j1 >= 0 && j1 < ane1 && j2 >= 0 && j2 < ane2 && j3 >= 0 && j3 < ane3;
        const float v = inside ? *(const float*)(a + j0 * nba0 + j1 * nba1 + j2 * nba2 + j3 * nba3) : 0.0f;
        *(float*)(d + i0 * nbd0 + i1 * nbd1 + i2 * nbd2 + i3 * nbd3) = v;
    }
}

// Every element = c (f16 = 1: F16 dst).
RF_KERNEL void fill(char* d, int f16, float c, i64 ne0, i64 ne1, i64 ne2, i64 n, i64 nbd0, i64 nbd1, i64 nbd2,
                    i64 nbd3) {
    rf_grid_begin();
    FOR_EACH(i, n) {
        LAYOUT_INDEX(i, ne0, ne1, ne2);
        char* p = d + i0 * nbd0 + i1 * nbd1 + i2 * nbd2 + i3 * nbd3;
        if (f16) {
            *(f16_bits*)p = rf_f32_to_f16(c);
        } else {
            *(float*)p = c;
        }
    }
}

RF_KERNEL void arange_f32(float* d, float start, float step, i64 n) {
    rf_grid_begin();
    FOR_EACH(i, n) d[i] = start + step * (float)i;
}

// Contiguous rows of ne0: element (i, j = row % ne1) = -inf where i > n_past + j, else a.
RF_KERNEL void diag_mask_inf_f32(const float* a, float* d, i64 ne0, i64 ne1, i64 n, int n_past) {
    rf_grid_begin();
    FOR_EACH(i, n) {
        const i64 c = i % ne0, j = (i / ne0) % ne1;
        d[i] = c > n_past + j ? rf_neg_inf() : a[i];
    }
}
