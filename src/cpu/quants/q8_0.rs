//! Q8_0: blocks of 32 values, one f16 scale and 32 signed bytes; x = d * q.
//! Also the activation type that Q4_0, Q5_0, Q8_0 and IQ4_NL weights are multiplied with.

use super::{f16_to_f32, f32_to_f16, use_avx2, use_neon};
use crate::cpu::types::VecDot;

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of Q8_0 (34 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ8_0;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Quantizes like ggml-cpu's x86 `quantize_row_q8_0`: scale amax/127, multiplier 127/amax,
/// round half to even. (ggml's portable reference rounds half away from zero instead; the two
/// differ only on exact ties, and the x86 path is what the CPU backend actually runs.)
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q8_0 (34 bytes each),
/// aligned to 2 bytes.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        return avx2::from_f32(src, dst);
    }
    #[cfg(target_arch = "aarch64")]
    if use_neon() {
        return neon::from_f32(src, dst);
    }
    from_f32_ref(src, dst)
}

/// Plain version of `from_f32`.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q8_0 (34 bytes each),
/// aligned to 2 bytes.
pub unsafe fn from_f32_ref(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ8_0;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let b = &mut *blocks.add(i);
        b.d = f32_to_f16(d);
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
        }
    }
}

/// # Safety
/// `x` must point to `n / QK` readable blocks of Q8_0 (34 bytes each, aligned to 2)
/// and `y` to `n / QK` blocks of Q8_0 (34 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ8_0, y as *const BlockQ8_0);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let sumi: i32 = bx
            .qs
            .iter()
            .zip(&by.qs)
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
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
    if use_neon() {
        return if crate::cpu::simd::has_dotprod() {
            neon::vec_dot_sdot
        } else {
            neon::vec_dot
        };
    }
    let _ = (use_avx2, use_neon);
    vec_dot_ref
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
        let blocks = dst as *mut BlockQ8_0;
        for (i, x) in src.chunks_exact(QK).enumerate() {
            let b = &mut *blocks.add(i);
            let (d, _) = quantize_block_i8(x.as_ptr(), b.qs.as_mut_ptr());
            b.d = f32_to_f16(d);
        }
    }

    /// One accumulator over the blocks, then a horizontal sum: the arithmetic order of
    /// ggml-cpu (its vec_dot and its tinyBLAS kernel alike), so results agree to the bit.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ8_0, y as *const BlockQ8_0);
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK {
            let (a, b) = (&*x.add(i), &*y.add(i));
            let p = dot_i8_i8(
                _mm256_loadu_si256(a.qs.as_ptr() as *const __m256i),
                _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i),
            );
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(f16_mul(a.d, b.d)),
                _mm256_cvtepi32_ps(p),
                acc,
            );
        }
        hsum_f32(acc)
    }

    /// `vec_dot` of R rows by C ≤ 4 columns, each pair summed exactly as `vec_dot` sums it.
    // The loop indices address the register tile, the row and column pointers and the
    // output together (as ggml's tiled kernels do): iterators would hide that.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
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
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for i in 0..n / QK {
            let by = |c: usize| &*(y.add(c * ys) as *const BlockQ8_0).add(i);
            let mut dy = [0f32; C];
            for (c, d) in dy.iter_mut().enumerate() {
                *d = f16_load(&by(c).d);
            }
            for r in 0..R {
                let bx = &*(x.add(r * xs) as *const BlockQ8_0).add(i);
                if C == 1 {
                    // One column streams the matrix once: fetch the next tile's rows (the
                    // memory right after these R rows) while this one is summed. The hardware
                    // prefetcher loses track of R interleaved short rows.
                    _mm_prefetch::<_MM_HINT_T0>((bx as *const BlockQ8_0 as *const i8).add(R * xs));
                }
                let dx = f16_load(&bx.d);
                let q = _mm256_loadu_si256(bx.qs.as_ptr() as *const __m256i);
                let qa = _mm256_sign_epi8(q, q);
                for c in 0..C {
                    let yq = _mm256_loadu_si256(by(c).qs.as_ptr() as *const __m256i);
                    let p = dot_u8_i8(qa, _mm256_sign_epi8(yq, q));
                    // dx·dy: the product vec_dot forms.
                    let scale = _mm256_set1_ps(dx * dy[c]);
                    acc[r][c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), acc[r][c]);
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                *(out.add(r * 4 + c * os) as *mut f32) = hsum_f32(acc[r][c]);
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

    impl CodesBlock for BlockQ8_0 {
        // Codes x + 128 (x ^ 0x80), offset 128.
        const OFFSET: i8 = -128;
        const EVEN_ODD: bool = false;
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn setup() -> __m256i {
            _mm256_setzero_si256()
        }
        #[inline]
        unsafe fn d(&self) -> u16 {
            self.d
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn codes(&self, _: __m256i) -> __m256i {
            _mm256_xor_si256(
                _mm256_loadu_si256(self.qs.as_ptr() as *const __m256i),
                _mm256_set1_epi8(-128),
            )
        }
    }

    codes_tiles!(BlockQ8_0);
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::{f32_to_f16, *};
    use std::arch::aarch64::*;

    #[target_feature(enable = "neon")]
    pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
        let blocks = dst as *mut BlockQ8_0;
        for (i, x) in src.chunks_exact(QK).enumerate() {
            let b = &mut *blocks.add(i);
            let (d, _) = quantize_block_i8(x.as_ptr(), b.qs.as_mut_ptr());
            b.d = f32_to_f16(d);
        }
    }

    #[inline(always)]
    unsafe fn block<D: I8Dot>(bx: &BlockQ8_0, by: &BlockQ8_0, acc: float32x4_t) -> float32x4_t {
        let (x, y) = (bx.qs.as_ptr(), by.qs.as_ptr());
        let p = D::dot(
            D::dot(vdupq_n_s32(0), vld1q_s8(x), vld1q_s8(y)),
            vld1q_s8(x.add(16)),
            vld1q_s8(y.add(16)),
        );
        vfmaq_n_f32(acc, vcvtq_f32_s32(p), f16_mul(bx.d, by.d))
    }

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ8_0, y as *const BlockQ8_0);
        vaddvq_f32(sum_blocks(n / QK, |i, acc| {
            block::<D>(&*x.add(i), &*y.add(i), acc)
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
    use crate::cpu::quants::testutil::*;
    use crate::ggml_types::GgmlType;

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
            GgmlType::Q8_0,
            from_f32,
            &[0],
            GgmlType::Q8_0,
            from_f32,
            avx2::vec_dot,
            &vnni,
            &bw,
            &vnni256,
            &avxvnni,
        );
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q8_0, from_f32, to_f32, 0.01);
        let x = data(32 * 9, 5);
        assert_eq!(
            quantize(GgmlType::Q8_0, from_f32, &x),
            quantize(GgmlType::Q8_0, from_f32_ref, &x)
        );
        #[cfg(target_arch = "aarch64")]
        assert_eq!(
            quantize(GgmlType::Q8_0, neon::from_f32, &x),
            quantize(GgmlType::Q8_0, from_f32_ref, &x)
        );
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q8_0,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            from_f32,
            to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    /// The machine's tiles, and the AVX2 one-column tile, which Q8_0 uses for generation only
    /// on Intel (`quants::q8_0_gemv`), so it is checked wherever AVX2 runs.
    #[test]
    fn tiles_equal_vec_dot() {
        let [gemm, gemv] = tiles(GgmlType::Q8_0);
        #[cfg(target_arch = "x86_64")]
        let gemv = gemv.or_else(|| {
            use_avx2().then_some(crate::cpu::types::Tile {
                rows: 4,
                cols: 1,
                dot: avx2::tile::<4, 1>,
            })
        });
        check_tiles(
            GgmlType::Q8_0,
            from_f32,
            GgmlType::Q8_0,
            from_f32,
            vec_dot_fn(),
            &[gemm, gemv],
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q8_0,
            to_f32,
            &[0],
            GgmlType::Q8_0,
            from_f32,
            to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

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
            "Q8_0: not the expected NEON kernel"
        );
        check_vec_dot(
            GgmlType::Q8_0,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            from_f32,
            to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
        check_vec_dot_extremes(
            GgmlType::Q8_0,
            to_f32,
            &[0],
            GgmlType::Q8_0,
            from_f32,
            to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
    }

    #[test]
    fn golden_block() {
        // amax 127 gives d = 1.0 (f16 0x3c00) and multiplier 1: q = x rounded half to even.
        let mut x = [0f32; 32];
        x[0] = -127.0;
        x[1] = -1.5; // tie → -2
        x[2] = -0.5; // tie → 0
        x[3] = 0.5; // tie → 0
        x[4] = 2.5; // tie → 2
        x[5] = 100.49;
        x[6] = 3.51;
        x[31] = 126.9;
        let q = quantize(GgmlType::Q8_0, from_f32, &x);
        let mut want = vec![0x00u8, 0x3c];
        let mut qs = [0i8; 32];
        qs[..7].copy_from_slice(&[-127, -2, 0, 0, 2, 100, 4]);
        qs[31] = 127;
        want.extend(qs.iter().map(|&v| v as u8));
        assert_eq!(q, want);
        assert_eq!(quantize(GgmlType::Q8_0, from_f32_ref, &x), want);
        #[cfg(target_arch = "aarch64")]
        assert_eq!(quantize(GgmlType::Q8_0, neon::from_f32, &x), want);
    }
}
