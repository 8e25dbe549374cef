//! The cost model: how long a node takes on each device and how long moving bytes between host
//! and GPU takes, from numbers measured on this machine (calibration) and refined online from
//! measured node times. (Interface; the calibration is filled in by its own commit.)

use super::Place;
use crate::device::Device;
use crate::tensor::Tensor;

/// What calibration measured (or a synthetic profile for tests).
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Fixed cost of one node, µs (CPU: thread wake-up; GPU: launch).
    pub cpu_node_us: f64,
    pub gpu_node_us: f64,
    /// Effective bandwidth of streaming ops (GB/s), and of weight reads in a
    /// matrix-vector product.
    pub cpu_bw_gbs: f64,
    pub gpu_bw_gbs: f64,
    /// Matrix-product throughput at large batches, GFLOP/s.
    pub cpu_gflops: f64,
    pub gpu_gflops: f64,
    /// Host to device and back, GB/s, from pinned and from pageable memory.
    pub h2d_pinned_gbs: f64,
    pub h2d_pageable_gbs: f64,
    pub d2h_gbs: f64,
    /// Latency of one transfer, µs.
    pub transfer_us: f64,
}

impl Profile {
    /// A profile for tests: the given CPU and GPU bandwidths (GB/s) and PCIe rate; the rest
    /// derived from them.
    pub fn synthetic(cpu_bw_gbs: f64, gpu_bw_gbs: f64, pcie_gbs: f64) -> Profile {
        Profile {
            cpu_node_us: 2.0,
            gpu_node_us: 5.0,
            cpu_bw_gbs,
            gpu_bw_gbs,
            cpu_gflops: cpu_bw_gbs * 20.0,
            gpu_gflops: gpu_bw_gbs * 200.0,
            h2d_pinned_gbs: pcie_gbs,
            h2d_pageable_gbs: pcie_gbs / 3.0,
            d2h_gbs: pcie_gbs,
            transfer_us: 10.0,
        }
    }
}

pub struct CostModel {
    pub profile: Profile,
}

impl CostModel {
    pub fn new(profile: Profile) -> CostModel {
        CostModel { profile }
    }

    /// µs to compute `node` on `place` with its inputs already there.
    pub fn compute_us(&self, node: &Tensor, place: Place) -> f64 {
        let bytes = (node.nbytes()
            + (0..4)
                .filter_map(|i| node.src(i))
                .map(|s| s.nbytes())
                .sum::<usize>()) as f64;
        let (fixed, bw) = match place {
            Place::Cpu => (self.profile.cpu_node_us, self.profile.cpu_bw_gbs),
            Place::Gpu => (self.profile.gpu_node_us, self.profile.gpu_bw_gbs),
        };
        fixed + bytes / (bw * 1e3)
    }

    /// µs to move `bytes` to `to` (from the other side); `pinned`: the host side is page-locked.
    pub fn transfer_us(&self, bytes: usize, to: Place, pinned: bool) -> f64 {
        let gbs = match (to, pinned) {
            (Place::Gpu, true) => self.profile.h2d_pinned_gbs,
            (Place::Gpu, false) => self.profile.h2d_pageable_gbs,
            (Place::Cpu, _) => self.profile.d2h_gbs,
        };
        self.profile.transfer_us + bytes as f64 / (gbs * 1e3)
    }

    /// A measured time for `node` on `place`: later predictions of its kind move towards it.
    pub fn observe(&mut self, _node: &Tensor, _place: Place, _measured_us: f64) {}
}

/// The profile of this machine: read from the cache beside the kernel cache when one was
/// measured for this CPU, GPU, driver and library version, else measured now (seconds, logged)
/// and cached.
pub fn load_or_calibrate(_cpu: &dyn Device, gpu: Option<&dyn Device>) -> Profile {
    Profile::synthetic(50.0, if gpu.is_some() { 2000.0 } else { 0.0 }, 25.0)
}
