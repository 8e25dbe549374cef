//! AVX-512 building blocks of the int8 matmul tiles, and the tile shared by the formats whose
//! blocks are 32 codes with one f16 scale, multiplied with Q8_0 (Q4_0, Q8_0, IQ4_NL).
//!
//! Float order: one 512-bit register holds two of the AVX2 tile's 256-bit accumulators (two
//! columns of one row for prompts, two rows of one column for generation; there as 128-bit
//! lanes [row a's lanes 0-3, row b's 0-3, a's 4-7, b's 4-7], `CodesBlock::split_pair`, so 4-bit
//! codes of a row pair decode at once). Each row and column sums its blocks in order, with the
//! same scale products and FMAs as the AVX2 `vec_dot`, and is reduced by the same horizontal
//! sum. So every result equals the AVX2 dot (and with it ggml-cpu's) to the bit; only the
//! integer work is wider: VNNI `vpdpbusd`, or 512-bit `vpmaddubsw` without VNNI.
//! The i32 lanes are the same in every variant: each is the exact sum of 4 adjacent products.
//!
//! One-row dots stay the AVX2 ones: their single accumulator chain (ggml's order) waits on FMA
//! latency, which wider integer work does not shorten.

use super::q8_0::BlockQ8_0;
use super::x86::f16_load;
use std::arch::x86_64::*;

/// `acc` plus, per i32 lane, the 4 products of its bytes in `u` (unsigned) and `s` (signed).
pub trait Dpbusd {
    const VNNI: bool;
    /// # Safety
    /// The CPU must have the instructions the implementation is compiled for: AVX-512 F, BW
    /// and VL, and AVX512-VNNI for `Vnni`.
    unsafe fn dpbusd(acc: __m512i, u: __m512i, s: __m512i) -> __m512i;
}

/// AVX-512 VNNI: one `vpdpbusd`, exact for all byte values.
pub struct Vnni;

/// AVX-512BW without VNNI: `vpmaddubsw` saturates its i16 pair sums, so only for u ≤ 128 with
/// |s| ≤ 127 (pair sums up to 32512).
pub struct Bw;

impl Dpbusd for Vnni {
    const VNNI: bool = true;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn dpbusd(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, u, s)
    }
}

impl Dpbusd for Bw {
    const VNNI: bool = false;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn dpbusd(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        _mm512_add_epi32(
            acc,
            _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)),
        )
    }
}

/// `[lo | hi]`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C (callers check
/// `use_avx512()` first).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// The AVX2 horizontal sums of the two halves of `v`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C (callers check
/// `use_avx512()` first).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn hsum_halves(v: __m512) -> (f32, f32) {
    let (lo, hi) = crate::cpu::simd::x86::halves(v);
    (
        crate::cpu::simd::x86::hsum(lo),
        crate::cpu::simd::x86::hsum(hi),
    )
}

/// Lane `a` of `v` in the low 8 lanes and lane `b` in the high 8.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C (callers check
/// `use_avx512()` first).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn lane_pair(v: __m512, a: usize, b: usize) -> __m512 {
    let idx = _mm512_inserti64x4::<1>(_mm512_set1_epi32(a as i32), _mm256_set1_epi32(b as i32));
    _mm512_permutexvar_ps(idx, v)
}

/// Lane `a` of `v` in 128-bit lanes 0 and 2, lane `b` in lanes 1 and 3.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C (callers check
/// `use_avx512()` first).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn lane_quads(v: __m512, a: usize, b: usize) -> __m512 {
    let (a, b) = (a as i32, b as i32);
    let idx = _mm512_setr_epi32(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b);
    _mm512_permutexvar_ps(idx, v)
}

/// N ≤ 8 f16 values `h(0..N)` as f32 lanes (upper lanes 0). Packed in general registers first:
/// 16-bit inserts would merge into (and wait for) unrelated registers (see `x86::f16_pair`).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C (callers check
/// `use_avx512()` first).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn f16s<const N: usize>(h: impl Fn(usize) -> u16) -> __m512 {
    const { assert!(N <= 8) };
    let w = |k: usize| if k < N { h(k) as u64 } else { 0 };
    let lo = w(0) | w(1) << 16 | w(2) << 32 | w(3) << 48;
    let hi = w(4) | w(5) << 16 | w(6) << 32 | w(7) << 48;
    _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64)))
}

/// N ≤ 8 32-bit words `w(0..N)`, each a pair of f16, as 2N f32 lanes (upper lanes 0).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C (callers check
/// `use_avx512()` first).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn f16_pairs<const N: usize>(w: impl Fn(usize) -> u32) -> __m512 {
    const { assert!(N <= 8) };
    let q = |k: usize| {
        let v = |j: usize| if j < N { w(j) as u64 } else { 0 };
        (v(2 * k) | v(2 * k + 1) << 32) as i64
    };
    _mm512_cvtph_ps(_mm256_set_epi64x(q(3), q(2), q(1), q(0)))
}

/// 16 packed bytes → 32 bytes: the low nibbles, then the high nibbles.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C (callers check
/// `use_avx512()` first).
/// `p` must be readable for 16 bytes (any alignment).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn nibbles(p: *const u8) -> __m256i {
    super::x86::nibbles(p)
}

/// A block of 32 codes and one f16 scale d: element = d · (code − OFFSET), codes unsigned bytes.
pub trait CodesBlock {
    /// The offset as a byte (128 is -128).
    const OFFSET: i8;
    /// Whether the AVX2 `vec_dot` sums even and odd blocks in two accumulators (added before the
    /// horizontal sum) and an odd last block after it, by a scalar FMA of its integer sum.
    const EVEN_ODD: bool;
    /// What `codes` needs in a register (a lookup table), loaded once per tile.
    ///
    /// # Safety
    /// Implementations are compiled for AVX2, FMA and F16C: the CPU must have them.
    unsafe fn setup() -> __m256i;
    /// # Safety
    /// Implementations are compiled for AVX2, FMA and F16C: the CPU must have them.
    unsafe fn d(&self) -> u16;
    /// The 32 codes in element order.
    ///
    /// # Safety
    /// Implementations are compiled for AVX2, FMA and F16C: the CPU must have them.
    unsafe fn codes(&self, setup: __m256i) -> __m256i;
    /// Two blocks' codes as 128-bit lanes [a's 0-15, b's 0-15, a's 16-31, b's 16-31]: the row
    /// pairs of a one-column tile. A 4-bit format decodes them at once (one shift, one mask).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn split_pair(a: &Self, b: &Self, setup: __m256i) -> __m512i {
        let (ca, cb) = (a.codes(setup), b.codes(setup));
        let idx = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
        _mm512_permutex2var_epi64(_mm512_castsi256_si512(ca), idx, _mm512_castsi256_si512(cb))
    }
}

/// The 16 bytes at `a` and at `b` as 128-bit lanes [a, b, a, b], the upper two shifted down a
/// nibble, then masked to 4 bits: `split_pair` of two 4-bit blocks whose codes are packed as
/// ggml packs them (value j in byte j's low nibble, value 16 + j in its high one).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL; `a` and `b` must be readable for 16 bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn nibble_pair(a: *const u8, b: *const u8) -> __m512i {
    let load16 = |p: *const u8| _mm_loadu_si128(p as *const __m128i);
    let u = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(load16(a)), 0xf0f0, load16(b));
    _mm512_and_si512(
        _mm512_mask_srli_epi16::<4>(u, 0xffff_0000, u),
        _mm512_set1_epi8(0x0f),
    )
}

/// A column's 32 values as 128-bit lanes [0-15, 0-15, 16-31, 16-31], against `split_pair`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn split_column(y: __m256i) -> __m512i {
    _mm512_permutexvar_epi64(
        _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
        _mm512_castsi256_si512(y),
    )
}

/// The AVX2 horizontal sums of the two rows of a `split_pair` accumulator (row a in 128-bit
/// lanes 0 and 2, row b in 1 and 3).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn hsum_split(v: __m512) -> (f32, f32) {
    use crate::cpu::simd::x86::hsum;
    let a = _mm256_set_m128(_mm512_extractf32x4_ps::<2>(v), _mm512_castps512_ps128(v));
    let b = _mm256_set_m128(
        _mm512_extractf32x4_ps::<3>(v),
        _mm512_extractf32x4_ps::<1>(v),
    );
    (hsum(a), hsum(b))
}

/// `total` plus the last block of an `EVEN_ODD` format, as its AVX2 `vec_dot` adds it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn odd_tail<B: CodesBlock>(bx: &B, by: &BlockQ8_0, setup: __m256i, total: f32) -> f32 {
    let mut c = [0u8; 32];
    _mm256_storeu_si256(c.as_mut_ptr() as *mut __m256i, bx.codes(setup));
    let off = B::OFFSET as u8 as i32;
    let sumi: i32 = c
        .iter()
        .zip(&by.qs)
        .map(|(&u, &y)| (u as i32 - off) * y as i32)
        .sum();
    (sumi as f32).mul_add(super::x86::f16_mul(by.d, bx.d()), total)
}

/// Block i of the R × C tile of `tile_codes` into `acc`: with C = 1, acc[q][0] holds rows 2q
/// and 2q + 1; else acc[r][p] holds columns 2p and 2p + 1 of row r. A function, not a closure:
/// `inline(always)` makes sure it lands in the caller compiled for the instruction set (a
/// closure called twice may stay out of line, with every intrinsic a call).
// The loop indices address the register tile, the row and column pointers and the
// output together (as ggml's tiled kernels do): iterators would hide that.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn step512<B: CodesBlock, D: Dpbusd, const R: usize, const C: usize>(
    i: usize,
    acc: &mut [[__m512; C]; R],
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    setup: __m256i,
) {
    let off = _mm512_set1_epi8(B::OFFSET);
    let zero = _mm512_setzero_si512();
    let bx = |r: usize| &*(x.add(r * xs) as *const B).add(i);
    let by = |c: usize| &*(y.add(c * ys) as *const BlockQ8_0).add(i);
    // Σ (u − OFFSET)·y: with VNNI as vpdpbusd(−OFFSET·Σy, u, y), the y term once per column;
    // without, as |x|·(±y) like the AVX2 kernels (vpmaddubsw cannot take u up to 255).
    let int_dot = |u: __m512i, yv: __m512i, negcorr: __m512i| {
        if D::VNNI {
            D::dpbusd(negcorr, u, yv)
        } else {
            let xv = _mm512_sub_epi8(u, off);
            let neg = _mm512_movepi8_mask(xv);
            D::dpbusd(
                zero,
                _mm512_abs_epi8(xv),
                _mm512_mask_sub_epi8(yv, neg, zero, yv),
            )
        }
    };
    let negcorr = |yv: __m512i| {
        if D::VNNI {
            _mm512_sub_epi32(zero, D::dpbusd(zero, off, yv))
        } else {
            zero
        }
    };
    let load = |p: *const i8| _mm256_loadu_si256(p as *const __m256i);
    if C == 1 {
        // Row pairs in `split_pair`'s lanes (each row's 8 lanes are vec_dot's 8).
        let b = by(0);
        let yv = split_column(load(b.qs.as_ptr()));
        let nc = negcorr(yv);
        // dx·dy per row: the product vec_dot forms.
        let s = _mm512_mul_ps(f16s::<R>(|r| bx(r).d()), _mm512_set1_ps(f16_load(&b.d)));
        for q in 0..R / 2 {
            let (b0, b1) = (bx(2 * q), bx(2 * q + 1));
            // One column streams the matrix once: fetch the next tile's rows meanwhile.
            _mm_prefetch::<_MM_HINT_T0>((b0 as *const B as *const i8).add(R * xs));
            _mm_prefetch::<_MM_HINT_T0>((b1 as *const B as *const i8).add(R * xs));
            let u = B::split_pair(b0, b1, setup);
            let p = int_dot(u, yv, nc);
            acc[q][0] = _mm512_fmadd_ps(
                lane_quads(s, 2 * q, 2 * q + 1),
                _mm512_cvtepi32_ps(p),
                acc[q][0],
            );
        }
    } else {
        let dy = f16s::<C>(|c| by(c).d);
        let dx = f16s::<R>(|r| bx(r).d());
        let mut yv = [zero; C];
        let mut nc = [zero; C];
        let mut dyv = [_mm512_setzero_ps(); C];
        for p in 0..C / 2 {
            yv[p] = join(load(by(2 * p).qs.as_ptr()), load(by(2 * p + 1).qs.as_ptr()));
            nc[p] = negcorr(yv[p]);
            dyv[p] = lane_pair(dy, 2 * p, 2 * p + 1);
        }
        for r in 0..R {
            let c = bx(r).codes(setup);
            let u = join(c, c);
            let dxr = lane_pair(dx, r, r);
            for p in 0..C / 2 {
                let prod = int_dot(u, yv[p], nc[p]);
                acc[r][p] = _mm512_fmadd_ps(
                    _mm512_mul_ps(dxr, dyv[p]),
                    _mm512_cvtepi32_ps(prod),
                    acc[r][p],
                );
            }
        }
    }
}

/// The R × C tile of a `CodesBlock` format with Q8_0 columns: C even pairs columns (prompts),
/// C = 1 pairs rows (generation). Result (r, c) goes to `out + r * 4 + c * os`.
///
/// # Safety
/// The CPU must have what `D` is compiled for and AVX-512 F, BW and VL (callers check
/// `use_avx512()` and VNNI first).
/// `x` must point to R rows of `n / 32` blocks of `B`, `xs` bytes apart; `y` to C rows of
/// `n / 32` Q8_0 blocks, `ys` bytes apart (both 2-byte aligned); `out` must be writable
/// for an f32 at `out + r * 4 + c * os` for each r < R, c < C, 4-byte aligned.
// The loop indices address the register tile, the row and column pointers and the
// output together (as ggml's tiled kernels do): iterators would hide that.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile_codes<B: CodesBlock, D: Dpbusd, const R: usize, const C: usize>(
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
            (C.is_multiple_of(2) && C <= 8 && R <= 8) || (C == 1 && R.is_multiple_of(2) && R <= 8)
        )
    };
    let nb = n / 32;
    let setup = B::setup();
    let mut acc = [[[_mm512_setzero_ps(); C]; R]; 2];
    if B::EVEN_ODD {
        for i in (0..nb & !1).step_by(2) {
            step512::<B, D, R, C>(i, &mut acc[0], x, xs, y, ys, setup);
            step512::<B, D, R, C>(i + 1, &mut acc[1], x, xs, y, ys, setup);
        }
        for r in 0..R {
            for c in 0..C {
                acc[0][r][c] = _mm512_add_ps(acc[0][r][c], acc[1][r][c]);
            }
        }
    } else {
        for i in 0..nb {
            step512::<B, D, R, C>(i, &mut acc[0], x, xs, y, ys, setup);
        }
    }
    let put = |r: usize, c: usize, total: f32| {
        let total = if B::EVEN_ODD && nb & 1 != 0 {
            odd_tail(
                &*(x.add(r * xs) as *const B).add(nb - 1),
                &*(y.add(c * ys) as *const BlockQ8_0).add(nb - 1),
                setup,
                total,
            )
        } else {
            total
        };
        *(out.add(r * 4 + c * os) as *mut f32) = total;
    };
    let acc = acc[0];
    if C == 1 {
        for q in 0..R / 2 {
            let (a, b) = hsum_split(acc[q][0]);
            put(2 * q, 0, a);
            put(2 * q + 1, 0, b);
        }
    } else {
        for r in 0..R {
            for p in 0..C / 2 {
                let (a, b) = hsum_halves(acc[r][p]);
                put(r, 2 * p, a);
                put(r, 2 * p + 1, b);
            }
        }
    }
}

/// `acc` plus, per i32 lane, the 4 products of its bytes in `u` (unsigned) and `s` (signed):
/// 256-bit VNNI, for generation (no 512-bit instructions) and CPUs with AVX-VNNI only.
pub trait Dpbusd256 {
    /// # Safety
    /// The CPU must have the instructions the implementation is compiled for: AVX2, plus
    /// AVX-VNNI or AVX512-VNNI with VL for the VNNI implementations.
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// The EVEX form (AVX-512 VNNI + VL).
pub struct VnniVl;

/// The VEX form (AVX-VNNI: Alder Lake and later, Zen 5).
pub struct AvxVnni;

/// No VNNI: AVX2 `vpmaddubsw` + `vpmaddwd` (only for u·s pairs within i16).
pub struct Maddubs;

impl Dpbusd256 for VnniVl {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

impl Dpbusd256 for AvxVnni {
    #[inline]
    #[target_feature(enable = "avxvnni,avx2,fma,f16c")]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
}

impl Dpbusd256 for Maddubs {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, super::x86::dot_u8_i8(u, s))
    }
}

/// Block i of `tile_codes256` into `acc` (a function for the reason given at `step512`).
// The loop indices address the register tile, the row and column pointers and the
// output together (as ggml's tiled kernels do): iterators would hide that.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn step256<B: CodesBlock, D: Dpbusd256, const R: usize, const C: usize>(
    i: usize,
    acc: &mut [[__m256; C]; R],
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    setup: __m256i,
) {
    let off = _mm256_set1_epi8(B::OFFSET);
    let zero = _mm256_setzero_si256();
    let by = |c: usize| &*(y.add(c * ys) as *const BlockQ8_0).add(i);
    let mut dy = [0f32; C];
    let mut yv = [zero; C];
    let mut nc = [zero; C];
    for c in 0..C {
        dy[c] = f16_load(&by(c).d);
        yv[c] = _mm256_loadu_si256(by(c).qs.as_ptr() as *const __m256i);
        nc[c] = _mm256_sub_epi32(zero, D::dpbusd(zero, off, yv[c]));
    }
    for r in 0..R {
        let b = &*(x.add(r * xs) as *const B).add(i);
        if C == 1 {
            // One column streams the matrix once: fetch the next tile's rows meanwhile.
            _mm_prefetch::<_MM_HINT_T0>((b as *const B as *const i8).add(R * xs));
        }
        let dx = f16_load(&b.d());
        let u = b.codes(setup);
        for c in 0..C {
            let p = D::dpbusd(nc[c], u, yv[c]);
            acc[r][c] =
                _mm256_fmadd_ps(_mm256_set1_ps(dx * dy[c]), _mm256_cvtepi32_ps(p), acc[r][c]);
        }
    }
}

/// The AVX2 tile of a `CodesBlock` format (one 256-bit accumulator per row and column, pairs
/// of them for `EVEN_ODD` formats) with the integer dot as VNNI `vpdpbusd(−OFFSET·Σy, u, y)`.
///
/// # Safety
/// The CPU must have what `D` is compiled for (AVX2, FMA and F16C at least; callers check
/// the VNNI level first).
/// `x` must point to R rows of `n / 32` blocks of `B`, `xs` bytes apart; `y` to C rows of
/// `n / 32` Q8_0 blocks, `ys` bytes apart (both 2-byte aligned); `out` must be writable
/// for an f32 at `out + r * 4 + c * os` for each r < R, c < C, 4-byte aligned.
// The loop indices address the register tile, the row and column pointers and the
// output together (as ggml's tiled kernels do): iterators would hide that.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile_codes256<B: CodesBlock, D: Dpbusd256, const R: usize, const C: usize>(
    n: usize,
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    out: *mut u8,
    os: usize,
) {
    let nb = n / 32;
    let setup = B::setup();
    let mut acc = [[[_mm256_setzero_ps(); C]; R]; 2];
    if B::EVEN_ODD {
        for i in (0..nb & !1).step_by(2) {
            step256::<B, D, R, C>(i, &mut acc[0], x, xs, y, ys, setup);
            step256::<B, D, R, C>(i + 1, &mut acc[1], x, xs, y, ys, setup);
        }
        for r in 0..R {
            for c in 0..C {
                acc[0][r][c] = _mm256_add_ps(acc[0][r][c], acc[1][r][c]);
            }
        }
    } else {
        for i in 0..nb {
            step256::<B, D, R, C>(i, &mut acc[0], x, xs, y, ys, setup);
        }
    }
    for r in 0..R {
        for c in 0..C {
            let mut total = crate::cpu::simd::x86::hsum(acc[0][r][c]);
            if B::EVEN_ODD && nb & 1 != 0 {
                total = odd_tail(
                    &*(x.add(r * xs) as *const B).add(nb - 1),
                    &*(y.add(c * ys) as *const BlockQ8_0).add(nb - 1),
                    setup,
                    total,
                );
            }
            *(out.add(r * 4 + c * os) as *mut f32) = total;
        }
    }
}

/// Stamps out a format's tiles beyond AVX2 over `tile_codes` and `tile_codes256`, each
/// compiled for its instruction set: `tile_vnni` and `tile_bw` (512-bit, with and without
/// VNNI), `tile_vnni256` (256-bit, EVEX) and `tile_avxvnni` (256-bit, VEX).
macro_rules! codes_tiles {
    ($block:ty) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub unsafe fn tile_vnni<const R: usize, const C: usize>(n: usize, x: *const u8, xs: usize, y: *const u8, ys: usize, out: *mut u8, os: usize) {
            crate::cpu::quants::avx512::tile_codes::<$block, crate::cpu::quants::avx512::Vnni, R, C>(n, x, xs, y, ys, out, os)
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        pub unsafe fn tile_bw<const R: usize, const C: usize>(n: usize, x: *const u8, xs: usize, y: *const u8, ys: usize, out: *mut u8, os: usize) {
            crate::cpu::quants::avx512::tile_codes::<$block, crate::cpu::quants::avx512::Bw, R, C>(n, x, xs, y, ys, out, os)
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub unsafe fn tile_vnni256<const R: usize, const C: usize>(n: usize, x: *const u8, xs: usize, y: *const u8, ys: usize, out: *mut u8, os: usize) {
            crate::cpu::quants::avx512::tile_codes256::<$block, crate::cpu::quants::avx512::VnniVl, R, C>(n, x, xs, y, ys, out, os)
        }

        #[target_feature(enable = "avxvnni,avx2,fma,f16c")]
        pub unsafe fn tile_avxvnni<const R: usize, const C: usize>(n: usize, x: *const u8, xs: usize, y: *const u8, ys: usize, out: *mut u8, os: usize) {
            crate::cpu::quants::avx512::tile_codes256::<$block, crate::cpu::quants::avx512::AvxVnni, R, C>(n, x, xs, y, ys, out, os)
        }
    };
}
pub(crate) use codes_tiles;
