//! Test helpers: ggml tensors over owned memory, and running one node through the real
//! CPU backend on a chosen number of threads.

use crate::cpu::backend::CpuBackend;
use crate::cpu::types::{load_f32, store_f32, traits};
use crate::device::Backend;
use crate::ffi::abi::ggml_tensor;
use crate::ggml_types::GgmlType;
use crate::tensor::Tensor;

pub struct TT {
    pub t: Box<ggml_tensor>,
    /// Owns the memory `t.data` points into.
    _buf: Vec<u8>,
}

impl TT {
    /// A contiguous tensor of `ty` and shape `ne`, zero filled.
    pub fn new(ty: GgmlType, ne: [usize; 4]) -> TT {
        let mut nb = [0usize; 4];
        nb[0] = ty.type_size();
        nb[1] = ty.row_size(ne[0]);
        nb[2] = nb[1] * ne[1];
        nb[3] = nb[2] * ne[2];
        TT::strided(ty, ne, nb, nb[3] * ne[3])
    }

    /// A tensor with explicit strides over `bytes` of zeroed memory.
    pub fn strided(ty: GgmlType, ne: [usize; 4], nb: [usize; 4], bytes: usize) -> TT {
        let mut t: Box<ggml_tensor> = Box::new(unsafe { std::mem::zeroed() });
        t.type_ = ty as i32;
        t.ne = ne.map(|v| v as i64);
        t.nb = nb;
        let mut buf = vec![0u8; bytes + 64];
        t.data = buf.as_mut_ptr() as *mut std::ffi::c_void;
        TT { t, _buf: buf }
    }

    pub fn ty(&self) -> GgmlType {
        GgmlType::from_raw(self.t.type_).unwrap()
    }

    pub fn ne(&self) -> [usize; 4] {
        self.t.ne.map(|v| v as usize)
    }

    fn elem_ptr(&self, i: [usize; 4]) -> *mut u8 {
        let nb = self.t.nb;
        unsafe {
            (self.t.data as *mut u8).add(i[0] * nb[0] + i[1] * nb[1] + i[2] * nb[2] + i[3] * nb[3])
        }
    }

    fn each_index(&self, mut f: impl FnMut(usize, [usize; 4])) {
        let ne = self.ne();
        let mut k = 0;
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        f(k, [i0, i1, i2, i3]);
                        k += 1;
                    }
                }
            }
        }
    }

    /// Writes values in logical order (float types, I32, I64).
    pub fn set(&mut self, v: &[f32]) -> &mut Self {
        let ty = self.ty();
        if ty.is_quantized() {
            let ne = self.ne();
            let from = traits(ty).unwrap().from_f32.unwrap();
            for r in 0..ne[1] * ne[2] * ne[3] {
                let p = self.elem_ptr([0, r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2])]);
                unsafe { from(&v[r * ne[0]..(r + 1) * ne[0]], p) };
            }
            return self;
        }
        self.each_index(|k, i| unsafe {
            let p = self.elem_ptr(i);
            match ty {
                GgmlType::I32 => *(p as *mut i32) = v[k] as i32,
                GgmlType::I64 => *(p as *mut i64) = v[k] as i64,
                _ => store_f32(ty, p, v[k]),
            }
        });
        self
    }

    /// Reads values in logical order (float types, I32, I64).
    pub fn get(&self) -> Vec<f32> {
        let ty = self.ty();
        let mut out = vec![0f32; self.ne().iter().product()];
        self.each_index(|k, i| unsafe {
            let p = self.elem_ptr(i);
            out[k] = match ty {
                GgmlType::I32 => *(p as *const i32) as f32,
                GgmlType::I64 => *(p as *const i64) as f32,
                _ => load_f32(ty, p),
            }
        });
        out
    }

    pub fn op(&mut self, op: i32) -> &mut Self {
        self.t.op = op;
        self
    }

    pub fn pi(&mut self, i: usize, v: i32) -> &mut Self {
        self.t.op_params[i] = v;
        self
    }

    pub fn pf(&mut self, i: usize, v: f32) -> &mut Self {
        self.t.op_params[i] = v.to_bits() as i32;
        self
    }

    pub fn src(&mut self, i: usize, s: &TT) -> &mut Self {
        self.t.src[i] = &*s.t as *const ggml_tensor as *mut ggml_tensor;
        self
    }

    pub fn tensor(&self) -> Tensor<'_> {
        unsafe { Tensor::from_ptr(&*self.t).unwrap() }
    }
}

/// Deterministic pseudo-random values in [lo, hi).
pub fn rand_vec(n: usize, seed: u32, lo: f32, hi: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            lo + (hi - lo) * ((x >> 8) as f32 / (1u32 << 24) as f32)
        })
        .collect()
}

/// Checks supports_op, then runs the node on `nth` threads.
pub fn run(node: &TT, nth: usize) {
    let t = node.tensor();
    assert!(super::supports(&t), "node not supported");
    let mut be = CpuBackend::new(nth).unwrap();
    be.compute(&[t]).unwrap();
}

pub fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "element {i}: got {g}, want {w}");
    }
}
