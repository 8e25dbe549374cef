use std::arch::x86_64::*;

const AMD: [u32; 3] = [0x6874_7541, 0x6974_6e65, 0x444d_4163]; // "AuthenticAMD"
const HYGON: [u32; 3] = [0x6f67_7948, 0x6e65_476e, 0x656e_6975]; // "HygonGenuine"
const INTEL: [u32; 3] = [0x756e_6547, 0x4965_6e69, 0x6c65_746e]; // "GenuineIntel"

/// CPUID leaf 0's vendor words (ebx, edx, ecx) and leaf 1's eax (family, model, stepping),
/// read once: kernels ask per product, and in a VM each `cpuid` traps to the hypervisor.
fn cpu_id() -> ([u32; 3], u32) {
    static ID: once_cell::sync::Lazy<([u32; 3], u32)> = once_cell::sync::Lazy::new(|| {
        let (v, f) = (__cpuid(0), __cpuid(1));
        ([v.ebx, v.edx, v.ecx], f.eax)
    });
    *ID
}

/// The CPU's vendor is Intel.
pub fn is_intel() -> bool {
    cpu_id().0 == INTEL
}

/// Whether BMI2's `pdep` is present and fast: one cycle on Intel (Haswell on) and AMD Zen 3
/// on; microcoded (hundreds of cycles) on AMD's and Hygon's earlier families (below 0x19).
pub fn fast_pdep() -> bool {
    static FAST: once_cell::sync::Lazy<bool> = once_cell::sync::Lazy::new(|| {
        let (vendor, eax) = cpu_id();
        is_x86_feature_detected!("bmi2") && pdep_is_fast(vendor, eax)
    });
    *FAST
}

/// `pdep`'s speed from CPUID: the vendor string's words and leaf 1's eax.
fn pdep_is_fast(vendor: [u32; 3], eax: u32) -> bool {
    let amd = vendor == AMD || vendor == HYGON;
    // The family: the base field, plus the extended one where the base is 0xf.
    let base = eax >> 8 & 0xf;
    let family = base + if base == 0xf { eax >> 20 & 0xff } else { 0 };
    !amd || family >= 0x19
}

/// Converts a 32-bit pair of f16 to 4 lanes [a, b, 0, 0]. Going through a general register
/// matters: a 16-bit insert (what LLVM emits for one half) merges into whatever register it
/// picks, often a loop accumulator, which chains every iteration onto the previous one.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_pair(bits: u32) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
}

/// `f16(a) * f16(b)`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_mul(a: u16, b: u16) -> f32 {
    let v = f16_pair(a as u32 | (b as u32) << 16);
    _mm_cvtss_f32(_mm_mul_ss(v, _mm_movehdup_ps(v)))
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16(h: u16) -> f32 {
    _mm_cvtss_f32(f16_pair(h as u32))
}

/// The 4 values as one vector (element 0 lowest), built in registers: a 32-byte load of values
/// just stored to memory waits for the stores to retire (no store forwarding).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn set_u64x4(v: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(v[3] as i64, v[2] as i64, v[1] as i64, v[0] as i64)
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn hsum_f32(v: __m256) -> f32 {
    crate::cpu::simd::x86::hsum(v)
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn hsum_i32(v: __m256i) -> i32 {
    hsum_i32_x4(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256(v, 1),
    ))
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn hsum_i32_x4(s: __m128i) -> i32 {
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
    _mm_cvtsi128_si32(s)
}

/// Quantizes 32 floats to i8 the way ggml-cpu's x86 `quantize_row_q8_0/1` do: multiplier
/// 127/amax, round half to even. Returns the scale amax/127 and the sum of the codes.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
/// `x` must be readable for 32 f32 and `qs` writable for 32 bytes (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_block_i8(x: *const f32, qs: *mut i8) -> (f32, i32) {
    let v = [
        _mm256_loadu_ps(x),
        _mm256_loadu_ps(x.add(8)),
        _mm256_loadu_ps(x.add(16)),
        _mm256_loadu_ps(x.add(24)),
    ];
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_andnot_ps(sign, v[0]);
    for &vi in &v[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, vi));
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let q = v.map(|vi| {
        _mm256_cvtps_epi32(_mm256_round_ps(
            _mm256_mul_ps(vi, id),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        ))
    });
    let sum = hsum_i32(_mm256_add_epi32(
        _mm256_add_epi32(q[0], q[1]),
        _mm256_add_epi32(q[2], q[3]),
    ));
    // packs interleave 128-bit lanes; the permute puts the 32 codes back in order.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs as *mut __m256i, p);
    (amax / 127.0, sum)
}

/// Loads one f16 as f32 through a general register. Written as asm because LLVM, seeing
/// only 16 bits used, turns any plain load into a 16-bit insert that merges into (and so
/// waits for) whatever register it picks, often another row's accumulator.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
/// `p` must be readable for 2 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_load(p: *const u16) -> f32 {
    let v: __m128i;
    std::arch::asm!(
        "movzx {t:e}, word ptr [{p}]",
        "vmovd {v}, {t:e}",
        p = in(reg) p,
        t = out(reg) _,
        v = out(xmm_reg) v,
        options(pure, readonly, nostack, preserves_flags)
    );
    _mm_cvtss_f32(_mm_cvtph_ps(v))
}

/// Every f16 bit pattern as f32 (256 KiB, built on first use), as ggml-cpu's
/// `ggml_table_f32_f16`: where a kernel needs one scale per 32 values, one broadcast load from
/// the table costs less than a conversion (`f16_load`'s four instructions). The values are
/// F16C's, so results do not change.
pub fn f16_table() -> &'static [f32; 65536] {
    static TABLE: once_cell::sync::Lazy<Box<[f32; 65536]>> = once_cell::sync::Lazy::new(|| {
        let mut t = Box::new([0f32; 65536]);
        for (h, v) in t.iter_mut().enumerate() {
            *v = half::f16::from_bits(h as u16).to_f32();
        }
        t
    });
    &TABLE
}

/// Converts the low f16 pair of up to 4 32-bit words (words c ≥ C read as 0) to 8 lanes
/// [a0, b0, a1, b1, ..]. Built from whole words, so no 16-bit insert can tie the result
/// to an unrelated register (see `f16_pair`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_pairs<const C: usize>(word: impl Fn(usize) -> u32) -> __m256 {
    let w = |c: usize| if c < C { word(c) as i32 } else { 0 };
    _mm256_cvtph_ps(_mm_setr_epi32(w(0), w(1), w(2), w(3)))
}

/// 16 packed bytes → 32 bytes: the low nibbles, then the high nibbles.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
/// `p` must be readable for 16 bytes (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn nibbles(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// 32 bits → 32 bytes: byte j is 0xff where bit j is set, else 0.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn bits_to_bytes(bits: u32) -> __m256i {
    // Byte j gets a copy of source byte j / 8, then is tested against bit j % 8.
    let which = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let spread = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), which);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// Byte shuffles over 16 i16 scales (8 per 128-bit lane, the same 8 in both lanes): table
/// k puts scale 2k over the low 128 bits and scale 2k + 1 over the high ones, for formats
/// whose sub-blocks of 16 meet 32 activations per vector (Q2_K, Q3_K, Q6_K).
static SCALE_PAIRS: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut i = 0;
        while i < 16 {
            t[k][i] = (4 * k + (i & 1)) as u8;
            t[k][16 + i] = (4 * k + 2 + (i & 1)) as u8;
            i += 1;
        }
        k += 1;
    }
    t
};

/// Byte shuffles over 8 i16 scales (the same 8 in both 128-bit lanes): table j puts scale j
/// over the whole vector, for formats with sub-blocks of 32 (Q4_K, Q5_K).
static SCALE_BROADCASTS: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut j = 0;
    while j < 8 {
        let mut i = 0;
        while i < 32 {
            t[j][i] = (2 * j + (i & 1)) as u8;
            i += 1;
        }
        j += 1;
    }
    t
};

/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_pairs() -> [__m256i; 4] {
    SCALE_PAIRS.map(|p| _mm256_loadu_si256(p.as_ptr() as *const __m256i))
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_broadcasts() -> [__m256i; 8] {
    SCALE_BROADCASTS.map(|p| _mm256_loadu_si256(p.as_ptr() as *const __m256i))
}

/// Pairwise sums of u8 × i8 products, widened to 8 i32 lanes.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// Pairwise sums of i8 × i8 products (neither may be -128... x may; y only in [-127, 127]).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C (callers check `use_avx2()` first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    // maddubs needs one unsigned operand: move x's sign onto y.
    dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zen 1 and 2 (family 0x17) and Hygon's Dhyana (0x18) microcode `pdep`; Zen 3 and 4
    /// (0x19), Zen 5 (0x1a) and Intel do not.
    #[test]
    fn pdep_speed_by_family() {
        let (amd, hygon, intel) = (AMD, HYGON, INTEL);
        assert!(!pdep_is_fast(amd, 0x0080_0f12)); // Zen 1
        assert!(!pdep_is_fast(amd, 0x0083_0f10)); // Zen 2
        assert!(!pdep_is_fast(hygon, 0x0090_0f01)); // Dhyana
        assert!(pdep_is_fast(amd, 0x00a2_0f10)); // Zen 3
        assert!(pdep_is_fast(amd, 0x00a1_0f11)); // Zen 4
        assert!(pdep_is_fast(amd, 0x00b4_0f00)); // Zen 5
        assert!(pdep_is_fast(intel, 0x0003_06c3)); // Haswell
        assert!(pdep_is_fast(intel, 0x0006_06a6)); // Ice Lake server
    }

    /// The table holds F16C's conversion of every bit pattern (NaN payloads included), so a
    /// kernel may take either.
    #[test]
    fn f16_table_is_f16c() {
        if !crate::cpu::quants::use_avx2() {
            return;
        }
        let t = f16_table();
        for h in 0..=u16::MAX {
            let want = unsafe { f16(h) };
            assert_eq!(t[h as usize].to_bits(), want.to_bits(), "f16 bits {h:#06x}");
        }
    }
}
