//! How far ahead the generation kernels over repacked weight groups prefetch their stream
//! (ROCMFORGE_CPU_PREFETCH). A token reads each weight byte once; one core's reads then wait on
//! memory latency, and on Intel server parts (a mesh, ~110 ns) the hardware prefetchers leave
//! a core at ~7 GB/s: 8B-shaped Q4_0 generation on a 16-core Sapphire Rapids went from 26-27 to
//! 34-35 t/s at 4 threads and from 73-78 to 92-99 at 16 with 3 KiB, Q4_K from 23-24 to 27-29 and
//! from 51-53 to 54-59 (distances 1-8 KiB swept; docs/performance.md, 2026-11-26). On Zen 4 the
//! hardware prefetchers keep up (2 threads: 85 t/s with and without).

use once_cell::sync::Lazy;

/// Bytes ahead of the current block; 0: no software prefetch.
pub fn distance() -> usize {
    static D: Lazy<usize> = Lazy::new(|| {
        crate::tuning::get()
            .cpu_prefetch
            .unwrap_or(if is_intel() { 3072 } else { 0 })
    });
    *D
}

/// The CPU's vendor is Intel (`x86::is_intel`; false off x86-64).
pub(crate) fn is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::cpu::quants::x86::is_intel();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Prefetches the cache lines of [p, p + len) into L1 (a hint: no fault past the mapping).
///
/// # Safety
/// None beyond the pointer arithmetic staying in the address space; nothing is read.
#[inline(always)]
pub unsafe fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let mut off = 0;
        while off < len {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

#[cfg(test)]
mod tests {
    /// Prefetching lines past the end of an allocation (what the last groups of a matrix do)
    /// neither faults nor changes memory.
    #[test]
    fn prefetch_past_the_end_is_harmless() {
        let v = vec![7u8; 4096];
        unsafe { super::prefetch(v.as_ptr().wrapping_add(v.len() + 3072), 4096) };
        unsafe { super::prefetch(std::ptr::null::<u8>().wrapping_add(64), 640) };
        assert!(v.iter().all(|&b| b == 7));
    }
}
