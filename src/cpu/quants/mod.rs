//! Quantized block formats, one file per format (block layout, dequantize, quantize, dot).

use super::types::TypeTraits;
use crate::ggml_types::GgmlType;

/// Kernels for a quantized type, or None where the CPU device does not handle it.
pub fn traits(_t: GgmlType) -> Option<TypeTraits> {
    None
}
