//! IQ1_M (1.75 bits per value): super-blocks of 256 values, 32 index bytes, 16 bytes of
//! per-group high bits (a nibble per group of 8 values: 3 index bits, 11-bit indices into
//! `IQ1S_GRID`, 8 values in {-1, 0, 1}, and the sign of the group's shift), then 4 u16 of
//! 3-bit scales s, one per half sub-block of 16 values (four per u16), whose top nibbles hold
//! the f16 super-block scale `d`; x = d * (2s + 1) * (g ± 1/8). Multiplied with Q8_K (ggml-cpu's
//! vec_dot_type for it). Weight-only: no quantizer, so CPY and SET_ROWS into it are not
//! claimed.

use super::grids::IQ1S_GRID;
use super::q8_k::BlockQ8K;
use super::{f16_to_f32, use_avx2, QK_K};
use crate::cpu::types::VecDot;

/// The shift's magnitude (ggml's IQ1M_DELTA).
const DELTA: f32 = 0.125;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct BlockIq1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq1M>() == 56);

impl BlockIq1M {
    #[inline(always)]
    fn sc(&self, k: usize) -> u16 {
        u16::from_le_bytes([self.scales[2 * k], self.scales[2 * k + 1]])
    }

    /// The f16 bits of the super-block scale, from the top nibbles of the 4 scale words.
    #[inline(always)]
    pub fn d(&self) -> u16 {
        (self.sc(0) >> 12)
            | ((self.sc(1) >> 8) & 0x00f0)
            | ((self.sc(2) >> 4) & 0x0f00)
            | (self.sc(3) & 0xf000)
    }

    /// Group `l` (0..4) of sub-block `ib`: 8 values in {-1, 0, 1}, one per byte.
    #[inline(always)]
    fn grid(&self, ib: usize, l: usize) -> u64 {
        let h = (self.qh[2 * ib + l / 2] as usize) << (8 - 4 * (l % 2)) & 0x700;
        IQ1S_GRID[self.qs[4 * ib + l] as usize | h]
    }

    /// The shift sign of group `l` of sub-block `ib`, ±1.
    #[inline(always)]
    fn delta(&self, ib: usize, l: usize) -> i32 {
        if self.qh[2 * ib + l / 2] & (0x08 << (4 * (l % 2))) != 0 {
            -1
        } else {
            1
        }
    }

    /// The integer scale 2s + 1 of half `h` (values 16h..16h+15) of sub-block `ib`.
    #[inline(always)]
    fn ls(&self, ib: usize, h: usize) -> i32 {
        2 * ((self.sc(ib / 2) >> (6 * (ib % 2) + 3 * h)) & 7) as i32 + 1
    }
}

/// # Safety
/// `src` must point to `dst.len() / QK_K` readable blocks of IQ1_M (56 bytes each).
pub unsafe fn to_f32(src: *const u8, dst: &mut [f32]) {
    let blocks = src as *const BlockIq1M;
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b = &*blocks.add(i);
        let d = f16_to_f32(b.d());
        for (ib, o) in out.chunks_exact_mut(32).enumerate() {
            let dl = [d * b.ls(ib, 0) as f32, d * b.ls(ib, 1) as f32];
            for (k, v) in o.iter_mut().enumerate() {
                let l = k / 8;
                let g = (b.grid(ib, l) >> (8 * (k % 8))) as u8 as i8;
                *v = dl[k / 16] * (g as f32 + b.delta(ib, l) as f32 * DELTA);
            }
        }
    }
}

/// ggml's portable order: per super-block the integer dot with the grid and the integer sum
/// of the shift terms, each weighted by its half sub-block's 2s + 1, combined as
/// d * dy * (dot + sum / 8) and summed in one f32.
///
/// # Safety
/// `x` must point to `n / QK_K` readable blocks of IQ1_M (56 bytes each) and `y` to
/// `n / QK_K` blocks of Q8_K (292 bytes each, aligned to 4).
pub unsafe fn vec_dot_ref(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x as *const BlockIq1M, y as *const BlockQ8K);
    let mut sumf = 0f32;
    for i in 0..n / QK_K {
        let (bx, by) = (&*x.add(i), &*y.add(i));
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for ib in 0..QK_K / 32 {
            for h in 0..2 {
                let (mut sum1, mut sum2) = (0i32, 0i32);
                for l in 2 * h..2 * h + 2 {
                    let (mut lsum1, mut lsum2) = (0i32, 0i32);
                    for j in 0..8 {
                        let q8 = by.qs[32 * ib + 8 * l + j] as i32;
                        lsum1 += q8 * (bx.grid(ib, l) >> (8 * j)) as u8 as i8 as i32;
                        lsum2 += q8;
                    }
                    sum1 += lsum1;
                    sum2 += lsum2 * bx.delta(ib, l);
                }
                sumi1 += sum1 * bx.ls(ib, h);
                sumi2 += sum2 * bx.ls(ib, h);
            }
        }
        sumf += f16_to_f32(bx.d()) * by.d * (sumi1 as f32 + DELTA * sumi2 as f32);
    }
    sumf
}

pub fn vec_dot_fn() -> VecDot {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        if crate::cpu::quants::x86::fast_pdep() {
            return avx2::vec_dot_bmi2;
        }
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

    /// IQ1S_GRID with 1 added to every byte: the points as unsigned bytes {0, 1, 2}, so one
    /// `vpmaddubsw` with q8 gives the grid dot plus q8's pair sums (no sign operations).
    #[repr(C, align(64))]
    struct Grid1([u64; 2048]);
    static GRID1: Grid1 = Grid1({
        let mut t = [0u64; 2048];
        let mut i = 0;
        while i < 2048 {
            let mut b = 0;
            while b < 8 {
                let v = (IQ1S_GRID[i] >> (8 * b)) as u8;
                t[i] |= (v.wrapping_add(1) as u64) << (8 * b);
                b += 1;
            }
            i += 1;
        }
        t
    });

    /// One sub-block: the grid dot and the shift terms, each as 8 i32 lanes times the halves'
    /// 2s + 1 (`sc`: 8 × the first half's, 8 × the second's, as i16); `g`: the 4 points from
    /// GRID1; `neg`: all ones in the 64-bit lanes of the groups whose shift is negative.
    #[inline(always)]
    unsafe fn sub_block(
        g: __m256i,
        q8: *const i8,
        neg: __m256i,
        sc: __m256i,
    ) -> (__m256i, __m256i) {
        let y = _mm256_loadu_si256(q8 as *const __m256i);
        // (g + 1) · q8 - q8's pair sums = g · q8, pairs in i16 (|.| <= 2 · 2 · 127, exact).
        // Q8_K's quants are in [-127, 127] (its quantizer's range): there this equals ggml's
        // |g| · sign(q8, g), whose vpsignb would wrap only a -128.
        let s = _mm256_maddubs_epi16(_mm256_set1_epi8(1), y);
        let dot1 = _mm256_sub_epi16(_mm256_maddubs_epi16(g, y), s);
        // ±s: (s ^ m) - m.
        let dot2 = _mm256_sub_epi16(_mm256_xor_si256(s, neg), neg);
        (_mm256_madd_epi16(dot1, sc), _mm256_madd_epi16(dot2, sc))
    }

    /// The 8 points (from GRID1) of sub-blocks 2p and 2p + 1: each index's byte offset
    /// from its index byte and 3 high bits, in general registers (indices built in a vector
    /// and read back cost more: the extracts or a stalled store forwarding).
    #[inline(always)]
    unsafe fn points<const PDEP: bool>(bx: &BlockIq1M, p: usize) -> [u64; 8] {
        let grid = GRID1.0.as_ptr();
        let qs = bx.qs.as_ptr().add(8 * p);
        let qh = u32::from_le_bytes(bx.qh[4 * p..4 * p + 4].try_into().unwrap());
        if PDEP {
            // Four 16-bit indices per u64: the index bytes to the fields' low bytes, the 3
            // high bits of each nibble of qh above them.
            let q = u64::from_le_bytes(*(qs as *const [u8; 8]));
            let a = _pdep_u64(q, 0x00ff_00ff_00ff_00ff)
                | _pdep_u64(qh as u64 & 0x7777, 0x0f00_0f00_0f00_0f00);
            let b = _pdep_u64(q >> 32, 0x00ff_00ff_00ff_00ff)
                | _pdep_u64(qh as u64 >> 16 & 0x7777, 0x0f00_0f00_0f00_0f00);
            std::array::from_fn(|l| {
                let w = if l < 4 { a } else { b };
                *grid.add((w >> (16 * (l % 4))) as u16 as usize)
            })
        } else {
            std::array::from_fn(|l| {
                // Byte offset: index byte * 8 + the nibble's 3 high bits << 11.
                let hi = if l < 3 {
                    qh << (11 - 4 * l)
                } else {
                    qh >> (4 * l - 11)
                } & 0x3800;
                *((grid as *const u8).add(hi as usize + 8 * *qs.add(l) as usize) as *const u64)
            })
        }
    }

    /// Sub-blocks 2P and 2P + 1 into the super-block's lane sums.
    #[inline(always)]
    unsafe fn pair<const P: usize, const PDEP: bool>(
        bx: &BlockIq1M,
        q8: *const i8,
        scales: __m256i,
        sumi1: &mut __m256i,
        sumi2: &mut __m256i,
    ) {
        let qh = u32::from_le_bytes(bx.qh[4 * P..4 * P + 4].try_into().unwrap());
        let qhv = _mm256_set1_epi32(qh as i32);
        let g = points::<PDEP>(bx, P);
        for k in 0..2 {
            let g = _mm256_set_epi64x(
                g[4 * k + 3] as i64,
                g[4 * k + 2] as i64,
                g[4 * k + 1] as i64,
                g[4 * k] as i64,
            );
            // Group l's shift sign (qh bit 16k + 4l + 3) to the top of 64-bit lane l.
            let sh = 60 - 16 * k as i64;
            let top = _mm256_sllv_epi64(qhv, _mm256_setr_epi64x(sh, sh - 4, sh - 8, sh - 12));
            let neg = _mm256_cmpgt_epi64(_mm256_setzero_si256(), top);
            // Element 4k + P of each half of `scales` to all 8 of that half.
            let e = (k * 4 + P) as i16;
            let sc = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(((2 * e + 1) << 8) | (2 * e)));
            let (p1, p2) = sub_block(g, q8.add(32 * k), neg, sc);
            *sumi1 = _mm256_add_epi32(*sumi1, p1);
            *sumi2 = _mm256_add_epi32(*sumi2, p2);
        }
    }

    /// ggml-cpu's AVX2 order, so results agree with ggml's to the bit: the grid dot and the
    /// shift terms each in 8 i32 lanes (lane k: values 4k..4k+3 of every sub-block, times
    /// their 2s + 1; exact), each with one fused multiply-add by d * dy per lane per
    /// super-block; the grid lanes' sum plus 1/8 of the shift lanes' sum at the end.
    #[inline(always)]
    unsafe fn dot<const PDEP: bool>(n: usize, x: *const u8, y: *const u8) -> f32 {
        let (x, y) = (x as *const BlockIq1M, y as *const BlockQ8K);
        let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in 0..n / QK_K {
            let (bx, by) = (&*x.add(i), &*y.add(i));
            let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            // The 16 half sub-block scales 2s + 1 as i16, once per super-block: the 64-bit lanes
            // shift the 4 scale words by 0, 6, 3, 9 (even sub-blocks' first halves, odd ones',
            // then the second halves), so element w of a lane is sub-block 2w or 2w + 1's.
            let words = u64::from_le_bytes(bx.scales);
            let scales = _mm256_srlv_epi64(
                _mm256_set1_epi64x(words as i64),
                _mm256_setr_epi64x(0, 6, 3, 9),
            );
            let scales = _mm256_and_si256(scales, _mm256_set1_epi16(7));
            let scales = _mm256_or_si256(_mm256_slli_epi16::<1>(scales), _mm256_set1_epi16(1));
            let q8 = by.qs.as_ptr();
            pair::<0, PDEP>(bx, q8, scales, &mut sumi1, &mut sumi2);
            pair::<1, PDEP>(bx, q8.add(64), scales, &mut sumi1, &mut sumi2);
            pair::<2, PDEP>(bx, q8.add(128), scales, &mut sumi1, &mut sumi2);
            pair::<3, PDEP>(bx, q8.add(192), scales, &mut sumi1, &mut sumi2);
            let d = _mm256_set1_ps(by.d * f16(bx.d()));
            acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), acc1);
            acc2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), acc2);
        }
        hsum_f32(acc1) + DELTA * hsum_f32(acc2)
    }

    /// The indices by shifts, for CPUs without a fast `pdep`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x` must point to `n / QK_K` readable blocks of
    /// IQ1_M and `y` to as many of Q8_K.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(n: usize, x: *const u8, y: *const u8) -> f32 {
        dot::<false>(n, x, y)
    }

    /// The indices by BMI2 `pdep` (two for four indices; as ggml-cpu builds them).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C and BMI2; `x` must point to `n / QK_K` readable
    /// blocks of IQ1_M and `y` to as many of Q8_K.
    #[target_feature(enable = "avx2,fma,f16c,bmi2")]
    pub unsafe fn vec_dot_bmi2(n: usize, x: *const u8, y: *const u8) -> f32 {
        dot::<true>(n, x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::quants::{f32_to_f16, q8_k, testutil::*};
    use crate::ggml_types::GgmlType;

    /// Raw random IQ1_M rows whose scale (spread over the scale words' top nibbles) is a
    /// finite f16 in [-1, 1].
    pub fn raw_iq1_m(n: usize, seed: u32) -> Vec<u8> {
        let mut q = raw_rows(GgmlType::IQ1_M, &[], n, 1, seed);
        let mut next = xorshift(seed.wrapping_mul(31).max(1));
        for block in q.chunks_exact_mut(56) {
            let d = f32_to_f16((next() % 2001) as f32 / 1000.0 - 1.0);
            for k in 0..4 {
                let nib = ((d >> (4 * k)) & 0xf) as u8;
                block[48 + 2 * k + 1] = (block[48 + 2 * k + 1] & 0x0f) | nib << 4;
            }
        }
        q
    }

    /// Decoding by the format's definition, on a hand-made block: the scale spread over the
    /// top nibbles, 11-bit indices, two 3-bit scales and four shift signs per sub-block.
    #[test]
    fn dequantize_by_definition() {
        let mut b = BlockIq1M {
            qs: [0; 32],
            qh: [0; 16],
            scales: [0; 8],
        };
        let d = f32_to_f16(0.25);
        // Sub-block 3: indices 0x7ff, 0x3a5, 0x100, 0x0ff; shifts -, +, +, -; scales 6, 1.
        let idx = [0x7ffusize, 0x3a5, 0x100, 0x0ff];
        let neg = [true, false, false, true];
        for (l, i) in idx.iter().enumerate() {
            b.qs[12 + l] = *i as u8;
            let nib = (i >> 8) as u8 | if neg[l] { 8 } else { 0 };
            b.qh[6 + l / 2] |= nib << (4 * (l % 2));
        }
        // Scale word 1 holds sub-blocks 2 and 3: sub-block 3's scales at bits 6..11.
        let mut sc = [0u16; 4];
        sc[1] = (6 | 1 << 3) << 6;
        for (k, w) in sc.iter_mut().enumerate() {
            *w |= ((d >> (4 * k)) & 0xf) << 12;
            b.scales[2 * k..2 * k + 2].copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(b.d(), d);
        let mut out = vec![0f32; QK_K];
        unsafe { to_f32(&b as *const BlockIq1M as *const u8, &mut out) };
        for (l, i) in idx.iter().enumerate() {
            let dl = 0.25 * [13.0, 3.0][l / 2];
            let delta = if neg[l] { -0.125 } else { 0.125 };
            for j in 0..8 {
                let g = (IQ1S_GRID[*i] >> (8 * j)) as u8 as i8 as f32;
                assert_eq!(out[96 + 8 * l + j], dl * (g + delta), "l={l} j={j}");
            }
        }
    }

    #[test]
    fn vec_dot_matches_dequantized() {
        for nb in [1, 2, 3, 8] {
            let n = nb * QK_K;
            let qx = raw_iq1_m(n, nb as u32);
            check_dots_dequantized(
                &qx,
                n,
                to_f32,
                GgmlType::Q8_K,
                q8_k::from_f32,
                q8_k::to_f32,
                &[vec_dot_fn(), vec_dot_ref as VecDot],
                &[],
                nb as u32,
            );
        }
    }

    /// Raw Q8_K rows: random quants in [-127, 127] (the range Q8_K's quantizer, ggml's and
    /// ours, gives), a finite scale.
    fn raw_q8_k(n: usize, rows: usize, seed: u32) -> Vec<u8> {
        let mut next = xorshift(seed.wrapping_mul(0x2545_f491).max(1));
        let mut q: Vec<u8> = (0..GgmlType::Q8_K.row_size(n) * rows)
            .map(|_| ((next() % 255) as i32 - 127) as u8)
            .collect();
        for block in q.chunks_exact_mut(size_of::<BlockQ8K>()) {
            let d = (next() % 2001) as f32 / 1e5 - 0.01;
            block[..4].copy_from_slice(&d.to_le_bytes());
        }
        q
    }

    /// ggml-cpu's AVX2 arithmetic one lane at a time: per super-block 8 exact i32 lanes of the
    /// grid dot and of the shift terms (lane k: values 4k..4k+3 of each sub-block, times their
    /// half's 2s + 1), one fused multiply-add by d * dy per lane, the lanes summed as
    /// `hsum_f32` sums them, the shift sum weighted by 1/8.
    fn vec_dot_avx2_order(n: usize, x: &[u8], y: &[u8]) -> f32 {
        let hsum = |a: [f32; 8]| {
            let s: [f32; 4] = std::array::from_fn(|j| a[j] + a[j + 4]);
            (s[0] + s[2]) + (s[1] + s[3])
        };
        let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
        for i in 0..n / QK_K {
            let bx = unsafe { &*(x.as_ptr() as *const BlockIq1M).add(i) };
            let by = unsafe { &*(y.as_ptr() as *const BlockQ8K).add(i) };
            let (mut s1, mut s2) = ([0i32; 8], [0i32; 8]);
            for ib in 0..QK_K / 32 {
                for (j, &q) in by.qs[32 * ib..32 * ib + 32].iter().enumerate() {
                    let l = j / 8;
                    let g = (bx.grid(ib, l) >> (8 * (j % 8))) as u8 as i8 as i32;
                    let ls = bx.ls(ib, j / 16);
                    s1[j / 4] += q as i32 * g * ls;
                    s2[j / 4] += q as i32 * bx.delta(ib, l) * ls;
                }
            }
            let d = by.d * f16_to_f32(bx.d());
            for k in 0..8 {
                acc1[k] = d.mul_add(s1[k] as f32, acc1[k]);
                acc2[k] = d.mul_add(s2[k] as f32, acc2[k]);
            }
        }
        hsum(acc1) + DELTA * hsum(acc2)
    }

    /// Every kernel this CPU runs gives ggml-cpu's AVX2 result to the bit: raw blocks (every
    /// index, shift sign and scale), raw Q8_K, k = 256 and 4096, an odd
    /// number of rows and of blocks.
    #[test]
    fn vec_dot_is_avx2_order_bits() {
        let mut dots: Vec<(&str, VecDot)> = vec![];
        #[cfg(target_arch = "x86_64")]
        if use_avx2() {
            dots.push(("avx2", avx2::vec_dot));
            if is_x86_feature_detected!("bmi2") {
                dots.push(("avx2 bmi2", avx2::vec_dot_bmi2));
            }
        }
        if dots.is_empty() {
            return;
        }
        dots.push(("dispatched", vec_dot_fn()));
        for (n, rows) in [(256, 7), (768, 5), (4096, 9)] {
            let qx = raw_iq1_m(n * rows, n as u32 + 3);
            let qy = raw_q8_k(n, rows, n as u32);
            let (xr, yr) = (GgmlType::IQ1_M.row_size(n), GgmlType::Q8_K.row_size(n));
            for r in 0..rows {
                let (x, y) = (&qx[r * xr..(r + 1) * xr], &qy[r * yr..(r + 1) * yr]);
                let want = vec_dot_avx2_order(n, x, y);
                for (name, dot) in &dots {
                    let got = unsafe { dot(n, x.as_ptr(), y.as_ptr()) };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{name} n={n} row {r}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The dot alone, one thread: 64 rows of 4096 in cache, and a [4096, 14336] matrix one row
    /// at a time (generation's product, from memory); the kernels interleaved, best of many.
    /// `cargo test --release -- --ignored bench_iq1_m --nocapture`
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn bench_iq1_m() {
        if !use_avx2() {
            return;
        }
        let mut dots: Vec<(&str, VecDot)> = vec![("avx2", avx2::vec_dot)];
        if is_x86_feature_detected!("bmi2") {
            dots.push(("avx2 bmi2", avx2::vec_dot_bmi2));
        }
        let n = 4096;
        let xr = GgmlType::IQ1_M.row_size(n);
        let qy = raw_q8_k(n, 1, 5);
        for (rows, reps, rounds) in [(64usize, 20usize, 41usize), (14336, 1, 31)] {
            let qx = raw_iq1_m(n * rows, 9);
            let mut best = vec![f64::MAX; dots.len()];
            let mut sink = 0f32;
            for _ in 0..rounds {
                for (b, (_, dot)) in best.iter_mut().zip(&dots) {
                    let start = std::time::Instant::now();
                    for _ in 0..reps {
                        for r in 0..rows {
                            sink += unsafe { dot(n, qx.as_ptr().add(r * xr), qy.as_ptr()) };
                        }
                    }
                    *b = b.min(start.elapsed().as_secs_f64() * 1e3 / reps as f64);
                }
            }
            for ((name, _), b) in dots.iter().zip(&best) {
                println!(
                    "bench_iq1_m {rows:5} rows x {n}: {name:12} {:8.1} us ({sink})",
                    b * 1e3
                );
            }
        }
    }
}
