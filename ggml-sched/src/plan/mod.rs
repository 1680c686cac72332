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

mod display;
mod minimal;
mod naive;

use minimal::minimal;
use naive::naive;

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
