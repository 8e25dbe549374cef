use std::arch::x86_64::*;

/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// e^x for 8 lanes by Arm's vector expf algorithm (see [`super::exp_arm`], which is the
/// same arithmetic one lane at a time): within 1.5 ulp + 0.5; below about -104 (-inf
/// included) 0, above about 88.4 +inf.
///
/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_ps(x: __m256) -> __m256 {
    use super::exp_arm_consts as c;
    let shift = _mm256_set1_ps(c::SHIFT);
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(c::INV_LN2), shift);
    let n = _mm256_sub_ps(z, shift);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::LN2_LO), r);
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let scale = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f80_0000)));
    let absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps::<_CMP_GT_OQ>(absn, _mm256_set1_ps(126.0));
    let r2 = _mm256_mul_ps(r, r);
    let p = _mm256_fmadd_ps(_mm256_set1_ps(c::C[0]), r, _mm256_set1_ps(c::C[1]));
    let q = _mm256_fmadd_ps(_mm256_set1_ps(c::C[2]), r, _mm256_set1_ps(c::C[3]));
    let q = _mm256_fmadd_ps(p, r2, q);
    let poly = _mm256_fmadd_ps(q, r2, _mm256_mul_ps(_mm256_set1_ps(c::C[4]), r));
    let plain = _mm256_fmadd_ps(poly, scale, scale);
    if _mm256_movemask_ps(big) == 0 {
        return plain;
    }
    // Lanes with n < -150 give +0 on every path below (2^n·(1 + poly) is under half the least
    // subnormal): set so, without the multiplies that would underflow. On Intel cores each
    // underflowing multiply is a microcode assist of ~150 cycles, and a softmax row over masked
    // keys or scores far below its maximum is full of them (a prompt's flash attention ran 14x
    // slower per key on Sapphire Rapids than on Zen 4). Lanes not needing the split scaling get
    // 1.0 factors for the same reason; their results are blended away.
    let zero = _mm256_cmp_ps::<_CMP_LT_OQ>(n, _mm256_set1_ps(-150.5));
    let need = _mm256_andnot_ps(zero, big);
    if _mm256_movemask_ps(need) == 0 {
        return _mm256_andnot_ps(zero, plain);
    }
    // 2^n out of the exponent's range: scale in two factors s1·s2.
    let b = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let one = _mm256_set1_ps(1.0);
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(b, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, b));
    let (s1, s2) = (
        _mm256_blendv_ps(one, s1, need),
        _mm256_blendv_ps(one, s2, need),
    );
    let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(absn, _mm256_set1_ps(192.0));
    let split = _mm256_mul_ps(_mm256_fmadd_ps(poly, s2, s2), s1);
    let v = _mm256_blendv_ps(plain, split, big);
    _mm256_andnot_ps(zero, _mm256_blendv_ps(v, _mm256_mul_ps(s1, s1), huge))
}

/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
/// `x.len()` must be a multiple of 8 and `y` at least as long as `x`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_exp_groups(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    let mut sum = 0f64;
    let m = _mm256_set1_ps(max);
    for i in (0..x.len()).step_by(8) {
        let v = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
        _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
        sum += hsum(v) as f64;
    }
    sum
}

/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
/// `x.len()` must be a multiple of 8; `y` and `g` at least as long as `x`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu_groups(x: &[f32], g: Option<&[f32]>, y: &mut [f32]) {
    let one = _mm256_set1_ps(1.0);
    for i in (0..x.len()).step_by(8) {
        let xv = _mm256_loadu_ps(x.as_ptr().add(i));
        let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), xv));
        let mut s = _mm256_div_ps(xv, _mm256_add_ps(one, e));
        if let Some(g) = g {
            s = _mm256_mul_ps(s, _mm256_loadu_ps(g.as_ptr().add(i)));
        }
        _mm256_storeu_ps(y.as_mut_ptr().add(i), s);
    }
}

/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            *acc_k = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8 * k)),
                _mm256_loadu_ps(pb.add(i + 8 * k)),
                *acc_k,
            );
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i)),
            _mm256_loadu_ps(pb.add(i)),
            acc[0],
        );
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16_f32_avx2(a: &[u16], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i + 8 * k) as *const __m128i));
            *acc_k = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i + 8 * k)), *acc_k);
        }
        i += 32;
    }
    while i + 8 <= n {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
        acc[0] = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += half::f16::from_bits(a[i]).to_f32() * b[i];
        i += 1;
    }
    s
}

/// One accumulator over chunks of 8, then a horizontal sum: the order of ggml-cpu's
/// tinyBLAS F16 kernel (used for every F16 MUL_MAT whose length is a multiple of 8), so
/// attention scores agree with ggml's to the bit.
///
/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16_f16_avx2(a: &[u16], b: &[u16]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
        let y = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i) as *const __m128i));
        acc = _mm256_fmadd_ps(x, y, acc);
        i += 8;
    }
    let mut s = hsum(acc);
    while i < n {
        s += half::f16::from_bits(a[i]).to_f32() * half::f16::from_bits(b[i]).to_f32();
        i += 1;
    }
    s
}

/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16_f16_4acc_avx2(a: &[u16], b: &[u16]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i + 8 * k) as *const __m128i));
            let y = _mm256_cvtph_ps(_mm_loadu_si128(pb.add(i + 8 * k) as *const __m128i));
            *acc_k = _mm256_fmadd_ps(x, y, *acc_k);
        }
        i += 32;
    }
    let a02 = _mm256_add_ps(acc[0], acc[2]);
    let a13 = _mm256_add_ps(acc[1], acc[3]);
    let v = _mm256_add_ps(a02, a13);
    let t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    let mut s = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
    while i < n {
        s += (half::f16::from_bits(a[i]).to_f32() * half::f16::from_bits(b[i]).to_f32()) as f64;
        i += 1;
    }
    s as f32
}

/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_bf16_bf16_avx2(a: &[u16], b: &[u16]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            let h = _mm_loadu_si128(pa.add(i + 8 * k) as *const __m128i);
            let x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            let g = _mm_loadu_si128(pb.add(i + 8 * k) as *const __m128i);
            let y = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(g), 16));
            *acc_k = _mm256_fmadd_ps(x, y, *acc_k);
        }
        i += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    while i < n {
        s += f32::from_bits((a[i] as u32) << 16) * f32::from_bits((b[i] as u32) << 16);
        i += 1;
    }
    s
}

/// # Safety
/// The CPU must have AVX2 and FMA (F16C too for the f16 kernels); the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_bf16_f32_avx2(a: &[u16], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            let h = _mm_loadu_si128(pa.add(i + 8 * k) as *const __m128i);
            let x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            *acc_k = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i + 8 * k)), *acc_k);
        }
        i += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    while i < n {
        s += f32::from_bits((a[i] as u32) << 16) * b[i];
        i += 1;
    }
    s
}

// AVX-512 versions: one 512-bit register holds two of the AVX2 kernel's 256-bit
// accumulators (the same lanes over the same elements), and the final reduction combines
// them in the AVX2 kernel's order, so the results are the same to the bit.

/// The two 256-bit halves of `v`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C; the dispatchers in
/// `simd` check `level()` first.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn halves(v: __m512) -> (__m256, __m256) {
    (
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    )
}

/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C; the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dot_f32_avx512(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // [acc0 | acc1], [acc2 | acc3] of dot_f32_avx2.
    let mut z = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    while i + 32 <= n {
        for (k, z_k) in z.iter_mut().enumerate() {
            *z_k = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i + 16 * k)),
                _mm512_loadu_ps(pb.add(i + 16 * k)),
                *z_k,
            );
        }
        i += 32;
    }
    let ((mut a0, a1), (a2, a3)) = (halves(z[0]), halves(z[1]));
    while i + 8 <= n {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), a0);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C; the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dot_f16_f32_avx512(a: &[u16], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut z = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    while i + 32 <= n {
        for (k, z_k) in z.iter_mut().enumerate() {
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(pa.add(i + 16 * k) as *const __m256i));
            *z_k = _mm512_fmadd_ps(x, _mm512_loadu_ps(pb.add(i + 16 * k)), *z_k);
        }
        i += 32;
    }
    let ((mut a0, a1), (a2, a3)) = (halves(z[0]), halves(z[1]));
    while i + 8 <= n {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i)), a0);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    while i < n {
        s += half::f16::from_bits(a[i]).to_f32() * b[i];
        i += 1;
    }
    s
}

/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C; the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dot_f16_f16_4acc_avx512(a: &[u16], b: &[u16]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut z = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    while i + 32 <= n {
        for (k, z_k) in z.iter_mut().enumerate() {
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(pa.add(i + 16 * k) as *const __m256i));
            let y = _mm512_cvtph_ps(_mm256_loadu_si256(pb.add(i + 16 * k) as *const __m256i));
            *z_k = _mm512_fmadd_ps(x, y, *z_k);
        }
        i += 32;
    }
    // [acc0 + acc2 | acc1 + acc3], then their sum: the AVX2 kernel's a02 + a13.
    let (a02, a13) = halves(_mm512_add_ps(z[0], z[1]));
    let v = _mm256_add_ps(a02, a13);
    let t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    let mut s = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
    while i < n {
        s += (half::f16::from_bits(a[i]).to_f32() * half::f16::from_bits(b[i]).to_f32()) as f64;
        i += 1;
    }
    s as f32
}

/// 16 bf16 as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn bf16x16(p: *const u16) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
        _mm256_loadu_si256(p as *const __m256i),
    )))
}

/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C; the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dot_bf16_bf16_avx512(a: &[u16], b: &[u16]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // [acc0 | acc1] of dot_bf16_bf16_avx2.
    let mut z = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        z = _mm512_fmadd_ps(bf16x16(pa.add(i)), bf16x16(pb.add(i)), z);
        i += 16;
    }
    let (a0, a1) = halves(z);
    let mut s = hsum(_mm256_add_ps(a0, a1));
    while i < n {
        s += f32::from_bits((a[i] as u32) << 16) * f32::from_bits((b[i] as u32) << 16);
        i += 1;
    }
    s
}

/// # Safety
/// The CPU must have AVX-512 F, BW and VL besides AVX2, FMA and F16C; the dispatchers in
/// `simd` check `level()` first.
/// `b` must be at least as long as `a`: the vector loop reads `b` up to `a.len()`
/// unchecked.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dot_bf16_f32_avx512(a: &[u16], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut z = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        z = _mm512_fmadd_ps(bf16x16(pa.add(i)), _mm512_loadu_ps(pb.add(i)), z);
        i += 16;
    }
    let (a0, a1) = halves(z);
    let mut s = hsum(_mm256_add_ps(a0, a1));
    while i < n {
        s += f32::from_bits((a[i] as u32) << 16) * b[i];
        i += 1;
    }
    s
}
