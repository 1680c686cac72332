//! A loaded model ready to run: file, weights placed on devices, KV cache, executor.

use std::any::Any;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ggml_core::Backend;

use crate::devices::{DeviceList, DeviceSpec};
use crate::error::{ModelError, Result};
use crate::executor::{Executor, SchedExecutor};
use crate::gguf_file::GgufFile;
use crate::model::Model;
use crate::placement::{place_weights, KvCache, LayerMap, OwnedBuffer};
use crate::tokenizer::Tokenizer;

/// The default [`RunConfig::wait_timeout`] (`--wait-timeout`): longer than any pass of
/// the models we run.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(300);

/// How the model is spread over devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMode {
    /// Everything on one device.
    None,
    /// Consecutive layers per device (pipeline parallelism).
    Layer,
    /// Tensor parallelism, bit-exact: matrices cut by output rows (attention by whole KV
    /// heads), activations all-gathered.
    Tensor,
    /// Megatron-style tensor parallelism: the attention projection and the down matrix
    /// cut by input columns, partial sums all-reduced (F32, or BF16 on the wire).
    TensorReduce,
}

impl SplitMode {
    /// The command-line and report name (`none`, `layer`, `tensor`, `tensor-reduce`).
    pub fn name(self) -> &'static str {
        match self {
            SplitMode::None => "none",
            SplitMode::Layer => "layer",
            SplitMode::Tensor => "tensor",
            SplitMode::TensorReduce => "tensor-reduce",
        }
    }
}

/// How the exact tensor split gathers the activations that feed a matrix product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllGather {
    /// Gather the whole tensor on every device, then multiply.
    #[default]
    Concat,
    /// Cut the tokens into one chunk per device and pipeline: each device multiplies
    /// chunk c while chunk c + 1 crosses on a copy engine (a queue of its own per
    /// device), forwarded round the ring of devices (device d receives from d - 1 only),
    /// so copies hide behind compute. Bit-identical to `concat`.
    Ring,
}

impl AllGather {
    /// The command-line and report name (`concat`, `ring`).
    pub fn name(self) -> &'static str {
        match self {
            AllGather::Concat => "concat",
            AllGather::Ring => "ring",
        }
    }
}

/// Injects a fault into a session's devices as it opens ([`RunConfig::inject_fault`]).
///
/// The crate knows no kinds of fault: whoever runs the session (the harness's
/// `--inject-fault D:OP:KIND`) supplies the plan. [`Session::open`] hands it the
/// backends it created, in device order, and runs on the wrappers it returns; the
/// session keeps them ([`Session::faulty`]) and releases them when it ends, so an
/// injected hang does not outlive it.
pub trait FaultInjector: fmt::Debug + fmt::Display + Send + Sync + 'static {
    /// Every backend of `backends` wrapped in a [`ggml_sched::FaultyBackend`], the same
    /// number in the same order, or an error that says why the fault cannot be injected
    /// on these devices (no such device, a fault this kind of device cannot raise).
    fn wrap(&self, backends: &[Arc<dyn Backend>]) -> Result<Vec<Arc<ggml_sched::FaultyBackend>>>;

    /// The injector as [`Any`], so its owner can get its own type back from a session's
    /// configuration.
    fn as_any(&self) -> &dyn Any;
}

/// Settings that choose devices and how to use them.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Devices to run on.
    pub devices: DeviceList,
    /// Split mode.
    pub split_mode: SplitMode,
    /// Pipeline slots.
    pub n_copies: usize,
    /// Threads in total (shared between virtual CPU devices).
    pub threads: usize,
    /// Seed of random delays in CPU queues (chaos mode), `None` for none.
    pub chaos: Option<u64>,
    /// Wrap every backend in the happens-before checker.
    pub check_races: bool,
    /// Weakened scheduler rules (for demonstrating the checker).
    pub weaken: Vec<ggml_sched::WeakenKnob>,
    /// Queue on which copies between CPU devices run.
    pub cpu_copy_queue: ggml_core::CopyQueue,
    /// Share of the layers per device for the layer split (like llama.cpp's
    /// `--tensor-split`); `None` splits evenly.
    pub tensor_split: Option<Vec<f32>>,
    /// Tokens per micro-batch (0: a batch is one pass).
    pub n_ubatch: usize,
    /// `tensor-reduce`: partial sums of at least this many bytes cross devices as BF16.
    pub reduce_bf16_min: Option<usize>,
    /// How the exact tensor split gathers activations ([`AllGather::Ring`] adds a copy
    /// engine per device).
    pub all_gather: AllGather,
    /// A fault to inject (`--inject-fault D:OP:KIND`): every device is wrapped in a
    /// [`ggml_sched::FaultyBackend`] by the injector, one of them with the fault.
    pub inject_fault: Option<Arc<dyn FaultInjector>>,
    /// How long the host waits for a device before the run fails with a timeout naming
    /// it (`--wait-timeout`); `None` waits for ever.
    pub wait_timeout: Option<std::time::Duration>,
    /// Pin each CPU device's compute threads to CPUs of their own
    /// ([`ggml_cpu::CpuBackendOptions::pin_threads`]); off in [`RunConfig::simple`], on
    /// on the command line unless `--no-pin`.
    pub pin_threads: bool,
    /// Speed features of every CUDA and cuda-sim device (`--cuda-tuning`,
    /// `--no-cuda-graphs`).
    pub cuda_tuning: ggml_cuda::CudaTuning,
}

impl RunConfig {
    /// One device, `threads` threads, no chaos or checking.
    pub fn simple(
        devices: DeviceList,
        split_mode: SplitMode,
        n_copies: usize,
        threads: usize,
    ) -> RunConfig {
        RunConfig {
            devices,
            split_mode,
            n_copies,
            threads,
            chaos: None,
            check_races: false,
            weaken: Vec::new(),
            cpu_copy_queue: ggml_core::CopyQueue::Destination,
            tensor_split: None,
            n_ubatch: 0,
            reduce_bf16_min: None,
            all_gather: AllGather::Concat,
            inject_fault: None,
            wait_timeout: Some(DEFAULT_WAIT_TIMEOUT),
            pin_threads: false,
            cuda_tuning: ggml_cuda::CudaTuning::default(),
        }
    }
}

/// Creates the backends of `config.devices`, giving CPU instances `threads / n_cpu`
/// threads each (at least one) and chaos seeds `seed + i`.
pub fn create_backends(config: &RunConfig) -> Result<Vec<Arc<dyn Backend>>> {
    let (devices, threads) = (&config.devices, config.threads);
    let n_cpu: usize = devices
        .0
        .iter()
        .map(|d| match d {
            DeviceSpec::Cpu { count } => *count,
            DeviceSpec::Cuda { .. } => 0,
        })
        .sum();
    let per_cpu = threads.checked_div(n_cpu).map_or(1, |t| t.max(1));
    let mut out: Vec<Arc<dyn Backend>> = Vec::new();
    if devices.0.iter().any(|d| {
        matches!(
            d,
            DeviceSpec::Cuda {
                driver: ggml_cuda::DriverKind::Sim,
                ..
            }
        )
    }) {
        // cuda-sim's streams take the same chaos seed as the CPU queues.
        let sim = ggml_cuda::sim_driver().map_err(|e| {
            ggml_core::BackendError::new(
                ggml_core::BackendErrorKind::Unavailable,
                ggml_core::Name::new("cuda-sim"),
                e.what,
            )
        })?;
        sim.set_chaos(config.chaos);
    }
    for d in &devices.0 {
        match *d {
            DeviceSpec::Cpu { count } => {
                for _ in 0..count {
                    let opts = ggml_cpu::CpuBackendOptions {
                        n_threads: per_cpu,
                        copy_queue: config.cpu_copy_queue,
                        chaos: config.chaos.map(|s| s.wrapping_add(out.len() as u64)),
                        pin_threads: config.pin_threads,
                        ..Default::default()
                    };
                    out.push(Arc::new(ggml_cpu::CpuBackend::new(opts)?));
                }
            }
            DeviceSpec::Cuda { driver, gpu, count } => {
                for b in ggml_cuda::CudaBackend::new_virtual_with(driver, gpu, count as u32)? {
                    b.set_tuning(config.cuda_tuning);
                    out.push(Arc::new(b));
                }
            }
        }
    }
    Ok(out)
}

/// `b`, unwrapped from the race checker's wrapper.
fn unchecked(b: &Arc<dyn Backend>) -> &dyn Backend {
    match b.as_any().downcast_ref::<ggml_sched::CheckedBackend>() {
        Some(c) => &**c.inner(),
        None => &**b,
    }
}

/// `b` as a CUDA backend, also behind the race checker's wrapper.
fn as_cuda(b: &Arc<dyn Backend>) -> Option<&ggml_cuda::CudaBackend> {
    unchecked(b)
        .as_any()
        .downcast_ref::<ggml_cuda::CudaBackend>()
}

/// A device that can time its nodes (`bench --op-times`).
#[derive(Clone, Copy)]
pub enum TimedBackend<'a> {
    /// A CPU device: wall time per node, barrier waits included.
    Cpu(&'a ggml_cpu::CpuBackend),
    /// A CUDA or cuda-sim device: stream time per node, from timed events.
    Cuda(&'a ggml_cuda::CudaBackend),
}

impl TimedBackend<'_> {
    /// The device's name (`cpu#0`, `cuda:0#0`).
    pub fn name(&self) -> String {
        match self {
            TimedBackend::Cpu(b) => b.name().to_string(),
            TimedBackend::Cuda(b) => b.name().to_string(),
        }
    }

    /// Starts (`true`) or stops timing; stopping drops what was measured.
    pub fn set_op_timing(&self, on: bool) -> Result<()> {
        match self {
            TimedBackend::Cpu(b) => b.set_op_timing(on),
            TimedBackend::Cuda(b) => b.set_op_timing(on)?,
        }
        Ok(())
    }

    /// The time per kind of op since timing started or the last call, longest first.
    pub fn take_op_times(&self) -> Result<Vec<ggml_core::OpTime>> {
        Ok(match self {
            TimedBackend::Cpu(b) => b.take_op_times()?,
            TimedBackend::Cuda(b) => b.take_op_times()?,
        })
    }
}

/// One copy engine per backend of `backends` (created by [`create_backends`] from the
/// same `config`): a one-thread CPU queue for CPU devices (with its own chaos seed), a
/// second stream on the same GPU for CUDA devices.
pub fn create_copy_engines(
    config: &RunConfig,
    backends: &[Arc<dyn Backend>],
) -> Result<Vec<Arc<dyn Backend>>> {
    let n = backends.len() as u64;
    backends
        .iter()
        .enumerate()
        .map(|(i, b)| -> Result<Arc<dyn Backend>> {
            if let Some(cuda) = as_cuda(b) {
                return Ok(Arc::new(cuda.copy_engine()?));
            }
            let opts = ggml_cpu::CpuBackendOptions {
                n_threads: 1,
                chaos: config.chaos.map(|s| s.wrapping_add(n + i as u64)),
                ..Default::default()
            };
            Ok(Arc::new(ggml_cpu::CpuBackend::new(opts)?))
        })
        .collect()
}

/// A model loaded for running.
pub struct Session {
    /// The mapped file (weights may point into it).
    pub file: GgufFile,
    /// The model.
    pub model: Model,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// The backends.
    pub backends: Vec<Arc<dyn Backend>>,
    /// The configuration.
    pub config: RunConfig,
    /// Where layers live.
    pub layers: LayerMap,
    /// The race log when `config.check_races` is set.
    pub race_log: Option<Arc<ggml_sched::RaceLog>>,
    /// One copy engine per device with [`AllGather::Ring`] (empty otherwise).
    pub engines: Vec<Arc<dyn Backend>>,
    /// With [`RunConfig::inject_fault`]: the fault wrappers of the devices, in order.
    pub faulty: Vec<Arc<ggml_sched::FaultyBackend>>,
    _weights: Vec<OwnedBuffer>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Session({}, {} on {})",
            self.file.path().display(),
            self.config.devices,
            self.backends.len()
        )
    }
}

impl Drop for Session {
    /// Waits for every queue before the fields go: the mapped file and the weights and
    /// KV buffers must outlive any kernel still reading them (a scheduler that gave up on
    /// a device leaves its queues running). A queue that does not finish within the wait
    /// timeout is waited for without one: blocking is safe, unmapping under it is not.
    fn drop(&mut self) {
        // Injected hangs end with the session (as a device is reset).
        for f in &self.faulty {
            f.release();
        }
        let t = self.config.wait_timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT);
        for b in self.backends.iter().chain(&self.engines) {
            if matches!(b.synchronize_timeout(t), Ok(false)) {
                eprintln!(
                    "ggml-harness: {} did not finish in {:.0} s; waiting for it before unmapping the model",
                    b.name(),
                    t.as_secs_f64()
                );
                let _ = b.synchronize();
            }
        }
    }
}

impl Session {
    /// Opens `path`, checks the configuration and places the weights.
    pub fn open(path: &Path, config: RunConfig) -> Result<Session> {
        if config.threads == 0 {
            return Err(ModelError::Usage("--threads must be at least 1".into()));
        }
        if !(1..=4).contains(&config.n_copies) {
            return Err(ModelError::Usage(format!(
                "--n-copies {}: must be 1 to 4",
                config.n_copies
            )));
        }
        let n_dev = config.devices.count();
        if let Some(ts) = &config.tensor_split {
            if ts.len() != n_dev {
                return Err(ModelError::Usage(format!(
                    "--tensor-split has {} proportions for {n_dev} devices",
                    ts.len()
                )));
            }
        }
        if config.all_gather == AllGather::Ring && config.split_mode != SplitMode::Tensor {
            return Err(ModelError::Usage(
                "--all-gather ring applies to --split-mode tensor only".into(),
            ));
        }
        if config.reduce_bf16_min.is_some() && config.split_mode != SplitMode::TensorReduce {
            return Err(ModelError::Usage(
                "--reduce-bf16-min applies to --split-mode tensor-reduce only".into(),
            ));
        }
        let file = GgufFile::open(path)?;
        let mut model = Model::from_gguf(&file)?;
        let tokenizer = Tokenizer::from_gguf(&file.gguf()?)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let mut backends = create_backends(&config)?;
        let mut engines = match config.all_gather {
            AllGather::Ring => create_copy_engines(&config, &backends)?,
            AllGather::Concat => Vec::new(),
        };
        let mut faulty = Vec::new();
        if let Some(f) = &config.inject_fault {
            faulty = f.wrap(&backends)?;
            if faulty.len() != backends.len() {
                return Err(ModelError::Usage(format!(
                    "--inject-fault {f}: {} wrappers for {} devices",
                    faulty.len(),
                    backends.len()
                )));
            }
            backends = faulty
                .iter()
                .map(|b| b.clone() as Arc<dyn Backend>)
                .collect();
        }
        let race_log = config.check_races.then(ggml_sched::RaceLog::new);
        if let Some(log) = &race_log {
            backends = ggml_sched::CheckedBackend::wrap_all(&backends, log);
            engines = ggml_sched::CheckedBackend::wrap_all(&engines, log);
        }
        // Split none: everything on the first device (llama.cpp's main device).
        let layers = match (config.split_mode, &config.tensor_split) {
            (SplitMode::Layer, Some(ts)) => LayerMap::proportional(model.hp.n_layer, ts)?,
            (SplitMode::Layer, None) => LayerMap::even(model.hp.n_layer, backends.len())?,
            (SplitMode::Tensor, _) => {
                let mut tp = model.shard(backends.len(), false)?;
                tp.ring = config.all_gather == AllGather::Ring;
                LayerMap::tensor_parallel(model.hp.n_layer, tp)
            }
            (SplitMode::TensorReduce, _) => {
                let mut tp = model.shard(backends.len(), true)?;
                tp.bf16_min = config.reduce_bf16_min;
                crate::model::tp::check_reduce_points(&model, &tp)?;
                LayerMap::tensor_parallel(model.hp.n_layer, tp)
            }
            _ => LayerMap::single(model.hp.n_layer),
        };
        let weights = place_weights(&mut model, &file, &backends, &layers)?;
        Ok(Session {
            file,
            model,
            tokenizer,
            backends,
            config,
            layers,
            race_log,
            engines,
            faulty,
            _weights: weights,
        })
    }

    /// A KV cache for `cells` cells on the session's devices.
    pub fn kv_cache(&self, cells: usize) -> Result<KvCache> {
        KvCache::new(&self.model, &self.backends, &self.layers, cells)
    }

    /// The CUDA backends among the devices (cuda and cuda-sim), in order.
    pub fn cuda_backends(&self) -> Vec<&ggml_cuda::CudaBackend> {
        self.backends.iter().filter_map(as_cuda).collect()
    }

    /// The devices, in order, as backends that can time their nodes (all of the CPU and
    /// CUDA backends this crate creates; none behind a fault injector).
    pub fn timed_backends(&self) -> Vec<TimedBackend<'_>> {
        self.backends
            .iter()
            .filter_map(|b| {
                let b = unchecked(b).as_any();
                b.downcast_ref::<ggml_cpu::CpuBackend>()
                    .map(TimedBackend::Cpu)
                    .or_else(|| {
                        b.downcast_ref::<ggml_cuda::CudaBackend>()
                            .map(TimedBackend::Cuda)
                    })
            })
            .collect()
    }

    /// An executor for the session's configuration: every pass goes through the
    /// scheduler (with one device its plan is trivial).
    pub fn executor(&self) -> Result<Box<dyn Executor>> {
        Ok(Box::new(
            self.sched_executor(ggml_sched::PlanStyle::Minimal)?,
        ))
    }

    /// The scheduler executor itself, planning in `style` (ours or ggml's naive one).
    pub fn sched_executor(&self, style: ggml_sched::PlanStyle) -> Result<SchedExecutor> {
        let opts = ggml_sched::SchedOptions {
            n_copies: self.config.n_copies,
            weaken: self.config.weaken.iter().copied().collect(),
            style,
            // Inputs live where the embedding lookup runs: on the last device they would
            // queue behind the previous pass's last layers and stall the pipeline.
            input_backend: Some(self.layers.input_device),
            // Ring all-gathers: every copy crosses one link, forwarded round the ring.
            ring: self.config.all_gather == AllGather::Ring
                && style == ggml_sched::PlanStyle::Minimal,
            timeout: self.config.wait_timeout,
            ..Default::default()
        };
        SchedExecutor::new(
            self.backends.clone(),
            self.engines.clone(),
            self.layers.clone(),
            opts,
            self.config.n_ubatch,
        )
    }
}
