//! Q4_1: blocks of 32 values, f16 scale and f16 min, 16 bytes of 4-bit codes; x = d * q + m.
//! Nibble order as Q4_0. Multiplied with Q8_1, whose `s` carries the min's contribution.

use super::q8_1::BlockQ8_1;
use super::{f16_to_f32, f32_to_f16, use_avx2, use_neon};
use crate::cpu::types::VecDot;

pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// # Safety
/// `src` must point to `dst.len() / QK` readable blocks of Q4_1 (20 bytes each),
/// aligned to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockQ4_1;
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b = &*blocks.add(i);
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for j in 0..QK / 2 {
            out[j] = (b.qs[j] & 0x0f) as f32 * d + m;
            out[j + QK / 2] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// ggml's reference: d = (max - min) / 15, codes rounded half up and capped at 15.
///
/// # Safety
/// `dst` must be valid for writes of `src.len() / QK` blocks of Q4_1 (20 bytes each),
/// aligned to 2 bytes.
pub unsafe fn from_f32(src: &[f32], dst: *mut u8) {
    let blocks = dst as *mut BlockQ4_1;
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let (mut min, mut max) = (f32::MAX, f32::MIN);
        for &v in x {
            min = if v < min { v } else { min };
            max = if v > max { v } else { max };
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let code = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
        let b = &mut *blocks.add(i);
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        for j in 0..QK / 2 {
            b.qs[j] = code(x[j]) | (code(x[j + QK / 2]) << 4);
        }
    }
}

/// # Safety
/// `x` must point to `n / QK` readable blocks of Q4_1 (20 bytes each, aligned to 2)
/// and `y` to `n / QK` blocks of Q8_1 (36 bytes each, aligned to 2).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockQ4_1, y as *const BlockQ8_1);
    let mut sum = 0f32;
    for i in 0..n / QK {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            sumi += (bx.qs[j] & 0x0f) as i32 * by.qs[j] as i32;
            sumi += (bx.qs[j] >> 4) as i32 * by.qs[j + QK / 2] as i32;
        }
        sum += sumi as f32 * (f16_to_f32(bx.d) * f16_to_f32(by.d))
            + f16_to_f32(bx.m) * f16_to_f32(by.s);
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

    /// Adds the block's scaled integer dot to `acc`; returns it and [d·d', m·s', ..] whose
    /// lane 1 is the block's min term.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(bx: &BlockQ4_1, by: &BlockQ8_1, acc: __m256) -> (__m256, __m128) {
        // Codes are unsigned 0..15: maddubs takes them as they are.
        let p = dot_u8_i8(
            nibbles(bx.qs.as_ptr()),
            _mm256_loadu_si256(by.qs.as_ptr() as *const __m256i),
        );
        // [dx, mx, dy, sy] in one conversion, then [dx·dy, mx·sy, ..].
        let xdm = (bx as *const BlockQ4_1 as *const u32).read_unaligned();
        let yds = (by as *const BlockQ8_1 as *const u32).read_unaligned();
        let v = _mm_cvtph_ps(_mm_set_epi32(0, 0, yds as i32, xdm as i32));
        let prod = _mm_mul_ps(v, _mm_movehl_ps(v, v));
        let acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(p), acc);
        (acc, prod)
    }

    /// One accumulator over the blocks and the min terms summed in block order: the same
    /// arithmetic order as ggml-cpu's AVX2 kernel, so results agree to the bit and a model's
    /// activations do not drift apart from ggml's through rounding of the next quantization.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ4_1, y as *const BlockQ8_1);
        let nb = n / QK;
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for i in 0..nb {
            let (a, prod) = block(&*x.add(i), &*y.add(i), acc);
            acc = a;
            summs += _mm_cvtss_f32(_mm_movehdup_ps(prod));
        }
        hsum_f32(acc) + summs
    }

    /// `vec_dot` of R rows by C ≤ 4 columns, each pair summed exactly as `vec_dot` sums it.
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
        tile_with::<crate::cpu::quants::avx512::Maddubs, R, C>(n, x, xs, y, ys, out, os)
    }

    /// `tile` with the integer dot of the codes (unsigned 0..15, so any variant takes them as
    /// they are) done by `D`: AVX2 here, 256-bit VNNI in `avx512::tile_vnni256`/`tile_avxvnni`.
    // The loop indices address the register tile, the row and column pointers and the
    // output together (as ggml's tiled kernels do): iterators would hide that.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    pub(in crate::cpu::quants) unsafe fn tile_with<
        D: crate::cpu::quants::avx512::Dpbusd256,
        const R: usize,
        const C: usize,
    >(
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
        // Lane 2c+1 of summs[r] sums row r's min terms with column c (even lanes unused).
        let mut summs = [_mm256_setzero_ps(); R];
        for i in 0..n / QK {
            let by = |c: usize| &*(y.add(c * ys) as *const BlockQ8_1).add(i);
            // [dy0, sy0, dy1, sy1, ..]
            let ydv =
                f16_pairs::<C>(|c| (by(c) as *const BlockQ8_1 as *const u32).read_unaligned());
            for r in 0..R {
                let bx = &*(x.add(r * xs) as *const BlockQ4_1).add(i);
                if C == 1 {
                    // One column streams the matrix once: fetch the next tile's rows (the
                    // memory right after these R rows) while this one is summed. The hardware
                    // prefetcher loses track of R interleaved short rows.
                    _mm_prefetch::<_MM_HINT_T0>((bx as *const BlockQ4_1 as *const i8).add(R * xs));
                }
                let xdm = _mm_cvtph_ps(_mm_set1_epi32(
                    (bx as *const BlockQ4_1 as *const u32).read_unaligned() as i32,
                ));
                // [dx·dy0, mx·sy0, dx·dy1, mx·sy1, ..]: the products vec_dot forms one by one.
                let prod = _mm256_mul_ps(_mm256_set_m128(xdm, xdm), ydv);
                summs[r] = _mm256_add_ps(summs[r], prod);
                let q = nibbles(bx.qs.as_ptr());
                for c in 0..C {
                    let p = D::dpbusd(
                        _mm256_setzero_si256(),
                        q,
                        _mm256_loadu_si256(by(c).qs.as_ptr() as *const __m256i),
                    );
                    let scale = _mm256_permutevar8x32_ps(prod, _mm256_set1_epi32(2 * c as i32));
                    acc[r][c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), acc[r][c]);
                }
            }
        }
        for r in 0..R {
            let mut s = [0f32; 8];
            _mm256_storeu_ps(s.as_mut_ptr(), summs[r]);
            for c in 0..C {
                *(out.add(r * 4 + c * os) as *mut f32) = hsum_f32(acc[r][c]) + s[2 * c + 1];
            }
        }
    }
}

/// AVX-512 tiles (see `quants/avx512.rs`): same results as `avx2::vec_dot` to the bit. Codes
/// are unsigned 0..15, so every variant multiplies them as they are.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::*;
    use crate::cpu::quants::avx512::*;
    use crate::cpu::simd::x86::hsum;
    use std::arch::x86_64::*;

    // The loop indices address the register tile, the row and column pointers and the
    // output together (as ggml's tiled kernels do): iterators would hide that.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn tile<D: Dpbusd, const R: usize, const C: usize>(
        n: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        const {
            assert!(
                (C.is_multiple_of(2) && C <= 4 && R <= 8)
                    || (C == 1 && R.is_multiple_of(2) && R <= 8)
            )
        };
        let zero = _mm512_setzero_si512();
        let bx = |r: usize, i: usize| &*(x.add(r * xs) as *const BlockQ4_1).add(i);
        let by = |c: usize, i: usize| &*(y.add(c * ys) as *const BlockQ8_1).add(i);
        let word = |p: *const u16| (p as *const u32).read_unaligned();
        let load = |p: *const i8| _mm256_loadu_si256(p as *const __m256i);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        if C == 1 {
            // acc[q][0] holds rows 2q and 2q + 1 in `split_pair`'s lanes (row 2q's values 0-15,
            // row 2q + 1's, row 2q's 16-31, row 2q + 1's): a row pair's codes decode with one
            // shift and one mask, and each row's 8 lanes are vec_dot's 8, summed in its order.
            // Lane 2r + 1 of summs sums row r's min terms.
            let mut summs = _mm512_setzero_ps();
            for i in 0..n / QK {
                let b = by(0, i);
                let yv = split_column(load(b.qs.as_ptr()));
                // [dy, sy] in every lane pair.
                let yds = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_set1_epi32(word(&b.d) as i32)));
                // [dx·dy, mx·sy] of each row: the products vec_dot forms.
                let prod = _mm512_mul_ps(f16_pairs::<R>(|r| word(&bx(r, i).d)), yds);
                summs = _mm512_add_ps(summs, prod);
                for q in 0..R / 2 {
                    let (b0, b1) = (bx(2 * q, i), bx(2 * q + 1, i));
                    // One column streams the matrix once: fetch the next tile's rows meanwhile.
                    _mm_prefetch::<_MM_HINT_T0>((b0 as *const BlockQ4_1 as *const i8).add(R * xs));
                    _mm_prefetch::<_MM_HINT_T0>((b1 as *const BlockQ4_1 as *const i8).add(R * xs));
                    let u = nibble_pair(b0.qs.as_ptr(), b1.qs.as_ptr());
                    let p = D::dpbusd(zero, u, yv);
                    acc[q][0] = _mm512_fmadd_ps(
                        lane_quads(prod, 4 * q, 4 * q + 2),
                        _mm512_cvtepi32_ps(p),
                        acc[q][0],
                    );
                }
            }
            let mut s = [0f32; 16];
            _mm512_storeu_ps(s.as_mut_ptr(), summs);
            for q in 0..R / 2 {
                let (a, b) = hsum_split(acc[q][0]);
                *(out.add(2 * q * 4) as *mut f32) = a + s[4 * q + 1];
                *(out.add((2 * q + 1) * 4) as *mut f32) = b + s[4 * q + 3];
            }
        } else {
            // acc[r][p] holds columns 2p and 2p + 1 of row r; lane 2c + 1 of summs[r] sums row
            // r's min terms with column c.
            let mut summs = [_mm256_setzero_ps(); R];
            for i in 0..n / QK {
                // [dy0, sy0, dy1, sy1, ..]
                let ydv = _mm512_castps512_ps256(f16_pairs::<C>(|c| word(&by(c, i).d)));
                let mut yv = [zero; C];
                for p in 0..C / 2 {
                    yv[p] = join(
                        load(by(2 * p, i).qs.as_ptr()),
                        load(by(2 * p + 1, i).qs.as_ptr()),
                    );
                }
                for r in 0..R {
                    let b = bx(r, i);
                    let xdm = _mm_cvtph_ps(_mm_set1_epi32(word(&b.d) as i32));
                    // [dx·dy0, mx·sy0, dx·dy1, mx·sy1, ..]: the products vec_dot forms.
                    let prod = _mm256_mul_ps(_mm256_set_m128(xdm, xdm), ydv);
                    summs[r] = _mm256_add_ps(summs[r], prod);
                    let q = nibbles(b.qs.as_ptr());
                    let u = join(q, q);
                    let prodz = _mm512_castps256_ps512(prod);
                    for p in 0..C / 2 {
                        let pi = D::dpbusd(zero, u, yv[p]);
                        acc[r][p] = _mm512_fmadd_ps(
                            lane_pair(prodz, 4 * p, 4 * p + 2),
                            _mm512_cvtepi32_ps(pi),
                            acc[r][p],
                        );
                    }
                }
            }
            for r in 0..R {
                let mut s = [0f32; 8];
                _mm256_storeu_ps(s.as_mut_ptr(), summs[r]);
                for p in 0..C / 2 {
                    let (lo, hi) = crate::cpu::simd::x86::halves(acc[r][p]);
                    *(out.add(r * 4 + 2 * p * os) as *mut f32) = hsum(lo) + s[4 * p + 1];
                    *(out.add(r * 4 + (2 * p + 1) * os) as *mut f32) = hsum(hi) + s[4 * p + 3];
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn tile_vnni<const R: usize, const C: usize>(
        n: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        tile::<Vnni, R, C>(n, x, xs, y, ys, out, os)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn tile_bw<const R: usize, const C: usize>(
        n: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        tile::<Bw, R, C>(n, x, xs, y, ys, out, os)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn tile_vnni256<const R: usize, const C: usize>(
        n: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        super::avx2::tile_with::<VnniVl, R, C>(n, x, xs, y, ys, out, os)
    }

    #[target_feature(enable = "avxvnni,avx2,fma,f16c")]
    pub unsafe fn tile_avxvnni<const R: usize, const C: usize>(
        n: usize,
        x: *const u8,
        xs: usize,
        y: *const u8,
        ys: usize,
        out: *mut u8,
        os: usize,
    ) {
        super::avx2::tile_with::<AvxVnni, R, C>(n, x, xs, y, ys, out, os)
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::cpu::quants::neon::*;
    use std::arch::aarch64::*;

    /// Adds the block's scaled integer dot to `acc` and its min term mx·sy to lane 1 of `mins`.
    #[inline(always)]
    unsafe fn block<D: I8Dot>(
        bx: &BlockQ4_1,
        by: &BlockQ8_1,
        acc: float32x4_t,
        mins: float32x4_t,
    ) -> (float32x4_t, float32x4_t) {
        // Codes are unsigned 0..15, so they are i8 as they are.
        let q = vld1q_u8(bx.qs.as_ptr());
        let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
        let y = by.qs.as_ptr();
        let p = D::dot(
            D::dot(vdupq_n_s32(0), lo, vld1q_s8(y)),
            hi,
            vld1q_s8(y.add(16)),
        );
        // [dx, mx, dy, sy] in one conversion; times [dy, sy, dx, mx] gives [dx·dy, mx·sy, ..].
        let xdm = (bx as *const BlockQ4_1 as *const u32).read_unaligned();
        let yds = (by as *const BlockQ8_1 as *const u32).read_unaligned();
        let v = f16x4(xdm as u64 | (yds as u64) << 32);
        let prod = vmulq_f32(v, vextq_f32::<2>(v, v));
        (
            vfmaq_laneq_f32::<0>(acc, vcvtq_f32_s32(p), prod),
            vaddq_f32(mins, prod),
        )
    }

    #[inline(always)]
    unsafe fn dot<D: I8Dot>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockQ4_1, y as *const BlockQ8_1);
        let mut mins = vdupq_n_f32(0.0);
        let acc = sum_blocks(n / QK, |i, acc| {
            let (acc, m) = block::<D>(&*x.add(i), &*y.add(i), acc, mins);
            mins = m;
            acc
        });
        vaddvq_f32(acc) + vgetq_lane_f32::<1>(mins)
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
    use crate::cpu::quants::{q8_1, testutil::*};
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
            GgmlType::Q4_1,
            from_f32,
            &[0, 2],
            GgmlType::Q8_1,
            q8_1::from_f32,
            avx2::vec_dot,
            &vnni,
            &bw,
            &vnni256,
            &avxvnni,
        );
    }

    #[test]
    fn round_trip() {
        check_round_trip(GgmlType::Q4_1, from_f32, to_f32, 0.12);
    }

    #[test]
    fn vec_dot_matches() {
        check_vec_dot(
            GgmlType::Q4_1,
            from_f32,
            to_f32,
            GgmlType::Q8_1,
            q8_1::from_f32,
            q8_1::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn tiles_equal_vec_dot() {
        check_tiles(
            GgmlType::Q4_1,
            from_f32,
            GgmlType::Q8_1,
            q8_1::from_f32,
            vec_dot_fn(),
            &tiles(GgmlType::Q4_1),
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
            "Q4_1: not the expected NEON kernel"
        );
        check_vec_dot(
            GgmlType::Q4_1,
            from_f32,
            to_f32,
            GgmlType::Q8_1,
            q8_1::from_f32,
            q8_1::to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
        check_vec_dot_extremes(
            GgmlType::Q4_1,
            to_f32,
            &[0, 2],
            GgmlType::Q8_1,
            q8_1::from_f32,
            q8_1::to_f32,
            neon::vec_dot,
            vec_dot_ref,
        );
    }

    #[test]
    fn vec_dot_extremes() {
        check_vec_dot_extremes(
            GgmlType::Q4_1,
            to_f32,
            &[0, 2],
            GgmlType::Q8_1,
            q8_1::from_f32,
            q8_1::to_f32,
            vec_dot_fn(),
            vec_dot_ref,
        );
    }

    #[test]
    fn golden_block() {
        // min -1, max 14 → d = 1.0 (0x3c00), m = -1.0 (0xbc00), code = x + 1.
        let mut x = [0f32; 32];
        for j in 0..16 {
            x[j] = j as f32 - 1.0;
            x[j + 16] = 14.0 - j as f32;
        }
        x[17] = 12.49; // 13.49 → 13
        x[18] = 11.5; // 12.5 → 13 (half up)
        let q = quantize(GgmlType::Q4_1, from_f32, &x);
        let mut want = vec![0x00u8, 0x3c, 0x00, 0xbc];
        for j in 0..16u8 {
            want.push(j | ((15 - j) << 4));
        }
        want[4 + 1] = 1 | (13 << 4);
        want[4 + 2] = 2 | (13 << 4);
        assert_eq!(q, want);
        assert_eq!(dequantize(to_f32, &q, 32)[18], 12.0);
    }
}
