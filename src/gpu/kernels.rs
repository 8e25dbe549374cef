//! The GPU kernels: HIP C++ sources embedded in the library, compiled on first use for the
//! device's architecture by the vendor's run-time compiler, and cached on disk keyed by a
//! hash of (vendor, arch, compiler version, options, source) (checked files: kernel_cache.rs).

use super::api::{DeviceInfo, Function, GpuApi, Module};
use super::kernel_cache::Cache;
use std::collections::HashMap;
use std::path::PathBuf;

const PRELUDE: &str = include_str!("../../kernels/prelude.h");
/// Shared device code (weight loaders) that several kernel files include.
const HEADERS: &[(&str, &str)] = &[("quants.h", include_str!("../../kernels/quants.h"))];

/// Every kernel file, compiled together as one program (one module per device).
const SOURCES: &[(&str, &str)] = &[
    ("mul_mat.hip", include_str!("../../kernels/mul_mat.hip")),
    ("mmvq.hip", include_str!("../../kernels/mmvq.hip")),
    (
        "elementwise.hip",
        include_str!("../../kernels/elementwise.hip"),
    ),
    ("cpy.hip", include_str!("../../kernels/cpy.hip")),
    ("rows.hip", include_str!("../../kernels/rows.hip")),
    (
        "get_set_rows.hip",
        include_str!("../../kernels/get_set_rows.hip"),
    ),
    ("rope.hip", include_str!("../../kernels/rope.hip")),
    (
        "activation.hip",
        include_str!("../../kernels/activation.hip"),
    ),
    (
        "flash_attn.hip",
        include_str!("../../kernels/flash_attn.hip"),
    ),
    (
        "flash_attn_split.hip",
        include_str!("../../kernels/flash_attn_split.hip"),
    ),
    (
        "flash_attn_vec.hip",
        include_str!("../../kernels/flash_attn_vec.hip"),
    ),
    (
        "mul_mat_id.hip",
        include_str!("../../kernels/mul_mat_id.hip"),
    ),
    ("norm.hip", include_str!("../../kernels/norm.hip")),
    ("reduce.hip", include_str!("../../kernels/reduce.hip")),
    ("layout.hip", include_str!("../../kernels/layout.hip")),
    ("quantize.hip", include_str!("../../kernels/quantize.hip")),
    ("dequant.hip", include_str!("../../kernels/dequant.hip")),
    (
        "flash_attn_tiled.hip",
        include_str!("../../kernels/flash_attn_tiled.hip"),
    ),
    (
        "flash_attn_mma.hip",
        include_str!("../../kernels/flash_attn_mma.hip"),
    ),
    ("hadamard.hip", include_str!("../../kernels/hadamard.hip")),
    // Last: it uses mmvq.hip's, activation.hip's, rope.hip's, quantize.hip's and hadamard.hip's
    // device functions.
    ("fused.hip", include_str!("../../kernels/fused.hip")),
];

/// Weight types with a loader in quants.h, by kernel-name suffix.
pub const WEIGHT_TYPES: &[(crate::ggml_types::GgmlType, &str)] = {
    use crate::ggml_types::GgmlType::*;
    &[
        (F32, "f32"),
        (F16, "f16"),
        (Q4_0, "q4_0"),
        (Q4_1, "q4_1"),
        (Q5_0, "q5_0"),
        (Q5_1, "q5_1"),
        (Q8_0, "q8_0"),
        (IQ4_NL, "iq4_nl"),
        (Q4_K, "q4_k"),
        (Q6_K, "q6_k"),
        (BF16, "bf16"),
        (Q2_K, "q2_k"),
        (Q3_K, "q3_k"),
        (Q5_K, "q5_k"),
    ]
};

/// Kernel-name suffix of a weight type, if the kernels read it.
pub fn weight_suffix(t: crate::ggml_types::GgmlType) -> Option<&'static str> {
    WEIGHT_TYPES.iter().find(|(w, _)| *w == t).map(|(_, s)| *s)
}

/// Weight types with an integer-dot matrix-vector kernel `mul_mat_vec_q_{suffix}` (mmvq.hip).
pub const MVQ_TYPES: &[&str] = &[
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q4_k", "q6_k",
];

/// (rows, unroll) shapes of the measuring variants mul_mat_vec_q1x_q4_0_r{rows}_u{unroll} (mmvq.hip).
pub const MV1X_SHAPES: &[(usize, usize)] = &[(1, 4), (1, 8), (2, 2), (2, 8), (4, 2), (4, 4)];

/// (head size, warps) of the tensor-core prompt attention kernels flash_attn_mma_{kv}_d{D}_w{W}
/// (flash_attn_mma.hip, kv f16 or q8_0): 16 query rows a warp.
pub const FM_SHAPES: &[(usize, usize)] = &[(64, 2), (64, 4), (128, 2), (128, 4)];

/// (head size, most rows) of the generation attention kernels flash_attn_vec_{kv}_d{D}_r{R} (kv f16 or q8_0)
/// (flash_attn_vec.hip), smallest row count first for each head size.
pub const FAV_SHAPES: &[(usize, usize)] = &[(64, 4), (64, 16), (128, 4), (128, 8), (256, 4)];

/// Entry points made once per weight type: `{prefix}_{suffix}`.
const PER_WEIGHT_TYPE: &[&str] = &[
    "mul_mat_vec",
    "mul_mat_tiled",
    "get_rows",
    "dequant_f16",
    "mul_mat_id",
];

/// Every entry point: the fixed ones and the per-weight-type ones.
pub fn kernel_names() -> Vec<String> {
    let mut v: Vec<String> = KERNEL_NAMES.iter().map(|s| s.to_string()).collect();
    for p in PER_WEIGHT_TYPE {
        for (_, suf) in WEIGHT_TYPES {
            v.push(format!("{p}_{suf}"));
        }
    }
    v.extend(MVQ_TYPES.iter().map(|suf| format!("mul_mat_vec_q_{suf}")));
    v.extend(MVQ_TYPES.iter().map(|suf| format!("mul_mat_vec_q1_{suf}")));
    v.extend(MVQ_TYPES.iter().map(|suf| format!("mul_mat_vec_q1s_{suf}")));
    v.extend(
        MVQ_TYPES
            .iter()
            .map(|suf| format!("mul_mat_vec_q1_pair_{suf}")),
    );
    v.extend(
        MVQ_TYPES
            .iter()
            .map(|suf| format!("mul_mat_vec_q1_qkv_{suf}")),
    );
    v.extend(MVQ_TYPES.iter().map(|suf| format!("mul_mat_id_q_{suf}")));
    v.extend(
        MV1X_SHAPES
            .iter()
            .map(|(r, u)| format!("mul_mat_vec_q1x_q4_0_r{r}_u{u}")),
    );
    v.extend(
        MVQ_TYPES
            .iter()
            .map(|suf| format!("mul_mat_vec_q_glu_{suf}")),
    );
    v.extend(
        MVQ_TYPES
            .iter()
            .map(|suf| format!("mul_mat_vec_q_glu_q8_{suf}")),
    );
    v.extend(
        MVQ_TYPES
            .iter()
            .map(|suf| format!("mul_mat_vec_q_add_norm_{suf}")),
    );
    for kv in ["f16", "q8_0"] {
        v.extend(
            FAV_SHAPES
                .iter()
                .map(|(d, r)| format!("flash_attn_vec_{kv}_d{d}_r{r}")),
        );
        v.extend(
            FM_SHAPES
                .iter()
                .map(|(d, w)| format!("flash_attn_mma_{kv}_d{d}_w{w}")),
        );
    }
    v
}

/// The `extern "C"` entry points the backend launches.
pub const KERNEL_NAMES: &[&str] = &[
    "round_src1",
    "quantize_q8",
    "fused_rms_norm",
    "fused_rope_kv",
    "binary_f32",
    "scale_f32",
    "cpy_f32_f32",
    "cpy_f32_f16",
    "cpy_f16_f32",
    "cpy_f16_f16",
    "soft_max_f32",
    "rms_norm_f32",
    "rf_spin",
    "set_rows",
    "set_rows_short",
    "rope_f32",
    "rope_f16",
    "unary_f32",
    "glu_f32",
    "flash_attn_f16_f16",
    "flash_attn_f32_f32",
    "src1_to_f16",
    "flash_attn_tiled_f16_f16_d64_q16",
    "flash_attn_tiled_f16_f16_d64_q32",
    "flash_attn_tiled_f16_f16_d128_q16",
    "flash_attn_tiled_f16_f16_d128_q32",
    "flash_attn_tiled_f32_f32_d64_q16",
    "flash_attn_tiled_f32_f32_d64_q32",
    "flash_attn_tiled_f32_f32_d128_q16",
    "flash_attn_tiled_f32_f32_d128_q32",
    "flash_attn_q8_0_q8_0",
    "flash_attn_split_f16_f16_d64",
    "flash_attn_split_f16_f16_d128",
    "flash_attn_split_f16_f16_d256",
    "flash_attn_split_f32_f32_d64",
    "flash_attn_split_f32_f32_d128",
    "flash_attn_split_f32_f32_d256",
    "flash_attn_split_q8_0_q8_0_d64",
    "flash_attn_split_q8_0_q8_0_d128",
    "flash_attn_split_q8_0_q8_0_d256",
    "flash_attn_split_combine",
    "cpy_f32_bf16",
    "cpy_f16_bf16",
    "cpy_bf16_f32",
    "cpy_bf16_f16",
    "cpy_bf16_bf16",
    "binary_typed",
    "unary_rows_f32",
    "unary_rows_f16",
    "glu_f16",
    "norm_f32",
    "sum_rows_f32",
    "sum_f32",
    "cumsum_f32",
    "argsort_f32",
    "concat",
    "repeat",
    "pad_f32",
    "fill",
    "arange_f32",
    "diag_mask_inf_f32",
    "set_rows_q",
    "cpy_rows_q",
    "add_id_f32",
    "hadamard_rows",
    "rot_qkv",
];

/// One translation unit: the prelude, the shared headers, then each file with its local
/// `#include "..."` lines removed (the run-time compilers get no include path) and a `#line`
/// so errors name the file.
pub fn program_source() -> String {
    let mut s = String::with_capacity(64 * 1024);
    s.push_str("#line 1 \"prelude.h\"\n");
    s.push_str(PRELUDE);
    for (name, text) in HEADERS.iter().chain(SOURCES.iter()) {
        s.push_str(&format!("\n#line 1 \"{name}\"\n"));
        for line in text.lines() {
            if line.trim_start().starts_with("#include \"") {
                s.push('\n'); // keep line numbers
            } else {
                s.push_str(line);
                s.push('\n');
            }
        }
    }
    s
}

/// FNV-1a, 64 bits: a stable hash (std's hasher may change between Rust releases).
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff; // separator, so ("ab","c") and ("a","bc") differ
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `$ROCMFORGE_CACHE_DIR`, else `$XDG_CACHE_HOME/rocmforge`, else `~/.cache/rocmforge`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = &crate::tuning::get().cache_dir {
        return Some(d.clone());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(d).join("rocmforge"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("rocmforge"))
}

/// Options every compile gets besides the target.
pub fn compile_options(info: &DeviceInfo) -> Vec<String> {
    let mut v = vec![format!("-DRF_WARP_SIZE={}", info.warp_size)];
    // Extra -D options for measuring builds (ROCMFORGE_GPU_DEFINES="-DX=1 -DY"; part of the cache key).
    v.extend(crate::tuning::get().gpu_defines.iter().cloned());
    v
}

/// Name of the cached binary for this program on this target.
pub fn cache_file_name(
    vendor: &str,
    arch: &str,
    compiler: &str,
    options: &[String],
    source: &str,
) -> String {
    let opts = options.join(" ");
    let key = fnv1a64(&[
        vendor.as_bytes(),
        arch.as_bytes(),
        compiler.as_bytes(),
        opts.as_bytes(),
        source.as_bytes(),
    ]);
    let arch_safe: String = arch
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!(
        "kernels-{}-{}-{:016x}.bin",
        vendor.to_ascii_lowercase(),
        arch_safe,
        key
    )
}

/// The loaded module of one device and its entry points.
pub struct Kernels {
    _module: Module,
    funcs: HashMap<String, Function>,
}

impl Kernels {
    /// The loaded entry point `name` (every name of kernel_names() was resolved at load; any
    /// other is a launcher bug, reported as an error rather than a panic).
    pub fn get(&self, name: &str) -> Result<Function, String> {
        self.funcs
            .get(name)
            .copied()
            .ok_or_else(|| format!("kernel {name} is not in the kernel list"))
    }

    /// Compiles (or finds in the cache in `dir`, usually `cache_dir()`) and loads the kernels
    /// on device `ord`.
    pub fn load(
        api: &dyn GpuApi,
        ord: usize,
        info: &DeviceInfo,
        dir: Option<&std::path::Path>,
    ) -> Result<Kernels, String> {
        let source = program_source();
        let options = compile_options(info);
        let compiler = api.compiler_version();
        let (name, key) = cache_entry(api, info);
        let cache = dir.and_then(|d| match Cache::open(d) {
            Ok(c) => Some(c),
            Err(e) => {
                crate::log_warn!("kernel cache not used ({e}); compiling in memory");
                None
            }
        });
        if let Some(c) = &cache {
            let cached = c.load(&name, &key).and_then(|image| match image {
                Some(image) => Self::from_image(api, ord, &image).map(Some),
                None => Ok(None),
            });
            match cached {
                Ok(Some(k)) => {
                    crate::log_debug!(
                        "GPU kernels for {} from cache {}",
                        info.arch,
                        c.path(&name).display()
                    );
                    return Ok(k);
                }
                Ok(None) => {}
                Err(e) => {
                    crate::log_warn!("cached GPU kernels unusable ({e}); removed, recompiling");
                    c.evict(&name);
                }
            }
        }
        crate::log_info!(
            "compiling GPU kernels for {} ({}) with {} ...",
            info.name,
            info.arch,
            compiler
        );
        let t0 = std::time::Instant::now();
        let image = api.compile(&source, "rocmforge.hip", &info.arch, &options)?;
        crate::log_info!(
            "compiled GPU kernels for {} in {:.2} s ({} bytes)",
            info.arch,
            t0.elapsed().as_secs_f64(),
            image.len()
        );
        if let Some(c) = &cache {
            if let Err(e) = c.store(&name, &key, &image) {
                crate::log_warn!("{e} (kernels are compiled again next time)");
            }
        }
        Self::from_image(api, ord, &image)
    }

    /// Loads `image` and resolves every kernel; a module missing one is unloaded again (a
    /// cached one is then evicted and the program compiled again).
    fn from_image(api: &dyn GpuApi, ord: usize, image: &[u8]) -> Result<Kernels, String> {
        if image.is_empty() {
            return Err("empty kernel image".into());
        }
        let module = api.module_load(ord, image)?;
        let mut funcs = HashMap::new();
        for name in kernel_names() {
            match api.module_function(ord, module, &name) {
                Ok(f) => {
                    funcs.insert(name, f);
                }
                Err(e) => {
                    api.module_unload(ord, module);
                    return Err(e);
                }
            }
        }
        Ok(Kernels {
            _module: module,
            funcs,
        })
    }
}

/// The cache file name and key of the program for this device.
pub fn cache_entry(api: &dyn GpuApi, info: &DeviceInfo) -> (String, Vec<u8>) {
    let (source, options, compiler) = (
        program_source(),
        compile_options(info),
        api.compiler_version(),
    );
    (
        cache_file_name(api.vendor(), &info.arch, &compiler, &options, &source),
        cache_key(api.vendor(), &info.arch, &compiler, &options, &source),
    )
}

/// What a cached image was compiled from (its SHA-256 is in the file's header): equal keys,
/// equal programs. The file name holds a short hash of the same.
pub fn cache_key(
    vendor: &str,
    arch: &str,
    compiler: &str,
    options: &[String],
    source: &str,
) -> Vec<u8> {
    [vendor, arch, compiler, &options.join(" "), source]
        .join("\0")
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_has_every_kernel_and_no_includes() {
        let s = program_source();
        for name in kernel_names() {
            let direct = s.contains(&format!("void {name}("));
            // Per-type kernels are stamped out by macros: SOME_KERNELS(suffix, loader).
            let stamped = WEIGHT_TYPES.iter().any(|(_, suf)| {
                name.ends_with(&format!("_{suf}")) && s.contains(&format!("({suf}, w_{suf})"))
            }) || MVQ_TYPES.iter().any(|suf| {
                [
                    format!("mul_mat_vec_q_{suf}"),
                    format!("mul_mat_vec_q1_{suf}"),
                    format!("mul_mat_id_q_{suf}"),
                ]
                .contains(&name)
                    && s.contains(&format!("MVQ_KERNEL({suf})"))
            }) || MVQ_TYPES.iter().any(|suf| {
                (name == format!("mul_mat_vec_q_glu_{suf}")
                    || name == format!("mul_mat_vec_q_glu_q8_{suf}"))
                    && s.contains(&format!("MVQ_GLU_KERNEL({suf})"))
            }) || MVQ_TYPES.iter().any(|suf| {
                name == format!("mul_mat_vec_q_add_norm_{suf}")
                    && s.contains(&format!("MVQ_ADD_NORM_KERNEL({suf})"))
            });
            let mv1x = MV1X_SHAPES.iter().any(|(r, u)| {
                name == format!("mul_mat_vec_q1x_q4_0_r{r}_u{u}")
                    && s.contains(&format!("MV1X_KERNEL({r}, {u})"))
            });
            let fav = [("f16", "false, 64"), ("q8_0", "true, 34")]
                .iter()
                .any(|(kv, rest)| {
                    FAV_SHAPES.iter().any(|(d, r)| {
                        name == format!("flash_attn_vec_{kv}_d{d}_r{r}")
                            && s.contains(&format!("FAV_KERNEL({kv}, {rest}, {d}, {r})"))
                    })
                });
            let fm = [("f16", "false"), ("q8_0", "true")].iter().any(|(kv, q8)| {
                FM_SHAPES.iter().any(|(d, w)| {
                    name == format!("flash_attn_mma_{kv}_d{d}_w{w}")
                        && s.contains(&format!("FM_KERNEL({kv}, {q8}, {d}, {w})"))
                })
            });
            assert!(
                direct || stamped || mv1x || fav || fm,
                "kernel {name} missing from the sources"
            );
        }
        assert!(!s.contains("#include \""));
    }

    /// The host launches kernels with programmatic dependent launch on sm_90+: a kernel that
    /// touched memory before rf_grid_begin() could read its inputs before they are written
    /// (only L2 prefetches, helpers named *_prefetch_l2, may come before it).
    #[test]
    fn every_kernel_begins_with_grid_begin() {
        let mut count = 0;
        for (file, src) in SOURCES {
            let mut rest = *src;
            while let Some(at) = rest.find("RF_KERNEL ") {
                let k = &rest[at..];
                let name_at = k.find(" void ").expect("kernel without void");
                let open = name_at + k[name_at..].find('(').unwrap();
                let mut depth = 0;
                let mut close = open;
                for (i, c) in k[open..].char_indices() {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                let brace = close + k[close..].find('{').unwrap();
                let mut body =
                    k[brace + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
                // L2 prefetches (address arithmetic on the arguments) may come first.
                while body.split('(').next().is_some_and(|f| {
                    f.ends_with("_prefetch_l2") && !f.contains(char::is_whitespace)
                }) {
                    body = body[body.find(';').unwrap() + 1..]
                        .trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
                }
                let name = k[name_at + 6..open].trim();
                assert!(
                    body.starts_with("rf_grid_begin();"),
                    "{file}: kernel {name} does not begin with rf_grid_begin()"
                );
                count += 1;
                rest = &k[brace..];
            }
        }
        assert!(count > 70, "found only {count} kernels");
    }

    /// Not a check: writes the program exactly as the library compiles it to the file named by
    /// ROCMFORGE_KERNEL_SOURCE_OUT, for scripts/check-nvrtc-kernels.py (run with --ignored).
    #[test]
    #[ignore]
    fn write_program_source() {
        let path = std::env::var_os("ROCMFORGE_KERNEL_SOURCE_OUT")
            .expect("ROCMFORGE_KERNEL_SOURCE_OUT names the output file");
        std::fs::write(path, program_source()).unwrap();
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let o = vec!["-DRF_WARP_SIZE=32".to_string()];
        let a = cache_file_name("CUDA", "sm_90", "nvrtc 13.0", &o, "src");
        assert_eq!(a, cache_file_name("CUDA", "sm_90", "nvrtc 13.0", &o, "src"));
        assert_ne!(a, cache_file_name("CUDA", "sm_80", "nvrtc 13.0", &o, "src"));
        assert_ne!(a, cache_file_name("CUDA", "sm_90", "nvrtc 12.4", &o, "src"));
        assert_ne!(
            a,
            cache_file_name("CUDA", "sm_90", "nvrtc 13.0", &o, "src2")
        );
        assert_ne!(
            a,
            cache_file_name("CUDA", "sm_90", "nvrtc 13.0", &[], "src")
        );
        assert!(
            cache_file_name("HIP", "gfx90a:sramecc+:xnack-", "hiprtc 6.2", &o, "s")
                .starts_with("kernels-hip-gfx90a_sramecc__xnack_-")
        );
    }
}
