//! Generates the C header `ggml-rocmforge.h` from the `extern "C"` exports with cbindgen, and
//! the i-quants' lookup grids from the pinned ggml sources.
//!
//! The header is written to `$OUT_DIR`; the committed copy in `include/` is compared with it
//! by a test (`header_is_current`), and `scripts/update-header` refreshes it.
//!
//! The grids (`$OUT_DIR/iquant_grids.rs`, included by `src/cpu/quants/grids.rs`) are read at
//! build time from `ggml-common.h` of the llama.cpp tree that `ggml-pin/` pins (found through
//! `cargo metadata`, as CMake finds it; `ROCMFORGE_GGML_SOURCE_DIR` overrides): they are the
//! format's definition, not derivable, and the repository carries no copy of them.

use std::env;
use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());

    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    // Programs linked with the library record this name (its major version): the install puts
    // libggml-rocmforge.so.<major> beside the file, ggml's loader opens libggml-rocmforge.so.
    let major = env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libggml-rocmforge.so.{major}");

    iquant_grids(&crate_dir, &out_dir);

    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let header = out_dir.join("ggml-rocmforge.h");
    match cbindgen::Builder::new()
        // Only the files that hold the C API: the crate's many internal constants stay out.
        .with_src(crate_dir.join("src/ffi/exports.rs"))
        .with_src(crate_dir.join("src/ffi/hybrid_exports.rs"))
        .with_src(crate_dir.join("src/ffi/comm.rs"))
        .with_src(crate_dir.join("src/ffi/version.rs"))
        .with_config(config)
        .with_after_include(string_constants(&crate_dir.join("src/ffi/version.rs")))
        .generate()
    {
        Ok(bindings) => {
            bindings.write_to_file(&header);
        }
        Err(e) => panic!("cbindgen failed: {e}"),
    }
}

/// `#define`s for the `pub const NAME: &str = "value";` items of `file`, with their doc
/// comments: cbindgen writes numeric constants but skips string ones.
fn string_constants(file: &std::path::Path) -> String {
    let text = std::fs::read_to_string(file).expect("src/ffi/version.rs");
    let mut out = String::new();
    let mut doc = String::new();
    for line in text.lines().map(str::trim) {
        if let Some(d) = line.strip_prefix("///") {
            doc.push_str(&format!("//{d}\n"));
            continue;
        }
        let item = line
            .strip_prefix("pub const ")
            .and_then(|l| l.split_once(": &str = "));
        if let Some((name, value)) = item {
            let value = value.trim_end_matches(';');
            out.push_str(&format!("\n{doc}#define {name} {value}\n"));
        }
        doc.clear();
    }
    out.trim_end().to_string()
}

/// The llama.cpp source tree of the crate `ggml-pin/` pins: `ROCMFORGE_GGML_SOURCE_DIR`, else
/// the directory of `llama-cpp-sys-2`'s manifest in `cargo metadata` (which downloads the crate
/// where it is missing) plus `llama.cpp`.
fn ggml_source_dir(crate_dir: &std::path::Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=ROCMFORGE_GGML_SOURCE_DIR");
    if let Some(dir) = env::var_os("ROCMFORGE_GGML_SOURCE_DIR") {
        return PathBuf::from(dir);
    }
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let pin = crate_dir.join("ggml-pin/Cargo.toml");
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(&pin)
        .output()
        .expect("running cargo metadata on ggml-pin/");
    assert!(
        out.status.success(),
        "cargo metadata --manifest-path {} failed:\n{}",
        pin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = String::from_utf8(out.stdout).expect("cargo metadata: UTF-8");
    let key = "\"manifest_path\":\"";
    meta.split(key)
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .find(|path| path.contains("/llama-cpp-sys-2-"))
        .map(|manifest| PathBuf::from(manifest).with_file_name("llama.cpp"))
        .expect("llama-cpp-sys-2 not in cargo metadata of ggml-pin/")
}

/// Writes `iquant_grids.rs`: each table of ggml-common.h the i-quants decode with, as a Rust
/// static of its element type, plus ggml's sign table for the test of the derived one.
fn iquant_grids(crate_dir: &std::path::Path, out_dir: &std::path::Path) {
    let header = ggml_source_dir(crate_dir).join("ggml/src/ggml-common.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(&header)
        .unwrap_or_else(|e| panic!("reading {}: {e}", header.display()));
    let mut out = String::from("// Generated by build.rs from ggml-common.h of the pinned ggml.\n");
    for (name, rust, ty, len) in [
        ("iq2xxs_grid", "IQ2XXS_GRID", "u64", 256),
        ("iq2xs_grid", "IQ2XS_GRID", "u64", 512),
        ("iq2s_grid", "IQ2S_GRID", "u64", 1024),
        ("iq3xxs_grid", "IQ3XXS_GRID", "u32", 256),
        ("iq3s_grid", "IQ3S_GRID", "u32", 512),
        ("iq1s_grid", "IQ1S_GRID", "u64", 2048),
        ("ksigns_iq2xs", "GGML_KSIGNS_IQ2XS", "u8", 128),
    ] {
        let values = ggml_table(&text, name);
        assert_eq!(values.len(), len, "{name}: {} values", values.len());
        out.push_str(&format!(
            "#[allow(dead_code)]\npub static {rust}: [{ty}; {len}] = [{}];\n",
            values.join(", ")
        ));
    }
    std::fs::write(out_dir.join("iquant_grids.rs"), out).expect("writing iquant_grids.rs");
    std::fs::write(out_dir.join("iquant_grids.h"), gpu_grids(&text))
        .expect("writing iquant_grids.h");
}

/// `iquant_grids.h`: the same grids as device tables for the GPU kernels (src/gpu/kernel_groups.rs
/// puts it after quants.h in every program). Each table is compiled only into the kernel groups
/// of the types that read it (`RF_T_<type>`, kernels/prelude.h). Global `__device__` memory,
/// not `__constant__`: the lanes of a warp look up different entries, which the constant cache
/// serves one address at a time.
fn gpu_grids(text: &str) -> String {
    let mut out = String::from(
        "// Generated by build.rs from ggml-common.h of the pinned ggml: the i-quants' grids.\n",
    );
    for (name, ty, types) in [
        ("iq2xxs_grid", "unsigned long long", &["iq2_xxs"][..]),
        ("iq2xs_grid", "unsigned long long", &["iq2_xs"]),
        ("iq2s_grid", "unsigned long long", &["iq2_s"]),
        ("iq3xxs_grid", "unsigned int", &["iq3_xxs"]),
        ("iq3s_grid", "unsigned int", &["iq3_s"]),
        ("iq1s_grid", "unsigned long long", &["iq1_s", "iq1_m"]),
    ] {
        let values = ggml_table(text, name);
        let gate: Vec<String> = types.iter().map(|t| format!("RF_T_{t}")).collect();
        out.push_str(&format!(
            "#if RF_ALL || {}\n__device__ const {ty} rf_{name}[{}] = {{{}}};\n#endif\n",
            gate.join(" || "),
            values.len(),
            values.join(", ")
        ));
    }
    out
}

/// The values of `GGML_TABLE_BEGIN(type, name, size) ... GGML_TABLE_END()` in `text`.
fn ggml_table(text: &str, name: &str) -> Vec<String> {
    let begin = text
        .lines()
        .position(|l| {
            l.trim_start().starts_with("GGML_TABLE_BEGIN(")
                && l.split(',').nth(1).map(str::trim) == Some(name)
        })
        .unwrap_or_else(|| panic!("ggml-common.h has no table {name}"));
    let mut values = vec![];
    for line in text.lines().skip(begin + 1) {
        if line.trim_start().starts_with("GGML_TABLE_END") {
            return values;
        }
        for v in line.split(',').map(str::trim).filter(|v| !v.is_empty()) {
            let ok = v.strip_prefix("0x").map_or_else(
                || v.chars().all(|c| c.is_ascii_digit()),
                |h| h.chars().all(|c| c.is_ascii_hexdigit()),
            );
            assert!(ok, "{name}: unexpected token {v:?}");
            values.push(v.to_string());
        }
    }
    panic!("{name}: no GGML_TABLE_END");
}
