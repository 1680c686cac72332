//! The planner: a pure function from a [`Partition`], the backends' declared properties
//! and the run settings to a [`Plan`], the ordered actions of one run.
//!
//! # What each action discharges
//!
//! Notation as DESIGN.md: `Q(X)` is backend X's in-order queue, run `r` uses slot
//! `c = r mod N`, `S = slot(x, B, c)`. Events are per (backend, kind, slot):
//! `split[X]@c` is recorded on `Q(X)` after every split of X in a run of slot `c`;
//! `copydone[X]@c` after the copies that run on `Q(X)` and need one; `inputs[I]@c` on the
//! input backend's queue at the start of the run, after the caller's input writes.
//!
//! [`PlanStyle::Minimal`], per split on backend B, for each input x from backend A:
//!
//! | copy queue | action | rule |
//! |---|---|---|
//! | source (`Q(A)`) | `wait Q(A) <- split[B]@c` once per run and pair (A, B) | HB3: the readers of S in run r-N are done before Q(A) overwrites S |
//! | source | `copy on src` | HB1 and HB4 by the order of Q(A); HB2 by the copy's own done-event |
//! | destination (`Q(B)`) | `wait Q(B) <- split[A]@c` (or `inputs[A]@c` for user inputs) unless Q(B) already is ordered after the producer | HB1 |
//! | destination | `copy on dst`, then `record copydone[B]@c` | HB2, HB3 by the order of Q(B) |
//! | destination | `wait Q(A) <- copydone[B]@c` before A's next compute (in this run, or the first of the next run) | HB4, HB6: A's allocator (or A's next run) overwrites x only after the copy read it |
//! | any, user input | `record copydone[Q]@c` after the copies; one `host-wait` per copy queue at the end of the run | HB5 |
//! | - | `compute`, `record split[B]@c` | HB2/HB3 for later copies, HB7 through `get_tensor`, which waits for the producer's queue |
//!
//! The producer wait of HB1 names the split that last wrote x: when A ran later splits
//! before the copy is issued, that split records its own `produced(k)[A]@c` event and the
//! copy waits on it, not on `split[A]@c` (which would also wait for A's later work and
//! serialise devices that should run side by side).
//!
//! # Copy engines
//!
//! With [`PlanSettings::engines`], computed tensors cross devices on the destination's
//! copy engine `E = E(B)`, a queue of its own (a second CUDA stream, a copy thread), so a
//! copy overlaps the compute of both A and B. With ring routing
//! ([`crate::PartitionConfig::ring`]) a tensor of A reaches B hop by hop: each device's
//! engine forwards it from the previous device's receive buffer, so every copy crosses one
//! link between neighbours. The rules, in DESIGN.md's style, and the test-only knob that
//! drops each:
//!
//! | rule | action | knob (breaks) |
//! |---|---|---|
//! | E1 (HB1) the engine reads x only after x's producer ended; a forward reads the previous device's receive buffer only after the copy into it ended | `wait Q(E) <- produced(k)[A]@c` or `split[A]@c`; a forward: `wait Q(E) <- copydone[E(A)]@c` | `engine-early`: a chunk is forwarded before it is ready |
//! | E2 (HB3) the engine overwrites the receive buffer S only after S's readers of run r - N ended: B's splits and the forwards out of S | `wait Q(E) <- split[B]@c` and `wait Q(E) <- copydone[E(B+1)]@c`, once per run, before E's first copy into B | `engine-reuse`: a receive buffer is reused before its reader is done |
//! | E3 (HB2) B reads S only after the engine's copy ended | `copy on E`, `record copydone[E]@c`, `wait Q(B) <- copydone[E]@c` | `engine-no-arrival`: the product reads a chunk that has not arrived |
//! | E4 (HB4/HB6) A overwrites x only after the engine read it | `wait Q(A) <- copydone[E]@c` before A's next compute | `no-alloc-wait` |
//!
//! Receive buffers are the copies' slot tensors: allocated once per graph and pipeline
//! slot, reused every run, their reuse ordered by E2, never by a barrier. E2 is what
//! a barrier around buffer exchange guards (NVIDIA Fuser's ring all-gather removed one and
//! hung): in a graph where every device gathers from every other in each layer, E1's
//! waits already order the engine after the readers of run r - N, so dropping E2 is
//! invisible there; on a pipeline (ggml-sched's `engines` tests) it is a race the checker
//! reports and the numbers show.
//!
//! Waits are deduplicated with a knowledge vector per queue (what each queue is already
//! ordered after, through earlier waits and events), so a backend with events gets one
//! queue wait per split at most in a layer split and no host sync besides HB5.
//!
//! A backend without events turns every wait on its events into `host-sync` of that
//! backend; a queue that cannot wait on the owner's events (`can_wait_on` false, or no
//! events itself) gets `host-wait` on the event instead.
//!
//! # HB6 with per-backend buffers
//!
//! Each backend computes into its own buffer, and only its own queue reuses bytes in it
//! (the interval plan runs over the node order, and a backend's nodes run in that order on
//! its queue). Other queues touch a backend's buffer only (a) by copies into its slot
//! tensors, which are never reused by the allocator (HB3 orders them), (b) by copies out
//! of it that run on another queue (destination-queue copies), which the `copydone` wait
//! before the owner's next compute orders (HB4/HB6), and (c) by the caller through
//! [`crate::Scheduler::set_input`] (enqueued on the owner's queue) and
//! [`crate::Scheduler::get_tensor`] (after the owner's queue drained). So no other wait is
//! needed for allocator reuse across backends.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use ggml_core::CopyQueue;

use crate::partition::{Partition, SourceKind};

/// Maximum number of pipeline slots (`n_copies`), as `GGML_SCHED_MAX_COPIES`.
pub const MAX_COPIES: usize = 4;

/// Which plan to build.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlanStyle {
    /// The fewest waits and host syncs that satisfy HB1-HB7.
    #[default]
    Minimal,
    /// ggml's `ggml_backend_sched_compute_splits` as it is (for comparison): events only
    /// when `n_copies > 1`, a wait on the split's *own* event before async copies, a host
    /// wait and blocking copy per user input, a host wait before input-less splits.
    Naive,
}

impl PlanStyle {
    /// The style named `name`: `minimal` or `naive`.
    pub fn from_name(name: &str) -> Option<PlanStyle> {
        match name {
            "minimal" => Some(PlanStyle::Minimal),
            "naive" => Some(PlanStyle::Naive),
            _ => None,
        }
    }
}

/// Test-only knobs that each drop one happens-before guarantee from the minimal plan, so
/// that tests and the harness (`--weaken`) can show the checker catches the race.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WeakenKnob {
    /// Destination-queue copies wait on the split's own event instead of the producer's
    /// (the llama.cpp bug; breaks HB1).
    OwnEvent,
    /// Drop the slot-release wait before source-queue copies (breaks HB3).
    NoSlotWait,
    /// User-input copies stay async without the final host wait (breaks HB5).
    AsyncUserInput,
    /// Skip the copy-done wait before the source backend reuses the copied bytes
    /// (breaks HB6, and HB4 across runs).
    NoAllocWait,
    /// Copy engines start a copy without waiting for its source's producer: a chunk is
    /// forwarded before it is ready (breaks HB1).
    EngineEarly,
    /// Copy engines overwrite a receive buffer without waiting for its readers of run
    /// r - N (breaks HB3).
    EngineReuse,
    /// The destination computes without waiting for the engine's copy-done event: it
    /// reads a chunk before it arrived (breaks HB2).
    EngineNoArrival,
}

impl WeakenKnob {
    /// All knobs.
    pub const ALL: [WeakenKnob; 7] = [
        WeakenKnob::OwnEvent,
        WeakenKnob::NoSlotWait,
        WeakenKnob::AsyncUserInput,
        WeakenKnob::NoAllocWait,
        WeakenKnob::EngineEarly,
        WeakenKnob::EngineReuse,
        WeakenKnob::EngineNoArrival,
    ];

    /// The knobs that only change plans with copy engines.
    pub const ENGINE: [WeakenKnob; 3] = [
        WeakenKnob::EngineEarly,
        WeakenKnob::EngineReuse,
        WeakenKnob::EngineNoArrival,
    ];

    /// The knob's command-line name (`own-event`, `no-slot-wait`, ...).
    pub fn name(self) -> &'static str {
        match self {
            WeakenKnob::OwnEvent => "own-event",
            WeakenKnob::NoSlotWait => "no-slot-wait",
            WeakenKnob::AsyncUserInput => "async-user-input",
            WeakenKnob::NoAllocWait => "no-alloc-wait",
            WeakenKnob::EngineEarly => "engine-early",
            WeakenKnob::EngineReuse => "engine-reuse",
            WeakenKnob::EngineNoArrival => "engine-no-arrival",
        }
    }

    /// The knob named `name` (as [`WeakenKnob::name`]).
    pub fn from_name(name: &str) -> Option<WeakenKnob> {
        WeakenKnob::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The rule the knob breaks.
    pub fn rule(self) -> HbRule {
        match self {
            WeakenKnob::OwnEvent => HbRule::Hb1,
            WeakenKnob::NoSlotWait => HbRule::Hb3,
            WeakenKnob::AsyncUserInput => HbRule::Hb5,
            WeakenKnob::NoAllocWait => HbRule::Hb6,
            WeakenKnob::EngineEarly => HbRule::Hb1,
            WeakenKnob::EngineReuse => HbRule::Hb3,
            WeakenKnob::EngineNoArrival => HbRule::Hb2,
        }
    }
}

/// A happens-before rule of DESIGN.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HbRule {
    /// Producer of x ends before the copy of x starts.
    Hb1,
    /// The copy ends before the first reader of the slot starts.
    Hb2,
    /// Readers of a slot in run r-N end before the copy into it in run r.
    Hb3,
    /// The copy reading x ends before anything overwrites x's bytes.
    Hb4,
    /// User-input copies complete before `compute` returns; the caller's next write
    /// comes after every queued read.
    Hb5,
    /// Allocator reuse across backends waits for earlier users of the bytes.
    Hb6,
    /// Host reads of outputs come after the producing split completed.
    Hb7,
}

impl fmt::Display for HbRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = *self as u8 + 1;
        write!(f, "HB{n}")
    }
}

/// Kinds of events the plan uses (one event per backend, kind and slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// Recorded after each split of the backend (producer event and slot release).
    Split,
    /// Recorded after copies that ran on the backend's queue.
    CopyDone,
    /// Recorded on the input backend at the start of a run, after the caller's writes.
    Inputs,
    /// Recorded on a queue right after a split's user-input copies when copies of
    /// computed tensors follow them there: the HB5 host wait waits for the inputs only.
    InputsCopied,
    /// Recorded after split `n` only, when a copy of its output is issued after the
    /// backend's next split: the copy waits for its producer and not for later work.
    Produced(u32),
}

/// An event of the plan: owned and recorded by `backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventKey {
    /// Backend owning (and recording) the event.
    pub backend: usize,
    /// What the event marks.
    pub kind: EventKind,
    /// Pipeline slot.
    pub slot: usize,
}

/// The queue a copy runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyOn {
    /// Asynchronous on the source backend's queue.
    Src,
    /// Asynchronous on the destination backend's queue.
    Dst,
    /// Blocking through the host (reads the source after its queue drained, writes the
    /// destination's buffer directly).
    Host,
    /// Asynchronous on a copy engine (the destination's, [`PlanSettings::engines`]): a
    /// queue of its own, so the copy overlaps both devices' compute.
    Engine(usize),
}

/// One step of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `Q(queue)` waits, without blocking the host, for the event's last recorded point.
    Wait {
        /// Backend whose queue waits.
        queue: usize,
        /// The event.
        event: EventKey,
        /// The rule this wait discharges.
        why: HbRule,
    },
    /// The host blocks until the event's last recorded point completed.
    HostWait {
        /// The event.
        event: EventKey,
        /// The rule this wait discharges.
        why: HbRule,
    },
    /// The host blocks until everything queued on `backend` finished.
    HostSync {
        /// The backend.
        backend: usize,
        /// The rule this sync discharges.
        why: HbRule,
    },
    /// Copies [`Partition::copies`]`[copy]` into its slot tensor.
    Copy {
        /// Index into [`Partition::copies`].
        copy: usize,
        /// Source tensor (caller id).
        tensor: ggml_core::TensorId,
        /// Slot written.
        slot: usize,
        /// Source backend.
        from: usize,
        /// Destination backend.
        to: usize,
        /// Queue the copy runs on.
        on: CopyOn,
    },
    /// Enqueues the split's nodes on its backend.
    Compute {
        /// Index of the split.
        split: usize,
    },
    /// Records the event on its owner's queue.
    Record {
        /// The event.
        event: EventKey,
    },
}

impl Action {
    /// Letter of the action in [`Plan::pattern`]: `w` queue wait, `s` host wait or sync,
    /// `a` async copy, `c` blocking copy, `g` graph compute; records have none.
    pub fn letter(&self) -> Option<char> {
        match self {
            Action::Wait { .. } => Some('w'),
            Action::HostWait { .. } | Action::HostSync { .. } => Some('s'),
            Action::Copy {
                on: CopyOn::Host, ..
            } => Some('c'),
            Action::Copy { .. } => Some('a'),
            Action::Compute { .. } => Some('g'),
            Action::Record { .. } => None,
        }
    }

    /// Whether the action blocks the host (host waits, host syncs, blocking copies).
    pub fn blocks_host(&self) -> bool {
        matches!(
            self,
            Action::HostWait { .. }
                | Action::HostSync { .. }
                | Action::Copy {
                    on: CopyOn::Host,
                    ..
                }
        )
    }
}

/// What the planner needs to know about one backend (declared, never probed by running).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendProps {
    /// Name for listings.
    pub name: String,
    /// Whether the backend has events.
    pub events: bool,
    /// The queue its `cpy_tensor_async` runs on (it is called on the destination).
    pub copy_queue: CopyQueue,
    /// `can_wait_on[y]`: whether this backend's queue can wait on backend y's events.
    pub can_wait_on: Vec<bool>,
}

impl BackendProps {
    /// Properties read from `backends` (caps and `can_wait_on` pairs).
    pub fn of(backends: &[&dyn ggml_core::Backend]) -> Vec<BackendProps> {
        backends
            .iter()
            .map(|b| {
                let caps = b.caps();
                BackendProps {
                    name: b.name().as_str().to_string(),
                    events: caps.events,
                    copy_queue: caps.copy_queue,
                    can_wait_on: backends.iter().map(|o| b.can_wait_on(*o)).collect(),
                }
            })
            .collect()
    }
}

/// Settings of one plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanSettings {
    /// Number of pipeline slots (1..=[`MAX_COPIES`]).
    pub n_copies: usize,
    /// Slot of the run planned (`run mod n_copies`).
    pub slot: usize,
    /// Minimal or ggml-like.
    pub style: PlanStyle,
    /// Weakened rules (tests only).
    #[doc(hidden)]
    pub weaken: BTreeSet<WeakenKnob>,
    /// `engines[b]`: the copy engine (a backend index with a queue of its own) that runs
    /// the copies of computed tensors into backend `b`; empty or `None` where copies run
    /// on the devices' queues.
    pub engines: Vec<Option<usize>>,
}

/// The actions of one split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    /// Index of the split.
    pub split: usize,
    /// Its backend.
    pub backend: usize,
    /// Number of nodes it computes.
    pub n_nodes: usize,
    /// Actions in order.
    pub actions: Vec<Action>,
}

/// The ordered actions of one run: a prologue, the splits, an epilogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Style it was built with.
    pub style: PlanStyle,
    /// Pipeline slots.
    pub n_copies: usize,
    /// Slot of the run.
    pub slot: usize,
    /// Actions before the first split.
    pub prologue: Vec<Action>,
    /// Per split.
    pub splits: Vec<SplitPlan>,
    /// Actions after the last split, before `compute` returns.
    pub epilogue: Vec<Action>,
    /// Weakened rules it was built with.
    pub weaken: BTreeSet<WeakenKnob>,
    backend_names: Vec<String>,
    backend_notes: Vec<String>,
    copy_names: Vec<(String, String)>,
}

impl Plan {
    /// Every action in execution order.
    pub fn actions(&self) -> impl Iterator<Item = &Action> {
        self.prologue
            .iter()
            .chain(self.splits.iter().flat_map(|s| s.actions.iter()))
            .chain(self.epilogue.iter())
    }

    /// Host syncs of the run: host waits, host syncs and blocking copies.
    pub fn host_syncs(&self) -> usize {
        self.actions().filter(|a| a.blocks_host()).count()
    }

    /// Queue waits of the run.
    pub fn queue_waits(&self) -> usize {
        self.actions()
            .filter(|a| matches!(a, Action::Wait { .. }))
            .count()
    }

    /// Events the plan records or waits on.
    pub fn events(&self) -> BTreeSet<EventKey> {
        self.actions()
            .filter_map(|a| match a {
                Action::Wait { event, .. }
                | Action::HostWait { event, .. }
                | Action::Record { event } => Some(*event),
                _ => None,
            })
            .collect()
    }

    /// The compact pattern: one group per split, then the epilogue, joined by `|`
    /// (letters as [`Action::letter`]; a non-empty prologue of waits comes first).
    pub fn pattern(&self) -> String {
        let letters = |acts: &[Action]| acts.iter().filter_map(Action::letter).collect::<String>();
        let mut parts = Vec::new();
        let pro = letters(&self.prologue);
        if !pro.is_empty() {
            parts.push(pro);
        }
        parts.extend(self.splits.iter().map(|s| letters(&s.actions)));
        let epi = letters(&self.epilogue);
        if !epi.is_empty() {
            parts.push(epi);
        }
        parts.join("|")
    }

    fn ev(&self, e: &EventKey) -> String {
        let kind = match e.kind {
            EventKind::Split => "split",
            EventKind::CopyDone => "copydone",
            EventKind::Inputs => "inputs",
            EventKind::InputsCopied => "inputs-copied",
            EventKind::Produced(k) => {
                return format!("split{k}[{}]@{}", self.bname(e.backend), e.slot)
            }
        };
        format!("{kind}[{}]@{}", self.bname(e.backend), e.slot)
    }

    fn bname(&self, b: usize) -> &str {
        self.backend_names.get(b).map_or("?", |s| s.as_str())
    }

    fn fmt_action(&self, f: &mut fmt::Formatter<'_>, a: &Action) -> fmt::Result {
        match a {
            Action::Wait { queue, event, why } => {
                let s = format!("{} <- {}", self.bname(*queue), self.ev(event));
                writeln!(f, "    wait       {s:<40} {why}")
            }
            Action::HostWait { event, why } => {
                writeln!(f, "    host-wait  {:<40} {why}", self.ev(event))
            }
            Action::HostSync { backend, why } => {
                writeln!(f, "    host-sync  {:<40} {why}", self.bname(*backend))
            }
            Action::Copy {
                copy,
                slot,
                from,
                to,
                on,
                ..
            } => {
                let (src, dst) = self
                    .copy_names
                    .get(*copy)
                    .map_or(("?", "?".to_string()), |(s, d)| {
                        (s.as_str(), d.replace("{c}", &slot.to_string()))
                    });
                let on = match on {
                    CopyOn::Src => "on src",
                    CopyOn::Dst => "on dst",
                    CopyOn::Host => "blocking",
                    CopyOn::Engine(e) => &format!("on {}", self.bname(*e)),
                };
                let s = format!("{src} -> {dst}");
                writeln!(
                    f,
                    "    copy       {s:<40} {} -> {} {on}",
                    self.bname(*from),
                    self.bname(*to)
                )
            }
            Action::Compute { split } => {
                let n = self
                    .splits
                    .iter()
                    .find(|s| s.split == *split)
                    .map_or(0, |s| s.n_nodes);
                writeln!(f, "    compute    split {split} ({n} nodes)")
            }
            Action::Record { event } => writeln!(f, "    record     {}", self.ev(event)),
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let style = match self.style {
            PlanStyle::Minimal => "minimal",
            PlanStyle::Naive => "naive (ggml)",
        };
        write!(
            f,
            "plan {style}, n_copies {}, slot {}: {} splits, {} host syncs, {} queue waits",
            self.n_copies,
            self.slot,
            self.splits.len(),
            self.host_syncs(),
            self.queue_waits()
        )?;
        if !self.weaken.is_empty() {
            let w: Vec<_> = self.weaken.iter().map(|k| k.name()).collect();
            write!(f, ", WEAKENED: {}", w.join(","))?;
        }
        writeln!(f)?;
        for (i, (n, note)) in self
            .backend_names
            .iter()
            .zip(&self.backend_notes)
            .enumerate()
        {
            writeln!(f, "  backend {i}: {n} ({note})")?;
        }
        if !self.prologue.is_empty() {
            writeln!(f, "  prologue")?;
            for a in &self.prologue {
                self.fmt_action(f, a)?;
            }
        }
        for s in &self.splits {
            let pat: String = s.actions.iter().filter_map(Action::letter).collect();
            writeln!(
                f,
                "  split {} on {} ({} nodes) [{pat}]",
                s.split,
                self.bname(s.backend),
                s.n_nodes
            )?;
            for a in &s.actions {
                self.fmt_action(f, a)?;
            }
        }
        if !self.epilogue.is_empty() {
            writeln!(f, "  epilogue")?;
            for a in &self.epilogue {
                self.fmt_action(f, a)?;
            }
        }
        writeln!(f, "  pattern: {}", self.pattern())
    }
}

/// Builds the plan of one run (slot `settings.slot`) of `part` on backends with
/// properties `props`. Pure: the same inputs always give the same plan.
///
/// # Panics
///
/// Never for a partition built by [`crate::partition::partition`] over `props.len()`
/// backends; a hand-made partition naming a backend index out of range panics.
pub fn build_plan(part: &Partition, props: &[BackendProps], settings: &PlanSettings) -> Plan {
    let n_copies = settings.n_copies.clamp(1, MAX_COPIES);
    let slot = settings.slot % n_copies;
    let mut plan = Plan {
        style: settings.style,
        n_copies,
        slot,
        prologue: Vec::new(),
        splits: Vec::new(),
        epilogue: Vec::new(),
        weaken: settings.weaken.clone(),
        backend_names: props.iter().map(|p| p.name.clone()).collect(),
        backend_notes: props
            .iter()
            .map(|p| {
                let q = match p.copy_queue {
                    CopyQueue::Source => "copies on src queue",
                    CopyQueue::Destination => "copies on dst queue",
                };
                let e = if p.events { "events" } else { "no events" };
                format!("{q}, {e}")
            })
            .collect(),
        copy_names: part
            .copies
            .iter()
            .map(|c| {
                let to = props.get(c.to).map_or("?", |p| p.name.as_str());
                (c.name.clone(), format!("{to}#{}#{{c}}", c.name))
            })
            .collect(),
    };
    match settings.style {
        PlanStyle::Naive => naive(part, props, n_copies, slot, &mut plan),
        PlanStyle::Minimal => {
            let prev = (slot + n_copies - 1) % n_copies;
            // The previous run has the same structure: its leftover copy-done waits are
            // this run's carry-in.
            let mut dry = plan.clone();
            let carry = minimal(part, props, settings, n_copies, prev, Vec::new(), &mut dry);
            minimal(part, props, settings, n_copies, slot, carry, &mut plan);
        }
    }
    plan
}

/// The queue a copy of `cp` into backend `to` runs on in the minimal plan: the
/// destination's copy engine for computed tensors, if it has one; else as the backend
/// declares.
fn copy_on_with(
    props: &[BackendProps],
    engines: &[Option<usize>],
    cp: &crate::partition::CopyInput,
    to: usize,
) -> CopyOn {
    match engines.get(to).copied().flatten() {
        Some(e) if cp.kind == SourceKind::Computed => CopyOn::Engine(e),
        _ => copy_on(props, to),
    }
}

fn copy_on(props: &[BackendProps], to: usize) -> CopyOn {
    match props[to].copy_queue {
        CopyQueue::Source => CopyOn::Src,
        CopyQueue::Destination => CopyOn::Dst,
    }
}

fn naive(part: &Partition, props: &[BackendProps], n_copies: usize, c: usize, plan: &mut Plan) {
    // ggml creates events only with n_copies > 1.
    let ev = |b: usize| props[b].events && n_copies > 1;
    let split_ev = |b: usize| EventKey {
        backend: b,
        kind: EventKind::Split,
        slot: c,
    };
    let host_wait_or_sync = |b: usize, why: HbRule| {
        if ev(b) {
            Action::HostWait {
                event: split_ev(b),
                why,
            }
        } else {
            Action::HostSync { backend: b, why }
        }
    };
    for (k, sp) in part.splits.iter().enumerate() {
        let b = sp.backend;
        let mut acts = Vec::new();
        if sp.inputs.is_empty() && k > 0 && part.splits[k - 1].backend != b {
            acts.push(host_wait_or_sync(part.splits[k - 1].backend, HbRule::Hb6));
        }
        for &ci in &sp.inputs {
            let cp = &part.copies[ci];
            if cp.kind == SourceKind::UserInput {
                acts.push(host_wait_or_sync(b, HbRule::Hb3));
                acts.push(Action::Copy {
                    copy: ci,
                    tensor: cp.tensor,
                    slot: c,
                    from: cp.from,
                    to: b,
                    on: CopyOn::Host,
                });
            } else {
                if ev(b) && props[b].can_wait_on[b] {
                    acts.push(Action::Wait {
                        queue: b,
                        event: split_ev(b),
                        why: HbRule::Hb3,
                    });
                } else {
                    acts.push(host_wait_or_sync(b, HbRule::Hb3));
                }
                acts.push(Action::Copy {
                    copy: ci,
                    tensor: cp.tensor,
                    slot: c,
                    from: cp.from,
                    to: b,
                    on: copy_on(props, b),
                });
            }
        }
        acts.push(Action::Compute { split: k });
        if ev(b) {
            acts.push(Action::Record { event: split_ev(b) });
        }
        plan.splits.push(SplitPlan {
            split: k,
            backend: b,
            n_nodes: sp.nodes.len(),
            actions: acts,
        });
    }
}

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
fn minimal(
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
