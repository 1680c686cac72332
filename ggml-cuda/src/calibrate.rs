//! Microbenchmarks that each measure one limit of a GPU, for fitting the cost model's
//! constants (`kernels/calibrate.ptx`): launch cost on a stream, a 196 KB read back to
//! the host, DRAM and L2 read bandwidth, dependent-load latency, the hand-off of a result
//! from one block to another inside a kernel (not a constant of the model: the figure a
//! persistent decode kernel would be weighed by), the f32 FMA, dp4a and
//! special-function issue rates, shared-memory bank conflicts, the f16 and int8
//! tensor-core rates, and the tensor cores' f16 accumulation (`mma_f16_numerics`: raw
//! results of designed products, from which `cuda_sim::tensor::fit_f16_model` pins the
//! parameters of cuda-sim's model of it).
//!
//! [`CudaBackend::calibrate`] runs them on the backend's stream and returns one
//! [`Probe`] per measurement: what was done (`work`, in the probe's unit), how long it
//! took, and their ratio. On cuda-sim the same code runs with [`ProbeSize::Tiny`] so that
//! a broken probe is found before a GPU is lent; those times mean nothing.

use std::time::Instant;

use ggml_core::{BackendErrorKind, BackendResult};

use cuda_sim::tensor::{fit_f16_model, fragment_coord, numerics_cases, Matrix, NumericsCase};

use crate::backend::CudaBackend;
use crate::driver::{CuError, Event, Func, GraphExec, Module};
use crate::launch::{Args, LaunchDims};

/// The PTX of the probes, loaded on demand (not one of the backend's kernels).
pub const CALIBRATE_PTX: &str = include_str!("../kernels/calibrate.ptx");

/// How much work each probe does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeSize {
    /// Enough to time a large GPU to about a percent (1 GiB reads, about 10^11 FMAs):
    /// about 2 seconds on an H100.
    Full,
    /// The smallest sizes that still run every code path, for a dry run on cuda-sim.
    Tiny,
}

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// What was measured, e.g. `dram_read`.
    pub name: &'static str,
    /// The unit of `work` (`bytes`, `launches`, `fma`, ...).
    pub unit: &'static str,
    /// Work per timed repetition.
    pub work: f64,
    /// Seconds per timed repetition, the median of the repetitions.
    pub seconds: f64,
    /// Every repetition's seconds, in order; for `mma_f16_numerics`, the raw f32 bits of
    /// its results instead (each as an exact f64 integer), in the order of
    /// [`mma_numerics_results`].
    pub samples: Vec<f64>,
    /// How the probe was run (sizes, grid), for the record.
    pub detail: String,
}

impl Probe {
    /// Work per second.
    pub fn rate(&self) -> f64 {
        self.work / self.seconds
    }
}

/// What [`CudaBackend::calibrate`] measured, and on what.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// The GPU's name as the driver reports it.
    pub device: String,
    /// Its compute capability.
    pub compute_capability: (i32, i32),
    /// The driver's CUDA version (`1000 · major + 10 · minor`).
    pub driver_version: i32,
    /// The probe size used.
    pub size: ProbeSize,
    /// The measurements, in the order they ran.
    pub probes: Vec<Probe>,
}

/// Sizes of one probe run.
struct Sizes {
    reps: usize,
    launches: usize,
    dram_bytes: usize,
    l2_bytes: usize,
    chase_dram_bytes: usize,
    chase_l2_bytes: usize,
    chase_steps: u32,
    blocks: u32,
    alu_iters: u32,
    smem_iters: u32,
    mma_iters: u32,
    readback_bytes: usize,
    handoff_blocks: u32,
}

impl Sizes {
    fn of(size: ProbeSize) -> Sizes {
        match size {
            ProbeSize::Full => Sizes {
                reps: 5,
                launches: 2000,
                dram_bytes: 1 << 30,
                l2_bytes: 8 << 20,
                chase_dram_bytes: 1 << 30,
                chase_l2_bytes: 4 << 20,
                chase_steps: 20_000,
                blocks: 4096,
                alu_iters: 4096,
                smem_iters: 4096,
                mma_iters: 64,
                readback_bytes: 196_608,
                // 32-thread blocks, all resident at once where an SM holds 32 blocks
                // (sm_80, sm_90) and there are 32 SMs or more (every H100 or H200).
                handoff_blocks: 1024,
            },
            ProbeSize::Tiny => Sizes {
                reps: 2,
                launches: 4,
                dram_bytes: 64 << 10,
                l2_bytes: 16 << 10,
                chase_dram_bytes: 64 << 10,
                chase_l2_bytes: 4 << 10,
                chase_steps: 64,
                blocks: 2,
                alu_iters: 4,
                smem_iters: 8,
                mma_iters: 2,
                readback_bytes: 196_608,
                handoff_blocks: 4,
            },
        }
    }
}

/// Polls of the hand-off probe before a block gives up (seconds on a GPU): it never hangs.
const HANDOFF_POLLS: u32 = 1 << 22;

/// Threads per block of the rate probes (their PTX assumes it).
const BLOCK: u32 = 256;

/// The probes' module and functions on one backend's device.
struct Kit<'a> {
    be: &'a CudaBackend,
    module: Module,
    start: Event,
    end: Event,
    /// Device allocations to free at the end.
    allocs: Vec<u64>,
    /// Pinned host allocations to free at the end.
    host_allocs: Vec<*mut u8>,
    /// Executable graphs to destroy at the end.
    execs: Vec<GraphExec>,
}

impl Drop for Kit<'_> {
    fn drop(&mut self) {
        let api = self.be.dev.api;
        let _ = api.stream_synchronize(self.be.stream);
        for &p in &self.allocs {
            let _ = api.mem_free(self.be.dev.ctx, p);
        }
        for &p in &self.host_allocs {
            let _ = api.mem_free_host(self.be.dev.ctx, p);
        }
        for &e in &self.execs {
            api.graph_exec_destroy(e);
        }
        api.event_destroy(self.start);
        api.event_destroy(self.end);
        api.module_unload(self.module);
    }
}

impl<'a> Kit<'a> {
    fn new(be: &'a CudaBackend) -> Result<Kit<'a>, CuError> {
        let api = be.dev.api;
        let module = api.module_load(be.dev.ctx, "calibrate.ptx", CALIBRATE_PTX)?;
        let start = api.event_create_timed(be.dev.ctx);
        let end = api.event_create_timed(be.dev.ctx);
        match (start, end) {
            (Ok(start), Ok(end)) => Ok(Kit {
                be,
                module,
                start,
                end,
                allocs: Vec::new(),
                host_allocs: Vec::new(),
                execs: Vec::new(),
            }),
            (s, e) => {
                for ev in [&s, &e].into_iter().flatten() {
                    api.event_destroy(*ev);
                }
                api.module_unload(module);
                Err(s.and(e).expect_err("one of them failed"))
            }
        }
    }

    fn func(&self, name: &str) -> Result<Func, CuError> {
        self.be.dev.api.module_function(self.module, name)
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64, CuError> {
        let p = self.be.dev.api.mem_alloc(self.be.dev.ctx, bytes)?;
        self.allocs.push(p);
        Ok(p)
    }

    fn alloc_host(&mut self, bytes: usize) -> Result<*mut u8, CuError> {
        let p = self.be.dev.api.mem_alloc_host(self.be.dev.ctx, bytes)?;
        self.host_allocs.push(p);
        Ok(p)
    }

    /// An executable graph of `n` launches of the empty kernel `f`, captured on the
    /// backend's stream.
    fn graph_of_empty(&mut self, f: Func, n: usize) -> Result<GraphExec, CuError> {
        let api = self.be.dev.api;
        let s = self.be.stream;
        api.stream_begin_capture(s)?;
        let launched = (0..n).try_for_each(|_| self.launch(f, 1, 32, Args::new().u64(0)));
        // The capture ends whatever happened, so the stream is usable again.
        let graph = api.stream_end_capture(s);
        launched?;
        let graph = graph?;
        let exec = api.graph_instantiate(graph);
        api.graph_destroy(graph);
        let exec = exec?;
        self.execs.push(exec);
        Ok(exec)
    }

    /// Uploads `bytes` to `dst` and waits.
    fn upload(&self, dst: u64, bytes: &[u8]) -> Result<(), CuError> {
        let api = self.be.dev.api;
        // SAFETY: `bytes` is pageable host memory that stays alive and unchanged until the
        // stream synchronisation below has completed the copy.
        unsafe { api.memcpy_htod_async(dst, bytes.as_ptr(), bytes.len(), self.be.stream) }?;
        api.stream_synchronize(self.be.stream)
    }

    /// Reads `len` bytes at `src` back through a pinned staging buffer and waits.
    fn download(&mut self, src: u64, len: usize) -> Result<Vec<u8>, CuError> {
        let api = self.be.dev.api;
        let staging = self.alloc_host(len)?;
        // SAFETY: `staging` is pinned memory of `len` bytes the kit owns; nothing reads it
        // before the synchronisation below completes the copy.
        unsafe { api.memcpy_dtoh_pinned_async(staging, src, len, self.be.stream) }?;
        api.stream_synchronize(self.be.stream)?;
        // SAFETY: the copy completed; `staging` holds `len` initialised bytes.
        Ok(unsafe { std::slice::from_raw_parts(staging, len) }.to_vec())
    }

    fn launch(&self, f: Func, grid: u32, block: u32, args: &mut Args) -> Result<(), CuError> {
        let d = LaunchDims {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared: 0,
            programmatic: false,
        };
        self.be.dev.api.launch(f, &d, self.be.stream, args)
    }

    /// Seconds of GPU time `enqueue` takes on the stream, between two timed events.
    fn gpu_seconds(&self, enqueue: impl Fn() -> Result<(), CuError>) -> Result<f64, CuError> {
        let api = self.be.dev.api;
        api.event_record(self.start, self.be.stream)?;
        enqueue()?;
        api.event_record(self.end, self.be.stream)?;
        api.event_synchronize(self.end)?;
        Ok(api.event_elapsed_ms(self.start, self.end)? as f64 * 1e-3)
    }
}

/// The numerics probe's inputs in fragment order (see `cal_mma_numerics`): per case, for
/// each lane, its four A words, two B words and four C words, as the PTX ISA's
/// m16n8k16 fragment tables place the elements.
pub(crate) fn pack_mma_numerics(cases: &[NumericsCase]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for case in cases {
        for lane in 0..32 {
            let mut wa = [0u32; 4];
            for i in 0..8 {
                let (r, k) = fragment_coord(Matrix::A, 16, 16, lane, i).expect("m16n8k16");
                wa[(i / 2) as usize] |= (case.a[(r * 16 + k) as usize] as u32) << (16 * (i % 2));
            }
            let mut wb = [0u32; 2];
            for i in 0..4 {
                let (k, n) = fragment_coord(Matrix::B, 16, 16, lane, i).expect("m16n8k16");
                wb[(i / 2) as usize] |= (case.b[(k * 8 + n) as usize] as u32) << (16 * (i % 2));
            }
            let mut wc = [0u32; 4];
            for (i, w) in wc.iter_mut().enumerate() {
                let (r, n) = fragment_coord(Matrix::C, 16, 16, lane, i as u32).expect("C");
                *w = case.c[(r * 8 + n) as usize];
            }
            a.extend(wa);
            b.extend(wb);
            c.extend(wc);
        }
    }
    (a, b, c)
}

/// D's fragments (four words per lane per case) back to each case's 16 x 8 row-major
/// results, cases in order: the order [`fit_f16_model`] reads.
pub fn mma_numerics_results(d: &[u32]) -> Vec<u32> {
    let mut out = vec![0u32; d.len()];
    for (case, words) in d.chunks(128).enumerate() {
        for lane in 0..32 {
            for i in 0..4 {
                let (r, n) = fragment_coord(Matrix::C, 16, 16, lane, i).expect("C");
                out[case * 128 + (r * 8 + n) as usize] = words[(lane * 4 + i) as usize];
            }
        }
    }
    out
}

/// The median of `v` (the mean of the two middle values for an even count).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => 0.5 * (s[n / 2 - 1] + s[n / 2]),
    }
}

/// A probe from `reps` timed repetitions after one untimed warm-up.
fn repeat(
    name: &'static str,
    unit: &'static str,
    work: f64,
    detail: String,
    reps: usize,
    mut once: impl FnMut() -> Result<f64, CuError>,
) -> Result<Probe, CuError> {
    once()?;
    let samples = (0..reps).map(|_| once()).collect::<Result<Vec<f64>, _>>()?;
    Ok(Probe {
        name,
        unit,
        work,
        seconds: median(&samples),
        samples,
        detail,
    })
}

/// Pushes the GPU-time probe `p` of a launch call (`api`), with the host time of one
/// call added to its detail, and the probe `name` (in `unit`) of that host time.
fn push_with_host_time(
    probes: &mut Vec<Probe>,
    mut p: Probe,
    (api, name, unit): (&str, &'static str, &'static str),
    host_seconds: f64,
    detail: String,
) {
    p.detail
        .push_str(&format!("; host {:.3} us per {api}", host_seconds * 1e6));
    probes.push(p);
    probes.push(Probe {
        name,
        unit,
        work: 1.0,
        seconds: host_seconds,
        samples: vec![host_seconds],
        detail,
    });
}

/// A single cycle through `n` u32 indices that jumps far on every step (a stride
/// co-prime with `n`, well above a page), so each load depends on the one before and
/// misses whatever the previous ones brought in.
fn chase_table(n: usize) -> Vec<u8> {
    let mut stride = (n / 2 + 4099) | 1;
    while gcd(stride, n) != 1 {
        stride += 2;
    }
    (0..n)
        .flat_map(|i| (((i + stride) % n) as u32).to_le_bytes())
        .collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl CudaBackend {
    /// Runs every probe of `calibrate.ptx` on this backend's stream and returns the
    /// measurements. Allocates up to about 2.2 GiB of device memory with
    /// [`ProbeSize::Full`] (freed on return) and waits for the stream throughout: run it
    /// on an otherwise idle GPU.
    pub fn calibrate(&self, size: ProbeSize) -> BackendResult<Calibration> {
        self.bind()?;
        let fail = |e: CuError| self.cu(e).at("calibrate", ggml_core::Name::new("probes"));
        let api = self.dev.api;
        api.stream_synchronize(self.stream).map_err(fail)?;
        let mut kit = Kit::new(self).map_err(fail)?;
        let s = Sizes::of(size);
        let mut probes = Vec::new();
        let sink = kit
            .alloc(s.blocks as usize * BLOCK as usize * 4)
            .map_err(fail)?;

        // Launch cost: empty kernels back to back, GPU time and host time per launch.
        let empty = kit.func("cal_empty").map_err(fail)?;
        let launches = s.launches;
        let host = std::cell::Cell::new(0.0f64);
        let p = repeat(
            "launch_stream",
            "launches",
            launches as f64,
            format!("{launches} empty kernels <<<1, 32>>> back to back"),
            s.reps,
            || {
                kit.gpu_seconds(|| {
                    let t = Instant::now();
                    for _ in 0..launches {
                        kit.launch(empty, 1, 32, Args::new().u64(0))?;
                    }
                    host.set(host.get() + t.elapsed().as_secs_f64());
                    Ok(())
                })
            },
        )
        .map_err(fail)?;
        let host_per_launch = host.get() / ((s.reps + 1) * launches) as f64;
        push_with_host_time(
            &mut probes,
            p,
            ("cuLaunchKernel", "launch_host", "launches"),
            host_per_launch,
            "host time of one launch call, averaged over launch_stream".into(),
        );

        // The same empty kernels as nodes of one CUDA graph: GPU time per node, and the
        // host time of one graph launch.
        let graph_host = std::cell::Cell::new(0.0f64);
        let exec = kit.graph_of_empty(empty, launches).map_err(fail)?;
        let p = repeat(
            "launch_graph_node",
            "launches",
            launches as f64,
            format!("a CUDA graph of {launches} empty kernels <<<1, 32>>>"),
            s.reps,
            || {
                kit.gpu_seconds(|| {
                    let t = Instant::now();
                    let r = api.graph_launch(exec, self.stream);
                    graph_host.set(graph_host.get() + t.elapsed().as_secs_f64());
                    r
                })
            },
        )
        .map_err(fail)?;
        let host_per_graph = graph_host.get() / (s.reps + 1) as f64;
        push_with_host_time(
            &mut probes,
            p,
            ("cuGraphLaunch", "launch_graph_host", "graph_launches"),
            host_per_graph,
            format!(
                "host time of one graph launch of {launches} nodes, averaged over launch_graph_node"
            ),
        );

        // A logits-sized read back into pinned host memory, host wall time from the
        // copy's enqueue to the stream's completion (the per-token read of generation).
        let rb = kit.alloc(s.readback_bytes).map_err(fail)?;
        api.memset_d8_async(rb, 1, s.readback_bytes, self.stream)
            .map_err(fail)?;
        let pinned = kit.alloc_host(s.readback_bytes).map_err(fail)?;
        probes.push(
            repeat(
                "readback_pinned",
                "bytes",
                s.readback_bytes as f64,
                format!(
                    "{} B device to pinned host, then a stream synchronisation; host wall time",
                    s.readback_bytes
                ),
                s.reps,
                || {
                    api.stream_synchronize(self.stream)?;
                    let t = Instant::now();
                    // SAFETY: `pinned` holds readback_bytes bytes of pinned memory the kit
                    // owns; nothing reads it before the synchronisation completes the copy.
                    unsafe {
                        api.memcpy_dtoh_pinned_async(pinned, rb, s.readback_bytes, self.stream)
                    }?;
                    api.stream_synchronize(self.stream)?;
                    Ok(t.elapsed().as_secs_f64())
                },
            )
            .map_err(fail)?,
        );

        // Read bandwidth: a buffer far larger than L2 (DRAM), and one that fits (L2).
        let read = kit.func("cal_read").map_err(fail)?;
        for (name, bytes, passes) in [
            ("dram_read", s.dram_bytes, 1usize),
            ("l2_read", s.l2_bytes, 8),
        ] {
            let buf = kit.alloc(bytes).map_err(fail)?;
            api.memset_d8_async(buf, 0x5a, bytes, self.stream)
                .map_err(fail)?;
            let n16 = (bytes / 16) as u64;
            let grid = s.blocks.min(n16.div_ceil(BLOCK as u64).max(1) as u32);
            probes.push(
                repeat(
                    name,
                    "bytes",
                    (bytes * passes) as f64,
                    format!("{bytes} B read {passes}x by <<<{grid}, {BLOCK}>>> with 16-byte loads"),
                    s.reps,
                    || {
                        kit.gpu_seconds(|| {
                            for _ in 0..passes {
                                kit.launch(
                                    read,
                                    grid,
                                    BLOCK,
                                    Args::new().u64(buf).u64(n16).u32(0xdead_beef).u64(sink),
                                )?;
                            }
                            Ok(())
                        })
                    },
                )
                .map_err(fail)?,
            );
        }

        // Dependent-load latency through DRAM and through L2.
        let chase = kit.func("cal_chase").map_err(fail)?;
        for (name, bytes) in [
            ("dram_latency", s.chase_dram_bytes),
            ("l2_latency", s.chase_l2_bytes),
        ] {
            let table = chase_table(bytes / 4);
            let buf = kit.alloc(bytes).map_err(fail)?;
            kit.upload(buf, &table).map_err(fail)?;
            let steps = s.chase_steps;
            probes.push(
                repeat(
                    name,
                    "loads",
                    steps as f64,
                    format!("{steps} dependent u32 loads in a {bytes} B cycle, one thread"),
                    s.reps,
                    || {
                        kit.gpu_seconds(|| {
                            kit.launch(chase, 1, 1, Args::new().u64(buf).u32(steps).u64(sink))
                        })
                    },
                )
                .map_err(fail)?,
            );
        }

        // Hand-offs between blocks inside one kernel: a chain in which each block waits
        // for the one before it (through L2, acquire and release at gpu scope), beside
        // the same blocks without waiting. (chain - base) / (blocks - 1) is the latency of
        // one hand-off: what a dependency costs kept inside a kernel (a persistent decode
        // kernel) rather than at a kernel boundary (`launch_graph_node` and the kernels'
        // own fixed cost).
        let handoff = kit.func("cal_handoff").map_err(fail)?;
        let hb = s.handoff_blocks;
        let flags = kit.alloc(hb as usize * 4).map_err(fail)?;
        let gave_up = kit.alloc(4).map_err(fail)?;
        api.memset_d8_async(gave_up, 0, 4, self.stream)
            .map_err(fail)?;
        for (name, wait, what) in [
            (
                "handoff_chain",
                1u32,
                "each waiting for the block before it",
            ),
            ("handoff_base", 0, "none waiting"),
        ] {
            probes.push(
                repeat(
                    name,
                    "blocks",
                    hb as f64,
                    format!("<<<{hb}, 32>>>, {what}; one flag each, set with release"),
                    s.reps,
                    || {
                        api.memset_d8_async(flags, 0, hb as usize * 4, self.stream)?;
                        kit.gpu_seconds(|| {
                            let mut args = Args::new();
                            args.u64(flags).u32(wait).u32(HANDOFF_POLLS).u64(gave_up);
                            kit.launch(handoff, hb, 32, &mut args)
                        })
                    },
                )
                .map_err(fail)?,
            );
        }
        let word = kit.download(gave_up, 4).map_err(fail)?;
        if word != [0; 4] {
            return Err(self.err(
                BackendErrorKind::Device,
                "calibrate: blocks of the hand-off probe gave up waiting (not all resident at once?)",
            ));
        }

        // Issue rates at full occupancy: 8 independent chains per thread.
        let threads = s.blocks as f64 * BLOCK as f64;
        for (name, kernel, unit) in [
            ("fma_rate", "cal_fma", "fma"),
            ("dp4a_rate", "cal_dp4a", "dp4a"),
            ("sfu_rate", "cal_sfu", "ex2"),
        ] {
            let f = kit.func(kernel).map_err(fail)?;
            let iters = s.alu_iters;
            probes.push(
                repeat(
                    name,
                    unit,
                    threads * 8.0 * iters as f64,
                    format!("<<<{}, {BLOCK}>>>, 8 chains x {iters} per thread", s.blocks),
                    s.reps,
                    || {
                        kit.gpu_seconds(|| {
                            kit.launch(f, s.blocks, BLOCK, Args::new().u32(iters).u64(sink))
                        })
                    },
                )
                .map_err(fail)?,
            );
        }

        // Shared memory: conflict-free loads, then a 32-way bank conflict.
        let smem = kit.func("cal_smem").map_err(fail)?;
        for (name, stride) in [("smem_load", 1u32), ("smem_load_32way", 32)] {
            let iters = s.smem_iters;
            probes.push(
                repeat(
                    name,
                    "warp_loads",
                    threads / 32.0 * iters as f64,
                    format!(
                        "<<<{}, {BLOCK}>>>, {iters} loads per thread, lane stride {stride} words",
                        s.blocks
                    ),
                    s.reps,
                    || {
                        kit.gpu_seconds(|| {
                            kit.launch(
                                smem,
                                s.blocks,
                                BLOCK,
                                Args::new().u32(iters).u32(stride).u64(sink),
                            )
                        })
                    },
                )
                .map_err(fail)?,
            );
        }

        // Tensor cores: 8 independent mma chains per warp at full occupancy.
        let warps = s.blocks as f64 * (BLOCK / 32) as f64;
        for (name, kernel, macs) in [
            ("mma_f16_rate", "cal_mma_f16", 16.0 * 8.0 * 16.0),
            ("mma_s8_rate", "cal_mma_s8", 16.0 * 8.0 * 32.0),
        ] {
            let f = kit.func(kernel).map_err(fail)?;
            let iters = s.mma_iters;
            probes.push(
                repeat(
                    name,
                    "tensor_macs",
                    warps * 8.0 * iters as f64 * macs,
                    format!(
                        "<<<{}, {BLOCK}>>>, 8 mma chains x {iters} per warp, {macs} multiply-adds each",
                        s.blocks
                    ),
                    s.reps,
                    || {
                        kit.gpu_seconds(|| {
                            kit.launch(f, s.blocks, BLOCK, Args::new().u32(iters).u64(sink))
                        })
                    },
                )
                .map_err(fail)?,
            );
        }
        probes.push(self.mma_numerics(&mut kit).map_err(fail)?);

        drop(kit);
        // Reports any error a probe kernel set, as every synchronisation does.
        ggml_core::Backend::synchronize(self)?;
        Ok(Calibration {
            device: self.dev.name.clone(),
            compute_capability: self.dev.cc,
            driver_version: self.dev.kind.version().map_err(fail)?,
            size,
            probes,
        })
    }
}

impl CudaBackend {
    /// The `mma_f16_numerics` probe: one warp runs every case of
    /// [`numerics_cases`]; the samples are the raw results, the detail names the
    /// model that reproduces them ([`fit_f16_model`]).
    fn mma_numerics(&self, kit: &mut Kit<'_>) -> Result<Probe, CuError> {
        let cases = numerics_cases();
        let (a, b, c) = pack_mma_numerics(&cases);
        let bytes = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (da, db, dc) = (
            kit.alloc(4 * a.len())?,
            kit.alloc(4 * b.len())?,
            kit.alloc(4 * c.len())?,
        );
        let dd = kit.alloc(4 * c.len())?;
        kit.upload(da, &bytes(&a))?;
        kit.upload(db, &bytes(&b))?;
        kit.upload(dc, &bytes(&c))?;
        let f = kit.func("cal_mma_numerics")?;
        let n = cases.len() as u32;
        let seconds = kit.gpu_seconds(|| {
            kit.launch(f, 1, 32, Args::new().u64(da).u64(db).u64(dc).u64(dd).u32(n))
        })?;
        let raw = kit.download(dd, 4 * c.len())?;
        let d: Vec<u32> = raw
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
            .collect();
        let results = mma_numerics_results(&d);
        let fit = fit_f16_model(&cases, &results);
        Ok(Probe {
            name: "mma_f16_numerics",
            unit: "results",
            work: results.len() as f64,
            seconds,
            samples: results.iter().map(|&r| r as f64).collect(),
            detail: format!(
                "{} m16n8k16 f16->f32 products of cuda_sim::tensor::numerics_cases, samples are D's f32 bits; fit: {}",
                cases.len(),
                fit.summary()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chase_table_is_one_cycle() {
        for n in [1024usize, 4099 * 2, 65536] {
            let t = chase_table(n);
            let next =
                |i: usize| u32::from_le_bytes(t[4 * i..4 * i + 4].try_into().unwrap()) as usize;
            let (mut i, mut seen) = (0usize, vec![false; n]);
            for _ in 0..n {
                assert!(!seen[i], "n = {n}: revisits {i} early");
                seen[i] = true;
                i = next(i);
            }
            assert_eq!(i, 0, "n = {n}: the cycle does not close");
        }
    }

    /// The numerics kernel on cuda-sim, with the approx check off and a chosen model,
    /// gives results from which the fit recovers that model: the PTX, the fragment
    /// packing and the unpacking agree with cuda-sim's tables.
    #[test]
    fn numerics_probe_recovers_the_model_cuda_sim_ran() {
        use cuda_sim::exec::{launch, LaunchConfig};
        use cuda_sim::fault::Checks;
        use cuda_sim::mem::FlatMemory;
        use cuda_sim::tensor::{AlignRef, BlockRounding, MmaModel};

        let module = cuda_sim::ptx::Module::parse("calibrate.ptx", CALIBRATE_PTX).unwrap();
        let cases = numerics_cases();
        let (a, b, c) = pack_mma_numerics(&cases);
        let base = 0x1000_0000u64;
        let (at_b, at_c, at_d) = (
            base + 4 * a.len() as u64,
            base + 4 * (a.len() + b.len()) as u64,
            base + 4 * (a.len() + b.len() + c.len()) as u64,
        );
        let bytes = |w: &[u32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let odd = MmaModel {
            block: 4,
            align_bits: 28,
            align_to: AlignRef::LeadingBit,
            rounding: BlockRounding::NearestEven,
        };
        for model in [MmaModel::SM80, MmaModel::SM90, odd] {
            let mem = FlatMemory::new(base, 4 * (a.len() + b.len() + 2 * c.len()), true);
            mem.write(base, &bytes(&a));
            mem.write(at_b, &bytes(&b));
            mem.write(at_c, &bytes(&c));
            let checks = Checks {
                approx_at_bound: false,
                mma: model,
                ..Checks::ALL
            };
            let cfg = LaunchConfig {
                grid: [1, 1, 1],
                block: [32, 1, 1],
                dynamic_shared: 0,
                programmatic: false,
            };
            let n = cases.len() as u32;
            let args: [&[u8]; 5] = [
                &base.to_le_bytes(),
                &at_b.to_le_bytes(),
                &at_c.to_le_bytes(),
                &at_d.to_le_bytes(),
                &n.to_le_bytes(),
            ];
            launch(&module, "cal_mma_numerics", &cfg, &args, &mem, checks, 1).unwrap();
            let mut raw = vec![0u8; 4 * c.len()];
            mem.read(at_d, &mut raw);
            let d: Vec<u32> = raw
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
                .collect();
            let fit = fit_f16_model(&cases, &mma_numerics_results(&d));
            assert_eq!(fit.unique(), Some(model), "{}", fit.summary());
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn the_probe_ptx_documents_every_entry() {
        let entries = crate::kernels::entries(CALIBRATE_PTX);
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "cal_empty",
                "cal_read",
                "cal_chase",
                "cal_fma",
                "cal_dp4a",
                "cal_sfu",
                "cal_smem",
                "cal_mma_f16",
                "cal_mma_s8",
                "cal_mma_numerics",
                "cal_handoff"
            ]
        );
        for e in &entries {
            let h = e.header.join("\n");
            for key in ["Params:", "Grid:", "Block:", "Shared:", "Reduction:"] {
                assert!(h.contains(key), "{} lacks '{key}'", e.name);
            }
            for p in &e.params {
                assert!(h.contains(p.as_str()), "{} does not document {p}", e.name);
            }
        }
    }
}
