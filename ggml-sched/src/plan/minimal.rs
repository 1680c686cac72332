//! [`PlanStyle::Minimal`]: the waits each happens-before rule needs and no more,
//! deduplicated with a knowledge vector per queue (see the module docs of [`super`]).

use super::*;

/// Knowledge of one agent (a queue or the host): for each backend Y, the latest point of
/// Q(Y) in this run it is ordered after (0 = start of the run, k + 1 = after split k).
type Known = Vec<Option<usize>>;

fn join(a: &mut Known, b: &Known) {
    for (x, y) in a.iter_mut().zip(b) {
        if y.is_some() && (*x < *y) {
            *x = *y;
        }
    }
}

struct Minimal<'a> {
    props: &'a [BackendProps],
    slot: usize,
    q: Vec<Known>,
    host: Known,
    /// `slot_rel[x][y]`: Q(x) is ordered after Q(y)'s work of run r - N.
    slot_rel: Vec<Vec<bool>>,
    /// Knowledge captured by events recorded in this run.
    ev_known: HashMap<EventKey, Known>,
}

impl Minimal<'_> {
    fn key(&self, backend: usize, kind: EventKind) -> EventKey {
        EventKey {
            backend,
            kind,
            slot: self.slot,
        }
    }

    /// Q(x) gets one more item: its own position moves on, so an event recorded later
    /// marks more than one recorded earlier.
    fn bump(&mut self, x: usize) {
        self.q[x][x] = Some(self.q[x][x].map_or(1, |p| p + 1));
    }

    /// Host program order: whatever the host knows, a newly enqueued item knows.
    fn enqueue(&mut self, x: usize) {
        let h = self.host.clone();
        join(&mut self.q[x], &h);
        for y in 0..self.host.len() {
            if self.q[x][y].is_some() {
                self.slot_rel[x][y] = true;
            }
        }
    }

    fn record(&mut self, acts: &mut Vec<Action>, event: EventKey) {
        let x = event.backend;
        if !self.props[x].events {
            return;
        }
        self.enqueue(x);
        self.ev_known.insert(event, self.q[x].clone());
        acts.push(Action::Record { event });
    }

    fn learn(&mut self, x: usize, event: EventKey) {
        match self.ev_known.get(&event) {
            Some(k) => {
                let k = k.clone();
                join(&mut self.q[x], &k);
            }
            None => {
                // Last recorded in an earlier run: a split event of slot c marks the end
                // of Q(owner)'s work of run r - N.
                if event.kind == EventKind::Split && event.slot == self.slot {
                    self.slot_rel[x][event.backend] = true;
                }
            }
        }
        for y in 0..self.host.len() {
            if self.q[x][y].is_some() {
                self.slot_rel[x][y] = true;
            }
        }
    }

    fn host_learn_all(&mut self, y: usize) {
        let k = self.q[y].clone();
        join(&mut self.host, &k);
    }

    /// Whether Q(x) is already ordered after `event`'s last record: a record of this
    /// run at a point Q(x) knows, or a record of an earlier run when Q(x) is ordered
    /// after some point of this run on the owner (which follows all earlier runs there).
    /// Without events the wait stands for a host sync: Q(x) must know the owner's latest
    /// point.
    fn implied(&self, x: usize, event: EventKey) -> bool {
        let owner = event.backend;
        let known = self.q[x][owner];
        if !self.props[owner].events {
            // Stands for "everything enqueued on the owner so far" (a host sync).
            return known.is_some() && known >= self.q[owner][owner];
        }
        match self.ev_known.get(&event) {
            Some(k) => known.is_some() && known >= k[owner],
            None => known.is_some(),
        }
    }

    /// Orders Q(x) after `event` by the cheapest means available, unless it already is.
    fn wait(&mut self, acts: &mut Vec<Action>, x: usize, event: EventKey, why: HbRule) {
        if self.implied(x, event) {
            return;
        }
        self.wait_always(acts, x, event, why);
    }

    /// As [`Minimal::wait`], even when implied (the own-event wait of the weakened plan).
    fn wait_always(&mut self, acts: &mut Vec<Action>, x: usize, event: EventKey, why: HbRule) {
        let owner = event.backend;
        if !self.props[owner].events {
            acts.push(Action::HostSync {
                backend: owner,
                why,
            });
            self.host_learn_all(owner);
            self.enqueue(x);
            self.slot_rel[x][owner] = true;
        } else if self.props[x].events && self.props[x].can_wait_on[owner] {
            self.enqueue(x);
            acts.push(Action::Wait {
                queue: x,
                event,
                why,
            });
            self.learn(x, event);
        } else {
            acts.push(Action::HostWait { event, why });
            if let Some(k) = self.ev_known.get(&event) {
                let k = k.clone();
                join(&mut self.host, &k);
            }
            self.enqueue(x);
            if event.kind == EventKind::Split && event.slot == self.slot {
                self.slot_rel[x][owner] = true;
            }
        }
    }
}

/// The producer splits whose copies are issued after a later split of the same backend:
/// they record their own [`EventKind::Produced`] event.
fn produced_events(part: &Partition) -> BTreeSet<usize> {
    part.copies
        .iter()
        .filter_map(|cp| {
            let p = cp.producer?;
            let latest = part.splits[..cp.split]
                .iter()
                .rposition(|s| s.backend == cp.from);
            (latest != Some(p)).then_some(p)
        })
        .collect()
}

/// HB1 for a copy into split `k` (run by queue `b`: the destination's, or an engine) of a
/// tensor computed on `a` by split `producer`: Q(b) waits for that split's own event when
/// `a` ran later splits since, else for `a`'s latest split before `k`, or for `a`'s last
/// split of the previous run (slot `prev`) when `a` has none yet in this run, unless Q(b)
/// already knows it.
#[allow(clippy::too_many_arguments)]
fn wait_for_producer(
    m: &mut Minimal<'_>,
    acts: &mut Vec<Action>,
    part: &Partition,
    compute_pos: &[Option<usize>],
    k: usize,
    prev: usize,
    a: usize,
    b: usize,
    producer: Option<usize>,
) {
    let latest = part.splits[..k].iter().rposition(|s| s.backend == a);
    match latest {
        Some(l) if producer.is_some_and(|p| p < l) => {
            let p = producer.expect("checked");
            if m.q[b][a] < compute_pos[p] {
                let e = m.key(a, EventKind::Produced(p as u32));
                m.wait(acts, b, e, HbRule::Hb1);
            }
        }
        Some(p) if m.q[b][a] < compute_pos[p] => {
            let e = m.key(a, EventKind::Split);
            m.wait(acts, b, e, HbRule::Hb1);
        }
        Some(_) => {}
        None => {
            let e = EventKey {
                backend: a,
                kind: EventKind::Split,
                slot: prev,
            };
            m.wait(acts, b, e, HbRule::Hb1);
        }
    }
}

/// The queue a copy into a split on backend `b` runs on.
fn copy_queue_of(
    props: &[BackendProps],
    engines: &[Option<usize>],
    cp: &crate::partition::CopyInput,
    b: usize,
) -> usize {
    match copy_on_with(props, engines, cp, b) {
        CopyOn::Src => cp.from,
        CopyOn::Dst | CopyOn::Host => b,
        CopyOn::Engine(e) => e,
    }
}

/// Builds the minimal plan into `plan`; returns the copy-done waits left pending at the
/// end of the run (per backend), for the next run's carry-in.
pub(super) fn minimal(
    part: &Partition,
    props: &[BackendProps],
    settings: &PlanSettings,
    n_copies: usize,
    c: usize,
    carry: Vec<Vec<EventKey>>,
    plan: &mut Plan,
) -> Vec<Vec<EventKey>> {
    let nb = props.len();
    let prev = (c + n_copies - 1) % n_copies;
    let mut m = Minimal {
        props,
        slot: c,
        q: (0..nb)
            .map(|x| {
                let mut k = vec![None; nb];
                k[x] = Some(0);
                k
            })
            .collect(),
        host: vec![None; nb],
        slot_rel: (0..nb).map(|x| (0..nb).map(|y| x == y).collect()).collect(),
        ev_known: HashMap::new(),
    };
    let mut pending: Vec<Vec<EventKey>> = if carry.len() == nb {
        carry
    } else {
        vec![Vec::new(); nb]
    };
    plan.prologue.clear();
    plan.splits.clear();
    plan.epilogue.clear();

    let (weaken, engines) = (&settings.weaken, &settings.engines[..]);
    let own_event = weaken.contains(&WeakenKnob::OwnEvent);
    let no_slot_wait = weaken.contains(&WeakenKnob::NoSlotWait);
    let async_user = weaken.contains(&WeakenKnob::AsyncUserInput);
    let no_alloc_wait = weaken.contains(&WeakenKnob::NoAllocWait);
    let engine_early = weaken.contains(&WeakenKnob::EngineEarly);
    let engine_reuse = weaken.contains(&WeakenKnob::EngineReuse);
    let engine_no_arrival = weaken.contains(&WeakenKnob::EngineNoArrival);
    let produced = produced_events(part);
    // Engines with copies since their last copy-done record, copies not yet waited for
    // per destination, the engines forwarding out of each device's receive buffers, and
    // the (engine, forwarding engine) pairs already ordered in this run.
    let mut engine_dirty: BTreeSet<usize> = BTreeSet::new();
    let mut arrivals: Vec<BTreeSet<EventKey>> = vec![BTreeSet::new(); nb];
    let mut relay_readers: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); nb];
    for cp in part.copies.iter().filter(|cp| cp.via.is_some()) {
        if let Some(e) = engines.get(cp.to).copied().flatten() {
            relay_readers[cp.from].insert(e);
        }
    }
    let mut relay_rel: BTreeSet<(usize, usize)> = BTreeSet::new();

    // Prologue: mark the caller's input writes on the input backend's queue, if a
    // destination-queue copy will read them.
    let i_b = part.input_backend;
    let needs_inputs_event = part.copies.iter().any(|cp| {
        cp.kind == SourceKind::UserInput && props[cp.to].copy_queue == CopyQueue::Destination
    });
    if needs_inputs_event {
        let e = m.key(i_b, EventKind::Inputs);
        let mut acts = Vec::new();
        m.record(&mut acts, e);
        plan.prologue = acts;
    }
    // Copy queues that ran user-input copies (HB5 epilogue): the point of Q(q) the host
    // must know to be after them, and the order of their last copy.
    let mut user_need: Vec<Option<usize>> = vec![None; nb];
    let mut user_last: Vec<usize> = vec![0; nb];
    let mut n_user_copies = 0usize;

    // The event the HB5 wait of each queue waits on (CopyDone, or InputsCopied when
    // copies of computed tensors followed the user inputs on that queue).
    let mut user_event: Vec<EventKind> = vec![EventKind::CopyDone; nb];
    // Position of each split's compute on its queue.
    let mut compute_pos: Vec<Option<usize>> = vec![None; part.splits.len()];

    for (k, sp) in part.splits.iter().enumerate() {
        let b = sp.backend;
        let mut acts = Vec::new();
        // Input phase: user inputs first, so that the HB5 host wait need not wait for
        // the copies of computed tensors behind them.
        let mut dst_copy_sources: BTreeSet<usize> = BTreeSet::new();
        let mut need_copydone: BTreeSet<usize> = BTreeSet::new();
        let mut engine_copies: BTreeSet<usize> = BTreeSet::new();
        let mut inputs = sp.inputs.clone();
        inputs.sort_by_key(|&ci| part.copies[ci].kind != SourceKind::UserInput);
        let n_user = inputs
            .iter()
            .filter(|&&ci| part.copies[ci].kind == SourceKind::UserInput)
            .count();
        // The producer waits of the computed copies come first (they usually imply the
        // inputs' waits too), so the split keeps its one wait.
        if !own_event && n_user > 0 && copy_on(props, b) != CopyOn::Src {
            for &ci in &inputs[n_user..] {
                let cp = &part.copies[ci];
                if cp.kind != SourceKind::Computed
                    || matches!(copy_on_with(props, engines, cp, b), CopyOn::Engine(_))
                {
                    continue;
                }
                let a = part.copies[ci].from;
                let p = part.copies[ci].producer;
                wait_for_producer(&mut m, &mut acts, part, &compute_pos, k, prev, a, b, p);
            }
        }
        for (i, &ci) in inputs.iter().enumerate() {
            if i == n_user && n_user > 0 && !async_user {
                // Mark the end of the user-input copies on each queue that ran some and
                // runs computed copies next.
                let queues: BTreeSet<usize> = inputs[..n_user]
                    .iter()
                    .map(|&cj| copy_queue_of(props, engines, &part.copies[cj], b))
                    .collect();
                let later: BTreeSet<usize> = inputs[n_user..]
                    .iter()
                    .map(|&cj| copy_queue_of(props, engines, &part.copies[cj], b))
                    .collect();
                for &q in queues.intersection(&later) {
                    let e = m.key(q, EventKind::InputsCopied);
                    m.record(&mut acts, e);
                    user_event[q] = EventKind::InputsCopied;
                }
            }
            let cp = &part.copies[ci];
            let a = cp.from;
            // The destination: this split's backend, or (a copy that a forward round the
            // ring reads) another device.
            let to = cp.to;
            let on = copy_on_with(props, engines, cp, to);
            match on {
                CopyOn::Engine(e) => {
                    // E1 (HB1): the engine after the producer of x; a forward after the
                    // copy into the previous device's receive buffer.
                    if engine_early {
                    } else if cp.via.is_some() {
                        let q = engines[a].expect("forwards run on copy engines");
                        if engine_dirty.remove(&q) {
                            m.record(&mut acts, m.key(q, EventKind::CopyDone));
                        }
                        let ev = m.key(q, EventKind::CopyDone);
                        m.wait(&mut acts, e, ev, HbRule::Hb1);
                    } else if own_event {
                        let ev = m.key(b, EventKind::Split);
                        m.wait_always(&mut acts, e, ev, HbRule::Hb1);
                    } else {
                        let p = cp.producer;
                        wait_for_producer(&mut m, &mut acts, part, &compute_pos, k, prev, a, e, p);
                    }
                    // E2 (HB3): the engine after the readers of the receive buffer from
                    // run r - N: the destination's splits, and the forwards out of it.
                    if !engine_reuse {
                        if !m.slot_rel[e][to] {
                            let ev = m.key(to, EventKind::Split);
                            m.wait(&mut acts, e, ev, HbRule::Hb3);
                        }
                        for &r in &relay_readers[to] {
                            if relay_rel.insert((e, r)) {
                                if engine_dirty.remove(&r) {
                                    m.record(&mut acts, m.key(r, EventKind::CopyDone));
                                }
                                let ev = m.key(r, EventKind::CopyDone);
                                m.wait(&mut acts, e, ev, HbRule::Hb3);
                            }
                        }
                    }
                    m.enqueue(e);
                    m.bump(e);
                    engine_dirty.insert(e);
                    engine_copies.insert(e);
                    arrivals[to].insert(m.key(e, EventKind::CopyDone));
                    // E4: the source's owner overwrites x only after the engine read it
                    // (receive buffers, the sources of forwards, are never reused so).
                    let done = m.key(e, EventKind::CopyDone);
                    if cp.via.is_none() && !pending[a].contains(&done) {
                        pending[a].push(done);
                    }
                }
                CopyOn::Src => {
                    // HB3: Q(A) waits for the readers of the slot from run r - N.
                    if !no_slot_wait && !m.slot_rel[a][b] {
                        let e = m.key(b, EventKind::Split);
                        m.wait(&mut acts, a, e, HbRule::Hb3);
                    }
                    m.enqueue(a);
                    m.bump(a);
                    // The copy-done dependency of cpy_tensor_async: Q(B) after the copy.
                    let ka = m.q[a].clone();
                    join(&mut m.q[b], &ka);
                    if cp.kind == SourceKind::UserInput {
                        need_copydone.insert(a);
                        n_user_copies += 1;
                        user_need[a] = m.q[a][a];
                        user_last[a] = n_user_copies;
                        user_event[a] = EventKind::CopyDone;
                    }
                }
                CopyOn::Dst | CopyOn::Host => {
                    // HB1: Q(B) after the producer of x.
                    match cp.kind {
                        SourceKind::Static => {}
                        SourceKind::UserInput => {
                            if own_event {
                                let e = m.key(b, EventKind::Split);
                                m.wait_always(&mut acts, b, e, HbRule::Hb1);
                            } else if m.q[b][a].is_none() {
                                let e = m.key(a, EventKind::Inputs);
                                m.wait(&mut acts, b, e, HbRule::Hb1);
                            }
                        }
                        SourceKind::Computed => {
                            if own_event {
                                let e = m.key(b, EventKind::Split);
                                m.wait_always(&mut acts, b, e, HbRule::Hb1);
                            } else {
                                wait_for_producer(
                                    &mut m,
                                    &mut acts,
                                    part,
                                    &compute_pos,
                                    k,
                                    prev,
                                    a,
                                    b,
                                    cp.producer,
                                );
                            }
                            dst_copy_sources.insert(a);
                        }
                    }
                    m.enqueue(b);
                    m.bump(b);
                    if cp.kind == SourceKind::UserInput {
                        need_copydone.insert(b);
                        n_user_copies += 1;
                        user_need[b] = m.q[b][b];
                        user_last[b] = n_user_copies;
                        user_event[b] = EventKind::CopyDone;
                    }
                }
            }
            acts.push(Action::Copy {
                copy: ci,
                tensor: cp.tensor,
                slot: c,
                from: a,
                to,
                on,
            });
        }
        if !dst_copy_sources.is_empty() {
            need_copydone.insert(b);
        }
        if async_user {
            // Without the HB5 wait nobody needs the user-input copy-done events, except
            // the source-reuse waits below.
            if dst_copy_sources.is_empty() {
                need_copydone.clear();
            } else {
                need_copydone = [b].into();
            }
        }
        for &q in &need_copydone {
            let e = m.key(q, EventKind::CopyDone);
            m.record(&mut acts, e);
        }
        // E3 (HB2): a device reads what the engines copied into it only after they
        // finished (its own copies and those made earlier for forwards).
        for &q in &engine_copies {
            if engine_dirty.remove(&q) {
                let e = m.key(q, EventKind::CopyDone);
                m.record(&mut acts, e);
            }
        }
        let arrived = std::mem::take(&mut arrivals[b]);
        if !engine_no_arrival {
            for e in arrived {
                m.wait(&mut acts, b, e, HbRule::Hb2);
            }
        }
        for &a in &dst_copy_sources {
            let e = m.key(b, EventKind::CopyDone);
            if !pending[a].contains(&e) {
                pending[a].push(e);
            }
        }
        // HB4/HB6: copies that read this backend's bytes on other queues are done before
        // this backend computes over them.
        let waits = std::mem::take(&mut pending[b]);
        if !no_alloc_wait {
            for e in waits {
                m.wait(&mut acts, b, e, HbRule::Hb6);
            }
        }
        m.enqueue(b);
        acts.push(Action::Compute { split: k });
        m.bump(b);
        compute_pos[k] = m.q[b][b];
        if produced.contains(&k) {
            let e = m.key(b, EventKind::Produced(k as u32));
            m.record(&mut acts, e);
        }
        let e = m.key(b, EventKind::Split);
        m.record(&mut acts, e);
        plan.splits.push(SplitPlan {
            split: k,
            backend: b,
            n_nodes: sp.nodes.len(),
            actions: acts,
        });
    }

    // HB5: the user-input copies completed before compute returns. Wait on the queue
    // that copied last first; its copy-done event usually implies the others (that queue
    // waited on their splits), so one host wait remains.
    if !async_user {
        let mut acts = Vec::new();
        let mut queues: Vec<usize> = (0..nb).filter(|&q| user_need[q].is_some()).collect();
        queues.sort_by_key(|&q| std::cmp::Reverse(user_last[q]));
        for q in queues {
            if m.host[q].is_some() && m.host[q] >= user_need[q] {
                continue;
            }
            let event = m.key(q, user_event[q]);
            if props[q].events {
                acts.push(Action::HostWait {
                    event,
                    why: HbRule::Hb5,
                });
                if let Some(k) = m.ev_known.get(&event) {
                    let k = k.clone();
                    join(&mut m.host, &k);
                }
            } else {
                acts.push(Action::HostSync {
                    backend: q,
                    why: HbRule::Hb5,
                });
                m.host_learn_all(q);
            }
        }
        plan.epilogue = acts;
    }
    pending
}
