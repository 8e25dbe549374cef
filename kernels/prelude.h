// rocmforge kernel prelude: the few things that differ between the three ways these kernels
// are compiled. Kernels are written once in HIP's dialect and include only this file.
//   - hiprtc  (AMD, at run time):  __HIPCC_RTC__ defined, HIP builtins need no header;
//   - hipcc   (AMD, offline check): needs <hip/hip_runtime.h>;
//   - nvrtc   (NVIDIA, at run time): __CUDACC_RTC__ defined, CUDA spellings.
// No vendor header beyond hip_runtime.h is used: fp16 conversions are done with the
// compiler's own instructions, so nvrtc needs no include path at all.
#ifndef ROCMFORGE_PRELUDE_H
#define ROCMFORGE_PRELUDE_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define RF_NVIDIA 1
#else
#define RF_AMD 1
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif
#endif

// Threads of a warp (NVIDIA) or wavefront (AMD). The run-time compiler passes the device's
// value with -DRF_WARP_SIZE=N; the offline check falls back to the compiler's own.
#ifndef RF_WARP_SIZE
#if defined(RF_NVIDIA)
#define RF_WARP_SIZE 32
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define RF_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define RF_WARP_SIZE 64
#endif
#endif

// Kernel groups (src/gpu/kernel_groups.rs): each group is compiled as a program of its own.
// RF_GROUP=1: a family's kernels of no tag; RF_GROUP=2 with RF_T_<tag>=1: one tag's kernels (a
// weight type, or a KV type and head size). Kernels are gated by `#if RF_UNTYPED` or
// `#if RF_ALL || RF_T_<tag>`; without RF_GROUP (the offline check of whole files) all compile.
#ifndef RF_GROUP
#define RF_GROUP 0
#endif
#define RF_ALL (RF_GROUP == 0)
#define RF_UNTYPED (RF_GROUP != 2)

#define RF_KERNEL extern "C" __global__
#define RF_DEVICE static __device__ __forceinline__
// Explicit template specializations may not repeat the storage class.
#define RF_DEVICE_SPEC __device__ __forceinline__

typedef long long i64;
typedef unsigned short f16_bits;

#if defined(RF_NVIDIA)
RF_DEVICE float rf_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
RF_DEVICE float rf_shfl(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
// IEEE half <-> float through the hardware conversion (round to nearest even).
RF_DEVICE float rf_f16_to_f32(f16_bits h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
RF_DEVICE f16_bits rf_f32_to_f16(float f) {
    f16_bits h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
RF_DEVICE float rf_neg_inf() { return __int_as_float(0xff800000); }
#else
RF_DEVICE float rf_shfl_xor(float v, int mask) { return __shfl_xor(v, mask); }
RF_DEVICE float rf_shfl(float v, int src) { return __shfl(v, src); }
RF_DEVICE float rf_f16_to_f32(f16_bits h) { return (float)__builtin_bit_cast(_Float16, h); }
RF_DEVICE f16_bits rf_f32_to_f16(float f) { return __builtin_bit_cast(f16_bits, (_Float16)f); }
RF_DEVICE float rf_neg_inf() { return -__builtin_huge_valf(); }
#endif

// Byte i of the 8-byte value (hi << 32 | lo) at the selector in byte i of sel (each 0..7): one
// byte-permute instruction (NVIDIA prmt, whose selectors are nibbles; AMD v_perm_b32).
#if defined(RF_NVIDIA)
RF_DEVICE unsigned rf_perm8(unsigned lo, unsigned hi, unsigned sel) {
    const unsigned nib = (sel & 7u) | ((sel >> 4) & 0x70u) | ((sel >> 8) & 0x700u) | ((sel >> 12) & 0x7000u);
    return __byte_perm(lo, hi, nib);
}
#else
RF_DEVICE unsigned rf_perm8(unsigned lo, unsigned hi, unsigned sel) { return __builtin_amdgcn_perm(hi, lo, sel); }
#endif

// dot of four signed bytes of a with four of b, plus c (int8 dot-product instructions where
// the chip has them: dp4a on NVIDIA sm_61+, v_dot4 on CDNA/RDNA2 (sdot4) and RDNA3+ (sudot4)).
#if defined(RF_NVIDIA)
RF_DEVICE int rf_dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
#elif defined(__gfx11__) || defined(__gfx12__) || defined(__GFX11__) || defined(__GFX12__)
RF_DEVICE int rf_dp4a(int a, int b, int c) { return __builtin_amdgcn_sudot4(true, a, true, b, c, false); }
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__) || defined(__gfx1030__) ||    \
    defined(__gfx1031__) || defined(__gfx1032__) || defined(__gfx1034__) || defined(__gfx1035__) ||  \
    defined(__gfx1036__)
RF_DEVICE int rf_dp4a(int a, int b, int c) { return __builtin_amdgcn_sdot4(a, b, c, false); }
#else
RF_DEVICE int rf_dp4a(int a, int b, int c) {
#pragma unroll
    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
}
#endif

// A float that another block of this launch wrote (read after the atomic that says it is
// there): from L2, past L1, which is not coherent between blocks. NVIDIA: ld.global.cg (a
// volatile load is a system-scope one there); AMD: a volatile load (glc).
#if defined(RF_NVIDIA)
RF_DEVICE float rf_load_l2(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}
#else
RF_DEVICE float rf_load_l2(const float* p) { return *(const volatile float*)p; }
#endif

// ALiBi: the slope of head h's mask (ggml's soft_max / flash_attn_ext: m0 for the first
// n_head_log2 heads, m1 for the rest); 1 without ALiBi (max_bias 0).
RF_DEVICE float rf_alibi_slope(i64 h, float max_bias, float m0, float m1, int n_head_log2) {
    if (max_bias <= 0.0f) return 1.0f;
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

// Sum / max over aligned groups of WIDTH lanes (a power of two up to the warp size): xor
// masks below WIDTH never leave the group. Every lane gets its group's result.
template <int WIDTH> RF_DEVICE float rf_group_sum(float v) {
#pragma unroll
    for (int m = WIDTH / 2; m > 0; m >>= 1) v += rf_shfl_xor(v, m);
    return v;
}

template <int WIDTH> RF_DEVICE float rf_group_max(float v) {
#pragma unroll
    for (int m = WIDTH / 2; m > 0; m >>= 1) v = fmaxf(v, rf_shfl_xor(v, m));
    return v;
}

// Sum over the threads of one warp; every lane gets the total.
RF_DEVICE float rf_warp_sum(float v) { return rf_group_sum<RF_WARP_SIZE>(v); }
RF_DEVICE float rf_warp_max(float v) { return rf_group_max<RF_WARP_SIZE>(v); }

// Block-wide reductions for blocks of up to 1024 threads (a multiple of the warp size).
// `scratch` holds one float per warp; every thread gets the result.
RF_DEVICE float rf_block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % RF_WARP_SIZE, warp = threadIdx.x / RF_WARP_SIZE;
    const int nwarps = blockDim.x / RF_WARP_SIZE;
    v = rf_warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return rf_warp_sum(v);
}

RF_DEVICE float rf_block_max(float v, float* scratch) {
    const int lane = threadIdx.x % RF_WARP_SIZE, warp = threadIdx.x / RF_WARP_SIZE;
    const int nwarps = blockDim.x / RF_WARP_SIZE;
    v = rf_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : rf_neg_inf();
    return rf_warp_max(v);
}

// Most warps a block can hold (1024 threads / 32).
#define RF_MAX_WARPS 32

// Programmatic dependent launch (NVIDIA sm_90+; the host launches with it where the driver
// has it): a kernel may start while the one before it in the stream is still running, so
// every kernel begins with rf_grid_begin(): it waits until the kernel before has finished
// and its writes are visible, then lets the next kernel start launching (its blocks wait in
// their own rf_grid_begin, so at most one kernel waits behind the running one). Nothing may
// be read or written before it (a unit test checks that it is each kernel's first
// statement). Elsewhere it is nothing. RF_PDL_TRIGGER (for measuring builds, through
// ROCMFORGE_GPU_DEFINES="-DRF_PDL_TRIGGER=N"):
// 1 = release after the wait (default), 0 = only when this kernel's blocks exit, 2 = before
// the wait (every later kernel may launch and wait).
#ifndef RF_PDL_TRIGGER
#define RF_PDL_TRIGGER 1
#endif
RF_DEVICE void rf_grid_begin();

// Starts pulling bytes [p, p + bytes) into L2 (sm_90 bulk prefetch by the block's first
// thread; a hint; elsewhere nothing). Every access meets in L2, so a prefetch never makes
// stale data visible: a kernel may issue it before rf_grid_begin() for what it will read
// (weights, mostly), so that those bytes come from memory while the kernel before still runs.
// Before rf_grid_begin() only addresses computed from the kernel's arguments may be used
// (helpers named *_prefetch_l2; the unit test allows those alone there).
#ifndef RF_L2_PREFETCH
#define RF_L2_PREFETCH 1
#endif
RF_DEVICE void rf_prefetch_l2(const void* p, i64 bytes) {
#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && RF_L2_PREFETCH
    if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0 || bytes <= 0) return;
    // The instruction takes 16-byte aligned addresses and sizes: whole 16-byte pieces inside.
    unsigned long long a = ((unsigned long long)p + 15) & ~15ull;
    const unsigned long long e = ((unsigned long long)p + (unsigned long long)bytes) & ~15ull;
    while (a < e) {
        const unsigned int n = e - a < (1ull << 20) ? (unsigned int)(e - a) : (1u << 20);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
        a += n;
    }
#else
    (void)p;
    (void)bytes;
#endif
}

RF_DEVICE void rf_grid_begin() {
#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if RF_PDL_TRIGGER == 2
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    asm volatile("griddepcontrol.wait;" ::: "memory");
#if RF_PDL_TRIGGER == 1
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#endif
}

#endif
