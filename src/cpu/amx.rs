//! Whether RFCPU may run AMX tile instructions (`amx-int8`, Sapphire Rapids and later), decided
//! once: the CPU reports AMX-TILE and AMX-INT8 (CPUID leaf 7), the OS saves the tile state
//! (XCR0 bits 17 and 18), Linux grants this process the tile data
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), and a
//! probe (`ldtilecfg`, `tilezero`, `tilerelease`) runs. The probe runs under a temporary SIGILL
//! handler that skips it when it faults: a hypervisor can report AMX and still trap its
//! instructions (ggml's own AMX build once died there with an illegal instruction), and then
//! RFCPU falls back to the VNNI panels instead. One log line says which and why.

use std::sync::OnceLock;

/// Whether the AMX kernels can run here (the first call detects and logs).
pub fn available() -> bool {
    detected().is_ok()
}

/// Whether RFCPU's products use them: only with ROCMFORGE_CPU_AMX=1. On the H100 machine's
/// Sapphire Rapids host (2026-11-26) the AMX kernel ran 33-38 G MAC/s a core against the VNNI
/// panels' 93, and an 8B-shaped Q4_0 prompt at 16 threads 211 t/s against 661: each 32-value
/// block's 16 x 16 int32 tile goes through memory into f32 accumulators that do not fit the
/// registers (docs/cpu.md).
pub fn used() -> bool {
    crate::tuning::get().cpu_amx && available()
}

/// `Ok` when AMX is usable, else why not.
pub fn detected() -> &'static Result<(), String> {
    static AMX: OnceLock<Result<(), String>> = OnceLock::new();
    AMX.get_or_init(|| {
        let r = detect();
        match &r {
            Ok(()) if crate::tuning::get().cpu_amx => {
                crate::log_info!("RFCPU: AMX (amx-int8) tiles used for prompt products")
            }
            Ok(()) => crate::log_info!(
                "RFCPU: AMX (amx-int8) usable, not used (ROCMFORGE_CPU_AMX=1 uses it; slower than the VNNI panels)"
            ),
            Err(why) => crate::log_info!("RFCPU: AMX not used: {why}"),
        }
        r
    })
}

fn detect() -> Result<(), String> {
    imp::detect()
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    pub fn detect() -> Result<(), String> {
        Err("not x86-64 Linux".into())
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::arch::asm;
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;

    pub fn detect() -> Result<(), String> {
        // Leaf 7 only where the highest leaf allows.
        let (max, osxsave) = (__cpuid(0).eax, __cpuid(1).ecx & (1 << 27) != 0);
        let edx7 = if max >= 7 { __cpuid_count(7, 0).edx } else { 0 };
        if edx7 & (1 << 24) == 0 || edx7 & (1 << 25) == 0 {
            return Err("the CPU has no AMX-TILE / AMX-INT8".into());
        }
        if !osxsave {
            return Err("the OS does not enable XSAVE".into());
        }
        // SAFETY: XGETBV exists where OSXSAVE is set.
        let xcr0 = unsafe { xgetbv0() };
        if xcr0 & (3 << 17) != 3 << 17 {
            return Err(format!("XCR0 {xcr0:#x} lacks the tile state (bits 17, 18)"));
        }
        // SAFETY: a plain system call with integer arguments.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("arch_prctl(ARCH_REQ_XCOMP_PERM) refused: {e}"));
        }
        if !probe() {
            return Err("the probe instruction trapped (SIGILL): a VM hiding AMX?".into());
        }
        Ok(())
    }

    /// XCR0.
    ///
    /// # Safety
    /// The CPU must have XSAVE enabled by the OS (CPUID.1:ECX.OSXSAVE).
    unsafe fn xgetbv0() -> u64 {
        let (lo, hi): (u32, u32);
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack));
        ((hi as u64) << 32) | lo as u64
    }

    /// The probe's code range [start, end) (written by the probe before it runs its tile
    /// instructions), and whether a SIGILL landed inside it.
    static PROBE_AT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
    static TRAPPED: AtomicBool = AtomicBool::new(false);
    /// The handler that was installed before the probe's.
    static mut OLD: Option<libc::sigaction> = None;

    /// SIGILL handler while the probe runs: a fault inside the probe's code is recorded and
    /// skipped (RIP set to the probe's end); any other goes to the handler before it.
    extern "C" fn on_sigill(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO handler.
        unsafe {
            let uc = uc as *mut libc::ucontext_t;
            let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
            let (start, end) = (PROBE_AT[0].load(Relaxed), PROBE_AT[1].load(Relaxed));
            let at = *rip as usize;
            if start != 0 && (start..end).contains(&at) {
                TRAPPED.store(true, Relaxed);
                *rip = end as i64;
                return;
            }
            // Not ours: the previous handler, or (default or ignored) the default action once
            // this handler is gone and the instruction runs again.
            let old = (*std::ptr::addr_of!(OLD)).unwrap_or(std::mem::zeroed());
            let h = old.sa_sigaction;
            if h == libc::SIG_DFL || h == libc::SIG_IGN {
                libc::signal(libc::SIGILL, libc::SIG_DFL);
            } else if old.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(h);
                f(sig, info, uc as *mut libc::c_void);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                f(sig);
            }
        }
    }

    /// Runs `ldtilecfg` (palette 1, tile 0 of 1 row × 4 bytes), `tilezero tmm0`, `tilerelease`
    /// under `on_sigill`; false if they trapped.
    fn probe() -> bool {
        let mut cfg = [0u8; 64];
        cfg[0] = 1;
        cfg[16] = 4;
        cfg[48] = 1;
        // SAFETY: 64 bytes of config, two words of range.
        under_handler(|at| unsafe { run_probe(cfg.as_ptr(), at) })
    }

    /// Runs `f` (given where to store its code range) with `on_sigill` installed for SIGILL,
    /// then puts the previous handler back; false if `f` trapped inside its range.
    fn under_handler(f: impl FnOnce(*mut usize)) -> bool {
        TRAPPED.store(false, Relaxed);
        // SAFETY: the handler is a valid SA_SIGINFO handler; the old one is restored below.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigill as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGILL, &sa, &mut old) != 0 {
                return false;
            }
            *std::ptr::addr_of_mut!(OLD) = Some(old);
            f(PROBE_AT.as_ptr() as *mut usize);
            libc::sigaction(libc::SIGILL, &old, std::ptr::null_mut());
            PROBE_AT[0].store(0, Relaxed);
        }
        !TRAPPED.load(Relaxed)
    }

    /// The probe: stores the range of its tile instructions at `at[0..2]`, then runs them.
    ///
    /// # Safety
    /// `cfg` must point to 64 readable bytes, `at` to two writable words; a SIGILL handler
    /// must skip a fault inside the range (`on_sigill`) where AMX may trap.
    #[inline(never)]
    unsafe fn run_probe(cfg: *const u8, at: *mut usize) {
        asm!(
            "lea {t}, [rip + 2f]",
            "mov [{at}], {t}",
            "lea {t}, [rip + 3f]",
            "mov [{at} + 8], {t}",
            "2:",
            "ldtilecfg [{cfg}]",
            "tilezero tmm0",
            "tilerelease",
            "3:",
            at = in(reg) at,
            cfg = in(reg) cfg,
            t = out(reg) _,
            options(nostack),
        );
    }

    #[cfg(test)]
    mod tests {
        /// Whatever this CPU has, detection returns (an illegal instruction in the probe is
        /// skipped, not fatal) and a second call gives the cached answer.
        #[test]
        fn detection_returns() {
            let first = super::super::detected().clone();
            eprintln!("AMX: {first:?}");
            assert_eq!(&first, super::super::detected());
        }

        /// A trapping probe is skipped: `ud2` at the probe's place, under the same handler.
        #[test]
        fn a_trap_in_the_probe_is_skipped() {
            use super::*;
            unsafe fn ud2_probe(at: *mut usize) {
                asm!(
                    "lea {t}, [rip + 2f]",
                    "mov [{at}], {t}",
                    "lea {t}, [rip + 3f]",
                    "mov [{at} + 8], {t}",
                    "2:",
                    "ud2",
                    "3:",
                    at = in(reg) at,
                    t = out(reg) _,
                    options(nostack),
                );
            }
            // After the real probe (the OnceLock), so the two never share the statics.
            let _ = super::super::detected();
            let ran = under_handler(|at| unsafe { ud2_probe(at) });
            assert!(!ran, "the ud2 did not trap");
        }
    }
}
