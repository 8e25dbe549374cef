//! Every `ROCMFORGE_*` environment variable, read once (at the first use of any) into `Tuning`,
//! each with its default, its range and what it is for. The rest of the crate reads the values
//! from `tuning::get()`, never the environment. `KNOBS` lists them for docs/tuning.md (a test
//! checks that the page names every one); "user" knobs are for people running the library,
//! "measuring" knobs for A/B runs and profiling (docs/tuning.md says which bench step uses them).
//!
//! Test inputs that only ignored tests read (ROCMFORGE_QCHECK, ROCMFORGE_KERNEL_GROUPS_OUT)
//! are not knobs and stay in those tests.

use std::path::PathBuf;

/// Whether a knob is for users or for measuring.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Audience {
    User,
    Measuring,
}

/// One knob as docs/tuning.md shows it.
pub struct Knob {
    pub name: &'static str,
    pub default: &'static str,
    pub range: &'static str,
    pub what: &'static str,
    pub audience: Audience,
}

const fn knob(
    name: &'static str,
    default: &'static str,
    range: &'static str,
    what: &'static str,
    audience: Audience,
) -> Knob {
    Knob {
        name,
        default,
        range,
        what,
        audience,
    }
}

use Audience::{Measuring, User};

/// Every knob `Tuning::read` reads (one line each: a table).
#[rustfmt::skip]
pub const KNOBS: &[Knob] = &[
    knob("ROCMFORGE_THREADS", "available cores", "1..", "RFCPU threads until the host sets a number", User),
    knob("ROCMFORGE_SIMD", "the machine's best", "scalar | avx2 | avx512-novnni", "force a lower CPU SIMD level (tests, A/B)", Measuring),
    knob("ROCMFORGE_DEBUG", "unset", "set / unset", "debug log lines (through ggml's logger)", User),
    knob("ROCMFORGE_GPU", "every runtime found", "0 | off | none | hip | cuda", "no GPU devices, or only those of one runtime", User),
    knob("ROCMFORGE_CACHE_DIR", "$XDG_CACHE_HOME/rocmforge or ~/.cache/rocmforge", "a directory", "where compiled GPU kernels are cached", User),
    knob("ROCMFORGE_GPU_BLAS", "on", "0 | off", "prompt matrix products on rocmforge's kernels instead of cuBLAS / hipBLAS (closer to ggml-cpu's rounding, slower)", Measuring),
    knob("ROCMFORGE_GPU_GRAPHS", "on", "0", "no GPU graph capture and replay", Measuring),
    knob("ROCMFORGE_GPU_GRAPH_CACHE", "128", "0 | a count", "captured GPU graphs a backend keeps besides the last one, replayed when a graph comes again (ggml's tensor-parallel -sm tensor gives each GPU one graph per layer part); 0: only the last graph is replayed", Measuring),
    knob("ROCMFORGE_GPU_PIN_HOST", "on", "0", "RFCPU's weight memory (host-pointer buffers, allocations of 64 MiB and more) is not page-locked for the first GPU (the scheduler's copies of offloaded ops' weights then go through pageable memory)", Measuring),
    knob("ROCMFORGE_HYBRID_STRATEGY", "auto", "auto | gpu | cpu | gpu-only | cpu-only", "how RFHYBRID places nodes: by the cost model, GPU first, CPU first, or one device only", User),
    knob("ROCMFORGE_HYBRID_VRAM", "the GPU's free memory less 512 MiB", "bytes, or with KiB / MiB / GiB (e.g. 8GiB)", "GPU memory RFHYBRID may use (resident weights, KV cache, activations, staging)", User),
    knob("ROCMFORGE_TELEMETRY", "off", "summary | <file>.json", "RFHYBRID: a table of what ran where printed when the backend is freed, or every event and the statistics written as JSON", User),
    knob("ROCMFORGE_TRACE", "off", "<file>.json", "RFHYBRID: a Chrome trace-event timeline (one track per device and one for transfers; opens in Perfetto) written when the backend is freed", User),
    knob("ROCMFORGE_HYBRID_CALIBRATE", "cached", "cached | force | 0", "RFHYBRID's cost model: the cached calibration (measured at first use), measured again now (and the plan-trial winners and sharing widths kept from earlier processes forgotten), or the built-in guesses (no measuring)", Measuring),
    knob("ROCMFORGE_HYBRID_GRAPH_COPIES", "on", "0", "RFHYBRID queues a replayed graph's input copies (the whole-model replay's, and each GPU segment's of a replayed split graph) one by one instead of having the GPU's captured graph make them (A/B runs)", Measuring),
    knob("ROCMFORGE_HYBRID_PREFETCH", "on", "0", "RFHYBRID does not move parts of a token's CPU layers to the GPU with their weights copied in while the CPU computes (A/B runs)", Measuring),
    knob("ROCMFORGE_HYBRID_TRIAL", "on", "0 | force", "0: RFHYBRID keeps a new graph's plan without running it against the plan of its calibrated curves alone; force: every new graph's plan is run against the CPU-first (else GPU-first) plan, one run a turn (tests of a plan swapped between runs)", Measuring),
    knob("ROCMFORGE_HYBRID_SCRIPTS", "on", "0", "RFHYBRID walks a repeated split graph (a token of a model split between CPU and GPU) node by node every time instead of replaying its last run's script (`hybrid/backend/script.rs`; A/B runs)", Measuring),
    knob("ROCMFORGE_HYBRID_SPLIT_EXPERTS", "measured (0, 2 or 4)", "0..", "of a small batch's expert chain (gate, up, GLU, down) that RFHYBRID runs on the CPU, how many slots the GPU takes beside it (their experts copied in once the ids are known); 0 = none; unset: each width run for a few tokens, the fastest kept (and used by later processes for the same graph shape and threads)", Measuring),
    knob("ROCMFORGE_HYBRID_USED_EXPERTS", "on", "0", "RFHYBRID streams every expert of a batch's MUL_MAT_ID to the GPU instead of only those its ids use (read back first)", Measuring),
    knob("ROCMFORGE_HYBRID_FAKE_GPU", "off", "1", "RFHYBRID's GPU side is a second RFCPU device with its own memory (tests of placement and residency without a GPU)", Measuring),
    knob("ROCMFORGE_GEMM", "the machine's best", "avx2 | vnni256 | avx512 | tiles", "instruction set of RFCPU's quantized matmul tiles for prompts; tiles: the register tiles instead of the Q4_0/Q4_K weight panels of AVX-512 VNNI machines", Measuring),
    knob("ROCMFORGE_GEMV", "the machine's best", "avx2 | vnni256 | avx512 | panel", "instruction set of RFCPU's quantized matmul tiles for generation; panel: Q4_0 on AVX-512 VNNI in place in the weight panels' order (ggml-cpu's repacked bits, slower)", Measuring),
    knob("ROCMFORGE_CPU_AMX", "off", "1", "1: prompt products of Q4_0 / Q8_0 weights run on AMX tiles where the CPU and OS allow (Sapphire Rapids and later; slower than the AVX-512 VNNI panels on the machines measured)", Measuring),
    knob("ROCMFORGE_CPU_REPACK", "on (Q4_0, Q4_K; Q6_K too on Intel)", "0 | q4 | all", "0: RFCPU offers no load-time repacked buffer type (RFCPU_REPACK): weights stay in ggml's layout (A/B; the repacked Q4_0 / Q4_K products sum in the weight panels' order, ggml-cpu's repacked one); q4: Q4_0 and Q4_K only; all: Q8_0, Q6_K and IQ4_NL repacked too (Q6_K and IQ4_NL keep the plain path's bits)", Measuring),
    knob("ROCMFORGE_FFI_TIMING", "off", "1", "host time inside every C entry point, printed at exit", Measuring),
    knob("ROCMFORGE_FFI_TRACE", "off", "<file>", "with ROCMFORGE_FFI_TIMING=1: the last 16,384 entry calls in order (start, length, entry) written to the file at exit", Measuring),
    knob("ROCMFORGE_CPU_PREFETCH", "3072 on Intel, 0 elsewhere", "0.. (bytes)", "how far ahead of a repacked weight group's stream RFCPU's generation kernels prefetch (one core's memory reads wait on the mesh's latency on Intel server parts); 0 = none", Measuring),
    knob("ROCMFORGE_CPU_CHUNKS", "guided", "quarter", "how RFCPU hands out a node's work with 3+ threads: chunks shrinking from half an even share of what is left to one unit, or fixed quarter shares (A/B)", Measuring),
    knob("ROCMFORGE_CPU_PROFILE", "off", "1", "every RFCPU node timed (wall, busiest thread, mean thread), totals per op, weight type and batch width printed when the backend is freed", Measuring),
    knob("ROCMFORGE_CPU_FUSE", "on", "0", "RFCPU runs a mixture of experts' gate and up products and their SWIGLU node by node instead of in one pass (A/B runs)", Measuring),
    knob("ROCMFORGE_CPU_SMALL_GRAPH", "32768", "0..", "graphs with fewer output elements (no matmul, no attention) run on the calling thread; 0 = always all threads (test_ops sets 0)", Measuring),
    knob("ROCMFORGE_GPU_STAGING", "on", "0", "small synchronous writes copied synchronously instead of staged", Measuring),
    knob("ROCMFORGE_GPU_GRAPH_UPDATE", "on", "0", "a new executable graph for every capture instead of re-pointing the last one at a graph of the same kernels and shapes", Measuring),
    knob("ROCMFORGE_GPU_PROFILE", "off", "1", "every GPU launch timed by events, totals per op logged when the backend is freed", Measuring),
    knob("ROCMFORGE_GPU_TIMING", "off", "1", "per graph: GPU time, stream and host time by phase, logged when the backend is freed", Measuring),
    knob("ROCMFORGE_GPU_FUSE", "on", "0", "no fused kernels (each node its own launch)", Measuring),
    knob("ROCMFORGE_GPU_DUMP", "off", "1", "log the node sequence of big graphs", Measuring),
    knob("ROCMFORGE_GPU_PDL", "on", "0", "no programmatic dependent launch (NVIDIA sm_90+)", Measuring),
    knob("ROCMFORGE_GPU_PEER", "on", "0", "GPUs do not map each other's memory (NVIDIA and AMD): copies between GPUs (layer and row split) go through host memory", Measuring),
    knob("ROCMFORGE_GPU_DEFINES", "none", "\"-DX=1 -DY ...\"", "extra -D options for the kernel compiler (measuring builds; part of the cache key)", Measuring),
    knob("ROCMFORGE_GPU_OFFLOAD_MIN_BATCH", "32", "0..", "fewest batch columns for which RFGPU takes an op whose weights live in host memory (the scheduler copies them over); 0 = never", Measuring),
    knob("ROCMFORGE_GPU_BLAS_MIN_COLS", "8", "1..", "fewest src1 columns a MUL_MAT takes the vendor BLAS from", Measuring),
    knob("ROCMFORGE_GPU_MMID_MMA", "on", "0", "batched Q4_0 / Q8_0 / IQ4_NL / IQ4_XS MUL_MAT_ID on the integer dot kernel instead of tensor cores (NVIDIA sm_80+)", Measuring),
    knob("ROCMFORGE_GPU_MMQ", "auto", "0 | 1", "batched Q4_0 / Q8_0 / IQ4_NL / IQ4_XS MUL_MAT on the tensor-core integer kernel (NVIDIA sm_80+): auto = IQ4_NL / IQ4_XS weights and batched (3-D) weights of all four, the vendor BLAS (f16 operands) for 2-D Q4_0 / Q8_0; 0 = never; 1 = always", Measuring),
    knob("ROCMFORGE_GPU_MMID_SORTED_MIN", "8", "0..", "fewest tokens for which a quantized MUL_MAT_ID groups its (slot, token) pairs by expert before its products (each expert row read once for several tokens); 0 = never", Measuring),
    knob("ROCMFORGE_GPU_MV1", "unset", "rows,unroll,warps (a compiled shape, warps 1..8)", "shape of the one-column Q4_0 matrix-vector kernel (sweeps: docs/gpu-matvec.md)", Measuring),
    knob("ROCMFORGE_GPU_FA_TILED", "on", "0", "prompt attention on the row-per-block kernel instead of the tiled one", Measuring),
    knob("ROCMFORGE_GPU_FA_MMA", "on", "0", "prompt attention on the scalar tiles instead of tensor cores", Measuring),
    knob("ROCMFORGE_GPU_FA_MMA_SPLIT", "on", "0", "the tensor-core prompt attention never splits the keys over blocks", Measuring),
    knob("ROCMFORGE_GPU_FA_F16_ACC", "off", "1", "flash attention accumulates F16 V in f16 where ggml-cpu does", Measuring),
    knob("ROCMFORGE_GPU_FA_SPLIT", "1", "0 | 1 | 2", "few-row attention: no key split / split row kernel / one key per lane", Measuring),
    knob("ROCMFORGE_GPU_FA_VEC", "8", "0..", "blocks per compute unit of the generation attention kernel; 0 = the split row kernel", Measuring),
    knob("ROCMFORGE_GPU_ADD_NORM", "on", "0", "output and down projections without their fused residual ADD and RMS norm", Measuring),
    knob("ROCMFORGE_GPU_ADD_NORM_WARPS", "by occupancy", "1..32", "warps per block of the projection+add+norm kernel", Measuring),
    knob("ROCMFORGE_GPU_GLU_WARPS", "by occupancy", "1..32", "warps per block of the gate/up+GLU kernel", Measuring),
    knob("ROCMFORGE_GPU_GLU_PF_MB", "24", "0..", "L2 prefetch budget of the gate/up kernel, MB", Measuring),
    knob("ROCMFORGE_GPU_SKIP", "none", "prefix,prefix...", "launches of kernels so named are left out (results wrong): their cost inside a replayed graph", Measuring),
];

/// The knobs' values (None / the default where a variable is unset or does not parse).
pub struct Tuning {
    /// ROCMFORGE_THREADS.
    pub threads: Option<usize>,
    /// ROCMFORGE_SIMD as given.
    pub simd: Option<String>,
    /// ROCMFORGE_DEBUG set (to anything).
    pub debug: bool,
    /// ROCMFORGE_GPU, lower case.
    pub gpu: Option<String>,
    /// ROCMFORGE_CACHE_DIR, if not empty.
    pub cache_dir: Option<PathBuf>,
    /// ROCMFORGE_GPU_BLAS not 0 / off.
    pub gpu_blas: bool,
    /// ROCMFORGE_GPU_GRAPHS not 0.
    pub gpu_graphs: bool,
    /// ROCMFORGE_GPU_GRAPH_CACHE (default 128).
    pub gpu_graph_cache: usize,
    /// ROCMFORGE_GPU_PIN_HOST not 0.
    pub gpu_pin_host: bool,
    /// ROCMFORGE_GEMM / ROCMFORGE_GEMV as given.
    pub gemm: Option<String>,
    pub gemv: Option<String>,
    /// ROCMFORGE_CPU_REPACK not 0.
    pub cpu_repack: bool,
    /// ROCMFORGE_CPU_AMX=1.
    pub cpu_amx: bool,
    /// ROCMFORGE_CPU_REPACK=all: Q8_0, Q6_K and IQ4_NL weights repacked too (see
    /// cpu::repack::repack_types for why not by default).
    pub cpu_repack_all: bool,
    /// ROCMFORGE_CPU_REPACK=q4: Q4_0 and Q4_K only (no Q6_K on Intel).
    pub cpu_repack_q4: bool,
    /// ROCMFORGE_FFI_TIMING=1.
    pub ffi_timing: bool,
    /// ROCMFORGE_FFI_TRACE=<file>.
    pub ffi_trace: Option<PathBuf>,
    /// ROCMFORGE_CPU_PREFETCH (bytes).
    pub cpu_prefetch: Option<usize>,
    /// ROCMFORGE_CPU_PROFILE=1.
    pub cpu_profile: bool,
    /// ROCMFORGE_CPU_CHUNKS=quarter: work handed out in quarter shares, not shrinking chunks.
    pub cpu_chunks_quarter: bool,
    /// ROCMFORGE_CPU_CHUNKS=guided: shrinking chunks with 2 threads too.
    pub cpu_chunks_guided: bool,
    /// ROCMFORGE_CPU_FUSE not 0.
    pub cpu_fuse: bool,
    /// ROCMFORGE_CPU_SMALL_GRAPH.
    pub cpu_small_graph: Option<usize>,
    /// ROCMFORGE_GPU_STAGING not 0.
    pub gpu_staging: bool,
    /// ROCMFORGE_GPU_GRAPH_UPDATE not 0.
    pub gpu_graph_update: bool,
    /// ROCMFORGE_GPU_PROFILE=1.
    pub gpu_profile: bool,
    /// ROCMFORGE_GPU_TIMING=1.
    pub gpu_timing: bool,
    /// ROCMFORGE_GPU_FUSE not 0.
    pub gpu_fuse: bool,
    /// ROCMFORGE_GPU_DUMP=1.
    pub gpu_dump: bool,
    /// ROCMFORGE_GPU_PDL not 0.
    pub gpu_pdl: bool,
    /// ROCMFORGE_GPU_PEER not 0: GPUs read each other's memory directly where they can.
    pub gpu_peer: bool,
    /// ROCMFORGE_GPU_DEFINES: the -D options in it.
    pub gpu_defines: Vec<String>,
    /// ROCMFORGE_GPU_OFFLOAD_MIN_BATCH (default 32).
    pub gpu_offload_min_batch: usize,
    /// ROCMFORGE_GPU_BLAS_MIN_COLS.
    pub gpu_blas_min_cols: Option<usize>,
    /// ROCMFORGE_GPU_MMID_MMA not 0.
    pub gpu_mmid_mma: bool,
    /// ROCMFORGE_GPU_MMQ: Some(false) "0", Some(true) "1", None (default) auto.
    pub gpu_mmq: Option<bool>,
    /// ROCMFORGE_GPU_MMID_SORTED_MIN (default 8; 0 = never).
    pub gpu_mmid_sorted_min: usize,
    /// ROCMFORGE_GPU_MV1=rows,unroll,warps with warps in 1..=8 (the caller checks the shape).
    pub gpu_mv1: Option<(usize, usize, usize)>,
    /// ROCMFORGE_GPU_FA_TILED not 0.
    pub gpu_fa_tiled: bool,
    /// ROCMFORGE_GPU_FA_MMA not 0.
    pub gpu_fa_mma: bool,
    /// ROCMFORGE_GPU_FA_MMA_SPLIT not 0.
    pub gpu_fa_mma_split: bool,
    /// ROCMFORGE_GPU_FA_F16_ACC=1.
    pub gpu_fa_f16_acc: bool,
    /// ROCMFORGE_GPU_FA_SPLIT: 0, 2, else 1.
    pub gpu_fa_split: u8,
    /// ROCMFORGE_GPU_FA_VEC (default 8).
    pub gpu_fa_vec: usize,
    /// ROCMFORGE_GPU_ADD_NORM not 0.
    pub gpu_add_norm: bool,
    /// ROCMFORGE_GPU_ADD_NORM_WARPS / ROCMFORGE_GPU_GLU_WARPS in 1..=32.
    pub gpu_add_norm_warps: Option<usize>,
    pub gpu_glu_warps: Option<usize>,
    /// ROCMFORGE_GPU_GLU_PF_MB.
    pub gpu_glu_pf_mb: Option<usize>,
    /// ROCMFORGE_GPU_SKIP: the kernel name prefixes.
    pub gpu_skip: Vec<String>,
    /// ROCMFORGE_HYBRID_STRATEGY as given.
    pub hybrid_strategy: Option<String>,
    /// ROCMFORGE_HYBRID_VRAM in bytes (None: unset or not a size).
    pub hybrid_vram: Option<usize>,
    /// ROCMFORGE_TELEMETRY as given ("summary" or a file name).
    pub telemetry: Option<String>,
    /// ROCMFORGE_TRACE: the file name.
    pub trace: Option<PathBuf>,
    /// ROCMFORGE_HYBRID_CALIBRATE: "cached" (default), "force" or "0".
    pub hybrid_calibrate: String,
    /// ROCMFORGE_HYBRID_FAKE_GPU=1.
    pub hybrid_fake_gpu: bool,
    /// ROCMFORGE_HYBRID_PREFETCH not 0.
    pub hybrid_prefetch: bool,
    /// ROCMFORGE_HYBRID_GRAPH_COPIES not 0.
    pub hybrid_graph_copies: bool,
    /// ROCMFORGE_HYBRID_SCRIPTS=0: a split graph that repeats is walked node by node every time
    /// instead of replayed from its last run's script (hybrid/backend/script.rs). Default on.
    pub hybrid_scripts: bool,
    /// ROCMFORGE_HYBRID_USED_EXPERTS not 0.
    pub hybrid_used_experts: bool,
    /// ROCMFORGE_HYBRID_SPLIT_EXPERTS: of a small batch's expert chain run on the CPU, how many
    /// slots the GPU takes beside it (0: none); unset: measured (`split_experts.rs`).
    pub hybrid_split_experts: Option<usize>,
    /// ROCMFORGE_HYBRID_TRIAL as given ("0", "force"; absent: on).
    pub hybrid_trial: Option<String>,
}

/// "8GiB", "512 MiB", "1.5G", "123456" -> bytes.
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0_f64.powi(4),
        _ => return None,
    };
    (v.is_finite() && v >= 0.0).then_some((v * mult) as usize)
}

fn var(name: &str) -> Option<String> {
    debug_assert!(KNOBS.iter().any(|k| k.name == name), "{name} not in KNOBS");
    std::env::var(name).ok()
}

/// On unless the variable is "0".
fn on_unless_0(name: &str) -> bool {
    var(name).is_none_or(|v| v != "0")
}

/// Off unless the variable is "1".
fn on_if_1(name: &str) -> bool {
    var(name).is_some_and(|v| v == "1")
}

fn number(name: &str) -> Option<usize> {
    var(name)?.parse().ok()
}

/// A count in 1..=max.
fn count(name: &str, max: usize) -> Option<usize> {
    number(name).filter(|n| (1..=max).contains(n))
}

impl Tuning {
    /// Reads every knob from the environment.
    pub fn read() -> Tuning {
        Tuning {
            threads: number("ROCMFORGE_THREADS"),
            simd: var("ROCMFORGE_SIMD"),
            debug: std::env::var_os("ROCMFORGE_DEBUG").is_some(),
            gpu: var("ROCMFORGE_GPU").map(|v| v.to_ascii_lowercase()),
            cache_dir: std::env::var_os("ROCMFORGE_CACHE_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            gpu_blas: var("ROCMFORGE_GPU_BLAS")
                .is_none_or(|v| v != "0" && !v.eq_ignore_ascii_case("off")),
            gpu_graphs: on_unless_0("ROCMFORGE_GPU_GRAPHS"),
            gpu_graph_cache: number("ROCMFORGE_GPU_GRAPH_CACHE").unwrap_or(128),
            gpu_pin_host: on_unless_0("ROCMFORGE_GPU_PIN_HOST"),
            gemm: var("ROCMFORGE_GEMM"),
            gemv: var("ROCMFORGE_GEMV"),
            cpu_repack: on_unless_0("ROCMFORGE_CPU_REPACK"),
            cpu_amx: on_if_1("ROCMFORGE_CPU_AMX"),
            cpu_repack_all: var("ROCMFORGE_CPU_REPACK").as_deref() == Some("all"),
            cpu_repack_q4: var("ROCMFORGE_CPU_REPACK").as_deref() == Some("q4"),
            ffi_timing: on_if_1("ROCMFORGE_FFI_TIMING"),
            ffi_trace: var("ROCMFORGE_FFI_TRACE").map(PathBuf::from),
            cpu_prefetch: number("ROCMFORGE_CPU_PREFETCH"),
            cpu_profile: on_if_1("ROCMFORGE_CPU_PROFILE"),
            cpu_fuse: on_unless_0("ROCMFORGE_CPU_FUSE"),
            cpu_chunks_quarter: var("ROCMFORGE_CPU_CHUNKS").as_deref() == Some("quarter"),
            cpu_chunks_guided: var("ROCMFORGE_CPU_CHUNKS").as_deref() == Some("guided"),
            cpu_small_graph: number("ROCMFORGE_CPU_SMALL_GRAPH"),
            gpu_staging: on_unless_0("ROCMFORGE_GPU_STAGING"),
            gpu_graph_update: on_unless_0("ROCMFORGE_GPU_GRAPH_UPDATE"),
            gpu_profile: on_if_1("ROCMFORGE_GPU_PROFILE"),
            gpu_timing: on_if_1("ROCMFORGE_GPU_TIMING"),
            gpu_fuse: on_unless_0("ROCMFORGE_GPU_FUSE"),
            gpu_dump: on_if_1("ROCMFORGE_GPU_DUMP"),
            gpu_pdl: on_unless_0("ROCMFORGE_GPU_PDL"),
            gpu_peer: on_unless_0("ROCMFORGE_GPU_PEER"),
            gpu_defines: var("ROCMFORGE_GPU_DEFINES").map_or(Vec::new(), |v| {
                v.split_whitespace()
                    .filter(|o| o.starts_with("-D"))
                    .map(String::from)
                    .collect()
            }),
            gpu_offload_min_batch: number("ROCMFORGE_GPU_OFFLOAD_MIN_BATCH").unwrap_or(32),
            gpu_blas_min_cols: number("ROCMFORGE_GPU_BLAS_MIN_COLS"),
            gpu_mmid_mma: on_unless_0("ROCMFORGE_GPU_MMID_MMA"),
            gpu_mmq: match var("ROCMFORGE_GPU_MMQ").as_deref() {
                Some("0") => Some(false),
                Some("1") => Some(true),
                _ => None,
            },
            gpu_mmid_sorted_min: number("ROCMFORGE_GPU_MMID_SORTED_MIN").unwrap_or(8),
            gpu_mv1: var("ROCMFORGE_GPU_MV1").and_then(|v| {
                let p: Vec<usize> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
                match p[..] {
                    [r, u, w] if (1..=8).contains(&w) => Some((r, u, w)),
                    _ => None,
                }
            }),
            gpu_fa_tiled: on_unless_0("ROCMFORGE_GPU_FA_TILED"),
            gpu_fa_mma: on_unless_0("ROCMFORGE_GPU_FA_MMA"),
            gpu_fa_mma_split: on_unless_0("ROCMFORGE_GPU_FA_MMA_SPLIT"),
            gpu_fa_f16_acc: on_if_1("ROCMFORGE_GPU_FA_F16_ACC"),
            gpu_fa_split: match var("ROCMFORGE_GPU_FA_SPLIT").as_deref() {
                Some("0") => 0,
                Some("2") => 2,
                _ => 1,
            },
            gpu_fa_vec: number("ROCMFORGE_GPU_FA_VEC").unwrap_or(8),
            gpu_add_norm: on_unless_0("ROCMFORGE_GPU_ADD_NORM"),
            gpu_add_norm_warps: count("ROCMFORGE_GPU_ADD_NORM_WARPS", 32),
            gpu_glu_warps: count("ROCMFORGE_GPU_GLU_WARPS", 32),
            gpu_glu_pf_mb: number("ROCMFORGE_GPU_GLU_PF_MB"),
            gpu_skip: var("ROCMFORGE_GPU_SKIP").map_or(Vec::new(), |v| {
                v.split(',')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect()
            }),
            hybrid_strategy: var("ROCMFORGE_HYBRID_STRATEGY"),
            hybrid_vram: var("ROCMFORGE_HYBRID_VRAM").and_then(|v| parse_size(&v)),
            telemetry: var("ROCMFORGE_TELEMETRY").filter(|v| !v.is_empty() && v != "0"),
            trace: var("ROCMFORGE_TRACE")
                .filter(|v| !v.is_empty() && v != "0")
                .map(PathBuf::from),
            hybrid_calibrate: var("ROCMFORGE_HYBRID_CALIBRATE").unwrap_or_else(|| "cached".into()),
            hybrid_fake_gpu: on_if_1("ROCMFORGE_HYBRID_FAKE_GPU"),
            hybrid_prefetch: on_unless_0("ROCMFORGE_HYBRID_PREFETCH"),
            hybrid_graph_copies: on_unless_0("ROCMFORGE_HYBRID_GRAPH_COPIES"),
            hybrid_scripts: on_unless_0("ROCMFORGE_HYBRID_SCRIPTS"),
            hybrid_used_experts: on_unless_0("ROCMFORGE_HYBRID_USED_EXPERTS"),
            hybrid_split_experts: number("ROCMFORGE_HYBRID_SPLIT_EXPERTS"),
            hybrid_trial: var("ROCMFORGE_HYBRID_TRIAL"),
        }
    }
}

static TUNING: once_cell::sync::Lazy<Tuning> = once_cell::sync::Lazy::new(Tuning::read);

/// The knobs, read from the environment at the first call.
pub fn get() -> &'static Tuning {
    &TUNING
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src_files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                src_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// Every ROCMFORGE_ variable this file reads is in KNOBS, and no other file of src/ reads
    /// one (test inputs of ignored tests excepted).
    #[test]
    fn knobs_are_read_here_only() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let here = std::fs::read_to_string(root.join("src/tuning.rs")).unwrap();
        let code = &here[..here.find("#[cfg(test)]").unwrap()];
        for name in code.split('"').filter(|s| s.starts_with("ROCMFORGE_")) {
            assert!(KNOBS.iter().any(|k| k.name == name), "{name} not in KNOBS");
        }
        let mut files = Vec::new();
        src_files(&root.join("src"), &mut files);
        for f in files.iter().filter(|f| !f.ends_with("tuning.rs")) {
            let text = std::fs::read_to_string(f).unwrap();
            for (i, line) in text.lines().enumerate() {
                let reads = line.contains("env::var(\"ROCMFORGE_")
                    || line.contains("env::var_os(\"ROCMFORGE_");
                let test_input = line.contains("ROCMFORGE_QCHECK")
                    || line.contains("ROCMFORGE_KERNEL_GROUPS_OUT");
                assert!(!reads || test_input, "{}:{}: {line}", f.display(), i + 1);
            }
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_size("512 MiB"), Some(512 << 20));
        assert_eq!(parse_size("1.5g"), Some(3 << 29));
        assert_eq!(parse_size("1000"), Some(1000));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("8 parsecs"), None);
    }

    /// docs/tuning.md names every knob, and at most 8 are for users.
    #[test]
    fn docs_name_every_knob() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let doc = std::fs::read_to_string(root.join("docs/tuning.md")).unwrap();
        for k in KNOBS {
            assert!(
                doc.contains(&format!("`{}`", k.name)),
                "{} missing in docs/tuning.md",
                k.name
            );
        }
        assert!(KNOBS.iter().filter(|k| k.audience == User).count() <= 8);
    }
}
