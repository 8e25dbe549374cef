//! What each device can run (`OpCapability`), collected by `CapabilityProvider` from the
//! devices' own `supports_op` over probe nodes, for the scheduler and for C (JSON).
//! (Interface; the probes are filled in by their own commit.)

use crate::device::Device;

#[derive(Clone, Debug, PartialEq)]
pub struct OpCapability {
    /// ggml op name ("MUL_MAT").
    pub op: &'static str,
    /// Types accepted as weights (src0 of products), activations (src1 / inputs), KV cache.
    pub weight_types: Vec<&'static str>,
    pub activation_types: Vec<&'static str>,
    pub kv_types: Vec<&'static str>,
    /// Largest buffer the device allocates, bytes.
    pub max_buffer_bytes: usize,
    /// Features the device's kernels for the op use ("tensor-cores", "avx512", ...).
    pub features: Vec<String>,
}

pub struct DeviceCapabilities {
    pub device: String,
    pub ops: Vec<OpCapability>,
}

pub struct CapabilityProvider;

impl CapabilityProvider {
    pub fn collect(_devices: &[&dyn Device]) -> Vec<DeviceCapabilities> {
        Vec::new()
    }

    /// `{"devices":[{"name":...,"ops":[...]}]}`.
    pub fn to_json(_caps: &[DeviceCapabilities]) -> String {
        "{\"devices\":[]}".into()
    }
}
