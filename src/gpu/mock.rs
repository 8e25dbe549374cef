//! A fault-injecting GPU runtime for tests without a GPU: every call of the `GpuApi` table is
//! numbered, and the k-th one fails (calls that return nothing are numbered too, and only
//! counted). It computes nothing; it hands out fake device addresses, real pinned-host stand-ins,
//! and counts what is live (device memory, pinned memory, streams, events, graphs), so the tests
//! can drive buffers and backends through every error path and then check that each failure
//! gave an error rather than a panic, that nothing leaked, and that the backend still works.

use super::api::*;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub struct Live {
    pub device: AtomicIsize,
    pub host: AtomicIsize,
    pub streams: AtomicIsize,
    pub events: AtomicIsize,
    pub graphs: AtomicIsize,
    pub execs: AtomicIsize,
    pub modules: AtomicIsize,
    /// Host ranges registered and not yet unregistered.
    pub registered: AtomicIsize,
}

pub struct MockApi {
    calls: AtomicUsize,
    /// The call number that fails (0: none).
    pub fail_at: AtomicUsize,
    pub injected: AtomicUsize,
    /// Names of the calls made, in order (to pick interesting k).
    pub log: Mutex<Vec<&'static str>>,
    pub live: Live,
    /// Frees and destroys of handles never handed out.
    pub bad_frees: AtomicUsize,
    allocs: Mutex<HashMap<DevPtr, usize>>,
    next: Mutex<DevPtr>,
    /// Modules by handle: the image they were loaded from.
    modules: Mutex<HashMap<usize, Vec<u8>>>,
    /// An image whose module lacks every function (a stale or foreign cached file).
    pub hollow_image: Mutex<Vec<u8>>,
    /// What `compile` returns.
    pub image: Vec<u8>,
    pub compiles: AtomicUsize,
    /// The program names compiled (one per kernel group), in order.
    pub compiled: Mutex<Vec<String>>,
    /// Milliseconds each compile takes (to make concurrent callers overlap).
    pub compile_ms: AtomicUsize,
    handles: AtomicUsize,
    /// Every host_register fails (a driver that cannot pin this memory).
    pub refuse_register: AtomicBool,
    /// What `peer_access` answers (kernels reach another device's memory).
    pub peer: AtomicBool,
    /// A capture is open: peer copies then fail, as CUDA's cuMemcpyPeerAsync does.
    capturing: AtomicBool,
}

impl MockApi {
    pub fn new(fail_at: usize) -> MockApi {
        MockApi {
            calls: AtomicUsize::new(0),
            fail_at: AtomicUsize::new(fail_at),
            injected: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
            live: Live::default(),
            bad_frees: AtomicUsize::new(0),
            allocs: Mutex::new(HashMap::new()),
            next: Mutex::new(0x7f00_0000_0000),
            modules: Mutex::new(HashMap::new()),
            hollow_image: Mutex::new(Vec::new()),
            image: b"mock kernel image".to_vec(),
            compiles: AtomicUsize::new(0),
            compiled: Mutex::new(Vec::new()),
            compile_ms: AtomicUsize::new(0),
            handles: AtomicUsize::new(1),
            refuse_register: AtomicBool::new(false),
            peer: AtomicBool::new(false),
            capturing: AtomicBool::new(false),
        }
    }

    pub fn info() -> DeviceInfo {
        DeviceInfo {
            name: "Mock GPU".into(),
            total_mem: 1 << 30,
            arch: "sm_90".into(),
            warp_size: 32,
            compute_units: 4,
        }
    }

    /// Numbers one call; Err where it is the one that fails.
    fn tick(&self, what: &'static str) -> ApiResult<()> {
        self.log.lock().unwrap().push(what);
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_at.load(Ordering::SeqCst) {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(format!("mock: {what} failed (call {n})"));
        }
        Ok(())
    }

    fn handle(&self) -> usize {
        self.handles.fetch_add(1, Ordering::Relaxed) * 16
    }

    fn gone(&self, counter: &AtomicIsize) {
        if counter.fetch_sub(1, Ordering::SeqCst) <= 0 {
            self.bad_frees.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl GpuApi for MockApi {
    fn vendor(&self) -> &'static str {
        "MOCK"
    }
    fn device_count(&self) -> usize {
        1
    }
    fn device_info(&self, _ord: usize) -> ApiResult<DeviceInfo> {
        self.tick("device_info")?;
        Ok(Self::info())
    }
    fn mem_info(&self, _ord: usize) -> ApiResult<(usize, usize)> {
        self.tick("mem_info")?;
        Ok((1 << 29, 1 << 30))
    }
    fn alloc(&self, _ord: usize, size: usize) -> ApiResult<DevPtr> {
        self.tick("alloc")?;
        let mut next = self.next.lock().unwrap();
        let p = *next;
        *next += (size.max(1) as u64).next_multiple_of(256);
        self.allocs.lock().unwrap().insert(p, size);
        self.live.device.fetch_add(1, Ordering::SeqCst);
        Ok(p)
    }
    fn free(&self, _ord: usize, ptr: DevPtr) {
        let _ = self.tick("free");
        match self.allocs.lock().unwrap().remove(&ptr) {
            Some(_) => self.gone(&self.live.device),
            None => {
                self.bad_frees.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    fn memset_async(&self, _: usize, _: DevPtr, _: u8, _: usize, _: Stream) -> ApiResult<()> {
        self.tick("memset_async")
    }
    fn stream_create(&self, _ord: usize) -> ApiResult<Stream> {
        self.tick("stream_create")?;
        self.live.streams.fetch_add(1, Ordering::SeqCst);
        Ok(Stream(self.handle()))
    }
    fn stream_sync(&self, _ord: usize, _s: Stream) -> ApiResult<()> {
        self.tick("stream_sync")
    }
    fn stream_destroy(&self, _ord: usize, _s: Stream) {
        let _ = self.tick("stream_destroy");
        self.gone(&self.live.streams);
    }
    fn compiler_version(&self) -> String {
        "mock 1.0".into()
    }
    fn compile(&self, _: &str, name: &str, _: &str, _: &[String]) -> ApiResult<Vec<u8>> {
        self.tick("compile")?;
        let ms = self.compile_ms.load(Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(ms as u64));
        self.compiles.fetch_add(1, Ordering::SeqCst);
        self.compiled.lock().unwrap().push(name.to_string());
        Ok(self.image.clone())
    }
    fn module_load(&self, _ord: usize, image: &[u8]) -> ApiResult<Module> {
        self.tick("module_load")?;
        let h = self.handle();
        self.modules.lock().unwrap().insert(h, image.to_vec());
        self.live.modules.fetch_add(1, Ordering::SeqCst);
        Ok(Module(h))
    }
    fn module_function(&self, _ord: usize, m: Module, name: &str) -> ApiResult<Function> {
        self.tick("module_function")?;
        let modules = self.modules.lock().unwrap();
        match modules.get(&m.0) {
            Some(img) if *img == *self.hollow_image.lock().unwrap() => {
                Err(format!("mock: {name} not found in the module"))
            }
            Some(_) => Ok(Function(self.handle())),
            None => Err("mock: no such module".into()),
        }
    }
    fn module_unload(&self, _ord: usize, m: Module) {
        let _ = self.tick("module_unload");
        if self.modules.lock().unwrap().remove(&m.0).is_some() {
            self.gone(&self.live.modules);
        } else {
            self.bad_frees.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn launch(
        &self,
        _: usize,
        _: Function,
        _: [u32; 3],
        _: [u32; 3],
        _: u32,
        _: Stream,
        _: &mut [*mut c_void],
    ) -> ApiResult<()> {
        self.tick("launch")
    }
    fn capture_begin(&self, _ord: usize, _s: Stream) -> ApiResult<()> {
        self.tick("capture_begin")?;
        self.capturing.store(true, Ordering::SeqCst);
        Ok(())
    }
    fn capture_end(&self, _ord: usize, _s: Stream) -> ApiResult<Graph> {
        self.capturing.store(false, Ordering::SeqCst);
        self.tick("capture_end")?;
        self.live.graphs.fetch_add(1, Ordering::SeqCst);
        Ok(Graph(self.handle()))
    }
    fn graph_instantiate(&self, _ord: usize, _g: Graph) -> ApiResult<GraphExec> {
        self.tick("graph_instantiate")?;
        self.live.execs.fetch_add(1, Ordering::SeqCst);
        Ok(GraphExec(self.handle()))
    }
    fn graph_node_count(&self, _ord: usize, _g: Graph) -> Option<usize> {
        Some(1)
    }
    fn graph_exec_update(&self, _ord: usize, _e: GraphExec, _g: Graph) -> bool {
        self.tick("graph_exec_update").is_ok()
    }
    fn graph_launch(&self, _ord: usize, _e: GraphExec, _s: Stream) -> ApiResult<()> {
        self.tick("graph_launch")
    }
    fn graph_destroy(&self, _ord: usize, _g: Graph) {
        let _ = self.tick("graph_destroy");
        self.gone(&self.live.graphs);
    }
    fn graph_exec_destroy(&self, _ord: usize, _e: GraphExec) {
        let _ = self.tick("graph_exec_destroy");
        self.gone(&self.live.execs);
    }
    fn host_alloc(&self, _ord: usize, size: usize) -> ApiResult<*mut u8> {
        self.tick("host_alloc")?;
        // SAFETY: plain calloc; freed by host_free.
        let p = unsafe { libc::calloc(size.max(1), 1) } as *mut u8;
        if p.is_null() {
            return Err("mock: calloc failed".into());
        }
        self.live.host.fetch_add(1, Ordering::SeqCst);
        Ok(p)
    }
    fn host_free(&self, _ord: usize, ptr: *mut u8) {
        let _ = self.tick("host_free");
        // SAFETY: ptr came from host_alloc's calloc.
        unsafe { libc::free(ptr as *mut c_void) };
        self.gone(&self.live.host);
    }
    fn host_register(&self, _: usize, ptr: *mut u8, _: usize, _: bool) -> ApiResult<DevPtr> {
        self.tick("host_register")?;
        if self.refuse_register.load(Ordering::SeqCst) {
            return Err("mock: host memory cannot be registered".into());
        }
        self.live.registered.fetch_add(1, Ordering::SeqCst);
        Ok(ptr as usize as DevPtr)
    }
    fn host_unregister(&self, _ord: usize, _ptr: *mut u8) {
        let _ = self.tick("host_unregister");
        self.gone(&self.live.registered);
    }
    fn device_sync(&self, _ord: usize) -> ApiResult<()> {
        self.tick("device_sync")
    }
    fn copy_htod_async(
        &self,
        _: usize,
        _: DevPtr,
        _: *const u8,
        _: usize,
        _: Stream,
    ) -> ApiResult<()> {
        self.tick("copy_htod_async")
    }
    fn copy_dtoh_async(
        &self,
        _: usize,
        dst: *mut u8,
        _: DevPtr,
        size: usize,
        _: Stream,
    ) -> ApiResult<()> {
        self.tick("copy_dtoh_async")?;
        // SAFETY: the caller hands a writable host range of `size` bytes.
        unsafe { std::ptr::write_bytes(dst, 0, size) };
        Ok(())
    }
    fn copy_dtod_async(
        &self,
        _: usize,
        _: DevPtr,
        _: DevPtr,
        _: usize,
        _: Stream,
    ) -> ApiResult<()> {
        self.tick("copy_dtod_async")
    }
    fn copy_peer_async(
        &self,
        _: usize,
        _: DevPtr,
        _: usize,
        _: DevPtr,
        _: usize,
        _: usize,
        _: Stream,
    ) -> ApiResult<()> {
        self.tick("copy_peer_async")?;
        if self.capturing.load(Ordering::SeqCst) {
            return Err(
                "cuMemcpyPeerAsync: operation not permitted when stream is capturing".into(),
            );
        }
        Ok(())
    }
    fn peer_access(&self, _from: usize, _to: usize) -> bool {
        self.peer.load(Ordering::SeqCst)
    }
    fn event_create(&self, _ord: usize) -> ApiResult<Event> {
        self.tick("event_create")?;
        self.live.events.fetch_add(1, Ordering::SeqCst);
        Ok(Event(self.handle()))
    }
    fn event_record(&self, _ord: usize, _e: Event, _s: Stream) -> ApiResult<()> {
        self.tick("event_record")
    }
    fn event_sync(&self, _ord: usize, _e: Event) -> ApiResult<()> {
        self.tick("event_sync")
    }
    fn stream_wait_event(&self, _ord: usize, _s: Stream, _e: Event) -> ApiResult<()> {
        self.tick("stream_wait_event")
    }
    fn event_destroy(&self, _ord: usize, _e: Event) {
        let _ = self.tick("event_destroy");
        self.gone(&self.live.events);
    }
    fn event_create_timed(&self, ord: usize) -> ApiResult<Event> {
        self.event_create(ord)
    }
    fn event_elapsed_ms(&self, _ord: usize, _s: Event, _e: Event) -> ApiResult<f32> {
        self.tick("event_elapsed_ms")?;
        Ok(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::testutil::TT;
    use crate::device::{Backend, BufferType};
    use crate::ggml_types::{op, GgmlType};
    use crate::gpu::backend::GpuBackend;
    use crate::gpu::buffer::GpuBufferType;
    use crate::gpu::GpuCtx;
    use crate::tensor::Tensor;
    use std::ffi::CString;
    use std::sync::Arc;

    /// What one run of the scenario saw.
    #[derive(Debug, Default)]
    struct Seen {
        errors: Vec<String>,
        /// The backend existed and its kernels loaded: then the final graph must work.
        usable: bool,
        last_ok: bool,
        /// Calls from here on belong to the two final graphs (their errors are not collected).
        tail_from: usize,
    }

    /// Buffers written, read, filled and copied (staged and direct), a backend computing one
    /// ADD node repeatedly (direct, captured, replayed), async copies, then the last graph.
    fn scenario(api: &Arc<MockApi>) -> Seen {
        let mut seen = Seen::default();
        let ctx = GpuCtx::for_test(api.clone(), MockApi::info(), None);
        let bt = GpuBufferType::new(ctx.clone(), CString::new("MOCK0").unwrap());
        let mut note = |r: crate::device::Result<()>| {
            if let Err(e) = r {
                seen.errors.push(e.to_string());
            }
        };
        let mut buf = match bt.alloc(1 << 20) {
            Ok(b) => b,
            Err(e) => {
                note(Err(e));
                return seen;
            }
        };
        note(buf.write(0, &[1u8; 256]));
        note(buf.write(4096, &vec![2u8; 200_000]));
        let mut back = [7u8; 256];
        note(buf.read(0, &mut back));
        note(buf.fill(0, 64, 0));
        let base = buf.base();
        note(
            buf.copy_from_same_type(8192, base as *const u8, 64)
                .map(|_| ()),
        );
        let mut be = match GpuBackend::new(ctx.clone(), CString::new("MOCK0").unwrap()) {
            Ok(b) => b,
            Err(e) => {
                note(Err(e));
                return seen;
            }
        };
        let at = |off: usize| unsafe { base.add(off) } as *mut std::ffi::c_void;
        let mut x = TT::new(GgmlType::F32, [64, 4, 1, 1]);
        let mut y = TT::new(GgmlType::F32, [64, 4, 1, 1]);
        x.t.data = at(0);
        y.t.data = at(1024);
        let mut a = TT::new(GgmlType::F32, [64, 4, 1, 1]);
        a.op(op::ADD).src(0, &x).src(1, &y);
        a.t.data = at(2048);
        let nodes = [a.tensor()];
        for _ in 0..4 {
            // As the ffi layer does: ask whether it repeats, then compute.
            be.repeats_last(&nodes);
            note(be.compute(&nodes));
            note(be.synchronize());
            note(buf.write(0, &[3u8; 128]));
        }
        let mut host = vec![0u8; 256];
        note(
            be.set_async(at(0) as *mut u8, host.as_ptr(), 256)
                .map(|_| ()),
        );
        note(
            be.get_async(host.as_mut_ptr(), at(0) as *const u8, 256)
                .map(|_| ()),
        );
        note(be.synchronize());
        seen.usable = !ctx.kernels.any_failed();
        seen.tail_from = api.log.lock().unwrap().len();
        // More graphs until one works: a failure at a synchronize is reported by the next
        // compute (queued work failed), so with one failure the backend works again within
        // two graphs; four are allowed.
        seen.last_ok = (0..4).any(|_| be.compute(&nodes).and_then(|_| be.synchronize()).is_ok());
        drop(be);
        drop(buf);
        seen
    }

    fn check_nothing_live(api: &MockApi, k: usize) {
        let l = &api.live;
        let counts = [
            ("device memory", l.device.load(Ordering::SeqCst)),
            ("pinned memory", l.host.load(Ordering::SeqCst)),
            ("streams", l.streams.load(Ordering::SeqCst)),
            ("events", l.events.load(Ordering::SeqCst)),
            ("graphs", l.graphs.load(Ordering::SeqCst)),
            ("graph execs", l.execs.load(Ordering::SeqCst)),
        ];
        for (what, n) in counts {
            assert_eq!(n, 0, "{what} left live when call {k} failed");
        }
        assert_eq!(
            api.bad_frees.load(Ordering::SeqCst),
            0,
            "bad frees (call {k})"
        );
    }

    /// A mock GPU's 1 MiB buffer and a backend on it (kernel cache in `dir`).
    fn mock_backend(
        dir: &std::path::Path,
    ) -> (
        Arc<MockApi>,
        Arc<GpuCtx>,
        Box<dyn crate::device::Buffer>,
        GpuBackend,
    ) {
        let api = Arc::new(MockApi::new(0));
        let ctx = GpuCtx::for_test(api.clone(), MockApi::info(), Some(dir.to_path_buf()));
        let bt = GpuBufferType::new(ctx.clone(), CString::new("MOCK0").unwrap());
        let buf = bt.alloc(1 << 20).unwrap();
        let be = GpuBackend::new(ctx.clone(), CString::new("MOCK0").unwrap()).unwrap();
        (api, ctx, buf, be)
    }

    /// A new graph's kernel groups are found by the dry run and built ahead (no launch has to
    /// build one itself), only those, and a repeat of the graph asks for nothing.
    #[test]
    fn a_graph_prefetches_exactly_its_groups() {
        let dir = cache_dir("graph");
        let (api, ctx, buf, mut be) = mock_backend(&dir);
        let base = buf.base();
        let at = |off: usize| unsafe { base.add(off) } as *mut std::ffi::c_void;
        let mut x = TT::new(GgmlType::F32, [64, 4, 1, 1]);
        x.t.data = at(0);
        let mut a = TT::new(GgmlType::F32, [64, 4, 1, 1]);
        a.op(op::ADD).src(0, &x).src(1, &x);
        a.t.data = at(4096);
        let mut c = TT::new(GgmlType::F16, [64, 4, 1, 1]);
        c.op(op::CPY).src(0, &a);
        c.t.data = at(8192);
        let nodes = [a.tensor(), c.tensor()];
        for _ in 0..3 {
            be.repeats_last(&nodes);
            be.compute(&nodes).unwrap();
            be.synchronize().unwrap();
        }
        let mut built = api.compiled.lock().unwrap().clone();
        built.sort();
        assert_eq!(built, ["cpy.hip", "elementwise.hip"]);
        assert_eq!(ctx.kernels.misses(), 0, "a launch had to build its group");
        drop(be);
        drop(buf);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An input `x` at `base` and `n` one-node graphs over it (ADD, MUL, ADD, ...), each
    /// output 4 KiB further on: graphs that differ only in op and address.
    fn one_node_graphs(base: *mut u8, n: usize) -> (TT, Vec<TT>) {
        let at = |off: usize| unsafe { base.add(off) } as *mut std::ffi::c_void;
        let mut x = TT::new(GgmlType::F32, [64, 4, 1, 1]);
        x.t.data = at(0);
        let outs = (0..n)
            .map(|k| {
                let mut a = TT::new(GgmlType::F32, [64, 4, 1, 1]);
                a.op(if k == 1 { op::MUL } else { op::ADD })
                    .src(0, &x)
                    .src(1, &x);
                a.t.data = at(4096 * (k + 1));
                a
            })
            .collect();
        (x, outs)
    }

    /// Graphs that come back, but never right after themselves (ggml's tensor-parallel meta
    /// device gives a GPU one graph per layer part): captured at their second run, replayed
    /// from the third without a kernel launch, each kept once; all freed with the backend.
    #[test]
    fn graphs_that_come_back_are_kept_and_replayed() {
        let dir = cache_dir("kept");
        let (api, _ctx, buf, mut be) = mock_backend(&dir);
        let (_x, outs) = one_node_graphs(buf.base(), 3);
        let graphs: Vec<[Tensor; 1]> = outs.iter().map(|a| [a.tensor()]).collect();
        let mut per_round = Vec::new();
        for _ in 0..4 {
            let from = api.log.lock().unwrap().len();
            for g in &graphs {
                be.repeats_last(g);
                be.compute(g).unwrap();
            }
            be.synchronize().unwrap();
            let log = api.log.lock().unwrap();
            let n = |what: &str| log[from..].iter().filter(|w| **w == what).count();
            per_round.push((n("launch"), n("capture_begin"), n("graph_launch")));
        }
        // Round 1 runs each launch by launch; round 2 captures each; then replays only.
        assert_eq!(per_round[0], (3, 0, 0));
        assert_eq!(per_round[1], (3, 3, 3));
        assert_eq!(per_round[2], (0, 0, 3));
        assert_eq!(per_round[3], (0, 0, 3));
        assert_eq!(be.cache.len(), 2, "the current graph is not in the cache");
        assert_eq!(api.live.execs.load(Ordering::SeqCst), 3);
        drop(be);
        assert_eq!(api.live.execs.load(Ordering::SeqCst), 0);
        drop(buf);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// RFHYBRID's recorded segments: a graph computed under a tag is replayed by the tag alone
    /// (one graph launch, no kernel launch) once it was captured, the current executable or a
    /// kept one; a tag not known, or made before the scratch moved or a buffer was freed, is not.
    #[test]
    fn tagged_graphs_replay_by_their_tag() {
        let dir = cache_dir("tagged");
        let (api, _ctx, buf, mut be) = mock_backend(&dir);
        let base = buf.base();
        let at = |off: usize| unsafe { base.add(off) } as *mut std::ffi::c_void;
        let (_x, outs) = one_node_graphs(base, 2);
        let graphs: Vec<[Tensor; 1]> = outs.iter().map(|a| [a.tensor()]).collect();
        let count = |api: &MockApi, from: usize, what: &str| {
            api.log.lock().unwrap()[from..]
                .iter()
                .filter(|w| **w == what)
                .count()
        };
        assert!(!be.replay_tagged(1).unwrap(), "no graph has this tag yet");
        // Seen once (launched), then captured: both rounds tagged.
        for _ in 0..2 {
            for (t, g) in graphs.iter().enumerate() {
                be.tag_next(t as u64 + 1);
                be.compute(g).unwrap();
            }
        }
        be.synchronize().unwrap();
        for _ in 0..2 {
            for t in [1u64, 2] {
                let from = api.log.lock().unwrap().len();
                assert!(be.replay_tagged(t).unwrap(), "tag {t}");
                assert_eq!(count(&api, from, "graph_launch"), 1);
                assert_eq!(count(&api, from, "launch"), 0);
            }
        }
        assert!(!be.replay_tagged(3).unwrap());
        // Copies in set as a prelude: captured with the graph, replayed only with them set.
        let host = vec![0u8; 1024];
        let p = [(at(0) as usize, host.as_ptr() as usize, 1024)];
        for _ in 0..2 {
            assert!(be.set_prelude(&p));
            be.tag_next(9);
            be.compute(&graphs[0]).unwrap();
        }
        let from = api.log.lock().unwrap().len();
        assert!(be.set_prelude(&p));
        assert!(be.replay_tagged(9).unwrap());
        assert_eq!(count(&api, from, "graph_launch"), 1);
        assert_eq!(
            count(&api, from, "copy_htod_async"),
            0,
            "the graph makes the copies"
        );
        assert!(!be.replay_tagged(9).unwrap(), "not without its copies set");
        assert!(
            be.replay_tagged(1).unwrap(),
            "the plain graph is still kept"
        );
        // A buffer freed since: the tags' keys can no longer match.
        crate::tensor::bump_free_epoch();
        assert!(!be.replay_tagged(1).unwrap());
        be.synchronize().unwrap();
        drop(be);
        assert_eq!(api.live.execs.load(Ordering::SeqCst), 0);
        drop(buf);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// RFHYBRID's replays: the copies in set as a prelude are made by the captured graph, so
    /// a replay makes no copy call; other copies make the graph a new one.
    #[test]
    fn a_prelude_is_captured_with_its_graph() {
        let dir = cache_dir("prelude");
        let (api, _ctx, buf, mut be) = mock_backend(&dir);
        let base = buf.base();
        let at = |off: usize| unsafe { base.add(off) } as *mut std::ffi::c_void;
        let mut x = TT::new(GgmlType::F32, [64, 4, 1, 1]);
        x.t.data = at(0);
        let mut a = TT::new(GgmlType::F32, [64, 4, 1, 1]);
        a.op(op::ADD).src(0, &x).src(1, &x);
        a.t.data = at(4096);
        let g = [a.tensor()];
        let host = vec![0u8; 2048];
        let p = [
            (at(0) as usize, host.as_ptr() as usize, 1024),
            (at(1024) as usize, host.as_ptr() as usize + 1024, 1024),
        ];
        let other = [(at(0) as usize, host.as_ptr() as usize, 512)];
        let mut run = |prelude: &[(usize, usize, usize)]| {
            let from = api.log.lock().unwrap().len();
            assert!(be.set_prelude(prelude));
            let replayed = be.replay_last().unwrap();
            if !replayed {
                be.compute(&g).unwrap();
            }
            be.synchronize().unwrap();
            let log = api.log.lock().unwrap();
            let n = |what: &str| log[from..].iter().filter(|w| **w == what).count();
            (
                replayed,
                n("copy_htod_async"),
                n("capture_begin"),
                n("graph_launch"),
            )
        };
        assert_eq!(
            run(&p),
            (false, 2, 0, 0),
            "a new graph: copies, then launch by launch"
        );
        assert_eq!(
            run(&p),
            (false, 2, 1, 1),
            "seen twice: captured with its copies"
        );
        assert_eq!(
            run(&p),
            (true, 0, 0, 1),
            "replayed: the graph makes the copies"
        );
        assert_eq!(run(&p), (true, 0, 0, 1));
        assert_eq!(run(&other), (false, 1, 0, 0), "other copies: another graph");
        assert_eq!(run(&[]), (false, 0, 0, 0), "no copies: another graph again");
        // Device memory that is not the backend's is refused.
        assert!(!be.set_prelude(&[(0x10, host.as_ptr() as usize, 16)]));
        drop(be);
        drop(buf);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn clean_run_works_and_leaks_nothing() {
        let api = Arc::new(MockApi::new(0));
        let seen = scenario(&api);
        assert!(seen.errors.is_empty(), "{:?}", seen.errors);
        assert!(seen.usable && seen.last_ok);
        check_nothing_live(&api, 0);
        let log = api.log.lock().unwrap();
        for what in ["capture_begin", "graph_launch", "copy_htod_async", "launch"] {
            assert!(log.contains(&what), "the scenario never calls {what}");
        }
        assert!(!log.contains(&"device_sync"));
    }

    /// Fails every call of the scenario in turn (of the hundreds of kernel lookups only the
    /// first and last): no panic, no leak, an error for the caller where the failure matters,
    /// and the backend computing again afterwards.
    #[test]
    fn each_failing_driver_call_gives_an_error_and_no_leak() {
        let clean = Arc::new(MockApi::new(0));
        scenario(&clean);
        let log = clean.log.lock().unwrap().clone();
        let lookups: Vec<usize> = (0..log.len())
            .filter(|&i| log[i] == "module_function")
            .collect();
        let mut tried = 0;
        for k in 1..=log.len() {
            let i = k - 1;
            if log[i] == "module_function"
                && Some(&i) != lookups.first()
                && Some(&i) != lookups.last()
            {
                continue;
            }
            tried += 1;
            let api = Arc::new(MockApi::new(k));
            let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&api)))
                .unwrap_or_else(|_| panic!("panic when call {k} ({}) failed", log[i]));
            assert_eq!(
                api.injected.load(Ordering::SeqCst),
                1,
                "call {k} ({}) not reached",
                log[i]
            );
            check_nothing_live(&api, k);
            if seen.usable {
                assert!(
                    seen.last_ok,
                    "backend broken after call {k} ({}) failed: {:?}",
                    log[i], seen.errors
                );
            }
            // Calls whose failure the caller must hear about (the others have a fallback:
            // graph capture -> direct launches, staging -> direct copies, counters -> merge kernel).
            // A launch while capturing is retried directly; the first launch is not captured.
            let must_report = [
                "compile",
                "module_load",
                "module_function",
                "copy_dtoh_async",
                "copy_dtod_async",
                "graph_launch",
            ];
            let first_launch = log.iter().position(|&c| c == "launch") == Some(i);
            if (must_report.contains(&log[i]) || first_launch) && i < seen.tail_from {
                assert!(
                    !seen.errors.is_empty(),
                    "failure of call {k} ({}) not reported",
                    log[i]
                );
            }
        }
        assert!(tried > 40, "only {tried} calls tried");
    }

    /// A fresh cache directory for one test.
    fn cache_dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rf-mock-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn kernels(api: &Arc<MockApi>, dir: &std::path::Path) -> crate::gpu::kernels::Kernels {
        let api: Arc<dyn GpuApi> = api.clone();
        crate::gpu::kernels::Kernels::new(api, 0, &MockApi::info(), Some(dir.to_path_buf()))
    }

    /// A cached group that loads but lacks a kernel (stale or foreign file with a valid
    /// header) is evicted and the group compiled and stored again, instead of the GPU being
    /// disabled; the next process then loads it from the cache. A failed compile is not
    /// remembered on disk: the next process compiles again.
    #[test]
    fn cache_recovers_from_a_hollow_module_and_a_failed_build() {
        use crate::gpu::kernel_cache::Cache;
        use crate::gpu::kernel_groups::group_of;
        let dir = cache_dir("hollow");
        let g = group_of("binary_f32").unwrap();
        let api = Arc::new(MockApi::new(0));
        let (name, key) = kernels(&api, &dir).cache_entry(g);
        let cache = Cache::open(&dir).unwrap();
        cache.store(&name, &key, b"hollow image").unwrap();
        *api.hollow_image.lock().unwrap() = b"hollow image".to_vec();
        assert!(kernels(&api, &dir).get("binary_f32").is_ok());
        assert_eq!(api.compiles.load(Ordering::SeqCst), 1, "compiled again");
        assert_eq!(
            api.live.modules.load(Ordering::SeqCst),
            1,
            "hollow module unloaded"
        );
        assert_eq!(cache.load(&name, &key).unwrap(), Some(api.image.clone()));

        let next = Arc::new(MockApi::new(0));
        assert!(kernels(&next, &dir).get("binary_f32").is_ok());
        assert_eq!(next.compiles.load(Ordering::SeqCst), 0, "from the cache");

        cache.evict(&name);
        let failing = Arc::new(MockApi::new(1)); // call 1: the compile
        let k = kernels(&failing, &dir);
        assert!(k.get("binary_f32").is_err());
        assert!(
            k.get("binary_f32").is_err(),
            "failure remembered in the process"
        );
        assert_eq!(failing.compiles.load(Ordering::SeqCst), 0);
        assert!(k.all_failed());
        assert_eq!(cache.load(&name, &key).unwrap(), None);
        let retry = Arc::new(MockApi::new(0));
        assert!(kernels(&retry, &dir).get("binary_f32").is_ok());
        assert_eq!(
            retry.compiles.load(Ordering::SeqCst),
            1,
            "compiled in the next process"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A group that fails to build fails its kernels only: the others still build, and the
    /// device keeps claiming ops (it declines them only when nothing builds at all).
    #[test]
    fn one_failed_group_leaves_the_others_working() {
        let dir = cache_dir("onefail");
        let api = Arc::new(MockApi::new(1)); // call 1: the first compile
        let ctx = GpuCtx::for_test(api.clone(), MockApi::info(), Some(dir.clone()));
        let k = &ctx.kernels;
        let err = k.get("binary_f32").unwrap_err();
        assert!(err.contains("elementwise"), "{err}");
        assert!(
            ctx.kernels_failed(),
            "nothing built yet: the device declines ops"
        );
        assert!(k.get("soft_max_f32").is_ok());
        assert!(k.any_failed() && !ctx.kernels_failed());
        assert!(k.get("scale_f32").is_err(), "the failed group stays failed");
        assert_eq!(*api.compiled.lock().unwrap(), ["rows.hip"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A launch compiles only its kernel's group, once; each group is its own cache file, and
    /// a corrupt one is compiled again alone.
    #[test]
    fn groups_compile_lazily_and_cache_separately() {
        use crate::gpu::kernel_groups::{group_of, groups};
        let dir = cache_dir("groups");
        let api = Arc::new(MockApi::new(0));
        let k = kernels(&api, &dir);
        let names = ["binary_f32", "mul_mat_vec_q1_q4_1", "get_rows_q4_1"];
        let mut funcs = Vec::new();
        for n in names {
            funcs.push(k.get(n).unwrap());
        }
        assert_eq!(
            k.get("mul_mat_vec_q1_q4_1").unwrap(),
            funcs[1],
            "same function"
        );
        assert_eq!(
            *api.compiled.lock().unwrap(),
            ["elementwise.hip", "mmvq_q4_1.hip", "mul_mat_q4_1.hip"],
            "only the groups launched, once each"
        );
        let files = |d: &std::path::Path| std::fs::read_dir(d).unwrap().count();
        assert_eq!(files(&dir), 3, "a cache file per group");
        // One group's file corrupted: the next process compiles that group only.
        let (corrupt, _) = k.cache_entry(group_of("get_rows_q4_1").unwrap());
        let path = dir.join(&corrupt);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let next = Arc::new(MockApi::new(0));
        let k2 = kernels(&next, &dir);
        for n in names {
            assert!(k2.get(n).is_ok());
        }
        assert_eq!(*next.compiled.lock().unwrap(), ["mul_mat_q4_1.hip"]);
        assert_eq!(files(&dir), 3);
        assert!(groups().len() > 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Threads asking for one group at once compile it once; a prefetch builds the groups on
    /// its own threads, and a launch then only loads them.
    #[test]
    fn concurrent_gets_and_prefetch_compile_each_group_once() {
        let dir = cache_dir("concurrent");
        let api = Arc::new(MockApi::new(0));
        api.compile_ms.store(50, Ordering::SeqCst);
        let k = kernels(&api, &dir);
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| assert!(k.get("soft_max_f32").is_ok()));
            }
        });
        assert_eq!(*api.compiled.lock().unwrap(), ["rows.hip"]);
        let asked = k.prefetch([
            "rope_f32",
            "norm_f32",
            "soft_max_f32",
            "cpy_f32_f16",
            "norm_f32",
        ]);
        assert_eq!(asked, 3, "rows was built already; norm asked once");
        assert_eq!(k.prefetch(["norm_f32"]), 0);
        for n in ["rope_f32", "norm_f32", "cpy_f32_f16"] {
            assert!(k.get(n).is_ok());
        }
        assert_eq!(
            k.misses(),
            1,
            "only the first get had to build its group itself"
        );
        let mut c = api.compiled.lock().unwrap().clone();
        c.sort();
        assert_eq!(c, ["cpy.hip", "mmvq.hip", "norm.hip", "rows.hip"]);
        // A backend freed while groups are queued: the queue is taken back and no compile
        // thread runs afterwards (the host may unload the library); the groups still build on
        // first use, each once.
        let names = [
            "get_rows_q5_0",
            "get_rows_q8_0",
            "mul_mat_vec_bf16",
            "mul_mat_vec_q4_0",
        ];
        assert_eq!(
            k.prefetch(names),
            7,
            "4 mul_mat groups, with mmvq q5_0, q8_0 and q4_0"
        );
        k.quiesce();
        let after = api.compiles.load(Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert_eq!(
            api.compiles.load(Ordering::SeqCst),
            after,
            "a compile after quiesce"
        );
        for n in names.into_iter().chain(["mul_mat_vec_q1_q8_0"]) {
            assert!(k.get(n).is_ok());
        }
        let c = api.compiled.lock().unwrap().clone();
        let mut unique = c.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(c.len(), unique.len(), "a group compiled twice: {c:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
