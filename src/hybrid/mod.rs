//! RFHYBRID: one device whose backend places every node of a graph on the CPU or the GPU by a
//! cost model measured on the machine, keeps the tensors' data where it is needed (host memory
//! is home; the GPU holds copies, tracked per byte range), keeps within a GPU memory budget and
//! reports what ran where (design: docs/hybrid.md).
//!
//! - `device`: the ggml device, its host-memory buffers and its backend;
//! - `scheduler`: `HybridScheduler`, the per-node `BackendSelection`;
//! - `residency`: where each byte range's current data lives, and the GPU copies;
//! - `cost`: the measured cost model and its calibration;
//! - `telemetry`: events, per-device statistics, summary, JSON and Chrome trace;
//! - `capability`: what each device can run, for the scheduler and for C (JSON).

pub mod backend;
pub mod calibrate;
pub mod capability;
pub mod cost;
pub mod device;
pub mod experts;
pub mod fake;
pub mod learned;
pub mod placement;
pub mod prefetch;
pub mod residency;
pub mod scheduler;
pub mod synth;
pub mod telemetry;
pub mod trial;

/// ggml's buffer usages (`ggml_backend_buffer_usage`).
pub const USAGE_WEIGHTS: i32 = 1;
pub const USAGE_COMPUTE: i32 = 2;

/// The usage ggml's host set on the buffer holding `t` (None: no buffer).
pub fn usage(t: &crate::tensor::Tensor) -> Option<i32> {
    unsafe { t.raw().buffer.as_ref().map(|b| b.usage) }
}

/// Where a node runs, or where a copy of some data lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Place {
    Cpu,
    Gpu,
}

impl Place {
    pub fn name(self) -> &'static str {
        match self {
            Place::Cpu => "CPU",
            Place::Gpu => "GPU",
        }
    }
}

/// How the scheduler chooses (ROCMFORGE_HYBRID_STRATEGY, `ggml_backend_rocmforge_hybrid_set_strategy`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ExecutionStrategy {
    /// Every node the GPU supports runs there (weights that do not fit are streamed).
    GpuPreferred,
    /// Every node runs on the CPU.
    CpuPreferred,
    /// Each node where the cost model predicts it finishes first, transfers included.
    Automatic,
    /// One device only; nodes it does not support fall back to the other.
    BackendOnly(Place),
}

impl ExecutionStrategy {
    /// "gpu", "cpu", "auto", "gpu-only", "cpu-only" (case-insensitive).
    pub fn parse(s: &str) -> Option<ExecutionStrategy> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "gpu" | "gpu-preferred" => ExecutionStrategy::GpuPreferred,
            "cpu" | "cpu-preferred" => ExecutionStrategy::CpuPreferred,
            "auto" | "automatic" => ExecutionStrategy::Automatic,
            "gpu-only" => ExecutionStrategy::BackendOnly(Place::Gpu),
            "cpu-only" => ExecutionStrategy::BackendOnly(Place::Cpu),
            _ => return None,
        })
    }
}

/// Why a node runs where it runs.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum SelectionReason {
    /// The strategy prefers the GPU and the GPU supports the node.
    GpuAvailable,
    /// There is no GPU (or it failed).
    GpuUnavailable,
    /// The GPU does not support the node.
    CpuFallback,
    /// The cost model's predictions, µs: compute on each device and the transfers the GPU
    /// placement would need.
    CostModel {
        cpu_us: f64,
        gpu_us: f64,
        transfer_us: f64,
    },
    /// The node's data cannot be placed on the GPU within the memory budget.
    MemoryConstraint,
    /// The strategy names the device.
    UserPreference,
}

impl std::fmt::Display for SelectionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelectionReason::GpuAvailable => write!(f, "gpu-available"),
            SelectionReason::GpuUnavailable => write!(f, "gpu-unavailable"),
            SelectionReason::CpuFallback => write!(f, "cpu-fallback"),
            SelectionReason::CostModel {
                cpu_us,
                gpu_us,
                transfer_us,
            } => write!(
                f,
                "cost-model cpu {cpu_us:.1}us gpu {gpu_us:.1}us transfer {transfer_us:.1}us"
            ),
            SelectionReason::MemoryConstraint => write!(f, "memory-constraint"),
            SelectionReason::UserPreference => write!(f, "user-preference"),
        }
    }
}

/// The scheduler's decision for one node.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct BackendSelection {
    pub place: Place,
    pub reason: SelectionReason,
    /// Predicted µs for the node on `place`, transfers into it included.
    pub predicted_us: f64,
}
