//! The scheduler: partition, plan and allocate once per graph shape, then run the plan
//! any number of times through `&dyn Backend` calls.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ggml_core::{Backend, BackendErrorKind, BufferInfo, EventId, EventRef, Tensor, TensorId};

use crate::check::{AccessContext, CheckedBackend, RaceLog};
use crate::error::{Result, SchedError};
use crate::partition::Partition;
use crate::plan::{
    Action, BackendProps, CopyOn, EventKey, Plan, PlanStyle, WeakenKnob, MAX_COPIES,
};
mod allocate;
mod diagnose;
mod staging;
mod tracing;
pub use staging::StagedOutput;

use crate::trace::{now_ns, SliceKind, TraceTrack, Tracer};

/// Options of a [`Scheduler`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedOptions {
    /// Pipeline slots (1..=[`MAX_COPIES`]): run r uses slot r mod n_copies, so up to
    /// n_copies runs can be in flight.
    pub n_copies: usize,
    /// Which plan to run.
    pub style: PlanStyle,
    /// Backend holding [`ggml_core::TensorFlags::INPUT`] tensors; default the last one
    /// (ggml: the CPU).
    pub input_backend: Option<usize>,
    /// ggml's `op_offload` (see [`PartitionConfig::op_offload`](crate::partition::PartitionConfig::op_offload)).
    pub op_offload: bool,
    /// Route copies of computed tensors round the ring of devices, each forwarded by the
    /// next device's copy engine from the previous device's receive buffer (see
    /// [`PartitionConfig::ring`](crate::partition::PartitionConfig::ring)); needs [`Scheduler::with_copy_engines`] and the
    /// minimal plan.
    pub ring: bool,
    /// Weakened rules, for tests and the harness's `--weaken` only.
    #[doc(hidden)]
    pub weaken: BTreeSet<WeakenKnob>,
    /// How long the host waits for a device before it gives up with
    /// [`SchedError::Timeout`] (a hung queue); `None` waits for ever.
    pub timeout: Option<std::time::Duration>,
}

impl Default for SchedOptions {
    fn default() -> Self {
        SchedOptions {
            n_copies: 1,
            style: PlanStyle::Minimal,
            input_backend: None,
            op_offload: false,
            ring: false,
            weaken: BTreeSet::new(),
            timeout: None,
        }
    }
}

/// What one [`Scheduler::compute`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Run index (0, 1, ...).
    pub run: u64,
    /// Pipeline slot used.
    pub slot: usize,
    /// Splits enqueued.
    pub splits: usize,
    /// Times the host blocked: host waits, host syncs, and the source-queue wait inside
    /// each blocking copy.
    pub host_syncs: usize,
    /// Queue-side event waits.
    pub queue_waits: usize,
    /// Events recorded.
    pub events_recorded: usize,
    /// Copies done by `cpy_tensor_async`.
    pub async_copies: usize,
    /// Copies done through the host (planned, or because a backend declined).
    pub blocking_copies: usize,
    /// Bytes copied between backends.
    pub bytes_copied: u64,
}

/// Cumulative statistics over runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Completed `compute` calls.
    pub runs: u64,
    /// Sum of host syncs.
    pub host_syncs: u64,
    /// Sum of queue waits.
    pub queue_waits: u64,
    /// Sum of recorded events.
    pub events_recorded: u64,
    /// Sum of async copies.
    pub async_copies: u64,
    /// Sum of blocking copies.
    pub blocking_copies: u64,
    /// Sum of bytes copied.
    pub bytes_copied: u64,
    /// Host waits for staged outputs ([`Scheduler::read_staged`], HB7).
    pub host_reads: u64,
}

impl Stats {
    /// Average host syncs per `compute`.
    pub fn host_syncs_per_compute(&self) -> f64 {
        if self.runs == 0 {
            0.0
        } else {
            self.host_syncs as f64 / self.runs as f64
        }
    }

    fn add(&mut self, r: &RunStats) {
        self.runs += 1;
        self.host_syncs += r.host_syncs as u64;
        self.queue_waits += r.queue_waits as u64;
        self.events_recorded += r.events_recorded as u64;
        self.async_copies += r.async_copies as u64;
        self.blocking_copies += r.blocking_copies as u64;
        self.bytes_copied += r.bytes_copied;
    }
}

struct GraphState {
    part: Partition,
    /// One tensor table per slot: the caller's descriptors with data, plus slot copies,
    /// with sources remapped to the slot's copies.
    tables: Vec<Vec<Tensor>>,
    /// `registered[c][b]`: slot `c`'s table as registered with device `b`
    /// ([`Backend::table_register`]), where `b` keeps tables.
    registered: Vec<Vec<Option<ggml_core::TableId>>>,
    plans: Vec<Plan>,
    /// Tensors whose bytes differ per slot (outputs and their views).
    per_slot: Vec<bool>,
    last_run: Option<u64>,
}

/// A multi-backend graph scheduler (ggml's `ggml_backend_sched`).
///
/// Build the graph once per batch shape, [`alloc`](Scheduler::alloc) it, then for each
/// run write inputs with [`set_input`](Scheduler::set_input), call
/// [`compute`](Scheduler::compute) and read outputs with
/// [`get_tensor`](Scheduler::get_tensor). `compute` only enqueues (plus the one host wait
/// HB5 needs when user inputs are copied across backends), so with `n_copies > 1` run
/// r + 1 is submitted while run r still executes; the outputs of the last `n_copies` runs
/// stay readable, and [`stage_output`](Scheduler::stage_output) keeps an output readable
/// for as long as the caller likes without holding its slot.
///
/// How long the scheduler's drop (or a new graph) waits for a backend that already failed
/// a wait by timing out: waiting the whole timeout again for each such backend would
/// only delay the caller; a queue that was reset meanwhile (as a GPU context is)
/// finishes within it, and one that does not is left behind with its memory.
pub const STUCK_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The caller's tensors and graph are never modified: the scheduler keeps its own table.
pub struct Scheduler {
    /// The devices, then their copy engines (if any).
    backends: Vec<Arc<dyn Backend>>,
    /// Number of devices (the backends that run graph nodes).
    n_devices: usize,
    /// Copy engine of each device (an index into `backends`).
    engines: Vec<Option<usize>>,
    /// The last split enqueued on each backend (for timeout errors).
    last_split: std::sync::Mutex<Vec<Option<usize>>>,
    /// Backends that had not finished when a wait timed out: later waits give them only
    /// [`STUCK_GRACE`], not the whole timeout again.
    stuck: std::sync::Mutex<Vec<bool>>,
    opts: SchedOptions,
    props: Vec<BackendProps>,
    pins: Vec<(TensorId, usize)>,
    graph: Option<GraphState>,
    buffers: Vec<Option<BufferInfo>>,
    events: HashMap<EventKey, EventId>,
    next_run: u64,
    stats: Stats,
    logs: Vec<Arc<RaceLog>>,
    tracer: Option<Tracer>,
    /// Free staging buffers and events (see [`Scheduler::stage_output`]).
    staging: Vec<staging::Spare>,
    /// Staging memory holding outputs not read yet.
    staged: HashMap<u64, staging::Spare>,
    next_staged: u64,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("backends", &self.props)
            .field("opts", &self.opts)
            .field("next_run", &self.next_run)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn props_of(backends: &[Arc<dyn Backend>]) -> Vec<BackendProps> {
    let refs: Vec<&dyn Backend> = backends.iter().map(|b| &**b).collect();
    BackendProps::of(&refs)
}

impl Scheduler {
    /// A scheduler over `backends` (index = priority, 0 highest; the last is where
    /// inputs live by default, as ggml's CPU).
    pub fn new(backends: Vec<Arc<dyn Backend>>, opts: SchedOptions) -> Result<Scheduler> {
        if backends.is_empty() {
            return Err(SchedError::Invalid(
                "a scheduler needs at least one backend".into(),
            ));
        }
        if !(1..=MAX_COPIES).contains(&opts.n_copies) {
            return Err(SchedError::Invalid(format!(
                "n_copies must be 1..={MAX_COPIES}, got {}",
                opts.n_copies
            )));
        }
        if let Some(i) = opts.input_backend {
            if i >= backends.len() {
                return Err(SchedError::Invalid(format!(
                    "input backend {i} out of range (have {})",
                    backends.len()
                )));
            }
        }
        if opts.ring {
            return Err(SchedError::Invalid(
                "ring copies need copy engines (Scheduler::with_copy_engines)".into(),
            ));
        }
        let props = props_of(&backends);
        let mut logs: Vec<Arc<RaceLog>> = Vec::new();
        for b in &backends {
            if let Some(c) = b.as_any().downcast_ref::<CheckedBackend>() {
                if !logs.iter().any(|l| Arc::ptr_eq(l, c.log())) {
                    logs.push(c.log().clone());
                }
            }
        }
        let n = backends.len();
        Ok(Scheduler {
            backends,
            n_devices: n,
            engines: Vec::new(),
            last_split: std::sync::Mutex::new(vec![None; n]),
            stuck: std::sync::Mutex::new(vec![false; n]),
            opts,
            props,
            pins: Vec::new(),
            graph: None,
            buffers: vec![None; n],
            events: HashMap::new(),
            next_run: 0,
            stats: Stats::default(),
            logs,
            tracer: None,
            staging: Vec::new(),
            staged: HashMap::new(),
            next_staged: 0,
        })
    }

    /// The backends, in priority order (copy engines not included).
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends[..self.n_devices]
    }

    /// A scheduler whose cross-device copies of computed tensors run on copy engines:
    /// `engines[d]` (a backend with its own queue that can copy between the devices'
    /// memories, see [`Backend::engine_cpy_tensor_async`]) runs the copies into device
    /// `d`, so that they overlap the compute of both devices. Engines run no graph nodes.
    /// Copies that an engine declines fall back to the device queues' copy path.
    pub fn with_copy_engines(
        backends: Vec<Arc<dyn Backend>>,
        engines: Vec<Arc<dyn Backend>>,
        opts: SchedOptions,
    ) -> Result<Scheduler> {
        let n = backends.len();
        if engines.len() != n {
            return Err(SchedError::Invalid(format!(
                "{} copy engines for {n} devices: give one per device",
                engines.len()
            )));
        }
        let mut all = backends;
        all.extend(engines);
        let ring = opts.ring;
        if ring && opts.style != PlanStyle::Minimal {
            return Err(SchedError::Invalid(
                "ring copies need the minimal plan (the naive one has no forward waits)".into(),
            ));
        }
        let mut s = Scheduler::new(
            all,
            SchedOptions {
                ring: false,
                ..opts
            },
        )?;
        s.opts.ring = ring;
        if let Some(i) = s.opts.input_backend.filter(|&i| i >= n) {
            return Err(SchedError::Invalid(format!(
                "input backend {i} out of range (have {n} devices)"
            )));
        }
        s.n_devices = n;
        s.engines = (0..n).map(|d| Some(n + d)).collect();
        Ok(s)
    }

    /// The copy engines, one per device (empty without).
    pub fn copy_engines(&self) -> &[Arc<dyn Backend>] {
        &self.backends[self.n_devices..]
    }

    /// The options.
    pub fn options(&self) -> &SchedOptions {
        &self.opts
    }

    /// The backend properties the planner uses (events may be turned off here when a
    /// backend declared events but `event_new` returned none).
    pub fn backend_props(&self) -> &[BackendProps] {
        &self.props
    }

    /// Pins `id` to `backend` for the next [`alloc`](Scheduler::alloc) (ggml's
    /// `ggml_backend_sched_set_tensor_backend`).
    pub fn set_tensor_backend(&mut self, id: TensorId, backend: usize) -> Result<()> {
        if backend >= self.n_devices {
            return Err(SchedError::Invalid(format!(
                "backend {backend} out of range"
            )));
        }
        self.pins.retain(|(t, _)| *t != id);
        self.pins.push((id, backend));
        Ok(())
    }

    /// Removes every pin.
    pub fn clear_pins(&mut self) {
        self.pins.clear();
    }

    /// Size in bytes of each backend's compute buffer (0 where none is allocated).
    pub fn buffer_sizes(&self) -> Vec<usize> {
        self.buffers
            .iter()
            .map(|b| b.map_or(0, |i| i.size))
            .collect()
    }

    /// The partition of the allocated graph.
    pub fn partition(&self) -> Option<&Partition> {
        self.graph.as_ref().map(|g| &g.part)
    }

    /// The plan run for pipeline slot `slot`.
    pub fn plan(&self, slot: usize) -> Option<&Plan> {
        self.graph.as_ref().and_then(|g| g.plans.get(slot))
    }

    /// The scheduler's descriptor of `id` (with data and remapped sources) in slot
    /// `slot`'s table; ids past the caller's table are slot copies.
    pub fn tensor(&self, slot: usize, id: TensorId) -> Option<&Tensor> {
        self.graph
            .as_ref()
            .and_then(|g| g.tables.get(slot))
            .and_then(|t| t.get(id.index()))
    }

    /// Index of the next run.
    pub fn next_run(&self) -> u64 {
        self.next_run
    }

    /// Cumulative statistics.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Resets the cumulative statistics.
    pub fn reset_stats(&mut self) {
        self.stats = Stats::default();
    }

    fn annotate(&self, ctx: AccessContext) {
        for l in &self.logs {
            l.set_context(ctx);
        }
    }

    fn state(&self) -> Result<&GraphState> {
        self.graph.as_ref().ok_or(SchedError::NoGraph)
    }

    fn tensor_err(&self, id: TensorId, what: &str) -> SchedError {
        let name = self
            .graph
            .as_ref()
            .and_then(|g| g.tables[0].get(id.index()))
            .map(|t| t.name.as_str().to_string())
            .unwrap_or_default();
        SchedError::Tensor {
            id: id.0,
            name,
            what: what.to_string(),
        }
    }

    /// Writes the bytes of input `id` (a leaf without data) for the next run. The write
    /// is enqueued on the input's backend, so it follows every queued read of the
    /// previous run there; copies of it to other backends completed before the previous
    /// `compute` returned (HB5).
    pub fn set_input(&mut self, id: TensorId, bytes: &[u8]) -> Result<()> {
        let gs = self.state()?;
        if !gs.part.user_inputs.contains(&id) {
            return Err(self.tensor_err(
                id,
                "is not an input of the allocated graph (a leaf without data)",
            ));
        }
        let t = &gs.tables[0][id.index()];
        if bytes.len() != t.nbytes() {
            return Err(self.tensor_err(
                id,
                &format!("expects {} bytes, got {}", t.nbytes(), bytes.len()),
            ));
        }
        let b = gs.part.backend_of[id.index()].expect("inputs are assigned");
        let slot = (self.next_run % self.opts.n_copies as u64) as usize;
        self.annotate(AccessContext {
            run: Some(self.next_run),
            slot: Some(slot),
            split: None,
            phase: "set_input",
        });
        let open = match &self.tracer {
            Some(tr) => tr.open(&self.backends, b)?,
            None => None,
        };
        self.backends[b].set_tensor_async(t, 0, bytes)?;
        if let Some(tr) = &self.tracer {
            let mut sl = tr.slice(
                TraceTrack::Queue(b),
                SliceKind::SetInput,
                t.name.as_str().into(),
            );
            sl.run = Some(self.next_run);
            sl.slot = Some(slot);
            tr.close(&self.backends, open, sl)?;
        }
        Ok(())
    }

    /// [`set_input`](Scheduler::set_input) for each pair, then
    /// [`compute`](Scheduler::compute).
    pub fn compute_with(&mut self, inputs: &[(TensorId, &[u8])]) -> Result<RunStats> {
        for (id, bytes) in inputs {
            self.set_input(*id, bytes)?;
        }
        self.compute()
    }

    /// Runs the allocated graph once: enqueues every split with its copies, waits and
    /// records as the plan of this run's slot says. Returns after everything is enqueued
    /// and user-input copies finished (HB5); outputs are readable through
    /// [`get_tensor`](Scheduler::get_tensor) (which waits for the producer's queue, HB7).
    ///
    /// On a backend error every queue is drained, the error is returned, and the
    /// scheduler can run again.
    pub fn compute(&mut self) -> Result<RunStats> {
        let run = self.next_run;
        let c = (run % self.opts.n_copies as u64) as usize;
        let mut st = RunStats {
            run,
            slot: c,
            ..RunStats::default()
        };
        let t0 = now_ns();
        let res = self
            .check_devices()
            .and_then(|()| self.execute(c, run, &mut st));
        self.annotate(AccessContext::default());
        if let Some(tr) = &self.tracer {
            let mut sl = tr.slice(TraceTrack::Host, SliceKind::Submit, format!("run {run}"));
            (sl.run, sl.slot, sl.start_ns, sl.end_ns) = (Some(run), Some(c), t0, now_ns());
            tr.host(sl);
            // Time what already finished, so that pending markers stay few.
            tr.resolve(&self.backends, false)?;
        }
        match res {
            Ok(()) => {
                self.next_run += 1;
                if let Some(g) = self.graph.as_mut() {
                    g.last_run = Some(run);
                }
                self.stats.add(&st);
                Ok(st)
            }
            Err(e) => {
                // The other queues finish the failed run's work; a queue that just timed
                // out is not waited for again (the error says it is stuck).
                self.drain(std::time::Duration::ZERO);
                if let Some(g) = self.graph.as_mut() {
                    g.last_run = None;
                }
                Err(e)
            }
        }
    }

    fn execute(&self, c: usize, run: u64, st: &mut RunStats) -> Result<()> {
        let gs = self.state()?;
        let plan = &gs.plans[c];
        st.splits = plan.splits.len();
        let mut ctx = AccessContext {
            run: Some(run),
            slot: Some(c),
            split: None,
            phase: "prologue",
        };
        for a in &plan.prologue {
            self.annotate(ctx);
            self.exec_traced(gs, c, run, None, a, st)?;
        }
        for sp in &plan.splits {
            ctx.split = Some(sp.split);
            for a in &sp.actions {
                ctx.phase = match a {
                    Action::Copy { .. } => "copy",
                    Action::Compute { .. } => "compute",
                    _ => "sync",
                };
                self.annotate(ctx);
                self.exec_traced(gs, c, run, Some(sp.split), a, st)?;
            }
        }
        ctx.split = None;
        ctx.phase = "epilogue";
        for a in &plan.epilogue {
            self.annotate(ctx);
            self.exec_traced(gs, c, run, None, a, st)?;
        }
        Ok(())
    }

    fn event(&self, k: &EventKey) -> Result<EventId> {
        self.events.get(k).copied().ok_or_else(|| {
            SchedError::Invalid(format!("plan uses an event that was not created: {k:?}"))
        })
    }

    fn exec(&self, gs: &GraphState, c: usize, a: &Action, st: &mut RunStats) -> Result<()> {
        match *a {
            Action::Wait { queue, event, .. } => {
                let id = self.event(&event)?;
                let owner = &*self.backends[event.backend];
                match self.backends[queue].event_wait(EventRef { owner, id }) {
                    Ok(()) => st.queue_waits += 1,
                    Err(e) if e.kind == BackendErrorKind::ForeignEvent => {
                        self.host_event_wait(event.backend, id, || self.event_label(&event))?;
                        st.host_syncs += 1;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Action::HostWait { event, why } => {
                let id = self.event(&event)?;
                self.host_event_wait(event.backend, id, || {
                    format!("{} ({why})", self.event_label(&event))
                })?;
                st.host_syncs += 1;
            }
            Action::HostSync { backend, why } => {
                self.host_sync(backend, &format!("its queue ({why})"))?;
                st.host_syncs += 1;
            }
            Action::Record { event } => {
                let id = self.event(&event)?;
                self.backends[event.backend].event_record(id)?;
                st.events_recorded += 1;
            }
            Action::Compute { split } => {
                let sp = &gs.part.splits[split];
                if let Some(l) = self
                    .last_split
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(sp.backend)
                {
                    *l = Some(split);
                }
                let b = &self.backends[sp.backend];
                match gs.registered[c][sp.backend] {
                    Some(t) => b.graph_compute_table(t, &sp.nodes)?,
                    None => b.graph_compute(&gs.tables[c], &sp.nodes)?,
                }
            }
            Action::Copy {
                copy,
                slot,
                from,
                to,
                on,
                ..
            } => {
                let cp = &gs.part.copies[copy];
                let table = &gs.tables[slot];
                let src = match cp.via {
                    Some(v) => &table[gs.part.copies[v].slots[slot].index()],
                    None => &table[cp.tensor.index()],
                };
                let dst = &table[cp.slots[slot].index()];
                match on {
                    CopyOn::Engine(e) => {
                        let (f, t) = (&*self.backends[from], &*self.backends[to]);
                        if self.backends[e].engine_cpy_tensor_async(f, src, t, dst)? {
                            st.async_copies += 1;
                        } else {
                            // Declined: drain the three queues, then copy through the host.
                            self.host_sync(e, "its copies")?;
                            self.host_sync(from, "its queue before a blocking copy")?;
                            self.host_sync(to, "its queue before a blocking copy")?;
                            st.host_syncs += 3;
                            self.blocking_copy(from, to, src, dst, st)?;
                        }
                    }
                    CopyOn::Src | CopyOn::Dst => {
                        if self.backends[to].cpy_tensor_async(&*self.backends[from], src, dst)? {
                            st.async_copies += 1;
                        } else {
                            // Declined: order it by draining both queues (HB1, HB3, HB4),
                            // then copy through the host.
                            self.host_sync(from, "its queue before a blocking copy")?;
                            self.host_sync(to, "its queue before a blocking copy")?;
                            st.host_syncs += 2;
                            self.blocking_copy(from, to, src, dst, st)?;
                        }
                    }
                    CopyOn::Host => self.blocking_copy(from, to, src, dst, st)?,
                }
                st.bytes_copied += cp.nbytes as u64;
            }
        }
        Ok(())
    }

    fn blocking_copy(
        &self,
        from: usize,
        to: usize,
        src: &Tensor,
        dst: &Tensor,
        st: &mut RunStats,
    ) -> Result<()> {
        let mut buf = vec![0u8; src.nbytes()];
        // get_tensor waits for the source queue: a host sync.
        self.backends[from].get_tensor(src, 0, &mut buf)?;
        let d = dst
            .data
            .ok_or_else(|| SchedError::Invalid("slot copy without data".into()))?;
        let info = self.buffers[to]
            .filter(|i| i.id == d.buffer)
            .ok_or_else(|| {
                SchedError::Invalid("slot copy outside the scheduler's buffer".into())
            })?;
        self.backends[to].buffer_set(d.buffer, (d.addr - info.base) as usize, &buf)?;
        st.host_syncs += 1;
        st.blocking_copies += 1;
        Ok(())
    }

    /// Reads the bytes of `id` as computed by the latest run into `out` (waits for the
    /// queue of the backend holding it, HB7). Outputs (flagged
    /// [`ggml_core::TensorFlags::OUTPUT`]), inputs and weights are always readable; other
    /// intermediates may have been overwritten by the allocator.
    pub fn get_tensor(&self, id: TensorId, out: &mut [u8]) -> Result<()> {
        let gs = self.state()?;
        let run = gs
            .last_run
            .ok_or_else(|| self.tensor_err(id, "no completed compute to read from"))?;
        self.get_tensor_run(run, id, out)
    }

    /// Reads output `id` of run `run`, which must be one of the last `n_copies` runs
    /// (older slots are reused).
    pub fn get_tensor_run(&self, run: u64, id: TensorId, out: &mut [u8]) -> Result<()> {
        let gs = self.state()?;
        let n = self.opts.n_copies as u64;
        if run >= self.next_run || self.next_run - run > n {
            return Err(self.tensor_err(
                id,
                &format!(
                    "run {run} is not readable (next run {}, n_copies {n})",
                    self.next_run
                ),
            ));
        }
        let table = gs
            .tables
            .get((run % n) as usize)
            .ok_or(SchedError::NoGraph)?;
        let t = table
            .get(id.index())
            .ok_or_else(|| self.tensor_err(id, "unknown tensor"))?;
        if Some(run) != gs.last_run && !gs.per_slot[id.index()] {
            return Err(self.tensor_err(
                id,
                "only outputs (TensorFlags::OUTPUT) of earlier runs stay readable",
            ));
        }
        if t.data.is_none() {
            return Err(self.tensor_err(id, "has no data (not in the allocated graph)"));
        }
        if out.len() != t.nbytes() {
            return Err(self.tensor_err(
                id,
                &format!("has {} bytes, output slice has {}", t.nbytes(), out.len()),
            ));
        }
        let owner = self.owner_of(gs, id, t)?;
        self.annotate(AccessContext {
            run: Some(run),
            slot: Some((run % n) as usize),
            split: None,
            phase: "get_tensor",
        });
        // HB7 without draining the owner's queue: a result of the run's graph is complete
        // once the owner's split event of this slot (recorded after each of its splits,
        // and not re-recorded until run + n_copies) has completed; read it outside the
        // queue so that later runs keep going.
        let slot = (run % n) as usize;
        let produced = id.index() < gs.part.n_tensors && t.op != ggml_core::Op::None;
        let split_event = self.events.get(&EventKey {
            backend: owner,
            kind: crate::plan::EventKind::Split,
            slot,
        });
        if let (true, Some(&ev), Some(d), Some(buf)) =
            (produced, split_event, t.data, self.buffers[owner])
        {
            if d.buffer == buf.id && d.addr >= buf.base {
                let off = usize::try_from(d.addr - buf.base)
                    .map_err(|_| self.tensor_err(id, "address outside its buffer"))?;
                let t0 = now_ns();
                self.host_event_wait(owner, ev, || {
                    format!("the split producing '{}' (HB7)", t.name.as_str())
                })?;
                self.trace_read(run, slot, t, t0);
                self.backends[owner].buffer_get(buf.id, off, out)?;
                return self.check_devices();
            }
        }
        let t0 = now_ns();
        self.backends[owner].get_tensor(t, 0, out)?;
        self.trace_read(run, slot, t, t0);
        self.check_devices()
    }

    /// Fails with the first error any device's finished work hit. An output can be ready
    /// while a device whose work fed it failed (its queue went on, with wrong bytes); its
    /// error is reported here, not lost.
    pub(crate) fn check_devices(&self) -> Result<()> {
        for b in &self.backends {
            b.pending_error()?;
        }
        Ok(())
    }

    /// The backend holding tensor `id` (descriptor `t` of some slot's table).
    fn owner_of(&self, gs: &GraphState, id: TensorId, t: &Tensor) -> Result<usize> {
        if id.index() < gs.part.n_tensors {
            let r = t.view_src.unwrap_or(id);
            gs.part.backend_of[r.index()].or(gs.part.backend_of[id.index()])
        } else {
            gs.part
                .copies
                .iter()
                .find(|c| c.slots.contains(&id))
                .map(|c| c.to)
        }
        .ok_or_else(|| self.tensor_err(id, "has no backend"))
    }

    /// Waits for every backend's queue; returns the first error any reported.
    pub fn synchronize(&mut self) -> Result<()> {
        let mut first = None;
        for b in 0..self.backends.len() {
            if let Err(e) = self.host_sync(b, "its queue (synchronize)") {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The host waits for `event` of backend `b`, within the timeout; `what` names the
    /// wait in a timeout error.
    pub(crate) fn host_event_wait(
        &self,
        b: usize,
        event: EventId,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        let backend = &self.backends[b];
        match self.opts.timeout {
            None => Ok(backend.event_synchronize(event)?),
            Some(t) if backend.event_synchronize_timeout(event, t)? => Ok(()),
            Some(t) => Err(self.timeout_err(b, what(), t)),
        }
    }

    /// The host waits for everything queued on backend `b`, within the timeout.
    fn host_sync(&self, b: usize, what: &str) -> Result<()> {
        let backend = &self.backends[b];
        match self.opts.timeout {
            None => Ok(backend.synchronize()?),
            Some(t) if backend.synchronize_timeout(t)? => Ok(()),
            Some(t) => Err(self.timeout_err(b, what.to_string(), t)),
        }
    }

    /// Frees the tables the devices keep for the current graph.
    fn free_tables(&mut self) {
        if let Some(gs) = &mut self.graph {
            for per_slot in &mut gs.registered {
                for (b, t) in per_slot.iter_mut().enumerate() {
                    if let Some(t) = t.take() {
                        let _ = self.backends[b].table_free(t);
                    }
                }
            }
        }
    }

    /// Waits for every queue, dropping errors (they belong to a run already failed); a
    /// queue that does not finish within the timeout (for one that already timed out:
    /// within `grace`) is left behind. Returns whether every queue finished.
    fn drain(&self, grace: std::time::Duration) -> bool {
        let mut all = true;
        let mut stuck = self.stuck.lock().unwrap_or_else(|e| e.into_inner());
        for (b, backend) in self.backends.iter().enumerate() {
            let done = match self.opts.timeout {
                Some(t) => {
                    let t = match stuck[b] {
                        true => t.min(grace),
                        false => t,
                    };
                    !matches!(backend.synchronize_timeout(t), Ok(false))
                }
                None => {
                    let _ = backend.synchronize();
                    true
                }
            };
            stuck[b] &= !done;
            all &= done;
        }
        all
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if !self.drain(STUCK_GRACE) {
            // A queue that never finished (a hung device) may still touch every buffer
            // and event of the graph: leaving them is safe, freeing them is not.
            return;
        }
        self.free_tables();
        for (k, id) in self.events.drain() {
            let _ = self.backends[k.backend].event_free(id);
        }
        for (b, info) in self.buffers.iter_mut().enumerate() {
            if let Some(i) = info.take() {
                let _ = self.backends[b].free_buffer(i.id);
            }
        }
        let staged = self.staged.drain().map(|(_, sp)| sp);
        for sp in self.staging.drain(..).chain(staged) {
            sp.free(&self.backends);
        }
    }
}
