//! IQ4_NL: blocks of 32 values, f16 scale and 16 bytes of 4-bit indices into a fixed
//! non-linear table; x = d * TABLE[q]. Nibble order as Q4_0. Multiplied with Q8_0.

use super::kquant_search::{best_index_int8, fp32_to_fp16, GROUP_MAX_EPS};
use super::q8_0::BlockQ8_0;
use super::{f16_to_f32, use_avx2};
use crate::cpu::types::VecDot;

pub const QK: usize = 32;

/// The format's 16 levels (part of the file format).
pub const TABLE: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq4Nl {
    pub d: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockIq4Nl>() == 18);

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of IQ4_NL (18 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockIq4Nl;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for j in 0..QK / 2 {
            out[j] = d * TABLE[(b.qs[j] & 0x0f) as usize] as f32;
            out[j + QK / 2] = d * TABLE[(b.qs[j] >> 4) as usize] as f32;
        }
    }
}

/// ggml's reference quantizer (`quantize_row_iq4_nl_ref`, what ggml-cpu's SET_ROWS runs), to
/// the bit: the largest magnitude onto -127, each value to its nearest level, then the scale
/// refitted by least squares weighted by x² (the reference path tries no other scales).
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of IQ4_NL (18 bytes each).
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockIq4Nl;
    // ggml keeps its code buffer across blocks: an all-zero block (scale 0) writes the previous
    // block's codes (which decode to 0 all the same).
    let mut l = [0u8; QK];
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let b = &mut *blocks.add(i);
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let mut d = 0f32;
        if amax >= GROUP_MAX_EPS {
            let id = 1.0 / (max / TABLE[0] as f32);
            let (mut sumqx, mut sumq2) = (0f32, 0f32);
            for (lj, &v) in l.iter_mut().zip(x) {
                let k = best_index_int8(&TABLE, id * v);
                *lj = k as u8;
                let (q, w) = (TABLE[k] as f32, v * v);
                sumqx += w * q * v;
                sumq2 += w * q * q;
            }
            d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        }
        b.d = fp32_to_fp16(d);
        for j in 0..QK / 2 {
            b.qs[j] = l[j] | (l[j + QK / 2] << 4);
        }
    }
}

/// # Safety
/// `x` must point to `n / QK` readable blocks of IQ4_NL (18 bytes each, aligned to 2)
/// and `y` to `n / QK` blocks of Q8_0 (34 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockIq4Nl, y as *const BlockQ8_0);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            sumi += TABLE[(bx.qs[j] & 0x0f) as usize] as i32 * by.qs[j] as i32;
            sumi += TABLE[(bx.qs[j] >> 4) as usize] as i32 * by.qs[j + QK / 2] as i32;
        }
        sum += sumi as f32 * (f16_to_f32(bx.d) * f16_to_f32(by.d));
    }
    sum
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return avx2::vec_dot;
    }
    #[cfg(target_arch = "aarch64")]
    if super::use_neon() {
        return if crate::cpu::simd::has_dotprod() {
            neon::vec_dot_sdot
        } else {
            neon::vec_dot
        };
    }
    let _ = use_avx2;
    vec_dot_ref
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    /// The 16 levels in both 128-bit lanes, for byte shuffles.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn table() -> __m256i {
        let t = _mm_loadu_si128(TABLE.as_ptr() as *const __m128i);
        _mm256_set_m128i(t, t)
    }

    /// The block's integer dot as 8 lanes of i32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(table: __m256i, bx: &BlockIq4Nl, by: &BlockQ8_0) -> __m256i {
        // A byte shuffle looks the 4-bit indices up in the table.
        let q = _mm256_shuffle_epi8(table, nibbles(bx.qs.as_ptr()));
        dot_i8_i8(q, _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i))
    }

    /// `acc` plus the block's dot, scaled, per lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accumulate(table: __m256i, bx: &BlockIq4Nl, by: &BlockQ8_0, acc: __m256) -> __m256 {
        _mm256_fmadd_ps(
            _mm256_set1_ps(f16_mul(by.d, bx.d)),
            _mm256_cvtepi32_ps(block(table, bx, by)),
            acc,
        )
    }

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: even and odd blocks in
    /// two accumulators, added before the horizontal sum; an odd last block is added after
    /// it with a scalar fused multiply-add (what ggml's compiled tail does).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockIq4Nl, y as *const BlockQ8_0);
        let nb = n / QK;
        let table = table();
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..nb & !1).step_by(2) {
            acc0 = accumulate(table, &*x.add(i), &*y.add(i), acc0);
            acc1 = accumulate(table, &*x.add(i + 1), &*y.add(i + 1), acc1);
        }
        let sum = hsum_f32(_mm256_add_ps(acc0, acc1));
        if nb & 1 == 0 {
            return sum;
        }
        let (bx, by) = (&*x.add(nb - 1), &*y.add(nb - 1));
        let sumi = hsum_i32(block(table, bx, by));
        (sumi as f32).mul_add(f16_mul(by.d, bx.d), sum)
    }

    /// Adds block i of R rows by C columns to `acc`, one accumulator per pair.
    // The loop indices address the register tile, the row and column pointers and the
    // output together (as ggml's tiled kernels do): iterators would hide that.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_block<const R: usize, const C: usize>(
        table: __m256i,
        i: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        acc: &mut [[__m256; C]; R],
    ) {
        let by = |c: usize| &*(y.add(c * ys) as *const BlockQ8_0).add(i);
        let mut dy = [0f32; C];
        for (c, d) in dy.iter_mut().enumerate() {
            *d = f16_load(&by(c).d);
        }
        for r in 0..R {
            let bx = &*(x.add(r * xs) as *const BlockIq4Nl).add(i);
            if C == 1 {
                // One column streams the matrix once: fetch the next tile's rows (the memory
                // right after these R rows) while this one is summed. The hardware prefetcher
                // loses track of R interleaved short rows.
                _mm_prefetch::<_MM_HINT_T0>((bx as *const BlockIq4Nl as *const i8).add(R * xs));
            }
            let dx = f16_load(&bx.d);
            let q = _mm256_shuffle_epi8(table, nibbles(bx.qs.as_ptr()));
            // dot_i8_i8 with the row's half (|q|) done once for all columns.
            let qa = _mm256_sign_epi8(q, q);
            for c in 0..C {
                let yq = _mm256_loadu_si256(by(c).qs.as_ptr() as *const __m256i);
                let p = dot_u8_i8(qa, _mm256_sign_epi8(yq, q));
                // dy·dx: the product vec_dot forms.
                acc[r][c] =
                    _mm256_fmadd_ps(_mm256_set1_ps(dy[c] * dx), _mm256_cvtepi32_ps(p), acc[r][c]);
            }
        }
    }

    /// `vec_dot` of R rows by C ≤ 4 columns, each pair summed exactly as `vec_dot` sums it.
    #[target_feature(enable = "avx2,fma,f16c")]
    // The 2 × 4 tile's 16 accumulators (two per pair, as `vec_dot`) spill some, yet it
    // measured faster than 2 × 2 and 1 × 4.
    // The loop indices address the register tile, the row and column pointers and the
    // output together (as ggml's tiled kernels do): iterators would hide that.
    #[allow(clippy::needless_range_loop)]
    pub unsafe fn tile<const R: usize, const C: usize>(
        n: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        const { assert!(C <= 4) };
        let nb = n / QK;
        let table = table();
        // Even blocks in acc[0], odd ones in acc[1], as vec_dot.
        let mut acc = [[[_mm256_setzero_ps(); C]; R]; 2];
        for i in (0..nb & !1).step_by(2) {
            tile_block::<R, C>(table, i, x, xs, y, ys, &mut acc[0]);
            tile_block::<R, C>(table, i + 1, x, xs, y, ys, &mut acc[1]);
        }
        for r in 0..R {
            for c in 0..C {
                let o = out.add(r * 4 + c * os) as *mut f32;
                *o = hsum_f32(_mm256_add_ps(acc[0][r][c], acc[1][r][c]));
                if nb & 1 != 0 {
                    let (bx, by) = (
                        &*(x.add(r * xs) as *const BlockIq4Nl).add(nb - 1),
                        &*(y.add(c * ys) as *const BlockQ8_0).add(nb - 1),
                    );
                    *o = (hsum_i32(block(table, bx, by)) as f32).mul_add(f16_mul(by.d, bx.d), *o);
                }
            }
        }
    }
}

/// AVX-512 tiles: see `quants/avx512.rs`. Same results as `avx2::vec_dot` to the bit.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::*;
    use crate::cpu::quants::avx512::{codes_tiles, CodesBlock};
    use std::arch::x86_64::*;

    impl CodesBlock for BlockIq4Nl {
        // Codes: table level + 128, offset 128.
        const OFFSET: i8 = -128;
        const EVEN_ODD: bool = true;
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn setup() -> __m256i {
            let t = _mm_loadu_si128(TABLE_U8.as_ptr() as *const __m128i);
            _mm256_set_m128i(t, t)
        }
        #[inline]
        unsafe fn d(&self) -> u16 {
            self.d
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn codes(&self, setup: __m256i) -> __m256i {
            _mm256_shuffle_epi8(setup, crate::cpu::quants::x86::nibbles(self.qs.as_ptr()))
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        unsafe fn split_pair(a: &Self, b: &Self, setup: __m256i) -> __m512i {
            let nib = crate::cpu::quants::avx512::nibble_pair(a.qs.as_ptr(), b.qs.as_ptr());
            let table = _mm512_broadcast_i32x4(_mm256_castsi256_si128(setup));
            _mm512_shuffle_epi8(table, nib)
        }
    }

    /// The levels plus 128, as unsigned bytes.
    static TABLE_U8: [u8; 16] = {
        let mut t = [0u8; 16];
        let mut k = 0;
        while k < 16 {
            t[k] = (TABLE[k] as i16 + 128) as u8;
            k += 1;
        }
        t
    };

    codes_tiles!(BlockIq4Nl);
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    #[inline(always)]
    unsafe fn block<D: I8Dot>(
        table: int8x16_t,
        bx: &BlockIq4Nl,
        by: &BlockQ8_0,
        acc: float32x4_t,
    ) -> float32x4_t {
        // A table lookup turns the 4-bit indices into levels: elements 0..15, then 16..31.
        let q = vld1q_u8(bx.qs.as_ptr());
        let lo = vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(0x0f)));
        let hi = vqtbl1q_s8(table, vshrq_n_u8::<4>(q));
        let y = by.qs.as_ptr();
        let p = D::dot(
            D::dot(vdupq_n_s32(0), lo, vld1q_s8(y)),
            hi,
            vld1q_s8(y.add(16)),
        );
        vfmaq_n_f32(acc, vcvtq_f32_s32(p), f16_mul(bx.d, by.d))
    }

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockIq4Nl, y as *const BlockQ8_0);
        let table = vld1q_s8(TABLE.as_ptr());
        vaddvq_f32(sum_blocks(n / QK, |i, acc| {
            block::<D>(table, &*x.add(i), &*y.add(i), acc)
        }))
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        dot::<Widen>(n, x, y)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn vec_dot_sdot(n: usize, x: *const u8, y: *const u8) -> f32 {
        dot::<Sdot>(n, x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_0, testutil::*};
    use crate::ggml_types::GgmlType;

    /// SDOT is dispatched where the CPU has it; the base-NEON dot (dispatched elsewhere) is
    /// checked here too.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_kernels() {
        let want = if crate::cpu::simd::has_dotprod() {
            neon::vec_dot_sdot
        } else {
            neon::vec_dot
        };
        assert_eq!(
            vec_dot_fn() as usize,
            want as usize,
            "IQ4_NL: not the expected NEON kernel"
        );
        for dot in [neon::vec_dot, vec_dot_fn()] {
            check_vec_dot(
                GgmlType::IQ4_NL,
                from_f32,
                to_f32,
                GgmlType::Q8_0,
                q8_0::from_f32,
                q8_0::to_f32,
                dot,
                vec_dot_ref,
            );
            check_vec_dot_extremes(
                GgmlType::IQ4_NL,
                to_f32,
                &[0],
                GgmlType::Q8_0,
                q8_0::from_f32,
                q8_0::to_f32,
                dot,
                vec_dot_ref,
            );
        }
    }

    /// The tiles beyond AVX2, of every shape used (and others), equal the AVX2 dot to the bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_tiles_equal_avx2_dot() {
        use crate::cpu::types::{DotTile, Tile};
        let tile = |rows, cols, dot: DotTile| Tile { rows, cols, dot };
        let vnni = [
            tile(4, 4, avx512::tile_vnni::<4, 4>),
            tile(8, 1, avx512::tile_vnni::<8, 1>),
            tile(2, 2, avx512::tile_vnni::<2, 2>),
            tile(3, 2, avx512::tile_vnni::<3, 2>),
            tile(2, 1, avx512::tile_vnni::<2, 1>),
        ];
        let bw = [
            tile(4, 4, avx512::tile_bw::<4, 4>),
            tile(8, 1, avx512::tile_bw::<8, 1>),
            tile(2, 2, avx512::tile_bw::<2, 2>),
            tile(3, 2, avx512::tile_bw::<3, 2>),
            tile(2, 1, avx512::tile_bw::<2, 1>),
        ];
        let vnni256 = [
            tile(2, 4, avx512::tile_vnni256::<2, 4>),
            tile(4, 1, avx512::tile_vnni256::<4, 1>),
            tile(1, 1, avx512::tile_vnni256::<1, 1>),
            tile(3, 2, avx512::tile_vnni256::<3, 2>),
        ];
        let avxvnni = [
            tile(2, 4, avx512::tile_avxvnni::<2, 4>),
            tile(4, 1, avx512::tile_avxvnni::<4, 1>),
            tile(1, 1, avx512::tile_avxvnni::<1, 1>),
            tile(3, 2, avx512::tile_avxvnni::<3, 2>),
        ];
        check_avx512_tiles(
            GgmlType::IQ4_NL,
            from_f32,
            &[0],
            GgmlType::Q8_0,
            q8_0::from_f32,
            avx2::vec_dot,
            &vnni,
            &bw,
            &vnni256,
            &avxvnni,
        );
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::IQ4_NL, from_f32, to_f32, 0.12);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::IQ4_NL,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn tiles_equal_vec_dot() {
        check_tiles(
            GgmlType::IQ4_NL,
            from_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            vec_dot_fn(),
            &tiles(GgmlType::IQ4_NL),
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::IQ4_NL,
            to_f32,
            &[0],
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }
}
