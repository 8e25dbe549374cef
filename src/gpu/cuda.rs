//! NVIDIA: the CUDA driver API (`libcuda.so.1`, installed with the driver) and nvrtc
//! (`libnvrtc.so*`, from the CUDA toolkit or a pip wheel), both opened at run time.

use super::api::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuStream = *mut c_void;
type CuModule = *mut c_void;
type CuFunction = *mut c_void;
type CuGraph = *mut c_void;
type CuGraphExec = *mut c_void;
type CuEvent = *mut c_void;

/// Thread-local capture: only the capturing thread is barred from calls that would break the
/// capture; other threads (other backends of the device) keep using the driver meanwhile.
const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// Streams that never synchronize with the legacy (null) stream (see `stream_create`).
const CU_STREAM_NON_BLOCKING: c_uint = 0x1;

const CU_DEVICE_ATTRIBUTE_WARP_SIZE: c_int = 10;
const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
const CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: c_int = 91;
const CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: c_int = 113;

const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;
const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x01;
const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 0x02;
const CU_MEMHOSTREGISTER_READ_ONLY: c_uint = 0x08;
const CU_EVENT_DISABLE_TIMING: c_uint = 0x02;
const CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: c_int = 6;

/// cuLaunchKernelEx's launch configuration (cuda.h, CUDA 12.0+).
#[repr(C)]
struct CuLaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem: c_uint,
    stream: CuStream,
    attrs: *mut CuLaunchAttribute,
    num_attrs: c_uint,
}

/// One launch attribute: its id, then a 64-byte union of values at offset 8.
#[repr(C)]
struct CuLaunchAttribute {
    id: c_int,
    pad: c_int,
    value: [u64; 8],
}

#[derive(Clone, Copy)]
struct Driver {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    device_total_mem: unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(u64) -> CuResult,
    memset_d8_async: unsafe extern "C" fn(u64, u8, usize, CuStream) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut CuModule, *const c_void) -> CuResult,
    module_unload: unsafe extern "C" fn(CuModule) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut CuFunction, CuModule, *const c_char) -> CuResult,
    #[allow(clippy::type_complexity)]
    launch_kernel: unsafe extern "C" fn(
        CuFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        CuStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    /// None with drivers older than CUDA 12 (then kernels launch without programmatic
    /// dependent launch).
    launch_kernel_ex: Option<
        unsafe extern "C" fn(
            *const CuLaunchConfig,
            CuFunction,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> CuResult,
    >,
    /// None with drivers older than CUDA 12 (then graphs are simply not used).
    graphs: Option<Graphs>,
    /// Counts a graph's nodes (None: an old runtime; then executables are always replaced).
    graph_get_nodes:
        Option<unsafe extern "C" fn(CuGraph, *mut *mut c_void, *mut usize) -> CuResult>,
    io: Io,
}

/// Pinned and registered host memory, asynchronous copies, events.
#[derive(Clone, Copy)]
struct Io {
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    mem_host_register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CuResult,
    mem_host_unregister: unsafe extern "C" fn(*mut c_void) -> CuResult,
    mem_host_get_device_pointer: unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> CuResult,
    ctx_synchronize: unsafe extern "C" fn() -> CuResult,
    memcpy_htod_async: unsafe extern "C" fn(u64, *const c_void, usize, CuStream) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, u64, usize, CuStream) -> CuResult,
    memcpy_dtod_async: unsafe extern "C" fn(u64, u64, usize, CuStream) -> CuResult,
    /// (dst, dst context, src, src context, bytes, stream)
    memcpy_peer_async:
        unsafe extern "C" fn(u64, CuContext, u64, CuContext, usize, CuStream) -> CuResult,
    event_create: unsafe extern "C" fn(*mut CuEvent, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(CuEvent, CuStream) -> CuResult,
    event_synchronize: unsafe extern "C" fn(CuEvent) -> CuResult,
    event_destroy: unsafe extern "C" fn(CuEvent) -> CuResult,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, CuEvent, CuEvent) -> CuResult,
    stream_wait_event: unsafe extern "C" fn(CuStream, CuEvent, c_uint) -> CuResult,
}

#[derive(Clone, Copy)]
struct Graphs {
    stream_begin_capture: unsafe extern "C" fn(CuStream, c_int) -> CuResult,
    stream_end_capture: unsafe extern "C" fn(CuStream, *mut CuGraph) -> CuResult,
    graph_instantiate: unsafe extern "C" fn(*mut CuGraphExec, CuGraph, u64) -> CuResult,
    /// The result-info argument is a 24-byte struct (result code, two node handles).
    graph_exec_update: unsafe extern "C" fn(CuGraphExec, CuGraph, *mut [u64; 4]) -> CuResult,
    graph_launch: unsafe extern "C" fn(CuGraphExec, CuStream) -> CuResult,
    graph_destroy: unsafe extern "C" fn(CuGraph) -> CuResult,
    graph_exec_destroy: unsafe extern "C" fn(CuGraphExec) -> CuResult,
}

type NvrtcProgram = *mut c_void;

#[derive(Clone, Copy)]
struct Nvrtc {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    create_program: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile_program: unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> c_int,
    get_program_log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    get_program_log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    get_cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> c_int,
    get_cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> c_int,
    destroy_program: unsafe extern "C" fn(*mut NvrtcProgram) -> c_int,
}

pub struct CudaApi {
    drv: Driver,
    rtc: Nvrtc,
    /// (device handle, retained primary context) per ordinal.
    devices: Vec<(CuDevice, usize)>,
    /// Per ordinal: launch with programmatic dependent launch (sm_90+, a driver with
    /// cuLaunchKernelEx, ROCMFORGE_GPU_PDL not 0). The kernels' rf_grid_begin() makes it safe.
    pdl: Vec<std::sync::atomic::AtomicBool>,
    /// peer[i][j]: kernels on device i read and write device j's memory (`enable_peer_access`).
    peer: Vec<Vec<bool>>,
    _libs: (libloading::Library, libloading::Library),
}

// The driver API is thread-safe; contexts are made current per call.
unsafe impl Send for CudaApi {}
unsafe impl Sync for CudaApi {}

fn nvrtc_names() -> Vec<String> {
    let mut v = vec!["libnvrtc.so".to_string()];
    for major in (11..=14).rev() {
        v.push(format!("libnvrtc.so.{major}"));
    }
    v
}

fn nvrtc_dirs() -> Vec<String> {
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

impl CudaApi {
    /// Opens the driver and nvrtc and retains every device's primary context.
    /// Err = no usable NVIDIA GPU here (with the reason, for the log).
    pub fn open() -> ApiResult<CudaApi> {
        let (lib, _) =
            open_library(&["libcuda.so.1", "libcuda.so"], &[]).ok_or("libcuda.so.1 not found")?;
        let drv = unsafe {
            Driver {
                init: sym(&lib, "cuInit")?,
                get_error_string: sym(&lib, "cuGetErrorString")?,
                device_get_count: sym(&lib, "cuDeviceGetCount")?,
                device_get: sym(&lib, "cuDeviceGet")?,
                device_get_name: sym(&lib, "cuDeviceGetName")?,
                device_total_mem: sym(&lib, "cuDeviceTotalMem_v2")?,
                device_get_attribute: sym(&lib, "cuDeviceGetAttribute")?,
                primary_ctx_retain: sym(&lib, "cuDevicePrimaryCtxRetain")?,
                ctx_set_current: sym(&lib, "cuCtxSetCurrent")?,
                mem_get_info: sym(&lib, "cuMemGetInfo_v2")?,
                mem_alloc: sym(&lib, "cuMemAlloc_v2")?,
                mem_free: sym(&lib, "cuMemFree_v2")?,
                memset_d8_async: sym(&lib, "cuMemsetD8Async")?,
                stream_create: sym(&lib, "cuStreamCreate")?,
                stream_synchronize: sym(&lib, "cuStreamSynchronize")?,
                stream_destroy: sym(&lib, "cuStreamDestroy_v2")?,
                module_load_data: sym(&lib, "cuModuleLoadData")?,
                module_unload: sym(&lib, "cuModuleUnload")?,
                module_get_function: sym(&lib, "cuModuleGetFunction")?,
                launch_kernel: sym(&lib, "cuLaunchKernel")?,
                launch_kernel_ex: sym(&lib, "cuLaunchKernelEx").ok(),
                graph_get_nodes: sym(&lib, "cuGraphGetNodes").ok(),
                graphs: (|| {
                    Ok::<_, String>(Graphs {
                        stream_begin_capture: sym(&lib, "cuStreamBeginCapture_v2")?,
                        stream_end_capture: sym(&lib, "cuStreamEndCapture")?,
                        graph_instantiate: sym(&lib, "cuGraphInstantiateWithFlags")?,
                        graph_exec_update: sym(&lib, "cuGraphExecUpdate_v2")?,
                        graph_launch: sym(&lib, "cuGraphLaunch")?,
                        graph_destroy: sym(&lib, "cuGraphDestroy")?,
                        graph_exec_destroy: sym(&lib, "cuGraphExecDestroy")?,
                    })
                })()
                .ok(),
                io: Io {
                    mem_host_alloc: sym(&lib, "cuMemHostAlloc")?,
                    mem_free_host: sym(&lib, "cuMemFreeHost")?,
                    mem_host_register: sym(&lib, "cuMemHostRegister_v2")?,
                    mem_host_unregister: sym(&lib, "cuMemHostUnregister")?,
                    mem_host_get_device_pointer: sym(&lib, "cuMemHostGetDevicePointer_v2")?,
                    ctx_synchronize: sym(&lib, "cuCtxSynchronize")?,
                    memcpy_htod_async: sym(&lib, "cuMemcpyHtoDAsync_v2")?,
                    memcpy_dtoh_async: sym(&lib, "cuMemcpyDtoHAsync_v2")?,
                    memcpy_dtod_async: sym(&lib, "cuMemcpyDtoDAsync_v2")?,
                    memcpy_peer_async: sym(&lib, "cuMemcpyPeerAsync")?,
                    event_create: sym(&lib, "cuEventCreate")?,
                    event_record: sym(&lib, "cuEventRecord")?,
                    event_synchronize: sym(&lib, "cuEventSynchronize")?,
                    event_destroy: sym(&lib, "cuEventDestroy_v2")?,
                    event_elapsed_time: sym(&lib, "cuEventElapsedTime")?,
                    stream_wait_event: sym(&lib, "cuStreamWaitEvent")?,
                },
            }
        };
        let check = |r: CuResult, what: &str| -> ApiResult<()> { cu_check(&drv, r, what) };
        check(unsafe { (drv.init)(0) }, "cuInit")?;
        let mut n: c_int = 0;
        check(
            unsafe { (drv.device_get_count)(&mut n) },
            "cuDeviceGetCount",
        )?;
        if n <= 0 {
            return Err("the CUDA driver reports no device".into());
        }
        let (rlib, rpath) = open_library(
            &nvrtc_names().iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            &nvrtc_dirs(),
        )
        .ok_or(
            "nvrtc (libnvrtc.so) not found: install the CUDA toolkit's nvrtc to use NVIDIA GPUs",
        )?;
        crate::log_debug!("CUDA: nvrtc from {rpath}");
        let rtc = unsafe {
            Nvrtc {
                version: sym(&rlib, "nvrtcVersion")?,
                get_error_string: sym(&rlib, "nvrtcGetErrorString")?,
                create_program: sym(&rlib, "nvrtcCreateProgram")?,
                compile_program: sym(&rlib, "nvrtcCompileProgram")?,
                get_program_log_size: sym(&rlib, "nvrtcGetProgramLogSize")?,
                get_program_log: sym(&rlib, "nvrtcGetProgramLog")?,
                get_cubin_size: sym(&rlib, "nvrtcGetCUBINSize")?,
                get_cubin: sym(&rlib, "nvrtcGetCUBIN")?,
                destroy_program: sym(&rlib, "nvrtcDestroyProgram")?,
            }
        };
        let mut devices = Vec::new();
        for i in 0..n {
            let mut d: CuDevice = 0;
            let mut ctx: CuContext = std::ptr::null_mut();
            let r = check(unsafe { (drv.device_get)(&mut d, i) }, "cuDeviceGet").and_then(|_| {
                check(
                    unsafe { (drv.primary_ctx_retain)(&mut ctx, d) },
                    "cuDevicePrimaryCtxRetain",
                )
            });
            match r {
                Ok(()) => devices.push((d, ctx as usize)),
                Err(e) => crate::log_warn!("CUDA device {i} skipped: {e}"),
            }
        }
        let peer = enable_peer_access(&lib, &drv, &devices);
        let pdl_env = crate::tuning::get().gpu_pdl;
        let pdl = devices
            .iter()
            .map(|&(d, _)| {
                let mut major: c_int = 0;
                let r = unsafe {
                    (drv.device_get_attribute)(
                        &mut major,
                        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                        d,
                    )
                };
                std::sync::atomic::AtomicBool::new(
                    pdl_env && drv.launch_kernel_ex.is_some() && r == 0 && major >= 9,
                )
            })
            .collect();
        Ok(CudaApi {
            drv,
            rtc,
            devices,
            pdl,
            peer,
            _libs: (lib, rlib),
        })
    }

    fn check(&self, r: CuResult, what: &str) -> ApiResult<()> {
        cu_check(&self.drv, r, what)
    }

    /// cuLaunchKernel (the context is current).
    fn plain_launch(
        &self,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        s: Stream,
        args: &mut [*mut c_void],
    ) -> ApiResult<()> {
        self.check(
            unsafe {
                (self.drv.launch_kernel)(
                    f.0 as CuFunction,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    shared_mem,
                    s.0 as CuStream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }

    fn current(&self, ord: usize) -> ApiResult<()> {
        let (_, ctx) = *self.devices.get(ord).ok_or("no such CUDA device")?;
        self.check(
            unsafe { (self.drv.ctx_set_current)(ctx as CuContext) },
            "cuCtxSetCurrent",
        )
    }

    fn graphs(&self) -> ApiResult<Graphs> {
        self.drv
            .graphs
            .ok_or_else(|| "this CUDA driver has no graph API".to_string())
    }

    fn ctx(&self, ord: usize) -> ApiResult<CuContext> {
        Ok(self.devices.get(ord).ok_or("no such CUDA device")?.1 as CuContext)
    }

    fn attr(&self, ord: usize, a: c_int) -> ApiResult<c_int> {
        let mut v: c_int = 0;
        self.check(
            unsafe { (self.drv.device_get_attribute)(&mut v, a, self.devices[ord].0) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    }

    fn rtc_err(&self, r: c_int, what: &str) -> String {
        let s = unsafe { (self.rtc.get_error_string)(r) };
        let msg = if s.is_null() {
            "?".into()
        } else {
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        format!("{what}: {msg} ({r})")
    }
}

/// Lets every GPU read and write every other's memory directly where the hardware allows
/// (NVLink or PCIe peer to peer): peer copies (layer and row split) then go device to device
/// instead of through host memory, and kernels may use another GPU's memory. Best effort:
/// refused pairs keep the staged copy, logged. Returns which pairs are on (`CudaApi::peer`).
fn enable_peer_access(
    lib: &libloading::Library,
    drv: &Driver,
    devices: &[(CuDevice, usize)],
) -> Vec<Vec<bool>> {
    let mut on = vec![vec![false; devices.len()]; devices.len()];
    type CanAccess = unsafe extern "C" fn(*mut c_int, CuDevice, CuDevice) -> CuResult;
    type Enable = unsafe extern "C" fn(CuContext, c_uint) -> CuResult;
    if devices.len() < 2 || !crate::tuning::get().gpu_peer {
        return on;
    }
    // SAFETY: the driver's own signatures of these two functions.
    let (Ok(can), Ok(enable)) = (
        unsafe { sym::<CanAccess>(lib, "cuDeviceCanAccessPeer") },
        unsafe { sym::<Enable>(lib, "cuCtxEnablePeerAccess") },
    ) else {
        return on;
    };
    const ALREADY_ENABLED: CuResult = 704;
    for (i, &(di, ci)) in devices.iter().enumerate() {
        for (j, &(dj, cj)) in devices.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut ok: c_int = 0;
            let r = unsafe { can(&mut ok, di, dj) };
            if r != 0 || ok == 0 {
                crate::log_info!("CUDA: device {i} cannot reach device {j} directly; copies between them go through the host");
                continue;
            }
            let r = unsafe {
                (drv.ctx_set_current)(ci as CuContext);
                enable(cj as CuContext, 0)
            };
            if r != 0 && r != ALREADY_ENABLED {
                crate::log_info!(
                    "CUDA: peer access {i} -> {j} refused ({r}); copies go through the host"
                );
            } else {
                crate::log_debug!("CUDA: peer access {i} -> {j} on");
                on[i][j] = true;
            }
        }
    }
    on
}

fn cu_check(drv: &Driver, r: CuResult, what: &str) -> ApiResult<()> {
    if r == 0 {
        return Ok(());
    }
    let mut s: *const c_char = std::ptr::null();
    unsafe { (drv.get_error_string)(r, &mut s) };
    let msg = if s.is_null() {
        "unknown error".into()
    } else {
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    };
    Err(format!("{what}: {msg} ({r})"))
}

impl GpuApi for CudaApi {
    fn vendor(&self) -> &'static str {
        "CUDA"
    }

    fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn device_info(&self, ord: usize) -> ApiResult<DeviceInfo> {
        let d = self.devices.get(ord).ok_or("no such CUDA device")?.0;
        let mut name = [0 as c_char; 256];
        self.check(
            unsafe { (self.drv.device_get_name)(name.as_mut_ptr(), 255, d) },
            "cuDeviceGetName",
        )?;
        let mut total = 0usize;
        self.check(
            unsafe { (self.drv.device_total_mem)(&mut total, d) },
            "cuDeviceTotalMem",
        )?;
        let major = self.attr(ord, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attr(ord, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok(DeviceInfo {
            name: unsafe { CStr::from_ptr(name.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
            total_mem: total,
            arch: format!("sm_{major}{minor}"),
            warp_size: self.attr(ord, CU_DEVICE_ATTRIBUTE_WARP_SIZE)? as u32,
            compute_units: self.attr(ord, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        })
    }

    fn mem_info(&self, ord: usize) -> ApiResult<(usize, usize)> {
        self.current(ord)?;
        let (mut free, mut total) = (0usize, 0usize);
        self.check(
            unsafe { (self.drv.mem_get_info)(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free, total))
    }

    fn alloc(&self, ord: usize, size: usize) -> ApiResult<DevPtr> {
        self.current(ord)?;
        let mut p = 0u64;
        self.check(
            unsafe { (self.drv.mem_alloc)(&mut p, size.max(1)) },
            "cuMemAlloc",
        )?;
        Ok(p)
    }

    fn free(&self, ord: usize, ptr: DevPtr) {
        if self.current(ord).is_ok() {
            if let Err(e) = self.check(unsafe { (self.drv.mem_free)(ptr) }, "cuMemFree") {
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
            unsafe { (self.drv.memset_d8_async)(dst, value, size, s.0 as CuStream) },
            "cuMemsetD8Async",
        )
    }

    fn stream_create(&self, ord: usize) -> ApiResult<Stream> {
        self.current(ord)?;
        let mut s: CuStream = std::ptr::null_mut();
        // Non-blocking: work on the legacy stream never waits for it, so nothing another
        // thread does can tie the legacy stream to this stream while it is being captured
        // (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 906). We queue nothing on the legacy stream.
        self.check(
            unsafe { (self.drv.stream_create)(&mut s, CU_STREAM_NON_BLOCKING) },
            "cuStreamCreate",
        )?;
        Ok(Stream(s as usize))
    }

    fn stream_sync(&self, ord: usize, s: Stream) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.drv.stream_synchronize)(s.0 as CuStream) },
            "cuStreamSynchronize",
        )
    }

    fn stream_destroy(&self, ord: usize, s: Stream) {
        if self.current(ord).is_ok() {
            unsafe { (self.drv.stream_destroy)(s.0 as CuStream) };
        }
    }

    fn compiler_version(&self) -> String {
        let (mut major, mut minor) = (0, 0);
        unsafe { (self.rtc.version)(&mut major, &mut minor) };
        format!("nvrtc {major}.{minor}")
    }

    fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        options: &[String],
    ) -> ApiResult<Vec<u8>> {
        let src = CString::new(source).map_err(|_| "kernel source contains NUL")?;
        let cname = CString::new(name).map_err(|_| "bad program name")?;
        let mut opts: Vec<CString> =
            vec![CString::new(format!("--gpu-architecture={arch}")).unwrap()];
        opts.extend(options.iter().filter_map(|o| CString::new(o.as_str()).ok()));
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: NvrtcProgram = std::ptr::null_mut();
        let r = unsafe {
            (self.rtc.create_program)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(self.rtc_err(r, "nvrtcCreateProgram"));
        }
        let r =
            unsafe { (self.rtc.compile_program)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let mut log_size = 0usize;
        unsafe { (self.rtc.get_program_log_size)(prog, &mut log_size) };
        let mut log = vec![0u8; log_size.max(1)];
        unsafe { (self.rtc.get_program_log)(prog, log.as_mut_ptr() as *mut c_char) };
        let log = String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string();
        let out = if r != 0 {
            Err(format!("{}\n{log}", self.rtc_err(r, "nvrtcCompileProgram")))
        } else {
            if !log.is_empty() {
                crate::log_debug!("nvrtc: {log}");
            }
            let mut size = 0usize;
            let r = unsafe { (self.rtc.get_cubin_size)(prog, &mut size) };
            if r != 0 || size == 0 {
                Err(self.rtc_err(r, "nvrtcGetCUBINSize"))
            } else {
                let mut bin = vec![0u8; size];
                let r = unsafe { (self.rtc.get_cubin)(prog, bin.as_mut_ptr() as *mut c_char) };
                if r != 0 {
                    Err(self.rtc_err(r, "nvrtcGetCUBIN"))
                } else {
                    Ok(bin)
                }
            }
        };
        unsafe { (self.rtc.destroy_program)(&mut prog) };
        out
    }

    fn module_load(&self, ord: usize, image: &[u8]) -> ApiResult<Module> {
        self.current(ord)?;
        let mut m: CuModule = std::ptr::null_mut();
        self.check(
            unsafe { (self.drv.module_load_data)(&mut m, image.as_ptr() as *const c_void) },
            "cuModuleLoadData",
        )?;
        Ok(Module(m as usize))
    }

    fn module_function(&self, ord: usize, m: Module, name: &str) -> ApiResult<Function> {
        self.current(ord)?;
        let cname = CString::new(name).map_err(|_| "bad kernel name")?;
        let mut f: CuFunction = std::ptr::null_mut();
        self.check(
            unsafe { (self.drv.module_get_function)(&mut f, m.0 as CuModule, cname.as_ptr()) },
            &format!("cuModuleGetFunction({name})"),
        )?;
        Ok(Function(f as usize))
    }

    fn module_unload(&self, ord: usize, m: Module) {
        if self.current(ord).is_ok() {
            unsafe { (self.drv.module_unload)(m.0 as CuModule) };
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
        let pdl = self
            .pdl
            .get(ord)
            .is_some_and(|p| p.load(std::sync::atomic::Ordering::Relaxed));
        if let (true, Some(launch_ex)) = (pdl, self.drv.launch_kernel_ex) {
            let mut attr = CuLaunchAttribute {
                id: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: 0,
                value: [0; 8],
            };
            attr.value[0] = 1; // programmaticStreamSerializationAllowed: an int at the union's start
            let cfg = CuLaunchConfig {
                grid,
                block,
                shared_mem,
                stream: s.0 as CuStream,
                attrs: &mut attr,
                num_attrs: 1,
            };
            let r = unsafe {
                launch_ex(
                    &cfg,
                    f.0 as CuFunction,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            if r == 0 {
                return Ok(());
            }
            // Try the plain way; if that works, the attribute was the problem: plain from now on.
            let e = self.check(r, "cuLaunchKernelEx").unwrap_err();
            self.plain_launch(f, grid, block, shared_mem, s, args)?;
            crate::log_warn!("CUDA device {ord}: programmatic dependent launch refused ({e}); launching without it");
            self.pdl[ord].store(false, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        self.plain_launch(f, grid, block, shared_mem, s, args)
    }

    fn capture_begin(&self, ord: usize, s: Stream) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe {
                (self.graphs()?.stream_begin_capture)(
                    s.0 as CuStream,
                    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "cuStreamBeginCapture",
        )
    }

    fn capture_end(&self, ord: usize, s: Stream) -> ApiResult<Graph> {
        self.current(ord)?;
        let mut g: CuGraph = std::ptr::null_mut();
        self.check(
            unsafe { (self.graphs()?.stream_end_capture)(s.0 as CuStream, &mut g) },
            "cuStreamEndCapture",
        )?;
        Ok(Graph(g as usize))
    }

    fn graph_instantiate(&self, ord: usize, g: Graph) -> ApiResult<GraphExec> {
        self.current(ord)?;
        let mut e: CuGraphExec = std::ptr::null_mut();
        self.check(
            unsafe { (self.graphs()?.graph_instantiate)(&mut e, g.0 as CuGraph, 0) },
            "cuGraphInstantiate",
        )?;
        Ok(GraphExec(e as usize))
    }

    fn graph_node_count(&self, ord: usize, g: Graph) -> Option<usize> {
        let f = self.drv.graph_get_nodes?;
        let mut n = 0usize;
        self.current(ord).ok()?;
        (unsafe { f(g.0 as CuGraph, std::ptr::null_mut(), &mut n) } == 0).then_some(n)
    }

    fn graph_exec_update(&self, ord: usize, e: GraphExec, g: Graph) -> bool {
        let mut info = [0u64; 4];
        let Some(gr) = self.drv.graphs else {
            return false;
        };
        self.current(ord).is_ok()
            && unsafe { (gr.graph_exec_update)(e.0 as CuGraphExec, g.0 as CuGraph, &mut info) } == 0
    }

    fn graph_launch(&self, ord: usize, e: GraphExec, s: Stream) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.graphs()?.graph_launch)(e.0 as CuGraphExec, s.0 as CuStream) },
            "cuGraphLaunch",
        )
    }

    fn graph_destroy(&self, ord: usize, g: Graph) {
        if let (Ok(()), Some(gr)) = (self.current(ord), self.drv.graphs) {
            unsafe { (gr.graph_destroy)(g.0 as CuGraph) };
        }
    }

    fn graph_exec_destroy(&self, ord: usize, e: GraphExec) {
        if let (Ok(()), Some(gr)) = (self.current(ord), self.drv.graphs) {
            unsafe { (gr.graph_exec_destroy)(e.0 as CuGraphExec) };
        }
    }

    fn host_alloc(&self, ord: usize, size: usize) -> ApiResult<*mut u8> {
        self.current(ord)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // Portable: pinned for every context; device-mapped: kernels could read it (unused).
        let flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
        self.check(
            unsafe { (self.drv.io.mem_host_alloc)(&mut p, size.max(1), flags) },
            "cuMemHostAlloc",
        )?;
        if p.is_null() {
            return Err("cuMemHostAlloc returned NULL".into());
        }
        Ok(p as *mut u8)
    }

    fn host_free(&self, ord: usize, ptr: *mut u8) {
        if self.current(ord).is_ok() {
            if let Err(e) = self.check(
                unsafe { (self.drv.io.mem_free_host)(ptr as *mut c_void) },
                "cuMemFreeHost",
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
        let mut flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
        if read_only {
            if self.attr(ord, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED)? == 0 {
                return Err("this device cannot map read-only host memory".into());
            }
            flags |= CU_MEMHOSTREGISTER_READ_ONLY;
        }
        let io = self.drv.io;
        self.check(
            unsafe { (io.mem_host_register)(ptr as *mut c_void, size, flags) },
            "cuMemHostRegister",
        )?;
        let mut d = 0u64;
        let r = self.check(
            unsafe { (io.mem_host_get_device_pointer)(&mut d, ptr as *mut c_void, 0) },
            "cuMemHostGetDevicePointer",
        );
        if let Err(e) = r {
            unsafe { (io.mem_host_unregister)(ptr as *mut c_void) };
            return Err(e);
        }
        // Devices with this attribute reach registered memory at the host's own address.
        let same = self
            .attr(
                ord,
                CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            )
            .unwrap_or(0)
            != 0;
        Ok(if same { ptr as u64 } else { d })
    }

    fn host_unregister(&self, ord: usize, ptr: *mut u8) {
        if self.current(ord).is_ok() {
            if let Err(e) = self.check(
                unsafe { (self.drv.io.mem_host_unregister)(ptr as *mut c_void) },
                "cuMemHostUnregister",
            ) {
                crate::log_warn!("{e}");
            }
        }
    }

    fn device_sync(&self, ord: usize) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.drv.io.ctx_synchronize)() },
            "cuCtxSynchronize",
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
        self.check(
            unsafe {
                (self.drv.io.memcpy_htod_async)(dst, src as *const c_void, size, s.0 as CuStream)
            },
            "cuMemcpyHtoDAsync",
        )
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
        self.check(
            unsafe {
                (self.drv.io.memcpy_dtoh_async)(dst as *mut c_void, src, size, s.0 as CuStream)
            },
            "cuMemcpyDtoHAsync",
        )
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
        self.check(
            unsafe { (self.drv.io.memcpy_dtod_async)(dst, src, size, s.0 as CuStream) },
            "cuMemcpyDtoDAsync",
        )
    }

    fn peer_access(&self, from: usize, to: usize) -> bool {
        self.peer
            .get(from)
            .and_then(|r| r.get(to))
            .copied()
            .unwrap_or(false)
    }

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
        let (dctx, sctx) = (self.ctx(dst_ord)?, self.ctx(src_ord)?);
        self.current(stream_ord)?;
        self.check(
            unsafe { (self.drv.io.memcpy_peer_async)(dst, dctx, src, sctx, size, s.0 as CuStream) },
            "cuMemcpyPeerAsync",
        )
    }

    fn event_create(&self, ord: usize) -> ApiResult<Event> {
        self.current(ord)?;
        let mut e: CuEvent = std::ptr::null_mut();
        self.check(
            unsafe { (self.drv.io.event_create)(&mut e, CU_EVENT_DISABLE_TIMING) },
            "cuEventCreate",
        )?;
        Ok(Event(e as usize))
    }

    fn event_record(&self, ord: usize, e: Event, s: Stream) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.drv.io.event_record)(e.0 as CuEvent, s.0 as CuStream) },
            "cuEventRecord",
        )
    }

    fn event_sync(&self, ord: usize, e: Event) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.drv.io.event_synchronize)(e.0 as CuEvent) },
            "cuEventSynchronize",
        )
    }

    fn stream_wait_event(&self, ord: usize, s: Stream, e: Event) -> ApiResult<()> {
        self.current(ord)?;
        self.check(
            unsafe { (self.drv.io.stream_wait_event)(s.0 as CuStream, e.0 as CuEvent, 0) },
            "cuStreamWaitEvent",
        )
    }

    fn event_destroy(&self, ord: usize, e: Event) {
        if self.current(ord).is_ok() {
            unsafe { (self.drv.io.event_destroy)(e.0 as CuEvent) };
        }
    }

    fn event_create_timed(&self, ord: usize) -> ApiResult<Event> {
        self.current(ord)?;
        let mut e: CuEvent = std::ptr::null_mut();
        self.check(
            unsafe { (self.drv.io.event_create)(&mut e, 0) },
            "cuEventCreate",
        )?;
        Ok(Event(e as usize))
    }

    fn event_elapsed_ms(&self, ord: usize, start: Event, end: Event) -> ApiResult<f32> {
        self.current(ord)?;
        let mut ms = 0f32;
        self.check(
            unsafe {
                (self.drv.io.event_elapsed_time)(&mut ms, start.0 as CuEvent, end.0 as CuEvent)
            },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuLaunchKernelEx's structs as cuda.h 13.0 lays them out (printed by a C program built
    /// against the H100 machine's cuda.h: CUlaunchConfig 56 bytes, hStream at 32, attrs at 40,
    /// numAttrs at 48; CUlaunchAttribute 72 bytes, value at 8).
    #[test]
    fn launch_structs_match_cuda_h() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<CuLaunchConfig>(), 56);
        assert_eq!(offset_of!(CuLaunchConfig, block), 12);
        assert_eq!(offset_of!(CuLaunchConfig, shared_mem), 24);
        assert_eq!(offset_of!(CuLaunchConfig, stream), 32);
        assert_eq!(offset_of!(CuLaunchConfig, attrs), 40);
        assert_eq!(offset_of!(CuLaunchConfig, num_attrs), 48);
        assert_eq!(size_of::<CuLaunchAttribute>(), 72);
        assert_eq!(offset_of!(CuLaunchAttribute, value), 8);
    }
}
