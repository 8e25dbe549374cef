//! ggml's reference scale searches for the K-quants and IQ4_NL, written out in Rust so that our
//! quantized bytes equal ggml-cpu's (SET_ROWS into a quantized KV cache is compared with ggml-cpu
//! to the bit, and a cache written by one backend is read by another). Every float operation
//! keeps ggml's order and precision: f32 throughout, no fused multiply-add (ggml-base is built
//! without FMA contraction on x86-64), integers converted to f32 where ggml's C converts them.

/// Below this largest magnitude a group counts as all zero (ggml's GROUP_MAX_EPS).
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round through the 1.5·2^23 trick. Ties go to even; for |v| >= 2^22
/// (a tiny scale) it wraps exactly as ggml's does, which the callers' clamps then see.
#[inline]
pub fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0;
    (t.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// ggml-base's f32 -> f16 (the portable bit construction): round to nearest even for every
/// finite value, NaN -> 0x7e00 with the sign kept.
#[inline]
pub fn fp32_to_fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xff00_0000).max(0x7100_0000);
    let base = f32::from_bits((bias >> 1) + 0x0780_0000) + base;
    let bits = base.to_bits();
    let nonsign = ((bits >> 13) & 0x7c00) + (bits & 0x0fff);
    ((sign >> 16)
        | if shl1_w > 0xff00_0000 {
            0x7e00
        } else {
            nonsign
        }) as u16
}

/// The value of largest magnitude (first one wins ties) and that magnitude.
#[inline]
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// Parameters of `make_qkx2_quants`: codes in 0..=nmax; candidate inverse scales
/// (rmin + rdelta·is + nmax) / (max - min) for is in 0..=nstep; error |d| (mad) or d².
pub struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

/// Asymmetric weighted search (ggml's `make_qkx2_quants`): x ≈ scale·l - min, l in 0..=nmax.
/// Writes the codes to `l` (`laux` is scratch of the same length); returns (scale, min).
pub fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    laux: &mut [u8],
    p: &Qkx2,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if p.use_mad { d.abs() } else { d * d };
    let mut iscale = p.nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
        l[i] = q as u8;
        best_error += weights[i] * err(scale * q as f32 + min - x[i]);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + p.nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Symmetric search weighted by x² (ggml's `make_qx_quants` with rmse_type 1 and no
/// importance weights, as Q6_K uses it): codes l + nmax in `l`, l in -nmax..nmax-1; returns
/// the scale.
pub fn make_qx_quants(x: &[f32], nmax: i32, l: &mut [u8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let code = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let q = code(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let iscale = -nmax as f32 / max;
    for (o, &v) in l.iter_mut().zip(x) {
        *o = (code(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l.iter_mut().zip(x) {
                *o = (code(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric search with per-value refinement (ggml's `make_q3_quants`, do_rmse on): codes
/// l + nmax in `l`, l in -nmax..nmax-1 (all zero for an all-zero group); returns the scale.
pub fn make_q3_quants(x: &[f32], nmax: i32, l: &mut [u8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return 0.0;
    }
    let iscale = -nmax as f32 / max;
    let mut q = [0i32; 32];
    let q = &mut q[..x.len()];
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * *qi as f32;
        suml2 += w * *qi as f32 * *qi as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (qi, &v) in q.iter_mut().zip(x) {
            let w = v * v;
            let mut slx = sumlx - w * v * *qi as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *qi as f32 * *qi as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *qi {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *qi = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (o, &qi) in l.iter_mut().zip(q.iter()) {
        *o = (qi + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Index of the entry of the sorted table `val` nearest to `x` (ggml's `best_index_int8`:
/// a bisection; ties between two entries go to the upper one).
#[inline]
pub fn best_index_int8(val: &[i8], x: f32) -> usize {
    let n = val.len();
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[n - 1] as f32 {
        return n - 1;
    }
    let (mut ml, mut mu) = (0, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < val[mu] as f32 - x {
        mu - 1
    } else {
        mu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even_and_wraps_like_ggml() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.51, -8),
            (4_194_303.0, 4_194_303),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
        // Out of range ggml's trick does not saturate: 2^22 comes out as -2^22.
        assert_eq!(nearest_int(4_194_304.0), -4_194_304);
        assert_eq!(nearest_int(f32::INFINITY), -0x0040_0000);
    }

    #[test]
    fn fp32_to_fp16_is_round_to_nearest_even() {
        let mut s = 0x1234_5678u32;
        for i in 0..200_000u32 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            // Every exponent, including f16 subnormals, overflow and f32 subnormals.
            let v = f32::from_bits(if i % 2 == 0 {
                s
            } else {
                s & 0x8fff_ffff | 0x3000_0000
            });
            if v.is_nan() {
                assert_eq!(fp32_to_fp16(v) & 0x7fff, 0x7e00);
                continue;
            }
            assert_eq!(fp32_to_fp16(v), half::f16::from_f32(v).to_bits(), "{v:e}");
        }
    }

    #[test]
    fn best_index_picks_the_nearest_level() {
        let t = super::super::iq4_nl::TABLE;
        for k in -1400..=1400 {
            let x = k as f32 * 0.1;
            let got = best_index_int8(&t, x);
            let best = (0..16)
                .map(|i| (x - t[i] as f32).abs())
                .fold(f32::MAX, f32::min);
            assert_eq!((x - t[got] as f32).abs(), best, "{x}");
        }
        // A midpoint goes up: between 1 and 13 lies 7.
        assert_eq!(best_index_int8(&t, 7.0), 9);
    }

    /// 5 super-blocks: uniform; tiny with one outlier; all positive; zeros, a constant
    /// negative and a constant positive sub-block; wider with a 1e-20 and an all-but-zero
    /// (below GROUP_MAX_EPS) 32-value span. Exact integers over 2^23, so a C program can
    /// build the same floats.
    fn golden_input() -> Vec<f32> {
        let mut s = 0x9e37_79b9u32;
        let mut u = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((s >> 8) as i32 - (1 << 23)) as f32 / 8_388_608.0
        };
        let mut x = vec![0f32; 1280];
        for v in &mut x[..256] {
            *v = u();
        }
        for v in &mut x[256..512] {
            *v = u() * 0.001;
        }
        x[256 + 7] = 50.0;
        for v in &mut x[512..768] {
            *v = u() + 1.0;
        }
        for v in &mut x[832..1024] {
            *v = u() * 3.0;
        }
        x[848..864].fill(-0.5);
        x[864..880].fill(0.25);
        for v in &mut x[1024..] {
            *v = (u() + u()) * 2.0;
        }
        for v in &mut x[1056..1088] {
            *v = u() * 1e-20;
        }
        for v in &mut x[1120..1152] {
            *v = u() * 1e-17;
        }
        x
    }

    fn fnv1a(b: &[u8]) -> u64 {
        b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| {
            (h ^ c as u64).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// Our quantizers write ggml's reference bytes. The hashes are of the bytes ggml 0.26.0's
    /// `from_float_ref` (the `quantize_row_*_ref` ggml-cpu's SET_ROWS calls) writes for
    /// `golden_input`.
    #[test]
    fn quantizers_match_ggml_reference_bytes() {
        use crate::ggml_types::GgmlType::*;
        let x = golden_input();
        let mut bad = vec![];
        for (t, want) in [
            (Q2_K, 0x100c_e863_661f_f2ffu64),
            (Q3_K, 0xbfde_ed24_ec09_9f42),
            (Q4_K, 0xdc14_45b9_5be2_17d1),
            (Q5_K, 0x4072_0f32_21f4_f75a),
            (Q6_K, 0x8bc2_b4de_fa6b_db14),
            (IQ4_NL, 0x0c9b_f9ec_44f9_1cee),
        ] {
            let from = super::super::traits(t).unwrap().from_f32.unwrap();
            let mut q = vec![0u8; t.row_size(x.len())];
            unsafe { from(&x, q.as_mut_ptr()) };
            if fnv1a(&q) != want {
                bad.push(format!("{t:?}: {:#018x}", fnv1a(&q)));
            }
        }
        assert!(bad.is_empty(), "bytes differ from ggml's: {bad:?}");
    }
}
