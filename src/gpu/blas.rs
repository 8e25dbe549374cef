//! The vendor BLAS for prompt-sized matrix products: cuBLAS on NVIDIA, rocBLAS on AMD (the
//! library under hipBLAS, whose `rocblas_gemm_strided_batched_ex` has kept one C signature and
//! one set of enum values across ROCm releases, where hipBLAS's GemmEx changed its types in
//! ROCm 6/7). Opened at run time like the runtimes themselves: a machine without the library
//! simply keeps using our own kernels (logged once). `ROCMFORGE_GPU_BLAS=0` turns it off.
//!
//! One handle per device, created lazily, shared by the device's streams under a mutex: each
//! call points it at the caller's stream and workspace first, so a product queued inside a
//! stream capture records into that stream's graph and needs no allocation of its own. The
//! caller must have made the device current on this thread (any kernel launch does; the
//! MUL_MAT path launches its conversion kernels right before).

use super::api::{glob_dirs, open_library, sym, ApiResult, DevPtr, Stream};
use once_cell::sync::OnceCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

/// Workspace the library may use per call (NVIDIA's recommendation for Hopper; ample elsewhere).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Element type of a GEMM operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F16,
    F32,
}

/// C[i + j*ldc] = sum_l A[l + i*lda] * B[l + j*ldb] for i < m, j < n, l < k, for `batch`
/// matrices `stride_*` elements apart: A holds one weight row per i (column-major A^T), B one
/// src1 row per j, C is F32 (dst with ldc = nb1 / 4). Accumulation in f32.
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: DevPtr,
    pub a_type: Elem,
    pub lda: usize,
    pub stride_a: usize,
    pub b: DevPtr,
    pub b_type: Elem,
    pub ldb: usize,
    pub stride_b: usize,
    pub c: DevPtr,
    pub ldc: usize,
    pub stride_c: usize,
    pub batch: usize,
}

impl Gemm {
    /// Whether every size fits the libraries' 32-bit integer parameters.
    pub fn fits(&self) -> bool {
        let lim = i32::MAX as usize;
        [
            self.m, self.n, self.k, self.lda, self.ldb, self.ldc, self.batch,
        ]
        .iter()
        .all(|&v| v <= lim && v > 0)
    }
}

type Status = c_int;

#[allow(clippy::type_complexity)]
#[derive(Clone, Copy)]
enum Funcs {
    Cublas {
        create: unsafe extern "C" fn(*mut *mut c_void) -> Status,
        set_stream: unsafe extern "C" fn(*mut c_void, *mut c_void) -> Status,
        set_workspace: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> Status,
        gemm: unsafe extern "C" fn(
            *mut c_void,   // handle
            c_int,         // transa
            c_int,         // transb
            c_int,         // m
            c_int,         // n
            c_int,         // k
            *const c_void, // alpha
            *const c_void, // A
            c_int,         // Atype
            c_int,         // lda
            i64,           // strideA
            *const c_void, // B
            c_int,         // Btype
            c_int,         // ldb
            i64,           // strideB
            *const c_void, // beta
            *mut c_void,   // C
            c_int,         // Ctype
            c_int,         // ldc
            i64,           // strideC
            c_int,         // batchCount
            c_int,         // computeType
            c_int,         // algo
        ) -> Status,
        status_string: Option<unsafe extern "C" fn(Status) -> *const c_char>,
    },
    Rocblas {
        create: unsafe extern "C" fn(*mut *mut c_void) -> Status,
        set_stream: unsafe extern "C" fn(*mut c_void, *mut c_void) -> Status,
        set_workspace: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> Status,
        gemm: unsafe extern "C" fn(
            *mut c_void,   // handle
            c_int,         // trans_a
            c_int,         // trans_b
            c_int,         // m
            c_int,         // n
            c_int,         // k
            *const c_void, // alpha
            *const c_void, // a
            c_int,         // a_type
            c_int,         // lda
            i64,           // stride_a
            *const c_void, // b
            c_int,         // b_type
            c_int,         // ldb
            i64,           // stride_b
            *const c_void, // beta
            *const c_void, // c
            c_int,         // c_type
            c_int,         // ldc
            i64,           // stride_c
            *mut c_void,   // d
            c_int,         // d_type
            c_int,         // ldd
            i64,           // stride_d
            c_int,         // batch_count
            c_int,         // compute_type
            c_int,         // algo
            i32,           // solution_index
            u32,           // flags
        ) -> Status,
        status_string: Option<unsafe extern "C" fn(Status) -> *const c_char>,
    },
}

// cuBLAS enum values (cublas_api.h / library_types.h).
const CUBLAS_OP_N: c_int = 0;
const CUBLAS_OP_T: c_int = 1;
const CUDA_R_32F: c_int = 0;
const CUDA_R_16F: c_int = 2;
const CUBLAS_COMPUTE_32F: c_int = 68;
const CUBLAS_GEMM_DEFAULT: c_int = -1;
// rocBLAS enum values (rocblas-types.h).
const ROCBLAS_OP_N: c_int = 111;
const ROCBLAS_OP_T: c_int = 112;
const ROCBLAS_F16: c_int = 150;
const ROCBLAS_F32: c_int = 151;
const ROCBLAS_GEMM_ALGO_STANDARD: c_int = 0;

pub struct Blas {
    funcs: Funcs,
    /// Handle per device ordinal; 0 = creation failed there (not retried).
    handles: Mutex<Vec<(usize, usize)>>,
    pub name: String,
    _libs: Vec<libloading::Library>,
}

// The handles are used only under the mutex; the libraries are thread-safe otherwise.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

fn enabled() -> bool {
    crate::tuning::get().gpu_blas
}

fn cuda_dirs() -> Vec<String> {
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os("CUDA_PATH").or_else(|| std::env::var_os("CUDA_HOME")) {
        dirs.push(format!("{}/lib64", p.to_string_lossy()));
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.extend(glob_dirs("/usr/local", "cuda", "/lib64"));
    dirs.extend(glob_dirs("/usr/local", "cuda", "/targets/x86_64-linux/lib"));
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    dirs.push("/usr/lib64".into());
    dirs
}

fn rocm_dirs() -> Vec<String> {
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os("ROCM_PATH") {
        dirs.push(format!("{}/lib", p.to_string_lossy()));
    }
    dirs.push("/opt/rocm/lib".into());
    dirs.extend(glob_dirs("/opt", "rocm", "/lib"));
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    dirs.push("/usr/lib64".into());
    dirs
}

fn open_cublas() -> ApiResult<Blas> {
    let dirs = cuda_dirs();
    // cuBLAS needs cuBLASLt of the same release: load it first (from the directory it will
    // be found in), so the dependency resolves even where that directory is not on the
    // loader's path.
    let lt = open_library(
        &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
        &dirs,
    );
    let (lib, path) = open_library(
        &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
        &dirs,
    )
    .ok_or("libcublas.so not found")?;
    let funcs = unsafe {
        Funcs::Cublas {
            create: sym(&lib, "cublasCreate_v2")?,
            set_stream: sym(&lib, "cublasSetStream_v2")?,
            set_workspace: sym(&lib, "cublasSetWorkspace_v2")?,
            gemm: sym(&lib, "cublasGemmStridedBatchedEx")?,
            status_string: sym(&lib, "cublasGetStatusString").ok(),
        }
    };
    let mut libs = vec![lib];
    libs.extend(lt.map(|(l, _)| l));
    Ok(Blas {
        funcs,
        handles: Mutex::new(Vec::new()),
        name: format!("cuBLAS ({path})"),
        _libs: libs,
    })
}

fn open_rocblas() -> ApiResult<Blas> {
    let (lib, path) = open_library(
        &["librocblas.so", "librocblas.so.5", "librocblas.so.4"],
        &rocm_dirs(),
    )
    .ok_or("librocblas.so not found")?;
    let funcs = unsafe {
        Funcs::Rocblas {
            create: sym(&lib, "rocblas_create_handle")?,
            set_stream: sym(&lib, "rocblas_set_stream")?,
            set_workspace: sym(&lib, "rocblas_set_workspace")?,
            gemm: sym(&lib, "rocblas_gemm_strided_batched_ex")?,
            status_string: sym(&lib, "rocblas_status_to_string").ok(),
        }
    };
    Ok(Blas {
        funcs,
        handles: Mutex::new(Vec::new()),
        name: format!("rocBLAS ({path})"),
        _libs: vec![lib],
    })
}

static CUBLAS: OnceCell<Option<Blas>> = OnceCell::new();
static ROCBLAS: OnceCell<Option<Blas>> = OnceCell::new();

/// Opens one vendor's BLAS library.
type OpenBlas = fn() -> ApiResult<Blas>;

/// The BLAS of a runtime ("CUDA" or "HIP"), opened on first use; None where it is missing
/// or turned off (then our own kernels compute every product).
pub fn for_vendor(vendor: &str) -> Option<&'static Blas> {
    let (cell, open): (&OnceCell<Option<Blas>>, OpenBlas) = match vendor {
        "CUDA" => (&CUBLAS, open_cublas),
        "HIP" => (&ROCBLAS, open_rocblas),
        _ => return None,
    };
    cell.get_or_init(|| {
        if !enabled() {
            crate::log_info!("GPU BLAS off (ROCMFORGE_GPU_BLAS=0): prompt matrix products use rocmforge's kernels");
            return None;
        }
        match open() {
            Ok(b) => {
                crate::log_info!("GPU BLAS for prompt matrix products: {}", b.name);
                Some(b)
            }
            Err(e) => {
                crate::log_info!("no GPU BLAS ({e}): prompt matrix products use rocmforge's kernels");
                None
            }
        }
    })
    .as_ref()
}

impl Blas {
    fn err(&self, what: &str, st: Status) -> String {
        let text = match self.funcs {
            Funcs::Cublas { status_string, .. } | Funcs::Rocblas { status_string, .. } => {
                status_string
            }
        }
        .map(|f| unsafe { f(st) })
        .filter(|p| !p.is_null())
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .unwrap_or_default();
        format!("{} {what} failed: status {st} {text}", self.name)
    }

    /// Queues `g` on `stream` of device `ord` (current on this thread), with `workspace`
    /// (WORKSPACE_BYTES of device memory that nothing else uses while the stream runs).
    pub fn gemm(&self, ord: usize, stream: Stream, workspace: DevPtr, g: &Gemm) -> ApiResult<()> {
        if !g.fits() {
            return Err(format!(
                "{}: GEMM sizes exceed 32-bit parameters",
                self.name
            ));
        }
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let h = match handles.iter().find(|(o, _)| *o == ord) {
            Some(&(_, h)) => h,
            None => {
                let mut h: *mut c_void = std::ptr::null_mut();
                let st = match self.funcs {
                    Funcs::Cublas { create, .. } | Funcs::Rocblas { create, .. } => unsafe {
                        create(&mut h)
                    },
                };
                if st != 0 {
                    crate::log_warn!("{}", self.err("handle creation", st));
                    h = std::ptr::null_mut();
                }
                handles.push((ord, h as usize));
                h as usize
            }
        };
        if h == 0 {
            return Err(format!("{}: no handle on device {ord}", self.name));
        }
        let hp = h as *mut c_void;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (m, n, k) = (g.m as c_int, g.n as c_int, g.k as c_int);
        let (lda, ldb, ldc, batch) = (
            g.lda as c_int,
            g.ldb as c_int,
            g.ldc as c_int,
            g.batch as c_int,
        );
        let (sa, sb, sc) = (g.stride_a as i64, g.stride_b as i64, g.stride_c as i64);
        let (a, b, c) = (
            g.a as usize as *const c_void,
            g.b as usize as *const c_void,
            g.c as usize as *mut c_void,
        );
        let (ap, bp) = (
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
        );
        unsafe {
            match self.funcs {
                Funcs::Cublas {
                    set_stream,
                    set_workspace,
                    gemm,
                    ..
                } => {
                    let st = set_stream(hp, stream.0 as *mut c_void);
                    if st != 0 {
                        return Err(self.err("cublasSetStream", st));
                    }
                    let st = set_workspace(hp, workspace as usize as *mut c_void, WORKSPACE_BYTES);
                    if st != 0 {
                        return Err(self.err("cublasSetWorkspace", st));
                    }
                    let ty = |e: Elem| {
                        if e == Elem::F16 {
                            CUDA_R_16F
                        } else {
                            CUDA_R_32F
                        }
                    };
                    let st = gemm(
                        hp,
                        CUBLAS_OP_T,
                        CUBLAS_OP_N,
                        m,
                        n,
                        k,
                        ap,
                        a,
                        ty(g.a_type),
                        lda,
                        sa,
                        b,
                        ty(g.b_type),
                        ldb,
                        sb,
                        bp,
                        c,
                        CUDA_R_32F,
                        ldc,
                        sc,
                        batch,
                        CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT,
                    );
                    if st != 0 {
                        return Err(self.err("cublasGemmStridedBatchedEx", st));
                    }
                }
                Funcs::Rocblas {
                    set_stream,
                    set_workspace,
                    gemm,
                    ..
                } => {
                    let st = set_stream(hp, stream.0 as *mut c_void);
                    if st != 0 {
                        return Err(self.err("rocblas_set_stream", st));
                    }
                    let st = set_workspace(hp, workspace as usize as *mut c_void, WORKSPACE_BYTES);
                    if st != 0 {
                        return Err(self.err("rocblas_set_workspace", st));
                    }
                    let ty = |e: Elem| {
                        if e == Elem::F16 {
                            ROCBLAS_F16
                        } else {
                            ROCBLAS_F32
                        }
                    };
                    let st = gemm(
                        hp,
                        ROCBLAS_OP_T,
                        ROCBLAS_OP_N,
                        m,
                        n,
                        k,
                        ap,
                        a,
                        ty(g.a_type),
                        lda,
                        sa,
                        b,
                        ty(g.b_type),
                        ldb,
                        sb,
                        bp,
                        c,
                        ROCBLAS_F32,
                        ldc,
                        sc,
                        c,
                        ROCBLAS_F32,
                        ldc,
                        sc,
                        batch,
                        ROCBLAS_F32,
                        ROCBLAS_GEMM_ALGO_STANDARD,
                        0,
                        0,
                    );
                    if st != 0 {
                        return Err(self.err("rocblas_gemm_strided_batched_ex", st));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_sizes_must_fit_32_bits_and_be_positive() {
        let g = Gemm {
            m: 576,
            n: 512,
            k: 576,
            a: 0,
            a_type: Elem::F16,
            lda: 576,
            stride_a: 0,
            b: 0,
            b_type: Elem::F16,
            ldb: 576,
            stride_b: 0,
            c: 0,
            ldc: 576,
            stride_c: 0,
            batch: 1,
        };
        assert!(g.fits());
        assert!(!Gemm { n: 0, ..g }.fits());
        assert!(!Gemm { k: 1 << 31, ..g }.fits());
    }

    #[test]
    fn missing_vendor_is_none() {
        assert!(for_vendor("nope").is_none());
    }
}
