//! Small host-to-device writes without waiting (`buffer_set_tensor` of a generated token's
//! inputs). ggml's scheduler writes each input of a graph with a synchronous set_tensor,
//! about ten of them per token; a synchronous copy from pageable memory costs the host ~6 µs
//! (the driver stages it and waits for the DMA). Here the bytes are copied into pinned
//! staging memory and the copy to the device is queued on the device's I/O stream (`GpuCtx`),
//! so the call returns at once, and the caller may reuse its memory at once.
//!
//! Why that is still a synchronous write for every reader: every read, fill or copy of
//! device memory by the host runs on the same I/O stream, after it, and each backend makes
//! its stream wait for the staged copies before it queues its next work
//! (`GpuCtx::order_after_staged`). A buffer being freed waits for the copies first (`quiesce`).
//! Nothing is queued on the legacy (null) stream: that would tie it to whatever stream
//! another thread is capturing into a graph, and break that capture.
//!
//! Staging is two halves of pinned memory used in turn: the half being filled is reused only
//! after an event recorded when it was left says that its copies are done.

use super::api::{DevPtr, Event, GpuApi, Stream};

/// Largest write that is staged (bigger ones are copied as before: they are not per-token).
pub const STAGE_MAX: usize = 64 << 10;
/// Bytes of one half of the staging memory.
const HALF: usize = 512 << 10;
/// Start of each staged piece (the DMA engines prefer aligned sources).
const PIECE_ALIGN: usize = 64;

pub struct Staging {
    host: *mut u8,
    events: [Event; 2],
    /// Whether events[i] was recorded since half i was last waited for.
    recorded: [bool; 2],
    cur: usize,
    used: usize,
    /// Copies were queued since the last `quiesce`.
    dirty: bool,
}

// The pointer is pinned host memory owned by this value; access goes through the Mutex in GpuCtx.
unsafe impl Send for Staging {}

impl Staging {
    /// Pinned memory and two events of device `ord`; None where the runtime gives neither.
    pub fn new(api: &dyn GpuApi, ord: usize) -> Option<Staging> {
        let host = api.host_alloc(ord, 2 * HALF).ok()?;
        let e0 = api.event_create(ord).ok();
        let e1 = api.event_create(ord).ok();
        match (e0, e1) {
            (Some(a), Some(b)) => Some(Staging {
                host,
                events: [a, b],
                recorded: [false; 2],
                cur: 0,
                used: 0,
                dirty: false,
            }),
            (a, b) => {
                a.into_iter()
                    .chain(b)
                    .for_each(|e| api.event_destroy(ord, e));
                api.host_free(ord, host);
                None
            }
        }
    }

    /// Queues the copy of `data` to `dst` (len <= STAGE_MAX) on `stream` (always the same one).
    pub fn write(
        &mut self,
        api: &dyn GpuApi,
        ord: usize,
        stream: Stream,
        dst: DevPtr,
        data: &[u8],
    ) -> Result<(), String> {
        debug_assert!(data.len() <= STAGE_MAX);
        let need = data.len().div_ceil(PIECE_ALIGN) * PIECE_ALIGN;
        if self.used + need > HALF {
            // Leave this half with an event after its copies; wait for the other half's.
            api.event_record(ord, self.events[self.cur], stream)?;
            self.recorded[self.cur] = true;
            self.cur ^= 1;
            self.used = 0;
            if self.recorded[self.cur] {
                api.event_sync(ord, self.events[self.cur])?;
                self.recorded[self.cur] = false;
            }
        }
        // SAFETY: [cur * HALF + used, + data.len()) lies inside the 2 * HALF bytes allocated, and
        // no queued copy reads it (this half's earlier copies read below `used`, and the half
        // was waited for before it was filled again).
        let piece = unsafe { self.host.add(self.cur * HALF + self.used) };
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), piece, data.len()) };
        api.copy_htod_async(ord, dst, piece, data.len(), stream)?;
        self.used += need;
        self.dirty = true;
        Ok(())
    }

    /// Waits until every queued copy is done (before device memory is freed).
    pub fn quiesce(&mut self, api: &dyn GpuApi, ord: usize, stream: Stream) -> Result<(), String> {
        if !self.dirty {
            return Ok(());
        }
        // The stream runs in order: the last record covers both halves' copies.
        api.event_record(ord, self.events[self.cur], stream)?;
        api.event_sync(ord, self.events[self.cur])?;
        self.recorded = [false; 2];
        self.dirty = false;
        Ok(())
    }

    pub fn free(&mut self, api: &dyn GpuApi, ord: usize, stream: Stream) {
        let _ = self.quiesce(api, ord, stream);
        self.events.iter().for_each(|&e| api.event_destroy(ord, e));
        api.host_free(ord, self.host);
        self.host = std::ptr::null_mut();
    }
}
