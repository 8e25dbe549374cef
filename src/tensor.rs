//! A read-only, safe view of a `ggml_tensor` owned by the host, plus the shape helpers
//! (element counts, byte sizes, contiguity) that every kernel needs.

use crate::ffi::abi::{ggml_tensor, GGML_MAX_DIMS};
use crate::ggml_types::GgmlType;

/// A borrowed ggml tensor. Reading its fields is safe; its `data` pointer is only
/// dereferenced by kernels, which check shapes first.
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    raw: &'a ggml_tensor,
}

// Kernels on several threads read the same node; each writes a disjoint part of its output.
unsafe impl Send for Tensor<'_> {}
unsafe impl Sync for Tensor<'_> {}

impl<'a> Tensor<'a> {
    /// # Safety
    /// `ptr` must be null or point to a live `ggml_tensor` for `'a`.
    pub unsafe fn from_ptr(ptr: *const ggml_tensor) -> Option<Tensor<'a>> {
        ptr.as_ref().map(|raw| Tensor { raw })
    }

    pub fn raw(&self) -> &'a ggml_tensor {
        self.raw
    }

    pub fn as_ptr(&self) -> *mut ggml_tensor {
        self.raw as *const ggml_tensor as *mut ggml_tensor
    }

    pub fn ty(&self) -> Option<GgmlType> {
        GgmlType::from_raw(self.raw.type_)
    }

    /// The element type; only call after `supports_op` accepted the node.
    pub fn dtype(&self) -> GgmlType {
        self.ty().expect("tensor type checked by supports_op")
    }

    pub fn op(&self) -> i32 {
        self.raw.op
    }

    pub fn ne(&self) -> [usize; 4] {
        self.raw.ne.map(|v| v.max(0) as usize)
    }

    pub fn nb(&self) -> [usize; 4] {
        self.raw.nb
    }

    pub fn data(&self) -> *mut u8 {
        self.raw.data as *mut u8
    }

    pub fn src(&self, i: usize) -> Option<Tensor<'a>> {
        unsafe { Tensor::from_ptr(self.raw.src[i]) }
    }

    pub fn param_i32(&self, i: usize) -> i32 {
        self.raw.op_params[i]
    }

    pub fn param_f32(&self, i: usize) -> f32 {
        f32::from_bits(self.raw.op_params[i] as u32)
    }

    pub fn name(&self) -> String {
        let bytes: Vec<u8> = self
            .raw
            .name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The node and every source have a type this library knows.
    pub fn types_known(&self) -> bool {
        self.ty().is_some()
            && (0..crate::ffi::abi::GGML_MAX_SRC)
                .all(|i| self.src(i).is_none_or(|s| s.ty().is_some()))
    }

    pub fn nelements(&self) -> usize {
        self.ne().iter().product()
    }

    pub fn nrows(&self) -> usize {
        let ne = self.ne();
        ne[1] * ne[2] * ne[3]
    }

    pub fn is_empty(&self) -> bool {
        self.raw.ne.iter().any(|&n| n <= 0)
    }

    /// Bytes spanned by the tensor in memory, as `ggml_nbytes` counts them.
    pub fn nbytes(&self) -> usize {
        match self.ty() {
            Some(t) => nbytes(t, &self.raw.ne, &self.raw.nb),
            None => 0,
        }
    }

    /// Every dimension is densely packed (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        self.is_contiguous_from(0)
    }

    /// Dims above `n` are dense; dims 1..=n may have any stride (ggml_is_contiguous_n).
    pub fn is_contiguous_from(&self, n: usize) -> bool {
        let Some(t) = self.ty() else { return false };
        let ne = self.raw.ne;
        let nb = self.raw.nb;
        let mut next = t.type_size();
        if ne[0] != t.block_size() as i64 && nb[0] != next {
            return false;
        }
        next *= ne[0] as usize / t.block_size();
        for i in 1..GGML_MAX_DIMS {
            if ne[i] != 1 {
                if i > n {
                    if nb[i] != next {
                        return false;
                    }
                    next *= ne[i] as usize;
                } else {
                    next = ne[i] as usize * nb[i];
                }
            }
        }
        true
    }

    /// Elements within a row are densely packed.
    pub fn has_dense_rows(&self) -> bool {
        match self.ty() {
            Some(t) => self.raw.nb[0] == t.type_size(),
            None => false,
        }
    }

    pub fn same_shape(&self, other: &Tensor) -> bool {
        self.raw.ne == other.raw.ne
    }

    /// `other` can be broadcast to `self` by repeating whole copies along every dimension.
    pub fn can_repeat_from(&self, other: &Tensor) -> bool {
        let a = self.raw.ne;
        let b = other.raw.ne;
        (0..4).all(|i| b[i] > 0 && a[i] % b[i] == 0)
    }

    /// Byte offset of element (i0, i1, i2, i3).
    #[inline]
    pub fn offset(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> usize {
        let nb = &self.raw.nb;
        i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
    }

    /// Byte offset of row (i1, i2, i3).
    #[inline]
    pub fn row_offset(&self, i1: usize, i2: usize, i3: usize) -> usize {
        let nb = &self.raw.nb;
        i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
    }
}

/// `ggml_nbytes` for a type, shape and strides.
pub fn nbytes(t: GgmlType, ne: &[i64; 4], nb: &[usize; 4]) -> usize {
    if ne.iter().any(|&n| n <= 0) {
        return 0;
    }
    let blck = t.block_size();
    let mut bytes = if blck == 1 {
        t.type_size()
    } else {
        ne[0] as usize * nb[0] / blck
    };
    for i in (if blck == 1 { 0 } else { 1 })..4 {
        bytes += (ne[i] as usize - 1) * nb[i];
    }
    bytes
}

/// Splits `n` items into `nth` nearly equal ranges and returns range `ith`.
#[inline]
pub fn split_range(n: usize, ith: usize, nth: usize) -> std::ops::Range<usize> {
    let per = n.div_ceil(nth.max(1));
    let start = (per * ith).min(n);
    let end = (start + per).min(n);
    start..end
}
