//! Row-split weights (`-sm row`): a split buffer type spreads each matrix's rows over the GPUs
//! (`split_rows` decides which rows go where), and a split buffer holds, per tensor, one device
//! allocation per GPU with rows. Only MUL_MAT's weights and MUL_MAT_ID's experts live here: the
//! main device's backend multiplies each device's rows there and gathers the results
//! (`backend/split_exec.rs`). An expert tensor (3-D) has each expert's rows divided as a
//! matrix's; a device's slice holds its rows of expert 0, then of expert 1, and so on.
//! The host's reads and writes are scattered over, and gathered from, the devices' slices.

use super::api::DevPtr;
use super::split_rows::{block_pieces, row_ranges};
use super::{GpuCtx, Memory};
use crate::device::{Error, Result};
use crate::ggml_types::GgmlType;
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};

/// Rows of a device's range start at a multiple of this: whole warps of rows for the
/// quantized kernels, any row for float weights.
pub fn row_granularity(t: GgmlType) -> usize {
    match t {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
        _ => 32,
    }
}

/// One split of the rows over every GPU, for one main device (the one that computes).
pub struct SplitBufferType {
    name: CString,
    /// Index of the main device among `ctxs`.
    pub main: usize,
    /// Every GPU, in RFGPU order.
    pub ctxs: Vec<Arc<GpuCtx>>,
    /// Normalised share of the rows per GPU.
    pub fractions: Vec<f32>,
}

impl SplitBufferType {
    /// Fails where a GPU given rows is of another runtime than the main device (copies and
    /// events between them do not exist).
    pub fn new(main: usize, ctxs: Vec<Arc<GpuCtx>>, fractions: Vec<f32>) -> Result<Self> {
        let m = ctxs
            .get(main)
            .ok_or_else(|| Error::Unsupported(format!("no GPU {main}")))?;
        for (i, (c, &f)) in ctxs.iter().zip(&fractions).enumerate() {
            if f > 0.0 && !Arc::ptr_eq(&c.api, &m.api) {
                return Err(Error::Unsupported(format!(
                    "RFGPU{i} is of another runtime than RFGPU{main}: give it 0 in tensor_split"
                )));
            }
        }
        let shares: Vec<String> = fractions.iter().map(|f| format!("{f:.3}")).collect();
        let name = CString::new(format!("RFGPU{main}_Split[{}]", shares.join(","))).unwrap();
        Ok(SplitBufferType {
            name,
            main,
            ctxs,
            fractions,
        })
    }

    pub fn name(&self) -> &CStr {
        &self.name
    }

    /// A buffer of `size` bytes of address space: device memory is taken per tensor.
    pub fn alloc(&self, size: usize) -> SplitBuffer {
        SplitBuffer {
            ctxs: self.ctxs.clone(),
            fractions: self.fractions.clone(),
            size,
            tensors: Mutex::new(HashMap::new()),
        }
    }
}

/// One device's rows of a split tensor.
pub struct Part {
    /// Index of the GPU (RFGPU number).
    pub gpu: usize,
    pub ctx: Arc<GpuCtx>,
    /// Rows `[rows.0, rows.1)` of the whole matrix.
    pub rows: (usize, usize),
    pub ptr: DevPtr,
}

/// A tensor of a split buffer: its rows over the devices (empty ranges left out).
pub struct SplitTensor {
    pub parts: Vec<Part>,
    pub row_bytes: usize,
    /// Matrices one after another (experts; 1 for a matrix), each split the same way.
    pub blocks: usize,
    /// Every device's range, in GPU order, empty ones included (for the byte pieces).
    ranges: Vec<(usize, usize)>,
    /// Index in `parts` of each GPU with rows.
    part_of: Vec<Option<usize>>,
}

impl Drop for SplitTensor {
    fn drop(&mut self) {
        for p in &self.parts {
            p.ctx.quiesce_staging();
            p.ctx.untrack(p.ptr);
            p.ctx.api.free(p.ctx.ord, p.ptr);
        }
    }
}

impl SplitTensor {
    /// Calls `f(part, byte in its slice, byte of the transfer, length)` for each piece of the
    /// bytes `[offset, offset+len)` of the whole tensor.
    fn each_piece(
        &self,
        offset: usize,
        len: usize,
        mut f: impl FnMut(&Part, usize, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let total = self.ranges.last().map_or(0, |r| r.1) * self.row_bytes * self.blocks;
        if offset.checked_add(len).is_none_or(|e| e > total) {
            return Err(Error::Unsupported(format!(
                "range {offset}+{len} outside the split tensor of {total} bytes"
            )));
        }
        for p in block_pieces(&self.ranges, self.row_bytes, self.blocks, offset, len) {
            if let Some(i) = self.part_of[p.part] {
                f(&self.parts[i], p.at, p.from, p.n)?;
            }
        }
        Ok(())
    }
}

/// The device slices of every tensor placed in one split buffer, by tensor address.
pub struct SplitBuffer {
    ctxs: Vec<Arc<GpuCtx>>,
    fractions: Vec<f32>,
    size: usize,
    tensors: Mutex<HashMap<usize, Arc<SplitTensor>>>,
}

impl SplitBuffer {
    pub fn size(&self) -> usize {
        self.size
    }

    /// Takes each device's slice of `t` (a contiguous, non-view tensor). A tensor placed
    /// again (the buffer reused) gets new slices.
    pub fn init_tensor(&self, t: &Tensor) -> Result<()> {
        if !t.raw().view_src.is_null() {
            return Err(Error::Unsupported(format!(
                "'{}' is a view: split buffers hold whole matrices only",
                t.name()
            )));
        }
        let ty = t
            .ty()
            .ok_or_else(|| Error::Unsupported(format!("'{}' has an unknown type", t.name())))?;
        if !t.is_contiguous() || t.is_empty() {
            return Err(Error::Unsupported(format!(
                "'{}' is not a contiguous, non-empty matrix",
                t.name()
            )));
        }
        let rows = t.ne()[1];
        let blocks = t.ne()[2] * t.ne()[3];
        let row_bytes = t.nb()[1];
        let ranges = row_ranges(rows, &self.fractions, row_granularity(ty));
        let mut parts = Vec::new();
        let mut part_of = vec![None; ranges.len()];
        for (gpu, &(r0, r1)) in ranges.iter().enumerate() {
            if r0 == r1 {
                continue;
            }
            let ctx = &self.ctxs[gpu];
            let bytes = (r1 - r0) * row_bytes * blocks;
            let ptr = match ctx.api.alloc(ctx.ord, bytes) {
                Ok(p) => p,
                Err(e) => {
                    // `parts` frees what was taken so far when dropped with the SplitTensor.
                    drop(SplitTensor {
                        parts,
                        row_bytes,
                        blocks,
                        ranges,
                        part_of,
                    });
                    return Err(Error::Alloc(format!(
                        "RFGPU{gpu}: {bytes} bytes for rows {r0}..{r1} of '{}': {e}",
                        t.name()
                    )));
                }
            };
            ctx.track(ptr, bytes, Memory::Device);
            part_of[gpu] = Some(parts.len());
            parts.push(Part {
                gpu,
                ctx: ctx.clone(),
                rows: (r0, r1),
                ptr,
            });
        }
        let st = Arc::new(SplitTensor {
            parts,
            row_bytes,
            blocks,
            ranges,
            part_of,
        });
        self.lock().insert(t.as_ptr() as usize, st);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Arc<SplitTensor>>> {
        self.tensors.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slices of `t`, if it was placed here.
    pub fn tensor(&self, t: &Tensor) -> Option<Arc<SplitTensor>> {
        self.lock().get(&(t.as_ptr() as usize)).cloned()
    }

    fn placed(&self, t: &Tensor) -> Result<Arc<SplitTensor>> {
        self.tensor(t).ok_or_else(|| {
            Error::Unsupported(format!(
                "'{}' was not placed in this split buffer",
                t.name()
            ))
        })
    }

    /// Scatters `data` (bytes `[offset, offset+len)` of the whole tensor) over the slices.
    pub fn write(&self, t: &Tensor, offset: usize, data: &[u8]) -> Result<()> {
        self.placed(t)?
            .each_piece(offset, data.len(), |p, at, from, n| {
                p.ctx
                    .write_device(p.ptr + at as u64, &data[from..from + n])
                    .map_err(Error::Device)
            })
    }

    /// Gathers bytes `[offset, offset+out.len())` of the whole tensor from the slices.
    pub fn read(&self, t: &Tensor, offset: usize, out: &mut [u8]) -> Result<()> {
        let len = out.len();
        self.placed(t)?.each_piece(offset, len, |p, at, from, n| {
            p.ctx
                .read_device(&mut out[from..from + n], p.ptr + at as u64)
                .map_err(Error::Device)
        })
    }

    pub fn fill(&self, t: &Tensor, offset: usize, len: usize, value: u8) -> Result<()> {
        self.placed(t)?.each_piece(offset, len, |p, at, _, n| {
            p.ctx
                .fill_device(p.ptr + at as u64, value, n)
                .map_err(Error::Device)
        })
    }

    /// Fills every slice of every tensor with `value`.
    pub fn clear(&self, value: u8) -> Result<()> {
        let all: Vec<Arc<SplitTensor>> = self.lock().values().cloned().collect();
        for st in all {
            for p in &st.parts {
                let n = (p.rows.1 - p.rows.0) * st.row_bytes * st.blocks;
                p.ctx.fill_device(p.ptr, value, n).map_err(Error::Device)?;
            }
        }
        Ok(())
    }
}
