//! TQ1_0 (ternary, from BitNet-style models): super-blocks of 256 values packed in base 3,
//! 48 bytes of 5 trits each, 4 bytes of 4 trits each, then one f16 scale (54 bytes);
//! x = d * (t - 1) with t in 0..=2. A byte holding trits t0..t4 (t0 most significant) stores
//! ceil(v * 256 / 243) for v = sum of t_i * 3^(4 - i), so trit l is the top base-3 digit of
//! byte * 3^l (mod 256): ((byte * 3^l mod 256) * 3) >> 8. Element order: trit l of qs[m] for
//! m < 32 is element l * 32 + m; of qs[32 + m] (m < 16) element 160 + l * 16 + m; of qh[j]
//! element 240 + l * 4 + j. Multiplied with Q8_K (ggml-cpu's vec_dot_type for it). No
//! quantizer: CPY and SET_ROWS into TQ1_0 are not claimed (weights only, as TQ2_0).

use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockTq1_0 {
    pub qs: [u8; 48],
    pub qh: [u8; 4],
    pub d: u16,
}
const _: () = assert!(size_of::<BlockTq1_0>() == 54);

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `l` (0..=2) of a packed byte.
#[inline]
fn trit(byte: u8, l: usize) -> i32 {
    ((byte.wrapping_mul(POW3[l]) as u32 * 3) >> 8) as i32
}

/// Element `k` of a block's trits (0..=2).
#[inline]
fn code(b: &BlockTq1_0, k: usize) -> i32 {
    if k < 160 {
        trit(b.qs[k % 32], k / 32)
    } else if k < 240 {
        trit(b.qs[32 + (k - 160) % 16], (k - 160) / 16)
    } else {
        trit(b.qh[(k - 240) % 4], (k - 240) / 4)
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of TQ1_0 (54 bytes each), aligned
/// to 2 bytes.
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockTq1_0;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d);
        for (k, o) in out.iter_mut().enumerate() {
            *o = (code(b, k) - 1) as f32 * d;
        }
    }
}

/// ggml's portable order: per super-block the exact integer dot times dx * dy, summed in one f32.
///
/// # Safety
/// `x` must point to `n / QK_K` readable blocks of TQ1_0 (54 bytes each, aligned to 2) and `y`
/// to `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockTq1_0, y as *const BlockQ8K);
    let mut sum = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let mut sumi = 0i32;
        for k in 0..QK_K {
            sumi += by.qs[k] as i32 * (code(bx, k) - 1);
        }
        sum += sumi as f32 * (f16_to_f32(bx.d) * by.d);
    }
    sum
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        return avx2::vec_dot;
    }
    let _ = use_avx2;
    vec_dot_ref
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
    use crate::cpu::quants::x86::*;
    use std::arch::x86_64::*;

    /// Trits of the 32 bytes of `b`, byte by byte, the power of 3 picking the trit given per
    /// 16-bit lane (the same for both bytes of a lane): even and odd bytes widened to 16 bits,
    /// multiplied by the power, kept mod 256, times 3, top byte taken.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn trits(b: __m256i, pow: __m256i) -> __m256i {
        let lo8 = _mm256_set1_epi16(0xff);
        let three = _mm256_set1_epi16(3);
        let top = |v: __m256i| {
            let q = _mm256_and_si256(_mm256_mullo_epi16(v, pow), lo8);
            _mm256_srli_epi16(_mm256_mullo_epi16(q, three), 8)
        };
        let even = top(_mm256_and_si256(b, lo8));
        let odd = top(_mm256_srli_epi16(b, 8));
        _mm256_or_si256(even, _mm256_slli_epi16(odd, 8))
    }

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: each trit (unsigned,
    /// 0..=2) times its activation in byte pairs, every pair in the same 16-bit lane as
    /// ggml's, summed as i16 (|sum| <= 8 * 2 * 2 * 128: no overflow), minus the activations'
    /// 16-value sums (the -1 of every trit), widened to 8 lanes of i32; per super-block one
    /// multiply-add by dy * dx per lane, lanes summed at the end.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockTq1_0, y as *const BlockQ8K);
        let pow = |lo: i16, hi: i16| _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
        let (p1, p3, p9, p27, p81) = (pow(1, 1), pow(3, 3), pow(9, 9), pow(27, 27), pow(81, 81));
        let (p01, p23) = (pow(1, 3), pow(9, 27));
        // Low half: trit 4 of qs[32..48]; high half: qh[j] * 3^l at byte 4 * l + j.
        let p45 = _mm256_set_epi16(27, 27, 9, 9, 3, 3, 1, 1, 81, 81, 81, 81, 81, 81, 81, 81);
        let mut acc = _mm256_setzero_ps();
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let yq = |o: usize| _mm256_loadu_si256(by.qs.as_ptr().add(o) as *const __m256i);
            let q = _mm256_loadu_si256(bx.qs.as_ptr() as *const __m256i);
            let tail = _mm_loadu_si128(bx.qs.as_ptr().add(32) as *const __m128i);
            let qh = _mm_set1_epi32(i32::from_le_bytes(bx.qh));
            let t2 = _mm256_set_m128i(tail, tail);
            let th = _mm256_set_m128i(qh, tail);
            let mut s = _mm256_maddubs_epi16(trits(q, p1), yq(0));
            for (l, p) in [p3, p9, p27, p81].into_iter().enumerate() {
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(trits(q, p), yq(32 * (l + 1))));
            }
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(trits(t2, p01), yq(160)));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(trits(t2, p23), yq(192)));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(trits(th, p45), yq(224)));
            let bsums = _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i);
            let s = _mm256_madd_epi16(_mm256_sub_epi16(s, bsums), _mm256_set1_epi16(1));
            let d = _mm256_set1_ps(by.d * f16(bx.d));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
        }
        hsum_f32(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Packs trits as the format defines: t0 most significant, v = sum t_i * 3^(n - 1 - i)
    /// (a 4-trit byte shifted up by one trit), stored as ceil(v * 256 / 243).
    fn pack(trits: &[u8]) -> u8 {
        let mut v = trits.iter().fold(0u32, |v, &t| v * 3 + t as u32);
        if trits.len() == 4 {
            v *= 3;
        }
        ((v * 256).div_ceil(243)) as u8
    }

    /// A block holding `want(k)` at element k, packed by the definition in the module doc.
    fn block(want: impl Fn(usize) -> u8, d: f32) -> BlockTq1_0 {
        let mut b = BlockTq1_0 {
            qs: [0; 48],
            qh: [0; 4],
            d: super::super::f32_to_f16(d),
        };
        for m in 0..32 {
            b.qs[m] = pack(&(0..5).map(|l| want(l * 32 + m)).collect::<Vec<_>>());
        }
        for m in 0..16 {
            b.qs[32 + m] = pack(&(0..5).map(|l| want(160 + l * 16 + m)).collect::<Vec<_>>());
        }
        for j in 0..4 {
            b.qh[j] = pack(&(0..4).map(|l| want(240 + l * 4 + j)).collect::<Vec<_>>());
        }
        b
    }

    /// Decoding by the format's definition, on blocks with every trit at every position.
    #[test]
    fn to_f32_by_definition() {
        for shift in 0..3 {
            let want = |k: usize| ((k * 7 + k / 5 + shift) % 3) as u8;
            let b = block(want, 0.25);
            let mut out = vec![0f32; QK_K];
            unsafe { to_f32(&b as *const BlockTq1_0 as *const u8, &mut out) };
            for (k, &o) in out.iter().enumerate() {
                assert_eq!(o, 0.25 * (want(k) as f32 - 1.0), "k={k}");
            }
        }
    }

    /// The dispatched (AVX2) dot and the scalar one approximate the product of the dequantized
    /// values, on raw random blocks against random and full-scale activations (Q8_K codes up to
    /// ±127, where the i16 sums come closest to overflowing). Both sum each block's exact
    /// integer dot, so the AVX2 lanes may differ from the scalar order only in rounding.
    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let dots = [vec_dot_fn(), vec_dot_ref as VecDot];
            let qx = raw_rows(GgmlType::TQ1_0, &[52], n, 1, nb as u32);
            let all_minus = vec![-1.0; n];
            check_dots_dequantized(
                &qx,
                n,
                to_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                &dots,
                &[all_minus],
                nb as u32,
            );
        }
    }

    /// With scales that make every product exact (Q8_K's d set to 1, TQ1_0's to 0.5), both
    /// orders give the exact integer dot, so the AVX2 dot must equal the scalar one to the bit
    /// (catches a trit read from the wrong byte or power, which the tolerance above could hide).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_equals_scalar_with_exact_scales() {
        if !use_avx2() {
            return;
        }
        for seed in 1..40u32 {
            let n = (seed as usize % 3 + 1) * QK_K;
            let mut qx = raw_rows(GgmlType::TQ1_0, &[52], n, 1, seed);
            for block in qx.chunks_exact_mut(54) {
                block[52..54].copy_from_slice(&super::super::f32_to_f16(0.5).to_le_bytes());
            }
            let mut qy = quantize(GgmlType::Q8_K, q8_k::from_f32, &data(n, seed + 500));
            for block in qy.chunks_exact_mut(292) {
                block[0..4].copy_from_slice(&1f32.to_le_bytes());
            }
            let want = unsafe { vec_dot_ref(n, qx.as_ptr(), qy.as_ptr()) };
            let got = unsafe { avx2::vec_dot(n, qx.as_ptr(), qy.as_ptr()) };
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "seed {seed}: {got} vs {want}"
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_dispatched() {
        if use_avx2() {
            assert_eq!(vec_dot_fn() as usize, avx2::vec_dot as VecDot as usize);
        }
    }
}
