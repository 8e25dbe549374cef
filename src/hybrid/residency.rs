//! Where each byte's current data lives. Host memory is home: every RFHYBRID buffer is host
//! memory, and the GPU holds copies in *regions* (device allocations, each mirroring one host
//! range: a whole compute or KV buffer, one resident weight tensor, or a weight streamed in
//! for one segment). Each region keeps, per byte range, whether the host, the device or both
//! hold the current data; writes mark the writer's side only, so no stale copy is read and no
//! copy is made twice.

use super::Place;
use crate::device::{Buffer, BufferType, Result};
use std::collections::BTreeMap;

/// Who holds the current data of a byte range of a region.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Host,
    Device,
    Both,
}

impl State {
    pub fn has(self, p: Place) -> bool {
        matches!(
            (self, p),
            (State::Both, _) | (State::Host, Place::Cpu) | (State::Device, Place::Gpu)
        )
    }
}

/// Byte ranges [start, end) of one region (offsets from its start) and their states; the
/// ranges cover the region without gaps, neighbours of equal state are merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Validity {
    map: BTreeMap<usize, (usize, State)>,
}

impl Validity {
    pub fn new(len: usize, s: State) -> Validity {
        let mut map = BTreeMap::new();
        if len > 0 {
            map.insert(0, (len, s));
        }
        Validity { map }
    }

    fn split_at(&mut self, at: usize) {
        if let Some((&s, &(e, st))) = self.map.range(..=at).next_back() {
            if s < at && at < e {
                self.map.insert(s, (at, st));
                self.map.insert(at, (e, st));
            }
        }
    }

    /// Marks [a, b) as `st`.
    pub fn set(&mut self, a: usize, b: usize, st: State) {
        if a >= b {
            return;
        }
        self.split_at(a);
        self.split_at(b);
        let keys: Vec<usize> = self.map.range(a..b).map(|(&k, _)| k).collect();
        for k in keys {
            self.map.remove(&k);
        }
        let (mut a, mut b) = (a, b);
        if let Some((&ps, &(pe, pst))) = self.map.range(..a).next_back() {
            if pe == a && pst == st {
                self.map.remove(&ps);
                a = ps;
            }
        }
        if let Some(&(ne, nst)) = self.map.get(&b) {
            if nst == st {
                self.map.remove(&b);
                b = ne;
            }
        }
        self.map.insert(a, (b, st));
    }

    /// The parts of [a, b) whose current data `p` does not hold.
    pub fn missing(&self, a: usize, b: usize, p: Place) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        let first = self.map.range(..=a).next_back().map_or(a, |(&s, _)| s);
        for (&s, &(e, st)) in self.map.range(first..b) {
            if e <= a || st.has(p) {
                continue;
            }
            let (x, y) = (s.max(a), e.min(b));
            match out.last_mut() {
                Some(last) if last.1 == x => last.1 = y,
                _ => out.push((x, y)),
            }
        }
        out
    }

    /// How many ranges (for tests and telemetry).
    pub fn ranges(&self) -> usize {
        self.map.len()
    }
}

/// What a region holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RegionKind {
    /// A whole compute or KV-cache buffer.
    Mirror,
    /// A weight tensor kept in VRAM.
    Resident,
    /// A weight copied in for the current graph only.
    Stream,
}

pub struct Region {
    pub host: usize,
    pub len: usize,
    pub kind: RegionKind,
    /// Device address of the region's first byte.
    pub dev_base: usize,
    /// The device allocation (None: a slice of the staging arena).
    owner: Option<Box<dyn Buffer>>,
    pub valid: Validity,
}

impl Region {
    pub fn dev_addr(&self, host: usize) -> usize {
        self.dev_base + (host - self.host)
    }
}

/// One RFHYBRID host buffer as the residency map knows it.
#[derive(Clone, Copy, Debug)]
pub struct HostBuf {
    pub len: usize,
    /// Page-locked for the GPU (copies from it run as DMA).
    pub pinned: bool,
    /// The page-locked range [lo, hi) (whole pages inside the buffer): a copy must lie wholly
    /// inside or wholly outside it (the driver refuses one that is partly page-locked).
    pub pin: (usize, usize),
}

/// A copy the caller must make: `len` bytes between host address `host` and device address
/// `dev`, towards `to`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Copy {
    pub host: usize,
    pub dev: usize,
    pub len: usize,
    pub to: Place,
    pub pinned: bool,
}

/// Makes copy `c` with `f`; where the driver refuses it, makes it in two pieces split at a page
/// boundary, and so on down to single pages. The driver refuses a copy whose host range is
/// partly page-locked and partly not, or page-locked by two registrations (weights of one
/// mapped file that RFCPU and RFHYBRID both hold, as a model with tied embeddings has): no
/// piece of a page straddles a registration.
pub fn copy_in_pieces(c: &Copy, f: &mut dyn FnMut(&Copy) -> Result<bool>) -> Result<bool> {
    const PAGE: usize = 4096;
    match f(c) {
        Ok(done) => Ok(done),
        Err(e) => {
            let mid = ((c.host + c.len / 2) & !(PAGE - 1)).max((c.host + 1).next_multiple_of(PAGE));
            if mid <= c.host || mid >= c.host + c.len {
                return Err(e);
            }
            let first = Copy {
                len: mid - c.host,
                ..*c
            };
            let second = Copy {
                host: mid,
                dev: c.dev + (mid - c.host),
                len: c.len - (mid - c.host),
                ..*c
            };
            Ok(copy_in_pieces(&first, f)? & copy_in_pieces(&second, f)?)
        }
    }
}

/// The host buffers, the GPU regions and the budget they share.
pub struct Residency {
    pub bufs: BTreeMap<usize, HostBuf>,
    pub regions: BTreeMap<usize, Region>,
    /// Bytes of device memory RFHYBRID may hold.
    pub budget: usize,
    pub used: usize,
    /// Device memory weights are streamed into for one segment (`Stream` regions), and how
    /// much of it the current segment uses.
    arena: Option<Box<dyn Buffer>>,
    arena_used: usize,
    /// Which half of the arena streamed weights go to now (the other may still be read by
    /// the GPU while this one fills).
    pub arena_half: usize,
    /// The configuration epoch the weights were placed for (None: not yet).
    pub placed_epoch: Option<u64>,
    /// Per backend (by id): the ranges whose state buffer calls changed (the host wrote them,
    /// or read them from the GPU) since its last graph, for a backend that replays a graph
    /// without walking its nodes, and whether there were too many to keep.
    logs: Vec<HostLog>,
    next_log: u64,
    /// The backend that computed the last graph: another one's graph may have changed any
    /// state, so a replay is only for the same backend twice in a row.
    pub last_computer: Option<u64>,
}

/// A backend's id, the ranges buffer calls changed since its last graph, and whether some were
/// not kept.
type HostLog = (u64, Vec<(usize, usize)>, bool);

/// Most host writes kept between graphs (a token's inputs are a handful).
const HOST_LOG_MAX: usize = 1024;

/// Alignment of streamed tensors inside the arena.
pub const ARENA_ALIGN: usize = 256;

impl Residency {
    pub fn new(budget: usize) -> Residency {
        Residency {
            bufs: BTreeMap::new(),
            regions: BTreeMap::new(),
            budget,
            used: 0,
            arena: None,
            arena_used: 0,
            arena_half: 0,
            placed_epoch: None,
            logs: Vec::new(),
            next_log: 1,
            last_computer: None,
        }
    }

    /// Bytes of the staging arena (0: none).
    pub fn arena_size(&self) -> usize {
        self.arena.as_ref().map_or(0, |a| a.size())
    }

    /// Allocates the staging arena (replacing any), if the budget allows.
    pub fn set_arena(&mut self, bt: &dyn BufferType, size: usize) -> Result<bool> {
        self.reset_arena();
        if let Some(a) = self.arena.take() {
            self.used -= a.size();
        }
        if size == 0 || self.used + size > self.budget {
            return Ok(false);
        }
        self.arena = Some(bt.alloc(size)?);
        self.used += size;
        Ok(true)
    }

    /// Bytes of one half of the arena: the most one node can stream.
    pub fn arena_half_size(&self) -> usize {
        (self.arena_size() / 2) / ARENA_ALIGN * ARENA_ALIGN
    }

    /// A `Stream` region for [host, host + len) in the current half of the arena; false when
    /// that half is full (the caller runs what it queued, then `flip_arena`).
    pub fn add_stream_region(&mut self, host: usize, len: usize) -> bool {
        let half = self.arena_half_size();
        let Some(a) = &self.arena else {
            return false;
        };
        let at = self.arena_used.next_multiple_of(ARENA_ALIGN);
        if at + len > half {
            return false;
        }
        self.arena_used = at + len;
        self.regions.insert(
            host,
            Region {
                host,
                len,
                kind: RegionKind::Stream,
                dev_base: a.base() as usize + self.arena_half * half + at,
                owner: None,
                valid: Validity::new(len, State::Host),
            },
        );
        true
    }

    /// Bytes left in the current half of the arena.
    pub fn arena_room(&self) -> usize {
        if self.arena.is_none() {
            return 0;
        }
        self.arena_half_size()
            .saturating_sub(self.arena_used.next_multiple_of(ARENA_ALIGN))
    }

    /// Switches to the other half of the arena, forgetting the regions streamed into it.
    pub fn flip_arena(&mut self) {
        self.arena_half ^= 1;
        self.arena_used = 0;
        let half = self.arena_half_size();
        if let Some(a) = &self.arena {
            let lo = a.base() as usize + self.arena_half * half;
            self.drop_regions_in(0, usize::MAX, |r| {
                r.kind == RegionKind::Stream && r.dev_base >= lo && r.dev_base < lo + half
            });
        }
    }

    /// Forgets the streamed regions; the arena is free again.
    pub fn reset_arena(&mut self) {
        self.drop_kind(RegionKind::Stream);
        self.arena_used = 0;
        self.arena_half = 0;
    }

    /// Whether device address `dev` is in the arena.
    pub fn in_arena(&self, dev: usize) -> bool {
        self.arena
            .as_ref()
            .is_some_and(|a| dev >= a.base() as usize && dev < a.base() as usize + a.size())
    }

    /// The device buffer holding device address `dev` and the offset in it (for copies made
    /// through `Buffer::write` / `read` where the backend has no asynchronous copy).
    pub fn dev_buffer(&mut self, dev: usize) -> Option<(&mut dyn Buffer, usize)> {
        if let Some(a) = self.arena.as_mut() {
            let b = a.base() as usize;
            if dev >= b && dev < b + a.size() {
                return Some((a.as_mut(), dev - b));
            }
        }
        for r in self.regions.values_mut() {
            if let Some(o) = r.owner.as_mut() {
                let b = o.base() as usize;
                if dev >= b && dev < b + o.size() {
                    return Some((o.as_mut(), dev - b));
                }
            }
        }
        None
    }

    pub fn add_buffer(&mut self, base: usize, len: usize, pin: Option<(usize, usize)>) {
        self.bufs.insert(
            base,
            HostBuf {
                len,
                pinned: pin.is_some(),
                pin: pin.unwrap_or((0, 0)),
            },
        );
    }

    /// Forgets a host buffer and frees every region inside it.
    pub fn remove_buffer(&mut self, base: usize) {
        if let Some(b) = self.bufs.remove(&base) {
            self.drop_regions_in(base, base + b.len, |_| true);
        }
    }

    /// The host buffer holding [p, p + len), if it is one of ours: (base, info).
    pub fn buffer_of(&self, p: usize, len: usize) -> Option<(usize, HostBuf)> {
        let (&b, &h) = self.bufs.range(..=p).next_back()?;
        (p + len <= b + h.len).then_some((b, h))
    }

    /// The region holding [p, p + len).
    pub fn region_of(&self, p: usize, len: usize) -> Option<&Region> {
        let (_, r) = self.regions.range(..=p).next_back()?;
        (p + len <= r.host + r.len).then_some(r)
    }

    fn region_of_mut(&mut self, p: usize, len: usize) -> Option<&mut Region> {
        let (_, r) = self.regions.range_mut(..=p).next_back()?;
        (p + len <= r.host + r.len).then_some(r)
    }

    /// Whether `p` holds the current data of all of [p0, p0 + len): the host does unless a
    /// region says otherwise; the GPU only inside a region.
    pub fn holds(&self, p0: usize, len: usize, p: Place) -> bool {
        match self.region_of(p0, len) {
            Some(r) => r
                .valid
                .missing(p0 - r.host, p0 - r.host + len, p)
                .is_empty(),
            None => p == Place::Cpu,
        }
    }

    /// Bytes of [p0, p0 + len) that would have to move to `p`.
    pub fn bytes_missing(&self, p0: usize, len: usize, p: Place) -> usize {
        match self.region_of(p0, len) {
            Some(r) => r
                .valid
                .missing(p0 - r.host, p0 - r.host + len, p)
                .iter()
                .map(|(a, b)| b - a)
                .sum(),
            None if p == Place::Cpu => 0,
            None => len,
        }
    }

    /// Allocates a region for [host, host + len) if the budget allows; false if not.
    pub fn add_region(
        &mut self,
        bt: &dyn BufferType,
        host: usize,
        len: usize,
        kind: RegionKind,
    ) -> Result<bool> {
        let size = len.next_multiple_of(bt.alignment().max(1));
        if self.used + size > self.budget {
            return Ok(false);
        }
        let dev = bt.alloc(size.max(1))?;
        self.used += size;
        self.regions.insert(
            host,
            Region {
                host,
                len,
                kind,
                dev_base: dev.base() as usize,
                owner: Some(dev),
                valid: Validity::new(len, State::Host),
            },
        );
        Ok(true)
    }

    /// Frees the regions inside [a, b) that `which` selects.
    pub fn drop_regions_in(&mut self, a: usize, b: usize, which: impl Fn(&Region) -> bool) {
        let keys: Vec<usize> = self
            .regions
            .range(a..b)
            .filter(|(_, r)| which(r))
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            if let Some(r) = self.regions.remove(&k) {
                self.used -= r.owner.map_or(0, |o| o.size());
            }
        }
    }

    /// Frees every region of `kind`.
    pub fn drop_kind(&mut self, kind: RegionKind) {
        self.drop_regions_in(0, usize::MAX, |r| r.kind == kind);
    }

    /// The copies that make `p` hold the current data of [p0, p0 + len), marking them done
    /// (the caller makes them before anything reads the range).
    pub fn make_current(&mut self, p0: usize, len: usize, p: Place) -> Vec<Copy> {
        let (lo, hi) = self.buffer_of(p0, len).map_or((0, 0), |(_, b)| b.pin);
        let Some(r) = self.region_of_mut(p0, len) else {
            return Vec::new();
        };
        let (a, b) = (p0 - r.host, p0 - r.host + len);
        let missing = r.valid.missing(a, b, p);
        let mut out = Vec::with_capacity(missing.len());
        for (x, y) in missing {
            r.valid.set(x, y, State::Both);
            // Cut at the page-locked range's ends: each piece wholly inside or outside.
            let (hx, hy) = (r.host + x, r.host + y);
            let mut cuts = vec![hx, hy];
            cuts.extend([lo, hi].into_iter().filter(|&c| c > hx && c < hy));
            cuts.sort_unstable();
            for w in cuts.windows(2) {
                out.push(Copy {
                    host: w[0],
                    dev: r.dev_base + (w[0] - r.host),
                    len: w[1] - w[0],
                    to: p,
                    pinned: w[0] >= lo && w[1] <= hi && hi > lo,
                });
            }
        }
        out
    }

    /// The host wrote [p0, p0 + len) through a buffer call.
    pub fn host_wrote(&mut self, p0: usize, len: usize) {
        self.written(p0, len, Place::Cpu);
        self.log_host_access(p0, len);
    }

    /// Notes a range whose state a buffer call changed (written, or fetched for reading), for
    /// every backend.
    pub fn log_host_access(&mut self, p0: usize, len: usize) {
        for (_, log, overflow) in &mut self.logs {
            if log.len() < HOST_LOG_MAX {
                log.push((p0, len));
            } else {
                *overflow = true;
            }
        }
    }

    /// A log for a new backend: its id.
    pub fn open_log(&mut self) -> u64 {
        let id = self.next_log;
        self.next_log += 1;
        self.logs.push((id, Vec::new(), false));
        id
    }

    pub fn close_log(&mut self, id: u64) {
        self.logs.retain(|(i, _, _)| *i != id);
    }

    /// Backend `id`'s ranges since its last graph, and whether some were not kept (emptied).
    pub fn take_log(&mut self, id: u64) -> (Vec<(usize, usize)>, bool) {
        match self.logs.iter_mut().find(|(i, _, _)| *i == id) {
            Some((_, log, overflow)) => (std::mem::take(log), std::mem::take(overflow)),
            None => (Vec::new(), true),
        }
    }

    /// `p` wrote [p0, p0 + len): the other side's copy is stale.
    pub fn written(&mut self, p0: usize, len: usize, p: Place) {
        let st = match p {
            Place::Cpu => State::Host,
            Place::Gpu => State::Device,
        };
        // A host write may cover several regions (a whole-buffer set_tensor).
        let keys: Vec<usize> = self
            .regions
            .range(..p0 + len)
            .rev()
            .take_while(|(_, r)| r.host + r.len > p0 || r.host >= p0)
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            let r = self.regions.get_mut(&k).unwrap();
            let a = p0.max(r.host);
            let b = (p0 + len).min(r.host + r.len);
            if a < b {
                r.valid.set(a - r.host, b - r.host, st);
            }
        }
    }

    /// The host filled [p0, p0 + len) with `value` (a buffer clear): the device copies in
    /// regions of their own are filled too and stay current, so a cleared KV cache is not
    /// uploaded again (~70 MB before every prompt of an 8B-class model in a benchmark that
    /// clears it). The GPU is idle between graphs. Elsewhere the host alone is current.
    pub fn host_filled(&mut self, p0: usize, len: usize, value: u8) {
        self.host_wrote(p0, len);
        let end = p0 + len;
        for r in self.regions.values_mut() {
            let (a, b) = (r.host.max(p0), (r.host + r.len).min(end));
            let Some(o) = r.owner.as_mut() else { continue };
            if a >= b {
                continue;
            }
            let off = r.dev_base - o.base() as usize + (a - r.host);
            if o.fill(off, b - a, value).is_ok() {
                r.valid.set(a - r.host, b - r.host, State::Both);
            }
        }
    }

    /// Fills [p0, p0 + len) with `value` on the GPU only, where mirrors cover all of it: the
    /// host's bytes are then stale (a read fetches them), and a cleared KV cache costs no host
    /// memset. False (nothing changed) where some byte has no mirror or a fill fails.
    pub fn device_fill(&mut self, p0: usize, len: usize, value: u8) -> bool {
        let end = p0 + len;
        let mut covered = p0;
        for r in self.regions.values() {
            if r.host + r.len <= covered || r.host >= end {
                continue;
            }
            if r.host > covered || r.kind != RegionKind::Mirror || r.owner.is_none() {
                return false;
            }
            covered = r.host + r.len;
        }
        if len == 0 || covered < end {
            return false;
        }
        for r in self.regions.values_mut() {
            let (a, b) = (r.host.max(p0), (r.host + r.len).min(end));
            if a >= b {
                continue;
            }
            let o = r.owner.as_mut().unwrap();
            let off = r.dev_base - o.base() as usize + (a - r.host);
            if o.fill(off, b - a, value).is_err() {
                // What was filled is the device's; the rest, the host's bytes as they are.
                r.valid.set(a - r.host, b - r.host, State::Host);
                return false;
            }
            r.valid.set(a - r.host, b - r.host, State::Device);
        }
        self.log_host_access(p0, len);
        true
    }

    /// The device address of host address `p` (inside a region).
    pub fn dev_addr(&self, p: usize, len: usize) -> Option<usize> {
        self.region_of(p, len).map(|r| r.dev_addr(p))
    }

    /// Everything a walk of a graph's nodes reads, word by word: the host buffers and their
    /// page-locked ranges, the regions, where they are on the device and who holds each byte,
    /// the arena's state. Equal words: a walk of the same graph and plan makes the same copies
    /// and leaves the same state (a recorded split graph's precondition).
    pub fn state_words(&self, out: &mut Vec<u64>) {
        out.clear();
        out.extend([self.arena_used as u64, self.arena_half as u64]);
        for (&base, b) in &self.bufs {
            out.extend([base as u64, b.len as u64, b.pinned as u64]);
            out.extend([b.pin.0 as u64, b.pin.1 as u64]);
        }
        for (&k, r) in &self.regions {
            out.extend([k as u64, r.len as u64, r.dev_base as u64, r.kind as u64]);
            for (&a, &(b, st)) in &r.valid.map {
                out.extend([a as u64, b as u64, st as u64]);
            }
        }
    }

    /// Every region's state (by its host address).
    pub fn snapshot(&self) -> Vec<(usize, Validity)> {
        self.regions
            .iter()
            .map(|(&k, r)| (k, r.valid.clone()))
            .collect()
    }

    /// Sets the regions' states to `states` (from `snapshot`; regions not there are left).
    pub fn restore(&mut self, states: &[(usize, Validity)]) {
        for (k, v) in states {
            if let Some(r) = self.regions.get_mut(k) {
                r.valid.clone_from(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuDevice;
    use crate::device::Device;

    #[test]
    fn validity_tracks_ranges() {
        let mut v = Validity::new(100, State::Host);
        assert_eq!(v.missing(0, 100, Place::Gpu), vec![(0, 100)]);
        v.set(10, 20, State::Both);
        v.set(20, 30, State::Both);
        assert_eq!(v.ranges(), 3, "equal neighbours merge");
        assert_eq!(v.missing(0, 100, Place::Gpu), vec![(0, 10), (30, 100)]);
        assert!(v.missing(12, 28, Place::Gpu).is_empty());
        v.set(15, 25, State::Device);
        assert_eq!(v.missing(0, 40, Place::Cpu), vec![(15, 25)]);
        assert_eq!(v.missing(16, 18, Place::Cpu), vec![(16, 18)]);
        v.set(0, 100, State::Both);
        assert_eq!(v.ranges(), 1);
        assert!(v.missing(0, 100, Place::Cpu).is_empty());
    }

    #[test]
    fn writes_invalidate_the_other_side_only() {
        let cpu = CpuDevice::new();
        let bt = cpu.buffer_type();
        let mut r = Residency::new(1 << 20);
        r.add_buffer(4096, 1000, None);
        assert!(r.add_region(bt, 4096, 1000, RegionKind::Mirror).unwrap());
        assert!(r.holds(4096, 1000, Place::Cpu));
        assert!(!r.holds(4096, 1000, Place::Gpu));
        let c = r.make_current(4096 + 100, 50, Place::Gpu);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].host, c[0].len, c[0].to), (4196, 50, Place::Gpu));
        assert!(
            r.make_current(4196, 50, Place::Gpu).is_empty(),
            "no copy twice"
        );
        r.written(4196, 10, Place::Gpu);
        assert!(!r.holds(4196, 10, Place::Cpu));
        assert_eq!(r.bytes_missing(4096, 1000, Place::Cpu), 10);
        let c = r.make_current(4096, 1000, Place::Cpu);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].host, c[0].len), (4196, 10));
        r.written(4000, 5000, Place::Cpu);
        assert_eq!(r.bytes_missing(4096, 1000, Place::Gpu), 1000);
        // Outside every region only the host holds data.
        assert!(r.holds(1, 10, Place::Cpu));
        assert!(!r.holds(1, 10, Place::Gpu));
    }

    /// A copy refused across a boundary is made in pieces that never cross it.
    /// A recorded split graph's precondition and effect: the state words tell every state
    /// change apart (and equal states equal), and a restored snapshot gives the words back.
    #[test]
    fn state_words_see_every_change_and_a_snapshot_restores_them() {
        let cpu = CpuDevice::new();
        let bt = cpu.buffer_type();
        let mut r = Residency::new(1 << 20);
        r.add_buffer(4096, 1000, None);
        assert!(r.add_region(bt, 4096, 1000, RegionKind::Mirror).unwrap());
        let words = |r: &Residency| {
            let mut w = Vec::new();
            r.state_words(&mut w);
            w
        };
        let (w0, s0) = (words(&r), r.snapshot());
        r.written(4196, 10, Place::Gpu);
        let (w1, s1) = (words(&r), r.snapshot());
        assert_ne!(w0, w1);
        r.make_current(4196, 10, Place::Cpu);
        let w2 = words(&r);
        assert_ne!(w1, w2, "Device and Both differ");
        r.written(4196, 10, Place::Gpu);
        assert_eq!(words(&r), w1, "the same states, the same words");
        r.restore(&s0);
        assert_eq!(words(&r), w0);
        r.restore(&s1);
        assert_eq!(words(&r), w1);
        assert!(r.add_region(bt, 8192, 100, RegionKind::Mirror).unwrap());
        assert_ne!(words(&r), w1, "a new region");
    }

    #[test]
    fn refused_copies_split_at_pages() {
        let boundary = 0x10000 + 5 * 4096;
        let c = Copy {
            host: 0x10000 + 100,
            dev: 0x900000 + 100,
            len: 20 * 4096,
            to: Place::Gpu,
            pinned: false,
        };
        let mut made = Vec::new();
        let r = copy_in_pieces(&c, &mut |p: &Copy| {
            if p.host < boundary && p.host + p.len > boundary {
                return Err(crate::device::Error::Device("invalid argument".into()));
            }
            made.push(*p);
            Ok(true)
        });
        assert!(r.unwrap());
        assert_eq!(made.iter().map(|p| p.len).sum::<usize>(), c.len);
        assert!(made.len() < 20, "{} pieces", made.len());
        let mut at = c.host;
        for p in &made {
            assert_eq!(p.host, at);
            assert_eq!(p.dev - c.dev, p.host - c.host);
            at += p.len;
        }
        // A page that is itself refused stays an error.
        let r = copy_in_pieces(&c, &mut |_: &Copy| {
            Err(crate::device::Error::Device("no".into()))
        });
        assert!(r.is_err());
    }

    /// Each backend sees every buffer call since its own last graph, whoever computed since.
    #[test]
    fn every_backend_has_its_own_log() {
        let mut r = Residency::new(0);
        let (a, b) = (r.open_log(), r.open_log());
        r.host_wrote(100, 10);
        assert_eq!(r.take_log(a), (vec![(100, 10)], false));
        r.host_wrote(200, 10);
        assert_eq!(r.take_log(b), (vec![(100, 10), (200, 10)], false));
        assert_eq!(r.take_log(a), (vec![(200, 10)], false));
        r.close_log(a);
        assert_eq!(
            r.take_log(a),
            (vec![], true),
            "an unknown log is never a clean one"
        );
        for i in 0..HOST_LOG_MAX + 1 {
            r.log_host_access(i, 1);
        }
        assert!(r.take_log(b).1, "overflow");
    }

    /// A buffer clear fills the device copy too: nothing to upload afterwards, and the device
    /// bytes hold the value (the stand-in "device" here is RFCPU memory).
    #[test]
    fn a_fill_fills_the_device_copy() {
        let cpu = CpuDevice::new();
        let bt = cpu.buffer_type();
        let mut r = Residency::new(1 << 20);
        r.add_buffer(4096, 1000, None);
        assert!(r.add_region(bt, 4096, 1000, RegionKind::Mirror).unwrap());
        r.make_current(4096, 1000, Place::Gpu);
        r.written(4096, 1000, Place::Gpu);
        r.host_filled(4096 + 200, 300, 7);
        assert_eq!(r.bytes_missing(4096, 1000, Place::Gpu), 0);
        assert!(r.holds(4096 + 200, 300, Place::Cpu));
        assert!(!r.holds(4096, 200, Place::Cpu));
        let dev = r.dev_addr(4096 + 200, 300).unwrap();
        let got = unsafe { std::slice::from_raw_parts(dev as *const u8, 300) };
        assert!(got.iter().all(|&b| b == 7));
        // Outside any region: the host alone.
        r.host_filled(9000, 10, 1);
    }

    #[test]
    fn a_fill_over_mirrors_fills_the_device_alone() {
        let cpu = CpuDevice::new();
        let bt = cpu.buffer_type();
        let mut r = Residency::new(1 << 20);
        r.add_buffer(4096, 1000, None);
        assert!(r.add_region(bt, 4096, 1000, RegionKind::Mirror).unwrap());
        assert!(r.device_fill(4096 + 100, 500, 9));
        // The host's bytes are stale: a read fetches the device's.
        assert!(!r.holds(4096 + 100, 500, Place::Cpu));
        assert_eq!(r.bytes_missing(4096 + 100, 500, Place::Gpu), 0);
        assert_eq!(r.bytes_missing(4096 + 100, 500, Place::Cpu), 500);
        let dev = r.dev_addr(4096 + 100, 500).unwrap();
        let got = unsafe { std::slice::from_raw_parts(dev as *const u8, 500) };
        assert!(got.iter().all(|&b| b == 9));
        // Not wholly mirrored: nothing done, the caller fills the host.
        assert!(!r.device_fill(4096 + 900, 200, 1));
        assert!(!r.device_fill(9000, 10, 1));
        assert!(r.holds(4096 + 900, 100, Place::Cpu));
        // A weight's region is not a mirror.
        r.add_buffer(1 << 16, 256, None);
        assert!(r
            .add_region(bt, 1 << 16, 256, RegionKind::Resident)
            .unwrap());
        assert!(!r.device_fill(1 << 16, 256, 0));
    }

    #[test]
    fn the_budget_limits_regions() {
        let cpu = CpuDevice::new();
        let bt = cpu.buffer_type();
        let mut r = Residency::new(0);
        assert!(!r.add_region(bt, 64, 64, RegionKind::Resident).unwrap());
        r.budget = 4096;
        assert!(r.add_region(bt, 64, 64, RegionKind::Resident).unwrap());
        assert!(r.used >= 64);
        assert!(!r
            .add_region(bt, 1 << 20, 8192, RegionKind::Resident)
            .unwrap());
        r.add_buffer(0, 4096, None);
        r.remove_buffer(0);
        assert_eq!(r.used, 0, "regions inside a freed buffer go with it");
        assert!(r.regions.is_empty());
    }
}
