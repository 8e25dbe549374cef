//! rocmforge: a ggml backend in Rust, loaded by ggml hosts (llama.cpp, whisper.cpp, ...)
//! through ggml's backend interface.
//!
//! - `ffi/`: the ggml ABI mirror and the exported C functions (a thin, guarded layer);
//! - `device`: the small trait model every device implements;
//! - `cpu/`: the RFCPU device (Rust kernels, run-time SIMD choice, thread pool);
//! - `gpu/`: the RFGPU devices (HIP C++ kernels compiled at run time, AMD HIP or NVIDIA CUDA
//!   runtimes opened with libloading).

pub mod cpu;
pub mod device;
pub mod ffi;
pub mod ggml_types;
pub mod gpu;
pub mod hybrid;
pub mod op_shapes;
pub mod tensor;
pub mod tuning;

#[cfg(test)]
mod header_test {
    /// The committed header must be what the build generates (scripts/update-header).
    #[test]
    fn header_is_current() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/ggml-rocmforge.h"));
        let committed = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/include/ggml-rocmforge.h"
        ))
        .unwrap_or_default();
        assert!(
            generated == committed,
            "include/ggml-rocmforge.h is stale: run scripts/update-header and commit the result"
        );
    }
}
