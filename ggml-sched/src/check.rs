//! The happens-before checker: [`CheckedBackend`] wraps any backend, records every read
//! and write of buffer bytes per queue with vector clocks, and reports accesses that are
//! not ordered after a conflicting earlier access into a shared [`RaceLog`].
//!
//! # The model
//!
//! One clock component per queue (one per wrapped backend) plus one for the host. All
//! bookkeeping happens when the host *enqueues*, which is exact for in-order queues, and
//! is why the checker needs no kernels at all (wrap a recording-only backend such as
//! `testing::SimBackend` to check plans):
//!
//! - enqueue on Q: `V(Q) ⊔= V(host)` (host program order), then `V(Q)[Q] += 1`; the
//!   item's accesses are stamped with `V(Q)`;
//! - `event_record(e)` on Q: `V(e) = V(Q)`; `event_wait(e)` on Q: `V(Q) ⊔= V(e)` (the
//!   event's last record at the time of the wait, as CUDA);
//! - `synchronize(Q)` and `get_tensor` on Q: `V(host) ⊔= V(Q)`; `event_synchronize(e)`:
//!   `V(host) ⊔= V(e)`; blocking buffer calls are host accesses;
//! - `graph_compute`: per node (view ops excepted) reads of its sources' byte ranges and
//!   a write of its own range; `set_tensor_async`: a write on the queue;
//!   `cpy_tensor_async`: read of the source and write of the destination on the queue
//!   [`ggml_core::BackendCaps::copy_queue`] names, and with a source-queue copy the
//!   destination queue then joins the source queue's clock (the copy's done-event).
//!
//! An access `a` (agent `q`, stamp `s`) happens before an access with clock `V` iff
//! `s <= V[q]`. A write not ordered after every overlapping earlier access, or a read not
//! ordered after every overlapping earlier write, is a race. Byte ranges are
//! `[data.addr, data.addr + nbytes)` of the descriptors passed in, views included.
//!
//! Reports name both tensors, the split, slot and run the scheduler was executing (it
//! annotates the log of wrapped backends automatically), and the HB rule broken, from
//! who made the two accesses (see [`classify`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use ggml_core::{
    Backend, BackendCaps, BackendKind, BackendResult, BufferId, BufferInfo, CopyQueue, EventId,
    EventRef, MemoryDomain, Name, Op, TableId, Tensor, TensorId,
};

use crate::plan::HbRule;

/// What the scheduler was doing when an access was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AccessContext {
    /// Run index.
    pub run: Option<u64>,
    /// Pipeline slot.
    pub slot: Option<usize>,
    /// Split index.
    pub split: Option<usize>,
    /// Phase: `"copy"`, `"compute"`, `"set_input"`, `"get_tensor"`, ...
    pub phase: &'static str,
}

impl fmt::Display for AccessContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = if self.phase.is_empty() {
            "outside a run"
        } else {
            self.phase
        };
        write!(f, "{phase}")?;
        if let Some(r) = self.run {
            write!(f, " run {r}")?;
        }
        if let Some(s) = self.slot {
            write!(f, " slot {s}")?;
        }
        if let Some(s) = self.split {
            write!(f, " split {s}")?;
        }
        Ok(())
    }
}

/// Who made an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A graph node writing its result.
    Producer,
    /// A graph node reading a source.
    Consumer,
    /// An async copy reading its source.
    CopyRead,
    /// An async copy writing its destination.
    CopyWrite,
    /// `set_tensor_async` (the caller's input write, enqueued).
    InputWrite,
    /// A blocking host read (`get_tensor`, `buffer_get`).
    HostRead,
    /// A blocking host write (`buffer_set`, `buffer_clear`).
    HostWrite,
}

impl Role {
    fn writes(self) -> bool {
        matches!(
            self,
            Role::Producer | Role::CopyWrite | Role::InputWrite | Role::HostWrite
        )
    }
}

/// Kind of conflict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Conflict {
    /// Read after write: a reader not ordered after the writer.
    ReadAfterWrite,
    /// Write after read: a writer not ordered after an earlier reader.
    WriteAfterRead,
    /// Write after write.
    WriteAfterWrite,
}

/// One side of a race.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessInfo {
    /// Tensor name (slot copies are `backend#tensor#slot`).
    pub tensor: String,
    /// Who accessed.
    pub role: Role,
    /// Queue (backend name) or `host`.
    pub queue: String,
    /// What the scheduler was doing.
    pub ctx: AccessContext,
}

impl fmt::Display for AccessInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} of '{}' on {} ({})",
            self.role, self.tensor, self.queue, self.ctx
        )
    }
}

/// A race: two conflicting accesses of overlapping bytes with no happens-before order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaceReport {
    /// The rule broken.
    pub rule: HbRule,
    /// The conflict.
    pub conflict: Conflict,
    /// Buffer of the bytes.
    pub buffer: BufferId,
    /// Overlapping address range `[lo, hi)`.
    pub range: (u64, u64),
    /// The earlier access (in host enqueue order).
    pub earlier: AccessInfo,
    /// The later access, not ordered after the earlier one.
    pub later: AccessInfo,
}

impl fmt::Display for RaceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} race ({:?}) on bytes {:#x}..{:#x} of buffer {}/{}: {} is not ordered after {}",
            self.rule,
            self.conflict,
            self.range.0,
            self.range.1,
            self.buffer.domain.0,
            self.buffer.index,
            self.later,
            self.earlier
        )
    }
}

/// The HB rule a race between `earlier` and `later` breaks, from who made them and
/// whether they touch the same tensor:
///
/// | earlier | later | rule |
/// |---|---|---|
/// | any write | copy read | HB1 (producer → copy) |
/// | copy write | consumer | HB2 (copy → consumer) |
/// | consumer or copy | copy write | HB3 (slot reuse) |
/// | copy read | producer, same tensor | HB4 (source reuse, next run) |
/// | copy read | producer, other tensor | HB6 (allocator reuse across backends) |
/// | consumer, copy read or input write | input or host write | HB5 (user input rewritten) |
/// | producer or copy write | host read, or the reverse | HB7 (host reads outputs) |
/// | anything else | | HB6 |
pub fn classify(earlier: Role, later: Role, same_tensor: bool) -> HbRule {
    use Role::*;
    match (earlier, later) {
        (e, CopyRead) if e.writes() => HbRule::Hb1,
        (CopyWrite, Consumer) => HbRule::Hb2,
        (Consumer | CopyRead | CopyWrite, CopyWrite) => HbRule::Hb3,
        (CopyRead, Producer) if same_tensor => HbRule::Hb4,
        (CopyRead | Consumer | InputWrite, InputWrite | HostWrite) => HbRule::Hb5,
        (Producer | CopyWrite, HostRead) | (HostRead, Producer | CopyWrite) => HbRule::Hb7,
        (InputWrite, Consumer) => HbRule::Hb1,
        _ => HbRule::Hb6,
    }
}

#[derive(Clone, Debug)]
struct Access {
    lo: u64,
    hi: u64,
    write: bool,
    agent: usize,
    stamp: u64,
    info: AccessInfo,
}

/// Identity of a report for deduplication: rule, both tensors, both splits.
type ReportKey = (HbRule, String, String, Option<usize>, Option<usize>);

#[derive(Default)]
struct LogState {
    agents: Vec<String>,
    clocks: Vec<Vec<u64>>,
    events: HashMap<(usize, u32), Vec<u64>>,
    history: HashMap<BufferId, Vec<Access>>,
    ctx: AccessContext,
    reports: Vec<RaceReport>,
    seen: HashSet<ReportKey>,
    total: usize,
    accesses: u64,
}

const HOST: usize = 0;
const MAX_REPORTS: usize = 256;

fn join(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x = (*x).max(*y);
    }
}

impl LogState {
    fn clock(&mut self, agent: usize) -> &mut Vec<u64> {
        let n = self.agents.len();
        let c = &mut self.clocks[agent];
        if c.len() < n {
            c.resize(n, 0);
        }
        c
    }

    /// Host program order, then one tick of the queue.
    fn enqueue(&mut self, q: usize) {
        let h = self.clock(HOST).clone();
        let c = self.clock(q);
        join(c, &h);
        c[q] += 1;
    }

    fn host_tick(&mut self) {
        self.clock(HOST)[HOST] += 1;
    }

    fn host_join(&mut self, v: &[u64]) {
        let v = v.to_vec();
        join(self.clock(HOST), &v);
    }

    #[allow(clippy::too_many_arguments)]
    fn access(
        &mut self,
        agent: usize,
        buffer: BufferId,
        lo: u64,
        hi: u64,
        role: Role,
        tensor: String,
    ) {
        if hi <= lo {
            return;
        }
        self.accesses += 1;
        let clock = self.clock(agent).clone();
        let write = role.writes();
        let info = AccessInfo {
            tensor,
            role,
            queue: self.agents[agent].clone(),
            ctx: self.ctx,
        };
        let hist = self.history.entry(buffer).or_default();
        let mut found = Vec::new();
        for a in hist.iter() {
            if a.hi <= lo || hi <= a.lo || !(write || a.write) || a.agent == agent {
                continue;
            }
            if a.stamp <= clock.get(a.agent).copied().unwrap_or(0) {
                continue;
            }
            let conflict = match (a.write, write) {
                (true, false) => Conflict::ReadAfterWrite,
                (false, true) => Conflict::WriteAfterRead,
                _ => Conflict::WriteAfterWrite,
            };
            let rule = classify(a.info.role, role, a.info.tensor == info.tensor);
            found.push(RaceReport {
                rule,
                conflict,
                buffer,
                range: (lo.max(a.lo), hi.min(a.hi)),
                earlier: a.info.clone(),
                later: info.clone(),
            });
        }
        // Forget what the new access makes redundant: accesses it covers and is ordered
        // after (a later access racing with them races with this one too), and older
        // identical reads of the same agent.
        if write {
            hist.retain(|a| {
                let covered = a.lo >= lo && a.hi <= hi;
                let ordered =
                    a.agent == agent || a.stamp <= clock.get(a.agent).copied().unwrap_or(0);
                !(covered && ordered)
            });
        } else {
            hist.retain(|a| !(a.agent == agent && !a.write && a.lo == lo && a.hi == hi));
        }
        hist.push(Access {
            lo,
            hi,
            write,
            agent,
            stamp: clock[agent],
            info,
        });
        for r in found {
            self.total += 1;
            let key = (
                r.rule,
                r.earlier.tensor.clone(),
                r.later.tensor.clone(),
                r.earlier.ctx.split,
                r.later.ctx.split,
            );
            if self.reports.len() < MAX_REPORTS && self.seen.insert(key) {
                self.reports.push(r);
            }
        }
    }
}

/// Shared collector of race reports and the vector-clock state of every queue wrapped by
/// a [`CheckedBackend`] that uses it.
pub struct RaceLog {
    state: Mutex<LogState>,
}

impl fmt::Debug for RaceLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("RaceLog")
            .field("queues", &s.agents)
            .field("races", &s.total)
            .finish_non_exhaustive()
    }
}

impl RaceLog {
    /// An empty log (with only the host as agent).
    pub fn new() -> Arc<RaceLog> {
        Arc::new(RaceLog {
            state: Mutex::new(LogState {
                agents: vec!["host".into()],
                clocks: vec![vec![0]],
                ..LogState::default()
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, name: String) -> usize {
        let mut s = self.lock();
        s.agents.push(name);
        s.clocks.push(Vec::new());
        s.agents.len() - 1
    }

    /// Sets what the scheduler is doing (stamped on the following accesses).
    pub fn set_context(&self, ctx: AccessContext) {
        self.lock().ctx = ctx;
    }

    /// The distinct races found (at most 256; see [`RaceLog::race_count`]).
    pub fn races(&self) -> Vec<RaceReport> {
        self.lock().reports.clone()
    }

    /// Number of racing access pairs found, duplicates included.
    pub fn race_count(&self) -> usize {
        self.lock().total
    }

    /// Whether no race was found.
    pub fn is_clean(&self) -> bool {
        self.race_count() == 0
    }

    /// The rules broken by the races found.
    pub fn rules(&self) -> BTreeSet<HbRule> {
        self.lock().reports.iter().map(|r| r.rule).collect()
    }

    /// Number of accesses recorded.
    pub fn accesses(&self) -> u64 {
        self.lock().accesses
    }

    /// Forgets the races found (clocks and access history stay).
    pub fn clear_races(&self) {
        let mut s = self.lock();
        s.reports.clear();
        s.seen.clear();
        s.total = 0;
    }

    /// A readable summary: the count, then up to `max` reports, one per line.
    pub fn summary(&self, max: usize) -> String {
        let s = self.lock();
        let mut out = format!("{} races ({} distinct)\n", s.total, s.reports.len());
        for r in s.reports.iter().take(max) {
            out.push_str(&format!("  {r}\n"));
        }
        out
    }

    fn forget_buffer(&self, id: BufferId) {
        self.lock().history.remove(&id);
    }
}

/// A backend wrapper that delegates every call to `inner` and records accesses, event
/// records and waits, and host syncs into a [`RaceLog`]. Event owners and copy sources
/// that are themselves `CheckedBackend`s are unwrapped before delegating.
pub struct CheckedBackend {
    inner: Arc<dyn Backend>,
    log: Arc<RaceLog>,
    agent: usize,
    bufs: Mutex<HashMap<BufferId, (u64, usize)>>,
    /// The tables registered with the inner backend, to record graph accesses.
    tables: Mutex<HashMap<TableId, Arc<[Tensor]>>>,
}

impl fmt::Debug for CheckedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckedBackend")
            .field("inner", &self.inner.name())
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// `b` without a [`CheckedBackend`] wrapper, and the wrapper's queue id if it had one.
fn unwrap_backend(b: &dyn Backend) -> (&dyn Backend, Option<usize>) {
    match b.as_any().downcast_ref::<CheckedBackend>() {
        Some(c) => (&*c.inner, Some(c.agent)),
        None => (b, None),
    }
}

fn range(t: &Tensor, offset: usize, len: Option<usize>) -> Option<(BufferId, u64, u64)> {
    let d = t.data?;
    let lo = d.addr + offset as u64;
    let n = len.unwrap_or_else(|| t.nbytes().saturating_sub(offset)) as u64;
    Some((d.buffer, lo, lo + n))
}

fn tname(tensors: &[Tensor], id: TensorId) -> String {
    let t = &tensors[id.index()];
    if t.name.is_empty() {
        format!("#{}", id.0)
    } else {
        t.name.as_str().to_string()
    }
}

impl CheckedBackend {
    /// Wraps `inner`, recording into `log` as a new queue.
    pub fn new(inner: Arc<dyn Backend>, log: &Arc<RaceLog>) -> Arc<CheckedBackend> {
        let agent = log.register(inner.name().as_str().to_string());
        Arc::new(CheckedBackend {
            inner,
            log: log.clone(),
            agent,
            bufs: Mutex::new(HashMap::new()),
            tables: Mutex::new(HashMap::new()),
        })
    }

    /// Wraps each backend of `backends` into one shared log.
    pub fn wrap_all(backends: &[Arc<dyn Backend>], log: &Arc<RaceLog>) -> Vec<Arc<dyn Backend>> {
        backends
            .iter()
            .map(|b| CheckedBackend::new(b.clone(), log) as Arc<dyn Backend>)
            .collect()
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    /// The log it records into.
    pub fn log(&self) -> &Arc<RaceLog> {
        &self.log
    }

    /// Records the accesses of a graph part enqueued on the inner backend.
    fn record_graph(&self, tensors: &[Tensor], nodes: &[TensorId]) {
        let mut s = self.log.lock();
        s.enqueue(self.agent);
        for &n in nodes {
            let Some(t) = tensors.get(n.index()) else {
                continue;
            };
            if t.op == Op::None || t.op.is_view() {
                continue;
            }
            for (j, src) in t.src.iter().enumerate() {
                let Some(src) = *src else { continue };
                // CPY's second operand is its destination, written, not read.
                if t.op == Op::Cpy && j == 1 {
                    continue;
                }
                if let Some((b, lo, hi)) =
                    tensors.get(src.index()).and_then(|st| range(st, 0, None))
                {
                    s.access(self.agent, b, lo, hi, Role::Consumer, tname(tensors, src));
                }
            }
            if let Some((b, lo, hi)) = range(t, 0, None) {
                s.access(self.agent, b, lo, hi, Role::Producer, tname(tensors, n));
            }
        }
    }

    fn buf(&self, id: BufferId) -> Option<(u64, usize)> {
        self.bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .copied()
    }

    fn host_access(&self, buffer: BufferId, offset: usize, len: usize, role: Role) {
        if let Some((base, _)) = self.buf(buffer) {
            let mut s = self.log.lock();
            s.host_tick();
            let lo = base + offset as u64;
            s.access(
                HOST,
                buffer,
                lo,
                lo + len as u64,
                role,
                format!("<{}+{offset}>", buffer.index),
            );
        }
    }
}

impl Backend for CheckedBackend {
    fn name(&self) -> Name {
        self.inner.name()
    }

    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn caps(&self) -> BackendCaps {
        self.inner.caps()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn domain(&self) -> MemoryDomain {
        self.inner.domain()
    }

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn supports_domain(&self, domain: MemoryDomain) -> bool {
        self.inner.supports_domain(domain)
    }

    fn buffer_from_host_ptr(&self, ptr: u64, size: usize) -> BackendResult<Option<BufferInfo>> {
        let info = self.inner.buffer_from_host_ptr(ptr, size)?;
        if let Some(info) = info {
            self.log.forget_buffer(info.id);
            self.bufs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(info.id, (info.base, info.size));
        }
        Ok(info)
    }

    fn alloc_buffer(&self, size: usize) -> BackendResult<BufferInfo> {
        let info = self.inner.alloc_buffer(size)?;
        self.log.forget_buffer(info.id);
        self.bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(info.id, (info.base, info.size));
        Ok(info)
    }

    fn free_buffer(&self, buffer: BufferId) -> BackendResult<()> {
        self.inner.free_buffer(buffer)?;
        self.bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&buffer);
        self.log.forget_buffer(buffer);
        Ok(())
    }

    fn buffer_set(&self, buffer: BufferId, offset: usize, data: &[u8]) -> BackendResult<()> {
        self.inner.buffer_set(buffer, offset, data)?;
        self.host_access(buffer, offset, data.len(), Role::HostWrite);
        Ok(())
    }

    fn buffer_get(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        self.inner.buffer_get(buffer, offset, out)?;
        self.host_access(buffer, offset, out.len(), Role::HostRead);
        Ok(())
    }

    fn buffer_prefetch(&self, buffer: BufferId, offset: usize, len: usize) -> BackendResult<bool> {
        let kept = self.inner.buffer_prefetch(buffer, offset, len)?;
        if kept {
            // The copy to host memory reads the range on the queue.
            let lo = self.buf(buffer).map_or(0, |(base, _)| base) + offset as u64;
            let mut s = self.log.lock();
            s.enqueue(self.agent);
            s.access(
                self.agent,
                buffer,
                lo,
                lo + len as u64,
                Role::CopyRead,
                format!("<{}+{offset}>", buffer.index),
            );
        }
        Ok(kept)
    }

    fn buffer_clear(&self, buffer: BufferId, value: u8) -> BackendResult<()> {
        self.inner.buffer_clear(buffer, value)?;
        if let Some((_, size)) = self.buf(buffer) {
            self.host_access(buffer, 0, size, Role::HostWrite);
        }
        Ok(())
    }

    fn supports_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        self.inner.supports_op(tensors, node)
    }

    fn offload_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        self.inner.offload_op(tensors, node)
    }

    fn set_tensor_async(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> BackendResult<()> {
        self.inner.set_tensor_async(tensor, offset, data)?;
        let mut s = self.log.lock();
        s.enqueue(self.agent);
        if let Some((b, lo, hi)) = range(tensor, offset, Some(data.len())) {
            s.access(
                self.agent,
                b,
                lo,
                hi,
                Role::InputWrite,
                tensor.name.as_str().to_string(),
            );
        }
        Ok(())
    }

    fn get_tensor(&self, tensor: &Tensor, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        let r = self.inner.get_tensor(tensor, offset, out);
        let mut s = self.log.lock();
        let q = s.clock(self.agent).clone();
        s.host_join(&q);
        r?;
        s.host_tick();
        if let Some((b, lo, hi)) = range(tensor, offset, Some(out.len())) {
            s.access(
                HOST,
                b,
                lo,
                hi,
                Role::HostRead,
                tensor.name.as_str().to_string(),
            );
        }
        Ok(())
    }

    fn cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        let (inner_src, src_agent) = unwrap_backend(src_backend);
        if !self.inner.cpy_tensor_async(inner_src, src, dst)? {
            return Ok(false);
        }
        let q = match self.inner.caps().copy_queue {
            CopyQueue::Source => src_agent.unwrap_or(self.agent),
            CopyQueue::Destination => self.agent,
        };
        let mut s = self.log.lock();
        s.enqueue(q);
        if let Some((b, lo, hi)) = range(src, 0, None) {
            s.access(q, b, lo, hi, Role::CopyRead, src.name.as_str().to_string());
        }
        if let Some((b, lo, hi)) = range(dst, 0, None) {
            s.access(q, b, lo, hi, Role::CopyWrite, dst.name.as_str().to_string());
        }
        if q != self.agent {
            // The destination queue waits for the copy's done-event.
            s.enqueue(self.agent);
            let qc = s.clock(q).clone();
            join(s.clock(self.agent), &qc);
        }
        Ok(true)
    }

    fn engine_cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst_backend: &dyn Backend,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        let (inner_src, _) = unwrap_backend(src_backend);
        let (inner_dst, _) = unwrap_backend(dst_backend);
        if !self
            .inner
            .engine_cpy_tensor_async(inner_src, src, inner_dst, dst)?
        {
            return Ok(false);
        }
        // The copy runs on this (the engine's) queue only.
        let q = self.agent;
        let mut s = self.log.lock();
        s.enqueue(q);
        if let Some((b, lo, hi)) = range(src, 0, None) {
            s.access(q, b, lo, hi, Role::CopyRead, src.name.as_str().to_string());
        }
        if let Some((b, lo, hi)) = range(dst, 0, None) {
            s.access(q, b, lo, hi, Role::CopyWrite, dst.name.as_str().to_string());
        }
        Ok(true)
    }

    fn fused_runs(
        &self,
        tensors: &[Tensor],
        nodes: &[TensorId],
        found: &mut dyn FnMut(usize, usize),
    ) {
        self.inner.fused_runs(tensors, nodes, found)
    }

    fn graph_compute(&self, tensors: &[Tensor], nodes: &[TensorId]) -> BackendResult<()> {
        self.inner.graph_compute(tensors, nodes)?;
        self.record_graph(tensors, nodes);
        Ok(())
    }

    fn table_register(&self, tensors: &[Tensor]) -> BackendResult<Option<TableId>> {
        let id = self.inner.table_register(tensors)?;
        if let Some(id) = id {
            self.tables
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, Arc::from(tensors));
        }
        Ok(id)
    }

    fn table_free(&self, table: TableId) -> BackendResult<()> {
        self.inner.table_free(table)?;
        self.tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&table);
        Ok(())
    }

    fn graph_compute_table(&self, table: TableId, nodes: &[TensorId]) -> BackendResult<()> {
        self.inner.graph_compute_table(table, nodes)?;
        let t = self
            .tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&table)
            .cloned();
        if let Some(t) = t {
            self.record_graph(&t, nodes);
        }
        Ok(())
    }

    fn pending_error(&self) -> BackendResult<()> {
        self.inner.pending_error()
    }

    fn synchronize_timeout(&self, timeout: std::time::Duration) -> BackendResult<bool> {
        let done = self.inner.synchronize_timeout(timeout);
        if matches!(done, Ok(true)) {
            let mut s = self.log.lock();
            let q = s.clock(self.agent).clone();
            s.host_join(&q);
        }
        done
    }

    fn event_synchronize_timeout(
        &self,
        event: EventId,
        timeout: std::time::Duration,
    ) -> BackendResult<bool> {
        let done = self.inner.event_synchronize_timeout(event, timeout);
        if matches!(done, Ok(true)) {
            let mut s = self.log.lock();
            if let Some(v) = s.events.get(&(self.agent, event.0)).cloned() {
                s.host_join(&v);
            }
        }
        done
    }

    fn synchronize(&self) -> BackendResult<()> {
        let r = self.inner.synchronize();
        let mut s = self.log.lock();
        let q = s.clock(self.agent).clone();
        s.host_join(&q);
        r
    }

    fn event_new(&self) -> BackendResult<Option<EventId>> {
        self.inner.event_new()
    }

    fn event_free(&self, event: EventId) -> BackendResult<()> {
        self.inner.event_free(event)?;
        self.log.lock().events.remove(&(self.agent, event.0));
        Ok(())
    }

    fn event_record(&self, event: EventId) -> BackendResult<()> {
        self.inner.event_record(event)?;
        let mut s = self.log.lock();
        s.enqueue(self.agent);
        let c = s.clock(self.agent).clone();
        s.events.insert((self.agent, event.0), c);
        Ok(())
    }

    fn event_wait(&self, event: EventRef<'_>) -> BackendResult<()> {
        let (owner, owner_agent) = unwrap_backend(event.owner);
        self.inner.event_wait(EventRef {
            owner,
            id: event.id,
        })?;
        let mut s = self.log.lock();
        s.enqueue(self.agent);
        let agent = owner_agent.unwrap_or(self.agent);
        if let Some(ec) = s.events.get(&(agent, event.id.0)).cloned() {
            join(s.clock(self.agent), &ec);
        }
        Ok(())
    }

    fn can_wait_on(&self, owner: &dyn Backend) -> bool {
        self.inner.can_wait_on(unwrap_backend(owner).0)
    }

    fn event_synchronize(&self, event: EventId) -> BackendResult<()> {
        self.inner.event_synchronize(event)?;
        let mut s = self.log.lock();
        if let Some(ec) = s.events.get(&(self.agent, event.0)).cloned() {
            s.host_join(&ec);
        }
        Ok(())
    }

    fn event_time_ns(&self, event: EventId) -> BackendResult<Option<u64>> {
        self.inner.event_time_ns(event)
    }
}
