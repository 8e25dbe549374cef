//! Quantized block formats, one file per format (block layout, dequantize, quantize, dot).
//!
//! Every format exposes `to_f32`, `from_f32`, `vec_dot_ref` (plain scalar) and `vec_dot_fn()`,
//! which picks the fastest dot product the machine runs (AVX2 or NEON where written) once, when the
//! traits are looked up, so the hot loop pays no dispatch.

/// `$kernel::<C>` for a column count known at run time: C itself for the listed counts, `$widest`
/// for any other (what each weight panel format's `kernel_cols` dispatches).
#[allow(unused_macros)]
macro_rules! kernel_for_cols {
    ($kernel:ident, $cols:expr, [$($c:literal),*], $widest:literal) => {
        match $cols {
            $($c => $kernel::<$c>,)*
            _ => $kernel::<$widest>,
        }
    };
}

pub mod amx_tiles;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod grids;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod kquant_search;
pub mod mxfp4;
pub mod nvfp4;
pub mod panel;
pub mod panel_amx;
pub mod panel_q4_k;
pub mod panel_q6_k;
pub mod q1_0;
pub mod q2_0;
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
pub mod repack_iq4_nl;
pub mod repack_q4_0;
pub mod repack_q4_k;
pub mod repack_q6_k;
pub mod repack_q8_0;
pub mod sign_grid;
pub mod stream;
pub mod tq1_0;
pub mod tq2_0;

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

/// Q8_0's one-column products a row at a time except on Intel. On Zen 4 one `vec_dot` per row
/// streams a matrix from memory at 21-25 GB/s a core where the 8-row tile, its rows read in
/// lock-step, reached 9-18 (`bench_gemv_streaming`, rows of 576 and 4096 values; SmolLM2's
/// 49152 x 576 output head took 1.84 ms of a 6.7 ms token at 2 threads). On Intel the tile
/// stays, with its software prefetch (stream.rs), until measured there. Same bits either way.
fn q8_0_gemv(t: TypeTraits) -> TypeTraits {
    #[cfg(target_arch = "x86_64")]
    if !stream::is_intel() {
        return TypeTraits { gemv: None, ..t };
    }
    t
}

/// Kernels for a quantized type, or None where the CPU device does not handle it.
pub fn traits(t: GgmlType) -> Option<TypeTraits> {
    use GgmlType::*;
    // Weight-only formats (no quantizer: no CPY / SET_ROWS into them), dotted with Q8_K.
    let weights_k = |to, dot| {
        Some(TypeTraits {
            to_f32: Some(to),
            from_f32: None,
            vec_dot_type: Q8_K,
            vec_dot: Some(dot),
            gemm: None,
            gemv: None,
        })
    };
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
            .map(|t| q8_0_gemv(with_tiles!(t, q8_0, avx512))),
        Q2_K => full(q2_k::to_f32, q2_k::from_f32, Q8_K, q2_k::vec_dot_fn()),
        Q3_K => full(q3_k::to_f32, q3_k::from_f32, Q8_K, q3_k::vec_dot_fn()),
        Q4_K => full(q4_k::to_f32, q4_k::from_f32, Q8_K, q4_k::vec_dot_fn())
            .map(|t| with_q4_k_gemv(with_gemm_tile!(t, q4_k, 2))),
        Q5_K => full(q5_k::to_f32, q5_k::from_f32, Q8_K, q5_k::vec_dot_fn()),
        Q6_K => full(q6_k::to_f32, q6_k::from_f32, Q8_K, q6_k::vec_dot_fn())
            .map(|t| with_gemm_tile!(t, q6_k, 1)),
        IQ4_NL => full(iq4_nl::to_f32, iq4_nl::from_f32, Q8_0, iq4_nl::vec_dot_fn())
            .map(|t| with_tiles!(t, iq4_nl, avx512)),
        // Weight-only: no quantizer (see iq4_xs.rs), so no CPY / SET_ROWS into it.
        IQ4_XS => Some(TypeTraits {
            to_f32: Some(iq4_xs::to_f32),
            from_f32: None,
            vec_dot_type: Q8_K,
            vec_dot: Some(iq4_xs::vec_dot_fn()),
            gemm: None,
            gemv: None,
        }),
        // Weight-only, as IQ4_XS: no quantizer (see mxfp4.rs).
        MXFP4 => Some(TypeTraits {
            to_f32: Some(mxfp4::to_f32),
            from_f32: None,
            vec_dot_type: Q8_0,
            vec_dot: Some(mxfp4::vec_dot_fn()),
            gemm: None,
            gemv: None,
        }),
        // Weight-only, as TQ2_0: no quantizer (see tq1_0.rs).
        TQ1_0 => Some(TypeTraits {
            to_f32: Some(tq1_0::to_f32),
            from_f32: None,
            vec_dot_type: Q8_K,
            vec_dot: Some(tq1_0::vec_dot_fn()),
            gemm: None,
            gemv: None,
        }),
        // Weight-only, as IQ4_XS: no quantizer (see tq2_0.rs).
        TQ2_0 => Some(TypeTraits {
            to_f32: Some(tq2_0::to_f32),
            from_f32: None,
            vec_dot_type: Q8_K,
            vec_dot: Some(tq2_0::vec_dot_fn()),
            gemm: None,
            gemv: None,
        }),
        // The i-quants: weight-only (ggml's quantizers need an importance matrix).
        IQ2_XXS => weights_k(iq2_xxs::to_f32, iq2_xxs::vec_dot_fn()),
        IQ2_XS => weights_k(iq2_xs::to_f32, iq2_xs::vec_dot_fn()),
        IQ2_S => weights_k(iq2_s::to_f32, iq2_s::vec_dot_fn()),
        IQ3_XXS => weights_k(iq3_xxs::to_f32, iq3_xxs::vec_dot_fn()),
        IQ3_S => weights_k(iq3_s::to_f32, iq3_s::vec_dot_fn()),
        IQ1_S => weights_k(iq1_s::to_f32, iq1_s::vec_dot_fn()),
        IQ1_M => weights_k(iq1_m::to_f32, iq1_m::vec_dot_fn()),
        // ggml 0.26's newer formats, with ggml's reference quantizers (so SET_ROWS into them too).
        Q1_0 => full(q1_0::to_f32, q1_0::from_f32, Q8_0, q1_0::vec_dot_fn()),
        Q2_0 => full(q2_0::to_f32, q2_0::from_f32, Q8_0, q2_0::vec_dot_fn()),
        NVFP4 => full(nvfp4::to_f32, nvfp4::from_f32, Q8_0, nvfp4::vec_dot_fn()),
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
pub mod x86;

/// NEON building blocks shared by the formats. Each int8 kernel is written once over `I8Dot`
/// and compiled twice: with SDOT where the CPU has it (chosen at run time), with widening
/// multiplies elsewhere.
#[cfg(target_arch = "aarch64")]
pub mod neon;

/// Shared checks used by every format's unit tests.
#[cfg(test)]
pub mod testutil;

/// Cross-check against files written by a small C program over the reference ggml build
/// (quantized rows, activations, dequantized rows and dots from ggml-cpu, over N and over
/// one block less). Run with
/// `ROCMFORGE_QCHECK=<dir> cargo test --release -- --ignored ggml_cross_check`.
#[cfg(test)]
mod cross_check;

/// Micro benchmark of the dots: `cargo test --release -- --ignored bench_ --nocapture`.
/// Prints GB/s of weight bytes streamed (rows sized like a small model's matrices, re-used
/// so they stay in cache: this measures the kernel, not memory).
#[cfg(test)]
mod bench;
