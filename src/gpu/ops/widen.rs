//! MUL_MAT and MUL_MAT_ID with F16 or BF16 activations (src1): widened to F32 (exact) in the
//! scratch, after what the F32 product needs there, then computed as the same product of a
//! shadow node whose src1 is that F32 copy. ggml-cpu converts such activations the same way
//! (widened, then rounded to the weight's vec_dot_type) except for F16 x F16 and BF16 x BF16,
//! which it takes natively: the F32 path rounds the widened values back to f16 / bf16 for
//! those weights (src1_rounding), the same values, so every weight type gives what ggml-cpu
//! gives with the activations as F32.

use super::rows::launch_cpy;
use super::scratch::scratch_bytes;
use super::LaunchCtx;
use crate::ffi::abi::{ggml_tensor, GGML_TENSOR_FLAG_COMPUTE};
use crate::ggml_types::{op, GgmlType};
use crate::gpu::api::ApiResult;
use crate::op_shapes::hadamard_len;
use crate::tensor::Tensor;

/// Whether `node` is a product whose src1 the F32 path takes only widened.
pub(super) fn half_src1(node: &Tensor) -> bool {
    matches!(node.op(), op::MUL_MAT | op::MUL_MAT_ID)
        && hadamard_len(node).is_none()
        && node
            .src(1)
            .is_some_and(|x| matches!(x.ty(), Some(GgmlType::F16 | GgmlType::BF16)))
}

/// The widened src1 (dense F32 at `data`), the CPY that fills it, and the product reading it.
struct Shadow {
    x: Box<ggml_tensor>,
    cpy: Box<ggml_tensor>,
    node: Box<ggml_tensor>,
}

impl Shadow {
    fn new(node: &Tensor, data: usize) -> Shadow {
        let src = node.src(1).expect("half_src1 checked src1");
        let ne = src.ne();
        let nb1 = ne[0] * 4;
        // SAFETY: ggml_tensor is plain data; all zeroes is a tensor without sources or name.
        let mut x: Box<ggml_tensor> = Box::new(unsafe { std::mem::zeroed() });
        x.type_ = GgmlType::F32 as i32;
        x.ne = ne.map(|v| v as i64);
        x.nb = [4, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]];
        x.data = data as *mut std::ffi::c_void;
        x.flags = GGML_TENSOR_FLAG_COMPUTE;
        // SAFETY: a bitwise copy of plain data; the copies' pointers are only read.
        let mut cpy: Box<ggml_tensor> = Box::new(unsafe { std::ptr::read(&*x) });
        cpy.op = op::CPY;
        cpy.src[0] = src.as_ptr();
        let mut n: Box<ggml_tensor> = Box::new(unsafe { std::ptr::read(node.raw()) });
        n.src[1] = &*x as *const ggml_tensor as *mut ggml_tensor;
        Shadow { x, cpy, node: n }
    }

    fn node(&self) -> Tensor<'_> {
        // SAFETY: the box lives as long as self.
        unsafe { Tensor::from_ptr(&*self.node) }.expect("boxed")
    }

    fn cpy(&self) -> Tensor<'_> {
        debug_assert!(std::ptr::eq(self.cpy.data, self.x.data));
        // SAFETY: as above.
        unsafe { Tensor::from_ptr(&*self.cpy) }.expect("boxed")
    }
}

/// Scratch offset of the widened src1: after everything the F32 product uses.
fn widened_at(node: &Tensor) -> usize {
    scratch_bytes(&Shadow::new(node, 0).node()).next_multiple_of(256)
}

/// Scratch a product with half activations needs: the F32 product's, then the widened src1.
pub(super) fn widened_scratch_bytes(node: &Tensor) -> usize {
    widened_at(node) + node.src(1).map_or(0, |x| x.nelements() * 4)
}

/// Widens src1 into the scratch and launches the F32 product `launch` on the shadow node.
pub(super) fn launch_widened(
    node: &Tensor,
    lc: &LaunchCtx,
    launch: fn(&Tensor, &LaunchCtx) -> ApiResult<()>,
) -> ApiResult<()> {
    if lc.scratch == 0 || widened_scratch_bytes(node) > lc.scratch_len {
        return Err(format!(
            "{} '{}': no scratch for its widened activations",
            if node.op() == op::MUL_MAT {
                "MUL_MAT"
            } else {
                "MUL_MAT_ID"
            },
            node.name()
        ));
    }
    let s = Shadow::new(node, lc.scratch as usize + widened_at(node));
    // Nothing quantized earlier is of this copy (its address is the scratch's, not a tensor's).
    lc.q8.set(None);
    launch_cpy(&s.cpy(), lc)?;
    launch(&s.node(), lc)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::cpu::ops::testutil::TT;
    use crate::gpu::kernel_groups::group_of;
    use crate::gpu::kernels::WEIGHT_TYPES;
    use crate::gpu::mock::MockApi;
    use std::sync::Arc;

    /// The kernels a dry run of `node` launches (`LaunchCtx::wants`).
    fn launched(node: &Tensor) -> Vec<String> {
        launched_on(node, true)
    }

    /// The same on a device with (`mma`) or without tensor cores.
    pub(in crate::gpu::ops) fn launched_on(node: &Tensor, mma: bool) -> Vec<String> {
        let api: Arc<dyn crate::gpu::api::GpuApi> = Arc::new(MockApi::new(0));
        let kernels = crate::gpu::kernels::Kernels::new(api.clone(), 0, &MockApi::info(), None);
        let wants = std::cell::RefCell::new(Vec::new());
        let need = scratch_bytes(node);
        let lc = LaunchCtx {
            api: api.as_ref(),
            ord: 0,
            stream: crate::gpu::api::Stream(0),
            kernels: &kernels,
            warp_size: 32,
            compute_units: 4,
            scratch: 1 << 20,
            scratch_len: need,
            fa_counters: 0,
            q8: Default::default(),
            q8_next: Default::default(),
            fuse: false,
            mma,
            wants: Some(&wants),
        };
        super::super::launch(node, &lc).unwrap();
        wants.take()
    }

    /// Every weight type with F32, F16 and BF16 activations, MUL_MAT with 1, 3 and 40 columns
    /// and MUL_MAT_ID: claimed, and every kernel it launches exists in a kernel group (a type
    /// wired into the Rust side but not into the kernel lists fails here, not on a GPU). Half
    /// activations are widened first and then take the F32 path's kernels; the formats with an
    /// integer-dot kernel (every quantized one) use it for one column and
    /// for the experts.
    #[test]
    fn every_weight_type_launches_known_kernels() {
        for &(wt, suffix) in WEIGHT_TYPES {
            let k = 2 * wt.block_size().max(64);
            for xt in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
                for n in [1, 3, 40] {
                    let w = TT::new(wt, [k, 9, 1, 1]);
                    let x = TT::new(xt, [k, n, 2, 1]);
                    let mut d = TT::new(GgmlType::F32, [9, n, 2, 1]);
                    d.op(op::MUL_MAT).src(0, &w).src(1, &x);
                    let node = d.tensor();
                    assert!(super::super::supports(&node), "{wt:?} x {xt:?}");
                    let names = launched(&node);
                    for name in &names {
                        assert!(group_of(name).is_some(), "{wt:?} x {xt:?} n={n}: {name}");
                    }
                    assert_eq!(
                        names[0]
                            == format!(
                                "cpy_{}_f32",
                                if xt == GgmlType::F16 { "f16" } else { "bf16" }
                            ),
                        xt != GgmlType::F32
                    );
                    if n == 1 && super::super::matmul::mvq_mode(wt).is_some() {
                        // (Q4_0 takes a measured shape, mul_mat_vec_q1x_q4_0_r4_u4.)
                        let last = names.last().unwrap();
                        assert!(
                            last.starts_with("mul_mat_vec_q1") && last.ends_with(suffix)
                                || (wt == GgmlType::Q4_0
                                    && last.starts_with("mul_mat_vec_q1x_q4_0")),
                            "{wt:?}: {last}"
                        );
                    }
                }
                let w = TT::new(wt, [k, 9, 4, 1]);
                let x = TT::new(xt, [k, 2, 3, 1]);
                let ids = TT::new(GgmlType::I32, [2, 3, 1, 1]);
                let mut d = TT::new(GgmlType::F32, [9, 2, 3, 1]);
                d.op(op::MUL_MAT_ID).src(0, &w).src(1, &x).src(2, &ids);
                let node = d.tensor();
                assert!(super::super::supports(&node), "MUL_MAT_ID {wt:?} x {xt:?}");
                let names = launched(&node);
                for name in &names {
                    assert!(
                        group_of(name).is_some(),
                        "MUL_MAT_ID {wt:?} x {xt:?}: {name}"
                    );
                }
                if super::super::matmul::mvq_mode(wt).is_some() {
                    assert_eq!(names.last().unwrap(), &format!("mul_mat_id_q_{suffix}"));
                }
            }
        }
    }

    /// Rows that end inside a block are declined for every block format (k = 1.5 blocks; the
    /// same tensors with k = 2 blocks are claimed), with F32 and F16 activations, for MUL_MAT,
    /// MUL_MAT_ID and GET_ROWS.
    #[test]
    fn partial_blocks_are_declined() {
        for &(wt, _) in WEIGHT_TYPES {
            let blk = wt.block_size();
            if blk == 1 {
                continue;
            }
            let ts = wt.type_size();
            let nb = [ts, 4096, 4096 * 9, 4096 * 9];
            for k in [2 * blk, blk + blk / 2] {
                let want = k % blk == 0;
                for xt in [GgmlType::F32, GgmlType::F16] {
                    let w = TT::strided(wt, [k, 9, 1, 1], nb, 4096 * 9);
                    let x = TT::new(xt, [k, 1, 1, 1]);
                    let mut d = TT::new(GgmlType::F32, [9, 1, 1, 1]);
                    d.op(op::MUL_MAT).src(0, &w).src(1, &x);
                    assert_eq!(
                        super::super::supports(&d.tensor()),
                        want,
                        "MUL_MAT {wt:?} k={k}"
                    );
                    let w =
                        TT::strided(wt, [k, 9, 4, 1], [ts, 4096, 4096 * 9, 4096 * 36], 4096 * 36);
                    let x = TT::new(xt, [k, 2, 3, 1]);
                    let ids = TT::new(GgmlType::I32, [2, 3, 1, 1]);
                    let mut d = TT::new(GgmlType::F32, [9, 2, 3, 1]);
                    d.op(op::MUL_MAT_ID).src(0, &w).src(1, &x).src(2, &ids);
                    let got = super::super::supports(&d.tensor());
                    assert_eq!(got, want, "MUL_MAT_ID {wt:?} k={k}");
                }
                let a = TT::strided(wt, [k, 9, 1, 1], nb, 4096 * 9);
                let ids = TT::new(GgmlType::I32, [3, 1, 1, 1]);
                let mut d = TT::new(GgmlType::F32, [k, 3, 1, 1]);
                d.op(op::GET_ROWS).src(0, &a).src(1, &ids);
                assert_eq!(
                    super::super::supports(&d.tensor()),
                    want,
                    "GET_ROWS {wt:?} k={k}"
                );
            }
        }
    }

    /// The shadow product reads a dense F32 copy of src1 placed past the F32 product's own
    /// scratch, and is otherwise the node.
    #[test]
    fn shadow_is_the_f32_product() {
        let mut w: ggml_tensor = unsafe { std::mem::zeroed() };
        w.type_ = GgmlType::Q4_0 as i32;
        w.ne = [64, 9, 1, 1];
        w.nb = [18, 36, 324, 324];
        let mut x: ggml_tensor = unsafe { std::mem::zeroed() };
        x.type_ = GgmlType::F16 as i32;
        x.ne = [64, 3, 2, 1];
        // permuted: rows of dim 2 first
        x.nb = [2, 256, 128, 768];
        let mut d: ggml_tensor = unsafe { std::mem::zeroed() };
        d.type_ = GgmlType::F32 as i32;
        d.op = op::MUL_MAT;
        d.ne = [9, 3, 2, 1];
        d.nb = [4, 36, 108, 216];
        d.src[0] = &mut w;
        d.src[1] = &mut x;
        let node = unsafe { Tensor::from_ptr(&d) }.unwrap();
        assert!(half_src1(&node));
        let s = Shadow::new(&node, 4096);
        let sn = s.node();
        assert!(!half_src1(&sn));
        let sx = sn.src(1).unwrap();
        assert_eq!(sx.dtype(), GgmlType::F32);
        assert_eq!(sx.ne(), [64, 3, 2, 1]);
        assert_eq!(sx.nb(), [4, 256, 768, 1536]);
        assert_eq!(sx.data() as usize, 4096);
        assert_eq!(s.cpy().src(0).unwrap().as_ptr(), &mut x as *mut ggml_tensor);
        assert_eq!(s.cpy().data() as usize, 4096);
        assert_eq!(sn.src(0).unwrap().as_ptr(), &mut w as *mut ggml_tensor);
        let at = widened_at(&node);
        assert!(at >= scratch_bytes(&sn) && at.is_multiple_of(256));
        assert_eq!(widened_scratch_bytes(&node), at + 64 * 6 * 4);
        // The node itself needs the widened copy's room too.
        assert_eq!(scratch_bytes(&node), widened_scratch_bytes(&node));
    }
}
