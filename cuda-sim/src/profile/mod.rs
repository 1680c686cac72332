//! Per-launch counters: what a kernel launch executed, counted exactly while the
//! interpreter runs it (off by default: [`crate::exec::launch`] counts nothing;
//! [`crate::exec::launch_profiled`] counts).
//!
//! - Warp instructions by [`InstrClass`] (every decoded operation has one), and thread
//!   instructions (active lanes), whose ratio is the lane utilisation.
//! - Global memory: per warp request, the distinct 32-byte sectors and 128-byte lines
//!   its active lanes touch (coalescing), reads and writes apart; and the launch's
//!   distinct sectors, which an [`L2Model`] turns into DRAM traffic
//!   ([`LaunchCounters::apply_l2`]).
//! - Shared memory: wavefronts per request by the bank rule of [`shared_wavefronts`]
//!   (`ldmatrix`: one phase of eight 16-byte rows per matrix; `cp.async`: a global
//!   load of its source and a shared store of its destination).
//! - Tensor-core multiply-adds (`mma`: m * n * k per warp instruction), int8 apart.
//! - Barriers (`bar.sync` executions per warp) and atomics.
//! - The dependent-latency critical path of the slowest warp: an in-order scoreboard per
//!   warp (an instruction issues one cycle after the previous one or when its source
//!   registers are ready, whichever is later; its results are ready a class latency
//!   later; `bar.sync` releases every warp of the block at the latest arrival). The path
//!   is reported as the hops along it ([`PathCounts`]), so a cost model can price it
//!   with its own latencies; the [`Latencies`] given to the profiler only choose which
//!   path is the longest.
//!
//! Local-memory accesses are counted as instructions only (the hardware interleaves
//! threads' local words, so they coalesce; cuda-sim does not model that layout).
//! Global loads are assumed to miss L1 (the L2 traffic term is an upper bound).
//!
//! Counters are sums over blocks (or maxima, for the critical path), so they do not
//! depend on how many host threads ran the blocks.

mod access;
mod class;
pub(crate) mod collect;
mod l2;

pub use access::{
    lanes_per_phase, sectors_and_lines, shared_wavefronts, BANKS, BANK_WORD_BYTES, LINE_BYTES,
    SECTOR_BYTES,
};
pub use class::{ClassCounts, InstrClass, MemSpace, ACCESS_WIDTHS};
pub use l2::{DramTraffic, L2Model, READ, WRITE};

/// Latencies in cycles the profiler's scoreboard uses to find the longest dependent
/// path (an instruction's issue takes one cycle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latencies {
    /// Arithmetic, logic, moves, conversions, parameter loads.
    pub alu: u64,
    /// Special-function unit and the expanded (`div`, `sqrt.rn`) operations.
    pub special: u64,
    /// Shared-memory loads and shuffles.
    pub shared: u64,
    /// Global and local loads, atomics.
    pub global: u64,
}

impl Default for Latencies {
    /// Hopper-like latencies (see `cost::GpuSpec::latencies` for the sources).
    fn default() -> Self {
        Latencies {
            alu: 4,
            special: 20,
            shared: 30,
            global: 600,
        }
    }
}

/// The hops along a dependent path: issue slots and results waited for, by latency kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathCounts {
    /// Cycles spent issuing (one per instruction issued back to back).
    pub issue: u64,
    /// ALU results waited for.
    pub alu: u64,
    /// Special-function results waited for.
    pub special: u64,
    /// Shared-memory or shuffle results waited for.
    pub shared: u64,
    /// Global-memory results waited for.
    pub global: u64,
}

impl PathCounts {
    /// The path's length in cycles with latencies `lat`.
    pub fn cycles(&self, lat: &Latencies) -> u64 {
        self.issue
            + self.alu * lat.alu
            + self.special * lat.special
            + self.shared * lat.shared
            + self.global * lat.global
    }
}

/// How to profile a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ProfileOptions {
    /// Latencies that pick the critical path.
    pub latencies: Latencies,
    /// Interpret only an evenly spaced subset of at most this many blocks and scale the
    /// per-block sums by blocks / interpreted blocks. The skipped blocks write nothing,
    /// so the launch's results are wrong: use it for counting only.
    pub sample_blocks: Option<u64>,
    /// Keep where the critical warp's time went, by PTX source line
    /// ([`LaunchCounters::critical_stalls`]). Costs a map update per instruction.
    pub stall_lines: bool,
}

/// Per warp request traffic of global loads or stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalTraffic {
    /// Warp instructions with at least one active lane.
    pub requests: u64,
    /// Distinct 32-byte sectors per request, summed.
    pub sectors: u64,
    /// Distinct 128-byte lines per request, summed.
    pub lines: u64,
}

/// Shared-memory loads or stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedTraffic {
    /// Warp instructions with at least one active lane.
    pub requests: u64,
    /// Wavefronts (bank-conflict passes), summed.
    pub wavefronts: u64,
}

/// Everything counted for one launch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchCounters {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block.
    pub dynamic_shared: u32,
    /// Static shared memory per block as the PTX declares it.
    pub static_shared: u32,
    /// Blocks of the grid.
    pub blocks: u64,
    /// Blocks interpreted (fewer than `blocks` when sampling; the sums below are then
    /// scaled by `blocks / blocks_interpreted`).
    pub blocks_interpreted: u64,
    /// Warp instructions issued (guarded-off ones included).
    pub warp_instructions: u64,
    /// Thread instructions (active lanes), summed.
    pub thread_instructions: u64,
    /// Warp instructions by class.
    pub classes: ClassCounts,
    /// Global loads.
    pub global_load: GlobalTraffic,
    /// Global stores.
    pub global_store: GlobalTraffic,
    /// Shared-memory loads.
    pub shared_load: SharedTraffic,
    /// Shared-memory stores.
    pub shared_store: SharedTraffic,
    /// `bar.sync` executions, per warp.
    pub barriers: u64,
    /// Atomic warp requests.
    pub atomics: u64,
    /// Tensor-core multiply-adds: m * n * k per executed warp `mma`.
    pub tensor_macs: u64,
    /// The part of `tensor_macs` done by integer (`.s8`/`.u8`) `mma`, which tensor
    /// cores run at twice the f16 rate.
    pub tensor_macs_int8: u64,
    /// Sectors that reach L2: each block's distinct sectors read once (its L1 keeps what
    /// it read for the block's lifetime, an idealised L1 of a block's footprint) plus
    /// every sector of every store (L1 is write-through).
    pub l2_sectors: u64,
    /// Distinct sectors the launch read (its read footprint, before any cache).
    pub unique_read_sectors: u64,
    /// Distinct sectors the launch wrote.
    pub unique_write_sectors: u64,
    /// DRAM traffic, once [`apply_l2`](LaunchCounters::apply_l2) ran (scaled like the
    /// sums when sampling).
    pub dram: Option<DramTraffic>,
    /// The longest dependent path of a warp, over all blocks.
    pub critical_path: PathCounts,
    /// Its length in cycles at the profiling latencies.
    pub critical_path_cycles: u64,
    /// For a kernel that runs `griddepcontrol.wait`: the longest path from the wait's
    /// release to the end of a warp. `critical_path` is then the latest arrival at the
    /// wait plus this (the kernel's path when the wait returns at once); a launch with
    /// programmatic stream serialisation can run the part before the wait while the grid
    /// before it finishes. `None` for a kernel without the wait.
    pub post_wait_path: Option<PathCounts>,
    /// With [`ProfileOptions::stall_lines`]: the cycles of the critical path at each PTX
    /// source line (1-based, of the module's text), sorted by line: one issue cycle per
    /// instruction plus its wait for its operands, along the warp that ends the path and,
    /// before each `bar.sync` it passed, along the warp that arrived there last (whose
    /// lines every released warp takes over). They sum to `critical_path_cycles`. Empty
    /// otherwise. Not scaled when sampling.
    pub critical_stalls: Vec<(u32, u64)>,
    /// The distinct sectors and their READ/WRITE flags, sorted, until `apply_l2`.
    pub(crate) touched: Vec<(u64, u8)>,
}

impl LaunchCounters {
    /// Threads per block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&b| b as u64).product()
    }

    /// Active lanes per issued warp instruction, 0 to 1.
    pub fn lane_utilisation(&self) -> f64 {
        if self.warp_instructions == 0 {
            0.0
        } else {
            self.thread_instructions as f64 / (32.0 * self.warp_instructions as f64)
        }
    }

    /// Whether the counts come from a subset of the blocks.
    pub fn sampled(&self) -> bool {
        self.blocks_interpreted < self.blocks
    }

    /// Runs the launch's distinct sectors through `l2` (in address order) and sets
    /// [`dram`](LaunchCounters::dram). A second call changes nothing and returns the
    /// first result.
    pub fn apply_l2(&mut self, l2: &mut L2Model) -> DramTraffic {
        if let Some(d) = self.dram {
            return d;
        }
        let t = l2.apply(&self.touched);
        let d = DramTraffic {
            read_sectors: self.scale(t.read_sectors),
            write_sectors: self.scale(t.write_sectors),
        };
        self.touched = Vec::new();
        self.dram = Some(d);
        d
    }

    /// A per-block sum scaled to the whole grid.
    pub(crate) fn scale(&self, v: u64) -> u64 {
        if self.blocks_interpreted == 0 || self.blocks_interpreted == self.blocks {
            v
        } else {
            ((v as u128 * self.blocks as u128 + self.blocks_interpreted as u128 / 2)
                / self.blocks_interpreted as u128) as u64
        }
    }

    /// One line per non-zero counter, `name value`, for reports.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "grid {:?} block {:?} shared {}+{} B, blocks {} ({} interpreted)",
            self.grid,
            self.block,
            self.static_shared,
            self.dynamic_shared,
            self.blocks,
            self.blocks_interpreted
        );
        let _ = writeln!(
            s,
            "warp instructions {} (lane utilisation {:.3})",
            self.warp_instructions,
            self.lane_utilisation()
        );
        for (c, n) in self.classes.nonzero() {
            let _ = writeln!(s, "  {} {n}", c.name());
        }
        for (name, g) in [("load", self.global_load), ("store", self.global_store)] {
            let _ = writeln!(
                s,
                "global {name}: {} requests, {} sectors, {} lines",
                g.requests, g.sectors, g.lines
            );
        }
        for (name, g) in [("load", self.shared_load), ("store", self.shared_store)] {
            let _ = writeln!(
                s,
                "shared {name}: {} requests, {} wavefronts",
                g.requests, g.wavefronts
            );
        }
        if let Some(d) = self.dram {
            let _ = writeln!(
                s,
                "dram: {} sectors read, {} written",
                d.read_sectors, d.write_sectors
            );
        }
        if self.tensor_macs != 0 {
            let _ = writeln!(
                s,
                "tensor core: {} multiply-adds ({} of them int8)",
                self.tensor_macs, self.tensor_macs_int8
            );
        }
        let _ = writeln!(
            s,
            "barriers {}, atomics {}, critical path {} cycles {:?}",
            self.barriers, self.atomics, self.critical_path_cycles, self.critical_path
        );
        s
    }
}
