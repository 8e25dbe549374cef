//! ROPE: rotates pairs of each row by angles p * base^(-2i/n_dims), with YaRN scaling.
//! Op params (i32 slots): 1 n_dims, 2 mode, 4 n_ctx_orig, 5..=10 freq_base, freq_scale,
//! ext_factor, attn_factor, beta_fast, beta_slow (f32), 11..=14 mrope sections, 15 offset
//! of the first rotated channel. Modes: normal 0 (adjacent pairs), neox 2 (pairs half the
//! rotated span apart), mrope 8 / imrope 40 (neox pairing, angle from one of four position
//! streams by section), vision 24 (pairs n_dims apart over the whole row).
//! Positions: src1 I32 (4 per token for the multi modes); src2: optional F32 freq factors.

use super::Ctx;
use crate::ggml_types::GgmlType;
use crate::tensor::{split_range, Tensor};

const NORMAL: i32 = 0;
const NEOX: i32 = 2;
const MROPE: i32 = 8;
const VISION: i32 = 24;
const IMROPE: i32 = 40;

struct Params {
    n_dims: usize,
    mode: i32,
    n_ctx_orig: i32,
    freq_base: f32,
    freq_scale: f32,
    ext_factor: f32,
    attn_factor: f32,
    beta_fast: f32,
    beta_slow: f32,
    sections: [i32; 4],
    n_offs: usize,
}

fn params(node: &Tensor) -> Params {
    Params {
        n_dims: node.param_i32(1).max(0) as usize,
        mode: node.param_i32(2),
        n_ctx_orig: node.param_i32(4),
        freq_base: node.param_f32(5),
        freq_scale: node.param_f32(6),
        ext_factor: node.param_f32(7),
        attn_factor: node.param_f32(8),
        beta_fast: node.param_f32(9),
        beta_slow: node.param_f32(10),
        sections: [
            node.param_i32(11),
            node.param_i32(12),
            node.param_i32(13),
            node.param_i32(14),
        ],
        n_offs: node.param_i32(15).max(0) as usize,
    }
}

pub fn supports(node: &Tensor) -> bool {
    let (Some(a), Some(pos)) = (node.src(0), node.src(1)) else {
        return false;
    };
    let t = a.dtype();
    if !matches!(t, GgmlType::F32 | GgmlType::F16) || node.dtype() != t || !a.same_shape(node) {
        return false;
    }
    if !a.has_dense_rows()
        || !node.has_dense_rows()
        || pos.dtype() != GgmlType::I32
        || !pos.is_contiguous()
    {
        return false;
    }
    let (ne, n1, n2, n3) = (
        node.ne(),
        node.param_i32(1),
        node.param_i32(2),
        node.param_i32(15),
    );
    if n1 < 0 || n3 < 0 {
        return false;
    }
    let p = params(node);
    let multi = p.mode & MROPE != 0;
    if !matches!(n2, NORMAL | NEOX | MROPE | VISION | IMROPE) {
        return false;
    }
    if p.n_dims > ne[0]
        || !p.n_dims.is_multiple_of(2)
        || !p.n_offs.is_multiple_of(2)
        || p.n_offs + p.n_dims > ne[0]
    {
        return false;
    }
    if pos.nelements() < if multi { 4 * ne[2] } else { ne[2] } {
        return false;
    }
    if multi {
        let s = p.sections;
        if s.iter().any(|&v| v < 0)
            || (s[0] <= 0 && s[1] <= 0 && s[2] <= 0)
            || s.iter().sum::<i32>() as usize > ne[0]
        {
            return false;
        }
    }
    let cache_len = if p.mode == VISION { ne[0] } else { p.n_dims };
    if p.mode == VISION && (p.n_dims * 2 != ne[0] || p.n_offs != 0) {
        return false;
    }
    if let Some(ff) = node.src(2) {
        if ff.dtype() != GgmlType::F32
            || !ff.is_contiguous()
            || ff.nelements() < (p.n_dims / 2).max(cache_len / 2)
        {
            return false;
        }
    }
    true
}

pub fn work_size(node: &Tensor, nth: usize) -> usize {
    (node.ne()[0] + 16) * 4 * nth
}

/// Start and end of the YaRN correction range, in rotated dimensions.
fn yarn_corr_dims(
    n_dims: usize,
    n_ctx_orig: i32,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let start = dim(beta_fast).floor();
    let end = dim(beta_slow).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

/// (cos, sin) of one rotation angle, YaRN-interpolated and scaled by `mscale`.
#[inline]
fn yarn(theta_extrap: f32, i0: usize, p: &Params, corr: [f32; 2]) -> (f32, f32) {
    let theta_interp = p.freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = p.attn_factor;
    if p.ext_factor != 0.0 {
        let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
        // max then min, not clamp: a NaN y gives 0 here, where clamp would keep the NaN.
        #[allow(clippy::manual_clamp)]
        let ramp_mix = (1.0 - y.max(0.0).min(1.0)) * p.ext_factor;
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

/// Fills cache[i0], cache[i0+1] with cos, sin for every pair i0 < len.
fn fill_cache(
    cache: &mut [f32],
    pos: [f32; 4],
    p: &Params,
    ff: Option<&[f32]>,
    corr: [f32; 2],
    theta_scale: f32,
) {
    let len = cache.len();
    let multi = p.mode & MROPE != 0;
    let s = p.sections;
    let sect_dims = (s[0] + s[1] + s[2] + s[3]).max(1) as usize;
    let (sec_w, sec_e) = ((s[0] + s[1]) as usize, (s[0] + s[1] + s[2]) as usize);
    let mut th = pos; // t, h, w, e
    for i0 in (0..len).step_by(2) {
        let f = ff.map_or(1.0, |f| f[i0 / 2]);
        let theta = if !multi {
            th[0]
        } else {
            let sector = (i0 / 2) % sect_dims;
            if p.mode == VISION {
                // Each section restarts its angle.
                if sector == 0 {
                    th[0] = pos[0];
                } else if sector == s[0] as usize {
                    th[1] = pos[1];
                } else if sector == sec_w {
                    th[2] = pos[2];
                } else if sector == sec_e {
                    th[3] = pos[3];
                }
            }
            if p.mode == IMROPE {
                if sector % 3 == 1 && sector < 3 * s[1] as usize {
                    th[1]
                } else if sector % 3 == 2 && sector < 3 * s[2] as usize {
                    th[2]
                } else if sector.is_multiple_of(3) && sector < 3 * s[0] as usize {
                    th[0]
                } else {
                    th[3]
                }
            } else if sector >= s[0] as usize && sector < sec_w {
                th[1]
            } else if sector >= sec_w && sector < sec_w + s[2] as usize {
                th[2]
            } else if sector >= sec_w + s[2] as usize {
                th[3]
            } else {
                th[0]
            }
        };
        let (c, sn) = yarn(theta / f, i0, p, corr);
        cache[i0] = c;
        cache[i0 + 1] = sn;
        for t in th.iter_mut() {
            *t *= theta_scale;
        }
    }
}

pub fn compute(node: &Tensor, ctx: &Ctx) {
    let a = node.src(0).unwrap();
    let posq = node.src(1).unwrap();
    let ff = node
        .src(2)
        .map(|f| unsafe { std::slice::from_raw_parts(f.data() as *const f32, f.nelements()) });
    let p = params(node);
    let ne = node.ne();
    let t = node.dtype();
    let f16 = t == GgmlType::F16;
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);
    let corr = yarn_corr_dims(
        p.n_dims,
        p.n_ctx_orig,
        p.freq_base,
        p.beta_fast,
        p.beta_slow,
    );
    let multi = p.mode & MROPE != 0;
    let pos = unsafe { std::slice::from_raw_parts(posq.data() as *const i32, posq.nelements()) };
    let cache_len = if p.mode == VISION { ne[0] } else { p.n_dims };
    let cache = unsafe {
        std::slice::from_raw_parts_mut(
            (ctx.wdata as *mut f32).add((ne[0] + 16) * ctx.ith),
            cache_len,
        )
    };
    let mut last_i2 = usize::MAX;

    let ld = |ptr: *const u8, i: usize| -> f32 {
        unsafe {
            if f16 {
                half::f16::from_bits(*(ptr as *const u16).add(i)).to_f32()
            } else {
                *(ptr as *const f32).add(i)
            }
        }
    };
    let st = |ptr: *mut u8, i: usize, v: f32| unsafe {
        if f16 {
            *(ptr as *mut u16).add(i) = half::f16::from_f32(v).to_bits();
        } else {
            *(ptr as *mut f32).add(i) = v;
        }
    };

    for r in split_range(node.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = super::cpy::unflatten3(r, ne[1], ne[2]);
        if i2 != last_i2 {
            let pp = if multi {
                [
                    pos[i2] as f32,
                    pos[i2 + ne[2]] as f32,
                    pos[i2 + 2 * ne[2]] as f32,
                    pos[i2 + 3 * ne[2]] as f32,
                ]
            } else {
                [pos[i2] as f32; 4]
            };
            fill_cache(cache, pp, &p, ff, corr, theta_scale);
            last_i2 = i2;
        }
        let sp = unsafe { a.data().add(a.row_offset(i1, i2, i3)) };
        let dp = unsafe { node.data().add(node.row_offset(i1, i2, i3)) };
        // (pair count, distance between the two elements of a pair, step of the first element)
        let (n, dist, first_step) = match p.mode {
            NORMAL => (p.n_dims, 1, 2),
            VISION => (ne[0], p.n_dims, 1),
            _ => (p.n_dims, p.n_dims / 2, 1),
        };
        let base = if p.mode == VISION { 0 } else { p.n_offs };
        for i0 in (0..n).step_by(2) {
            let ic = base + i0 / 2 * first_step;
            let (c, s) = (cache[i0], cache[i0 + 1]);
            let (x0, x1) = (ld(sp, ic), ld(sp, ic + dist));
            // Fused as ggml-cpu's compiled C++ is (GCC contracts a*b - c*d to fma(a, b, -(c*d))),
            // so rotated values agree to the bit.
            st(dp, ic, x0.mul_add(c, -(x1 * s)));
            st(dp, ic + dist, x0.mul_add(s, x1 * c));
        }
        if p.mode != VISION {
            // Channels outside the rotated span are copied unchanged.
            let sz = t.type_size();
            unsafe {
                if sp != dp {
                    std::ptr::copy(sp, dp, p.n_offs * sz);
                    let end = p.n_offs + p.n_dims;
                    std::ptr::copy(sp.add(end * sz), dp.add(end * sz), (ne[0] - end) * sz);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::ggml_types::{op, GgmlType};

    /// Plain rotary embedding written from the formulas (no YaRN: ext_factor 0).
    #[allow(clippy::too_many_arguments)] // every rope parameter, passed plainly
    fn reference(
        x: &[f32],
        ne: [usize; 4],
        pos: &[i32],
        n_dims: usize,
        mode: i32,
        base: f32,
        scale: f32,
        attn: f32,
        sections: [i32; 4],
    ) -> Vec<f32> {
        let mut out = x.to_vec();
        let sect: i32 = sections.iter().sum();
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    let row = ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0];
                    for k in 0..n_dims / 2 {
                        let p = if mode & 8 != 0 {
                            let sec = (k as i32) % sect;
                            let stream = if mode == 40 {
                                if sec % 3 == 1 && sec < 3 * sections[1] {
                                    1
                                } else if sec % 3 == 2 && sec < 3 * sections[2] {
                                    2
                                } else if sec % 3 == 0 && sec < 3 * sections[0] {
                                    0
                                } else {
                                    3
                                }
                            } else if sec < sections[0] {
                                0
                            } else if sec < sections[0] + sections[1] {
                                1
                            } else if sec < sections[0] + sections[1] + sections[2] {
                                2
                            } else {
                                3
                            };
                            pos[i2 + stream * ne[2]]
                        } else {
                            pos[i2]
                        };
                        let theta = p as f64
                            * (base as f64).powf(-2.0 * k as f64 / n_dims as f64)
                            * scale as f64;
                        let (c, s) = (
                            (theta.cos() * attn as f64) as f32,
                            (theta.sin() * attn as f64) as f32,
                        );
                        let (a, b) = if mode == 0 {
                            (2 * k, 2 * k + 1)
                        } else {
                            (k, k + n_dims / 2)
                        };
                        let (x0, x1) = (x[row + a], x[row + b]);
                        out[row + a] = x0 * c - x1 * s;
                        out[row + b] = x0 * s + x1 * c;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn rope_modes_match_reference() {
        let ne = [10, 3, 4, 2];
        let n: usize = ne.iter().product();
        for (mode, sections) in [
            (0, [0; 4]),
            (2, [0; 4]),
            (8, [2, 1, 1, 0]),
            (40, [1, 1, 1, 1]),
        ] {
            for ty in [GgmlType::F32, GgmlType::F16] {
                for nth in [1, 3] {
                    let x = rand_vec(n, 7, -2.0, 2.0);
                    let mut a = TT::new(ty, ne);
                    a.set(&x);
                    let xin = a.get();
                    let npos = if mode & 8 != 0 { 4 * ne[2] } else { ne[2] };
                    let pos: Vec<i32> = (0..npos).map(|i| (i * 7 % 13) as i32 + 1).collect();
                    let mut pt = TT::new(GgmlType::I32, [npos, 1, 1, 1]);
                    pt.set(&pos.iter().map(|&v| v as f32).collect::<Vec<_>>());
                    let mut d = TT::new(ty, ne);
                    d.op(op::ROPE)
                        .src(0, &a)
                        .src(1, &pt)
                        .pi(1, 8)
                        .pi(2, mode)
                        .pi(4, 4096);
                    d.pf(5, 10000.0)
                        .pf(6, 0.5)
                        .pf(7, 0.0)
                        .pf(8, 1.25)
                        .pf(9, 32.0)
                        .pf(10, 1.0);
                    for (k, s) in sections.iter().enumerate() {
                        d.pi(11 + k, *s);
                    }
                    run(&d, nth);
                    let want = reference(&xin, ne, &pos, 8, mode, 10000.0, 0.5, 1.25, sections);
                    let tol = if ty == GgmlType::F16 { 4e-3 } else { 1e-5 };
                    assert_close(&d.get(), &want, tol);
                }
            }
        }
    }

    #[test]
    fn rope_yarn_ext_factor_runs_and_is_bounded() {
        let ne = [8, 2, 3, 1];
        let x = rand_vec(48, 1, -1.0, 1.0);
        let mut a = TT::new(GgmlType::F32, ne);
        a.set(&x);
        let mut pt = TT::new(GgmlType::I32, [3, 1, 1, 1]);
        pt.set(&[0.0, 100.0, 5000.0]);
        let mut d = TT::new(GgmlType::F32, ne);
        d.op(op::ROPE)
            .src(0, &a)
            .src(1, &pt)
            .pi(1, 8)
            .pi(2, 2)
            .pi(4, 4096);
        d.pf(5, 10000.0)
            .pf(6, 0.25)
            .pf(7, 1.0)
            .pf(8, 1.0)
            .pf(9, 32.0)
            .pf(10, 1.0);
        run(&d, 2);
        // Position 0 is the identity rotation scaled by the YaRN magnitude factor.
        let m = 1.0 + 0.1 * (4.0f32).ln();
        assert_close(
            &d.get()[..8],
            &x[..8].iter().map(|v| v * m).collect::<Vec<_>>(),
            1e-6,
        );
    }
}
