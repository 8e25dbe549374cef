#!/usr/bin/env python3
"""Compiles the GPU kernels as the library does on NVIDIA (the program text comes from the
library itself: src/gpu/kernels.rs's program_source(), written out by the ignored unit test
write_program_source) with an nvrtc found here, for the architectures given (default sm_90
sm_80), and reports errors. No GPU is needed; exit 2 (skipped) when no nvrtc can be had.
nvrtc: $NVRTC_LIB, or the pip wheel nvidia-cuda-nvrtc-cu12 under $NVRTC_DIR (default .nvrtc/,
fetched with pip download when missing)."""
import ctypes, glob, os, subprocess, sys, tempfile, time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def program_source():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rocmforge.hip")
        env = dict(os.environ, ROCMFORGE_KERNEL_SOURCE_OUT=out)
        subprocess.check_call([os.environ.get("CARGO", "cargo"), "test", "-q", "--release", "--lib", "gpu::kernels::tests::write_program_source",
                               "--", "--ignored", "--exact"], cwd=root, env=env, stdout=subprocess.DEVNULL)
        with open(out, "rb") as f:
            return f.read()


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


def main():
    archs = sys.argv[1:] or ["sm_90", "sm_80"]
    nv = ctypes.CDLL(find_nvrtc())
    major, minor = ctypes.c_int(), ctypes.c_int()
    nv.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    src = program_source()
    failed = 0
    for arch in archs:
        t0 = time.time()
        prog = ctypes.c_void_p()
        assert nv.nvrtcCreateProgram(ctypes.byref(prog), src, b"rocmforge.hip", 0, None, None) == 0
        opts = [f"--gpu-architecture={arch}".encode(), b"-DRF_WARP_SIZE=32"]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        r = nv.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace").strip()
        print(f"{'ok  ' if r == 0 else 'FAIL'}  nvrtc {major.value}.{minor.value} {arch} ({time.time() - t0:.0f} s)")
        if text:
            print(text[:20000])
        failed += r != 0
        nv.nvrtcDestroyProgram(ctypes.byref(prog))
    sys.exit(1 if failed else 0)


main()
