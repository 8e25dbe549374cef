//! Quantized block formats, one file per format (block layout, dequantize, quantize, dot).
//!
//! Every format exposes `to_f32`, `from_f32`, `vec_dot_ref` (plain scalar) and `vec_dot_fn()`,
//! which picks the fastest dot product the machine runs (AVX2 or NEON where written) once, when the
//! traits are looked up, so the hot loop pays no dispatch.

#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod iq4_nl;
pub mod kquant_search;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;

use super::types::TypeTraits;
use crate::ggml_types::GgmlType;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// Adds a format's register-blocked kernels to its traits (`avx2::tile::<R, C>`: 2 rows ×
/// 4 columns for prompts, 4 rows × 1 column for generation), enough independent accumulators
/// to hide the FMA latency that a single `vec_dot` chain waits on. Formats with tiles beyond
/// AVX2 (`, avx512`: see `quants/avx512.rs`) take what `tile_isa` picks for the machine.
macro_rules! with_tiles {
    ($t:expr, $format:ident) => {{
        #[cfg(target_arch = "x86_64")]
        let t = if use_avx2() {
            TypeTraits {
                gemm: Some(crate::cpu::types::Tile {
                    rows: 2,
                    cols: 4,
                    dot: $format::avx2::tile::<2, 4>,
                }),
                gemv: Some(crate::cpu::types::Tile {
                    rows: 4,
                    cols: 1,
                    dot: $format::avx2::tile::<4, 1>,
                }),
                ..$t
            }
        } else {
            $t
        };
        #[cfg(not(target_arch = "x86_64"))]
        let t = $t;
        t
    }};
    ($t:expr, $format:ident, avx512) => {{
        #[cfg(target_arch = "x86_64")]
        let t = {
            use crate::cpu::types::Tile;
            use TileIsa::*;
            let tile = |isa: Option<TileIsa>, gemv: bool| -> Option<Tile> {
                let t = |rows, cols, dot| Some(Tile { rows, cols, dot });
                match (isa?, gemv) {
                    (Avx2, false) => t(2, 4, $format::avx2::tile::<2, 4>),
                    (Avx2, true) => t(4, 1, $format::avx2::tile::<4, 1>),
                    (AvxVnni256, false) => t(2, 4, $format::avx512::tile_avxvnni::<2, 4>),
                    (AvxVnni256, true) => t(4, 1, $format::avx512::tile_avxvnni::<4, 1>),
                    (Vnni256, false) => t(2, 4, $format::avx512::tile_vnni256::<2, 4>),
                    (Vnni256, true) => t(4, 1, $format::avx512::tile_vnni256::<4, 1>),
                    // 32 vector registers: 4 × 4 and 8 × 1.
                    (Avx512, false) => t(4, 4, $format::avx512::tile_bw::<4, 4>),
                    (Avx512, true) => t(8, 1, $format::avx512::tile_bw::<8, 1>),
                    (Avx512Vnni, false) => t(4, 4, $format::avx512::tile_vnni::<4, 4>),
                    (Avx512Vnni, true) => t(8, 1, $format::avx512::tile_vnni::<8, 1>),
                }
            };
            TypeTraits {
                gemm: tile(tile_isa(false), false),
                gemv: tile(tile_isa(true), true),
                ..$t
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let t = with_tiles!($t, $format);
        t
    }};
}

/// Adds only a prompt tile (`avx2::tile::<R, 4>`), for the K-quants, whose best prompt shapes
/// differ from the int8 formats' (measured by `bench_kquant_tiles`, `SWEEP=1`) and whose
/// generation keeps `vec_dot` (the AVX-512 dot where the machine has it; Q4_K's exception:
/// `with_q4_k_gemv`).
macro_rules! with_gemm_tile {
    ($t:expr, $format:ident, $rows:literal) => {{
        #[cfg(target_arch = "x86_64")]
        let t = if use_avx2() {
            TypeTraits {
                gemm: Some(crate::cpu::types::Tile {
                    rows: $rows,
                    cols: 4,
                    dot: $format::avx2::tile::<$rows, 4>,
                }),
                ..$t
            }
        } else {
            $t
        };
        #[cfg(not(target_arch = "x86_64"))]
        let t = $t;
        t
    }};
}

/// Q4_K's generation tile, 2 rows × 1 column: on the 2-core AVX2 box it streams the weights
/// faster than the one-row dot (tg64 of an 8B-shaped Q4_K model 68 → 77 t/s; 4 rows gave 72).
/// Not where AVX-512 runs: there it would replace the AVX-512 one-row dot, unmeasured.
fn with_q4_k_gemv(t: TypeTraits) -> TypeTraits {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() && !use_avx512() {
        return TypeTraits {
            gemv: Some(crate::cpu::types::Tile {
                rows: 2,
                cols: 1,
                dot: q4_k::avx2::tile::<2, 1>,
            }),
            ..t
        };
    }
    t
}

#[cfg(target_arch = "x86_64")]
/// Instruction set of the int8 matmul tiles (formats with tiles beyond AVX2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileIsa {
    Avx2,
    /// 256-bit VNNI, VEX form (AVX-VNNI).
    AvxVnni256,
    /// 256-bit VNNI, EVEX form (AVX-512 VNNI + VL).
    Vnni256,
    /// 512-bit without VNNI (AVX-512BW).
    Avx512,
    Avx512Vnni,
}

#[cfg(target_arch = "x86_64")]
/// What the machine runs best, and what `ROCMFORGE_GEMM` / `ROCMFORGE_GEMV` (`avx2`,
/// `vnni256`, `avx512`) ask for instead (prompts / generation; for A/B runs). Looked up once.
fn pick_tile_isa(forced: Option<&str>) -> Option<TileIsa> {
    use super::simd::{has_avx512_vnni, has_avx_vnni};
    use TileIsa::*;
    if !use_avx2() {
        return None;
    }
    let vnni256 = if has_avx512_vnni() {
        Some(Vnni256)
    } else if has_avx_vnni() {
        Some(AvxVnni256)
    } else {
        None
    };
    let avx512 = use_avx512().then_some(if has_avx512_vnni() {
        Avx512Vnni
    } else {
        Avx512
    });
    let best = avx512.or(vnni256).unwrap_or(Avx2);
    Some(match forced {
        Some("avx2") => Avx2,
        Some("vnni256") => vnni256.unwrap_or(Avx2),
        Some("avx512") => best,
        _ => best,
    })
}

#[cfg(target_arch = "x86_64")]
static GEMM_ISA: once_cell::sync::Lazy<Option<TileIsa>> =
    once_cell::sync::Lazy::new(|| pick_tile_isa(crate::tuning::get().gemm.as_deref()));
#[cfg(target_arch = "x86_64")]
static GEMV_ISA: once_cell::sync::Lazy<Option<TileIsa>> =
    once_cell::sync::Lazy::new(|| pick_tile_isa(crate::tuning::get().gemv.as_deref()));

#[cfg(target_arch = "x86_64")]
/// The tile instruction set for generation (one column) or prompts.
pub fn tile_isa(gemv: bool) -> Option<TileIsa> {
    if gemv {
        *GEMV_ISA
    } else {
        *GEMM_ISA
    }
}

/// Kernels for a quantized type, or None where the CPU device does not handle it.
pub fn traits(t: GgmlType) -> Option<TypeTraits> {
    use GgmlType::*;
    let full = |to, from, vdt, dot| {
        Some(TypeTraits {
            to_f32: Some(to),
            from_f32: Some(from),
            vec_dot_type: vdt,
            vec_dot: Some(dot),
            gemm: None,
            gemv: None,
        })
    };
    match t {
        Q4_0 => full(q4_0::to_f32, q4_0::from_f32, Q8_0, q4_0::vec_dot_fn())
            .map(|t| with_tiles!(t, q4_0, avx512)),
        Q4_1 => full(q4_1::to_f32, q4_1::from_f32, Q8_1, q4_1::vec_dot_fn())
            .map(|t| with_tiles!(t, q4_1, avx512)),
        Q5_0 => full(q5_0::to_f32, q5_0::from_f32, Q8_0, q5_0::vec_dot_fn()),
        Q5_1 => full(q5_1::to_f32, q5_1::from_f32, Q8_1, q5_1::vec_dot_fn()),
        Q8_0 => full(q8_0::to_f32, q8_0::from_f32, Q8_0, q8_0::vec_dot_fn())
            .map(|t| with_tiles!(t, q8_0, avx512)),
        Q2_K => full(q2_k::to_f32, q2_k::from_f32, Q8_K, q2_k::vec_dot_fn()),
        Q3_K => full(q3_k::to_f32, q3_k::from_f32, Q8_K, q3_k::vec_dot_fn()),
        Q4_K => full(q4_k::to_f32, q4_k::from_f32, Q8_K, q4_k::vec_dot_fn())
            .map(|t| with_q4_k_gemv(with_gemm_tile!(t, q4_k, 2))),
        Q5_K => full(q5_k::to_f32, q5_k::from_f32, Q8_K, q5_k::vec_dot_fn()),
        Q6_K => full(q6_k::to_f32, q6_k::from_f32, Q8_K, q6_k::vec_dot_fn())
            .map(|t| with_gemm_tile!(t, q6_k, 1)),
        IQ4_NL => full(iq4_nl::to_f32, iq4_nl::from_f32, Q8_0, iq4_nl::vec_dot_fn())
            .map(|t| with_tiles!(t, iq4_nl, avx512)),
        // Activation-only types: ggml-cpu gives them a quantizer and nothing else, so do we.
        Q8_1 => Some(TypeTraits {
            to_f32: None,
            from_f32: Some(q8_1::from_f32),
            vec_dot_type: Q8_1,
            vec_dot: None,
            gemm: None,
            gemv: None,
        }),
        Q8_K => Some(TypeTraits {
            to_f32: None,
            from_f32: Some(q8_k::from_f32),
            vec_dot_type: Q8_K,
            vec_dot: None,
            gemm: None,
            gemv: None,
        }),
        _ => None,
    }
}

#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// Round-to-nearest-even, as ggml's F16C conversion does.
#[inline]
pub fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// True when the AVX2 kernels may run.
#[inline]
pub fn use_avx2() -> bool {
    super::simd::level() >= super::simd::Level::Avx2
}

/// True when the AVX-512 kernels may run.
#[inline]
pub fn use_avx512() -> bool {
    super::simd::level() >= super::simd::Level::Avx512
}

/// True when the NEON kernels may run.
#[inline]
pub fn use_neon() -> bool {
    super::simd::level() == super::simd::Level::Neon
}

/// Nearest integer, ties to even (Q8_K; the K-quant searches use `kquant_search::nearest_int`).
#[inline]
pub fn nearest(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// AVX2 building blocks shared by the formats.
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::*;

    /// Converts a 32-bit pair of f16 to 4 lanes [a, b, 0, 0]. Going through a general register
    /// matters: a 16-bit insert (what LLVM emits for one half) merges into whatever register it
    /// picks, often a loop accumulator, which chains every iteration onto the previous one.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_pair(bits: u32) -> __m128 {
        _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
    }

    /// `f16(a) * f16(b)`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_mul(a: u16, b: u16) -> f32 {
        let v = f16_pair(a as u32 | (b as u32) << 16);
        _mm_cvtss_f32(_mm_mul_ss(v, _mm_movehdup_ps(v)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16(h: u16) -> f32 {
        _mm_cvtss_f32(f16_pair(h as u32))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn hsum_f32(v: __m256) -> f32 {
        crate::cpu::simd::x86::hsum(v)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn hsum_i32(v: __m256i) -> i32 {
        hsum_i32_x4(_mm_add_epi32(
            _mm256_castsi256_si128(v),
            _mm256_extracti128_si256(v, 1),
        ))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn hsum_i32_x4(s: __m128i) -> i32 {
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
        _mm_cvtsi128_si32(s)
    }

    /// Quantizes 32 floats to i8 the way ggml-cpu's x86 `quantize_row_q8_0/1` do: multiplier
    /// 127/amax, round half to even. Returns the scale amax/127 and the sum of the codes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_block_i8(x: *const f32, qs: *mut i8) -> (f32, i32) {
        let v = [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ];
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for &vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, vi));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q = v.map(|vi| {
            _mm256_cvtps_epi32(_mm256_round_ps(
                _mm256_mul_ps(vi, id),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            ))
        });
        let sum = hsum_i32(_mm256_add_epi32(
            _mm256_add_epi32(q[0], q[1]),
            _mm256_add_epi32(q[2], q[3]),
        ));
        // packs interleave 128-bit lanes; the permute puts the 32 codes back in order.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs as *mut __m256i, p);
        (amax / 127.0, sum)
    }

    /// Loads one f16 as f32 through a general register. Written as asm because LLVM, seeing
    /// only 16 bits used, turns any plain load into a 16-bit insert that merges into (and so
    /// waits for) whatever register it picks, often another row's accumulator.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_load(p: *const u16) -> f32 {
        let v: __m128i;
        std::arch::asm!(
            "movzx {t:e}, word ptr [{p}]",
            "vmovd {v}, {t:e}",
            p = in(reg) p,
            t = out(reg) _,
            v = out(xmm_reg) v,
            options(pure, readonly, nostack, preserves_flags)
        );
        _mm_cvtss_f32(_mm_cvtph_ps(v))
    }

    /// Converts the low f16 pair of up to 4 32-bit words (words c ≥ C read as 0) to 8 lanes
    /// [a0, b0, a1, b1, ..]. Built from whole words, so no 16-bit insert can tie the result
    /// to an unrelated register (see `f16_pair`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_pairs<const C: usize>(word: impl Fn(usize) -> u32) -> __m256 {
        let w = |c: usize| if c < C { word(c) as i32 } else { 0 };
        _mm256_cvtph_ps(_mm_setr_epi32(w(0), w(1), w(2), w(3)))
    }

    /// 16 packed bytes → 32 bytes: the low nibbles, then the high nibbles.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn nibbles(p: *const u8) -> __m256i {
        let t = _mm_loadu_si128(p as *const __m128i);
        let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
    }

    /// 32 bits → 32 bytes: byte j is 0xff where bit j is set, else 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn bits_to_bytes(bits: u32) -> __m256i {
        // Byte j gets a copy of source byte j / 8, then is tested against bit j % 8.
        let which = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let spread = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), which);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
    }

    /// Byte shuffles over 16 i16 scales (8 per 128-bit lane, the same 8 in both lanes): table
    /// k puts scale 2k over the low 128 bits and scale 2k + 1 over the high ones, for formats
    /// whose sub-blocks of 16 meet 32 activations per vector (Q2_K, Q3_K, Q6_K).
    static SCALE_PAIRS: [[u8; 32]; 4] = {
        let mut t = [[0u8; 32]; 4];
        let mut k = 0;
        while k < 4 {
            let mut i = 0;
            while i < 16 {
                t[k][i] = (4 * k + (i & 1)) as u8;
                t[k][16 + i] = (4 * k + 2 + (i & 1)) as u8;
                i += 1;
            }
            k += 1;
        }
        t
    };

    /// Byte shuffles over 8 i16 scales (the same 8 in both 128-bit lanes): table j puts scale j
    /// over the whole vector, for formats with sub-blocks of 32 (Q4_K, Q5_K).
    static SCALE_BROADCASTS: [[u8; 32]; 8] = {
        let mut t = [[0u8; 32]; 8];
        let mut j = 0;
        while j < 8 {
            let mut i = 0;
            while i < 32 {
                t[j][i] = (2 * j + (i & 1)) as u8;
                i += 1;
            }
            j += 1;
        }
        t
    };

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_pairs() -> [__m256i; 4] {
        SCALE_PAIRS.map(|p| _mm256_loadu_si256(p.as_ptr() as *const __m256i))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_broadcasts() -> [__m256i; 8] {
        SCALE_BROADCASTS.map(|p| _mm256_loadu_si256(p.as_ptr() as *const __m256i))
    }

    /// Pairwise sums of u8 × i8 products, widened to 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }

    /// Pairwise sums of i8 × i8 products (neither may be -128... x may; y only in [-127, 127]).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
        // maddubs needs one unsigned operand: move x's sign onto y.
        dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
    }
}

/// NEON building blocks shared by the formats. Each int8 kernel is written once over `I8Dot`
/// and compiled twice: with SDOT where the CPU has it (chosen at run time), with widening
/// multiplies elsewhere.
#[cfg(target_arch = "aarch64")]
pub mod neon {
    pub use crate::cpu::simd::neon::{f16, f16x4, f32_to_f16};
    use std::arch::aarch64::*;

    /// Adds the 16 products of `a` and `b` into the 4 lanes of `acc`. Which lane gets which
    /// products differs between the implementations: callers use only sums over all 4.
    pub trait I8Dot {
        unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
    }

    /// Base NEON: i8·i8 products fit i16 (even -128·-128), pairwise-added into the i32 lanes.
    pub struct Widen;

    /// SDOT (FEAT_DotProd): only in functions compiled with the `dotprod` feature.
    pub struct Sdot;

    impl I8Dot for Widen {
        #[inline(always)]
        unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
            let acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
            vpadalq_s16(acc, vmull_high_s8(a, b))
        }
    }

    impl I8Dot for Sdot {
        #[inline(always)]
        unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
            sdot(acc, a, b)
        }
    }

    /// `vdotq_s32` is not stable Rust yet, hence the asm.
    #[inline]
    #[target_feature(enable = "neon,dotprod")]
    unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        std::arch::asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b, options(pure, nomem, nostack, preserves_flags));
        acc
    }

    /// 16 bits → 16 bytes: 0x10 where bit j is set (the fifth bit of Q5 codes), else 0.
    #[inline(always)]
    pub unsafe fn bit4_bytes(h: u16) -> uint8x16_t {
        let b = vcombine_u8(vdup_n_u8(h as u8), vdup_n_u8((h >> 8) as u8));
        let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        vandq_u8(vtstq_u8(b, bit), vdupq_n_u8(0x10))
    }

    /// `f16(a) * f16(b)`.
    #[inline(always)]
    pub unsafe fn f16_mul(a: u16, b: u16) -> f32 {
        let v = f16x4(a as u64 | (b as u64) << 16);
        vgetq_lane_f32::<0>(v) * vgetq_lane_f32::<1>(v)
    }

    /// The lane sums of the vectors in `p` (one per sub-block), multiplied by the i32 scales
    /// in `sc` (4 per vector, sub-block order) and added up.
    #[inline(always)]
    pub unsafe fn scaled_sum(p: &[int32x4_t], sc: &[int32x4_t]) -> i32 {
        let mut acc = vdupq_n_s32(0);
        for (g, s) in p.chunks_exact(4).zip(sc) {
            let sums = vpaddq_s32(vpaddq_s32(g[0], g[1]), vpaddq_s32(g[2], g[3]));
            acc = vmlaq_s32(acc, sums, *s);
        }
        vaddvq_s32(acc)
    }

    /// `block(i, acc)` over blocks 0..nb, even blocks into one accumulator and odd ones into
    /// another, so that consecutive FMAs do not wait on each other; returns their sum.
    #[inline(always)]
    pub unsafe fn sum_blocks(
        nb: usize,
        mut block: impl FnMut(usize, float32x4_t) -> float32x4_t,
    ) -> float32x4_t {
        let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut i = 0;
        while i + 2 <= nb {
            a0 = block(i, a0);
            a1 = block(i + 1, a1);
            i += 2;
        }
        if i < nb {
            a0 = block(i, a0);
        }
        vaddq_f32(a0, a1)
    }

    /// Quantizes 32 floats to i8 as `q8_0::from_f32_ref` does: multiplier 127/amax, round half
    /// to even (FCVTNS). Returns the scale amax/127 and the sum of the codes.
    #[inline(always)]
    pub unsafe fn quantize_block_i8(x: *const f32, qs: *mut i8) -> (f32, i32) {
        let v: [float32x4_t; 8] = std::array::from_fn(|k| vld1q_f32(x.add(4 * k)));
        // maxnm, like f32::max, ignores NaN.
        let mut m = vabsq_f32(v[0]);
        for &vk in &v[1..] {
            m = vmaxnmq_f32(m, vabsq_f32(vk));
        }
        let amax = vmaxnmvq_f32(m);
        let id = vdupq_n_f32(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q: [int32x4_t; 8] = std::array::from_fn(|k| vcvtnq_s32_f32(vmulq_f32(v[k], id)));
        let mut sum = vdupq_n_s32(0);
        for k in 0..4 {
            sum = vaddq_s32(sum, vaddq_s32(q[2 * k], q[2 * k + 1]));
            let q16 = vqmovn_high_s32(vqmovn_s32(q[2 * k]), q[2 * k + 1]);
            vst1_s8(qs.add(8 * k), vqmovn_s16(q16));
        }
        (amax / 127.0, vaddvq_s32(sum))
    }
}

/// Shared checks used by every format's unit tests.
#[cfg(test)]
pub mod testutil {
    use crate::cpu::types::{FromF32, Tile, ToF32, VecDot};
    use crate::ggml_types::GgmlType;

    /// xorshift32 from state `s` (non-zero): the test data's one random source.
    pub fn xorshift(mut s: u32) -> impl FnMut() -> u32 {
        move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        }
    }

    /// Deterministic data with a spread of magnitudes between blocks and a few outliers.
    pub fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut next = xorshift(seed.wrapping_mul(2654435761).wrapping_add(12345).max(1));
        (0..n)
            .map(|i| {
                let scale = 0.05 + ((i / 32) % 7) as f32 * 0.4;
                let v = (next() % 20001) as f32 / 10000.0 - 1.0;
                if next() % 97 == 0 {
                    v * scale * 4.0
                } else {
                    v * scale
                }
            })
            .collect()
    }

    pub fn quantize(t: GgmlType, from: FromF32, x: &[f32]) -> Vec<u8> {
        let mut q = vec![0u8; t.row_size(x.len())];
        unsafe { from(x, q.as_mut_ptr()) };
        q
    }

    pub fn dequantize(to: ToF32, q: &[u8], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n];
        unsafe { to(q.as_ptr(), &mut y) };
        y
    }

    /// Round trip error, relative to the data's RMS, stays below `tol`.
    pub fn check_round_trip(t: GgmlType, from: FromF32, to: ToF32, tol: f32) {
        let bs = t.block_size();
        for nb in [1, 2, 5, 16] {
            let n = nb * bs;
            let x = data(n, nb as u32 + 7);
            let y = dequantize(to, &quantize(t, from, &x), n);
            let err =
                (x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / n as f32).sqrt();
            let rms = (x.iter().map(|a| a * a).sum::<f32>() / n as f32).sqrt();
            assert!(
                err <= tol * rms,
                "{t:?} n={n}: rms error {err} vs data rms {rms}"
            );
        }
        // All zeros survive exactly (no NaN from a zero scale).
        let z = vec![0f32; bs];
        assert!(
            dequantize(to, &quantize(t, from, &z), bs)
                .iter()
                .all(|&v| v == 0.0),
            "{t:?} zeros"
        );
    }

    /// Formats with a NEON dot (every format with a dot; one without runs its scalar
    /// reference on aarch64).
    const NEON_DOTS: [GgmlType; 11] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
    ];

    /// Every format has an AVX2 dot, some a NEON one: where it may run it must be what is
    /// dispatched, or the checks below compare the reference with itself.
    fn assert_simd_dispatched(t: GgmlType, dot: VecDot, dot_ref: VecDot) {
        let simd = if super::use_avx2() {
            "AVX2"
        } else if super::use_neon() && NEON_DOTS.contains(&t) {
            "NEON"
        } else {
            return;
        };
        assert!(
            dot as usize != dot_ref as usize,
            "{t:?}: the scalar reference is dispatched on a {simd} machine"
        );
    }

    /// The tiles the traits of `t` register (none without AVX2).
    pub fn tiles(t: GgmlType) -> [Option<Tile>; 2] {
        let tr = crate::cpu::types::traits(t).unwrap();
        [tr.gemm, tr.gemv]
    }

    /// Runs `tile` on `rows` rows `qx` of `t` and `cols` columns `qy` of `yt` (output column
    /// stride `os` bytes) and asserts each result equals `dot` of its row and column to the bit.
    #[allow(clippy::too_many_arguments)]
    fn assert_tile_is_dot(
        t: GgmlType,
        what: &str,
        tile: &Tile,
        n: usize,
        qx: &[u8],
        qy: &[u8],
        yt: GgmlType,
        dot: VecDot,
        os: usize,
    ) {
        let (xs, ys) = (t.row_size(n), yt.row_size(n));
        let mut out = vec![0u8; os * tile.cols];
        unsafe { (tile.dot)(n, qx.as_ptr(), xs, qy.as_ptr(), ys, out.as_mut_ptr(), os) };
        for r in 0..tile.rows {
            for c in 0..tile.cols {
                let want = unsafe { dot(n, qx.as_ptr().add(r * xs), qy.as_ptr().add(c * ys)) };
                let got = f32::from_le_bytes(out[r * 4 + c * os..][..4].try_into().unwrap());
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{t:?} {what}{}x{} n={n} ({r},{c}): {got} vs {want}",
                    tile.rows,
                    tile.cols
                );
            }
        }
    }

    /// Every tile result equals `vec_dot` of its row and column to the bit.
    pub fn check_tiles(
        t: GgmlType,
        from: FromF32,
        yt: GgmlType,
        yfrom: FromF32,
        dot: VecDot,
        tiles: &[Option<Tile>],
    ) {
        #[cfg(target_arch = "x86_64")]
        assert!(
            !super::use_avx2() || tiles.iter().all(Option::is_some),
            "{t:?}: AVX2 machine without tiles"
        );
        for tile in tiles.iter().flatten() {
            for nb in [1, 3, 18] {
                let n = nb * t.block_size();
                let os = 4 * tile.rows + 12;
                let mut qx = vec![];
                for r in 0..tile.rows {
                    qx.extend(quantize(t, from, &data(n, 7 + r as u32)));
                }
                let mut qy = vec![];
                for c in 0..tile.cols {
                    qy.extend(quantize(yt, yfrom, &data(n, 50 + c as u32)));
                }
                assert_tile_is_dot(t, "", tile, n, &qx, &qy, yt, dot, os);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    /// Random raw blocks (every code pattern; the f16 fields at byte offsets `f16_at` of each
    /// block finite) for `rows` rows of `n` elements.
    pub fn raw_rows(t: GgmlType, f16_at: &[usize], n: usize, rows: usize, seed: u32) -> Vec<u8> {
        let mut next = xorshift(seed.wrapping_mul(0x9e37_79b9).max(1));
        let mut q: Vec<u8> = (0..t.row_size(n) * rows).map(|_| next() as u8).collect();
        for block in q.chunks_exact_mut(t.type_size()) {
            for &o in f16_at {
                let h = super::f32_to_f16((next() % 2001) as f32 / 1000.0 - 1.0);
                block[o..o + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        q
    }

    #[cfg(target_arch = "x86_64")]
    /// Every result of each tile equals `dot` of its row and column to the bit, on raw random
    /// weight blocks against full-scale activations (codes ±127: where integer sums come
    /// closest to overflowing).
    pub fn check_tiles_raw(
        t: GgmlType,
        f16_at: &[usize],
        yt: GgmlType,
        yfrom: FromF32,
        dot: VecDot,
        tiles: &[Tile],
    ) {
        for tile in tiles {
            for nb in [1, 3, 7, 33] {
                let n = nb * t.block_size();
                let os = 4 * tile.rows + 8;
                let qx = raw_rows(t, f16_at, n, tile.rows, nb as u32);
                let mut qy = vec![];
                for c in 0..tile.cols {
                    let mut next = xorshift(77u32 + c as u32 * 31 + nb as u32);
                    let v: Vec<f32> = (0..n)
                        .map(|_| {
                            if next() & 1 != 0 || c % 2 == 1 {
                                1.0
                            } else {
                                -1.0
                            }
                        })
                        .collect();
                    qy.extend(quantize(yt, yfrom, &v));
                }
                assert_tile_is_dot(t, "raw ", tile, n, &qx, &qy, yt, dot, os);
            }
        }
    }

    /// Two dots of one format (an AVX-512 one and the AVX2 one) agree to the bit, on quantized
    /// data and on raw random blocks against full-scale activations. Runs where the CPU has
    /// AVX-512, whatever `ROCMFORGE_SIMD` forces; says when it skipped.
    #[cfg(target_arch = "x86_64")]
    pub fn check_same_dot(
        t: GgmlType,
        from: FromF32,
        f16_at: &[usize],
        yt: GgmlType,
        yfrom: FromF32,
        dot: VecDot,
        avx2_dot: VecDot,
    ) {
        use crate::cpu::simd;
        if !simd::has_avx512() {
            println!("{t:?} AVX-512 dot: SKIPPED, this CPU has no AVX-512");
            return;
        }
        for nb in [1, 2, 3, 8, 17] {
            let n = nb * t.block_size();
            for (k, qx) in [
                quantize(t, from, &data(n, nb as u32)),
                raw_rows(t, f16_at, n, 1, nb as u32),
            ]
            .iter()
            .enumerate()
            {
                let yv: Vec<f32> = if k == 0 {
                    data(n, nb as u32 + 100)
                } else {
                    (0..n)
                        .map(|i| if (i * 7919) % 3 == 0 { -1.0 } else { 1.0 })
                        .collect()
                };
                let qy = quantize(yt, yfrom, &yv);
                let (a, b) = unsafe {
                    (
                        dot(n, qx.as_ptr(), qy.as_ptr()),
                        avx2_dot(n, qx.as_ptr(), qy.as_ptr()),
                    )
                };
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{t:?} n={n} {}: {a} vs AVX2 {b}",
                    ["quantized", "raw"][k]
                );
            }
        }
        if super::use_avx512() {
            assert_eq!(
                crate::cpu::types::traits(t).unwrap().vec_dot.unwrap() as usize,
                dot as usize,
                "{t:?}: AVX-512 dot not dispatched"
            );
        }
        println!("{t:?} AVX-512 dot: ran (level {:?})", simd::level());
    }

    /// A format's tiles beyond AVX2 (512-bit with VNNI and without, 256-bit VNNI in EVEX and
    /// VEX form) against its AVX2 `vec_dot`, bit for bit, on quantized and on raw blocks. Each
    /// runs where the CPU has it, whatever `ROCMFORGE_SIMD` forces, and says so on stdout;
    /// where it has not, says that it skipped.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    pub fn check_avx512_tiles(
        t: GgmlType,
        from: FromF32,
        f16_at: &[usize],
        yt: GgmlType,
        yfrom: FromF32,
        avx2_dot: VecDot,
        vnni: &[Tile],
        bw: &[Tile],
        vnni256: &[Tile],
        avxvnni: &[Tile],
    ) {
        use crate::cpu::simd;
        let (mut ran, mut sets) = (vec![], vec![]);
        if is_x86_feature_detected!("avxvnni") && simd::level() >= simd::Level::Avx2 {
            ran.push("AVX-VNNI 256");
            sets.push(avxvnni);
        } else {
            println!("{t:?} AVX-VNNI (256-bit) tiles: SKIPPED, this CPU has no AVX-VNNI");
        }
        if simd::has_avx512() {
            ran.push("AVX-512BW");
            sets.push(bw);
        } else {
            println!("{t:?} AVX-512 tiles: SKIPPED, this CPU has no AVX-512");
        }
        if simd::has_avx512_vnni_cpu() {
            ran.extend(["AVX-512 VNNI", "AVX-512 VNNI 256"]);
            sets.extend([vnni, vnni256]);
        } else {
            println!("{t:?} AVX-512 VNNI tiles: SKIPPED, this CPU has no AVX-512 VNNI");
        }
        for tiles in sets {
            let some: Vec<Option<Tile>> = tiles.iter().map(|&t| Some(t)).collect();
            check_tiles(t, from, yt, yfrom, avx2_dot, &some);
            check_tiles_raw(t, f16_at, yt, yfrom, avx2_dot, tiles);
        }
        if super::tile_isa(false) == Some(super::TileIsa::Avx512Vnni)
            || super::tile_isa(false) == Some(super::TileIsa::Avx512)
        {
            let gemm = self::tiles(t)[0].unwrap();
            let want = if simd::has_avx512_vnni() { vnni } else { bw };
            assert!(
                want.iter().any(|w| w.dot as usize == gemm.dot as usize),
                "{t:?}: not the expected AVX-512 gemm tile"
            );
        }
        println!(
            "{t:?} tiles beyond AVX2: ran {} (level {:?}, gemm {:?}, gemv {:?})",
            ran.join(", "),
            simd::level(),
            super::tile_isa(false),
            super::tile_isa(true)
        );
    }

    /// The dispatched dot equals the scalar reference (tightly) and approximates the dot of the
    /// dequantized values (loosely: the activation side is quantized too).
    #[allow(clippy::too_many_arguments)]
    pub fn check_vec_dot(
        t: GgmlType,
        from: FromF32,
        to: ToF32,
        yt: GgmlType,
        yfrom: FromF32,
        yto: ToF32,
        dot: VecDot,
        dot_ref: VecDot,
    ) {
        assert_simd_dispatched(t, dot, dot_ref);
        let bs = t.block_size();
        for nb in [1, 2, 3, 8, 17, 40] {
            let n = nb * bs;
            let x = data(n, nb as u32);
            let yv = data(n, nb as u32 + 100);
            let qx = quantize(t, from, &x);
            let qy = quantize(yt, yfrom, &yv);
            let fast = unsafe { dot(n, qx.as_ptr(), qy.as_ptr()) };
            let slow = unsafe { dot_ref(n, qx.as_ptr(), qy.as_ptr()) };
            let dx = dequantize(to, &qx, n);
            let dy = dequantize(yto, &qy, n);
            let exact: f64 = dx.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = dx
                .iter()
                .zip(&dy)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            assert!(
                ((fast - slow) as f64).abs() <= 1e-5 * mag + 1e-6,
                "{t:?} n={n}: simd {fast} vs scalar {slow}"
            );
            assert!(
                (slow as f64 - exact).abs() <= 2e-3 * mag + 1e-5,
                "{t:?} n={n}: dot {slow} vs dequantized {exact}"
            );
        }
    }

    /// The dispatched dot equals the scalar reference on raw random weight bytes (every code,
    /// sub-block scale and high-bit pattern, not only what the quantizer produces; the f16
    /// fields at byte offsets `f16_at` of each block get finite values) against activations at
    /// full scale (codes ±127, where i16 intermediate sums come closest to saturating), over
    /// odd block counts.
    #[allow(clippy::too_many_arguments)]
    pub fn check_vec_dot_extremes(
        t: GgmlType,
        to: ToF32,
        f16_at: &[usize],
        yt: GgmlType,
        yfrom: FromF32,
        yto: ToF32,
        dot: VecDot,
        dot_ref: VecDot,
    ) {
        assert_simd_dispatched(t, dot, dot_ref);
        let (bs, ts) = (t.block_size(), t.type_size());
        let mut next = xorshift(0x9e37_79b9);
        for nb in [1, 3, 7, 33] {
            let n = nb * bs;
            let mut qx: Vec<u8> = (0..t.row_size(n)).map(|_| next() as u8).collect();
            for block in qx.chunks_exact_mut(ts) {
                for &o in f16_at {
                    let h = super::f32_to_f16((next() % 2001) as f32 / 1000.0 - 1.0);
                    block[o..o + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
            // Random signs of one magnitude, and a last block of one sign.
            let mut yv: Vec<f32> = (0..n)
                .map(|_| if next() & 1 != 0 { 1.0 } else { -1.0 })
                .collect();
            yv[n - bs..].fill(1.0);
            let qy = quantize(yt, yfrom, &yv);
            let fast = unsafe { dot(n, qx.as_ptr(), qy.as_ptr()) };
            let slow = unsafe { dot_ref(n, qx.as_ptr(), qy.as_ptr()) };
            let (dx, dy) = (dequantize(to, &qx, n), dequantize(yto, &qy, n));
            let mag: f64 = dx
                .iter()
                .zip(&dy)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            assert!(
                mag > 0.0 && mag.is_finite(),
                "{t:?} n={n}: degenerate test data"
            );
            assert!(
                ((fast - slow) as f64).abs() <= 1e-5 * mag + 1e-6,
                "{t:?} n={n}: simd {fast} vs scalar {slow}"
            );
        }
    }
}

/// Cross-check against files written by a small C program over the reference ggml build
/// (quantized rows, activations, dequantized rows and dots from ggml-cpu, over N and over
/// one block less). Run with
/// `ROCMFORGE_QCHECK=<dir> cargo test --release -- --ignored ggml_cross_check`.
#[cfg(test)]
mod cross_check {
    use super::*;
    use crate::cpu::types::traits as all_traits;

    fn read(dir: &str, name: &str) -> Vec<u8> {
        std::fs::read(format!("{dir}/{name}")).unwrap_or_else(|e| panic!("{dir}/{name}: {e}"))
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    #[ignore]
    fn ggml_cross_check() {
        let Ok(dir) = std::env::var("ROCMFORGE_QCHECK") else {
            return;
        };
        const N: usize = 4096;
        let x = floats(&read(&dir, "x.f32"));
        let y = floats(&read(&dir, "y.f32"));
        let rows = x.len() / N;
        use GgmlType::*;
        let mut dot_mismatches = vec![];
        for t in [
            Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
        ] {
            let tr = all_traits(t).unwrap();
            let vt = tr.vec_dot_type;
            let (xr, yr) = (t.row_size(N), vt.row_size(N));
            let gq = read(&dir, &format!("{}.q", t.name()));
            let gy = read(&dir, &format!("{}.y", t.name()));
            let gdeq = floats(&read(&dir, &format!("{}.deq", t.name())));
            let gdot = floats(&read(&dir, &format!("{}.dot", t.name())));
            let gdot_odd = floats(&read(&dir, &format!("{}.dot_odd", t.name())));
            let mut mine_y = vec![0u8; yr * rows];
            let mut mine_q = vec![0u8; xr * rows];
            let mut deq = vec![0f32; N];
            for r in 0..rows {
                unsafe {
                    (all_traits(vt).unwrap().from_f32.unwrap())(
                        &y[r * N..(r + 1) * N],
                        mine_y.as_mut_ptr().add(r * yr),
                    );
                    (tr.from_f32.unwrap())(&x[r * N..(r + 1) * N], mine_q.as_mut_ptr().add(r * xr));
                    (tr.to_f32.unwrap())(gq.as_ptr().add(r * xr), &mut deq);
                }
                assert_eq!(
                    deq[..],
                    gdeq[r * N..(r + 1) * N],
                    "{t:?} dequantize row {r}"
                );
                // Dots follow ggml-cpu's summation order, so they agree to the bit; the odd
                // block count reaches the kernels' tails.
                for (n, want) in [(N, gdot[r]), (N - t.block_size(), gdot_odd[r])] {
                    let d = unsafe {
                        (tr.vec_dot.unwrap())(n, gq.as_ptr().add(r * xr), gy.as_ptr().add(r * yr))
                    };
                    if d.to_bits() != want.to_bits() {
                        dot_mismatches.push(format!("{t:?} row {r} n={n}: {d} vs ggml {want}"));
                    }
                }
            }
            assert!(mine_y == gy, "{vt:?} activation bytes differ from ggml-cpu");
            // Every quantizer reproduces ggml-cpu's bytes (the K-quants and IQ4_NL through
            // `kquant_search`, ggml's reference searches).
            assert!(mine_q == gq, "{t:?} quantized bytes differ from ggml-cpu");
        }
        assert!(
            dot_mismatches.is_empty(),
            "dots differ from ggml-cpu's:\n{}",
            dot_mismatches.join("\n")
        );
    }
}

/// Micro benchmark of the dots: `cargo test --release -- --ignored bench_ --nocapture`.
/// Prints GB/s of weight bytes streamed (rows sized like a small model's matrices, re-used
/// so they stay in cache: this measures the kernel, not memory).
#[cfg(test)]
mod bench {
    use super::*;
    use crate::cpu::types::traits as all_traits;

    /// Rows × columns of `tl` over a rows × cols block, reps times; returns G MAC/s.
    #[allow(clippy::too_many_arguments)]
    fn time(
        tl: crate::cpu::types::Tile,
        n: usize,
        qx: &[u8],
        xs: usize,
        rows: usize,
        qy: &[u8],
        ys: usize,
        cols: usize,
        reps: usize,
    ) -> f64 {
        let mut out = vec![0f32; rows * cols];
        let start = std::time::Instant::now();
        for _ in 0..reps {
            for j in (0..cols).step_by(tl.cols) {
                for i in (0..rows).step_by(tl.rows) {
                    unsafe {
                        (tl.dot)(
                            n,
                            qx.as_ptr().add(i * xs),
                            xs,
                            qy.as_ptr().add(j * ys),
                            ys,
                            out.as_mut_ptr().add(i + j * rows) as *mut u8,
                            rows * 4,
                        )
                    };
                }
            }
        }
        std::hint::black_box(&out);
        (n * rows * cols * reps) as f64 / start.elapsed().as_secs_f64() / 1e9
    }

    /// One column against a matrix larger than the caches (generation's case): rows one
    /// `vec_dot` at a time vs the gemv tile.
    #[test]
    #[ignore]
    fn bench_gemv_streaming() {
        const N: usize = 576;
        let rows_env = std::env::var("ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1usize << 16);
        #[allow(non_snake_case)]
        let ROWS = rows_env;
        let reps = (10usize << 16) / ROWS;
        use GgmlType::*;
        for t in [Q4_0, Q4_1, Q8_0, IQ4_NL] {
            let tr = all_traits(t).unwrap();
            let x = testutil::data(N * ROWS, 1);
            let y = testutil::data(N, 2);
            let qx = testutil::quantize(t, tr.from_f32.unwrap(), &x);
            let qy = testutil::quantize(
                tr.vec_dot_type,
                all_traits(tr.vec_dot_type).unwrap().from_f32.unwrap(),
                &y,
            );
            let row = t.row_size(N);
            let mut out = vec![0f32; ROWS];
            for pass in 0..2 {
                let start = std::time::Instant::now();
                for _ in 0..reps {
                    match (pass, tr.gemv) {
                        (1, Some(tl)) => {
                            for r in (0..ROWS).step_by(tl.rows) {
                                unsafe {
                                    (tl.dot)(
                                        N,
                                        qx.as_ptr().add(r * row),
                                        row,
                                        qy.as_ptr(),
                                        0,
                                        out.as_mut_ptr().add(r) as *mut u8,
                                        0,
                                    )
                                };
                            }
                        }
                        _ => {
                            for r in 0..ROWS {
                                out[r] = unsafe {
                                    (tr.vec_dot.unwrap())(N, qx.as_ptr().add(r * row), qy.as_ptr())
                                };
                            }
                        }
                    }
                }
                let gbs = (row * ROWS * reps) as f64 / start.elapsed().as_secs_f64() / 1e9;
                eprintln!(
                    "gemv {t:?} {}: {gbs:6.2} GB/s ({})",
                    ["vec_dot", "tile"][pass],
                    out[7]
                );
            }
        }
    }

    /// The tiles of each instruction set side by side, one thread: AVX2, 256-bit VNNI (VEX,
    /// EVEX), AVX-512BW and AVX-512 VNNI (where the CPU has them) on a weight matrix that stays in L2 (64 rows ×
    /// 4096) against 16 columns (prompts) and 1 column (generation), and streaming a matrix
    /// larger than the caches against 1 column. Prints G multiply-adds/s.
    /// `cargo test --release -- --ignored bench_tiles --nocapture`
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn bench_tiles() {
        use crate::cpu::simd;
        use crate::cpu::types::{DotTile, Tile};
        use GgmlType::*;
        let tile = |rows, cols, dot: DotTile| Tile { rows, cols, dot };
        macro_rules! set {
            ($f:ident) => {
                [
                    (
                        "avx2",
                        tile(2, 4, $f::avx2::tile::<2, 4>),
                        tile(4, 1, $f::avx2::tile::<4, 1>),
                    ),
                    (
                        "avxvnni256",
                        tile(2, 4, $f::avx512::tile_avxvnni::<2, 4>),
                        tile(4, 1, $f::avx512::tile_avxvnni::<4, 1>),
                    ),
                    (
                        "vnni256",
                        tile(2, 4, $f::avx512::tile_vnni256::<2, 4>),
                        tile(4, 1, $f::avx512::tile_vnni256::<4, 1>),
                    ),
                    (
                        "avx512bw",
                        tile(4, 4, $f::avx512::tile_bw::<4, 4>),
                        tile(8, 1, $f::avx512::tile_bw::<8, 1>),
                    ),
                    (
                        "avx512vnni",
                        tile(4, 4, $f::avx512::tile_vnni::<4, 4>),
                        tile(8, 1, $f::avx512::tile_vnni::<8, 1>),
                    ),
                ]
            };
        }
        let sets = [
            (Q4_0, set!(q4_0)),
            (Q4_1, set!(q4_1)),
            (Q8_0, set!(q8_0)),
            (IQ4_NL, set!(iq4_nl)),
        ];
        let runs = |name: &str| match name {
            "avx2" => simd::level() >= simd::Level::Avx2,
            "avxvnni256" => is_x86_feature_detected!("avxvnni"),
            "avx512bw" => simd::has_avx512(),
            _ => simd::has_avx512_vnni_cpu(),
        };
        for (t, set) in sets {
            let tr = all_traits(t).unwrap();
            let yt = tr.vec_dot_type;
            let yfrom = all_traits(yt).unwrap().from_f32.unwrap();
            let (n, rows) = (4096, 64);
            let qx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(n * rows, 1));
            let qy = testutil::quantize(yt, yfrom, &testutil::data(n * 16, 2));
            let (xs, ys) = (t.row_size(n), yt.row_size(n));
            let (sn, srows) = (576, 1 << 16);
            let sqx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(sn * srows, 3));
            let sqy = testutil::quantize(yt, yfrom, &testutil::data(sn, 4));
            for (name, gemm, gemv) in set {
                if !runs(name) {
                    println!("bench_tiles {t:?} {name}: SKIPPED (not on this CPU)");
                    continue;
                }
                let a = time(gemm, n, &qx, xs, rows, &qy, ys, 16, 100);
                let b = time(gemv, n, &qx, xs, rows, &qy, ys, 1, 1000);
                let c = time(gemv, sn, &sqx, t.row_size(sn), srows, &sqy, 0, 1, 10);
                println!("bench_tiles {t:?} {name:10}: gemm {}x{} {a:6.2} | gemv {}x1 in L2 {b:6.2} | gemv streaming {c:6.2} G MAC/s", gemm.rows, gemm.cols, gemv.rows);
            }
        }
    }

    /// The K-quant tiles (AVX2) against their one-row dot, one thread: 64 rows × 4096 in L2
    /// against 16 columns (prompts) and 1 column (generation), and a matrix larger than the
    /// caches against 1 column. Prints G multiply-adds/s.
    /// `cargo test --release -- --ignored bench_kquant_tiles --nocapture`
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn bench_kquant_tiles() {
        use crate::cpu::types::Tile;
        use GgmlType::*;
        if !use_avx2() {
            println!("bench_kquant_tiles: SKIPPED, no AVX2");
            return;
        }
        // The one-row dot as a 1 × 1 "tile", so both run through the same loop.
        fn one_row<const T: u8>(
            n: usize,
            x: *const u8,
            _: usize,
            y: *const u8,
            _: usize,
            out: *mut u8,
            _: usize,
        ) {
            let t = if T == 4 { Q4_K } else { Q6_K };
            unsafe { *(out as *mut f32) = (all_traits(t).unwrap().vec_dot.unwrap())(n, x, y) };
        }
        let sets: [(GgmlType, Tile); 2] = [
            (
                Q4_K,
                Tile {
                    rows: 1,
                    cols: 1,
                    dot: one_row::<4>,
                },
            ),
            (
                Q6_K,
                Tile {
                    rows: 1,
                    cols: 1,
                    dot: one_row::<6>,
                },
            ),
        ];
        for (t, single) in sets {
            let tr = all_traits(t).unwrap();
            let yfrom = all_traits(Q8_K).unwrap().from_f32.unwrap();
            let (n, rows) = (4096, 64);
            let qx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(n * rows, 1));
            let qy = testutil::quantize(Q8_K, yfrom, &testutil::data(n * 16, 2));
            let (xs, ys) = (t.row_size(n), Q8_K.row_size(n));
            let (sn, srows) = (1024, 1 << 14);
            let sqx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(sn * srows, 3));
            let sqy = testutil::quantize(Q8_K, yfrom, &testutil::data(sn, 4));
            let (gemm, gemv) = (tr.gemm.unwrap_or(single), tr.gemv.unwrap_or(single));
            for (name, gemm, gemv) in [("vec_dot", single, single), ("tiles", gemm, gemv)] {
                let a = time(gemm, n, &qx, xs, rows, &qy, ys, 16, 30);
                let b = time(gemv, n, &qx, xs, rows, &qy, ys, 1, 300);
                let c = time(gemv, sn, &sqx, t.row_size(sn), srows, &sqy, 0, 1, 10);
                println!("bench_kquant_tiles {t:?} {name:7}: gemm {}x{} {a:6.2} | gemv {}x1 in L2 {b:6.2} | gemv streaming {c:6.2} G MAC/s", gemm.rows, gemm.cols, gemv.rows);
            }
            if std::env::var("SWEEP").is_ok() {
                macro_rules! shapes {
                    ($f:ident) => {
                        [
                            Tile {
                                rows: 1,
                                cols: 1,
                                dot: $f::avx2::tile::<1, 1>,
                            },
                            Tile {
                                rows: 2,
                                cols: 1,
                                dot: $f::avx2::tile::<2, 1>,
                            },
                            Tile {
                                rows: 3,
                                cols: 1,
                                dot: $f::avx2::tile::<3, 1>,
                            },
                            Tile {
                                rows: 1,
                                cols: 4,
                                dot: $f::avx2::tile::<1, 4>,
                            },
                            Tile {
                                rows: 2,
                                cols: 2,
                                dot: $f::avx2::tile::<2, 2>,
                            },
                            Tile {
                                rows: 4,
                                cols: 2,
                                dot: $f::avx2::tile::<4, 2>,
                            },
                            Tile {
                                rows: 3,
                                cols: 4,
                                dot: $f::avx2::tile::<3, 4>,
                            },
                            Tile {
                                rows: 2,
                                cols: 3,
                                dot: $f::avx2::tile::<2, 3>,
                            },
                        ]
                    };
                }
                let shapes = if t == Q4_K {
                    shapes!(q4_k)
                } else {
                    shapes!(q6_k)
                };
                for tl in shapes {
                    let a = time(
                        tl,
                        n,
                        &qx,
                        xs,
                        rows - rows % tl.rows,
                        &qy,
                        ys,
                        16 - 16 % tl.cols,
                        30,
                    );
                    let b = if tl.cols == 1 {
                        time(tl, n, &qx, xs, rows - rows % tl.rows, &qy, ys, 1, 300)
                    } else {
                        0.0
                    };
                    let c = if tl.cols == 1 {
                        time(
                            tl,
                            sn,
                            &sqx,
                            t.row_size(sn),
                            srows - srows % tl.rows,
                            &sqy,
                            0,
                            1,
                            10,
                        )
                    } else {
                        0.0
                    };
                    println!("sweep {t:?} {}x{}: 16 columns {a:6.2} | 1 column in L2 {b:6.2} | streaming {c:6.2}", tl.rows, tl.cols);
                }
            }
        }
    }

    /// The K-quant dots, AVX2 against AVX-512, one thread, 64 rows × 4096 in L2.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn bench_kquant_dots() {
        use crate::cpu::types::VecDot;
        use GgmlType::*;
        if !crate::cpu::simd::has_avx512() {
            println!("bench_kquant_dots: SKIPPED, no AVX-512");
            return;
        }
        let dots: [(GgmlType, VecDot, VecDot); 2] = [
            (Q4_K, q4_k::avx2::vec_dot, q4_k::avx512::vec_dot),
            (Q6_K, q6_k::avx2::vec_dot, q6_k::avx512::vec_dot),
        ];
        for (t, a2, a5) in dots {
            let (n, rows) = (4096, 64);
            let tr = all_traits(t).unwrap();
            let qx = testutil::quantize(t, tr.from_f32.unwrap(), &testutil::data(n * rows, 1));
            let qy = testutil::quantize(
                Q8_K,
                all_traits(Q8_K).unwrap().from_f32.unwrap(),
                &testutil::data(n, 2),
            );
            for (name, dot) in [("avx2", a2), ("avx512", a5)] {
                let start = std::time::Instant::now();
                let mut s = 0f32;
                for _ in 0..200 {
                    for r in 0..rows {
                        s += unsafe { dot(n, qx.as_ptr().add(r * t.row_size(n)), qy.as_ptr()) };
                    }
                }
                println!(
                    "bench_kquant_dots {t:?} {name:6}: {:6.2} G MAC/s ({s})",
                    (n * rows * 200) as f64 / start.elapsed().as_secs_f64() / 1e9
                );
            }
        }
    }

    /// The float dots, AVX2 against AVX-512, one thread, 4096 elements in L1/L2.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn bench_float_dots() {
        use crate::cpu::simd::{self, x86};
        if !simd::has_avx512() {
            println!("bench_float_dots: SKIPPED, no AVX-512");
            return;
        }
        let n = 4096;
        let a = testutil::data(n, 1);
        let b = testutil::data(n, 2);
        let a16: Vec<u16> = a.iter().map(|&v| f32_to_f16(v)).collect();
        let b16: Vec<u16> = b.iter().map(|&v| f32_to_f16(v)).collect();
        let reps = 200_000;
        let go = |name: &str, f: &dyn Fn() -> f32| {
            let start = std::time::Instant::now();
            let mut s = 0f32;
            for _ in 0..reps {
                s += std::hint::black_box(f());
            }
            println!(
                "bench_float_dots {name:22}: {:6.2} G elements/s ({s})",
                (n * reps) as f64 / start.elapsed().as_secs_f64() / 1e9
            );
        };
        unsafe {
            go("f32 avx2", &|| x86::dot_f32_avx2(&a, &b));
            go("f32 avx512", &|| x86::dot_f32_avx512(&a, &b));
            go("f16·f32 avx2", &|| x86::dot_f16_f32_avx2(&a16, &b));
            go("f16·f32 avx512", &|| x86::dot_f16_f32_avx512(&a16, &b));
            go("f16·f16 4acc avx2", &|| {
                x86::dot_f16_f16_4acc_avx2(&a16, &b16)
            });
            go("f16·f16 4acc avx512", &|| {
                x86::dot_f16_f16_4acc_avx512(&a16, &b16)
            });
        }
    }

    #[test]
    #[ignore]
    fn bench_vec_dot() {
        const N: usize = 4096;
        const ROWS: usize = 64;
        use GgmlType::*;
        for t in [
            Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
        ] {
            let tr = all_traits(t).unwrap();
            let x = testutil::data(N * ROWS, 1);
            let y = testutil::data(N, 2);
            let qx = testutil::quantize(t, tr.from_f32.unwrap(), &x);
            let qy = testutil::quantize(
                tr.vec_dot_type,
                all_traits(tr.vec_dot_type).unwrap().from_f32.unwrap(),
                &y,
            );
            let dot = tr.vec_dot.unwrap();
            let row = t.row_size(N);
            let mut sink = 0f32;
            let reps = 200;
            let start = std::time::Instant::now();
            for _ in 0..reps {
                for r in 0..ROWS {
                    sink += unsafe { dot(N, qx.as_ptr().add(r * row), qy.as_ptr()) };
                }
            }
            let secs = start.elapsed().as_secs_f64();
            let gbs = (row * ROWS * reps) as f64 / secs / 1e9;
            let gelems = (N * ROWS * reps) as f64 / secs / 1e9;
            eprintln!("bench {t:?}: {gbs:6.2} GB/s weights, {gelems:6.2} G elements/s ({sink:.1})");
        }
    }
}
