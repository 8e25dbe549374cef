//! Generates the C header `ggml-rocmforge.h` from the `extern "C"` exports with cbindgen.
//!
//! The header is written to `$OUT_DIR`; the committed copy in `include/` is compared with it
//! by a test (`header_is_current`), and `scripts/update-header` refreshes it.

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

    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let header = out_dir.join("ggml-rocmforge.h");
    match cbindgen::Builder::new()
        // Only the files that hold the C API: the crate's many internal constants stay out.
        .with_src(crate_dir.join("src/ffi/exports.rs"))
        .with_src(crate_dir.join("src/ffi/hybrid_exports.rs"))
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
