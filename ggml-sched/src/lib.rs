#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
// ggml-core's errors carry names inline (it has no allocator), so results are large.
#![allow(clippy::result_large_err)]

//! # Layout of the crate
//!
//! - [`partition`](mod@partition): backend assignment in ggml's order, splits, cross-backend
//!   copies with one destination per pipeline slot, and the source remap;
//! - [`plan`](mod@plan): the pure planner from a partition and the backends' declared
//!   properties to per-split actions, with a readable listing;
//! - [`Scheduler`]: allocation of one compute buffer per backend (with reuse), the
//!   executor of the plan, pipelined runs, inputs, outputs and statistics;
//! - [`check`]: [`CheckedBackend`] and [`RaceLog`], the vector-clock happens-before
//!   checker;
//! - [`split_layers`]: llama.cpp's `--tensor-split` proportions;
//! - [`reduce`]: where tensor parallelism's all-reduces go (a graph pass);
//! - [`trace`](mod@trace): timelines of runs (every queue action and host sync, timed);
//! - `testing` (feature `testing`): a threaded test backend and a recording-only one.

mod alloc;
pub mod check;
mod error;
pub mod fault;
mod layers;
pub mod partition;
pub mod plan;
pub mod reduce;
mod sched;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace;

pub use check::{AccessContext, CheckedBackend, RaceLog, RaceReport};
pub use error::{Result, SchedError};
pub use fault::{FaultKind, FaultPlan, FaultyBackend, Trigger};
pub use layers::split_layers;
pub use partition::{partition, CopyInput, Partition, PartitionConfig, SourceKind, Split};
#[doc(hidden)]
pub use plan::WeakenKnob;
pub use plan::{
    build_plan, Action, BackendProps, CopyOn, EventKey, EventKind, HbRule, Plan, PlanSettings,
    PlanStyle, SplitPlan, MAX_COPIES,
};
pub use sched::{RunStats, SchedOptions, Scheduler, StagedOutput, Stats, STUCK_GRACE};
pub use trace::{SliceKind, Trace, TraceSlice, TraceTrack};
