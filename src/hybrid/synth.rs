//! Synthetic ggml tensors built in Rust (calibration and capability probes, tests): a
//! `ggml_tensor` struct and, optionally, memory for its data, owned together.

use crate::ffi::abi::ggml_tensor;
use crate::ggml_types::GgmlType;
use crate::tensor::Tensor;

pub struct Synth {
    pub t: Box<ggml_tensor>,
}

impl Synth {
    /// A contiguous tensor of `ty` and shape `ne` with no memory (`data` is null): for
    /// `supports_op` probes. Point `t.data` at memory before computing.
    pub fn new(ty: GgmlType, ne: [usize; 4]) -> Synth {
        let mut nb = [0usize; 4];
        nb[0] = ty.type_size();
        nb[1] = ty.row_size(ne[0]);
        nb[2] = nb[1] * ne[1];
        nb[3] = nb[2] * ne[2];
        let mut t: Box<ggml_tensor> = Box::new(unsafe { std::mem::zeroed() });
        t.type_ = ty as i32;
        t.ne = ne.map(|v| v as i64);
        t.nb = nb;
        Synth { t }
    }

    /// Bytes of the tensor's data (contiguous).
    pub fn nbytes(&self) -> usize {
        self.t.nb[3] * self.t.ne[3].max(0) as usize
    }

    pub fn op(&mut self, op: i32) -> &mut Self {
        self.t.op = op;
        self
    }

    /// Sets source `i`; the source must outlive every use of this tensor.
    pub fn src(&mut self, i: usize, s: &Synth) -> &mut Self {
        self.t.src[i] = &*s.t as *const ggml_tensor as *mut ggml_tensor;
        self
    }

    pub fn param_i32(&mut self, i: usize, v: i32) -> &mut Self {
        self.t.op_params[i] = v;
        self
    }

    pub fn param_f32(&mut self, i: usize, v: f32) -> &mut Self {
        self.t.op_params[i] = v.to_bits() as i32;
        self
    }

    pub fn set_data(&mut self, p: *mut u8) -> &mut Self {
        self.t.data = p as *mut std::ffi::c_void;
        self
    }

    pub fn tensor(&self) -> Tensor<'_> {
        unsafe { Tensor::from_ptr(&*self.t).unwrap() }
    }
}
