//! A persistent thread pool for parallelism inside a graph computation.
//!
//! The queue worker that calls [`Pool::run`] is thread 0; the pool owns threads
//! `1..n`. A job is a closure every thread runs with its [`ThreadCtx`]; threads meet at
//! [`ThreadCtx::barrier`] (an atomic counter with a phase word, spinning briefly and then
//! yielding, as ggml's barrier). Nothing is allocated per job: the closure lives on the
//! caller's stack and `run` returns only after every thread has left it. Idle threads
//! sleep on a condition variable after a short spin. A pool may pin its threads to CPUs
//! of their own ([`crate::affinity`]).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::affinity::{self, CpuClaim};

/// Spins before a waiting thread starts yielding its time slice.
const SPIN: u32 = 2_000;
/// Yields before an idle pool thread goes to sleep.
const YIELDS: u32 = 2_000;

type Job = dyn Fn(&ThreadCtx<'_>) + Sync;

struct Shared {
    n: usize,
    /// Incremented to publish a job.
    generation: AtomicUsize,
    /// The current job (a lifetime-erased pointer to the caller's closure).
    job: UnsafeCell<Option<*const Job>>,
    /// Pool threads still inside the current job.
    running: AtomicUsize,
    barrier_count: AtomicUsize,
    barrier_phase: AtomicUsize,
    shutdown: AtomicBool,
    sleep: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread calling `run` while no pool thread reads it
// (before the generation bump, after `running` dropped to 0); everything else is atomic.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw job pointer is only dereferenced during `run`.
unsafe impl Send for Shared {}

/// What a thread of a job knows about itself.
pub struct ThreadCtx<'a> {
    /// This thread's index, `0..nth`.
    pub ith: usize,
    /// Number of threads running the job.
    pub nth: usize,
    shared: &'a Shared,
}

impl ThreadCtx<'_> {
    /// Waits until every thread of the job reached this barrier. Writes before it are
    /// visible to every thread after it.
    pub fn barrier(&self) {
        let s = self.shared;
        if s.n == 1 {
            return;
        }
        let phase = s.barrier_phase.load(Ordering::Acquire);
        if s.barrier_count.fetch_add(1, Ordering::AcqRel) == s.n - 1 {
            s.barrier_count.store(0, Ordering::Relaxed);
            s.barrier_phase.fetch_add(1, Ordering::Release);
        } else {
            let mut spins = 0u32;
            while s.barrier_phase.load(Ordering::Acquire) == phase {
                backoff(&mut spins);
            }
        }
    }
}

fn backoff(spins: &mut u32) {
    if *spins < SPIN {
        *spins += 1;
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A fixed set of threads that run jobs together with the caller.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// CPUs the threads are pinned to (thread `i` to the `i`-th), if pinned.
    claim: Option<CpuClaim>,
}

impl Pool {
    /// A pool for jobs of `n` threads (the caller plus `n - 1` spawned ones). With `pin`,
    /// each thread is pinned to a CPU of its own where enough are unclaimed (see
    /// [`crate::affinity`]); the caller pins itself with [`Pool::pin_caller`].
    pub(crate) fn new(n: usize, name: &str, pin: bool) -> std::io::Result<Pool> {
        let n = n.max(1);
        let claim = if pin { CpuClaim::new(n) } else { None };
        let shared = Arc::new(Shared {
            n,
            generation: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            running: AtomicUsize::new(0),
            barrier_count: AtomicUsize::new(0),
            barrier_phase: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut handles = Vec::with_capacity(n - 1);
        for ith in 1..n {
            let s = shared.clone();
            let cpu = claim.as_ref().map(|c| c.cpu(ith));
            let h = std::thread::Builder::new()
                .name(format!("{name}-t{ith}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        affinity::pin_current_thread(cpu);
                    }
                    worker(s, ith)
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    let pool = Pool {
                        shared,
                        handles,
                        claim,
                    };
                    drop(pool);
                    return Err(e);
                }
            }
        }
        Ok(Pool {
            shared,
            handles,
            claim,
        })
    }

    /// Pins the calling thread (thread 0 of every job) to its CPU if the pool is pinned.
    pub(crate) fn pin_caller(&self) {
        if let Some(c) = &self.claim {
            affinity::pin_current_thread(c.cpu(0));
        }
    }

    /// The CPU of each thread, if the pool is pinned.
    pub(crate) fn cpus(&self) -> Option<Vec<usize>> {
        let c = self.claim.as_ref()?;
        Some((0..self.shared.n).map(|i| c.cpu(i)).collect())
    }

    /// Number of threads of a job.
    pub(crate) fn n_threads(&self) -> usize {
        self.shared.n
    }

    /// Runs `f` on every thread (the caller is thread 0) and returns when all are done.
    pub(crate) fn run(&self, f: &(dyn Fn(&ThreadCtx<'_>) + Sync)) {
        let s = &*self.shared;
        let ctx = ThreadCtx {
            ith: 0,
            nth: s.n,
            shared: s,
        };
        if s.n == 1 {
            f(&ctx);
            return;
        }
        // SAFETY: erase the closure's lifetime; pool threads only call it between the
        // generation bump below and their decrement of `running`, and this function does
        // not return before `running` is 0, so the closure outlives every use.
        let erased: *const Job = unsafe { std::mem::transmute::<*const _, *const Job>(f) };
        // SAFETY: no pool thread reads `job` now: the previous job finished (running == 0)
        // and the next generation is not published yet.
        unsafe { *s.job.get() = Some(erased) };
        s.running.store(s.n - 1, Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::Release);
        {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        f(&ctx);
        let mut spins = 0u32;
        while s.running.load(Ordering::Acquire) != 0 {
            backoff(&mut spins);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(s: Arc<Shared>, ith: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            if spins < SPIN + YIELDS {
                backoff(&mut spins);
                spins += u32::from(spins >= SPIN);
            } else {
                let g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
                if s.generation.load(Ordering::Acquire) == seen
                    && !s.shutdown.load(Ordering::Acquire)
                {
                    drop(s.wake.wait(g));
                }
            }
        }
        // SAFETY: the generation bump (Acquire above) published `job`; `run` keeps the
        // closure alive until `running` reaches 0, which happens after this call.
        let job = unsafe { (*s.job.get()).expect("a published job") };
        let ctx = ThreadCtx {
            ith,
            nth: s.n,
            shared: &s,
        };
        // SAFETY: see above; the pointer is valid for the duration of this call.
        unsafe { (*job)(&ctx) };
        s.running.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_and_barriers_order() {
        for n in [1, 2, 3] {
            let pool = Pool::new(n, "test", false).unwrap();
            for _ in 0..50 {
                let counter = AtomicUsize::new(0);
                let seen = Mutex::new(Vec::new());
                pool.run(&|ctx| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    ctx.barrier();
                    seen.lock().unwrap().push(counter.load(Ordering::Relaxed));
                    ctx.barrier();
                });
                assert_eq!(counter.load(Ordering::Relaxed), n);
                assert!(seen.lock().unwrap().iter().all(|&c| c == n));
            }
        }
    }
}
