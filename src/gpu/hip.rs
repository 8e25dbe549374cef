//! AMD: the HIP runtime (`libamdhip64.so`) and hiprtc (`libhiprtc.so`, part of libamdhip64
//! before ROCm 5.3), both opened at run time from the usual ROCm locations.

use super::api::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

type HipError = c_int;
type HipStream = *mut c_void;
type HipModule = *mut c_void;
type HipFunction = *mut c_void;
type HipGraph = *mut c_void;
type HipGraphExec = *mut c_void;
type HipEvent = *mut c_void;

/// Thread-local capture: only the capturing thread is barred from calls that would break the
/// capture; other threads (other backends of the device) keep using the runtime meanwhile.
const HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// hipStreamNonBlocking: streams that never synchronize with the null stream.
const HIP_STREAM_NON_BLOCKING: c_uint = 0x1;

const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

const HIP_HOST_MALLOC_PORTABLE: c_uint = 0x1;
const HIP_HOST_MALLOC_MAPPED: c_uint = 0x2;
const HIP_HOST_REGISTER_PORTABLE: c_uint = 0x1;
const HIP_HOST_REGISTER_MAPPED: c_uint = 0x2;
/// hipHostRegisterReadOnly in recent ROCm (where AMD ignores it); the same bit is
/// hipExtHostRegisterCoarseGrained in older headers, which is also fine for memory the
/// device only reads.
const HIP_HOST_REGISTER_READ_ONLY: c_uint = 0x8;
const HIP_EVENT_DISABLE_TIMING: c_uint = 0x2;

#[derive(Clone, Copy)]
struct Runtime {
    init: unsafe extern "C" fn(c_uint) -> HipError,
    get_error_string: unsafe extern "C" fn(HipError) -> *const c_char,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    set_device: unsafe extern "C" fn(c_int) -> HipError,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> HipError,
    get_device_properties: unsafe extern "C" fn(*mut u8, c_int) -> HipError,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> HipError,
    malloc: unsafe extern "C" fn(*mut u64, usize) -> HipError,
    free: unsafe extern "C" fn(u64) -> HipError,
    memset_async: unsafe extern "C" fn(u64, c_int, usize, HipStream) -> HipError,
    stream_create_with_flags: unsafe extern "C" fn(*mut HipStream, c_uint) -> HipError,
    stream_synchronize: unsafe extern "C" fn(HipStream) -> HipError,
    stream_destroy: unsafe extern "C" fn(HipStream) -> HipError,
    module_load_data: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipError,
    module_unload: unsafe extern "C" fn(HipModule) -> HipError,
    module_get_function:
        unsafe extern "C" fn(*mut HipFunction, HipModule, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    module_launch_kernel: unsafe extern "C" fn(
        HipFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        HipStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    /// None where this ROCm has no graph API (then graphs are simply not used).
    graphs: Option<Graphs>,
    /// Counts a graph's nodes (None: an old runtime; then executables are always replaced).
    graph_get_nodes:
        Option<unsafe extern "C" fn(HipGraph, *mut *mut c_void, *mut usize) -> HipError>,
    io: Io,
}

/// Pinned and registered host memory, asynchronous copies, events.
#[derive(Clone, Copy)]
struct Io {
    host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError,
    host_free: unsafe extern "C" fn(*mut c_void) -> HipError,
    host_register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> HipError,
    host_unregister: unsafe extern "C" fn(*mut c_void) -> HipError,
    host_get_device_pointer:
        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> HipError,
    device_synchronize: unsafe extern "C" fn() -> HipError,
    /// (dst, src, bytes, hipMemcpyKind, stream)
    memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipError,
    /// (dst, dst device, src, src device, bytes, stream)
    memcpy_peer_async: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *const c_void,
        c_int,
        usize,
        HipStream,
    ) -> HipError,
    event_create_with_flags: unsafe extern "C" fn(*mut HipEvent, c_uint) -> HipError,
    event_record: unsafe extern "C" fn(HipEvent, HipStream) -> HipError,
    event_synchronize: unsafe extern "C" fn(HipEvent) -> HipError,
    event_destroy: unsafe extern "C" fn(HipEvent) -> HipError,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, HipEvent, HipEvent) -> HipError,
    stream_wait_event: unsafe extern "C" fn(HipStream, HipEvent, c_uint) -> HipError,
}

#[derive(Clone, Copy)]
struct Graphs {
    stream_begin_capture: unsafe extern "C" fn(HipStream, c_int) -> HipError,
    stream_end_capture: unsafe extern "C" fn(HipStream, *mut HipGraph) -> HipError,
    graph_instantiate: unsafe extern "C" fn(
        *mut HipGraphExec,
        HipGraph,
        *mut *mut c_void,
        *mut c_char,
        usize,
    ) -> HipError,
    graph_exec_update:
        unsafe extern "C" fn(HipGraphExec, HipGraph, *mut *mut c_void, *mut c_int) -> HipError,
    graph_launch: unsafe extern "C" fn(HipGraphExec, HipStream) -> HipError,
    graph_destroy: unsafe extern "C" fn(HipGraph) -> HipError,
    graph_exec_destroy: unsafe extern "C" fn(HipGraphExec) -> HipError,
}

type HiprtcProgram = *mut c_void;

#[derive(Clone, Copy)]
struct Hiprtc {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    create_program: unsafe extern "C" fn(
        *mut HiprtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile_program: unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> c_int,
    get_program_log_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> c_int,
    get_program_log: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> c_int,
    get_code_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> c_int,
    get_code: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> c_int,
    destroy_program: unsafe extern "C" fn(*mut HiprtcProgram) -> c_int,
}

pub struct HipApi {
    rt: Runtime,
    rtc: Hiprtc,
    count: usize,
    /// peer[i][j]: kernels on device i read and write device j's memory (`enable_peer_access`).
    peer: Vec<Vec<bool>>,
    _libs: (libloading::Library, Option<libloading::Library>),
}

unsafe impl Send for HipApi {}
unsafe impl Sync for HipApi {}

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

/// Wavefront size the compiler uses by default for a target: 64 on GCN/CDNA (gfx9xx and
/// older), 32 on RDNA (gfx10xx and newer).
pub fn warp_size_of_arch(arch: &str) -> u32 {
    let digits: String = arch
        .trim_start_matches("gfx")
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    if digits.len() >= 4
        && (digits.starts_with("10") || digits.starts_with("11") || digits.starts_with("12"))
    {
        32
    } else {
        64
    }
}

/// The target id ("gfx90a:sramecc+:xnack-") inside a hipDeviceProp_t. The struct's layout
/// differs between ROCm releases, so we look for the one field that starts with "gfx"
/// rather than trusting an offset.
pub fn find_gcn_arch_name(props: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 3 < props.len() {
        if &props[i..i + 3] == b"gfx" && (i == 0 || props[i - 1] == 0) {
            let end = props[i..].iter().position(|&b| b == 0).map(|p| i + p)?;
            let s = std::str::from_utf8(&props[i..end]).ok()?;
            if s.len() > 3
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == ':' || c == '+' || c == '-')
            {
                return Some(s.to_string());
            }
        }
        i += 1;
    }
    None
}

/// hiprtc is its own library since ROCm 5.3; before, libamdhip64 (`hip`) exports it.
fn load_hiprtc(
    hip: &libloading::Library,
    dirs: &[String],
) -> ApiResult<(Hiprtc, Option<libloading::Library>)> {
    let rtc_lib =
        open_library(&["libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5"], dirs).map(|(l, _)| l);
    let l = rtc_lib.as_ref().unwrap_or(hip);
    let rtc = unsafe {
        Hiprtc {
            version: sym(l, "hiprtcVersion")?,
            get_error_string: sym(l, "hiprtcGetErrorString")?,
            create_program: sym(l, "hiprtcCreateProgram")?,
            compile_program: sym(l, "hiprtcCompileProgram")?,
            get_program_log_size: sym(l, "hiprtcGetProgramLogSize")?,
            get_program_log: sym(l, "hiprtcGetProgramLog")?,
            get_code_size: sym(l, "hiprtcGetCodeSize")?,
            get_code: sym(l, "hiprtcGetCode")?,
            destroy_program: sym(l, "hiprtcDestroyProgram")?,
        }
    };
    Ok((rtc, rtc_lib))
}

impl HipApi {
    pub fn open() -> ApiResult<HipApi> {
        let dirs = rocm_dirs();
        let (lib, path) = open_library(
            &["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"],
            &dirs,
        )
        .ok_or("libamdhip64.so not found")?;
        crate::log_debug!("HIP: runtime from {path}");
        let rt = unsafe {
            Runtime {
                init: sym(&lib, "hipInit")?,
                get_error_string: sym(&lib, "hipGetErrorString")?,
                get_device_count: sym(&lib, "hipGetDeviceCount")?,
                set_device: sym(&lib, "hipSetDevice")?,
                device_get_name: sym(&lib, "hipDeviceGetName")?,
                device_total_mem: sym(&lib, "hipDeviceTotalMem")?,
                get_device_properties: sym(&lib, "hipGetDevicePropertiesR0600")
                    .or_else(|_| sym(&lib, "hipGetDeviceProperties"))?,
                mem_get_info: sym(&lib, "hipMemGetInfo")?,
                malloc: sym(&lib, "hipMalloc")?,
                free: sym(&lib, "hipFree")?,
                memset_async: sym(&lib, "hipMemsetAsync")?,
                stream_create_with_flags: sym(&lib, "hipStreamCreateWithFlags")?,
                stream_synchronize: sym(&lib, "hipStreamSynchronize")?,
                stream_destroy: sym(&lib, "hipStreamDestroy")?,
                module_load_data: sym(&lib, "hipModuleLoadData")?,
                module_unload: sym(&lib, "hipModuleUnload")?,
                module_get_function: sym(&lib, "hipModuleGetFunction")?,
                module_launch_kernel: sym(&lib, "hipModuleLaunchKernel")?,
                graph_get_nodes: sym(&lib, "hipGraphGetNodes").ok(),
                graphs: (|| {
                    Ok::<_, String>(Graphs {
                        stream_begin_capture: sym(&lib, "hipStreamBeginCapture")?,
                        stream_end_capture: sym(&lib, "hipStreamEndCapture")?,
                        graph_instantiate: sym(&lib, "hipGraphInstantiate")?,
                        graph_exec_update: sym(&lib, "hipGraphExecUpdate")?,
                        graph_launch: sym(&lib, "hipGraphLaunch")?,
                        graph_destroy: sym(&lib, "hipGraphDestroy")?,
                        graph_exec_destroy: sym(&lib, "hipGraphExecDestroy")?,
                    })
                })()
                .ok(),
                io: Io {
                    // hipHostMalloc is deprecated in recent ROCm in favour of hipHostAlloc (same arguments).
                    host_malloc: sym(&lib, "hipHostMalloc")
                        .or_else(|_| sym(&lib, "hipHostAlloc"))?,
                    host_free: sym(&lib, "hipHostFree")?,
                    host_register: sym(&lib, "hipHostRegister")?,
                    host_unregister: sym(&lib, "hipHostUnregister")?,
                    host_get_device_pointer: sym(&lib, "hipHostGetDevicePointer")?,
                    device_synchronize: sym(&lib, "hipDeviceSynchronize")?,
                    memcpy_async: sym(&lib, "hipMemcpyAsync")?,
                    memcpy_peer_async: sym(&lib, "hipMemcpyPeerAsync")?,
                    event_create_with_flags: sym(&lib, "hipEventCreateWithFlags")?,
                    event_record: sym(&lib, "hipEventRecord")?,
                    event_synchronize: sym(&lib, "hipEventSynchronize")?,
                    event_destroy: sym(&lib, "hipEventDestroy")?,
                    event_elapsed_time: sym(&lib, "hipEventElapsedTime")?,
                    stream_wait_event: sym(&lib, "hipStreamWaitEvent")?,
                },
            }
        };
        let r = unsafe { (rt.init)(0) };
        hip_check(&rt, r, "hipInit")?;
        let mut n: c_int = 0;
        hip_check(
            &rt,
            unsafe { (rt.get_device_count)(&mut n) },
            "hipGetDeviceCount",
        )?;
        if n <= 0 {
            return Err("the HIP runtime reports no device".into());
        }
        let (rtc, rtc_lib) = load_hiprtc(&lib, &dirs)?;
        let peer = enable_peer_access(&lib, &rt, n as usize);
        Ok(HipApi {
            rt,
            rtc,
            count: n as usize,
            peer,
            _libs: (lib, rtc_lib),
        })
    }

    fn graphs(&self) -> ApiResult<Graphs> {
        self.rt
            .graphs
            .ok_or_else(|| "this HIP runtime has no graph API".to_string())
    }

    fn check(&self, r: HipError, what: &str) -> ApiResult<()> {
        hip_check(&self.rt, r, what)
    }

    fn current(&self, ord: usize) -> ApiResult<()> {
        if ord >= self.count {
            return Err("no such HIP device".into());
        }
        self.check(
            unsafe { (self.rt.set_device)(ord as c_int) },
            "hipSetDevice",
        )
    }
}

/// Lets every GPU read and write every other's memory directly where the hardware allows
/// (xGMI or PCIe peer to peer): peer copies (layer and row split) then go device to device
/// instead of through host memory, and kernels may use another GPU's memory. Best effort:
/// refused pairs keep the runtime's staged copy, logged; ROCMFORGE_GPU_PEER=0 turns it off.
/// Returns which pairs are on (`HipApi::peer`). Leaves device `n - 1` current, as any call
/// here sets its own.
fn enable_peer_access(lib: &libloading::Library, rt: &Runtime, n: usize) -> Vec<Vec<bool>> {
    let mut on = vec![vec![false; n]; n];
    type CanAccess = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError;
    type Enable = unsafe extern "C" fn(c_int, c_uint) -> HipError;
    if n < 2 || !crate::tuning::get().gpu_peer {
        return on;
    }
    // SAFETY: the runtime's own signatures of these two functions.
    let (Ok(can), Ok(enable)) = (
        unsafe { sym::<CanAccess>(lib, "hipDeviceCanAccessPeer") },
        unsafe { sym::<Enable>(lib, "hipDeviceEnablePeerAccess") },
    ) else {
        return on;
    };
    /// hipErrorPeerAccessAlreadyEnabled.
    const ALREADY_ENABLED: HipError = 704;
    for (i, row) in on.iter_mut().enumerate() {
        for (j, cell) in row.iter_mut().enumerate() {
            if i == j {
                continue;
            }
            let mut ok: c_int = 0;
            let r = unsafe { can(&mut ok, i as c_int, j as c_int) };
            if r != 0 || ok == 0 {
                crate::log_info!("HIP: device {i} cannot reach device {j} directly; copies between them go through the host");
                continue;
            }
            // Enabling acts for the current device: `i` reaches `j`.
            let r = unsafe {
                match (rt.set_device)(i as c_int) {
                    0 => enable(j as c_int, 0),
                    e => e,
                }
            };
            if r != 0 && r != ALREADY_ENABLED {
                crate::log_info!(
                    "HIP: peer access {i} -> {j} refused ({}); copies go through the host",
                    hip_check(rt, r, "hipDeviceEnablePeerAccess")
                        .err()
                        .unwrap_or_default()
                );
            } else {
                crate::log_debug!("HIP: peer access {i} -> {j} on");
                *cell = true;
            }
        }
    }
    on
}

fn hiprtc_compile(
    rtc: &Hiprtc,
    source: &str,
    name: &str,
    arch: &str,
    options: &[String],
) -> ApiResult<Vec<u8>> {
    let src = CString::new(source).map_err(|_| "kernel source contains NUL")?;
    let cname = CString::new(name).map_err(|_| "bad program name")?;
    let mut opts: Vec<CString> = vec![CString::new(format!("--offload-arch={arch}")).unwrap()];
    opts.extend(options.iter().filter_map(|o| CString::new(o.as_str()).ok()));
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: HiprtcProgram = std::ptr::null_mut();
    let r = unsafe {
        (rtc.create_program)(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(rtc_err(rtc, r, "hiprtcCreateProgram"));
    }
    let r = unsafe { (rtc.compile_program)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let mut log_size = 0usize;
    unsafe { (rtc.get_program_log_size)(prog, &mut log_size) };
    let mut log = vec![0u8; log_size.max(1)];
    unsafe { (rtc.get_program_log)(prog, log.as_mut_ptr() as *mut c_char) };
    let log = String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .trim()
        .to_string();
    let out = if r != 0 {
        Err(format!(
            "{}\n{log}",
            rtc_err(rtc, r, "hiprtcCompileProgram")
        ))
    } else {
        let mut size = 0usize;
        let r = unsafe { (rtc.get_code_size)(prog, &mut size) };
        if r != 0 || size == 0 {
            Err(rtc_err(rtc, r, "hiprtcGetCodeSize"))
        } else {
            let mut bin = vec![0u8; size];
            let r = unsafe { (rtc.get_code)(prog, bin.as_mut_ptr() as *mut c_char) };
            if r != 0 {
                Err(rtc_err(rtc, r, "hiprtcGetCode"))
            } else {
                Ok(bin)
            }
        }
    };
    unsafe { (rtc.destroy_program)(&mut prog) };
    out
}

fn rtc_err(rtc: &Hiprtc, r: c_int, what: &str) -> String {
    let s = unsafe { (rtc.get_error_string)(r) };
    let msg = if s.is_null() {
        "?".into()
    } else {
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    format!("{what}: {msg} ({r})")
}

fn hip_check(rt: &Runtime, r: HipError, what: &str) -> ApiResult<()> {
    if r == 0 {
        return Ok(());
    }
    let s = unsafe { (rt.get_error_string)(r) };
    let msg = if s.is_null() {
        "unknown error".into()
    } else {
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    Err(format!("{what}: {msg} ({r})"))
}

impl GpuApi for HipApi {
    fn vendor(&self) -> &'static str {
        "HIP"
    }

    fn device_count(&self) -> usize {
        self.count
    }

    fn device_info(&self, ord: usize) -> ApiResult<DeviceInfo> {
        self.current(ord)?;
        let mut name = [0 as c_char; 256];
        self.check(
            unsafe { (self.rt.device_get_name)(name.as_mut_ptr(), 255, ord as c_int) },
            "hipDeviceGetName",
        )?;
        let mut total = 0usize;
        self.check(
            unsafe { (self.rt.device_total_mem)(&mut total, ord as c_int) },
            "hipDeviceTotalMem",
        )?;
        // Generously sized: hipDeviceProp_t is about 1.5 KiB and grows between releases.
        let mut props = vec![0u8; 16 * 1024];
        self.check(
            unsafe { (self.rt.get_device_properties)(props.as_mut_ptr(), ord as c_int) },
            "hipGetDeviceProperties",
        )?;
        let arch = find_gcn_arch_name(&props).ok_or("no gfx target name in hipDeviceProp_t")?;
        Ok(DeviceInfo {
            name: unsafe { CStr::from_ptr(name.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
            total_mem: total,
            warp_size: warp_size_of_arch(&arch),
            arch,
            compute_units: 0,
        })
    }

    fn mem_info(&self, ord: usize) -> ApiResult<(usize, usize)> {
        self.current(ord)?;
        let (mut free, mut total) = (0usize, 0usize);
        self.check(
            unsafe { (self.rt.mem_get_info)(&mut free, &mut total) },
            "hipMemGetInfo",
        )?;
        Ok((free, total))
    }

    fn alloc(&self, ord: usize, size: usize) -> ApiResult<DevPtr> {
        self.current(ord)?;
        let mut p = 0u64;
        self.check(
            unsafe { (self.rt.malloc)(&mut p, size.max(1)) },
            "hipMalloc",
        )?;
        Ok(p)
    }

    fn free(&self, ord: usize, ptr: DevPtr) {
        if self.current(ord).is_ok() {
            if let Err(e) = self.check(unsafe { (self.rt.free)(ptr) }, "hipFree") {
                crate::log_warn!("{e}");
            }
        }
    }

    fn memset_async(
        &self,
        ord: usize,
        dst: DevPtr,
        value: u8,
        size: usize,
        s: Stream,
    ) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.rt.memset_async)(dst, value as c_int, size, s.0 as HipStream) },
            "hipMemsetAsync",
        )
    }

    fn stream_create(&self, ord: usize) -> ApiResult<Stream> {
        self.current(ord)?;
        let mut s: HipStream = std::ptr::null_mut();
        self.check(
            // Non-blocking: nothing on the null stream waits for it (see cuda.rs `stream_create`).
            unsafe { (self.rt.stream_create_with_flags)(&mut s, HIP_STREAM_NON_BLOCKING) },
            "hipStreamCreateWithFlags",
        )?;
        Ok(Stream(s as usize))
    }

    fn stream_sync(&self, ord: usize, s: Stream) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.rt.stream_synchronize)(s.0 as HipStream) },
            "hipStreamSynchronize",
        )
    }

    fn stream_destroy(&self, ord: usize, s: Stream) {
        if self.current(ord).is_ok() {
            unsafe { (self.rt.stream_destroy)(s.0 as HipStream) };
        }
    }

    fn compiler_version(&self) -> String {
        let (mut major, mut minor) = (0, 0);
        unsafe { (self.rtc.version)(&mut major, &mut minor) };
        format!("hiprtc {major}.{minor}")
    }

    fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        options: &[String],
    ) -> ApiResult<Vec<u8>> {
        hiprtc_compile(&self.rtc, source, name, arch, options)
    }

    fn module_load(&self, ord: usize, image: &[u8]) -> ApiResult<Module> {
        self.current(ord)?;
        let mut m: HipModule = std::ptr::null_mut();
        self.check(
            unsafe { (self.rt.module_load_data)(&mut m, image.as_ptr() as *const c_void) },
            "hipModuleLoadData",
        )?;
        Ok(Module(m as usize))
    }

    fn module_function(&self, ord: usize, m: Module, name: &str) -> ApiResult<Function> {
        self.current(ord)?;
        let cname = CString::new(name).map_err(|_| "bad kernel name")?;
        let mut f: HipFunction = std::ptr::null_mut();
        self.check(
            unsafe { (self.rt.module_get_function)(&mut f, m.0 as HipModule, cname.as_ptr()) },
            &format!("hipModuleGetFunction({name})"),
        )?;
        Ok(Function(f as usize))
    }

    fn module_unload(&self, ord: usize, m: Module) {
        if self.current(ord).is_ok() {
            unsafe { (self.rt.module_unload)(m.0 as HipModule) };
        }
    }

    fn launch(
        &self,
        ord: usize,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        s: Stream,
        args: &mut [*mut c_void],
    ) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe {
                (self.rt.module_launch_kernel)(
                    f.0 as HipFunction,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    shared_mem,
                    s.0 as HipStream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "hipModuleLaunchKernel",
        )
    }

    fn capture_begin(&self, ord: usize, s: Stream) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe {
                (self.graphs()?.stream_begin_capture)(
                    s.0 as HipStream,
                    HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "hipStreamBeginCapture",
        )
    }

    fn capture_end(&self, ord: usize, s: Stream) -> ApiResult<Graph> {
        self.current(ord)?;
        let mut g: HipGraph = std::ptr::null_mut();
        self.check(
            unsafe { (self.graphs()?.stream_end_capture)(s.0 as HipStream, &mut g) },
            "hipStreamEndCapture",
        )?;
        Ok(Graph(g as usize))
    }

    fn graph_instantiate(&self, ord: usize, g: Graph) -> ApiResult<GraphExec> {
        self.current(ord)?;
        let mut e: HipGraphExec = std::ptr::null_mut();
        let r = unsafe {
            (self.graphs()?.graph_instantiate)(
                &mut e,
                g.0 as HipGraph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        self.check(r, "hipGraphInstantiate")?;
        Ok(GraphExec(e as usize))
    }

    fn graph_node_count(&self, ord: usize, g: Graph) -> Option<usize> {
        let f = self.rt.graph_get_nodes?;
        let mut n = 0usize;
        self.current(ord).ok()?;
        (unsafe { f(g.0 as HipGraph, std::ptr::null_mut(), &mut n) } == 0).then_some(n)
    }

    fn graph_exec_update(&self, ord: usize, e: GraphExec, g: Graph) -> bool {
        let (mut node, mut result): (*mut c_void, c_int) = (std::ptr::null_mut(), 0);
        let Some(gr) = self.rt.graphs else {
            return false;
        };
        self.current(ord).is_ok()
            && unsafe {
                (gr.graph_exec_update)(e.0 as HipGraphExec, g.0 as HipGraph, &mut node, &mut result)
            } == 0
    }

    fn graph_launch(&self, ord: usize, e: GraphExec, s: Stream) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.graphs()?.graph_launch)(e.0 as HipGraphExec, s.0 as HipStream) },
            "hipGraphLaunch",
        )
    }

    fn graph_destroy(&self, ord: usize, g: Graph) {
        if let (Ok(()), Some(gr)) = (self.current(ord), self.rt.graphs) {
            unsafe { (gr.graph_destroy)(g.0 as HipGraph) };
        }
    }

    fn graph_exec_destroy(&self, ord: usize, e: GraphExec) {
        if let (Ok(()), Some(gr)) = (self.current(ord), self.rt.graphs) {
            unsafe { (gr.graph_exec_destroy)(e.0 as HipGraphExec) };
        }
    }

    fn host_alloc(&self, ord: usize, size: usize) -> ApiResult<*mut u8> {
        self.current(ord)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = HIP_HOST_MALLOC_PORTABLE | HIP_HOST_MALLOC_MAPPED;
        self.check(
            unsafe { (self.rt.io.host_malloc)(&mut p, size.max(1), flags) },
            "hipHostMalloc",
        )?;
        if p.is_null() {
            return Err("hipHostMalloc returned NULL".into());
        }
        Ok(p as *mut u8)
    }

    fn host_free(&self, ord: usize, ptr: *mut u8) {
        if self.current(ord).is_ok() {
            if let Err(e) = self.check(
                unsafe { (self.rt.io.host_free)(ptr as *mut c_void) },
                "hipHostFree",
            ) {
                crate::log_warn!("{e}");
            }
        }
    }

    fn host_register(
        &self,
        ord: usize,
        ptr: *mut u8,
        size: usize,
        read_only: bool,
    ) -> ApiResult<DevPtr> {
        self.current(ord)?;
        let mut flags = HIP_HOST_REGISTER_PORTABLE | HIP_HOST_REGISTER_MAPPED;
        if read_only {
            flags |= HIP_HOST_REGISTER_READ_ONLY;
        }
        let io = self.rt.io;
        self.check(
            unsafe { (io.host_register)(ptr as *mut c_void, size, flags) },
            "hipHostRegister",
        )?;
        let mut d: *mut c_void = std::ptr::null_mut();
        let r = self.check(
            unsafe { (io.host_get_device_pointer)(&mut d, ptr as *mut c_void, 0) },
            "hipHostGetDevicePointer",
        );
        match r {
            Ok(()) if !d.is_null() => Ok(d as u64),
            r => {
                unsafe { (io.host_unregister)(ptr as *mut c_void) };
                Err(r
                    .err()
                    .unwrap_or_else(|| "registered memory has no device address".into()))
            }
        }
    }

    fn host_unregister(&self, ord: usize, ptr: *mut u8) {
        if self.current(ord).is_ok() {
            if let Err(e) = self.check(
                unsafe { (self.rt.io.host_unregister)(ptr as *mut c_void) },
                "hipHostUnregister",
            ) {
                crate::log_warn!("{e}");
            }
        }
    }

    fn device_sync(&self, ord: usize) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.rt.io.device_synchronize)() },
            "hipDeviceSynchronize",
        )
    }

    fn copy_htod_async(
        &self,
        ord: usize,
        dst: DevPtr,
        src: *const u8,
        size: usize,
        s: Stream,
    ) -> ApiResult<()> {
        self.current(ord)?;
        let r = unsafe {
            (self.rt.io.memcpy_async)(
                dst as *mut c_void,
                src as *const c_void,
                size,
                HIP_MEMCPY_HOST_TO_DEVICE,
                s.0 as HipStream,
            )
        };
        self.check(r, "hipMemcpyAsync(HtoD)")
    }

    fn copy_dtoh_async(
        &self,
        ord: usize,
        dst: *mut u8,
        src: DevPtr,
        size: usize,
        s: Stream,
    ) -> ApiResult<()> {
        self.current(ord)?;
        let r = unsafe {
            (self.rt.io.memcpy_async)(
                dst as *mut c_void,
                src as *const c_void,
                size,
                HIP_MEMCPY_DEVICE_TO_HOST,
                s.0 as HipStream,
            )
        };
        self.check(r, "hipMemcpyAsync(DtoH)")
    }

    fn copy_dtod_async(
        &self,
        ord: usize,
        dst: DevPtr,
        src: DevPtr,
        size: usize,
        s: Stream,
    ) -> ApiResult<()> {
        self.current(ord)?;
        let r = unsafe {
            (self.rt.io.memcpy_async)(
                dst as *mut c_void,
                src as *const c_void,
                size,
                HIP_MEMCPY_DEVICE_TO_DEVICE,
                s.0 as HipStream,
            )
        };
        self.check(r, "hipMemcpyAsync(DtoD)")
    }

    fn peer_access(&self, from: usize, to: usize) -> bool {
        self.peer
            .get(from)
            .and_then(|r| r.get(to))
            .copied()
            .unwrap_or(false)
    }

    /// Device to device where peer access is on; the runtime stages it through the host
    /// where it is not.
    fn copy_peer_async(
        &self,
        dst_ord: usize,
        dst: DevPtr,
        src_ord: usize,
        src: DevPtr,
        size: usize,
        stream_ord: usize,
        s: Stream,
    ) -> ApiResult<()> {
        if dst_ord >= self.count || src_ord >= self.count {
            return Err("no such HIP device".into());
        }
        self.current(stream_ord)?;
        let r = unsafe {
            (self.rt.io.memcpy_peer_async)(
                dst as *mut c_void,
                dst_ord as c_int,
                src as *const c_void,
                src_ord as c_int,
                size,
                s.0 as HipStream,
            )
        };
        self.check(r, "hipMemcpyPeerAsync")
    }

    fn event_create(&self, ord: usize) -> ApiResult<Event> {
        self.current(ord)?;
        let mut e: HipEvent = std::ptr::null_mut();
        self.check(
            unsafe { (self.rt.io.event_create_with_flags)(&mut e, HIP_EVENT_DISABLE_TIMING) },
            "hipEventCreateWithFlags",
        )?;
        Ok(Event(e as usize))
    }

    fn event_record(&self, ord: usize, e: Event, s: Stream) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.rt.io.event_record)(e.0 as HipEvent, s.0 as HipStream) },
            "hipEventRecord",
        )
    }

    fn event_sync(&self, ord: usize, e: Event) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.rt.io.event_synchronize)(e.0 as HipEvent) },
            "hipEventSynchronize",
        )
    }

    fn stream_wait_event(&self, ord: usize, s: Stream, e: Event) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.rt.io.stream_wait_event)(s.0 as HipStream, e.0 as HipEvent, 0) },
            "hipStreamWaitEvent",
        )
    }

    fn event_destroy(&self, ord: usize, e: Event) {
        if self.current(ord).is_ok() {
            unsafe { (self.rt.io.event_destroy)(e.0 as HipEvent) };
        }
    }

    fn event_create_timed(&self, ord: usize) -> ApiResult<Event> {
        self.current(ord)?;
        let mut e: HipEvent = std::ptr::null_mut();
        self.check(
            unsafe { (self.rt.io.event_create_with_flags)(&mut e, 0) },
            "hipEventCreateWithFlags",
        )?;
        Ok(Event(e as usize))
    }

    fn event_elapsed_ms(&self, ord: usize, start: Event, end: Event) -> ApiResult<f32> {
        self.current(ord)?;
        let mut ms = 0f32;
        self.check(
            unsafe {
                (self.rt.io.event_elapsed_time)(&mut ms, start.0 as HipEvent, end.0 as HipEvent)
            },
            "hipEventElapsedTime",
        )?;
        Ok(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_name_is_found_in_props() {
        let mut props = vec![0u8; 1024];
        props[..18].copy_from_slice(b"AMD Instinct MI210");
        props[600..622].copy_from_slice(b"gfx90a:sramecc+:xnack-");
        assert_eq!(
            find_gcn_arch_name(&props).as_deref(),
            Some("gfx90a:sramecc+:xnack-")
        );
        assert_eq!(find_gcn_arch_name(&[0u8; 64]), None);
    }

    /// Compiles the real kernels with hiprtc where the HIP runtime is installed (no GPU is
    /// needed to compile); skipped elsewhere.
    #[test]
    fn hiprtc_compiles_the_kernels_when_installed() {
        let Some((lib, _)) = open_library(
            &["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"],
            &rocm_dirs(),
        ) else {
            eprintln!("skipped: no HIP runtime");
            return;
        };
        let Ok((rtc, _l)) = load_hiprtc(&lib, &rocm_dirs()) else {
            eprintln!("skipped: no hiprtc");
            return;
        };
        for g in crate::gpu::kernel_groups::groups() {
            let src = g.source();
            for (arch, wave) in [("gfx90a", 64), ("gfx1030", 32)] {
                let mut opts = vec![format!("-DRF_WARP_SIZE={wave}")];
                opts.extend(g.options());
                let r = hiprtc_compile(&rtc, &src, "rocmforge.hip", arch, &opts);
                assert!(
                    r.as_ref().is_ok_and(|b| !b.is_empty()),
                    "hiprtc for {arch}, group {}: {:?}",
                    g.label(),
                    r.err()
                );
            }
        }
    }

    #[test]
    fn wave_size_by_target() {
        assert_eq!(warp_size_of_arch("gfx90a:sramecc+:xnack-"), 64);
        assert_eq!(warp_size_of_arch("gfx942"), 64);
        assert_eq!(warp_size_of_arch("gfx906"), 64);
        assert_eq!(warp_size_of_arch("gfx1030"), 32);
        assert_eq!(warp_size_of_arch("gfx1100"), 32);
    }
}
