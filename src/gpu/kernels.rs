//! The GPU kernels: HIP C++ sources embedded in the library, compiled in groups
//! (kernel_groups.rs) on first use for the device's architecture by the vendor's run-time
//! compiler, several groups at once, and cached on disk one file per group keyed by a hash of
//! (vendor, arch, compiler version, options, group source) (checked files: kernel_cache.rs).

use super::api::{DeviceInfo, Function, GpuApi};
use super::kernel_cache::Cache;
use super::kernel_groups::{companions, group_of, groups, Group};
use once_cell::sync::OnceCell;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Weight types with a loader in quants.h or quants_iq.h, by kernel-name suffix.
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
        (IQ4_XS, "iq4_xs"),
        (MXFP4, "mxfp4"),
        (TQ2_0, "tq2_0"),
        (TQ1_0, "tq1_0"),
        (IQ3_S, "iq3_s"),
        (IQ3_XXS, "iq3_xxs"),
        (IQ2_XXS, "iq2_xxs"),
        (IQ2_XS, "iq2_xs"),
        (IQ2_S, "iq2_s"),
        (IQ1_S, "iq1_s"),
        (IQ1_M, "iq1_m"),
        (NVFP4, "nvfp4"),
        (Q1_0, "q1_0"),
        (Q2_0, "q2_0"),
    ]
};

/// Kernel-name suffix of a weight type, if the kernels read it.
pub fn weight_suffix(t: crate::ggml_types::GgmlType) -> Option<&'static str> {
    WEIGHT_TYPES.iter().find(|(w, _)| *w == t).map(|(_, s)| *s)
}

/// Weight types with an integer-dot matrix-vector kernel `mul_mat_vec_q_{suffix}` (mmvq.hip).
pub const MVQ_TYPES: &[&str] = &[
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q4_k", "q5_k", "q6_k", "q2_k", "q3_k",
    "iq4_xs", "mxfp4", "tq2_0", "tq1_0", "iq3_s", "iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s",
    "iq1_m", "nvfp4", "q1_0", "q2_0",
];

/// Weight types with tensor-core integer kernels for batches of columns: mul_mat_id_mma_{suffix}
/// (mmvq.hip) and mul_mat_mma_{suffix} (mul_mat_mma.hip); symmetric formats whose activations
/// are Q8_0 or Q8_K.
pub const MMA_TYPES: &[&str] = &["q4_0", "q8_0", "iq4_nl", "iq4_xs"];

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
    v.extend(["f32", "f16", "bf16"].map(|suf| format!("mul_mat_vec8_{suf}")));
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
        MVQ_TYPES
            .iter()
            .map(|suf| format!("mul_mat_id_q_sorted_{suf}")),
    );
    // The tensor-core forms of the batched MUL_MAT_ID (mmvq.hip) and MUL_MAT (mul_mat_mma.hip).
    v.extend(MMA_TYPES.iter().map(|suf| format!("mul_mat_id_mma_{suf}")));
    v.extend(MMA_TYPES.iter().map(|suf| format!("mul_mat_mma_{suf}")));
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
    "mmid_sort",
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
    "allreduce_sum_f32",
    "allreduce_small_f32",
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

/// Name of the cached binary of one kernel group (label "mul_mat q4_1") on this target.
pub fn cache_file_name(
    vendor: &str,
    arch: &str,
    group: &str,
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
    let safe = |s: &str| -> String {
        s.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    };
    format!(
        "kernels-{}-{}-{}-{:016x}.bin",
        vendor.to_ascii_lowercase(),
        safe(arch),
        safe(group),
        key
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

/// Most threads compiling kernel groups at once. nvrtc/hiprtc compile one program on one
/// core; a model's first graphs need about a dozen groups (one weight type, one KV type and
/// head size), the largest a few seconds each, so 8 threads finish them in about the time of
/// the largest while leaving a 16-core host cores for loading the model (and bounding the
/// compilers' memory: about 120 MB each for nvrtc 12.9 on the largest group).
const MAX_COMPILE_THREADS: usize = 8;

/// Where one group stands on one device.
enum State {
    /// Not asked for yet.
    Idle,
    /// Waiting for a compile thread (or the first `get`, which takes it over).
    Queued,
    /// Being read from the cache or compiled.
    Building,
    /// Image ready (compiled, or read from the cache: `cached`), module not loaded yet: the
    /// driver calls happen on the thread that launches (with its device current).
    Built { image: Vec<u8>, cached: bool },
    /// Loaded: the functions are in `Slot::funcs`.
    Loaded,
    /// Compile or load failed: remembered for this process (not on disk).
    Failed(String),
}

/// How a group's build ended (for the progress lines).
enum Built {
    Cached,
    /// Compiled: the image's bytes.
    Compiled(usize),
    Failed,
}

struct Slot {
    state: Mutex<State>,
    changed: Condvar,
    /// The group's functions once loaded: read without the lock on every launch.
    funcs: OnceCell<HashMap<String, Function>>,
}

/// Progress of the groups asked for since the work last drained (the progress lines).
#[derive(Default)]
struct Work {
    queue: VecDeque<usize>,
    threads: usize,
    asked: usize,
    done: usize,
    compiled: usize,
    cached: usize,
    failed: usize,
    since: Option<std::time::Instant>,
}

struct Shared {
    api: Arc<dyn GpuApi>,
    ord: usize,
    info: DeviceInfo,
    dir: Option<PathBuf>,
    /// Opened on first use (a failure logged once; then groups compile in memory).
    cache: OnceCell<Option<Cache>>,
    slots: Vec<Slot>,
    work: Mutex<Work>,
    /// Groups asked for by a launch that no prefetch had asked for.
    misses: AtomicUsize,
    /// Some group loaded / some group failed (all failing: the device can compute nothing).
    any_loaded: AtomicBool,
    any_failed: AtomicBool,
}

/// The kernels of one device: each group compiled (or read from the cache) on first use of
/// one of its kernels, or ahead of it by `prefetch` on a few threads.
pub struct Kernels {
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Kernels {
    /// Nothing is compiled yet; `dir` (usually `cache_dir()`) holds the cached groups.
    pub fn new(
        api: Arc<dyn GpuApi>,
        ord: usize,
        info: &DeviceInfo,
        dir: Option<PathBuf>,
    ) -> Kernels {
        let slots = groups()
            .iter()
            .map(|_| Slot {
                state: Mutex::new(State::Idle),
                changed: Condvar::new(),
                funcs: OnceCell::new(),
            })
            .collect();
        Kernels {
            shared: Arc::new(Shared {
                api,
                ord,
                info: info.clone(),
                dir,
                cache: OnceCell::new(),
                slots,
                work: Mutex::new(Work::default()),
                misses: AtomicUsize::new(0),
                any_loaded: AtomicBool::new(false),
                any_failed: AtomicBool::new(false),
            }),
        }
    }

    /// The entry point `name`, its group compiled or loaded first where needed (on this
    /// thread, or waiting for the thread already doing it). A failed group stays failed.
    pub fn get(&self, name: &str) -> Result<Function, String> {
        let g = group_of(name).ok_or_else(|| format!("kernel {name} is not in the kernel list"))?;
        let sh = &self.shared;
        let slot = &sh.slots[g];
        let find = |funcs: &HashMap<String, Function>| {
            funcs
                .get(name)
                .copied()
                .ok_or_else(|| format!("kernel {name} missing from its group"))
        };
        if let Some(funcs) = slot.funcs.get() {
            return find(funcs);
        }
        let mut st = lock(&slot.state);
        loop {
            match &mut *st {
                State::Loaded => {
                    return slot
                        .funcs
                        .get()
                        .map_or_else(|| Err("kernel group lost".into()), find);
                }
                State::Failed(e) => {
                    return Err(format!("kernel group {}: {e}", groups()[g].label()));
                }
                State::Building => {
                    st = slot.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                State::Idle | State::Queued => {
                    if matches!(*st, State::Idle) {
                        sh.misses.fetch_add(1, Ordering::Relaxed);
                        sh.asked(1);
                    }
                    *st = State::Building;
                    drop(st);
                    sh.build(g, true);
                    st = lock(&slot.state);
                }
                State::Built { image, cached } => {
                    let (image, cached) = (std::mem::take(image), *cached);
                    match sh.load(g, &image) {
                        Ok(funcs) => {
                            sh.any_loaded.store(true, Ordering::Relaxed);
                            let _ = slot.funcs.set(funcs);
                            *st = State::Loaded;
                        }
                        Err(e) if cached => {
                            // A cached file that loads but is not this group's (stale or
                            // foreign): evicted, compiled again.
                            crate::log_warn!(
                                "cached GPU kernel group {} unusable ({e}); removed, recompiling",
                                groups()[g].label()
                            );
                            if let Some(c) = sh.cache() {
                                c.evict(&sh.entry(g).0);
                            }
                            *st = State::Building;
                            drop(st);
                            sh.asked(1);
                            sh.build(g, false);
                            st = lock(&slot.state);
                        }
                        Err(e) => {
                            crate::log_error!(
                                "GPU kernel group {} for {} could not be loaded: {e}",
                                groups()[g].label(),
                                sh.info.arch
                            );
                            sh.any_failed.store(true, Ordering::Relaxed);
                            *st = State::Failed(e);
                        }
                    }
                    slot.changed.notify_all();
                }
            }
        }
    }

    /// Starts building the groups of `names` not asked for yet, and their `companions`, on up
    /// to MAX_COMPILE_THREADS threads (largest family first); returns how many groups it asked
    /// for.
    pub fn prefetch<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> usize {
        let mut wanted: Vec<usize> = names.into_iter().filter_map(group_of).collect();
        let more: Vec<usize> = wanted.iter().flat_map(|&g| companions(g)).collect();
        wanted.extend(more);
        wanted.sort_unstable();
        wanted.dedup();
        let sh = &self.shared;
        let mut fresh = Vec::new();
        for g in wanted {
            let mut st = lock(&sh.slots[g].state);
            if matches!(*st, State::Idle) {
                *st = State::Queued;
                fresh.push(g);
            }
        }
        if fresh.is_empty() {
            return 0;
        }
        sh.asked(fresh.len());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spawn = {
            let mut w = lock(&sh.work);
            w.queue.extend(fresh.iter().copied());
            let want = cores
                .min(MAX_COMPILE_THREADS)
                .min(w.queue.len() + w.threads);
            let n = want.saturating_sub(w.threads);
            w.threads += n;
            n
        };
        for _ in 0..spawn {
            let sh = self.shared.clone();
            let r = std::thread::Builder::new()
                .name("rf-kernels".into())
                .spawn(move || sh.compile_queued());
            if r.is_err() {
                // No thread: the groups stay queued and `get` builds them itself.
                lock(&self.shared.work).threads -= 1;
            }
        }
        fresh.len()
    }

    /// Takes back the groups still queued (they are built on first use instead) and waits for
    /// the compile threads to finish the ones they are on and exit.
    pub fn quiesce(&self) {
        let sh = &self.shared;
        let queued: Vec<usize> = std::mem::take(&mut lock(&sh.work).queue).into();
        let mut taken = 0;
        for g in queued {
            let mut st = lock(&sh.slots[g].state);
            if matches!(*st, State::Queued) {
                *st = State::Idle;
                taken += 1;
            }
        }
        if taken > 0 {
            sh.progress(None, taken);
        }
        while lock(&sh.work).threads > 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// How many groups a launch had to ask for itself (no prefetch had).
    pub fn misses(&self) -> usize {
        self.shared.misses.load(Ordering::Relaxed)
    }

    /// Groups failed and none ever loaded: the compiler or driver does not work at all.
    pub fn all_failed(&self) -> bool {
        let sh = &self.shared;
        sh.any_failed.load(Ordering::Relaxed) && !sh.any_loaded.load(Ordering::Relaxed)
    }

    /// Some group failed (its ops' launches fail).
    pub fn any_failed(&self) -> bool {
        self.shared.any_failed.load(Ordering::Relaxed)
    }

    /// The cache file name and key of group `g` on this device.
    pub fn cache_entry(&self, g: usize) -> (String, Vec<u8>) {
        self.shared.entry(g)
    }
}

impl Shared {
    fn cache(&self) -> Option<&Cache> {
        self.cache
            .get_or_init(|| {
                self.dir.as_deref().and_then(|d| match Cache::open(d) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        crate::log_warn!("kernel cache not used ({e}); compiling in memory");
                        None
                    }
                })
            })
            .as_ref()
    }

    fn options(&self, g: usize) -> Vec<String> {
        let mut o = compile_options(&self.info);
        o.extend(groups()[g].options());
        o
    }

    fn entry(&self, g: usize) -> (String, Vec<u8>) {
        let (source, options, compiler) = (
            groups()[g].source(),
            self.options(g),
            self.api.compiler_version(),
        );
        let (vendor, arch) = (self.api.vendor(), &self.info.arch);
        let label = groups()[g].label();
        (
            cache_file_name(vendor, arch, &label, &compiler, &options, &source),
            cache_key(vendor, arch, &compiler, &options, &source),
        )
    }

    fn asked(&self, n: usize) {
        let mut w = lock(&self.work);
        w.asked += n;
        w.since.get_or_insert_with(std::time::Instant::now);
    }

    /// A compile thread: builds queued groups until none are left.
    fn compile_queued(&self) {
        loop {
            let next = {
                let mut w = lock(&self.work);
                match w.queue.pop_front() {
                    Some(g) => g,
                    None => {
                        w.threads -= 1;
                        return;
                    }
                }
            };
            let mut st = lock(&self.slots[next].state);
            if matches!(*st, State::Queued) {
                *st = State::Building;
                drop(st);
                self.build(next, true);
            }
        }
    }

    /// Group `g` (marked Building by the caller) from the cache (`use_cache`) or compiled, to
    /// Built or Failed; logs the progress.
    fn build(&self, g: usize, use_cache: bool) {
        let group = &groups()[g];
        let t0 = std::time::Instant::now();
        let (name, key) = self.entry(g);
        let cache = self.cache();
        let mut outcome = None;
        if let (true, Some(c)) = (use_cache, cache) {
            match c.load(&name, &key) {
                Ok(Some(image)) => outcome = Some(Ok((image, true))),
                Ok(None) => {}
                Err(e) => {
                    crate::log_warn!("cached GPU kernels unusable ({e}); removed, recompiling");
                    c.evict(&name);
                }
            }
        }
        let outcome = outcome.unwrap_or_else(|| {
            let label = group.label();
            let r = self
                .api
                .compile(
                    &group.source(),
                    &format!("{}.hip", label.replace(' ', "_")),
                    &self.info.arch,
                    &self.options(g),
                )
                .and_then(|image| {
                    if image.is_empty() {
                        return Err("empty kernel image".to_string());
                    }
                    Ok(image)
                });
            if let (Ok(image), Some(c)) = (&r, cache) {
                if let Err(e) = c.store(&name, &key, image) {
                    crate::log_warn!("{e} (kernels are compiled again next time)");
                }
            }
            r.map(|image| (image, false))
        });
        let secs = t0.elapsed().as_secs_f64();
        let state = match outcome {
            Ok((image, cached)) => {
                let how = match cached {
                    true => Built::Cached,
                    false => Built::Compiled(image.len()),
                };
                self.progress(Some((group, secs, how)), 0);
                State::Built { image, cached }
            }
            Err(e) => {
                crate::log_error!(
                    "GPU kernel group {} for {} could not be built: {e}",
                    group.label(),
                    self.info.arch
                );
                self.any_failed.store(true, Ordering::Relaxed);
                self.progress(Some((group, secs, Built::Failed)), 0);
                State::Failed(e)
            }
        };
        let slot = &self.slots[g];
        *lock(&slot.state) = state;
        slot.changed.notify_all();
    }

    /// One line per compiled group, and a summary when every group asked for is done.
    /// `done`: None where only `cancelled` groups were taken back from the queue.
    fn progress(&self, done: Option<(&Group, f64, Built)>, cancelled: usize) {
        let mut w = lock(&self.work);
        w.asked = w.asked.saturating_sub(cancelled);
        if let Some((group, secs, how)) = done {
            w.done += 1;
            match how {
                Built::Cached => {
                    w.cached += 1;
                    crate::log_debug!(
                        "kernel group {} from the cache ({secs:.3} s)",
                        group.label()
                    );
                }
                Built::Compiled(bytes) => {
                    w.compiled += 1;
                    crate::log_info!(
                        "compiled {}/{} kernel groups for {} ({}: {secs:.1} s, {bytes} bytes)",
                        w.done,
                        w.asked,
                        self.info.arch,
                        group.label()
                    );
                }
                Built::Failed => w.failed += 1,
            }
        }
        if w.done == w.asked && w.since.is_some() {
            let wall = w.since.take().map_or(0.0, |t| t.elapsed().as_secs_f64());
            crate::log_info!(
                "GPU kernels for {} ({}): {} groups compiled, {} loaded from cache, {} failed, {wall:.2} s",
                self.info.name,
                self.info.arch,
                w.compiled,
                w.cached,
                w.failed
            );
            (w.asked, w.done, w.compiled, w.cached, w.failed) = (0, 0, 0, 0, 0);
        }
    }

    /// Loads `image` and resolves the group's kernels; a module missing one is unloaded again.
    fn load(&self, g: usize, image: &[u8]) -> Result<HashMap<String, Function>, String> {
        let (api, ord) = (self.api.as_ref(), self.ord);
        let module = api.module_load(ord, image)?;
        let mut funcs = HashMap::new();
        for name in &groups()[g].kernels {
            match api.module_function(ord, module, name) {
                Ok(f) => {
                    funcs.insert(name.clone(), f);
                }
                Err(e) => {
                    api.module_unload(ord, module);
                    return Err(e);
                }
            }
        }
        Ok(funcs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kernel_groups::SOURCES;

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

    #[test]
    fn cache_key_changes_with_every_input() {
        let o = vec!["-DRF_WARP_SIZE=32".to_string()];
        let a = cache_file_name("CUDA", "sm_90", "g", "nvrtc 13.0", &o, "src");
        assert_ne!(
            a,
            cache_file_name("CUDA", "sm_90", "h", "nvrtc 13.0", &o, "src")
        );
        assert_eq!(
            a,
            cache_file_name("CUDA", "sm_90", "g", "nvrtc 13.0", &o, "src")
        );
        assert_ne!(
            a,
            cache_file_name("CUDA", "sm_80", "g", "nvrtc 13.0", &o, "src")
        );
        assert_ne!(
            a,
            cache_file_name("CUDA", "sm_90", "g", "nvrtc 12.4", &o, "src")
        );
        assert_ne!(
            a,
            cache_file_name("CUDA", "sm_90", "g", "nvrtc 13.0", &o, "src2")
        );
        assert_ne!(
            a,
            cache_file_name("CUDA", "sm_90", "g", "nvrtc 13.0", &[], "src")
        );
        assert!(cache_file_name(
            "HIP",
            "gfx90a:sramecc+:xnack-",
            "mul_mat q4_1",
            "hiprtc 6.2",
            &o,
            "s"
        )
        .starts_with("kernels-hip-gfx90a_sramecc__xnack_-mul_mat_q4_1-"));
    }
}
