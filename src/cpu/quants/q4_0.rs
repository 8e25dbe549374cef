//! Q4_0: blocks of 32 values, one f16 scale and 16 bytes of 4-bit codes; x = d * (q - 8).
//! Byte j holds element j in its low nibble and element j + 16 in its high nibble.

use super::q8_0::BlockQ8_0;
use super::{f16_to_f32, f32_to_f16, use_avx2, use_neon};
use crate::cpu::types::VecDot;

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of Q4_0 (18 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ4_0;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for j in 0..QK / 2 {
            out[j] = ((b.qs[j] & 0x0f) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// ggml's reference: the value of largest magnitude maps onto -8, codes are truncated after
/// adding 8.5 (round half up), capped at 15.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q4_0 (18 bytes each),
/// aligned to 2 bytes.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ4_0;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let code = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        let b = &mut *blocks.add(i);
        b.d = f32_to_f16(d);
        for j in 0..QK / 2 {
            b.qs[j] = code(x[j]) | (code(x[j + QK / 2]) << 4);
        }
    }
}

/// # Safety
/// `x` must point to `n / QK` readable blocks of Q4_0 (18 bytes each, aligned to 2)
/// and `y` to `n / QK` blocks of Q8_0 (34 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ4_0, y as *const BlockQ8_0);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            sumi += ((bx.qs[j] & 0x0f) as i32 - 8) * by.qs[j] as i32;
            sumi += ((bx.qs[j] >> 4) as i32 - 8) * by.qs[j + QK / 2] as i32;
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

    /// One accumulator over the blocks, then a horizontal sum: ggml-cpu's AVX2 order, so
    /// results agree with ggml's to the bit.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ4_0, y as *const BlockQ8_0);
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let q = _mm256_sub_epi8(nibbles(bx.qs.as_ptr()), _mm256_set1_epi8(8));
            let p = dot_i8_i8(q, _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i));
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(f16_mul(bx.d, by.d)),
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
                let bx = &*(x.add(r * xs) as *const BlockQ4_0).add(i);
                if C == 1 {
                    // One column streams the matrix once: fetch the next tile's rows (the
                    // memory right after these R rows) while this one is summed. The hardware
                    // prefetcher loses track of R interleaved short rows.
                    _mm_prefetch::<_MM_HINT_T0>((bx as *const BlockQ4_0 as *const i8).add(R * xs));
                }
                let dx = f16_load(&bx.d);
                let q = _mm256_sub_epi8(nibbles(bx.qs.as_ptr()), _mm256_set1_epi8(8));
                // dot_i8_i8 with the row's half (|q|) done once for all columns.
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

    impl CodesBlock for BlockQ4_0 {
        const OFFSET: i8 = 8;
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
            crate::cpu::quants::x86::nibbles(self.qs.as_ptr())
        }
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        unsafe fn split_pair(a: &Self, b: &Self, _: __m256i) -> __m512i {
            crate::cpu::quants::avx512::nibble_pair(a.qs.as_ptr(), b.qs.as_ptr())
        }
    }

    codes_tiles!(BlockQ4_0);
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    #[inline(always)]
    unsafe fn block<D: I8Dot>(bx: &BlockQ4_0, by: &BlockQ8_0, acc: float32x4_t) -> float32x4_t {
        let q = vld1q_u8(bx.qs.as_ptr());
        let eight = vdupq_n_s8(8);
        let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), eight);
        let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)), eight);
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
        let (x, y) = (x as *const BlockQ4_0, y as *const BlockQ8_0);
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
    use crate::cpu::quants::{q8_0, testutil::*};
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
            GgmlType::Q4_0,
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

    /// The generic 256-bit VNNI tile with the AVX2 integer dot in place of `vpdpbusd` (valid
    /// for Q4_0, whose codes are at most 15): checks its structure on any AVX2 machine.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn tile_codes256_on_avx2() {
        use crate::cpu::quants::avx512::{tile_codes256, Maddubs};
        use crate::cpu::types::{DotTile, Tile};
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn t<const R: usize, const C: usize>(
            n: usize,
            x: *const u8,
            xs: usize,
            y: *const u8,
            ys: usize,
            out: *mut u8,
            os: usize,
        ) {
            tile_codes256::<BlockQ4_0, Maddubs, R, C>(n, x, xs, y, ys, out, os)
        }
        if !crate::cpu::quants::use_avx2() {
            return;
        }
        let tile = |rows, cols, dot: DotTile| Some(Tile { rows, cols, dot });
        check_tiles(
            GgmlType::Q4_0,
            from_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            avx2::vec_dot,
            &[
                tile(2, 4, t::<2, 4>),
                tile(4, 1, t::<4, 1>),
                tile(3, 2, t::<3, 2>),
            ],
        );
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q4_0, from_f32, to_f32, 0.15);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q4_0,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
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
            "Q4_0: not the expected NEON kernel"
        );
        check_vec_dot(
            GgmlType::Q4_0,
            from_f32,
            to_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
        check_vec_dot_extremes(
            GgmlType::Q4_0,
            to_f32,
            &[0],
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
    }

    #[test]
    fn tiles_equal_vec_dot() {
        check_tiles(
            GgmlType::Q4_0,
            from_f32,
            GgmlType::Q8_0,
            q8_0::from_f32,
            vec_dot_fn(),
            &tiles(GgmlType::Q4_0),
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q4_0,
            to_f32,
            &[0],
            GgmlType::Q8_0,
            q8_0::from_f32,
            q8_0::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn golden_block() {
        // Largest magnitude -8 → d = 1.0 (f16 0x3c00), code = x + 8.
        let mut x = [0f32; 32];
        for j in 0..16 {
            x[j] = j as f32 - 8.0;
            x[j + 16] = 7.0 - j as f32;
        }
        x[17] = 6.49; // 14.99 → 14
        x[18] = 5.5; // 14.0 → 14 (half rounds up: 13.5 + 0.5)
        let q = quantize(GgmlType::Q4_0, from_f32, &x);
        let mut want = vec![0x00u8, 0x3c];
        for j in 0..16u8 {
            want.push(j | ((15 - j) << 4));
        }
        want[2 + 1] = 1 | (14 << 4);
        want[2 + 2] = 2 | (14 << 4);
        assert_eq!(q, want);
        let back = dequantize(to_f32, &q, 32);
        assert_eq!(back[18], 6.0);
        assert_eq!(back[0], -8.0);
    }
}
