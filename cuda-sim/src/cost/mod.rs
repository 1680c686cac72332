//! A cost model: a kernel's time on a named GPU from its [`LaunchCounters`].
//!
//! ```text
//! time = max(throughput × ..., (waves − 1) × path) + path + launch,   never below the floors
//! throughput = max(DRAM bytes / (bandwidth × dram_efficiency),
//!                  L2 sectors × 32 / (l2_bytes_per_clk × clock),   (what each block's
//!                  L1 misses: LaunchCounters::l2_sectors)
//!                  q × shared wavefronts / (wavefronts per cycle × SMs × clock),
//!                  q × warp instructions / (schedulers × SMs × clock),
//!                  q × each class's warp instructions × 32 / (its rate × SMs × clock),
//!                  q × tensor multiply-adds / (rate × SMs × clock))
//! ```
//!
//! - `q`, the wave quantisation of the SM-local terms, is the busiest SM's share of the
//!   blocks over the average: `ceil(blocks / SMs) × SMs / blocks` (1 for a grid that
//!   fills every SM evenly; `SMs / blocks` for fewer blocks than SMs). The device-wide
//!   DRAM and L2 terms are not quantised.
//! - `path`, the dependent-latency term, is the profiler's critical path of a warp
//!   priced with the GPU's latencies: the last wave's latency is never hidden, and a
//!   grid of latency-bound blocks takes a path per wave ([`Occupancy::waves`]).
//! - `launch` is the cost of a launch on a stream or of a graph node ([`LaunchKind`]).
//! - The floors, from datasheet peaks only: DRAM bytes / peak bandwidth, tensor work /
//!   peak tensor rate, f32 arithmetic / peak f32 rate.
//!
//! The result names the term that bound it ([`Term`]). DRAM bytes come from the L2
//! model ([`LaunchCounters::apply_l2`]); a launch without them is priced with its whole
//! footprint as DRAM traffic (a cold L2).

mod fit;
mod guard;
mod occupancy;
mod resources;
mod spec;

pub use fit::{evaluate, fit, FitLaunch, FitReport, FitRow, RowError};
pub use guard::{check_drift, Calibration, FamilyError, Observation, Verdict};
pub use occupancy::{occupancy, KernelResources, Limit, Occupancy};
pub use resources::{ResourceTable, HEADER as RESOURCE_TABLE_HEADER};
pub use spec::{h100_sxm, h200, sm90_issue_rates, Arch, GpuSpec, Tunable, Tunables};

use crate::profile::{InstrClass, LaunchCounters, SECTOR_BYTES};

/// An error of the cost model: an unpriced instruction class, a block that does not fit
/// an SM, a malformed table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CostError(String);

impl CostError {
    pub(crate) fn new(msg: impl Into<String>) -> CostError {
        CostError(msg.into())
    }
}

impl std::fmt::Display for CostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CostError {}

/// How a kernel was launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LaunchKind {
    /// `cuLaunchKernel` on a stream.
    Stream,
    /// A kernel node of a CUDA graph launch.
    GraphNode,
}

/// A term of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Term {
    /// DRAM bandwidth.
    Dram,
    /// L2 bandwidth.
    L2,
    /// Shared-memory wavefronts.
    Shared,
    /// Warp-instruction issue (all classes together).
    Issue,
    /// One instruction class's pipe.
    Class(InstrClass),
    /// Tensor-core multiply-adds.
    TensorCore,
    /// The dependent-latency critical path.
    Latency,
    /// Launch cost.
    Launch,
}

impl Term {
    /// A short name (`dram`, `class:f32_fma`, ...).
    pub fn name(&self) -> String {
        match self {
            Term::Dram => "dram".into(),
            Term::L2 => "l2".into(),
            Term::Shared => "shared".into(),
            Term::Issue => "issue".into(),
            Term::Class(c) => format!("class:{}", c.name()),
            Term::TensorCore => "tensor_core".into(),
            Term::Latency => "latency".into(),
            Term::Launch => "launch".into(),
        }
    }
}

/// A modelled kernel time and how it was reached.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Modelled seconds, launch included.
    pub time_s: f64,
    /// The term that bound it: the largest throughput term, or [`Term::Latency`] when
    /// the critical path outweighs throughput, or [`Term::Launch`] when the launch cost
    /// outweighs the kernel.
    pub bound: Term,
    /// Every throughput term in seconds, wave quantisation applied, largest first.
    pub terms: Vec<(Term, f64)>,
    /// The largest throughput term.
    pub throughput_s: f64,
    /// One critical path, seconds.
    pub path_s: f64,
    /// For a kernel with `griddepcontrol.wait`: the part of `path_s` after the wait's
    /// release (see [`LaunchCounters::post_wait_path`]). With programmatic stream
    /// serialisation the launch and the rest of the path can overlap the grid before.
    pub post_wait_s: Option<f64>,
    /// The launch cost, seconds.
    pub launch_s: f64,
    /// The part of [`Prediction::launch_s`] a programmatic launch can spend while the
    /// grid before still runs ([`crate::cost::Tunables::programmatic_launch_s`], at most
    /// the launch cost).
    pub programmatic_launch_s: f64,
    /// The wave quantisation factor `q` of the SM-local terms.
    pub wave_factor: f64,
    /// Occupancy on the GPU.
    pub occupancy: Occupancy,
    /// The physical floor, seconds (the time is never below it).
    pub floor_s: f64,
}

/// The DRAM bytes a launch moves: the L2 model's result, else its whole footprint.
pub fn dram_bytes(c: &LaunchCounters) -> u64 {
    match c.dram {
        Some(d) => d.bytes(),
        None => (c.unique_read_sectors + c.unique_write_sectors) * SECTOR_BYTES,
    }
}

/// Models one launch with counters `c` on `spec`. `resources` are the kernel's
/// `ptxas -v` figures for the GPU's architecture; without them occupancy counts
/// threads, blocks and the PTX's shared memory only.
pub fn predict(
    spec: &GpuSpec,
    c: &LaunchCounters,
    resources: Option<&KernelResources>,
    launch: LaunchKind,
) -> Result<Prediction, CostError> {
    let a = &spec.arch;
    let t = &spec.tunables;
    if !(t.dram_efficiency > 0.0 && t.l2_bytes_per_clk > 0.0) {
        return Err(CostError::new(format!(
            "{}: dram_efficiency and l2_bytes_per_clk must be positive",
            spec.name
        )));
    }
    let blocks = c.blocks.max(1);
    let res = resources.copied().unwrap_or(KernelResources {
        static_shared: c.static_shared,
        ..Default::default()
    });
    let threads = c.threads_per_block().clamp(1, u32::MAX as u64) as u32;
    let occ = occupancy(a, &res, threads, c.dynamic_shared, blocks)?;
    let (sms, clock) = (a.sms as f64, a.clock_hz);
    let q = blocks.div_ceil(a.sms as u64) as f64 * sms / blocks as f64;
    let per_sm = |work: f64, rate: f64| q * work / (rate * sms * clock);
    let mut terms = Vec::new();
    let dram = dram_bytes(c) as f64;
    terms.push((Term::Dram, dram / (a.dram_bytes_per_s * t.dram_efficiency)));
    let l2 = (c.l2_sectors * SECTOR_BYTES) as f64;
    terms.push((Term::L2, l2 / (t.l2_bytes_per_clk * clock)));
    let wavefronts = (c.shared_load.wavefronts + c.shared_store.wavefronts) as f64;
    terms.push((
        Term::Shared,
        per_sm(wavefronts, a.shared_wavefronts_per_clk as f64),
    ));
    terms.push((
        Term::Issue,
        per_sm(c.warp_instructions as f64, a.schedulers_per_sm as f64),
    ));
    // Dense int8 runs at twice the f16 rate (H100 whitepaper: 1979 dense INT8 TOPS
    // against 989 dense FP16 TFLOPS): an int8 multiply-add costs half an f16 one.
    let tensor_work = c.tensor_macs as f64 - 0.5 * c.tensor_macs_int8 as f64;
    terms.push((
        Term::TensorCore,
        per_sm(tensor_work, a.tensor_macs_per_clk as f64),
    ));
    for (class, n) in c.classes.nonzero() {
        let rate = spec.issue_rate(class).ok_or_else(|| {
            CostError::new(format!(
                "{}: no issue rate for instruction class {}",
                spec.name,
                class.name()
            ))
        })?;
        terms.push((Term::Class(class), per_sm(n as f64 * 32.0, rate)));
    }
    terms.sort_by(|x, y| y.1.total_cmp(&x.1));
    let (top, throughput_s) = terms[0];
    let lat = spec.latencies_f64();
    let price = |p: &crate::profile::PathCounts| {
        p.issue as f64
            + p.alu as f64 * lat[0]
            + p.special as f64 * lat[1]
            + p.shared as f64 * lat[2]
            + p.global as f64 * lat[3]
    };
    let path_s = price(&c.critical_path) / clock;
    let post_wait_s = c.post_wait_path.as_ref().map(|p| price(p) / clock);
    let launch_s = match launch {
        LaunchKind::Stream => t.launch_stream_s,
        LaunchKind::GraphNode => t.launch_graph_node_s,
    };
    let latency_body = (occ.waves - 1) as f64 * path_s;
    let body = throughput_s.max(latency_body);
    let kernel_s = body + path_s;
    let mut bound = if latency_body > throughput_s || path_s > throughput_s {
        Term::Latency
    } else {
        top
    };
    if launch_s > kernel_s {
        bound = Term::Launch;
    }
    let f32_work = [InstrClass::F32Fma, InstrClass::F32Mul, InstrClass::F32Add]
        .iter()
        .map(|&k| c.classes.get(k))
        .sum::<u64>() as f64
        * 32.0;
    let floor_s = [
        dram / a.dram_bytes_per_s,
        tensor_work / (a.tensor_macs_per_clk as f64 * sms * clock),
        f32_work / (128.0 * sms * clock),
    ]
    .into_iter()
    .fold(0.0, f64::max);
    let time_s = (kernel_s + launch_s).max(floor_s);
    Ok(Prediction {
        time_s,
        bound,
        terms,
        throughput_s,
        path_s,
        post_wait_s,
        launch_s,
        programmatic_launch_s: t.programmatic_launch_s.min(launch_s),
        wave_factor: q,
        occupancy: occ,
        floor_s,
    })
}

impl GpuSpec {
    /// The latencies (alu, special, shared, global) in cycles, unrounded.
    fn latencies_f64(&self) -> [f64; 4] {
        let t = &self.tunables;
        [
            t.alu_latency,
            t.special_latency,
            t.shared_latency,
            t.global_latency,
        ]
    }
}

impl Prediction {
    /// The path before `griddepcontrol.wait`, seconds (0 for a kernel without it).
    pub fn pre_wait_s(&self) -> f64 {
        self.post_wait_s
            .map_or(0.0, |post| (self.path_s - post).max(0.0))
    }

    /// How much of this launch, made with programmatic stream serialisation right after
    /// `prev` on the same stream, runs while `prev` still runs, in seconds: the
    /// programmatic part of its launch cost and its path up to `griddepcontrol.wait`, at
    /// most as long as `prev` runs after its own wait. The kernels here run
    /// `griddepcontrol.launch_dependents` right after their wait, so a dependent is
    /// launched when `prev`'s wait returns; a kernel without the wait (no trigger either)
    /// lets its dependent launch only when it ends, and hides nothing.
    pub fn programmatic_overlap_s(&self, prev: &Prediction) -> f64 {
        if self.post_wait_s.is_none() || prev.post_wait_s.is_none() {
            return 0.0;
        }
        let prev_after_release = prev.time_s - prev.launch_s - prev.pre_wait_s();
        (self.programmatic_launch_s + self.pre_wait_s())
            .min(prev_after_release)
            .max(0.0)
    }

    /// One line: time, bound, the three largest terms, occupancy.
    pub fn summary(&self) -> String {
        let top: Vec<String> = self
            .terms
            .iter()
            .take(3)
            .map(|(t, s)| format!("{} {:.2} µs", t.name(), s * 1e6))
            .collect();
        format!(
            "modelled {:.2} µs, bound by {} (throughput: {}; path {:.2} µs; launch {:.2} µs; \
             {} blocks/SM by {:?}, {} waves)",
            self.time_s * 1e6,
            self.bound.name(),
            top.join(", "),
            self.path_s * 1e6,
            self.launch_s * 1e6,
            self.occupancy.blocks_per_sm,
            self.occupancy.limited_by,
            self.occupancy.waves
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{DramTraffic, GlobalTraffic, PathCounts};

    /// A streaming kernel: `n` floats read and written once, coalesced.
    fn streaming(n: u64) -> LaunchCounters {
        let warps = n / 32;
        let mut c = LaunchCounters {
            grid: [(n / 256) as u32, 1, 1],
            block: [256, 1, 1],
            blocks: n / 256,
            blocks_interpreted: n / 256,
            warp_instructions: 10 * warps,
            thread_instructions: 10 * n,
            global_load: GlobalTraffic {
                requests: warps,
                sectors: n / 8,
                lines: n / 32,
            },
            global_store: GlobalTraffic {
                requests: warps,
                sectors: n / 8,
                lines: n / 32,
            },
            dram: Some(DramTraffic {
                read_sectors: n / 8,
                write_sectors: n / 8,
            }),
            critical_path: PathCounts {
                issue: 10,
                alu: 5,
                global: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        c.classes.0[InstrClass::F32Fma.index()] = 4 * warps;
        c.classes.0[InstrClass::IntAlu.index()] = 6 * warps;
        c
    }

    #[test]
    fn every_class_has_a_rate_on_every_named_gpu() {
        for name in GpuSpec::NAMES {
            let spec = GpuSpec::named(name).expect("named");
            for class in InstrClass::all() {
                let r = spec.issue_rate(class);
                assert!(r.is_some_and(|r| r > 0.0), "{name}: {}", class.name());
            }
        }
    }

    #[test]
    fn a_class_without_a_rate_is_an_error() {
        let mut spec = GpuSpec::h100_sxm();
        spec.issue_rates[InstrClass::F32Fma.index()] = None;
        let e = predict(&spec, &streaming(1 << 20), None, LaunchKind::Stream).unwrap_err();
        assert!(e.to_string().contains("f32_fma"), "{e}");
    }

    #[test]
    fn a_large_streaming_kernel_is_dram_bound_near_the_floor() {
        let spec = GpuSpec::h200();
        let n = 1u64 << 26; // 256 MiB read and written
        let p = predict(&spec, &streaming(n), None, LaunchKind::GraphNode).unwrap();
        assert_eq!(p.bound, Term::Dram);
        let bytes = (n * 8) as f64;
        assert_eq!(p.floor_s, bytes / 4.8e12);
        assert!(p.time_s >= p.floor_s);
        // The DRAM term is the floor at the measured efficiency; the path adds a little,
        // the graph node its fixed cost.
        let dram = p.floor_s / spec.tunables.dram_efficiency;
        let launch = spec.tunables.launch_graph_node_s;
        assert!(p.time_s < dram * 1.01 + launch + 2e-6, "{}", p.summary());
    }

    #[test]
    fn a_tiny_kernel_is_latency_or_launch_bound() {
        let spec = GpuSpec::h100_sxm();
        let mut c = streaming(256);
        c.critical_path = PathCounts {
            issue: 20,
            global: 8,
            ..Default::default()
        };
        let on_stream = predict(&spec, &c, None, LaunchKind::Stream).unwrap();
        assert_eq!(on_stream.bound, Term::Launch);
        let node = predict(&spec, &c, None, LaunchKind::GraphNode).unwrap();
        assert_eq!(node.bound, Term::Latency);
        let t = &spec.tunables;
        let path = (20.0 + 8.0 * t.global_latency) / 1.98e9;
        assert!((node.path_s - path).abs() < 1e-15);
        let launch = t.launch_graph_node_s;
        assert!((node.time_s - (path + launch + node.throughput_s)).abs() < 1e-12);
        assert_eq!(node.wave_factor, 132.0);
    }

    #[test]
    fn a_programmatic_launch_hides_its_launch_and_pre_wait_path_behind_the_grid_before() {
        let spec = GpuSpec::h200();
        let t = &spec.tunables;
        let clock = spec.arch.clock_hz;
        // 10 global hops before the wait and 100 after it: the grid before is long enough
        // to hide the launch and the pre-wait path.
        let kernel = |pre: u64, post: u64| {
            let mut c = streaming(256);
            c.critical_path = PathCounts {
                global: pre + post,
                ..Default::default()
            };
            c.post_wait_path = Some(PathCounts {
                global: post,
                ..Default::default()
            });
            c
        };
        let a = predict(&spec, &kernel(10, 100), None, LaunchKind::GraphNode).unwrap();
        let b = predict(&spec, &kernel(10, 100), None, LaunchKind::GraphNode).unwrap();
        let pre = 10.0 * t.global_latency / clock;
        assert!((b.pre_wait_s() - pre).abs() < 1e-15);
        let hidden = b.programmatic_overlap_s(&a);
        assert!(b.programmatic_launch_s <= b.launch_s);
        assert_eq!(b.programmatic_launch_s, t.programmatic_launch_s);
        assert!(
            (hidden - (b.programmatic_launch_s + pre)).abs() < 1e-15,
            "{hidden}"
        );
        // The programmatic part is at most the launch cost itself.
        let mut all = spec.clone();
        all.tunables.programmatic_launch_s = 1.0;
        let whole = predict(&all, &kernel(10, 100), None, LaunchKind::GraphNode).unwrap();
        assert_eq!(whole.programmatic_launch_s, whole.launch_s);
        let hidden_whole = whole.programmatic_overlap_s(&a);
        assert!((hidden_whole - (whole.launch_s + pre)).abs() < 1e-15);
        // Behind a short grid only what it leaves after its own wait is hidden.
        let short = predict(&spec, &kernel(10, 1), None, LaunchKind::GraphNode).unwrap();
        let after = short.time_s - short.launch_s - short.pre_wait_s();
        assert!((b.programmatic_overlap_s(&short) - after).abs() < 1e-15);
        assert!(after < b.programmatic_launch_s + pre);
        // No wait on either side: nothing overlaps.
        let plain = predict(&spec, &streaming(256), None, LaunchKind::GraphNode).unwrap();
        assert_eq!(plain.pre_wait_s(), 0.0);
        assert_eq!(b.programmatic_overlap_s(&plain), 0.0);
        assert_eq!(plain.programmatic_overlap_s(&a), 0.0);
    }

    #[test]
    fn datasheet_constants_never_go_below_the_physical_floors() {
        for name in GpuSpec::NAMES {
            let spec = GpuSpec::named(name).unwrap();
            for shift in [8, 12, 16, 20, 24, 28] {
                let mut c = streaming(1 << shift);
                for dram in [None, c.dram] {
                    c.dram = dram;
                    for kind in [LaunchKind::Stream, LaunchKind::GraphNode] {
                        let p = predict(&spec, &c, None, kind).unwrap();
                        let bytes = dram_bytes(&c) as f64;
                        let fma = c.classes.get(InstrClass::F32Fma) as f64 * 32.0;
                        let sms = spec.arch.sms as f64;
                        assert!(p.time_s >= bytes / spec.arch.dram_bytes_per_s, "{name}");
                        assert!(p.time_s >= fma / (128.0 * sms * spec.arch.clock_hz));
                        assert!(p.time_s >= p.floor_s && p.floor_s > 0.0);
                    }
                }
            }
            // Even a fit gone wrong (efficiency above 1) stays at the floor.
            let mut wild = spec.clone();
            wild.tunables.dram_efficiency = 4.0;
            wild.tunables.launch_graph_node_s = 0.0;
            let c = streaming(1 << 26);
            let p = predict(&wild, &c, None, LaunchKind::GraphNode).unwrap();
            assert_eq!(p.time_s, p.floor_s);
        }
    }

    #[test]
    fn wave_quantisation_of_one_block_more_than_the_sms() {
        let spec = GpuSpec::h100_sxm();
        let mut c = streaming(133 * 256);
        c.dram = Some(DramTraffic::default());
        let p = predict(&spec, &c, None, LaunchKind::GraphNode).unwrap();
        assert_eq!(p.wave_factor, 2.0 * 132.0 / 133.0);
    }
}
