//! The few AMX tile operations the AMX panel kernels use (`panel_amx.rs`), behind one trait
//! with two implementations: `Hw`, the instructions (`ldtilecfg`, `tilezero`, `tileloadd`,
//! `tdpbssd`, `tilestored`, `tilerelease`), and `Emu`, a plain Rust model of them. The kernels
//! are generic over the trait, so the code the emulator tests on any machine is the code that
//! runs the instructions on Sapphire Rapids.

/// Tile operations; tile numbers are constants (the instructions encode them).
pub trait Tiles {
    /// `ldtilecfg`: the 64-byte configuration at `cfg` (palette 1: byte 0; bytes per row of
    /// tile t as u16 at 16 + 2t; rows of tile t at 48 + t).
    ///
    /// # Safety
    /// `cfg` must be a valid palette-1 configuration; AMX must be usable (`amx::available`).
    unsafe fn config(&mut self, cfg: &[u8; 64]);
    /// `tilerelease`.
    ///
    /// # Safety
    /// As `config`.
    unsafe fn release(&mut self);
    /// `tilezero tmmT`.
    ///
    /// # Safety
    /// The tiles must be configured.
    unsafe fn zero<const T: u8>(&mut self);
    /// `tileloadd tmmT`: row i of the tile from `p + i · stride`.
    ///
    /// # Safety
    /// The tiles must be configured, each configured row's bytes readable.
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize);
    /// `tilestored`: row i of tmmT to `p + i · stride`.
    ///
    /// # Safety
    /// The tiles must be configured, each configured row's bytes writable.
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize);
    /// `tdpbssd tmmC, tmmA, tmmB`: C[m][n] += Σ_k Σ_{i<4} A[m][4k + i] · B[k][4n + i] (i8 × i8
    /// into i32).
    ///
    /// # Safety
    /// The tiles must be configured with matching shapes.
    unsafe fn dpbssd<const C: u8, const A: u8, const B: u8>(&mut self);
}

/// The instructions. Each thread configures its tiles before its share and releases them after.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub struct Hw;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
impl Tiles for Hw {
    #[inline(always)]
    unsafe fn config(&mut self, cfg: &[u8; 64]) {
        std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack, readonly));
    }
    #[inline(always)]
    unsafe fn release(&mut self) {
        std::arch::asm!("tilerelease", options(nostack));
    }
    #[inline(always)]
    unsafe fn zero<const T: u8>(&mut self) {
        std::arch::asm!("tilezero tmm{t}", t = const T, options(nostack));
    }
    #[inline(always)]
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize) {
        std::arch::asm!(
            "tileloadd tmm{t}, [{p} + {s}*1]",
            t = const T,
            p = in(reg) p,
            s = in(reg) stride,
            options(nostack, readonly)
        );
    }
    #[inline(always)]
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize) {
        std::arch::asm!(
            "tilestored [{p} + {s}*1], tmm{t}",
            t = const T,
            p = in(reg) p,
            s = in(reg) stride,
            options(nostack)
        );
    }
    #[inline(always)]
    unsafe fn dpbssd<const C: u8, const A: u8, const B: u8>(&mut self) {
        std::arch::asm!(
            "tdpbssd tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack)
        );
    }
}

/// The tile registers in memory, for tests on machines without AMX. Shapes are checked as the
/// instructions fault on them (a wrong configuration panics instead of computing garbage).
pub struct Emu {
    tile: [[u8; 1024]; 8],
    rows: [usize; 8],
    colsb: [usize; 8],
    configured: bool,
}

impl Default for Emu {
    fn default() -> Self {
        Emu {
            tile: [[0; 1024]; 8],
            rows: [0; 8],
            colsb: [0; 8],
            configured: false,
        }
    }
}

impl Emu {
    fn shape(&self, t: u8) -> (usize, usize) {
        assert!(self.configured, "tiles used unconfigured");
        (self.rows[t as usize], self.colsb[t as usize])
    }
}

impl Tiles for Emu {
    unsafe fn config(&mut self, cfg: &[u8; 64]) {
        assert_eq!(cfg[0], 1, "palette 1 only");
        for t in 0..8 {
            self.rows[t] = cfg[48 + t] as usize;
            self.colsb[t] = u16::from_le_bytes([cfg[16 + 2 * t], cfg[17 + 2 * t]]) as usize;
            assert!(self.rows[t] <= 16 && self.colsb[t] <= 64);
        }
        self.tile = [[0; 1024]; 8];
        self.configured = true;
    }
    unsafe fn release(&mut self) {
        *self = Emu::default();
    }
    unsafe fn zero<const T: u8>(&mut self) {
        self.shape(T);
        self.tile[T as usize] = [0; 1024];
    }
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        // The hardware zeroes what lies past the configured shape.
        let t = &mut self.tile[T as usize];
        *t = [0; 1024];
        for i in 0..rows {
            std::ptr::copy_nonoverlapping(p.add(i * stride), t[i * 64..].as_mut_ptr(), colsb);
        }
    }
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        let t = &self.tile[T as usize];
        for i in 0..rows {
            std::ptr::copy_nonoverlapping(t[i * 64..].as_ptr(), p.add(i * stride), colsb);
        }
    }
    unsafe fn dpbssd<const C: u8, const A: u8, const B: u8>(&mut self) {
        let ((cr, cc), (ar, ac), (br, bc)) = (self.shape(C), self.shape(A), self.shape(B));
        assert!(cr == ar && cc == bc && ac == 4 * br && cc % 4 == 0 && ac % 4 == 0);
        let (a, b) = (self.tile[A as usize], self.tile[B as usize]);
        let c = &mut self.tile[C as usize];
        for m in 0..cr {
            for n in 0..cc / 4 {
                let at = m * 64 + 4 * n;
                let mut s = i32::from_le_bytes(c[at..at + 4].try_into().unwrap());
                for k in 0..ac / 4 {
                    for i in 0..4 {
                        let x = a[m * 64 + 4 * k + i] as i8 as i32;
                        let y = b[k * 64 + 4 * n + i] as i8 as i32;
                        s = s.wrapping_add(x * y);
                    }
                }
                c[at..at + 4].copy_from_slice(&s.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The emulator's `tdpbssd` is the integer product of a 16 × 32 by 32 × 16 matrix given in
    /// VNNI layout, added to what C held; loads and stores follow their strides.
    #[test]
    fn emulated_dpbssd_is_a_matrix_product() {
        let mut cfg = [0u8; 64];
        cfg[0] = 1;
        for (t, rows, colsb) in [(0, 16, 64), (4, 16, 32), (5, 8, 64)] {
            cfg[16 + 2 * t] = colsb as u8;
            cfg[48 + t] = rows;
        }
        let a: Vec<i8> = (0..16 * 40)
            .map(|i| ((i * 37 + 11) % 255) as u8 as i8)
            .collect();
        let bm: Vec<i8> = (0..32 * 16)
            .map(|i| ((i * 53 + 7) % 251) as u8 as i8)
            .collect();
        // B in VNNI layout: row k, column n holds bm[4k..4k+4][n].
        let mut b = vec![0i8; 8 * 64];
        for k in 0..32 {
            for n in 0..16 {
                b[(k / 4) * 64 + 4 * n + k % 4] = bm[k * 16 + n];
            }
        }
        let mut c = vec![0i32; 16 * 20];
        let mut e = Emu::default();
        unsafe {
            e.config(&cfg);
            e.zero::<0>();
            // A rows 40 bytes apart (of which 32 are read), C rows 80 bytes apart.
            e.load::<4>(a.as_ptr() as *const u8, 40);
            e.load::<5>(b.as_ptr() as *const u8, 64);
            e.dpbssd::<0, 4, 5>();
            e.dpbssd::<0, 4, 5>();
            e.store::<0>(c.as_mut_ptr() as *mut u8, 80);
        }
        for m in 0..16 {
            for n in 0..16 {
                let want: i32 = (0..32)
                    .map(|k| a[m * 40 + k] as i32 * bm[k * 16 + n] as i32)
                    .sum();
                assert_eq!(c[m * 20 + n], 2 * want, "({m}, {n})");
            }
        }
    }
}
