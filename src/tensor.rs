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
            // c_char is i8 on x86-64 and u8 on aarch64.
            .map(|&c| u8::from_ne_bytes(c.to_ne_bytes()))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The node and every source have a type this library knows.
    pub fn types_known(&self) -> bool {
        self.ty().is_some()
            && (0..crate::ffi::abi::GGML_MAX_SRC)
                .all(|i| self.src(i).is_none_or(|s| s.ty().is_some()))
    }

    /// Elements of the tensor; saturates at usize::MAX (a host can write any `ne`), which
    /// no geometry check lets through.
    pub fn nelements(&self) -> usize {
        self.ne()
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .unwrap_or(usize::MAX)
    }

    /// Rows (ne[1]·ne[2]·ne[3]); saturates like `nelements`.
    pub fn nrows(&self) -> usize {
        let ne = self.ne();
        ne[1..]
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .unwrap_or(usize::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.raw.ne.iter().any(|&n| n <= 0)
    }

    /// Bytes spanned by the tensor in memory, as `ggml_nbytes` counts them; usize::MAX where
    /// that overflows (never 0: `nb[3] = 1<<63, ne[3] = 3` must not look empty).
    pub fn nbytes(&self) -> usize {
        match self.ty() {
            Some(t) => nbytes(t, &self.raw.ne, &self.raw.nb),
            None => 0,
        }
    }

    /// Whether the shape and strides can be computed on: a known type, no negative extent,
    /// whole blocks per row for block types, at most `MAX_ELEMENTS` elements, and a byte
    /// span that fits in the address space. Asked before memory exists (supports_op).
    pub fn check_geometry(&self) -> Result<(), String> {
        self.span_len().map(|_| ())
    }

    /// The address range [start, end) the tensor's elements occupy, checked (see
    /// `check_geometry`); an empty tensor spans nothing. Every device checks this range
    /// against the memory the tensor claims to be in before a kernel touches it.
    pub fn data_range(&self) -> Result<(usize, usize), String> {
        let len = self.span_len()?;
        let start = self.raw.data as usize;
        let end = start
            .checked_add(len)
            .ok_or_else(|| format!("data at {start:#x} + {len} bytes wraps the address space"))?;
        if len > 0 && !start.is_multiple_of(element_alignment(self.dtype())) {
            return Err(format!(
                "data at {start:#x} is not aligned for {}",
                self.dtype().name()
            ));
        }
        Ok((start, end))
    }

    /// Bytes from the first to past the last byte any kernel may touch: for every dimension
    /// (ne-1)·nb, plus one element (or block). A row of blocks counts blocks of at least the
    /// block's size apart (kernels read blocks whole, whatever nb[0] says).
    fn span_len(&self) -> Result<usize, String> {
        let t = self
            .ty()
            .ok_or_else(|| format!("unknown type {}", self.raw.type_))?;
        let (ne, nb) = (self.raw.ne, self.raw.nb);
        if let Some(d) = ne.iter().position(|&n| n < 0) {
            return Err(format!("ne[{d}] = {} is negative", ne[d]));
        }
        let blck = t.block_size() as i64;
        if ne[0] % blck != 0 {
            return Err(format!(
                "ne[0] = {} is not a multiple of the {} block of {blck}",
                ne[0],
                t.name()
            ));
        }
        let elems = ne
            .iter()
            .try_fold(1u64, |a, &n| a.checked_mul(n as u64))
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| format!("shape {ne:?} has more than 2^48 elements"))?;
        if elems == 0 {
            return Ok(0);
        }
        let overflow = || format!("shape {ne:?} with strides {nb:?} overflows");
        let step0 = nb[0].max(t.type_size());
        let mut len = t.type_size();
        for (i, (&n, &b)) in ne.iter().zip(&nb).enumerate() {
            let n = if i == 0 { n / blck } else { n } as usize;
            let stride = if i == 0 { step0 } else { b };
            len = (n - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(len))
                .ok_or_else(overflow)?;
        }
        Ok(len)
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

    /// The two tensors' bytes (from `data`, `nbytes` long) share an address.
    pub fn overlaps(&self, other: &Tensor) -> bool {
        let (a, b) = (self.data() as usize, other.data() as usize);
        a < b + other.nbytes() && b < a + self.nbytes()
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

    /// Byte offset of row `r` of the rows counted flat over dims 1..3 (`nrows`). Not
    /// `r * nb[1]`: a dimension of size 1 may have any stride, even in a contiguous tensor.
    #[inline]
    pub fn flat_row_offset(&self, r: usize) -> usize {
        let ne = self.ne();
        let (i1, i23) = (r % ne[1].max(1), r / ne[1].max(1));
        self.row_offset(i1, i23 % ne[2].max(1), i23 / ne[2].max(1))
    }

    /// Byte offset of row (i1, i2, i3).
    #[inline]
    pub fn row_offset(&self, i1: usize, i2: usize, i3: usize) -> usize {
        let nb = &self.raw.nb;
        i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
    }
}

/// Counts buffers freed (`bump_free_epoch`, called by `buffer_free`). A remembered graph
/// whose addresses were checked at epoch E still refers to the same live buffers while the
/// epoch is E: an address can only come back in another buffer after a free. The GPU keeps
/// it in its repeated-graph key.
#[cfg_attr(test, allow(dead_code))]
static FREE_EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Most words `node_words` writes for one node.
pub const NODE_WORDS: usize = 2 + 8 + TENSOR_WORDS * (1 + crate::ffi::abi::GGML_MAX_SRC);
pub const TENSOR_WORDS: usize = 10;

/// One node's words written into `w` (address, type, shape and strides of it and of its
/// sources up to the last one present, op, flags and parameters); returns how many.
pub fn node_words(n: &Tensor, w: &mut [u64; NODE_WORDS]) -> usize {
    fn tensor(w: &mut [u64; NODE_WORDS], at: usize, t: &crate::ffi::abi::ggml_tensor) {
        w[at] = t.data as usize as u64;
        w[at + 1] = t.type_ as u32 as u64;
        for i in 0..4 {
            w[at + 2 + i] = t.ne[i] as u64;
            w[at + 6 + i] = t.nb[i] as u64;
        }
    }
    let r = n.raw();
    // Flags too: fusion skips writing intermediates that are not graph outputs.
    let nsrc = r
        .src
        .iter()
        .rposition(|s| !s.is_null())
        .map_or(0, |i| i + 1);
    w[0] = r.op as u32 as u64 | (r.flags as u32 as u64) << 32;
    w[1] = nsrc as u64;
    for (i, p) in r.op_params.chunks_exact(2).enumerate() {
        w[2 + i] = p[0] as u32 as u64 | (p[1] as u32 as u64) << 32;
    }
    tensor(w, 10, r);
    let mut at = 10 + TENSOR_WORDS;
    for s in &r.src[..nsrc] {
        match unsafe { s.as_ref() } {
            Some(s) => tensor(w, at, s),
            // An absent source between present ones (words that no tensor writes).
            None => w[at..at + TENSOR_WORDS].fill(u64::MAX),
        }
        at += TENSOR_WORDS;
    }
    at
}

#[cfg(not(test))]
pub fn free_epoch() -> u64 {
    FREE_EPOCH.load(std::sync::atomic::Ordering::Acquire)
}

#[cfg(not(test))]
pub fn bump_free_epoch() {
    FREE_EPOCH.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

// Unit tests run on many threads at once: one test's bump (key_matches_only_the_same_graph)
// must not make another's repeated graph look new (split_exec's capture test failed so, about
// once in four runs of the suite). Each test thread counts its own frees.
#[cfg(test)]
thread_local! {
    static TEST_FREE_EPOCH: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
pub fn free_epoch() -> u64 {
    TEST_FREE_EPOCH.with(|e| e.get())
}

#[cfg(test)]
pub fn bump_free_epoch() {
    TEST_FREE_EPOCH.with(|e| e.set(e.get() + 1));
}

/// Most elements one tensor may have (256 Ti): far beyond any memory, and small enough that
/// the kernels' size arithmetic (elements × bytes per element × threads, `ops::work_size`)
/// cannot overflow for any tensor that passed `check_geometry`.
pub const MAX_ELEMENTS: u64 = 1 << 48;

/// `ggml_nbytes` for a type, shape and strides, computed with checked arithmetic:
/// usize::MAX where it overflows.
pub fn nbytes(t: GgmlType, ne: &[i64; 4], nb: &[usize; 4]) -> usize {
    if ne.iter().any(|&n| n <= 0) {
        return 0;
    }
    let blck = t.block_size();
    let first = if blck == 1 {
        Some(t.type_size())
    } else {
        (ne[0] as usize).checked_mul(nb[0]).map(|b| b / blck)
    };
    (if blck == 1 { 0 } else { 1 }..4)
        .try_fold(first.unwrap_or(usize::MAX), |acc, i| {
            (ne[i] as usize - 1)
                .checked_mul(nb[i])
                .and_then(|x| acc.checked_add(x))
        })
        .filter(|_| first.is_some())
        .unwrap_or(usize::MAX)
}

/// The alignment a kernel's loads of one element (or block) need: plain types their size,
/// blocks that of their f16 scale (Q8_K's is an f32).
fn element_alignment(t: GgmlType) -> usize {
    match t {
        GgmlType::Q8_K => 4,
        _ if t.block_size() > 1 => 2,
        _ => t.type_size(),
    }
}

/// Splits `n` items into `nth` nearly equal ranges and returns range `ith`.
#[inline]
pub fn split_range(n: usize, ith: usize, nth: usize) -> std::ops::Range<usize> {
    let per = n.div_ceil(nth.max(1));
    let start = (per * ith).min(n);
    let end = (start + per).min(n);
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(ty: GgmlType, ne: [i64; 4], nb: [usize; 4]) -> ggml_tensor {
        // SAFETY: ggml_tensor is plain data; all zero is a valid (empty) value.
        let mut t: ggml_tensor = unsafe { std::mem::zeroed() };
        t.type_ = ty as i32;
        t.ne = ne;
        t.nb = nb;
        t.data = 4096 as *mut std::ffi::c_void;
        t
    }

    /// `nb[3] = 1<<63, ne[3] = 3` wraps to a 0..4-byte length in unchecked arithmetic.
    #[test]
    fn wrapping_strides_are_rejected_not_zero() {
        let r = raw(GgmlType::F32, [1, 1, 1, 3], [4, 4, 4, 1 << 63]);
        let t = unsafe { Tensor::from_ptr(&r) }.unwrap();
        assert_eq!(t.nbytes(), usize::MAX);
        assert!(t.check_geometry().is_err());
        assert!(t.data_range().is_err());
    }

    #[test]
    fn geometry_checks() {
        let ok = raw(GgmlType::F32, [8, 2, 1, 1], [4, 32, 64, 64]);
        let t = unsafe { Tensor::from_ptr(&ok) }.unwrap();
        assert_eq!(t.data_range(), Ok((4096, 4096 + 64)));
        assert_eq!(t.nbytes(), 64);
        let mut huge = raw(GgmlType::F32, [8, 2, 1, 1], [4, 32, 64, 64]);
        huge.ne = [1 << 20, 1 << 20, 1 << 20, 1];
        huge.nb = [4, 0, 0, 0];
        let t = unsafe { Tensor::from_ptr(&huge) }.unwrap();
        assert!(t.check_geometry().is_err(), "2^60 elements");
        assert_eq!(
            unsafe { Tensor::from_ptr(&raw(GgmlType::F32, [1 << 32; 4], [4; 4])) }
                .unwrap()
                .nelements(),
            usize::MAX
        );
        let neg = raw(GgmlType::F32, [8, -1, 1, 1], [4, 32, 32, 32]);
        assert!(unsafe { Tensor::from_ptr(&neg) }
            .unwrap()
            .check_geometry()
            .is_err());
        let part = raw(GgmlType::Q8_0, [40, 1, 1, 1], [34, 68, 68, 68]);
        assert!(unsafe { Tensor::from_ptr(&part) }
            .unwrap()
            .check_geometry()
            .is_err());
        let mut odd = raw(GgmlType::F32, [8, 2, 1, 1], [4, 32, 64, 64]);
        odd.data = 4098 as *mut std::ffi::c_void;
        assert!(unsafe { Tensor::from_ptr(&odd) }
            .unwrap()
            .data_range()
            .is_err());
        let mut q = raw(GgmlType::Q4_0, [64, 3, 1, 1], [18, 36, 108, 108]);
        q.data = 4098 as *mut std::ffi::c_void;
        let t = unsafe { Tensor::from_ptr(&q) }.unwrap();
        assert_eq!(t.data_range(), Ok((4098, 4098 + 108)));
        assert_eq!(t.nbytes(), 108);
    }
}
