//! A persistent worker pool that runs one whole graph per call: every thread walks the node
//! list and meets the others at a spin barrier between nodes (as ggml-cpu does), so a graph
//! costs one wake-up, not one per node. Workers spin briefly, then sleep on a condvar.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

const SPINS_BEFORE_SLEEP: u32 = 20_000;

/// A value alone on its cache lines (128 bytes: adjacent-line prefetch pairs 64-byte lines).
#[repr(align(128))]
#[derive(Default)]
pub(super) struct Padded<T>(pub(super) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Threads per first-level counter of the barrier.
const FAN_IN: usize = 4;
/// First-level counters: enough for `thread_cap`'s 512 threads.
const MAX_GROUPS: usize = 512 / FAN_IN;

/// Barrier for the threads of one job. `wait` returns false once any thread has panicked,
/// so the others stop instead of waiting forever. Arrivals go up a two-level tree: each group
/// of `FAN_IN` threads counts on its own cache line and the group's last arrival counts on the
/// root line, whose last arrival flips the phase every waiter spins on (another line). One
/// counter for all 16 threads of a Sapphire Rapids host made each arrival wait for the line
/// behind up to 15 others (~1.9 µs a barrier: a SmolLM2-sized token is ~360 of them); the tree
/// waits for at most 4 + 4 (tiny nodes' wall 15-20% lower, SmolLM2-shaped tg128 at 16 threads
/// +5%, 2026-11-26). With the counter beside the phase each arrival also pulled the line from
/// every spinning thread (16 threads made generation slower than 8).
pub struct SpinBarrier {
    groups: Box<[Padded<AtomicUsize>]>,
    count: Padded<AtomicUsize>,
    phase: Padded<AtomicUsize>,
    poisoned: Padded<AtomicBool>,
}

impl SpinBarrier {
    fn new() -> Self {
        SpinBarrier {
            groups: (0..MAX_GROUPS)
                .map(|_| Padded(AtomicUsize::new(0)))
                .collect(),
            count: Padded(AtomicUsize::new(0)),
            phase: Padded(AtomicUsize::new(0)),
            poisoned: Padded(AtomicBool::new(false)),
        }
    }

    /// Zeroes the counters (a job that panicked may have left arrivals behind).
    fn reset(&self) {
        self.count.store(0, Ordering::Relaxed);
        for g in self.groups.iter() {
            g.store(0, Ordering::Relaxed);
        }
    }

    /// Thread `ith` of `n` arrives; returns when all `n` have.
    pub fn wait(&self, ith: usize, n: usize) -> bool {
        if n <= 1 {
            return !self.poisoned.load(Ordering::Relaxed);
        }
        let phase = self.phase.load(Ordering::Acquire);
        // Small jobs count on the root alone; larger ones count in groups first (the group's
        // last arrival zeroes its counter, then goes on to the root for the group).
        let (up, members) = if n <= FAN_IN {
            (true, n)
        } else {
            let g = ith / FAN_IN;
            let size = FAN_IN.min(n - g * FAN_IN);
            let last = size == 1 || self.groups[g].fetch_add(1, Ordering::AcqRel) == size - 1;
            if last && size > 1 {
                self.groups[g].store(0, Ordering::Relaxed);
            }
            (last, n.div_ceil(FAN_IN))
        };
        if up && self.count.fetch_add(1, Ordering::AcqRel) == members - 1 {
            self.count.store(0, Ordering::Relaxed);
            self.phase.fetch_add(1, Ordering::Release);
        } else {
            let mut spins = 0u32;
            while self.phase.load(Ordering::Acquire) == phase {
                if self.poisoned.load(Ordering::Relaxed) {
                    return false;
                }
                spins += 1;
                if spins > 1 << 16 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        !self.poisoned.load(Ordering::Relaxed)
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed)
    }
}

/// What a job sees: its index, the number of threads, and the shared barrier.
pub struct Worker<'a> {
    pub ith: usize,
    pub nth: usize,
    barrier: &'a SpinBarrier,
}

impl Worker<'_> {
    /// Waits for every thread of the job; false if the job is being abandoned.
    pub fn sync(&self) -> bool {
        self.barrier.wait(self.ith, self.nth)
    }
}

type Job = dyn Fn(&Worker) + Sync;

pub struct Shared {
    job: UnsafeCell<Option<*const Job>>,
    n_active: AtomicUsize,
    generation: AtomicUsize,
    remaining: AtomicUsize,
    stop: AtomicBool,
    barrier: SpinBarrier,
    lock: Mutex<()>,
    wake: Condvar,
}

// `job` is written only by the thread in `run`, while no worker reads it (published through
// `generation`), and cleared after every worker has finished.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// Not `Sync` (the marker) and `run` takes `&mut self`: one job at a time by type, since the
/// workers, the job slot and the barrier serve one caller.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    _one_caller: std::marker::PhantomData<std::cell::Cell<()>>,
}

/// Most threads a pool gets, whatever is asked (`set_n_threads`, ROCMFORGE_THREADS): 4 per
/// hardware thread, at least 8, at most 512. Beyond that threads only cost memory and wake-ups.
pub fn thread_cap() -> usize {
    // Read once: available_parallelism reads the cgroup's files (10-20 µs), and libllama sets
    // the thread count before every graph.
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| {
        let hw = std::thread::available_parallelism().map_or(1, |n| n.get());
        hw.saturating_mul(4).clamp(8, 512)
    })
}

type Spawn<'a> = dyn FnMut(usize, Arc<Shared>) -> std::io::Result<JoinHandle<()>> + 'a;

impl ThreadPool {
    /// A pool able to run jobs on up to `n_threads` threads (the caller is thread 0), capped
    /// at `thread_cap` (logged). Err when a worker cannot be started; those already started
    /// are stopped and joined first.
    pub fn new(n_threads: usize) -> Result<ThreadPool, String> {
        Self::new_with(n_threads, &mut |ith, s| {
            std::thread::Builder::new()
                .name(format!("rocmforge-cpu-{ith}"))
                .spawn(move || worker_loop(s, ith))
        })
    }

    fn new_with(n_threads: usize, spawn: &mut Spawn) -> Result<ThreadPool, String> {
        let cap = thread_cap();
        if n_threads > cap {
            crate::log_warn!("RFCPU: {n_threads} threads asked for, using {cap} (the cap)");
        }
        let n_threads = n_threads.clamp(1, cap);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            n_active: AtomicUsize::new(1),
            generation: AtomicUsize::new(0),
            remaining: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            barrier: SpinBarrier::new(),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        // Dropping the pool stops and joins whatever was started, also on failure below.
        let mut pool = ThreadPool {
            shared,
            workers: Vec::new(),
            _one_caller: std::marker::PhantomData,
        };
        for ith in 1..n_threads {
            match spawn(ith, pool.shared.clone()) {
                Ok(h) => pool.workers.push(h),
                Err(e) => {
                    return Err(format!(
                        "cannot start worker thread {ith} of {n_threads}: {e}"
                    ))
                }
            }
        }
        Ok(pool)
    }

    pub fn max_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job` on `n` threads (capped at the pool's size) and returns when all are done.
    /// Err if any thread panicked.
    pub fn run(&mut self, n: usize, job: &(dyn Fn(&Worker) + Sync)) -> Result<(), String> {
        let n = n.clamp(1, self.max_threads());
        if n == 1 {
            // The workers stay asleep (or spinning) where they are: nothing to publish.
            let b = SpinBarrier::new();
            job(&Worker {
                ith: 0,
                nth: 1,
                barrier: &b,
            });
            return Ok(());
        }
        let s = &*self.shared;
        s.barrier.poisoned.store(false, Ordering::Relaxed);
        s.barrier.reset();
        if !self.workers.is_empty() {
            // Erase the borrow's lifetime: we wait below until no worker can touch it.
            let ptr: *const Job =
                unsafe { std::mem::transmute::<&(dyn Fn(&Worker) + Sync), &'static Job>(job) };
            unsafe { *s.job.get() = Some(ptr) };
            s.n_active.store(n, Ordering::Relaxed);
            s.remaining.store(self.workers.len(), Ordering::Relaxed);
            {
                let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.generation.fetch_add(1, Ordering::Release);
                s.wake.notify_all();
            }
        }
        let w = Worker {
            ith: 0,
            nth: n,
            barrier: &s.barrier,
        };
        let mine = catch_unwind(AssertUnwindSafe(|| job(&w)));
        if mine.is_err() {
            s.barrier.poisoned.store(true, Ordering::Relaxed);
        }
        if !self.workers.is_empty() {
            let mut spins = 0u32;
            while s.remaining.load(Ordering::Acquire) != 0 {
                spins += 1;
                if spins > 1 << 16 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            unsafe { *s.job.get() = None };
        }
        match mine {
            Err(e) => std::panic::resume_unwind(e),
            Ok(()) if s.barrier.is_poisoned() => Err("a worker thread panicked".into()),
            Ok(()) => Ok(()),
        }
    }
}

fn worker_loop(s: Arc<Shared>, ith: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            spins += 1;
            if spins < SPINS_BEFORE_SLEEP {
                std::hint::spin_loop();
            } else {
                let g2 = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                if s.generation.load(Ordering::Acquire) == seen && !s.stop.load(Ordering::Acquire) {
                    drop(s.wake.wait(g2).unwrap_or_else(|e| e.into_inner()));
                }
            }
        }
        let n = s.n_active.load(Ordering::Relaxed);
        if ith < n {
            if let Some(job) = unsafe { *s.job.get() } {
                let w = Worker {
                    ith,
                    nth: n,
                    barrier: &s.barrier,
                };
                if catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(&w) })).is_err() {
                    s.barrier.poisoned.store(true, Ordering::Relaxed);
                }
            }
        }
        s.remaining.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.stop.store(true, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn runs_every_thread_and_syncs() {
        let mut pool = ThreadPool::new(4).unwrap();
        for n in 1..=4 {
            let sum = AtomicU64::new(0);
            let after = AtomicU64::new(0);
            pool.run(n, &|w: &Worker| {
                sum.fetch_add(1 << w.ith, Ordering::Relaxed);
                assert!(w.sync());
                // Every thread sees all contributions after the barrier.
                after.fetch_max(sum.load(Ordering::Relaxed), Ordering::Relaxed);
            })
            .unwrap();
            assert_eq!(sum.load(Ordering::Relaxed), (1 << n) - 1);
            assert_eq!(after.load(Ordering::Relaxed), (1 << n) - 1);
        }
    }

    /// Through the two-level barrier (more threads than one group, a last group of one, of
    /// two): every thread sees every write of every round before the next.
    #[test]
    fn tree_barrier_orders_every_round() {
        // The pool is capped at 4 threads per core (at least 8).
        let mut pool = ThreadPool::new(13).unwrap();
        let max = pool.max_threads();
        for n in [5, 6, 8, 9, 13].into_iter().filter(|&n| n <= max) {
            let slots: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
            let bad = AtomicU64::new(0);
            pool.run(n, &|w: &Worker| {
                for round in 1..=100u64 {
                    slots[w.ith].store(round, Ordering::Relaxed);
                    assert!(w.sync());
                    if slots.iter().any(|s| s.load(Ordering::Relaxed) < round) {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    assert!(w.sync());
                }
            })
            .unwrap();
            assert_eq!(bad.load(Ordering::Relaxed), 0, "n={n}");
        }
    }

    #[test]
    fn worker_panic_is_an_error_not_a_hang() {
        let mut pool = ThreadPool::new(2).unwrap();
        let r = pool.run(2, &|w: &Worker| {
            if w.ith == 1 {
                panic!("boom");
            }
            w.sync();
        });
        assert!(r.is_err());
        // The pool still works afterwards.
        pool.run(2, &|w: &Worker| {
            w.sync();
        })
        .unwrap();
    }

    /// A failed spawn is an error, not a panic, and the workers started before it stop.
    #[test]
    fn spawn_failure_stops_started_workers() {
        let alive = Arc::new(AtomicUsize::new(0));
        let mut spawned = 0;
        let r = ThreadPool::new_with(6, &mut |ith, s| {
            if ith == 4 {
                return Err(std::io::Error::other("no more threads"));
            }
            spawned += 1;
            let alive = alive.clone();
            alive.fetch_add(1, Ordering::SeqCst);
            std::thread::Builder::new().spawn(move || {
                worker_loop(s, ith);
                alive.fetch_sub(1, Ordering::SeqCst);
            })
        });
        assert!(r.is_err());
        assert_eq!(spawned, 3);
        assert_eq!(
            alive.load(Ordering::SeqCst),
            0,
            "started workers were joined"
        );
    }

    #[test]
    fn thread_count_is_capped() {
        let pool = ThreadPool::new(1 << 20).unwrap();
        assert_eq!(pool.max_threads(), thread_cap());
        assert!(thread_cap() <= 512);
    }
}
