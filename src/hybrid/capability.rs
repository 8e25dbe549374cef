//! What each device can run (`OpCapability`), collected by `CapabilityProvider` from the
//! devices' own `supports_op` over probe nodes, for the scheduler and for C (JSON).
//!
//! The probes are synthetic nodes shaped like an 8B-class model's (rows of 4,096, head size
//! 128 and 256, whole blocks of every type), one per op, candidate type and variant: a few
//! hundred `supports_op` calls per device, no memory, no kernels run. What a device accepts
//! for these shapes is what it reports; a node of another shape is still asked for itself.

use super::synth::Synth;
use crate::device::{Device, DeviceKind};
use crate::ggml_types::{glu, op, unary, GgmlType};
use std::fmt::Write as _;

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

impl DeviceCapabilities {
    /// The entry of ggml op `name` ("MUL_MAT"), if the device accepts it at all.
    pub fn op(&self, name: &str) -> Option<&OpCapability> {
        self.ops.iter().find(|o| o.op == name)
    }
}

pub struct CapabilityProvider;

use GgmlType::*;

/// Every type with a block layout a weight can have.
const WEIGHT_TYPES: &[GgmlType] = &[
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
    MXFP4, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, NVFP4, Q1_0, Q2_0,
];

/// Types activations flow in.
const ACTIVATION_TYPES: &[GgmlType] = &[F32, F16, BF16];

/// Ops probed, with the variants (UNARY and GLU sub-ops, op_params[0]) each is probed for.
const PROBES: &[(i32, &[(&str, i32)])] = &[
    (op::MUL_MAT, &[]),
    (op::MUL_MAT_ID, &[]),
    (op::GET_ROWS, &[]),
    (op::SET_ROWS, &[]),
    (op::CPY, &[]),
    (op::CONT, &[]),
    (op::ADD, &[]),
    (op::MUL, &[]),
    (op::SCALE, &[]),
    (op::RMS_NORM, &[]),
    (op::NORM, &[]),
    (op::ROPE, &[]),
    (op::SOFT_MAX, &[]),
    (op::FLASH_ATTN_EXT, &[]),
    (op::GLU, &[("swiglu", glu::SWIGLU), ("geglu", glu::GEGLU)]),
    (op::UNARY, &[("silu", unary::SILU), ("gelu", unary::GELU)]),
];

/// The types accepted in each role by one probe.
#[derive(Default)]
struct Accepted {
    weight: Vec<GgmlType>,
    activation: Vec<GgmlType>,
    kv: Vec<GgmlType>,
}

impl Accepted {
    fn is_empty(&self) -> bool {
        self.weight.is_empty() && self.activation.is_empty() && self.kv.is_empty()
    }
}

fn which(cands: &[GgmlType], f: impl Fn(GgmlType) -> bool) -> Vec<GgmlType> {
    cands.iter().copied().filter(|&t| f(t)).collect()
}

/// `a` with the types of `b` it lacks, in WEIGHT_TYPES order.
fn union(a: &[GgmlType], b: &[GgmlType]) -> Vec<GgmlType> {
    WEIGHT_TYPES
        .iter()
        .copied()
        .filter(|t| a.contains(t) || b.contains(t))
        .collect()
}

fn names(v: &[GgmlType]) -> Vec<&'static str> {
    v.iter().map(|t| t.name()).collect()
}

/// A node `d` of `op` whose sources are `srcs`, asked of the device.
fn asks(dev: &dyn Device, d: &mut Synth, op: i32, srcs: &[&Synth]) -> bool {
    d.op(op);
    for (i, s) in srcs.iter().enumerate() {
        d.src(i, s);
    }
    dev.supports_op(&d.tensor())
}

fn mul_mat(dev: &dyn Device, w: GgmlType, x: GgmlType) -> bool {
    let ws = Synth::new(w, [4096, 256, 1, 1]);
    let xs = Synth::new(x, [4096, 8, 1, 1]);
    asks(
        dev,
        &mut Synth::new(F32, [256, 8, 1, 1]),
        op::MUL_MAT,
        &[&ws, &xs],
    )
}

/// 8 experts of [4096 -> 256], 2 used per token, 8 tokens (the up/gate form: one src1 row
/// per token, broadcast over the experts used).
fn mul_mat_id(dev: &dyn Device, w: GgmlType, x: GgmlType) -> bool {
    let ws = Synth::new(w, [4096, 256, 8, 1]);
    let xs = Synth::new(x, [4096, 1, 8, 1]);
    let ids = Synth::new(I32, [2, 8, 1, 1]);
    let mut d = Synth::new(F32, [256, 2, 8, 1]);
    asks(dev, &mut d, op::MUL_MAT_ID, &[&ws, &xs, &ids])
}

fn get_rows(dev: &dyn Device, a: GgmlType) -> bool {
    let src = Synth::new(a, [4096, 256, 1, 1]);
    let idx = Synth::new(I32, [8, 1, 1, 1]);
    asks(
        dev,
        &mut Synth::new(F32, [4096, 8, 1, 1]),
        op::GET_ROWS,
        &[&src, &idx],
    )
}

/// 8 rows of 1,024 into a cache of 256 rows.
fn set_rows(dev: &dyn Device, src: GgmlType, dst: GgmlType) -> bool {
    let a = Synth::new(src, [1024, 8, 1, 1]);
    let idx = Synth::new(I64, [8, 1, 1, 1]);
    asks(
        dev,
        &mut Synth::new(dst, [1024, 256, 1, 1]),
        op::SET_ROWS,
        &[&a, &idx],
    )
}

fn copy(dev: &dyn Device, op: i32, src: GgmlType, dst: GgmlType) -> bool {
    let a = Synth::new(src, [4096, 8, 1, 1]);
    asks(dev, &mut Synth::new(dst, [4096, 8, 1, 1]), op, &[&a])
}

/// `t` (op) `t` broadcast row -> `t`.
fn binary(dev: &dyn Device, op: i32, t: GgmlType) -> bool {
    let a = Synth::new(t, [4096, 8, 1, 1]);
    let b = Synth::new(t, [4096, 1, 1, 1]);
    asks(dev, &mut Synth::new(t, [4096, 8, 1, 1]), op, &[&a, &b])
}

fn scale(dev: &dyn Device, t: GgmlType) -> bool {
    let a = Synth::new(t, [4096, 8, 1, 1]);
    let mut d = Synth::new(t, [4096, 8, 1, 1]);
    d.param_f32(0, 0.5).param_f32(1, 0.0);
    asks(dev, &mut d, op::SCALE, &[&a])
}

fn norm(dev: &dyn Device, op: i32, t: GgmlType) -> bool {
    let a = Synth::new(t, [4096, 8, 1, 1]);
    let mut d = Synth::new(t, [4096, 8, 1, 1]);
    d.param_f32(0, 1e-5);
    asks(dev, &mut d, op, &[&a])
}

/// NeoX rope over 32 heads of 128, 8 positions (llama's parameters).
fn rope(dev: &dyn Device, t: GgmlType) -> bool {
    let a = Synth::new(t, [128, 32, 8, 1]);
    let pos = Synth::new(I32, [8, 1, 1, 1]);
    let mut d = Synth::new(t, [128, 32, 8, 1]);
    d.param_i32(1, 128)
        .param_i32(2, 2)
        .param_i32(4, 4096)
        .param_f32(5, 10000.0)
        .param_f32(6, 1.0)
        .param_f32(7, 0.0)
        .param_f32(8, 1.0)
        .param_f32(9, 32.0)
        .param_f32(10, 1.0);
    asks(dev, &mut d, op::ROPE, &[&a, &pos])
}

/// 32 heads x 8 rows over 256 keys, with an F16 mask.
fn soft_max(dev: &dyn Device, t: GgmlType) -> bool {
    let a = Synth::new(t, [256, 8, 32, 1]);
    let mask = Synth::new(F16, [256, 8, 1, 1]);
    let mut d = Synth::new(t, [256, 8, 32, 1]);
    d.param_f32(0, 0.088).param_f32(1, 0.0);
    asks(dev, &mut d, op::SOFT_MAX, &[&a, &mask])
}

/// 8 query rows, 32 query heads over 8 KV heads, 256 keys, head size `hd`, F16 mask.
fn flash_attn(dev: &dyn Device, hd: usize, q: GgmlType, kv: GgmlType) -> bool {
    let qs = Synth::new(q, [hd, 8, 32, 1]);
    let k = Synth::new(kv, [hd, 256, 8, 1]);
    let v = Synth::new(kv, [hd, 256, 8, 1]);
    let mask = Synth::new(F16, [256, 8, 1, 1]);
    let mut d = Synth::new(F32, [hd, 32, 8, 1]);
    d.param_f32(0, 1.0 / (hd as f32).sqrt())
        .param_f32(1, 0.0)
        .param_f32(2, 0.0)
        .param_i32(3, 0);
    asks(dev, &mut d, op::FLASH_ATTN_EXT, &[&qs, &k, &v, &mask])
}

/// Gate and up as two tensors of 14,336 x 8 (llama's split form).
fn glu_node(dev: &dyn Device, variant: i32, t: GgmlType) -> bool {
    let a = Synth::new(t, [14336, 8, 1, 1]);
    let b = Synth::new(t, [14336, 8, 1, 1]);
    let mut d = Synth::new(t, [14336, 8, 1, 1]);
    d.param_i32(0, variant);
    asks(dev, &mut d, op::GLU, &[&a, &b])
}

fn unary_node(dev: &dyn Device, variant: i32, t: GgmlType) -> bool {
    let a = Synth::new(t, [4096, 8, 1, 1]);
    let mut d = Synth::new(t, [4096, 8, 1, 1]);
    d.param_i32(0, variant);
    asks(dev, &mut d, op::UNARY, &[&a])
}

/// The types `dev` accepts for `op` (variant: op_params[0] of UNARY / GLU).
fn probe(dev: &dyn Device, op: i32, variant: i32) -> Accepted {
    let acts = ACTIVATION_TYPES;
    match op {
        op::MUL_MAT | op::MUL_MAT_ID => {
            let f: fn(&dyn Device, GgmlType, GgmlType) -> bool = if op == op::MUL_MAT {
                mul_mat
            } else {
                mul_mat_id
            };
            let weight = which(WEIGHT_TYPES, |w| f(dev, w, F32));
            // Activations against an accepted weight type (F32 first: the plainest kernel).
            let w = weight
                .iter()
                .copied()
                .find(|&w| w == F32)
                .or(weight.first().copied());
            let activation = w.map_or(Vec::new(), |w| which(acts, |x| f(dev, w, x)));
            Accepted {
                weight,
                activation,
                kv: Vec::new(),
            }
        }
        op::GET_ROWS => Accepted {
            weight: which(WEIGHT_TYPES, |a| get_rows(dev, a)),
            ..Default::default()
        },
        // Sources into an F16 cache; caches of every type from F32.
        op::SET_ROWS => Accepted {
            activation: which(acts, |s| set_rows(dev, s, F16)),
            kv: which(WEIGHT_TYPES, |d| set_rows(dev, F32, d)),
            ..Default::default()
        },
        // Sources into F32; destinations (KV cache copies) of every type from F32.
        op::CPY => Accepted {
            activation: which(acts, |s| copy(dev, op::CPY, s, F32)),
            kv: which(WEIGHT_TYPES, |d| copy(dev, op::CPY, F32, d)),
            ..Default::default()
        },
        op::CONT => Accepted {
            activation: which(acts, |t| copy(dev, op::CONT, t, t)),
            ..Default::default()
        },
        op::ADD | op::MUL => Accepted {
            activation: which(acts, |t| binary(dev, op, t)),
            ..Default::default()
        },
        op::SCALE => Accepted {
            activation: which(acts, |t| scale(dev, t)),
            ..Default::default()
        },
        op::RMS_NORM | op::NORM => Accepted {
            activation: which(acts, |t| norm(dev, op, t)),
            ..Default::default()
        },
        op::ROPE => Accepted {
            activation: which(acts, |t| rope(dev, t)),
            ..Default::default()
        },
        op::SOFT_MAX => Accepted {
            activation: which(acts, |t| soft_max(dev, t)),
            ..Default::default()
        },
        // Q against an F16 cache; caches with K and V of one type, head size 128 or 256
        // (256 fits the K-quants' blocks).
        op::FLASH_ATTN_EXT => Accepted {
            activation: which(acts, |q| {
                [128, 256].iter().any(|&hd| flash_attn(dev, hd, q, F16))
            }),
            kv: which(WEIGHT_TYPES, |kv| {
                [128, 256].iter().any(|&hd| flash_attn(dev, hd, F32, kv))
            }),
            ..Default::default()
        },
        op::GLU => Accepted {
            activation: which(acts, |t| glu_node(dev, variant, t)),
            ..Default::default()
        },
        op::UNARY => Accepted {
            activation: which(acts, |t| unary_node(dev, variant, t)),
            ..Default::default()
        },
        _ => Accepted::default(),
    }
}

/// What the device is and what its kernels use: "kind:cpu" / "kind:gpu", "device:<its
/// description>", and for the CPU its SIMD level and instruction sets ("simd:avx512",
/// "avx512_vnni").
fn device_features(dev: &dyn Device) -> Vec<String> {
    let mut f = vec![
        match dev.kind() {
            DeviceKind::Cpu => "kind:cpu".to_string(),
            DeviceKind::Gpu => "kind:gpu".to_string(),
        },
        format!("device:{}", dev.description().to_string_lossy()),
    ];
    if dev.kind() == DeviceKind::Cpu {
        for (name, value) in crate::cpu::simd::features() {
            if name == "SIMD" {
                f.push(format!("simd:{}", value.to_ascii_lowercase()));
            } else {
                f.push(name.to_ascii_lowercase());
            }
        }
    }
    f
}

impl CapabilityProvider {
    /// Probes every device with every op of PROBES. UNARY and GLU list the variants the
    /// device accepts among their features ("variant:silu"), their types being the union
    /// over those variants. An op no type of which is accepted is left out.
    pub fn collect(devices: &[&dyn Device]) -> Vec<DeviceCapabilities> {
        devices
            .iter()
            .map(|&dev| {
                let features = device_features(dev);
                let max_buffer_bytes = dev.buffer_type().max_size();
                let mut ops = Vec::new();
                for &(op, variants) in PROBES {
                    let mut acc = Accepted::default();
                    let mut feats = features.clone();
                    if variants.is_empty() {
                        acc = probe(dev, op, 0);
                    }
                    for &(vname, v) in variants {
                        let a = probe(dev, op, v);
                        if !a.is_empty() {
                            feats.push(format!("variant:{vname}"));
                        }
                        acc.weight = union(&acc.weight, &a.weight);
                        acc.activation = union(&acc.activation, &a.activation);
                        acc.kv = union(&acc.kv, &a.kv);
                    }
                    if acc.is_empty() {
                        continue;
                    }
                    ops.push(OpCapability {
                        op: op::name(op),
                        weight_types: names(&acc.weight),
                        activation_types: names(&acc.activation),
                        kv_types: names(&acc.kv),
                        max_buffer_bytes,
                        features: feats,
                    });
                }
                DeviceCapabilities {
                    device: dev.name().to_string_lossy().into_owned(),
                    ops,
                }
            })
            .collect()
    }

    /// `{"devices":[{"name":...,"ops":[...]}]}`.
    pub fn to_json(caps: &[DeviceCapabilities]) -> String {
        let mut s = String::from("{\"devices\":[");
        for (i, d) in caps.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str("{\"name\":");
            json_str(&mut s, &d.device);
            s.push_str(",\"ops\":[");
            for (j, o) in d.ops.iter().enumerate() {
                if j > 0 {
                    s.push(',');
                }
                s.push_str("{\"op\":");
                json_str(&mut s, o.op);
                for (key, list) in [
                    ("weight_types", &o.weight_types),
                    ("activation_types", &o.activation_types),
                    ("kv_types", &o.kv_types),
                ] {
                    let _ = write!(s, ",\"{key}\":");
                    json_list(&mut s, list.iter().copied());
                }
                let _ = write!(s, ",\"max_buffer_bytes\":{}", o.max_buffer_bytes);
                s.push_str(",\"features\":");
                json_list(&mut s, o.features.iter().map(String::as_str));
                s.push('}');
            }
            s.push_str("]}");
        }
        s.push_str("]}");
        s
    }
}

fn json_list<'a>(s: &mut String, items: impl Iterator<Item = &'a str>) {
    s.push('[');
    for (i, v) in items.enumerate() {
        if i > 0 {
            s.push(',');
        }
        json_str(s, v);
    }
    s.push(']');
}

/// Appends `v` as a JSON string (a device description may hold any character).
fn json_str(s: &mut String, v: &str) {
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuDevice;
    use crate::device::{Backend, BufferType, DeviceCaps, Result};
    use crate::hybrid::telemetry::json_valid;
    use crate::tensor::Tensor;
    use std::ffi::CStr;

    /// RFCPU's memory with another device's op table (`accepts`): RFGPU's (src/gpu/ops), to
    /// probe it without a GPU, or none.
    struct Table {
        cpu: CpuDevice,
        kind: DeviceKind,
        accepts: fn(&Tensor) -> bool,
    }

    impl Table {
        fn gpu() -> Table {
            Table {
                cpu: CpuDevice::new(),
                kind: DeviceKind::Gpu,
                accepts: crate::gpu::ops::supports,
            }
        }
    }

    impl Device for Table {
        fn name(&self) -> &CStr {
            c"TABLE"
        }
        fn description(&self) -> &CStr {
            c"table \"of\" RFGPU"
        }
        fn memory(&self) -> (usize, usize) {
            (0, 0)
        }
        fn kind(&self) -> DeviceKind {
            self.kind
        }
        fn caps(&self) -> DeviceCaps {
            DeviceCaps::default()
        }
        fn buffer_type(&self) -> &dyn BufferType {
            self.cpu.buffer_type()
        }
        fn new_backend(&self) -> Result<Box<dyn Backend>> {
            self.cpu.new_backend()
        }
        fn supports_op(&self, node: &Tensor) -> bool {
            (self.accepts)(node)
        }
    }

    fn has(list: &[&str], t: GgmlType) -> bool {
        list.contains(&t.name())
    }

    #[test]
    fn cpu_capabilities() {
        let cpu = CpuDevice::new();
        let caps = CapabilityProvider::collect(&[&cpu]);
        assert_eq!(caps.len(), 1);
        let c = &caps[0];
        assert_eq!(c.device, "RFCPU");
        let mm = c.op("MUL_MAT").expect("MUL_MAT");
        for t in [
            F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, IQ2_XXS,
            IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, NVFP4, Q1_0, Q2_0,
        ] {
            assert!(has(&mm.weight_types, t), "MUL_MAT {t:?}: {mm:?}");
        }
        // F16/BF16 activations with every weight type (issue 25).
        assert_eq!(mm.activation_types, vec!["f32", "f16", "bf16"]);
        assert!(mm.kv_types.is_empty());
        assert_eq!(mm.max_buffer_bytes, cpu.buffer_type().max_size());
        assert!(mm.features.iter().any(|f| f == "kind:cpu"));
        assert!(mm.features.iter().any(|f| f.starts_with("simd:")));
        let fa = c.op("FLASH_ATTN_EXT").expect("FLASH_ATTN_EXT");
        assert!(has(&fa.kv_types, F16) && has(&fa.kv_types, Q8_0), "{fa:?}");
        assert_eq!(fa.activation_types, vec!["f32"]);
        let sr = c.op("SET_ROWS").expect("SET_ROWS");
        assert!(has(&sr.kv_types, F16) && has(&sr.kv_types, Q4_0), "{sr:?}");
        assert_eq!(sr.activation_types, vec!["f32", "f16"]);
        let glu = c.op("GLU").expect("GLU");
        assert!(glu.features.iter().any(|f| f == "variant:swiglu"));
        assert_eq!(glu.activation_types, vec!["f32", "f16"]);
        for op in [
            "MUL_MAT_ID",
            "GET_ROWS",
            "CPY",
            "CONT",
            "ADD",
            "MUL",
            "SCALE",
            "RMS_NORM",
            "NORM",
            "ROPE",
            "SOFT_MAX",
            "UNARY",
        ] {
            let o = c.op(op).unwrap_or_else(|| panic!("no {op}"));
            assert!(
                !o.activation_types.is_empty() || !o.weight_types.is_empty(),
                "{o:?}"
            );
        }
    }

    /// The GPU's table differs where its kernels do: flash attention on F16, F32 and Q8_0
    /// caches only, SET_ROWS into Q8_0 / Q4_0 but not Q4_1; the products and GET_ROWS take
    /// every weight type.
    #[test]
    fn gpu_table_capabilities() {
        let gpu = Table::gpu();
        let caps = CapabilityProvider::collect(&[&gpu]);
        let c = &caps[0];
        let fa = c.op("FLASH_ATTN_EXT").expect("FLASH_ATTN_EXT");
        assert_eq!(fa.kv_types, vec!["f32", "f16", "q8_0"]);
        let sr = c.op("SET_ROWS").expect("SET_ROWS");
        assert!(has(&sr.kv_types, Q8_0) && has(&sr.kv_types, Q4_0) && !has(&sr.kv_types, Q4_1));
        let mm = c.op("MUL_MAT").expect("MUL_MAT");
        assert!(has(&mm.weight_types, Q4_0) && has(&mm.weight_types, F32));
        // Every weight type, ggml 0.26's NVFP4, Q1_0 and Q2_0 included, and F16 / BF16
        // activations (issue 25), for the products and GET_ROWS alike.
        for op in ["MUL_MAT", "MUL_MAT_ID", "GET_ROWS"] {
            let o = c.op(op).unwrap_or_else(|| panic!("no {op}"));
            let all: Vec<&str> = WEIGHT_TYPES.iter().map(|t| t.name()).collect();
            assert_eq!(o.weight_types, all, "{op}");
        }
        assert_eq!(mm.activation_types, vec!["f32", "f16", "bf16"]);
        let mmid = c.op("MUL_MAT_ID").expect("MUL_MAT_ID");
        assert_eq!(mmid.activation_types, vec!["f32", "f16", "bf16"]);
        assert!(mm.features.iter().any(|f| f == "kind:gpu"));
        assert!(!mm.features.iter().any(|f| f.starts_with("simd:")));
        assert!(c.op("NORM").is_some() && c.op("UNARY").is_some());
    }

    #[test]
    fn json_is_well_formed() {
        let cpu = CpuDevice::new();
        let gpu = Table::gpu();
        let caps = CapabilityProvider::collect(&[&cpu, &gpu]);
        let j = CapabilityProvider::to_json(&caps);
        assert!(json_valid(&j), "{j}");
        assert!(j.starts_with("{\"devices\":[{\"name\":\"RFCPU\",\"ops\":[{\"op\":\"MUL_MAT\""));
        assert!(j.contains("\"device:table \\\"of\\\" RFGPU\""), "{j}");
        assert!(j.contains("\"weight_types\":[\"f32\",\"f16\",\"bf16\",\"q4_0\""));
        assert_eq!(CapabilityProvider::to_json(&[]), "{\"devices\":[]}");
    }

    /// A device that accepts nothing reports no op.
    #[test]
    fn ops_without_types_are_left_out() {
        let nothing = Table {
            cpu: CpuDevice::new(),
            kind: DeviceKind::Cpu,
            accepts: |_| false,
        };
        let caps = CapabilityProvider::collect(&[&nothing]);
        assert!(caps[0].ops.is_empty());
    }
}
