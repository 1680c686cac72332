//! Named GPUs: architecture facts (from datasheets and NVIDIA's guides) and at most
//! nine tunable constants each, every one citing where its value comes from.

use crate::profile::{InstrClass, Latencies, MemSpace};

/// What the hardware is: datasheet and programming-guide facts, never fitted.
#[derive(Clone, Debug, PartialEq)]
pub struct Arch {
    /// Compute capability as `major * 10 + minor` (90 for sm_90).
    pub compute_capability: u32,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// L2 cache bytes.
    pub l2_bytes: u64,
    /// Peak DRAM bandwidth, bytes per second.
    pub dram_bytes_per_s: f64,
    /// Boost clock, Hz.
    pub clock_hz: f64,
    /// 32-bit registers per SM.
    pub regs_per_sm: u32,
    /// Registers are allocated to a warp in units of this many.
    pub reg_alloc_unit: u32,
    /// Shared memory per SM usable by blocks, bytes.
    pub shared_per_sm: u32,
    /// Shared memory the driver reserves per resident block, bytes.
    pub shared_reserved_per_block: u32,
    /// Resident threads per SM.
    pub max_threads_per_sm: u32,
    /// Resident blocks per SM.
    pub max_blocks_per_sm: u32,
    /// Warp schedulers per SM, each issuing one warp instruction per cycle.
    pub schedulers_per_sm: u32,
    /// Shared-memory wavefronts an SM serves per cycle (32 banks of 4 bytes).
    pub shared_wavefronts_per_clk: u32,
    /// Dense f16 tensor-core multiply-adds per SM per cycle.
    pub tensor_macs_per_clk: u32,
}

/// The [`Tunables`] of the GPU whose module is `$gpu`, from its constants.
macro_rules! tunables_of {
    ($gpu:ident) => {
        Tunables {
            dram_efficiency: $gpu::DRAM_EFFICIENCY,
            l2_bytes_per_clk: $gpu::L2_BYTES_PER_CLK,
            alu_latency: $gpu::ALU_LATENCY,
            special_latency: $gpu::SPECIAL_LATENCY,
            shared_latency: $gpu::SHARED_LATENCY,
            global_latency: $gpu::GLOBAL_LATENCY,
            launch_stream_s: $gpu::LAUNCH_STREAM_S,
            launch_graph_node_s: $gpu::LAUNCH_GRAPH_NODE_S,
            programmatic_launch_s: $gpu::PROGRAMMATIC_LAUNCH_S,
        }
    };
}

/// The nine tunable constants of a GPU. Each named GPU defines them in a module of its
/// own ([`h100_sxm`], [`h200`]) as constants that cite their source.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tunables {
    /// Fraction of the peak DRAM bandwidth a streaming kernel reaches (at most 1).
    pub dram_efficiency: f64,
    /// L2 bytes served per cycle, whole device.
    pub l2_bytes_per_clk: f64,
    /// Dependent ALU result latency, cycles.
    pub alu_latency: f64,
    /// Special-function (and expanded div/sqrt) result latency, cycles.
    pub special_latency: f64,
    /// Shared-memory load and shuffle latency, cycles.
    pub shared_latency: f64,
    /// Global load latency, cycles.
    pub global_latency: f64,
    /// Host-side cost of one kernel launched on a stream, seconds.
    pub launch_stream_s: f64,
    /// Cost of one kernel node of a CUDA graph launch, seconds.
    pub launch_graph_node_s: f64,
    /// The part of a kernel's launch cost that a programmatic dependent launch can spend
    /// while the grid before it still runs, seconds (the rest of the launch cost, and
    /// all of it for other launches, comes after that grid).
    pub programmatic_launch_s: f64,
}

/// A tunable constant, by name (what [`crate::cost::fit`] adjusts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tunable {
    /// [`Tunables::dram_efficiency`].
    DramEfficiency,
    /// [`Tunables::l2_bytes_per_clk`].
    L2BytesPerClk,
    /// [`Tunables::alu_latency`].
    AluLatency,
    /// [`Tunables::special_latency`].
    SpecialLatency,
    /// [`Tunables::shared_latency`].
    SharedLatency,
    /// [`Tunables::global_latency`].
    GlobalLatency,
    /// [`Tunables::launch_stream_s`].
    LaunchStream,
    /// [`Tunables::launch_graph_node_s`].
    LaunchGraphNode,
    /// [`Tunables::programmatic_launch_s`].
    ProgrammaticLaunch,
}

impl Tunable {
    /// All nine.
    pub const ALL: [Tunable; 9] = [
        Tunable::DramEfficiency,
        Tunable::L2BytesPerClk,
        Tunable::AluLatency,
        Tunable::SpecialLatency,
        Tunable::SharedLatency,
        Tunable::GlobalLatency,
        Tunable::LaunchStream,
        Tunable::LaunchGraphNode,
        Tunable::ProgrammaticLaunch,
    ];
}

impl Tunables {
    /// The value of `t`.
    pub fn get(&self, t: Tunable) -> f64 {
        match t {
            Tunable::DramEfficiency => self.dram_efficiency,
            Tunable::L2BytesPerClk => self.l2_bytes_per_clk,
            Tunable::AluLatency => self.alu_latency,
            Tunable::SpecialLatency => self.special_latency,
            Tunable::SharedLatency => self.shared_latency,
            Tunable::GlobalLatency => self.global_latency,
            Tunable::LaunchStream => self.launch_stream_s,
            Tunable::LaunchGraphNode => self.launch_graph_node_s,
            Tunable::ProgrammaticLaunch => self.programmatic_launch_s,
        }
    }

    /// Sets `t` to `v`.
    pub fn set(&mut self, t: Tunable, v: f64) {
        let slot = match t {
            Tunable::DramEfficiency => &mut self.dram_efficiency,
            Tunable::L2BytesPerClk => &mut self.l2_bytes_per_clk,
            Tunable::AluLatency => &mut self.alu_latency,
            Tunable::SpecialLatency => &mut self.special_latency,
            Tunable::SharedLatency => &mut self.shared_latency,
            Tunable::GlobalLatency => &mut self.global_latency,
            Tunable::LaunchStream => &mut self.launch_stream_s,
            Tunable::LaunchGraphNode => &mut self.launch_graph_node_s,
            Tunable::ProgrammaticLaunch => &mut self.programmatic_launch_s,
        };
        *slot = v;
    }
}

/// A named GPU: facts, tunables and issue rates.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    /// Its name (`h100-sxm`, `h200`).
    pub name: &'static str,
    /// Architecture facts.
    pub arch: Arch,
    /// The tunable constants.
    pub tunables: Tunables,
    /// Thread instructions per SM per cycle of each class, indexed by
    /// [`InstrClass::index`]; `None` is a class the model cannot price (an error when
    /// a launch executes it).
    pub issue_rates: Vec<Option<f64>>,
}

/// The issue rates of compute capability 9.0, in thread instructions per SM per cycle.
///
/// Source: CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table
/// (results per clock cycle per multiprocessor), column 9.0: 32-bit float add, multiply
/// and fma 128; compare, min, max 64; 16-bit float 256 results, i.e. 128 `f16x2`
/// instructions; 64-bit float 64; 32-bit integer add, logic, shift 64; integer
/// multiply and multiply-add 64; reciprocal, rsqrt, log2, exp2, sine, cosine 16; warp
/// shuffle 32; conversions 16. Rows the guide does not list, each an assumption to
/// check with the calibration kit: `dp4a` at the integer multiply-add rate 64 (it runs
/// on the same pipe); expanded `div`/`sqrt.rn`/`rcp.rn` at the special-function rate
/// 16 (each holds one such operation); moves and control at 64; tensor-core
/// instructions issue at 128 (their cost is the tensor term); loads, stores and atomics
/// at 32 (the 32 load/store units of an SM, H100 whitepaper); parameter loads at 64
/// (constant cache).
pub fn sm90_issue_rates() -> Vec<Option<f64>> {
    InstrClass::all()
        .map(|c| {
            Some(match c {
                InstrClass::F32Fma | InstrClass::F32Mul | InstrClass::F32Add => 128.0,
                InstrClass::F32Other => 64.0,
                InstrClass::F16Arith => 128.0,
                InstrClass::F64Arith => 64.0,
                InstrClass::IntAlu | InstrClass::IntMul | InstrClass::Dp4a => 64.0,
                InstrClass::TensorCore => 128.0,
                InstrClass::Special | InstrClass::Emulated | InstrClass::Convert => 16.0,
                InstrClass::Move | InstrClass::Control => 64.0,
                InstrClass::ShuffleVote => 32.0,
                InstrClass::Load {
                    space: MemSpace::Param,
                    ..
                } => 64.0,
                InstrClass::Load { .. } | InstrClass::Store { .. } | InstrClass::Atomic { .. } => {
                    32.0
                }
            })
        })
        .collect()
}

/// Hopper (sm_90) facts shared by H100 SXM and H200.
///
/// Sources: NVIDIA H100 Tensor Core GPU Architecture whitepaper (v1.01): 132 SMs on the
/// SXM5 part, 50 MB L2, 64K 32-bit registers per SM, up to 228 KB shared memory per SM,
/// 4 warp schedulers per SM, 2048 threads and 32 blocks per SM; dense FP16 tensor
/// 989.4 TFLOPS = 132 SMs × 1830 MHz × 4096 flops, i.e. 2048 multiply-adds per SM per
/// cycle. CUDA C++ Programming Guide ("Compute Capabilities", "Occupancy"): 1 KB of
/// shared memory reserved per block, registers allocated per warp in units of 256; 32
/// banks of 4 bytes (one wavefront per cycle). Boost clock 1980 MHz (H100 SXM5 product
/// brief).
fn hopper(l2_bytes: u64, dram_bytes_per_s: f64) -> Arch {
    Arch {
        compute_capability: 90,
        sms: 132,
        l2_bytes,
        dram_bytes_per_s,
        clock_hz: 1.98e9,
        regs_per_sm: 65536,
        reg_alloc_unit: 256,
        shared_per_sm: 228 << 10,
        shared_reserved_per_block: 1 << 10,
        max_threads_per_sm: 2048,
        max_blocks_per_sm: 32,
        schedulers_per_sm: 4,
        shared_wavefronts_per_clk: 1,
        tensor_macs_per_clk: 2048,
    }
}

/// The tunable constants of the H100 SXM, measured and fitted on one (see the note inside).
pub mod h100_sxm {
    // Measured on an NVIDIA H100 80GB HBM3 (driver 580.159.04) by the calibration kit of
    // commit a5a7363: harness/reference/cuda-h100-a5a7363/ (probes.json, kernels.json;
    // the fit: fit-h100-3.txt, `ggml-harness fit-cost-model --gpu h100 --dir ...
    // --tunables l2-bytes-per-clk,alu-latency,special-latency`). The fitted latencies are
    // effective values of this model's one dependent-latency term (they absorb issue
    // stalls the model does not count), not the hardware's instruction latencies.

    /// 0.928: the `dram_read` probe, 1 GiB read once with 16-byte loads at 3109 GB/s
    /// against the datasheet's 3.35 TB/s.
    pub const DRAM_EFFICIENCY: f64 = 0.928;
    /// 556 bytes per cycle: fitted to the pp512 per-kernel times (kernels.json); the
    /// `l2_read` probe (an 8 MiB buffer read 8 times) gave 1045.
    pub const L2_BYTES_PER_CLK: f64 = 556.0;
    /// 20.3 cycles: fitted as above (datasheet order: about 4 cycles, CUDA C++
    /// Programming Guide, "Multiprocessor Level").
    pub const ALU_LATENCY: f64 = 20.3;
    /// 180 cycles: fitted as above (Luo et al., arXiv:2402.13499, measure MUFU latency of
    /// the order of 20 cycles).
    pub const SPECIAL_LATENCY: f64 = 180.0;
    /// 30 cycles: order of the shared-memory load latency of Luo et al.; left out of the
    /// fit, which drove it to 0 when free (fit-h100.txt).
    pub const SHARED_LATENCY: f64 = 30.0;
    /// 287 cycles: the `dram_latency` probe (145 ns per dependent load at 1.98 GHz; its
    /// chain stays in L2, as does most of a kernel's dependent traffic).
    pub const GLOBAL_LATENCY: f64 = 287.0;
    /// 3.6 µs: the `launch_stream` probe, 2000 empty kernels launched back to back on a
    /// stream in 7.17 ms of GPU time.
    pub const LAUNCH_STREAM_S: f64 = 3.6e-6;
    /// 0.79 µs: the `launch_graph_node` probe, a CUDA graph of 2000 empty kernels in
    /// 1.57 ms of GPU time.
    pub const LAUNCH_GRAPH_NODE_S: f64 = 0.79e-6;
    /// As [`super::h200::PROGRAMMATIC_LAUNCH_S`] (measured on the H200, the same GH100
    /// chip and driver; no H100 run has measured programmatic launches).
    pub const PROGRAMMATIC_LAUNCH_S: f64 = super::h200::PROGRAMMATIC_LAUNCH_S;
}

/// The tunable constants of the H200, measured and fitted on one (see the note inside).
pub mod h200 {
    // Measured on an NVIDIA H200 (driver 580.159.04) by the calibration kit of commit
    // 0aadbf6 (run 5): harness/reference/cuda-h200-0aadbf6/ (probes.json, kernels.json; the
    // fit: fit-h200.txt, `ggml-harness fit-cost-model --gpu h200 --devices cuda-sim:0 --dir
    // ... --fit-pass pp512,tg --tunables alu-latency,launch-graph-node`). The probes set
    // DRAM efficiency, L2 bandwidth and global latency; the fit takes both passes' rows
    // (the kit's kernels.json replays each op's kernels alone as graph nodes, so the
    // generated token's rows hold no host waits). The graph-node cost is fitted, not the
    // empty-kernel probe's 0.50 µs: the kernels timed alone show a fixed cost of about
    // 3.7 µs each (3.5 µs on run 4's and the H100's kits; harness/reference/
    // cuda-modelled.md, "How far to trust the constants"). Left free, the special-function
    // latency runs to 0 (no row is bound by it; fit-h200-free-special.txt, rms 0.173
    // against 0.195), so it keeps run 4's effective value. Run 4's fit (938b0ae) had no
    // fixed cost and took it into the latencies (ALU 24.4, special 384, L2 665 B/clk).

    /// 0.922: the `dram_read` probe, 1 GiB read once with 16-byte loads at 4426 GB/s
    /// against the datasheet's 4.8 TB/s.
    pub const DRAM_EFFICIENCY: f64 = 0.922;
    /// 875 bytes per cycle: the `l2_read` probe (an 8 MiB buffer read 8 times, 1732 GB/s).
    pub const L2_BYTES_PER_CLK: f64 = 875.0;
    /// 4.50 cycles: fitted as above (an effective value of the model's one
    /// dependent-latency term).
    pub const ALU_LATENCY: f64 = 4.50;
    /// 384 cycles: run 4's fit (938b0ae), not bounded by run 5's rows.
    pub const SPECIAL_LATENCY: f64 = 384.0;
    /// As [`super::h100_sxm::SHARED_LATENCY`] (same SM; not fitted).
    pub const SHARED_LATENCY: f64 = super::h100_sxm::SHARED_LATENCY;
    /// 288 cycles: the `dram_latency` probe (146 ns per dependent load at 1.98 GHz).
    pub const GLOBAL_LATENCY: f64 = 288.0;
    /// 4.34 µs: the `launch_stream` probe, 2000 empty kernels launched back to back on a
    /// stream in 8.67 ms of GPU time (run 4: 3.64 µs).
    pub const LAUNCH_STREAM_S: f64 = 4.34e-6;
    /// 3.75 µs: fitted as above, the fixed cost of a kernel timed alone as a graph node
    /// (the `launch_graph_node` probe of empty kernels: 0.50 µs).
    pub const LAUNCH_GRAPH_NODE_S: f64 = 3.75e-6;
    /// 0.61 µs: set so that the modelled token hides what run 5 measured programmatic
    /// launches to save, 0.125 ms a SmolLM2 token (tg128 at 1021.6 t/s with `no-pdl`,
    /// 1171.7 without; `tuning-*.json`): 149 programmatic launches hide their pre-wait
    /// paths (0.034 ms) and 0.61 µs each of their launch cost. About the empty-kernel
    /// probe's 0.50 µs a node: the launch itself starts early, while the rest of a
    /// kernel's fixed cost (3.75 µs above) comes after the grid before it.
    pub const PROGRAMMATIC_LAUNCH_S: f64 = 0.61e-6;
}

/// The error each kernel family kept after the H100 fit (fit-h100-3.txt: measured /
/// modelled within `[1 / (1 + e), 1 + e]`, rounded up), the families it was fitted on.
const H100_FAMILIES: [(&str, f64); 11] = [
    ("pp512 ADD", 0.41),
    ("pp512 FLASH_ATTN_EXT", 0.20),
    ("pp512 GET_ROWS", 0.49),
    ("pp512 MUL", 0.37),
    ("pp512 MUL_MAT q4_1", 0.09),
    ("pp512 RMS_NORM", 0.99),
    ("pp512 RMS_NORM+MUL_MAT q8_0", 0.61),
    ("pp512 ROPE", 0.33),
    ("pp512 SET_ROWS", 1.43),
    ("pp512 SWIGLU", 0.24),
    ("pp512 UPLOAD_SCATTER", 2.79),
];

/// The error each kernel family kept after the H200 fit (fit-h200.json: measured /
/// modelled within `[1 / (1 + e), 1 + e]`, rounded up to a hundredth, at least 0.01), the
/// families it was fitted on.
const H200_FAMILIES: [(&str, f64); 15] = [
    ("pp512 FLASH_ATTN_EXT", 0.40),
    ("pp512 GET_ROWS", 0.04),
    ("pp512 MUL_MAT q4_1", 0.11),
    ("pp512 RMS_NORM", 0.20),
    ("pp512 RMS_NORM+MUL_MAT q8_0", 0.12),
    ("pp512 ROPE*2+SET_ROWS*2", 0.10),
    ("pp512 SWIGLU", 0.67),
    ("pp512 UPLOAD_SCATTER", 0.34),
    ("tg FLASH_ATTN_EXT", 0.06),
    ("tg GET_ROWS", 0.01),
    ("tg MUL_MAT+ADD q4_1", 0.10),
    ("tg RMS_NORM+MUL_MAT q8_0", 0.18),
    ("tg RMS_NORM+MUL_MAT*2+GLU q4_1", 0.01),
    ("tg RMS_NORM+MUL_MAT*3+ROPE*2+SET_ROWS*2 q4_1", 0.10),
    ("tg UPLOAD_SCATTER", 0.09),
];

impl GpuSpec {
    /// Where this GPU's constants came from and the error each kernel family kept, for
    /// [`check_drift`](super::check_drift): `None` where nothing was fitted on this GPU
    /// (then every modelled claim for it is uncalibrated).
    pub fn calibration(&self) -> Option<super::Calibration> {
        let (commit, file, date, families): (_, _, _, &[(&str, f64)]) = match self.name {
            "h100-sxm" => (
                "a5a7363",
                "harness/reference/cuda-h100-a5a7363/fit-h100-3.txt",
                "2026-11-26",
                &H100_FAMILIES,
            ),
            "h200" => (
                "0aadbf6",
                "harness/reference/cuda-h200-0aadbf6/fit-h200.txt",
                "2026-11-29",
                &H200_FAMILIES,
            ),
            _ => return None,
        };
        Some(super::Calibration {
            gpu: self.name.to_string(),
            commit: commit.to_string(),
            file: file.to_string(),
            date: date.to_string(),
            families: families
                .iter()
                .map(|&(f, e)| super::FamilyError {
                    family: f.to_string(),
                    error: e,
                })
                .collect(),
        })
    }

    /// H100 SXM5: 132 SMs, 50 MB L2, HBM3 at 3.35 TB/s (H100 datasheet), 1.98 GHz.
    pub fn h100_sxm() -> GpuSpec {
        GpuSpec {
            name: "h100-sxm",
            arch: hopper(50 << 20, 3.35e12),
            tunables: tunables_of!(h100_sxm),
            issue_rates: sm90_issue_rates(),
        }
    }

    /// H200 SXM: the H100's GH100 (132 SMs, 50 MB L2, 1.98 GHz) with HBM3e at 4.8 TB/s
    /// (H200 datasheet).
    pub fn h200() -> GpuSpec {
        GpuSpec {
            name: "h200",
            arch: hopper(50 << 20, 4.8e12),
            tunables: tunables_of!(h200),
            issue_rates: sm90_issue_rates(),
        }
    }

    /// The GPU called `name` (`h100`, `h100-sxm`, `h200`), case-insensitive.
    pub fn named(name: &str) -> Option<GpuSpec> {
        match name.to_ascii_lowercase().as_str() {
            "h100" | "h100-sxm" | "h100_sxm" => Some(GpuSpec::h100_sxm()),
            "h200" => Some(GpuSpec::h200()),
            _ => None,
        }
    }

    /// The names [`named`](GpuSpec::named) knows.
    pub const NAMES: [&'static str; 2] = ["h100-sxm", "h200"];

    /// The issue rate of `class` (thread instructions per SM per cycle), if priced.
    pub fn issue_rate(&self, class: InstrClass) -> Option<f64> {
        self.issue_rates.get(class.index()).copied().flatten()
    }

    /// The tunable latencies as the profiler's scoreboard takes them (rounded cycles).
    pub fn latencies(&self) -> Latencies {
        let t = &self.tunables;
        let c = |v: f64| v.round().max(0.0) as u64;
        Latencies {
            alu: c(t.alu_latency),
            special: c(t.special_latency),
            shared: c(t.shared_latency),
            global: c(t.global_latency),
        }
    }
}
