//! Calibration of the cost model: short measurements on the real devices, through the crate's
//! own device traits (a buffer of the device's type, a backend computing synthetic nodes), sized
//! to take about a second per device, and the profile's file beside the kernel cache. What is
//! measured and how the model uses it: `cost`.

use super::cost::{MatCurve, Profile, TypeClass};
use super::synth::Synth;
use crate::device::{Backend, Device, DeviceKind};
use crate::ggml_types::{op, GgmlType};
use crate::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Shapes and limits of one device's measurements.
struct Plan {
    /// The weight matrix [K, M] of the products.
    k: usize,
    m: usize,
    /// Columns measured, ascending from 1.
    batches: &'static [usize],
    /// Bytes the weights of one matrix-vector graph span (copies of the matrix): more than the
    /// caches hold, so that they come from memory as a model's weights do.
    weight_bytes: usize,
    /// Flops of one timed graph at batches above 1 (copies of the matrix up to it).
    flop_budget: f64,
    /// Elements of each operand of the streaming ADD.
    stream_elems: usize,
    /// FLASH_ATTN_EXT: head size, queries, keys, heads.
    fa: [usize; 4],
    /// No new weight class is measured after this long (the rest use the bounds).
    budget: Duration,
}

/// Small enough for about a second on 2 cores.
const CPU_PLAN: Plan = Plan {
    k: 2048,
    m: 1024,
    batches: &[1, 16, 64, 256],
    weight_bytes: 128 << 20,
    flop_budget: 0.5e9,
    stream_elems: 4 << 20,
    fa: [128, 64, 512, 8],
    budget: Duration::from_millis(2000),
};

/// A model-like shape (an 8B model's attention projection).
const GPU_PLAN: Plan = Plan {
    k: 4096,
    m: 4096,
    batches: &[1, 16, 64, 512],
    weight_bytes: 512 << 20,
    flop_budget: 40e9,
    stream_elems: 32 << 20,
    fa: [128, 512, 4096, 32],
    budget: Duration::from_millis(1500),
};

/// The backend's own work at a change of device, beyond a one-node graph on each (the next
/// segment's copies made current and launched, the wait before the CPU's part): a CPU layer's
/// attention sent to the GPU and back cost 130-150 us beyond its kernels in an H200 trace.
const SWITCH_HOST_US: f64 = 50.0;

/// Tiny nodes timed together for the fixed cost of one.
const TINY_NODES: usize = 32;
const TINY_ELEMS: usize = 2048;
/// Bytes moved per transfer measurement.
const TRANSFER_BYTES: usize = 64 << 20;

/// What one device measured.
#[derive(Debug)]
struct DeviceNumbers {
    node_us: f64,
    /// A graph of one tiny node, launched and waited for.
    one_graph_us: f64,
    bw_gbs: f64,
    gflops: f64,
    fa_gflops: f64,
    mm: Vec<MatCurve>,
}

/// Measures the CPU and, if given, the GPU and the transfers between them. Parts that cannot
/// be measured (allocation or compute failure, an unsupported type) keep `default_guess`'s
/// numbers or, for a weight class, the bounds.
pub fn measure(cpu: &dyn Device, gpu: Option<&dyn Device>) -> Profile {
    let t0 = Instant::now();
    let mut p = Profile::default_guess(gpu.is_some());
    let threads = crate::cpu::default_threads();
    p.cpu_threads = threads;
    let mut cpu_one_us = None;
    match measure_device(cpu, &CPU_PLAN, &format!("CPU, {threads} threads")) {
        Some(d) => {
            cpu_one_us = Some(d.one_graph_us);
            p.cpu_alone_us = (d.one_graph_us - d.node_us).max(0.0);
            p.cpu_node_us = d.node_us;
            p.cpu_bw_gbs = d.bw_gbs;
            p.cpu_gflops = d.gflops;
            p.cpu_fa_gflops = d.fa_gflops;
            p.cpu_mm = d.mm;
        }
        None => crate::log_warn!("RFHYBRID: CPU not measured; its numbers are built-in guesses"),
    }
    if let Some(g) = gpu {
        // A CPU standing in for the GPU (ROCMFORGE_HYBRID_FAKE_GPU) gets the CPU's shapes.
        let plan = match g.kind() {
            DeviceKind::Cpu => &CPU_PLAN,
            DeviceKind::Gpu => &GPU_PLAN,
        };
        match measure_device(g, plan, "GPU") {
            Some(d) => {
                if let Some(c) = cpu_one_us {
                    p.switch_us = c + d.one_graph_us + SWITCH_HOST_US;
                }
                p.gpu_alone_us = (d.one_graph_us - d.node_us).max(0.0);
                p.gpu_node_us = d.node_us;
                p.gpu_bw_gbs = d.bw_gbs;
                p.gpu_gflops = d.gflops;
                p.gpu_fa_gflops = d.fa_gflops;
                p.gpu_mm = d.mm;
            }
            None => {
                crate::log_warn!("RFHYBRID: GPU not measured; its numbers are built-in guesses")
            }
        }
        measure_transfers(g, &mut p);
    }
    p.calib_ms = t0.elapsed().as_secs_f64() * 1e3;
    crate::log_info!(
        "RFHYBRID: calibrated in {:.0} ms: CPU {:.1} us/node {:.1} GB/s {:.0} GFLOP/s{}",
        p.calib_ms,
        p.cpu_node_us,
        p.cpu_bw_gbs,
        p.cpu_gflops,
        if gpu.is_some() {
            format!(
                "; GPU {:.1} us/node {:.0} GB/s {:.0} GFLOP/s; to GPU {:.1} GB/s pinned, {:.1} pageable; back {:.1}",
                p.gpu_node_us,
                p.gpu_bw_gbs,
                p.gpu_gflops,
                p.h2d_pinned_gbs,
                p.h2d_pageable_gbs,
                p.d2h_gbs
            )
        } else {
            String::new()
        }
    );
    p
}

fn align(n: usize) -> usize {
    n.next_multiple_of(4096)
}

/// The address `off` bytes into a buffer (a device address: never dereferenced here).
fn at(base: *mut u8, off: usize) -> *mut u8 {
    base.wrapping_add(off)
}

fn tensor(ty: GgmlType, ne: [usize; 4], data: *mut u8) -> Synth {
    let mut s = Synth::new(ty, ne);
    s.set_data(data);
    s
}

/// The least of `reps` timings of `f` (µs); None when `f` fails.
fn best_us(reps: usize, mut f: impl FnMut() -> bool) -> Option<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        if !f() {
            return None;
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6);
    }
    Some(best)
}

/// µs to compute `nodes` once: warmed up once, then the best of a few runs (fewer when long;
/// a long warm-up run also counts, its first-use costs being small beside it).
fn time_graph(be: &mut dyn Backend, nodes: &[Tensor]) -> Option<f64> {
    let mut run = || be.compute(nodes).is_ok() && be.synchronize().is_ok();
    let warm = best_us(1, &mut run)?;
    let (reps, floor) = if warm > 20_000.0 {
        (1, warm)
    } else if warm > 2_000.0 {
        (3, f64::INFINITY)
    } else {
        (8, f64::INFINITY)
    };
    Some(best_us(reps, run)?.min(floor))
}

/// µs of work in a node that took `t` in all, its fixed cost `fixed` taken off (at most 70%
/// of it: a noisy fixed cost must not make the work look free).
fn work_us(t: f64, fixed: f64) -> f64 {
    (t - fixed).max(0.3 * t).max(1e-3)
}

/// Measures one device: the fixed cost of a node, streaming bandwidth, product curves per
/// weight class, attention throughput. None when it cannot allocate or compute at all.
fn measure_device(dev: &dyn Device, plan: &Plan, what: &str) -> Option<DeviceNumbers> {
    let mut be = match dev.new_backend() {
        Ok(b) => b,
        Err(e) => {
            crate::log_warn!("RFHYBRID: calibration ({what}): no backend: {e}");
            return None;
        }
    };
    let nmax = *plan.batches.last()?;
    let x_bytes = align((plan.k * nmax * 4).max(2 * TINY_ELEMS * 4));
    let o_bytes = align((plan.m * nmax * 4).max(TINY_ELEMS * 4));
    // Weights: what the plan says, less where the device has little memory free.
    let (free, _) = dev.memory();
    let mut w_bytes = plan.weight_bytes;
    if free > 0 {
        w_bytes = w_bytes.min(align(free / 8)).max(16 << 20);
    }
    let mut buf = loop {
        match dev.buffer_type().alloc(w_bytes + x_bytes + o_bytes) {
            Ok(b) => break b,
            Err(e) if w_bytes <= 16 << 20 => {
                crate::log_warn!("RFHYBRID: calibration ({what}): {e}");
                return None;
            }
            Err(_) => w_bytes /= 2,
        }
    };
    if let Err(e) = buf.fill(0, buf.size(), 0) {
        crate::log_warn!("RFHYBRID: calibration ({what}): {e}");
        return None;
    }
    let base = buf.base();
    let (wb, xb, ob) = (base, at(base, w_bytes), at(base, w_bytes + x_bytes));

    // The fixed cost of a node: tiny ADDs (also the warm-up: a GPU compiles its kernels at the
    // first graph, which is not counted against the budget).
    let a = tensor(GgmlType::F32, [TINY_ELEMS, 1, 1, 1], xb);
    let b = tensor(GgmlType::F32, [TINY_ELEMS, 1, 1, 1], at(xb, TINY_ELEMS * 4));
    let adds: Vec<Synth> = (0..TINY_NODES)
        .map(|_| {
            let mut s = tensor(GgmlType::F32, [TINY_ELEMS, 1, 1, 1], ob);
            s.op(op::ADD).src(0, &a).src(1, &b);
            s
        })
        .collect();
    let tiny: Vec<Tensor> = adds.iter().map(|s| s.tensor()).collect();
    if !tiny.iter().all(|n| dev.supports_op(n)) {
        crate::log_warn!("RFHYBRID: calibration ({what}): ADD not supported");
        return None;
    }
    let mut node_us = time_graph(be.as_mut(), &tiny)? / TINY_NODES as f64;
    let one_graph_us = time_graph(be.as_mut(), &tiny[..1])?;
    let started = Instant::now();

    // Streaming bandwidth: one large ADD, its three operands in the weight region.
    let s_elems = plan.stream_elems.min(w_bytes / 12);
    let sa = tensor(GgmlType::F32, [s_elems, 1, 1, 1], wb);
    let sb = tensor(GgmlType::F32, [s_elems, 1, 1, 1], at(wb, s_elems * 4));
    let mut sd = tensor(GgmlType::F32, [s_elems, 1, 1, 1], at(wb, 2 * s_elems * 4));
    sd.op(op::ADD).src(0, &sa).src(1, &sb);
    let t_stream = time_graph(be.as_mut(), &[sd.tensor()])?;

    // Products per weight class and batch.
    let (k, m) = (plan.k, plan.m);
    // (class, [(columns, flops, µs per node)]): turned into curves once the node cost is final.
    let mut raw = Vec::new();
    for class in TypeClass::ALL {
        if started.elapsed() > plan.budget {
            crate::log_info!(
                "RFHYBRID: calibration ({what}): time budget spent; {} and later classes use the bounds",
                class.name()
            );
            break;
        }
        let ty = class.rep();
        let mat = align(ty.row_size(k) * m);
        let copies_max = (w_bytes / mat).clamp(1, 128);
        let mut points = Vec::new();
        for &n in plan.batches {
            let flops = 2.0 * (k * m * n) as f64;
            let copies = if n == 1 {
                copies_max
            } else {
                ((plan.flop_budget / flops) as usize).clamp(1, copies_max)
            };
            let x = tensor(GgmlType::F32, [k, n, 1, 1], xb);
            let ws: Vec<Synth> = (0..copies)
                .map(|i| tensor(ty, [k, m, 1, 1], at(wb, i * mat)))
                .collect();
            let prods: Vec<Synth> = ws
                .iter()
                .map(|w| {
                    let mut d = tensor(GgmlType::F32, [m, n, 1, 1], ob);
                    d.op(op::MUL_MAT).src(0, w).src(1, &x);
                    d
                })
                .collect();
            let nodes: Vec<Tensor> = prods.iter().map(|s| s.tensor()).collect();
            if !nodes.iter().all(|t| dev.supports_op(t)) {
                break;
            }
            let Some(t) = time_graph(be.as_mut(), &nodes) else {
                break;
            };
            points.push((n as f64, flops, t / copies as f64));
        }
        if points.len() == plan.batches.len() {
            raw.push((class, points));
        }
    }
    let fa = measure_attention(be.as_mut(), dev, plan, wb, w_bytes);
    // Once more at the end, the least kept: a busy machine's scheduler delays can make one
    // measurement of a few microseconds look like milliseconds.
    if let Some(t) = time_graph(be.as_mut(), &tiny) {
        node_us = node_us.min(t / TINY_NODES as f64);
    }
    let bw_gbs = (12 * s_elems) as f64 / work_us(t_stream, node_us) / 1e3;
    let mm: Vec<MatCurve> = raw
        .into_iter()
        .map(|(class, pts)| {
            let points: Vec<(f64, f64)> = pts
                .iter()
                .map(|&(n, flops, t)| (n, flops / work_us(t, node_us) / 1e3))
                .collect();
            crate::log_debug!(
                "RFHYBRID: calibration ({what}): {} GFLOP/s at N {points:?}",
                class.name()
            );
            MatCurve { class, points }
        })
        .collect();
    let gflops = mm
        .iter()
        .find(|c| c.class == TypeClass::Q4_0)
        .or(mm.first())
        .and_then(|c| c.points.last())
        .map_or(0.0, |p| p.1);
    let gflops = if gflops > 0.0 {
        gflops
    } else {
        // Nothing measured: the weights streamed at the measured bandwidth, 64 columns.
        bw_gbs * 64.0 * 2.0 / 0.5625
    };

    // Attention at a prompt-sized batch; else half the F16 products' rate.
    let fa_gflops = fa
        .map(|(flops, t)| flops / work_us(t, node_us) / 1e3)
        .unwrap_or_else(|| {
            let f16 = mm
                .iter()
                .find(|c| c.class == TypeClass::F16)
                .and_then(|c| c.points.last())
                .map_or(gflops, |p| p.1);
            0.5 * f16
        });
    crate::log_info!(
        "RFHYBRID: calibrated {what}: {node_us:.1} us/node, {bw_gbs:.1} GB/s, {gflops:.0} GFLOP/s \
         (q4_0 products), attention {fa_gflops:.0} GFLOP/s, {} of {} weight classes, {:.0} ms",
        mm.len(),
        TypeClass::ALL.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    Some(DeviceNumbers {
        node_us,
        one_graph_us,
        bw_gbs,
        gflops,
        fa_gflops,
        mm,
    })
}

/// FLASH_ATTN_EXT of F16 K and V, no mask, in the weight region: (flops, µs).
fn measure_attention(
    be: &mut dyn Backend,
    dev: &dyn Device,
    plan: &Plan,
    wb: *mut u8,
    w_bytes: usize,
) -> Option<(f64, f64)> {
    let [d, nq, nkv, h] = plan.fa;
    let (qb, kb) = (align(d * nq * h * 4), align(d * nkv * h * 2));
    if qb * 2 + kb * 2 > w_bytes {
        return None;
    }
    let q = tensor(GgmlType::F32, [d, nq, h, 1], wb);
    let k = tensor(GgmlType::F16, [d, nkv, h, 1], at(wb, qb));
    let v = tensor(GgmlType::F16, [d, nkv, h, 1], at(wb, qb + kb));
    let mut o = tensor(GgmlType::F32, [d, h, nq, 1], at(wb, qb + 2 * kb));
    o.op(op::FLASH_ATTN_EXT)
        .src(0, &q)
        .src(1, &k)
        .src(2, &v)
        .param_f32(0, 1.0 / (d as f32).sqrt());
    let node = o.tensor();
    if !dev.supports_op(&node) {
        return None;
    }
    let t = time_graph(be, &[node])?;
    Some((4.0 * (d * nq * nkv * h) as f64, t))
}

/// Host to device from pinned and pageable memory, device to host, and the latency of a
/// small copy, through the device's buffer (and its pinned host buffer type, if it has one).
fn measure_transfers(dev: &dyn Device, p: &mut Profile) {
    let size = TRANSFER_BYTES;
    let mut dbuf = match dev.buffer_type().alloc(size) {
        Ok(b) => b,
        Err(e) => {
            crate::log_warn!("RFHYBRID: calibration: transfers not measured: {e}");
            return;
        }
    };
    let mut page = vec![1u8; size];
    let Some(lat) = best_us(20, || dbuf.write(0, &page[..4096]).is_ok()) else {
        return;
    };
    let rate = |t: f64| size as f64 / work_us(t, lat) / 1e3;
    let h2d = best_us(3, || dbuf.write(0, &page).is_ok());
    let d2h = best_us(3, || dbuf.read(0, &mut page).is_ok());
    let (Some(h2d), Some(d2h)) = (h2d, d2h) else {
        return;
    };
    p.transfer_us = lat;
    p.h2d_pageable_gbs = rate(h2d);
    p.d2h_gbs = rate(d2h);
    p.h2d_pinned_gbs = p.h2d_pageable_gbs;
    p.d2h_pinned_gbs = p.d2h_gbs;
    let Some(hbt) = dev.host_buffer_type() else {
        return;
    };
    let Ok(mut hb) = hbt.alloc(size) else {
        return;
    };
    if !hb.is_host() || hb.size() < size || hb.fill(0, size, 1).is_err() {
        return;
    }
    // SAFETY: host memory of `hb` (is_host), `size` bytes, alive until the end of this function;
    // nothing else refers to it while the slice lives.
    let pinned = unsafe { std::slice::from_raw_parts_mut(hb.base(), size) };
    if let Some(t) = best_us(3, || dbuf.write(0, pinned).is_ok()) {
        p.h2d_pinned_gbs = rate(t);
    }
    if let Some(t) = best_us(3, || dbuf.read(0, pinned).is_ok()) {
        p.d2h_pinned_gbs = rate(t);
    }
}

// ---- The profile on disk ----

const HEADER: &str = "rocmforge-hybrid-profile 2";

impl Profile {
    fn scalars(&self) -> [(&'static str, f64); 18] {
        [
            ("cpu_node_us", self.cpu_node_us),
            ("gpu_node_us", self.gpu_node_us),
            ("cpu_bw_gbs", self.cpu_bw_gbs),
            ("gpu_bw_gbs", self.gpu_bw_gbs),
            ("cpu_gflops", self.cpu_gflops),
            ("gpu_gflops", self.gpu_gflops),
            ("h2d_pinned_gbs", self.h2d_pinned_gbs),
            ("h2d_pageable_gbs", self.h2d_pageable_gbs),
            ("d2h_gbs", self.d2h_gbs),
            ("transfer_us", self.transfer_us),
            ("switch_us", self.switch_us),
            ("cpu_alone_us", self.cpu_alone_us),
            ("gpu_alone_us", self.gpu_alone_us),
            ("d2h_pinned_gbs", self.d2h_pinned_gbs),
            ("cpu_fa_gflops", self.cpu_fa_gflops),
            ("gpu_fa_gflops", self.gpu_fa_gflops),
            ("cpu_threads", self.cpu_threads as f64),
            ("calib_ms", self.calib_ms),
        ]
    }

    /// The profile as `key=value` lines (f64 written so that they read back exactly), for the
    /// machine identified by `key`.
    pub fn to_text(&self, key: &str) -> String {
        let mut s = format!("{HEADER}\nkey={}\n", one_line(key));
        for (k, v) in self.scalars() {
            s += &format!("{k}={v}\n");
        }
        for (side, curves) in [("cpu_mm", &self.cpu_mm), ("gpu_mm", &self.gpu_mm)] {
            for c in curves {
                let pts: Vec<String> = c.points.iter().map(|(n, g)| format!("{n}:{g}")).collect();
                s += &format!("{side}.{}={}\n", c.class.name(), pts.join(" "));
            }
        }
        s
    }

    /// Parses `to_text`'s output; Err for another machine's key, a missing or unknown field,
    /// or a number that is not finite and ≥ 0 (CPU bandwidth, throughput and threads > 0).
    pub fn from_text(text: &str, key: &str) -> Result<Profile, String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err("not a profile of this version".into());
        }
        let mut p = Profile::synthetic(0.0, 0.0, 0.0);
        let mut seen = std::collections::HashSet::new();
        let mut key_ok = false;
        for line in lines {
            if line.is_empty() {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("line without '=': {line:?}"))?;
            if !seen.insert(k.to_string()) {
                return Err(format!("{k} given twice"));
            }
            if k == "key" {
                key_ok = v == one_line(key);
                continue;
            }
            if let Some((side, class)) = k.split_once('.') {
                let class =
                    TypeClass::from_name(class).ok_or_else(|| format!("unknown class in {k}"))?;
                let curve = MatCurve {
                    class,
                    points: parse_points(v).ok_or_else(|| format!("bad curve {k}={v}"))?,
                };
                match side {
                    "cpu_mm" => p.cpu_mm.push(curve),
                    "gpu_mm" => p.gpu_mm.push(curve),
                    _ => return Err(format!("unknown field {k}")),
                }
                continue;
            }
            let x: f64 = v
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("bad number {k}={v}"))?;
            let slot = match k {
                "cpu_node_us" => &mut p.cpu_node_us,
                "gpu_node_us" => &mut p.gpu_node_us,
                "cpu_bw_gbs" => &mut p.cpu_bw_gbs,
                "gpu_bw_gbs" => &mut p.gpu_bw_gbs,
                "cpu_gflops" => &mut p.cpu_gflops,
                "gpu_gflops" => &mut p.gpu_gflops,
                "h2d_pinned_gbs" => &mut p.h2d_pinned_gbs,
                "h2d_pageable_gbs" => &mut p.h2d_pageable_gbs,
                "d2h_gbs" => &mut p.d2h_gbs,
                "transfer_us" => &mut p.transfer_us,
                "switch_us" => &mut p.switch_us,
                "cpu_alone_us" => &mut p.cpu_alone_us,
                "gpu_alone_us" => &mut p.gpu_alone_us,
                "d2h_pinned_gbs" => &mut p.d2h_pinned_gbs,
                "cpu_fa_gflops" => &mut p.cpu_fa_gflops,
                "gpu_fa_gflops" => &mut p.gpu_fa_gflops,
                "calib_ms" => &mut p.calib_ms,
                "cpu_threads" => {
                    p.cpu_threads = x as usize;
                    continue;
                }
                _ => return Err(format!("unknown field {k}")),
            };
            *slot = x;
        }
        if !key_ok {
            return Err("measured on another machine or library version".into());
        }
        if let Some((k, _)) = p.scalars().iter().find(|(k, _)| !seen.contains(*k)) {
            return Err(format!("{k} missing"));
        }
        if !(p.cpu_bw_gbs > 0.0 && p.cpu_gflops > 0.0 && p.cpu_threads > 0) {
            return Err("CPU numbers are zero".into());
        }
        Ok(p)
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// "1:12.5 16:180" -> points with N ≥ 1 ascending and GFLOP/s > 0, finite.
fn parse_points(v: &str) -> Option<Vec<(f64, f64)>> {
    let mut pts: Vec<(f64, f64)> = Vec::new();
    for p in v.split_whitespace() {
        let (n, g) = p.split_once(':')?;
        let (n, g): (f64, f64) = (n.parse().ok()?, g.parse().ok()?);
        let last = pts.last().map_or(0.0, |l| l.0);
        if !(n.is_finite() && g.is_finite() && n >= 1.0 && g > 0.0 && n > last) {
            return None;
        }
        pts.push((n, g));
    }
    (!pts.is_empty()).then_some(pts)
}

/// What a measured profile depends on: the CPU, its thread count and SIMD level, the GPU and
/// its memory, the library version.
pub fn cache_key(cpu: &dyn Device, gpu: Option<&dyn Device>) -> String {
    let gpu = gpu.map_or("none".to_string(), |g| {
        format!(
            "{} ({} bytes)",
            g.description().to_string_lossy(),
            g.memory().1
        )
    });
    one_line(&format!(
        "cpu={}; threads={}; simd={:?}; gpu={gpu}; version={}",
        cpu_model_name().unwrap_or_else(|| cpu.description().to_string_lossy().into_owned()),
        crate::cpu::default_threads(),
        crate::cpu::simd::level(),
        env!("CARGO_PKG_VERSION")
    ))
}

fn cpu_model_name() -> Option<String> {
    let s = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let l = s.lines().find(|l| l.starts_with("model name"))?;
    Some(l.split_once(':')?.1.trim().to_string())
}

/// `hybrid-profile-<hash of key>.txt` in `dir`.
pub fn cache_file(dir: &Path, key: &str) -> PathBuf {
    keyed_file(dir, "hybrid-profile", key)
}

/// `<name>-<hash of key>.txt` in `dir`: a file of RFHYBRID's cache for one machine key.
pub fn keyed_file(dir: &Path, name: &str, key: &str) -> PathBuf {
    let h = crate::gpu::sha256::hex(&crate::gpu::sha256::sha256(key.as_bytes()));
    dir.join(format!("{name}-{}.txt", &h[..16]))
}

/// Reads the profile cached at `path` for `key`; None (logged) when absent or unusable.
pub fn load_cached(path: &Path, key: &str) -> Option<Profile> {
    let text = std::fs::read_to_string(path).ok()?;
    match Profile::from_text(&text, key) {
        Ok(p) => Some(p),
        Err(e) => {
            crate::log_warn!(
                "RFHYBRID: ignoring the cost profile {}: {e}",
                path.display()
            );
            None
        }
    }
}

/// Writes the profile to `path` through a temporary file and a rename (a reader never sees
/// half a file; two writers leave one whole file).
pub fn store(path: &Path, p: &Profile, key: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, p.to_text(key))?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The 1-minute load average when it exceeds the CPUs available: measurements then take
/// other processes' time slices into account (a node's fixed cost on a busy 2-core machine
/// measures 1.5 ms instead of 1 µs) and must not be kept.
fn busy() -> Option<(f64, usize)> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    let load: f64 = s.split_whitespace().next()?.parse().ok()?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (load > cpus as f64).then_some((load, cpus))
}

/// Jiffies the machine spent busy (all but idle and I/O wait; a VM's stolen time counts as
/// busy), in all, and in this process: from /proc/stat's first line and /proc/self/stat.
fn jiffies() -> Option<(u64, u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_jiffies(stat.lines().next()?, &own)
}

fn parse_jiffies(cpu_line: &str, self_stat: &str) -> Option<(u64, u64, u64)> {
    let v: Vec<u64> = cpu_line
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice: inside user already]
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    // After the command name (in parentheses, may hold spaces): utime, stime are fields 14, 15.
    let rest: Vec<&str> = self_stat
        .get(self_stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let own = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    Some((total - idle, total, own))
}

/// Others' share of the machine between two `jiffies` readings (busy time not this process's
/// over all time), where above a quarter: then this process's measurements shared the CPUs.
fn others_busy(before: (u64, u64, u64), after: (u64, u64, u64)) -> Option<f64> {
    let total = after.1.checked_sub(before.1)?;
    let busy = after.0.checked_sub(before.0)?;
    let own = after.2.checked_sub(before.2)?;
    if total == 0 {
        return None;
    }
    let share = busy.saturating_sub(own) as f64 / total as f64;
    (share > 0.25).then_some(share)
}

/// A node's fixed cost on an idle CPU is about a microsecond (1.1 µs on the H100 machine's
/// host); hundreds of microseconds mean the workers waited for CPUs others held.
const SUSPECT_CPU_NODE_US: f64 = 100.0;

/// `cost::load_or_calibrate`: the mode from ROCMFORGE_HYBRID_CALIBRATE, the file in the kernel
/// cache's directory, the devices measured. A profile measured while other processes used a
/// quarter of the machine or more (the load average lags a minute behind, so this is read
/// from the CPU counters around the measurement), or with a node's fixed cost over
/// `SUSPECT_CPU_NODE_US`, is not cached: a cached one serves every later process.
pub fn load_or_calibrate(cpu: &dyn Device, gpu: Option<&dyn Device>) -> Profile {
    let key = cache_key(cpu, gpu);
    let path = crate::gpu::kernels::cache_dir().map(|d| cache_file(&d, &key));
    load_or_measure(
        &crate::tuning::get().hybrid_calibrate,
        path.as_deref(),
        &key,
        gpu.is_some(),
        || {
            let loaded = busy();
            let before = jiffies();
            let p = measure(cpu, gpu);
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let shared = before
                .zip(jiffies())
                .and_then(|(b, a)| others_busy(b, a))
                .map(|share| (share * cpus as f64, cpus));
            let slow = (p.cpu_node_us > SUSPECT_CPU_NODE_US).then_some((f64::NAN, cpus));
            (p, loaded.or(shared).or(slow))
        },
    )
}

/// The cache logic of `load_or_calibrate`, with the measurement given: `measure` returns the
/// profile and whether the machine was busy (load, CPUs), which keeps it out of the cache.
pub fn load_or_measure(
    mode: &str,
    path: Option<&Path>,
    key: &str,
    gpu: bool,
    measure: impl FnOnce() -> (Profile, Option<(f64, usize)>),
) -> Profile {
    let mode = mode.trim().to_ascii_lowercase();
    if matches!(mode.as_str(), "0" | "off" | "no" | "false") {
        crate::log_info!(
            "RFHYBRID: cost model from built-in defaults (ROCMFORGE_HYBRID_CALIBRATE=0)"
        );
        return Profile::default_guess(gpu);
    }
    if !matches!(mode.as_str(), "cached" | "force" | "" | "1") {
        crate::log_warn!(
            "RFHYBRID: ROCMFORGE_HYBRID_CALIBRATE={mode}: expected cached, force or 0; using cached"
        );
    }
    if mode != "force" {
        if let Some((f, p)) = path.and_then(|f| Some((f, load_cached(f, key)?))) {
            crate::log_info!("RFHYBRID: cost model from {}", f.display());
            return p;
        }
    }
    let shown = path.map_or("nowhere: no cache directory".to_string(), |p| {
        p.display().to_string()
    });
    crate::log_info!("RFHYBRID: calibrating the cost model (cached in {shown})");
    let (p, busy) = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(measure)) {
        Ok(r) => r,
        Err(_) => {
            crate::log_error!("RFHYBRID: calibration failed; using built-in defaults");
            return Profile::default_guess(gpu);
        }
    };
    if let Some((load, cpus)) = busy {
        crate::log_warn!(
            "RFHYBRID: the machine was busy (load {load:.1} on {cpus} CPUs; NaN: a CPU node's \
             fixed cost of {:.0} us): the measured profile is used by this process only, not cached",
            p.cpu_node_us
        );
        return p;
    }
    if let Some(f) = path {
        if let Err(e) = store(f, &p, key) {
            crate::log_warn!("RFHYBRID: cannot cache the cost profile in {shown}: {e}");
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hybrid::cost::CostModel;
    use crate::hybrid::Place;

    #[test]
    fn others_share_of_the_cpus() {
        let own = "4242 (llama run) S 1 2 3 4 5 6 7 8 9 10 300 40 0 0 20 0 17";
        let (busy, total, me) = parse_jiffies("cpu  100 5 50 1000 10 1 2 3 0 0", own).unwrap();
        assert_eq!((busy, total, me), (161, 1171, 340));
        // 1000 jiffies pass: 600 busy, 500 of them ours: others 10%.
        let quiet = others_busy((0, 0, 0), (600, 1000, 500));
        assert_eq!(quiet, None);
        // 800 busy, 300 ours: others half of the machine.
        assert_eq!(others_busy((0, 0, 0), (800, 1000, 300)), Some(0.5));
        assert_eq!(others_busy((5, 5, 5), (5, 5, 5)), None);
        assert!(parse_jiffies("intr 1 2", own).is_none());
    }

    fn positive(x: f64) -> bool {
        x.is_finite() && x > 0.0
    }

    #[test]
    fn calibrates_the_cpu() {
        let cpu = crate::cpu::CpuDevice::new();
        let t = Instant::now();
        let p = measure(&cpu, None);
        let s = t.elapsed().as_secs_f64();
        eprintln!("calibration took {s:.2} s: {p:#?}");
        // About 2.5 s on 2 idle cores, 12 s under qemu: not a timing test, only a guard that
        // the time budget stops it (no new class is started after it runs out).
        assert!(s < 120.0, "{s} s");
        for x in [
            p.cpu_node_us,
            p.cpu_bw_gbs,
            p.cpu_gflops,
            p.cpu_fa_gflops,
            p.calib_ms,
        ] {
            assert!(positive(x), "{p:#?}");
        }
        assert_eq!(p.cpu_threads, crate::cpu::default_threads());
        // Without a GPU its compute numbers are zero.
        assert_eq!((p.gpu_bw_gbs, p.gpu_gflops), (0.0, 0.0));
        // Q4_0 at least was measured, at every batch (how the throughput grows with the batch
        // depends on how busy the machine is: not checked).
        let q4 = p
            .cpu_mm
            .iter()
            .find(|c| c.class == TypeClass::Q4_0)
            .expect("q4_0 curve");
        assert_eq!(q4.points.len(), CPU_PLAN.batches.len());
        assert!(q4.points.iter().all(|&(n, g)| n >= 1.0 && positive(g)));
        // The profile survives the cache format and predicts a product.
        let back = super::super::cost::Profile::from_text(&p.to_text("k"), "k").unwrap();
        assert_eq!(back, p);
        let w = Synth::new(GgmlType::Q4_0, [4096, 4096, 1, 1]);
        let x = Synth::new(GgmlType::F32, [4096, 1, 1, 1]);
        let mut d = Synth::new(GgmlType::F32, [4096, 1, 1, 1]);
        d.op(op::MUL_MAT).src(0, &w).src(1, &x);
        let m = CostModel::new(p);
        assert!(positive(m.compute_us(&d.tensor(), Place::Cpu)));
    }

    #[test]
    fn transfers_through_a_host_device() {
        // The CPU device standing in for a GPU: host memory, no pinned type (pinned = pageable).
        let cpu = crate::cpu::CpuDevice::new();
        let mut p = Profile::synthetic(1.0, 1.0, 1.0);
        measure_transfers(&cpu, &mut p);
        for x in [
            p.h2d_pinned_gbs,
            p.h2d_pageable_gbs,
            p.d2h_gbs,
            p.d2h_pinned_gbs,
            p.transfer_us,
        ] {
            assert!(positive(x) && x != 1.0, "{p:#?}");
        }
        assert_eq!(p.h2d_pinned_gbs, p.h2d_pageable_gbs);
    }

    fn measured_like() -> Profile {
        let mut p = Profile::synthetic(41.3, 2891.7, 24.9);
        p.cpu_mm.push(MatCurve {
            class: TypeClass::Q4_0,
            points: vec![
                (1.0, 101.25),
                (16.0, 1000.1),
                (64.0, 1234.5678901234),
                (256.0, 1300.0),
            ],
        });
        p.gpu_mm.push(MatCurve {
            class: TypeClass::Q6K,
            points: vec![(1.0, 1.0 / 3.0), (512.0, 1e5)],
        });
        p.calib_ms = 1234.5;
        p.cpu_threads = 7;
        p
    }

    #[test]
    fn cache_round_trip_and_corrupt_files() {
        let dir = std::env::temp_dir().join(format!("rf-cost-test-{}", std::process::id()));
        let key = "cpu=Test CPU; threads=7; gpu=none";
        let file = cache_file(&dir, key);
        assert!(file
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("hybrid-profile-"));
        assert_ne!(file, cache_file(&dir, "another key"));
        let p = measured_like();
        store(&file, &p, key).unwrap();
        assert_eq!(load_cached(&file, key), Some(p.clone()));
        // Another machine's key, a missing directory.
        assert_eq!(load_cached(&file, "cpu=Other"), None);
        assert_eq!(load_cached(&dir.join("absent.txt"), key), None);
        // Corruptions: each is rejected.
        let text = p.to_text(key);
        let corrupt = [
            String::new(),
            "garbage".to_string(),
            text.replace("cpu_bw_gbs=41.3", "cpu_bw_gbs=abc"),
            text.replace("cpu_bw_gbs=41.3", "cpu_bw_gbs=NaN"),
            text.replace("cpu_bw_gbs=41.3", "cpu_bw_gbs=-1"),
            text.replace("cpu_bw_gbs=41.3", "cpu_bw_gbs=0"),
            text.replace("cpu_bw_gbs=41.3\n", ""),
            text.replace("d2h_gbs=24.9\n", "d2h_gbs=24.9\nd2h_gbs=1\n"),
            text.replace("1:101.25", "1:-5"),
            text.replace("16:1000.1", "16:"),
            text.replace("64:", "8:"),
            text.replace("cpu_mm.q4_0", "cpu_mm.q9_9"),
            text.replace("calib_ms", "calib_msx"),
            text[..text.len() / 2].to_string(),
        ];
        for (i, c) in corrupt.iter().enumerate() {
            assert!(
                Profile::from_text(c, key).is_err(),
                "corruption {i} accepted:\n{c}"
            );
            std::fs::write(&file, c).unwrap();
            assert_eq!(load_cached(&file, key), None, "corruption {i}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cache_modes() {
        let dir = std::env::temp_dir().join(format!("rf-cost-modes-{}", std::process::id()));
        let key = "cpu=Test; gpu=none";
        let file = cache_file(&dir, key);
        let p = measured_like();
        let calls = std::cell::Cell::new(0);
        let run = |mode: &str, path: Option<&Path>, busy: Option<(f64, usize)>| {
            load_or_measure(mode, path, key, false, || {
                calls.set(calls.get() + 1);
                (p.clone(), busy)
            })
        };
        // "0": built-in numbers, nothing measured or written.
        assert_eq!(run("0", Some(&file), None), Profile::default_guess(false));
        assert_eq!((calls.get(), file.exists()), (0, false));
        // Measured on a busy machine: used, not cached.
        assert_eq!(run("cached", Some(&file), Some((5.0, 2))), p);
        assert_eq!((calls.get(), file.exists()), (1, false));
        // Measured and cached, then read back without measuring.
        assert_eq!(run("cached", Some(&file), None), p);
        assert_eq!((calls.get(), file.exists()), (2, true));
        assert_eq!(run("cached", Some(&file), None), p);
        assert_eq!(calls.get(), 2);
        // "force" measures again; a corrupt file is measured over and rewritten.
        assert_eq!(run("force", Some(&file), None), p);
        assert_eq!(calls.get(), 3);
        std::fs::write(&file, "rocmforge-hybrid-profile 1\ncpu_bw_gbs=oops\n").unwrap();
        assert_eq!(run("cached", Some(&file), None), p);
        assert_eq!(calls.get(), 4);
        assert_eq!(load_cached(&file, key), Some(p.clone()));
        // No cache directory: measured every time.
        assert_eq!(run("cached", None, None), p);
        assert_eq!(calls.get(), 5);
        // A measurement that panics gives the built-in numbers.
        let q = load_or_measure("force", Some(&file), key, true, || panic!("device lost"));
        assert_eq!(q, Profile::default_guess(true));
        assert_eq!(load_cached(&file, key), Some(p.clone()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Predicted against measured on this CPU for model-like nodes of other shapes than the
    /// calibration's (SmolLM2-135M's and an 8B model's), each timed in a graph of copies over
    /// distinct weights as a model's layers are. Prints the table; fails past 2× either way
    /// for nodes of 50 µs or more. Ignored: seconds, and only meaningful on an idle machine
    /// (`cargo test --release --lib prediction_accuracy -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn prediction_accuracy_on_this_cpu() {
        let cpu = crate::cpu::CpuDevice::new();
        let model = CostModel::new(measure(&cpu, None));
        let mut be = cpu.new_backend().unwrap();
        let size = 256 << 20;
        let mut buf = cpu.buffer_type().alloc(size).unwrap();
        buf.fill(0, size, 0).unwrap();
        let base = buf.base();
        // (name, weight type, K, M, N) products; copies over distinct weights up to 64 MiB.
        let products = [
            ("smollm2 q_proj q8_0 N=1", GgmlType::Q8_0, 576, 576, 1),
            ("smollm2 ffn_up q8_0 N=1", GgmlType::Q8_0, 576, 1536, 1),
            ("smollm2 ffn_up q8_0 N=32", GgmlType::Q8_0, 576, 1536, 32),
            (
                "smollm2 ffn_down q8_0 N=128",
                GgmlType::Q8_0,
                1536,
                576,
                128,
            ),
            ("8b ffn_up q4_0 N=1", GgmlType::Q4_0, 4096, 14336, 1),
            ("8b attn_q q4_0 N=8", GgmlType::Q4_0, 4096, 4096, 8),
            ("8b attn_q q4_0 N=128", GgmlType::Q4_0, 4096, 4096, 128),
            ("8b output q6_K N=1", GgmlType::Q6_K, 4096, 8192, 1),
            ("f16 N=1", GgmlType::F16, 2048, 2048, 1),
        ];
        let mut worst: f64 = 1.0;
        eprintln!(
            "{:<32} {:>12} {:>12} {:>7}",
            "node", "predicted us", "measured us", "ratio"
        );
        let mut report = |name: &str, nodes: &[Tensor]| {
            let t = time_graph(be.as_mut(), nodes).unwrap() / nodes.len() as f64;
            let p = model.compute_us(&nodes[0], Place::Cpu);
            eprintln!("{name:<32} {p:>12.1} {t:>12.1} {:>7.2}", p / t);
            if t >= 50.0 {
                worst = worst.max(p / t).max(t / p);
            }
        };
        for (name, ty, k, m, n) in products {
            let mat = align(ty.row_size(k) * m);
            let x_at = size - align(k * n * 4) - align(m * n * 4);
            let copies = ((x_at / 2) / mat).clamp(1, 32).min((64 << 20) / mat).max(1);
            let x = tensor(GgmlType::F32, [k, n, 1, 1], at(base, x_at));
            let ws: Vec<Synth> = (0..copies)
                .map(|i| tensor(ty, [k, m, 1, 1], at(base, i * mat)))
                .collect();
            let ds: Vec<Synth> = ws
                .iter()
                .map(|w| {
                    let mut d = tensor(
                        GgmlType::F32,
                        [m, n, 1, 1],
                        at(base, size - align(m * n * 4)),
                    );
                    d.op(op::MUL_MAT).src(0, w).src(1, &x);
                    d
                })
                .collect();
            let nodes: Vec<Tensor> = ds.iter().map(|d| d.tensor()).collect();
            assert!(cpu.supports_op(&nodes[0]), "{name}");
            report(name, &nodes);
        }
        // Streaming: ADD of a token's hidden state, of a prompt's, of 4M floats.
        for (name, n) in [
            ("add 576", 576),
            ("add 576x128", 576 * 128),
            ("add 4M", 4 << 20),
        ] {
            let a = tensor(GgmlType::F32, [n, 1, 1, 1], base);
            let b = tensor(GgmlType::F32, [n, 1, 1, 1], at(base, align(n * 4)));
            let ds: Vec<Synth> = (0..8)
                .map(|_| {
                    let mut d = tensor(GgmlType::F32, [n, 1, 1, 1], at(base, 2 * align(n * 4)));
                    d.op(op::ADD).src(0, &a).src(1, &b);
                    d
                })
                .collect();
            let nodes: Vec<Tensor> = ds.iter().map(|d| d.tensor()).collect();
            report(name, &nodes);
        }
        // Attention, SmolLM2's heads (64 wide, 9 query heads on 3 KV heads).
        for (name, nq, nkv) in [
            ("fa smollm2 1x1024", 1, 1024),
            ("fa smollm2 128x512", 128, 512),
        ] {
            let (d, h, hkv) = (64, 9, 3);
            let q = tensor(GgmlType::F32, [d, nq, h, 1], base);
            let k = tensor(GgmlType::F16, [d, nkv, hkv, 1], at(base, 1 << 20));
            let v = tensor(GgmlType::F16, [d, nkv, hkv, 1], at(base, 2 << 20));
            let mut o = tensor(GgmlType::F32, [d, h, nq, 1], at(base, 3 << 20));
            o.op(op::FLASH_ATTN_EXT)
                .src(0, &q)
                .src(1, &k)
                .src(2, &v)
                .param_f32(0, 0.125);
            let nodes = [o.tensor()];
            assert!(cpu.supports_op(&nodes[0]), "{name}");
            report(name, &nodes);
        }
        assert!(worst < 2.0, "a prediction is off by {worst:.2}x");
    }
}
