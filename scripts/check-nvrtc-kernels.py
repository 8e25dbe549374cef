#!/usr/bin/env python3
"""Compiles the GPU kernels as the library does on NVIDIA, each kernel group on its own (the
programs and their -D options come from the library itself: src/gpu/kernel_groups.rs, written
out by the ignored unit test write_group_sources) with an nvrtc found here, for the
architectures given (default sm_90 sm_80), on all cores, and reports errors and each group's
compile time. No GPU is needed; exit 2 (skipped) when no nvrtc can be had.
nvrtc: $NVRTC_LIB, or the pip wheel nvidia-cuda-nvrtc-cu12 under $NVRTC_DIR (default .nvrtc/,
fetched with pip download when missing)."""
import concurrent.futures, ctypes, glob, os, subprocess, sys, tempfile, time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def group_sources():
    """[(label, source bytes, [options])] of every kernel group."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, ROCMFORGE_KERNEL_GROUPS_OUT=d)
        subprocess.check_call([os.environ.get("CARGO", "cargo"), "test", "-q", "--release", "--lib", "gpu::kernel_groups::tests::write_group_sources",
                               "--", "--ignored", "--exact"], cwd=root, env=env, stdout=subprocess.DEVNULL)
        out = []
        for path in sorted(glob.glob(os.path.join(d, "*.hip"))):
            with open(path, "rb") as f:
                src = f.read()
            with open(path[:-4] + ".opts") as f:
                opts = f.read().split()
            out.append((os.path.basename(path)[:-4], src, opts))
        return out


def find_nvrtc():
    lib = os.environ.get("NVRTC_LIB")
    if lib:
        return lib
    d = os.environ.get("NVRTC_DIR", os.path.join(root, ".nvrtc"))
    hits = glob.glob(os.path.join(d, "**/libnvrtc.so.*"), recursive=True)
    if not hits:
        os.makedirs(d, exist_ok=True)
        r = subprocess.call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                             "nvidia-cuda-nvrtc-cu12", "-d", d])
        if r != 0:
            print("check-nvrtc-kernels: skipped: nvrtc could not be fetched (pip download nvidia-cuda-nvrtc-cu12)")
            sys.exit(2)
        for whl in glob.glob(os.path.join(d, "*.whl")):
            subprocess.check_call(["python3", "-m", "zipfile", "-e", whl, d])
        hits = glob.glob(os.path.join(d, "**/libnvrtc.so.*"), recursive=True)
    hits = [h for h in hits if "alt" not in os.path.basename(h) and "builtins" not in os.path.basename(h)]
    if not hits:
        sys.exit("nvrtc not found")
    return hits[0]


def compile_one(nv, label, src, opts, arch):
    """(ok, seconds, log) of one group for one architecture."""
    t0 = time.time()
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src, (label + ".hip").encode(), 0, None, None) == 0
    args = [f"--gpu-architecture={arch}".encode(), b"-DRF_WARP_SIZE=32"] + [o.encode() for o in opts]
    arr = (ctypes.c_char_p * len(args))(*args)
    r = nv.nvrtcCompileProgram(prog, len(args), arr)
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return r == 0, time.time() - t0, log.value.decode(errors="replace").strip()


def main():
    archs = sys.argv[1:] or ["sm_90", "sm_80"]
    nv = ctypes.CDLL(find_nvrtc())
    major, minor = ctypes.c_int(), ctypes.c_int()
    nv.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    groups = group_sources()
    jobs = [(g, arch) for arch in archs for g in groups]
    failed = 0
    t0 = time.time()
    # nvrtc compiles one program per thread; ctypes lets go of the GIL during the call.
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        done = pool.map(lambda j: (j, compile_one(nv, j[0][0], j[0][1], j[0][2], j[1])), jobs)
        for ((label, _, _), arch), (ok, secs, text) in done:
            print(f"{'ok  ' if ok else 'FAIL'}  nvrtc {major.value}.{minor.value} {arch} {label:24} {secs:5.1f} s")
            if text:
                print(text[:20000])
            failed += not ok
    print(f"{len(jobs)} compiles in {time.time() - t0:.0f} s")
    sys.exit(1 if failed else 0)


main()
