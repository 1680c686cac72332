//! Graph builders and helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Arc;

use ggml_core::{
    Backend, Context, CopyQueue, DType, DataRef, EventRef, Graph, Tensor, TensorFlags, TensorId,
};
use ggml_sched::testing::{SimBackend, SimOptions, TestBackend, TestBackendOptions};
use ggml_sched::{CheckedBackend, PlanStyle, RaceLog, SchedOptions, Scheduler, WeakenKnob};

/// `waiter`'s queue waits for everything enqueued on `owner` so far.
pub fn wait_for(waiter: &Arc<CheckedBackend>, owner: &Arc<CheckedBackend>) {
    let e = owner.event_new().unwrap().expect("events");
    owner.event_record(e).unwrap();
    waiter
        .event_wait(EventRef {
            owner: owner.as_ref(),
            id: e,
        })
        .unwrap();
}

pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A graph as lists, detached from the builder's storage.
pub struct Built {
    pub tensors: Vec<Tensor>,
    pub nodes: Vec<TensorId>,
    pub leafs: Vec<TensorId>,
}

pub fn build(cap: usize, f: impl FnOnce(&mut Context<'_>) -> Vec<TensorId>) -> Built {
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); cap];
    let mut ctx = Context::new(&mut storage);
    let outs = f(&mut ctx);
    let mut ids = vec![TensorId(0); cap];
    let mut marks = vec![0u64; Graph::marks_len(cap)];
    let mut g = Graph::new(&mut ids, &mut marks);
    for o in outs {
        g.build_forward_expand(&ctx, o).unwrap();
    }
    Built {
        tensors: ctx.tensors().to_vec(),
        nodes: g.nodes().to_vec(),
        leafs: g.leafs().collect(),
    }
}

/// Allocates `vals` on `backend` and points `t` at it (a weight or caller memory).
pub fn place(backend: &dyn Backend, t: &mut Tensor, vals: &[f32]) {
    let bytes = to_bytes(vals);
    assert_eq!(bytes.len(), t.nbytes());
    let info = backend.alloc_buffer(bytes.len()).unwrap();
    backend.buffer_set(info.id, 0, &bytes).unwrap();
    t.data = Some(DataRef {
        buffer: info.id,
        addr: info.base,
    });
}

/// The layer-split chain: inputs `x` and `p` (positions-like, read by every layer) on
/// the input backend; layer l on device `dev[l]`: `h = ((h * s_l) + w_l) + p`, the first
/// node pinned to the layer's device (as llama pins its norm); output `h` flagged OUTPUT.
pub struct Chain {
    pub g: Built,
    pub x: TensorId,
    pub p: TensorId,
    pub out: TensorId,
    pub pins: Vec<(TensorId, usize)>,
    pub n: usize,
    pub layers: Vec<usize>,
}

pub const SCALES: [f32; 4] = [2.0, 0.5, 1.0, 2.0];

pub fn chain(n: usize, layers: &[usize]) -> Chain {
    let mut x = TensorId(0);
    let mut p = TensorId(0);
    let mut out = TensorId(0);
    let mut pins = Vec::new();
    let g = build(16 + 8 * layers.len(), |ctx| {
        x = ctx.new_tensor_1d(DType::F32, n).unwrap();
        ctx.set_name(x, "x").unwrap();
        ctx.set_flags(x, TensorFlags::INPUT).unwrap();
        p = ctx.new_tensor_1d(DType::F32, n).unwrap();
        ctx.set_name(p, "p").unwrap();
        ctx.set_flags(p, TensorFlags::INPUT).unwrap();
        let mut h = x;
        for (l, &d) in layers.iter().enumerate() {
            let w = ctx.new_tensor_1d(DType::F32, n).unwrap();
            ctx.set_name(w, &format!("w{l}")).unwrap();
            ctx.set_flags(w, TensorFlags::WEIGHT).unwrap();
            let s = ctx.scale(h, SCALES[l % 4]).unwrap();
            ctx.set_name(s, &format!("s{l}")).unwrap();
            pins.push((s, d));
            let a = ctx.add(s, w).unwrap();
            ctx.set_name(a, &format!("a{l}")).unwrap();
            h = ctx.add(a, p).unwrap();
            ctx.set_name(h, &format!("h{l}")).unwrap();
        }
        out = h;
        ctx.set_flags(out, TensorFlags::OUTPUT).unwrap();
        vec![out]
    });
    Chain {
        g,
        x,
        p,
        out,
        pins,
        n,
        layers: layers.to_vec(),
    }
}

impl Chain {
    pub fn weight(&self, l: usize) -> Vec<f32> {
        (0..self.n).map(|i| (l * 3 + i % 5) as f32).collect()
    }

    /// Places every weight on its layer's device.
    pub fn place_weights(&mut self, backends: &[Arc<dyn Backend>]) {
        for (l, &d) in self.layers.clone().iter().enumerate() {
            let w = self
                .g
                .tensors
                .iter()
                .position(|t| t.name.as_str() == format!("w{l}"))
                .unwrap();
            let vals = self.weight(l);
            place(&*backends[d], &mut self.g.tensors[w], &vals);
        }
    }

    pub fn inputs(&self, run: u64) -> (Vec<f32>, Vec<f32>) {
        let x = (0..self.n).map(|i| (run as usize * 7 + i) as f32).collect();
        let p = (0..self.n).map(|i| (run as usize + i % 3) as f32).collect();
        (x, p)
    }

    pub fn expected(&self, run: u64) -> Vec<f32> {
        let (mut h, p) = self.inputs(run);
        for l in 0..self.layers.len() {
            let w = self.weight(l);
            for i in 0..self.n {
                h[i] = ((h[i] * SCALES[l % 4]) + w[i]) + p[i];
            }
        }
        h
    }

    pub fn scheduler(&mut self, backends: Vec<Arc<dyn Backend>>, opts: SchedOptions) -> Scheduler {
        self.scheduler_with(backends, Vec::new(), opts)
    }

    /// [`Chain::scheduler`] with copy engines (none: a plain scheduler).
    pub fn scheduler_with(
        &mut self,
        backends: Vec<Arc<dyn Backend>>,
        engines: Vec<Arc<dyn Backend>>,
        opts: SchedOptions,
    ) -> Scheduler {
        self.place_weights(&backends);
        let mut s = if engines.is_empty() {
            Scheduler::new(backends, opts).unwrap()
        } else {
            Scheduler::with_copy_engines(backends, engines, opts).unwrap()
        };
        for &(id, b) in &self.pins {
            s.set_tensor_backend(id, b).unwrap();
        }
        s.alloc_nodes(&self.g.tensors, &self.g.nodes, &self.g.leafs)
            .unwrap();
        s
    }

    /// Runs `runs` runs back to back, staging every output, and reads them all at the
    /// end; returns the runs whose output differed.
    pub fn run_staged(&self, s: &mut Scheduler, runs: u64) -> Vec<u64> {
        let first = s.next_run();
        let mut staged = Vec::new();
        for r in first..first + runs {
            let (x, p) = self.inputs(r);
            s.set_input(self.x, &to_bytes(&x)).unwrap();
            s.set_input(self.p, &to_bytes(&p)).unwrap();
            s.compute().unwrap();
            staged.push(s.stage_output(self.out).unwrap());
        }
        let mut out = vec![0u8; self.n * 4];
        let mut bad = Vec::new();
        for st in staged {
            let r = st.run();
            s.read_staged(st, &mut out).unwrap();
            if to_f32(&out) != self.expected(r) {
                bad.push(r);
            }
        }
        bad
    }

    /// Runs `runs` pipelined runs, reading each output as late as the slots allow;
    /// returns the runs whose output differed.
    pub fn run_pipelined(&self, s: &mut Scheduler, runs: u64) -> Vec<u64> {
        let n_copies = s.options().n_copies as u64;
        let mut bad = Vec::new();
        let mut out = vec![0u8; self.n * 4];
        let mut check = |s: &mut Scheduler, r: u64| {
            s.get_tensor_run(r, self.out, &mut out).unwrap();
            if to_f32(&out) != self.expected(r) {
                bad.push(r);
            }
        };
        let first = s.next_run();
        for r in first..first + runs {
            let (x, p) = self.inputs(r);
            s.set_input(self.x, &to_bytes(&x)).unwrap();
            s.set_input(self.p, &to_bytes(&p)).unwrap();
            s.compute().unwrap();
            if r + 1 >= first + n_copies {
                check(s, r + 1 - n_copies);
            }
        }
        for r in (first + runs).saturating_sub(n_copies - 1).max(first)..first + runs {
            check(s, r);
        }
        s.synchronize().unwrap();
        bad
    }
}

/// Backend setup of one test configuration.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub n_backends: usize,
    /// 0: all source-queue copies, 1: all destination, 2: alternating.
    pub queues: usize,
    pub events: bool,
    pub foreign_waits: bool,
    pub async_copy: bool,
    pub n_copies: usize,
}

impl Setup {
    /// Backends with events and waits on each other's events, as real devices have.
    pub fn with_events(
        n_backends: usize,
        queues: usize,
        async_copy: bool,
        n_copies: usize,
    ) -> Setup {
        Setup {
            n_backends,
            queues,
            events: true,
            foreign_waits: true,
            async_copy,
            n_copies,
        }
    }

    pub fn queue(&self, i: usize) -> CopyQueue {
        match self.queues {
            0 => CopyQueue::Source,
            1 => CopyQueue::Destination,
            _ if i % 2 == 0 => CopyQueue::Source,
            _ => CopyQueue::Destination,
        }
    }

    pub fn all() -> Vec<Setup> {
        let mut v = Vec::new();
        for n_backends in 2..=4 {
            for queues in 0..3 {
                for events in [true, false] {
                    for n_copies in 1..=4 {
                        v.push(Setup {
                            n_backends,
                            queues,
                            events,
                            foreign_waits: !(n_backends == 3 && queues == 2),
                            async_copy: true,
                            n_copies,
                        });
                    }
                }
            }
        }
        v
    }

    pub fn sims(&self) -> Vec<Arc<dyn Backend>> {
        (0..self.n_backends)
            .map(|i| {
                let mut o = SimOptions::new(&format!("sim{i}"));
                o.copy_queue = self.queue(i);
                o.events = self.events;
                o.foreign_waits = self.foreign_waits;
                SimBackend::new(o) as Arc<dyn Backend>
            })
            .collect()
    }

    pub fn tests(&self, seed: Option<u64>, max_delay_us: u64) -> Vec<Arc<TestBackend>> {
        TestBackend::many(self.n_backends, |i, o| {
            o.copy_queue = self.queue(i);
            o.events = self.events;
            o.foreign_waits = self.foreign_waits;
            o.async_copy = self.async_copy;
            o.delay_seed = seed.map(|s| s * 31 + i as u64);
            o.max_delay_us = max_delay_us;
        })
    }

    pub fn opts(&self, style: PlanStyle, weaken: &[WeakenKnob]) -> SchedOptions {
        SchedOptions {
            n_copies: self.n_copies,
            style,
            weaken: weaken.iter().copied().collect::<BTreeSet<_>>(),
            ..SchedOptions::default()
        }
    }
}

pub fn dyns(v: Vec<Arc<TestBackend>>) -> Vec<Arc<dyn Backend>> {
    v.into_iter().map(|b| b as Arc<dyn Backend>).collect()
}

pub fn checked(v: Vec<Arc<dyn Backend>>) -> (Vec<Arc<dyn Backend>>, Arc<RaceLog>) {
    let log = RaceLog::new();
    (CheckedBackend::wrap_all(&v, &log), log)
}

/// Test backends with per-backend copy queue, delay and seed.
pub fn test_backends(specs: &[(CopyQueue, u64)], seed: u64) -> Vec<Arc<TestBackend>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, &(q, delay))| {
            let mut o = TestBackendOptions::new(&format!("test{i}"));
            o.copy_queue = q;
            o.delay_seed = if delay > 0 {
                Some(seed * 131 + i as u64)
            } else {
                None
            };
            o.max_delay_us = delay;
            TestBackend::new(o)
        })
        .collect()
}

/// A two-stage pipeline with an accumulator on the second stage: A computes
/// `x = in * 2` (the input lives on A), B adds the copy of x into `acc` (caller memory on
/// B) every run. Any copy that reads the wrong x changes the final sum.
pub struct Pipe {
    pub g: Built,
    pub input: TensorId,
    pub acc: TensorId,
    pub pins: Vec<(TensorId, usize)>,
    pub n: usize,
    pub input_on_b: bool,
}

/// With `reuse`, A computes a second tensor after B's split, which the allocator places
/// over x's bytes (the HB6 scenario). With `input_on_b`, B's split reads a copy of the
/// input itself (the HB5 scenario).
pub fn pipe(n: usize, reuse: bool, input_on_b: bool) -> Pipe {
    let mut input = TensorId(0);
    let mut acc = TensorId(0);
    let mut pins = Vec::new();
    let g = build(32, |ctx| {
        input = ctx.new_tensor_1d(DType::F32, n).unwrap();
        ctx.set_name(input, "in").unwrap();
        ctx.set_flags(input, TensorFlags::INPUT).unwrap();
        acc = ctx.new_tensor_1d(DType::F32, n).unwrap();
        ctx.set_name(acc, "acc").unwrap();
        let x = if input_on_b {
            input
        } else {
            let x = ctx.scale(input, 2.0).unwrap();
            ctx.set_name(x, "x").unwrap();
            x
        };
        let y = ctx.scale(x, 1.0).unwrap();
        ctx.set_name(y, "y").unwrap();
        let sum = ctx.add(acc, y).unwrap();
        ctx.set_name(sum, "sum").unwrap();
        let upd = ctx.cpy(sum, acc).unwrap();
        let mut outs = vec![upd];
        if reuse {
            let z = ctx.scale(input, 3.0).unwrap();
            ctx.set_name(z, "z").unwrap();
            let z2 = ctx.scale(z, 1.0).unwrap();
            ctx.set_name(z2, "z2").unwrap();
            ctx.set_flags(z2, TensorFlags::OUTPUT).unwrap();
            outs.push(z2);
        }
        outs
    });
    for (i, t) in g.tensors.iter().enumerate() {
        let id = TensorId(i as u32);
        match t.name.as_str() {
            "x" | "z" | "z2" => pins.push((id, 0)),
            "y" | "sum" => pins.push((id, 1)),
            _ => {}
        }
    }
    Pipe {
        g,
        input,
        acc,
        pins,
        n,
        input_on_b,
    }
}

impl Pipe {
    pub fn input(&self, r: u64) -> Vec<f32> {
        (0..self.n)
            .map(|i| ((r * 5 + i as u64) % 64) as f32)
            .collect()
    }

    /// Runs `runs` runs back to back (no host reads in between), returns whether the
    /// accumulated sum is exact.
    pub fn run(
        &mut self,
        backends: Vec<Arc<dyn Backend>>,
        opts: SchedOptions,
        input_backend: usize,
        runs: u64,
    ) -> bool {
        self.run_with(backends, Vec::new(), opts, input_backend, runs)
    }

    /// [`Pipe::run`] with copy engines (none: a plain scheduler).
    pub fn run_with(
        &mut self,
        backends: Vec<Arc<dyn Backend>>,
        engines: Vec<Arc<dyn Backend>>,
        opts: SchedOptions,
        input_backend: usize,
        runs: u64,
    ) -> bool {
        place(
            &*backends[1],
            &mut self.g.tensors[self.acc.index()],
            &vec![0.0; self.n],
        );
        let opts = SchedOptions {
            input_backend: Some(input_backend),
            ..opts
        };
        let mut s = if engines.is_empty() {
            Scheduler::new(backends, opts).unwrap()
        } else {
            Scheduler::with_copy_engines(backends, engines, opts).unwrap()
        };
        for &(id, b) in &self.pins {
            s.set_tensor_backend(id, b).unwrap();
        }
        s.alloc_nodes(&self.g.tensors, &self.g.nodes, &self.g.leafs)
            .unwrap();
        let mut expect = vec![0.0f32; self.n];
        let factor = if self.input_on_b { 1.0 } else { 2.0 };
        for r in 0..runs {
            let x = self.input(r);
            for (e, v) in expect.iter_mut().zip(&x) {
                *e += v * factor;
            }
            s.set_input(self.input, &to_bytes(&x)).unwrap();
            s.compute().unwrap();
        }
        s.synchronize().unwrap();
        let mut out = vec![0u8; self.n * 4];
        let t = *s.tensor(0, self.acc).unwrap();
        s.backends()[1].get_tensor(&t, 0, &mut out).unwrap();
        to_f32(&out) == expect
    }
}
