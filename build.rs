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
    // ggml's loader and CMake hosts see the library under this name.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libggml-rocmforge.so");

    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let header = out_dir.join("ggml-rocmforge.h");
    match cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
    {
        Ok(bindings) => {
            bindings.write_to_file(&header);
        }
        Err(e) => panic!("cbindgen failed: {e}"),
    }
}
