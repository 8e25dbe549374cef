//! CPU ops: what the device accepts (`supports`), the scratch each node needs (`work_size`)
//! and the kernel dispatch (`compute`), each a plain `match` on the op, one file per op family.

mod add_id;
mod binary;
mod cpy;
mod flash_attn;
mod flash_attn_tiled;
mod glu;
mod layout;
mod mul_mat;
mod mul_mat_amx;
mod mul_mat_id;
mod mul_mat_panel;
mod mul_mat_repack;
mod mul_mat_repack_rows;
mod norm;
mod reduce;
mod rope;
mod rows;
mod scale;
mod softmax;
mod unary;

#[cfg(test)]
pub(crate) mod testutil;

use super::pool::Worker;
use crate::ggml_types::op;
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// What a kernel gets besides its node: its thread index, the thread count, a barrier and a
/// scratch area shared by the threads of the graph (sized by `work_size`).
pub struct Ctx<'a> {
    pub ith: usize,
    pub nth: usize,
    pub worker: &'a Worker<'a>,
    pub wdata: *mut u8,
    pub wsize: usize,
    /// The node's work counter for `chunks`: 0 when the node starts (the backend resets it
    /// before the barrier in front of the node).
    pub next: &'a AtomicUsize,
}

impl Ctx<'_> {
    /// Waits for all threads of the graph; every thread must call it the same number of times.
    pub fn sync(&self) -> bool {
        self.worker.sync()
    }

    /// Indices `0..n`, in chunks handed to whichever thread asks next: a thread that runs ahead
    /// (a less loaded core, another's turbo) takes more, where a fixed split waits for the
    /// slowest (the busiest of 16 threads took 1.14x the mean in generation, 1.29x in prompts,
    /// on Sapphire Rapids). Every thread of the node iterates it once, each index goes to one
    /// thread; what a thread computes for an index must not depend on which thread it is.
    ///
    /// With 2 threads or fewer a chunk is a whole even share: on the 2-core Zen 4 machine quarter
    /// shares made SmolLM2's generation 10-15% slower at 2 threads (122-136 against 139-154 t/s,
    /// 2026-11-26) for no prompt gain. With more, chunks shrink as the work runs out (half of
    /// what is left over the threads, at least one index): large first chunks keep each
    /// thread's reads in long streams, small last ones leave no thread finishing one large chunk
    /// while the others wait (with quarter shares, the busiest of 16 threads took 1.2x the mean
    /// in a token's products on Sapphire Rapids). `ROCMFORGE_CPU_CHUNKS=quarter` keeps quarter
    /// shares, `guided` takes the shrinking chunks with 2 threads too (A/B runs).
    pub fn chunks(&self, n: usize) -> impl Iterator<Item = usize> + '_ {
        let nth = self.nth;
        let fixed = if nth <= 2 && !crate::tuning::get().cpu_chunks_guided {
            Some(n.div_ceil(nth).max(1))
        } else if crate::tuning::get().cpu_chunks_quarter {
            Some(n.div_ceil(nth * 4).max(1))
        } else {
            None
        };
        std::iter::from_fn(move || match fixed {
            Some(size) => {
                let start = self.next.fetch_add(size, Relaxed);
                (start < n).then(|| start..(start + size).min(n))
            }
            None => {
                let mut start = self.next.load(Relaxed);
                loop {
                    if start >= n {
                        return None;
                    }
                    let size = guided_size(n - start, nth);
                    match self
                        .next
                        .compare_exchange_weak(start, start + size, Relaxed, Relaxed)
                    {
                        Ok(_) => return Some(start..start + size),
                        Err(now) => start = now,
                    }
                }
            }
        })
        .flatten()
    }
}

/// The next chunk's size with `left` indices left on `nth` threads: half of an even share of
/// what is left, at least one.
fn guided_size(left: usize, nth: usize) -> usize {
    (left / (2 * nth)).max(1)
}

/// Whether the CPU device computes `node` (types, shapes and strides included).
pub fn supports(node: &Tensor) -> bool {
    if !node.types_known() {
        return false;
    }
    match node.op() {
        op::NONE | op::VIEW | op::RESHAPE | op::PERMUTE | op::TRANSPOSE => true,
        op::DUP | op::CPY | op::CONT => cpy::supports(node),
        op::ADD | op::SUB | op::MUL | op::DIV => binary::supports(node),
        op::ADD_ID => add_id::supports(node),
        op::SCALE => scale::supports(node),
        op::SOFT_MAX => softmax::supports(node),
        op::MUL_MAT => mul_mat::supports(node),
        op::RMS_NORM | op::NORM | op::L2_NORM => norm::supports(node),
        op::GET_ROWS => rows::supports_get(node),
        op::SET_ROWS => rows::supports_set(node),
        op::ROPE => rope::supports(node),
        op::GLU => glu::supports(node),
        op::FLASH_ATTN_EXT => flash_attn::supports(node),
        op::MUL_MAT_ID => mul_mat_id::supports(node),
        op::CONCAT | op::REPEAT | op::PAD | op::FILL | op::ARANGE | op::DIAG_MASK_INF => {
            crate::op_shapes::layout_op_ok(node)
        }
        op::SUM | op::SUM_ROWS | op::MEAN | op::CUMSUM | op::ARGSORT | op::TOP_K => {
            reduce::supports(node)
        }
        op::UNARY
        | op::SQR
        | op::SQRT
        | op::LOG
        | op::SIN
        | op::COS
        | op::CLAMP
        | op::LEAKY_RELU => unary::supports(node),
        _ => false,
    }
}

/// Scratch bytes `node` needs when run on `nth` threads.
pub fn work_size(node: &Tensor, nth: usize) -> usize {
    match node.op() {
        op::MUL_MAT => mul_mat::work_size(node, nth),
        op::SOFT_MAX => softmax::work_size(node, nth),
        op::ADD | op::SUB | op::MUL | op::DIV => binary::work_size(node, nth),
        op::SET_ROWS => rows::work_size_set(node, nth),
        op::ROPE => rope::work_size(node, nth),
        op::FLASH_ATTN_EXT => flash_attn::work_size(node, nth),
        op::MUL_MAT_ID => mul_mat_id::work_size(node, nth),
        _ => 0,
    }
}

/// How many nodes from `k` on run as one step: 3 for a mixture of experts' gate and up
/// products and their SWIGLU (`mul_mat_id::gate_up_glu`), else 1.
pub fn fused_len(nodes: &[Tensor], k: usize) -> usize {
    if mul_mat_id::gate_up_glu(nodes, k) {
        3
    } else {
        1
    }
}

/// Runs a step (`fused_len` nodes) on this thread's share. Called by every thread of the graph.
pub fn compute_step(nodes: &[Tensor], ctx: &Ctx) {
    match nodes {
        [node] => compute(node, ctx),
        _ => mul_mat_id::compute_gate_up_glu(nodes, ctx),
    }
}

/// Runs `node` on this thread's share. Called by every thread of the graph.
pub fn compute(node: &Tensor, ctx: &Ctx) {
    match node.op() {
        op::DUP | op::CPY | op::CONT => cpy::compute(node, ctx),
        op::ADD | op::SUB | op::MUL | op::DIV => binary::compute(node, ctx),
        op::ADD_ID => add_id::compute(node, ctx),
        op::SCALE => scale::compute(node, ctx),
        op::SOFT_MAX => softmax::compute(node, ctx),
        op::MUL_MAT => mul_mat::compute(node, ctx),
        op::RMS_NORM | op::NORM | op::L2_NORM => norm::compute(node, ctx),
        op::GET_ROWS => rows::compute_get(node, ctx),
        op::SET_ROWS => rows::compute_set(node, ctx),
        op::ROPE => rope::compute(node, ctx),
        op::GLU => glu::compute(node, ctx),
        op::FLASH_ATTN_EXT => flash_attn::compute(node, ctx),
        op::MUL_MAT_ID => mul_mat_id::compute(node, ctx),
        op::CONCAT | op::REPEAT | op::PAD | op::FILL | op::ARANGE | op::DIAG_MASK_INF => {
            layout::compute(node, ctx)
        }
        op::SUM | op::SUM_ROWS | op::MEAN | op::CUMSUM | op::ARGSORT | op::TOP_K => {
            reduce::compute(node, ctx)
        }
        op::UNARY
        | op::SQR
        | op::SQRT
        | op::LOG
        | op::SIN
        | op::COS
        | op::CLAMP
        | op::LEAKY_RELU => unary::compute(node, ctx),
        other => unreachable!("op {other} passed supports_op but has no kernel"),
    }
}

#[cfg(test)]
mod tests {
    use super::Ctx;
    use crate::cpu::pool::{ThreadPool, Worker};
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};

    /// Every index goes to exactly one thread, whatever the thread count and the work size.
    #[test]
    fn chunks_hand_out_each_index_once() {
        for nth in [1, 2, 3, 5, 16] {
            let mut pool = ThreadPool::new(nth).unwrap();
            for n in [0, 1, 2, 7, 31, 64, 1000, 6144] {
                let seen: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                let next = AtomicUsize::new(0);
                pool.run(nth, &|w: &Worker| {
                    let ctx = Ctx {
                        ith: w.ith,
                        nth: w.nth,
                        worker: w,
                        wdata: std::ptr::null_mut(),
                        wsize: 0,
                        next: &next,
                    };
                    for i in ctx.chunks(n) {
                        seen[i].fetch_add(1, Relaxed);
                    }
                })
                .unwrap();
                assert!(seen.iter().all(|c| c.load(Relaxed) == 1), "nth {nth} n {n}");
            }
        }
    }

    /// The chunks shrink from half an even share to single indices (the tail is balanced).
    #[test]
    fn guided_chunks_shrink_to_one() {
        let (n, nth) = (6144usize, 16usize);
        let (mut start, mut sizes) = (0, Vec::new());
        while start < n {
            let size = super::guided_size(n - start, nth);
            sizes.push(size);
            start += size;
        }
        assert_eq!(sizes[0], 192);
        assert_eq!(*sizes.last().unwrap(), 1);
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]));
    }
}
