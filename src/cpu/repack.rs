//! RFCPU's load-time repack buffer type, `RFCPU_REPACK`: the device offers it through
//! `ggml_backend_dev_get_extra_bufts` (as ggml-cpu offers its CPU_REPACK), so libllama places the
//! weight matrices the repacked products handle in it. `set_tensor` lays Q4_0, Q4_K, Q6_K, Q8_0
//! and IQ4_NL matrices out in 16-row groups (`quants/repack_q4_0.rs`, `repack_q4_k.rs`,
//! `repack_q6_k.rs`, `repack_q8_0.rs`, `repack_iq4_nl.rs`), `get_tensor` gives ggml's layout
//! back.
//!
//! Other ops must never read a repacked tensor: the buffer type is not host memory (ggml copies
//! through `get_tensor` where another backend wants the data), the device accepts a node with a
//! source in such a buffer only when it is the weight of a product the repacked kernels run
//! (`product_ok`, checked in `ffi::vtables`), and the kernels know a repacked tensor by the
//! marker `init_tensor` leaves in its `extra` field (`is_repacked`).

use super::buffer::{HostBuffer, ALIGNMENT};
use crate::device::{Buffer, BufferType, Error, Result};
use crate::ggml_types::{op, GgmlType};
use crate::tensor::Tensor;
use std::ffi::CStr;

/// The marker in a repacked tensor's `extra`: its address is all that counts.
static MARK: u8 = 0;

fn mark() -> *mut std::ffi::c_void {
    &MARK as *const u8 as *mut std::ffi::c_void
}

/// Whether `t`'s data is in the repacked layout (set by `init_tensor` of a repack buffer).
pub fn is_repacked(t: &Tensor) -> bool {
    t.raw().extra == mark()
}

/// Marks `t` repacked (tests: a tensor of ours whose data was repacked by hand).
///
/// # Safety
/// `t` must point to a live tensor no other thread reads now.
pub unsafe fn set_mark(t: *mut crate::ffi::abi::ggml_tensor) {
    (*t).extra = mark();
}

/// Whether the device offers the buffer type here: the repacked kernels need AVX-512 VNNI, and
/// ROCMFORGE_CPU_REPACK=0 turns it off.
pub fn enabled() -> bool {
    crate::tuning::get().cpu_repack && crate::cpu::quants::panel::available()
}

/// Why `enabled` is false (for the log line the device writes then).
pub fn why_disabled() -> &'static str {
    if !crate::tuning::get().cpu_repack {
        "ROCMFORGE_CPU_REPACK=0"
    } else {
        "its kernels need AVX-512 VNNI"
    }
}

/// Whether a tensor stored in a repack buffer is repacked: a whole (not a view), contiguous
/// Q4_0 or Q4_K matrix (or stack of them); Q6_K too on Intel. `repack_types` says which.
pub fn repackable(t: &Tensor) -> bool {
    let raw = t.raw();
    let intel = crate::cpu::quants::stream::is_intel();
    let ty_ok = t
        .ty()
        .is_some_and(|ty| repack_types(ty, crate::tuning::get(), intel));
    raw.view_src.is_null() && ty_ok && t.is_contiguous()
}

/// Which weight types RFCPU_REPACK repacks (ROCMFORGE_CPU_REPACK: `q4` Q4_0 and Q4_K only,
/// `all` Q8_0, Q6_K and IQ4_NL too).
/// - Q6_K by default on Intel only: on a 16-core Sapphire Rapids its repacked generation kernel
///   streams 41-42 GB/s at 4 threads where the plain path's rows reach 29 (109-116 against
///   84-87 at 16; 8B-shaped Q4_K_M tg64 26.5 -> 31 t/s at 4 threads), and prompts unpack each
///   group for the same panels (2026-11-27, docs/performance.md). On Zen 4 it measured no
///   faster than the plain path (2026-11-26), so the mapped file is read in place there.
/// - IQ4_NL: no faster than the plain path on Zen 4; not measured on Intel.
/// - Q8_0: a model with tied Q8_0 embeddings (SmolLM2) then holds its output head twice, the
///   mapped file's and the repacked copy (+30 MB, 1.21x ggml-cpu's peak memory, whose x86
///   build repacks no Q8_0), for 1.04x in generation at 2 threads.
fn repack_types(ty: GgmlType, tuning: &crate::tuning::Tuning, intel: bool) -> bool {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_K => true,
        GgmlType::Q6_K => tuning.cpu_repack_all || (intel && !tuning.cpu_repack_q4),
        GgmlType::Q8_0 | GgmlType::IQ4_NL => tuning.cpu_repack_all,
        _ => false,
    }
}

/// Bytes of one repacked matrix of `t` (whose type `repackable` accepted).
pub fn matrix_bytes(t: &Tensor) -> usize {
    let (rows, nb, _) = matrices(t);
    match t.dtype() {
        GgmlType::Q4_K => crate::cpu::quants::repack_q4_k::repacked_bytes(rows, nb),
        GgmlType::Q6_K => rows * nb * 210,
        GgmlType::Q8_0 => rows * nb * 34,
        GgmlType::IQ4_NL => rows * nb * 18,
        _ => rows * nb * 18,
    }
}

/// Repacks (or, with `back`, un-repacks) one matrix of `t` from `src` to `dst`.
///
/// # Safety
/// `src` and `dst` must span the plain and the repacked bytes of one matrix of `t` (swapped
/// with `back`) and not overlap.
unsafe fn convert(t: &Tensor, back: bool, src: *const u8, dst: *mut u8) {
    use crate::cpu::quants::{repack_iq4_nl as ri, repack_q8_0 as r8};
    use crate::cpu::quants::{repack_q4_0 as r0, repack_q4_k as rk, repack_q6_k as r6};
    let (rows, nb, _) = matrices(t);
    match (t.dtype(), back) {
        (GgmlType::Q4_K, false) => rk::repack(rows, nb, src, dst),
        (GgmlType::Q4_K, true) => rk::unrepack(rows, nb, src, dst),
        (GgmlType::Q6_K, false) => r6::repack(rows, nb, src, dst),
        (GgmlType::Q6_K, true) => r6::unrepack(rows, nb, src, dst),
        (GgmlType::IQ4_NL, false) => ri::repack(rows, nb, src, dst),
        (GgmlType::IQ4_NL, true) => ri::unrepack(rows, nb, src, dst),
        (GgmlType::Q8_0, false) => r8::repack(rows, nb, src, dst),
        (GgmlType::Q8_0, true) => r8::unrepack(rows, nb, src, dst),
        (_, false) => r0::repack(rows, nb, src, dst),
        (_, true) => r0::unrepack(rows, nb, src, dst),
    }
}

/// Whether the device computes `node`, whose source `src` lives in a repack buffer: only as
/// the weights of a MUL_MAT the repacked kernels run (float activations, no Hadamard hint).
pub fn product_ok(node: &Tensor, src: usize) -> bool {
    let (Some(w), Some(x)) = (node.src(0), node.src(1)) else {
        return false;
    };
    node.op() == op::MUL_MAT
        && src == 0
        && repackable(&w)
        && matches!(x.ty(), Some(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16))
        && crate::op_shapes::hadamard_len(node).is_none()
        && crate::cpu::quants::panel::available()
}

/// Rows and blocks per row of each matrix of `t`, and how many matrices.
fn matrices(t: &Tensor) -> (usize, usize, usize) {
    let ne = t.ne();
    let blk = t.ty().map_or(32, |ty| ty.block_size());
    (ne[1], ne[0] / blk, ne[2] * ne[3])
}

pub struct RepackBufferType;

impl BufferType for RepackBufferType {
    fn name(&self) -> &CStr {
        c"RFCPU_REPACK"
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        let b = HostBuffer::alloc(size)?;
        // libllama allocates empty ones to ask supports_op about each weight: not news.
        if size > 0 {
            crate::log_info!(
                "RFCPU_REPACK: {size} bytes for Q4_0 / Q4_K / Q6_K / Q8_0 / IQ4_NL weights repacked at load"
            );
        }
        Ok(Box::new(RepackBuffer(b)))
    }
    fn alignment(&self) -> usize {
        ALIGNMENT
    }
    fn is_host(&self) -> bool {
        false
    }
    /// A repacked Q4_K matrix keeps its scales unpacked: 64 bytes more per 16-row super-block.
    fn alloc_size(&self, t: &Tensor) -> usize {
        if repackable(t) {
            let (_, _, mats) = matrices(t);
            (mats * matrix_bytes(t)).max(t.nbytes())
        } else {
            t.nbytes()
        }
    }
}

/// Host memory whose repackable tensors hold the repacked layout.
pub struct RepackBuffer(HostBuffer);

impl RepackBuffer {
    /// Err unless `[offset, offset + len)` is the whole of repacked `t`: the layout moves bytes
    /// between rows, so parts of it cannot be written or read alone.
    fn whole(t: &Tensor, offset: usize, len: usize) -> Result<()> {
        if offset == 0 && len == t.nbytes() {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "'{}' is repacked (RFCPU_REPACK): only the whole tensor ({} bytes) can be set or \
             read, not +{offset}, {len} bytes",
            t.name(),
            t.nbytes()
        )))
    }
}

impl Buffer for RepackBuffer {
    fn base(&self) -> *mut u8 {
        self.0.base()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.0.write(offset, data)
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.0.read(offset, out)
    }
    fn fill(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.0.fill(offset, len, value)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn init_tensor(&mut self, t: &Tensor) -> Result<()> {
        if repackable(t) {
            unsafe { set_mark(t.as_ptr()) };
        }
        Ok(())
    }
    fn set_tensor(&mut self, t: &Tensor, at: usize, offset: usize, data: &[u8]) -> Result<()> {
        if !is_repacked(t) {
            return self.0.write(at, data);
        }
        Self::whole(t, offset, data.len())?;
        let (_, _, mats) = matrices(t);
        let (pb, rb, base) = (t.nbytes() / mats.max(1), matrix_bytes(t), self.0.base());
        if at + mats * rb > self.0.size() {
            return Err(Error::Unsupported("tensor outside its buffer".into()));
        }
        for m in 0..mats {
            unsafe { convert(t, false, data.as_ptr().add(m * pb), base.add(at + m * rb)) };
        }
        Ok(())
    }
    fn get_tensor(&self, t: &Tensor, at: usize, offset: usize, out: &mut [u8]) -> Result<()> {
        if !is_repacked(t) {
            return self.0.read(at, out);
        }
        Self::whole(t, offset, out.len())?;
        let (_, _, mats) = matrices(t);
        let (pb, rb, base) = (t.nbytes() / mats.max(1), matrix_bytes(t), self.0.base());
        if at + mats * rb > self.0.size() {
            return Err(Error::Unsupported("tensor outside its buffer".into()));
        }
        for m in 0..mats {
            unsafe { convert(t, true, base.add(at + m * rb), out.as_mut_ptr().add(m * pb)) };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::repack_types;
    use crate::ggml_types::GgmlType::*;

    /// The default, `q4` and `all` sets, on Intel and elsewhere.
    #[test]
    fn repacked_types_by_knob_and_vendor() {
        let mut t = crate::tuning::Tuning::read();
        for (all, q4, intel, want) in [
            (false, false, false, [true, true, false, false, false]),
            (false, false, true, [true, true, true, false, false]),
            (false, true, true, [true, true, false, false, false]),
            (true, false, false, [true, true, true, true, true]),
            (true, false, true, [true, true, true, true, true]),
        ] {
            (t.cpu_repack_all, t.cpu_repack_q4) = (all, q4);
            let got = [Q4_0, Q4_K, Q6_K, Q8_0, IQ4_NL].map(|ty| repack_types(ty, &t, intel));
            assert_eq!(got, want, "all={all} q4={q4} intel={intel}");
            assert!(!repack_types(Q4_1, &t, intel) && !repack_types(Q5_K, &t, intel));
        }
    }
}
