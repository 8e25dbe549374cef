//! Kernel argument packing: each argument in an 8-byte slot.

use super::quant_dst;
use crate::ggml_types::GgmlType;
use crate::tensor::Tensor;

/// Kernel arguments, each in an 8-byte slot (the runtime reads as many bytes as the
/// parameter's size; little-endian, so 4-byte values sit at the slot's start).
#[derive(Default)]
pub(super) struct Args(pub(super) Vec<u64>);

impl Args {
    pub(super) fn ptr(mut self, p: *const u8) -> Self {
        self.0.push(p as usize as u64);
        self
    }
    pub(super) fn opt_ptr(self, t: Option<Tensor>) -> Self {
        self.ptr(t.map(|t| t.data() as *const u8).unwrap_or(std::ptr::null()))
    }
    pub(super) fn i64(mut self, v: usize) -> Self {
        self.0.push(v as u64);
        self
    }
    pub(super) fn i64s(mut self, v: &[usize]) -> Self {
        self.0.extend(v.iter().map(|&x| x as u64));
        self
    }
    pub(super) fn i32(mut self, v: i32) -> Self {
        self.0.push(v as u32 as u64);
        self
    }
    pub(super) fn f32(mut self, v: f32) -> Self {
        self.0.push(v.to_bits() as u64);
        self
    }
    /// The cache that SET_ROWS `set` writes, as mul_mat_vec_q1_qkv takes its K and V caches:
    /// cache, row ids `idx`, ids are I64, cache is F16, cache rows, row stride. A quantized
    /// cache is written by a later launch (`set` itself, or rot_qkv): the kernel writes `set`'s
    /// F32 source instead (one row, whatever the id: row stride 0).
    pub(super) fn qkv_cache(self, set: &Tensor, idx: &Tensor) -> Self {
        let staged = quant_dst(set.dtype()).is_some();
        let data = if staged {
            set.src(0).map_or(std::ptr::null(), |a| a.data())
        } else {
            set.data()
        };
        self.ptr(data)
            .ptr(idx.data())
            .i32((idx.dtype() == GgmlType::I64) as i32)
            .i32((set.dtype() == GgmlType::F16) as i32)
            .i64(set.ne()[1])
            .i64(if staged { 0 } else { set.nb()[1] })
    }
}
